"""``jobwrap run``: what it leaves in the job's record, and what the epilog tells a job
that did not use it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.epilog import JOB, EpilogCase
from wrapper.config import Config, PathsConfig
from wrapper.hooks.epilog import decide_attempt
from wrapper.hooks.services import Services
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.restart.apply import in_place_hint
from wrapper.restart.classify import Classification
from wrapper.restart.policy import Decision
from wrapper.restart.runloop import FORWARDED, run
from wrapper.submit.directives import parse_args


@pytest.fixture
def handlers() -> Iterator[None]:
    """``run`` installs its signal forwarder: put pytest's handlers back."""
    saved = {signum: signal.getsignal(signum) for signum in FORWARDED}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def _in_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Config, JobState]:
    """jobwrap run's view inside attempt 0 of job JOB on n1, its state folder made."""
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    return cfg, state


def test_run_notes_in_the_jobs_file_that_it_restarts_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    cfg, state = _in_job(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert run(["true"], parse_args([]), cfg, say=lambda text: None) == 0
    [started] = [e for e in JobStore(state).events() if isinstance(e, ev.RunStarted)]
    assert (started.attempt, started.node, started.command, started.source) == \
        (2, "n1", "true", "user")


def test_a_restart_in_place_notes_what_ended_the_command_and_when(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    """The ledger's boundary inside the attempt: the class jobwrap run gave the failure,
    when the command ended, and when it started again."""
    cfg, state = _in_job(tmp_path, monkeypatch)
    marker = tmp_path / "ran-once"
    command = ["sh", "-c", f"[ -e {marker} ] && exit 0; touch {marker}; sleep 0.3; "
               "echo 'srun: error: n2: task 1: Killed' >&2; exit 137"]
    before = time.time()
    assert run(command, parse_args(["--max-restarts=2"]), cfg, say=lambda text: None) == 0
    [restarted] = [e for e in JobStore(state).events() if isinstance(e, ev.RunRestarted)]
    assert (restarted.restart, restarted.kind_ended) == (1, "killed")
    assert before + 0.3 <= restarted.ended_at <= restarted.ts


def test_run_outside_a_job_or_its_state_records_nothing_and_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "none")))
    monkeypatch.setenv("SLURM_JOB_ID", JOB)  # no state folder for it
    assert run(["false"], parse_args(["--max-restarts=0"]), cfg, say=lambda t: None) == 1
    monkeypatch.delenv("SLURM_JOB_ID")
    assert run(["true"], parse_args([]), cfg, say=lambda text: None) == 0
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("kind", "action", "used_run", "hinted"), [
    ("killed", "requeue", False, True),
    ("user_error", "requeue", False, True),
    ("collective_timeout", "requeue", False, True),
    ("killed", "requeue", True, False),  # it runs under jobwrap run already
    ("killed", "stop", False, False),  # nothing restarts at all
    ("hardware", "requeue", False, False),  # wants other nodes
    ("hang", "requeue", False, True),  # its steps only, under jobwrap run
])
def test_the_hint_names_what_jobwrap_run_would_have_kept(kind: str, action: str,
                                                          used_run: bool, hinted: bool) -> None:
    hint = in_place_hint(Classification(kind, "x"), Decision(action, "y"), used_run=used_run)
    assert bool(hint) == hinted
    assert not hint or "`jobwrap run -- CMD`" in hint


def test_a_job_under_jobwrap_run_is_not_told_to_use_it(tmp_path: Path,
                                                       epilog_case: EpilogCase) -> None:
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "killed", "first", True)
    JobStore(state).record(ev.RunStarted(attempt=0, node="n1", command="srun train.py"))
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None))
    told = Path(record.stdout).read_text()
    assert decision.requeue and "ended: killed" in told
    assert "jobwrap run -- CMD" not in told


def test_faulty_nodes_are_roots_and_slurms_facts(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.restart.spares import faulty_nodes
    from wrapper.slurm.fake import FakeSlurm

    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    healthy = {"State": "MIXED", "Reason": ""}
    slurm = FakeSlurm(nodes={"n1": healthy, "n2": healthy, "n3": healthy})
    assert faulty_nodes(cfg, 0, slurm) == {}
    # the user's own word is no fault; a watcher's (root's) on this node is
    state.append("watch.fault", as_user=True, node="n1", attempt=0, reason="forged")
    assert faulty_nodes(cfg, 0, slurm) == {}
    JobStore(state).record(ev.WatchFault(node="n1", attempt=0, reason="xid 79 on gpu0"))
    slurm.nodes["n2"] = {"State": "MIXED+DRAIN", "Reason": "jobwrap: xid gpu1 [root@t]"}
    slurm.nodes["n3"] = {"State": "DOWN*", "Reason": "Not responding"}
    assert faulty_nodes(cfg, 0, slurm) == {"n1": "xid 79 on gpu0", "n2": "jobwrap: xid gpu1",
                                           "n3": "Slurm lost it (DOWN*)"}
    assert faulty_nodes(cfg, 1, slurm).keys() == {"n2", "n3"}  # n1's fault was attempt 0's
    # lost and back within one look (a slurmd restarted at once): its slurmd started
    # after the launch did, and srun could not reach it; a node srun did not name is
    # not judged on its slurmd's restart alone (an admin's restart harms no step)
    launch = 1_800_000_000.0
    back = {"State": "IDLE", "Reason": "", "SlurmdStartTime": time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(launch + 30))}
    slurm = FakeSlurm(nodes={"n1": healthy, "n2": back, "n3": back})
    assert faulty_nodes(cfg, 1, slurm, suspects=["n3"], since=launch) == {
        "n3": "Slurm lost it (IDLE, back since)"}
    assert faulty_nodes(cfg, 1, slurm, suspects=["n3"], since=launch + 60) == {}


def test_no_restart_in_place_on_a_faulty_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              handlers: None) -> None:
    import wrapper.restart.runloop as runloop

    said: list[str] = []
    monkeypatch.setattr(runloop, "faulty_nodes",
                        lambda cfg, attempt, nodes=None, **_: {"n2": "jobwrap: xid"})
    marker = tmp_path / "runs"
    code = run(["sh", "-c", f"echo run >> {marker}; kill -9 $$"],
               parse_args(["--max-restarts=3"]), Config(), say=said.append)
    assert code == 128 + signal.SIGKILL
    assert marker.read_text() == "run\n"  # started once, never again
    assert "not restarting in place: a node of the job is faulty (n2: jobwrap: xid)" in said[-1]


def test_run_takes_the_jobs_directives_where_its_command_line_is_silent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.job import record as jobrecord
    from wrapper.job.record import JobRecord, site_options
    from wrapper.restart.runloop import with_directives

    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    state.write_json(jobrecord.RECORD, JobRecord(
        job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(), nodes=["n1"], gpus=[],
        work_dir=str(tmp_path), options={"checkpoint_dir": "ckpt", "max_restarts": 4,
                                         "checkpoint_glob": "step_*"}).as_dict())
    # not in a job: its own options over the site's defaults (the one merge)
    assert with_directives(parse_args([]), cfg) == site_options(parse_args([]), cfg)
    assert with_directives(parse_args([]), cfg).max_restarts == cfg.restart.max_restarts
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    merged = with_directives(parse_args([]), cfg)
    assert (merged.checkpoint_dir, merged.max_restarts, merged.checkpoint_glob) == \
        (str(tmp_path / "ckpt"), 4, "step_*")
    own = with_directives(parse_args(["--max-restarts=0", "--checkpoint-dir=/elsewhere"]), cfg)
    assert (own.checkpoint_dir, own.max_restarts, own.checkpoint_glob) == \
        ("/elsewhere", 0, "step_*")
    # a relative folder on the command line is the job's work dir's, as the record's is,
    # wherever jobwrap run was started from
    monkeypatch.chdir("/")
    assert with_directives(parse_args(["--checkpoint-dir=mine"]), cfg).checkpoint_dir == \
        str(tmp_path / "mine")
    monkeypatch.setenv("SLURM_JOB_ID", "999")  # no record of that job: its own options
    assert with_directives(parse_args(["--max-restarts=2"]), cfg) == \
        site_options(parse_args(["--max-restarts=2"]), cfg)


def _spare_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: str = "n[1-3]"
               ) -> tuple[Config, JobState]:
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    for name, value in {"SLURM_JOB_ID": JOB, "SLURM_JOB_NODELIST": nodes,
                        "SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS": "6",
                        "SLURM_NTASKS_PER_NODE": "2", "SLURMD_NODENAME": "n1"}.items():
        monkeypatch.setenv(name, value)
    return cfg, state


def test_spares_keep_the_commands_steps_on_the_working_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.restart.spares import Spares

    _spare_job(tmp_path, monkeypatch)
    spares = Spares.of(parse_args(["--spare-nodes=1"]), os.environ)
    assert spares is not None and (spares.working, spares.nodes, spares.left) == \
        (2, ["n1", "n2", "n3"], 1)
    env = spares.environ(os.environ)
    assert (env["SLURM_JOB_NUM_NODES"], env["SLURM_NNODES"], env["SLURM_NTASKS"]) == \
        ("2", "2", "4")  # srun's defaults: 2 nodes, 2 tasks on each
    assert Spares.of(parse_args([]), os.environ) is None  # none asked
    assert Spares.of(parse_args(["--spare-nodes=3"]), os.environ) is None  # no working node


def test_a_faulty_node_is_given_back_and_a_spare_takes_its_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.restart.spares import Spares, faulty_nodes
    from wrapper.slurm.fake import FakeSlurm

    cfg, state = _spare_job(tmp_path, monkeypatch, "n[1-4]")
    healthy = {"State": "MIXED", "Reason": ""}
    slurm = FakeSlurm(nodes={n: dict(healthy) for n in ("n1", "n2", "n3", "n4")},
                      jobs={JOB: {"NodeList": "n[1-4]", "JobState": "RUNNING"}})
    spares = Spares.of(parse_args(["--spare-nodes=2"]), os.environ)
    assert spares is not None
    said: list[str] = []

    def replace() -> bool:  # as jobwrap run does: the faults read once, then the move
        assert spares is not None
        return spares.replace_faulty(cfg, faulty_nodes(cfg, 0, slurm, nodes=spares.nodes),
                                     said.append, slurm)

    assert not replace()  # nothing faulty: no move
    assert ("shrink_job", JOB, "n1", "n2", "n4") not in slurm.calls
    JobStore(state).record(ev.WatchFault(node="n2", attempt=0, reason="xid 79 on gpu0"))
    assert replace()
    assert slurm.calls[-1] == ("shrink_job", JOB, "n1", "n3", "n4")
    assert (spares.nodes, spares.left) == (["n1", "n3", "n4"], 1)
    assert "spare n3 took its place; 1 spare left" in said[-1]
    [used] = [e for e in JobStore(state).events() if isinstance(e, ev.SpareUsed)]
    assert (used.failed, used.replaced_by, used.spares_left) == (["n2"], ["n3"], 1)
    # a lost node and a drained one at once: one spare left, two needed -> no move
    slurm.nodes["n1"] = {"State": "DOWN*", "Reason": "Not responding"}
    slurm.nodes["n3"] = {"State": "MIXED+DRAIN", "Reason": "jobwrap: row_remap gpu0"}
    assert not replace()
    assert "no spare node left for n1: Slurm lost it" in said[-1]
    assert spares.nodes == ["n1", "n3", "n4"]
    # a node Slurm lost under --no-kill has left the allocation: nothing to give back
    slurm.nodes["n3"] = dict(healthy)
    slurm.jobs[JOB]["NodeList"] = "n[3-4]"
    calls = len(slurm.calls)
    assert replace()
    assert not [c for c in slurm.calls[calls:] if c[0] == "shrink_job"]
    assert (spares.nodes, spares.left) == (["n3", "n4"], 0)


def test_run_moves_onto_a_spare_without_spending_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    import wrapper.restart.runloop as runloop

    _spare_job(tmp_path, monkeypatch)
    moves: list[dict[str, str]] = []
    asked: list[int] = []

    def replace_faulty(self: runloop.Spares, cfg: Config, faulty: dict[str, str],
                       say: object) -> bool:
        moves.append(faulty)
        self.nodes = ["n1", "n3"]
        return True

    def faulty_nodes(cfg: Config, attempt: int, nodes: object = None,
                     **_: object) -> dict[str, str]:
        asked.append(attempt)  # the first failure was a node's; the later ones the job's
        return {"n2": "xid"} if len(asked) == 1 else {}

    monkeypatch.setattr(runloop.Spares, "replace_faulty", replace_faulty)
    monkeypatch.setattr(runloop, "faulty_nodes", faulty_nodes)
    marker = tmp_path / "runs"
    said: list[str] = []
    code = run(["sh", "-c", f"echo $SLURM_JOB_NUM_NODES:$SLURM_JOB_NODELIST >> {marker}; "
                "exit 3"], parse_args(["--spare-nodes=1", "--max-restarts=1"]), Config(),
               say=said.append)
    assert code == 3
    # the node's failure moved the work (no restart spent); the job's own error then
    # had its one restart, and the same error a third time stopped it
    assert marker.read_text().splitlines() == ["2:n1,n2,n3", "2:n1,n3", "2:n1,n3"]
    assert moves == [{"n2": "xid"}]
    assert len(asked) == 3  # Slurm asked once per failed run, not twice


LAUNCH_FAILED = ("srun: error: Task launch for StepId=7.1 failed on node n2: Communication "
                 "connection failure")


def test_a_node_srun_could_not_reach_is_awaited_then_swapped_for_a_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    # srun ended before slurmctld marked n2 not responding: restarting at once would
    # launch on n2 again; jobwrap run asks Slurm again until it has judged n2
    import wrapper.restart.runloop as runloop
    import wrapper.restart.spares as spares_mod

    _spare_job(tmp_path, monkeypatch)
    asked: list[int] = []
    moves: list[dict[str, str]] = []

    def faulty_nodes(cfg: Config, attempt: int, nodes: object = None,
                     **_: object) -> dict[str, str]:
        asked.append(attempt)
        return {"n2": "Slurm lost it (IDLE*)"} if len(asked) >= 3 else {}

    def replace_faulty(self: runloop.Spares, cfg: Config, faulty: dict[str, str],
                       say: object) -> bool:
        moves.append(faulty)
        self.nodes = ["n1", "n3"]
        return True

    monkeypatch.setattr(runloop, "faulty_nodes", faulty_nodes)
    monkeypatch.setattr(runloop.Spares, "replace_faulty", replace_faulty)
    monkeypatch.setattr(spares_mod.time, "sleep", lambda s: None)
    marker = tmp_path / "runs"
    said: list[str] = []
    code = run(["sh", "-c", f'echo $SLURM_JOB_NODELIST >> {marker}; '
                f'[ "$SLURM_JOB_NODELIST" = n1,n3 ] && exit 0; echo "{LAUNCH_FAILED}" >&2; '
                "exit 1"], parse_args(["--spare-nodes=1", "--max-restarts=0"]), Config(),
               say=said.append)
    assert code == 0 and moves == [{"n2": "Slurm lost it (IDLE*)"}]
    assert marker.read_text().splitlines() == ["n1,n2,n3", "n1,n3"]  # never n2 again
    assert len(asked) == 3 and any("srun could not reach n2" in line for line in said)


def test_the_wait_for_slurms_verdict_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    from wrapper.restart.spares import await_verdict

    now = [0.0]
    asks: list[float] = []

    def ask() -> dict[str, str]:
        asks.append(now[0])
        return {"n7": "drained by jobwrap"}  # another node's fault: not the one awaited

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = await_verdict(ask, ["n2"], wait_s=10, poll_s=3, clock=lambda: now[0],
                          sleep=sleep)
    assert found == {"n7": "drained by jobwrap"}  # what Slurm says at the end, unchanged
    assert asks == [0, 3, 6, 9, 10]


def test_without_srun_naming_a_node_nothing_is_awaited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    import wrapper.restart.runloop as runloop

    asked: list[int] = []
    monkeypatch.setattr(runloop, "faulty_nodes",
                        lambda cfg, attempt, nodes=None, **_: asked.append(attempt) or {})
    said: list[str] = []
    from wrapper.config import RestartConfig

    cfg = Config(restart=RestartConfig(no_progress_limit=5))
    assert run(["sh", "-c", 'echo "srun: error: n2: task 1: Killed" >&2; exit 1'],
               parse_args(["--max-restarts=1"]), cfg, say=said.append) == 1
    assert asked == [0]  # once, for the one restart: a task's death is not a node's
    assert not any("could not reach" in line for line in said)


def test_a_node_given_back_by_a_running_job_makes_no_decision(tmp_path: Path) -> None:
    from wrapper.hooks.epilog import _released
    from wrapper.job.record import JobRecord
    from wrapper.slurm.context import JobContext
    from wrapper.slurm.fake import FakeSlurm

    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    store = JobStore(state)

    def record(*nodes: str) -> JobRecord:
        return JobRecord(job_id=JOB, user="u", uid=1, gid=1, nodes=list(nodes), gpus=[],
                         work_dir="/w")

    def alone(node: str) -> JobContext:  # what the epilog's own environment says
        return JobContext(hook="epilog", job_id=JOB, node=node, user="u", uid=1, gid=1,
                          nodes=[node])

    slurm = FakeSlurm(jobs={JOB: {"JobState": "COMPLETING"}})
    three = record("n1", "n2", "n3")
    assert alone("n2").first_node
    # no prolog of this attempt here: root's record may be an older attempt's
    assert not _released(alone("n2"), three, store, slurm)
    for node in ("n1", "n2"):
        store.record(ev.PrologContext(node=node, hook="prolog", attempt=0, context={}))
    assert _released(alone("n2"), three, store, slurm)  # given back, or lost and back
    # the first node: its end, unless the job still runs
    assert not _released(alone("n1"), three, store, slurm)
    slurm.jobs[JOB]["JobState"] = "RUNNING"
    assert _released(alone("n1"), three, store, slurm)
    # the job's end (every node named), and a one-node job: the usual decision
    assert not _released(JobContext(hook="epilog", job_id=JOB, node="n1", user="u", uid=1,
                                    gid=1, nodes=["n1", "n2", "n3"]), three, store, slurm)
    assert not _released(alone("n2"), record("n2"), store, slurm)


def test_a_requeued_job_whose_spares_were_spent_works_on_what_it_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.restart.spares import Spares, working_before

    cfg, state = _spare_job(tmp_path, monkeypatch, "n[1-2]")
    assert working_before(cfg) is None
    JobStore(state).record(ev.SpareUsed(attempt=0, node="n1", failed=["n2"],
                                        replaced_by=["n3"], working=2))
    assert working_before(cfg) == 2
    # given back one node, the job came back with 2: both work, no spare left
    assert Spares.of(parse_args(["--spare-nodes=1"]), os.environ, working=2) is None
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    spares = Spares.of(parse_args(["--spare-nodes=1"]), os.environ, working=2)
    assert spares is not None and spares.left == 1


def test_a_watcher_ends_only_the_steps_of_a_job_whose_spare_can_take_over(
        tmp_path: Path) -> None:
    from wrapper.job import record as jobrecord
    from wrapper.watch.process import spare_may_take

    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    record = jobrecord.JobRecord(job_id=JOB, user="u", uid=1, gid=1, nodes=["n1", "n2", "n3"],
                                 gpus=[], work_dir="/w", options={"spare_nodes": 1})
    state.write_json(jobrecord.RECORD, record.as_dict())
    assert not spare_may_take(state, "n2", 0)  # not under jobwrap run: nothing relaunches
    JobStore(state).record(ev.RunStarted(attempt=0, node="n1", command="srun x"))
    assert spare_may_take(state, "n2", 0)
    assert not spare_may_take(state, "n1", 0)  # the batch script's node: the whole job
    assert not spare_may_take(state, "n2", 1)  # jobwrap run of another attempt
    # root's record decides whether the job holds spares, not the job's own claims
    state.write_json(jobrecord.RECORD, {**record.as_dict(), "options": {}})
    JobStore(state).record(ev.SpareUsed(attempt=0, node="n1", working=2))
    assert not spare_may_take(state, "n2", 0)


def test_srun_s_words_tell_two_faults_with_the_same_status_apart(
        tmp_path: Path, handlers: None, capfd: pytest.CaptureFixture[str]) -> None:
    # srun --kill-on-bad-exit ends 143 whether a rank was killed or crashed: by status
    # alone the second fault would be "the same error" and stop the restarts
    count = tmp_path / "count"
    script = (f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; '
              'if [ "$n" = 0 ]; then echo "srun: error: n2: task 1: Killed" >&2; exit 143; '
              'elif [ "$n" = 1 ]; then '
              'echo "srun: error: n2: task 1: Segmentation fault" >&2; exit 143; fi')
    said: list[str] = []
    from wrapper.config import RestartConfig

    cfg = Config(restart=RestartConfig(no_progress_limit=5))  # no checkpoints here
    assert run(["sh", "-c", script], parse_args(["--max-restarts=3"]), cfg,
               say=said.append) == 0
    assert count.read_text() == "3\n"
    assert any("a rank crashed: srun: error: n2: task 1: Segmentation fault" in line
               for line in said), said
    err = capfd.readouterr().err  # passed through as it came, not swallowed
    assert "task 1: Killed" in err and "task 1: Segmentation fault" in err


def test_slurmstepd_s_oom_kill_line_is_host_oom_for_jobwrap_run(
        tmp_path: Path, handlers: None) -> None:
    """jobwrap run decides for the job's user alone: srun's relayed OOM-kill line is its
    evidence (root's epilog takes Slurm's OUT_OF_MEMORY instead, never the words)."""
    count = tmp_path / "count"
    script = (f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; '
              'if [ "$n" = 0 ]; then echo "slurmstepd: error: Detected 1 oom-kill event(s) '
              'in StepId=7.0. Some of your processes may have been killed" >&2; exit 137; fi')
    said: list[str] = []
    from wrapper.config import RestartConfig

    cfg = Config(restart=RestartConfig(no_progress_limit=5))
    assert run(["sh", "-c", script], parse_args(["--max-restarts=2"]), cfg,
               say=said.append) == 0
    assert any("ended: host_oom (the kernel's OOM killer ended it" in line for line in said), \
        said


def test_a_hang_the_supervisor_ended_the_steps_of_is_restarted_in_place_as_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    """The supervisor writes ``hang`` before it ends the command's steps: the command's
    failure after it is the hang, restarted in place under the same brakes."""
    import sys

    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    state.append(ev.Hang.KIND, as_user=True, attempt=0, hook="supervisor")  # before: not it
    count = tmp_path / "count"
    hang = (f"from pathlib import Path; from wrapper.job.state import JobState; "
            f"JobState(Path({str(tmp_path / 'state')!r}), {JOB!r})"
            ".append('hang', as_user=True, attempt=0, hook='supervisor')")
    script = (f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; '
              f'if [ "$n" = 0 ]; then {sys.executable} -c "{hang}"; '
              'echo "srun: error: n1: task 0: Killed" >&2; exit 137; fi')
    said: list[str] = []
    monkeypatch.chdir(Path(__file__).parents[3])
    assert run(["sh", "-c", script], parse_args(["--max-restarts=1"]), cfg,
               say=said.append) == 0
    assert count.read_text() == "2\n"
    assert any("attempt 0 ended: hang (no progress for the hang timeout" in line
               and "restarting in place" in line for line in said), said
    # a second hang would be past --max-restarts=1: the brakes are the same
    count.unlink()
    script = script.replace('if [ "$n" = 0 ]', 'if [ "$n" -lt 5 ]')
    assert run(["sh", "-c", script], parse_args(["--max-restarts=1"]), cfg,
               say=said.append) == 137
    assert count.read_text() == "2\n" and "restart limit reached" in said[-1], said


def test_a_script_that_goes_on_after_its_steps_were_ended_still_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    """A whole batch script under jobwrap run ([restart] batch_wrapper) goes on past the
    srun the supervisor ended after a hang, and may end 0: still the hang, restarted in
    place, not a success that would end the job half-trained."""
    import sys

    cfg, _state = _in_job(tmp_path, monkeypatch)
    count = tmp_path / "count"
    hang = (f"from pathlib import Path; from wrapper.job.state import JobState; "
            f"JobState(Path({str(tmp_path / 'state')!r}), {JOB!r})"
            ".append('hang', as_user=True, attempt=0, hook='supervisor')")
    script = (f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; '
              f'if [ "$n" = 0 ]; then {sys.executable} -c "{hang}"; fi; echo after srun')
    said: list[str] = []
    monkeypatch.chdir(Path(__file__).parents[3])
    assert run(["sh", "-c", script], parse_args(["--max-restarts=1"]), cfg,
               say=said.append) == 0
    assert count.read_text() == "2\n"  # run again after the hang, then done
    assert any("attempt 0 ended: hang" in line and "restarting in place" in line
               for line in said), said


def test_when_its_brakes_stop_it_the_epilog_does_not_start_them_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None,
        epilog_case: EpilogCase) -> None:
    """The same error twice stops jobwrap run (its same-error brake); it notes
    ``run.stopped``, and the epilog then stops the job where it would have requeued it
    for a second round of the same brakes (--max-restarts restarts in place, then as
    many requeues, each with as many restarts in place)."""
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "user_error", "first", True)
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    said: list[str] = []
    code = run(["sh", "-c", "echo 'ValueError: bad input' >&2; exit 3"],
               parse_args(["--max-restarts=5"]), cfg, say=said.append)
    assert code == 3
    assert sum("restarting in place" in line for line in said) == 1, said
    [stopped] = [e for e in JobStore(state).events() if isinstance(e, ev.RunStopped)]
    assert (stopped.attempt, stopped.kind_ended, stopped.source) == (0, "user_error", "user")
    assert "the same error" in stopped.reason
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None))
    assert decision.action == "stop" and "jobwrap run restarted it inside the allocation " \
        "and stopped (the same error" in decision.reason, decision
    assert slurm.did("requeue") == []


@pytest.mark.parametrize(("kind", "action"), [("user_error", "requeue"),
                                               ("hardware", "requeue")])
def test_run_stopped_stops_only_the_jobs_own_failures(tmp_path: Path, epilog_case: EpilogCase,
                                                      kind: str, action: str) -> None:
    """Without ``run.stopped`` a user error is requeued as ever; with it, a fault that is
    not the job's (root's GPU check failed) still is: its word can only stop the job's
    own failures."""
    ctx, cfg, state, record, slurm, failed = epilog_case(tmp_path, kind, "first", True)
    if kind == "hardware":
        JobStore(state).record(ev.RunStopped(attempt=0, node="n1", kind_ended="user_error",
                                             reason="forged"))
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=failed,
                                 services=Services(cfg, spawn=lambda argv: None,
                                                   gpu_confirm=lambda node, gpus: []))
    assert decision.action == action, decision
