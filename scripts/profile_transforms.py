"""Print how long each transform of a recipe takes on the cached source (best of N)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from converter.fetch import Fetcher  # noqa: E402
from converter.pipeline import add_imports  # noqa: E402
from converter.recipes import TransformStep, get_recipe  # noqa: E402
from transforms import REGISTRY  # noqa: E402
from transforms.library.base import DEFER_IMPORT_EDITS, SUPPORT_SOURCES  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="t5")
    parser.add_argument("--version", default="4.5.1")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    recipe = get_recipe(args.family)
    sources = Fetcher(recipe.package, args.version, REPO / "tests/fixtures/cache", "cache").fetch(recipe.members)
    tree = cst.parse_module(sources[recipe.source].text)
    supports = {m: sources[m].text for m in recipe.support}
    total = 0.0
    shared = CodemodContext(full_module_name=recipe.module_name,
                            full_package_name=recipe.module_name.rpartition(".")[0],
                            scratch={SUPPORT_SOURCES: supports, DEFER_IMPORT_EDITS: True})

    def transform(step: TransformStep, ctx: CodemodContext, tree: cst.Module) -> cst.Module:
        return REGISTRY[step.name](ctx, step.options_for(args.version)).transform_module(tree)

    steps: list[tuple[str, Callable[[CodemodContext, cst.Module], cst.Module]]] = [
        (s.name, partial(transform, s)) for s in recipe.steps_for(args.version)]
    steps.append(("(import edits)", lambda ctx, tree: add_imports(tree, ctx)))
    for name, apply in steps:
        best, result = float("inf"), tree
        for _ in range(args.repeat):
            scratch = dict(shared.scratch)
            context = CodemodContext(full_module_name=shared.full_module_name,
                                     full_package_name=shared.full_package_name, scratch=scratch)
            start = time.perf_counter()
            result = apply(context, tree)
            best = min(best, time.perf_counter() - start)
        shared.scratch.update(scratch)
        tree, total = result, total + best
        print(f"{name:24s} {best * 1000:8.1f} ms")
    print(f"{'total':24s} {total * 1000:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
