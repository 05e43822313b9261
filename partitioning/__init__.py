"""Partition generated models into balanced pipeline stages and place them on GPUs or IPUs."""
