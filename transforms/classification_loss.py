"""The classification heads' ``problem_type`` choice and loss chain -> two calls of ``stateless.losses``."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.syntax import code_of
from transforms.library.base import TransformError
from transforms.library.leaf_helper import LeafHelperRewrite

LOSSES = {
    "MSELoss": ("torch.nn.MSELoss", "torch.nn.modules.loss.MSELoss"),
    "CrossEntropyLoss": ("torch.nn.CrossEntropyLoss", "torch.nn.modules.loss.CrossEntropyLoss"),
    "BCEWithLogitsLoss": ("torch.nn.BCEWithLogitsLoss", "torch.nn.modules.loss.BCEWithLogitsLoss"),
}

# Stock's code from transformers 4.6 on (4.15 for GPT-2 and BART), names as placeholders: {config},
# {num_labels}, {labels}, {logits}, {loss}, {fct} and one per loss class.
STOCK = """\
if {config}.problem_type is None:
    if {num_labels} == 1:
        {config}.problem_type = "regression"
    elif {num_labels} > 1 and ({labels}.dtype == torch.long or {labels}.dtype == torch.int):
        {config}.problem_type = "single_label_classification"
    else:
        {config}.problem_type = "multi_label_classification"
if {config}.problem_type == "regression":
    {fct} = {MSELoss}()
    if {num_labels} == 1:
        {loss} = {fct}({logits}.squeeze(), {labels}.squeeze())
    else:
        {loss} = {fct}({logits}, {labels})
elif {config}.problem_type == "single_label_classification":
    {fct} = {CrossEntropyLoss}()
    {loss} = {fct}({logits}.view(-1, {num_labels}), {labels}.view(-1))
elif {config}.problem_type == "multi_label_classification":
    {fct} = {BCEWithLogitsLoss}()
    {loss} = {fct}({logits}, {labels})
"""

GENERATED = """\
{config}.problem_type = problem_type_of({config}.problem_type, {num_labels}, {labels})
{loss} = classification_loss({logits}, {labels}, {num_labels}, {config}.problem_type)
"""


class ClassificationLoss(LeafHelperRewrite):
    """Stock's ``problem_type`` choice and its loss chain -> ``problem_type_of`` and the fx leaf ``classification_loss``.

    From transformers 4.6 the sequence-classification heads choose their loss from
    ``config.problem_type``, which their first call with labels sets from ``num_labels`` and the
    labels' dtype.  torch.fx cannot branch on a traced dtype, and a graph traced after that first call
    has one loss baked in.  The two statements become two calls of :mod:`stateless.losses`: the config
    is written as stock writes it (eager; torch.export, whose dtypes are static), and the loss is one
    call fx records (registered with ``torch.fx.wrap``) that makes the choice from the labels' dtype when
    the graph runs, unless the config had already made it.  The functional losses are the very kernels
    the modules call.  The two statements must be stock's exactly (``STOCK``: any names for the config,
    the number of labels, the labels, the logits, the loss and its local; comments and layout free);
    a ``problem_type`` test in another form is an error, not left behind::

        if self.config.problem_type is None:                                   # before
            if self.num_labels == 1:
                self.config.problem_type = "regression"
            elif self.num_labels > 1 and (labels.dtype == torch.long or labels.dtype == torch.int):
                self.config.problem_type = "single_label_classification"
            else:
                self.config.problem_type = "multi_label_classification"
        if self.config.problem_type == "regression":
            loss_fct = MSELoss()
            ...                                                                 # (the three losses)

        self.config.problem_type = problem_type_of(self.config.problem_type, self.num_labels, labels)   # after
        loss = classification_loss(pooled_logits, labels, self.num_labels, self.config.problem_type)
    """

    DESCRIPTION = "problem_type choice + loss chain -> problem_type_of(...), classification_loss(...) (fx leaf)"
    HELPER = "classification_loss"

    def candidate(self, node: cst.If) -> bool:
        test = node.test
        return (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                and isinstance(test.comparisons[0].operator, cst.Is)
                and isinstance(test.left, cst.Attribute) and test.left.attr.value == "problem_type"
                and isinstance(test.comparisons[0].comparator, cst.Name)
                and test.comparisons[0].comparator.value == "None")

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._rewrite_pairs(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.rewritten:
            AddImportsVisitor.add_needed_import(self.context, self.helper_module, "problem_type_of")
        return super().leave_Module(original_node, updated_node)

    def rewrite(self, node: cst.If) -> cst.Assign | None:
        return None  # two statements become two: _rewrite_pairs does the work

    def _rewrite_pairs(self, original: Sequence[cst.BaseStatement],
                       updated: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
        """``updated`` with each choice and its chain replaced by the two calls, or None when it has none."""
        statements: list[cst.BaseStatement] = []
        changed = False
        index = 0
        while index < len(original):
            choice = original[index]
            if not (isinstance(choice, cst.If) and self.candidate(choice)):
                statements.append(updated[index])
                index += 1
                continue
            chain = original[index + 1] if index + 1 < len(original) else None
            lines = cst.parse_module(GENERATED.format(**self._names(choice, chain))).body
            inner = [line for statement in (choice, chain) if statement is not None
                     for line in _comments(statement.with_changes(leading_lines=()))]
            statements.extend([lines[0].with_changes(leading_lines=[*choice.leading_lines, *inner]), *lines[1:]])
            changed = True
            index += 2
        self.rewritten |= changed
        return statements if changed else None

    def _names(self, choice: cst.If, chain: cst.BaseStatement | None) -> dict[str, str]:
        """The names stock's two statements use, checked against ``STOCK``; a TransformError if they differ."""
        assert isinstance(choice.test, cst.Comparison) and isinstance(choice.test.left, cst.Attribute)
        names = {"config": code_of(choice.test.left.value)}
        try:
            assert isinstance(chain, cst.If)
            inner = choice.body.body[0]
            assert isinstance(inner, cst.If) and isinstance(inner.test, cst.Comparison)
            names["num_labels"] = code_of(inner.test.left)
            branches = (chain.body.body, _orelse(chain).body.body, _orelse(_orelse(chain)).body.body)
            names["fct"] = code_of(_assignment(branches[0][0]).targets[0].target)
            last = _assignment(branches[2][1])
            assert isinstance(last.value, cst.Call) and len(last.value.args) == 2
            names["loss"] = code_of(last.targets[0].target)
            names["logits"], names["labels"] = (code_of(arg.value) for arg in last.value.args)
            for branch, (loss, qualified) in zip(branches, LOSSES.items()):
                constructor = _assignment(branch[0]).value
                assert isinstance(constructor, cst.Call) and self.qualified_names(constructor.func) & set(qualified)
                names[loss] = code_of(constructor.func)
                if isinstance(constructor.func, cst.Name):
                    self.remove_unused_import_of(constructor.func.value)  # if nothing else reads it
            same = _syntax(code_of(choice) + "\n" + code_of(chain)) == _syntax(STOCK.format(**names))
        except (AssertionError, AttributeError, IndexError):
            same = False
        if not same:
            raise TransformError(f"`{code_of(choice.test)}`: the problem_type choice and the loss chain after it "
                                 "are not stock's (transforms/classification_loss.py STOCK)")
        return names


def _orelse(node: cst.If) -> cst.If:
    assert isinstance(node.orelse, cst.If)
    return node.orelse


def _assignment(statement: cst.CSTNode) -> cst.Assign:
    """The one assignment ``statement`` is (an AssertionError otherwise)."""
    assert isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign) and len(assign.targets) == 1
    return assign


def _syntax(code: str) -> str:
    """The code's syntax tree, without layout and comments."""
    return ast.dump(ast.parse(textwrap.dedent(code)))


def _comments(node: cst.CSTNode) -> list[cst.EmptyLine]:
    """Comment lines inside ``node``, kept above its replacement."""
    return [cst.EmptyLine(comment=comment) for comment in m.findall(node, m.Comment())
            if isinstance(comment, cst.Comment)]
