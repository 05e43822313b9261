"""The generated BertModel on trained weights: sentence-transformers/all-MiniLM-L6-v2 (tests/real_weights.py).

Stock transformers 4.5.1 and the generated model (plain and stateless) load the released checkpoint and
encode real tokenized text: the last hidden state is torch.equal; the model partitioned into 2 stages by
the partitioner and run by the pipelining backend on 2 gloo ranks gives the same tensor.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from support import REPO, SUPPORT, TORCHRUN, real_weights
from support.bert_models import generated
from support.threads import RANK_THREADS, threads
from transformers.models.bert import modeling_bert as stock


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    model = stock.BertModel(real_weights.config()).eval()
    model.load_state_dict(real_weights.state_dict(), strict=True)
    batch = real_weights.tokenized()
    with torch.no_grad(), threads():  # as the ranks of the pipelined comparison run
        return batch, model(**batch).last_hidden_state


def test_the_checkpoint_is_trained(reference) -> None:
    """Paraphrases are close and unrelated sentences are not: the weights are the released ones, loaded right."""
    batch, hidden = reference
    embeddings = real_weights.sentence_embeddings(hidden, batch["attention_mask"])
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > 0.6 > 0.1 > similarity[0, 2]
    assert batch["attention_mask"].sum(1).tolist() == [12, 14, 11, 15]  # padded batch, word-pieces split


@pytest.mark.parametrize("form", ["plain", "stateless"])
def test_generated_bert_equals_stock_on_trained_weights(reference, form: str) -> None:
    batch, expected = reference
    model = generated.BertModel(real_weights.config()).eval()
    if form == "stateless":
        model.make_stateless()
    model.load_state_dict(real_weights.state_dict(), strict=True)
    with torch.no_grad(), threads():  # the reference's thread count
        assert torch.equal(model(**batch), expected)


def test_two_stage_pipeline_on_trained_weights(reference, tmp_path: Path) -> None:
    batch, expected = reference
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(RANK_THREADS)}
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", str(SUPPORT / "real_weights_worker.py"),
                             str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["stages"] == [0, 1] and len(record["blocks"]) == 2 and all(record["blocks"])
    pipelined = torch.load(tmp_path / "last_hidden_state.pt")
    assert torch.equal(pipelined, expected)
