"""The suite passes wherever the checkout lives, a private 0700 folder included.

A new admin clones into root's home (mode 0700 on Debian): nothing the test user runs
may live inside the checkout. This runs the login guard's scan tests, which start
processes as the test user, from a copy of the checkout with its own virtualenv (the
way tools/bootstrap makes .venv) in a folder only root can enter.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_user_facing_tests_pass_from_a_checkout_only_root_can_enter() -> None:
    private = Path(tempfile.mkdtemp(prefix="jobwrap-private-"))
    try:
        os.chmod(private, 0o700)
        copy = private / "checkout"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.egg-info", ".*_cache"))
        venv = copy / ".venv"
        subprocess.run([os.path.realpath(sys.executable), "-m", "venv", "--without-pip",
                        str(venv)], check=True, timeout=120)
        python = str(venv / "bin" / "python")
        [packages] = Path(venv, "lib").glob("python3*/site-packages")
        (packages / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        env = {**os.environ, "PYTHONPATH": str(copy)}
        res = subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/unit/loginguard/test_loginguard_scan.py::"
             "test_cpu_is_measured_between_scans_including_new_processes",
             "tests/unit/loginguard/test_loginguard_cli.py::test_dry_run_acts_on_nothing"],
            cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert "2 passed" in res.stdout and "failed" not in res.stdout
        # It really ran the private copy, not this checkout.
        probe = subprocess.run([python, "-c", "import sys, wrapper; print(sys.executable); "
                                "print(wrapper.__file__)"],
                               cwd=copy, env=env, capture_output=True, text=True, check=True)
        assert all(line.startswith(str(copy)) for line in probe.stdout.split()), probe.stdout
    finally:
        shutil.rmtree(private)
