"""The suite's per-release checks: every release exported, the two modes alternating, both at the newest."""

from __future__ import annotations

from support.release_process import EXPORT_MODES, picks, suite_checks

CHECKS = ("eval", "train", "fx", *EXPORT_MODES)


def test_export_modes_alternate_along_the_releases_and_the_newest_runs_both() -> None:
    releases = ["4.57.6", "4.10.3", "5.23.0", "4.5.1", "4.40.2"]  # any order: sorted as versions, not strings
    ran = {release: suite_checks(CHECKS, release, releases) for release in releases}
    assert ran["5.23.0"] == CHECKS
    assert ran["4.5.1"] == ran["4.40.2"] == ("eval", "train", "fx", "export-strict")
    assert ran["4.10.3"] == ran["4.57.6"] == ("eval", "train", "fx", "export-non-strict")
    assert suite_checks(("eval",), "4.5.1", releases) == ("eval",)


def test_stateless_configs_and_non_strict_classes_rotate_along_the_releases_and_the_newest_takes_all() -> None:
    releases = ["4.57.6", "4.10.3", "5.23.0", "4.5.1", "4.40.2"]
    taken = {release: picks(release, releases) for release in releases}
    assert taken["5.23.0"] == {}
    assert [taken[r]["stateless"] for r in ("4.5.1", "4.10.3", "4.40.2", "4.57.6")] == [0, 1, 2, 3]
    # the releases that export non-strict (every other one) take consecutive classes: all of a family's five
    eleven = [f"4.{minor}.0" for minor in range(10)] + ["5.0.0"]
    non_strict = [r for r in eleven[:-1] if "export-non-strict" in suite_checks(CHECKS, r, eleven)]
    assert [picks(r, eleven)["export-non-strict"] for r in non_strict] == [0, 1, 2, 3, 4]
