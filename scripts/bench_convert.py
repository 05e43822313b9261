"""Time a whole conversion (cached source) against a bare libcst parse + print of the same file.

Usage: python scripts/bench_convert.py [--repeat N]
Prints the best-of-N time of each and their ratio; the target is <= 10x.
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


def best_of(repeat: int, func) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


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
    print(f"floor (libcst parse + code): {floor * 1000:8.1f} ms")
    print(f"full conversion:             {full * 1000:8.1f} ms")
    print(f"ratio: {full / floor:.2f}x (target <= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
