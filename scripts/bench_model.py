"""Forward + backward time of the generated T5 against stock transformers, same weights, one run.

Usage: python scripts/bench_model.py [--repeat N] [--batch B --source S --target T]
t5-small shape (random weights: none are downloaded), CPU, train mode with labels.
Timings interleave the two models (alternating which goes first) so machine noise
hits both alike; the ratio is median(generated) / median(stock), with the ratio of
minimums beside it; the target is <= 1.02.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from transformers import T5Config  # noqa: E402
from transformers.models.t5 import modeling_t5 as stock  # noqa: E402

from generated_models.t5.v4_5_1 import modeling_t5 as generated  # noqa: E402

T5_SMALL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                relative_attention_num_buckets=32, dropout_rate=0.1, feed_forward_proj="relu",
                decoder_start_token_id=0, pad_token_id=0)


def step(model: torch.nn.Module, kwargs: dict, stock_output: bool) -> None:
    model.zero_grad(set_to_none=True)
    output = model(**kwargs)
    (output.loss if stock_output else output).backward()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--source", type=int, default=64)
    parser.add_argument("--target", type=int, default=32)
    parser.add_argument("--stateless", action="store_true", help="time the generated model's stateless form")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = T5Config(**T5_SMALL)
    torch.manual_seed(0)
    reference = stock.T5ForConditionalGeneration(config).train()
    converted = generated.T5ForConditionalGeneration(config).train()
    converted.load_state_dict(reference.state_dict())
    if args.stateless:
        converted.make_stateless()
    generator = torch.Generator().manual_seed(0)
    kwargs = {"input_ids": torch.randint(1, 32128, (args.batch, args.source), generator=generator),
              "labels": torch.randint(1, 32128, (args.batch, args.target), generator=generator)}
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
    print(f"t5-small shape, batch {args.batch}, source {args.source}, target {args.target}, "
          f"{args.repeat} interleaved steps, {torch.get_num_threads()} threads, generated form: {form}")
    print(f"stock     forward+backward median {stock_median * 1000:8.1f} ms "
          f"(min {min(times['stock']) * 1000:.1f})")
    print(f"generated forward+backward median {generated_median * 1000:8.1f} ms "
          f"(min {min(times['generated']) * 1000:.1f})")
    print(f"ratio generated/stock: median {generated_median / stock_median:.3f}, "
          f"min {min(times['generated']) / min(times['stock']):.3f} (target <= 1.02)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
