"""``jobwrap check``: the GPU and version checks by hand, a node's inventory captured, and
a node that jobwrap drained returned to service once it is healthy again.

Exit codes: 0 healthy (warnings are healthy), 1 unhealthy, 2 jobwrap or its config is
broken (one line on stderr). ``--json`` prints :meth:`Report.as_json` (see
wrapper/gpu/report.py) with four more keys: ``node``, ``target``, ``slurm``
(``{"gres": int or null, "error": str or null}``: what Slurm said about the node) and
``resume`` (``{"resumed": bool, "why": str}``, null without ``--resume``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import click

from wrapper.errors import EXIT_OK, EXIT_UNHEALTHY, JobwrapError
from wrapper.gpu.report import TARGETS, Report, read_probe, run_checks
from wrapper.gpu.undrain import ResumeDecision, decide_resume
from wrapper.slurm.records import parse_gres_gpus


@click.command("check")
@click.argument("target", type=click.Choice(TARGETS), default="all", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (a stable shape; see wrapper/gpu/report.py).")
@click.option("--dump-inventory", "dump", metavar="PATH|-",
              help="Write what the probe reads as a fake-probe inventory (TOML) to PATH, or "
                   "to stdout with -, and run no check.")
@click.option("--resume", is_flag=True,
              help="If jobwrap drained this node and the checks now pass, resume it "
                   "(for Slurm's HealthCheckProgram or a timer). Other drains are left alone.")
@click.option("--node", metavar="NAME",
              help="Slurm node name [default: $SLURMD_NODENAME, else the short hostname].")
def check(target: str, as_json: bool, dump: str | None, resume: bool, node: str | None) -> None:
    """Check this node's GPUs (gpu), software versions (versions) or both (all)."""
    from wrapper import config as config_mod
    from wrapper.gpu.backend import open_probe

    path: str | None = click.get_current_context().find_root().obj["config_path"]
    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    cfg = config_mod.load(path, node=name)
    probe = open_probe(cfg.gpu, name)
    try:
        if dump is not None:
            _dump_inventory(probe, dump, name, cfg.checks.probe_budget)
            return
        backend, record, slurm_error = _slurm_node(cfg, name, required=resume)
        gres: int | None = None
        if record:
            try:
                gres = parse_gres_gpus(record.get("Gres", ""))
            except ValueError as exc:
                slurm_error = f"Slurm's Gres for {name}: {exc}"
        report = run_checks(cfg, probe, phase="check", allocated=None, configured_gres=gres,
                            env=os.environ, target=target)
    finally:
        probe.close()
    decision: ResumeDecision | None = None
    if resume and backend is not None:
        decision = decide_resume(record.get("State", ""), record.get("Reason", ""),
                                 report.verdict)
        if decision.resume:
            backend.resume_node(name)
    if as_json:
        doc = {**report.as_json(), "node": name, "target": target,
               "slurm": {"gres": gres, "error": slurm_error},
               "resume": None if decision is None
               else {"resumed": decision.resume, "why": decision.why}}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render_table(report, node=name, slurm_error=slurm_error))
        if decision is not None:
            click.echo(f"resume: {name}: {decision.why}")
    click.get_current_context().exit(EXIT_UNHEALTHY if report.verdict == "fail" else EXIT_OK)


def _slurm_node(cfg: Any, name: str, *, required: bool) -> tuple[Any, dict[str, str], str | None]:
    """The Slurm backend and the node's record; without ``--resume`` Slurm is optional
    (only the gres comparison needs it), so its failure is a note, not an error."""
    from wrapper import slurm

    try:
        backend = slurm.backend(cfg.slurm)
        return backend, backend.node_info(name), None
    except JobwrapError as exc:
        if required:
            raise
        return None, {}, str(exc)


def _dump_inventory(probe: Any, dest: str, node: str, budget: float) -> None:
    import time

    from wrapper.gpu.fake import dump_inventory
    from wrapper.gpu.probe import ALL_FIELDS

    readings = read_probe(probe, ALL_FIELDS, devices=True, versions=True, budget=budget)
    if readings.error is not None:
        raise readings.error
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    text = dump_inventory(readings.driver_version or "", readings.cuda_driver_version or "",
                          readings.devices, comment=f"jobwrap fake GPU inventory: read by the "
                          f"{probe.name} probe on {node} at {stamp}")
    if dest == "-":
        sys.stdout.write(text)
        return
    _write_atomically(dest, text)
    click.echo(f"wrote the inventory of {len(readings.devices)} GPUs to {dest}", err=True)


def _write_atomically(dest: str, text: str) -> None:
    from wrapper.gpu.probe import ProbeError

    tmp = f"{dest}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, dest)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise ProbeError(f"cannot write the inventory to {dest}: {exc.strerror}") from None


_SHOWN = {"pass": "ok", "warn": "WARN", "fail": "FAIL"}


def render_table(report: Report, *, node: str, slurm_error: str | None = None) -> str:
    """One row per check per GPU; the verdict, and the drain reason, last."""
    rows = [("CHECK", "GPU", "STATUS", "REASON")]
    for r in report.results:
        gpu = "-" if r.gpu_index is None else str(r.gpu_index)
        if r.gpu_uuid:
            gpu += f" {r.gpu_uuid[:12]}"
        rows.append((r.check, gpu, _SHOWN[r.status], r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}"
             for row in rows]
    if slurm_error:
        lines.append(f"note: Slurm's gres not compared: {slurm_error}")
    failures, warnings = report.failures, report.warnings
    summary = f"{node}: {report.verdict.upper()} ({len(failures)} failed, {len(warnings)} " \
              f"warnings, {len(report.results)} results)"
    lines.append(summary)
    for r in failures + warnings:
        gpu = "" if r.gpu_index is None else f" gpu{r.gpu_index}" + (
            f" ({r.gpu_uuid})" if r.gpu_uuid else "")
        lines.append(f"  {_SHOWN[r.status]} {r.check}{gpu}: {r.reason}")
    reason = report.drain_reason()
    if reason:
        lines.append(f"drain reason: {reason}")
    return "\n".join(lines)
