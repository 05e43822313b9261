"""Pipelined LLM training equals one process (torchrun, 2 and 3 gloo ranks, GPipe and 1F1B), every LLM family.

One launch of pipelining_worker.py with the release's transformers first on PYTHONPATH (as the release
workers run) trains tiny Llama configs both ways, 3 Adam steps: tied embeddings (the head's copy on the last
rank) cut between the two layers, and untied at the optimal split. Per-micro-batch losses, every gradient
and every weight after the steps torch.equal to the single process; every replica of the tied weight the
same; the stages replay the causal mask and the rotary cos/sin their plan names instead of receiving them.

Then every family at every committed release (two launches per release, one per rank count, all of its
families in each; pipelining_worker.py cases prefixed NAME@RELEASE/): on 2 ranks tied with GPipe cut inside the
layers and untied with 1F1B at the optimal split, on 3 ranks untied with GPipe at the optimal split and tied with
1F1B cut inside the layers and before the norm: all four at the newest release, and at the others one per rank
count, rotating (`cases`; every family still runs 2 and 3 ranks, tied and untied, at every release) (the untied tiny configs of the windowed families have a sliding
window of 4 on sequences of 7; Gemma 3 mixes sliding and full layers).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import load_script
from support import REPO, SUPPORT, TORCHRUN
from support.llm_release_worker import FAMILIES
from support.release_process import rotation, run_index

from common.versions import Release

CASES = {  # case -> (stages holding the tied weight, stages that recompute the mask and the rotary embedding)
    "tied:gpipe:2:model.layers.1": ({"shared_embed_weight": [0, 1]}, [1]),
    "untied:1f1b:4:optimal": ({}, [1]),
}
installer = load_script("install_releases")
RELEASE = installer.verified_releases()[-1]  # the newest: every cut runs there


def test_pipelined_llama_equals_one_process(tmp_path: Path) -> None:
    listed = {r.version: r for r in installer.read_releases()}
    assert installer.is_installed(listed[RELEASE]), f"no stock install of transformers {RELEASE}: bash scripts/setup.sh"
    path = [str(installer.install_dir(RELEASE)), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", str(SUPPORT / "pipelining_worker.py"),
                             "--out", str(tmp_path), "--family", f"llama@{RELEASE}", *CASES], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    records: dict[str, list[dict]] = {}
    for file in sorted(tmp_path.glob("*.json")):
        record = json.loads(file.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(CASES) and all(len(ranks) == 2 for ranks in records.values())
    for case, ranks in records.items():
        tied, replaying = CASES[case]
        for record in ranks:
            assert record["problems"] == [], f"{case} rank {record['rank']}: {record['problems'][:5]}"
            for chunk, keys in record["replayed"].items():  # one chunk per rank: chunk = rank
                assert keys == record["planned"][chunk], case  # the backend does what the plan says
                modules = sorted(key.split(":")[0] for key in keys)
                assert modules == (["model", "model.rotary_emb"] if int(chunk) in replaying else []), (case, modules)
        held: dict[str, list[int]] = {}
        for record in ranks:
            for name, chunks in record["tied"].items():
                held[name] = sorted(held.get(name, []) + chunks)
        assert held == tied, case


def committed() -> dict[str, list[str]]:
    """release -> the LLM families committed for it."""
    found: dict[str, list[str]] = {}
    for package in sorted((REPO / "generated_models").glob("*/v*/")):
        if package.parent.name in FAMILIES:
            found.setdefault(package.name[1:].replace("_", "."), []).append(package.parent.name)
    return found


# (release, ranks) -> cases: every family committed at the release on 2 and on 3 ranks, tied and untied; a case cut
# by name inside the layers replays the rotary cos/sin on stage 1.
CUTS = {2: ("tied:gpipe:2:model.layers.1", "untied:1f1b:2:optimal"),
        3: ("untied:gpipe:3:optimal", "tied:1f1b:3:model.layers.1,norm")}


def cases(release: str, families: list[str], ranks: int, releases: list[str]) -> list[str]:
    """Every cut at the newest release; at the others, one cut per family and rank count, rotating by family and
    release: each family still runs 2 and 3 ranks, tied and untied (cut k of both rank counts is one tied and one
    untied), with GPipe at one release and 1F1B at the next, and every launch holds both cuts (two families or more)."""
    shift = rotation(release, releases)
    if shift is None:
        return [f"{family}@{release}/{cut}" for family in families for cut in CUTS[ranks]]
    return [f"{family}@{release}/{CUTS[ranks][(index + shift) % 2]}" for index, family in enumerate(families)]


def launches(run: int) -> dict[tuple[str, int], list[str]]:
    """(release, ranks) -> the cases of one launch, for CI run ``run``: both rank counts at the newest release, one
    at each other, 2 and 3 alternating along the releases and from one run to the next (so that two consecutive
    runs launch every release on both)."""
    releases = list(COMMITTED)
    chosen = {}
    for release, families in COMMITTED.items():
        position = rotation(release, releases)
        for ranks in CUTS:
            if position is None or ranks == sorted(CUTS)[(position + run) % 2]:
                chosen[release, ranks] = cases(release, families, ranks, releases)
    return chosen


COMMITTED = committed()
LAUNCHES = launches(run_index())


def model_level_rotary(family: str, release: str) -> bool:
    """Whether the base model computes the rotary cos/sin once (``self.rotary_emb`` of its ``*Model``) and passes it
    to its layers: then a stage cut inside the layers replays it. Before (4.40; Mistral until 4.47) each attention
    layer computes its own, and nothing of it crosses a cut."""
    package = REPO / "generated_models" / family / f"v{release.replace('.', '_')}"
    for source in package.glob("modeling_*.py"):
        text = source.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Model") and "PreTrained" not in node.name:
                return "self.rotary_emb =" in (ast.get_source_segment(text, node) or "")
    raise AssertionError(f"no base model class in {package}")


def launch(release: str, ranks: int, cases: list[str], out: Path) -> dict[str, list[dict]]:
    listed = {r.version: r for r in installer.read_releases()}
    assert installer.is_installed(listed[release]), f"no stock install of transformers {release}: bash scripts/setup.sh"
    path = [str(installer.install_dir(release)), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={ranks}", str(SUPPORT / "pipelining_worker.py"),
                             "--out", str(out), *cases], env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-4000:]
    records: dict[str, list[dict]] = {}
    for file in sorted(out.glob("*.json")):
        record = json.loads(file.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(cases) and all(len(found) == ranks for found in records.values())
    return records


@pytest.mark.parametrize(("release", "ranks"), sorted(LAUNCHES))
def test_pipelined_llms_equal_one_process(release: str, ranks: int, tmp_path: Path) -> None:
    cases = LAUNCHES[release, ranks]
    for case, found in launch(release, ranks, cases, tmp_path).items():
        held: dict[str, list[int]] = {}
        for record in found:
            assert record["problems"] == [], f"{case} rank {record['rank']}: {record['problems'][:5]}"
            for chunk, keys in record["replayed"].items():
                assert keys == record["planned"][chunk], case  # the backend does what the plan says
                if int(chunk) == 1 and "optimal" not in case:  # cut inside the layers: cos/sin replayed where the
                    # base model computes them. The mask is replayed or sent as the plan says (checked above): where
                    # the release builds it by slice assignment (Qwen2/Qwen3 4.51, Qwen2/Mistral 4.46:
                    # stateless.setitem) it is sent.
                    rotary = model_level_rotary(case.split("@")[0], release)
                    assert any(key.startswith("model.rotary_emb:") for key in keys) == rotary, (case, keys)
            for name, chunks in record["tied"].items():
                held[name] = sorted(held.get(name, []) + chunks)
        # tied: one copy of the embedding on the first and one on the last stage, kept equal
        assert held == ({"shared_embed_weight": [0, ranks - 1]} if "/tied:" in case else {}), case


def test_the_rotation_keeps_every_family_on_two_and_three_ranks_tied_and_untied() -> None:
    """What `cases` and `launches` promise, on the committed packages: in two consecutive runs every (family,
    release) pipelined on 2 and 3 ranks, tied and untied; every family under GPipe and 1F1B at some release and under all four cuts at the newest; each
    launch holds both of its rank count's cuts."""
    newest = max(COMMITTED, key=Release.parse)
    both = {**launches(run_index()), **launches(run_index() + 1)}  # two consecutive runs
    this_run = launches(run_index())  # every release launched in every run: twice at the newest, once elsewhere
    assert all(len([r for rel, r in this_run if rel == release]) == (2 if release == newest else 1)
               for release in COMMITTED)
    for (release, ranks), listed in both.items():
        assert {case.split("/", 1)[1] for case in listed} == set(CUTS[ranks]), (release, ranks)
    for release, families in COMMITTED.items():
        for family in families:
            cuts = [case.split("/", 1)[1] for ranks in CUTS for case in both[release, ranks]
                    if case.startswith(f"{family}@")]
            assert {cut.split(":")[2] for cut in cuts} == {"2", "3"}, (family, release)
            assert {cut.split(":")[0] for cut in cuts} == {"tied", "untied"}, (family, release)
            if release == newest:
                assert sorted(cuts) == sorted(cut for pair in CUTS.values() for cut in pair)
    for family in {family for families in COMMITTED.values() for family in families}:
        schedules = {case.split(":")[1] for listed in both.values() for case in listed
                     if case.startswith(f"{family}@") and not case.startswith(f"{family}@{newest}/")}
        assert schedules == {"gpipe", "1f1b"}, family
