"""Every repository path README.md and docs/*.md name exists, so the docs cannot point at a file that is gone.

What counts as a repository path (the rule, strict where it can be and silent where it cannot know):
- a relative markdown link's target (``[text](page.md#anchor)``), resolved from the page's folder, the anchor
  dropped; links with a scheme (``https:``) and bare anchors are not paths;
- a word of inline code or of a fenced block whose first component is a top-level entry of the repository
  (``scripts/setup.sh``, ``tests/...``, ``partitioning/train/rank.py``); a word stops at whitespace, quotes and
  brackets, and loses trailing punctuation. Other words are not the repository's: user paths (``plan.json``,
  ``my-t5/``, ``out/``), transformers' files (``utils/generic.py``), names relative to a folder the sentence
  gives (``cli.py``), another repository's path written after its name (``tanganke/fusion_bench:
  `tests/test_depth_upscaling.py```).

A word with a placeholder (``<family>``, ``...``) names a pattern, not a path, and is not checked. ``*`` must
match a path, ``{a,b}`` must exist for each alternative, and ``module.name`` (an attribute, as in
``tests/support/release_process.suite_checks``) needs ``module.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_WORD = re.compile(r"[^\s'\"()\[\]=;]+")
_FILE = re.compile(r"\.(py|md|toml|txt|sh|json|cfg|png)$")  # a file name, never a module's attribute
_PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.")
_OTHER_REPOSITORY = re.compile(r"\b[\w.-]+/[\w.-]+: `$")  # "owner/name: `path`": that repository's path


def pages(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def _alternatives(word: str) -> list[str]:
    """``a/{b,c}.py`` as ``a/b.py`` and ``a/c.py``."""
    found = re.search(r"\{([^{}]*)\}", word)
    if found is None:
        return [word]
    return [spelled for choice in found.group(1).split(",")
            for spelled in _alternatives(word[:found.start()] + choice + word[found.end():])]


def _exists(repo: Path, path: str) -> bool:
    if "*" in path:
        return any(repo.glob(path.rstrip("/")))
    if (repo / path).exists():
        return True
    parent, _, name = path.rpartition("/")
    module, dot, _ = name.partition(".")
    return bool(dot) and not _FILE.search(name) and (repo / parent / f"{module}.py").is_file()  # module.attribute


def stale(page: Path, repo: Path) -> list[str]:
    """The repository paths ``page`` names that do not exist, each as ``page:line: path``, in line order."""
    text = page.read_text(encoding="utf-8")
    tops = {entry.name for entry in repo.iterdir() if not entry.name.startswith(".")}
    missing: list[tuple[int, str]] = []
    for match in _LINK.finditer(text):
        target = match.group(1).split("#", 1)[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target) and not (page.parent / target).exists():
            missing.append((text.count("\n", 0, match.start()) + 1, target))
    spans = [(m.start(), m.group(0)) for m in _FENCE.finditer(text)]
    unfenced = _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # same offsets, no fenced spans
    spans += [(m.start(1), m.group(1)) for m in _INLINE.finditer(unfenced)
              if not _OTHER_REPOSITORY.search(unfenced, 0, m.start(1))]
    for start, span in spans:
        for word in _WORD.finditer(span):
            path = word.group(0).rstrip(".:,")
            if path.split("/", 1)[0] not in tops or "/" not in path or _PLACEHOLDER.search(path):
                continue
            if not all(_exists(repo, spelled) for spelled in _alternatives(path)):
                missing.append((text.count("\n", 0, start + word.start()) + 1, path))
    return [f"{page.relative_to(repo).as_posix()}:{line}: {path}" for line, path in sorted(missing)]


@pytest.mark.parametrize("page", pages(REPO), ids=lambda page: page.name)
def test_every_path_a_page_names_exists(page: Path) -> None:
    assert stale(page, REPO) == []


def test_a_broken_link_or_path_is_found_and_patterns_and_user_paths_are_not(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup.sh").write_text("")
    (tmp_path / "tests" / "support").mkdir(parents=True)
    (tmp_path / "tests" / "support" / "release_process.py").write_text("")
    (tmp_path / "README.md").write_text("[setup](docs/setup.md), [gone](docs/gone.md#why)\n")
    (tmp_path / "docs" / "setup.md").write_text(
        "Run `bash scripts/setup.sh`, then [home](../README.md#top) and [web](https://example.org/x.md).\n"
        "Patterns: `generated_models/<family>/v<X>/`, `tests/...`; user paths: `plan.json`, `my-t5/`, `out/`;\n"
        "an attribute: `tests/support/release_process.suite_checks`; `scripts/{setup.sh,install.py}`;\n"
        "another repository's: pytorch/torchtune: `tests/torchtune/models/llama3_2/_model_builders.py`.\n"
        "```bash\nbash scripts/setup.sh && python scripts/missing.py --out out/\n```\n"
        "`scripts/*.sh`, `scripts/*.py` and `tests/support/release_process.nothing.py`\n")
    assert stale(tmp_path / "README.md", tmp_path) == ["README.md:1: docs/gone.md"]
    assert stale(tmp_path / "docs" / "setup.md", tmp_path) == [
        "docs/setup.md:3: scripts/{setup.sh,install.py}", "docs/setup.md:6: scripts/missing.py",
        "docs/setup.md:8: scripts/*.py", "docs/setup.md:8: tests/support/release_process.nothing.py"]
