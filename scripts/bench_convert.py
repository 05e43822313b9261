"""Time a whole conversion (cached source) against a bare libcst parse + print of the same file.

Usage: python scripts/bench_convert.py [--repeat N] [--family F --version X]
Prints the best-of-N time of each and their ratio; the target is <= 10x.  Both clocks: the wall
clock, and the process's CPU time, which a machine shared with other work disturbs far less.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import libcst as cst

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from converter.fetch import Fetcher  # noqa: E402
from converter.pipeline import Conversion, render  # noqa: E402
from converter.recipes import get_recipe  # noqa: E402


def best_of(repeat: int, func) -> tuple[float, float]:
    """The best wall-clock and the best CPU time of ``repeat`` calls."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        func()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--family", default="t5")
    parser.add_argument("--version", default="4.5.1")
    args = parser.parse_args()

    recipe = get_recipe(args.family)
    cache = REPO / "tests" / "fixtures" / "cache"
    sources = Fetcher(recipe.package, args.version, cache, "cache").fetch(recipe.members)
    text = sources[recipe.source].text
    conversion = Conversion(recipe, args.version, sources, "bench")

    floor = best_of(args.repeat, lambda: cst.parse_module(text).code)
    full = best_of(args.repeat, lambda: render(conversion, recipe.source))
    print(f"{recipe.family} {args.version}: {len(text.splitlines())} lines, "
          f"{len(recipe.transforms)} transforms")
    for clock, index in (("wall", 0), ("cpu", 1)):
        print(f"{clock:4s} floor (libcst parse + code): {floor[index] * 1000:8.1f} ms, full conversion: "
              f"{full[index] * 1000:8.1f} ms, ratio: {full[index] / floor[index]:.2f}x (target <= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
