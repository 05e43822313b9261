from __future__ import annotations

import pytest

from common.versions import Release, VersionError, VersionRange


@pytest.mark.parametrize(("low", "high"), [
    ("4.5.1", "4.10.0"), ("4.9", "4.10"), ("5.0.0.dev1", "5.0.0a1"), ("5.0.0a1", "5.0.0b1"),
    ("5.0.0b2", "5.0.0rc1"), ("5.0.0rc1", "5.0.0"), ("5.0.0", "5.0.0.post1"), ("5.0.0rc1.dev1", "5.0.0rc1"),
])
def test_release_order(low: str, high: str) -> None:
    assert Release.parse(low) < Release.parse(high)


def test_trailing_zeros_do_not_matter() -> None:
    assert Release.parse("4.20") == Release.parse("4.20.0")


@pytest.mark.parametrize(("spec", "inside", "outside"), [
    (">=4.20,<4.46", ["4.20", "4.20.1", "4.45.2"], ["4.19.9", "4.46", "4.46.0rc1", "5.0"]),
    ("==4.5.*", ["4.5", "4.5.1"], ["4.50", "4.6.0", "4"]),
    ("!=4.5.*", ["4.6"], ["4.5.1"]),
    (">4.5.1", ["4.5.2", "4.6"], ["4.5.1", "4.5.0"]),
    ("<=4.30", ["4.30.0", "4.29"], ["4.30.1"]),
    ("<5.0.0rc2", ["5.0.0rc1"], ["5.0.0"]),
    ("== 4.5.1", ["4.5.1"], ["4.5.2"]),
])
def test_ranges(spec: str, inside: list[str], outside: list[str]) -> None:
    versions = VersionRange.parse(spec)
    assert all(v in versions for v in inside)
    assert not any(v in versions for v in outside)


@pytest.mark.parametrize("spec", ["4.20", ">=", ">=4.x", "~=4.20", ">4.*", ">=4.20;<5", ""])
def test_bad_ranges(spec: str) -> None:
    with pytest.raises(VersionError):
        VersionRange.parse(spec)


def test_bad_release() -> None:
    with pytest.raises(VersionError):
        Release.parse("four")


@pytest.mark.parametrize("text", ["04.5.1", " 4.5.1", "4.5.1\n", "4" * 65, "4.5.1.0.0", "4.5.x", "4.5.1rc01", ""])
def test_only_the_registry_spelling_is_a_release(text: str) -> None:
    with pytest.raises(VersionError):
        Release.parse(text)
