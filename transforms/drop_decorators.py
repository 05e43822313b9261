"""Remove decorators, named by qualified name, from functions and classes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from common.schema import OptionError
from transforms.library.base import Transform


@dataclass(frozen=True)
class DropDecoratorsOptions:
    names: tuple[str, ...]  # qualified names of the decorators to remove (called or not)

    def __post_init__(self) -> None:
        if not self.names:
            raise OptionError("names", "name at least one decorator")


class DropDecorators(Transform):
    """Remove the decorators the recipe names, wherever they decorate a function or a class.

    Library decorators wrap a forward for features a pipeline never uses and
    that tracers cannot follow: renaming deprecated keywords, returning tuples
    or recording outputs through hooks, filling arguments from the config,
    writing docstrings at import time.  Once the arguments they serve are
    specialized away they only stand between a tracer and the code.  A
    decorator is matched by the qualified name of what it calls, whether it is
    called (``@deprecate_kwarg("old", ...)``) or not (``@auto_docstring``)::

        @deprecate_kwarg("past_key_value", new_name="past_key_values", version="4.58")   # before
        def forward(self, hidden_states, past_key_values=None):

        def forward(self, hidden_states, past_key_values=None):                          # after
    """

    DESCRIPTION = "remove the recipe's decorators from functions and classes"
    Options = DropDecoratorsOptions

    def _drops(self, decorator: cst.Decorator) -> bool:
        target = decorator.decorator
        return bool(self.qualified_names(target.func if isinstance(target, cst.Call) else target)
                    & set(self.options.names))

    def focus(self) -> Iterable[cst.CSTNode]:
        self._dropped = {id(d) for d in self.index.nodes(cst.Decorator) if self._drops(d)}
        return [parent for d in self.index.nodes(cst.Decorator)
                if id(d) in self._dropped and (parent := self.index.parent(d)) is not None]

    def _without(self, original: cst.FunctionDef | cst.ClassDef, updated: cst.FunctionDef | cst.ClassDef):  # noqa: ANN202
        """``updated`` without the dropped decorators; comments above one move to what follows it."""
        kept: list[cst.Decorator] = []
        carried: list[cst.EmptyLine] = []
        for old, new in zip(original.decorators, updated.decorators):
            if id(old) in self._dropped:
                carried += new.leading_lines
                continue
            kept.append(new.with_changes(leading_lines=[*carried, *new.leading_lines]) if carried else new)
            carried = []
        if len(kept) == len(updated.decorators):
            return updated
        return updated.with_changes(decorators=kept, lines_after_decorators=[*carried, *updated.lines_after_decorators])

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self._without(original_node, updated_node)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        return self._without(original_node, updated_node)
