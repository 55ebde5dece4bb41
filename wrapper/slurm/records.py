"""Slurm's job and node records, read so that text a user wrote can never become a field.

A job record mixes Slurm's own facts (JobState, Reason, ExitCode, Requeue, ExcNodeList...)
with text any user chooses (``--job-name``, ``--comment``, ``--chdir``, ``--output``,
``--network``, ``--mail-user``...), and Slurm prints that text raw: spaces, ``Key=``,
newlines and all. A reader that splits on every `` Key=`` lets
``--comment='x JobState=NODE_FAIL'`` override the real JobState. Two readers here:

1. **JSON** (``scontrol --json show job|node``, Slurm 23.02 and later; Debian 12's 22.05
   has no ``--json`` in scontrol, and its ``squeue --json`` ignores ``-j`` and dumps every
   job). Structured: ``from_json_job``/``from_json_node`` map the fields jobwrap uses
   onto the names and text forms ``scontrol show`` prints, so the rest of jobwrap reads
   one shape whichever reader ran.

2. **Text** (``scontrol -o show job``), where ``parse_job_text`` uses what Slurm's
   printer (``slurm_sprint_job_info``) guarantees about *where* user text can be:

   - head: ``JobId=N`` and Slurm's numeric array/het fields, then ``JobName=`` (user
     text) up to `` UserId=``. When ``UserId=`` appears once in the whole record that is
     the real one; when the name (or later text) contains it too, the record cannot be
     split from the text alone, and the caller must pass the exact name, read on its own
     (``squeue -o %j``): the record must then read ``...JobName=<name> UserId=``.
   - middle: from ``UserId=`` to the first free-text key (``Network``, ``Command``...):
     only Slurm's own values, none with whitespace (Slurm writes a Reason's blanks as
     ``_``), so it is split on whitespace into ``Key=Value`` tokens. Every field root
     decides from lives here, so no user text can reach them.
   - tail: the free-text fields (TAIL_ORDER). Each value runs to the next of these keys
     *that Slurm prints after it*, found from the right, so text inside ``Comment`` or
     ``WorkDir`` never yields an earlier key, and Slurm's own trailing fields (StdErr,
     StdIn, StdOut, Power) anchor the end. Text alone cannot tell an absent optional
     field from one spelled inside its neighbour (a ``WorkDir`` holding `` Comment=x``),
     so tail fields can only be confused with each other: the same user's paths and
     text, which root uses with that user's rights and never for a decision.

``SlurmJob`` is the typed view of a record (state, reason, exit, requeue, restarts...).
Node records are written by Slurm and admins only (``parse_record`` in parse.py);
``parse_gres_gpus`` counts the GPUs in one's ``Gres`` field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from wrapper.errors import SlurmError
from wrapper.fastdataclass import dataclass
from wrapper.slurm.parse import parse_exit_pair

HEAD_KEYS = ("ArrayJobId", "ArrayTaskId", "ArrayTaskThrottle", "HetJobId", "HetJobOffset",
             "HetJobIdSet")
# The fields Slurm prints after the fixed ones, in its order (22.05-25.11); all may carry
# text a user chose, or follow one that does.
TAIL_ORDER = ("Network", "Command", "WorkDir", "AdminComment", "SystemComment", "Comment",
              "Extra", "StdErr", "StdIn", "StdOut", "BurstBuffer", "BurstBufferState",
              "CpusPerTres", "MemPerTres", "TresBind", "TresFreq", "TresPerJob",
              "TresPerNode", "TresPerSocket", "TresPerTask", "MailUser", "MailType",
              "Container", "ContainerID", "Power", "NtasksPerTRES")
FREE_TEXT = frozenset({"JobName", *TAIL_ORDER})
_HEAD_KEY = "|".join(HEAD_KEYS)
_HEAD = re.compile(rf"JobId=(\d+)((?: (?:{_HEAD_KEY})=[0-9A-Za-z_,\-%\[\]]*)*) JobName=")


def record_head(text: str) -> dict[str, str]:
    """The first record's head: ``JobId`` and Slurm's numeric array and het fields, which
    no user text can reach (empty when ``text`` starts with no record)."""
    head = _HEAD.match(text)
    if not head:
        return {}
    return {"JobId": head.group(1), **dict(t.partition("=")[::2] for t in head.group(2).split())}


class AmbiguousJobName(SlurmError):
    """The job's name contains `` UserId=``: read the name on its own and parse again."""


def parse_job_text(line: str, *, name: str | None = None) -> dict[str, str]:
    """Parse one ``scontrol -o show job`` record (see the module docstring)."""
    line = line.rstrip("\n")
    head = _HEAD.match(line)
    if not head:
        raise SlurmError(f"scontrol show job printed no JobId=... JobName= record: "
                         f"{line[:80]!r}")
    record = {"JobId": head.group(1)}
    for token in head.group(2).split():
        key, _, value = token.partition("=")
        record[key] = value
    rest = line[head.end():]
    if name is None:
        found = list(re.finditer(r"\sUserId=", rest))
        if len(found) != 1:
            raise AmbiguousJobName(f"job {record['JobId']}: its name or text holds 'UserId='")
        at = found[0]
        record["JobName"], rest = rest[:at.start()], rest[at.start():].lstrip()
    else:
        if not (rest.startswith(name) and rest[len(name):len(name) + 8] == " UserId="):
            raise SlurmError(f"job {record['JobId']}: the record does not match its name "
                             f"{name[:80]!r}; not reading it")
        record["JobName"], rest = name, rest[len(name) + 1:]
    middle, tail = _split_middle(rest)
    for token in middle.split():
        key, eq, value = token.partition("=")
        if eq and key not in record and key not in FREE_TEXT:
            record[key] = value
    record.update(_parse_tail(tail))
    return record


_TAIL_KEY = "|".join(TAIL_ORDER)
_TAIL_START = re.compile(rf"(?:^|\s)(?:{_TAIL_KEY})=")


def _split_middle(rest: str) -> tuple[str, str]:
    match = _TAIL_START.search(rest)
    if not match:
        return rest, ""
    return rest[:match.start()], rest[match.start():].lstrip()


def _parse_tail(tail: str) -> dict[str, str]:
    """Free-text fields, each up to the next key Slurm prints after it, from the right."""
    out: dict[str, str] = {}
    end = len(tail)
    for key in reversed(TAIL_ORDER):
        if tail.startswith(f"{key}="):
            pos, start = 0, len(key) + 1
        else:
            pos = tail.rfind(f" {key}=", 0, end)
            start = pos + len(key) + 2
        if pos < 0 or start > end:
            continue
        out[key] = tail[start:end].strip(" ")
        end = pos
        if pos == 0:
            break
    return out


# -- JSON ----------------------------------------------------------------------------------
_FLAG_STATES = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED",
                "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED",
                "RESV_DEL_HOLD", "SIGNALING")


def _number(value: Any) -> int | None:
    """Slurm's numbers: plain, or ``{"set": true, "infinite": false, "number": 5}``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _state(value: Any) -> str:
    """JobState as scontrol prints it: a flag such as COMPLETING wins over the base state."""
    states = [str(s).upper() for s in (value if isinstance(value, list) else [value]) if s]
    for flag in _FLAG_STATES:
        if flag in states:
            return flag
    return states[0] if states else ""


def _time(value: Any) -> str:
    stamp = _number(value)
    return datetime.fromtimestamp(stamp).isoformat() if stamp else "Unknown"


def _minutes(value: Any) -> str:
    if isinstance(value, dict) and value.get("infinite"):
        return "UNLIMITED"
    return limit_text(_number(value))


def limit_text(minutes: int | None) -> str:
    """A time limit in minutes as ``scontrol show job`` prints it (None: UNLIMITED)."""
    if minutes is None:
        return "UNLIMITED"
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00" if days else \
        f"{rest // 60:02d}:{rest % 60:02d}:00"


def time_limit_seconds(text: str) -> float | None:
    """Slurm's TimeLimit (``UNLIMITED``, ``30:00``, ``1-02:00:00``) in seconds; None when
    unlimited or unreadable (limit_text's inverse)."""
    from wrapper.submit.directives import parse_duration

    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "PARTITION_LIMIT"):
        return None
    if ":" in text and "-" not in text and text.count(":") == 1:
        text = "00:" + text  # MM:SS
    try:
        return parse_duration(text)
    except ValueError:
        return None


def _exit(value: Any) -> str:
    if isinstance(value, dict):  # data_parser 0.0.39+: {"return_code": ..., "signal": ...}
        code = _number(value.get("return_code")) or 0
        signal = value.get("signal") or {}
        sig = _number(signal.get("id")) if isinstance(signal, dict) else None
        return f"{code}:{sig or 0}"
    status = _number(value)  # openapi 0.0.38: a wait status
    return f"{(status >> 8) & 0xFF}:{status & 0x7F}" if status is not None else ""


def _memory(value: Any) -> str:
    """Megabytes as scontrol prints them (``4000M``); unset: ""."""
    megabytes = _number(value)
    return f"{megabytes}M" if megabytes else ("0" if megabytes == 0 else "")


def _text(value: Any, empty: str = "") -> str:
    return str(value) if value not in (None, "") else empty


def _pick_job(jobs: list[Any], job_id: str | None) -> Mapping[str, Any]:
    """The job asked for: ``scontrol --json show job A_T`` (or the id of an array's
    master) prints every task of the array, in no order that names the one asked for."""
    found = [j for j in jobs if isinstance(j, dict)]
    if job_id is None:
        return found[0]
    head, _, task = job_id.partition("_")
    for job in found:
        if task:
            if (_text(_number(job.get("array_job_id"))) == head
                    and _text(_number(job.get("array_task_id"))) == task):
                return job
        elif _text(_number(job.get("job_id"))) == head:
            return job
    raise SlurmError(f"scontrol --json show job {job_id} printed no job {job_id}")


def from_json_job(data: Mapping[str, Any], job_id: str | None = None) -> dict[str, str]:
    """The job ``job_id`` (default: the first) of ``scontrol --json show job`` as the fields
    ``scontrol show job`` prints."""
    jobs = data.get("jobs")
    if not isinstance(jobs, list) or not jobs or not isinstance(jobs[0], dict):
        raise SlurmError("scontrol --json show job printed no job")
    job = _pick_job(jobs, job_id)
    out = {
        "JobId": _text(_number(job.get("job_id"))),
        "JobName": _text(job.get("name")),
        "UserId": f"{_text(job.get('user_name'))}({_text(_number(job.get('user_id')))})",
        "JobState": _state(job.get("job_state")),
        "Reason": _text(job.get("state_reason"), "None"),
        "Requeue": "1" if job.get("requeue") else "0",
        "Restarts": _text(_number(job.get("restart_cnt")), "0"),
        "ExitCode": _exit(job.get("exit_code")),
        "TimeLimit": _minutes(job.get("time_limit")),
        "StartTime": _time(job.get("start_time")),
        "EndTime": _time(job.get("end_time")),
        "SubmitTime": _time(job.get("submit_time")),
        "Partition": _text(job.get("partition")),
        "NodeList": _text(job.get("nodes")),
        "BatchHost": _text(job.get("batch_host")),
        "ExcNodeList": _text(job.get("excluded_nodes"), "(null)"),
        "Account": _text(job.get("account"), "(null)"),
        "Command": _text(job.get("command")),
        "WorkDir": _text(job.get("current_working_directory")),
        "Comment": _text(job.get("comment")),
        # what a rerun asks for again (archive/rerun.py), as scontrol prints it
        "NumNodes": _text(_number(job.get("node_count"))),
        "NumTasks": _text(_number(job.get("tasks"))),
        "CPUs/Task": _text(_number(job.get("cpus_per_task"))),
        "ReqTRES": _text(job.get("tres_req_str")),
        "TresPerNode": _text(job.get("tres_per_node")),
        "MinMemoryNode": _memory(job.get("memory_per_node")),
        "MinMemoryCPU": _memory(job.get("memory_per_cpu")),
        "QOS": _text(job.get("qos"), "(null)"),
        "Reservation": _text(job.get("reservation"), "(null)"),
        "Features": _text(job.get("features"), "(null)"),
        "AdminComment": _text(job.get("admin_comment")),
        "Extra": _text(job.get("extra")),
        "StdOut": _text(job.get("stdout_expanded") or job.get("standard_output")),
        "StdErr": _text(job.get("stderr_expanded") or job.get("standard_error")),
        "StdIn": _text(job.get("stdin_expanded") or job.get("standard_input")),
    }
    array_job = _number(job.get("array_job_id"))
    if array_job:
        out["ArrayJobId"] = str(array_job)
        out["ArrayTaskId"] = _text(_number(job.get("array_task_id")),
                                   _text(job.get("array_task_string")))
    return out


def from_json_node(data: Mapping[str, Any]) -> dict[str, str]:
    """One node of ``scontrol --json show node`` as the fields ``scontrol show node`` prints."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes or not isinstance(nodes[0], dict):
        raise SlurmError("scontrol --json show node printed no node")
    node = nodes[0]
    state = node.get("state")
    states = [str(s).upper() for s in (state if isinstance(state, list) else [state]) if s]
    states += [str(s).upper() for s in node.get("state_flags") or [] if str(s).upper()
               not in states]
    return {"NodeName": _text(node.get("name")), "State": "+".join(states),
            "Gres": _text(node.get("gres")), "Reason": _text(node.get("reason")),
            "Partitions": ",".join(str(p) for p in node.get("partitions") or []),
            "SlurmdStartTime": _time(node.get("slurmd_start_time")),
            "BootTime": _time(node.get("boot_time"))}


# -- a node's Gres ----------------------------------------------------------------------------
_GRES_ITEM = re.compile(r"^([A-Za-z_]+)(?::([^:(]+))?(?::([0-9]+[KMG]?))?(?:\(.*\))?$")


def parse_gres_gpus(gres: str) -> int:
    """GPUs in a Slurm Gres string: ``gpu:h100:4(S:0),gpu:h100:4(S:1),shard:8`` -> 8.

    ``(null)`` or no gpu entry -> 0. Raises ValueError on an entry it cannot read.
    """
    total = 0
    for item in _split_gres(gres.strip()):
        if not item or item == "(null)":
            continue
        match = _GRES_ITEM.match(item)
        if not match:
            raise ValueError(f"cannot read the gres entry {item!r}")
        name, second, third = match.groups()
        if name != "gpu":
            continue
        count = third if third is not None else \
            second if second and re.fullmatch(r"[0-9]+[KMG]?", second) else None
        if count is None:
            total += 1
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(count[-1], 1)
        total += int(count.rstrip("KMG")) * scale
    return total


def _split_gres(text: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [i.strip() for i in items]

# -- the typed view ---------------------------------------------------------------------------
# Slurm's Reason while a job is COMPLETING tells what ended it.
REASON_STATE = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "NodeFail": "NODE_FAIL",
                "Preempted": "PREEMPTED", "OutOfMemory": "OUT_OF_MEMORY"}
# The batch step's id as SLURM_STEP_ID gives it (its name, or SLURM_BATCH_SCRIPT's number).
BATCH_STEP_IDS = ("batch", "4294967294")


def node_lost(fields: Mapping[str, str], since: float | None = None) -> bool:
    """The node record says Slurm lost the node: DOWN, or not responding (``*``), or, with
    ``since`` (an attempt's start, seconds since the epoch), its slurmd or the node itself
    started again after it: lost and already back (a crashed node that rebooted)."""
    if node_down(fields):
        return True
    return since is not None and (node_rebooted(fields, since)
                                  or slurmd_restarted(fields, since))


def node_down(fields: Mapping[str, str]) -> bool:
    """Slurm's record says the node is DOWN or not responding now: its base state DOWN, or
    the NOT_RESPONDING flag (``*`` after a state, in an older scontrol's words). Matched
    by whole word: a node powered down to save power (``IDLE+POWERED_DOWN``,
    ``POWER_DOWN``, ``POWERING_DOWN``) is no lost node."""
    base, flags = node_state(fields)
    return base == "DOWN" or "NOT_RESPONDING" in flags


# The marks sinfo and older scontrols put after a state's name (``DOWN*``, ``IDLE~``).
_STATE_MARKS = "*~#%!$@^-"


def node_state(fields: Mapping[str, str]) -> tuple[str, frozenset[str]]:
    """A node record's State as Slurm builds it: the base state, then its flags, each
    after a ``+`` (``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``; ``("", {})`` when absent). A
    ``*`` after a name is the NOT_RESPONDING flag; the other marks are dropped."""
    words: list[str] = []
    flags: set[str] = set()
    for part in fields.get("State", "").upper().split("+"):
        word = part.strip().rstrip(_STATE_MARKS)
        if "*" in part.strip()[len(word):]:
            flags.add("NOT_RESPONDING")
        if word:
            words.append(word)
    return (words[0], frozenset(flags.union(words[1:]))) if words else ("", frozenset(flags))


def node_rebooted(fields: Mapping[str, str], since: float) -> bool:
    """The node itself booted after ``since``: every process of a job there is gone."""
    stamp = slurm_timestamp(fields.get("BootTime", ""))
    return stamp is not None and stamp > since


def slurmd_restarted(fields: Mapping[str, str], since: float) -> bool:
    """The node's slurmd started after ``since``. Alone, no loss: a restarted slurmd
    (``systemctl restart slurmd``, an upgrade) leaves the job's steps running."""
    stamp = slurm_timestamp(fields.get("SlurmdStartTime", ""))
    return stamp is not None and stamp > since


def slurm_timestamp(text: str) -> float | None:
    """Seconds since the epoch of a time Slurm prints (``2026-12-03T15:04:50``, local
    time: StartTime, SlurmdStartTime...); None for ``Unknown``, ``None`` or anything else.

    datetime, not time.strptime: strptime's first call imports locale machinery that
    costs the prolog a tenth of its budget.
    """
    text = text.strip()
    try:
        return datetime.fromisoformat(text).timestamp() if text[:1].isdigit() else None
    except ValueError:
        return None


def is_batch_step(step_id: str) -> bool:
    return step_id in BATCH_STEP_IDS


@dataclass(frozen=True)
class SlurmJob:
    """The facts of a job record that jobwrap decides from, typed."""

    job_id: str
    state: str
    reason: str
    requeue: bool | None
    restarts: int
    exit_code: int | None
    exit_signal: int | None
    nodes: str
    excluded: str
    work_dir: str
    stdout: str
    stderr: str
    array_job_id: str = ""
    array_task_id: str = ""

    @property
    def final_state(self) -> str:
        """How the job ended, as the epilog sees it: while Slurm still says COMPLETING
        (or nothing), its Reason tells what ended it ("" when it does not)."""
        if self.state == "COMPLETING" or not self.state:
            return REASON_STATE.get(self.reason, "")
        return self.state

    @property
    def requeue_allowed(self) -> bool:
        """Slurm would accept a requeue: not ``Requeue=0`` (sbatch --no-requeue, or a
        site's job_submit); an unknown value is not a refusal."""
        return self.requeue is not False

    @classmethod
    def of(cls, fields: Mapping[str, str]) -> SlurmJob:
        requeue = fields.get("Requeue")
        code: int | None
        sig: int | None
        try:
            code, sig = parse_exit_pair(fields.get("ExitCode", ""))
        except ValueError:
            code = sig = None
        restarts = fields.get("Restarts", "0")
        return cls(job_id=fields.get("JobId", ""), state=fields.get("JobState", ""),
                   reason=fields.get("Reason", ""),
                   requeue=None if requeue not in ("0", "1") else requeue == "1",
                   restarts=int(restarts) if restarts.isdigit() and len(restarts) < 10 else 0,
                   exit_code=code, exit_signal=sig,
                   nodes=_null(fields.get("NodeList", "")),
                   excluded=_null(fields.get("ExcNodeList", "")),
                   work_dir=fields.get("WorkDir", ""), stdout=fields.get("StdOut", ""),
                   stderr=fields.get("StdErr", ""),
                   array_job_id=_null(fields.get("ArrayJobId", "")),
                   array_task_id=_null(fields.get("ArrayTaskId", "")))


def _null(text: str) -> str:
    return "" if text == "(null)" else text
