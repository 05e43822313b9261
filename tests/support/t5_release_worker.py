"""Generated T5 of one transformers release against that release's stock T5, in a process of its own.

Run with ``PYTHONPATH=.venv/transformers/<release>`` (tests/test_t5_releases.py and
scripts/release_table.py do): the process must import exactly that release, never the one
installed in .venv, and checks so before anything else.

    python tests/t5_release_worker.py --release 4.46.3 --install-dir .venv/transformers/4.46.3 \\
        --generated generated_models/t5/v4_46_3/modeling_t5.py [--checks eval,fx] --json out.json

Checks (each a list of named cases; a failing case does not stop the others):
  eval              every configuration, class, path, with and without masks, and a one-token target:
                    outputs torch.equal
  train             the same cases in train mode with dropout 0.1, same seed: output and every gradient equal
  dropout-active    guards ``train``: two seeds give different outputs
  state-dict        the generated model has stock's state-dict keys, in order
  stateless-eval    make_stateless(): outputs equal stock (tied and untied)
  stateless-train   make_stateless(): output and every gradient equal (the shared one summed over its uses)
  fx                torch.fx.symbolic_trace (absent inputs as concrete None): clean graph, equal to eager
                    on the traced shape and another one
  export-strict     torch.export.export strict, dynamic batch and sequence dims, equal on two shapes:
                    T5ForConditionalGeneration and T5EncoderModel (T5Model runs the same stack code;
                    strict export costs 4 to 11 s of CPU per class here)
  export-non-strict the same, non-strict, every class
  partition         ``partition-model t5 --version <release>`` (the committed package, not --generated): a
                    2-stage plan of the tiny shape on meta for every class
  ftpipe            FTPipe's tracer semantics (tests/support/ftpipe_standin.py): every class and path,
                    stateful and stateless, with and without padding; the recorded program torch.equal
                    to eager on the traced inputs and on fresh ones (tests/support/t5_release_ftpipe.py)
Stock runs the eager attention where a release offers several (``attn_implementation="eager"``),
which is what the generated model computes. Exit 0 when every check passed, 1 when one failed,
2 when the environment is wrong (another transformers imported, missing files).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import operator
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.export import Dim

# Run as a script: tests/ for the support package, and this checkout's root before any editable install of
# another checkout (the generated code imports stateless, the partition check partitioning).
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
from support.release_process import environment, wrong_release  # noqa: E402
from support.t5_cases import CLASSES, CONFIGS, PATHS, call_kwargs, config_kwargs, inputs, reference_output  # noqa: E402
from support.t5_release_ftpipe import ftpipe_cases  # noqa: E402

CHECKS = ("eval", "train", "dropout-active", "state-dict", "stateless-eval", "stateless-train", "fx",
          "export-strict", "export-non-strict", "partition", "ftpipe")
TIED, UNTIED = "1layer-relu-tied", "2layer-gelu-untied"
TRACE_CONFIG = UNTIED
CASES = [(cls, path) for cls in CLASSES for path in PATHS[cls]]
MASKS = {"masks": True, "no-masks": False}


class Models:
    """Stock and generated T5 classes of one release, built on the tiny configurations."""

    def __init__(self, generated_file: Path) -> None:
        from transformers import T5Config
        from transformers.models.t5 import modeling_t5

        self.config_class, self.stock = T5Config, modeling_t5
        spec = importlib.util.spec_from_file_location(f"generated_t5_{abs(hash(generated_file))}", generated_file)
        assert spec is not None and spec.loader is not None  # a .py file: the source loader
        self.generated = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = self.generated
        spec.loader.exec_module(self.generated)
        # Releases with several attention implementations (4.36 on) take the choice as a config
        # argument; older ones have only the eager computation.
        self.selects_attention = hasattr(T5Config(), "_attn_implementation")

    def config(self, name: str):
        kwargs = config_kwargs(name)
        if self.selects_attention:
            kwargs["attn_implementation"] = "eager"
        return self.config_class(**kwargs)

    def attention(self) -> str:
        return self.config(TIED)._attn_implementation if self.selects_attention else "eager (only)"

    def pair(self, class_name: str, config_name: str, seed: int = 0) -> tuple[Any, Any]:
        """Stock and generated, same weights; Any: mypy sees neither model's attributes (imported by name)."""
        cfg = self.config(config_name)
        torch.manual_seed(seed)
        reference = getattr(self.stock, class_name)(cfg)
        if self.selects_attention:
            assert reference.config._attn_implementation == "eager", reference.config._attn_implementation
        converted = getattr(self.generated, class_name)(cfg)
        converted.load_state_dict(reference.state_dict(), strict=True)
        return reference, converted

    def build(self, class_name: str, config_name: str = TRACE_CONFIG) -> Any:  # a generated model, as pair's
        torch.manual_seed(0)
        return getattr(self.generated, class_name)(self.config(config_name))


def scalar(value: torch.Tensor) -> torch.Tensor:
    return value if value.dim() == 0 else (value * torch.linspace(-1, 1, value.numel()).view_as(value)).sum()


def compare_gradients(converted: torch.nn.Module, grads: dict[str, torch.Tensor | None]) -> int:
    compared = 0
    for name, parameter in converted.named_parameters():
        assert name in grads, f"parameter {name} is not stock's"
        expected = grads[name]
        if expected is None:
            assert parameter.grad is None, f"{name}: gradient where stock has none"
            continue
        assert parameter.grad is not None, f"{name}: no gradient where stock has one"
        assert torch.equal(parameter.grad, expected), f"{name}: gradient differs"
        compared += 1
    return compared


def train_step(model: torch.nn.Module, kwargs: dict, class_name: str, stock: bool, seed: int) -> torch.Tensor:
    model.train()
    torch.manual_seed(seed)
    output = model(**kwargs)
    value = scalar(reference_output(class_name, output, kwargs) if stock else output)
    value.backward()
    return value


# -- checks: each yields (case name, thunk) ----------------------------------------------------

Case = tuple[str, Callable[[], None]]


def check_eval(models: Models) -> Iterator[Case]:
    for config_name in CONFIGS:
        for class_name in CLASSES:
            def run(config_name=config_name, class_name=class_name) -> None:
                reference, converted = models.pair(class_name, config_name)
                reference.eval(), converted.eval()
                for path in PATHS[class_name]:
                    for mask_name, masks in MASKS.items():
                        for shape, values in (("", inputs(masks)), ("/target-1", inputs(masks, 3, 4, 1, seed=3))):
                            kwargs = call_kwargs(class_name, values, path)
                            with torch.no_grad():
                                expected = reference_output(class_name, reference(**kwargs), kwargs)
                                actual = converted(**kwargs)
                            where = f"{path}/{mask_name}{shape}"
                            assert isinstance(actual, torch.Tensor), f"{where}: returns {type(actual)}"
                            assert torch.equal(actual, expected), f"{where}: outputs differ"
            yield f"{class_name}/{config_name}", run


def check_train(models: Models) -> Iterator[Case]:
    for config_name in CONFIGS:
        for class_name, path in CASES:
            for mask_name, masks in MASKS.items():
                def run(config_name=config_name, class_name=class_name, path=path, masks=masks) -> None:
                    reference, converted = models.pair(class_name, config_name)
                    kwargs = call_kwargs(class_name, inputs(masks), path)
                    expected = train_step(reference, kwargs, class_name, stock=True, seed=1234)
                    actual = train_step(converted, kwargs, class_name, stock=False, seed=1234)
                    assert torch.equal(actual, expected), "train-mode outputs differ"
                    grads = {name: p.grad for name, p in reference.named_parameters()}
                    assert compare_gradients(converted, grads) > 10, "too few gradients compared"
                yield f"{class_name}/{path}/{config_name}/{mask_name}", run


def check_dropout_active(models: Models) -> Iterator[Case]:
    def run() -> None:
        _, converted = models.pair("T5ForConditionalGeneration", UNTIED)
        kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels")
        converted.train()
        torch.manual_seed(1)
        first = converted(**kwargs)
        torch.manual_seed(2)
        assert not torch.equal(first, converted(**kwargs)), "train mode gives the same output for two seeds"
    yield "T5ForConditionalGeneration", run


def check_state_dict(models: Models) -> Iterator[Case]:
    for class_name in CLASSES:
        def run(class_name=class_name) -> None:
            reference, converted = models.pair(class_name, UNTIED)
            assert list(converted.state_dict()) == list(reference.state_dict()), "state-dict keys differ"
        yield class_name, run


def check_stateless_eval(models: Models) -> Iterator[Case]:
    for config_name in (TIED, UNTIED):
        for class_name in CLASSES:
            def run(config_name=config_name, class_name=class_name) -> None:
                reference, converted = models.pair(class_name, config_name)
                converted.make_stateless()
                reference.eval(), converted.eval()
                for path in PATHS[class_name]:
                    kwargs = call_kwargs(class_name, inputs(True), path)
                    with torch.no_grad():
                        expected = reference_output(class_name, reference(**kwargs), kwargs)
                        assert torch.equal(converted(**kwargs), expected), f"{path}: outputs differ"
            yield f"{class_name}/{config_name}", run


def check_stateless_train(models: Models) -> Iterator[Case]:
    for config_name in (TIED, UNTIED):
        for class_name in CLASSES:
            def run(config_name=config_name, class_name=class_name) -> None:
                reference, converted = models.pair(class_name, config_name)
                converted.make_stateless()
                kwargs = call_kwargs(class_name, inputs(True), PATHS[class_name][0])
                expected = train_step(reference, kwargs, class_name, stock=True, seed=3)
                actual = train_step(converted, kwargs, class_name, stock=False, seed=3)
                assert torch.equal(actual, expected), "train-mode outputs differ"
                grads = {name: p.grad for name, p in reference.named_parameters()}
                grads["shared_embed_weight"] = grads.pop("shared.weight")
                compare_gradients(converted, grads)
                assert converted.shared_embed_weight.grad.abs().sum() > 0, "shared weight got no gradient"
            yield f"{class_name}/{config_name}", run


def absent(module: torch.nn.Module, kwargs: dict) -> dict:
    """concrete_args for every optional input the call does not pass."""
    return {name: None for name in inspect.signature(module.forward).parameters if name not in kwargs}


def assert_clean_graph(graph: torch.fx.Graph) -> None:
    for node in graph.nodes:
        assert node.target not in (operator.is_, operator.is_not), f"identity test in the graph: {node.format_node()}"
        assert node.target is not F.dropout, f"functional dropout in the graph: {node.format_node()}"
        assert not isinstance(node.kwargs.get("training"), bool), f"training baked in: {node.format_node()}"


def check_fx(models: Models) -> Iterator[Case]:
    for class_name, path in CASES:
        for mask_name, masks in MASKS.items():
            def run(class_name=class_name, path=path, masks=masks) -> None:
                module = models.build(class_name).eval()
                kwargs = call_kwargs(class_name, inputs(masks), path)
                graph_module = torch.fx.symbolic_trace(module, concrete_args=absent(module, kwargs))
                assert_clean_graph(graph_module.graph)
                with torch.no_grad():
                    assert torch.equal(graph_module(**kwargs), module(**kwargs)), "traced != eager"
                    other = call_kwargs(class_name, inputs(masks, batch=3, source=9, target=4, seed=5), path)
                    assert torch.equal(graph_module(**other), module(**other)), "traced != eager on another shape"
            yield f"{class_name}/{path}/{mask_name}", run


def dynamic_shapes(kwargs: dict) -> dict:
    # target >= 3: shift-right slices labels[..., :-1], and export's 0/1 specialization
    # would otherwise demand target - 1 != 1.
    batch, source, target = Dim("batch", min=2, max=64), Dim("source", min=2, max=512), Dim("target", min=3, max=512)
    dims = {"input_ids": (batch, source), "attention_mask": (batch, source),
            "decoder_input_ids": (batch, target), "decoder_attention_mask": (batch, target),
            "labels": (batch, target)}
    return {name: {0: dims[name][0], 1: dims[name][1]} for name in kwargs}


STRICT_EXPORT_CLASSES = ("T5ForConditionalGeneration", "T5EncoderModel")


def export_cases(models: Models, strict: bool) -> Iterator[Case]:
    for class_name in STRICT_EXPORT_CLASSES if strict else CLASSES:
        def run(class_name=class_name) -> None:
            module = models.build(class_name).eval()
            path = "labels-only" if class_name == "T5ForConditionalGeneration" else "hidden"
            kwargs = call_kwargs(class_name, inputs(True), path)
            program = torch.export.export(module, (), kwargs, dynamic_shapes=dynamic_shapes(kwargs), strict=strict)
            exported = program.module()
            with torch.no_grad():
                assert torch.equal(exported(**kwargs), module(**kwargs)), "exported != eager"
                other = call_kwargs(class_name, inputs(True, batch=5, source=11, target=4, seed=9), path)
                assert torch.equal(exported(**other), module(**other)), "exported != eager on another shape"
        yield class_name, run


def partition_cases(models: Models) -> Iterator[Case]:
    import contextlib
    import io
    import tempfile

    import transformers

    from partitioning.cli import main as partition_model

    release = transformers.__version__
    for class_name in CLASSES:
        def run(class_name=class_name) -> None:
            with tempfile.TemporaryDirectory() as scratch:
                plan = Path(scratch) / "plan.json"
                printed, errors = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
                    code = partition_model(["t5", "--version", release, "--class", class_name, "--stages", "2",
                                            "--shape", "tiny", "--output", str(plan)])
                assert code == 0, f"partition-model exit {code}: {errors.getvalue().strip()[-300:]}"
                assert len(json.loads(plan.read_text())["stages"]) == 2, "the plan has not 2 stages"
        yield class_name, run


RUNNERS: dict[str, Callable[[Models], Iterator[Case]]] = {
    "eval": check_eval, "train": check_train, "dropout-active": check_dropout_active,
    "state-dict": check_state_dict, "stateless-eval": check_stateless_eval,
    "stateless-train": check_stateless_train, "fx": check_fx,
    "export-strict": lambda models: export_cases(models, strict=True),
    "export-non-strict": lambda models: export_cases(models, strict=False),
    "partition": partition_cases,
    "ftpipe": lambda models: ftpipe_cases(models.build, (TIED, UNTIED)),
}


def describe(exc: BaseException) -> str:
    """One line: the exception and, for errors raised inside model code, where."""
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if isinstance(exc, AssertionError):
        return message
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "modeling" in Path(f.filename).name]
    return f"{message} (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else message


def run_checks(models: Models, names: list[str]) -> dict[str, dict]:
    results = {}
    for name in names:
        started, cpu, failures, passed = time.monotonic(), time.process_time(), {}, 0
        try:
            for case, thunk in RUNNERS[name](models):
                try:
                    thunk()
                    passed += 1
                except Exception as exc:  # every failing case is reported, none stops the others
                    failures[case] = describe(exc)
        except Exception as exc:
            failures["(setup)"] = describe(exc)
        results[name] = {"ok": not failures and passed > 0, "passed": passed, "failures": failures,
                         "seconds": round(time.monotonic() - started, 2),
                         "cpu_seconds": round(time.process_time() - cpu, 2)}
    return results


def run_in_subprocess(release: str, install_dir: Path, generated: Path, out: Path, checks: str | None = None,
                      timeout: float = 1200) -> tuple[int, dict | None, str]:
    """Run this worker for one release in a fresh interpreter: (exit code, results or None, stderr)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--release", release, "--install-dir", str(install_dir),
               "--generated", str(generated), "--json", str(out)]
    if checks:
        command += ["--checks", checks]
    proc = subprocess.run(command, env=environment(install_dir), capture_output=True, text=True, timeout=timeout)
    record = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else None
    return proc.returncode, record, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", type=Path, required=True, help="the release's side-by-side install")
    parser.add_argument("--generated", type=Path, required=True, help="the generated modeling file")
    parser.add_argument("--checks", default=",".join(CHECKS), help="comma-separated subset of " + ", ".join(CHECKS))
    parser.add_argument("--json", type=Path, required=True, help="where the results go")
    args = parser.parse_args(argv)
    started, cpu = time.monotonic(), time.process_time()
    torch.set_num_threads(1)  # tiny models; runs beside other workers on a shared machine

    problem = wrong_release(args.release, args.install_dir)
    if problem:
        print(f"t5-release-worker: {problem}", file=sys.stderr)
        return 2
    import transformers
    location = Path(transformers.__file__).resolve()
    generated = args.generated.resolve()
    if not generated.is_file():
        print(f"t5-release-worker: {generated} not found", file=sys.stderr)
        return 2
    names = [name for name in args.checks.split(",") if name]
    unknown = [name for name in names if name not in RUNNERS]
    if unknown:
        print(f"t5-release-worker: unknown checks {unknown}; known: {', '.join(CHECKS)}", file=sys.stderr)
        return 2

    record: dict = {"release": args.release, "generated": str(generated), "transformers": str(location.parent)}
    try:
        models = Models(generated)
        record["attention"] = models.attention()
    except Exception as exc:  # a generated file that does not import fails every check, naming why
        failed = {"ok": False, "passed": 0, "seconds": 0.0, "cpu_seconds": 0.0, "failures": {"(import)": describe(exc)}}
        record.update(import_error=describe(exc), checks={name: failed for name in names})
    else:
        record["checks"] = run_checks(models, names)
    record["seconds"] = round(time.monotonic() - started, 2)
    record["cpu_seconds"] = round(time.process_time() - cpu, 2)
    args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0 if all(result["ok"] for result in record["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
