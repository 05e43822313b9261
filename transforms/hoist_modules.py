"""Build the modules that ``forward`` creates on every call once, in ``__init__``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.metadata import GlobalScope, QualifiedName, QualifiedNameProvider, ScopeProvider

from transforms.base import Transform
from transforms.positions import located

MODULE_BASES = ("torch.nn.Module", "torch.nn.modules.module.Module",
                "transformers.modeling_utils.PreTrainedModel")
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


_ASSIGNED_CALL = m.SimpleStatementLine(body=[
    m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Call())])
_NUMBER = m.Integer() | m.Float() | m.Imaginary()
_LITERAL = (_NUMBER | m.UnaryOperation(operator=m.Minus() | m.Plus(), expression=_NUMBER) | m.SimpleString()
            | m.Name("True") | m.Name("False") | m.Name("None"))


def _is_constant(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(e, cst.Element) and _is_constant(e.value) for e in node.elements)
    if isinstance(node, cst.ConcatenatedString):
        return _is_constant(node.left) and _is_constant(node.right)
    return m.matches(node, _LITERAL)


def _self_attribute(node: cst.BaseExpression) -> tuple[str, str] | None:
    """``(owner, first attribute)`` of a plain ``owner.first[.more...]`` chain."""
    if not isinstance(node, cst.Attribute):
        return None
    while isinstance(node.value, cst.Attribute):
        node = node.value
    return (node.value.value, node.attr.value) if isinstance(node.value, cst.Name) else None


def _first_parameter(function: cst.FunctionDef) -> str | None:
    params = function.params.posonly_params or function.params.params
    return params[0].name.value if params else None


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
    """

    DESCRIPTION = "nn modules built inside forward -> submodules built at the end of __init__"
    METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider)

    Options = HoistOptions

    def __init__(self, context: CodemodContext, options: HoistOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.methods = self.options.methods
        self.classes = self.options.classes
        self.module_bases = frozenset(self.options.module_bases)
        # A call's own qualified names are its callee's: only a named callee is a constructor.
        named_class = m.MatchMetadataIfTrue(QualifiedNameProvider, self._names_module_class)
        self._construction = m.Call(func=m.Name(metadata=named_class) | m.Attribute(metadata=named_class))
        self._module_classes: dict[str, bool] = {}
        self._descend: set[cst.FunctionDef] = set()
        self._inside = 0
        self._removed: set[cst.SimpleStatementLine] = set()
        self._uses: dict[cst.Name, tuple[str, str]] = {}
        self._appended: dict[cst.FunctionDef, list[cst.SimpleStatementLine]] = {}

    def _names_module_class(self, names: Iterable[QualifiedName]) -> bool:
        return any(name.name.startswith(self.classes) and not name.name.startswith(NOT_MODULES)
                   and name.name.rpartition(".")[2][:1].isupper() for name in names)

    def _is_module_subclass(self, node: cst.ClassDef) -> bool:
        for base in node.bases:
            for name in self.get_metadata(QualifiedNameProvider, base.value, set()):
                if self.absolute_name(name.name) in self.module_bases or self._module_classes.get(name.name, False):
                    return True
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        is_module = self._is_module_subclass(node)
        if isinstance(self.get_metadata(ScopeProvider, node, None), GlobalScope):
            self._module_classes[node.name.value] = is_module
        return is_module and isinstance(node.body, cst.IndentedBlock) and self._plan(node)

    def _plan(self, node: cst.ClassDef) -> bool:
        methods = {s.name.value: s for s in node.body.body if isinstance(s, cst.FunctionDef)}
        init = methods.get("__init__")
        taken: set[str] | None = None
        planned = False
        for method in (methods[name] for name in self.methods if name in methods):
            found = m.findall(method, self._construction | _ASSIGNED_CALL, metadata_resolver=self)
            calls = {n for n in found if isinstance(n, cst.Call)}
            statements = [n for n in found
                          if isinstance(n, cst.SimpleStatementLine) and n.body[0].value in calls]
            assigned = {s.body[0].value for s in statements}
            for call in (n for n in found if n in calls and n not in assigned):
                self.warn(located(self, call, "module built inside an expression, not hoisted: "
                                              "assign it to a local first"))
            for statement in statements:
                obstacle = self._obstacle(statement, method, init)
                if obstacle:
                    self.warn(located(self, statement, f"module not hoisted: {obstacle}"))
                    continue
                if taken is None:
                    taken = self._taken_attributes(node, methods.values())
                self._hoist(statement, method, init, taken)
                planned = True
        return planned

    def _obstacle(self, statement: cst.SimpleStatementLine, method: cst.FunctionDef,
                  init: cst.FunctionDef | None) -> str | None:
        assign = statement.body[0]
        local = assign.targets[0].target
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            return "the class has no __init__ with an indented body to move it to"
        owner = _first_parameter(method)
        if owner is None or _first_parameter(init) != owner:
            return f"{method.name.value} and __init__ do not share a self parameter name"
        scope = self.get_metadata(ScopeProvider, local)
        assignments = scope.assignments[local.value]
        if len(assignments) != 1:
            return f"`{local.value}` is assigned more than once"
        if any(set(access.referents) != set(assignments) for access in scope.accesses[local.value]):
            return f"`{local.value}` is used before it is assigned"
        assigned_in_init = None
        for arg in assign.value.args:
            if arg.star:
                return "starred arguments"
            if _is_constant(arg.value):
                continue
            attribute = _self_attribute(arg.value)
            if assigned_in_init is None:
                assigned_in_init = self._assigned_attributes(init, owner)
            if attribute is None or attribute[0] != owner or attribute[1] not in assigned_in_init:
                code = self.module.code_for_node(arg.value)
                return f"argument `{code}` is neither a literal nor an attribute that __init__ sets"
        return None

    @staticmethod
    def _assigned_attributes(init: cst.FunctionDef, owner: str) -> set[str]:
        targets = [t.target for t in m.findall(init, m.AssignTarget() | m.AnnAssign())]
        return {a.attr.value for t in targets for a in m.findall(t, m.Attribute(value=m.Name(owner)))}

    @staticmethod
    def _taken_attributes(node: cst.ClassDef, methods: Iterable[cst.FunctionDef]) -> set[str]:
        owners = {_first_parameter(method) for method in methods} - {None}
        owner = m.Name(m.MatchIfTrue(owners.__contains__))
        used = {a.attr.value for a in m.findall(node, m.Attribute(value=owner))}
        defined = {s.name.value for s in node.body.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
        assigned = {t.target.value for s in node.body.body if isinstance(s, cst.SimpleStatementLine)
                    for t in m.findall(s, m.AssignTarget(target=m.Name()) | m.AnnAssign(target=m.Name()))}
        return used | defined | assigned

    def _hoist(self, statement: cst.SimpleStatementLine, method: cst.FunctionDef, init: cst.FunctionDef,
               taken: set[str]) -> None:
        assign = statement.body[0]
        local = assign.targets[0].target
        attribute = local.value
        suffix = 0
        while attribute in taken:
            suffix += 1
            attribute = f"{local.value}_{suffix}"
        taken.add(attribute)
        owner = _first_parameter(method)
        target = cst.Attribute(value=cst.Name(owner), attr=cst.Name(attribute))
        moved = statement.with_changes(
            body=[assign.with_changes(targets=[assign.targets[0].with_changes(target=target)])],
            leading_lines=[line for line in statement.leading_lines if line.comment is not None])
        self._appended.setdefault(init, []).append(moved)
        self._removed.add(statement)
        assignment = next(iter(self.get_metadata(ScopeProvider, local).assignments[local.value]))
        for access in assignment.references:
            self._uses[access.node] = (owner, attribute)
        self._descend.update((method, init))
        if not self._is_stateless(assign.value):
            self.warn(located(self, statement, f"`{self.module.code_for_node(assign.value.func)}` may hold "
                                               f"parameters or buffers: the state dict gains keys under "
                                               f"`{attribute}.`"))

    def _is_stateless(self, call: cst.Call) -> bool:
        names = self.get_metadata(QualifiedNameProvider, call.func, set())
        return (all(_is_constant(arg.value) for arg in call.args)
                and any(fnmatchcase(n.name.rpartition(".")[2], pattern)
                        for n in names for pattern in STATELESS))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if self._inside or node in self._descend:
            self._inside += 1
            return True
        return False

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self._inside:
            self._inside -= 1
        moved = self._appended.get(original_node)
        if moved:
            updated_node = updated_node.with_changes(
                body=updated_node.body.with_changes(body=[*updated_node.body.body, *moved]))
        return updated_node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        return cst.RemoveFromParent() if original_node in self._removed else updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if updated_node.body or not original_node.body:
            return updated_node
        # The hoisted statement was the block's only one.
        return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        use = self._uses.get(original_node)
        if use is None:
            return updated_node
        owner, attribute = use
        return cst.Attribute(value=cst.Name(owner), attr=cst.Name(attribute),
                             lpar=updated_node.lpar, rpar=updated_node.rpar)
