"""A real Slurm cluster on one machine: slurmctld and three slurmd, each node with 4 fake GPUs.

It backs the end-to-end tests and ``python -m jobwrap_dev sandbox``. As root on Debian it installs
Slurm and munge from Debian's packages when they are missing, writes a whole cluster
configuration into one folder (used through ``SLURM_CONF``), installs this checkout
into a runtime folder the job user can read, points Slurm's hooks at it, starts munge
(if no munged answers: then the machine's, left running) and the daemons, and waits
until the nodes are idle. It stops only the processes it started, by pid, checked
against their start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, field
from pathlib import Path
from typing import Any

from jobwrap_dev.sandbox import containment, flavor
from jobwrap_dev.sandbox.containment import mode_from_env as containment_mode
from jobwrap_dev.sandbox.daemons import Daemon, SandboxError, alive, daemon_of, terminate
from wrapper.fastdataclass import dataclass
from wrapper.job.state import JobState
from wrapper.runner import Runner

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "python3-venv"]
PROGRAMS = ["slurmctld", "slurmd", "sbatch", "scontrol", "munged"]
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
DEFAULT_BASE = Path("/tmp/jobwrap-sandbox")
RECORD = "sandbox.json"
# Memory is allocated and, under ConstrainRAMSpace, enforced per job as sites do
# (CR_Core_Memory): each node offers this much (less on a host with less: every slurmd
# reports the whole host's, and one configured above it would be drained), shared out
# per CPU by default.
NODE_MEMORY_MB = 6000
# Each sandbox's job ids: a block of its own, the next one on this host each time (a
# counter in JOB_ID_COUNTER); the last block ends below Slurm's default MaxJobId
# (67,043,328), so ids repeat only after 6,700 sandboxes.
JOB_ID_COUNTER = Path("/var/tmp/jobwrap-sandbox-job-ids")
JOB_ID_BLOCK = 10_000
JOB_ID_BLOCKS = 6_700


def node_memory_mb() -> int:
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return NODE_MEMORY_MB
    return max(256, min(NODE_MEMORY_MB, host - 512))


def source_root() -> Path:
    """The checkout this package was loaded from (it holds pyproject.toml and the hooks)."""
    here = Path(__file__).resolve().parents[2]
    if not (here / "pyproject.toml").exists():
        raise SandboxError(f"{here} is not a jobwrap checkout; the sandbox runs from one")
    return here


@dataclass
class Spec:
    """What the cluster looks like; written to the record so ``down`` can find it again."""

    base: str = str(DEFAULT_BASE)
    nodes: list[str] = field(default_factory=lambda: ["n1", "n2", "n3"])
    gpus_per_node: int = 4
    ctld_port: int = 16817
    node_ports: list[int] = field(default_factory=lambda: [17001, 17002, 17003])
    user: str = "jwtest"
    cpus_per_node: int = 2
    # "" Debian's Slurm; else a built one's prefix (flavor.PREFIX_VARIABLE)
    slurm_prefix: str = field(default_factory=flavor.prefix_from_env)
    accounting: bool = False  # slurmdbd + MariaDB (jobwrap_dev/sandbox/accounting.py)
    # "cgroup" (what sites run) or "none" (containment.VARIABLE)
    containment: str = field(default_factory=containment_mode)
    db_port: int = 16820
    dbd_port: int = 16819
    pulse_ports: str = "7400-7599"  # [pulse] ports: the hubs of the sandbox's jobs


class Cluster:
    def __init__(self, spec: Spec, source: Path | None = None) -> None:
        self.spec = spec
        self.base = Path(spec.base)
        self.source = source or source_root()
        self.daemons: list[Daemon] = []
        self.munge_started = False

    # -- paths ---------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def jobwrap_config(self) -> Path:
        return self.base / "etc" / "jobwrap.toml"

    # Each node keeps its own folders, as each real node keeps /var/lib/jobwrap and its
    # scratch to itself: the one config file says <base>/nodes/{node}/..., and nothing one
    # node writes there is read by another (docs/architecture.md, cross-node facts).
    def node_dir(self, node: str) -> Path:
        if node not in self.spec.nodes:
            raise ValueError(f"{node!r} is not a node of this sandbox ({self.spec.nodes})")
        return self.base / "nodes" / node

    def state_of(self, node: str) -> Path:
        """``node``'s own ``[paths] state_dir``."""
        return self.node_dir(node) / "state"

    def watcher_pid(self, job_id: str, node: str) -> int | None:
        """The pid of jobwrap's root watcher of ``job_id`` on ``node`` (its own record in
        the node's state folder), None while there is none."""
        from wrapper.job.state import JobState
        from wrapper.watch.files import pid_file

        record = JobState(self.state_of(node), job_id).read_json(pid_file(node))
        return int(record["pid"]) if record and "pid" in record else None

    def python_ranks(self, job_id: str) -> dict[str, int]:
        """The pid of the job's Python rank on each node (its environment names the job,
        a ``RANK`` and the node): one rank per node, as the slow-node jobs run."""
        import psutil

        out = {}
        for p in psutil.process_iter(["environ", "name"]):
            env = p.info["environ"] or {}
            if env.get("SLURM_JOB_ID") == job_id and "RANK" in env and \
                    "python" in (p.info["name"] or ""):
                out[env.get("SLURMD_NODENAME", "")] = p.pid
        return out

    def wait_output(self, path: Path, text: str, timeout: float) -> str:
        """The job's output once it holds ``text``; SandboxError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while text not in (out := path.read_text(errors="replace") if path.exists() else ""):
            if time.monotonic() > deadline:
                raise SandboxError(f"{path}: no {text!r} within {timeout:g} s: {out[-2000:]}")
            time.sleep(1)
        return out

    def scratch_of(self, node: str) -> Path:
        return self.node_dir(node) / "scratch"

    def log_of(self, node: str) -> Path:
        """``node``'s jobwrap log (root's hooks, watcher, release)."""
        return self.node_dir(node) / "log" / "jobwrap.log"

    def logs_text(self) -> str:
        """Every node's jobwrap log, one after the other (for tests that look for a line)."""
        return "".join(self.log_of(n).read_text(errors="replace")
                       for n in self.spec.nodes if self.log_of(n).exists())

    def log_marks(self) -> dict[str, int]:
        """Where each node's log ends now, for ``log_since``."""
        return {n: self.log_of(n).stat().st_size if self.log_of(n).exists() else 0
                for n in self.spec.nodes}

    def log_since(self, marks: dict[str, int]) -> list[str]:
        """The lines every node logged after ``marks``."""
        lines: list[str] = []
        for node in self.spec.nodes:
            if not self.log_of(node).exists():
                continue
            with self.log_of(node).open("rb") as handle:
                handle.seek(marks.get(node, 0))
                lines += handle.read().decode(errors="replace").splitlines()
        return lines

    @property
    def state_in_script(self) -> str:
        """The node's own state folder as a job's shell names it (``$SLURMD_NODENAME``)."""
        return f"{self.base}/nodes/$SLURMD_NODENAME/state"

    def metrics_of(self, node: str) -> Path:
        return self.node_dir(node) / "metrics" / "jobwrap.prom"

    def metrics_texts(self) -> list[str]:
        """Each node's metrics textfile (node_exporter's, one per node), where written."""
        return [self.metrics_of(n).read_text() for n in self.spec.nodes
                if self.metrics_of(n).exists()]

    def scratch_paths(self, relative: str) -> list[Path]:
        """``relative`` under every node's scratch."""
        return [self.scratch_of(n) / relative for n in self.spec.nodes]

    def job_state(self, job_id: str, node: str | None = None) -> JobState:
        """The job's folder on ``node``; by default on the first node (spec order) that
        holds one: its batch node for a job that ran on one node only."""
        if node is None:
            node = next((n for n in self.spec.nodes
                         if JobState(self.state_of(n), job_id).path.is_dir()),
                        self.spec.nodes[0])
        return JobState(self.state_of(node), job_id)

    def events(self, job_id: str, *, root_only: bool = False) -> list[dict[str, Any]]:
        """The job's events on every node, each once, in time order: what an observer (a
        test, the archive's manifest) gathers; no node reads another's. A verdict the next
        attempt's prolog carried to its node (wrapper/archive/carry.py) is the same
        record there: counted once, as the manifest counts it."""
        seen: dict[str, dict[str, Any]] = {}
        for node in self.spec.nodes:
            for record in JobState(self.state_of(node), job_id).events(root_only=root_only):
                key = json.dumps([record.get(k) for k in ("ts", "event", "node", "attempt",
                                                          "source")], default=str)
                seen.setdefault(key, record)
        return sorted(seen.values(), key=lambda e: float(e.get("ts") or 0))

    def gpu_inventory(self, node: str) -> Path:
        return self.base / "gpus" / f"{node}.toml"

    def set_gpu_faults(self, node: str, faults: dict[int, dict[str, Any]] | None = None
                       ) -> None:
        """Rewrite ``node``'s fake GPU inventory, healthy but for ``faults`` (minor -> fields)."""
        from jobwrap_dev.sandbox import gpus

        gpus.write(self.gpu_inventory(node), node, self.spec.gpus_per_node, faults)

    @property
    def runtime(self) -> Path:
        return self.base / "runtime"

    @property
    def work(self) -> Path:
        """A folder owned by the test user, for job scripts and their output."""
        return self.base / "work"

    def env(self) -> dict[str, str]:
        """Environment for Slurm clients talking to this cluster."""
        return flavor.client_env(self.spec.slurm_prefix,
                                 {**os.environ, "SLURM_CONF": str(self.conf)})

    # -- lifecycle -----------------------------------------------------------------------
    def up(self, *, log: Any = print) -> None:
        if os.geteuid() != 0:
            raise SandboxError("the sandbox needs root (it installs packages, makes device "
                               "nodes and runs slurmd); run it with sudo")
        if self.running():
            log(f"sandbox already running in {self.base}")
            self.load()
            return
        ensure_packages(log)
        ensure_user(self.spec.user)
        self._layout()
        workaround = flavor.scheduler_workaround(self.spec.slurm_prefix, self.spec.accounting)
        if workaround:
            log(f"Slurm {'.'.join(map(str, flavor.version(self.spec.slurm_prefix)))} "
                f"without accounting: SchedulerParameters {workaround}, as its main "
                "scheduler refuses every job (InvalidAccount) and only backfill starts "
                "jobs (docs/compat.md)")
        log(self.containment().line)
        log("installing this checkout into the sandbox runtime ...")
        with ticking(log, "installing the runtime"):
            self._install_runtime()
        self._write_configs()
        self._start_munge()
        try:
            if self.spec.accounting:
                log("starting MariaDB and slurmdbd ...")
                self.daemons += self._accounting().start(self.env())
                self._save()
            log(f"starting slurmctld and slurmd {', '.join(self.spec.nodes)} ...")
            self._start_daemons()
            if self.spec.accounting:
                self._accounting().add_user(self.env(), self.spec.user)
            log("waiting for the nodes to register idle ...")
            # many slurmd on one host register one after another: a few seconds each
            self.wait_idle(timeout=max(60.0, 3.0 * len(self.spec.nodes)))
        except BaseException:
            self.down()
            raise
        log(f"sandbox up: {len(self.spec.nodes)} nodes idle; SLURM_CONF={self.conf}")

    def _accounting(self) -> Any:
        from jobwrap_dev.sandbox.accounting import Accounting

        return Accounting(self.base, self.spec.db_port, self.spec.dbd_port, "jobwrap-sandbox",
                          self.spec.slurm_prefix)

    def down(self) -> list[str]:
        """Stop what this sandbox started; returns the names of the processes stopped."""
        if self.daemons:
            self._cancel_jobs()
        stopped = []
        for daemon in reversed(self.daemons):
            if terminate(daemon):
                stopped.append(daemon.name)
        self.daemons = []
        self._save()
        # Supervisors and releases run from this cluster's own runtime: they are ours too,
        # as is a slurmstepd our slurmd started and left behind (a test that kills a
        # slurmd under a job leaves its extern step's slurmstepd waiting for it).
        import psutil

        helpers = self.runtime_processes() + self.stepds()
        for proc in helpers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(helpers, timeout=10)
        return stopped

    def runtime_processes(self) -> list[Any]:
        """Processes running a program of this cluster's runtime (jobwrap's helpers)."""
        import psutil

        prefix = str(self.runtime) + os.sep
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmdline = proc.info["cmdline"] or []
            if cmdline and cmdline[0].startswith(prefix) and \
                    proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    def stepds(self) -> list[Any]:
        """The slurmstepd processes of this cluster's jobs (their ``SLURM_CONF`` is ours)."""
        import psutil

        conf, found = f"SLURM_CONF={self.conf}", []
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] != "slurmstepd":
                continue
            with contextlib.suppress(psutil.Error, OSError):
                environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
                if conf in environ.decode(errors="replace").split("\0"):
                    found.append(proc)
        return found

    def running(self) -> bool:
        record = self.base / RECORD
        if not record.exists():
            return False
        self.load()
        return any(alive(d) for d in self.daemons if d.name != "munged")

    def load(self) -> None:
        data = json.loads((self.base / RECORD).read_text())
        self.daemons = [Daemon(**d) for d in data.get("daemons", [])]
        self.munge_started = bool(data.get("munge_started"))

    def _save(self) -> None:
        record = {"spec": asdict(self.spec), "daemons": [asdict(d) for d in self.daemons],
                  "munge_started": self.munge_started}
        tmp = self.base / (RECORD + ".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.base / RECORD)

    # -- set-up --------------------------------------------------------------------------
    def _layout(self) -> None:
        user = pwd.getpwnam(self.spec.user)
        slurm = pwd.getpwnam("slurm")
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)  # the job user and SlurmUser must traverse it
        for sub in ("etc", "log", "spool", "dev", "gpus", "jobwrap", "nodes"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(self.base / sub, 0o755)
        for sub in ("ctld", "log"):
            path = self.base / sub
            path.mkdir(exist_ok=True)
            os.chown(path, slurm.pw_uid, slurm.pw_gid)
        self.work.mkdir(exist_ok=True)
        os.chown(self.work, user.pw_uid, user.pw_gid)
        os.chmod(self.work, 0o755)
        for node in self.spec.nodes:
            for sub, mode in (("", 0o755), ("state", 0o755), ("scratch", 0o755),
                              ("cache", 0o700), ("log", 0o750), ("metrics", 0o755)):
                path = self.node_dir(node) / sub
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, mode)
        for i in range(self.spec.gpus_per_node):
            dev = self.base / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(195, i))
        for node in self.spec.nodes:
            self.set_gpu_faults(node)

    def _install_runtime(self) -> None:
        """Install the checkout as an admin would: a venv the job user can read and run."""
        venv = self.runtime / "venv"
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        runner = Runner()
        fresh = not (venv / "bin" / "pip").exists()
        if fresh:
            runner.run([python, "-m", "venv", str(venv)], timeout=300)
            runner.run([str(venv / "bin" / "pip"), "install", "--quiet", "wheel"], timeout=600)
        stage = self.runtime / "src"
        shutil.rmtree(stage, ignore_errors=True)
        shutil.copytree(self.source, stage, ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.egg-info", "build", ".*_cache", "tests"))
        pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
               "--no-build-isolation"]
        # Dependencies once; later ups reinstall only jobwrap itself, from this checkout.
        extra = [] if fresh else ["--no-deps", "--force-reinstall"]
        runner.run([*pip, *extra, str(stage)], timeout=600)
        if not fresh:  # a dependency added since the venv was made (py-spy): only those
            runner.run([*pip, str(stage)], timeout=600)
        wheel = flavor.pyslurm_wheel(self.spec.slurm_prefix)
        if fresh and wheel is not None:  # built against this very Slurm
            runner.run([*pip, "--no-deps", str(wheel)], timeout=600)
        shutil.rmtree(stage, ignore_errors=True)
        for path in [self.runtime, *self.runtime.rglob("*")]:
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode):
                os.chmod(path, (mode | 0o444 | (0o111 if mode & 0o111 else 0)) & ~0o022)

    def containment(self) -> containment.Plan:
        """The process containment this cluster's Slurm runs (decided from the host)."""
        return containment.plan(self.spec.containment)

    def _first_job_id(self) -> int:
        """Job ids of their own for each sandbox, as a site's never repeat: cgroup v1 paths
        are host-wide (slurm_NODE/uid_U/job_J), so two sandboxes side by side must not
        share job ids, and the kernel log keeps a job's OOM-kill record across sandboxes
        (root's OOM evidence reads it), so a later sandbox must not reuse an earlier one's.
        A host-wide counter hands each sandbox its own block of JOB_ID_BLOCK ids."""
        import fcntl

        fd = os.open(JOB_ID_COUNTER, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+") as counter:
            fcntl.flock(counter, fcntl.LOCK_EX)
            text = counter.read().strip()
            block = (int(text) if text.isdigit() else 0) % (JOB_ID_BLOCKS - 1) + 1
            counter.seek(0)
            counter.truncate()
            counter.write(f"{block}\n")
        return block * JOB_ID_BLOCK

    def _write_configs(self) -> None:
        host = socket.gethostname().split(".")[0]
        spec = self.spec
        contain = self.containment()
        memory = node_memory_mb()
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={spec.cpus_per_node} RealMemory={memory} Gres=gpu:{spec.gpus_per_node} "
            f"Weight={weight} State=UNKNOWN"  # idle nodes are filled in order: n1 first
            for weight, (name, port) in enumerate(zip(spec.nodes, spec.node_ports,
                                                      strict=True), start=1))
        b = self.base
        storage = self._accounting().slurm_conf() if spec.accounting else \
            "AccountingStorageType=accounting_storage/none\n"
        workaround = flavor.scheduler_workaround(spec.slurm_prefix, spec.accounting)
        # The site's own lines only: jobwrap's (Prolog, Epilog, TaskProlog, JobRequeue,
        # JobSubmitPlugins, nohold_on_prolog_fail) are merged in by `jobwrap install`, as on
        # a site's cluster (install_jobwrap below).
        scheduler = f"SchedulerParameters={workaround}\n" if workaround else ""
        self.conf.write_text(f"""# written by jobwrap's sandbox; a throwaway cluster on one host
ClusterName=jobwrap-sandbox
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={spec.ctld_port}
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation={b}/ctld
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/log/slurmctld.pid
SlurmdPidFile={b}/spool/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
{contain.slurm_lines}{storage}JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={memory // spec.cpus_per_node}
SchedulerType=sched/backfill
{scheduler}ReturnToService=2
PrologEpilogTimeout=120
# jobwrap's health check only when a test runs it: a timer would resume the nodes tests drain
HealthCheckInterval=0
FirstJobId={self._first_job_id()}
MinJobAge=3600
KillWait=5
InactiveLimit=0
SlurmdTimeout=300
MessageTimeout=10
GresTypes=gpu
MpiDefault=none
MailProg=/bin/true
{nodes}
PartitionName=debug Nodes={','.join(spec.nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        cgroup_conf = b / "etc" / "cgroup.conf"
        if contain.cgroup_conf:
            cgroup_conf.write_text(contain.cgroup_conf)
        else:
            cgroup_conf.unlink(missing_ok=True)
        (b / "etc" / "gres.conf").write_text(
            f"NodeName={','.join(spec.nodes)} Name=gpu "
            f"File={b}/dev/nvidia[0-{spec.gpus_per_node - 1}]\n")
        self.jobwrap_config.write_text(f"""# jobwrap configuration of the sandbox cluster
# Each node its own folders ({{node}}: the node's Slurm name); the archive is shared.
[paths]
state_dir = "{b}/nodes/{{node}}/state"
scratch_root = "{b}/nodes/{{node}}/scratch"
cache_root = "{b}/nodes/{{node}}/cache"
archive_root = "{b}/jobwrap/archive"

[log]
file = "{b}/nodes/{{node}}/log/jobwrap.log"
level = "debug"

[slurm]
command_timeout = 20
{flavor.slurm_section(spec.slurm_prefix)}
[gpu]
backend = "fake"
fake_inventory = "{b}/gpus/{{node}}.toml"

[supervisor]
gpu_interval = 2
settle_seconds = 2
slurm_ask_every = 5
hang_floor = 40
hang_min = 40

[pulse]
address = "127.0.0.1"
ports = "{spec.pulse_ports}"
# a slow node named in about 50 s instead of 100 (tests/bench/run straggler puts the
# site's defaults back: 60 and 30)
slow_window = 30
slow_hold = 15

[metrics]
textfile = "{b}/nodes/{{node}}/metrics/jobwrap.prom"

[hooks]
prolog_budget = 60
epilog_budget = 100
""")
        for path in (self.conf, b / "etc" / "gres.conf", self.jobwrap_config, cgroup_conf):
            if not path.exists():
                continue
            os.chmod(path, 0o644)
        (b / "jobwrap" / "archive").mkdir(exist_ok=True)
        os.chmod(b / "jobwrap" / "archive", 0o711)
        self.install_jobwrap()

    def install_jobwrap(self, verb: str = "install") -> str:
        """``jobwrap install`` (or ``uninstall``) as an admin runs it on this host, which is
        the controller and every node: the hooks into the runtime, slurm.conf's lines merged
        into the sandbox's, job_submit.lua beside it. Returns its output."""
        args = ["--role", "compute", "--role", "controller", "--slurm-conf", str(self.conf),
                "--systemd-dir", str(self.base / "etc" / "systemd"), "--no-doctor",
                "--host", socket.gethostname().split(".")[0]] if verb == "install" else []
        done = Runner(self.env()).run(
            [str(self.runtime / "venv" / "bin" / "jobwrap"), "--config",
             str(self.jobwrap_config), verb, "--prefix", str(self.runtime), *args],
            timeout=120, check=False)
        if done.returncode != 0:
            raise SandboxError(f"jobwrap {verb} failed: {done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")
        return done.stdout

    def _start_munge(self) -> None:
        if _munge_works():
            return
        munge = pwd.getpwnam("munge")
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chown(run_dir, munge.pw_uid, munge.pw_gid)
        os.chmod(run_dir, 0o755)
        for sub in ("/var/lib/munge", "/var/log/munge"):
            Path(sub).mkdir(parents=True, exist_ok=True)
            os.chown(sub, munge.pw_uid, munge.pw_gid)
        Runner().run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], timeout=30)
        pid_file = run_dir / "munged.pid"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (pid_file.exists() and _munge_works()):
            time.sleep(0.1)
        if not _munge_works():
            raise SandboxError("munged did not start (see /var/log/munge/munged.log)")
        # The machine's service from now on, as on a real cluster: left running when this
        # sandbox stops, since the sandboxes beside it (xdist workers, tiers) may have
        # found it answering and use it too; stopping it would fail them mid-test.
        self.munge_started = True
        self._save()

    def _start_daemons(self) -> None:
        for name in ["slurmctld", *(f"slurmd-{n}" for n in self.spec.nodes)]:
            self.start_daemon(name)

    def daemon_argv(self, name: str) -> list[str]:
        """How the sandbox runs its Slurm daemon ``name`` (``slurmctld``, ``slurmd-NODE``):
        in the foreground, slurmctld keeping its saved state (``-i`` only ignores a state
        file it cannot read), so a restart with the same argv is the site's restart."""
        prefix = self.spec.slurm_prefix
        if name == "slurmctld":
            return [flavor.program(prefix, "slurmctld"), "-D", "-i", "-f", str(self.conf)]
        node = name.removeprefix("slurmd-")
        if name.startswith("slurmd-") and node in self.spec.nodes:
            return [flavor.program(prefix, "slurmd"), "-D", "-N", node, "-f", str(self.conf)]
        raise SandboxError(f"no Slurm daemon {name!r} in this sandbox")

    def start_daemon(self, name: str) -> Daemon:
        """Start the Slurm daemon ``name`` and record it (``down`` stops it); slurmctld is
        waited for until it answers."""
        out = open(self.base / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 - the daemon's
        # From /: slurmd hands its cwd to every hook, and a checkout in a private
        # folder (root's 0700 home) is no place the job user can be.
        proc = subprocess.Popen(self.daemon_argv(name), env=self.env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/")
        out.close()
        daemon = daemon_of(name, proc.pid)
        self.daemons.append(daemon)
        self._save()
        if name == "slurmctld":
            self._wait_ctld()
        return daemon

    def stop_daemon(self, name: str, grace: float = 30) -> None:
        """Stop the daemon ``name`` as ``systemctl stop`` does: SIGTERM, then wait for it
        to exit. One that is still there after ``grace`` seconds is killed and reported."""
        daemon = next((d for d in self.daemons if d.name == name), None)
        if daemon is None or not alive(daemon):
            raise SandboxError(f"{name} is not running in this sandbox")
        try:
            how = terminate(daemon, grace)
        finally:
            self.daemons.remove(daemon)
            self._save()
        if how == "SIGKILL":
            raise SandboxError(f"{name} did not exit within {grace:g} s of SIGTERM; killed")

    def _wait_ctld(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = Runner(self.env()).run(["scontrol", "ping"], timeout=10, check=False)
            if "UP" in res.stdout:
                return
            time.sleep(0.3)
        raise SandboxError(f"slurmctld did not answer within {timeout:g} s; "
                           f"see {self.base}/log/slurmctld.log")

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(s.startswith("idle") for s in states.values()):
                return
            for daemon in self.daemons:
                if not alive(daemon):
                    raise SandboxError(f"{daemon.name} exited; see {self.base}/log/")
            time.sleep(0.5)
        raise SandboxError(f"nodes not idle within {timeout:g} s: {states}; "
                           f"see {self.base}/log/")

    def node_states(self) -> dict[str, str]:
        res = Runner(self.env()).run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10,
                                     check=False)
        return dict(line.split(None, 1) for line in res.stdout.splitlines() if " " in line)

    def _cancel_jobs(self) -> None:
        env = self.env()
        runner = Runner(env)
        runner.run(["scancel", "--partition=debug"], timeout=20, check=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            res = runner.run(["squeue", "-h", "-t", "RUNNING,COMPLETING,CONFIGURING"],
                             timeout=10, check=False)
            if res.returncode != 0 or not res.stdout.strip():
                return
            time.sleep(0.5)

    # -- using it ------------------------------------------------------------------------
    def as_user(self, argv: list[str], *, timeout: float = 30,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command as the test user, with this cluster's SLURM_CONF."""
        cmd = ["runuser", "-u", self.spec.user, "--", "env", f"SLURM_CONF={self.conf}",
               f"PATH={self.env()['PATH']}",
               f"HOME={pwd.getpwnam(self.spec.user).pw_dir}", *argv]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             cwd=self.work, check=False)
        if check and res.returncode != 0:
            raise SandboxError(f"{' '.join(argv)} as {self.spec.user} failed: "
                               f"{res.stderr.strip() or res.stdout.strip()}")
        return res

    def write_user_file(self, name: str, text: str, mode: int = 0o644) -> Path:
        user = pwd.getpwnam(self.spec.user)
        path = self.work / name
        path.write_text(text)
        os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(path, mode)
        return path

    def submit(self, script: str, *args: str, name: str = "job.sh") -> str:
        """Submit a batch script as the test user; returns the job id."""
        path = self.write_user_file(name, script, 0o755)
        res = self.as_user(["sbatch", "--parsable", f"--chdir={self.work}", *args, str(path)])
        return res.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        from wrapper.config import SlurmConfig
        from wrapper.slurm.commands import CliBackend

        # jobwrap's own reader: a test job's --comment must not become its JobState
        return CliBackend(SlurmConfig(), Runner(self.env())).job_info(job_id)

    def wait_job(self, job_id: str, *, states: Iterable[str] = TERMINAL_STATES,
                 timeout: float = 90) -> dict[str, str]:
        wanted = set(states)
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in wanted:
                return info
            time.sleep(0.3)
        raise SandboxError(f"job {job_id} not in {sorted(wanted)} after {timeout:g} s: "
                           f"{info.get('JobState')} {info.get('Reason')}")


# -- host helpers ------------------------------------------------------------------------
@contextlib.contextmanager
def ticking(log: Any, what: str, every: float = 3.0) -> Iterator[None]:
    """Log a progress line every ``every`` seconds until the block ends: nothing silent."""
    import threading

    done = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not done.wait(every):
            log(f"  ... {what} ({time.monotonic() - start:.0f} s)")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def ensure_packages(log: Any = print) -> None:
    """Install Slurm and munge from Debian's packages when any of their programs is missing."""
    missing = [p for p in PROGRAMS if not shutil.which(p, path=os.environ.get("PATH", "")
                                                       + ":/usr/sbin:/sbin")]
    if not missing and Path("/usr/bin/python3").exists() and _has_venv():
        return
    if not shutil.which("apt-get"):
        raise SandboxError(f"{', '.join(missing)} missing and no apt-get here; install Slurm "
                           "(slurmctld, slurmd, client) and munge by hand")
    log(f"installing {' '.join(PACKAGES)} from Debian's packages ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    runner = Runner(env)
    if runner.run(cmd, timeout=900, check=False).returncode != 0:
        runner.run(["apt-get", "update", "-q"], timeout=900)
        runner.run(cmd, timeout=900)


def _has_venv() -> bool:
    res = subprocess.run(["/usr/bin/python3", "-c", "import venv, ensurepip"],
                         capture_output=True, check=False)
    return res.returncode == 0


def ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        Runner().run(["useradd", "--create-home", "--shell", "/bin/bash", name], timeout=30)


def _munge_works() -> bool:
    if not shutil.which("munge"):
        return False
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=5, check=False)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=5,
                             check=False)
    except subprocess.TimeoutExpired:
        return False
    return dec.returncode == 0
