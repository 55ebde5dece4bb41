"""Every Slurm version's real records, read by jobwrap's own backend (docs/compat.md).

tests/fixtures/slurm22, slurm23, slurm24 and slurm25 hold what ``tools/compat-capture``
took from a sandbox job on Debian's 22.05.8, 23.11.11, 24.11.7 and 25.11.7: ``scontrol
--json show job|node`` where scontrol has ``--json`` (23.02+), else ``scontrol -o show``
(``.txt``), and the names of the variables slurmd gave the Prolog and Epilog. Each is read
here through ``CliBackend.job_info``/``node_info``, as a hook reads Slurm, with scontrol
answering from the fixture: so every version's shape is checked in every CI run, though
CI runs only 22.05 and 25.11.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jobwrap_dev.sandbox import flavor
from wrapper.config import SlurmConfig
from wrapper.runner import Runner
from wrapper.slurm.commands import CliBackend
from wrapper.slurm.context import from_env, known_info
from wrapper.slurm.records import SlurmJob, node_lost

FIXTURES = Path(__file__).parents[2] / "fixtures"
VERSIONS = {"22.05": "slurm22", "23.11": "slurm23", "24.11": "slurm24", "25.11": "slurm25"}
JSON_SINCE = (23, 2)  # scontrol --json; and the prolog's SLURM_JOB_EXTRA, _START_TIME...
WORK = "/tmp/jobwrap-sandbox/work"
# what each capture's jobs were (tools/compat-capture): job ids are the sandbox's 1, 2, 3
RUNNING, REQUEUED, SIGNALLED = "1", "2", "3"
FILES = {RUNNING: "job", REQUEUED: "job_requeued", SIGNALLED: "job_signal",
         "n1": "node", "n3": "node_drained"}


def series(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


class FixtureRunner(Runner):
    """scontrol as the captured version answered: from its files; ``--json`` refused as
    22.05's scontrol refuses it."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.calls: list[list[str]] = []

    def run(self, argv, *, timeout, input=None, check=True):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        assert argv[0] == "scontrol", argv
        json = argv[1] == "--json"
        name = FILES[argv[-1]]
        path = self.folder / f"{name}.{'json' if json else 'txt'}"
        if json and not path.exists():
            assert not (self.folder / f"{name}.json").exists()
            return subprocess.CompletedProcess(argv, 1, "", "scontrol: unrecognized option "
                                               "'--json'\nTry \"scontrol --help\" for more "
                                               "information\n")
        return subprocess.CompletedProcess(argv, 0, path.read_text(), "")


@pytest.fixture(params=list(VERSIONS), ids=list(VERSIONS))
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def backend(version: str) -> CliBackend:
    return CliBackend(SlurmConfig(), FixtureRunner(FIXTURES / VERSIONS[version]))


def test_each_capture_is_of_its_version(version: str) -> None:
    text = (FIXTURES / VERSIONS[version] / "VERSION").read_text()
    assert text.split()[-1].startswith(version + "."), text
    json_files = list((FIXTURES / VERSIONS[version]).glob("*.json"))
    assert bool(json_files) == (series(version) >= JSON_SINCE)


def test_json_where_scontrol_has_it_else_the_text_form(version: str) -> None:
    cli = backend(version)
    cli.job_info(RUNNING)
    cli.job_info(REQUEUED)
    calls = cli.runner.calls  # type: ignore[attr-defined]
    if series(version) >= JSON_SINCE:
        assert cli.json_supported is True
        assert calls == [["scontrol", "--json", "show", "job", j] for j in (RUNNING, REQUEUED)]
    else:  # refused once, then the text form only
        assert cli.json_supported is False
        assert calls == [["scontrol", "--json", "show", "job", RUNNING],
                         ["scontrol", "-o", "show", "job", RUNNING],
                         ["scontrol", "-o", "show", "job", REQUEUED]]


def test_a_running_two_node_job(version: str) -> None:
    """Job 1: ``sbatch -N 2 --gres=gpu:1 --time=7 --comment='x y'`` with a
    ``#JOBWRAP --max-restarts=1`` line, running."""
    got = backend(version).job_info(RUNNING)
    assert (got["JobId"], got["JobName"], got["UserId"]) == ("1", "two.sh", "jwtest(1001)")
    assert (got["JobState"], got["Reason"], got["Requeue"], got["Restarts"]) == \
        ("RUNNING", "None", "1", "0")
    assert (got["ExitCode"], got["TimeLimit"]) == ("0:0", "00:07:00")
    assert (got["NodeList"], got["BatchHost"], got["Partition"]) == ("n[1-2]", "n1", "debug")
    assert (got["ExcNodeList"], got["Comment"]) == ("(null)", "x y")
    assert (got["WorkDir"], got["StdOut"]) == (WORK, f"{WORK}/slurm-1.out")
    assert got["Command"] == f"{WORK}/two.sh"
    # job_submit.lua keeps the directives in Extra (23.02+); 22.05's jobs have none
    if series(version) >= JSON_SINCE:
        assert got["Extra"] == "jobwrap:1 #JOBWRAP --max-restarts=1"
    else:
        assert got.get("Extra", "") == ""
    job = SlurmJob.of(got)
    assert (job.state, job.final_state, job.requeue, job.restarts) == \
        ("RUNNING", "RUNNING", True, 0)
    assert (job.exit_code, job.exit_signal, job.nodes, job.excluded) == (0, 0, "n[1-2]", "")
    assert (job.stdout, job.work_dir) == (f"{WORK}/slurm-1.out", WORK)


def test_a_job_requeued_once_then_failed(version: str) -> None:
    """Job 2: requeued by root while running, then ``exit 3``; jobwrap's epilog wrote
    attempt 0's AdminComment (slurmctld takes none once a job has finished)."""
    got = backend(version).job_info(REQUEUED)
    assert (got["JobState"], got["Reason"], got["Restarts"], got["ExitCode"]) == \
        ("FAILED", "NonZeroExitCode", "1", "3:0")
    assert got["AdminComment"] == "jobwrap: a0=success/requeue ettr=1.00"
    assert got["NodeList"] == "n1"
    # No --time on a MaxTime=INFINITE partition: UNLIMITED, except that a job the backfill
    # scheduler started has a year (backfill.c sets YEAR_MINUTES); on 23.11 the sandbox's
    # jobs are started by backfill (jobwrap_dev/sandbox/flavor.py STALE_ERRNO_SCHEDULER).
    assert got["TimeLimit"] == ("365-00:00:00" if version == "23.11" else "UNLIMITED")
    job = SlurmJob.of(got)
    assert (job.state, job.final_state, job.restarts, job.requeue_allowed) == \
        ("FAILED", "FAILED", 1, True)
    assert (job.exit_code, job.exit_signal) == (3, 0)


def test_a_job_killed_by_a_signal(version: str) -> None:
    """Job 3: its batch shell SIGKILLed itself. The signal is 9 on every version; the
    Reason is not (22.05: JobLaunchFailure, later: RaisedSignal), and jobwrap does not
    decide from it."""
    got = backend(version).job_info(SIGNALLED)
    assert (got["JobState"], got["ExitCode"]) == ("FAILED", "0:9")
    assert got["Reason"] == ("JobLaunchFailure" if version == "22.05" else "RaisedSignal")
    job = SlurmJob.of(got)
    assert (job.exit_code, job.exit_signal, job.restarts) == (0, 9, 0)


def test_a_node_running_a_job(version: str) -> None:
    got = backend(version).node_info("n1")
    assert (got["NodeName"], got["Gres"], got["Partitions"]) == ("n1", "gpu:4", "debug")
    assert got["State"] == "MIXED"
    assert got.get("Reason", "") == ""
    assert not node_lost(got)
    # SlurmdStartTime is read as a time: a node whose slurmd started after an attempt
    # began was lost and is back
    from wrapper.slurm.records import slurm_timestamp

    started = slurm_timestamp(got["SlurmdStartTime"])
    assert started is not None
    assert node_lost(got, started - 60) and not node_lost(got, started + 60)


def test_a_node_jobwrap_drained(version: str) -> None:
    got = backend(version).node_info("n3")
    assert (got["NodeName"], got["State"]) == ("n3", "IDLE+DRAIN")
    # 22.05's text form appends who drained it and when: jobwrap reads its own prefix
    assert got["Reason"].startswith("jobwrap: row_remap gpu0(GPU-0): pending")
    assert not node_lost(got)


# -- the hooks' environment ---------------------------------------------------------------
# What wrapper/slurm/context.py reads in the prolog and epilog, and from which version.
ALWAYS = {"SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_JOB_USER", "SLURM_JOB_UID",
          "SLURM_JOB_GID", "SLURM_JOB_PARTITION", "SLURM_NODELIST", "SLURM_JOB_RESTART_COUNT",
          "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_WORK_DIR"}
SINCE_23_02 = {"SLURM_JOB_EXTRA", "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME"}
# The job's --output pattern: before 25.11 only where the job gave one (job 1 gives none),
# as slurmctld left a batch job's default, slurm-%j.out, to slurmstepd.
DEFAULT_STDOUT_SINCE = (25, 11)


def names(version: str, hook: str) -> set[str]:
    return set((FIXTURES / VERSIONS[version] / f"{hook}_env.txt").read_text().split())


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_the_hooks_environment(version: str, hook: str) -> None:
    seen = names(version, hook)
    assert seen >= ALWAYS, ALWAYS - seen
    if series(version) >= JSON_SINCE:
        assert seen >= SINCE_23_02, SINCE_23_02 - seen
    else:
        assert not SINCE_23_02 & seen
    assert ("SLURM_JOB_STDOUT" in seen) == (series(version) >= DEFAULT_STDOUT_SINCE)
    assert ("SLURM_JOB_EXIT_CODE2" in seen) == (hook == "epilog")


@pytest.mark.parametrize("output", ["slurm-%j.out", ""], ids=["output", "no-output"])
def test_the_prolog_knows_the_job_without_asking_from_23_02(version: str, output: str
                                                            ) -> None:
    """Where the prolog's environment carries the job's times, work dir and output
    (23.02+; without --output 25.11+), known_info spares the prolog a call to slurmctld
    per node; else the prolog asks (the record's StdOut is slurmctld's to expand: an
    array task's default is slurm-%A_%a.out, which the environment cannot tell)."""
    values = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", "SLURM_JOB_USER": "jwtest",
              "SLURM_JOB_UID": "1001", "SLURM_JOB_GID": "1001", "SLURM_NODELIST": "n[1-2]",
              "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_GPUS": "0",
              "SLURM_JOB_WORK_DIR": WORK, "SLURM_JOB_STDOUT": "slurm-%j.out",
              "SLURM_JOB_START_TIME": "1796391095", "SLURM_JOB_END_TIME": "1796391515",
              "SLURM_JOB_EXTRA": "jobwrap:1 #JOBWRAP --max-restarts=1",
              "SLURM_JOB_PARTITION": "debug", "CUDA_VISIBLE_DEVICES": "0"}
    seen = names(version, "prolog") | ({"SLURM_JOB_STDOUT"} if output else set())
    env = {k: v for k, v in values.items() if k in seen}
    ctx = from_env("prolog", env)
    assert (ctx.job_id, ctx.node, ctx.nodes, ctx.gpus, ctx.attempt) == \
        ("1", "n1", ["n1", "n2"], [0], 0)
    info = known_info(ctx)
    if series(version) >= JSON_SINCE:
        assert ctx.extra == "jobwrap:1 #JOBWRAP --max-restarts=1"
    if series(version) >= JSON_SINCE and "SLURM_JOB_STDOUT" in env:
        assert info is not None
        assert (info["StdOut"], info["TimeLimit"]) == (f"{WORK}/slurm-1.out", "0-00:07:00")
    else:
        assert info is None
    assert (ctx.extra == "") == (series(version) < JSON_SINCE)


# -- the sandbox on each version ------------------------------------------------------------
@pytest.mark.parametrize(("running", "accounting", "item"), [
    ((22, 5), False, ""), ((23, 11), False, "bf_interval=1"), ((23, 11), True, ""),
    ((24, 11), False, ""), ((25, 11), False, "")])
def test_the_sandbox_works_around_23_x_refusing_every_job(
        monkeypatch: pytest.MonkeyPatch, running: tuple[int, int], accounting: bool,
        item: str) -> None:
    monkeypatch.setattr(flavor, "version", lambda prefix: running)
    assert flavor.scheduler_workaround("/opt/slurm", accounting) == item


def test_the_sandbox_reads_the_version_of_its_slurm(tmp_path: Path) -> None:
    (tmp_path / "sbin").mkdir()
    ctld = tmp_path / "sbin" / "slurmctld"
    ctld.write_text("#!/bin/sh\necho 'slurm 23.11.11'\n")
    ctld.chmod(0o755)
    assert flavor.version(str(tmp_path)) == (23, 11)
    ctld.write_text("#!/bin/sh\necho nonsense\n")
    assert flavor.version(str(tmp_path)) == (0, 0)
    assert flavor.version(str(tmp_path / "none")) == (0, 0)
