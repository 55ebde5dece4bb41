from __future__ import annotations

import io
import json
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.hooks import FIXTURES, slurm_env
from wrapper.hooks import run_hook
from wrapper.job.state import JobState


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    config = tmp_path / "jobwrap.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                      f'scratch_root = "{tmp_path}/scratch"\n'
                      f'[log]\nfile = "{tmp_path}/jobwrap.log"\n'
                      f'[gpu]\nbackend = "fake"\nfake_inventory = "{FIXTURES}/healthy-4.toml"\n')
    return {"config": config, "state": tmp_path / "state", "log": tmp_path / "jobwrap.log",
            "scratch": tmp_path / "scratch"}


def test_prolog_records_the_context(site: dict[str, Path]) -> None:
    assert run_hook("prolog", config_path=str(site["config"]), env=slurm_env("prolog")) == 0
    events = JobState(site["state"], "31").events()
    [event] = [e for e in events if e["event"] == "prolog.context"]
    [health] = [e for e in events if e["event"] == "health"]
    assert health["verdict"] == "pass"  # the fake inventory's GPUs 1 and 3 are healthy
    assert event["context"]["gpus"] == [1, 3]
    assert event["context"]["node"] == "n1"
    assert event["attempt"] == 1


def test_every_log_event_carries_hook_job_node_attempt(site: dict[str, Path]) -> None:
    run_hook("prolog", config_path=str(site["config"]), env=slurm_env("prolog"))
    lines = [json.loads(x) for x in site["log"].read_text().splitlines()]
    assert lines, "the prolog logged nothing"
    for line in lines:
        assert (line["hook"], line["job_id"], line["node"], line["attempt"]) == \
            ("prolog", "31", "n1", 1)
        assert "timestamp" in line and "level" in line


@pytest.mark.usefixtures("root")  # root's hooks make the log folder
def test_the_prolog_makes_a_missing_log_folder(site: dict[str, Path]) -> None:
    """On a node where nothing made /var/log/jobwrap, the first hook makes it (root's,
    0750) and logs there, rather than only to a stderr slurmd does not keep."""
    log_file = site["config"].parent / "log" / "jobwrap" / "jobwrap.log"
    site["config"].write_text(site["config"].read_text().replace(str(site["log"]),
                                                                 str(log_file)))
    (site["config"].parent / "log").mkdir(mode=0o755)
    assert run_hook("prolog", config_path=str(site["config"]), env=slurm_env("prolog")) == 0
    folder = log_file.parent.lstat()
    assert stat.S_ISDIR(folder.st_mode) and stat.S_IMODE(folder.st_mode) == 0o750
    assert folder.st_uid == 0
    events = [json.loads(x)["event"] for x in log_file.read_text().splitlines()]
    assert "log.file_unavailable" not in events and events, events


def test_task_prolog_exports(site: dict[str, Path]) -> None:
    run_hook("prolog", config_path=str(site["config"]), env=slurm_env("prolog"))
    out = io.StringIO()
    env = slurm_env("task-prolog", SLURM_RESTART_COUNT="1")
    assert run_hook("task-prolog", config_path=str(site["config"]), env=env, out=out) == 0
    assert out.getvalue().splitlines() == [
        "export JOBWRAP_ATTEMPT=1",
        f"export JOBWRAP_SCRATCH={site['scratch']}/31",
        # not /etc/jobwrap/config.toml: jobwrap commands inside the job read the same one
        f"export JOBWRAP_CONFIG={site['config']}",
        # PyTorch's flight recorder, dumping into the task's scratch
        "export TORCH_FR_BUFFER_SIZE=2000",
        f"export TORCH_FR_DUMP_TEMP_FILE={site['scratch']}/31/.flight-recorder/rank_",
        "export TORCH_NCCL_DUMP_ON_TIMEOUT=1",
        # attempt 1 of the batch step: the user is told why and from where it runs
        "print jobwrap: attempt 1; no valid checkpoint: starting from the beginning",
    ]
    events = [e for e in JobState(site["state"], "31").events() if "context" in e["event"]]
    assert [(e["event"], e["source"]) for e in events] == [
        ("prolog.context", "root"), ("task-prolog.context", "user")]
    (site["scratch"] / "31").mkdir(parents=True, exist_ok=True)  # the prolog makes it
    assert run_hook("task-prolog", config_path=str(site["config"]), env=env,
                    out=io.StringIO()) == 0
    assert (site["scratch"] / "31" / ".flight-recorder").is_dir()  # where the dumps go
    own = io.StringIO()  # the job's own recorder settings win
    env.update(TORCH_FR_BUFFER_SIZE="0", TORCH_FR_DUMP_TEMP_FILE="/x/t_")
    assert run_hook("task-prolog", config_path=str(site["config"]), env=env, out=own) == 0
    assert [line for line in own.getvalue().splitlines() if "TORCH" in line] == [
        "export TORCH_NCCL_DUMP_ON_TIMEOUT=1"]


@pytest.mark.parametrize(("extra", "claims"), [
    ({"JOBWRAP_RUN": "31", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0"}, 1),
    ({"JOBWRAP_RUN": "31", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "1"}, 0),  # once a node
    ({"JOBWRAP_RUN": "77", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0"}, 0),  # another job's
    ({"SLURM_STEP_ID": "0", "SLURM_LOCALID": "0"}, 0),  # no jobwrap run around the step
])
def test_a_step_of_jobwrap_runs_command_says_so_on_its_own_node(
        site: dict[str, Path], extra: dict[str, str], claims: int) -> None:
    """jobwrap run writes its run.started on the batch node only; each node keeps its state
    to itself, so the task-prolog of its command's step says it on this node (the user's
    word, once an attempt), where this node's watcher looks before a spare takes over."""
    from wrapper.job.store import JobStore

    run_hook("prolog", config_path=str(site["config"]), env=slurm_env("prolog"))
    for _task in range(2):  # a second step of the attempt adds nothing
        assert run_hook("task-prolog", config_path=str(site["config"]),
                        env=slurm_env("task-prolog", **extra), out=io.StringIO()) == 0
    store = JobStore(JobState(site["state"], "31"))
    found = [e for e in store.user_claims(1) if e.KIND == "run.started"]
    assert len(found) == claims and store.under_run(1) == bool(claims), found
    assert all(e.node == "n1" and not e.from_root for e in found)


def test_a_task_without_its_prolog_gets_its_env_and_ends_before_the_jobs_code(
        site: dict[str, Path]) -> None:
    out = io.StringIO()  # no prolog ran on n1 for attempt 1: root's record has none
    assert run_hook("task-prolog", config_path=str(site["config"]),
                    env=slurm_env("task-prolog"), out=out) == 1
    lines = out.getvalue().splitlines()
    assert "export JOBWRAP_ATTEMPT=1" in lines
    assert lines[-1].startswith("print jobwrap: job 31 did not start on n1: jobwrap's "
                                "prolog did not run on n1 for attempt 1")
    assert "requeued away from n1" in lines[-1]


@pytest.mark.parametrize(("step", "ended"), [("0", True), ("batch", False),
                                             ("extern", False)])
def test_a_task_without_its_prolog_ends_its_whole_step(site: dict[str, Path], step: str,
                                                       ended: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its ranks on the other nodes would wait for it in their rendezvous until a timeout:
    the refused task cancels its step (the user's own right), never the job, once its
    line is printed (in the background, after a delay: here at once, in this process)."""
    from wrapper.config import load
    from wrapper.hooks import Services, task_prolog
    from wrapper.slurm.fake import FakeSlurm

    delays: list[float] = []

    def inline(work: Callable[[], None], *, delay: float) -> None:
        delays.append(delay)
        work()

    monkeypatch.setattr(task_prolog, "_in_background", inline)
    fake = FakeSlurm()
    services = Services(load(str(site["config"])), slurm_factory=lambda: fake)
    assert run_hook("task-prolog", config_path=str(site["config"]),
                    env=slurm_env("task-prolog", SLURM_STEP_ID=step), out=io.StringIO(),
                    services=services) == 1
    assert fake.calls == ([("cancel_step", "31", step)] if ended else [])
    assert delays == ([task_prolog.STEP_END_DELAY] if ended else [])


def test_the_step_is_ended_from_a_child_that_holds_no_stream(tmp_path: Path) -> None:
    """slurmstepd reads the task-prolog's output to its end: the child that cancels the
    step later must not hold it open, or the task would wait for the delay."""
    import subprocess
    import sys
    import time

    marker = tmp_path / "done"
    code = ("from pathlib import Path\n"
            "from wrapper.hooks.task_prolog import _in_background\n"
            f"_in_background(lambda: Path({str(marker)!r}).write_text('x'), delay=4)\n"
            "print('parent done')\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=True)  # reads stdout to EOF, as slurmstepd does
    assert done.stdout == "parent done\n"
    assert time.monotonic() - start < 3, "the child held the parent's output open"
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "x"


def test_a_prolog_of_another_attempt_or_node_does_not_vouch(site: dict[str, Path]) -> None:
    for node, attempt in (("n1", "0"), ("n2", "1")):  # Slurm skipped attempt 1 on n1
        assert run_hook("prolog", config_path=str(site["config"]),
                        env=slurm_env("prolog", SLURMD_NODENAME=node,
                                      SLURM_JOB_RESTART_COUNT=attempt)) == 0
    # The user's own file cannot vouch for a check either.
    JobState(site["state"], "31").append("prolog.context", as_user=True, node="n1",
                                         attempt=1, hook="prolog")
    out = io.StringIO()
    assert run_hook("task-prolog", config_path=str(site["config"]),
                    env=slurm_env("task-prolog"), out=out) == 1
    assert "did not run on n1 for attempt 1" in out.getvalue()


def test_with_unchecked_attempt_run_the_task_runs_and_is_told(site: dict[str, Path]) -> None:
    site["config"].write_text(site["config"].read_text() +
                              '[hooks]\nunchecked_attempt = "run"\n')
    out = io.StringIO()
    assert run_hook("task-prolog", config_path=str(site["config"]),
                    env=slurm_env("task-prolog"), out=out) == 0
    assert "export JOBWRAP_ATTEMPT=1" in out.getvalue()
    assert "print jobwrap: warning: jobwrap's prolog did not run on n1 for attempt 1" \
        in out.getvalue()


def test_bad_config_inside_slurm_lets_the_job_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[paths]\nstate_dir = 5\n")
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = run_hook("prolog", config_path=str(bad), env=slurm_env("prolog"))
    assert code == 0
    assert "hook.failed" in err.getvalue()
    assert "[paths] state_dir = 5" in err.getvalue()


def test_bad_config_by_hand_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[paths]\nstate_dir = 5\n")
    env = slurm_env("prolog")
    del env["SLURM_SCRIPT_CONTEXT"]
    assert run_hook("prolog", config_path=str(bad), env=env) == 2


def test_not_under_slurm_exits_2(site: dict[str, Path]) -> None:
    assert run_hook("epilog", config_path=str(site["config"]), env={}) == 2


def test_unwritable_state_is_not_a_node_fault(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    blocker = tmp_path / "file"
    blocker.write_text("")
    config.write_text(f'[paths]\nstate_dir = "{blocker}/state"\n[log]\nfile = ""\n')
    assert run_hook("prolog", config_path=str(config), env=slurm_env("prolog")) == 0
