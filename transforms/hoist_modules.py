"""Build the modules that ``forward`` creates on every call once, in ``__init__``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.literals import is_literal
from transforms.analysis.syntax import code_of
from transforms.library.base import Transform
from transforms.library.submodules import MODULE_BASES, ClassFamily, InitSite, append_to_init, receiver

# Capitalised names under these prefixes are classes but not modules.
NOT_MODULES = ("torch.nn.functional.", "torch.nn.Parameter", "torch.nn.parameter.", "torch.nn.init.",
               "torch.nn.utils.")
# Modules that register no parameters, nor buffers when every argument is a literal.
STATELESS = ("*Loss", "Dropout*", "AlphaDropout", "FeatureAlphaDropout", "Identity", "Flatten", "Unflatten",
             "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "ELU", "CELU", "SELU", "LeakyReLU", "Tanh", "Sigmoid",
             "Hardtanh", "Hardswish", "Hardsigmoid", "Softplus", "Softmax", "LogSoftmax")


@dataclass(frozen=True)
class HoistOptions:
    methods: tuple[str, ...] = ("forward",)  # the methods to look in
    classes: tuple[str, ...] = ("torch.nn.",)  # qualified-name prefixes of module classes
    module_bases: tuple[str, ...] = MODULE_BASES  # qualified names whose subclasses are modules


class HoistModules(Transform):
    """Move ``name = nn.SomeModule(...)`` from ``forward`` to the end of ``__init__``.

    torch.fx cannot call a module that is not a submodule, and HF models build
    their loss inside ``forward``.  Built once in ``__init__`` (keeping its
    arguments, which must be literals or attributes that ``__init__`` sets) the
    module is registered and every use reads the attribute.  Losses and other
    state-free modules keep the state dict unchanged; any other module is still
    hoisted with a warning that its keys are new.  Options: ``methods`` to look
    in (default ``["forward"]``), ``classes``, the qualified-name prefixes of
    module classes (default ``["torch.nn."]``), and ``module_bases``, the
    qualified names whose subclasses count as modules::

        def forward(self, logits, labels):                 # before
            loss_fct = CrossEntropyLoss(ignore_index=-100)
            return loss_fct(logits, labels)

        def __init__(self, config):                        # after
            ...
            self.loss_fct = CrossEntropyLoss(ignore_index=-100)
        def forward(self, logits, labels):
            return self.loss_fct(logits, labels)

    A module built and called at once gets an attribute named after its class::

        w = nn.Softmax(dim=-1)(w)                          # before (GPT-2's attention)
        w = self.softmax(w)                                # after; __init__ ends with self.softmax = nn.Softmax(dim=-1)
    """

    DESCRIPTION = "nn modules built inside forward -> submodules built at the end of __init__"
    Options = HoistOptions

    def __init__(self, context: CodemodContext, options: HoistOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self._removed: set[int] = set()  # ids of the moved statements
        self._uses: dict[int, tuple[str, str]] = {}  # id of a read of a moved local -> (receiver, attribute)
        self._appended: dict[int, tuple[InitSite, list[cst.SimpleStatementLine]]] = {}  # id of a class -> lines
        self._replaced: dict[int, tuple[str, str]] = {}  # id of a constructor called at once -> (receiver, attribute)
        self._own_reads: dict[int, list[cst.Name]] = {}  # id of one of several bindings -> the reads it reaches

    def _names_module_class(self, names: Iterable[str]) -> bool:
        return any(name.startswith(self.options.classes) and not name.startswith(NOT_MODULES)
                   and name.rpartition(".")[2][:1].isupper() for name in names)

    def focus(self) -> Iterable[cst.CSTNode]:
        """The methods whose constructions move (planned here, with a warning for each that cannot)."""
        family = ClassFamily(self.index, self.options.module_bases)
        by_method: dict[int, list[cst.Call]] = {}
        for call in self.index.nodes(cst.Call):
            # A call's own qualified names are its callee's: only a named callee is a constructor.
            if isinstance(call.func, (cst.Name, cst.Attribute)) and self._names_module_class(self.qualified_names(call)):
                method = self._method_of(call)
                if method is not None:
                    by_method.setdefault(id(method), []).append(call)
        planned: list[cst.CSTNode] = []
        for node in self.index.nodes(cst.ClassDef):
            if not by_method or not isinstance(node.body, cst.IndentedBlock) or not family.is_module(node):
                continue
            methods = {s.name.value: s for s in node.body.body if isinstance(s, cst.FunctionDef)}
            for method in (methods[name] for name in self.options.methods if name in methods):
                if self._plan(family, node, method, by_method.get(id(method), [])):
                    planned.append(method)
        return planned

    def _method_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The method (a function right in a class body) that ``node`` is in."""
        functions = [a for a in self.index.ancestors(node) if isinstance(a, cst.FunctionDef)]
        for function in functions:
            block = self.index.parent(function)
            if block is not None and isinstance(self.index.parent(block), cst.ClassDef):
                return function
        return None

    def _plan(self, family: ClassFamily, node: cst.ClassDef, method: cst.FunctionDef, calls: list[cst.Call]) -> bool:
        statements = [line for call in calls if (line := self._assigned(call)) is not None]
        planned = False
        for call in calls:
            if self._assigned(call) is not None:
                continue
            if not self._called_at_once(call):
                self.report(call, "module built inside an expression, not hoisted: assign it to a local first")
                continue
            site = self._site(family, node)
            obstacle = site if isinstance(site, str) else self._argument_obstacle(family, call, method, site)
            if obstacle:
                self.report(call, f"module not hoisted: {obstacle}")
                continue
            assert isinstance(site, InitSite)
            self._hoist_called(family, node, call, site)
            planned = True
        for statement in statements:
            site = self._site(family, node)
            obstacle = site if isinstance(site, str) else self._obstacle(family, statement, method, site)
            if obstacle:
                self.report(statement, f"module not hoisted: {obstacle}")
                continue
            assert isinstance(site, InitSite)
            self._hoist(family, node, statement, site)
            planned = True
        return planned

    def _assigned(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The line ``name = <call>`` when that is all the line does."""
        assign = self.index.parent(call)
        line = None if assign is None else self.index.parent(assign)
        if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1 \
                and isinstance(assign.targets[0].target, cst.Name) \
                and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
        return None

    def _site(self, family: ClassFamily, node: cst.ClassDef) -> InitSite | str:
        if id(node) in self._appended:
            return self._appended[id(node)][0]
        init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            return "the class has no __init__ with an indented body to move it to"
        site = family.init_site(node)
        return site

    def _obstacle(self, family: ClassFamily, statement: cst.SimpleStatementLine, method: cst.FunctionDef,
                  site: InitSite) -> str | None:
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        local = assign.targets[0].target
        assert isinstance(local, cst.Name)
        bindings, reads = self.index.local_uses(local)
        position = self.index.statement_position(statement)
        if len(bindings) != 1:
            mine = self._branch_reads(statement, bindings, reads)
            if mine is None:
                return f"`{local.value}` is assigned more than once"
            self._own_reads[id(statement)] = mine
        elif any(self.index.statement_position(read) <= position for read in reads):
            return f"`{local.value}` is used before it is assigned"
        return self._argument_obstacle(family, assign.value, method, site)

    def _branch_reads(self, statement: cst.SimpleStatementLine, bindings: list[cst.CSTNode],
                      reads: list[cst.Name]) -> list[cst.Name] | None:
        """The reads of this binding when each binding is a module built in its own block (BERT's
        ``loss_fct = MSELoss()`` / ``loss_fct = CrossEntropyLoss()`` in an if/else) and every read
        follows exactly one of them in that binding's block; else None."""
        found_lines = [self.index.enclosing(binding, cst.SimpleStatementLine) for binding in bindings]
        lines = [line for line in found_lines if line is not None and self._assigned_call(line) is not None]
        blocks = [self.index.parent(line) for line in lines]
        if len(lines) != len(found_lines) or len(set(map(id, blocks))) != len(blocks):
            return None

        def owners(read: cst.Name) -> list[int]:
            return [i for i, (line, block) in enumerate(zip(lines, blocks, strict=True))
                    if block is not None and block in list(self.index.ancestors(read))
                    and self.index.statement_position(read) > self.index.statement_position(line)]
        owned = [owners(read) for read in reads]
        if any(len(owner) != 1 for owner in owned):
            return None
        index = next(i for i, line in enumerate(lines) if line is statement)
        return [read for read, owner in zip(reads, owned, strict=True) if owner == [index]]

    def _assigned_call(self, line: cst.SimpleStatementLine) -> cst.Call | None:
        assign = line.body[0] if len(line.body) == 1 else None
        if isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call) \
                and self._names_module_class(self.qualified_names(assign.value)):
            return assign.value
        return None

    def _argument_obstacle(self, family: ClassFamily, call: cst.Call, method: cst.FunctionDef,
                           site: InitSite) -> str | None:
        owner = receiver(method)
        if owner is None or owner != site.receiver:
            return f"{method.name.value} and __init__ do not share a self parameter name"
        for arg in call.args:
            if arg.star:
                return "starred arguments"
            if family.relocate(arg.value, site, owner) is None:
                return f"argument `{code_of(arg.value)}` is neither a literal nor an attribute that __init__ sets"
        return None

    def _called_at_once(self, call: cst.Call) -> bool:
        """``Module(...)(x)``: the constructor's value is only called."""
        parent = self.index.parent(call)
        return isinstance(parent, cst.Call) and parent.func is call

    def _hoist_called(self, family: ClassFamily, node: cst.ClassDef, call: cst.Call, site: InitSite) -> None:
        dotted = code_of(call.func).rpartition(".")[2]
        stem = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", dotted).lower()
        attribute = family.fresh_attribute(node, stem, stem)
        target = cst.Attribute(value=cst.Name(site.receiver), attr=cst.Name(attribute))
        line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], call)])
        self._appended.setdefault(id(node), (site, []))[1].append(line)
        self._replaced[id(call)] = (site.receiver, attribute)
        if not self._is_stateless(call):
            self.report(call, f"`{code_of(call.func)}` may hold parameters or buffers: "
                              f"the state dict gains keys under `{attribute}.`")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        use = self._replaced.get(id(original_node))
        if use is None:
            return updated_node
        return cst.Attribute(value=cst.Name(use[0]), attr=cst.Name(use[1]),
                             lpar=updated_node.lpar, rpar=updated_node.rpar)

    def _hoist(self, family: ClassFamily, node: cst.ClassDef, statement: cst.SimpleStatementLine,
               site: InitSite) -> None:
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        local = assign.targets[0].target
        assert isinstance(local, cst.Name)
        own_reads = self._own_reads.get(id(statement))
        # One of several bindings (a loss per branch): the attribute is named after its class.
        stem = local.value if own_reads is None else \
            re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_",
                   code_of(assign.value.func).rpartition(".")[2]).lower()
        attribute = family.fresh_attribute(node, stem, stem)
        target = cst.Attribute(value=cst.Name(site.receiver), attr=cst.Name(attribute))
        moved = statement.with_changes(
            body=[assign.with_changes(targets=[assign.targets[0].with_changes(target=target)])],
            leading_lines=[line for line in statement.leading_lines if line.comment is not None])
        self._appended.setdefault(id(node), (site, []))[1].append(moved)
        self._removed.add(id(statement))
        for read in self.index.local_uses(local)[1] if own_reads is None else own_reads:
            self._uses[id(read)] = (site.receiver, attribute)
        if not self._is_stateless(assign.value):
            self.report(statement, f"`{code_of(assign.value.func)}` may hold parameters or buffers: "
                                   f"the state dict gains keys under `{attribute}.`")

    def _is_stateless(self, call: cst.Call) -> bool:
        return (all(is_literal(arg.value) for arg in call.args)
                and any(fnmatchcase(name.rpartition(".")[2], pattern)
                        for name in self.qualified_names(call.func) for pattern in STATELESS))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        appended = self._appended.get(id(original_node))
        return updated_node if appended is None else append_to_init(updated_node, *appended)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        return cst.RemoveFromParent() if id(original_node) in self._removed else updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if updated_node.body or not original_node.body:
            return updated_node
        # The hoisted statement was the block's only one.
        return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        use = self._uses.get(id(original_node))
        if use is None:
            return updated_node
        owner, attribute = use
        return cst.Attribute(value=cst.Name(owner), attr=cst.Name(attribute),
                             lpar=updated_node.lpar, rpar=updated_node.rpar)
