"""Specialize optional arguments to constants and fold away the code they guard."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.callees import Callees
from transforms.analysis.facts import Fact, rewrite_facts
from transforms.analysis.folding import Known
from transforms.analysis.literals import is_constant
from transforms.analysis.liveness import Liveness
from transforms.analysis.names import module_imports
from transforms.analysis.propagation import FunctionFolder, Unsupported
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import all_params, code_of, drop_items, indented, is_docstring, root_name
from transforms.base import Transform, TransformError
from transforms.options import OptionError
from transforms.submodules import methods, receiver


def _constant(key: str, text: str) -> cst.BaseExpression:
    try:
        value = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        value = None
    if value is None or not is_constant(value):
        raise OptionError(key, f"{text!r} is not a literal constant")
    return value


def _expression(key: str, text: str) -> cst.BaseExpression:
    try:
        return cst.parse_expression(text)
    except cst.ParserSyntaxError:
        raise OptionError(key, f"{text!r} is not an expression") from None


@dataclass(frozen=True)
class FactOptions:
    expression: str
    value: str
    reason: str | None = None  # the guard's message; default: "assumed <expression> == <value>"
    # The condition the guard asserts, where the default form does not fit every tracer: a plain
    # Python value (module state such as self.model_parallel) is best checked with `not`.
    check: str | None = None

    def __post_init__(self) -> None:
        _expression("expression", self.expression)
        _constant("value", self.value)
        if self.check is not None:
            _expression("check", self.check)

    def fact(self) -> Fact:
        reason = self.reason if self.reason is not None else f"assumed {self.expression} == {self.value}"
        check = cst.parse_expression(self.check) if self.check is not None else None
        return Fact(cst.parse_expression(self.expression), cst.parse_expression(self.value), reason, check)


@dataclass(frozen=True)
class SpecializeOptions:
    constants: dict[str, str]  # parameter name -> the literal it is fixed to
    pure_methods: tuple[str, ...] = ()  # methods whose unused results may be dropped with their call
    facts: tuple[FactOptions, ...] = ()
    # Only the methods of these top-level classes (default: every function of the module).
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, text in self.constants.items():
            _constant(f"constants.{name}", text)


class SpecializeArguments(Transform):
    """Fix optional arguments to constants, fold what they guard, and drop them.

    The recipe states model-wide facts such as "head masks are never used"
    (``head_mask = None``) or "no cache" (``use_cache = False``).  Every function
    taking such a parameter loses it; inside, the constant is propagated
    flow-sensitively (a reassignment ends it; if the entry value could still be
    read, the name is bound to the constant at entry instead), ``is None``,
    ``not``, ``and``/``or``, ternaries and ``if`` tests on it are folded, dead
    branches and statements after a folded ``return`` disappear, assignments that
    only fed removed code are dropped, and calls stop passing the parameter as a
    keyword (calls into imported code are left alone)::

        def forward(self, x, head_mask=None, return_dict=None):     # before
            return_dict = return_dict if return_dict is not None else self.config.use_return_dict
            if head_mask is not None:
                x = x * head_mask
            if not return_dict:
                return (x,)
            return Output(x)

        def forward(self, x):                                        # after
            return_dict = False
            return (x,)

    A call into this module (``self.method(...)`` of the same class, or a
    module-level function) that passes a removed parameter positionally loses
    that argument too, so every local call still matches its callee::

        def _attn(self, q, k, head_mask=None, output_attentions=False):   # before
        ...     self._attn(q, k, head_mask, output_attentions)

        def _attn(self, q, k):                                             # after
        ...     self._attn(q, k)

    A *required* parameter the recipe fixes goes the same way from a method or a
    module-level function: its callers passed it by keyword, which they lost
    above (BART's ``encoder_layer(h, mask, layer_head_mask=...)``), or
    positionally in a local call, which loses the argument as shown.  A nested
    function keeps its required parameters: its calls are not resolved::

        def forward(self, x, layer_head_mask):      # before
        def forward(self, x):                       # after

    The same holds for a call on a submodule whose class ``__init__`` names
    (``self.attention(h, mask, head_mask)`` with ``self.attention =
    BertAttention(config)``) or on the items of a ``ModuleList`` in a layer loop
    (:mod:`transforms.analysis.callees`).

    ``pure_methods`` names methods whose calls may be dropped when their
    result is unused (e.g. ``get_head_mask``).  ``classes`` limits the step to
    the methods of some classes (an encoder-only head's cross-attention inputs,
    which its base model keeps): only they lose the parameters, calls into them
    lose the arguments, and inside them a read of a parameter becomes its
    constant, so a call passing it on to an unlimited callee passes the
    constant (``encoder_hidden_states=None``).
    """

    DESCRIPTION = "fix recipe arguments to constants, fold and drop what they guard"
    Options = SpecializeOptions

    def __init__(self, context: CodemodContext, options: SpecializeOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.constants = {name: cst.parse_expression(text) for name, text in self.options.constants.items()}
        self.pure_methods = frozenset(self.options.pure_methods)
        self.facts = [fact.fact() for fact in self.options.facts]
        self._dropped_keywords: list[int] = []
        self._imported: set[str] = set()
        self._fact_readers: set[int] = set()
        self._positional: dict[int, list[bool]] = {}  # id of a local call -> which of its arguments stay
        self._scope: set[int] | None = None  # ids of the methods a limited step rewrites

    def focus(self) -> Iterable[cst.CSTNode]:
        """Functions with a parameter to fix or a name a fact reads, and calls passing a fixed keyword."""
        index = self.index
        self._scope = self._scoped_functions()
        self._positional = self._positional_drops()
        found: list[cst.CSTNode] = [
            call for call in index.nodes(cst.Call)
            if any(arg.keyword is not None and arg.keyword.value in self.constants for arg in call.args)
            and (self._scope is None or id(call) in self._positional)]
        for function in index.nodes(cst.FunctionDef):
            if self._in_scope(function) and self._fixed(function):
                found.append(function)
        # Functions reading every name of some fact: only there can a fact apply.
        readers: dict[str, set[int]] = {}
        for scope in index.all_scopes:
            for name in {n for fact in self.facts for n in fact.names} & scope.reads.keys():
                readers.setdefault(name, set()).update(
                    id(f) for read in scope.reads[name] for f in index.ancestors(read) if isinstance(f, cst.FunctionDef))
        self._fact_readers = set().union(*(set.intersection(*(readers.get(n, set()) for n in fact.names))
                                           for fact in self.facts if fact.names))
        self._fact_readers = {f for f in self._fact_readers if self._scope is None or f in self._scope}
        found.extend(f for f in index.nodes(cst.FunctionDef) if id(f) in self._fact_readers)
        found.extend(call for call in index.nodes(cst.Call) if id(call) in self._positional)
        return found

    def _fixed(self, function: cst.FunctionDef) -> set[str]:
        """The parameters of ``function`` that the specialization removes (see the class docstring)."""
        if not self._in_scope(function):
            return set()
        nested = any(isinstance(node, cst.FunctionDef) for node in self.index.ancestors(function))
        return {p.name.value for p in all_params(function.params)
                if p.name.value in self.constants and (p.default is not None or not nested)}

    def _scoped_functions(self) -> set[int] | None:
        """The ids of the methods of the ``classes`` option's classes; None when the step is not limited."""
        if not self.options.classes:
            return None
        classes = {s.name.value: s for s in self.module.body if isinstance(s, cst.ClassDef)}
        missing = [name for name in self.options.classes if name not in classes]
        if missing:
            raise TransformError(f"no class {', '.join(missing)} in the module")
        return {id(method) for name in self.options.classes for _, method, _ in methods(classes[name])}

    def _in_scope(self, function: cst.FunctionDef) -> bool:
        return self._scope is None or id(function) in self._scope

    def _kept_positions(self, function: cst.FunctionDef, method: bool) -> list[bool] | None:
        """Per positional parameter (a method's receiver left out), whether it stays; None if none goes."""
        params = [*function.params.posonly_params, *function.params.params][1 if method else 0:]
        fixed = self._fixed(function)
        keep = [p.name.value not in fixed for p in params]
        return None if all(keep) else keep

    def _positional_drops(self) -> dict[int, list[bool]]:
        """The local calls passing a removed parameter positionally, with the arguments they keep."""
        functions: dict[tuple[str | None, str], list[bool]] = {}
        for statement in self.module.body:
            if isinstance(statement, cst.FunctionDef) and self._scope is None:
                keep = self._kept_positions(statement, method=False)
                if keep is not None:
                    functions[(None, statement.name.value)] = keep
            elif isinstance(statement, cst.ClassDef):
                for _, method, _ in methods(statement):
                    if not self._in_scope(method):
                        continue
                    keep = self._kept_positions(method, method=True)
                    if keep is not None:
                        functions[(statement.name.value, method.name.value)] = keep
        if not functions:
            return {}
        self._callees = Callees(self.index)
        drops: dict[int, list[bool]] = {}
        for call in self.index.nodes(cst.Call):
            key = self._local_callee(call)
            if key not in functions:
                continue
            positional = 0
            keep_args = []
            for arg in call.args:
                if arg.star:
                    if positional < len(functions[key]) and not all(functions[key][positional:]):
                        raise TransformError(f"`{code_of(call)}`: a starred argument may fill a parameter "
                                             f"the specialization removes")
                    keep_args.append(True)
                elif arg.keyword is None:
                    kept = positional >= len(functions[key]) or functions[key][positional]
                    if not kept and not is_pure(arg.value, self.pure_methods):
                        raise TransformError(f"`{code_of(call)}`: cannot drop the argument "
                                             f"`{code_of(arg.value)}`, it may have effects")
                    keep_args.append(kept)
                    positional += 1
                else:
                    keep_args.append(True)
            if not all(keep_args) or (self._scope is not None and any(
                    arg.keyword is not None and arg.keyword.value in self.constants for arg in call.args)):
                drops[id(call)] = keep_args
        return drops

    def _local_callee(self, call: cst.Call) -> tuple[str | None, str] | None:
        """``(class, method)`` for ``self.method(...)`` in a method of that class, ``(None, f)`` for ``f(...)``,
        ``(K, "forward")`` for a call on a submodule or a layer-loop item of file class ``K``
        (:mod:`transforms.analysis.callees`)."""
        func = call.func
        submodule = self._callees.submodule_class(call)
        if submodule is not None:
            owner = self._callees.method_owner(submodule, "forward")
            return (owner, "forward") if owner is not None else None
        if isinstance(func, cst.Name):
            found = self.index.lookup(self.index.scope_of(func), func.value)
            return (None, func.value) if found is self.index.root else None
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return None
        method = self.index.enclosing(call, cst.FunctionDef)
        holder = self.index.parent(method) if method is not None else None
        holder = self.index.parent(holder) if isinstance(holder, cst.IndentedBlock) else holder
        if method is None or not isinstance(holder, cst.ClassDef) or receiver(method) != func.value.value:
            return None
        return holder.name.value, func.attr.value

    def visit_Module(self, node: cst.Module) -> None:
        # Only "is the callee an imported name?" matters here, and the module's
        # top-level import bindings answer it; full scope analysis would cost
        # more than the rest of this transform.
        self._imported = set(module_imports(node)) | set(dir(builtins))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        keep = [not (arg.keyword is not None and arg.keyword.value in self.constants) for arg in updated_node.args]
        positional = self._positional.get(id(original_node))
        if self._scope is not None and positional is None:
            return updated_node  # a limited step drops arguments only where its own methods are called
        if positional is not None:
            keep = [a and b for a, b in zip(keep, positional)]
        if all(keep) or root_name(original_node.func, through_calls=True) in self._imported:
            return updated_node
        if self._dropped_keywords:
            self._dropped_keywords[-1] += 1
        return updated_node.with_changes(args=drop_items(updated_node.args, keep))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._dropped_keywords.append(0)

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        """Facts, then constant propagation, then dead-code removal, then the new signature."""
        dropped = self._dropped_keywords.pop()
        if self._dropped_keywords:
            self._dropped_keywords[-1] += dropped
        params = updated_node.params
        fixed = self._fixed(original_node)
        specialized = [p.name.value for p in all_params(params) if p.name.value in fixed]
        if not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        body, used_facts = updated_node.body, False
        if id(original_node) in self._fact_readers:
            body, used_facts = rewrite_facts(self.facts, updated_node.body)
        if not specialized and not dropped and not used_facts:
            return updated_node
        folder = FunctionFolder(self.pure_methods)
        try:
            statements, _, _ = folder.block(body.body, {name: Known(self.constants[name], True)
                                                        for name in specialized})
        except Unsupported:
            self.warn(f"{updated_node.name.value}: global/nonlocal declarations, left unspecialized")
            return updated_node
        liveness = Liveness(self.pure_methods)
        # Only what folding made dead goes: code the recipe does not touch stays as written.
        assert isinstance(original_node.body, cst.IndentedBlock)
        statements = liveness.remove_dead(statements, liveness.live(original_node.body.body))
        statements = self._bind_at_entry(statements, [name for name in specialized if name in folder.observed])
        if not self._in_scope(original_node):
            return updated_node.with_changes(body=indented(statements, updated_node.body))
        positional, star, kwonly = _without(params.params, fixed), params.star_arg, _without(params.kwonly_params, fixed)
        if isinstance(star, cst.ParamStar) and not kwonly:  # a bare `*` needs a keyword-only parameter after it
            star = cst.MaybeSentinel.DEFAULT
            if positional and params.star_kwarg is None:
                positional[-1] = positional[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(params=params.with_changes(
            posonly_params=_without(params.posonly_params, fixed),
            params=positional,
            star_arg=star,
            kwonly_params=kwonly,
        ), body=indented(statements, updated_node.body))

    def _bind_at_entry(self, statements: list[cst.BaseStatement], names: list[str]) -> list[cst.BaseStatement]:
        """``name = <constant>`` after the docstring, for parameters whose entry value is still read."""
        entry = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], self.constants[name])])
                 for name in names]
        docstring = 1 if statements and is_docstring(statements[0]) else 0
        return [*statements[:docstring], *entry, *statements[docstring:]]


def _without(params: Sequence[cst.Param], fixed: set[str]) -> list[cst.Param]:
    return drop_items(params, [p.name.value not in fixed for p in params])
