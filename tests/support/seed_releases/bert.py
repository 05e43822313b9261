"""BERT at a release: the 4.5.1 test family's configs and paths, and the classifier heads for
every problem type, against the release's stock and package."""

from __future__ import annotations

from support.bert_models import families_at
from support.model_checks import Family


def families(release: str) -> list[Family]:
    return families_at(release)
