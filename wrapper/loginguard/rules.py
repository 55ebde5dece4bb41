"""The guard's rules: which users' processes break the login-node policy, as pure functions.

Nothing here reads /proc or signals anything: :mod:`wrapper.loginguard.scan` turns
processes into :class:`ProcessSample` records, :func:`evaluate` turns those into
:class:`Finding` records, and :mod:`wrapper.loginguard.guard` decides what to do about
them; so every rule can be tested with a table of samples.
"""

from __future__ import annotations

import grp
import os
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import field

from wrapper.config import LoginGuardConfig
from wrapper.errors import ConfigError
from wrapper.fastdataclass import dataclass

KINDS = ("cpu", "memory", "gpu", "ai")
STEPS = ("warn", "throttle", "terminate")
TITLES = {"cpu": "sustained CPU use", "memory": "resident memory", "gpu": "GPU use",
          "ai": "AI workload"}
GIB = 1024**3
# A process using less than 1% of a core since the last scan is not what loads the node
# (an idle editor, a shell); throttling or killing it would punish the wrong thing.
BUSY_CORES = 0.01
# A user capped by cpu.max cannot exceed the cap; one still using 90% of it wants more
# than it allows, so the violation goes on (and may escalate).
PINNED_FRACTION = 0.9
_PYTHON = re.compile(r"(python|pypy)[0-9.]*")
# Python options that take a separate argument, so it is not read as the script.
_PYTHON_ARG_OPTIONS = frozenset({"-W", "-X", "--check-hash-based-pycs"})


@dataclass(frozen=True)
class ProcRef:
    """Enough to find one process again and be sure it is the same one (pids are reused)."""

    pid: int
    create_time: float
    name: str


@dataclass(frozen=True)
class ProcessSample:
    """One process of a user the guard watches, as one scan saw it."""

    pid: int
    create_time: float
    uid: int
    user: str
    name: str
    cmdline: tuple[str, ...]
    cpu_cores: float  # cores used since the previous scan; 0 when not measured
    rss: int  # resident bytes
    signature: str = ""  # the AI signature its name or command line matched
    ai_library: str = ""  # the AI library found mapped into it
    session: bool = False  # a login session or shell: a root program, clean, not busy
    exempt: str = ""  # the exempt command it is (its program, not its name), or ''
    children_cores: float = 0.0  # cores of its children that ended (and it waited for)

    @property
    def ref(self) -> ProcRef:
        return ProcRef(self.pid, self.create_time, self.name)


@dataclass(frozen=True)
class Snapshot:
    """What one scan saw: the watched users' processes and how CPU use was measured."""

    samples: tuple[ProcessSample, ...]
    cpus: int
    measured: bool  # False on a first scan: there is no earlier CPU reading to compare
    seconds: float  # the time CPU use was measured over
    processes: int  # every process seen, system ones included
    # Per uid, cores used by processes this scan did not see use them (short-lived ones,
    # the last moments of those that ended): from the user's cgroup, else from children.
    unseen: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """One user breaking one rule now, with the processes an action may touch."""

    uid: int
    user: str
    rule: str  # "cpu", "cpu:<command>", "memory", "gpu", "ai"
    kind: str  # which ladder and window apply: one of KINDS
    seen: str  # what was seen, for people: goes into messages and the audit
    value: float
    limit: float
    targets: tuple[ProcRef, ...]  # never a protected process, largest offender first


@dataclass(frozen=True)
class Policy:
    """The rules' settings, checked once; built from ``[login_guard]``."""

    min_uid: int = 1000
    exempt_users: frozenset[str] = frozenset()
    exempt_gids: frozenset[int] = frozenset()
    allowances: Mapping[str, float] = field(default_factory=dict)
    protected_commands: frozenset[str] = frozenset()
    cpu_share: float = 0.1
    cpu_window: float = 300.0
    memory_bytes: int = 32 * GIB
    memory_window: float = 60.0
    ai_window: float = 30.0
    ai_commands: tuple[tuple[str, ...], ...] = ()
    ai_libraries: tuple[str, ...] = ()
    ladders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    throttle_cpu_share: float = 0.02
    own_pids: frozenset[int] = frozenset()
    exempt_path: tuple[str, ...] = ()
    session_cpu_cores: float = 0.25

    @classmethod
    def from_config(cls, cfg: LoginGuardConfig, source: str,
                    own_pids: Collection[int] = ()) -> Policy:
        """Check what the schema cannot (shares, steps, NAME=SHARE) and build the policy.

        Raises ConfigError with every problem, each naming its ``[login_guard]`` key.
        """
        problems: list[str] = []
        for key in ("cpu_share", "command_cpu_share", "throttle_cpu_share"):
            value = getattr(cfg, key)
            if value > 1:
                problems.append(f"[login_guard] {key} = {value}: expected a share of the "
                                "node's cores, 1 or less (0.1 = 10%)")
        if not 0 <= cfg.throttle_nice <= 19:
            problems.append(f"[login_guard] throttle_nice = {cfg.throttle_nice}: expected "
                            "a nice value from 0 to 19")
        ladders: dict[str, tuple[str, ...]] = {}
        for kind in KINDS:
            steps = tuple(getattr(cfg, f"{kind}_actions"))
            bad = [s for s in steps if s not in STEPS]
            if bad or len(set(steps)) != len(steps):
                problems.append(f"[login_guard] {kind}_actions = {list(steps)}: expected "
                                f"distinct steps among {', '.join(STEPS)}")
            ladders[kind] = steps
        allowances: dict[str, float] = {}
        for entry in cfg.exempt_commands:
            name, sep, share_text = entry.partition("=")
            share = cfg.command_cpu_share
            if sep:
                try:
                    share = float(share_text)
                except ValueError:
                    share = -1.0
            if not name or not 0 < share <= 1:
                problems.append(f"[login_guard] exempt_commands: {entry!r}: expected NAME "
                                "or NAME=SHARE with 0 < SHARE <= 1")
                continue
            allowances[name] = share
        signatures = tuple(tuple(s.split()) for s in cfg.ai_commands)
        if any(not words for words in signatures):
            problems.append("[login_guard] ai_commands: expected no empty signature")
        gids: set[int] = set()
        for group in cfg.exempt_groups:
            try:
                gids.add(grp.getgrnam(group).gr_gid)
            except KeyError:
                # Failing closed: an exemption we cannot honour must not turn into a kill.
                problems.append(f"[login_guard] exempt_groups: no group named {group!r} "
                                "on this node")
        if problems:
            raise ConfigError(source, problems)
        return cls(
            min_uid=cfg.min_uid, exempt_users=frozenset(cfg.exempt_users),
            exempt_gids=frozenset(gids), allowances=allowances,
            protected_commands=frozenset(cfg.protected_commands), cpu_share=cfg.cpu_share,
            cpu_window=cfg.cpu_window, memory_bytes=int(cfg.memory_gib * GIB),
            memory_window=cfg.memory_window, ai_window=cfg.ai_window,
            ai_commands=signatures, ai_libraries=tuple(cfg.ai_libraries), ladders=ladders,
            throttle_cpu_share=cfg.throttle_cpu_share, own_pids=frozenset(own_pids),
            exempt_path=tuple(cfg.exempt_command_path),
            session_cpu_cores=cfg.session_cpu_cores,
        )

    def ignores_account(self, uid: int, user: str, gids: Iterable[int]) -> bool:
        """Root, system accounts and exempt users or groups are never touched."""
        if uid == 0 or uid < self.min_uid or user in self.exempt_users:
            return True
        return not self.exempt_gids.isdisjoint(gids)

    def window(self, kind: str) -> float:
        return {"cpu": self.cpu_window, "memory": self.memory_window}.get(kind, self.ai_window)

    def ladder(self, kind: str) -> tuple[str, ...]:
        return tuple(self.ladders.get(kind, ()))

    def signature(self, name: str, cmdline: tuple[str, ...]) -> str:
        """The AI signature a process's name or command line matches, or ''."""
        words = command_words(cmdline)
        for pattern in self.ai_commands:
            if (len(pattern) == 1 and name == pattern[0]) or words[:len(pattern)] == pattern:
                return " ".join(pattern)
        return ""

    def is_protected(self, sample: ProcessSample) -> bool:
        """Login sessions, shells and the guard itself are never signalled or reniced."""
        return sample.session or sample.pid in self.own_pids

    def is_session(self, name: str, binary: str | None, root_program: bool) -> bool:
        """Whether a process named ``name`` may be a login session or shell to protect.

        The name alone would let anyone protect a training run by naming it ``sshd``:
        the program must also be a root file (:mod:`wrapper.loginguard.trust`) and be
        that program (``sh`` runs ``dash``, ``ksh`` runs ``ksh93``). ``binary`` None: it
        could not be read, and protecting a real session matters more than catching a
        disguise. The scanner further requires that it maps no code but root's and is
        not busy (``session_cpu_cores``).
        """
        if name not in self.protected_commands:
            return False
        if binary is None:
            return True
        return root_program and (binary in self.protected_commands or binary.startswith(name))


def is_python(name: str) -> bool:
    return bool(_PYTHON.fullmatch(name))


def command_words(cmdline: tuple[str, ...]) -> tuple[str, ...]:
    """The words of a command line from the program on.

    The program is argv[0]'s file name; for a Python interpreter it is the module after
    ``-m`` or the script's file name, so ``python -m torch.distributed.run`` and
    ``/venv/bin/python /venv/bin/accelerate launch`` read as what they run. Code given
    with ``-c`` names no program.
    """
    if not cmdline:
        return ()
    first = os.path.basename(cmdline[0])
    if not is_python(first):
        return (first, *cmdline[1:])
    rest = cmdline[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "-m":
            return tuple(rest[i + 1:])
        if arg.startswith("-m"):
            return (arg[2:], *rest[i + 1:])
        if arg == "-c" or arg.startswith("-c"):
            return ()
        if arg in _PYTHON_ARG_OPTIONS:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return (os.path.basename(arg), *rest[i + 1:])
    return ()


def printable(text: str, limit: int = 160) -> str:
    """User-controlled text (process names, command lines) made safe for a terminal."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[:limit - 1] + "…"


def evaluate(snapshot: Snapshot, policy: Policy, gpu_pids: Collection[int] | None,
             capped: Collection[int] = ()) -> list[Finding]:
    """Every rule broken now, per user. ``gpu_pids`` None: the GPU probe had no answer.

    ``capped``: users whose slice is already limited by cpu.max; for them the CPU rule
    asks whether they are pinned against that cap.
    """
    by_uid: dict[int, list[ProcessSample]] = defaultdict(list)
    for sample in snapshot.samples:
        by_uid[sample.uid].append(sample)
    findings: list[Finding] = []
    for uid in sorted(by_uid):
        procs = by_uid[uid]
        if snapshot.measured:
            findings.extend(_cpu(procs, snapshot, policy, uid in capped))
        findings.extend(_memory(procs, policy))
        if gpu_pids is not None:
            findings.extend(_gpu(procs, policy, gpu_pids))
        findings.extend(_ai(procs, policy))
    return findings


def _busy(p: ProcessSample) -> float:
    return p.cpu_cores + p.children_cores


def _targets(procs: Iterable[ProcessSample], policy: Policy) -> tuple[ProcRef, ...]:
    return tuple(p.ref for p in procs if not policy.is_protected(p))


# CPU time comes in 10 ms ticks: over a shorter look than this, a process starting up
# reads as several cores. The service scans every [login_guard] interval (10 s).
MIN_CPU_SAMPLE = 0.25


def _cpu(procs: list[ProcessSample], snapshot: Snapshot, policy: Policy,
         capped: bool) -> list[Finding]:
    if snapshot.seconds < MIN_CPU_SAMPLE:
        return []
    # An exempt command's allowance covers its own CPU and its ended children's (make's
    # recipes, a compiler driver's cc1 and as): the command is known by its root-owned
    # program (trust.py), so a disguised interpreter earns no allowance, and what a real
    # make runs is bounded by make's allowance. Children of anything else, and what no
    # scan saw (processes too short-lived to be seen), count against the general share.
    groups: dict[str, list[ProcessSample]] = defaultdict(list)
    children: dict[str, float] = defaultdict(float)
    for p in procs:
        rule = f"cpu:{p.exempt}" if p.exempt in policy.allowances else "cpu"
        groups[rule].append(p)
        children[rule] += p.children_cores
    unseen = snapshot.unseen.get(procs[0].uid, 0.0)
    children["cpu"] += unseen
    if children["cpu"]:
        groups.setdefault("cpu", [])
    found = []
    for rule, members in sorted(groups.items()):
        limit = policy.cpu_share if rule == "cpu" else policy.allowances[rule[4:]]
        if capped:
            limit = min(limit, PINNED_FRACTION * policy.throttle_cpu_share)
        cores = sum(p.cpu_cores for p in members) + children[rule]
        share = cores / snapshot.cpus
        if share <= limit:
            continue
        busy = sorted((p for p in members if _busy(p) >= BUSY_CORES), key=_busy, reverse=True)
        top = ", ".join(f"{p.pid} {printable(p.name, 40)} {p.cpu_cores:.2f}"
                        + (f" (+{p.children_cores:.2f} ended children)"
                           if p.children_cores >= BUSY_CORES else "")
                        for p in busy[:5])
        what = "your processes" if rule == "cpu" else f"your {rule[4:]} processes"
        seen = (f"{what} used {cores:.2f} cores ({share:.0%} of the node's {snapshot.cpus}) "
                f"over the last {snapshot.seconds:.0f} s; allowed {limit:.0%}"
                + (f" (busiest: {top})" if top else "")
                + (f"; {unseen:.2f} cores of it by processes too short-lived to be seen"
                   if rule == "cpu" and unseen >= BUSY_CORES else ""))
        found.append(Finding(procs[0].uid, procs[0].user, rule, "cpu", seen, share, limit,
                             _targets(busy, policy)))
    return found


def _memory(procs: list[ProcessSample], policy: Policy) -> list[Finding]:
    total = sum(p.rss for p in procs)
    if total <= policy.memory_bytes:
        return []
    # The largest first, only as many as bring the user back under the cap.
    chosen, left = [], total
    for p in sorted(procs, key=lambda p: p.rss, reverse=True):
        if left <= policy.memory_bytes:
            break
        if not policy.is_protected(p):
            chosen.append(p)
            left -= p.rss
    top = ", ".join(f"{p.pid} {printable(p.name, 40)} {p.rss / GIB:.1f} GiB" for p in chosen[:5])
    seen = (f"your processes hold {total / GIB:.2f} GiB of resident memory; allowed "
            f"{policy.memory_bytes / GIB:.2f} GiB" + (f" (largest: {top})" if top else ""))
    return [Finding(procs[0].uid, procs[0].user, "memory", "memory", seen, total,
                    policy.memory_bytes, _targets(chosen, policy))]


def _gpu(procs: list[ProcessSample], policy: Policy, gpu_pids: Collection[int]) -> list[Finding]:
    on_gpu = [p for p in procs if p.pid in gpu_pids]
    if not on_gpu:
        return []
    names = ", ".join(f"{p.pid} {printable(p.name, 40)}" for p in on_gpu[:5])
    seen = f"{len(on_gpu)} of your processes use a GPU of this login node ({names})"
    return [Finding(procs[0].uid, procs[0].user, "gpu", "gpu", seen, len(on_gpu), 0,
                    _targets(on_gpu, policy))]


def _ai(procs: list[ProcessSample], policy: Policy) -> list[Finding]:
    # a launcher's signature (torchrun, deepspeed) tells more than a library loaded: first
    ai = sorted((p for p in procs if p.signature or p.ai_library),
                key=lambda p: (not p.signature, p.pid))
    if not ai:
        return []
    parts = []
    for p in ai[:5]:
        why = f"runs {p.signature}" if p.signature else f"has {p.ai_library} loaded"
        parts.append(f"{p.pid} {printable(' '.join(p.cmdline) or p.name, 80)} ({why})")
    seen = f"AI workload on a login node: {'; '.join(parts)}"
    return [Finding(procs[0].uid, procs[0].user, "ai", "ai", seen, len(ai), 0,
                    _targets(ai, policy))]
