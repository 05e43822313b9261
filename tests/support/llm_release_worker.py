"""Generated decoder-only LLMs of one transformers release against that release's stock models, in one process.

Run with ``PYTHONPATH=.venv/transformers/<release>`` (tests/releases/test_llm_releases.py does): every
family committed for the release is checked here, so a release costs one interpreter and one import.

    python tests/support/llm_release_worker.py --release 5.23.0 --install-dir .venv/transformers/5.23.0 \\
        --families llama,qwen2 --json out.json [--checks eval,fx] [--generated llama=PATH] [--pick K]

Checks (named cases per family; a failing case does not stop the others), stock with eager attention,
tiny configs (GQA, tied with rope scaling, untied without; a sliding window shorter than the sequence
where the family has one), with and without a padding mask, with labels and without:
  eval, train        outputs torch.equal (eval also with packed sequences: position ids, no mask); train mode, same seed: the loss and every gradient equal
  state-dict         stock's keys, in order
  stateless          make_stateless(): eval output, train loss and every gradient equal (the shared one
                     against the embedding's); stateful_state_dict() has stock's keys and values
  fx                 symbolic_trace (absent inputs concrete None): equal on the traced shape and another
  train-graph        a graph traced in train mode, switched with .eval(), equals eager eval
  export-strict, export-non-strict   dynamic batch and sequence, equal on two shapes
Exit 0 when every check passed, 1 when one failed, 2 when the environment is wrong.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.export import Dim

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository: generated_models, stateless
from support.llm_models import CONFIGS, FAMILIES, MASKS, Family, inputs, stock_output  # noqa: E402
from support.release_process import environment, wrong_release  # noqa: E402
from support.t5_release_worker import compare_gradients, describe, scalar  # noqa: E402

CHECKS = ("eval", "train", "state-dict", "stateless", "fx", "train-graph", "export-strict", "export-non-strict")
Case = tuple[str, Callable[[], None]]


def paths(family: Family) -> Iterator[tuple[str, bool]]:
    """(class, with labels): the causal LM with and without labels, the base model without."""
    yield family.lm, True
    yield family.lm, False
    yield family.base, False


def train_step(model: torch.nn.Module, kwargs: dict, stock: bool, seed: int) -> torch.Tensor:
    model.train()
    torch.manual_seed(seed)
    output = model(**kwargs)
    value = scalar(stock_output(output, kwargs) if stock else output)
    value.backward()
    return value


def check_eval(family: Family) -> Iterator[Case]:
    for config in CONFIGS:
        for class_name in (family.lm, family.base):
            def run(config=config, class_name=class_name) -> None:
                reference, converted = family.pair(class_name, config)
                reference.eval(), converted.eval()
                for cls, labels in paths(family):
                    if cls != class_name:
                        continue
                    for mask in (*MASKS, "packed"):
                        kwargs = inputs(mask, labels)
                        # Packed: stock 4.5x with its default use_cache builds a cache and then ignores packing;
                        # the generated model is stock with use_cache=False (its header says so).
                        cache = {"use_cache": False} if mask == "packed" else {}
                        with torch.no_grad():
                            expected, actual = stock_output(reference(**kwargs, **cache), kwargs), converted(**kwargs)
                        assert torch.equal(actual, expected), f"labels={labels}/{mask}: outputs differ"
            yield f"{class_name}/{config}", run


def check_train(family: Family) -> Iterator[Case]:
    for config in CONFIGS:
        for class_name, labels in paths(family):
            for mask in MASKS:
                def run(config=config, class_name=class_name, labels=labels, mask=mask) -> None:
                    reference, converted = family.pair(class_name, config)
                    kwargs = inputs(mask, labels)
                    expected = train_step(reference, kwargs, stock=True, seed=1234)
                    actual = train_step(converted, kwargs, stock=False, seed=1234)
                    assert torch.equal(actual, expected), "train-mode outputs differ"
                    grads = {name: p.grad for name, p in reference.named_parameters()}
                    assert compare_gradients(converted, grads) > 10, "too few gradients compared"
                yield f"{class_name}/{'labels' if labels else 'logits'}/{config}/{mask}", run


def check_state_dict(family: Family) -> Iterator[Case]:
    for class_name in (family.lm, family.base):
        def run(class_name=class_name) -> None:
            for config in CONFIGS:
                reference, converted = family.pair(class_name, config)
                assert list(converted.state_dict()) == list(reference.state_dict()), f"{config}: keys differ"
        yield class_name, run


def check_stateless(family: Family) -> Iterator[Case]:
    for config in CONFIGS:
        for class_name, labels in paths(family):
            def run(config=config, class_name=class_name, labels=labels) -> None:
                reference, converted = family.pair(class_name, config)
                converted.make_stateless()  # type: ignore[operator]
                shared = "model.embed_tokens.weight" if class_name == family.lm else "embed_tokens.weight"
                stateful = converted.stateful_state_dict()  # type: ignore[operator]
                # Same keys (stateless/sharing.py puts the shared weight's first; loading reads them by name).
                assert sorted(stateful) == sorted(reference.state_dict()), "stateful_state_dict() keys differ"
                assert all(torch.equal(stateful[k], v) for k, v in reference.state_dict().items()), "values differ"
                kwargs = inputs("padded", labels)
                reference.eval(), converted.eval()
                with torch.no_grad():
                    assert torch.equal(converted(**kwargs), stock_output(reference(**kwargs), kwargs)), "eval differs"
                expected = train_step(reference, kwargs, stock=True, seed=3)
                actual = train_step(converted, kwargs, stock=False, seed=3)
                assert torch.equal(actual, expected), "train-mode outputs differ"
                grads = {name: p.grad for name, p in reference.named_parameters()}
                grads["shared_embed_weight"] = grads.pop(shared)
                compare_gradients(converted, grads)
                grad = converted.get_parameter("shared_embed_weight").grad
                assert grad is not None and grad.abs().sum() > 0, "shared weight got no gradient"
            yield f"{class_name}/{'labels' if labels else 'logits'}/{config}", run


def absent(module: torch.nn.Module, kwargs: dict) -> dict:
    return {name: None for name in inspect.signature(module.forward).parameters if name not in kwargs}


def check_fx(family: Family) -> Iterator[Case]:
    for class_name, labels in paths(family):
        for mask in MASKS:
            def run(class_name=class_name, labels=labels, mask=mask) -> None:
                module = family.build(class_name).eval()
                kwargs = inputs(mask, labels)
                graph = torch.fx.symbolic_trace(module, concrete_args=absent(module, kwargs))
                with torch.no_grad():
                    assert torch.equal(graph(**kwargs), module(**kwargs)), "traced != eager"
                    other = inputs(mask, labels, batch=3, seq=9, seed=5)
                    assert torch.equal(graph(**other), module(**other)), "traced != eager on another shape"
            yield f"{class_name}/{'labels' if labels else 'logits'}/{mask}", run


def check_train_graph(family: Family) -> Iterator[Case]:
    for class_name in (family.lm, family.base):
        def run(class_name=class_name) -> None:
            module = family.build(class_name).train()
            kwargs = inputs("padded", False)
            graph = torch.fx.symbolic_trace(module, concrete_args=absent(module, kwargs))
            torch.manual_seed(0)
            first = graph(**kwargs)
            torch.manual_seed(1)
            assert not torch.equal(first, graph(**kwargs)), "the train-mode graph does not drop out"
            graph.eval(), module.eval()
            with torch.no_grad():
                assert torch.equal(graph(**kwargs), module(**kwargs)), "the graph does not follow .eval()"
        yield class_name, run


def export_cases(family: Family, strict: bool, pick: int | None = None) -> Iterator[Case]:
    """strict: the LM with labels; non-strict: every class and path, or with ``pick`` the one at that position
    (modulo the count; the suite rotates it along the releases, release_process.picks)."""
    every = list(paths(family))
    chosen = [(family.lm, True)] if strict else every if pick is None else [every[pick % len(every)]]
    for class_name, labels in chosen:
        def run(class_name=class_name, labels=labels) -> None:
            module = family.build(class_name).eval()
            kwargs = inputs("padded", labels)
            batch, seq = Dim("batch", min=2, max=64), Dim("seq", min=3, max=60)
            shapes = {name: {0: batch, 1: seq} for name in kwargs}
            exported = torch.export.export(module, (), kwargs, dynamic_shapes=shapes, strict=strict).module()
            with torch.no_grad():
                assert torch.equal(exported(**kwargs), module(**kwargs)), "exported != eager"
                other = inputs("padded", labels, batch=5, seq=11, seed=9)
                assert torch.equal(exported(**other), module(**other)), "exported != eager on another shape"
        yield f"{class_name}/{'labels' if labels else 'logits'}", run


RUNNERS: dict[str, Callable[[Family], Iterator[Case]]] = {
    "eval": check_eval, "train": check_train, "state-dict": check_state_dict, "stateless": check_stateless,
    "fx": check_fx, "train-graph": check_train_graph,
    "export-strict": lambda family: export_cases(family, strict=True),
    "export-non-strict": lambda family: export_cases(family, strict=False),
}


def run_checks(family: Family, names: list[str], pick: int | None = None) -> dict[str, dict]:
    """Every check of ``names``; ``pick``: the non-strict export's path (see :func:`export_cases`)."""
    results = {}
    for name in names:
        started, failures, passed = time.monotonic(), {}, 0
        try:
            cases = export_cases(family, False, pick) if name == "export-non-strict" else RUNNERS[name](family)
            for case, thunk in cases:
                try:
                    thunk()
                    passed += 1
                except Exception as exc:  # every failing case is reported, none stops the others
                    failures[case] = describe(exc)
        except Exception as exc:
            failures["(setup)"] = describe(exc)
        results[name] = {"ok": not failures and passed > 0, "passed": passed, "failures": failures,
                         "seconds": round(time.monotonic() - started, 2)}
    return results


def run_in_subprocess(release: str, install_dir: Path, families: list[str], out: Path, checks: str | None = None,
                      generated: dict[str, Path] | None = None, pick: int | None = None,
                      timeout: float = 1800) -> tuple[int, dict | None, str]:
    """This worker for one release in a fresh interpreter: (exit code, results or None, stderr)."""
    import subprocess

    command = [sys.executable, str(Path(__file__).resolve()), "--release", release, "--install-dir", str(install_dir),
               "--families", ",".join(families), "--json", str(out)]
    if checks:
        command += ["--checks", checks]
    for family, path in (generated or {}).items():
        command += ["--generated", f"{family}={path}"]
    if pick is not None:
        command += ["--pick", str(pick)]
    proc = subprocess.run(command, env=environment(install_dir), capture_output=True, text=True, timeout=timeout)
    record = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else None
    return proc.returncode, record, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", type=Path, required=True)
    parser.add_argument("--families", required=True, help="comma-separated: " + ", ".join(FAMILIES))
    parser.add_argument("--checks", default=",".join(CHECKS))
    parser.add_argument("--generated", action="append", default=[], help="FAMILY=PATH: check this file instead")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--pick", type=int, help="export-non-strict: only each family's K-th class and path")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    problem = wrong_release(args.release, args.install_dir)
    names = [name for name in args.checks.split(",") if name]
    families = [name for name in args.families.split(",") if name]
    overrides = dict(item.split("=", 1) for item in args.generated)
    if problem or set(names) - set(RUNNERS) or set(families) - set(FAMILIES):
        print(f"llm-release-worker: {problem or 'unknown checks or families'}", file=sys.stderr)
        return 2
    record: dict = {"release": args.release, "families": {}}
    started = time.monotonic()
    for name in families:
        try:
            family = Family(name, args.release, Path(overrides[name]) if name in overrides else None)
        except Exception as exc:  # a generated file that does not import fails every check, naming why
            failed = {"ok": False, "passed": 0, "seconds": 0.0, "failures": {"(import)": describe(exc)}}
            record["families"][name] = {check: failed for check in names}
            continue
        record["families"][name] = run_checks(family, names, args.pick)
    record["seconds"] = round(time.monotonic() - started, 2)
    args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    ok = all(result["ok"] for checks in record["families"].values() for result in checks.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
