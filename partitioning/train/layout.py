"""The files of a ``--save`` directory that more than the saving ranks name (the launcher, the metrics writer).

``train_state.json`` marks a directory train-model wrote; ``metrics.jsonl`` is written outside the save's commit
(each logged step), so a run that died before its first save leaves it alone in the directory, and the next run
may still write there.  ``train_config.toml`` is part of each save's commit.
"""

from __future__ import annotations

STATE = "train_state.json"  # the run's step, stages and kept settings (written last, by the commit)
METRICS = "metrics.jsonl"  # one record per logged step (partitioning/train/metrics.py)
SETTINGS = "train_config.toml"  # the run's settings, as a --config-file (partitioning/train/cli.py)
OUTSIDE_COMMIT = (METRICS,)
