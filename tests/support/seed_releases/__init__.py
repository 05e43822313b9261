"""The seed families (GPT-2, BERT, RoBERTa, BART) at any release, as the per-release worker checks them.

Each family's module here exposes ``families(release) -> list[Family]``: the family's classes at that release
(stock: the modeling module this process imports, from the release's install on PYTHONPATH; generated: the
package committed for the release), tiny configs valid at that release, and the paths each class is called
with. Several Family objects per release are allowed (a head whose configs differ from the base model's).
"""

from __future__ import annotations

import importlib

from support.model_checks import Family

FAMILIES = ("gpt2", "bert", "roberta", "bart")


def families(name: str, release: str) -> list[Family]:
    module = importlib.import_module(f"support.seed_releases.{name}")
    return list(module.families(release))
