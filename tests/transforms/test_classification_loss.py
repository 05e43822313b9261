"""The classification_loss transform (problem_type choice + loss chain -> stateless.losses) and its helpers."""

from __future__ import annotations

import copy
from textwrap import dedent, indent
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.transform_helpers import assert_rewrites, assert_unchanged, run
from torch import nn

from stateless.losses import classification_loss
from transforms.classification_loss import ClassificationLoss
from transforms.library.base import TransformError

IMPORTS = "import torch\nfrom torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss\n"


def stock(logits: str = "logits", num_labels: str = "self.num_labels") -> str:
    """Stock's statements (BERT's names by default; GPT-2 says pooled_logits, BART self.config.num_labels)."""
    return f"""\
if self.config.problem_type is None:
    if {num_labels} == 1:
        self.config.problem_type = "regression"
    elif {num_labels} > 1 and (labels.dtype == torch.long or labels.dtype == torch.int):
        self.config.problem_type = "single_label_classification"
    else:
        self.config.problem_type = "multi_label_classification"

if self.config.problem_type == "regression":
    loss_fct = MSELoss()
    if {num_labels} == 1:
        loss = loss_fct({logits}.squeeze(), labels.squeeze())
    else:
        loss = loss_fct({logits}, labels)
elif self.config.problem_type == "single_label_classification":
    loss_fct = CrossEntropyLoss()
    loss = loss_fct({logits}.view(-1, {num_labels}), labels.view(-1))
elif self.config.problem_type == "multi_label_classification":
    loss_fct = BCEWithLogitsLoss()
    loss = loss_fct({logits}, labels)
"""


def head(statements: str, logits: str = "logits") -> str:
    """A classifier module around the loss statements (a dropout, so that train mode draws)."""
    return IMPORTS + f"""

class Head(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_labels = config.num_labels
        self.dropout = torch.nn.Dropout(0.3)
        self.dense = torch.nn.Linear(4, config.num_labels)

    def forward(self, hidden, labels=None):
        {logits} = self.dense(self.dropout(hidden))
        loss = None
        if labels is not None:
{indent(statements.rstrip(), " " * 12)}
        return loss if labels is not None else {logits}
"""


@pytest.mark.parametrize("logits,num_labels", [("logits", "self.num_labels"),                # BERT, RoBERTa
                                               ("pooled_logits", "self.num_labels"),         # GPT-2
                                               ("logits", "self.config.num_labels")])        # BART
def test_the_choice_and_the_chain_become_two_calls(logits: str, num_labels: str) -> None:
    assert_rewrites(ClassificationLoss, head(stock(logits, num_labels), logits), dedent(f"""\
        import torch
        from stateless import classification_loss, problem_type_of

        torch.fx.wrap("classification_loss")


        class Head(torch.nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config
                self.num_labels = config.num_labels
                self.dropout = torch.nn.Dropout(0.3)
                self.dense = torch.nn.Linear(4, config.num_labels)

            def forward(self, hidden, labels=None):
                {logits} = self.dense(self.dropout(hidden))
                loss = None
                if labels is not None:
                    self.config.problem_type = problem_type_of(self.config.problem_type, {num_labels}, labels)
                    loss = classification_loss({logits}, labels, {num_labels}, self.config.problem_type)
                return loss if labels is not None else {logits}
        """))


def test_loss_classes_still_read_elsewhere_stay_imported_and_comments_stay() -> None:
    code = head("# the loss\n" + stock().replace("    loss_fct = BCEWithLogitsLoss()",
                                                 "    # multi-hot labels\n    loss_fct = BCEWithLogitsLoss()"))
    code += "\n\ndef token_loss(logits, labels):\n    return CrossEntropyLoss()(logits, labels)\n"
    result = run(ClassificationLoss, code)
    assert "from torch.nn import CrossEntropyLoss\n" in result
    assert ("            # the loss\n            # multi-hot labels\n"
            "            self.config.problem_type = problem_type_of(") in result


def test_code_without_the_idiom_is_left_alone() -> None:
    assert_unchanged(ClassificationLoss, IMPORTS + "def f(config):\n    if config.problem_type == 'regression':\n"
                     "        return MSELoss()\n")


@pytest.mark.parametrize("change", [
    ("loss_fct = BCEWithLogitsLoss()", "loss_fct = BCEWithLogitsLoss(pos_weight=w)"),   # another loss
    ("labels.dtype == torch.int", "labels.dtype == torch.int16"),                       # another choice
    ("loss = loss_fct(logits, labels)\n", "loss = loss_fct(logits, labels.float())\n"),  # other arguments
    ("logits.view(-1, self.num_labels)", "logits.view(-1, 2)"),
])
def test_a_problem_type_test_in_another_form_is_an_error(change: tuple[str, str]) -> None:
    with pytest.raises(TransformError, match="not stock's"):
        run(ClassificationLoss, head(stock().replace(*change)))
    with pytest.raises(TransformError, match="not stock's"):  # the choice without its chain
        run(ClassificationLoss, head(stock().split("\n\n")[0]))


def test_an_unknown_problem_type_is_refused() -> None:
    with pytest.raises(ValueError, match="problem_type must be one of"):
        classification_loss(torch.zeros(2, 3), torch.zeros(2, 3), 3, "ranking")


# -- equivalence: stock's statements and the rewritten ones in the same module, every problem type -----------

def load(code: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "head_under_test"}
    exec(compile(code, "<head>", "exec"), namespace)
    return namespace["Head"]


CASES = {  # name: (num_labels, problem_type preset, labels)
    "regression, one label": (1, None, lambda: torch.randn(5)),
    "regression, three": (3, "regression", lambda: torch.randn(5, 3)),
    "single label, long": (3, None, lambda: torch.randint(0, 3, (5,))),
    "single label, int": (3, None, lambda: torch.randint(0, 3, (5,), dtype=torch.int)),
    "multi label": (3, None, lambda: torch.randint(0, 2, (5, 3)).float()),
    "multi label, set": (3, "multi_label_classification", lambda: torch.randint(0, 2, (5, 3)).float()),
}


def outcome(model: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, seed: int = 0) -> tuple:
    """The loss and every gradient, or stock's error (int labels: cross-entropy refuses them)."""
    model.zero_grad()
    torch.manual_seed(seed)
    try:
        loss = model(hidden, labels)
    except RuntimeError as error:
        return (str(error),)
    loss.backward()
    return (loss, *(parameter.grad for parameter in model.parameters()))


def same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize("case", list(CASES))
def test_every_problem_type_equals_stock_eager_fx_and_export(case: str) -> None:
    num_labels, preset, make_labels = CASES[case]
    stock_class, ours_class = load(head(stock())), load(run(ClassificationLoss, head(stock())))
    torch.manual_seed(0)
    hidden, labels = torch.randn(5, 4), make_labels()
    reference = stock_class(SimpleNamespace(num_labels=num_labels, problem_type=preset))
    model = ours_class(copy.deepcopy(reference.config))
    model.load_state_dict(reference.state_dict())
    for mode in ("eval", "train"):
        getattr(reference, mode)(), getattr(model, mode)()
        expected = outcome(reference, hidden, labels)
        assert same(outcome(model, hidden, labels), expected), (case, mode)
        assert model.config.problem_type == reference.config.problem_type  # written as stock writes it
    # fx: traced with the config undecided, one call chooses from the labels' dtype when the graph runs.
    traced_model = ours_class(SimpleNamespace(num_labels=num_labels, problem_type=preset))
    traced_model.load_state_dict(reference.state_dict())
    graph = torch.fx.symbolic_trace(traced_model.train())
    assert [node.target for node in graph.graph.nodes if node.op == "call_function"] == [classification_loss]
    assert traced_model.config.problem_type == preset  # tracing decides nothing
    assert same(outcome(graph, hidden, labels), expected), case
    # export: the dtype is static, the choice made while exporting (and written, as stock's first call does).
    if len(expected) > 1:
        exported = torch.export.export(model.eval(), (hidden, labels), strict=False).module()
        reference.eval()
        assert torch.equal(exported(hidden, labels), reference(hidden, labels)), case


def test_one_fx_graph_serves_every_dtype() -> None:
    ours = load(run(ClassificationLoss, head(stock())))(SimpleNamespace(num_labels=3, problem_type=None)).eval()
    graph = torch.fx.symbolic_trace(ours)
    hidden = torch.randn(5, 4)
    for labels in (torch.randint(0, 3, (5,)), torch.randint(0, 2, (5, 3)).float()):
        fresh = load(head(stock()))(SimpleNamespace(num_labels=3, problem_type=None)).eval()
        fresh.load_state_dict(ours.state_dict())
        assert torch.equal(graph(hidden, labels), fresh(hidden, labels))
