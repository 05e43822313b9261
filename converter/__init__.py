"""Rewrite HuggingFace modeling files into traceable, pipeline-ready code."""

__version__ = "0.1.0"
