"""The default Slurm backend: Slurm's own commands, through the runner, with timeouts.

What this node's Slurm said is kept in root's node state (``<state_dir>/nodes/``, written
by ``write_node_file``): each file has a ``format`` (``NODE_FORMAT``, docs/upgrades.md),
and one a newer jobwrap wrote is a miss (``read_node_file``: None), asked again and
written over, never an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from wrapper.config import SlurmConfig
from wrapper.errors import CommandError, FormatTooNew, SlurmError, format_of
from wrapper.runner import Runner
from wrapper.slurm.parse import check_job_id as _job_id
from wrapper.slurm.parse import check_node as _node
from wrapper.slurm.parse import expand_hostlist, parse_record
from wrapper.slurm.records import (
    AmbiguousJobName,
    from_json_job,
    from_json_node,
    parse_job_text,
    record_head,
)

DRAIN_PREFIX = "jobwrap:"
# a node drained for being slow (wrapper/archive/slow.py): only an admin resumes it
SLOW_DRAIN_PREFIX = "jobwrap: slow:"
NODE_FORMAT = 1  # the "format" of the files in <state_dir>/nodes
ABILITIES = "scontrol.json"  # in <state_dir>/nodes: what this node's scontrol can do


def node_file(state_dir: str, name: str) -> Path:
    """``<state_dir>/nodes/NAME``: a file of root's node state."""
    return Path(state_dir) / "nodes" / name


def read_node_file(path: Path) -> dict[str, Any] | None:
    """A node state file's content; None when it is absent, unreadable or of a newer
    jobwrap's format (a miss: the caller asks again)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            return None
        format_of(data, "format", known=NODE_FORMAT, path=path, what="node cache")
    except (OSError, ValueError, FormatTooNew):
        return None
    return data


def write_node_file(path: Path, data: dict[str, Any]) -> None:
    """Replace a node state file at once (``NODE_FORMAT`` added); OSError if it cannot."""
    from wrapper.osl.files import atomic_write

    path.parent.mkdir(mode=0o755, exist_ok=True)
    atomic_write(path, json.dumps({"format": NODE_FORMAT, **data}).encode(), mode=0o644)


def drain_reason(reason: str) -> str:
    """Slurm keeps one line of reason; ours always start with the jobwrap: prefix."""
    text = " ".join(reason.split())
    if not text.startswith(DRAIN_PREFIX):
        text = f"{DRAIN_PREFIX} {text}"
    return text


class CliBackend:
    """Speaks to Slurm through scontrol/sinfo/squeue. Every call has a timeout."""

    name = "cli"

    def __init__(self, config: SlurmConfig, runner: Runner | None = None) -> None:
        self.config = config
        self.runner = runner or Runner()
        self.json_supported: bool | None = None  # found out on the first record read
        self._own_ids: dict[str, str] = {}

    def _this_job(self, job_id: str) -> str:
        """The id that names this job alone in scancel and ``scontrol update/requeue``.

        The first task of an array has the array's own id as its numeric JobId, and Slurm
        reads that id, bare, as every task of the array: the task is named ``A_T`` then
        (its task id from squeue's numeric columns, asked once). Any other job, and one
        squeue cannot tell about, keeps its id."""
        job = _job_id(job_id)
        if job in self._own_ids:
            return self._own_ids[job]
        argv = [self.config.squeue_command, "-h", "-r", "-t", "all", "-j", job, "-o",
                "%A %F %K"]
        try:
            out = self.runner.run(argv, timeout=self.config.command_timeout).stdout
        except CommandError as exc:  # not knowing, acting on every task is worse: no act
            raise SlurmError(f"job {job}: cannot tell whether it is an array's task "
                             f"({exc})") from None
        tasks = {words[2] for words in (ln.split() for ln in out.splitlines())
                 if len(words) == 3 and words[0] == words[1] == job and words[2].isdigit()}
        own = f"{job}_{tasks.pop()}" if len(tasks) == 1 else job
        if out.strip():  # squeue knew the job: its answer holds for the job's life
            self._own_ids[job] = own
        return own

    def recall_abilities(self, state_dir: str) -> None:
        """Spare the prolog a failing ``scontrol --json`` per job where this scontrol has
        none.

        Slurm before 23.02 answers ``--json`` with an error: found once, kept in root's
        node state with the binary's identity, so an upgraded scontrol is asked again.
        """
        if self.json_supported is not None:
            return
        data = read_node_file(node_file(state_dir, ABILITIES))
        if data is not None and data.get("json") is False and \
                data.get("scontrol") == self._identity():
            self.json_supported = False

    def remember_abilities(self, state_dir: str) -> None:
        """Keep what this backend found out about ``scontrol --json`` (recall_abilities);
        a node state that cannot be written is logged, never an error."""
        if self.json_supported is not False:
            return
        path = node_file(state_dir, ABILITIES)
        facts = {"json": False, "scontrol": self._identity()}
        if read_node_file(path) == {"format": NODE_FORMAT, **facts}:
            return
        try:
            write_node_file(path, facts)
        except OSError as exc:
            from wrapper import log

            log.get().warning("health.scontrol_facts_unwritable", error=str(exc))

    def _identity(self) -> list[int | str] | None:
        """The scontrol this backend runs, as (path, inode, size, mtime): changes on an
        upgrade."""
        name = self.config.scontrol_command
        # shutil.which's own walk, without importing shutil (and bz2, lzma) on every prolog
        for folder in ([""] if os.sep in name else os.get_exec_path()):
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not os.path.isdir(path) and os.access(path, os.X_OK):
                return [path, st.st_ino, st.st_size, st.st_mtime_ns]
        return None

    def _scontrol(self, *args: str, input: str | None = None) -> str:
        argv = [self.config.scontrol_command, *args]
        try:
            return self.runner.run(argv, timeout=self.config.command_timeout, input=input).stdout
        except CommandError as exc:
            raise SlurmError(str(exc)) from None

    def version(self) -> str:
        """Slurm's version, e.g. ``22.05.8``."""
        out = self._scontrol("--version").strip()
        return out.split()[-1] if out else ""

    def batch_script(self, job_id: str) -> str:
        """The job's batch script (root or the job's owner only)."""
        return self._scontrol("write", "batch_script", _job_id(job_id), "-")

    def _json(self, *args: str) -> dict[str, object] | None:
        """``scontrol --json ARGS`` parsed, or None where this scontrol has no --json."""
        if self.json_supported is False:
            return None
        argv = [self.config.scontrol_command, "--json", *args]
        try:
            res = self.runner.run(argv, timeout=self.config.command_timeout, check=False)
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        if res.returncode != 0 and "unrecognized option" in res.stderr:
            self.json_supported = False  # Slurm before 23.02: read the text form
            return None
        if res.returncode != 0:
            raise SlurmError(f"command {' '.join(argv)!r} failed: {res.stderr.strip()}")
        self.json_supported = True
        try:
            data = json.loads(res.stdout)
        except ValueError as exc:
            raise SlurmError(f"{' '.join(argv)!r} printed no JSON ({exc})") from None
        if not isinstance(data, dict):
            raise SlurmError(f"{' '.join(argv)!r} printed no JSON object")
        return data

    def job_info(self, job_id: str) -> dict[str, str]:
        """Slurm's record of a job, as the fields ``scontrol show job`` prints.

        Read structured (``--json``) where scontrol can, else from the text form by
        records.parse_job_text, in which text a user wrote never becomes a field.
        """
        job = _job_id(job_id)
        data = self._json("show", "job", job)
        if data is not None:
            return self._learn_own_id(job, from_json_job(data, job))
        out = self._scontrol("-o", "show", "job", job)
        if not out.strip():
            raise SlurmError(f"scontrol show job {job_id} printed nothing")
        if record_head(out).get("ArrayJobId") == job:
            out = self._array_task_text(job)
        try:
            return self._learn_own_id(job, parse_job_text(out))
        except AmbiguousJobName:
            return self._learn_own_id(job, parse_job_text(out, name=self._job_name(job)))

    def _learn_own_id(self, job: str, fields: dict[str, str]) -> dict[str, str]:
        """The record says whether ``job`` is the array task holding the array's own id
        (``_this_job`` then asks squeue nothing)."""
        task = fields.get("ArrayTaskId", "")
        if fields.get("JobId") == job:
            self._own_ids[job] = f"{job}_{task}" if fields.get("ArrayJobId") == job \
                and task.isdigit() else job
        return fields

    def _array_task_text(self, job: str) -> str:
        """The one record of the array task whose numeric id is the array's own.

        ``scontrol show job A`` prints every task of array A, one record a line, and a
        user's text may hold newlines that look like records: the task is read again
        alone as ``A_T``, its task id ``T`` from squeue's numeric columns."""
        argv = [self.config.squeue_command, "-h", "-r", "-t", "all", "-j", job, "-o", "%A %K"]
        try:
            out = self.runner.run(argv, timeout=self.config.command_timeout).stdout
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        tasks = {t for a, _, t in (ln.strip().partition(" ") for ln in out.splitlines())
                 if a == job and t.isdigit()}
        if len(tasks) != 1:
            raise SlurmError(f"job {job}: the array task holding the array's own id is not "
                             f"one running task ({', '.join(sorted(tasks)) or 'none'} "
                             "found); not reading it")
        text = self._scontrol("-o", "show", "job", f"{job}_{tasks.pop()}")
        if not text.strip():
            raise SlurmError(f"scontrol show job {job} printed nothing")
        return text

    def _job_name(self, job_id: str) -> str:
        """The job's name alone (squeue prints nothing else), to split a record whose name
        holds ``UserId=``."""
        argv = [self.config.squeue_command, "-h", "-t", "all", "-j", job_id, "-o", "%j"]
        try:
            out = self.runner.run(argv, timeout=self.config.command_timeout).stdout
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        return out[:-1] if out.endswith("\n") else out

    def node_info(self, node: str) -> dict[str, str]:
        name = _node(node)
        data = self._json("show", "node", name)
        if data is not None:
            return from_json_node(data)
        out = self._scontrol("-o", "show", "node", name)
        line = next((ln for ln in out.splitlines() if ln.strip()), "")
        if not line:
            raise SlurmError(f"scontrol show node {node} printed nothing")
        return parse_record(line)

    def nodes_info(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        """Slurm's records of ``nodes`` in one call (``scontrol show node n1,n2,...``), by
        name; a node Slurm does not know is absent. A 1,000-node job's faults are read
        with one request to slurmctld, not a thousand."""
        if not nodes:
            return {}
        names = ",".join(_node(n) for n in nodes)
        data = self._json("show", "node", names)
        if data is not None:
            listed = data.get("nodes")
            records = [from_json_node({"nodes": [n]}) for n in listed or []
                       if isinstance(n, dict)] if isinstance(listed, list) else []
        else:
            out = self._scontrol("-o", "show", "node", names)
            records = [parse_record(ln) for ln in out.splitlines() if ln.strip()]
        return {r["NodeName"]: r for r in records if r.get("NodeName") in nodes}

    def job_state(self, job_id: str) -> str:
        """The job's state from squeue (cheap), or "" once Slurm no longer lists it."""
        argv = [self.config.squeue_command, "-h", "-j", _job_id(job_id), "-o", "%T"]
        try:  # squeue retries a slurmctld that is down (restarting) past command_timeout
            res = self.runner.run(argv, timeout=self.config.command_timeout, check=False)
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return ""
            raise SlurmError(f"command {' '.join(argv)!r} failed: {res.stderr.strip()}")
        return res.stdout.strip().split("\n")[0].strip()

    def job_state_and_limit(self, job_id: str) -> tuple[str, str]:
        """The job's state and its time limit now, as squeue prints them (``RUNNING``,
        ``1:00:00``), in the one request :meth:`job_state` makes; ``("", "")`` once Slurm
        no longer lists it. The limit is the job's current one: ``scontrol update
        JobId= TimeLimit=`` moves it while the job runs."""
        argv = [self.config.squeue_command, "-h", "-j", _job_id(job_id), "-o", "%T %l"]
        try:
            res = self.runner.run(argv, timeout=self.config.command_timeout, check=False)
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return "", ""
            raise SlurmError(f"command {' '.join(argv)!r} failed: {res.stderr.strip()}")
        state, _, limit = res.stdout.strip().split("\n")[0].strip().partition(" ")
        return state, limit.strip()

    def job_steps(self, job_id: str) -> list[str]:
        """The job's running steps as ``JOB.STEP`` of its own numeric id (``123.0``),
        without its batch and extern steps.

        squeue prints an array task's steps as ``ARRAY_TASK.STEP`` (``100_3.0``), and
        ``-j`` of an array's own id (which one of its tasks keeps) lists every task's
        steps: each step is kept by the numeric job id squeue gives it (``JobId``), so
        one task never sees, or kills, its siblings' steps.
        """
        job = _job_id(job_id)
        argv = [self.config.squeue_command, "-h", "-s", "-j", job, "-O", "JobId:24,StepId:80"]
        try:
            out = self.runner.run(argv, timeout=self.config.command_timeout).stdout
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        steps = []
        for line in out.splitlines():
            fields = line.split()
            if len(fields) != 2 or fields[0] != job:
                continue
            step = fields[1].rpartition(".")[2]
            if step.isdigit():  # not batch, extern, interactive
                steps.append(f"{job}.{step}")
        return steps

    def signal_job(self, job_id: str, signal: str, *, full: bool = False) -> None:
        """Send a signal to the job's steps (``full``: to the batch script too)."""
        argv = [self.config.scancel_command, f"--signal={signal}", self._this_job(job_id)]
        if full:
            argv.insert(1, "--full")
        try:
            self.runner.run(argv, timeout=self.config.command_timeout)
        except CommandError as exc:
            raise SlurmError(str(exc)) from None

    def kill_steps(self, job_id: str) -> list[str]:
        """SIGKILL the job's steps, not its batch script (``scancel --signal=KILL JOB``
        would end the whole job); returns the steps signalled."""
        steps = self.job_steps(job_id)
        if steps:
            try:
                self.runner.run([self.config.scancel_command, "--signal=KILL", *steps],
                                timeout=self.config.command_timeout)
            except CommandError as exc:
                raise SlurmError(str(exc)) from None
        return steps

    def cancel_step(self, job_id: str, step: str) -> None:
        """End one step of the job, every task of it (``scancel JOB.STEP``): tasks not yet
        started never start. The job and its batch script go on."""
        if not step.isdigit():
            raise SlurmError(f"step {step!r} of job {job_id} is not a numbered step")
        try:
            self.runner.run([self.config.scancel_command, f"{_job_id(job_id)}.{step}"],
                            timeout=self.config.command_timeout)
        except CommandError as exc:
            raise SlurmError(str(exc)) from None

    def release_now(self, job_id: str, exclude: list[str] | None = None) -> None:
        """Make a pending (requeued) job eligible at once, away from ``exclude``."""
        job = self._this_job(job_id)
        if exclude:
            self.exclude_nodes(job_id, exclude)
        self._scontrol("update", f"JobId={job}", "StartTime=now")

    def drain_node(self, node: str, reason: str) -> str:
        """Drain a node; running jobs finish, no new ones start. Returns the reason set."""
        text = drain_reason(reason)
        self._scontrol("update", f"NodeName={_node(node)}", "State=DRAIN", f"Reason={text}")
        return text

    def resume_node(self, node: str) -> None:
        self._scontrol("update", f"NodeName={_node(node)}", "State=RESUME")

    def down_node(self, node: str, reason: str) -> str:
        """Set a node DOWN: Slurm ends the jobs' work on it (or, under ``--no-kill``,
        takes it out of their allocation) at once. Returns the reason set."""
        text = drain_reason(reason)
        self._scontrol("update", f"NodeName={_node(node)}", "State=DOWN", f"Reason={text}")
        return text

    def requeue(self, job_id: str, *, hold: bool = False, eligible_now: bool = False) -> None:
        """Requeue a batch job; ``eligible_now`` skips Slurm's fixed requeue delay."""
        job = self._this_job(job_id)
        self._scontrol("requeuehold" if hold else "requeue", job)
        if eligible_now and not hold:
            self._scontrol("update", f"JobId={job}", "StartTime=now")

    def shrink_job(self, job_id: str, keep: list[str]) -> None:
        """Give a running job's other nodes back: its allocation becomes ``keep``.

        scontrol writes ``slurm_job_N_resize.{sh,csh}`` into its working folder; it runs
        in a folder of its own, removed after, so nothing lands in the job's."""
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="jobwrap-shrink-")
        try:
            self.runner.run([self.config.scontrol_command, "update",
                             f"JobId={self._this_job(job_id)}",
                             f"NodeList={','.join(_node(n) for n in keep)}"],
                            timeout=self.config.command_timeout, cwd=folder)
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """Set the job's AdminComment (only an admin or root can: the user cannot forge it).

        slurmctld takes it while the job is still its own (a requeued attempt); once the job
        has finished (the epilog of its last attempt runs while it completes) only the
        database can, through ``sacctmgr modify job``: at most two bounded commands.
        """
        job = _job_id(job_id)
        try:
            self._scontrol("update", f"JobId={self._this_job(job)}", f"AdminComment={text}")
            return
        except SlurmError as exc:
            first = str(exc)
        argv = [self._sacctmgr(), "-i", "modify", "job", "where", f"jobid={job}", "set",
                f"AdminComment={text}"]
        try:
            self.runner.run(argv, timeout=self.config.command_timeout)
        except CommandError as exc:
            raise SlurmError(f"{first}; and then {exc}") from None

    def ended_attempts(self, job_id: str, *, timeout: float | None = None
                       ) -> list[tuple[str, float | None]]:
        """The job's attempts as Slurm's accounting recorded them, oldest first: (state,
        end) of each (``sacct --duplicates``): a requeued attempt reads ``NODE_FAIL`` when
        Slurm requeued it for a node it lost, ``REQUEUED`` when someone asked. Written by
        slurmctld alone; SlurmError where the site keeps no accounting. ``timeout``: the
        seconds the caller has left, when fewer than ``command_timeout``."""
        from wrapper.slurm.records import slurm_timestamp

        argv = [self._sibling("sacct"), "-n", "-P", "-X", "-D", "-j", _job_id(job_id),
                "-o", "JobIDRaw,State,End"]
        limit = self.config.command_timeout if timeout is None \
            else min(timeout, self.config.command_timeout)
        try:
            out = self.runner.run(argv, timeout=limit).stdout
        except CommandError as exc:
            raise SlurmError(str(exc)) from None
        found = []
        for line in out.splitlines():
            raw, _, rest = line.partition("|")
            state, _, end = rest.partition("|")
            if raw == job_id and state:
                found.append((state.split()[0], slurm_timestamp(end)))
        return found

    def _sacctmgr(self) -> str:
        return self._sibling("sacctmgr")

    def _sibling(self, program: str) -> str:
        """``program`` beside the configured scontrol (the same Slurm), else on PATH."""
        scontrol = self.config.scontrol_command
        if os.sep in scontrol:
            sibling = os.path.join(os.path.dirname(scontrol), program)
            if os.access(sibling, os.X_OK):
                return sibling
        return program

    def exclude_nodes(self, job_id: str, nodes: list[str]) -> list[str]:
        """Add nodes to a pending job's excluded nodes; returns the whole excluded list.

        Never so many that the job can no longer run: with its partition's nodes less the
        excluded ones fewer than the nodes it asks, Slurm leaves it PENDING for good
        (BadConstraints). Nodes past that room are not excluded, and are absent from the
        list returned (the caller tells)."""
        job = _job_id(job_id)
        info = self.job_info(job)
        current = info.get("ExcNodeList", "")
        have = expand_hostlist(current) if current and current != "(null)" else []
        new = [_node(n) for n in nodes if n not in have]
        room = self._exclusion_room(info)
        if room is not None:
            new = new[:max(0, room - len(have))]
        merged = have + new
        if new:
            self._scontrol("update", f"JobId={self._this_job(job)}",
                           f"ExcNodeList={','.join(merged)}")
        return merged

    def _exclusion_room(self, info: dict[str, str]) -> int | None:
        """How many nodes the job may have excluded and still run: its partition's nodes
        less the fewest it asks for (None: not known, e.g. several partitions)."""
        partition = info.get("Partition", "")
        wanted = info.get("NumNodes", "").split("-")[0]
        if not partition or "," in partition or not wanted.isdigit():
            return None
        try:
            out = self._scontrol("-o", "show", "partition", partition)
        except SlurmError:  # not knowing the room is no reason to leave the job unmoved
            return None
        total = next((w.split("=", 1)[1] for w in out.split() if w.startswith("TotalNodes=")),
                     "")
        return int(total) - int(wanted) if total.isdigit() else None
