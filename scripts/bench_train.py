"""What the ``train-model`` runtime costs: its throughput against a bare torch pipelining loop, and its memory.

1. **Throughput** (``--stages`` ranks, default 2): ``train-model``'s own loop (:func:`partitioning.train.rank.train`:
   checkpoint loaded per stage on ``meta``, the ordered tied-weight sum, AdamW and its schedule) against
   ``torch.distributed.pipelining.pipeline()`` split at the same modules, run by a hand-written loop
   (``schedule.step``, ``optimizer.step``, ``zero_grad``) with no tied-weight synchronisation.  Same model, data
   file, schedule and micro-batches; rounds alternate runtime and baseline; each round's first step is warm-up
   and is left out; the ratio is of the median tokens/s.
2. **Peak RSS per rank** (``--rss-stages`` ranks, default 4, ``--rss-shape`` default gpt2-medium), one table
   per ``--tied-sum``: a few ``train-model`` steps from a random-weight ``model.safetensors`` this script
   writes, parameter-balanced stages; each rank reports its peak RSS (``getrusage``), its RSS before any
   model (python, torch, the imports, the process group: torch's baseline), and its stage's parameters.

    python scripts/bench_train.py                       # CPU, gloo, both parts
    python scripts/bench_train.py --docs docs           # also write the section of docs/benchmarks.md
    python scripts/bench_train.py --part rss --rss-shape gpt2-large
    python scripts/bench_train.py --part rss --rss-micro-batches 8 --rss-tied-sums ordered
    python scripts/bench_train.py --batch 8 --seq-len 512 --steps 20 --rss-seq-len 512  # GPU: one a rank, NCCL

(NCCL when there are as many GPUs as ranks; never run: no task had two GPUs.  The one-GPU run, one stage, and
its command are in docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.atomic import write_atomic  # noqa: E402
from common.memory import return_large_frees  # noqa: E402
from families.family import ModelFamily  # noqa: E402
from families.models import SharedWeight  # noqa: E402
from partitioning.cost import granularity as grain  # noqa: E402
from partitioning.cost.chain import family_chain  # noqa: E402
from partitioning.files import read_plan  # noqa: E402
from partitioning.gpu.pipelining import CarryInputs, model_loss, split_spec  # noqa: E402
from partitioning.gpu.train import device_for_rank, rebuild  # noqa: E402
from partitioning.solve.baselines import parameter_balanced_split  # noqa: E402
from partitioning.solve.partition import Settings, build_plan  # noqa: E402
from partitioning.train.data import read_dataset  # noqa: E402
from partitioning.train.rank import train  # noqa: E402
from partitioning.train.request import parse  # noqa: E402
from partitioning.train.stage import settings_of  # noqa: E402

SECTION = "## Training runtime (`scripts/bench_train.py`)"
MB = 1 << 20
_STEP = re.compile(r"^step (\d+)/\d+: loss \S+, (\d+) tokens/s")


def write_run(directory: Path, family_name: str, shape: str, stages: int, batch: int, seq_len: int,
              micro_batches: int, examples: int) -> tuple[Path, Path, Path]:
    """A parameter-balanced plan, a random-weight checkpoint (model.safetensors) and a data file of random ids."""
    from safetensors.torch import save_file

    family = ModelFamily.load(family_name, "4.5.1")
    class_name = family.definition.default_class
    config = family.config(shape)
    for key, value in config.to_dict().items():  # no dropout: the two loops do the same work
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
            setattr(config, key, 0.0)
    micro_batch = family.micro_batch(batch, {name: seq_len for name in family.definition.lengths})
    chain = family_chain(family, class_name, config, micro_batch)
    layers = grain.layer_chain(chain, family.layer_lists(class_name))
    described = {**family.describe(class_name, config, micro_batch, shape, 1), "shared_bytes": layers.shared_bytes}
    plan = build_plan(layers.blocks, parameter_balanced_split(layers.blocks, stages, layers.shared_bytes),
                      Settings(micro_batches=micro_batches, schedule="gpipe"), described, method="parameters",
                      values=layers.values)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "plan.json").write_text(plan.to_json())
    torch.manual_seed(0)
    model = family.build(class_name, config, "cpu")
    state, seen = {}, set()
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:  # a tied weight once (the loader reads whichever name is present)
            seen.add(tensor.data_ptr())
            state[key] = tensor.contiguous()
    checkpoint = directory / "checkpoint"
    checkpoint.mkdir(exist_ok=True)
    save_file(state, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = [class_name]
    (checkpoint / "config.json").write_text(config.to_json_string())
    del model, state
    generator = torch.Generator().manual_seed(0)
    specs = [spec for spec in plan.model["inputs"] if spec["fill"] == "randint"]
    with (directory / "data.jsonl").open("w") as out:
        for _ in range(examples):
            example = {}
            for spec in specs:
                high = spec["high"] if isinstance(spec["high"], int) else getattr(config, spec["high"])
                low = spec.get("low") or 0
                low = low if isinstance(low, int) else getattr(config, low)
                length = seq_len if len([d for d in spec["shape"] if d != "batch"]) else 0
                values = torch.randint(low, high, (max(length, 1),), generator=generator).tolist()
                example[spec["name"]] = values if length else values[0]
            out.write(json.dumps(example) + "\n")
    return directory / "plan.json", checkpoint, directory / "data.jsonl"


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def _argv(plan: str, checkpoint: str, data: str, steps: int) -> list[str]:
    return ["--plan", plan, "--checkpoint", checkpoint, "--data", data, "--steps", str(steps), "--log-every", "1"]


def baseline(plan_path: Path, data_path: Path, steps: int, device: torch.device) -> list[float]:
    """torch pipelining on the plan's split, a hand-written loop, no tied sync: tokens/s per step."""
    from torch.distributed.pipelining import ScheduleGPipe, pipeline


    plan = read_plan(plan_path)
    micro_batches, _ = settings_of(plan)
    torch.manual_seed(0)
    model, config, specs, micro_batch = rebuild(plan.model)
    if isinstance(model, SharedWeight):
        model.make_stateless()  # the generated model's pipelining form, as train-model splits it
    size = micro_batch.batch * micro_batches
    dataset = read_dataset(data_path, specs, config, micro_batch, size)
    names = list(dataset.tensors)
    wrapped = CarryInputs(model, names)
    example = dataset.batch(0, micro_batch.batch, 0)
    pipe = pipeline(wrapped, tuple(example[n] for n in names), split_spec=split_spec(plan, model, "model."))
    rank, last = dist.get_rank(), dist.get_rank() == len(plan.stages) - 1
    stage = pipe.build_stage(rank, device)
    schedule = ScheduleGPipe(stage, micro_batches, loss_fn=model_loss)
    optimizer = torch.optim.AdamW(stage.submod.parameters(), lr=5e-5)
    placeholder = torch.zeros(micro_batches, device=device)
    tokens = size * sum(micro_batch.lengths.values())
    rates = []
    for step in range(steps):
        began = time.perf_counter()
        batch = dataset.batch(step, size, 0)
        args = tuple(batch[n].to(device) for n in names) if rank == 0 else ()
        losses: list[torch.Tensor] = []
        schedule.step(*args, target=placeholder if last else None, losses=losses if last else None,
                      return_outputs=False)
        optimizer.step()
        optimizer.zero_grad()
        if last:
            torch.stack(losses).mean().item()  # the runtime reads its loss too
        rates.append(tokens / (time.perf_counter() - began))
    return rates


def worker(job_path: str) -> None:

    job = json.loads(Path(job_path).read_text())
    return_large_frees()  # as a train-model rank does
    backend, device = device_for_rank()
    dist.init_process_group(backend)
    before = _peak_mb()
    record: dict[str, Any] = {"rank": dist.get_rank(), "baseline_mb": before}
    try:
        if job["part"] == "rss":
            argv = [*_argv(job["plan"], job["checkpoint"], job["data"], job["steps"]), "--tied-sum", job["tied_sum"]]
            stage = train(parse(argv), device)
            params = sum(p.numel() * p.element_size() for p in stage.module.parameters())
            record.update(peak_mb=_peak_mb(), param_mb=params / MB, params=sum(p.numel() for p in stage.parameters()))
            if device.type == "cuda":
                record["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / MB
        else:
            record["pipelining"] = []
            for _ in range(job["rounds"]):
                train(parse(_argv(job["plan"], job["checkpoint"], job["data"], job["steps"])), device)
                record["pipelining"] += baseline(Path(job["plan"]), Path(job["data"]), job["steps"], device)[1:]
    finally:
        dist.destroy_process_group()
    Path(job["out"], f"rank{record['rank']}.json").write_text(json.dumps(record))


def launch(job: dict[str, Any], ranks: int) -> tuple[list[dict[str, Any]], str]:
    Path(job["out"]).mkdir(parents=True, exist_ok=True)
    job_path = Path(job["out"], "job.json")
    job_path.write_text(json.dumps(job))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([str(torchrun) if torchrun.exists() else "torchrun", "--standalone",
                             f"--nproc-per-node={ranks}", __file__, "--worker", str(job_path)],
                            env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"bench_train: a run failed:\n{result.stdout + result.stderr}")
    records = [json.loads(path.read_text()) for path in sorted(Path(job["out"]).glob("rank*.json"))]
    return sorted(records, key=lambda r: r["rank"]), result.stdout


def throughput(args: argparse.Namespace, scratch: Path) -> str:
    plan, checkpoint, data = write_run(scratch / "speed", args.family, args.shape, args.stages, args.batch,
                                       args.seq_len, args.micro_batches, 4 * args.batch * args.micro_batches)
    job = {"part": "speed", "plan": str(plan), "checkpoint": str(checkpoint), "data": str(data),
           "steps": args.steps, "rounds": args.rounds, "out": str(scratch / "speed" / "records")}
    records, stdout = launch(job, args.stages)
    runtime: list[float] = []
    for line in stdout.splitlines():
        found = _STEP.match(line.strip())
        if found and int(found.group(1)) > 1:  # each round's first step is warm-up
            runtime.append(float(found.group(2)))
    bare = records[-1]["pipelining"]
    ours, theirs = statistics.median(runtime), statistics.median(bare)
    tokens = args.batch * args.micro_batches * args.seq_len
    return (f"{args.family} `{args.shape}`, {args.stages} stages (parameter-balanced), GPipe, {args.micro_batches} "
            f"micro-batches of {args.batch} x {args.seq_len} tokens ({tokens} tokens a step), {args.rounds} rounds "
            f"of {args.steps} steps each, first step of a round left out:\n\n"
            f"| loop | median tokens/s | steps | min .. max |\n| --- | ---: | ---: | --- |\n"
            f"| `train-model` | {ours:.0f} | {len(runtime)} | {min(runtime):.0f} .. {max(runtime):.0f} |\n"
            f"| torch pipelining, hand-written loop | {theirs:.0f} | {len(bare)} | {min(bare):.0f} .. "
            f"{max(bare):.0f} |\n\nRatio train-model / bare pipelining: **{ours / theirs:.3f}**.\n")


def rss(args: argparse.Namespace, scratch: Path) -> str:
    micro_batches = args.rss_micro_batches or args.rss_stages
    plan, checkpoint, data = write_run(scratch / "rss", args.family, args.rss_shape, args.rss_stages, 1,
                                       args.rss_seq_len, micro_batches, 2 * micro_batches)
    text = [f"{args.family} `{args.rss_shape}` from a random-weight `model.safetensors`, {args.rss_stages} stages "
            f"(parameter-balanced), GPipe, {args.rss_steps} steps, {micro_batches} micro-batches of 1 x "
            f"{args.rss_seq_len} tokens, no `--save`; AdamW state is 2 x the weights, the gradients 1 x:\n"]
    for tied_sum in args.rss_tied_sums:
        job = {"part": "rss", "plan": str(plan), "checkpoint": str(checkpoint), "data": str(data),
               "steps": args.rss_steps, "tied_sum": tied_sum, "out": str(scratch / "rss" / f"records-{tied_sum}")}
        records, _ = launch(job, args.rss_stages)
        rows = [f"`--tied-sum {tied_sum}`:\n", "| rank | parameters | weights MB | + AdamW (3x) MB | torch baseline "
                "RSS MB | peak RSS MB | peak - baseline MB | (peak - baseline) / (weights + AdamW) | peak / (baseline "
                "+ weights + AdamW) | peak / (baseline + weights + gradients + AdamW) |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in records:
            state = 3 * r["param_mb"]
            cuda = f" (CUDA peak {r['cuda_peak_mb']:.0f} MB)" if "cuda_peak_mb" in r else ""
            rows.append(f"| {r['rank']}{cuda} | {r['params'] / 1e6:.1f} M | {r['param_mb']:.0f} | {state:.0f} | "
                        f"{r['baseline_mb']:.0f} | {r['peak_mb']:.0f} | {r['peak_mb'] - r['baseline_mb']:.0f} | "
                        f"{(r['peak_mb'] - r['baseline_mb']) / state:.2f} | "
                        f"{r['peak_mb'] / (r['baseline_mb'] + state):.2f} | "
                        f"{r['peak_mb'] / (r['baseline_mb'] + state + r['param_mb']):.2f} |")
        text.append("\n".join(rows) + "\n")
    return "\n".join(text)


def write_docs(docs: Path, text: str) -> None:
    path = docs / "benchmarks.md"
    current = path.read_text()
    start = current.find(SECTION)
    if start < 0:
        updated = current.rstrip("\n") + "\n\n" + text
    else:
        end = current.find("\n## ", start + len(SECTION))
        updated = current[:start] + text + (current[end + 1:] if end >= 0 else "")
    write_atomic(path, updated.encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=("both", "speed", "rss"), default="both")
    for name, default in (("family", "gpt2"), ("shape", "gpt2"), ("stages", 2), ("seq-len", 64), ("micro-batches", 2),
                          ("rounds", 2), ("rss-shape", "gpt2-medium"), ("rss-stages", 4), ("rss-seq-len", 32),
                          ("rss-steps", 2)):
        parser.add_argument(f"--{name}", type=type(default), default=default)
    parser.add_argument("--batch", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument("--steps", type=int, default=4, help="per round (the first is warm-up)")
    parser.add_argument("--rss-micro-batches", type=int, help="default: --rss-stages")
    parser.add_argument("--rss-tied-sums", nargs="+", choices=("ordered", "allreduce"),
                        default=["ordered", "allreduce"], help="one memory table per --tied-sum")
    parser.add_argument("--docs", type=Path, help="write the section into DOCS/benchmarks.md")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    device = "CUDA" if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores, gloo, 1 thread per rank)"
    parts = [f"{SECTION}\n\nMeasured with torch {torch.__version__} on {device}.\n"]
    print(parts[0], flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_train.") as scratch:
        for part, measure in (("speed", throughput), ("rss", rss)):
            if args.part in ("both", part):
                parts.append(measure(args, Path(scratch)))
                print(parts[-1], flush=True)  # each part as it is measured
    text = "\n".join(parts)
    if args.docs:
        write_docs(args.docs, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
