"""Run one transform on inline code, the way the pipeline does."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import libcst as cst
from libcst.codemod import Codemod, CodemodContext

MODULE = "transformers.models.t5.modeling_t5"


def run_reporting(transform: type[Codemod], code: str, module_name: str = MODULE, scratch: dict | None = None,
                  **options: Any) -> tuple[str, list[str]]:
    """The rewritten code and the warnings the transform reported."""
    context = CodemodContext(full_module_name=module_name, full_package_name=module_name.rpartition(".")[0],
                             scratch=dict(scratch or {}))
    result = transform(context, **options).transform_module(cst.parse_module(dedent(code))).code
    return result, context.warnings


def run(transform: type[Codemod], code: str, module_name: str = MODULE, scratch: dict | None = None,
        **options: Any) -> str:
    return run_reporting(transform, code, module_name, scratch, **options)[0]


def warnings_of(transform: type[Codemod], code: str, **options: Any) -> list[str]:
    return run_reporting(transform, code, **options)[1]


def assert_left_with_warning(transform: type[Codemod], code: str, expected: str, **options: Any) -> None:
    """The code is left as it is, with one warning containing ``expected``."""
    result, warnings = run_reporting(transform, code, **options)
    assert result == dedent(code)
    assert len(warnings) == 1 and expected in warnings[0], warnings


def assert_rewrites(transform: type[Codemod], before: str, after: str, **kwargs: Any) -> None:
    """``before`` becomes ``after``, and the transform leaves its own output alone."""
    result = run(transform, before, **kwargs)
    assert result == dedent(after)
    assert run(transform, result, **kwargs) == result, "transform is not idempotent"


def assert_unchanged(transform: type[Codemod], code: str, **kwargs: Any) -> None:
    assert run(transform, code, **kwargs) == dedent(code)
