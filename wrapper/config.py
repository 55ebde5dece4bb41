"""Configuration: one TOML file, one schema with every default and its documentation.

Load order: defaults, then the file (``--config``, else ``$JOBWRAP_CONFIG``, else
``/etc/jobwrap/config.toml`` when it exists). Every problem in a file is reported at
once, each naming the key and what was expected. The schema is hand-written dataclasses
rather than a validation library because the prolog loads it on the start path of
every job, where an import of pydantic alone would cost more than the whole budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wrapper.errors import ConfigError

DEFAULT_PATH = "/etc/jobwrap/config.toml"
ENV_VAR = "JOBWRAP_CONFIG"


def _opt(default: Any, doc: str, *, choices: tuple[str, ...] = (), absolute: bool = False,
         positive: bool = False, non_negative: bool = False) -> Any:
    """One config key: its default, its documentation and its constraints, together.

    Supported types: str, int, float, bool and tuple[str, ...] (a TOML array of strings).
    """
    meta = {"doc": doc, "choices": choices, "absolute": absolute, "positive": positive,
            "non_negative": non_negative}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class PathsConfig:
    state_dir: str = _opt("/var/lib/jobwrap", "Per-job state (events) and node state; "
                          "node-local, owned by root.", absolute=True)
    scratch_root: str = _opt("/local/jobwrap", "Node-local scratch; each job gets "
                             "<scratch_root>/<jobid>, owned by the job user, mode 0700.",
                             absolute=True)
    cache_root: str = _opt("/local/jobwrap-cache", "Node-local cache of staged datasets, "
                           "shared by the jobs on a node.", absolute=True)
    archive_root: str = _opt("/var/lib/jobwrap/archive", "Where each job's logs and "
                             "manifest are archived: <archive_root>/<user>/<jobid>/.",
                             absolute=True)


@dataclass(frozen=True)
class LogConfig:
    file: str = _opt("/var/log/jobwrap/jobwrap.log", "JSON-lines log file; empty to log "
                     "to stderr only. Hooks that run as the job user log to stderr.")
    level: str = _opt("info", "Least severe level written.",
                      choices=("debug", "info", "warning", "error"))
    stderr_format: str = _opt("auto", "stderr form: console (coloured, for terminals), "
                              "logfmt (one key=value line, for journald/syslog), json; "
                              "auto picks console on a terminal, else logfmt.",
                              choices=("auto", "console", "logfmt", "json"))


@dataclass(frozen=True)
class SlurmConfig:
    backend: str = _opt("auto", "cli: Slurm's commands; pyslurm: only where pyslurm matches "
                        "the running Slurm; auto: pyslurm when it matches, else cli.",
                        choices=("auto", "cli", "pyslurm"))
    scontrol_command: str = _opt("scontrol", "Path or name of scontrol.")
    sinfo_command: str = _opt("sinfo", "Path or name of sinfo.")
    squeue_command: str = _opt("squeue", "Path or name of squeue.")
    command_timeout: float = _opt(10.0, "Seconds before a Slurm command is killed.",
                                  positive=True)


@dataclass(frozen=True)
class HooksConfig:
    on_internal_error: str = _opt("run", "When jobwrap itself fails inside a Slurm hook: "
                                  "run (log loudly, let the job run) or drain the node.",
                                  choices=("run", "drain"))
    prolog_budget: float = _opt(60.0, "Seconds the prolog may take; keep below Slurm's "
                                "PrologEpilogTimeout.", positive=True)
    epilog_budget: float = _opt(120.0, "Seconds the epilog may take; keep below Slurm's "
                                "PrologEpilogTimeout.", positive=True)


@dataclass(frozen=True)
class GpuConfig:
    backend: str = _opt("nvml", "Where GPU readings come from: nvml (pynvml, production) or "
                        "fake (a TOML inventory, for tests and dry runs).",
                        choices=("nvml", "fake"))
    fake_inventory: str = _opt("", "With backend = \"fake\": the TOML inventory to read.")


@dataclass(frozen=True)
class ChecksConfig:
    prolog: bool = _opt(True, "Run the GPU and version checks in the prolog.")
    epilog: bool = _opt(True, "Run the post-job GPU checks in the epilog.")


@dataclass(frozen=True)
class VersionsConfig:
    driver_min: str = _opt("", "Minimum NVIDIA driver version (empty: not checked).")


@dataclass(frozen=True)
class SupervisorConfig:
    enabled: bool = _opt(True, "Start a supervisor for each job on its first node.")


@dataclass(frozen=True)
class RestartConfig:
    max_restarts: int = _opt(3, "Default for --max-restarts: requeues of one job at most.",
                             non_negative=True)


@dataclass(frozen=True)
class StagingConfig:
    verify: str = _opt("size", "How a staged file is verified before the job sees it: size, "
                       "or sha256 (size and checksum).", choices=("size", "sha256"))


@dataclass(frozen=True)
class ArchiveConfig:
    enabled: bool = _opt(True, "Archive each job's logs and manifest at its end.")


@dataclass(frozen=True)
class LoginGuardConfig:
    interval: float = _opt(10.0, "Seconds between two scans of the login node's processes.",
                           positive=True)


@dataclass(frozen=True)
class MetricsConfig:
    textfile: str = _opt("", "node_exporter textfile to write (empty: no metrics).")


@dataclass(frozen=True)
class Config:
    paths: PathsConfig = field(default_factory=PathsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    versions: VersionsConfig = field(default_factory=VersionsConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    staging: StagingConfig = field(default_factory=StagingConfig)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    login_guard: LoginGuardConfig = field(default_factory=LoginGuardConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: str = field(default="(defaults)", compare=False)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {
            f.name: dataclasses.asdict(getattr(self, f.name))
            for f in dataclasses.fields(self) if f.name != "source"
        }

    def digest(self) -> str:
        """A stable hash of the effective settings, recorded in manifests."""
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


SECTIONS: dict[str, type] = {
    "paths": PathsConfig, "log": LogConfig, "slurm": SlurmConfig, "hooks": HooksConfig,
    "gpu": GpuConfig, "checks": ChecksConfig, "versions": VersionsConfig,
    "supervisor": SupervisorConfig, "restart": RestartConfig, "staging": StagingConfig,
    "archive": ArchiveConfig, "login_guard": LoginGuardConfig, "metrics": MetricsConfig,
}

_TYPE_NAMES = {"str": "a string", "float": "a number", "int": "an integer", "bool": "true or false"}


def resolve_path(explicit: str | None, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """Return the config path to read and whether it must exist (it was asked for)."""
    environ = os.environ if env is None else env
    if explicit:
        return explicit, True
    if environ.get(ENV_VAR):
        return environ[ENV_VAR], True
    return DEFAULT_PATH, False


def load(explicit: str | None = None, env: dict[str, str] | None = None) -> Config:
    """Load the effective configuration, raising ConfigError with every problem found."""
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
    return parse(raw, path)


def parse(raw: bytes, path: str) -> Config:
    import tomllib

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(path, ["the file is not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
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
    if problems:
        raise ConfigError(path, problems)
    return Config(**sections, source=path)


def _build_section(section: str, cls: type, values: dict[str, Any], problems: list[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
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
        if spec.type in (float, "float"):
            value = float(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def _check_value(spec: dataclasses.Field[Any], value: Any) -> str | None:
    type_name = spec.type if isinstance(spec.type, str) else spec.type.__name__
    meta = spec.metadata
    if type_name == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif type_name == "bool":
        ok = isinstance(value, bool)
    elif type_name.startswith("tuple"):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        type_name = "an array of strings"
    else:
        ok = isinstance(value, str)
    if not ok:
        return f"{_TYPE_NAMES.get(type_name, type_name)}, not {_describe(value)}"
    if meta.get("choices") and value not in meta["choices"]:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if meta.get("absolute") and not os.path.isabs(value):
        return "an absolute path"
    if meta.get("positive") and value <= 0:
        return "a number greater than 0"
    if meta.get("non_negative") and value < 0:
        return "a number of 0 or more"
    return None


def _describe(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | int | float | bool) else _describe(value)


def documented_defaults() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) for every key: the reference the README is built from."""
    rows = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            rows.append((section, f.name, f.default, f.metadata.get("doc", "")))
    return rows


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
