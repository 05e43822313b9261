"""Run one transform on inline code, the way the pipeline does."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import libcst as cst
from libcst.codemod import Codemod, CodemodContext

MODULE = "transformers.models.t5.modeling_t5"


def run(transform: type[Codemod], code: str, module_name: str = MODULE, scratch: dict | None = None,
        **options: Any) -> str:
    context = CodemodContext(full_module_name=module_name, full_package_name=module_name.rpartition(".")[0],
                             scratch=dict(scratch or {}))
    return transform(context, **options).transform_module(cst.parse_module(dedent(code))).code


def assert_rewrites(transform: type[Codemod], before: str, after: str, **kwargs: Any) -> None:
    """``before`` becomes ``after``, and the transform leaves its own output alone."""
    result = run(transform, before, **kwargs)
    assert result == dedent(after)
    assert run(transform, result, **kwargs) == result, "transform is not idempotent"


def assert_unchanged(transform: type[Codemod], code: str, **kwargs: Any) -> None:
    assert run(transform, code, **kwargs) == dedent(code)
