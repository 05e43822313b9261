"""``--schedule auto``: the schedule and virtual stages with the least predicted step time under the memory limit.

Every schedule the engine has (:data:`partitioning.schedules.SCHEDULES`)
is a candidate, with its virtual stages: 1 for one stage per rank, 2 for the
V-shaped ones, 2 to 4 for the looped ones (as many as the blocks allow;
``--virtual-stages`` fixes V).  The one-stage schedules get their exact plan;
the others are first simulated on the balanced split into K x V chunks, and
the :data:`SEARCHED` best of those (that fit) get the full cut search
(:mod:`partitioning.solve.chunks`), which is the slow part.  A candidate
the engine refuses for these counts (DualPipeV needs ``m >= 2K``, say) is
listed with the engine's reason.  Ties go to the earlier schedule in the
engine's list, then to fewer virtual stages.

The micro-batch count: under FLOP and byte costs alone the step time only
falls as micro-batches get more and smaller, so without the runtime's own
terms (a calibration's: per-action overhead, message latency, the tied
gradients' sum that grows with the count) ``auto`` keeps the one asked for.
With them it also tries every count ``m'`` that divides the step's batch
(``m`` micro-batches of ``b`` sequences) into micro-batches of ``m b / m'``
sequences, with every block's and value's per-micro-batch costs scaled by
``b' / b`` (first order: FLOPs, times and bytes in proportion to the
sequences), and keeps the fastest predicted step that fits (ties: fewer
micro-batches).  The plan records the micro-batch it chose.  A micro-batch
of another size than the costed one is planned without recomputation: the
runtime finds a recomputed value by the shape it was traced with, which
another micro-batch does not have (cost at that micro-batch to get it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from common.errors import UserError
from partitioning.plan import Block, Plan, Value
from partitioning.schedules import SCHEDULES, SINGLE, V_SHAPED, check_runs
from partitioning.settings import Settings
from partitioning.solve.chunks import balanced, plan_chunks, predict
from partitioning.solve.costs import ChainCosts
from partitioning.solve.single import plan_single

SEARCHED = 3  # multi-chunk candidates given the full cut search
MAX_LOOPED_V = 4
MAX_MICRO_BATCHES = 64


def candidates(blocks: int, ranks: int, virtual: int | None) -> list[tuple[str, int]]:
    """(schedule, V) pairs to try, in preference order for ties."""
    found = []
    for schedule in SCHEDULES:
        options = [1] if schedule in SINGLE else [2] if schedule in V_SHAPED else range(2, MAX_LOOPED_V + 1)
        for v in options:
            if (virtual is None or v == virtual) and ranks * v <= blocks:
                found.append((schedule, v))
    return found


def micro_batch_counts(settings: Settings, model: dict[str, Any]) -> list[int]:
    """The micro-batch counts ``auto`` tries (see the module doc): the one asked for, or the batch's divisors."""
    per = int(model.get("micro_batch", {}).get("batch", 0))
    if not settings.runtime_terms or per < 1:
        return [settings.micro_batches]
    total = per * settings.micro_batches
    return [m for m in range(1, min(total, MAX_MICRO_BATCHES) + 1) if total % m == 0]


def rescaled(blocks: Sequence[Block], values: Sequence[Value], factor: float) -> tuple[list[Block], list[Value]]:
    """Per-micro-batch costs of micro-batches ``factor`` times as large (first order: see the module doc)."""
    def scale(count: int) -> int:
        return round(count * factor)
    scaled_blocks = [replace(b, flops=b.flops * factor, out_bytes=scale(b.out_bytes),
                             activation_bytes=scale(b.activation_bytes),
                             seconds=None if b.seconds is None else b.seconds * factor) for b in blocks]
    scaled_values = [replace(v, bytes=scale(v.bytes), recompute=None if v.recompute is None else replace(
        v.recompute, flops=v.recompute.flops * factor, bytes=scale(v.recompute.bytes),
        inputs=tuple((name, scale(size)) for name, size in v.recompute.inputs))) for v in values]
    return scaled_blocks, scaled_values


def choose(blocks: Sequence[Block], ranks: int, settings: Settings, model: dict[str, Any],
           values: Sequence[Value] = ()) -> Plan:
    """The fastest (schedule, V, micro-batch count) that fits (see the module doc)."""
    counts = micro_batch_counts(settings, model)
    if counts == [settings.micro_batches]:
        return _choose(blocks, ranks, settings, model, values)
    per, total = int(model["micro_batch"]["batch"]), int(model["micro_batch"]["batch"]) * settings.micro_batches
    best: Plan | None = None
    best_key: tuple[float, int] | None = None
    tried: list[dict[str, Any]] = []
    failures: list[str] = []
    for m in counts:
        size = total // m
        micro_batch = {**model["micro_batch"], "batch": size}
        scaled_blocks, scaled_values = rescaled(blocks, values, size / per)
        # a recomputed value is named by the shape it was traced with: another micro-batch sends them all
        each = replace(settings, micro_batches=m, recompute=settings.recompute and size == per)
        try:
            plan = _choose(scaled_blocks, ranks, each, {**model, "micro_batch": micro_batch}, scaled_values)
        except UserError as exc:
            failures.append(f"{m} micro-batches: {exc}")
            continue
        key = (plan.prediction["step_time"], m)
        if best_key is None or key < best_key:
            best, best_key = plan, key
        tried.append({"micro_batches": m, "batch": size, "schedule": plan.settings["schedule"],
                      "virtual_stages": plan.settings["virtual_stages"], "step_time": plan.prediction["step_time"]})
    if best is None:
        raise UserError(failures[0])
    best.prediction = {**best.prediction, "micro_batch_counts": tried}
    return best


def _choose(blocks: Sequence[Block], ranks: int, settings: Settings, model: dict[str, Any],
            values: Sequence[Value] = ()) -> Plan:
    plans: list[tuple[tuple[Any, ...], Plan]] = []
    drafts: list[tuple[tuple[Any, ...], Settings]] = []
    rows: list[dict[str, Any]] = []
    for order, (schedule, virtual) in enumerate(candidates(len(blocks), ranks, settings.virtual_stages)):
        each = replace(settings, schedule=schedule, virtual_stages=virtual)
        row: dict[str, Any] = {"schedule": schedule, "virtual_stages": virtual}
        rows.append(row)
        try:
            check_runs(schedule, ranks, virtual, settings.micro_batches)
            if schedule in SINGLE:
                plan = plan_single(blocks, ranks, each, model, values)
                plans.append(((plan.prediction["step_time"], order), plan))
                row.update(_summary(plan.prediction, True))
                continue
            costs = ChainCosts(blocks, each, model.get("shared_bytes"), values)
            draft = predict(costs, balanced(costs, ranks * virtual), ranks)
        except UserError as exc:
            row["error"] = str(exc)
            continue
        row.update(_summary(draft.to_dict(), draft.fits))
        drafts.append(((not draft.fits, draft.step_time, order), each))
    for (_, _, order), each in sorted(drafts, key=lambda pair: pair[0])[:SEARCHED]:
        try:
            plan, searched = plan_chunks(blocks, ranks, each, model, values)
        except UserError:
            continue  # the search found no split that fits either: the draft row says so
        plans.append(((searched.step_time, order), plan))
        rows[order].update(_summary(searched.to_dict(), searched.fits), searched=True)
    if not plans:
        reasons = "; ".join(f"{row['schedule']}: {row.get('error', 'does not fit')}" for row in rows[:3])
        raise UserError(f"no schedule has a plan on {ranks} ranks that fits ({reasons})")
    best = min(plans, key=lambda pair: pair[0])[1]
    chosen = (best.settings["schedule"], best.settings["virtual_stages"])
    alternatives = [row for row in rows if (row["schedule"], row["virtual_stages"]) != chosen]
    alternatives.sort(key=lambda row: (row.get("step_time") is None, row.get("step_time") or 0.0))
    best.prediction = {**best.prediction, "alternatives": alternatives}
    return best


def _summary(prediction: dict[str, Any], fits: bool) -> dict[str, Any]:
    return {"step_time": prediction["step_time"], "bubble": prediction["bubble"],
            "peak_memory_bytes": max(prediction["rank_memory_bytes"]), "fits": fits}

