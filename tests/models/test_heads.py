"""The heads users fine-tune (4.5.1): each is stock transformers bit for bit, for each loss stock picks.

Stock 4.5.1 picks the loss from the config (``num_labels == 1``: regression, else single-label
cross-entropy; it has no ``config.problem_type`` and no multi-label loss; BART is cross-entropy only),
a Python value fixed before tracing: a traced graph computes the loss of the config it was traced with,
and a model of another ``num_labels`` is another model (its classifier's shape differs).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import load_script
from support import REPO, SUPPORT, TORCHRUN, real_weights
from support.heads import HEADS as PIPELINED
from support.heads import head_family_at
from support.model_checks import Family, assert_equal_gradients, fx_trace, scalar
from support.model_families import FAMILIES

ROWS, LENGTH = 3, 7
REGRESSION, SINGLE = "regression", "single_label_classification"
# (family, class, problem types): token classification is single-label only (stock 4.5.1).
HEADS = [("gpt2", "GPT2ForSequenceClassification", (REGRESSION, SINGLE)),
         ("bert", "BertForSequenceClassification", (REGRESSION, SINGLE)),
         ("bert", "BertForTokenClassification", (SINGLE,)),
         ("roberta", "RobertaForSequenceClassification", (REGRESSION, SINGLE)),
         ("roberta", "RobertaForTokenClassification", (SINGLE,)),
         ("bart", "BartForSequenceClassification", (SINGLE,))]
CASES = [(family, name, problem, labels) for family, name, problems in HEADS for problem in problems
         for labels in (True, False)]
IDS = [f"{name}-{problem}-{'labels' if labels else 'logits'}" for _, name, problem, labels in CASES]


def pair(family: Family, class_name: str, problem: str) -> tuple[Any, Any]:
    config = family.make_config(family.configs[0])
    config.num_labels = 1 if problem == REGRESSION else 3
    config.pad_token_id = 1  # GPT-2's default has none: batches of one row only
    torch.manual_seed(0)
    reference = getattr(family.stock, class_name)(config)
    converted = getattr(family.generated, class_name)(config)
    converted.load_state_dict(reference.state_dict(), strict=True)
    return reference, converted


def inputs(family: Family, class_name: str, problem: str, labels: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(3, family.make_config(family.configs[0]).vocab_size, (ROWS, LENGTH), generator=generator)
    mask = torch.ones(ROWS, LENGTH, dtype=torch.long)
    ids[1, -2:] = 1  # padding (GPT-2 picks the last non-pad token)
    mask[1, -2:] = 0
    ids[:, -3] = 2  # BART reads the last <eos> of each row (the same count in each)
    values = {"input_ids": ids, "attention_mask": mask}
    if labels:
        token = class_name.endswith("TokenClassification")
        shape = (ROWS, LENGTH) if token else (ROWS,)
        values["labels"] = torch.randn(shape, generator=generator) if problem == REGRESSION else \
            torch.randint(0, 3, shape, generator=generator)
    return values


def stock_output(reference: Any, kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = reference(**kwargs, return_dict=True)
    return out.loss if "labels" in kwargs else out.logits


@pytest.mark.parametrize("family_name,class_name,problem,labels", CASES, ids=IDS)
def test_equal_to_stock_eval_train_stateless_and_traced(family_name: str, class_name: str, problem: str,
                                                        labels: bool) -> None:
    family = FAMILIES[family_name]
    kwargs = inputs(family, class_name, problem, labels)
    reference, converted = pair(family, class_name, problem)
    reference.eval(), converted.eval()
    with torch.no_grad():
        expected = stock_output(reference, kwargs)
        assert torch.equal(converted(**kwargs), expected)
        traced = fx_trace(converted, kwargs)
        assert torch.equal(traced(**kwargs), expected)
    for model in (converted, pair(family, class_name, problem)[1].make_stateless()):
        reference.zero_grad(set_to_none=True)
        reference.train(), model.train()
        torch.manual_seed(1234)
        wanted = scalar(stock_output(reference, kwargs))
        wanted.backward()
        torch.manual_seed(1234)
        got = scalar(model(**kwargs))
        got.backward()
        assert torch.equal(got, wanted)
        key, weight = family.shared_key(class_name), family.shared_weight(class_name)
        renamed = {weight: key} if weight is not None and key is not None else {}
        assert assert_equal_gradients(model, reference, renamed) > 10


def test_bart_refuses_rows_with_different_or_no_eos_counts_as_stock_does() -> None:
    """Stock raises ValueError (different counts) or IndexError (none); ours, eager or traced, RuntimeError
    (torch._assert_async on the CPU) with stock's message."""
    family = FAMILIES["bart"]
    reference, converted = pair(family, "BartForSequenceClassification", SINGLE)
    traced = fx_trace(converted.eval(), inputs(family, "BartForSequenceClassification", SINGLE, False))
    different = inputs(family, "BartForSequenceClassification", SINGLE, False)
    different["input_ids"][0, 1] = 2
    none = inputs(family, "BartForSequenceClassification", SINGLE, False)
    none["input_ids"][:, -3] = 5
    for kwargs, stock_error in ((different, ValueError), (none, IndexError)):
        with pytest.raises(stock_error):
            reference(**kwargs)
        for model in (converted, traced):
            with pytest.raises(RuntimeError, match="same number of <eos> tokens"):
                model(**kwargs)


@pytest.mark.parametrize("name", sorted(PIPELINED))
def test_pipelined_head_batches_are_what_users_feed(name: str) -> None:
    """support/heads.py's batches: the pad id exactly where the mask is 0, labels of the head's kind (-100 on the
    padding of token labels), BART's one </s> per row at its last real token, and micro-batches padded unlike."""
    head, family = PIPELINED[name], head_family_at(name, "4.5.1")
    assert family.model_family.definition.default_class == head.class_name and family.train_batch is not None
    cfg = family.make_config(head.config)
    values = family.train_batch(cfg, 4, 10)
    ids, mask, labels = values["input_ids"], values["attention_mask"], values["labels"]
    assert torch.equal(ids == cfg.pad_token_id, mask == 0) and (mask == 0).any()
    assert not torch.equal(mask[:2], mask[2:])  # the two micro-batches of the pipelined cases
    assert labels.shape == (ids.shape if head.labels == "token" else ids.shape[:1])
    if head.labels == "token":
        assert torch.equal(labels == -100, mask == 0)
    assert labels.max() < cfg.num_labels
    if head.ends_with_eos:
        ends = mask.sum(1) - 1
        assert torch.equal((ids == cfg.eos_token_id).nonzero()[:, 1], ends)


# Every head pipelined at 4.5.1 (this process's transformers) and at the later releases where all their base
# families are committed, each release in one launch with that release's transformers first on PYTHONPATH.
installer = load_script("install_releases")
PIPELINED_RELEASES = ["4.5.1"] + [r for r in ("4.57.6", installer.verified_releases()[-1]) if all(
    (REPO / "generated_models" / head.base / f"v{r.replace('.', '_')}").is_dir() for head in PIPELINED.values())]


@pytest.mark.parametrize("release", PIPELINED_RELEASES)
def test_two_gloo_ranks_train_every_head_as_one_process(release: str, tmp_path: Path) -> None:
    """pipelining_worker.py, every head of support/heads.py a case of one launch (1F1B, the optimal split): 3 Adam
    steps, losses, gradients and weights torch.equal to one process, and the head's own parameters on rank 1."""
    first = [] if release == "4.5.1" else [str(installer.install_dir(release))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*first, str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cases = [f"{name}@{release}/{head.config}:1f1b:2:optimal" for name, head in PIPELINED.items()]
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", str(SUPPORT / "pipelining_worker.py"),
                             "--out", str(tmp_path), *cases], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    records: dict[str, list[dict]] = {}
    for path in sorted(tmp_path.glob("*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(cases)
    for case, (name, head) in zip(cases, PIPELINED.items()):
        ranks = records[case]
        assert [record["rank"] for record in ranks] == [0, 1], case
        assert all(record["problems"] == [] for record in ranks), (case, [r["problems"][:3] for r in ranks])
        own = [[p for p in record["parameters"] if p.startswith(f"{head.module}.")] for record in ranks]
        assert own[0] == [] and own[1], (name, own)  # the head trained, on the last rank only


def test_bert_for_sequence_classification_on_trained_weights() -> None:
    """all-MiniLM-L6-v2 (tests/support/real_weights.py) under a new seeded head, on real text: the logits and,
    in training, the loss and every gradient are stock's (every other release: test_seed_releases.py)."""
    family = FAMILIES["bert"]
    assert real_weights.check_sequence_classification(family.stock, family.generated) > 90


def test_the_trained_weights_check_fails_on_a_model_off_by_one_ulp() -> None:
    """The check the release workers run (tests/support/real_weights.py) can fail: logits scaled by 1 + 2**-20."""
    family = FAMILIES["bert"]

    class Off(family.generated.BertForSequenceClassification):  # type: ignore[name-defined]
        def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return super().forward(*args, **kwargs) * (1 + 2 ** -20)

    with pytest.raises(AssertionError, match="eval logits differ"):
        real_weights.check_sequence_classification(family.stock, SimpleNamespace(BertForSequenceClassification=Off))


@pytest.mark.parametrize("family_name,class_name", [(f, c) for f, c, problems in HEADS if REGRESSION in problems])
def test_multi_label_problem_type_is_stock_4_5_1s_single_label_loss(family_name: str, class_name: str) -> None:
    """4.5.1 has no config.problem_type: stock ignores it and refuses multi-hot labels, and so does ours, with
    the same error (never a silently different loss)."""
    family = FAMILIES[family_name]
    reference, converted = pair(family, class_name, SINGLE)
    for model in (reference, converted):
        model.config.problem_type = "multi_label_classification"
    kwargs = {**inputs(family, class_name, SINGLE, False), "labels": torch.ones(ROWS, 3)}
    errors = []
    for model in (reference, converted):
        with pytest.raises(Exception) as caught:  # noqa: PT011 (whatever stock raises, ours must raise too)
            model(**kwargs)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("family_name,class_name,problem", [(f, c, p[0]) for f, c, p in HEADS],
                         ids=[c for _, c, _ in HEADS])
def test_torch_export_with_labels_computes_what_eager_does(family_name: str, class_name: str, problem: str) -> None:
    family = FAMILIES[family_name]
    kwargs = inputs(family, class_name, problem, True)
    converted = pair(family, class_name, problem)[1].eval()
    exported = torch.export.export(converted, (), kwargs, strict=False)
    with torch.no_grad():
        assert torch.equal(exported.module()(**kwargs), converted(**kwargs))


@pytest.mark.parametrize(("family_name", "class_name", "length"),
                         [("bert", "BertForSequenceClassification", "sequence"),
                          ("bart", "BartForSequenceClassification", "source")])
def test_partition_model_plans_a_head_on_its_own_inputs(family_name: str, class_name: str, length: str,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its labels are one class index per sequence, BART's source ends with </s> ([model.classes.X.inputs])."""
    from families.models import MicroBatch
    from partitioning.cli import main

    family = FAMILIES[family_name].model_family
    plan = tmp_path / "plan.json"
    assert main([family_name, "--version", "4.5.1", "--class", class_name, "--shape", "tiny", "--stages", "2",
                 "--batch", "2", f"--{length}-len", "8", "--output", str(plan)]) == 0
    record = json.loads(plan.read_text())["model"]
    specs = {spec["name"]: spec for spec in record["inputs"]}
    assert specs["labels"]["shape"] == ["batch"] and specs["labels"]["high"] == "num_labels"
    if family_name == "bart":  # its decoder inputs: the source shifted right, made by its forward (model.classes.omit)
        assert specs["input_ids"]["last"] == "eos_token_id" and "decoder_input_ids" not in specs
        values = family.inputs(class_name, family.config("tiny"), MicroBatch(2, {"source": 8, "target": 8}), "cpu")
        assert values["input_ids"][:, -1].tolist() == [2, 2]


def test_gpt2_without_a_pad_token_takes_one_row_and_refuses_more_eager_or_traced() -> None:
    """Stock's assert stays (torch._assert, recorded by fx); one row reads its last token, equal to stock."""
    family = FAMILIES["gpt2"]
    reference, converted = pair(family, "GPT2ForSequenceClassification", SINGLE)
    for model in (reference, converted):
        model.config.pad_token_id = None
        model.eval()
    kwargs = inputs(family, "GPT2ForSequenceClassification", SINGLE, True)
    one = {key: value[:1] for key, value in kwargs.items()}
    traced = fx_trace(converted, one)
    with torch.no_grad():
        expected = reference(**one, return_dict=True).loss
        assert torch.equal(converted(**one), expected) and torch.equal(traced(**one), expected)
        for model in (reference, converted, traced):
            with pytest.raises(AssertionError, match="no padding token"):
                model(**kwargs)
