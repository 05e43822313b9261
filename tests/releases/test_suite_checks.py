"""The suite's per-release rotation (support/release_process.py): everything at the newest release; at the others
one family, and the exports at half of them, rotating along the releases and from one CI run to the next, so that
every release and every family is checked in every run and each pair within a few runs."""

from __future__ import annotations

from support.release_process import EXPORT_MODES, picks, suite_checks, suite_families

CHECKS = ("eval", "train", "fx", *EXPORT_MODES)
RELEASES = ["4.57.6", "4.10.3", "5.23.0", "4.5.1", "4.40.2", "4.46.3"]  # any order: sorted as versions, not strings
OLDER = ["4.5.1", "4.10.3", "4.40.2", "4.46.3", "4.57.6"]


def test_the_newest_runs_every_check_and_the_others_export_in_turn() -> None:
    for run in range(4):
        ran = {release: suite_checks(CHECKS, release, RELEASES, run) for release in RELEASES}
        assert ran["5.23.0"] == CHECKS
        exporting = [release for release in OLDER if set(ran[release]) & set(EXPORT_MODES)]
        assert len(exporting) in (2, 3) and all(len(set(ran[r]) & set(EXPORT_MODES)) == 1 for r in exporting)
        assert all(ran[release][:3] == CHECKS[:3] for release in OLDER)  # eval, train, fx: every release, every run
    modes = {(release, mode) for run in range(4) for release in OLDER
             for mode in suite_checks(CHECKS, release, RELEASES, run) if mode in EXPORT_MODES}
    assert modes == {(release, mode) for release in OLDER for mode in EXPORT_MODES}  # each pair within four runs
    assert suite_checks(("eval",), "4.5.1", RELEASES, 0) == ("eval",)


def test_one_family_at_each_older_release_each_in_turn() -> None:
    families = ["gpt2", "bert", "roberta", "bart"]
    for run in range(4):
        assert suite_families(families, "5.23.0", RELEASES, run) == families
        assert suite_families(families, "4.40.2", RELEASES, run, every=("4.40.2",)) == families
        taken = [suite_families(families, release, RELEASES, run) for release in OLDER]
        assert all(len(chosen) == 1 for chosen in taken)
        assert len({chosen[0] for chosen in taken}) == len(families)  # consecutive releases take different ones
    for release in OLDER:  # every family at every release within as many runs as there are families
        assert {suite_families(families, release, RELEASES, run)[0] for run in range(4)} == set(families)


def test_stateless_configs_and_non_strict_classes_rotate_and_the_newest_takes_all() -> None:
    assert picks("5.23.0", RELEASES, 3) == {}
    assert [picks(r, RELEASES, 0)["stateless"] for r in OLDER] == [0, 1, 2, 3, 4]
    assert [picks(r, RELEASES, 1)["stateless"] for r in OLDER] == [1, 2, 3, 4, 5]
    assert {picks("4.10.3", RELEASES, run)["export-non-strict"] for run in range(5)} == {0, 1, 2, 3, 4}
