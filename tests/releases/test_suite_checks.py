"""The suite's per-release checks: every release exported, the two modes alternating, both at the newest."""

from __future__ import annotations

from support.release_process import EXPORT_MODES, suite_checks

CHECKS = ("eval", "train", "fx", *EXPORT_MODES)


def test_export_modes_alternate_along_the_releases_and_the_newest_runs_both() -> None:
    releases = ["4.57.6", "4.10.3", "5.23.0", "4.5.1", "4.40.2"]  # any order: sorted as versions, not strings
    ran = {release: suite_checks(CHECKS, release, releases) for release in releases}
    assert ran["5.23.0"] == CHECKS
    assert ran["4.5.1"] == ran["4.40.2"] == ("eval", "train", "fx", "export-strict")
    assert ran["4.10.3"] == ran["4.57.6"] == ("eval", "train", "fx", "export-non-strict")
    assert suite_checks(("eval",), "4.5.1", releases) == ("eval",)
