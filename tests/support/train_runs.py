"""train-model runs against one process, for any family at the release this process imports.

Shared by the 4.5.1 acceptance tests (tests/partitioning/test_train_model.py and its neighbours) and the
per-release worker (train_release_worker.py, run with another release's install first on PYTHONPATH):
a stock checkpoint saved with save_pretrained (tiny config, no dropout), a plan cut at named blocks, a data
file, a torchrun launch running several train-model command lines (train_worker.py), and the reference: the
same steps in one process with the stock model, torch.optim.AdamW, transformers' warm-up and clip_grad_norm_.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch
import transformers

from families.family import ModelFamily
from families.models import MicroBatch
from partitioning.cost.chain import family_chain
from partitioning.solve.partition import Settings, build_plan
from partitioning.train.data import read_dataset
from partitioning.train.stage import plan_model
from support import REPO, SUPPORT, TORCHRUN
from support.threads import threads

PER_MICRO_BATCH, MICRO_BATCHES, STEPS = 2, 2, 3
LR = 0.01
CPU = torch.device("cpu")
OPTIONS = ["--lr", str(LR), "--weight-decay", "0.01", "--warmup-steps", "2", "--decay", "cosine", "--clip-grad",
           "0.01"]  # small enough to clip every step
# The families of every other release (train_release_worker.py): family -> (its smallest tiny config, the first
# block of stage 1 per schedule).  The LLMs' tied configs split between the layers (embedding and head on
# different stages); Mistral runs untied.
RELEASE_CASES: dict[str, tuple[str, dict[str, str]]] = {
    "t5": ("1layer-relu-tied", {"gpipe": "decoder.embed", "1f1b": "encoder.block.0"}),
    "gpt2": ("1layer-tied", {"gpipe": "transformer.h.0", "1f1b": "lm_head"}),
    "bert": ("1layer-tied", {"gpipe": "bert.encoder.layer.0", "1f1b": "cls"}),
    "roberta": ("1layer-tied", {"gpipe": "lm_head", "1f1b": "roberta.encoder.layer.0"}),
    "bart": ("1layer-tied", {"gpipe": "decoder.embed", "1f1b": "model.decoder.layers.0"}),
    "llama": ("tied", {"gpipe": "model.layers.1", "1f1b": "lm_head"}),
    "qwen2": ("tied", {"gpipe": "norm", "1f1b": "model.layers.1"}),
    "qwen3": ("tied", {"gpipe": "model.layers.1", "1f1b": "norm"}),
    "mistral": ("untied", {"gpipe": "model.layers.1", "1f1b": "lm_head"}),
    "gemma3": ("tied", {"gpipe": "model.layers.1", "1f1b": "lm_head"}),
}

# Every class that trains but the families' default ones (the recipes' output = "loss"; the same classes at
# 4.5.1, 4.57.6 and 5.23.0): class -> (family, config, schedule of its 2-stage run, first block of stage 1, first
# blocks of stages 1 and 2 of its 3-stage run, under the other schedule).  The heads take support/heads.py's
# labels and pad id (GPT-2's head reads the last token before its pad id, which the data file's padding holds).
# In the order the releases after 4.5.1 take them (release_heads): first those that read positions off the data
# (the pad id, BART's </s>) or lift a constant into their stage (the token classifiers' ignored label).
HEAD_CASES: dict[str, tuple[str, str, str, str, str]] = {
    "GPT2ForSequenceClassification": ("gpt2", "2layer-untied", "gpipe", "transformer.h.1",
                                      "transformer.h.0,transformer.h.1"),
    "BertForTokenClassification": ("bert", "2layer-untied-relu", "1f1b", "bert.encoder.layer.0",
                                   "bert.encoder.layer.0,bert.encoder.layer.1"),
    "BartForSequenceClassification": ("bart", "1layer-tied", "gpipe", "decoder.embed",
                                      "model.encoder.layers.0,model.decoder.layers.0"),
    "BertForMaskedLM": ("bert", "1layer-tied", "1f1b", "cls", "bert.encoder.layer.0,cls"),
    "RobertaForSequenceClassification": ("roberta", "2layer-untied-relu", "gpipe", "roberta.encoder.layer.1",
                                         "roberta.encoder.layer.0,roberta.encoder.layer.1"),
    "RobertaForTokenClassification": ("roberta", "2layer-untied-relu", "1f1b", "roberta.encoder.layer.0",
                                      "roberta.encoder.layer.0,roberta.encoder.layer.1"),
    "BertForSequenceClassification": ("bert", "2layer-untied-relu", "gpipe", "bert.encoder.layer.1",
                                      "bert.encoder.layer.1,pooler"),
}
OTHER = {"gpipe": "1f1b", "1f1b": "gpipe"}
RELEASE_HEADS = 1  # head classes per release after 4.5.1 in the suite (11 releases: each class once or twice)


def release_heads(position: int) -> tuple[str, ...]:
    """The head classes the release at ``position`` (0, 1, ... among the tested releases after 4.5.1) trains: the
    next RELEASE_HEADS of HEAD_CASES, so that the releases take them in turn."""
    order = list(HEAD_CASES)
    return tuple(order[(position * RELEASE_HEADS + k) % len(order)] for k in range(RELEASE_HEADS))

class TrainFamily(Protocol):
    """What these helpers read of a family at one release (support.model_checks.Family, llm_pipelining.LLM)."""

    name: str
    train_lengths: dict[str, int]

    def make_config(self, name: str) -> Any: ...

    @property
    def model_family(self) -> ModelFamily: ...


def without_dropout(cfg: Any) -> Any:
    """The config with every dropout probability 0: the reference and the ranks draw no random numbers."""
    for key, value in cfg.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
            setattr(cfg, key, 0.0)
    return cfg


def stock_class(family: TrainFamily) -> Any:
    """The family's default (training) class, from the transformers this process imports."""
    return getattr(transformers, family.model_family.definition.default_class)


def load_stock(family: TrainFamily, directory: Path, **kwargs: Any) -> Any:
    """Stock ``from_pretrained`` of the default class, with eager attention where the release offers several
    (from 4.36 it would pick sdpa; the generated model, and so train-model, computes the eager one)."""
    cls = stock_class(family)
    if hasattr(cls.config_class(), "_attn_implementation"):
        kwargs["attn_implementation"] = "eager"
    return cls.from_pretrained(directory, **kwargs)


def save_checkpoint(family: TrainFamily, config_name: str, directory: Path) -> Any:
    """A stock model of the named config, seeded, saved with save_pretrained; its config."""
    cfg = without_dropout(family.make_config(config_name))
    torch.manual_seed(0)
    stock_class(family)(cfg).save_pretrained(directory)
    return cfg


def write_plan(family: TrainFamily, cfg: Any, split: str, schedule: str, path: Path, tied_sum: str = "ordered",
               micro_batches: int = MICRO_BATCHES) -> None:
    """A plan of the default class whose stages 1..K-1 start at the comma-separated blocks of ``split``; the run's
    tied sum ``tied_sum`` (train-model runs the plan's)."""
    models = family.model_family
    class_name = models.definition.default_class
    micro_batch = MicroBatch(PER_MICRO_BATCH, family.train_lengths)
    chain = family_chain(models, class_name, cfg, micro_batch)
    names = [block.name for block in chain.blocks]
    starts = [0] + [names.index(name) for name in split.split(",")]
    plan = build_plan(chain.blocks, [(a, b - 1) for a, b in zip(starts, starts[1:] + [len(names)])],
                      Settings(micro_batches=micro_batches, schedule=schedule, tied_sum=tied_sum), {},
                      values=chain.values)
    plan.model = models.describe(class_name, cfg, micro_batch, "test", 1)
    path.write_text(plan.to_json())


def write_data(path: Path, plan: Path, count: int = 7, seed: int = 0) -> None:
    """Examples of random lengths (padded by the reader), some token labels ignored, masks left to the reader; an
    input whose spec names its ``last`` value (BART's </s>, which its classification head reads) ends with it."""
    from partitioning.files import read_plan

    _, _, cfg, specs, micro_batch = plan_model(read_plan(plan))
    rng = random.Random(seed)
    with path.open("w") as out:
        for _ in range(count):
            lengths = {name: rng.randint(2, size) for name, size in micro_batch.lengths.items()}
            example: dict[str, Any] = {}
            for spec in specs:
                if spec.fill != "randint":
                    continue
                low = spec.low if isinstance(spec.low, int) else getattr(cfg, spec.low)
                high = spec.high if isinstance(spec.high, int) else getattr(cfg, str(spec.high))
                dims = [d for d in spec.shape if d != "batch"]
                values = [rng.randrange(low, high) for _ in range(lengths[str(dims[0])] if dims else 1)]
                if spec.name.endswith("labels") and dims:  # one label per sequence: none ignored (a micro-batch
                    values = [-100 if rng.random() < 0.2 else v for v in values]  # of ignored ones has no loss)
                if spec.last is not None:
                    values[-1] = spec.last if isinstance(spec.last, int) else getattr(cfg, spec.last)
                example[spec.name] = values if dims else values[0]
            out.write(json.dumps(example) + "\n")


def launch(ranks: int, cases: dict[str, list[str]], out: Path) -> dict[str, list[dict]]:
    """Run each case (a train-model command line) on ``ranks`` torchrun ranks; each rank's record per case.

    The ranks import what this process does: this checkout first, then this process's PYTHONPATH (a release's
    side-by-side install in a release worker).
    """
    out.mkdir(exist_ok=True)
    (out / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={ranks}", str(SUPPORT / "train_worker.py"),
                             str(out), str(out / "cases.json")], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*.rank*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(cases)
    return records


def trainer_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's groups as HF Trainer makes them (4.57 on), told from the whole model's modules: no weight decay on
    biases (every parameter with ``bias`` in its name, T5's relative attention bias included) and on the weights of
    norm modules (every class with ``norm`` in its name); for these families, Trainer's own rule
    (tests/support/decay_worker.py checks it against ``Trainer.get_decay_parameter_names``)."""
    exempt = {whole for prefix, module in model.named_modules() for name, _ in module.named_parameters(recurse=False)
              if "bias" in (whole := f"{prefix}.{name}" if prefix else name).lower()
              or "norm" in type(module).__name__.lower()}
    named = list(model.named_parameters())
    return [{"params": [p for name, p in named if name not in exempt], "weight_decay": weight_decay},
            {"params": [p for name, p in named if name in exempt], "weight_decay": 0.0}]


def reference(family: TrainFamily, checkpoint: Path, plan: Path, data: Path, steps: int,
              micro_batches: int = MICRO_BATCHES, bf16: bool = False, lr: float = LR,
              device: torch.device = CPU, fp16_scale: float | None = None, decay_steps: int | None = None,
              skipped: list[bool] | None = None) -> torch.nn.Module:
    """``steps`` steps in one process: stock model, AdamW (HF Trainer's groups), transformers' cosine warm-up,
    clip_grad_norm_.

    A step is ``micro_batches`` micro-batches (all replicas' of a data-parallel run), their gradients averaged.
    ``bf16``: each forward under bf16 autocast, the backward outside it (fp32 weights and AdamW).
    ``lr``: the ranks' (OPTIONS); another one shows a comparison can fail.  ``device``: where it runs.
    ``fp16_scale``: each forward under fp16 autocast, the loss scaled by torch's GradScaler from this initial scale,
    its step and the schedule's skipped where the gradients overflow (HF Trainer's fp16); ``skipped`` gets
    whether each step was.  ``decay_steps``: the schedule's span (default ``steps``).
    """
    from partitioning.files import read_plan

    _, _, cfg, specs, micro_batch = plan_model(read_plan(plan))
    size = PER_MICRO_BATCH * micro_batches
    dataset = read_dataset(data, specs, cfg, micro_batch, size)
    with threads():
        model = load_stock(family, checkpoint).to(device).train()
        optimizer = torch.optim.AdamW(trainer_groups(model, 0.01), lr=lr)
        scheduler = transformers.get_cosine_schedule_with_warmup(optimizer, 2, decay_steps or steps)
        scaler = torch.amp.GradScaler(device.type, init_scale=fp16_scale) if fp16_scale is not None else None
        dtype = torch.float16 if scaler is not None else torch.bfloat16
        for step in range(steps):
            batch = {name: tensor.to(device) for name, tensor in dataset.batch(step, size, 0).items()}
            for chunk in range(micro_batches):
                with torch.autocast(device.type, dtype=dtype, enabled=bf16 or scaler is not None):
                    loss = model(**{k: v.tensor_split(micro_batches)[chunk] for k, v in batch.items()}).loss
                (scaler.scale(loss) if scaler is not None else loss).backward()
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(micro_batches)  # the schedule scales the summed gradients so
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            if scaler is None:
                optimizer.step()
                scheduler.step()
            else:  # accelerate's test of a skipped step: the scale went down
                before = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                if scaler.get_scale() >= before:
                    scheduler.step()
                if skipped is not None:
                    skipped.append(scaler.get_scale() < before)
            optimizer.zero_grad()
    return model


def saved_differences(family: TrainFamily, saved: Path, expected: torch.nn.Module) -> dict[str, float]:
    """Stock key -> the largest absolute difference, for every tensor not torch.equal: each tensor ``saved`` holds
    against ``expected``'s, and ``saved`` loaded by stock ``from_pretrained`` (no missing or unexpected keys)
    against ``expected`` after stock's own save_pretrained / from_pretrained round trip, so that what a release's
    loader does to every checkpoint is done to both (4.46.3 loads RobertaForMaskedLM's ``lm_head.bias`` as zeros,
    from its own save_pretrained too)."""
    from safetensors.torch import load_file

    model, info = load_stock(family, saved, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # lists, or sets from 5.0 on
    stock: Any = expected.cpu()
    want = stock.state_dict()
    files = {key: tensor for path in sorted(saved.glob("*.safetensors")) for key, tensor in load_file(path).items()}
    assert files and set(files) <= set(want), sorted(set(files) - set(want))
    different = {key: float((files[key].double() - want[key].double()).abs().max()) for key in files
                 if not torch.equal(files[key], want[key])}
    with tempfile.TemporaryDirectory() as scratch:
        stock.save_pretrained(scratch)
        loaded = load_stock(family, Path(scratch)).state_dict()
    got = model.state_dict()
    assert sorted(got) == sorted(loaded)
    different.update({f"{key} (loaded)": float((got[key].double() - loaded[key].double()).abs().max())
                      for key in loaded if not torch.equal(got[key], loaded[key])})
    return different


def assert_stage_only(records: list[dict]) -> None:
    for record in records:
        assert record["others_meta"], record["rank"]  # no other stage's parameter was ever given memory
        assert record["loaded"] == record["own"], record["rank"]  # exactly this stage's tensors were read
