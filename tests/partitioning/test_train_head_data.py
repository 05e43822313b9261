"""train-model's data files for the classes that train besides the families' default ones (the heads).

A sequence classifier takes one label per example, a token classifier one per token; a label in another shape
or type, or outside ``[0, num_labels)``, is refused in one line and exit 2 before any rank starts.  BART's
sequence classifier takes no decoder inputs (its forward shifts the source right) and needs every source to end
with ``</s>``, as often in every example.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.train_runs import OPTIONS
from test_train_model import head_case

from partitioning.train.cli import main
from partitioning.train.data import read_dataset
from partitioning.train.stage import plan_model


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """A sequence and a token classifier, and BART's (whose source ends with </s>): class -> its command line."""
    root = tmp_path_factory.mktemp("heads")
    return {name: head_case(name, root / name, 2)[0][:-len(OPTIONS) - 2] for name in
            ("BertForSequenceClassification", "BertForTokenClassification", "BartForSequenceClassification")}


@pytest.mark.parametrize("class_name,lines,expected", [
    ("BertForSequenceClassification", ['{"input_ids": [5, 6], "labels": [1, 2]}'],
     "line 1: labels must be an integer, not [1, 2]"),
    ("BertForSequenceClassification", ['{"input_ids": [5, 6], "labels": 1.0}'], "labels must be an integer, not 1.0"),
    ("BertForSequenceClassification", ['{"input_ids": [5, 6], "labels": 3}'], "labels holds 3, outside [0, 3)"),
    ("BertForSequenceClassification", ['{"input_ids": [5, 6]}'], "line 1: no 'labels'"),
    ("BertForTokenClassification", ['{"input_ids": [5, 6], "labels": 1}'], "labels must be a list of integers"),
    ("BertForTokenClassification", ['{"input_ids": [5, 6], "labels": [1]}'], "labels has 1 tokens, input_ids 2"),
    ("BertForTokenClassification", ['{"input_ids": [5, 6], "labels": [1, 7]}'], "labels holds 7, outside [0, 3)"),
    ("BartForSequenceClassification", ['{"input_ids": [5, 6], "labels": 1}'],
     "input_ids ends with 6; this class reads each sequence's last 2 (eos_token_id), which ends it"),
    ("BartForSequenceClassification", ['{"input_ids": [5, 2], "labels": 1}', '{"input_ids": [2, 5, 2], "labels": 0}'],
     "line 2: holds input_ids 2 2 times, line 1 input_ids 2 1 times: every example must hold them as often"),
    ("BartForSequenceClassification", ['{"input_ids": [5, 2], "decoder_input_ids": [5, 2], "labels": 1}'],
     "unknown field 'decoder_input_ids'"),
])
def test_bad_labels_of_a_head(heads: dict[str, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path,
                              class_name: str, lines: list[str], expected: str) -> None:
    """A head's labels in another shape or type than its class takes: one line, exit 2, before any rank starts."""
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines * 4) + "\n")
    argv = heads[class_name]
    assert main([*argv[:argv.index("--data") + 1], str(data), *argv[argv.index("--data") + 2:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train-model: error: ") and expected in err, err


def test_head_labels_are_padded_as_their_class_takes_them(heads: dict[str, list[str]]) -> None:
    """One label per sequence stays one; per token, padded with -100 as the ids are with the pad id."""
    from partitioning.files import read_plan

    for class_name, first, second in (("BertForSequenceClassification", 2, 0),
                                      ("BertForTokenClassification", [2, 0], [1])):
        argv = heads[class_name]
        _, _, cfg, specs, micro_batch = plan_model(read_plan(Path(argv[argv.index("--plan") + 1])))
        data = Path(argv[argv.index("--data") + 1]).with_name("short.jsonl")
        data.write_text(f'{{"input_ids": [5, 6], "labels": {first}}}\n{{"input_ids": [7], "labels": {second}}}\n')
        tensors, length = read_dataset(data, specs, cfg, micro_batch, 2).tensors, micro_batch.size("sequence")
        assert tensors["input_ids"][1].tolist() == [7] + [cfg.pad_token_id] * (length - 1)
        if isinstance(first, list) and isinstance(second, list):
            assert tensors["labels"].tolist() == [first + [-100] * (length - 2), second + [-100] * (length - 1)]
        else:
            assert tensors["labels"].tolist() == [first, second], class_name
