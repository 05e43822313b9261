"""Forward + backward time of a generated model against stock transformers, same weights, one run.

Usage: python scripts/bench_model.py [FAMILY] [--version V] [--shape S] [--repeat N] [--batch B]
       [--seq-len NAME=N ...] [--shrink F] [--stateless]
The family's default class at its default shape (random weights: none are downloaded) on
the family's training inputs (labels included; its default sequence lengths / 8 unless
given), CPU, train mode; T5 when no family is named.
Timings interleave the two models (alternating which goes first) so machine noise hits both
alike; the ratio is median(generated) / median(stock), with the ratio of minimums beside it;
the target is <= 1.02.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from converter.recipes import get_recipe  # noqa: E402
from families.family import ModelFamily  # noqa: E402
from families.models import SharedWeight  # noqa: E402


def step(model: torch.nn.Module, kwargs: dict, stock_output: bool) -> None:
    model.zero_grad(set_to_none=True)
    output = model(**kwargs)
    (output.loss if stock_output else output).backward()  # stock returns a ModelOutput, generated the loss


def _length(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    return name, int(value)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("family", nargs="?", default="t5")
    parser.add_argument("--version", default="4.5.1", help="the installed transformers release (the stock model)")
    parser.add_argument("--shape", help="a named shape of the family (default: its default)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=_length, action="append", default=[], metavar="NAME=N",
                        help="a sequence length (default: the family's default / --shrink)")
    parser.add_argument("--shrink", type=int, default=8,
                        help="divide the family's default lengths by this (default 8: about a second per step)")
    parser.add_argument("--stateless", action="store_true", help="time the generated model's stateless form")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    family = ModelFamily.load(args.family, args.version)
    recipe = get_recipe(args.family)
    stock = importlib.import_module(recipe.module_name)
    if stock.__name__.split(".")[0] == "transformers":
        import transformers

        if transformers.__version__ != args.version:
            raise SystemExit(f"stock transformers is {transformers.__version__}, not {args.version}")
    class_name = family.definition.default_class
    if not family.class_info(class_name).trains:
        raise SystemExit(f"{class_name} computes no loss: nothing to backward")
    config = family.config(args.shape)
    lengths = {name: max(1, length // args.shrink) for name, length in family.definition.lengths.items()}
    micro_batch = family.micro_batch(args.batch, {**lengths, **dict(args.seq_len)})
    torch.manual_seed(0)
    reference = getattr(stock, class_name)(config).train()
    converted = family.build(class_name, config, "cpu")
    converted.load_state_dict(reference.state_dict())
    if args.stateless:
        if not isinstance(converted, SharedWeight):
            raise SystemExit(f"{class_name} shares no weight: it has no stateless form")
        converted.make_stateless()
    kwargs = family.inputs(class_name, config, micro_batch, "cpu")
    for _ in range(3):  # warm up allocator and kernels
        step(reference, kwargs, True)
        step(converted, kwargs, False)
    times: dict[str, list[float]] = {"stock": [], "generated": []}
    pairs = [("stock", reference), ("generated", converted)]
    for round_index in range(args.repeat):
        # Alternate who goes first: allocator and cache state then favour neither.
        for name, model in pairs if round_index % 2 == 0 else pairs[::-1]:
            start = time.perf_counter()
            step(model, kwargs, name == "stock")
            times[name].append(time.perf_counter() - start)
    stock_median, generated_median = statistics.median(times["stock"]), statistics.median(times["generated"])
    form = "stateless" if args.stateless else "stateful"
    print(f"{family.name} {class_name}, shape {args.shape or family.definition.default_shape}, micro-batch "
          f"{micro_batch.describe()}, inputs {', '.join(kwargs)}, {args.repeat} interleaved steps, "
          f"{torch.get_num_threads()} threads, generated form: {form}")
    print(f"stock     forward+backward median {stock_median * 1000:8.1f} ms "
          f"(min {min(times['stock']) * 1000:.1f})")
    print(f"generated forward+backward median {generated_median * 1000:8.1f} ms "
          f"(min {min(times['generated']) * 1000:.1f})")
    print(f"ratio generated/stock: median {generated_median / stock_median:.3f}, "
          f"min {min(times['generated']) / min(times['stock']):.3f} (target <= 1.02)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
