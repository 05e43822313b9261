"""Undo the keyword renames a release declares with its own deprecation decorator."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from common.schema import OptionError
from transforms.analysis.syntax import all_params
from transforms.library.base import Transform, TransformError


@dataclass(frozen=True)
class RenamedKeywordsOptions:
    # the decorator that declares a rename: ``@<decorator>(old, version, new_name=new)``
    decorator: str = "transformers.utils.deprecation.deprecate_kwarg"

    def __post_init__(self) -> None:
        if "." not in self.decorator:
            raise OptionError("decorator", f"{self.decorator!r} is not a qualified name (module.function)")


class RenamedKeywords(Transform):
    """Give renamed keywords back their old names, read from the release's deprecation decorators.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` in almost every
    modeling file and said so on each forward it touched (and on the masking
    functions the forwards call)::

        @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")

    Every recipe, fact and ``stateless`` helper speaks of the old name, and the
    arguments it names are specialized away later.  So rather than restate each
    recipe per release, this step reads the renames from the source itself and
    undoes them: in every function taking a renamed parameter, the parameter
    and its reads and writes; in every call of the module, the keyword
    argument, and the key of a keyword dict it is put in (``{"cache": cache}``,
    spread into a call); the decorators themselves go (what they translated no
    longer exists).  Attribute reads (``outputs.cache``) keep the new name: they read
    the library's output classes, whose fields were renamed too::

        @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")      # before
        def forward(self, hidden_states, cache=None):
            if cache is not None:
                hidden_states = cache.update(hidden_states)
            return self.mlp(hidden_states, cache=cache)

        def forward(self, hidden_states, past_key_values=None):              # after
            if past_key_values is not None:
                hidden_states = past_key_values.update(hidden_states)
            return self.mlp(hidden_states, past_key_values=past_key_values)

    A rename whose old name is already taken in a function that would receive
    it stops the step (one line): the two names would merge.
    """

    DESCRIPTION = "undo the keyword renames the release's deprecation decorators declare"
    Options = RenamedKeywordsOptions

    def _rename_of(self, decorator: cst.Decorator) -> tuple[str, str] | None:
        call = decorator.decorator
        if not isinstance(call, cst.Call) or self.options.decorator not in self.qualified_names(call.func):
            return None
        old = call.args[0].value if call.args and call.args[0].keyword is None else None
        new = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "new_name"),
                   None)
        if not isinstance(old, cst.SimpleString) or not isinstance(new, cst.SimpleString):
            return None  # a removal (no new_name) or a computed name: nothing this step can undo
        return str(new.evaluated_value), str(old.evaluated_value)

    def focus(self) -> Iterable[cst.CSTNode] | None:
        self._dropped: set[int] = set()
        self._renames: dict[str, str] = {}
        for decorator in self.index.nodes(cst.Decorator):
            rename = self._rename_of(decorator)
            if rename is not None:
                new, old = rename
                if self._renames.setdefault(new, old) != old:
                    raise TransformError(f"{new!r} is declared the new name of both {self._renames[new]!r} "
                                         f"and {old!r}")
                self._dropped.add(id(decorator))
                func = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else None
                if isinstance(func, cst.Name):
                    self.remove_unused_import_of(func.value)
        if not self._renames:
            return []
        self._functions = {id(node) for node in self.index.nodes(cst.FunctionDef)
                           if any(p.name.value in self._renames for p in all_params(node.params))}
        for node in self.index.nodes(cst.FunctionDef):
            if id(node) not in self._functions:
                continue
            taken = {p.name.value for p in all_params(node.params)}
            for new, old in self._renames.items():
                if new in taken and old in taken:
                    raise TransformError(f"{node.name.value} takes both {old!r} and its new name {new!r}")
        self._depth = 0
        return None  # calls anywhere in the module may pass a renamed keyword

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if id(node) in self._functions:
            self._depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if id(original_node) in self._functions:
            self._depth -= 1
        if not any(id(d) in self._dropped for d in original_node.decorators):
            return updated_node
        kept = [new for old, new in zip(original_node.decorators, updated_node.decorators)
                if id(old) not in self._dropped]
        return updated_node.with_changes(decorators=kept)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        # ``x.cache``: the field of a library object keeps its (new) name; only the object may be renamed.
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        keyword = original_node.keyword
        if keyword is not None and keyword.value in self._renames:
            return updated_node.with_changes(keyword=cst.Name(self._renames[keyword.value]))
        return updated_node.with_changes(keyword=keyword)

    def leave_DictElement(self, original_node: cst.DictElement, updated_node: cst.DictElement) -> cst.DictElement:
        # ``{"cache": cache}`` spread into a call (``create_causal_mask(**mask_kwargs)``): a keyword by another name.
        key, value = original_node.key, original_node.value
        if self._depth and isinstance(key, cst.SimpleString) and isinstance(value, cst.Name) \
                and value.value in self._renames and key.evaluated_value == value.value:
            return updated_node.with_changes(key=cst.SimpleString(repr(self._renames[value.value]).replace("'", '"')))
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        if self._depth and original_node.value in self._renames:
            return updated_node.with_changes(value=self._renames[original_node.value])
        return updated_node
