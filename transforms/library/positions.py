"""Line numbers for warnings, computed only when a transform has something to report."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import Codemod
from libcst.metadata import PositionProvider


def line_of(transform: Codemod, node: cst.CSTNode) -> int | None:
    """The first line of ``node``, an original node of the tree being transformed.

    Positions need a code-generation pass over the whole module, which most
    runs never use: resolving them on demand (cached by the wrapper) keeps that
    cost out of runs that have nothing to warn about.
    """
    wrapper = transform.context.wrapper
    if wrapper is None:
        return None
    code_range = wrapper.resolve(PositionProvider).get(node)
    return None if code_range is None else code_range.start.line


def located(transform: Codemod, node: cst.CSTNode, message: str) -> str:
    line = line_of(transform, node)
    return message if line is None else f"line {line}: {message}"
