"""Generated GPT-2, BERT, RoBERTa and BART of one transformers release against that release's stock, in one process.

Run with ``PYTHONPATH=.venv/transformers/<release>`` (tests/releases/test_seed_releases.py does): every seed family
committed for the release is checked here, so a release costs one interpreter and one import. Each family
describes itself at the release in tests/support/seed_releases/<family>.py.

    python tests/support/seed_release_worker.py --release 4.57.6 --install-dir .venv/transformers/4.57.6 \\
        --families gpt2,bert --json out.json [--checks eval,fx] [--generated gpt2=PATH] [--real-weights] [--pick CHECK=K]

Checks (named cases per family; a failing case does not stop the others), stock with eager attention:
  eval               every config, class and path, with and without masks: outputs torch.equal
  train              same seed in train mode: the output (a loss, or the output weighted by position) and every
                     gradient torch.equal
  state-dict         stock's keys, in order
  stateless          make_stateless(): eval outputs, train loss and every gradient equal (the shared weight's
                     against the embedding's); stateful_state_dict() has stock's keys and values; every config
                     (--pick stateless=K: the K-th of each Family's)
  fx                 symbolic_trace (absent inputs concrete None): equal to eager on the traced shape and another
  train-graph        a graph traced in train mode follows .eval() and .train() (and drops out in train)
  export-strict, export-non-strict   every size that differs between two shapes dynamic (Dim.AUTO), the
                     exported program equal to eager on both shapes (a specialised size fails the second); strict
                     the default class, non-strict every class (--pick export-non-strict=K: the K-th of each Family's)
With --real-weights (BERT among the families): all-MiniLM-L6-v2 under a new BertForSequenceClassification
head, stock's and ours, on real text (tests/support/real_weights.py), recorded as "real-weights".
Exit 0 when every check passed, 1 when one failed, 2 when the environment is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.export import Dim

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository: generated_models, stateless
from support.model_checks import (  # noqa: E402
    Family,
    Inputs,
    assert_equal_gradients,
    assert_train_trace_follows_mode,
    eval_outputs,
    fx_trace,
    train_step,
)
from support.release_process import environment, wrong_release  # noqa: E402
from support.seed_releases import FAMILIES, families  # noqa: E402
from support.t5_release_worker import describe  # noqa: E402

CHECKS = ("eval", "train", "state-dict", "stateless", "fx", "train-graph", "export-strict", "export-non-strict")
Case = tuple[str, Callable[[], None]]


def call(family: Family, class_name: str, path: str, config_name: str, masks: bool = True,
         other: bool = False) -> Inputs:
    """One call's keyword arguments; ``other``: another batch size and the family's other lengths."""
    shape: dict[str, Any] = {"batch": 3, "seed": 5, **family.lengths} if other else {}
    return family.call_kwargs(class_name, family.make_inputs(masks, config_name=config_name, **shape), path)


def check_eval(family: Family) -> Iterator[Case]:
    for config_name in family.configs:
        for class_name, path in family.cases():
            def run(config_name: str = config_name, class_name: str = class_name, path: str = path) -> None:
                reference, converted = family.pair(class_name, config_name)
                for masks in (True, False):
                    actual, expected = eval_outputs(family, class_name, reference, converted,
                                                    call(family, class_name, path, config_name, masks))
                    assert torch.equal(actual, expected), f"masks={masks}: outputs differ"
            yield f"{class_name}/{path}/{config_name}", run


def check_train(family: Family) -> Iterator[Case]:
    for config_name in family.configs:
        for class_name, path in family.cases():
            def run(config_name: str = config_name, class_name: str = class_name, path: str = path) -> None:
                reference, converted = family.pair(class_name, config_name)
                kwargs = call(family, class_name, path, config_name)
                actual, expected = train_step(family, class_name, reference, converted, kwargs)
                assert torch.equal(actual, expected), "train-mode outputs differ"
                assert assert_equal_gradients(converted, reference) > 10, "too few gradients compared"
            yield f"{class_name}/{path}/{config_name}", run


def check_state_dict(family: Family) -> Iterator[Case]:
    for class_name in family.classes:
        def run(class_name: str = class_name) -> None:
            for config_name in family.configs:
                reference, converted = family.pair(class_name, config_name)
                assert list(converted.state_dict()) == list(reference.state_dict()), f"{config_name}: keys differ"
        yield class_name, run


def check_stateless(family: Family, pick: int | None = None) -> Iterator[Case]:
    """Every config, or with ``pick`` the config at that position (modulo the count; the suite rotates it)."""
    configs = family.configs if pick is None else (family.configs[pick % len(family.configs)],)
    for config_name in configs:
        for class_name in family.classes:
            if family.shared_key(class_name) is None:
                continue

            def run(config_name: str = config_name, class_name: str = class_name) -> None:
                reference, converted = family.pair(class_name, config_name)
                try:
                    converted.make_stateless()
                except ValueError as exc:
                    # transformers 5.x ties BART's embeddings only with tie_word_embeddings: untied, stock shares
                    # nothing, and the stateless form (one parameter for what is shared) refuses in one line.
                    if "does not tie its weight" in str(exc) and _shares_nothing(reference, family.shared_key(class_name)):
                        return
                    raise
                state = converted.stateful_state_dict()
                assert sorted(state) == sorted(reference.state_dict()), "stateful_state_dict() keys differ"
                assert all(torch.equal(state[k], v) for k, v in reference.state_dict().items()), "values differ"
                for path in family.paths[class_name]:
                    actual, expected = eval_outputs(family, class_name, reference, converted,
                                                    call(family, class_name, path, config_name))
                    assert torch.equal(actual, expected), f"{path}: eval differs"
                kwargs = call(family, class_name, family.paths[class_name][-1], config_name)
                actual, expected = train_step(family, class_name, reference, converted, kwargs)
                assert torch.equal(actual, expected), "train-mode outputs differ"
                weight, key = family.shared_weight(class_name), family.shared_key(class_name)
                assert weight is not None and key is not None
                assert assert_equal_gradients(converted, reference, {weight: key}) > 10, "too few gradients"
                assert converted.get_parameter(weight).grad.abs().sum() > 0, "the shared weight got no gradient"
            yield f"{class_name}/{config_name}", run


def _shares_nothing(reference: torch.nn.Module, key: str | None) -> bool:
    """Whether no other state-dict entry of the stock model shares the storage of the shared weight ``key``."""
    state = reference.state_dict(keep_vars=True)
    return key is not None and sum(v is state[key] for v in state.values()) == 1


def check_fx(family: Family) -> Iterator[Case]:
    config_name = family.configs[-1]
    for class_name, path in family.cases():
        def run(class_name: str = class_name, path: str = path) -> None:
            _, module = family.pair(class_name, config_name)
            module.eval()
            for masks in (True, False):
                kwargs = call(family, class_name, path, config_name, masks)
                graph = fx_trace(module, kwargs)
                with torch.no_grad():
                    assert torch.equal(graph(**kwargs), module(**kwargs)), f"masks={masks}: traced != eager"
                    other = call(family, class_name, path, config_name, masks, other=True)
                    assert torch.equal(graph(**other), module(**other)), f"masks={masks}: traced != eager, 2nd shape"
        yield f"{class_name}/{path}", run


def check_train_graph(family: Family) -> Iterator[Case]:
    config_name = family.configs[-1]
    for class_name in family.classes:
        def run(class_name: str = class_name) -> None:
            _, module = family.pair(class_name, config_name)
            assert_train_trace_follows_mode(module, call(family, class_name, family.paths[class_name][0], config_name))
        yield class_name, run


def dynamic_shapes(first: Inputs, second: Inputs) -> dict[str, dict[int, Any]]:
    """Every size that differs between the two calls is dynamic; export decides which sizes are one symbol."""
    return {name: {dim: Dim.AUTO for dim, (a, b) in enumerate(zip(value.shape, second[name].shape)) if a != b}
            for name, value in first.items()}


def export_cases(family: Family, strict: bool, pick: int | None = None) -> Iterator[Case]:
    """strict: one class, the family's default where this Family has it (a head's own Family: its first class);
    non-strict: every class, or with ``pick`` the class at that position (modulo the count; the suite rotates it
    along the releases, release_process.export_pick)."""
    config_name = family.configs[-1]
    default = family.model_family.definition.default_class
    if strict:
        classes = [default if default in family.paths else family.classes[0]]
    else:
        classes = list(family.classes) if pick is None else [family.classes[pick % len(family.classes)]]
    for class_name in classes:
        path = family.paths[class_name][0]

        def run(class_name: str = class_name, path: str = path) -> None:
            _, module = family.pair(class_name, config_name)
            module.eval()
            kwargs = call(family, class_name, path, config_name)
            other = call(family, class_name, path, config_name, other=True)
            exported = torch.export.export(module, (), kwargs, dynamic_shapes=dynamic_shapes(kwargs, other),
                                           strict=strict).module()
            with torch.no_grad():
                assert torch.equal(exported(**kwargs), module(**kwargs)), "exported != eager"
                assert torch.equal(exported(**other), module(**other)), "exported != eager on another shape"
        yield f"{class_name}/{path}", run


Picks = dict[str, int]  # check -> which of each Family's classes or configs it takes (absent: all)
RUNNERS: dict[str, Callable[[Family, Picks], Iterator[Case]]] = {
    "eval": lambda family, _: check_eval(family), "train": lambda family, _: check_train(family),
    "state-dict": lambda family, _: check_state_dict(family),
    "stateless": lambda family, picks: check_stateless(family, picks.get("stateless")),
    "fx": lambda family, _: check_fx(family), "train-graph": lambda family, _: check_train_graph(family),
    "export-strict": lambda family, _: export_cases(family, strict=True),
    "export-non-strict": lambda family, picks: export_cases(family, strict=False, pick=picks.get("export-non-strict")),
}


def run_checks(members: list[Family], names: list[str], picks: Picks | None = None) -> dict[str, dict]:
    results = {}
    for name in names:
        started, failures, passed = time.monotonic(), {}, 0
        for family in members:
            try:
                for case, thunk in RUNNERS[name](family, picks or {}):
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


def check_real_weights(bert: Family) -> dict[str, Any]:
    """tests/support/real_weights.py's head check on this release's stock and package: ok, gradients compared."""
    from support import real_weights

    try:
        return {"ok": True, "gradients": real_weights.check_sequence_classification(bert.stock, bert.generated)}
    except Exception as exc:
        return {"ok": False, "failure": describe(exc)}


def with_generated(member: Family, path: Path) -> Family:
    """``member`` with its generated module loaded from ``path`` (a harness test's broken copy)."""
    import dataclasses
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{member.generated.__name__}_override", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = member.generated.__package__  # its relative imports resolve against the real package
    spec.loader.exec_module(module)
    return dataclasses.replace(member, generated=module)


def run_in_subprocess(release: str, install_dir: Path, names: list[str], out: Path, checks: str | None = None,
                      generated: dict[str, Path] | None = None, real_weights: bool = False,
                      picks: dict[str, int] | None = None, timeout: float = 1800) -> tuple[int, dict | None, str]:
    """This worker for one release in a fresh interpreter: (exit code, results or None, stderr)."""
    import subprocess

    command = [sys.executable, str(Path(__file__).resolve()), "--release", release, "--install-dir", str(install_dir),
               "--families", ",".join(names), "--json", str(out)]
    if checks:
        command += ["--checks", checks]
    for family, path in (generated or {}).items():
        command += ["--generated", f"{family}={path}"]
    if real_weights:
        command.append("--real-weights")
    for check, k in (picks or {}).items():
        command += ["--pick", f"{check}={k}"]
    proc = subprocess.run(command, env=environment(install_dir), capture_output=True, text=True, timeout=timeout)
    record = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else None
    return proc.returncode, record, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", type=Path, required=True)
    parser.add_argument("--families", required=True, help="comma-separated: " + ", ".join(FAMILIES))
    parser.add_argument("--checks", default=",".join(CHECKS))
    parser.add_argument("--generated", action="append", default=[], help="FAMILY=PATH: check this file instead")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--real-weights", action="store_true", help="also the trained BERT checkpoint's head")
    parser.add_argument("--pick", action="append", default=[], metavar="CHECK=K",
                        help="stateless: only each Family's K-th config; export-non-strict: only its K-th class")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    problem = wrong_release(args.release, args.install_dir)
    names = [name for name in args.checks.split(",") if name]
    chosen = [name for name in args.families.split(",") if name]
    overrides = dict(item.split("=", 1) for item in args.generated)
    picks = {check: int(k) for check, k in (item.split("=", 1) for item in args.pick)}
    if (problem or set(names) - set(RUNNERS) or set(chosen) - set(FAMILIES) or set(picks) - {"stateless", "export-non-strict"}
            or (args.real_weights and "bert" not in chosen)):
        print(f"seed-release-worker: {problem or 'unknown checks or families'}", file=sys.stderr)
        return 2
    record: dict = {"release": args.release, "families": {}}
    started = time.monotonic()
    for name in chosen:
        try:
            members = families(name, args.release)
            if name in overrides:
                members = [with_generated(member, Path(overrides[name])) for member in members]
        except Exception as exc:  # a generated file that does not import fails every check, naming why
            failed = {"ok": False, "passed": 0, "seconds": 0.0, "failures": {"(import)": describe(exc)}}
            record["families"][name] = {check: failed for check in names}
            continue
        record["families"][name] = run_checks(members, names, picks)
        if name == "bert" and args.real_weights:
            record["real-weights"] = check_real_weights(members[0])
    record["seconds"] = round(time.monotonic() - started, 2)
    args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    ok = all(result["ok"] for checks in record["families"].values() for result in checks.values())
    ok = ok and record.get("real-weights", {"ok": True})["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
