"""The guard's state on disk: atomic, refusing folders that are not its own, one guard a node."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wrapper.errors import StateError
from wrapper.loginguard.state import (
    HISTORY,
    ActionRecord,
    GuardState,
    PendingKill,
    Reniced,
    StateStore,
    Throttle,
    Violation,
)


def full_state() -> GuardState:
    state = GuardState()
    v = Violation(1500, "alice", "cpu", "cpu", since=100.0, last_seen=160.0, seen="2 cores",
                  stage=2, stage_at=150.0, last_action="throttle")
    state.violations[v.key] = v
    state.throttles[1500] = Throttle(1500, "alice", "renice", 150.0,
                                     reniced=[Reniced(77, 99.5, 0)])
    state.pending_kills.append(PendingKill(77, 99.5, 1500, "alice", "cpu", 170.0))
    state.record(ActionRecord(150.0, "throttle", "alice", 1500, "cpu", (77,), "2 cores",
                              "reniced [77] to 19", False, True))
    return state


def test_round_trip_and_no_temporary_file_left(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state" / "login-guard")
    store.save(full_state())
    loaded, problem = store.load()
    assert problem == ""
    assert loaded == full_state()
    assert sorted(os.listdir(store.directory)) == ["state.json"]
    assert os.stat(store.path).st_mode & 0o777 == 0o640
    assert json.loads(store.path.read_text())["version"] == 1


def test_history_is_bounded() -> None:
    state = GuardState()
    for i in range(HISTORY + 7):
        state.record(ActionRecord(float(i), "warn", "a", 1500, "ai", (), "", "", False, True))
    assert len(state.history) == HISTORY
    assert state.history[0].ts == 7.0


def test_a_damaged_file_is_set_aside_not_fatal(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.prepare()
    store.path.write_text('{"version": 1, "violations": [')  # cut by a crash of the disk
    state, problem = store.load()
    assert state == GuardState()
    assert "unreadable" in problem and "set aside" in problem
    assert not store.path.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("state.json.damaged-")]


def test_a_symlinked_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "login-guard").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateError, match="not a directory"):
        StateStore(tmp_path / "login-guard").save(GuardState())
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_folder_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test checks ownership and must run as root, as CI does")
    folder = tmp_path / "login-guard"
    folder.mkdir()
    os.chown(folder, 4242, 4242)
    with pytest.raises(StateError, match="owned by uid 4242"):
        StateStore(folder).save(GuardState())


def test_a_state_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    target = tmp_path / "target.json"
    target.write_text(json.dumps(full_state().to_json()))
    store.path.symlink_to(target)
    with pytest.raises(StateError, match="cannot open"):
        store.load()


def test_one_guard_per_node(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "lg")
    held = store.lock()
    try:
        with pytest.raises(StateError, match="another login guard"):
            StateStore(tmp_path / "lg").lock()
    finally:
        os.close(held)
    os.close(StateStore(tmp_path / "lg").lock())  # free again once released
