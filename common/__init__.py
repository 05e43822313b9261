"""Plumbing both tools stand on: errors, the CLI runner, atomic writes, capped reads, schemas, versions."""

__version__ = "0.1.0"
