"""Stage-out: whatever the job left is copied back with the user's rights, and what could
not be is reported, never silently lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.staging import MakeDataset, digest
from wrapper.staging import (
    Progress,
    StageSettings,
    UserIds,
    parse_stage_out,
    prepare_scratch,
    remove_scratch,
    stage_out,
)


@pytest.fixture
def scratch(area: Path, user: UserIds, make_dataset: MakeDataset) -> Path:
    """The scratch of a job that failed half-way: some results, and a partial checkpoint."""
    path = prepare_scratch(area / "scratch", "700", user)
    make_dataset(path / "results", big=1 << 20)
    (path / "ckpt-partial.pt").write_bytes(os.urandom(4096))
    for item in [path / "results", *path.rglob("*")]:
        os.chown(item, user.uid, user.gid, follow_symlinks=False)
    return path


@pytest.fixture
def shared(area: Path, user: UserIds) -> Path:
    """The user's folder on shared storage."""
    folder = area / "home" / "jwtest"
    folder.mkdir(parents=True)
    os.chown(folder, user.uid, user.gid)
    return folder


def test_a_failed_jobs_outputs_are_still_staged_out(scratch: Path, shared: Path,
                                                    user: UserIds) -> None:
    specs = [parse_stage_out(f"results:{shared}/run1/results"),
             parse_stage_out(f"model-final.pt:{shared}/run1/model.pt"),  # never written
             parse_stage_out(f"ckpt-partial.pt:{shared}/run1/ckpt.pt")]
    updates: list[Progress] = []
    report = stage_out(specs, scratch=scratch, user=user, progress=updates.append,
                       settings=StageSettings(progress_interval=0))
    results, model, ckpt = report.items
    assert digest(shared / "run1" / "results") == digest(scratch / "results")
    assert (shared / "run1" / "ckpt.pt").read_bytes() == \
        (scratch / "ckpt-partial.pt").read_bytes()
    assert results.ok and results.files == 6 and ckpt.ok
    assert model.missing and not model.ok and not (shared / "run1" / "model.pt").exists()
    assert not report.ok and report.missing == [specs[1].directive]
    for path in (shared / "run1").rglob("*"):  # written as the user, not as root
        assert path.lstat().st_uid == user.uid, path
    assert any(u.done for u in updates)


def test_no_way_into_someone_elses_folder(scratch: Path, area: Path, user: UserIds) -> None:
    theirs = area / "home" / "other"
    theirs.mkdir(parents=True)  # root's, 0755: the user may read it, not write it
    report = stage_out([parse_stage_out(f"results:{theirs}/stolen"),
                        parse_stage_out(f"ckpt-partial.pt:{theirs}/sub/x")],
                       scratch=scratch, user=user)
    assert os.listdir(theirs) == []
    first, second = report.items
    assert first.files == 0
    assert first.problems == (f"{first.directive}: cannot make the folder 'stolen': "
                              "permission denied for the job's user",)
    assert second.problems == (f"{second.directive}: cannot write into "
                               f"'{theirs}/sub' as the job's user (Permission denied); "
                               "choose a DEST the user may write",)


def test_one_bad_file_does_not_stop_the_others(scratch: Path, shared: Path,
                                               user: UserIds) -> None:
    (scratch / "results" / "sub" / "one-byte").chmod(0o000)  # the user's own, unreadable
    report = stage_out([parse_stage_out(f"results:{shared}/r")], scratch=scratch, user=user)
    [item] = report.items
    assert item.files == 5
    assert len(item.problems) == 1 and "sub/one-byte" in item.problems[0]
    assert (shared / "r" / "sub" / "big.bin").exists()


def test_existing_results_are_replaced_whole_and_folders_merged(scratch: Path, shared: Path,
                                                                user: UserIds) -> None:
    (shared / "r" / "sub").mkdir(parents=True)
    (shared / "r" / "sub" / "big.bin").write_text("an older attempt's")
    (shared / "r" / "keep-me").write_text("from before")
    for path in [shared / "r", *(shared / "r").rglob("*")]:
        os.chown(path, user.uid, user.gid)
    report = stage_out([parse_stage_out(f"results:{shared}/r")], scratch=scratch, user=user)
    assert report.ok
    assert (shared / "r" / "sub" / "big.bin").read_bytes() == \
        (scratch / "results" / "sub" / "big.bin").read_bytes()
    assert (shared / "r" / "keep-me").read_text() == "from before"
    leftovers = [p.name for p in (shared / "r").rglob("*") if ".jobwrap-" in p.name]
    assert leftovers == []


def test_relative_dest_goes_to_the_work_dir(scratch: Path, shared: Path,
                                            user: UserIds) -> None:
    report = stage_out([parse_stage_out("ckpt-partial.pt:out/ckpt.pt")], scratch=scratch,
                       user=user, work_dir=str(shared))
    assert report.ok and (shared / "out" / "ckpt.pt").exists()
    assert report.items[0].dest == f"{shared}/out/ckpt.pt"


def test_after_scratch_is_gone_everything_is_missing(scratch: Path, shared: Path,
                                                     user: UserIds) -> None:
    remove_scratch(scratch)
    report = stage_out([parse_stage_out(f"results:{shared}/r")], scratch=scratch, user=user)
    assert report.missing == [f"--stage-out=results:{shared}/r"]
    assert os.listdir(shared) == []


def test_a_symlink_left_in_scratch_is_copied_as_a_link(scratch: Path, shared: Path,
                                                       user: UserIds) -> None:
    os.symlink("/etc/shadow", scratch / "results" / "grab")
    os.lchown(scratch / "results" / "grab", user.uid, user.gid)
    report = stage_out([parse_stage_out(f"results:{shared}/r")], scratch=scratch, user=user)
    assert report.ok
    assert os.readlink(shared / "r" / "grab") == "/etc/shadow"  # a link, not the content
