"""Pipelined training, measured and predicted: our plan and schedule against uniform layers + 1F1B, interleaved.

For each case (family and shape, K ranks), this

1. calibrates the machine (``partition-model --calibrate``: block times,
   FLOP/s, backward factor, memory and link bandwidth, and the runtime's own
   terms: message latency, per-action overhead, optimizer rate);
2. plans ours (``partition-model --schedule auto``: the split, the schedule,
   its virtual stages and the micro-batch count for the same global batch,
   granularity chosen automatically, recomputation on) and the uniform layer
   split under 1F1B (torchtitan's and NeMo's default), both costed and
   simulated on the calibrated chain;
3. trains both under ``torchrun`` with ``torch.distributed.pipelining`` and
   Adam (gloo with one thread per rank on CPU, NCCL with one GPU per rank when
   there are K GPUs), steps interleaved in rotating order so load from
   elsewhere hits both alike, each step recorded by the per-rank timeline
   (:mod:`partitioning.gpu.timeline`);
4. prints paste-ready markdown: per plan the median step, predicted step and
   error, and for the median step of each plan a breakdown per rank,
   predicted against measured: compute (forward and backward actions; also
   in CPU seconds, which a loaded machine does not inflate), waiting
   (bubble, transfers, p2p), tied-gradient sum, optimizer.

    python scripts/bench_pipeline.py                                   # t5-small and gpt2, 2 ranks, CPU
    python scripts/bench_pipeline.py --case t5 --stages 4              # 4 ranks (oversubscribed on 2 cores)
    python scripts/bench_pipeline.py --device cuda --stages 2 --case t5 --case gpt2   # K GPUs, NCCL
    python scripts/bench_pipeline.py --docs docs                       # also write the section of benchmarks.md

The GPU command has not been run by this project yet (no GPU was lent to its sessions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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
from partitioning.gpu import timeline  # noqa: E402
from partitioning.gpu.pipelining import PipelineRun  # noqa: E402
from partitioning.gpu.train import device_for_rank, rebuild  # noqa: E402
from partitioning.plan import Plan  # noqa: E402
from partitioning.solve.baselines import uniform_split  # noqa: E402
from partitioning.solve.chunks import finish, predict  # noqa: E402
from partitioning.solve.costs import ChainCosts  # noqa: E402
from partitioning.solve.partition import Settings, build_plan, partition  # noqa: E402

SECTION = "## Pipelined training (`scripts/bench_pipeline.py`)"
METHODS = ("ours", "uniform + 1f1b")
CASES = {"t5": ("t5-small", 2, ["source=128", "target=32"]), "gpt2": ("gpt2", 1, ["sequence=128"])}
COMPUTE = ("F", "B", "I", "W", "link_send", "link_recv", "link_finish")
GROUPS = {"compute": COMPUTE, "tied sum": ("tied_sync",), "optimizer": ("optimizer", "reduce_grad")}


def _model(family_name: str, args: argparse.Namespace) -> tuple[ModelFamily, str, Any, Any, str]:
    shape, batch, lengths = CASES[family_name]
    family = ModelFamily.load(family_name, args.version)
    sizes = {name: int(value) for name, _, value in (item.partition("=") for item in lengths)}
    return family, family.definition.default_class, family.config(shape), family.micro_batch(batch, sizes), shape


def measure_calibration(family_name: str, args: argparse.Namespace) -> Calibration:
    family, class_name, config, micro_batch, shape = _model(family_name, args)
    if args.device == "cpu":
        torch.set_num_threads(1)  # as each rank runs (and the clock is then the thread's CPU time)
    torch.manual_seed(0)
    model = family.build(class_name, config, args.device)
    chain = family_chain(family, class_name, config, micro_batch, 1, args.device, args.repeats, model=model,
                         sublayers=True, clock=clock(args.device))
    inputs = family.inputs(class_name, config, micro_batch, args.device)
    described = family.describe(class_name, config, micro_batch, shape, grain.SUBLAYER)
    return calibrate(chain, model, inputs, described, args.repeats, torch.get_num_threads(),
                     micro_batches=args.micro_batches)


def plans(family_name: str, stages: int, args: argparse.Namespace, calibration: Calibration) -> list[Plan]:
    """Ours (auto: split, schedule, V, micro-batch count) and uniform layers under 1F1B, on the calibrated chain."""
    family, class_name, config, micro_batch, shape = _model(family_name, args)
    layer_lists = family.layer_lists(class_name)
    chain = family_chain(family, class_name, config, micro_batch, sublayers=True)
    chain = calibration.apply(chain, layer_lists, family.describe(class_name, config, micro_batch, shape, 1))
    layers = grain.layer_chain(chain, layer_lists)

    def described(granularity: int | str, candidate: Any) -> dict[str, Any]:
        return {**family.describe(class_name, config, micro_batch, shape, granularity),
                "shared_bytes": candidate.shared_bytes}

    auto = calibration.settings(Settings(micro_batches=args.micro_batches, schedule="auto"))
    ours, _ = grain.choose(chain, layer_lists, lambda c, g: partition(c.blocks, stages, auto, described(g, c),
                                                                       c.values))
    one_f_one_b = calibration.settings(Settings(micro_batches=args.micro_batches, schedule="1f1b"))
    segments = uniform_split(layers.blocks, stages, layer_lists)
    costs = ChainCosts(layers.blocks, one_f_one_b, layers.shared_bytes, layers.values)
    uniform = build_plan(layers.blocks, segments, one_f_one_b, described(1, layers), costs, method="uniform")
    return [ours, finish(uniform, predict(costs, segments, stages), stages)]


def worker(paths: list[str], warmup: int, steps: int) -> None:
    """One rank: build every plan's stages, then time interleaved steps with a timeline; rank 0 prints them."""
    backend, device = device_for_rank()
    dist.init_process_group(backend)
    try:
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
            runs.append((run, batch, torch.optim.Adam(run.module.parameters(), lr=1e-5), timeline.attach(run)))
        for step in range(warmup + steps):
            for index in [(step + k) % len(runs) for k in range(len(runs))]:  # rotate who goes first
                run, batch, optimizer, recorder = runs[index]
                with recorder.step():
                    run.step(batch)
                    with recorder.span("optimizer"):
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
        gathered = [timeline.gather(recorder) for *_, recorder in runs]
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"backend": backend, "events": gathered}), flush=True)
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


def measured_parts(events: list[dict[str, Any]], step: int) -> dict[int, dict[str, float]]:
    """Per rank, the seconds of ``step`` by component (see the module doc): wall, and the rank's CPU (``cpu ...``)."""
    parts = {}
    for rank, kinds in timeline.breakdown(events, step).items():
        found = {group: sum(kinds.get(kind, 0.0) for kind in members) for group, members in GROUPS.items()}
        found["waiting"] = kinds["step"] - sum(found.values())  # p2p posts and waits, the bubble, the rest
        found["step"] = kinds["step"]
        top = [e for e in events if e["step"] == step and e["rank"] == rank and e["inside"] == "step"]
        for group, members in GROUPS.items():  # a nested span's CPU is in its parent's (links inside B)
            found[f"cpu {group}"] = sum(e["cpu"] for e in top if e["kind"] in members)
        found["cpu step"] = next(e["cpu"] for e in events if e["step"] == step and e["rank"] == rank
                                 and e["kind"] == "step")
        found["cpu waiting"] = found["cpu step"] - sum(found[f"cpu {group}"] for group in GROUPS)
        parts[rank] = found
    return parts


def predicted_parts(plan: Plan) -> dict[int, dict[str, float]]:
    p = plan.prediction
    parts = {}
    for rank, busy in enumerate(p["rank_busy"]):
        tied, update = p.get("rank_tied_sync", [0.0] * (rank + 1))[rank], p.get("rank_update", [0.0] * (rank + 1))[rank]
        parts[rank] = {"compute": busy, "tied sum": tied, "optimizer": update,
                       "waiting": p["step_time"] - busy - tied - update, "step": p["step_time"]}
    return parts


def summarize(case: str, plans_run: list[Plan], measured: dict[str, Any], warmup: int) -> dict[str, Any]:
    rows = []
    for method, plan, events in zip(METHODS, plans_run, measured["events"]):
        steps = sorted({e["step"] for e in events if e["step"] >= warmup})
        walls = {s: max(e["end"] - e["start"] for e in events if e["step"] == s and e["kind"] == "step") for s in steps}
        chosen = next(s for s in steps if walls[s] == statistics.median_low(walls.values()))
        cpu = {s: max(e["cpu"] for e in events if e["step"] == s and e["kind"] == "step") for s in steps}
        settings = plan.settings
        rows.append({"method": method, "schedule": settings["schedule"], "virtual": settings.get("virtual_stages", 1),
                     "micro_batches": settings["micro_batches"], "batch": plan.model["micro_batch"]["batch"],
                     "starts": [s.blocks[0] for s in plan.stages], "step": statistics.median(walls.values()),
                     "cpu": statistics.median(cpu.values()),
                     "step_min": min(walls.values()), "predicted": plan.prediction["step_time"],
                     "measured_parts": measured_parts(events, chosen), "predicted_parts": predicted_parts(plan)})
    return {"case": case, "rows": rows}


def report(result: dict[str, Any], calibration: Calibration, loads: list[float], backend: str, args: Any) -> str:
    rows, ours = result["rows"], result["rows"][0]
    lines = [f"### {result['case']}", "",
             f"{args.steps} timed steps each after {args.warmup} warm-up, interleaved; {backend} on "
             f"{calibration.device} ({calibration.machine}), one thread per rank; load average {loads[0]:.2f} before, "
             f"{loads[1]:.2f} after. Calibration: {calibration.flops / 1e9:.3g} GFLOP/s, backward "
             f"{calibration.backward_factor:.2f} x forward, link {calibration.bandwidth / 1e9:.3g} GB/s, latency "
             f"{calibration.latency * 1e6:.0f} us, {calibration.action_overhead * 1e6:.0f} us per action, optimizer "
             f"{calibration.update_rate * 1e9:.3g} s/GB, memory {calibration.memory_bandwidth / 1e9:.3g} GB/s.", "",
             "| plan | schedule | micro-batches | stages start at | step s (median) | step s (min) | ours / this "
             "| predicted step s | prediction error | busiest rank's CPU s per step (median) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        schedule = row["schedule"] + (f" (V={row['virtual']})" if row["virtual"] > 1 else "")
        lines.append(f"| {row['method']} | {schedule} | {row['micro_batches']} x {row['batch']} "
                     f"| {', '.join(row['starts'])} | {row['step']:.3f} | {row['step_min']:.3f} "
                     f"| {ours['step'] / row['step']:.3f} | {row['predicted']:.3f} "
                     f"| {row['predicted'] / row['step'] - 1:+.0%} | {row['cpu']:.3f} |")
    for row in rows:
        ranks = sorted(row["measured_parts"])
        lines += ["", f"Breakdown of the median step of {row['method']}, seconds per rank: predicted / measured "
                      f"wall / the rank's CPU seconds in it:", "",
                  "| component | " + " | ".join(f"rank {r}" for r in ranks) + " |", "|---|" + "---|" * len(ranks)]
        for part in ("compute", "waiting", "tied sum", "optimizer", "step"):
            cells = []
            for r in ranks:
                predicted, measured = row["predicted_parts"][int(r)][part], row["measured_parts"][r][part]
                cells.append(f"{predicted:.3f} / {measured:.3f} / {row['measured_parts'][r]['cpu ' + part]:.3f}")
            lines.append(f"| {part} | " + " | ".join(cells) + " |")
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
    parser.add_argument("--case", action="append", choices=tuple(CASES), help="family (default: t5 and gpt2)")
    parser.add_argument("--version", default="4.5.1")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4, help="of the shape's micro-batch: the global batch")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per plan")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats when calibrating")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (NCCL, one GPU per rank)")
    parser.add_argument("--docs", type=Path, help="write the report into DOCS/benchmarks.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("plans", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.plans, args.warmup, args.steps)
        return 0
    texts = []
    for case in args.case or list(CASES):
        try:
            calibration = measure_calibration(case, args)
            by_method = plans(case, args.stages, args, calibration)
        except UserError as exc:
            raise SystemExit(f"bench_pipeline: {exc}") from None
        with tempfile.TemporaryDirectory() as folder:
            paths = [Path(folder) / f"{index}.json" for index in range(len(by_method))]
            for path, plan in zip(paths, by_method):
                path.write_text(plan.to_json())
            before = os.getloadavg()[0]
            measured = launch(paths, args.stages, args.warmup, args.steps)
            after = os.getloadavg()[0]
        shape, batch, lengths = CASES[case]
        name = (f"{case} {args.version} {shape}, {args.micro_batches * batch} sequences of {', '.join(lengths)} per "
                f"step, K = {args.stages}")
        result = summarize(name, by_method, measured, args.warmup)
        texts.append(report(result, calibration, [before, after], measured["backend"], args))
        print(texts[-1] + "\n", flush=True)
        print(json.dumps(result), file=sys.stderr)
    if args.docs:
        write_docs(args.docs, "\n\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
