"""Version checks against the site's baseline (``[versions]``): driver, CUDA, NCCL,
Fabric Manager and site-listed commands.

Versions compare as dotted numbers (``550.54.15`` > ``535.161.8``). NCCL is found as a
file (``libnccl.so.2.18.5`` under ``nccl_search_paths``), not by importing a framework;
only when no file name carries the version is the library loaded to ask
``ncclGetVersion``. Commands run through :class:`wrapper.runner.Runner`, each cut off at
``command_timeout`` or at what is left of the check's budget.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from wrapper.errors import CommandError
from wrapper.fastdataclass import dataclass
from wrapper.gpu.checks import CheckInput, CheckResult, node_result, register

if TYPE_CHECKING:
    from wrapper.config import Config

_DOTTED = re.compile(r"(?<![\d.])(\d+(?:\.\d+)+)")
_NCCL_FILE = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")


def parse_version(text: str) -> tuple[int, ...]:
    """``"550.54.15"`` -> (550, 54, 15); raises ValueError for anything else."""
    parts = text.strip().split(".")
    if not text.strip() or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a version like 550.54.15")
    return tuple(int(p) for p in parts)


def at_least(found: str, minimum: str) -> bool:
    """Whether ``found`` >= ``minimum``, comparing dotted numbers (missing parts are 0)."""
    a, b = parse_version(found), parse_version(minimum)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) >= b + (0,) * (width - len(b))


def matches(found: str, expected: str) -> bool:
    """Whether ``found`` is ``expected`` or a more precise version of it (12.4.131 is 12.4)."""
    a, b = parse_version(found), parse_version(expected)
    return a[:len(b)] == b


def first_version(text: str) -> str | None:
    """The first dotted number in a command's output (``release 12.4, V12.4.131`` -> 12.4)."""
    match = _DOTTED.search(text)
    return match.group(1) if match else None


@dataclass(frozen=True)
class CommandSpec:
    """One entry of ``[versions] commands``: ``COMMAND ARGS >= VERSION`` (or ``==``)."""

    argv: tuple[str, ...]
    op: str
    version: str
    text: str


def parse_command_spec(text: str) -> CommandSpec:
    """Raises ValueError with what is wrong with one ``[versions] commands`` entry."""
    for op in (">=", "=="):
        command, sep, version = text.rpartition(f" {op} ")
        if sep:
            break
    else:
        raise ValueError(f"{text!r} has no ' >= VERSION' or ' == VERSION' at its end")
    import shlex  # only sites that list commands pay for it

    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise ValueError(f"{text!r}: cannot split the command: {exc}") from None
    if not argv:
        raise ValueError(f"{text!r} has no command before {op}")
    parse_version(version)
    return CommandSpec(argv, op, version.strip(), text)


def config_problems(cfg: Config) -> list[str]:
    """Baseline values in ``[versions]`` that are not versions, and bad command entries."""
    versions = cfg.versions
    problems = []
    for key, value in (("driver_min", versions.driver_min),
                       ("driver_exact", versions.driver_exact),
                       ("cuda_min", versions.cuda_min), ("nccl_min", versions.nccl_min)):
        if value:
            try:
                parse_version(value)
            except ValueError as exc:
                problems.append(f"[versions] {key}: {exc}")
    for entry in versions.commands:
        try:
            parse_command_spec(entry)
        except ValueError as exc:
            problems.append(f"[versions] commands: {exc}")
    return problems


@register("driver", group="versions", enabled=lambda c: True)
def check_driver(inp: CheckInput) -> list[CheckResult]:
    found = inp.driver_version
    if found is None:
        return []
    versions = inp.cfg.versions
    try:
        parse_version(found)
    except ValueError:
        return [node_result("driver", "fail", f"cannot read the driver version {found!r}")]
    if versions.driver_exact and parse_version(found) != parse_version(versions.driver_exact):
        return [node_result("driver", "fail", f"driver {found}, but the site runs "
                            f"{versions.driver_exact} (driver_exact)")]
    if versions.driver_min and not at_least(found, versions.driver_min):
        return [node_result("driver", "fail", f"driver {found} is older than driver_min "
                            f"{versions.driver_min}")]
    baseline = versions.driver_exact or (versions.driver_min and f">= {versions.driver_min}")
    return [node_result("driver", "pass", f"driver {found}"
                        + (f" (baseline {baseline})" if baseline else " (no baseline set)"))]


@register("cuda", group="versions", enabled=lambda c: True)
def check_cuda(inp: CheckInput) -> list[CheckResult]:
    found = inp.cuda_driver_version
    if found is None:
        return []
    minimum = inp.cfg.versions.cuda_min
    if minimum and not at_least(found, minimum):
        return [node_result("cuda", "fail", f"the driver supports CUDA {found}, older than "
                            f"cuda_min {minimum}")]
    return [node_result("cuda", "pass", f"the driver supports CUDA {found}"
                        + (f" (>= {minimum})" if minimum else " (no baseline set)"))]


def find_nccl(paths: tuple[str, ...]) -> tuple[str, str] | None:
    """(version, path) of the first NCCL in ``paths`` (the highest version in that folder),
    or None when there is none."""
    for folder in paths:
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith("libnccl.so"))
        except OSError:
            continue
        if not names:
            continue
        versioned = [(parse_version(m.group(1)), n) for n in names
                     if (m := _NCCL_FILE.match(n))]
        if versioned:
            best = max(versioned)
            return ".".join(map(str, best[0])), os.path.join(folder, best[1])
        for name in names:  # libnccl.so.2 -> libnccl.so.2.18.5
            real = os.path.realpath(os.path.join(folder, name))
            match = _NCCL_FILE.match(os.path.basename(real))
            if match:
                return match.group(1), real
        path = os.path.join(folder, names[0])
        version = nccl_get_version(path)
        if version:
            return version, path
    return None


def nccl_get_version(path: str) -> str | None:
    """Ask the library itself (``ncclGetVersion``); None when it cannot be loaded."""
    import ctypes

    try:
        lib = ctypes.CDLL(path)
        code = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    value = code.value
    # NCCL_VERSION_CODE is major*10000 + minor*100 + patch from 2.9 on, major*1000 +
    # minor*100 + patch before.
    if value >= 20900:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}"


@register("nccl", group="versions", enabled=lambda c: bool(c.versions.nccl_min))
def check_nccl(inp: CheckInput) -> list[CheckResult]:
    versions = inp.cfg.versions
    found = find_nccl(versions.nccl_search_paths)
    if found is None:
        return [node_result("nccl", "fail", "no libnccl.so.* in nccl_search_paths "
                            f"({', '.join(versions.nccl_search_paths)})")]
    version, path = found
    if not at_least(version, versions.nccl_min):
        return [node_result("nccl", "fail", f"NCCL {version} ({path}) is older than nccl_min "
                            f"{versions.nccl_min}")]
    return [node_result("nccl", "pass", f"NCCL {version} ({path})")]


@register("fabric_manager", group="versions", enabled=lambda c: c.versions.fabric_manager)
def check_fabric_manager(inp: CheckInput) -> list[CheckResult]:
    versions = inp.cfg.versions
    unit = versions.fabric_manager_service
    try:
        state = inp.runner.run([versions.systemctl_command, "is-active", unit],
                               timeout=_timeout(inp), check=False).stdout.strip()
    except CommandError as exc:
        return [node_result("fabric_manager", "fail", f"cannot ask systemd about {unit}: {exc}")]
    if state != "active":
        return [node_result("fabric_manager", "fail", f"{unit} is {state or 'unknown'}, not "
                            "active (NVSwitch GPUs cannot talk to each other without it)")]
    try:
        result = inp.runner.run([versions.fabric_manager_command, "--version"],
                                timeout=_timeout(inp))
    except CommandError as exc:
        return [node_result("fabric_manager", "fail", f"cannot read Fabric Manager's version: "
                            f"{exc}")]
    version = first_version(result.stdout + result.stderr)
    driver = inp.driver_version
    if version is None:
        return [node_result("fabric_manager", "fail", "cannot find a version in "
                            f"`{versions.fabric_manager_command} --version`")]
    if driver and parse_version(version) != parse_version(driver):
        return [node_result("fabric_manager", "fail", f"Fabric Manager {version} differs from "
                            f"the driver {driver}; they must be the same version")]
    return [node_result("fabric_manager", "pass", f"{unit} active, version {version}")]


@register("commands", group="versions", enabled=lambda c: bool(c.versions.commands))
def check_commands(inp: CheckInput) -> list[CheckResult]:
    rows = []
    for entry in inp.cfg.versions.commands:
        spec = parse_command_spec(entry)
        name = os.path.basename(spec.argv[0])
        try:
            result = inp.runner.run(list(spec.argv), timeout=_timeout(inp))
        except CommandError as exc:
            rows.append(node_result("commands", "fail", f"{name}: {exc}"))
            continue
        found = first_version(result.stdout + "\n" + result.stderr)
        if found is None:
            rows.append(node_result("commands", "fail", f"{name}: no version in the output of "
                                    f"{' '.join(spec.argv)!r}"))
        elif spec.op == ">=" and not at_least(found, spec.version):
            rows.append(node_result("commands", "fail", f"{name} {found} is older than "
                                    f"{spec.version}"))
        elif spec.op == "==" and not matches(found, spec.version):
            rows.append(node_result("commands", "fail", f"{name} {found}, the site expects "
                                    f"{spec.version}"))
        else:
            rows.append(node_result("commands", "pass", f"{name} {found} ({spec.op} "
                                    f"{spec.version})"))
    return rows


def _timeout(inp: CheckInput) -> float:
    # A command gets its own timeout, but never more than what is left of the check's
    # budget (and at least a moment, so that a spent budget still reports cleanly).
    return max(0.1, min(inp.cfg.versions.command_timeout, inp.seconds_left()))
