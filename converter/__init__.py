"""Rewrite HuggingFace modeling files into traceable, pipeline-ready code."""
