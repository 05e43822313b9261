"""The module index's qualified names and local uses against libcst's own scope analysis."""

from __future__ import annotations

from textwrap import dedent

import libcst as cst
import pytest
from conftest import REPO, T5_SOURCE
from libcst.helpers import get_absolute_module_from_package
from libcst.metadata import QualifiedNameProvider

from transforms.analysis.scopes import ModuleIndex
from transforms.analysis.syntax import dotted_name

PACKAGE = "transformers.models.t5"


def _absolute(name: str) -> str:
    dots = len(name) - len(name.lstrip("."))
    return name if not dots else get_absolute_module_from_package(PACKAGE, name[dots:] or None, dots) or name


@pytest.mark.parametrize("path", [T5_SOURCE, REPO / "generated_models/t5/v4_5_1/modeling_t5.py"])
def test_qualified_names_agree_with_libcst(path: object) -> None:
    tree = cst.parse_module(path.read_text())  # type: ignore[attr-defined]
    index = ModuleIndex(tree, PACKAGE)
    resolved = cst.MetadataWrapper(tree, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    compared = 0
    for node, names in resolved.items():
        if not isinstance(node, (cst.Name, cst.Attribute)):
            continue
        parent = index.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node or dotted_name(node) is None:
            continue  # after a dot; or a chain through a call, which libcst resolves by its root
        theirs = {_absolute(q.name) for q in (names() if callable(names) else names)}
        ours = index.qualified_names(node)
        # Locals are named after their function by both, in slightly different ways; compare the rest.
        assert {n for n in ours if "<locals>" not in n} == {n for n in theirs if "<locals>" not in n}, \
            cst.Module([]).code_for_node(node)
        compared += 1
    assert compared > 2500


def test_scoping_rules() -> None:
    tree = cst.parse_module(dedent("""\
        import torch.nn as nn
        from torch import nn as other
        from . import sibling
        nn_alias = nn

        class Model(nn.Module):
            nn = 3
            def forward(self, nn=None):
                return nn, other.Linear, sibling.x, [torch for torch in nn]

            def g(self):
                global nn_alias
                return nn.ReLU, nn_alias, len
        """))
    index = ModuleIndex(tree, PACKAGE)
    names = {dotted_name(n): n for n in index.nodes(cst.Attribute) if dotted_name(n)}
    assert index.qualified_names(cst.ensure_type(tree.body[4], cst.ClassDef).bases[0].value) == {"torch.nn.Module"}
    assert index.qualified_names(names["other.Linear"]) == {"torch.nn.Linear"}
    assert index.qualified_names(names["sibling.x"]) == {"transformers.models.t5.sibling.x"}
    assert index.qualified_names(names["nn.ReLU"]) == {"torch.nn.ReLU"}  # the class body's nn is not seen
    reads = {n.value: n for n in index.nodes(cst.Name) if n.value in ("nn_alias", "len")}
    assert index.qualified_names(reads["nn_alias"]) == {"nn_alias"}
    assert index.qualified_names(reads["len"]) == {"builtins.len"}


def test_local_uses() -> None:
    tree = cst.parse_module("def f(x):\n    y = g()\n    h = lambda: y\n    return [y for _ in x]\n")
    index = ModuleIndex(tree)
    target = next(n for n in index.nodes(cst.Name) if n.value == "y")
    bindings, reads = index.local_uses(target)
    assert len(bindings) == 1 and len(reads) == 2
    assert all(index.statement_position(read) > index.statement_position(bindings[0]) for read in reads)
