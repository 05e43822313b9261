"""The human-readable table of a plan."""

from __future__ import annotations

from partitioning.plan import Plan


def _blocks(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"  # significant digits: tiny test models and t5-11b alike


def _mb(size: int) -> str:
    return f"{size / 1e6:.4g}"


def format_plan(plan: Plan) -> str:
    rows = [("stage", "blocks", "compute ms", "recompute ms", "send ms", "send MB", "total ms", "memory GB")]
    for stage in plan.stages:
        sent = "" if stage.send_bytes is None else _mb(stage.send_bytes)
        rows.append((str(stage.index), _blocks(stage.blocks), _ms(stage.compute), _ms(stage.recompute_time),
                     _ms(stage.communication), sent, _ms(stage.cost), f"{stage.memory_bytes / 1e9:.4g}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) if c == 1 else cell.rjust(width)
                       for c, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.append(f"bottleneck {_ms(plan.bottleneck)} ms, ideal {_ms(plan.ideal)} ms, "
                 f"bottleneck / ideal {plan.ratio:.3f}")
    by_name = {value.name: value for value in plan.values}
    for name in plan.recomputed:
        value = by_name[name]
        readers = [str(stage.index) for stage in plan.stages if value.key in stage.recompute]
        if readers:
            lines.append(f"recomputed, not sent: {value.key} ({_mb(value.bytes)} MB) by stage(s) {', '.join(readers)}")
    return "\n".join(lines)

