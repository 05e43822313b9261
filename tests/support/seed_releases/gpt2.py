"""GPT-2 at a release: the 4.5.1 test family's configs and paths, against the release's stock and package."""

from __future__ import annotations

from support.gpt2_models import family_at
from support.model_checks import Family


def families(release: str) -> list[Family]:
    return [family_at(release)]
