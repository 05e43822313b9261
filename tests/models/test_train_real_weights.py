"""train-model fine-tunes a trained checkpoint (all-MiniLM-L6-v2) on real text exactly as one process does.

The released BERT (support/real_weights.py) becomes a BertForMaskedLM: its encoder and embeddings from the
checkpoint, the MLM decoder tied to the word embeddings, the head's transform and bias (not released) seeded
and written with them into a starting directory (stock ``save_pretrained``).  Real sentences, tokenized, have
15% of their word-pieces masked by a seeded draw (labels -100 elsewhere) in a JSON Lines file.  Three steps of
``train-model`` on 2 gloo ranks (one torchrun launch) must save weights torch.equal to the same three steps in
one process with stock transformers 4.5.1 and torch.optim.AdamW, in a directory stock ``from_pretrained``
loads with no missing or unexpected keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from support import REPO, real_weights
from support.threads import RANK_THREADS, threads
from support.train_runs import trainer_groups
from transformers.models.bert import modeling_bert as stock

from families.family import ModelFamily
from families.models import MicroBatch
from partitioning.cost.chain import family_chain
from partitioning.files import read_plan
from partitioning.solve.partition import Settings, build_plan
from partitioning.train.data import read_dataset
from partitioning.train.stage import plan_model

CLASS, SPLIT = "BertForMaskedLM", "bert.encoder.layer.3"
PER_MICRO_BATCH, MICRO_BATCHES, STEPS, LENGTH, MASKED = 2, 2, 3, 24, 0.15
OPTIONS = {"lr": 1e-4, "weight_decay": 0.01, "warmup": 1, "clip": 1.0}
TEXTS = [*real_weights.TEXTS,
         "The children walked to school through the quiet park this morning.",
         "Heavy rain is expected across the northern region by the weekend.",
         "She translated the old letters from French into English.",
         "Engineers measured how much memory each pipeline stage needed."]


def masked_examples(seed: int = 0) -> list[dict[str, list[int]]]:
    """Each text's word-pieces with 15% (at least one) of them, drawn by ``seed``, replaced by [MASK]."""
    pieces = real_weights.WordPiece(real_weights.MODEL_DIR / "vocab.txt")
    batch = pieces(TEXTS)
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
        ids = ids[: int(mask.sum())]
        real = torch.arange(1, len(ids) - 1)  # not [CLS] / [SEP]
        chosen = real[torch.randperm(len(real), generator=generator)[: max(1, round(MASKED * len(real)))]]
        labels = torch.full_like(ids, -100)
        labels[chosen] = ids[chosen]
        inputs = ids.clone()
        inputs[chosen] = pieces.ids["[MASK]"]
        examples.append({"input_ids": inputs.tolist(), "labels": labels.tolist()})
    return examples


def start_checkpoint(directory: Path) -> transformers.BertConfig:
    """The released weights in a BertForMaskedLM; its head's transform and bias seeded (stock initialisation)."""
    config = real_weights.config()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # one process and the ranks agree
    config.architectures = [CLASS]
    torch.manual_seed(0)
    model = stock.BertForMaskedLM(config)
    released = {f"bert.{key}": value for key, value in real_weights.state_dict().items()
                if not key.startswith("pooler.")}  # BertForMaskedLM has no pooler
    missing, unexpected = model.load_state_dict(released, strict=False)
    assert unexpected == [], unexpected
    assert sorted(missing) == ["cls.predictions.bias", "cls.predictions.decoder.bias",
                               "cls.predictions.decoder.weight", "cls.predictions.transform.LayerNorm.bias",
                               "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.dense.bias",
                               "cls.predictions.transform.dense.weight"], missing
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # tied, loaded
    model.save_pretrained(directory)
    return config


def write_plan(config: transformers.BertConfig, path: Path) -> None:
    family = ModelFamily.load("bert", "4.5.1")
    micro_batch = MicroBatch(PER_MICRO_BATCH, {"sequence": LENGTH})
    chain = family_chain(family, CLASS, config, micro_batch)
    names = [block.name for block in chain.blocks]
    cut = names.index(SPLIT)
    plan = build_plan(chain.blocks, [(0, cut - 1), (cut, len(names) - 1)],
                      Settings(micro_batches=MICRO_BATCHES, schedule="gpipe"), {}, values=chain.values)
    plan.model = family.describe(CLASS, config, micro_batch, "all-MiniLM-L6-v2", 1)
    path.write_text(plan.to_json())


def reference(checkpoint: Path, plan: Path, data: Path) -> torch.nn.Module:
    """The same steps in one process: stock model, torch.optim.AdamW (HF Trainer's groups), transformers' linear
    warm-up, clipping."""
    _, _, config, specs, micro_batch = plan_model(read_plan(plan))
    size = PER_MICRO_BATCH * MICRO_BATCHES
    dataset = read_dataset(data, specs, config, micro_batch, size)
    with threads():  # the ranks' thread count
        model = stock.BertForMaskedLM.from_pretrained(checkpoint).train()
        optimizer = torch.optim.AdamW(trainer_groups(model, OPTIONS["weight_decay"]), lr=OPTIONS["lr"])
        scheduler = transformers.get_linear_schedule_with_warmup(optimizer, OPTIONS["warmup"], STEPS)
        for step in range(STEPS):
            batch = dataset.batch(step, size, 0)
            for chunk in range(MICRO_BATCHES):
                model(**{k: v.tensor_split(MICRO_BATCHES)[chunk] for k, v in batch.items()}).loss.backward()
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(MICRO_BATCHES)
            torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIONS["clip"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return model


def test_masked_lm_fine_tuning_of_real_weights_equals_one_process(tmp_path: Path) -> None:
    checkpoint, plan, data, out = tmp_path / "start", tmp_path / "plan.json", tmp_path / "mlm.jsonl", tmp_path / "out"
    config = start_checkpoint(checkpoint)
    write_plan(config, plan)
    examples = masked_examples()
    assert all(any(label != -100 for label in example["labels"]) for example in examples)
    data.write_text("".join(json.dumps(example) + "\n" for example in examples))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(RANK_THREADS)}
    command = [sys.executable, "-m", "partitioning.train.cli", "--plan", str(plan), "--checkpoint", str(checkpoint),
               "--data", str(data), "--steps", str(STEPS), "--save", str(out), "--lr", str(OPTIONS["lr"]),
               "--weight-decay", str(OPTIONS["weight_decay"]), "--warmup-steps", str(OPTIONS["warmup"]),
               "--decay", "linear", "--clip-grad", str(OPTIONS["clip"])]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert f"step {STEPS}/{STEPS}: loss" in result.stdout, result.stdout[-2000:]
    expected = reference(checkpoint, plan, data)
    saved, info = stock.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    got, want = saved.state_dict(), expected.state_dict()
    assert sorted(got) == sorted(want)
    different = {key: float((got[key] - want[key]).abs().max()) for key in want if not torch.equal(got[key], want[key])}
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]
    start = stock.BertForMaskedLM.from_pretrained(checkpoint).state_dict()
    assert not torch.equal(start["bert.encoder.layer.0.attention.self.query.weight"],
                           got["bert.encoder.layer.0.attention.self.query.weight"])  # it did train
