"""Why did an attempt end? One class per outcome, from everything the epilog can see.

Evidence, strongest first: Slurm's own verdict (NODE_FAIL, TIMEOUT, PREEMPTED,
OUT_OF_MEMORY, CANCELLED), what jobwrap itself saw (root's GPU check, the supervisor's
hang through its root-owned channel), signatures in the tail of the job's output, then
the exit status. A pure function, so that the table below is what is tested.

Hardware, the one class that excludes a node and does not count against the job, is
root's word alone: a GPU fault the supervisor reports, or a GPU error the job prints,
is hardware only when root's own probe confirms it (``gpu_check_failed``); otherwise
the attempt is judged on the rest, and the detail says the report was not confirmed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import field, replace

from wrapper.fastdataclass import dataclass
from wrapper.job.events import GpuFault, Hang, HangInPlace
from wrapper.job.kinds import (  # the classes live with the events (attempt.end's kind)
    CANCELLED,
    COLLECTIVE_TIMEOUT,
    CUDA_OOM,
    HANG,
    HARDWARE,
    HOST_OOM,
    KILLED,
    NCCL_TIMEOUT,
    NODE_FAILURE,
    NOT_THE_JOBS_FAULT,
    PREEMPTED,
    RETRYABLE,
    STAGING,
    SUCCESS,
    UNCHECKED,
    USER_ERROR,
    WALLTIME,
)

# The classes, re-exported: the judge's callers name them through it (with the names
# defined below, which need no listing).
__all__ = [
    "CANCELLED",
    "COLLECTIVE_TIMEOUT",
    "CUDA_OOM",
    "HANG",
    "HARDWARE",
    "HOST_OOM",
    "KILLED",
    "NCCL_TIMEOUT",
    "NODE_FAILURE",
    "NOT_THE_JOBS_FAULT",
    "PREEMPTED",
    "RETRYABLE",
    "STAGING",
    "SUCCESS",
    "UNCHECKED",
    "USER_ERROR",
    "WALLTIME",
]

# (class, pattern) in order: the first match wins. Patterns are what the tools print.
SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (HARDWARE, re.compile(r"\bXid\b.*?\b(48|63|64|74|79|92|94|95|119|120)\b|"
                          r"GPU has fallen off the bus|uncorrectable ECC error|"
                          r"CUDA error: (an illegal memory access|unspecified launch failure"
                          r"|uncorrectable ECC)|cudaErrorECCUncorrectable", re.I)),
    (COLLECTIVE_TIMEOUT, re.compile(
        r"NCCL.*(timeout|timed out|Watchdog caught collective)|"
        r"ProcessGroupNCCL.*(Timeout|timed out)|"
        r"NCCL error.*(remote process exited|unhandled system error)|"
        r"gloo.*(Connection closed by peer|Connection reset by peer|Timed out)|"
        r"Watchdog caught collective operation timeout", re.I)),
    (CUDA_OOM, re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|"
                          r"cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED: Out of memory",
                          re.I)),
    (HOST_OOM, re.compile(r"oom-kill|Out of memory: Killed process|"
                          r"oom_kill_process|MemoryError\b")),
)

# Classes the output alone may not pick: what it names instead, as unconfirmed.
UNCONFIRMED_IN_OUTPUT = {HARDWARE: "the GPU error in the output",
                         HOST_OOM: "the out-of-memory kill in the output (no OOM kill "
                                   "recorded for the job)"}


@dataclass(frozen=True)
class Evidence:
    exit_code: int | None = None
    exit_signal: int | None = None
    slurm_state: str = ""  # FAILED, TIMEOUT, NODE_FAIL, ... (without COMPLETING)
    # The supervisor's reports through its root-owned channel: "hang", "gpu.fault"
    supervisor_events: tuple[str, ...] = ()
    gpu_check_failed: bool = False  # root's own GPU check (post-job, or confirming) failed
    unconfirmed: tuple[str, ...] = ()  # claims from the user's side root did not confirm
    staging_error: str = ""  # why the prolog could not stage the job's data
    # Root's record has no prolog on this node for the attempt, and the task-prolog ended
    # it there before the job's code ran ([hooks] unchecked_attempt = "requeue"); or the
    # task-prolog of another node of the job said so of its node (``unchecked_elsewhere``).
    unchecked: str = ""
    unchecked_elsewhere: tuple[str, ...] = ()
    output_tail: str = ""
    # An OOM kill root saw for this job (cgroup memory.events, the kernel log): what and
    # where, from wrapper.restart.oom; "" when none was recorded.
    oom_kill: str = ""
    job_id: str = ""  # to know slurmstepd's cancel line for this job in the output
    # Seconds that were left before Slurm's time limit when the attempt ended, when Slurm's
    # Restarts says it was requeued without jobwrap (jobwrap's supervisor once the save it
    # asked for was on disk, or the job's own signal trap) close enough to its limit for
    # that to be the reason (the gatherer's window); None otherwise.
    requeued_before_limit_s: float | None = None


@dataclass(frozen=True)
class Classification:
    kind: str
    detail: str
    signature: str = ""  # what identifies "the same error again"
    evidence: list[str] = field(default_factory=list)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


# What an attempt looks like on the first node when another node's task-prolog ended its
# tasks there (a prolog Slurm skipped): its ranks fail or wait for the missing peer.
SKIP_LOOKALIKES = frozenset({HANG, USER_ERROR, KILLED, COLLECTIVE_TIMEOUT})
# The signature of an attempt classed unchecked on the task-prolog's word from another
# node (``unchecked_elsewhere``): it spends the job's restarts, where root's own record
# of a skip ("unchecked") spends none.
CLAIMED_SKIP = "unchecked_claimed"


def classify(ev: Evidence) -> Classification:
    """The class of the attempt. A skip another node's task-prolog reported is weighed
    last: root's own facts (a GPU fault, a lost node, an OOM kill, the time limit) come
    first, and it is taken only where the attempt failed as such a skip makes it fail."""
    if not ev.unchecked_elsewhere:
        return _classify(ev)
    verdict = _classify(replace(ev, unchecked="", unchecked_elsewhere=()))
    if verdict.kind not in SKIP_LOOKALIKES:
        return verdict
    return Classification(UNCHECKED, f"{ev.unchecked}; the task-prolog ended the attempt's "
                          f"tasks there before the job's code started ({verdict.kind} here: "
                          f"{verdict.detail})", CLAIMED_SKIP)


@dataclass(frozen=True)
class _Seen:
    """What every rule reads: the evidence, and what follows from it alone."""

    ev: Evidence
    state: str  # Slurm's final state, upper case
    succeeded: bool
    failed: bool
    # reports of a GPU fault no root probe confirmed (the supervisor's, so far)
    unconfirmed: tuple[str, ...]

    @classmethod
    def of(cls, ev: Evidence) -> _Seen:
        state = ev.slurm_state.upper()
        clean_exit = ev.exit_code == 0 and not ev.exit_signal
        return cls(ev, state,
                   succeeded=state == "COMPLETED" or (
                       clean_exit and state not in ("CANCELLED", "FAILED")),
                   failed=state in ("FAILED", "") and not clean_exit,
                   unconfirmed=tuple(ev.unconfirmed) + (
                       ("the supervisor's GPU fault",)
                       if GpuFault.KIND in ev.supervisor_events else ()))


Rule = Callable[[_Seen], "Classification | None"]


# -- Slurm's own verdict ------------------------------------------------------------------
def _node_fail(s: _Seen) -> Classification | None:
    return Classification(NODE_FAILURE, "Slurm reported NODE_FAIL", "node_fail") \
        if s.state == "NODE_FAIL" else None


def _preempted(s: _Seen) -> Classification | None:
    return Classification(PREEMPTED, "preempted by Slurm", "preempted") \
        if s.state == "PREEMPTED" else None


# -- root's facts ---------------------------------------------------------------------------
def _skipped_prolog(s: _Seen) -> Classification | None:
    if not s.ev.unchecked or s.succeeded or s.state == "CANCELLED":
        return None
    return Classification(UNCHECKED, f"{s.ev.unchecked}; the task-prolog ended the attempt "
                          "before the job's code started", "unchecked")


def _staging(s: _Seen) -> Classification | None:
    return Classification(STAGING, f"the job could not be prepared: {s.ev.staging_error}",
                          "staging") if s.ev.staging_error else None


def _gpu_checked(s: _Seen) -> Classification | None:
    if not s.ev.gpu_check_failed:
        return None
    why = "the supervisor saw a GPU fault, confirmed by root's GPU check" \
        if GpuFault.KIND in s.ev.supervisor_events else "the post-job GPU check failed"
    return Classification(HARDWARE, why, "gpu_fault")


def _hang(s: _Seen) -> Classification | None:
    return Classification(HANG, "no progress and no output for the hang timeout; jobwrap "
                          "ended the job", "hang") \
        if ended_by_hang(s.ev.supervisor_events) else None


def _hang_in_place(s: _Seen) -> Classification | None:
    # The supervisor ended the hung steps for jobwrap run, whose brakes then stopped (or
    # which ended with them) and passed on their SIGKILL: still the hang's doing.
    if HangInPlace.KIND not in s.ev.supervisor_events or s.state in (
            "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY") or not _sigkill(s.ev):
        return None
    return Classification(HANG, "no progress and no output for the hang timeout; jobwrap "
                          "ended the job's steps and jobwrap run did not restart them",
                          "hang")


def _time_limit(s: _Seen) -> Classification | None:
    return Classification(WALLTIME, "reached its time limit", "walltime") \
        if s.state == "TIMEOUT" else None


def _slurm_oom(s: _Seen) -> Classification | None:
    return Classification(HOST_OOM, "Slurm reported OUT_OF_MEMORY", "host_oom") \
        if s.state == "OUT_OF_MEMORY" else None


def _kernel_oom(s: _Seen) -> Classification | None:
    return Classification(HOST_OOM, f"the kernel's OOM killer ended it ({s.ev.oom_kill})",
                          "host_oom") if s.ev.oom_kill and s.failed else None


def _requeued_before_limit(s: _Seen) -> Classification | None:
    if s.ev.requeued_before_limit_s is None or s.state == "CANCELLED":
        return None
    left = max(0, round(s.ev.requeued_before_limit_s))
    return Classification(WALLTIME, f"requeued {left} s before its time limit, by the "
                          "job's side (jobwrap's supervisor once the save it asked for "
                          "was on disk, or the job's own signal trap)", "walltime")


# -- the job's own words and exit -------------------------------------------------------
def _cancel_line_seen(s: _Seen) -> Classification | None:
    # While the job completes Slurm's record says COMPLETING and the exit Slurm hands the
    # epilog is 0 (the batch script had not ended when it was cancelled): the line
    # slurmstepd wrote into the job's output is all that tells. The job's own words, so
    # they may only stop it (scancel's effect), never requeue it nor loosen a brake.
    cancelled = _cancel_line(s.ev) if s.state != "COMPLETED" else ""
    if not cancelled or GpuFault.KIND in s.ev.supervisor_events:
        return None
    return Classification(CANCELLED, f"cancelled while it ran: {cancelled} (slurmstepd's "
                          "line in the job's output)", "cancelled")


def _success(s: _Seen) -> Classification | None:
    return Classification(SUCCESS, "exit 0", "") if s.succeeded else None


def _scancel(s: _Seen) -> Classification | None:
    return Classification(CANCELLED, "cancelled (scancel)", "cancelled") \
        if s.state == "CANCELLED" else None


def _killed(s: _Seen) -> Classification | None:
    killed = _sigkill(s.ev)
    if not killed:
        return None
    return Classification(KILLED, _unconfirmed(f"{killed}; no OOM kill recorded for the "
                                               "job: ended from outside", s.unconfirmed),
                          "killed")


def _output_and_exit(s: _Seen) -> Classification:
    """The output's signatures (the job's own words: not hardware, nor an OOM kill,
    unless root saw it), a rank's crash (the cause; its peers' gloo/NCCL errors that
    follow are not), a traceback, else the exit status. Always an answer."""
    ev, unconfirmed, last = s.ev, list(s.unconfirmed), ""
    crash = _last_match(_CRASH, ev.output_tail)
    for kind, pattern in SIGNATURES:
        match = _last_match(pattern, ev.output_tail)
        if not match or (crash and kind == COLLECTIVE_TIMEOUT):
            continue
        line = _line_of(ev.output_tail, match)
        if kind in UNCONFIRMED_IN_OUTPUT:
            unconfirmed.append(UNCONFIRMED_IN_OUTPUT[kind])
            last = line
            continue
        return Classification(kind, f"output says: {line}", f"{kind}:{_normalise(line)}")
    if crash:
        line = _line_of(ev.output_tail, crash)
        return Classification(USER_ERROR, _unconfirmed(f"a rank crashed: {line}", unconfirmed),
                              f"crash:{_normalise(line)}")
    traceback = last_traceback(ev.output_tail)
    if traceback is not None:
        exc_type, frame, line = traceback
        return Classification(USER_ERROR, _unconfirmed(
            f"{line}" + (f" (at {frame})" if frame else ""), unconfirmed),
            f"traceback:{exc_type}:{frame}")
    last = last or _last_error_line(ev.output_tail)
    code = ev.exit_code if ev.exit_code is not None else -1
    signal_note = f" (signal {ev.exit_signal})" if ev.exit_signal else ""
    if 128 < code < 160 and not ev.exit_signal:
        signal_note = f" (a command killed by {_signal_name(code - 128)})"
    detail = f"exit {code}{signal_note}" + (f"; last error: {last}" if last else "")
    return Classification(USER_ERROR, _unconfirmed(detail, unconfirmed),
                          f"exit:{code}:{ev.exit_signal or 0}:{_normalise(last)}")


def _unconfirmed(detail: str, unconfirmed: Sequence[str]) -> str:
    return detail + (f"; not confirmed by root: {', '.join(unconfirmed)}" if unconfirmed
                     else "")


# The rules in order, the first answer wins: Slurm's facts, root's, then the job's words.
RULES: tuple[tuple[str, Rule], ...] = (
    ("slurm", _node_fail), ("slurm", _preempted),
    ("root", _skipped_prolog), ("root", _staging), ("root", _gpu_checked), ("root", _hang),
    ("root", _hang_in_place), ("slurm", _time_limit), ("slurm", _slurm_oom),
    ("root", _kernel_oom), ("root", _requeued_before_limit),
    ("job", _cancel_line_seen), ("job", _success), ("slurm", _scancel), ("job", _killed),
)


def _classify(ev: Evidence) -> Classification:
    seen = _Seen.of(ev)
    for _source, rule in RULES:
        found = rule(seen)
        if found is not None:
            return found
    return _output_and_exit(seen)


# A process of the job that crashed on its own (SIGSEGV, SIGBUS, SIGFPE, SIGILL): srun's
# line for the task, torchrun's, CPython's faulthandler. SIGABRT is left out: NCCL's
# watchdog aborts a rank *after* a collective timed out, a consequence, not a cause.
_CRASH = re.compile(
    r"^srun: error: \S+: tasks? [\d,-]+: (?:Segmentation fault|Bus error|"
    r"Floating point exception|Illegal instruction)\b.*$"
    r"|^.*\bSignal (?:11|7|8|4) \(SIG(?:SEGV|BUS|FPE|ILL)\) received by PID \d+.*$"
    r"|^Fatal Python error: (?:Segmentation fault|Bus error|Floating point exception|"
    r"Illegal instruction).*$", re.M)
_RANK_PREFIX = re.compile(r"^\[(?:rank|Rank |default)\d*\]:\s?", re.M)
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+), in (\S+)')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|"
                        r"KeyboardInterrupt|StopIteration|[A-Z]\w*))(?::\s?(.*))?$")
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<frozen ")


def ended_by_hang(supervisor_events: tuple[str, ...]) -> bool:
    """Whether the supervisor's facts say a hang ended the attempt: a ``hang`` not
    followed by ``hang.in_place`` (the supervisor then killed only the job's steps, and
    ``jobwrap run`` restarted its command: the attempt ends as that command ends)."""
    last = next((name for name in reversed(supervisor_events)
                 if name in (Hang.KIND, HangInPlace.KIND)), "")
    return last == Hang.KIND


def _cancel_line(ev: Evidence) -> str:
    """slurmstepd's ``*** JOB N ON node CANCELLED AT time ***`` for this job in the output
    (scancel, or a signal to the whole job; not "DUE TO" a time limit, a preemption, a
    node failure or a requeue, which Slurm's record tells), or "". Slurm 25.11 words the
    same end ``... DUE to SIGNAL Terminated ***`` (SIGTERM, SIGKILL) or ``... DUE TO TASK
    FAILURE ***`` (the job's termination while its batch script runs)."""
    if not ev.job_id:
        return ""
    # 25.11 prefixes the line with its time ("[2026-12-05T01:42:17.687] error: ***")
    match = _last_match(re.compile(r"^(?:slurmstepd(?:-\S+)?: |\[[0-9T:.-]{10,32}\] )"
                                   rf"error: \*\*\* JOB "
                                   rf"{re.escape(ev.job_id)} ON \S+ CANCELLED AT \S+"
                                   r"(?: DUE to SIGNAL [A-Za-z ]{1,40}| DUE TO TASK FAILURE)?"
                                   r" \*\*\*", re.M), ev.output_tail)
    return _line_of(ev.output_tail, match).strip() if match else ""


def _sigkill(ev: Evidence) -> str:
    """How the attempt shows a SIGKILL (Slurm's exit signal or status 137), or ""."""
    if ev.exit_signal == 9:
        return "ended by SIGKILL"
    if ev.exit_code == 137:
        return "exit 137 (a command killed by SIGKILL)"
    # srun's "task N: Killed" or a shell's "Killed" line alone is the job's own output,
    # which anyone can print: not a kill (srun itself exits 128+9 when a task was).
    return ""


def last_traceback(text: str) -> tuple[str, str, str] | None:
    """The last Python traceback in ``text``: (exception type, innermost user frame, line).

    The frame is ``file:function:line`` of the innermost frame outside the libraries
    (site-packages, the standard library); ``[rankN]:`` prefixes (torch.distributed's)
    are removed first.
    """
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    lines = _RANK_PREFIX.sub("", text[at:]).splitlines()[1:]
    frames: list[tuple[str, str, str]] = []
    for line in lines:
        frame = _FRAME.match(line)
        if frame:
            frames.append(frame.groups())  # type: ignore[arg-type]
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        exc = _EXCEPTION.match(line.strip())
        if exc is None:
            continue
        user = [f for f in frames if not _LIBRARY.search(f[0])] or frames
        where = ""
        if user:
            path, number, func = user[-1]
            where = f"{path.rsplit('/', 1)[-1]}:{func}:{number}"
        return exc.group(1), where, line.strip()[:200]
    return None


def reports_gpu_fault(text: str) -> bool:
    """The job's output names a GPU hardware error (a claim for root to confirm)."""
    return SIGNATURES[0][1].search(text) is not None


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def oom_kill_in_output(text: str) -> str:
    """The output's last line that reports an OOM kill (slurmstepd's ``Detected 1 oom-kill
    event(s)``, the kernel's words), or "". Evidence only where the output is the caller's
    own (``jobwrap run``, as the job's user); root never takes it as a fact."""
    pattern = dict(SIGNATURES)[HOST_OOM]
    match = _last_match(pattern, text)
    return _line_of(text, match) if match else ""


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - we want the last one
        pass
    return found


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)].strip()[:200]


_ERROR_LINE = re.compile(r"^(\w+(\.\w+)*(Error|Exception)\b.*|error:.*|Error:.*|"
                         r"Segmentation fault.*|Killed.*)$", re.M)


def _last_error_line(text: str) -> str:
    match = _last_match(_ERROR_LINE, text)
    return match.group(0).strip()[:200] if match else ""


_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+(\.\d+)?|'[^']*'|\"[^\"]*\"", re.I)


def _normalise(line: str) -> str:
    """Strip numbers, addresses and quoted values: the same error compares equal."""
    return _VOLATILE.sub("#", line)[:160]
