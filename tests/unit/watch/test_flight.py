"""PyTorch's flight recorder (wrapper/watch/flight.py): real gloo dumps recorded here, a
synthetic NCCL one in the same format (tests/fixtures/flight/README.md), and hostile
folders and files a job's user can leave where root's child reads them as the user."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wrapper.watch import flight

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flight"


@pytest.mark.parametrize("folder", ["gloo-3ranks", "gloo-3ranks-json"])
def test_the_gloo_rank_that_stopped_before_the_all_reduce_is_named(folder: str) -> None:
    records = flight.read_folder(str(FIXTURES / folder))
    assert [r["rank"] for r in records] == [0, 1, 2]
    assert records[0]["groups"][0]["seq"] == 4 and records[2]["groups"][0]["seq"] == 3
    named, said = flight.not_joined(records)
    assert len(named) == 1 and named[0].startswith(
        "rank 2 never joined gloo:all_reduce #4 of process group 0 (its last: #3"), named
    assert said == "process group 0: 2 of 3 ranks entered gloo:all_reduce #4, 1 stopped before"


def test_the_nccl_rank_behind_is_named_with_where_the_job_called_it() -> None:
    records = flight.read_folder(str(FIXTURES / "nccl-4ranks-synthetic"))
    assert [(r["groups"][0]["seq"], r["groups"][0]["state"]) for r in records] == [
        (7, "started"), (7, "started"), (6, "completed"), (7, "scheduled")]
    named, said = flight.not_joined(records)
    assert named == ["rank 2 never joined nccl:all_reduce #7 of process group 0 (its last: "
                     "#6 at train_step (train.py:71))"], named
    assert "3 of 4 ranks entered nccl:all_reduce #7" in said


def test_ranks_in_step_name_nobody() -> None:
    records = flight.read_folder(str(FIXTURES / "gloo-3ranks"))[:2]
    assert flight.not_joined(records) == ([], "")
    assert flight.not_joined([]) == ([], "")


def test_a_pickle_naming_anything_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    [record] = flight.read_folder(str(tmp_path))
    assert record["rank"] == 0 and "not a flight recorder's" in record["error"], record
    assert not marker.exists()


def test_shared_huge_strings_deep_nesting_and_huge_numbers_cost_little(tmp_path: Path
                                                                        ) -> None:
    """A pickle can name one huge string (or a deep list) in many places at no size;
    each is cut before it is looked at, and one bad file loses only its own rank."""
    huge = "A" * (4 << 20)
    shared = [huge] * 2000
    entries = [{"collective_seq_id": i, "process_group": (huge, "x"), "profiling_name": huge,
                "frames": [{"name": huge, "filename": huge, "line": huge}]}
               for i in range(200)] + [{"collective_seq_id": 1 << 70, "pg_id": shared}]
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": entries}))
    deep = b"]" * 200000  # EMPTY_LIST opcodes, each appended (a) to the one before
    (tmp_path / "rank_1").write_bytes(b"\x80\x04" + deep + b"a" * 199999 + b".")
    shutil.copy(FIXTURES / "gloo-3ranks" / "rank_2", tmp_path / "rank_2")
    records = {r["rank"]: r for r in flight.read_folder(str(tmp_path))}
    [group] = records[0]["groups"]
    assert group["seq"] == 199 and len(group["pg"]) == flight.TEXT_MAX  # the huge seq: out
    assert len(group["at"]) <= flight.TEXT_MAX
    assert "error" in records[1] and records[2]["groups"][0]["seq"] == 3, records[1]


def test_links_fifos_huge_files_and_odd_names_are_not_read(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "gloo-3ranks" / "rank_0", tmp_path / "rank_0")
    secret = tmp_path / "secret"
    secret.write_bytes((FIXTURES / "gloo-3ranks" / "rank_1").read_bytes())
    (tmp_path / "rank_1").symlink_to(secret)
    os.mkfifo(tmp_path / "rank_2")  # nobody writes it: a blocking open would hang
    with open(tmp_path / "rank_3", "wb") as handle:
        handle.truncate(flight.FILE_MAX + 1)
    (tmp_path / "rank_4").write_bytes(b"\x80\x04not a pickle")
    for odd in ("rank_\u00b2", "rank_x", "rank_", "other_5"):
        (tmp_path / odd).write_bytes(b"{}")
    records = {r["rank"]: r for r in flight.read_folder(str(tmp_path))}
    assert sorted(records) == [0, 1, 2, 3, 4]
    assert "groups" in records[0]
    assert all("error" in records[r] for r in (1, 2, 3, 4)), records
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path)
    assert flight.read_folder(str(linked)) == []  # the folder itself: never through a link
    assert flight.read_folder(str(tmp_path / "none")) == []


def test_the_task_prolog_sets_the_recorder_unless_the_job_did() -> None:
    values = flight.exports(2000, "/scratch/7", {})
    assert values == {"TORCH_FR_BUFFER_SIZE": "2000",
                      "TORCH_FR_DUMP_TEMP_FILE": "/scratch/7/.flight-recorder/rank_",
                      "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert flight.dump_folder(values) == "/scratch/7/.flight-recorder"
    assert flight.exports(0, "/scratch/7", {}) == {}
    own = flight.exports(2000, "/scratch/7", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "10",
                                              "TORCH_FR_DUMP_TEMP_FILE": "/mine/t_"})
    assert own == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"} and flight.dump_folder(own) is None
    # a task on another node inherits the batch step's: jobwrap's own is set anew
    inherited = flight.exports(2000, "/n2/scratch/7", values)
    assert inherited == {"TORCH_FR_DUMP_TEMP_FILE": "/n2/scratch/7/.flight-recorder/rank_"}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_parse_or_are_refused_with_the_one_error(raw: bytes) -> None:
    try:
        data = flight.parse(raw)
    except flight.DumpError as exc:
        assert str(exc)  # one clear reason, never another exception
        return
    assert isinstance(data["entries"], list)
    assert len(flight.summarise(data)) <= flight.GROUPS_MAX


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(
    ["collective_seq_id", "process_group", "pg_id", "profiling_name", "state", "frames",
     "is_p2p"]), JSONISH, max_size=7), max_size=5))
def test_any_entries_summarise_and_compare_without_error(entries: list[dict[str, object]]
                                                         ) -> None:
    groups = flight.summarise({"entries": entries})
    assert len(groups) <= flight.GROUPS_MAX
    flight.not_joined([{"rank": 0, "groups": groups}, {"rank": 1, "groups": []}])
