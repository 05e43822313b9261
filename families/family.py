"""A model family at one release: its recipe's family definition (``families.definition``) on the torch side.

Everything the converter's checks, the partitioner, the backends and the
benchmarks do with a family's models goes through :class:`ModelFamily`: which
classes it has and which of them train, configs of its named shapes, building
a generated model, the inputs of a micro-batch, and the plan's record of all
that.  Costing its block chain is the partitioner's (``partitioning.cost.chain``).
The knowledge itself is data in ``families/recipe_data/<family>.toml``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from families import installed, limits, pp_plan
from families.definition import ClassInfo, FamilyDefinition, InputSpec
from families.layout import converted_in, default_root, generated_package, models_root, mount, root_package, version_dir
from families.models import MicroBatch, accepted, build_model, import_class, make_inputs
from families.registry import definition, definitions
from families.shapes import check_config_values, config_class, config_file_kwargs, make_config, shape_kwargs

__all__ = ["ModelFamily", "definition", "definitions"]

MAX_TOKENS = 1 << 31  # tokens of a micro-batch
# Attention scores are batch x heads x length x length: their bytes must stay far inside int64, which
# torch's sizes are (a costing on the meta device allocates nothing, but still computes the size).
MAX_SCORES = 1 << 48


class ModelFamily:
    """One family at one transformers release (the release its generated code was converted from)."""

    def __init__(self, definition: FamilyDefinition, version: str, models_dir: Path | None = None) -> None:
        self.definition, self.version = definition, version
        self.root = models_root(models_dir)  # None: the repository's generated_models
        self._checked_release = False

    @classmethod
    def load(cls, name: str, version: str, models_dir: Path | None = None) -> ModelFamily:
        """``name`` at ``version``, its generated code imported from ``models_dir`` (default: the repo's)."""
        if models_dir is not None and not models_dir.is_dir():
            raise UserError(f"--models-dir {models_dir} is not a directory",
                            hint=f"convert-model {name} --version {version} --output-dir {models_dir} writes it")
        return cls(definition(name), version, models_dir)

    @classmethod
    def of_plan(cls, described: Mapping[str, Any], models_dir: Path | None = None) -> ModelFamily:
        """The family a plan's model record names, importing the code it was planned with (or ``models_dir``'s).

        A plan records its models directory (``describe``), so every process that rebuilds its model, torchrun
        ranks included, imports the same code.  Raises KeyError for a record without family or version.
        """
        name, version = described["family"], described["version"]
        recorded = described.get("models_dir")
        if models_dir is None and recorded is not None:
            models_dir = Path(recorded)
            if not models_dir.is_dir():
                raise UserError(f"the plan's models directory {recorded} no longer exists",
                                hint=f"convert-model {name} --version {version} --output-dir {recorded} writes it "
                                     f"again, or give --models-dir DIR")
        family = cls.load(name, version, models_dir)
        module = described["module"]  # the package it named, whichever directory it was imported from
        if not (isinstance(module, str) and module.endswith(f".{name}.{version_dir(version)}")
                and (module == family.package or models_dir is not None)):
            raise UserError(f"the plan's module is {module!r} but the {name} recipe gives {family.package!r}: "
                            f"re-plan with partition-model")
        family.require_release()  # before the plan's config is built: its class is that release's
        return family

    @property
    def name(self) -> str:
        return self.definition.family

    @property
    def package(self) -> str:
        """The generated package of this release (it exports every class of the recipe), as it imports here."""
        return generated_package(self.name, self.version, self.root)

    def _missing(self) -> UserError:
        """No generated package of this release where this family looks: the convert-model run that writes it."""
        here, root = Path.cwd(), self.root or default_root()
        run = f"convert-model {self.name} --version {self.version}"  # its default output: ./generated_models
        run += "" if (here / root_package(None)).resolve() == root else f" --output-dir {root}"
        if self.root is not None:
            return UserError(f"no generated model {self.name} {self.version} in {self.root} (run: {run})")
        found = [d for d in (here, here / root_package(None)) if converted_in(d, self.name, self.version)]
        hint = f"{found[0]} holds convert-model's output for it: give --models-dir {found[0]}" if found else None
        return UserError(f"no generated model {self.package} (run: {run})", hint=hint)

    def class_info(self, class_name: str) -> ClassInfo:
        try:
            return self.definition.classes[class_name]
        except KeyError:
            raise UserError(f"unknown class {class_name!r}; known: {', '.join(self.definition.classes)}") from None

    def training_classes(self) -> list[str]:
        return [name for name, info in self.definition.classes.items() if info.trains]

    def require_release(self) -> None:
        """The package whose models and configs this release's generated code uses is that very release."""
        if self._checked_release:
            return
        package = self.definition.package
        if not self._importable() and self.root is None and installed.release(package)[0] == self.version:
            self.root = self._converted_here()  # the installed release, committed nowhere: the user's own package
        if not self._importable():  # no package of this release at all is said first: convert-model makes it
            raise self._missing()
        found, _ = installed.release(package)
        if found != self.version:
            raise installed.other_release(package, self.version, f"{self.package} (generated from {package} "
                                          f"{self.version})", f"partition-model {self.name} --version {found} plans the release here"
                                          if found and converted_in(default_root(), self.name, found) else None)
        self._checked_release = True
        if self.definition.chain_from is not None and not self.definition.chain:
            self._read_chain()

    def _importable(self) -> bool:
        mount(self.root)
        try:
            return importlib.util.find_spec(self.package) is not None
        except ModuleNotFoundError:
            return False

    def _converted_here(self) -> Path:
        """The installed release's package in the user's cache (``installed.user_models``), converted on first use.

        convert-model writes it as for any release nothing verifies: checked against the installed stock code
        first, or refused in one line.  It runs as the command, in a process of its own: the tools stand side by
        side, neither imports the other.
        """
        root = installed.user_models().resolve()
        if converted_in(root, self.name, self.version):
            return root
        print(f"{self.name} {self.version}: no committed package; converting the installed release into {root} "
              f"(once)", file=sys.stderr, flush=True)
        command = [sys.executable, "-m", "converter", self.name, "--version", self.version, "--output-dir",
                   str(root), "--quiet"]
        proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip()] or [f"exit {proc.returncode}"]
            raise UserError(f"{self.name} {self.version} is committed nowhere and its conversion for this "
                            f"environment failed: {lines[-1].removeprefix('convert-model: error: ')}")
        return root

    def _read_chain(self) -> None:
        """The chain and tied weights the release's own classes declare (``[pipeline] chain = "pp_plan"``)."""
        recipe = self.definition
        classes = {name: self.model_class(name) for name in recipe.classes}
        model = self.build(recipe.default_class, self.config(recipe.verify_shape))
        stand_in = next((plan for plan in recipe.chain_plans if plan.covers(self.version)), None)
        chain = pp_plan.read_chain(config_class(recipe.config_path), classes, model,
                                   recipe.classes[recipe.default_class].base, recipe.chain_sublayers, stand_in)
        for name, cls in classes.items():
            built = model if name == recipe.default_class else None
            if built is None and isinstance(getattr(cls, "_tied_weights_keys", None), list):
                built = self.build(name, self.config(recipe.verify_shape))
            pp_plan.check_tied(recipe.origin, recipe.classes[name], recipe.shared.get(name, ()),
                               pp_plan.tied_keys(cls, built))
        self.definition = replace(recipe, chain=chain)

    def model_class(self, class_name: str) -> type[torch.nn.Module]:
        self.class_info(class_name)
        self.require_release()
        try:
            found = import_class(self.package, class_name, str(self._missing()))
        except ImportError as exc:
            raise UserError(f"{self.package} does not import ({type(exc).__name__}: {exc})") from None
        assert issubclass(found, torch.nn.Module), found  # class_info: one of the family's generated model classes
        return found

    def build(self, class_name: str, config: Any, device: str | torch.device = "meta") -> torch.nn.Module:
        """A generated ``class_name`` in training mode, built directly on ``device``."""
        return build_model(self.model_class(class_name), config, device)

    def config(self, shape: str | None = None, config_file: Path | None = None) -> Any:
        """The config of a named shape (default: the family's) or of a HuggingFace config file."""
        if shape is not None and config_file is not None:
            raise UserError("give a shape name or a config file, not both")
        self.require_release()
        if config_file is not None:
            kwargs = config_file_kwargs(config_file)
            if not set(kwargs) & set(self.sizes()):
                raise UserError(f"config {config_file} sets none of a {self.definition.config_class}'s sizes "
                                f"({', '.join(self.sizes()[:4])}...): give the model's config.json")
            check_config_values(self.definition.config_path, kwargs, self.sizes(), f"config {config_file}")
            return make_config(self.definition.config_path, kwargs)
        shape = shape or self.definition.default_shape
        if shape not in self.definition.shapes:
            raise UserError(f"unknown shape {shape!r}; known: {', '.join(self.definition.shapes)}")
        kwargs, unknown = shape_kwargs(self.definition, shape, self.version)
        if unknown:
            raise UserError(f"shape {shape} of the {self.name} recipe sets {unknown[0]!r}, which "
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
            raise UserError(f"the {self.name} family has no sequence length {unknown[0]!r} "
                            f"(its lengths: {', '.join(self.definition.lengths)})")
        defaults = self.definition.lengths
        sizes = {name: lengths.get(name, default) for name, default in defaults.items()}
        longest = max(sizes.values(), default=1)
        if batch * longest > MAX_TOKENS or batch * longest * longest > MAX_SCORES:
            raise UserError(f"a micro-batch of {batch} x {longest} tokens is too large to cost (at most 2^31 tokens, "
                            f"and batch x length^2 at most 2^48: attention scores are that large)")
        return MicroBatch(batch, sizes)

    def check_limits(self, config: Any, micro_batch: MicroBatch, where: str) -> None:
        """``config`` and ``micro_batch`` are within what the family's models take (its ``[model.limits]``)."""
        limits.check(self.definition.limits, config, micro_batch.lengths, where)

    def input_specs(self, class_name: str) -> tuple[InputSpec, ...]:
        return accepted(self.definition.class_inputs(class_name), self.model_class(class_name).forward)

    def inputs(self, class_name: str, config: Any, micro_batch: MicroBatch, device: str | torch.device,
               seed: int = 0) -> dict[str, torch.Tensor]:
        """One training micro-batch for ``class_name``: the family's inputs its forward takes."""
        return make_inputs(self.input_specs(class_name), config, micro_batch, device, seed)

    def layer_lists(self, class_name: str) -> tuple[str, ...]:
        self.require_release()  # a chain read from the release's classes is read there
        return self.definition.layer_lists(self.class_info(class_name).name)

    def describe(self, class_name: str, config: Any, micro_batch: MicroBatch, shape: str,
                 granularity: int | str) -> dict[str, Any]:
        """The plan's record of the model: enough for ``partitioning.gpu.train`` to rebuild it and its inputs."""
        return {"family": self.name, "version": self.version, "class": class_name,
                "output": self.class_info(class_name).output, "module": self.package,
                "config_class": self.definition.config_path, "shape": shape, "config": config.to_dict(),
                "granularity": granularity, "micro_batch": micro_batch.to_dict(),
                "inputs": [spec.to_dict() for spec in self.input_specs(class_name)],
                "layer_lists": list(self.layer_lists(class_name)),
                **({"models_dir": str(self.root)} if self.root is not None else {})}


def trained_model(described: Mapping[str, Any], models_dir: Path | None = None
                  ) -> tuple[ModelFamily, str, Any, list[InputSpec], MicroBatch]:
    """The family, class, config, inputs and micro-batch of a plan's model record, to train it.

    The record is what :meth:`ModelFamily.describe` wrote; one naming other code or another config class, a
    class that does not train, a missing key, or sizes past the model's limits is refused in one line.
    """
    try:
        family = ModelFamily.of_plan(described, models_dir)  # the code it was planned with, or models_dir's
        class_name = described["class"]
        info = family.class_info(class_name)
        if not info.trains:
            raise UserError(f"training runs need a plan of a class whose forward returns its loss; {class_name} "
                            f"returns its {info.output}")
        if described["config_class"] != family.definition.config_path:
            raise UserError(f"the plan's config_class is {described['config_class']!r} but the {family.name} recipe "
                            f"gives {family.definition.config_path!r}: re-plan with partition-model")
        config = make_config(family.definition.config_path, described["config"])
        specs = [InputSpec.from_dict(spec) for spec in described["inputs"]]
        micro_batch = MicroBatch.from_dict(described["micro_batch"])
        family.check_limits(config, micro_batch, "the plan's model config")
    except KeyError as exc:
        raise UserError(f"the plan does not say how to rebuild its model (no {exc}): re-plan with partition-model") \
            from None
    return family, class_name, config, specs, micro_batch
