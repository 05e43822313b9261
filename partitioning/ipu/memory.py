"""What each IPU holds while training a placement, term by term, against a Mk2 IPU's In-Processor Memory.

The model follows how PopTorch / PopART train a pipelined model the way
optimum-graphcore sets it up (docs/ipu.md has the sources):

* **weights**: float16 after ``model.half()`` (``half_precision``), float32 otherwise;
  a shared weight lives once, on the IPU of all its users.
* **gradient accumulators**: one per weight, in the optimizer's first-order type
  (optimum-graphcore's trainer passes ``accum_type`` = the first-order
  momentum type, float16 unless training in float32).
* **optimizer state**: Adam's two moments (``optimizer_states`` of the plan;
  the first in float16 with ``enable_half_first_order_momentum``, the second
  float32); nothing on chip with ``optimizer_state_offchip``, one replica's
  share with ``replicated_tensor_sharding`` and replication > 1.
* **stashed activations**: PopTorch turns on PopART's
  ``RecomputationType::Pipeline`` when it pipelines over several IPUs, so a
  pipeline stage keeps, per micro-batch in flight, only its inputs and the
  recomputation checkpoints inside it; stage ``s`` of ``N`` has
  ``2 (N - s) - 1`` micro-batches in flight (its forward runs ``2 (N - s) - 2``
  pipeline steps before its backward).
* **recomputation working set**: one micro-batch's saved activations of the
  largest segment between checkpoints, while that segment is recomputed
  (stages of an IPU run one at a time).  Without pipelining, every block's
  saved activations of one micro-batch.
* **projection temporaries**: the vocabulary projection's matmul partials
  (its weight's size, in the partials type), split ``embedding_serialization_factor``
  ways by serializing the matmul, and capped by ``available_memory_proportion``
  (the cap PopLibs plans matmul temporaries within; it is not a reservation).

The plan's bytes are float32 (the costing builds models in float32; integer
inputs are int64): with ``half_precision`` weights and activations are half
of them (ids become int32 on the IPU).  Activation and crossing bytes are
the plan's, for its micro-batch.  Not modelled: other matmul and convolution
temporaries (capped by ``available_memory_proportion``), code, exchange
buffers and host streams, which only compilation measures.  So fitting is
necessary, not sufficient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from partitioning.ipu.config import IPUConfig
from partitioning.plan import Block

# Mk2 (GC200) In-Processor Memory, Graphcore's "900 MB": 1472 tiles of 624 KiB.
IPU_MEMORY_BYTES = 1472 * 624 * 1024
_FLOAT32 = 4


@dataclass(frozen=True)
class MemoryTerms:
    """Bytes one IPU holds, by what holds them."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    stash: float = 0.0
    working: float = 0.0
    temporaries: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def largest(self) -> tuple[str, float]:
        name = max((f.name for f in fields(self)), key=lambda n: getattr(self, n))
        return name, getattr(self, name)


TERM_NAMES = {
    "weights": "weights",
    "gradients": "gradient accumulators",
    "optimizer": "optimizer state",
    "stash": "stashed activations",
    "working": "recomputation working set",
    "temporaries": "projection temporaries",
}
TERM_COLUMNS = {"weights": "weights", "gradients": "grads", "optimizer": "optimizer", "stash": "stash",
                "working": "recompute", "temporaries": "temps"}
TERM_FIXES = {
    "weights": "use more IPUs",
    "gradients": "use more IPUs",
    "optimizer": "set optimizer_state_offchip (or replicated_tensor_sharding with replication_factor > 1)",
    "stash": "use a smaller micro-batch, fewer pipeline stages, or fewer recompute checkpoints",
    "working": "use a smaller micro-batch or checkpoint more often (recompute_every_layer)",
    "temporaries": "raise embedding_serialization_factor or lower available_memory_proportion",
}


@dataclass(frozen=True)
class StageLoad:
    """One pipeline stage on an IPU: its number in the pipeline, its blocks in order, the bytes it receives."""

    index: int
    blocks: tuple[Block, ...]
    input_bytes: int


@dataclass(frozen=True)
class Projection:
    """The vocabulary projection (optimum-graphcore serializes it): the block that runs it and its weight's bytes."""

    block: str
    weight_bytes: int


@dataclass(frozen=True)
class MemoryModel:
    config: IPUConfig
    optimizer_states: int  # optimizer copies of each parameter (Adam: 2)
    checkpoints: frozenset[str]  # blocks whose outputs are recomputation checkpoints
    projection: Projection | None = None

    @property
    def scale(self) -> float:
        """IPU bytes per plan byte, for weights and activations."""
        return 0.5 if self.config.half_precision else 1.0

    @property
    def first_order_bytes(self) -> int:
        return 2 if self.config.half_precision and self.config.enable_half_first_order_momentum else 4

    def terms(self, stages: Sequence[StageLoad], pipeline_stages: int, proportion: float) -> MemoryTerms:
        """What one IPU holds: ``stages`` are the pipeline stages it runs, of ``pipeline_stages`` in all."""
        config = self.config
        blocks = [block for stage in stages for block in stage.blocks]
        param_bytes = sum(block.param_bytes for block in blocks)
        params = param_bytes / _FLOAT32
        weights = param_bytes * self.scale
        gradients = optimizer = stash = 0.0
        if config.training:
            gradients = params * self.first_order_bytes
            if not config.optimizer_state_offchip and self.optimizer_states > 0:
                shards = config.replication_factor if config.replicated_tensor_sharding else 1
                optimizer = params * (self.first_order_bytes + _FLOAT32 * (self.optimizer_states - 1)) / shards
        pipelined = config.pipelined and pipeline_stages > 1
        if config.training and pipelined:
            stash = sum(self.depth(stage.index, pipeline_stages) * self.stashed(stage) for stage in stages)
            working = max((self.segment(stage) for stage in stages), default=0.0)
        elif config.training:  # one IPU: PopTorch recomputes nothing, every saved activation stays
            working = sum(block.activation_bytes for block in blocks) * self.scale
        else:  # inference keeps nothing for a backward pass: the live tensors of the largest block at most
            working = max((block.activation_bytes for block in blocks), default=0) * self.scale
        return MemoryTerms(weights, gradients, optimizer, stash, working, self.temporaries(blocks, proportion))

    @staticmethod
    def depth(index: int, pipeline_stages: int) -> int:
        """Micro-batches whose stash pipeline stage ``index`` holds at once."""
        return max(2 * (pipeline_stages - index) - 1, 1)

    def stashed(self, stage: StageLoad) -> float:
        """Bytes one micro-batch leaves in a stage's stash: its inputs and its checkpoints (not its output)."""
        kept = sum(block.out_bytes for block in stage.blocks[:-1] if block.name in self.checkpoints)
        return (stage.input_bytes + kept) * self.scale

    def segment(self, stage: StageLoad) -> float:
        """The largest run of blocks between checkpoints: what recomputing it holds for one micro-batch."""
        largest = current = 0
        for block in stage.blocks:
            current += block.activation_bytes
            largest = max(largest, current)
            if block.name in self.checkpoints:
                current = 0
        return largest * self.scale

    def temporaries(self, blocks: Sequence[Block], proportion: float) -> float:
        projection = self.projection
        if projection is None or not any(block.name == projection.block for block in blocks):
            return 0.0
        partial = 2 if self.config.enable_half_partials else 4
        need = projection.weight_bytes / _FLOAT32 * partial / self.config.embedding_serialization_factor
        return min(need, proportion * IPU_MEMORY_BYTES)
