"""``--schedule auto``: the schedule and virtual stages with the least predicted step time under the memory limit.

Every schedule the engine has (:data:`partitioning.solve.schedules.SCHEDULES`)
is a candidate, with its virtual stages: 1 for one stage per rank, 2 for the
V-shaped ones, 2 to 4 for the looped ones (as many as the blocks allow;
``--virtual-stages`` fixes V).  The one-stage schedules get their exact plan;
the others are first simulated on the balanced split into K x V chunks, and
the :data:`SEARCHED` best of those (that fit) get the full cut search
(:mod:`partitioning.solve.chunks`), which is the slow part.  A candidate
the engine refuses for these counts (DualPipeV needs ``m >= 2K``, say) is
listed with the engine's reason.  Ties go to the earlier schedule in the
engine's list, then to fewer virtual stages.  The micro-batch count is the
one asked for: under FLOP costs the step time only falls as micro-batches
get more and smaller, so choosing it needs per-micro-batch overheads this
cost model does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from common.errors import UserError
from partitioning.plan import Block, Plan, Value
from partitioning.solve.chunks import balanced, plan_chunks, predict
from partitioning.solve.costs import ChainCosts, Settings
from partitioning.solve.schedules import SCHEDULES, SINGLE, V_SHAPED, check_runs

SEARCHED = 3  # multi-chunk candidates given the full cut search
MAX_LOOPED_V = 4


def candidates(blocks: int, ranks: int, virtual: int | None) -> list[tuple[str, int]]:
    """(schedule, V) pairs to try, in preference order for ties."""
    found = []
    for schedule in SCHEDULES:
        options = [1] if schedule in SINGLE else [2] if schedule in V_SHAPED else range(2, MAX_LOOPED_V + 1)
        for v in options:
            if (virtual is None or v == virtual) and ranks * v <= blocks:
                found.append((schedule, v))
    return found


def choose(blocks: Sequence[Block], ranks: int, settings: Settings, model: dict[str, Any],
           values: Sequence[Value] = ()) -> Plan:
    from partitioning.solve.partition import partition  # partition dispatches here

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
                plan = partition(blocks, ranks, each, model, values)
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

