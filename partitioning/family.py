"""A model family at one release: its recipe's family definition (``converter.family``) on the torch side.

Everything the partitioner, the pipelining backend and the benchmarks do with
a family goes through :class:`ModelFamily`: which classes it has and which of
them train, configs of its named shapes, building a generated model, its
block chain, the inputs of a micro-batch, and the plan's record of all that.
The knowledge itself is data in ``converter/recipe_data/<family>.toml``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from converter.errors import ConvertError
from converter.family import ClassInfo, FamilyDefinition, InputSpec
from converter.recipes import load_recipes
from partitioning.blocks import MicroBatch, accepted, build_model, chain_specs, import_class, make_inputs
from partitioning.costing import BlockSpec, Chain, cost_chain
from partitioning.plan import PlanError
from partitioning.shapes import check_config_values, config_file_kwargs, make_config, unknown_keys

GENERATED = "generated_models"
MAX_TOKENS = 1 << 31  # convert-model's default output root, an importable package


def definitions() -> dict[str, FamilyDefinition]:
    """Every family whose recipe has a family definition."""
    try:
        recipes = load_recipes()
    except ConvertError as exc:
        raise PlanError(exc.one_line()) from None
    return {name: recipe.definition for name, recipe in recipes.items() if recipe.definition is not None}


def definition(name: str) -> FamilyDefinition:
    known = definitions()
    if name not in known:
        raise PlanError(f"unknown family {name!r}; known: {', '.join(sorted(known)) or 'none'}")
    return known[name]


class ModelFamily:
    """One family at one transformers release (the release its generated code was converted from)."""

    def __init__(self, definition: FamilyDefinition, version: str) -> None:
        self.definition, self.version = definition, version

    @classmethod
    def load(cls, name: str, version: str) -> ModelFamily:
        return cls(definition(name), version)

    @property
    def name(self) -> str:
        return self.definition.family

    @property
    def package(self) -> str:
        """The generated package of this release (it exports every class of the recipe)."""
        from converter.pipeline import version_dir  # the converter's own layout rule (imports libcst: late)

        return f"{GENERATED}.{self.name}.{version_dir(self.version)}"

    def class_info(self, class_name: str) -> ClassInfo:
        try:
            return self.definition.classes[class_name]
        except KeyError:
            raise PlanError(f"unknown class {class_name!r}; known: {', '.join(self.definition.classes)}") from None

    def training_classes(self) -> list[str]:
        return [name for name, info in self.definition.classes.items() if info.trains]

    def model_class(self, class_name: str) -> type:
        self.class_info(class_name)
        return import_class(self.package, class_name, f"no generated model {self.package} (run: convert-model "
                                                      f"{self.name} --version {self.version})")

    def build(self, class_name: str, config: Any, device: str | torch.device = "meta") -> torch.nn.Module:
        """A generated ``class_name`` in training mode, built directly on ``device``."""
        return build_model(self.model_class(class_name), config, device)

    def config(self, shape: str | None = None, config_file: Path | None = None) -> Any:
        """The config of a named shape (default: the family's) or of a HuggingFace config file."""
        if shape is not None and config_file is not None:
            raise PlanError("give a shape name or a config file, not both")
        if config_file is not None:
            kwargs = config_file_kwargs(config_file)
            if not set(kwargs) & set(self.sizes()):
                raise PlanError(f"config {config_file} sets none of a {self.definition.config_class}'s sizes "
                                f"({', '.join(self.sizes()[:4])}...): give the model's config.json")
            check_config_values(self.definition.config_path, kwargs, self.sizes(), f"config {config_file}")
            return make_config(self.definition.config_path, kwargs)
        shape = shape or self.definition.default_shape
        if shape not in self.definition.shapes:
            raise PlanError(f"unknown shape {shape!r}; known: {', '.join(self.definition.shapes)}")
        kwargs = self.definition.shapes[shape]
        unknown = unknown_keys(self.definition.config_path, kwargs)
        if unknown:
            raise PlanError(f"shape {shape} of the {self.name} recipe sets {unknown[0]!r}, which "
                            f"{self.definition.config_class} does not have")
        return make_config(self.definition.config_path, kwargs)

    def sizes(self) -> list[str]:
        """Config keys every named shape sets to a positive integer (layer counts, widths, vocabulary...): a config
        file must too."""
        shapes = list(self.definition.shapes.values())
        return [key for key in shapes[0] if all(isinstance(shape.get(key), int) and not isinstance(shape.get(key), bool)
                                                and shape[key] > 0 for shape in shapes)]

    def micro_batch(self, batch: int, lengths: Mapping[str, int] | None = None) -> MicroBatch:
        """``batch`` sequences of the family's lengths: those given, the family's defaults for the rest."""
        lengths = dict(lengths or {})
        unknown = [name for name in lengths if name not in self.definition.lengths]
        if unknown:
            raise PlanError(f"the {self.name} family has no sequence length {unknown[0]!r} "
                            f"(its lengths: {', '.join(self.definition.lengths)})")
        defaults = self.definition.lengths
        sizes = {name: lengths.get(name, default) for name, default in defaults.items()}
        longest = max(sizes.values(), default=1)
        if batch * longest > MAX_TOKENS:  # torch's sizes are int64 and a model's square of them must be too
            raise PlanError(f"a micro-batch of {batch} x {longest} tokens is too large to cost (at most 2^31 tokens)")
        return MicroBatch(batch, sizes)

    def input_specs(self, class_name: str) -> tuple[InputSpec, ...]:
        return accepted(self.definition.inputs, self.model_class(class_name).forward)

    def inputs(self, class_name: str, config: Any, micro_batch: MicroBatch, device: str | torch.device,
               seed: int = 0) -> dict[str, torch.Tensor]:
        """One training micro-batch for ``class_name``: the family's inputs its forward takes."""
        return make_inputs(self.input_specs(class_name), config, micro_batch, device, seed)

    def block_specs(self, class_name: str, model: torch.nn.Module, layers_per_block: int = 1,
                    sublayers: bool = False) -> list[BlockSpec]:
        return chain_specs(self.definition.entries(self.class_info(class_name).name), model, layers_per_block,
                           sublayers)

    def layer_lists(self, class_name: str) -> tuple[str, ...]:
        return self.definition.layer_lists(self.class_info(class_name).name)

    def chain(self, class_name: str, config: Any, micro_batch: MicroBatch, layers_per_block: int = 1,
              device: str | torch.device = "meta", measure_repeats: int = 0, model: torch.nn.Module | None = None,
              sublayers: bool = False, clock: Callable[[], float] = time.perf_counter) -> Chain:
        """Build (unless given: then on its device) and cost the block chain of ``class_name``."""
        if model is None:
            model = self.build(class_name, config, device)
        else:
            device = next(model.parameters()).device
        kwargs = self.inputs(class_name, config, micro_batch, device)
        absent = {name: None for name in inspect.signature(model.forward).parameters if name not in kwargs}
        specs = self.block_specs(class_name, model, layers_per_block, sublayers)
        return cost_chain(model, specs, kwargs, absent, measure_repeats, clock)

    def describe(self, class_name: str, config: Any, micro_batch: MicroBatch, shape: str,
                 granularity: int | str) -> dict[str, Any]:
        """The plan's record of the model: enough for ``partitioning.train`` to rebuild it and its inputs."""
        return {"family": self.name, "version": self.version, "class": class_name,
                "output": self.class_info(class_name).output, "module": self.package,
                "config_class": self.definition.config_path, "shape": shape, "config": config.to_dict(),
                "granularity": granularity, "micro_batch": micro_batch.to_dict(),
                "inputs": [spec.to_dict() for spec in self.input_specs(class_name)],
                "layer_lists": list(self.layer_lists(class_name))}
