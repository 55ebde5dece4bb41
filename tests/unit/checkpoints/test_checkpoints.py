"""Checkpoint discovery on real files: every layout complete, partial and corrupt."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.checkpoints import NOW, OLD, find, name_of, reasons, zip_bytes
from wrapper.checkpoints import Checkpoint, Discovery, Skipped, latest_valid
from wrapper.checkpoints.layout import Layout, registered
from wrapper.checkpoints.listing import temp_key
from wrapper.checkpoints.ziptail import zip_problem
from wrapper.errors import JobwrapError, UserInputError

REPO = Path(__file__).resolve().parents[3]


def safetensors_bytes(tensors: int = 2, size: int = 16) -> bytes:
    """A safetensors file: an 8-byte header length, a JSON header, then the data it maps."""
    header = {f"t{i}": {"dtype": "F32", "shape": [size // 4],
                        "data_offsets": [i * size, (i + 1) * size]} for i in range(tensors)}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(tensors * size)


EMPTY_ZIP = b"PK\x05\x06" + bytes(18)  # what zipfile writes for an archive with no members


def zip64_bytes(payload: bytes = b"weights" * 50) -> bytes:
    """What PyTorch writes (miniz, MZ_ZIP_FLAG_WRITE_ZIP64): ZIP64 end records before the EOCD."""
    plain = zip_bytes(payload)
    eocd_at = plain.rindex(b"PK\x05\x06")
    _sig, _d, _cd, _n1, entries, cd_size, cd_offset, _c = struct.unpack_from("<4s4H2LH", plain,
                                                                            eocd_at)
    body = plain[:eocd_at]
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries,
                         cd_size, cd_offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(body), 1)
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, cd_size, cd_offset, 0)
    return body + record + locator + eocd


def settle(path: Path, mtime: float = OLD) -> None:
    os.utime(path, (mtime, mtime), follow_symlinks=False)


def put(path: Path, data: bytes, mtime: float = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    settle(path, mtime)
    return path


def put_dir(path: Path, files: dict[str, bytes], mtime: float = OLD) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        put(path / name, data, mtime)
    settle(path, mtime)
    return path


# -- zip tails ---------------------------------------------------------------------------
def _problem(data: bytes) -> str | None:
    with tempfile.TemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        return zip_problem(handle.fileno(), len(data))


def test_complete_zips_pass_the_tail_check() -> None:
    assert _problem(zip_bytes()) is None
    assert _problem(zip_bytes(comment=b"a comment PK\x05\x06 that looks like an end")) is None
    assert _problem(zip64_bytes()) is None
    with zipfile.ZipFile(io.BytesIO(zip64_bytes())) as archive:  # a real ZIP64 archive
        assert archive.namelist() == ["archive/data.pkl", "archive/data/1"]


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "empty file"),
    (b"PK\x03\x04short", "truncated: 9 bytes is too short for a zip archive"),
    (zip_bytes()[:-1], "truncated: no zip end-of-central-directory record"),
    (zip_bytes()[:300], "truncated: no zip end-of-central-directory record"),
    (b"\x80\x02\x8a\x0alegacy pickle" * 10, "not a zip archive"),
    (EMPTY_ZIP, "a zip archive with no entries"),
])
def test_broken_zips_are_named(data: bytes, reason: str) -> None:
    problem = _problem(data)
    assert problem is not None and problem.startswith(reason)


def test_end_record_pointing_past_its_own_offset_is_rejected() -> None:
    data = bytearray(zip_bytes())
    eocd_at = data.rindex(b"PK\x05\x06")
    struct.pack_into("<L", data, eocd_at + 16, eocd_at)  # the central directory "starts" at it
    problem = _problem(bytes(data))
    assert problem is not None and problem.startswith("truncated: central directory")


def test_end_record_pointing_at_no_central_directory_is_rejected() -> None:
    data = bytearray(zip_bytes())
    eocd_at = data.rindex(b"PK\x05\x06")
    struct.pack_into("<L", data, eocd_at + 16, 0)  # offset 0: a local header, not a central one
    problem = _problem(bytes(data))
    assert problem is not None and problem.startswith("corrupt: no central directory")


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=3000), comment=st.binary(max_size=300),
       members=st.integers(1, 4), data=st.data())
def test_any_cut_of_a_valid_zip_is_rejected(payload: bytes, comment: bytes, members: int,
                                            data: st.DataObject) -> None:
    whole = zip_bytes(payload, comment, members)
    assert _problem(whole) is None
    cut = data.draw(st.integers(0, len(whole) - 1), label="cut")
    assert _problem(whole[:cut]) is not None


@settings(max_examples=50, deadline=None)
@given(payload=st.binary(max_size=2000), data=st.data())
def test_any_cut_of_a_zip64_archive_is_rejected(payload: bytes, data: st.DataObject) -> None:
    whole = zip64_bytes(payload)
    assert _problem(whole) is None
    assert _problem(whole[:data.draw(st.integers(0, len(whole) - 1), label="cut")]) is not None


# -- PyTorch Lightning --------------------------------------------------------------------
def test_lightning_highest_step_wins(tmp_path: Path) -> None:
    for step in (900, 1000, 200):  # 1000 > 900 numerically, not as text
        put(tmp_path / f"epoch=0-step={step}.ckpt", zip_bytes())
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "epoch=0-step=1000.ckpt"), "lightning",
                                      1000, OLD)
    assert found.skipped == [] and found.layout == "lightning"


def test_lightning_truncated_newest_falls_back_to_the_previous(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=100.ckpt", zip_bytes())
    put(tmp_path / "epoch=1-step=200.ckpt", zip_bytes()[:150])
    put(tmp_path / "epoch=0-step=50.ckpt", zip_bytes()[:10])  # older: never looked at
    found = find(tmp_path)
    assert name_of(found) == "epoch=0-step=100.ckpt"
    assert found.latest is not None and found.latest.step == 100
    assert reasons(found) == {
        "epoch=1-step=200.ckpt": "truncated: no zip end-of-central-directory record"}


def test_lightning_last_ckpt_saved_after_the_steps_wins(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=100.ckpt", zip_bytes(), OLD)
    put(tmp_path / "last.ckpt", zip_bytes(), OLD + 60)
    found = find(tmp_path)
    assert name_of(found) == "last.ckpt"
    assert found.latest is not None and found.latest.step is None


def test_lightning_stale_last_ckpt_loses_to_a_newer_step(tmp_path: Path) -> None:
    put(tmp_path / "last.ckpt", zip_bytes(), OLD)
    put(tmp_path / "epoch=3-step=400.ckpt", zip_bytes(), OLD + 60)
    assert name_of(find(tmp_path)) == "epoch=3-step=400.ckpt"


def test_lightning_newest_last_version_and_hpc_counter(tmp_path: Path) -> None:
    put(tmp_path / "last.ckpt", zip_bytes(), OLD)
    put(tmp_path / "last-v1.ckpt", zip_bytes(), OLD + 5)
    assert name_of(find(tmp_path)) == "last-v1.ckpt"
    other = tmp_path / "hpc"
    put(other / "hpc_ckpt_2.ckpt", zip_bytes(), OLD)
    put(other / "hpc_ckpt_10.ckpt", zip_bytes(), OLD)  # same mtime: the counter decides
    assert name_of(find(other)) == "hpc_ckpt_10.ckpt"


def test_lightning_same_step_twice_prefers_the_newer_file(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=100.ckpt", zip_bytes(), OLD)
    put(tmp_path / "epoch=0-step=100-v1.ckpt", zip_bytes(), OLD + 1)
    assert name_of(find(tmp_path)) == "epoch=0-step=100-v1.ckpt"


def test_lightning_directory_checkpoints_need_their_completion_file(tmp_path: Path) -> None:
    # DeepSpeed strategy: last.ckpt/ holds 'latest' naming a tag directory.
    model_states = {"mp_rank_00_model_states.pt": zip_bytes()}
    put_dir(tmp_path / "epoch=0-step=10.ckpt" / "checkpoint", model_states)
    put(tmp_path / "epoch=0-step=10.ckpt" / "latest", b"checkpoint\n")
    settle(tmp_path / "epoch=0-step=10.ckpt")
    put_dir(tmp_path / "epoch=0-step=20.ckpt" / "checkpoint", model_states)
    settle(tmp_path / "epoch=0-step=20.ckpt")
    found = find(tmp_path)
    assert name_of(found) == "epoch=0-step=10.ckpt"
    assert "without DeepSpeed's 'latest'" in reasons(found)["epoch=0-step=20.ckpt"]
    # Sharded FSDP: a torch.distributed.checkpoint directory under the Lightning name.
    put_dir(tmp_path / "epoch=0-step=30.ckpt", {"__0_0.distcp": b"shard", ".metadata": b"m"})
    assert name_of(find(tmp_path)) == "epoch=0-step=30.ckpt"


def test_lightning_symlink_inside_the_directory_is_followed(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=100.ckpt", zip_bytes())
    os.symlink("epoch=0-step=100.ckpt", tmp_path / "last.ckpt")  # save_last="link"
    settle(tmp_path / "last.ckpt", OLD + 10)
    found = find(tmp_path)
    assert found.latest is not None and found.latest.path in {
        str(tmp_path / "last.ckpt"), str(tmp_path / "epoch=0-step=100.ckpt")}
    assert found.skipped == []


# -- Hugging Face Trainer -----------------------------------------------------------------
def hf_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    files = {"model.safetensors": safetensors_bytes(), "optimizer.pt": zip_bytes()}
    if complete:
        files["trainer_state.json"] = b'{"global_step": %d}' % step
    return put_dir(root / f"checkpoint-{step}", files)


def test_hf_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 500)
    hf_checkpoint(tmp_path, 9)
    hf_checkpoint(tmp_path, 1000, complete=False)
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "checkpoint-500"), "hf", 500, OLD)
    assert reasons(found) == {
        "checkpoint-1000": "missing trainer_state.json (the Trainer writes it last)"}


def test_hf_staging_directory_is_a_temporary_name(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 500)
    put_dir(tmp_path / "tmp-checkpoint-1000", {"trainer_state.json": b"{}"})
    found = find(tmp_path)
    assert name_of(found) == "checkpoint-500"
    assert reasons(found) == {"tmp-checkpoint-1000": "temporary name"}


def test_hf_final_model_beside_checkpoints_is_not_a_checkpoint(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 500)
    put(tmp_path / "pytorch_model.bin", zip_bytes(), OLD + 600)
    put(tmp_path / "training_args.bin", zip_bytes(), OLD + 600)
    found = find(tmp_path)
    assert name_of(found) == "checkpoint-500" and found.layout == "hf"


def test_hf_checkpoint_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 5)
    put(tmp_path / "checkpoint-6", b"not a directory")
    found = find(tmp_path)
    assert name_of(found) == "checkpoint-5"
    assert reasons(found) == {"checkpoint-6": "not a directory"}


# -- DeepSpeed ----------------------------------------------------------------------------
def deepspeed_tag(root: Path, step: int) -> Path:
    return put_dir(root / f"global_step{step}", {"mp_rank_00_model_states.pt": zip_bytes()})


def test_deepspeed_tag_named_by_latest_wins_over_a_newer_partial_one(tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 10)
    deepspeed_tag(tmp_path, 20)
    deepspeed_tag(tmp_path, 30)
    put(tmp_path / "latest", b"global_step20\n")
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "global_step20"), "deepspeed", 20, OLD)
    assert reasons(found) == {
        "global_step30": "partial: newer than global_step20, which latest names"}


def test_deepspeed_latest_naming_a_missing_tag(tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 10)
    put(tmp_path / "latest", b"global_step40")
    found = find(tmp_path)
    # global_step10 was complete when 'latest' moved past it.
    assert name_of(found) == "global_step10"
    assert reasons(found) == {"global_step40": "latest names global_step40, which does not exist"}


def test_deepspeed_latest_naming_a_missing_custom_tag_finds_nothing(tmp_path: Path) -> None:
    put(tmp_path / "latest", b"my-tag")
    found = find(tmp_path)
    assert found.latest is None and found.layout == "deepspeed"
    assert reasons(found) == {"my-tag": "latest names my-tag, which does not exist"}


def test_deepspeed_tags_without_latest_are_partial(tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 10)
    found = find(tmp_path)
    assert found.latest is None
    assert reasons(found)["global_step10"].startswith("no 'latest' file names it")


@pytest.mark.parametrize("pointer", [b"../../etc", b"", b"global_step/../x"])
def test_deepspeed_latest_that_names_no_tag_is_rejected(tmp_path: Path, pointer: bytes) -> None:
    deepspeed_tag(tmp_path, 10)
    put(tmp_path / "latest", pointer)
    found = find(tmp_path)
    assert found.latest is None
    assert set(reasons(found)) == {"latest", "global_step10"}


def test_deepspeed_fresh_pointer_falls_back_to_the_previous_tag(tmp_path: Path) -> None:
    deepspeed_tag(tmp_path, 10)
    deepspeed_tag(tmp_path, 20)
    put(tmp_path / "latest", b"global_step20", NOW - 3)
    found = find(tmp_path)
    assert name_of(found) == "global_step10"
    assert reasons(found) == {
        "global_step20": "still being written: modified 3 s ago (< settle 10 s)"}


def test_deepspeed_empty_tag_directory_is_rejected(tmp_path: Path) -> None:
    put_dir(tmp_path / "global_step5", {})
    put(tmp_path / "latest", b"global_step5")
    assert reasons(find(tmp_path)) == {"global_step5": "no mp_rank_*_model_states.pt in it"}


# -- Megatron-LM --------------------------------------------------------------------------
def megatron_iter(root: Path, iteration: int) -> Path:
    return put_dir(root / f"iter_{iteration:07d}" / "mp_rank_00",
                   {"model_optim_rng.pt": zip_bytes()}).parent


def test_megatron_tracker_names_the_iteration_and_newer_ones_are_partial(tmp_path: Path) -> None:
    for iteration in (100, 200, 300):
        settle(megatron_iter(tmp_path, iteration))
    put(tmp_path / "latest_checkpointed_iteration.txt", b"200")
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "iter_0000200"), "megatron", 200, OLD)
    assert reasons(found) == {"iter_0000300": "partial: newer than iter_0000200, which "
                                              "latest_checkpointed_iteration.txt names"}


def test_megatron_release(tmp_path: Path) -> None:
    put_dir(tmp_path / "release" / "mp_rank_00", {"model_optim_rng.pt": zip_bytes()})
    settle(tmp_path / "release")
    put(tmp_path / "latest_checkpointed_iteration.txt", b"release\n")
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "release"), "megatron", None, OLD)


def test_megatron_iterations_without_the_tracker_are_partial(tmp_path: Path) -> None:
    settle(megatron_iter(tmp_path, 100))
    found = find(tmp_path)
    assert found.latest is None and found.layout == "megatron"
    assert reasons(found)["iter_0000100"].startswith(
        "partial: no latest_checkpointed_iteration.txt names it")


def test_megatron_tracker_with_garbage(tmp_path: Path) -> None:
    settle(megatron_iter(tmp_path, 100))
    put(tmp_path / "latest_checkpointed_iteration.txt", b"twelve")
    found = find(tmp_path)
    assert found.latest is None
    assert "neither an iteration nor 'release'" in reasons(found)[
        "latest_checkpointed_iteration.txt"]


# -- torch.distributed.checkpoint ---------------------------------------------------------
def test_dcp_directory_needs_its_metadata(tmp_path: Path) -> None:
    put_dir(tmp_path / "step_100", {"__0_0.distcp": b"shard", ".metadata": b"meta"})
    put_dir(tmp_path / "step_200", {"__0_0.distcp": b"shard"})
    put_dir(tmp_path / "tensorboard", {"events.out": b"x"}, NOW - 1)  # busy, not a checkpoint
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "step_100"), "dcp", 100, OLD)
    assert reasons(found) == {
        "step_200": "missing .metadata (torch.distributed.checkpoint writes it last)"}


# -- plain torch.save ---------------------------------------------------------------------
def test_torch_files_by_number_with_a_truncated_newest(tmp_path: Path) -> None:
    put(tmp_path / "model_100.pt", zip_bytes())
    put(tmp_path / "model_200.pt", zip_bytes()[:-30])
    put(tmp_path / "model_20.pth", zip_bytes())  # another prefix ... older by mtime
    settle(tmp_path / "model_20.pth", OLD - 100)
    found = find(tmp_path)
    assert found.latest == Checkpoint(str(tmp_path / "model_100.pt"), "torch", None, OLD)
    assert reasons(found) == {"model_200.pt": "truncated: no zip end-of-central-directory record"}


def test_torch_ignores_training_arguments(tmp_path: Path) -> None:
    put(tmp_path / "model_100.pt", zip_bytes(), OLD)
    put(tmp_path / "training_args.bin", zip_bytes(), OLD + 600)
    assert name_of(find(tmp_path)) == "model_100.pt"


def test_torch_step_is_reported_when_the_name_says_it(tmp_path: Path) -> None:
    put(tmp_path / "ckpt_step1500.pt", zip64_bytes())
    found = find(tmp_path)
    assert found.latest is not None and found.latest.step == 1500


def test_torch_legacy_and_odd_files_are_rejected(tmp_path: Path) -> None:
    put(tmp_path / "model_1.pt", zip_bytes(), OLD - 10)
    put(tmp_path / "model_2.pt", b"\x80\x02legacy pickle" * 5)
    put(tmp_path / "model_3.pt", b"")
    os.mkfifo(tmp_path / "model_4.pt")  # must be refused, not block discovery
    found = find(tmp_path)
    assert name_of(found) == "model_1.pt"
    got = reasons(found)
    assert got["model_2.pt"].startswith("not a zip archive")
    assert got["model_3.pt"] == "empty file"
    assert got["model_4.pt"] == "not a regular file"


# -- generic: glob + marker ---------------------------------------------------------------
def test_generic_directories_with_a_marker_inside(tmp_path: Path) -> None:
    put_dir(tmp_path / "snap_2", {"state.npz": b"x", "DONE": b""})
    put_dir(tmp_path / "snap_3", {"state.npz": b"x"})
    put_dir(tmp_path / "other_9", {"DONE": b""})
    found = find(tmp_path, glob="snap_*", marker="DONE")
    assert found.latest == Checkpoint(str(tmp_path / "snap_2"), "generic", None, OLD)
    assert reasons(found) == {"snap_3": "missing completion marker DONE inside it"}


def test_generic_files_with_a_marker_beside(tmp_path: Path) -> None:
    put(tmp_path / "state_1.npz", b"x")
    put(tmp_path / "state_1.npz.done", b"")
    put(tmp_path / "state_2.npz", b"x")
    found = find(tmp_path, glob="state_*", marker=".done")
    assert name_of(found) == "state_1.npz"
    assert reasons(found) == {"state_2.npz": "missing completion marker state_2.npz.done beside it"}


def test_generic_without_marker_still_checks_zips(tmp_path: Path) -> None:
    put(tmp_path / "w-1.data", zip_bytes())
    put(tmp_path / "w-2.data", zip_bytes()[:-3])
    put(tmp_path / "epoch=0-step=9.ckpt", zip_bytes())  # not the glob's: ignored
    found = find(tmp_path, glob="w-*.data")
    assert name_of(found) == "w-1.data" and found.layout == "generic"
    assert list(reasons(found)) == ["w-2.data"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"glob": "a/b*"}, "glob 'a/b\\*' must be one non-empty name pattern without '/'"),
    ({"glob": ""}, "glob '' must be one non-empty name pattern"),
    ({"marker": "DONE"}, "a checkpoint completion marker needs a glob"),
    ({"glob": "*", "marker": "x/y"}, "marker 'x/y' must be a file name without '/'"),
    ({"settle_seconds": -1.0}, "settle time -1.0: expected seconds >= 0"),
    ({"settle_seconds": float("nan")}, "settle time nan: expected seconds >= 0"),
])
def test_bad_arguments_raise_a_user_input_error(tmp_path: Path, kwargs: dict[str, object],
                                                message: str) -> None:
    """One line that names the value given and what it must be: the user's input, never
    a node fault (a UserInputError, not another JobwrapError)."""
    with pytest.raises(UserInputError, match=message) as caught:
        latest_valid(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert type(caught.value) is UserInputError and "\n" not in str(caught.value)


# -- rules shared by every layout ---------------------------------------------------------
@pytest.mark.parametrize("name", [
    "epoch=0-step=900.ckpt.tmp", "epoch=0-step=900.ckpt.partial",
    "epoch=0-step=900.ckpt.incomplete", "epoch=0-step=900.ckpt~", ".epoch=0-step=900.ckpt",
    "tmp_epoch=0-step=900.ckpt", "tmpepoch=0-step=900.ckpt",
])
def test_temporary_names_are_skipped_in_their_place(tmp_path: Path, name: str) -> None:
    put(tmp_path / "epoch=0-step=100.ckpt", zip_bytes())
    put(tmp_path / name, zip_bytes())
    put(tmp_path / ".epoch=0-step=50.ckpt.tmp", zip_bytes())  # older: not reported
    found = find(tmp_path)
    assert name_of(found) == "epoch=0-step=100.ckpt"
    assert found.skipped == [Skipped(str(tmp_path / name), "temporary name")]


def test_temporary_names_no_layout_knows_are_ignored(tmp_path: Path) -> None:
    put(tmp_path / "model_1.pt", zip_bytes())
    put(tmp_path / ".DS_Store", b"x", NOW)
    put_dir(tmp_path / "tmpabc123", {"x": b"y"}, NOW)
    found = find(tmp_path)
    assert name_of(found) == "model_1.pt" and found.skipped == []


@pytest.mark.parametrize(("name", "key"), [
    ("a.pt", None), ("a.pt.tmp", "a.pt"), (".a.pt.partial", "a.pt"), ("tmp-a.pt~", "a.pt"),
    ("tmp", ""), ("model.tmp.pt", None),
])
def test_temp_key(name: str, key: str | None) -> None:
    assert temp_key(name) == key


def test_recently_modified_checkpoint_is_still_being_written(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=100.ckpt", zip_bytes())
    put(tmp_path / "epoch=0-step=200.ckpt", zip_bytes(), NOW - 2)
    found = find(tmp_path)
    assert name_of(found) == "epoch=0-step=100.ckpt"
    assert found.skipped == [Skipped(str(tmp_path / "epoch=0-step=200.ckpt"),
                                     "still being written: modified 2 s ago (< settle 10 s)")]
    assert name_of(latest_valid(tmp_path, now=NOW, settle_seconds=1)) == "epoch=0-step=200.ckpt"


def test_recent_and_truncated_says_both(tmp_path: Path) -> None:
    put(tmp_path / "model_1.pt", zip_bytes()[:100], NOW - 0.5)
    [skipped] = find(tmp_path).skipped
    assert skipped.reason == ("still being written: modified 0.5 s ago (< settle 10 s); "
                              "truncated: no zip end-of-central-directory record")


def test_recent_hf_marker_counts_as_still_being_written(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 1)
    settle(hf_checkpoint(tmp_path, 2) / "trainer_state.json", NOW - 4)
    found = find(tmp_path)
    assert name_of(found) == "checkpoint-1"
    assert reasons(found)["checkpoint-2"].startswith("still being written: modified 4 s ago")


def test_symlink_out_of_the_directory_is_never_followed(tmp_path: Path) -> None:
    ckpts, outside = tmp_path / "ckpts", tmp_path / "outside"
    put(ckpts / "epoch=0-step=100.ckpt", zip_bytes())
    put(outside / "stolen.ckpt", zip_bytes())  # a valid zip: only the boundary rejects it
    os.symlink(outside / "stolen.ckpt", ckpts / "epoch=0-step=999.ckpt")
    os.symlink("../outside/stolen.ckpt", ckpts / "epoch=0-step=998.ckpt")
    os.symlink(outside, ckpts / "checkpoint-5")
    found = find(ckpts)
    assert name_of(found) == "epoch=0-step=100.ckpt"
    escaping = f"symlink pointing outside {ckpts}: not followed"
    assert reasons(found) == {"epoch=0-step=999.ckpt": escaping,
                              "epoch=0-step=998.ckpt": escaping, "checkpoint-5": escaping}


def test_symlink_chain_that_leaves_through_an_inner_link_is_refused(tmp_path: Path) -> None:
    ckpts, outside = tmp_path / "ckpts", tmp_path / "outside"
    put(ckpts / "model_1.pt", zip_bytes())
    put(outside / "x.pt", zip_bytes())
    os.symlink(outside, ckpts / "door")
    os.symlink("door/x.pt", ckpts / "model_2.pt")
    found = find(ckpts)
    assert name_of(found) == "model_1.pt"
    assert reasons(found)["model_2.pt"].startswith("symlink pointing outside")


@pytest.mark.parametrize(("make", "reason"), [
    (lambda p: None, "no such directory"),
    (lambda p: p.write_text("a file"), "not a directory"),
])
def test_missing_directory_is_an_answer_not_a_traceback(tmp_path: Path, make: object,
                                                        reason: str) -> None:
    target = tmp_path / "ckpts"
    make(target)  # type: ignore[operator]
    found = latest_valid(target)
    assert found == Discovery(None, [Skipped(str(target), reason)], None)


def test_empty_directory_finds_nothing(tmp_path: Path) -> None:
    assert latest_valid(tmp_path) == Discovery(None, [], None)


def test_relative_directory_gives_absolute_paths(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    put(tmp_path / "run" / "model_1.pt", zip_bytes())
    monkeypatch.chdir(tmp_path)
    found = latest_valid("run", now=NOW)
    assert found.latest is not None and found.latest.path == str(tmp_path / "run" / "model_1.pt")


def test_discovery_never_modifies_anything(tmp_path: Path) -> None:
    put(tmp_path / "epoch=0-step=1.ckpt", zip_bytes())
    put(tmp_path / "epoch=0-step=2.ckpt", zip_bytes()[:-9])
    put(tmp_path / "epoch=0-step=3.ckpt.tmp", zip_bytes())
    hf = hf_checkpoint(tmp_path / "hf", 7)

    def snapshot() -> dict[str, tuple[int, int, str]]:
        out = {}
        for path in sorted(tmp_path.rglob("*")):
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            out[str(path)] = (info.st_size, info.st_mtime_ns, digest)
        return out

    before = snapshot()
    assert find(tmp_path).latest is not None and find(hf.parent).latest is not None
    assert snapshot() == before


def test_layout_when_nothing_is_valid_is_the_newest_rejected_ones(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 3, complete=False)
    found = find(tmp_path)
    assert found.latest is None and found.layout == "hf"


def test_registry_holds_every_layout_once_and_each_meets_the_protocol() -> None:
    layouts = registered()
    assert [layout.name for layout in layouts] == [
        "accelerate", "deepspeed", "hf", "lightning", "megatron", "dcp", "torch"]
    assert all(isinstance(layout, Layout) for layout in layouts)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(0, 10**6), min_size=1, max_size=12, unique=True),
       data=st.data())
def test_latest_is_the_highest_valid_step_and_skipped_the_broken_above_it(
        steps: list[int], data: st.DataObject) -> None:
    broken = data.draw(st.sets(st.sampled_from(steps)), label="broken")
    with tempfile.TemporaryDirectory() as tmp:
        for step in steps:
            whole = zip_bytes()
            put(Path(tmp) / f"epoch=0-step={step}.ckpt",
                whole[:len(whole) // 2] if step in broken else whole)
        found = latest_valid(tmp, now=NOW)
        valid = [s for s in steps if s not in broken]
        best = max(valid, default=None)
        assert (found.latest.step if found.latest else None) == best
        above = sorted((s for s in broken if best is None or s > best), reverse=True)
        assert [Path(s.path).name for s in found.skipped] == [
            f"epoch=0-step={s}.ckpt" for s in above]


# -- the CLI ------------------------------------------------------------------------------
def jobwrap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wrapper", "checkpoints", "latest", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_cli_prints_the_path_alone_on_stdout(weird_tmp_path: Path) -> None:
    put(weird_tmp_path / "epoch=0-step=100.ckpt", zip_bytes())
    put(weird_tmp_path / "epoch=0-step=200.ckpt", zip_bytes()[:40])
    done = jobwrap(str(weird_tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{weird_tmp_path / 'epoch=0-step=100.ckpt'}\n"
    assert "layout=lightning step=100" in done.stderr
    assert "epoch=0-step=200.ckpt: truncated" in done.stderr


def test_cli_json_shape(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 40)
    hf_checkpoint(tmp_path, 50, complete=False)
    done = jobwrap(str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == {
        "latest": {"path": str(tmp_path / "checkpoint-40"), "layout": "hf", "step": 40,
                   "mtime": OLD},
        "skipped": [{"path": str(tmp_path / "checkpoint-50"),
                     "reason": "missing trainer_state.json (the Trainer writes it last)"}],
        "layout": "hf"}


def test_cli_exit_1_when_nothing_is_valid(tmp_path: Path) -> None:
    put(tmp_path / "model_1.pt", zip_bytes()[:-1])
    done = jobwrap(str(tmp_path), "--json")
    assert done.returncode == 1
    answer = json.loads(done.stdout)
    assert answer["latest"] is None and answer["layout"] == "torch"
    missing = jobwrap(str(tmp_path / "nope"))
    assert (missing.returncode, missing.stdout) == (1, "")
    assert "no such directory" in missing.stderr


def test_cli_settle_and_generic_options(tmp_path: Path) -> None:
    (tmp_path / "snap_1").mkdir()
    (tmp_path / "snap_1" / "OK").write_text("")  # just written: not settled by default
    assert jobwrap(str(tmp_path), "--glob", "snap_*", "--marker", "OK").returncode == 1
    done = jobwrap(str(tmp_path), "--glob", "snap_*", "--marker", "OK", "--settle", "0")
    assert (done.returncode, done.stdout) == (0, f"{tmp_path / 'snap_1'}\n")


@pytest.mark.parametrize("args", [["--marker", "DONE"], ["--glob", "a/*"],
                                  ["--settle", "-5"], ["--settle", "soon"]])
def test_cli_exit_2_on_bad_input(tmp_path: Path, args: list[str]) -> None:
    done = jobwrap(str(tmp_path), *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "error" in done.stderr.lower()


def test_layouts_that_cannot_be_listed_are_an_error_not_an_empty_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Read with a user's rights from an install that user cannot read, the layouts'
    folder lists as empty: every checkpoint would be missed without a word."""
    import pkgutil

    from wrapper.checkpoints import layout as layout_mod

    monkeypatch.setattr(layout_mod, "_loaded", False)
    monkeypatch.setattr(pkgutil, "iter_modules", lambda path: iter(()))
    with pytest.raises(JobwrapError, match="must be readable by every user"):
        registered()
