"""Drop ``**kwargs`` parameters that are only passed on, and the ``**kwargs`` arguments passing them on."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from common.schema import OptionError
from transforms.analysis.callees import Callees
from transforms.analysis.scopes import ModuleIndex, Scope
from transforms.analysis.syntax import code_of, descendants, drop_items
from transforms.library.base import Transform

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
# Builtins that read a function's locals by name: a use of every parameter that no name analysis sees.
_DYNAMIC = frozenset({"builtins.locals", "builtins.vars", "builtins.eval", "builtins.exec"})


@dataclass(frozen=True)
class ForwardedKwargsOptions:
    # Qualified names: only a `**` parameter whose annotation names one of them is dropped
    # (e.g. "transformers.utils.TransformersKwargs"); empty, every `**` parameter may be.
    annotations: tuple[str, ...] = ()
    # Keywords the recipe knows no function reads once they land in a `**` parameter (an LLM decoder layer
    # passes `position_ids=` and `use_cache=` to an attention whose `**kwargs` only reaches the eager
    # attention function, which ignores them): at a call of a function whose `**` parameter is dropped they
    # are dropped too, instead of keeping that parameter.
    unread: tuple[str, ...] = ()
    # Functions whose `**` parameter stays whatever its uses: called through a registry this module cannot
    # resolve (an LLM's `attention_interface(..., sliding_window=w)`, eager_attention_forward once the
    # registry is specialized), they take keywords no call here shows.  A name, or ``Class.method`` for one
    # method: BERT 5.x's self-attention, called as ``self.self`` whose class __init__ picks by a flag, gets
    # the cross-attention's keywords through its ``**kwargs``.
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for position, name in enumerate(self.annotations):
            if not all(part.isidentifier() for part in name.split(".")):
                raise OptionError(f"annotations[{position}]", f"{name!r} is not a qualified name")
        for position, name in enumerate(self.unread):
            if not name.isidentifier():
                raise OptionError(f"unread[{position}]", f"{name!r} is not a keyword")


class DropForwardedKwargs(Transform):
    """Remove a ``**name`` parameter that its function only passes on, with the ``**name`` arguments.

    transformers 5 threads ``**kwargs: Unpack[TransformersKwargs]`` through every
    forward, down to an attention function that never reads it.  A pipeline stage
    gets no such options, and ``torch.fx`` cannot unpack a dict of them ("Proxy
    object cannot be iterated").  When every use of ``name`` in the function is a
    ``**name`` argument of a call (or there is none), the function sees an empty
    dict once the parameter is gone, and passing that on is passing nothing::

        def forward(self, x, mask=None, **kwargs: Unpack[TransformersKwargs]):   # before
            return self.layer(x, mask=mask, **kwargs)

        def forward(self, x, mask=None):                                         # after
            return self.layer(x, mask=mask)

    Functions and methods at any depth are decided one by one, a nested
    function's own ``**name`` by its own uses.  Kept, with a warning naming the
    cause: a parameter read otherwise (``kwargs.get("x")``, ``kwargs["x"]``,
    ``f(kwargs)``, ``{**kwargs}``), rebound (``kwargs = ...``, ``del kwargs``),
    closed over by a nested function, lambda or class body, reachable through
    ``locals()``/``vars()``/``eval``/``exec``, or taken by a call in this module
    that resolves to the function (:mod:`transforms.analysis.callees`) and passes
    a keyword only ``**name`` accepts or a ``**mapping`` that is not dropped with
    it (decided to a fixed point: a kept parameter keeps the ones it is passed on
    to).  Calls the module cannot resolve, and callers outside it, are assumed to
    pass no extra keywords: that is what dropping the parameter means.  A keyword
    the recipe lists as ``unread`` does not keep the parameter: it goes from the
    calls with it (``self.self_attn(x, position_ids=p)`` -> ``self.self_attn(x)``
    when only the attention's dropped ``**kwargs`` took it); a function the
    recipe lists in ``keep`` (by name, or ``Class.method``) keeps its parameter.  Imports
    that only the dropped annotations used go with them.  Lambdas are left alone.

    The parameter passed on whole as a keyword's value (5.24's ``cache.update(k, v,
    layer_idx, kwargs=kwargs)``) is the empty dict it would be: the argument becomes
    ``{}``::

        kwargs=kwargs                                                               # before
        kwargs={}                                                                   # after

    A statement that only pops a named key, its value discarded, shapes nothing but
    what is passed on: it goes with the parameter (GPT-2 5.x's model forward)::

        kwargs.pop("output_attentions", None)                                      # before: a statement
                                                                                   # after: gone
    """

    DESCRIPTION = "drop **kwargs parameters that are only passed on as **kwargs, with those arguments"
    Options = ForwardedKwargsOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        self._unread_arguments: set[int] = set()
        self._pops: dict[int, list[cst.SimpleStatementLine]] = {}  # id(function) -> its discarded pops
        self._unread_calls: dict[int, cst.Call] = {}
        self._dynamic = [call for call in self.index.nodes(cst.Call)
                         if isinstance(call.func, cst.Name) and self.qualified_names(call) & _DYNAMIC]
        candidates: dict[int, tuple[cst.FunctionDef, list[cst.Arg]]] = {}
        for function in self.index.nodes(cst.FunctionDef):
            param = function.params.star_kwarg
            if param is not None and self._selected(param) and function.name.value not in self.options.keep \
                    and _where(self.index, function) not in self.options.keep:
                forwarded = self._forwarding_arguments(function, param)
                if forwarded is not None:
                    candidates[id(function)] = (function, forwarded)
        if candidates:
            self._settle(candidates)
        self._parameters = {id(function.params) for function, _ in candidates.values()}
        self._arguments = {id(arg) for _, args in candidates.values() for arg in args if arg.star == "**"} \
            | self._unread_arguments
        self._emptied = {id(arg) for _, args in candidates.values() for arg in args if arg.keyword is not None}
        for function, _ in candidates.values():
            self._remove_imports(function.params.star_kwarg)
        calls = {id(call): call for _, args in candidates.values() for arg in args
                 if isinstance(call := self.index.parent(arg), cst.Call)}
        calls.update(self._unread_calls)
        lines = [line for key in candidates for line in self._pops.get(key, [])]
        self._dropped_lines = {id(line) for line in lines}
        return [*(function.params for function, _ in candidates.values()), *calls.values(), *lines]

    # -- which parameters go ---------------------------------------------------------------------------
    def _selected(self, param: cst.Param) -> bool:
        if not self.options.annotations:
            return True
        if param.annotation is None:
            return False
        wanted = set(self.options.annotations)
        return any(self.qualified_names(node) & wanted for node in descendants(param.annotation.annotation)
                   if isinstance(node, (cst.Name, cst.Attribute)))

    def _forwarding_arguments(self, function: cst.FunctionDef, param: cst.Param) -> list[cst.Arg] | None:
        """The ``**name`` arguments that are the only uses of ``param``; None (reported) if it has others."""
        index, name = self.index, param.name.value
        scope = index.scope_of(param.name)
        kept = f"**{name} of {_where(index, function)} kept"
        rebound = [binding for binding in scope.bindings[name] if binding is not param]
        if rebound:
            self.report(rebound[0], f"{kept}: `{name}` is rebound in the function")
            return None
        for call in self._dynamic:
            if _runs_inline(index.scope_of(call), scope):
                self.report(call, f"{kept}: `{code_of(call.func)}` may read it")
                return None
        forwarded: list[cst.Arg] = []
        for inner in index.all_scopes:
            if index.lookup(inner, name) is not scope:
                continue
            inline = _runs_inline(inner, scope)
            if not inline and name in inner.nonlocals:
                self.report(inner.node, f"{kept}: a nested scope declares it nonlocal")
                return None
            for read in inner.reads[name]:
                arg = index.parent(read)
                if inline and (line := _discarded_pop(index, read)) is not None:
                    self._pops.setdefault(id(function), []).append(line)
                    continue
                if not inline:
                    self.report(read, f"{kept}: a nested function, lambda or class body uses it")
                    return None
                if not (isinstance(arg, cst.Arg) and isinstance(index.parent(arg), cst.Call)
                        and (arg.star == "**" or (arg.star == "" and arg.keyword is not None))):
                    self.report(read, f"{kept}: used other than as a `**{name}` argument")
                    return None
                forwarded.append(arg)
        return forwarded

    def _settle(self, candidates: dict[int, tuple[cst.FunctionDef, list[cst.Arg]]]) -> None:
        """Keep the candidates that calls in this module pass keywords only their ``**`` parameter takes."""
        callees = Callees(self.index)
        sites: list[tuple[cst.Call, cst.FunctionDef]] = []
        for call in self.index.nodes(cst.Call):
            if any(arg.keyword is not None or arg.star == "**" for arg in call.args):
                callee = callees.resolve(call)
                if callee is not None and id(callee.function) in candidates:
                    sites.append((call, callee.function))
        changed = True
        while changed:
            changed = False
            dropped = {id(arg) for _, args in candidates.values() for arg in args}
            for call, function in sites:
                if id(function) not in candidates:
                    continue
                param = function.params.star_kwarg
                assert param is not None  # a candidate has one
                extra = _extra_keywords(call, function, param.name.value, dropped, self.options.unread)
                if extra is not None:
                    self.report(call, f"**{param.name.value} of {_where(self.index, function)} kept: "
                                      f"this call passes {extra}")
                    del candidates[id(function)]
                    changed = True
        for call, function in sites:
            if id(function) in candidates:
                unread = _unread_arguments(call, function, self.options.unread)
                self._unread_arguments |= {id(arg) for arg in unread}
                if unread:
                    self._unread_calls[id(call)] = call

    def _remove_imports(self, param: cst.Param | None) -> None:
        """Schedule the removal of the imports the dropped annotation names (each only if nothing else uses it)."""
        if param is None or param.annotation is None:
            return
        index = self.index
        for node in descendants(param.annotation.annotation):
            parent = index.parent(node)
            if isinstance(node, cst.Name) and not (isinstance(parent, cst.Attribute) and parent.attr is node) \
                    and index.lookup(index.scope_of(node), node.value) is index.root:
                self.remove_unused_import_of(node.value)

    # -- the rewrite -----------------------------------------------------------------------------------
    def leave_Parameters(self, original_node: cst.Parameters, updated_node: cst.Parameters) -> cst.Parameters:
        return _without_star_kwarg(updated_node) if id(original_node) in self._parameters else updated_node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        return cst.RemoveFromParent() if id(original_node) in self._dropped_lines else updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if any(id(arg) in self._emptied for arg in original_node.args):
            updated_node = updated_node.with_changes(args=[
                new.with_changes(value=cst.Dict([])) if id(old) in self._emptied else new
                for old, new in zip(original_node.args, updated_node.args)])
        keep = [id(arg) not in self._arguments for arg in original_node.args]
        if all(keep):
            return updated_node
        return updated_node.with_changes(args=drop_items(updated_node.args, keep))


def _discarded_pop(index: ModuleIndex, read: cst.Name) -> cst.SimpleStatementLine | None:
    """The statement line if ``read`` is ``name.pop("key", ...)`` alone on it, its value discarded; else None."""
    attribute = index.parent(read)
    call = index.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    expression = index.parent(call) if isinstance(call, cst.Call) else None
    line = index.parent(expression) if isinstance(expression, cst.Expr) else None
    if not (isinstance(attribute, cst.Attribute) and attribute.value is read and attribute.attr.value == "pop"
            and isinstance(call, cst.Call) and call.args and isinstance(call.args[0].value, cst.SimpleString)
            and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
        return None
    return line


def _runs_inline(inner: Scope, scope: Scope) -> bool:
    """Whether code in ``inner`` runs as part of ``scope``'s: it is that scope or comprehensions in it."""
    current: Scope | None = inner
    while current is not scope:
        if current is None or not isinstance(current.node, _COMPREHENSIONS):
            return False
        current = current.parent
    return True


def _where(index: ModuleIndex, function: cst.FunctionDef) -> str:
    """``Class.method`` (or ``outer.inner``): the function's name with its enclosing classes and functions."""
    names = [a.name.value for a in index.ancestors(function) if isinstance(a, (cst.ClassDef, cst.FunctionDef))]
    return ".".join([*reversed(names), function.name.value])


def _named(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {p.name.value for p in (*params.params, *params.kwonly_params)}


def _extra_keywords(call: cst.Call, function: cst.FunctionDef, name: str, dropped: set[int],
                    unread: tuple[str, ...]) -> str | None:
    """What ``call`` passes that only ``function``'s ``**name`` may take (said in words), or None."""
    named = _named(function)
    for arg in call.args:
        if arg.star == "**" and id(arg) not in dropped:
            return f"`**{code_of(arg.value)}`, which may hold any keyword"
        if not arg.star and arg.keyword is not None and arg.keyword.value not in named \
                and arg.keyword.value not in unread:
            return f"`{arg.keyword.value}=`, which only `**{name}` takes"
    return None


def _unread_arguments(call: cst.Call, function: cst.FunctionDef, unread: tuple[str, ...]) -> list[cst.Arg]:
    """The ``unread`` keywords ``call`` passes that only ``function``'s dropped ``**`` parameter took."""
    named = _named(function)
    return [arg for arg in call.args if not arg.star and arg.keyword is not None
            and arg.keyword.value in unread and arg.keyword.value not in named]


def _without_star_kwarg(params: cst.Parameters) -> cst.Parameters:
    """``params`` without ``**name``; the item before it takes its comma (and the space before the parenthesis)."""
    star_kwarg = params.star_kwarg
    assert star_kwarg is not None
    for field in ("kwonly_params", "star_arg", "params", "posonly_ind", "posonly_params"):
        value = getattr(params, field)
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            last = value[-1]
        elif isinstance(value, (cst.Param, cst.ParamStar, cst.ParamSlash)):
            last = value
        else:
            continue
        changes: dict[str, object] = {"comma": star_kwarg.comma}
        if isinstance(last, cst.Param):
            changes["whitespace_after_param"] = star_kwarg.whitespace_after_param
        last = last.with_changes(**changes)
        replaced = [*value[:-1], last] if isinstance(value, (list, tuple)) else last
        return params.with_changes(star_kwarg=None, **{field: replaced})
    return params.with_changes(star_kwarg=None)
