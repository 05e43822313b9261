"""Pipelined training, measured: our plan against the splits other tools make, on the real engine, interleaved.

For one family, shape, micro-batch, number of stages K and schedule, this

1. calibrates the machine (``partition-model --calibrate``: block times,
   FLOP/s, backward factor, memory and link bandwidth), or reads a calibration;
2. plans three splits of the calibrated chain: ours (``partition-model``'s
   optimal plan, granularity chosen automatically, recomputation on), the
   uniform layer split (optimum-graphcore's default ``layers_per_ipu``) and the
   parameter-balanced split (DeepSpeed's ``partition_method="parameters"``); all
   three run on this project's backend, so the comparison is of the split;
3. trains all three under ``torchrun`` with ``torch.distributed.pipelining``
   (one stage per rank; gloo with one thread per rank on CPU, NCCL with one GPU
   per rank when there are K GPUs), the same steps on the same batch,
   interleaved step by step in rotating order so load from elsewhere hits all
   three alike, and reports per plan the median step time, tokens/s, each
   stage's busy time (time inside its forward and backward chunks) and the cost
   model's prediction of it.

    python scripts/bench_pipeline.py                       # t5, defaults below, CPU
    python scripts/bench_pipeline.py --device cuda --stages 2 --batch 8 --seq-len source=512 --seq-len target=128
    python scripts/bench_pipeline.py --docs docs            # also write the section of docs/benchmarks.md

The GPU command has not been run by this project yet (no GPU was available to its sessions).
"""

from __future__ import annotations

import argparse
import json
import os
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
from common.errors import UserError  # noqa: E402
from families.family import ModelFamily  # noqa: E402
from families.models import make_inputs  # noqa: E402
from partitioning.cost import granularity as grain  # noqa: E402
from partitioning.cost.calibration import Calibration, calibrate, clock  # noqa: E402
from partitioning.cost.chain import family_chain  # noqa: E402
from partitioning.gpu.pipelining import PipelineRun  # noqa: E402
from partitioning.gpu.train import device_for_rank, rebuild  # noqa: E402
from partitioning.plan import Plan  # noqa: E402
from partitioning.solve.baselines import parameter_balanced_split, uniform_split  # noqa: E402
from partitioning.solve.partition import Settings, build_plan, partition  # noqa: E402

SECTION = "## Pipelined training (`scripts/bench_pipeline.py`)"
METHODS = ("ours", "uniform", "parameters")


def _lengths(items: list[str]) -> dict[str, int]:
    bad = [item for item in items if not item.partition("=")[2].isdigit()]
    if bad:
        raise SystemExit(f"--seq-len takes NAME=N, got {bad[0]!r}")
    return {name: int(value) for name, _, value in (item.partition("=") for item in items)}


def _model(args: argparse.Namespace) -> tuple[ModelFamily, str, Any, Any]:
    """The family, its default class, the config of ``--shape`` and the micro-batch the benchmark runs."""
    family = ModelFamily.load(args.family, args.version)
    return (family, family.definition.default_class, family.config(args.shape),
            family.micro_batch(args.batch, _lengths(args.seq_len)))


def plans(args: argparse.Namespace, calibration: Calibration) -> dict[str, Plan]:
    """Ours, uniform and parameter-balanced, all costed on the calibrated chain."""
    family, class_name, config, micro_batch = _model(args)
    layer_lists = family.layer_lists(class_name)
    settings = calibration.settings(Settings(micro_batches=args.micro_batches, schedule=args.schedule))
    chain = family_chain(family, class_name, config, micro_batch, sublayers=True)
    chain = calibration.apply(chain, layer_lists, family.describe(class_name, config, micro_batch, args.shape, 1))
    layers = grain.layer_chain(chain, layer_lists)

    def described(granularity: int | str, candidate: Any) -> dict[str, Any]:
        return {**family.describe(class_name, config, micro_batch, args.shape, granularity),
                "shared_bytes": candidate.shared_bytes}

    ours, _ = grain.choose(chain, layer_lists, lambda c, g: partition(c.blocks, args.stages, settings,
                                                                       described(g, c), c.values))
    uniform = build_plan(layers.blocks, uniform_split(layers.blocks, args.stages, layer_lists), settings,
                         described(1, layers), method="uniform", values=layers.values)
    balanced = build_plan(layers.blocks, parameter_balanced_split(layers.blocks, args.stages, layers.shared_bytes),
                          settings, described(1, layers), method="parameters", values=layers.values)
    return {"ours": ours, "uniform": uniform, "parameters": balanced}


def _calibrate(args: argparse.Namespace) -> Calibration:
    family, class_name, config, micro_batch = _model(args)
    if args.device == "cpu":
        torch.set_num_threads(1)  # as each rank runs (and the clock is then the thread's CPU time)
    torch.manual_seed(0)
    model = family.build(class_name, config, args.device)
    chain = family_chain(family, class_name, config, micro_batch, 1, args.device, args.repeats, model=model, sublayers=True,
                         clock=clock(args.device))
    inputs = family.inputs(class_name, config, micro_batch, args.device)
    described = family.describe(class_name, config, micro_batch, args.shape, grain.SUBLAYER)
    return calibrate(chain, model, inputs, described, args.repeats, torch.get_num_threads())


class Busy:
    """Seconds a stage spends inside its forward and backward chunks.

    Timed with the calibration's clock (the thread's CPU time for a one-thread CPU rank, so that waiting for
    a core on a shared machine does not count; wall time, synchronised, on a GPU), and in wall time.
    """

    def __init__(self, stage: Any, device: torch.device) -> None:
        self.seconds = self.wall = 0.0
        self.cuda, self.clock = device.type == "cuda", clock(device)
        for name in ("forward_one_chunk", "backward_one_chunk"):
            setattr(stage, name, self._timed(getattr(stage, name)))

    def _timed(self, method: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, wall = self.clock(), time.perf_counter()
            result = method(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds += self.clock() - start
            self.wall += time.perf_counter() - wall
            return result
        return timed


def worker(paths: list[str], warmup: int, steps: int) -> None:
    """One rank: build every plan's stage, then time interleaved steps; rank 0 prints the results."""
    backend, device = device_for_rank()
    dist.init_process_group(backend)
    try:
        rank = dist.get_rank()
        runs = []
        for path in paths:
            plan = Plan.from_json(Path(path).read_text())
            torch.manual_seed(0)
            model, config, specs, micro_batch = rebuild(plan.model)
            micro_batches = int(plan.settings["micro_batches"])
            run = PipelineRun(model, plan, make_inputs(specs, config, micro_batch, "cpu"),
                              micro_batches=micro_batches, schedule=str(plan.settings["schedule"]), device=device)
            batch = {k: v.to(device) for k, v in make_inputs(specs, config, micro_batch.scaled(micro_batches),
                                                               "cpu", seed=1).items()}
            optimizer = torch.optim.SGD(run.module.parameters(), lr=1e-5)
            times: dict[str, list[float]] = {"step": [], "busy": [], "busy_wall": []}
            runs.append((run, batch, optimizer, Busy(run.stage, device), times))
        for step in range(warmup + steps):
            for index in [(step + k) % len(runs) for k in range(len(runs))]:  # rotate who goes first
                run, batch, optimizer, busy, times = runs[index]
                dist.barrier()
                busy.seconds, busy.wall, start = 0.0, 0.0, time.perf_counter()
                run.step(batch)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                dist.barrier()
                if step >= warmup:
                    times["step"].append(time.perf_counter() - start)
                    times["busy"].append(busy.seconds)
                    times["busy_wall"].append(busy.wall)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.gather_object([times for *_, times in runs], gathered if rank == 0 else None, dst=0)
        if rank == 0:
            print("RESULT " + json.dumps({"backend": backend, "ranks": gathered}), flush=True)
    finally:
        dist.destroy_process_group()


def launch(paths: list[Path], stages: int, warmup: int, steps: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={stages}",
               str(Path(__file__).resolve()), "--worker", "--warmup", str(warmup), "--steps", str(steps),
               *map(str, paths)]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    line = next((text for text in result.stdout.splitlines() if text.startswith("RESULT ")), None)
    if result.returncode or line is None:
        raise SystemExit(f"the pipelined runs failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def summarize(plans_by_method: dict[str, Plan], measured: dict[str, Any], tokens: int) -> list[dict[str, Any]]:
    rows = []
    for index, method in enumerate(METHODS):
        plan = plans_by_method[method]
        micro_batches = int(plan.settings["micro_batches"])
        per_rank = [rank[index] for rank in measured["ranks"]]
        steps = [max(values) for values in zip(*(r["step"] for r in per_rank))]  # the barrier's view: the slowest
        busy = [statistics.median(r["busy"]) for r in per_rank]
        busy_wall = [statistics.median(r["busy_wall"]) for r in per_rank]
        predicted = [micro_batches * (s.compute + s.recompute_time) for s in plan.stages]
        k = len(plan.stages)
        rows.append({"method": method, "starts": [s.blocks[0] for s in plan.stages],
                     "granularity": plan.model.get("granularity"), "step": statistics.median(steps),
                     "step_min": min(steps), "tokens_per_s": tokens / statistics.median(steps),
                     "busy": busy, "busy_wall": busy_wall, "predicted": predicted,
                     "errors": [p / b - 1.0 for p, b in zip(predicted, busy)],
                     "predicted_step": (micro_batches + k - 1) * plan.bottleneck,
                     "sent": [s.send_bytes for s in plan.stages[:-1]], "recomputed": list(plan.recomputed)})
    return rows


def report(args: argparse.Namespace, calibration: Calibration, rows: list[dict[str, Any]], loads: list[float],
           backend: str, tokens: int) -> str:
    ours = rows[0]
    lines = [f"{args.family} {args.version} {args.shape}, micro-batch {args.batch} x {', '.join(args.seq_len)} "
             f"({tokens} tokens per step), {args.micro_batches} micro-batches, K = {args.stages}, {args.schedule}, "
             f"{args.steps} timed steps each after {args.warmup} warm-up, interleaved; {backend} on "
             f"{calibration.device} ({calibration.machine}), one thread per rank; load average "
             f"{loads[0]:.2f} before, {loads[1]:.2f} after.",
             f"Calibration: {calibration.flops / 1e9:.3g} GFLOP/s, backward {calibration.backward_factor:.2f} x "
             f"forward, link {calibration.bandwidth / 1e9:.3g} GB/s, memory {calibration.memory_bandwidth / 1e9:.3g}"
             f" GB/s.", "",
             "| split | stages start at | step s (median) | step s (min) | tokens/s | ours / this | busy s per stage "
             "(measured) | busy s per stage (predicted) | prediction error | busy s per stage (wall) "
             "| predicted step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['method']} | {', '.join(row['starts'])} | {row['step']:.3f} | {row['step_min']:.3f} "
                     f"| {row['tokens_per_s']:.1f} | {ours['step'] / row['step']:.3f} "
                     f"| {' / '.join(f'{b:.3f}' for b in row['busy'])} "
                     f"| {' / '.join(f'{p:.3f}' for p in row['predicted'])} "
                     f"| {' / '.join(f'{e:+.0%}' for e in row['errors'])} "
                     f"| {' / '.join(f'{b:.3f}' for b in row['busy_wall'])} | {row['predicted_step']:.3f} |")
    return "\n".join(lines)


def write_docs(docs: Path, text: str) -> None:
    benchmarks = docs / "benchmarks.md"
    existing = benchmarks.read_text() if benchmarks.exists() else "# Benchmarks\n"
    kept = existing.split(SECTION)[0].rstrip("\n") + "\n"
    rest = existing.split(SECTION, 1)[1] if SECTION in existing else ""
    after = rest[rest.find("\n## "):] if "\n## " in rest else ""
    write_atomic(benchmarks, (kept + "\n" + SECTION + "\n\n" + text + "\n" + after).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="t5")
    parser.add_argument("--version", default="4.5.1")
    parser.add_argument("--shape", default="t5-small")
    parser.add_argument("--batch", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--seq-len", action="append", metavar="NAME=N",
                        help="sequence lengths (default for t5: source=128, target=32)")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per plan")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats when calibrating")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (NCCL, one GPU per rank)")
    parser.add_argument("--calibration", type=Path, help="use this calibration instead of measuring one")
    parser.add_argument("--save-calibration", type=Path, help="write the calibration measured here")
    parser.add_argument("--docs", type=Path, help="write the report into DOCS/benchmarks.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("plans", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.plans, args.warmup, args.steps)
        return 0
    args.seq_len = args.seq_len or (["source=128", "target=32"] if args.family == "t5" else [])
    try:
        if args.calibration:
            calibration = Calibration.from_json(args.calibration.read_text(), str(args.calibration))
        else:
            calibration = _calibrate(args)
            if args.save_calibration:
                write_atomic(args.save_calibration, calibration.to_json().encode())
        by_method = plans(args, calibration)
    except UserError as exc:
        raise SystemExit(f"bench_pipeline: {exc}") from None
    micro_batch = ModelFamily.load(args.family, args.version).micro_batch(args.batch, _lengths(args.seq_len))
    tokens = args.micro_batches * micro_batch.batch * sum(micro_batch.lengths.values())
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for method in METHODS:
            paths.append(Path(folder) / f"{method}.json")
            paths[-1].write_text(by_method[method].to_json())
        before = os.getloadavg()[0]
        measured = launch(paths, args.stages, args.warmup, args.steps)
        after = os.getloadavg()[0]
    rows = summarize(by_method, measured, tokens)
    text = report(args, calibration, rows, [before, after], measured["backend"], tokens)
    print(text)
    print(json.dumps(rows))
    if args.docs:
        write_docs(args.docs, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
