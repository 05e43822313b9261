"""Specialize optional arguments to constants and fold away the code they guard."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.callees import Callees
from transforms.analysis.facts import Fact, rewrite_facts
from transforms.analysis.flags import opaque_classes, settled_flags
from transforms.analysis.folding import Known
from transforms.analysis.liveness import Liveness
from transforms.analysis.names import module_imports
from transforms.analysis.propagation import FunctionFolder, Unsupported
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import all_params, code_of, drop_items, indented, is_docstring, root_name
from transforms.library.base import Transform, TransformError
from transforms.library.specialize_options import SpecializeOptions
from transforms.library.submodules import methods


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
        self._resolved: dict[int, set[int]] = {}  # id of a call of a function defined here -> arguments to drop
        self._classes: frozenset[str] = frozenset()
        self._used_constants: set[str] = set()  # for the header: what this step specialized
        self._used_facts: set[int] = set()
        self._scope: set[int] | None = None  # ids of the methods a limited step rewrites

    def focus(self) -> Iterable[cst.CSTNode]:
        """Functions with a parameter to fix or a name a fact reads, and calls passing a fixed argument."""
        index = self.index
        self._scope = self._scoped_functions()
        found: list[cst.CSTNode] = list(self._plan_calls())
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

    def _plan_calls(self) -> list[cst.Call]:
        """The arguments to drop from calls of functions the module defines, by position and keyword.

        A call of such a function loses exactly the arguments that fill a parameter this step
        removes, positional ones included; other calls lose the keywords named like a constant.
        """
        callees = Callees(self.index)
        planned = []
        for call in self.index.nodes(cst.Call):
            callee = callees.resolve(call)
            if callee is None:
                if any(arg.keyword is not None and arg.keyword.value in self.constants for arg in call.args):
                    planned.append(call)
                continue
            drops = callee.arguments_filling(call, self._fixed(callee.function))
            if drops is None:
                raise TransformError(f"`{code_of(call)}`: a starred argument may fill a parameter "
                                     f"the specialization removes")
            for arg in (call.args[position] for position in sorted(drops)):
                if arg.keyword is None and not is_pure(arg.value, self.pure_methods):
                    raise TransformError(f"`{code_of(call)}`: cannot drop the argument "
                                         f"`{code_of(arg.value)}`, it may have effects")
            self._resolved[id(call)] = drops
            if drops:
                planned.append(call)
        return planned

    def visit_Module(self, node: cst.Module) -> None:
        # Only "is the callee an imported name?" matters here, and the module's
        # top-level import bindings answer it; full scope analysis would cost
        # more than the rest of this transform.
        imports = module_imports(node)
        self._imported = set(imports) | set(dir(builtins))
        self._classes = opaque_classes(node, imports)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        """The header says which arguments were fixed and which facts were assumed, checked or not."""
        constants = [f"{name}={text}" for name, text in self.options.constants.items() if name in self._used_constants]
        if constants:
            self.note("specialized arguments: " + ", ".join(constants))
        used = [(options, fact) for options, fact in zip(self.options.facts, self.facts) if id(fact) in self._used_facts]
        checked = [f"{options.expression} -> {options.value}" for options, fact in used if fact.guarded]
        if checked:
            self.note("assumed, checked by torch._assert: " + "; ".join(checked))
        for options, fact in used:
            if not fact.guarded:
                self.note(f"specialized: {options.expression} -> {options.value} ({fact.reason})")
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        drops = self._resolved.get(id(original_node))
        if drops is not None:
            keep = [position not in drops for position in range(len(updated_node.args))]
        elif self._scope is not None:
            return updated_node  # a limited step drops arguments only where its own methods are called
        else:
            keep = [not (arg.keyword is not None and arg.keyword.value in self.constants) for arg in updated_node.args]
            if root_name(original_node.func, through_calls=True) in self._imported:
                return updated_node
        if all(keep):
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
        body, used_facts = updated_node.body, list[Fact]()
        if id(original_node) in self._fact_readers:
            body, used_facts = rewrite_facts(self.facts, updated_node.body)
            self._used_facts.update(id(fact) for fact in used_facts)
        self._used_constants.update(specialized)
        if not specialized and not dropped and not used_facts:
            return updated_node
        entry = {name: Known(self.constants[name], True) for name in specialized}
        folder = FunctionFolder(self.pure_methods, self._classes)
        try:
            statements, _, _ = folder.block(body.body, entry)
        except Unsupported:
            self.warn(f"{updated_node.name.value}: global/nonlocal declarations, left unspecialized")
            return updated_node
        liveness = Liveness(self.pure_methods)
        # Only what folding made dead goes: code the recipe does not touch stays as written.
        assert isinstance(original_node.body, cst.IndentedBlock)
        live_before = liveness.live(original_node.body.body)
        statements = liveness.remove_dead(statements, live_before)
        # Flags whose other assignments folding removed now hold one constant: fold them in turn.
        settled = settled_flags(statements, original_node.body.body, {p.name.value for p in all_params(params)})
        if settled:
            observed = folder.observed
            folder = FunctionFolder(self.pure_methods, self._classes, frozenset(settled))
            statements, _, _ = folder.block(statements, {})
            folder.observed |= observed
            statements = liveness.remove_dead(statements, live_before)
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
