"""A branch on tensor dtypes inside a method -> a call of a module-level function that torch.fx keeps as a leaf."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.names import assigned_names, bound_names, imports_module, names_in_order
from transforms.analysis.receivers import ReceiverChains
from transforms.analysis.syntax import code_of, dotted_name
from transforms.library.base import Transform
from transforms.library.submodules import fresh_names

# The dtypes a test may compare with (torch.<name>).
_DTYPES = frozenset({
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8", "int16", "short",
    "int32", "int", "int64", "long", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"})
_TENSOR_CLASSES = frozenset({"torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter"})
_COMPARISONS = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn, cst.Is, cst.IsNot)


@dataclass
class _Plan:
    function: cst.FunctionDef  # the module-level function the branch becomes
    call: cst.SimpleStatementLine  # the line that replaces the branch
    owner: cst.CSTNode  # the top-level statement (class or def) the function goes before


class DtypeBranchLeaf(Transform):
    """Move an ``if`` that tests only dtypes out of its method, into a function registered with ``torch.fx.wrap``.

    ``symbolic_trace`` cannot branch on the dtype of a traced tensor (its
    dtype is a Proxy) and evaluates ``isinstance(<Proxy>, torch.Tensor)`` to
    False, silently dropping the branch.  A test made only of ``<tensor>.dtype``
    comparisons with ``torch`` dtypes, ``in`` lists of them and
    ``isinstance(<tensor>, torch.Tensor)``, over a body of assignments, moves
    as it is written into a module-level function whose parameters are the
    tensors it reads and whose result is the one variable it assigns that
    is used later.  fx records one call of that function (a leaf); eager
    mode and torch.export run the very same code (the dtype is static there).
    Identical branches share one function::

        class T5LayerNorm(nn.Module):                                          # before
            def forward(self, hidden_states):
                ...
                if self.weight.dtype in [torch.float16, torch.bfloat16]:
                    hidden_states = hidden_states.to(self.weight.dtype)

        def T5LayerNorm_forward_dtype_branch(hidden_states, weight):           # after
            if weight.dtype in [torch.float16, torch.bfloat16]:
                hidden_states = hidden_states.to(weight.dtype)
            return hidden_states


        torch.fx.wrap("T5LayerNorm_forward_dtype_branch")


        class T5LayerNorm(nn.Module):
            def forward(self, hidden_states):
                ...
                hidden_states = T5LayerNorm_forward_dtype_branch(hidden_states, self.weight)

    Only branches inside methods move (never one in a module-level function,
    so a second run finds nothing); a branch whose body is read afterwards
    through more than one variable stays, with a warning.
    """

    DESCRIPTION = "if <dtype test>: <assignments> inside a method -> x = <fx leaf function>(...)"

    def focus(self) -> Iterable[cst.CSTNode]:
        self._plans: dict[int, _Plan] = {}
        self._functions: dict[str, str] = {}  # code of a function with a placeholder name -> its name
        self._names: set[str] = set(self.index.root.bindings)
        for node in self.index.nodes(cst.If):
            if id(node) not in self._plans and self._is_branch(node):
                plan = self._plan(node)
                if plan is not None:
                    self._plans[id(node)] = plan
        return [self.index.module] if self._plans else []

    # -- which branches ------------------------------------------------------------------------------------
    def _method(self, node: cst.CSTNode) -> tuple[cst.CSTNode, cst.FunctionDef, str] | None:
        """(top-level statement, method, receiver name) when ``node`` is inside a method of a class."""
        functions = [a for a in self.index.ancestors(node) if isinstance(a, cst.FunctionDef)]
        if not functions:
            return None
        method = functions[-1]
        block = self.index.parent(method)
        cls = self.index.parent(block) if block is not None else None
        if not isinstance(cls, cst.ClassDef) or self.index.parent(cls) is not self.index.module:
            return None
        positional = [*method.params.posonly_params, *method.params.params]
        if not positional or any(m.matches(d.decorator, m.Name("staticmethod") | m.Name("classmethod"))
                                 for d in method.decorators):
            return None
        return cls, method, positional[0].name.value

    def _is_branch(self, node: cst.If) -> bool:
        if node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
            return False
        if self._method(node) is None or not self._dtype_test(node.test, reads=[]):
            return False
        for statement in node.body.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                return False
            for small in statement.body:
                if not isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                    return False
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                if not all(isinstance(target, cst.Name) for target in targets):
                    return False
        return True

    def _dtype_test(self, node: cst.BaseExpression, reads: list[bool]) -> bool:
        """Whether ``node`` is made only of dtype reads, dtype constants and tensor isinstance tests."""
        if isinstance(node, cst.BooleanOperation):
            return self._dtype_test(node.left, reads) and self._dtype_test(node.right, reads)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            return self._dtype_test(node.expression, reads)
        if isinstance(node, cst.Comparison):
            return all(isinstance(t.operator, _COMPARISONS) for t in node.comparisons) and all(
                self._dtype_value(operand, reads) for operand in [node.left, *(t.comparator for t in node.comparisons)])
        if isinstance(node, cst.Call):
            return self._tensor_test(node)
        return False

    def _dtype_value(self, node: cst.BaseExpression, reads: list[bool]) -> bool:
        if isinstance(node, (cst.List, cst.Tuple)):
            return bool(node.elements) and all(
                isinstance(e, cst.Element) and self._dtype_value(e.value, reads) for e in node.elements)
        if isinstance(node, cst.Attribute) and node.attr.value == "dtype" and dotted_name(node.value) is not None:
            reads.append(True)
            return True
        names = self.qualified_names(node)
        return bool(names) and all(n.startswith("torch.") and n.rpartition(".")[2] in _DTYPES for n in names)

    def _tensor_test(self, node: cst.Call) -> bool:
        """``isinstance(<name or attribute chain>, torch.Tensor)``."""
        return ("builtins.isinstance" in self.qualified_names(node) and len(node.args) == 2
                and not any(a.star or a.keyword for a in node.args) and dotted_name(node.args[0].value) is not None
                and bool(self.qualified_names(node.args[1].value) & _TENSOR_CLASSES))

    # -- the function it becomes ---------------------------------------------------------------------------
    def _plan(self, node: cst.If) -> _Plan | None:
        found = self._method(node)
        assert found is not None
        owner, method, receiver = found
        reads: list[bool] = []
        self._dtype_test(node.test, reads)
        if not reads:
            return None  # an isinstance test alone is no dtype branch
        parameters: dict[str, str] = {}  # code of the argument -> parameter name
        chains = ReceiverChains(receiver)
        node.visit(chains)
        if chains.other_use:
            return None  # the branch uses the instance for more than tensors' dtypes
        inputs = [name for name in self._inputs(node) if name != receiver]
        taken = set(inputs) | bound_names(node.body)
        for name in inputs:
            parameters[name] = name
        for chain in chains.chains:
            text = code_of(chain)
            if text not in parameters:
                stem = "_".join(text.split(".")[1:])
                parameters[text] = next(n for n in fresh_names(stem, stem)
                                        if n not in taken and n not in parameters.values())
        results = self._results(node, method)
        if results is None:
            return None
        if len(results) != 1:
            self.report(node, f"dtype branch left in place: it sets {len(results)} variables used later "
                              f"({', '.join(sorted(results)) or 'none'}), a leaf returns one")
            return None
        result = next(iter(results))
        if result not in parameters:
            if not self._bound_before(result, node):
                return None  # not bound before the branch: keep Python's own error if the branch is skipped
            parameters[result] = result  # its value when the branch is not taken
        body = node.visit(_Renamer({t: cst.Name(p) for t, p in parameters.items() if t != p}))
        assert isinstance(body, cst.If)
        body = body.with_changes(leading_lines=())
        params = [cst.Param(cst.Name(p)) for p in parameters.values()]
        template = cst.FunctionDef(
            name=cst.Name("__name__"), params=cst.Parameters(params=params),
            body=cst.IndentedBlock(body=[body, cst.SimpleStatementLine([cst.Return(cst.Name(result))])]))
        key = code_of(template)
        name = self._functions.get(key)
        if name is None:
            stem = f"{owner.name.value}_{method.name.value}_dtype_branch"
            name = next(n for n in fresh_names(stem, stem) if n not in self._names)
            self._names.add(name)
            self._functions[key] = name
        function = template.with_changes(name=cst.Name(name))
        args = [cst.Arg(cst.parse_expression(text)) for text in parameters]
        call = cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(result))], cst.Call(cst.Name(name), args))],
            leading_lines=node.leading_lines)
        return _Plan(function, call, owner)

    def _is_local(self, name: cst.Name) -> bool:
        scope = self.index.lookup(self.index.scope_of(name), name.value)
        return scope is not None and scope is not self.index.root and not scope.is_class

    def _inputs(self, node: cst.If) -> list[str]:
        """The method's variables the branch reads before it sets them, in source order."""
        inputs: list[str] = []
        assigned: set[str] = set()

        def read(expression: cst.CSTNode) -> None:
            for name in names_in_order(expression):
                if name.value not in assigned and name.value not in inputs and self._is_local(name):
                    inputs.append(name.value)

        read(node.test)
        assert isinstance(node.body, cst.IndentedBlock)
        for statement in node.body.body:
            assert isinstance(statement, cst.SimpleStatementLine)
            for small in statement.body:
                if isinstance(small, cst.AugAssign):
                    read(small.target)
                if small.value is not None:  # assignments only (_is_branch)
                    read(small.value)
                assigned |= bound_names(small)
        return inputs

    def _bound_before(self, name: str, node: cst.If) -> bool:
        target = next(n for n in assigned_names(node.body) if n.value == name)
        bindings, _ = self.index.local_uses(target)
        position = self.index.statement_position(node)
        return any(isinstance(b, cst.Param) or self.index.statement_position(b) < position for b in bindings)

    def _results(self, node: cst.If, method: cst.FunctionDef) -> set[str] | None:
        """The variables the branch sets that are read after it: outside it, not inside another branch setting them."""
        results = set()
        for target in sorted(bound_names(node.body)):
            bindings = [b for b in assigned_names(node.body) if b.value == target]
            _, reads = self.index.local_uses(bindings[0]) if bindings else ([], [])
            for read in reads:
                if any(a is node for a in self.index.ancestors(read)):
                    continue
                if any(isinstance(a, cst.If) and a is not node and self._is_branch(a) and target in bound_names(a.body)
                       for a in self.index.ancestors(read)):
                    continue  # another such branch, which sets it first
                results.add(target)
                break
        return results

    # -- rewriting -----------------------------------------------------------------------------------------
    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not any(id(s) in self._plans for s in original_node.body):
            return updated_node
        body = [self._plans[id(o)].call if id(o) in self._plans else u
                for o, u in zip(original_node.body, updated_node.body)]
        return updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._plans:
            return updated_node
        emitted: set[str] = set()
        before: dict[int, list[cst.BaseStatement]] = {}
        for plan in self._plans.values():
            name = plan.function.name.value
            if name in emitted:
                continue
            emitted.add(name)
            wrap = cst.parse_statement(f'torch.fx.wrap("{name}")\n')
            spaced = [cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
            before.setdefault(id(plan.owner), []).extend([
                plan.function.with_changes(leading_lines=spaced), wrap.with_changes(leading_lines=spaced)])
        body: list[cst.BaseStatement] = []
        for original, updated in zip(original_node.body, updated_node.body):
            added = before.get(id(original), [])
            if added:
                added[0] = added[0].with_changes(leading_lines=updated.leading_lines or added[0].leading_lines)
                updated = updated.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
            body += [*added, updated]
        if not imports_module(original_node, "torch"):
            AddImportsVisitor.add_needed_import(self.context, "torch")
        return updated_node.with_changes(body=body)


class _Renamer(cst.CSTTransformer):
    """Replace receiver chains (by their code) and local names by the function's parameter names."""

    def __init__(self, names: dict[str, cst.Name]) -> None:
        self.names = names

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        text = dotted_name(original_node)
        return self.names[text].deep_clone() if text in self.names else updated_node
