from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from wrapper import slurm
from wrapper.config import SlurmConfig
from wrapper.errors import SlurmError
from wrapper.runner import Runner
from wrapper.slurm.commands import CliBackend, drain_reason


class RecordingRunner(Runner):
    """A real runner that first records argv; scontrol is replaced by echo, which exists."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def run(self, argv, *, timeout, input=None, check=True):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        return super().run(["echo", "slurm 22.05.8"], timeout=timeout)


def test_drain_reason_is_prefixed_and_one_line() -> None:
    assert drain_reason("ecc on gpu 1\nmore") == "jobwrap: ecc on gpu 1 more"
    assert drain_reason("jobwrap: xid 79 on gpu 0") == "jobwrap: xid 79 on gpu 0"


def test_commands_sent_to_scontrol() -> None:
    runner = RecordingRunner()
    cli = CliBackend(SlurmConfig(scontrol_command="/opt/slurm/bin/scontrol"), runner)
    assert cli.drain_node("n2", "ecc on gpu 1") == "jobwrap: ecc on gpu 1"
    cli.resume_node("n2")
    cli.requeue("12", eligible_now=True)
    cli.requeue("13", hold=True)
    assert runner.calls == [
        ["/opt/slurm/bin/scontrol", "update", "NodeName=n2", "State=DRAIN",
         "Reason=jobwrap: ecc on gpu 1"],
        ["/opt/slurm/bin/scontrol", "update", "NodeName=n2", "State=RESUME"],
        ["squeue", "-h", "-r", "-t", "all", "-j", "12", "-o", "%A %F %K"],  # an array task?
        ["/opt/slurm/bin/scontrol", "requeue", "12"],
        ["/opt/slurm/bin/scontrol", "update", "JobId=12", "StartTime=now"],
        ["squeue", "-h", "-r", "-t", "all", "-j", "13", "-o", "%A %F %K"],
        ["/opt/slurm/bin/scontrol", "requeuehold", "13"],
    ]


class ArrayRunner(Runner):
    """squeue answers as for array 40 (tasks 40_0 .. 40_2: numeric ids 40, 41, 42) and a
    plain job 50; every other command is recorded and succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def run(self, argv, *, timeout, input=None, check=True, cwd=None):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        if argv[0] == "false":
            return super().run(["false"], timeout=timeout)
        if argv[0] == "squeue":
            job = argv[argv.index("-j") + 1]
            text = {"40": "40 40 0\n41 40 1\n42 40 2\n", "41": "41 40 1\n",
                    "50": "50 50 N/A\n"}.get(job, "")
            return super().run(["printf", text], timeout=timeout)
        return super().run(["true"], timeout=timeout)


@pytest.mark.parametrize(("job", "named"), [("40", "40_0"), ("41", "41"), ("50", "50")])
def test_an_action_on_an_array_task_names_that_task_alone(job: str, named: str) -> None:
    """The array's first task has the array's own number as its JobId, which scancel and
    scontrol read as every task: ending, requeueing or releasing it names it as A_T."""
    runner = ArrayRunner()
    cli = CliBackend(SlurmConfig(), runner)
    cli.signal_job(job, "KILL", full=True)
    cli.requeue(job, eligible_now=True)
    cli.release_now(job)
    cli.shrink_job(job, ["n1"])
    acted = [c for c in runner.calls if c[0] != "squeue"]
    assert acted == [
        ["scancel", "--full", "--signal=KILL", named],
        ["scontrol", "requeue", named],
        ["scontrol", "update", f"JobId={named}", "StartTime=now"],
        ["scontrol", "update", f"JobId={named}", "StartTime=now"],
        ["scontrol", "update", f"JobId={named}", "NodeList=n1"],
    ]
    assert sum(c[0] == "squeue" for c in runner.calls) == 1  # asked once per backend


@pytest.mark.parametrize("bad", ["n1 State=RESUME", "n1;reboot", "../x", ""])
def test_hostile_node_names_never_reach_scontrol(bad: str) -> None:
    runner = RecordingRunner()
    with pytest.raises(SlurmError, match="not a Slurm node name"):
        CliBackend(SlurmConfig(), runner).drain_node(bad, "x")
    assert runner.calls == []


def test_failed_command_is_a_slurm_error_naming_it() -> None:
    cli = CliBackend(SlurmConfig(scontrol_command="false", squeue_command="true"))
    with pytest.raises(SlurmError, match="'false requeue 5' failed with exit code 1"):
        cli.requeue("5")


def test_an_admin_comment_falls_back_to_sacctmgr_once_the_job_has_finished(
        tmp_path: Path) -> None:
    """slurmctld refuses the AdminComment of a finished job: the database takes it, through
    the sacctmgr beside the configured scontrol; both refusing is one SlurmError."""
    for name in ("scontrol", "sacctmgr"):
        (tmp_path / name).symlink_to("/bin/false")
    runner = RecordingCalls()
    cli = CliBackend(SlurmConfig(scontrol_command=str(tmp_path / "scontrol"),
                                 squeue_command="true"), runner)
    with pytest.raises(SlurmError, match=r"scontrol update.*; and then .*sacctmgr -i modify"):
        cli.set_admin_comment("12", "jobwrap: a0=hang/stop ettr=0.50")
    assert runner.calls == [
        ["true", "-h", "-r", "-t", "all", "-j", "12", "-o", "%A %F %K"],  # an array's?
        [str(tmp_path / "scontrol"), "update", "JobId=12",
         "AdminComment=jobwrap: a0=hang/stop ettr=0.50"],
        [str(tmp_path / "sacctmgr"), "-i", "modify", "job", "where", "jobid=12", "set",
         "AdminComment=jobwrap: a0=hang/stop ettr=0.50"]]
    with pytest.raises(SlurmError, match="not a Slurm job id"):
        cli.set_admin_comment("12 AdminComment=x", "y")
    assert len(runner.calls) == 3


class RecordingCalls(Runner):
    """A real runner that records argv and runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def run(self, argv, *, timeout, input=None, check=True, cwd=None):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        return super().run(argv, timeout=timeout, input=input, check=check, cwd=cwd)


def test_cli_backend_when_asked() -> None:
    assert slurm.backend(SlurmConfig(backend="cli")).name == "cli"


def test_pyslurm_that_does_not_match_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pyslurm")
    fake.__version__ = "25.11.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    runner = RecordingRunner()  # scontrol --version answers 22.05.8
    assert slurm.backend(SlurmConfig(backend="auto"), runner).name == "cli"
    with pytest.raises(SlurmError, match=r"pyslurm 25\.11\.0 does not match Slurm 22\.05\.8"):
        slurm.backend(SlurmConfig(backend="pyslurm"), runner)


def test_pyslurm_that_matches_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pyslurm")
    fake.__version__ = "22.05.1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    assert slurm.backend(SlurmConfig(backend="auto"), RecordingRunner()).name == "pyslurm"


def test_missing_pyslurm_costs_no_scontrol_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    runner = RecordingRunner()
    assert slurm.backend(SlurmConfig(backend="auto"), runner).name == "cli"
    assert runner.calls == []


class CannedRunner(Runner):
    """Records argv and the folder it ran in; answers with ``outputs[verb]``."""

    def __init__(self, outputs: dict[str, str]) -> None:
        super().__init__()
        self.outputs = outputs
        self.calls: list[tuple[list[str], str | None]] = []

    def run(self, argv, *, timeout, input=None, check=True, cwd=None):  # type: ignore[no-untyped-def]
        self.calls.append((list(argv), cwd))
        verb = next((v for v in self.outputs if v in argv), "")
        return super().run(["printf", "%s", self.outputs.get(verb, "")], timeout=timeout)


def test_many_nodes_are_read_in_one_call() -> None:
    import json

    doc = {"nodes": [{"name": n, "state": ["IDLE", "DRAIN"] if n == "n2" else ["MIXED"],
                      "reason": "jobwrap: xid" if n == "n2" else ""} for n in ("n1", "n2")]}
    runner = CannedRunner({"show": json.dumps(doc)})
    cli = CliBackend(SlurmConfig(scontrol_command="scontrol"), runner)
    found = cli.nodes_info(["n1", "n2", "n3"])
    assert [c[0] for c in runner.calls] == [["scontrol", "--json", "show", "node", "n1,n2,n3"]]
    assert found["n2"]["State"] == "IDLE+DRAIN" and found["n2"]["Reason"] == "jobwrap: xid"
    assert set(found) == {"n1", "n2"}  # n3 unknown to Slurm: absent
    assert cli.nodes_info([]) == {}
    with pytest.raises(SlurmError, match="not a Slurm node name"):
        cli.nodes_info(["n1", "n1;reboot"])


def test_a_shrink_runs_in_a_folder_of_its_own_and_steps_are_killed_by_id() -> None:
    import os

    runner = CannedRunner({"-s": "12 12.0\n12 12.1\n12 12.batch\n12 12.extern\n"})
    cli = CliBackend(SlurmConfig(scontrol_command="scontrol", scancel_command="scancel",
                                 squeue_command="squeue"), runner)
    cli.shrink_job("12", ["n1", "n3"])
    argv, cwd = runner.calls[-1]
    assert argv == ["scontrol", "update", "JobId=12", "NodeList=n1,n3"]
    assert cwd is not None and not os.path.exists(cwd)  # removed, resize scripts and all
    assert cli.kill_steps("12") == ["12.0", "12.1"]  # never the batch script: the job goes on
    assert runner.calls[-1][0] == ["scancel", "--signal=KILL", "12.0", "12.1"]


def test_an_array_tasks_steps_are_its_own_never_its_siblings() -> None:
    """squeue prints an array task's steps as ARRAY_TASK.STEP, and ``-j`` of the array's
    own id (which its last task keeps) lists every task's: a task kills its steps alone,
    by its numeric id."""
    listing = ("100  100_1.0\n100  100_1.batch\n101  100_0.0\n101  100_0.1\n"
               "100  100_1.extern\n100  100_1.interactive\n")
    runner = CannedRunner({"-s": listing})
    cli = CliBackend(SlurmConfig(scancel_command="scancel", squeue_command="squeue"), runner)
    assert cli.kill_steps("100") == ["100.0"]
    assert runner.calls[-2][0] == ["squeue", "-h", "-s", "-j", "100", "-O",
                                   "JobId:24,StepId:80"]
    assert runner.calls[-1][0] == ["scancel", "--signal=KILL", "100.0"]
    assert cli.kill_steps("101") == ["101.0", "101.1"]
    assert cli.job_steps("102") == []


def test_a_squeue_that_does_not_answer_is_a_slurm_error(tmp_path: Path) -> None:
    # squeue retries a slurmctld that is down (a restart) for longer than command_timeout:
    # its timeout is "Slurm did not answer", like every other failed Slurm command, never
    # a CommandTimeout that a caller of the backend need not expect
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\nsleep 30\n")
    squeue.chmod(0o755)
    cli = CliBackend(SlurmConfig(squeue_command=str(squeue), command_timeout=0.3))
    with pytest.raises(SlurmError, match=r"timed out after 0\.3 s"):
        cli.job_state("7")
    missing = CliBackend(SlurmConfig(squeue_command=str(tmp_path / "none")))
    with pytest.raises(SlurmError, match="was not found"):
        missing.job_state("7")


def test_the_job_state_and_its_time_limit_come_in_one_squeue_call() -> None:
    runner = CannedRunner({"%T %l": "RUNNING 1-02:00:00\n"})
    cli = CliBackend(SlurmConfig(squeue_command="squeue"), runner)
    assert cli.job_state_and_limit("12") == ("RUNNING", "1-02:00:00")
    assert [c[0] for c in runner.calls] == [["squeue", "-h", "-j", "12", "-o", "%T %l"]]


def test_the_array_task_holding_the_arrays_own_id_is_read_alone() -> None:
    """Slurm before 23.02 (text records): ``scontrol show job A`` prints every task of
    array A, and a task's comment may hold a line that looks like a record of A. The task
    whose numeric id is A is read again alone, as ``A_T``, T from squeue's numbers."""

    def rec(job: str, task: str, state: str, comment: str = "x") -> str:
        return (f"JobId={job} ArrayJobId=460 ArrayTaskId={task} JobName=a UserId=u(1) "
                f"JobState={state} Restarts=0 NodeList=n1 Command=/w/a.sh WorkDir=/w "
                f"Comment={comment} StdErr=/w/o StdIn=/dev/null StdOut=/w/o Power=")

    forged = "\n" + rec("460", "9", "NODE_FAIL")
    listing = "\n".join([rec("461", "0", "RUNNING", "y" + forged), rec("460", "1", "RUNNING")])
    runner = CannedRunner({"%A %K": "461 0\n460 1\n", "460_1": rec("460", "1", "RUNNING"),
                           "460": listing + "\n"})
    cli = CliBackend(SlurmConfig(scontrol_command="scontrol", squeue_command="squeue"), runner)
    cli.json_supported = False
    got = cli.job_info("460")
    assert (got["JobId"], got["ArrayTaskId"], got["JobState"]) == ("460", "1", "RUNNING")
    assert [c[0][-1] for c in runner.calls] == ["460", "%A %K", "460_1"]
    # acting on it names that task alone, from the record read: squeue is not asked again
    cli.requeue("460")
    assert runner.calls[-1][0] == ["scontrol", "requeue", "460_1"] and len(runner.calls) == 4
    # a task's own numeric id prints that task alone: read as it is, nothing more asked
    runner = CannedRunner({"461": rec("461", "0", "RUNNING") + "\n"})
    cli = CliBackend(SlurmConfig(scontrol_command="scontrol"), runner)
    cli.json_supported = False
    assert cli.job_info("461")["ArrayTaskId"] == "0" and len(runner.calls) == 1
    cli.signal_job("461", "TERM")
    assert runner.calls[-1][0] == ["scancel", "--signal=TERM", "461"] and len(runner.calls) == 2
    # no one running task holds the array's id (a pending remainder, A_[2-5]): an error
    runner = CannedRunner({"%A %K": "461 0\n460 2-5\n", "460": listing})
    cli = CliBackend(SlurmConfig(scontrol_command="scontrol"), runner)
    cli.json_supported = False
    with pytest.raises(SlurmError, match="not one running task"):
        cli.job_info("460")


def test_accountings_attempts_are_read_by_the_jobs_own_id() -> None:
    """sacct --duplicates: one line an attempt, oldest first; a state with words after it
    (``CANCELLED by 0``) is its first word; the running attempt has no end yet."""
    from wrapper.slurm.records import slurm_timestamp

    out = ("77|REQUEUED|2026-12-05T10:00:00\n77|NODE_FAIL|2026-12-05T10:05:00\n"
           "77|CANCELLED by 0|2026-12-05T10:06:00\n770|NODE_FAIL|2026-12-05T10:07:00\n"
           "77|RUNNING|Unknown\n")
    runner = CannedRunner({"sacct": out})
    cli = CliBackend(SlurmConfig(scontrol_command="/opt/slurm/bin/scontrol"), runner)
    assert cli.ended_attempts("77") == [
        ("REQUEUED", slurm_timestamp("2026-12-05T10:00:00")),
        ("NODE_FAIL", slurm_timestamp("2026-12-05T10:05:00")),
        ("CANCELLED", slurm_timestamp("2026-12-05T10:06:00")), ("RUNNING", None)]
    assert runner.calls[-1][0] == ["sacct", "-n", "-P", "-X", "-D", "-j", "77", "-o",
                                   "JobIDRaw,State,End"]


def test_an_accounting_ask_has_at_most_the_time_its_caller_has_left() -> None:
    """The epilog's poll of sacct passes what is left of its budget: sacct is given no
    more, and never more than ``command_timeout``."""

    class TimedRunner(CannedRunner):
        def __init__(self, outputs: dict[str, str]) -> None:
            super().__init__(outputs)
            self.timeouts: list[float] = []

        def run(self, argv, *, timeout, input=None, check=True, cwd=None):  # type: ignore[no-untyped-def]
            self.timeouts.append(timeout)
            return super().run(argv, timeout=timeout, input=input, check=check, cwd=cwd)

    runner = TimedRunner({"sacct": "77|NODE_FAIL|2026-12-05T10:05:00\n"})
    cli = CliBackend(SlurmConfig(command_timeout=10.0), runner)
    cli.ended_attempts("77", timeout=1.5)
    cli.ended_attempts("77", timeout=60.0)
    cli.ended_attempts("77")
    assert runner.timeouts == [1.5, 10.0, 10.0]


def test_a_job_squeue_cannot_place_is_not_acted_on_as_a_bare_array_id() -> None:
    """Without squeue's word the id might be an array's, every task of it: no act at all,
    one SlurmError saying why (the caller logs it and tries again later)."""
    runner = ArrayRunner()
    cli = CliBackend(SlurmConfig(squeue_command="false"), runner)
    with pytest.raises(SlurmError, match="cannot tell whether it is an array's task"):
        cli.signal_job("40", "KILL", full=True)
    assert [c for c in runner.calls if c[0] == "scancel"] == []


@pytest.mark.parametrize(("excluded", "asked", "nodes", "total", "kept"), [
    ("(null)", ["n2"], "2", "3", ["n2"]),  # room for one: taken
    ("n2", ["n1"], "2", "3", ["n2"]),  # n1 too would leave one node for a 2-node job
    ("(null)", ["n1", "n2"], "1-2", "3", ["n1", "n2"]),  # the fewest it asks: 1
    ("(null)", ["n1", "n2", "n3"], "1", "3", ["n1", "n2"]),
])
def test_an_exclusion_never_leaves_a_job_unable_to_run(excluded: str, asked: list[str],
                                                       nodes: str, total: str,
                                                       kept: list[str]) -> None:
    runner = CannedRunner({"partition": f"PartitionName=debug TotalNodes={total} "
                                        "TotalCPUs=6 Nodes=n[1-3]"})
    cli = CliBackend(SlurmConfig(scontrol_command="scontrol"), runner)
    cli.job_info = lambda job: {"Partition": "debug", "NumNodes": nodes,  # type: ignore[method-assign]
                                "ExcNodeList": excluded}
    assert cli.exclude_nodes("7", asked) == kept
    updates = [c[0] for c in runner.calls if "update" in c[0]]
    have = [] if excluded == "(null)" else [excluded]
    assert updates == ([["scontrol", "update", "JobId=7", f"ExcNodeList={','.join(kept)}"]]
                       if kept != have else [])
