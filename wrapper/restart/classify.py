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
from dataclasses import field, replace

from wrapper.job.events import GpuFault, Hang, HangInPlace
from wrapper.lean import dataclass

# Classes, and whether a retry can help at all (the policy decides whether it will).
SUCCESS = "success"
HARDWARE = "hardware"
NODE_FAILURE = "node_failure"
HANG = "hang"
COLLECTIVE_TIMEOUT = "collective_timeout"  # gloo or NCCL: a peer vanished or timed out
NCCL_TIMEOUT = COLLECTIVE_TIMEOUT  # its name before gloo was recognised too
KILLED = "killed"  # SIGKILL from outside the job with no OOM kill recorded: retried
CUDA_OOM = "cuda_oom"
HOST_OOM = "host_oom"
WALLTIME = "walltime"
PREEMPTED = "preempted"
CANCELLED = "cancelled"
STAGING = "staging"  # the job's declared data could not be staged: the user's input
UNCHECKED = "unchecked"  # jobwrap's prolog did not run on the node for the attempt
USER_ERROR = "user_error"

RETRYABLE = {HARDWARE, NODE_FAILURE, HANG, COLLECTIVE_TIMEOUT, WALLTIME, PREEMPTED, HOST_OOM,
             USER_ERROR, KILLED, UNCHECKED}
# Classes that are no fault of the job: they do not count against its progress. Each
# rests on root's facts alone (root's GPU check, Slurm's NODE_FAIL and PREEMPTED); a kill
# is not among them, since the job can kill itself (``kill -9 $$``, ``exit 137``) and the
# brakes would then never apply: classes the job's own output or exit can pick may only
# make an attempt more the job's fault, never less.
NOT_THE_JOBS_FAULT = {HARDWARE, NODE_FAILURE, PREEMPTED, UNCHECKED}

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
    # where, from wrapper.restart.signals; "" when none was recorded.
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


def _classify(ev: Evidence) -> Classification:
    state = ev.slurm_state.upper()
    signal_note = f" (signal {ev.exit_signal})" if ev.exit_signal else ""
    if state == "NODE_FAIL":
        return Classification(NODE_FAILURE, "Slurm reported NODE_FAIL", "node_fail")
    if state == "PREEMPTED":
        return Classification(PREEMPTED, "preempted by Slurm", "preempted")
    succeeded = state == "COMPLETED" or (ev.exit_code == 0 and not ev.exit_signal
                                         and state not in ("CANCELLED", "FAILED"))
    if ev.unchecked and not succeeded and state != "CANCELLED":
        return Classification(UNCHECKED, f"{ev.unchecked}; the task-prolog ended the attempt "
                              "before the job's code started", "unchecked")
    if ev.staging_error:
        return Classification(STAGING, f"the job could not be prepared: {ev.staging_error}",
                              "staging")
    if ev.gpu_check_failed:
        why = "the supervisor saw a GPU fault, confirmed by root's GPU check" \
            if GpuFault.KIND in ev.supervisor_events else "the post-job GPU check failed"
        return Classification(HARDWARE, why, "gpu_fault")
    unconfirmed = list(ev.unconfirmed)
    if GpuFault.KIND in ev.supervisor_events:
        unconfirmed.append("the supervisor's GPU fault")
    if ended_by_hang(ev.supervisor_events):
        return Classification(HANG, "no progress and no output for the hang timeout; "
                              "jobwrap ended the job", "hang")
    if HangInPlace.KIND in ev.supervisor_events and state not in ("TIMEOUT", "CANCELLED",
                                                                   "OUT_OF_MEMORY") \
            and _sigkill(ev):
        # The supervisor ended the hung steps for jobwrap run, whose brakes then stopped
        # (or which ended with them) and passed on their SIGKILL: still the hang's doing.
        return Classification(HANG, "no progress and no output for the hang timeout; "
                              "jobwrap ended the job's steps and jobwrap run did not "
                              "restart them", "hang")
    if state == "TIMEOUT":
        return Classification(WALLTIME, "reached its time limit", "walltime")
    if state == "OUT_OF_MEMORY":
        return Classification(HOST_OOM, "Slurm reported OUT_OF_MEMORY", "host_oom")
    failed = state in ("FAILED", "") and not (ev.exit_code == 0 and not ev.exit_signal)
    if ev.oom_kill and failed:
        return Classification(HOST_OOM, f"the kernel's OOM killer ended it ({ev.oom_kill})",
                              "host_oom")
    if ev.requeued_before_limit_s is not None and state != "CANCELLED":
        left = max(0, round(ev.requeued_before_limit_s))
        return Classification(WALLTIME, f"requeued {left} s before its time limit, by the "
                              "job's side (jobwrap's supervisor once the save it asked for "
                              "was on disk, or the job's own signal trap)", "walltime")
    cancelled = _cancel_line(ev) if state != "COMPLETED" else ""
    if cancelled and GpuFault.KIND not in ev.supervisor_events:
        # While the job completes Slurm's record says COMPLETING and the exit Slurm hands
        # the epilog is 0 (the batch script had not ended when it was cancelled): the line
        # slurmstepd wrote into the job's output is all that tells. The job's own words, so
        # they may only stop it (scancel's effect), never requeue it nor loosen a brake.
        return Classification(CANCELLED, f"cancelled while it ran: {cancelled} (slurmstepd's "
                              "line in the job's output)", "cancelled")
    if succeeded:
        return Classification(SUCCESS, "exit 0", "")
    if state == "CANCELLED":
        return Classification(CANCELLED, "cancelled (scancel)", "cancelled")
    killed = _sigkill(ev)
    if killed:
        detail = f"{killed}; no OOM kill recorded for the job: ended from outside"
        if unconfirmed:
            detail += f"; not confirmed by root: {', '.join(unconfirmed)}"
        return Classification(KILLED, detail, "killed")
    last = ""
    # A rank's own crash is the cause; its peers' gloo/NCCL errors that follow are not.
    crash = _last_match(_CRASH, ev.output_tail)
    for kind, pattern in SIGNATURES:
        match = _last_match(pattern, ev.output_tail)
        if match and crash and kind == COLLECTIVE_TIMEOUT:
            continue
        if match:
            line = _line_of(ev.output_tail, match)
            # The job's own words: not hardware, nor an OOM kill, unless root saw it
            # (its GPU check; Slurm's OUT_OF_MEMORY or the job's memory cgroup, above).
            if kind in UNCONFIRMED_IN_OUTPUT:
                unconfirmed.append(UNCONFIRMED_IN_OUTPUT[kind])
                last = line
                continue
            return Classification(kind, f"output says: {line}", f"{kind}:{_normalise(line)}")
    if crash:
        line = _line_of(ev.output_tail, crash)
        detail = f"a rank crashed: {line}"
        if unconfirmed:
            detail += f"; not confirmed by root: {', '.join(unconfirmed)}"
        return Classification(USER_ERROR, detail, f"crash:{_normalise(line)}")
    traceback = last_traceback(ev.output_tail)
    if traceback is not None:
        exc_type, frame, line = traceback
        detail = f"{line}" + (f" (at {frame})" if frame else "")
        if unconfirmed:
            detail += f"; not confirmed by root: {', '.join(unconfirmed)}"
        return Classification(USER_ERROR, detail, f"traceback:{exc_type}:{frame}")
    last = last or _last_error_line(ev.output_tail)
    code = ev.exit_code if ev.exit_code is not None else -1
    if 128 < code < 160 and not ev.exit_signal:
        signal_note = f" (a command killed by {_signal_name(code - 128)})"
    detail = f"exit {code}{signal_note}" + (f"; last error: {last}" if last else "")
    if unconfirmed:
        detail += f"; not confirmed by root: {', '.join(unconfirmed)}"
    return Classification(USER_ERROR, detail,
                          f"exit:{code}:{ev.exit_signal or 0}:{_normalise(last)}")


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
