"""The GPU health checks: each a small registered unit with a name, its config switch and
thresholds (``[checks]`` in the config) and a function from readings to results.

A check never talks to a GPU: it reads the :class:`GpuReading` records a probe produced
(only the fields it declares) and returns one :class:`CheckResult` per GPU it judged,
each with a one-line reason that says what is wrong and what to do. Adding a check
touches this file only: write the function, decorate it with :func:`register`, add its
switch to ``ChecksConfig``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal

from wrapper.fastdataclass import dataclass
from wrapper.gpu import xid as xid_table
from wrapper.gpu.probe import GpuReading

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.gpu.probe import Probe
    from wrapper.runner import Runner

Status = Literal["pass", "warn", "fail"]
PHASES = ("prolog", "epilog", "check")
_RANK = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class CheckResult:
    """One verdict: of one check, on one GPU (or on the node when ``gpu_index`` is None)."""

    check: str
    status: Status
    gpu_index: int | None
    gpu_uuid: str | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "gpu_index": self.gpu_index,
                "gpu_uuid": self.gpu_uuid, "reason": self.reason}


@dataclass(frozen=True)
class Allocation:
    """Which GPUs the per-GPU checks judge, and how Slurm's numbers were mapped to them."""

    selected: tuple[GpuReading, ...]
    ids: tuple[int, ...] | None  # Slurm's GPU ids of the job; None: no job (all GPUs)
    rows: tuple[CheckResult, ...]  # the mapping check's results


@dataclass(frozen=True)
class CheckInput:
    """Everything a check may read."""

    cfg: Config
    phase: str
    visible: tuple[GpuReading, ...]  # every GPU the probe sees
    allocation: Allocation
    configured_gres: int | None      # GPUs Slurm's gres gives this node, if known
    driver_version: str | None
    cuda_driver_version: str | None
    probe: Probe
    runner: Runner
    deadline: float                  # time.monotonic() by which this check must end

    @property
    def devices(self) -> tuple[GpuReading, ...]:
        """The GPUs to judge: the job's, or all of them outside a job."""
        return self.allocation.selected

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


CheckFn = Callable[[CheckInput], list[CheckResult]]


@dataclass(frozen=True)
class Check:
    name: str
    group: Literal["gpu", "versions"]
    fields: frozenset[str]           # GpuReading fields the check reads
    enabled: Callable[[Config], bool]
    run: CheckFn


REGISTRY: dict[str, Check] = {}


def register(name: str, *, group: Literal["gpu", "versions"], enabled: Callable[[Config], bool],
             fields: Collection[str] = ()) -> Callable[[CheckFn], CheckFn]:
    def add(fn: CheckFn) -> CheckFn:
        if name in REGISTRY:
            raise AssertionError(f"check {name!r} registered twice")
        REGISTRY[name] = Check(name, group, frozenset(fields), enabled, fn)
        return fn
    return add


def gpu_result(check: str, status: Status, reading: GpuReading, reason: str) -> CheckResult:
    return CheckResult(check, status, reading.index, reading.uuid, reason)


def node_result(check: str, status: Status, reason: str) -> CheckResult:
    return CheckResult(check, status, None, None, reason)


def worst(statuses: Collection[Status]) -> Status:
    return max(statuses, key=_RANK.__getitem__, default="pass")


def _severity(setting: str) -> Status:
    """A config severity (ignore/warn/fail) as a status."""
    return "pass" if setting == "ignore" else "warn" if setting == "warn" else "fail"


def _not_reported(check: str, reading: GpuReading, what: str) -> CheckResult:
    return gpu_result(check, "pass", reading, f"{what} not reported by this GPU")


# -- which GPUs: Slurm's numbers -> NVML's devices -----------------------------------------

def resolve_allocation(visible: Collection[GpuReading], allocated: Collection[int] | None,
                       env: Mapping[str, str], *, phase: str, id_kind: str) -> Allocation:
    """Map the job's GPUs to devices by what Slurm's numbers mean, never by position.

    ``allocated`` are Slurm's GPU ids (SLURM_JOB_GPUS); in a hook they default to the
    environment's. With ``id_kind`` "minor" they are minor numbers (/dev/nvidiaN, what
    gres.conf File= lists), which need not follow NVML's index order. CUDA_VISIBLE_DEVICES,
    when Slurm set it for the hook, must name the same GPUs: by UUID, or by the same
    numbers as SLURM_JOB_GPUS (outside the job's cgroup Slurm does not renumber them).
    Outside a job (phase "check", no allocation) every GPU is judged.
    """
    from wrapper.slurm.parse import parse_index_list

    ordered = tuple(sorted(visible, key=lambda r: r.index))
    key_name = "minor number" if id_kind == "minor" else "index"

    def key(reading: GpuReading) -> int:
        return reading.minor if id_kind == "minor" else reading.index

    by_key = {key(r): r for r in ordered}
    rows: list[CheckResult] = []
    ids: tuple[int, ...] | None = tuple(allocated) if allocated is not None else None
    source = "the job's allocation"
    if ids is None and phase != "check" and env.get("SLURM_JOB_GPUS"):
        text = env["SLURM_JOB_GPUS"]
        source = f"SLURM_JOB_GPUS={text}"
        try:
            ids = tuple(parse_index_list(text))
        except ValueError as exc:
            rows.append(node_result("mapping", "warn", f"cannot read SLURM_JOB_GPUS: {exc}; "
                                    "checking every GPU"))
    cuda_text = env.get("CUDA_VISIBLE_DEVICES", "") if phase != "check" else ""
    cuda = _cuda_devices(cuda_text, ordered, by_key, rows) if cuda_text else None
    if ids is None and cuda is not None:
        selected = tuple(cuda)
        rows.append(node_result("mapping", "pass", f"CUDA_VISIBLE_DEVICES={cuda_text} is "
                                + (_names(selected) or "no GPU")))
        return Allocation(selected, tuple(key(r) for r in selected), tuple(rows))
    if ids is None:
        rows.append(node_result("mapping", "pass", f"no job allocation: all {len(ordered)} "
                                "GPUs checked"))
        return Allocation(ordered, None, tuple(rows))
    if not ids:
        rows.append(node_result("mapping", "pass", "the job has no GPU on this node: no GPU "
                                "checked"))
    selected_list: list[GpuReading] = []
    for gpu_id in dict.fromkeys(ids):
        reading = by_key.get(gpu_id)
        if reading is None:
            seen = ",".join(str(k) for k in sorted(by_key)) or "none"
            rows.append(node_result("mapping", "fail", f"allocated GPU {gpu_id} ({key_name} "
                                    f"{gpu_id}, from {source}) is not visible; visible "
                                    f"{key_name}s: {seen}"))
            continue
        selected_list.append(reading)
        rows.append(gpu_result("mapping", "pass", reading, f"Slurm GPU {gpu_id} is gpu"
                               f"{reading.index} (minor {reading.minor}, {reading.pci_bus_id})"))
    selected = tuple(sorted(selected_list, key=lambda r: r.index))
    if cuda is not None and {r.index for r in cuda} != {r.index for r in selected}:
        rows.append(node_result("mapping", "warn", f"CUDA_VISIBLE_DEVICES={cuda_text} names "
                                f"{_names(cuda) or 'no GPU'} but {source} names "
                                f"{_names(selected) or 'no GPU'}; check [checks] slurm_gpu_ids"))
    return Allocation(selected, ids, tuple(rows))


def _names(readings: Collection[GpuReading]) -> str:
    return ",".join(f"gpu{r.index}" for r in sorted(readings, key=lambda r: r.index))


def _cuda_devices(text: str, ordered: tuple[GpuReading, ...], by_key: dict[int, GpuReading],
                  rows: list[CheckResult]) -> list[GpuReading]:
    if text.strip() == "NoDevFiles":  # Slurm's value when the gres has no device files
        return []
    found: list[GpuReading] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        match: GpuReading | None = None
        if entry.isdigit():
            match = by_key.get(int(entry))
        elif entry.upper().startswith("GPU-"):
            # CUDA accepts any unique prefix of a UUID.
            hits = [r for r in ordered if r.uuid.lower().startswith(entry.lower())]
            match = hits[0] if len(hits) == 1 else None
        elif entry.upper().startswith("MIG-"):
            rows.append(node_result("mapping", "warn", f"CUDA_VISIBLE_DEVICES entry {entry} is "
                                    "a MIG instance; jobwrap checks whole GPUs only"))
            continue
        if match is None:
            rows.append(node_result("mapping", "warn", f"CUDA_VISIBLE_DEVICES entry {entry!r} "
                                    "matches no visible GPU"))
            continue
        found.append(match)
    return found


# -- the checks ------------------------------------------------------------------------------

@register("count", group="gpu", enabled=lambda c: c.checks.count)
def check_count(inp: CheckInput) -> list[CheckResult]:
    visible = len(inp.visible)
    minors = ",".join(str(r.minor) for r in inp.visible) or "none"
    rows = []
    gres = inp.configured_gres
    if gres is None:
        rows.append(node_result("count", "pass", f"{visible} GPUs visible (Slurm's gres not "
                                "compared)"))
    elif visible < gres:
        rows.append(node_result("count", "fail", f"only {visible} of the {gres} GPUs in Slurm's "
                                f"gres are visible (minors {minors}); a GPU is missing"))
    elif visible > gres:
        rows.append(node_result("count", "warn", f"{visible} GPUs visible but Slurm's gres lists "
                                f"{gres}; update gres.conf/slurm.conf"))
    else:
        rows.append(node_result("count", "pass", f"{visible} GPUs visible, as Slurm's gres "
                                "lists"))
    ids = inp.allocation.ids
    if ids is not None and len(set(ids)) > visible:
        rows.append(node_result("count", "fail", f"the job was allocated {len(set(ids))} GPUs "
                                f"but only {visible} are visible"))
    return rows


@register("mapping", group="gpu", enabled=lambda c: c.checks.mapping)
def check_mapping(inp: CheckInput) -> list[CheckResult]:
    return list(inp.allocation.rows)


@register("ecc", group="gpu", enabled=lambda c: c.checks.ecc,
          fields=("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"))
def check_ecc(inp: CheckInput) -> list[CheckResult]:
    limit = inp.cfg.checks.ecc_aggregate_max
    rows = []
    for r in inp.devices:
        vol, agg = r.ecc_volatile_uncorrected, r.ecc_aggregate_uncorrected
        if vol is None and agg is None:
            rows.append(_not_reported("ecc", r, "ECC error counts (ECC off or unsupported)"))
        elif vol:
            rows.append(gpu_result("ecc", "fail", r, f"{vol} uncorrectable ECC errors since the "
                                   "last reset (volatile); reset the GPU"))
        elif agg is not None and agg > limit:
            rows.append(gpu_result("ecc", "fail", r, f"{agg} uncorrectable ECC errors over its "
                                   f"life (aggregate), above ecc_aggregate_max {limit}"))
        elif agg:
            rows.append(gpu_result("ecc", "warn", r, f"{agg} uncorrectable ECC errors over its "
                                   f"life (aggregate; fails above {limit})"))
        else:
            rows.append(gpu_result("ecc", "pass", r, "no uncorrectable ECC errors"))
    return rows


@register("retired_pages", group="gpu", enabled=lambda c: c.checks.retired_pages,
          fields=("retired_pages_pending", "retired_pages_dbe", "retired_pages_sbe"))
def check_retired_pages(inp: CheckInput) -> list[CheckResult]:
    limit = inp.cfg.checks.retired_pages_max
    rows = []
    for r in inp.devices:
        dbe, sbe = r.retired_pages_dbe, r.retired_pages_sbe
        total = (dbe or 0) + (sbe or 0)
        if r.retired_pages_pending is None and dbe is None and sbe is None:
            rows.append(_not_reported("retired_pages", r, "page retirement (GPUs from Ampere "
                                      "on remap rows instead)"))
        elif r.retired_pages_pending:
            rows.append(gpu_result("retired_pages", "fail", r, "retired pages pending; reset "
                                   "the GPU (or reboot) to retire them"))
        elif total >= limit:
            rows.append(gpu_result("retired_pages", "fail", r, f"{total} retired pages, at or "
                                   f"above retired_pages_max {limit}; the GPU needs service"))
        elif dbe:
            rows.append(gpu_result("retired_pages", "warn", r, f"{dbe} pages retired for "
                                   f"double-bit ECC errors ({total} in all)"))
        else:
            rows.append(gpu_result("retired_pages", "pass", r, f"{total} retired pages, none "
                                   "pending"))
    return rows


@register("row_remap", group="gpu", enabled=lambda c: c.checks.row_remap,
          fields=("row_remap_pending", "row_remap_failed"))
def check_row_remap(inp: CheckInput) -> list[CheckResult]:
    rows = []
    for r in inp.devices:
        if r.row_remap_failed is None and r.row_remap_pending is None:
            rows.append(_not_reported("row_remap", r, "row remapping"))
        elif r.row_remap_failed:
            rows.append(gpu_result("row_remap", "fail", r, "row remapping failed (no spare rows "
                                   "left); the GPU needs service"))
        elif r.row_remap_pending:
            rows.append(gpu_result("row_remap", _severity(inp.cfg.checks.row_remap_pending), r,
                                   "row remapping pending; reset the GPU to apply it"))
        else:
            rows.append(gpu_result("row_remap", "pass", r, "no row remapping pending or failed"))
    return rows


@register("xid", group="gpu", enabled=lambda c: c.checks.xid, fields=("xid_events",))
def check_xid(inp: CheckInput) -> list[CheckResult]:
    drain, _ = xid_table.parse_codes(inp.cfg.checks.xid_drain, "xid_drain")
    ignore, _ = xid_table.parse_codes(inp.cfg.checks.xid_ignore, "xid_ignore")
    rows = []
    for r in inp.devices:
        if r.xid_events is None:
            rows.append(gpu_result("xid", "pass", r, "Xid events not available (the kernel log "
                                   "needs root; see [gpu] xid_source)"))
            continue
        infos = [xid_table.classify(code, drain_extra=drain, ignore=ignore)
                 for code in r.xid_events]
        by_action = {action: [i for i in infos if i.action == action]
                     for action in ("drain", "warn", "app")}
        if by_action["drain"]:
            rows.append(gpu_result("xid", "fail", r, _xids(by_action["drain"])
                                   + _also(by_action["warn"] + by_action["app"])))
        elif by_action["warn"]:
            rows.append(gpu_result("xid", "warn", r, _xids(by_action["warn"])
                                   + _also(by_action["app"])))
        elif by_action["app"]:
            rows.append(gpu_result("xid", "pass", r, _xids(by_action["app"])
                                   + ": the application's fault, not the node's"))
        else:
            rows.append(gpu_result("xid", "pass", r, "no recent Xid events"))
    return rows


def _xids(infos: list[xid_table.XidInfo]) -> str:
    return ", ".join(f"Xid {i.code} ({i.name})" for i in infos)


def _also(infos: list[xid_table.XidInfo]) -> str:
    return f"; also Xid {','.join(str(i.code) for i in infos)}" if infos else ""


@register("temperature", group="gpu", enabled=lambda c: c.checks.temperature,
          fields=("temperature", "temperature_slowdown", "temperature_shutdown"))
def check_temperature(inp: CheckInput) -> list[CheckResult]:
    margin = inp.cfg.checks.temperature_margin
    rows = []
    for r in inp.devices:
        t, slow, shut = r.temperature, r.temperature_slowdown, r.temperature_shutdown
        if t is None:
            rows.append(_not_reported("temperature", r, "temperature"))
        elif shut is not None and t >= shut:
            rows.append(gpu_result("temperature", "fail", r, f"{t} C, at or above its shutdown "
                                   f"threshold {shut} C; check the cooling"))
        elif slow is not None and t >= slow:
            rows.append(gpu_result("temperature", "fail", r, f"{t} C, at or above its slowdown "
                                   f"threshold {slow} C; check the cooling"))
        elif slow is not None and t >= slow - margin:
            rows.append(gpu_result("temperature", "warn", r, f"{t} C, within {margin} C of its "
                                   f"slowdown threshold {slow} C"))
        else:
            limit = f" (slowdown at {slow} C)" if slow is not None else ""
            rows.append(gpu_result("temperature", "pass", r, f"{t} C{limit}"))
    return rows


@register("throttle", group="gpu", enabled=lambda c: c.checks.throttle,
          fields=("throttle_reasons",))
def check_throttle(inp: CheckInput) -> list[CheckResult]:
    fail, warn = set(inp.cfg.checks.throttle_fail), set(inp.cfg.checks.throttle_warn)
    rows = []
    for r in inp.devices:
        if r.throttle_reasons is None:
            rows.append(_not_reported("throttle", r, "clock throttle reasons"))
            continue
        active = list(r.throttle_reasons)
        bad = [a for a in active if a in fail]
        odd = [a for a in active if a in warn and a not in fail]
        if bad:
            rows.append(gpu_result("throttle", "fail", r, f"clocks throttled by {', '.join(bad)}"
                                   " (hardware protection: power or cooling fault)"))
        elif odd:
            rows.append(gpu_result("throttle", "warn", r, f"clocks throttled by "
                                   f"{', '.join(odd)}"))
        else:
            rows.append(gpu_result("throttle", "pass", r, "no harmful throttling (active: "
                                   f"{', '.join(active) or 'none'})"))
    return rows


@register("pcie", group="gpu", enabled=lambda c: c.checks.pcie,
          fields=("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"))
def check_pcie(inp: CheckInput) -> list[CheckResult]:
    cfg = inp.cfg.checks
    rows = []
    for r in inp.devices:
        gen, gmax, width, wmax = r.pcie_gen, r.pcie_gen_max, r.pcie_width, r.pcie_width_max
        if gen is None and width is None:
            rows.append(_not_reported("pcie", r, "PCIe link"))
            continue
        found: list[tuple[Status, str]] = []
        if width is not None and wmax is not None and width < wmax:
            found.append((_severity(cfg.pcie_width_below_max),
                          f"PCIe link x{width}, below its x{wmax} (reseat the GPU or riser)"))
        if gen is not None and gmax is not None and gen < gmax:
            found.append((_severity(cfg.pcie_gen_below_max),
                          f"PCIe gen{gen}, below its gen{gmax}"
                          + (" (idle GPUs lower it)" if cfg.pcie_gen_below_max == "ignore"
                             else "")))
        status = worst([s for s, _ in found])
        text = "; ".join(t for _, t in sorted(found, key=lambda f: -_RANK[f[0]]))
        rows.append(gpu_result("pcie", status, r, text or f"PCIe gen{gen} x{width}"))
    return rows


@register("nvlink", group="gpu", enabled=lambda c: c.checks.nvlink,
          fields=("nvlink_links", "nvlink_links_down"))
def check_nvlink(inp: CheckInput) -> list[CheckResult]:
    expected = inp.cfg.checks.nvlink_expected
    rows = []
    for r in inp.devices:
        if r.nvlink_links is None:
            status: Status = "fail" if expected else "pass"
            rows.append(gpu_result("nvlink", status, r, "no NVLink reported"
                                   + (f" ({expected} expected)" if expected else "")))
            continue
        down = list(r.nvlink_links_down or ())
        up = r.nvlink_links - len(down)
        listed = f" (down: {','.join(map(str, down))})" if down else ""
        if expected and up < expected:
            rows.append(gpu_result("nvlink", "fail", r, f"{up} NVLinks up, {expected} expected"
                                   + listed))
        elif expected and down:
            rows.append(gpu_result("nvlink", "warn", r, f"{up} NVLinks up as expected, but "
                                   f"{len(down)} more down" + listed))
        elif not expected and down:
            rows.append(gpu_result("nvlink", "fail", r, f"NVLink {','.join(map(str, down))} "
                                   f"down ({up} of {r.nvlink_links} up)"))
        else:
            rows.append(gpu_result("nvlink", "pass", r, f"{up} of {r.nvlink_links} NVLinks up"))
    return rows


@register("persistence", group="gpu", enabled=lambda c: c.checks.persistence,
          fields=("persistence_mode",))
def check_persistence(inp: CheckInput) -> list[CheckResult]:
    rows = []
    for r in inp.devices:
        if r.persistence_mode is None:
            rows.append(_not_reported("persistence", r, "persistence mode"))
        elif not r.persistence_mode:
            rows.append(gpu_result("persistence", _severity(inp.cfg.checks.persistence_off), r,
                                   "persistence mode is off (run nvidia-persistenced)"))
        else:
            rows.append(gpu_result("persistence", "pass", r, "persistence mode on"))
    return rows


@register("in_use", group="gpu", enabled=lambda c: c.checks.in_use,
          fields=("memory_used_mib", "compute_pids"))
def check_in_use(inp: CheckInput) -> list[CheckResult]:
    limit = inp.cfg.checks.in_use_memory_max_mib
    warn_at = inp.cfg.checks.in_use_memory_warn_mib
    when = {"prolog": "before the job", "epilog": "after the job"}.get(inp.phase)
    rows = []
    for r in inp.devices:
        pids, used = r.compute_pids, r.memory_used_mib
        if pids is None and used is None:
            rows.append(_not_reported("in_use", r, "memory use and processes"))
            continue
        summary = f"{len(pids or ())} processes, {used if used is not None else '?'} MiB used"
        if when is None:
            rows.append(gpu_result("in_use", "pass", r, f"{summary} (judged only in the prolog "
                                   "and epilog)"))
        elif pids:
            shown = ",".join(map(str, pids[:5])) + ("..." if len(pids) > 5 else "")
            rows.append(gpu_result("in_use", "fail", r, f"{len(pids)} processes on the GPU "
                                   f"{when} (pids {shown}); a stale process holds it"))
        elif used is not None and used > limit:
            rows.append(gpu_result("in_use", "fail", r, f"{used} MiB of GPU memory in use "
                                   f"{when}, above in_use_memory_max_mib {limit}"))
        elif used is not None and used > warn_at:
            rows.append(gpu_result("in_use", "warn", r, f"{used} MiB of GPU memory in use "
                                   f"{when} with no process on it"))
        else:
            rows.append(gpu_result("in_use", "pass", r, f"free {when} ({summary})"))
    return rows


def config_problems(cfg: Config) -> list[str]:
    """What in ``[checks]`` the schema cannot see is wrong (Xid numbers, throttle names)."""
    from wrapper.gpu.probe import THROTTLE_REASONS

    checks = cfg.checks
    problems = []
    for key, codes in (("xid_drain", checks.xid_drain), ("xid_ignore", checks.xid_ignore)):
        problems += xid_table.parse_codes(codes, key)[1]
    for key, names in (("throttle_fail", checks.throttle_fail),
                       ("throttle_warn", checks.throttle_warn)):
        for name in names:
            if name not in THROTTLE_REASONS:
                problems.append(f"[checks] {key}: unknown throttle reason {name!r}; known: "
                                f"{', '.join(THROTTLE_REASONS)}")
    return problems
