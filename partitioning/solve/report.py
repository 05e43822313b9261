"""The human-readable table of a plan."""

from __future__ import annotations

from partitioning.plan import Plan
from partitioning.schedules import SINGLE


def _blocks(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"  # significant digits: tiny test models and t5-11b alike


def _mb(size: int) -> str:
    return f"{size / 1e6:.4g}"


def format_plan(plan: Plan) -> str:
    chunked = bool(plan.placement)
    rows = [("chunk, rank" if chunked else "stage", "blocks", "compute ms", "recompute ms", "send ms", "send MB", "total ms", "memory GB")]
    for stage in plan.stages:
        sent = "" if stage.send_bytes is None else _mb(stage.send_bytes)
        where = f"{stage.index}, {plan.placement[stage.index]}" if chunked else str(stage.index)
        rows.append((where, _blocks(stage.blocks), _ms(stage.compute), _ms(stage.recompute_time),
                     _ms(stage.communication), sent, _ms(stage.cost), f"{stage.memory_bytes / 1e9:.4g}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) if c == 1 else cell.rjust(width)
                       for c, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.append(f"bottleneck {_ms(plan.bottleneck)} ms, ideal {_ms(plan.ideal)} ms, "
                 f"bottleneck / ideal {plan.ratio:.3f}")
    lines += _prediction(plan)
    by_name = {value.name: value for value in plan.values}
    for name in plan.recomputed:
        value = by_name[name]
        readers = [str(stage.index) for stage in plan.stages if value.key in stage.recompute]
        if readers:
            lines.append(f"recomputed, not sent: {value.key} ({_mb(value.bytes)} MB) by stage(s) {', '.join(readers)}")
    return "\n".join(lines)



def _of(plan: Plan) -> str:
    """`` of B`` sequences where ``--schedule auto`` chose the micro-batch count (the micro-batch changed)."""
    if "micro_batch_counts" not in plan.prediction:
        return ""
    return f" of {plan.model.get('micro_batch', {}).get('batch')} (chosen)"


def _prediction(plan: Plan) -> list[str]:
    """The simulated step of the plan's schedule, and of the schedules it was chosen over."""
    prediction = plan.prediction
    if "step_time" not in prediction:
        return []  # a plan from before the simulator
    schedule = f"{plan.settings.get('schedule')}" + (f" (V={plan.settings['virtual_stages']})"
                                                     if (plan.settings.get("virtual_stages") or 1) > 1 else "")
    lines = [f"predicted step {_ms(prediction['step_time'])} ms under {schedule}, "
             f"{plan.settings.get('micro_batches')} micro-batches{_of(plan)}: bubble {prediction['bubble']:.1%}, "
             f"peak rank memory {max(prediction['rank_memory_bytes']) / 1e9:.4g} GB"]
    if "rank_tied_sync" in prediction:
        lines.append(f"  of which pipeline {_ms(prediction['pipeline_time'])} ms, then per rank tied-gradient sum "
                     f"{' / '.join(_ms(t) for t in prediction['rank_tied_sync'])} ms and optimizer step "
                     f"{' / '.join(_ms(t) for t in prediction['rank_update'])} ms")
    for row in prediction.get("micro_batch_counts", ()):
        if row["micro_batches"] != plan.settings.get("micro_batches"):
            name = row["schedule"] + (f" (V={row['virtual_stages']})" if row["virtual_stages"] > 1 else "")
            lines.append(f"  instead {row['micro_batches']} micro-batches of {row['batch']}: step "
                         f"{_ms(row['step_time'])} ms under {name}")
    for row in prediction.get("alternatives", ()):
        name = row["schedule"] + (f" (V={row['virtual_stages']})" if row["virtual_stages"] > 1 else "")
        if "error" in row:
            lines.append(f"  instead {name}: cannot run ({row['error']})")
        else:
            how = "" if row.get("searched") or row["schedule"] in SINGLE else ", balanced split"
            fits = "" if row["fits"] else ", does not fit"
            lines.append(f"  instead {name}: step {_ms(row['step_time'])} ms, bubble {row['bubble']:.1%}, "
                         f"peak {row['peak_memory_bytes'] / 1e9:.4g} GB{how}{fits}")
    return lines
