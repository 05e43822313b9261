"""LayerDrop's Python draw and branch in a layer loop -> a recorded decision and ``unless_dropped``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from transforms.analysis.names import bound_names, names_outside, names_read
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import all_params, code_of
from transforms.library.base import Transform
from transforms.library.layer_drop_forms import TorchDraw, carried, python_draw_test, torch_draw
from transforms.library.submodules import MODULE_BASES, ClassFamily, InitSite, append_to_init, fresh_names, receiver

_DRAWS = ("random.uniform", "random.random")
_ZERO, _ONE = m.Integer("0") | m.Float("0.0"), m.Integer("1") | m.Float("1.0")
_EMPTY = m.List(elements=[]) | m.Tuple(elements=[])


@dataclass(frozen=True)
class LayerDropOptions:
    module: str = "stateless"  # where the generated code imports LayerDrop and unless_dropped from
    attribute: str = "layer_drop"  # the preferred name of the LayerDrop submodule
    module_bases: tuple[str, ...] = MODULE_BASES  # qualified names whose subclasses are modules


@dataclass
class _Idiom:
    """One layer-drop site of a loop body (indices into the loop body's statements)."""

    draw: int  # ``u = random.uniform(0, 1)``
    branch: int  # ``if self.training and (u < p): ...``
    end: int  # one past the last statement replaced
    receiver: str
    probability: cst.BaseExpression
    state: str  # the one variable the layer carries (``hidden_states``)
    run: list[int] | None  # loop-body indices of the layer's statements; None: the ``else`` branch's
    draws: str = "random"  # what the stock code draws from: Python's random, or torch (training only)


@dataclass
class _Class:
    node: cst.ClassDef
    site: InitSite | None = None
    gate: str | None = None  # the LayerDrop submodule's attribute, once created
    draws: str | None = None  # its sites' draws (one kind per class)


class LayerDropLoop(Transform):
    """Replace the LayerDrop idiom of a layer loop by a decision tracers record, and a select.

    Stock code draws ``random.uniform(0, 1)`` per layer and skips the layer in
    Python when ``self.training`` and the draw is below the drop probability, so a
    traced graph keeps the one draw it saw.  The draw becomes a call of a
    ``stateless.LayerDrop`` submodule (added at the end of ``__init__``; no
    parameters, so the state dict is unchanged) and the layer's code the body of a
    local function that ``stateless.unless_dropped`` runs or skips: eagerly exactly
    as stock does (the same draw from ``random``, the layer skipped in Python), in a
    traced graph as a fresh draw per call and ``torch.where`` (see
    ``stateless/layerdrop.py`` for what that means for gradients and dropout).

    The idiom: in a ``for`` loop of a module's method, ``u = random.uniform(0, 1)``
    (or ``random.random()``) right before ``if <self>.training and (u < p):`` whose
    body is ``continue`` (the layer is the rest of the loop body) or assignments of
    values only that branch uses, with an ``else`` that is the layer.  The layer's
    code must carry exactly one variable to the code after it (the hidden states),
    bound before the loop, and may not return, yield, break or continue; ``u`` may
    not be read elsewhere.  A loop that does not fit is reported and left as is::

        for idx, layer in enumerate(self.layers):                    # before
            dropout_probability = random.uniform(0, 1)
            if self.training and (dropout_probability < self.layerdrop):
                continue
            layer_outputs = layer(hidden_states, attention_mask)
            hidden_states = layer_outputs[0]

        for idx, layer in enumerate(self.layers):                    # after
            dropped = self.layer_drop(self.layerdrop, hidden_states)

            def run_layer(hidden_states):
                layer_outputs = layer(hidden_states, attention_mask)
                hidden_states = layer_outputs[0]
                return hidden_states

            hidden_states = stateless.unless_dropped(dropped, run_layer, hidden_states)
        # __init__ ends with: self.layer_drop = stateless.LayerDrop()

    HF 4.35 on draw ``torch.rand([])``, in training only (the shapes: ``library/layer_drop_forms.py``):
    the same rewrite, with ``stateless.LayerDrop("torch")`` drawing as they do.
    """

    DESCRIPTION = "LayerDrop's random.uniform + if self.training branch -> a LayerDrop submodule and unless_dropped"
    Options = LayerDropOptions

    def __init__(self, context: CodemodContext, options: LayerDropOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self._classes: list[_Class] = []
        self._functions: list[cst.FunctionDef] = []
        self._idioms: dict[int, list[_Idiom]] = {}  # id of an original loop body -> its sites

    # -- finding the idiom ------------------------------------------------------------------------------
    def focus(self) -> Iterable[cst.CSTNode]:
        return [loop for loop in self.index.nodes(cst.For) if isinstance(loop.body, cst.IndentedBlock)
                and any(self._draw(statement) is not None or m.findall(statement, m.Call(func=m.Attribute(
                    attr=m.Name("rand")))) for statement in loop.body.body)]

    def _torch_draw(self, value: cst.BaseExpression) -> bool:
        """Whether ``value`` is ``torch.rand([])``: one 0-d draw from torch's generator."""
        return isinstance(value, cst.Call) and self.qualified_names(value) == {"torch.rand"} and m.matches(
            value, m.Call(args=[m.Arg(_EMPTY, keyword=None)]))

    def _draw(self, statement: cst.BaseStatement) -> str | None:
        """The variable of ``u = random.uniform(0, 1)`` / ``u = random.random()``, if ``statement`` is one."""
        if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(target=m.Name())], value=m.Call())])):
            return None
        assert isinstance(statement, cst.SimpleStatementLine)
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        call = assign.value
        names = self.qualified_names(call) & set(_DRAWS)
        if names == {"random.uniform"} and m.matches(call, m.Call(args=[m.Arg(_ZERO, keyword=None), m.Arg(
                _ONE, keyword=None)])):
            pass
        elif not (names == {"random.random"} and not call.args):
            return None
        target = assign.targets[0].target
        assert isinstance(target, cst.Name)
        return target.value

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._classes.append(_Class(node))
        return True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._functions.append(node)
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self._functions.pop()
        return updated_node

    def visit_For(self, node: cst.For) -> bool:
        if isinstance(node.body, cst.IndentedBlock):
            sites = [site for index, statement in enumerate(node.body.body)
                     if self._draw(statement) is not None and (site := self._site(node, index)) is not None]
            me = receiver(self._functions[-1]) if self._functions else None
            for index in range(len(node.body.body)) if me is not None and self._classes else ():
                form = torch_draw(node.body.body, index, me, self._torch_draw)
                if form is not None and (site := self._torch_site(node, form, me)) is not None:
                    sites.append(site)
            if sites:
                self._idioms[id(node.body)] = sites
        return True

    def _site(self, loop: cst.For, draw: int) -> _Idiom | None:
        """The idiom starting at statement ``draw`` of ``loop``'s body, or None (reported) when it does not fit."""
        body = loop.body.body
        variable = self._draw(body[draw])
        assert variable is not None
        where = body[draw]
        if not self._functions or not self._classes or draw + 1 >= len(body) or not isinstance(body[draw + 1], cst.If):
            self.report(where, f"`{variable}` is drawn for LayerDrop, but no `if <self>.training and ...` follows; "
                               "left as is")
            return None
        function, owner = self._functions[-1], self._classes[-1]
        branch = body[draw + 1]
        assert isinstance(branch, cst.If)
        me = receiver(function)
        found = None if me is None else self.extract(branch.test, python_draw_test(me, variable))
        if found is None:
            self.report(branch, f"`{code_of(branch.test)}` is not `{me}.training and ({variable} < p)`; left as is")
            return None
        probability = found["p"]
        assert isinstance(probability, cst.BaseExpression)
        if isinstance(branch.orelse, cst.Else) and isinstance(branch.orelse.body, cst.IndentedBlock):
            skip, run, end, layer = list(branch.body.body), list(branch.orelse.body.body), draw + 2, None
        elif branch.orelse is None and m.matches(branch.body, m.IndentedBlock(body=[
                m.SimpleStatementLine(body=[m.Continue()])]) | m.SimpleStatementSuite(body=[m.Continue()])):
            skip, run, end, layer = [], list(body[draw + 2:]), len(body), list(range(draw + 2, len(body)))
        else:
            return self._refuse(branch, "the branch is neither `continue` nor an `else` holding the layer")
        if not isinstance(branch.body, cst.IndentedBlock) and skip:
            return self._refuse(branch, "the branch is on one line")
        fit = self._fit(loop, branch, variable, probability, skip, run, [body[draw], branch])
        if fit is None or owner.draws in ("torch", "torch_positive"):
            return None if fit is None else self._refuse(branch, "the class draws LayerDrop from both random and torch")
        owner.draws = "random"
        return _Idiom(draw, draw + 1, end, me, probability, fit, layer)

    def _torch_site(self, loop: cst.For, form: TorchDraw, me: str) -> _Idiom | None:
        """The idiom of a torch draw (``layer_drop_forms.torch_draw``), or None (reported) when it does not fit."""
        body, owner = loop.body.body, self._classes[-1]
        if form.layer_branch is None:  # the continue form: the layer is the rest of the loop body
            skip, run, layer, branch, end = [], list(body[form.end:]), list(range(form.end, len(body))), form.start, len(body)
        else:
            holder = body[form.layer_branch]  # ``if to_drop: <skip> else: <layer>``, or 5.x's ``if not to_drop: <layer>``
            assert isinstance(holder, cst.If)
            skip, run = ((list(holder.body.body), list(holder.orelse.body.body)) if isinstance(holder.orelse, cst.Else)
                         else ([], list(holder.body.body)))
            layer, branch, end = None, form.layer_branch, form.end
        draws = "torch_positive" if form.positive else "torch"  # one LayerDrop kind per class
        if owner.draws not in (None, draws):
            return self._refuse(body[form.start], f"the class draws LayerDrop both as {owner.draws} and as {draws}")
        fit = self._fit(loop, body[form.start], form.variable, form.probability, skip, run, body[form.start:form.end])
        if fit is None:
            return None
        owner.draws = draws
        return _Idiom(form.start, branch, end, me, form.probability, fit, layer, draws)

    def _fit(self, loop: cst.For, where: cst.CSTNode, variable: str, probability: cst.BaseExpression,
             skip: Sequence[cst.BaseStatement | cst.BaseSmallStatement], run: list[cst.BaseStatement],
             idiom: Sequence[cst.CSTNode]) -> str | None:
        """The variable the layer carries, or None (reported) when the site cannot be rewritten."""
        function, owner, branch = self._functions[-1], self._classes[-1], where
        if not is_pure(probability):
            return self._refuse(branch, f"the probability `{code_of(probability)}` may have effects")
        family = ClassFamily(self.index, self.options.module_bases)
        if not family.is_module(owner.node):
            return self._refuse(branch, f"{owner.node.name.value} is not a known nn.Module subclass (see module_bases)")
        site = family.init_site(owner.node)
        if isinstance(site, str):
            return self._refuse(branch, f"cannot add a submodule to {owner.node.name.value}: {site}")
        owner.site = site
        outside = {*(id(statement) for statement in idiom), *(id(statement) for statement in run)}
        reads = names_outside(function.body, outside, names_read)
        if variable in reads or any(variable in names_read(statement) for statement in [*skip, *run]):
            return self._refuse(branch, f"`{variable}` is read elsewhere too")
        state, problem = carried(skip, run, reads, names_outside(function.body, outside, bound_names)
                                 | {p.name.value for p in all_params(function.params, starred=True)})
        if state is None:
            return self._refuse(branch, problem)
        return state

    def _refuse(self, node: cst.CSTNode, problem: str) -> None:
        self.report(node, f"LayerDrop loop left as is: {problem}")
        return None

    # -- rewriting --------------------------------------------------------------------------------------
    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        sites = self._idioms.pop(id(original_node), None)
        if not sites:
            return updated_node
        owner = self._classes[-1]
        assert owner.site is not None
        if owner.gate is None:
            owner.gate = ClassFamily(self.index, self.options.module_bases).fresh_attribute(
                owner.node, self.options.attribute, self.options.attribute)
        AddImportsVisitor.add_needed_import(self.context, self.options.module)
        RemoveImportsVisitor.remove_unused_import(self.context, "random")  # only if nothing else draws
        statements = list(updated_node.body)
        for site in reversed(sites):
            statements[site.draw:site.end] = self._replacement(site, statements, owner.gate)
        return updated_node.with_changes(body=statements)

    def _replacement(self, site: _Idiom, statements: list[cst.BaseStatement], gate: str) -> list[cst.BaseStatement]:
        draw, branch = statements[site.draw], statements[site.branch]
        assert isinstance(branch, cst.If)
        if site.run is None:  # the flag form's layer: ``else:`` of ``if to_drop:``, or ``if not to_drop:`` (5.x)
            held = branch.orelse.body if isinstance(branch.orelse, cst.Else) else branch.body
            assert isinstance(held, cst.IndentedBlock)
            run = list(held.body)
        else:
            run = [statements[index] for index in site.run]
        if run:  # the function's body starts at its first statement, not at a blank line
            run[0] = run[0].with_changes(leading_lines=[line for line in run[0].leading_lines if line.comment])
        function = self._functions[-1]
        taken = names_read(function) | bound_names(function.body) | {p.name.value for p in all_params(function.params, starred=True)}
        decision = next(name for name in fresh_names("dropped", "dropped") if name not in taken)
        layer = next(name for name in fresh_names("run_layer", "run_layer") if name not in taken)
        module, state = self.options.module, site.state
        later = [] if branch is draw else [line for line in branch.leading_lines
                                            if line.comment or site.draws == "random"]
        comments = [*draw.leading_lines, *later] if isinstance(draw, (cst.SimpleStatementLine, cst.If)) else []
        decide = cst.parse_statement(f"{decision} = {site.receiver}.{gate}({code_of(site.probability)}, {state})\n")
        local = cst.parse_statement(f"def {layer}({state}):\n    return {state}\n")
        assert isinstance(local, cst.FunctionDef) and isinstance(local.body, cst.IndentedBlock)
        local = local.with_changes(leading_lines=[cst.EmptyLine(indent=False)],
                                   body=local.body.with_changes(body=[*run, *local.body.body]))
        select = cst.parse_statement(f"{state} = {module}.unless_dropped({decision}, {layer}, {state})\n")
        return [decide.with_changes(leading_lines=comments), local,
                select.with_changes(leading_lines=[cst.EmptyLine(indent=False)])]

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        owner = self._classes.pop()
        if owner.gate is None:
            return updated_node
        assert owner.site is not None
        draws = f'"{owner.draws}"' if owner.draws in ("torch", "torch_positive") else ""
        line = cst.parse_statement(f"{owner.site.receiver}.{owner.gate} = {self.options.module}.LayerDrop({draws})\n")
        assert isinstance(line, cst.SimpleStatementLine)
        return append_to_init(updated_node, owner.site, [line])

