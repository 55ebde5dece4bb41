"""The program's entry point: Slurm's hooks run without click (or structlog and asyncio),
everything else is click's command line as before.

The prolog is on the start path of every job; its import budget is measured by
``tests/bench/run prolog-overhead``. These tests keep the budget from rotting: a hook
entry that imports click, structlog or asyncio again fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hooks import FIXTURES, slurm_env
from wrapper.entry import hook_of
from wrapper.job.state import JobState

HEAVY = ("click", "structlog", "asyncio", "ssl")

# Runs the console script's main() with ARGV, then prints its exit code and the heavy
# modules it loaded as the last line of stdout.
PROGRAM = """
import json, sys
sys.argv = ["jobwrap", *sys.argv[1:]]
from wrapper.entry import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY_NAMES)
print(json.dumps({"code": code, "heavy": heavy}))
""".replace("HEAVY_NAMES", repr(HEAVY))


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    config = tmp_path / "jobwrap.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                      f'scratch_root = "{tmp_path}/scratch"\n'
                      f'[log]\nfile = "{tmp_path}/jobwrap.log"\n'
                      f'[gpu]\nbackend = "fake"\nfake_inventory = "{FIXTURES}/healthy-4.toml"\n')
    return {"config": config, "state": tmp_path / "state", "log": tmp_path / "jobwrap.log"}


def run_entry(*argv: str, env: dict[str, str]) -> tuple[int, list[str], str]:
    res = subprocess.run([sys.executable, "-c", PROGRAM, *argv], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.stdout, res.stderr
    last = json.loads(res.stdout.splitlines()[-1])
    return last["code"], last["heavy"], res.stdout


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog"])
def test_a_hook_runs_without_click_structlog_or_asyncio(hook: str,
                                                        site: dict[str, Path]) -> None:
    env = {**slurm_env(hook), "JOBWRAP_CONFIG": str(site["config"]), "PATH": "/usr/bin:/bin"}
    if hook == "task-prolog":  # after the job's prolog, as in Slurm
        assert run_entry("prolog", env={**env, **slurm_env("prolog")})[:2] == (0, [])
    code, heavy, out = run_entry(hook, env=env)
    assert code == 0
    assert heavy == []
    # The hook itself ran, through the frame, with the config JOBWRAP_CONFIG names.
    events = [e["event"] for e in JobState(site["state"], "31").events()]
    assert f"{hook}.context" in events
    if hook == "task-prolog":
        assert "export JOBWRAP_ATTEMPT=1" in out
    else:
        assert f'"hook": "{hook}"' in site["log"].read_text()


def test_a_hook_with_a_broken_config_still_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[paths\n")
    env = {"JOBWRAP_CONFIG": str(bad), "PATH": "/usr/bin:/bin"}  # by hand: not under Slurm
    # `python -m wrapper prolog`, its built-in [log] file (which root's hooks make) moved
    # into this test's folder: the host's /var/log/jobwrap is not the test's to make
    moved = ("import runpy, sys; from wrapper import log; real = log.open_log_file; "
             f"log.open_log_file = lambda path: real({str(tmp_path / 'jobwrap.log')!r}); "
             "sys.argv = ['wrapper', 'prolog']; runpy.run_module('wrapper', "
             "run_name='__main__', alter_sys=True)")
    res = subprocess.run([sys.executable, "-c", moved], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2
    assert "invalid configuration" in res.stderr and str(bad) in res.stderr
    assert "Traceback" not in res.stderr
    assert '"event": "hook.failed"' in (tmp_path / "jobwrap.log").read_text()


@pytest.mark.parametrize("argv", [["prolog", "--help"], ["--help"], ["-v", "prolog"],
                                  ["--config", "/nonexistent", "prolog"], ["config", "defaults"]])
def test_everything_else_is_clicks(argv: list[str]) -> None:
    assert hook_of(argv) is None


def test_hook_help_is_still_clicks(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    code, heavy, out = run_entry("prolog", "--help", env=env)
    assert code == 0
    assert "Slurm Prolog (root, each allocated node)." in out and "Usage: jobwrap prolog" in out
    assert "click" in heavy
    code, _, out = run_entry("--help", env=env)
    assert code == 0 and "task-prolog" in out and "supervise" in out


def test_only_a_bare_hook_name_skips_click() -> None:
    assert [hook_of([h]) for h in ("prolog", "epilog", "task-prolog")] == \
        ["prolog", "epilog", "task-prolog"]
    assert hook_of([]) is None and hook_of(["supervise"]) is None


# The prolog's whole body, in a fresh interpreter, with Slurm and the GPUs behind their
# seams (FakeSlurm, the fake probe) and the watcher's spawn recorded: every module it
# loaded is printed.
PROLOG_BODY = """
import io, json, os, sys
from pathlib import Path
base = set(sys.modules)
from wrapper import config
from wrapper.hooks import Services, run_hook
from wrapper.gpu.fake import FakeProbe, parse_inventory
from wrapper.slurm.fake import FakeSlurm
config_path, inventory_path, env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cfg = config.load(config_path, env)
slurm = FakeSlurm(jobs={"31": {"JobId": "31", "JobState": "RUNNING", "WorkDir": "/tmp"}},
                  scripts={"31": "#!/bin/bash\\ntrue\\n"},
                  nodes={"n1": {"NodeName": "n1", "Gres": "gpu:4"}})
inventory = parse_inventory(Path(inventory_path).read_bytes(), "<n1>")
spawned = []
services = Services(cfg, slurm_factory=lambda: slurm,
                    probe_factory=lambda node: FakeProbe(inventory, "<n1>"),
                    spawn=spawned.append)
code = run_hook("prolog", config_path=config_path, env=env, out=io.StringIO(),
                services=services)
print(json.dumps({"code": code, "spawned": len(spawned),
                  "loaded": sorted(set(sys.modules) - base)}))
"""

# What a quiet prolog (nothing to stage, a healthy node) needs, beyond the entry point.
PROLOG_MODULES = {
    "wrapper", "wrapper.config", "wrapper.detach", "wrapper.errors",
    "wrapper.submit", "wrapper.submit.directives",
    "wrapper.gpu", "wrapper.gpu.checks", "wrapper.gpu.probe", "wrapper.gpu.report",
    "wrapper.gpu.versions", "wrapper.gpu.xid", "wrapper.hooks", "wrapper.hooks.health",
    "wrapper.hooks.services",
    "wrapper.hooks.prolog", "wrapper.hooks.staging", "wrapper.job", "wrapper.job.events",
    "wrapper.job.paths", "wrapper.job.record", "wrapper.job.state", "wrapper.job.store",
    "wrapper.fastdataclass",
    "wrapper.log", "wrapper.metrics", "wrapper.osl", "wrapper.osl.dirs", "wrapper.osl.files",
    "wrapper.osl.jsontext", "wrapper.osl.users", "wrapper.restart", "wrapper.restart.resume",
    "wrapper.runner", "wrapper.slurm", "wrapper.slurm.commands", "wrapper.slurm.context",
    "wrapper.slurm.parse", "wrapper.slurm.records", "wrapper.staging",
    "wrapper.staging.errors", "wrapper.staging.scratch",
    "wrapper.watch", "wrapper.watch.feed", "wrapper.watch.files", "wrapper.watch.process",
    # a requeued attempt's prolog (this one's: SLURM_JOB_RESTART_COUNT=1) reads root's
    # verdicts on the earlier ones from the archive's parts, not the archive's writer
    "wrapper.archive", "wrapper.archive.carry", "wrapper.archive.parts", "wrapper.archive._fs",
}
# Loaded by the test's own fakes and set-up, not by the prolog.
HARNESS = {"wrapper.gpu.fake", "wrapper.slurm.fake"}
# Never on a quiet prolog's path: each was there once and cost it milliseconds.
NEVER = ("click", "structlog", "asyncio", "ssl", "shutil", "ctypes", "socket", "bz2",
         "lzma", "tarfile", "zipfile", "sqlite3", "logging", "email", "http", "pynvml",
         "psutil", "wrapper.staging.copy", "wrapper.staging.cache", "wrapper.staging.channel",
         "wrapper.staging.privileges", "wrapper.osl.child", "wrapper.archive.attempt",
         "wrapper.archive.store", "wrapper.archive.collect", "wrapper.archive.manifest",
         "wrapper.checkpoints", "wrapper.goodput", "wrapper.restart.classify",
         "wrapper.restart.policy", "wrapper.supervisor.monitor", "wrapper.cli")


def test_a_quiet_prolog_loads_only_what_it_uses(site: dict[str, Path], tmp_path: Path) -> None:
    """The prolog-overhead budget, kept: a module that joins the quiet prolog's path must
    be added here on purpose (and measured with ``tests/bench/run prolog-overhead``)."""
    (tmp_path / "scratch").mkdir()
    with site["config"].open("a") as handle:
        handle.write(f'[metrics]\ntextfile = "{tmp_path}/jobwrap.prom"\n')
    res = subprocess.run([sys.executable, "-c", PROLOG_BODY, str(site["config"]),
                          str(FIXTURES / "healthy-4.toml"), json.dumps(slurm_env("prolog"))],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert (out["code"], out["spawned"]) == (0, 1)  # it ran to the end: the watcher
    loaded = set(out["loaded"])
    assert {m for m in loaded if m.split(".")[0] == "wrapper"} - HARNESS == PROLOG_MODULES
    assert sorted(m for m in loaded if m.split(".")[0] in NEVER or m.startswith(
        tuple(n + "." for n in NEVER) + tuple(n for n in NEVER if "." in n))) == []
