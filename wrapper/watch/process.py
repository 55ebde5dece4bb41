"""Start, stop and run a node's watcher process (``python -I -m wrapper.watch``).

The prolog starts it detached (``wrapper.detach``: new session, ``/``, no inherited
descriptors); it writes ``watch-<node>.json`` (its pid and start time) into the job's
root-owned state folder; the epilog of the node stops it by that pid, after checking that
the process is still the same watcher (start time and command line), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.errors import JobwrapError, format_of
from wrapper.job import events as ev
from wrapper.job.paths import PULSE_HANG_FILE, PULSE_SPEED_FILE
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.slurm.context import JobContext
from wrapper.watch.feed import Fault, Watcher
from wrapper.watch.files import WATCH_FORMAT, forensics_file, pid_file

if TYPE_CHECKING:
    import argparse

    from wrapper.gpu.nvml import XidListener
    from wrapper.pulse.judge import SlowJudge, Verdict
    from wrapper.slurm import SlurmBackend

MODULE = "wrapper.watch"  # in its command line: the epilog checks it before it stops it
WATCH_ASK_EVERY = 600.0  # seconds between a watcher's asks to slurmctld (see run())
PULSE_NICE = -10  # the pulse's thread, above the job's ranks (0) on a starved CPU
TICK_MAX = 1.0  # seconds between two looks of the watcher's loop, at most


def start(ctx: JobContext, cfg: Config, state: JobState,
          spawn: Callable[[Sequence[str]], object] | None = None) -> str | None:
    """Start the watcher of this node (prolog, root); returns how, None when not started.
    ``spawn`` (the hook's injected spawner, a fake in unit tests) replaces the detach."""
    if not cfg.supervisor.node_watch or os.geteuid() != 0:  # GPUs or not: hang forensics
        return None
    import sys

    from wrapper import detach

    argv = [sys.executable, "-I", "-m", MODULE, ctx.job_id, "--node", ctx.node,
            "--attempt", str(ctx.attempt), "--gpus", ",".join(map(str, ctx.gpus)),
            "--uid", str(ctx.uid), "--gid", str(ctx.gid), "--nodes", ",".join(ctx.nodes)]
    if spawn is not None:
        spawn(argv)
        return "spawned"
    pid = detach.spawn(argv, detach.hook_env(cfg.source))
    JobStore(state).record(ev.WatchStarted(attempt=ctx.attempt, node=ctx.node, pid=pid))
    return f"detached:{pid}"


def stop(state: JobState, node: str) -> bool:
    """Stop this node's watcher of the job (epilog, root); True when one was stopped."""
    import psutil

    record = state.read_json(pid_file(node))
    if not record:
        return False
    format_of(record, "format", known=WATCH_FORMAT, path=state.path / pid_file(node),
              what="watcher record")
    try:
        pid, started = int(record["pid"]), float(record["started"])
        proc = psutil.Process(pid)
        same = abs(proc.create_time() - started) < 0.01 and MODULE in proc.cmdline() \
            and state.job_id in proc.cmdline()
        if not same:
            return False
        proc.terminate()
        proc.wait(timeout=5)
    except (KeyError, TypeError, ValueError, psutil.Error):
        return False
    return True


def read_faults(cfg: Config, node: str, gpus: Sequence[int],
                listener: XidListener | None = None) -> list[Fault]:
    """Faults on ``gpus`` now, through the probe seam and the prolog's checks (Xids from
    ``listener``, NVML's event API, where the watcher has one)."""
    from wrapper.gpu import faults
    from wrapper.slurm.commands import drain_reason

    try:
        failures = faults.read(cfg, node, gpus, listener=listener)
    except JobwrapError as exc:  # the probe, not the GPU: jobwrap's problem, keep watching
        log.get().warning("watch.gpu_unreadable", error=str(exc))
        return []
    out = []
    for r in failures:
        where = f" gpu{r.gpu_index}" if r.gpu_index is not None else ""
        if where and r.gpu_uuid:
            where += f"({r.gpu_uuid[:12]})"
        out.append(Fault(r.check, r.gpu_index,
                         drain_reason(f"jobwrap: {r.check}{where}: {r.reason}")))
    return out


def spare_may_take(state: JobState, node: str, attempt: int) -> bool:
    """Whether a fault here ends only the job's steps, not its batch script: the job
    holds spare nodes (root's record of its options), this is not the node its batch
    script runs on, and its command runs under ``jobwrap run`` this attempt (the user's
    word: a job that lies keeps its own allocation on a node that is drained anyway)."""
    from wrapper.job import record as jobrecord

    try:
        record = jobrecord.load(state)
    except (JobwrapError, OSError):
        return False
    if not record.job_options.spare_nodes or node == record.first_node:
        return False
    return JobStore(state).under_run(attempt)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m wrapper.watch")
    parser.add_argument("job_id")
    parser.add_argument("--node", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--gpus", required=True)
    parser.add_argument("--uid", type=int, default=-1)
    parser.add_argument("--gid", type=int, default=-1)
    parser.add_argument("--nodes", default="")  # the job's, its first node first
    args = parser.parse_args(argv)
    import time

    import psutil

    from wrapper import config, slurm
    from wrapper.job import state as state_mod

    os.chdir("/")
    cfg = config.load(None, node=args.node)
    log.configure(file=cfg.log.file, level=cfg.log.level, stderr_format="logfmt")
    log.bind(hook="watch", job_id=args.job_id, node=args.node, attempt=args.attempt)
    gpus = [int(g) for g in args.gpus.split(",") if g]
    read_gpu_faults = _gpu_fault_reader(cfg, args.node, gpus)
    state = state_mod.for_job(cfg, args.job_id)
    store = JobStore(state)
    state.write_json(pid_file(args.node), {
        "format": WATCH_FORMAT, "pid": os.getpid(), "started": psutil.Process().create_time(),
        "attempt": args.attempt})
    backend = slurm.backend(cfg.slurm)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    from wrapper.supervisor.launch import SlurmLook

    # The epilog stops the watcher, and root's epilog.context of the attempt ends it too:
    # Slurm is only the safety net for a node whose epilog never runs, asked once every
    # WATCH_ASK_EVERY s (a 1,000-node job's watchers: under 2 calls a second, none at start).
    job_state = SlurmLook(backend, args.job_id, state, args.attempt,
                          unreachable_after=cfg.supervisor.slurm_unreachable,
                          ask_every=WATCH_ASK_EVERY, ask_at_once=False)

    def superseded() -> bool:
        return any(isinstance(e, ev.PrologContext) and e.node == args.node
                   and e.attempt > args.attempt for e in store.root_events())

    on_fault = _fault_handler(store, backend, args)

    sup = cfg.supervisor
    samples = _Samples(args)
    forensics = _forensics_reader(cfg, store, args, gpus, samples)

    from wrapper.watch.keeper import SupervisorKeeper

    def restart_supervisor() -> str:
        from wrapper.supervisor.launch import start as start_supervisor

        return start_supervisor(args.job_id, cfg)

    keep = SupervisorKeeper(state, job_id=args.job_id, node=args.node, attempt=args.attempt,
                            restart=restart_supervisor) \
        if cfg.supervisor.enabled and args.uid > 0 else None

    watcher = Watcher(job_id=args.job_id, node=args.node, attempt=args.attempt,
                      interval=sup.gpu_interval, slurm_interval=sup.slurm_interval,
                      slurm_unreachable=sup.slurm_unreachable,
                      read_faults=read_gpu_faults,
                      job_state=job_state, superseded=superseded, on_fault=on_fault,
                      forensics=forensics, keep=keep,
                      clock=time.monotonic)
    pulse = _start_pulse(cfg, store, backend, args, superseded, samples)
    sampler = _start_sampler(cfg, store, args, samples, pulse)
    try:
        # a 1 s look at the hang fact (one stat): the forensics follow a hang at once
        watcher.run(sleep=lambda s: done.wait(min(s, TICK_MAX)), stopped=done.is_set)
    finally:
        for part in (sampler, pulse):
            if part is not None:
                part.stop()
    return 0


class _Samples:
    """The newest sample of each node's ranks (wrapper/watch/ranks.py): on the job's first
    node every node's, as they arrive (the hub's thread puts, the sampler's judges); on the
    others this node's own, for its beat to carry once."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.by_node: dict[str, tuple[float, dict[str, object]]] = {}
        self.outgoing: bytes | None = None
        self.lock = threading.Lock()
        self.lost: set[str] = set()  # nodes the hub judged lost: no longer waited for

    def put(self, node: str, sample: dict[str, object]) -> None:
        import time

        with self.lock:
            self.by_node[node] = (time.monotonic(), sample)

    def heard(self, node: str, payload: bytes) -> None:
        """A node's sample, off the pulse (root's, on that node: its hello was checked)."""
        import json

        try:
            sample = json.loads(payload)
        except ValueError:
            return
        if isinstance(sample, dict) and sample.get("node") == node:
            self.put(node, sample)

    def send(self, sample: dict[str, object]) -> None:
        import json

        with self.lock:
            self.outgoing = json.dumps(sample, separators=(",", ":")).encode()

    def take(self) -> bytes | None:
        with self.lock:
            out, self.outgoing = self.outgoing, None
            return out

    def snapshot(self) -> dict[str, tuple[float, dict[str, object]]]:
        with self.lock:
            return dict(self.by_node)


def _start_sampler(cfg: Config, store: JobStore, args: argparse.Namespace,
                   samples: _Samples, pulse: _Pulse | None) -> _Pulse | None:
    """This node's sampler of the job's ranks, every ``[pulse] sample_interval``; on the
    job's first node also the judge of every node's samples (wrapper/pulse/judge.py).
    None with ``[pulse] samples`` off, without the job's user, or on a node other than the
    first whose samples have no way to the hub (no pulse)."""
    nodes = [n for n in args.nodes.split(",") if n] or [args.node]
    first = args.node == nodes[0]
    if not cfg.pulse.samples or args.uid <= 0 or (not first and pulse is None):
        return None
    import time

    from wrapper.pulse.judge import HangJudge, SlowJudge
    from wrapper.watch.ranks import NodeSampler

    p = cfg.pulse
    interval = p.sample_interval
    sampler = NodeSampler(job_id=args.job_id, node=args.node, uid=args.uid, gid=args.gid,
                          flight_folder=_flight_folder(cfg, args))
    judge = HangJudge(floor=p.hang_floor, k=p.hang_k, interval=interval) \
        if first and (pulse is not None or len(nodes) == 1) else None
    slow = SlowJudge(window=p.slow_window, below=p.slow_below, hold=p.slow_hold,
                     interval=interval) \
        if judge is not None and p.slow_below > 0 and len(nodes) > 1 else None
    kept: list[tuple[dict[str, float], list[str]]] = []  # what was last written for the epilog
    stopping = threading.Event()

    def run() -> None:
        while not stopping.is_set():
            started = time.monotonic()
            sample = sampler.sample(budget=interval)
            log.get().debug("pulse.sampled", ranks=len(sample["ranks"]),
                            flight=len(sample.get("fr") or ()),
                            seconds=round(time.monotonic() - started, 3),
                            spent_s=round(sampler.spent, 3))
            if judge is None:
                samples.send(sample)
            else:
                samples.put(args.node, sample)
                now, seen = time.monotonic(), samples.snapshot()
                alive = [n for n in nodes if n not in samples.lost]
                verdict = judge.round(now, seen, alive)
                if verdict is not None:
                    _hang_found(store, args, verdict, seen)
                if slow is not None:
                    for node in slow.round(now, seen, alive, stuck=judge.since is not None):
                        _slow_found(cfg, store, args, node, slow)
                    now_kept = (dict(slow.scores), sorted(slow.named))
                    if slow.scores and [now_kept] != kept and _keep_speed(store, args, slow):
                        kept[:] = [now_kept]
            stopping.wait(max(0.2, interval - (time.monotonic() - started)))

    def guarded() -> None:
        try:
            run()
        except Exception as exc:  # the samples end; the watcher's own work goes on
            log.get().error("pulse.samples_off", why=f"the sampler failed: {exc!r}"[:300])

    import contextvars

    thread = threading.Thread(target=contextvars.copy_context().run, args=(guarded,),
                              name="pulse-samples", daemon=True)
    thread.start()
    return _Pulse(thread, stopping)


def _slow_found(cfg: Config, store: JobStore, args: argparse.Namespace, node: str,
                judge: SlowJudge) -> None:
    """A node named slow: root's ``pulse.slow`` and the metrics; the first node's epilog
    tells the job's output (wrapper/hooks/aftermath.py). Nothing else: what follows (a
    drain after N jobs, a spare) is the site's, from the record."""
    from wrapper import metrics

    score = judge.named[node]
    log.get().warning("pulse.slow", slow_node=node, score=score, scores=judge.scores)
    try:
        store.record(ev.PulseSlow(attempt=args.attempt, node=args.node, slow=node,
                                  score=score, scores=dict(judge.scores),
                                  window_s=judge.window, held_s=judge.hold))
    except (JobwrapError, OSError) as exc:
        log.get().error("pulse.not_recorded", error=str(exc)[:300])
    if cfg.metrics.textfile:
        metrics.record_slow_node(cfg.metrics, node=node, score=score)


def _keep_speed(store: JobStore, args: argparse.Namespace, judge: SlowJudge) -> bool:
    """Every node's newest score, for the epilog's ``pulse.speed`` (one root file,
    rewritten when a score changes: no event per round); a node named and since lost
    keeps the score it was named at. False when it could not be written."""
    try:
        store.state.write_json(PULSE_SPEED_FILE, {
            "attempt": args.attempt, "scores": {**judge.named, **judge.scores},
            "named": sorted(judge.named), "window_s": judge.window})
    except (JobwrapError, OSError) as exc:
        log.get().error("pulse.not_recorded", error=str(exc)[:300])
        return False
    return True


def _hang_found(store: JobStore, args: argparse.Namespace, verdict: Verdict,
                samples: Mapping[str, tuple[float, dict[str, object]]]) -> None:
    """The judge's hang: root's ``pulse.hang`` and the file the supervisor looks at each
    tick (``pulse-hang.json``, root's, in the job's state folder): it ends the hang as its
    own, after the forensics. Where ranks dumped PyTorch's flight recorder, the ranks it
    says never joined are named too."""
    import time

    from wrapper.pulse.judge import label
    from wrapper.watch.flight import not_joined

    named = [label(s) for s in verdict.stuck]
    # dumps written since the job got stuck (less a margin): an earlier run's, left in the
    # scratch by a restart in place, say nothing of this hang
    since = time.time() - verdict.held_s - 30.0
    flight, said = not_joined(r for _, sample in samples.values() for r in _flight_of(sample)
                              if not isinstance(when := r.get("mtime"), int | float)
                              or when >= since)
    log.get().error("pulse.hang", stuck=named, held_s=verdict.held_s, why=verdict.why,
                    flight=flight)
    event = ev.PulseHang(attempt=args.attempt, node=args.node, stuck=named,
                         ranks=verdict.ranks, waiting=verdict.waiting,
                         held_s=verdict.held_s, window_s=verdict.window_s,
                         why=verdict.why + (f"; flight recorder: {said}" if said else ""),
                         flight=flight)
    try:
        store.state.write_json(PULSE_HANG_FILE, {**event.encode(), "time": time.time()})
        store.record(event)
    except (JobwrapError, OSError) as exc:
        log.get().error("pulse.not_recorded", error=str(exc)[:300])


class _Pulse:
    """The pulse's thread of this watcher (the hub on the job's first node, a beater on
    every other) and how it is stopped."""

    def __init__(self, thread: threading.Thread, stopping: threading.Event) -> None:
        self.thread, self.stopping = thread, stopping

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=2.0)


def _start_pulse(cfg: Config, store: JobStore, backend: SlurmBackend,
                 args: argparse.Namespace, superseded: Callable[[], bool],
                 samples: _Samples) -> _Pulse | None:
    """This node's part of the job's pulse (wrapper/pulse/); None for a one-node job, with
    the pulse off, or when it cannot start (logged: the job runs on Slurm's clocks)."""
    nodes = [n for n in args.nodes.split(",") if n]
    if not cfg.pulse.enabled or len(nodes) < 2 or args.node not in nodes:
        return None
    import socket

    from wrapper.pulse import Settings, munge
    from wrapper.pulse.wire import port_range

    settings = Settings(interval=cfg.pulse.interval, lost_after=cfg.pulse.lost_after,
                        fence_grace=cfg.pulse.fence_grace, ports=port_range(cfg.pulse.ports))
    first = nodes[0]
    try:
        host = socket.gethostbyname(cfg.pulse.address.replace("{node}", first))
    except OSError as exc:
        log.get().error("pulse.off", why=f"cannot resolve the hub's address: {exc}")
        return None
    stopping = threading.Event()
    if args.node == first:
        from wrapper.pulse.hub import Hub

        lost_now: list[set[str]] = []
        hub = Hub(job_id=args.job_id, attempt=args.attempt, node=args.node, nodes=nodes,
                  settings=settings, signer=munge, on_sample=samples.heard,
                  on_lost=_loss_handler(cfg, store, backend, args, lost_now, len(nodes) - 1))
        lost_now.append(hub.lost)
        samples.lost = hub.lost
        if hub.bind(host) is None:
            log.get().error("pulse.off", why=f"no port of [pulse] ports {cfg.pulse.ports} "
                            "in the job's sequence is free")
            return None
        log.get().info("pulse.hub", port=hub.port)
        target = hub.run
    else:
        from wrapper.pulse.beat import Beater

        beater = Beater(job_id=args.job_id, attempt=args.attempt, node=args.node,
                        hub_host=host, settings=settings, signer=munge,
                        sample=samples.take, on_fence=_fencer(store, args, superseded))
        target = beater.run

    def run() -> None:
        with contextlib.suppress(OSError):  # the beat before the job's work, on a busy CPU
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PULSE_NICE)
        try:
            target(stopping.is_set)
        except Exception as exc:  # the pulse ends; the watcher's own work goes on
            log.get().error("pulse.off", why=f"the pulse failed: {exc!r}"[:300])

    import contextvars

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,),
                              name="pulse", daemon=True)  # its log lines name the job
    thread.start()
    return _Pulse(thread, stopping)


def _loss_handler(cfg: Config, store: JobStore, backend: SlurmBackend,
                  args: argparse.Namespace, lost_now: list[set[str]], others: int
                  ) -> Callable[[str, float], None]:
    """The hub's action on a lost node: root's record at once; the node DOWN in Slurm once
    its own fence has surely run (``[pulse] fence_grace``), where the site wants it, and
    only while at most half of the job's other nodes (one, at least) went silent at once:
    more than that is the hub's own link failing, not theirs (its nodes fence their work
    themselves; nothing is set DOWN on the hub's doubt)."""
    import time

    from wrapper.slurm.commands import drain_reason

    def record(event: ev.Event) -> None:
        try:
            store.record(event)
        except (JobwrapError, OSError) as exc:  # a stalled state disk: the action goes on
            log.get().error("pulse.not_recorded", error=str(exc)[:300])

    def on_lost(node: str, silent: float) -> None:
        record(ev.PulseLost(attempt=args.attempt, node=args.node, lost=node,
                            silent_s=round(silent, 2)))
        if cfg.pulse.action != "down":
            return
        time.sleep(cfg.pulse.fence_grace)
        lost = len(lost_now[0]) if lost_now else 1
        reason = drain_reason(f"jobwrap: lost: no heartbeat from its watcher for "
                              f"{silent:.1f} s (job {args.job_id})")
        error = ""
        if lost > max(1, others // 2):
            error = (f"not set DOWN: {lost} of the job's {others} other nodes went silent "
                     "at once; the hub's own link is suspect")
            log.get().error("pulse.hub_suspect", lost_node=node, lost=lost, others=others)
        else:
            try:
                backend.down_node(node, reason)
            except JobwrapError as exc:
                error = str(exc)[:300]
                log.get().error("pulse.down_failed", lost_node=node, error=error)
        record(ev.PulseDown(attempt=args.attempt, node=args.node, lost=node,
                            reason=reason, error=error))

    return on_lost


def _fencer(store: JobStore, args: argparse.Namespace, superseded: Callable[[], bool]
            ) -> Callable[[float, str], None]:
    """The fence: SIGKILL the job's processes on this node (the job user's, whose
    environment names the job and no other node: wrapper.watch.forensics.job_processes,
    every one of them), then root's record; none where a later attempt of the job
    already runs here (its processes are not this attempt's). Slurm may be out of reach
    from here: nothing is asked of it."""

    def fence(silent: float, why: str) -> None:
        from wrapper.watch.procs import job_processes

        killed = 0
        if args.uid > 0 and not superseded():
            for proc in job_processes(args.job_id, args.uid, node=args.node, limit=None):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc["pid"], signal.SIGKILL)
                    killed += 1
        log.get().error("pulse.fenced", silent_s=round(silent, 2), why=why, killed=killed)
        try:
            store.record(ev.PulseFenced(attempt=args.attempt, node=args.node,
                                        silent_s=round(silent, 2), why=why, killed=killed))
        except (JobwrapError, OSError) as exc:
            log.get().error("pulse.not_recorded", error=str(exc)[:300])

    return fence


def _gpu_fault_reader(cfg: Config, node: str, gpus: list[int]) -> Callable[[], list[Fault]]:
    """The watcher's reading of the job's GPUs on this node."""
    if not gpus:  # a job without GPUs: the watcher is there for the hang forensics only
        return list
    from wrapper.gpu.nvml import open_xid_listener

    # NVML's Xid events where the driver gives them (registered once, for the job's
    # life), opened in a thread of its own: NVML on a sick node can hang, and the
    # watcher's own checks must start regardless. Until it answers, and where it
    # cannot, the kernel log is the source (wrapper.gpu.kmsg).
    listening: list[XidListener | None] = []

    def open_listener() -> None:
        listener = open_xid_listener(cfg.gpu)
        listening.append(listener)
        log.get().info("watch.xid_source", source="nvml-events" if listener is not None
                       else cfg.gpu.xid_source)

    threading.Thread(target=open_listener, name="xid-listener", daemon=True).start()

    def read_gpu_faults() -> list[Fault]:
        return read_faults(cfg, node, gpus, listening[0] if listening else None)

    return read_gpu_faults


def _fault_handler(store: JobStore, backend: SlurmBackend, args: argparse.Namespace
                   ) -> Callable[[list[Fault]], None]:
    """What the watcher does on a fault: record it, drain the node, end the job (or, where
    a spare can take over under jobwrap run, its steps only)."""

    def on_fault(faults: list[Fault]) -> None:
        reason = faults[0].reason
        store.record(ev.WatchFault(attempt=args.attempt, node=args.node,
                                   faults=[f.reason for f in faults], reason=reason))
        log.get().error("watch.fault", reason=reason, faults=len(faults))
        try:  # first: the first node's decision learns of it from Slurm
            backend.drain_node(args.node, reason)
        except JobwrapError as exc:
            log.get().error("watch.drain_failed", error=str(exc))
        steps_only = spare_may_take(store.state, args.node, args.attempt)
        try:  # the job's steps only, where jobwrap run restarts the work on a spare
            if steps_only:
                backend.kill_steps(args.job_id)
            else:
                backend.signal_job(args.job_id, "KILL", full=True)
            store.record(ev.WatchEndedJob(attempt=args.attempt, node=args.node,
                                          reason=reason))
        except JobwrapError as exc:
            log.get().error("watch.end_failed", error=str(exc))

    return on_fault


def _forensics_reader(cfg: Config, store: JobStore, args: argparse.Namespace,
                      gpus: list[int], samples: _Samples) -> Callable[[], None]:
    """The node's part of a hang's forensics, once the supervisor asks for it (its fact is
    in this node's state folder: the job's first node's). There, every other node's part
    is its newest pulse sample (each rank's frame and whether it waits in a collective,
    a few seconds old): no node reads another's folder."""
    from wrapper.watch import forensics as fx

    trigger = fx.Trigger(store.state, args.attempt)

    def forensics() -> None:
        if args.uid < 0 or cfg.supervisor.forensics_timeout <= 0 or not trigger.wanted():
            return
        found = fx.collect(cfg, job_id=args.job_id, node=args.node, attempt=args.attempt,
                           uid=args.uid, gid=args.gid, gpus=gpus,
                           budget=max(2.0, cfg.supervisor.forensics_timeout
                                          - cfg.supervisor.gpu_interval),
                           flight_folder=_flight_folder(cfg, args))
        store.state.write_json(forensics_file(args.node), {"format": WATCH_FORMAT, **found})
        store.record(ev.WatchForensics(
            attempt=args.attempt, node=args.node,
            ranks=[{k: r.get(k) for k in ("node", "pid", "rank", "signature",
                                          "in_collective", "error")} for r in found["ranks"]],
            problems=found["problems"], seconds=found["seconds"],
            # the dumps as read now, else as this node's newest sample read them
            flight=found["flight"] or _flight_of(samples.snapshot().get(
                args.node, (0.0, {}))[1])))
        import time

        now = time.monotonic()
        for node, (heard, sample) in sorted(samples.snapshot().items()):
            if node == args.node:
                continue
            listed = sample.get("ranks")
            ranks = [r for r in listed if isinstance(r, dict)] \
                if isinstance(listed, list) else []
            store.record(ev.WatchForensics(
                attempt=args.attempt, node=node,
                ranks=[{"node": node, "pid": r.get("pid"), "rank": r.get("rank") or None,
                        "signature": r.get("at", ""), "in_collective": bool(r.get("coll")),
                        "error": r.get("err")} for r in ranks],
                problems=[f"read from the node's pulse sample, {now - heard:.1f} s old"],
                seconds=0.0, flight=_flight_of(sample)))

    return forensics


def _flight_folder(cfg: Config, args: argparse.Namespace) -> str | None:
    """Where this node's ranks dump PyTorch's flight recorder (the task-prolog set it,
    wrapper/watch/flight.py); None with ``[pulse] flight_recorder`` off."""
    if cfg.pulse.flight_recorder <= 0:
        return None
    from wrapper.job.paths import JobPaths
    from wrapper.watch.flight import FOLDER

    return f"{JobPaths.of(cfg, args.job_id).scratch}/{FOLDER}"


def _flight_of(sample: dict[str, object]) -> list[dict[str, object]]:
    """A node's sample's flight-recorder records (another node's word: shapes checked)."""
    listed = sample.get("fr")
    return [r for r in listed if isinstance(r, dict)][:64] if isinstance(listed, list) else []
