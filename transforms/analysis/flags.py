"""What folding may assume about names: classes no constant belongs to, and flags that settled to one constant.

Both answer questions ``specialize_arguments`` asks between folding passes; they only read code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import libcst as cst

from transforms.analysis.literals import literal_value
from transforms.analysis.names import bound_names
from transforms.analysis.syntax import children


def opaque_classes(module: cst.Module, imports: dict[str, tuple[str, str | None]]) -> frozenset[str]:
    """Dotted names of classes no literal constant is an instance of: the module's own classes and
    capitalized names imported from third-party modules (``torch.Tensor``, ``transformers.cache_utils.Cache``).

    Builtins and the modules defining abstract base classes a constant may belong to are left out.
    """
    classes = {s.name.value for s in module.body if isinstance(s, cst.ClassDef)}
    for name, (source, imported) in imports.items():
        if source.split(".")[0] in _ABC_MODULES:
            continue
        if imported is not None and imported[:1].isupper():
            classes.add(name)
        elif imported is None:  # import torch: torch.Tensor, ...
            classes.add(f"{name}.Tensor")
    return frozenset(classes)


_ABC_MODULES = frozenset({"builtins", "typing", "typing_extensions", "numbers", "collections", "abc", "types"})


def settled_flags(statements: Sequence[cst.BaseStatement], original: Sequence[cst.BaseStatement],
                   parameters: set[str]) -> set[str]:
    """Flags folding left with one binding, a top-level ``name = True/False/None``, that had more before.

    Such a flag (``return_legacy_cache = False`` whose ``= True`` branch folded away) holds that
    constant wherever it is read after its assignment.  Numbers and strings stay: they are data.
    """
    before = _binding_counts(original)
    after = _binding_counts(statements)
    settled = set()
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                    and isinstance(small.targets[0].target, cst.Name) and _is_flag(small.value):
                name = small.targets[0].target.value
                if name not in parameters and after.get(name) == 1 and before.get(name, 0) > 1:
                    settled.add(name)
    return settled


def _is_flag(node: cst.BaseExpression) -> bool:
    value = literal_value(node)
    return value is None or value is True or value is False


def _binding_counts(statements: Sequence[cst.BaseStatement]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in _walk(statements):
        if isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For)):
            for name in bound_names(node):
                counts[name] = counts.get(name, 0) + 1
        elif isinstance(node, (cst.NamedExpr, cst.AsName, cst.FunctionDef, cst.ClassDef)):
            for name in bound_names(node):
                counts[name] = counts.get(name, 0) + 2  # never a plain flag
    return counts


def _walk(statements: Sequence[cst.CSTNode]) -> Iterable[cst.CSTNode]:
    pending = list(statements)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            pending.extend(children(node))
