"""Configuration: one TOML file, one schema with every default and its documentation.

Load order: defaults, then the file (``--config``, else ``$JOBWRAP_CONFIG``, else
``/etc/jobwrap/config.toml`` when it exists). Every problem in a file is reported at
once, each naming the key and what was expected. The schema is a small hand-written
declaration (one ``_opt`` per key) rather than a validation library or dataclasses,
because the prolog loads it on the start path of every job: pydantic's import alone
would cost more than the prolog's whole budget, and dataclasses' generated methods for
~90 keys cost a tenth of it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, ClassVar

from wrapper.errors import ConfigError

DEFAULT_PATH = "/etc/jobwrap/config.toml"
ENV_VAR = "JOBWRAP_CONFIG"


def _opt(default: Any, doc: str, *, choices: tuple[str, ...] = (), absolute: bool = False,
         positive: bool = False, non_negative: bool = False,
         at_least: float | None = None) -> Any:
    """One config key: its default, its documentation and its constraints, together.

    Supported types: str, int, float, bool and tuple[str, ...] (a TOML array of strings).
    """
    return Opt(default, doc, choices, absolute, positive, non_negative, at_least)


class Opt:
    """The declaration of one key; the class attribute a section's instances shadow."""

    __slots__ = ("absolute", "at_least", "choices", "default", "doc", "name", "non_negative",
                 "positive", "type")

    def __init__(self, default: Any, doc: str, choices: tuple[str, ...], absolute: bool,
                 positive: bool, non_negative: bool, at_least: float | None = None) -> None:
        self.default, self.doc, self.choices = default, doc, choices
        self.absolute, self.positive, self.non_negative = absolute, positive, non_negative
        self.at_least = at_least
        self.name = self.type = ""


class Section:
    """A read-only group of keys ([paths], [log], ...), declared with ``_opt``."""

    _fields: ClassVar[dict[str, Opt]] = {}

    def __init_subclass__(cls) -> None:
        # The class's own (string) annotations, as inspect.get_annotations gives them;
        # inspect itself is too heavy for the prolog's start path.
        annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
        cls._fields = {}
        for name, value in list(vars(cls).items()):
            if isinstance(value, Opt):
                value.name, value.type = name, str(annotations.get(name, "str"))
                cls._fields[name] = value

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no key {', '.join(sorted(unknown))}")
        data = {name: values.get(name, opt.default) for name, opt in self._fields.items()}
        object.__setattr__(self, "__dict__", data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"configuration is read-only ({type(self).__name__}.{name})")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({vars(self)!r})"

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def replace(self, **values: Any) -> Any:
        """A copy with some keys changed (what dataclasses.replace was for)."""
        return type(self)(**{**vars(self), **values})


class PathsConfig(Section):
    state_dir: str = _opt("/var/lib/jobwrap", "Per-job state (events) and node state; "
                          "node-local, owned by root. {node} in it (and in scratch_root, "
                          "cache_root, [log] file, [metrics] textfile) is the node's Slurm "
                          "name, for a host that runs several slurmd.", absolute=True)
    scratch_root: str = _opt("/local/jobwrap", "Node-local scratch; each job gets "
                             "<scratch_root>/<jobid>, owned by the job user, mode 0700.",
                             absolute=True)
    cache_root: str = _opt("/local/jobwrap-cache", "Node-local cache of staged datasets, "
                           "shared by the jobs on a node.", absolute=True)
    archive_root: str = _opt("/var/lib/jobwrap/archive", "Where each job's logs and "
                             "manifest are archived: <archive_root>/<user>/<jobid>/.",
                             absolute=True)


class LogConfig(Section):
    file: str = _opt("/var/log/jobwrap/jobwrap.log", "JSON-lines log file of root's hooks, "
                     "release and node watcher; root makes its folder (0750) when missing, "
                     "and logs to syslog when it cannot write it; empty to log to stderr "
                     "only. Hooks that run as the job user log to stderr.")
    level: str = _opt("info", "Least severe level written.",
                      choices=("debug", "info", "warning", "error"))
    stderr_format: str = _opt("auto", "stderr form: console (aligned, for terminals; no "
                              "colour codes, which would end up in job output files), "
                              "logfmt (one key=value line, for journald/syslog), json; "
                              "auto picks console on a terminal, else logfmt.",
                              choices=("auto", "console", "logfmt", "json"))


class SlurmConfig(Section):
    backend: str = _opt("auto", "cli: Slurm's commands; pyslurm: only where pyslurm matches "
                        "the running Slurm; auto: pyslurm when it matches, else cli.",
                        choices=("auto", "cli", "pyslurm"))
    scontrol_command: str = _opt("scontrol", "Path or name of scontrol.")
    sinfo_command: str = _opt("sinfo", "Path or name of sinfo.")
    squeue_command: str = _opt("squeue", "Path or name of squeue.")
    scancel_command: str = _opt("scancel", "Path or name of scancel.")
    command_timeout: float = _opt(10.0, "Seconds before a Slurm command is killed.",
                                  positive=True)


class HooksConfig(Section):
    on_internal_error: str = _opt("run", "When jobwrap itself fails inside a Slurm hook: "
                                  "run (log loudly, let the job run) or drain the node.",
                                  choices=("run", "drain"))
    prolog_budget: float = _opt(60.0, "Seconds the prolog may take; keep below Slurm's "
                                "PrologEpilogTimeout.", positive=True)
    epilog_budget: float = _opt(120.0, "Seconds the epilog may take; keep below Slurm's "
                                "PrologEpilogTimeout.", positive=True)
    unchecked_attempt: str = _opt("requeue", "An attempt on a node where jobwrap's prolog "
                                  "did not run for it (slurmd before 23.02 skips the Prolog "
                                  "of a job requeued back onto a node within seconds): "
                                  "requeue (the task-prolog ends it there before the job's "
                                  "code starts; it is requeued away from that node) or run "
                                  "(it runs unchecked, and the job's output says so).",
                                  choices=("requeue", "run"))
    user_events_max: int = _opt(1048576, "Bytes a job's user-writable event file "
                                "(user-events.jsonl) may hold; appends past it are dropped "
                                "and only its last this-many bytes are read.", positive=True)
    user_events_days: float = _opt(7.0, "Days a finished job's user-writable event file is "
                                   "kept (for jobwrap status); a later epilog on the node "
                                   "removes older ones. Root's record stays.", positive=True)


class GpuConfig(Section):
    backend: str = _opt("nvml", "Where GPU readings come from: nvml (pynvml, production) or "
                        "fake (a TOML inventory, for tests and dry runs).",
                        choices=("nvml", "fake"))
    fake_inventory: str = _opt("", "With backend = \"fake\": the TOML inventory to read "
                               "(format: wrapper/gpu/fake.py); {node} in it is replaced by "
                               "the Slurm node name.")
    xid_source: str = _opt("kmsg", "Where the nvml probe finds Xid events: kmsg (the kernel "
                           "log, which the driver writes them to; needs root; the node "
                           "watcher takes them from NVML's Xid event API where the "
                           "driver delivers it) or none.",
                           choices=("kmsg", "none"))
    kmsg_path: str = _opt("/dev/kmsg", "The kernel log to read Xid events from.",
                          absolute=True)
    xid_window: float = _opt(3600.0, "Seconds back in the kernel log that an Xid counts as "
                             "recent.", positive=True)


class ChecksConfig(Section):
    prolog: bool = _opt(True, "Run the GPU and version checks in the prolog.")
    epilog: bool = _opt(True, "Run the post-job GPU checks in the epilog.")
    probe_budget: float = _opt(30.0, "Seconds the GPU probe may take to read every GPU; a "
                               "probe that takes longer is reported as jobwrap's failure "
                               "(hung NVML), not as a GPU fault.", positive=True)
    check_budget: float = _opt(10.0, "Seconds one check may take (version commands are cut "
                               "off at it); a slower check adds a warning.", positive=True)
    slurm_gpu_ids: str = _opt("minor", "What the numbers in SLURM_JOB_GPUS are: minor (N of "
                              "/dev/nvidiaN, as gres.conf File= lists them) or index "
                              "(NVML's order, for AutoDetect setups that number that way).",
                              choices=("minor", "index"))
    count: bool = _opt(True, "Compare the GPUs visible with those allocated and with the "
                       "node's gres in Slurm (fewer visible: fail).")
    mapping: bool = _opt(True, "Report which GPU each of SLURM_JOB_GPUS and "
                         "CUDA_VISIBLE_DEVICES is (by minor number / UUID; fail when one "
                         "is missing).")
    ecc: bool = _opt(True, "Uncorrectable ECC errors: any since the last reset (volatile) "
                     "fails; over the GPU's life (aggregate) warns, and fails above "
                     "ecc_aggregate_max.")
    ecc_aggregate_max: int = _opt(10, "Aggregate uncorrectable ECC errors a GPU may have "
                                  "before the ecc check fails.", non_negative=True)
    retired_pages: bool = _opt(True, "Retired pages (before Ampere): pending retirement "
                               "fails; double-bit retirements warn; retired_pages_max fails.")
    retired_pages_max: int = _opt(60, "Retired pages (single- and double-bit) at which the "
                                  "retired_pages check fails (a GPU can retire at most 64).",
                                  positive=True)
    row_remap: bool = _opt(True, "Row remapping (Ampere on): a failed remap fails; a pending "
                           "one (needs a GPU reset) is row_remap_pending.")
    row_remap_pending: str = _opt("fail", "Status of a row remap waiting for a GPU reset.",
                                  choices=("warn", "fail"))
    xid: bool = _opt(True, "Recent Xid events (wrapper/gpu/xid.py says which drain, warn, "
                     "or are the application's fault).")
    xid_drain: tuple[str, ...] = _opt((), "Xids to treat as node faults besides jobwrap's "
                                      "table, e.g. [\"46\"].")
    xid_ignore: tuple[str, ...] = _opt((), "Xids to ignore altogether.")
    temperature: bool = _opt(True, "Temperature at or above the GPU's slowdown or shutdown "
                             "threshold fails; within temperature_margin of slowdown warns.")
    temperature_margin: int = _opt(5, "Degrees C below the slowdown threshold where the "
                                   "temperature check starts to warn.", non_negative=True)
    throttle: bool = _opt(True, "Active clock throttle reasons.")
    throttle_fail: tuple[str, ...] = _opt(
        ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"),
        "Throttle reasons that fail the throttle check (names: wrapper/gpu/probe.py).")
    throttle_warn: tuple[str, ...] = _opt(("sw_thermal_slowdown",), "Throttle reasons that "
                                          "warn.")
    pcie: bool = _opt(True, "PCIe link generation and width against the most the GPU and "
                      "its slot can do.")
    pcie_width_below_max: str = _opt("fail", "Status when the link is narrower than it can "
                                     "be (a reseat or riser problem).",
                                     choices=("ignore", "warn", "fail"))
    pcie_gen_below_max: str = _opt("ignore", "Status when the link runs below its best "
                                   "generation; idle GPUs lower it to save power, so by "
                                   "default it is only reported.",
                                   choices=("ignore", "warn", "fail"))
    nvlink: bool = _opt(True, "NVLink links down fail.")
    nvlink_expected: int = _opt(0, "NVLinks each GPU must have up (0: every link the GPU "
                                "reports; with a number, further links down only warn).",
                                non_negative=True)
    persistence: bool = _opt(True, "Persistence mode off (slow job starts, GPU state lost "
                             "between jobs).")
    persistence_off: str = _opt("warn", "Status when persistence mode is off.",
                                choices=("warn", "fail"))
    in_use: bool = _opt(True, "Processes or memory in use on an allocated GPU before the "
                        "job (prolog) or after it (epilog) fail; not judged by jobwrap check.")
    in_use_memory_warn_mib: int = _opt(256, "MiB of GPU memory in use, with no process on "
                                       "the GPU, above which the in_use check warns.",
                                       non_negative=True)
    in_use_memory_max_mib: int = _opt(1024, "MiB of GPU memory in use above which the in_use "
                                      "check fails.", non_negative=True)


class VersionsConfig(Section):
    driver_min: str = _opt("", "Minimum NVIDIA driver version (empty: not checked).")
    driver_exact: str = _opt("", "The NVIDIA driver version every node must run, e.g. "
                             "\"550.54.15\" (empty: not checked).")
    cuda_min: str = _opt("", "Minimum CUDA version the driver supports, e.g. \"12.2\" (empty: "
                         "not checked).")
    nccl_min: str = _opt("", "Minimum NCCL version installed on the node, e.g. \"2.18\" "
                         "(empty: not checked).")
    nccl_search_paths: tuple[str, ...] = _opt(
        ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
         "/usr/local/lib", "/usr/local/nccl/lib", "/usr/local/cuda/lib64"),
        "Folders searched, in order, for libnccl.so.*; the first found is the node's NCCL.")
    fabric_manager: bool = _opt(False, "Require NVIDIA Fabric Manager to run, at the "
                                "driver's version (NVSwitch systems: HGX/DGX).")
    fabric_manager_service: str = _opt("nvidia-fabricmanager", "Fabric Manager's systemd "
                                       "unit.")
    fabric_manager_command: str = _opt("nv-fabricmanager", "Path or name of "
                                       "nv-fabricmanager (asked for its version).")
    systemctl_command: str = _opt("systemctl", "Path or name of systemctl.")
    commands: tuple[str, ...] = _opt((), "Site commands whose version to check, each "
                                     "\"COMMAND ARGS >= VERSION\" or \"COMMAND ARGS == "
                                     "VERSION\"; the first dotted number in the output is "
                                     "the version.")
    command_timeout: float = _opt(10.0, "Seconds before a version command is killed.",
                                  positive=True)


class SupervisorConfig(Section):
    enabled: bool = _opt(True, "Start a supervisor for each job on its first node.")
    interval: float = _opt(2.0, "Seconds between two looks at the job (checkpoints, output).",
                           positive=True)
    slurm_interval: float = _opt(10.0, "Seconds between two looks at whether the job still "
                                 "runs (the supervisor's and the node watchers'): a look "
                                 "reads the node's own epilog record; slurmctld itself is "
                                 "asked at most every slurm_ask_every (a watcher: every "
                                 "10 min).", positive=True)
    slurm_ask_every: float = _opt(60.0, "Fewest seconds between two asks to slurmctld itself "
                                  "(the job's state and time limit); the looks between read "
                                  "only the node's own epilog record. At most one call a "
                                  "minute per running job by default: a time limit changed "
                                  "with scontrol update is followed within this.",
                                  positive=True)
    gpu_interval: float = _opt(10.0, "Seconds between two GPU health readings.",
                               positive=True)
    hang_timeout: float = _opt(0.0, "Default for --hang-timeout in seconds (0: learned from "
                               "each job's progress cadence, see hang_k, hang_floor and hang_min).",
                               non_negative=True)
    hang_k: float = _opt(3.0, "Without --hang-timeout a job is hung after hang_k x the "
                         "longest gap seen between two signs of progress (output growth or "
                         "a new checkpoint), and never before hang_floor, or hang_min once "
                         "its cadence is learned.", positive=True)
    hang_floor: float = _opt(1800.0, "Seconds without progress that are never a hang while "
                             "a job's cadence is not learned yet (PyTorch's longest collective "
                             "timeout, gloo's 30 min).", positive=True)
    hang_min: float = _opt(300.0, "Seconds without progress that are never a hang once a "
                           "job's cadence is learned (20 gaps and a save seen): half of "
                           "NCCL's 10 min watchdog, so the stacks are read before it aborts.",
                           positive=True)
    slurm_unreachable: float = _opt(600.0, "Seconds without an answer from Slurm after "
                                     "which the supervisor gives up on its job and exits.",
                                     positive=True)
    walltime_signal: str = _opt("URG", "Signal sent to the job's steps (to its batch shell "
                                "when it has none) before its time limit when it did not ask "
                                "for one (--signal). URG: ignored unless trapped, and neither "
                                "Lightning (USR1: save and requeue itself) nor torchrun/NCCL "
                                "(TERM: shut down) reads it as something else.")
    walltime_lead: float = _opt(300.0, "Seconds before the time limit to send it.",
                                non_negative=True)
    walltime_requeue: bool = _opt(True, "With the signal, touch the job's save file "
                                  "(JOBWRAP_SAVE_FILE, in its checkpoint dir) and, once a "
                                  "checkpoint newer than that is complete, requeue the job "
                                  "at once instead of training on until the limit (not past "
                                  "--max-restarts, never with --no-requeue).")
    settle_seconds: float = _opt(10.0, "A checkpoint modified more recently than this is "
                                 "taken as still being written.", non_negative=True)
    forensics_timeout: float = _opt(30.0, "Seconds a hung job is kept, before it is "
                                    "ended, while the node watchers read every rank's "
                                    "Python stack (py-spy) and the GPUs (0: no forensics).",
                                    non_negative=True)
    node_watch: bool = _opt(True, "Start a root watcher of the job's GPUs on every "
                            "allocated node (Xids, NVML health at gpu_interval); on a fault "
                            "it drains the node and ends the job (wrapper/watch/).")


class PulseConfig(Section):
    enabled: bool = _opt(True, "Every node's watcher beats to the watcher of the job's first "
                         "node (TCP, MUNGE-signed both ways), so that a node lost mid-job is "
                         "known in seconds instead of after SlurmdTimeout (wrapper/pulse/). "
                         "Needs node_watch.")
    interval: float = _opt(0.5, "Seconds between two beats of a node.", positive=True)
    lost_after: float = _opt(4.5, "Seconds a node's open connection may stay silent before "
                             "it is lost, and a node without the hub's ack fences itself "
                             "(kills the job's processes on it). At least 3 x interval: a "
                             "watcher frozen 3 s keeps its node.", positive=True)
    fence_grace: float = _opt(2.0, "Seconds the hub waits after a loss, for the lost node's "
                              "own fence to have surely run, before it acts.",
                              non_negative=True)
    ports: str = _opt("7400-7599", "TCP ports a job's hub may listen on (the first free of "
                      "8 drawn from the job id and attempt); open them between compute "
                      "nodes, and to nothing else.")
    address: str = _opt("{node}", "Where the hub listens and the nodes reach it: {node} is the "
                        "first node's Slurm name (resolved by the host's resolver), or a "
                        "fixed address.")
    action: str = _opt("down", "On a loss: down (set the node DOWN in Slurm with a jobwrap: "
                       "reason; Slurm ends the job's work there, a spare or the requeue "
                       "moves it) or record (root's pulse.lost event and log only).",
                       choices=("down", "record"))
    samples: bool = _opt(True, "Every node's watcher samples the job's ranks on it (CPU time, "
                         "I/O, and each rank's Python stack through py-spy, as the job's user) "
                         "and the first node's judges them together: a hang is ended in "
                         "seconds, its stuck rank named (wrapper/pulse/judge.py). Off: hangs "
                         "wait for the supervisor's hang_floor/hang_min.")
    sample_interval: float = _opt(3.0, "Seconds between two samples of a node's ranks (each "
                                  "costs ~7 ms of CPU per rank).", positive=True)
    hang_floor: float = _opt(15.0, "Seconds the job's ranks must stay stuck (some waiting in a "
                             "collective, the others not moving at all) before it is a hang. "
                             "At least 3 x sample_interval.", positive=True)
    hang_k: float = _opt(2.0, "A hang is also never called before hang_k x the longest "
                         "stretch the job was stuck and then went on by itself.",
                         positive=True)
    flight_recorder: int = _opt(2000, "Entries of PyTorch's flight recorder kept per rank "
                                "(TORCH_FR_BUFFER_SIZE, set by the task-prolog unless the "
                                "job sets it; dumps go to the task's scratch, NCCL dumps on "
                                "its timeout): a hang's verdict and forensics name the ranks "
                                "that never joined a collective. About 1 MB a rank at 2000. "
                                "0: not set.", non_negative=True)
    slow_below: float = _opt(0.85, "A node whose speed score (the job's typical rank's CPU "
                             "demand over its ranks'; 1.0 = as fast) stays under this for "
                             "slow_hold seconds is named slow: root's pulse.slow, the "
                             "job's output, jobwrap status and report, the metrics. 0: "
                             "never.", non_negative=True)
    slow_window: float = _opt(60.0, "Seconds of each rank's CPU demand the speed score "
                              "compares.", positive=True)
    slow_hold: float = _opt(30.0, "Seconds a node's score must stay under slow_below before "
                            "it is named.", non_negative=True)
    slow_drain_users: int = _opt(0, "Drain a node once jobs of this many different users "
                                 "named it slow within slow_drain_days (0: never, the record "
                                 "only). Done by the indexer (jobwrap archive index, root); "
                                 "the reason starts \"jobwrap: slow:\" and only an admin "
                                 "resumes it. One user's jobs never count twice: the score "
                                 "is their own processes' state.", non_negative=True)
    slow_drain_days: float = _opt(7.0, "The window slow_drain_users counts users' jobs in.",
                                  positive=True)


class RestartConfig(Section):
    max_restarts: int = _opt(3, "Default for --max-restarts: requeues of one job at most.",
                             non_negative=True)
    max_restarts_limit: int = _opt(-1, "The most restarts a job may ask for (-1: no limit). "
                                   "job_submit.lua (jobwrap install-lua) refuses a job "
                                   "asking more at submit; the prolog, the supervisor and "
                                   "the epilog hold every job to it, whatever its "
                                   "directives say later (scontrol update Extra=...).",
                                   at_least=-1)
    no_progress_limit: int = _opt(2, "Stop requeueing after this many failed attempts in a "
                                  "row ended at the same checkpoint (faults that are not "
                                  "the job's, such as a bad GPU, do not count).",
                                  positive=True)
    release_delay: float = _opt(1.5, "Seconds between a requeued job leaving COMPLETING and "
                                "its release: slurmd refuses a relaunch within the second "
                                "the old credential was revoked.", non_negative=True)
    spare_nodes: str = _opt("", "Default --spare-nodes per partition, e.g. \"gpu=1,big=2\" "
                            "(jobs asking none get these; written into job_submit.lua by "
                            "jobwrap install-lua).")
    node_verdict_wait: float = _opt(120.0, "Seconds jobwrap run waits, after srun said it "
                                    "could not reach a node, for Slurm to say whether the "
                                    "node is lost before restarting on it (Slurm marks a "
                                    "node not responding after a failed ping, within "
                                    "SlurmdTimeout).", non_negative=True)
    batch_wrapper: str = _opt("", "Path of the jobwrap command on the compute nodes: when "
                              "set, job_submit.lua (jobwrap install-lua) makes every batch "
                              "script of a POSIX shell run under `jobwrap run`, so that a "
                              "rank's crash or kill restarts inside the allocation with no "
                              "change to the script (docs/recovery.md); \"\" off.")


class StagingConfig(Section):
    verify: str = _opt("size", "How a staged file is verified before the job sees it: size, "
                       "or sha256 (size and checksum).", choices=("size", "sha256"))
    cache: bool = _opt(True, "Keep staged-in datasets in the node cache (paths.cache_root), "
                       "so later jobs on the node re-stage them almost for free.")
    cache_max_gib: float = _opt(100.0, "Size cap of the node cache in GiB; the least recently "
                                "used datasets are evicted to stay under it, and a larger "
                                "dataset is staged without the cache.", positive=True)
    cache_key: str = _opt("stat", "What identifies a cached dataset: stat (its real path and "
                          "every file's size, mode, mtime and ctime) or sha256 (every "
                          "file's content; reads the whole source at every stage-in).",
                          choices=("stat", "sha256"))
    cache_link: str = _opt("hardlink", "How cached files reach a job's scratch: hardlink "
                           "(instant; read-only files owned by root) or copy (the user's own "
                           "writable copies). Across file systems hardlink copies.",
                           choices=("hardlink", "copy"))
    parallel_files: int = _opt(8, "Files copied at once (threads, never more than the CPUs "
                               "jobwrap may use); small files are spread by folder, a large "
                               "file is a task of its own.", positive=True)
    free_space_margin_gib: float = _opt(1.0, "Local disk space in GiB a stage-in must leave "
                                        "free; data that would leave less fails before "
                                        "anything is copied.", non_negative=True)
    zstd_command: str = _opt("zstd", "Path or name of zstd, which unpacks .tar.zst archives.")
    kept_results_days: float = _opt(7.0, "Days a job's scratch is kept when its stage-out "
                                    "did not bring everything back (a full or unwritable "
                                    "DEST): in <scratch_root>/.quarantine/<jobid>/, readable "
                                    "by root and the job's user; a later epilog removes it.",
                                    non_negative=True)


class ArchiveConfig(Section):
    enabled: bool = _opt(True, "Archive each job's logs and manifest at its end.")
    budget: float = _opt(60.0, "Seconds the epilog may spend archiving on one node; what "
                         "does not fit is recorded as partial or skipped (keep it inside "
                         "[hooks] epilog_budget).", positive=True)
    max_file_mb: int = _opt(1024, "A log larger than this many MiB keeps only its last "
                            "max_file_mb MiB in the archive (marked truncated).", positive=True)
    compression: str = _opt("fast", "gzip effort for archived files: fast (level 1), default "
                            "(6) or best (9).", choices=("fast", "default", "best"))
    hook_log_scan_mb: int = _opt(64, "MiB at the end of [log] file searched for the job's hook "
                                 "log lines.", positive=True)
    outputs: tuple[str, ...] = _opt((), "Further files of every job to archive from each of "
                                    "its nodes, besides its stdout and stderr: Slurm filename "
                                    "patterns (%j %x %u %N %n ...) relative to the job's work "
                                    "dir, e.g. [\"%x-%j-%N.log\"]; read as the job's user.")
    git_timeout: float = _opt(10.0, "Seconds the manifest may spend reading the git facts "
                              "(commit, branch, changes) of the job's work dir from its .git "
                              "(no git is run).", positive=True)
    max_age_days: float = _opt(90.0, "jobwrap archive prune removes job archives last written "
                               "more than this many days ago (0: never by age).",
                               non_negative=True)
    max_total_gb: float = _opt(0.0, "jobwrap archive prune removes the oldest job archives "
                               "until all fit in this many GiB (0: no size limit).",
                               non_negative=True)
    access: str = _opt("user", "Who reads an archive besides root: user (the job's user "
                       "alone, through a POSIX ACL; root and admin_group own it: folders "
                       "0750, files 0640; the archive's file system needs ACLs), group (the "
                       "job user's whole primary group: folders 0750 root:GROUP, files 0640; "
                       "only where no two users share a primary group, see jobwrap doctor) "
                       "or acl (the former name of user).",
                       choices=("user", "group", "acl"))
    admin_group: str = _opt("root", "With access = \"user\": the group of the admins who "
                            "read every archive.")
    index_backend: str = _opt("sqlite", "What keeps the archive's index (one record per job, "
                              "which status, report, list and prune read): sqlite, a file "
                              "only root reads; mariadb, a MariaDB or MySQL database "
                              "(index_connection), one for several clusters (docs/scale.md).",
                              choices=("sqlite", "mariadb"))
    index_connection: str = _opt("/etc/jobwrap/index.cnf", "With index_backend = "
                                 "\"mariadb\": the client option file naming the database "
                                 "([client] host, port or socket, user, password, database), "
                                 "root's and mode 0600 (refused otherwise).", absolute=True)
    cluster: str = _opt("", "With index_backend = \"mariadb\": this cluster's name in the "
                        "shared index; empty: slurm.conf's ClusterName.")
    index_path: str = _opt("", "The index's SQLite file; empty: <archive_root>/.index/"
                           "archive.sqlite. On an NFS archive root, a path on the admin "
                           "node's local disk (the spool stays in the archive).")


class LoginGuardConfig(Section):
    interval: float = _opt(10.0, "Seconds between two scans of the login node's processes.",
                           positive=True)
    min_uid: int = _opt(1000, "Accounts with a uid below this (system accounts) are never "
                        "touched; neither is root, whatever this says.", non_negative=True)
    exempt_users: tuple[str, ...] = _opt((), "Users the guard never touches.")
    exempt_groups: tuple[str, ...] = _opt((), "Groups whose members (primary or "
                                          "supplementary) the guard never touches.")
    exempt_commands: tuple[str, ...] = _opt(
        ("cc1", "cc1plus", "cc1obj", "as", "ld", "ld.gold", "ld.lld", "collect2", "gcc",
         "g++", "clang", "clang++", "nvcc", "cicc", "ptxas", "make", "ninja", "cmake",
         "rustc", "cargo", "go", "javac", "vim", "nvim", "emacs", "nano", "git", "pip",
         "conda", "mamba", "rsync", "scp", "tar", "gzip", "xz", "zstd"),
        "Commands with their own CPU allowance, counted apart from the user's other "
        "processes: NAME (allowance command_cpu_share) or NAME=SHARE. A process is one "
        "only if its program is a root file named NAME, or what NAME is in "
        "exempt_command_path (not by its name or command line), and it loads no code "
        "from a file that is not root's.")
    exempt_command_path: tuple[str, ...] = _opt(
        ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
         "/usr/lib/gcc/*/*", "/usr/libexec/gcc/*/*", "/usr/local/cuda/bin",
         "/usr/local/cuda/nvvm/bin"),
        "Folders (glob patterns allowed) where each exempt command NAME is looked up, "
        "symlinks followed: a process running the file found is that command. Only files "
        "owned and writable by root alone, in folders likewise, count.")
    command_cpu_share: float = _opt(0.5, "CPU allowance of each exempt command of a user, "
                                    "as a share of all the node's cores.", positive=True)
    protected_commands: tuple[str, ...] = _opt(
        ("sshd", "sshd-session", "sshd-auth", "sftp-server", "login", "su", "sudo",
         "systemd", "(sd-pam)", "bash", "sh", "dash", "zsh", "ksh", "tcsh", "csh", "bsd-csh",
         "fish", "tmux", "tmux: server", "screen", "SCREEN", "mosh-server"),
        "Process names never signalled or reniced (login sessions and shells) when their "
        "program is a root file (owned and writable by root only, in folders likewise), "
        "it loads no code from another file and uses at most session_cpu_cores; their CPU "
        "still counts.")
    session_cpu_cores: float = _opt(0.25, "CPU (cores, since the previous scan) a protected "
                                    "session or shell may use and stay protected: a shell "
                                    "busier than that is judged like any other process.",
                                    positive=True)
    cpu_share: float = _opt(0.1, "Share of all the node's cores (0.1 = 10%) one user may "
                            "use, sustained.", positive=True)
    cpu_window: float = _opt(300.0, "Seconds a user's CPU use must stay above cpu_share "
                             "before the first action.", non_negative=True)
    memory_gib: float = _opt(32.0, "Resident memory (GiB, all of a user's processes "
                             "together) one user may hold.", positive=True)
    memory_window: float = _opt(60.0, "Seconds a user's memory must stay above memory_gib "
                                "before the first action.", non_negative=True)
    ai_commands: tuple[str, ...] = _opt(
        ("torchrun", "deepspeed", "accelerate launch", "vllm serve",
         "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server",
         "torch.distributed.run", "torch.distributed.launch", "text-generation-launcher",
         "tritonserver", "sglang.launch_server", "ollama serve", "llama-server"),
        "AI workload signatures: a process name, or the words a command line starts with "
        "(after a python interpreter, its options and -m).")
    ai_libraries: tuple[str, ...] = _opt(
        ("libcuda.so", "libcudart", "libtorch", "libnccl", "libcublas", "libcudnn"),
        "File-name prefixes of libraries that, mapped into a Python process "
        "(/proc/PID/maps), mark it as GPU or AI work.")
    ai_window: float = _opt(30.0, "Seconds an AI signature or a GPU use must be seen "
                            "before the first action.", non_negative=True)
    gpu_pids_file: str = _opt("", "A TOML file naming the pids on each GPU ([[gpu]] "
                              "processes = [...]), read instead of NVML: for tests and "
                              "dry runs.")
    cpu_actions: tuple[str, ...] = _opt(("warn", "throttle", "terminate"),
                                        "Steps, in order, while a CPU violation continues "
                                        "(each of warn, throttle, terminate).")
    memory_actions: tuple[str, ...] = _opt(("warn", "terminate"), "Steps, in order, while "
                                           "a memory violation continues.")
    gpu_actions: tuple[str, ...] = _opt(("warn", "terminate"), "Steps, in order, while a "
                                        "process uses a GPU.")
    ai_actions: tuple[str, ...] = _opt(("warn", "terminate"), "Steps, in order, while an "
                                       "AI workload runs.")
    escalate_after: float = _opt(120.0, "Seconds between two steps while a violation "
                                 "continues.", positive=True)
    forgive_after: float = _opt(300.0, "Seconds without a violation before its clock is "
                                "cleared and a throttle lifted.", positive=True)
    kill_grace: float = _opt(10.0, "Seconds between SIGTERM and SIGKILL.", non_negative=True)
    throttle_cpu_share: float = _opt(0.02, "CPU a throttled user keeps (cpu.max of the "
                                     "user's slice), as a share of all the node's cores.",
                                     positive=True)
    throttle_nice: int = _opt(19, "Nice value (0-19) given to the offending processes "
                              "where the user has no cgroup v2 slice.", non_negative=True)
    cgroup_root: str = _opt("/sys/fs/cgroup", "cgroup v2 mount; throttling writes "
                            "<cgroup_root>/user.slice/user-UID.slice/cpu.max when it exists.",
                            absolute=True)
    notify_command: tuple[str, ...] = _opt((), "Command run on every step (argv; {user}, "
                                           "{uid}, {rule} and {action} are replaced), the "
                                           "message on stdin; empty: none.")
    advice: str = _opt("Run it as a Slurm job instead: sbatch job.sh (batch), or srun "
                       "--pty bash (interactive, on a compute node).",
                       "Where to run the work instead; ends every message to a user.")


class MetricsConfig(Section):
    textfile: str = _opt("", "node_exporter textfile to write (empty: no metrics), e.g. "
                         "\"/var/lib/prometheus/node-exporter/jobwrap.prom\": a *.prom file in "
                         "node_exporter's --collector.textfile.directory. The hooks update it "
                         "in place (wrapper/metrics.py lists the series).")
    lock_timeout: float = _opt(2.0, "Seconds a hook waits for another's update of the "
                               "textfile before it skips its own (with a warning in the log); "
                               "metrics never hold up a job.", positive=True)


class NotifyConfig(Section):
    command: tuple[str, ...] = _opt((), "Site command run (as root, no shell) when a job is "
                                    "requeued or stopped or a node drained, e.g. "
                                    "[\"/usr/local/bin/page\", \"--job\", \"{job_id}\"]; "
                                    "placeholders {event} {job_id} {attempt} {node} {class} "
                                    "{user} {reason}; the message on its stdin. Empty: none.")
    webhook: str = _opt("", "URL that gets each notification as a JSON POST (http or https; "
                        "redirects are not followed). Empty: none.")
    events: tuple[str, ...] = _opt(("requeue", "stop", "drain"), "Which events notify: any "
                                   "of requeue, stop, drain.",
                                   choices=("requeue", "stop", "drain"))
    rate_limit: int = _opt(10, "At most this many notifications per node per rate_window; "
                           "the next one that goes out counts those dropped.", positive=True)
    rate_window: float = _opt(300.0, "Seconds of rate_limit's window.", positive=True)
    timeout: float = _opt(10.0, "Seconds a command or webhook may take; it runs detached, "
                          "never holding up a hook.", positive=True)


class Config:
    """The whole effective configuration: one Section per table, and where it came from."""

    paths: PathsConfig
    log: LogConfig
    slurm: SlurmConfig
    hooks: HooksConfig
    gpu: GpuConfig
    checks: ChecksConfig
    versions: VersionsConfig
    supervisor: SupervisorConfig
    pulse: PulseConfig
    restart: RestartConfig
    staging: StagingConfig
    archive: ArchiveConfig
    login_guard: LoginGuardConfig
    metrics: MetricsConfig
    notify: NotifyConfig
    source: str

    def __init__(self, source: str = "(defaults)", **sections: Any) -> None:
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            raise TypeError(f"Config has no section {', '.join(sorted(unknown))}")
        for name, cls in SECTIONS.items():
            object.__setattr__(self, name, sections.get(name) or cls())
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"configuration is read-only (Config.{name})")

    def __eq__(self, other: object) -> bool:  # where it came from does not count
        return isinstance(other, Config) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Config(source={self.source!r})"

    def replace(self, **sections: Any) -> Config:
        current = {name: getattr(self, name) for name in SECTIONS}
        source = sections.pop("source", self.source)
        return Config(source, **{**current, **sections})

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {name: getattr(self, name).as_dict() for name in SECTIONS}

    def digest(self) -> str:
        """A stable hash of the effective settings, recorded in manifests."""
        import hashlib

        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


SECTIONS: dict[str, type[Section]] = {
    "paths": PathsConfig, "log": LogConfig, "slurm": SlurmConfig, "hooks": HooksConfig,
    "gpu": GpuConfig, "checks": ChecksConfig, "versions": VersionsConfig,
    "supervisor": SupervisorConfig, "pulse": PulseConfig, "restart": RestartConfig,
    "staging": StagingConfig,
    "archive": ArchiveConfig, "login_guard": LoginGuardConfig, "metrics": MetricsConfig,
    "notify": NotifyConfig,
}

# Numbers beyond this are no one's intent, and past float's or C's range.
_LARGEST = 2**63
_TYPE_NAMES = {"str": "a string", "float": "a number", "int": "an integer", "bool": "true or false"}


def resolve_path(explicit: str | None, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """Return the config path to read and whether it must exist (it was asked for)."""
    environ = os.environ if env is None else env
    if explicit:
        return explicit, True
    if environ.get(ENV_VAR):
        return environ[ENV_VAR], True
    return DEFAULT_PATH, False


def load(explicit: str | None = None, env: dict[str, str] | None = None,
         node: str | None = None) -> Config:
    """Load the effective configuration, raising ConfigError with every problem found.

    ``{node}`` in a node-local path (NODE_LOCAL) is this node's Slurm name: ``node``,
    else ``$SLURMD_NODENAME``, else the short hostname."""
    path, required = resolve_path(explicit, env)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        if required:
            raise ConfigError(path, ["the file does not exist (set by --config or "
                                     f"${ENV_VAR}; unset it to use {DEFAULT_PATH})"]) from None
        return Config()
    except OSError as exc:
        raise ConfigError(path, [f"cannot read the file: {exc.strerror}"]) from None
    return for_node(parse(raw, path), node, env)


# The keys whose folders a node keeps to itself. One config file serves every node; where
# several nodes share a host's disk (the sandbox: slurmd per node on one machine), ``{node}``
# in these gives each its own, as /var/lib/jobwrap is its own on a real node. The archive
# is not among them: it is the one shared place (login nodes read it).
NODE_LOCAL = (("paths", "state_dir"), ("paths", "scratch_root"), ("paths", "cache_root"),
              ("log", "file"), ("metrics", "textfile"))


def this_node(env: dict[str, str] | None = None) -> str:
    """This node's Slurm name: ``$SLURMD_NODENAME`` (Slurm sets it for hooks, jobs and
    steps), else the short hostname."""
    import socket

    environ = os.environ if env is None else env
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _node_name_problem(node: str) -> str | None:
    if not node or len(node) > 64 or node.startswith(".") or any(
            not (c.isascii() and (c.isalnum() or c in "._-")) for c in node):
        return (f"node name {node!r} cannot name a folder (letters, digits, '.', '_', '-'; "
                "at most 64; not starting with '.')")
    return None


def for_node(cfg: Config, node: str | None = None, env: dict[str, str] | None = None
             ) -> Config:
    """``cfg`` with ``{node}`` in its node-local paths replaced by ``node`` (by default
    ``this_node(env)``, looked up only where a path needs it)."""
    templated = [(s, k) for s, k in NODE_LOCAL if "{node}" in getattr(getattr(cfg, s), k)]
    if not templated:
        return cfg
    node = node or this_node(env)
    problem = _node_name_problem(node)
    if problem:
        raise ConfigError(cfg.source, [f"[{s}] {k} has {{node}} but the {problem}"
                                       for s, k in templated])
    sections: dict[str, Any] = {}
    for section, key in templated:
        current = sections.get(section, getattr(cfg, section))
        sections[section] = current.replace(
            **{key: getattr(current, key).replace("{node}", node)})
    return cfg.replace(**sections)


def parse(raw: bytes, path: str) -> Config:
    import tomllib

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(path, ["the file is not UTF-8 text"]) from None
    except ValueError as exc:  # TOMLDecodeError, and integers past Python's digit limit
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(path, ["not valid TOML here: arrays or tables nested too deeply"]
                          ) from None
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for name, value in data.items():
        if name not in SECTIONS:
            problems.append(f"unknown section [{name}]; valid sections: "
                            f"{', '.join(sorted(SECTIONS))}")
            continue
        if not isinstance(value, dict):
            problems.append(f"{name} must be a table ([{name}]), not {_describe(value)}")
            continue
        sections[name] = _build_section(name, SECTIONS[name], value, problems)
    if "pulse" in sections:
        _check_pulse(sections["pulse"], problems)
    if problems:
        raise ConfigError(path, problems)
    return Config(**sections, source=path)


def _build_section(section: str, cls: type[Section], values: dict[str, Any],
                   problems: list[str]) -> Any:
    fields = cls._fields
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        where = f"[{section}] {key}"
        spec = fields.get(key)
        if spec is None:
            problems.append(f"unknown key {where}; valid keys in [{section}]: "
                            f"{', '.join(sorted(fields))}")
            continue
        problem = _check_value(spec, value)
        if problem:
            problems.append(f"{where} = {_show(value)}: expected {problem}")
            continue
        if spec.type == "float":
            value = float(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def port_range(text: str) -> tuple[int, int]:
    """``"7400-7599"`` as (7400, 7599); ValueError names what is wrong."""
    lo_text, sep, hi_text = text.partition("-")
    if not sep or not lo_text.strip().isdigit() or not hi_text.strip().isdigit():
        raise ValueError(f"{text!r} is not a port range like 7400-7599")
    lo, hi = int(lo_text), int(hi_text)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"{text!r}: ports are 1-65535, the first not above the last")
    return lo, hi


def _check_pulse(pulse: PulseConfig, problems: list[str]) -> None:
    try:
        port_range(pulse.ports)
    except ValueError as exc:
        problems.append(f"[pulse] ports = {_show(pulse.ports)}: {exc}")
    if pulse.hang_floor < 3 * pulse.sample_interval:
        problems.append(f"[pulse] hang_floor = {pulse.hang_floor:g} with [pulse] "
                        f"sample_interval = {pulse.sample_interval:g}: expected hang_floor at "
                        f"least 3 x sample_interval ({3 * pulse.sample_interval:g}): a hang "
                        "is judged on several samples, never one or two")
    if pulse.slow_below >= 1.0:
        problems.append(f"[pulse] slow_below = {pulse.slow_below:g}: expected under 1 (a "
                        "score of 1.0 is as fast as the job's typical rank; 0.85 names a "
                        "node ~18% slower), or 0 to name no node")
    if pulse.slow_drain_users == 1:
        problems.append("[pulse] slow_drain_users = 1: one user's jobs would drain any node "
                        "they run on (the score is their own processes' state); expected 0 "
                        "(never drain) or 2 or more different users")
    if pulse.slow_window < 5 * pulse.sample_interval:
        problems.append(f"[pulse] slow_window = {pulse.slow_window:g} with [pulse] "
                        f"sample_interval = {pulse.sample_interval:g}: expected slow_window "
                        f"at least 5 x sample_interval ({5 * pulse.sample_interval:g}): a "
                        "speed is judged over several samples")
    if pulse.lost_after < 3 * pulse.interval:
        problems.append(f"[pulse] lost_after = {pulse.lost_after:g} with [pulse] interval = "
                        f"{pulse.interval:g}: expected lost_after at least 3 x interval "
                        f"({3 * pulse.interval:g}): a node missing two beats is not lost")


def _check_value(spec: Opt, value: Any) -> str | None:
    type_name = spec.type
    if type_name == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and not (abs(value) < _LARGEST if isinstance(value, int) else math.isfinite(value)):
            return "a finite number"
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not abs(value) < _LARGEST:
            return f"an integer below {_LARGEST}"
    elif type_name == "bool":
        ok = isinstance(value, bool)
    elif type_name.startswith("tuple"):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        type_name = "an array of strings"
    else:
        ok = isinstance(value, str)
    if not ok:
        return f"{_TYPE_NAMES.get(type_name, type_name)}, not {_describe(value)}"
    if spec.choices and any(v not in spec.choices for v in
                            (value if isinstance(value, list) else [value])):
        return ("an array of " if isinstance(value, list) else "") + "one of " + \
            ", ".join(repr(c) for c in spec.choices)
    if spec.absolute and not os.path.isabs(value):
        return "an absolute path"
    if spec.positive and value <= 0:
        return "a number greater than 0"
    if spec.non_negative and value < 0:
        return "a number of 0 or more"
    if spec.at_least is not None and value < spec.at_least:
        return f"a number of {spec.at_least:g} or more"
    return None


def _describe(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _LARGEST:
        return "a very large integer"
    return json.dumps(value) if isinstance(value, str | int | float | bool) else _describe(value)


def documented_defaults() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) for every key: the reference the README is built from."""
    rows = []
    for section, cls in SECTIONS.items():
        for f in cls._fields.values():
            rows.append((section, f.name, f.default, f.doc))
    return rows


def defaults_toml(*, commented: bool = False) -> str:
    """Every key with its default and what it does, as TOML; ``commented``: each key a
    comment too, so a site's file (``jobwrap install``) sets nothing until it is edited and
    later releases' defaults still apply."""
    out, section = [], None
    for sect, key, default, doc in documented_defaults():
        if sect != section:
            out.append(f"\n[{sect}]")
            section = sect
        out.append(f"# {doc}\n{'# ' if commented else ''}{key} = {_toml_value(default)}")
    return "\n".join(out) + "\n"


def to_toml(config: Config) -> str:
    """Render the effective config as TOML that :func:`parse` reads back unchanged."""
    out = [f"# effective jobwrap configuration (source: {config.source})"]
    for section, values in config.as_dict().items():
        out.append(f"\n[{section}]")
        for key, value in values.items():
            out.append(f"{key} = {_toml_value(value)}")
    return "\n".join(out) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    # A JSON string is a TOML basic string, once non-BMP characters are left literal
    # (JSON would write surrogate pairs) and DEL is escaped (TOML forbids it raw).
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
