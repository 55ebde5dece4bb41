"""job_submit.lua's in-allocation restarts without a change to the script
([restart] batch_wrapper): which scripts get the line, where it goes, what it does when a
real shell runs it, and that the archive gets the script back as its user wrote it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.lua import luarun
from wrapper.restart.batch import MARK, TEST, unwrap
from wrapper.submit.lua import InstallError, SiteDefaults, batch_wrapper, render, template

PLAIN = "#!/bin/bash\n#SBATCH --nodes=2\n#JOBWRAP --max-restarts=2\n\nsrun python train.py\n"


@pytest.fixture(scope="module", params=luarun.interpreter_params())
def lua(request: pytest.FixtureRequest) -> str:
    return luarun.require(request.param)


def _submit(lua: str, tmp_path: Path, scripts: list[str], wrapper: str = "/opt/jw/bin/jobwrap"
            ) -> list[dict[str, Any]]:
    plugin = tmp_path / "job_submit.lua"
    plugin.write_text(render(SiteDefaults(batch_wrapper=wrapper)))
    return luarun.run_cases([luarun.submit_case(s) for s in scripts], tmp_path, lua=lua,
                            plugin=plugin)


def _script(result: dict[str, Any]) -> str | None:
    assert result["rc"] == 0 and "crash" not in result, result
    return (result.get("set") or {}).get("script")


def test_the_line_goes_where_the_header_ends_and_comes_out_again(lua: str,
                                                                tmp_path: Path) -> None:
    [result] = _submit(lua, tmp_path, [PLAIN])
    wrapped = _script(result)
    assert wrapped is not None
    lines = wrapped.splitlines()
    # the header (#!, #SBATCH, #JOBWRAP, the blank line) is untouched, then the line
    assert lines[:4] == PLAIN.splitlines()[:4]
    assert lines[4] == (TEST + "[ ! -x '/opt/jw/bin/jobwrap' ] || exec '/opt/jw/bin/jobwrap' "
                        "run -- '/bin/bash' \"$0\" \"$@\"  " + MARK)
    assert lines[5:] == ["srun python train.py"]
    assert unwrap(wrapped) == PLAIN


@pytest.mark.parametrize(("first", "interpreter"), [
    ("#!/bin/sh", "'/bin/sh'"),
    ("#!/bin/bash -l", "'/bin/bash' '-l'"),
    ("#!/usr/bin/env bash", "'/usr/bin/env' 'bash'"),
    ("#! /usr/bin/zsh", "'/usr/bin/zsh'"),
])
def test_every_posix_shell_is_run_again_the_way_its_line_says(lua: str, tmp_path: Path,
                                                             first: str,
                                                             interpreter: str) -> None:
    [result] = _submit(lua, tmp_path, [f"{first}\nsrun true\n"])
    wrapped = _script(result)
    assert wrapped is not None and f"run -- {interpreter} \"$0\"" in wrapped


@pytest.mark.parametrize("script", [
    "#!/usr/bin/env python3\nprint('hi')\n",  # not a shell
    "#!/bin/csh\necho hi\n",  # not a POSIX shell: the line is not its syntax
    "#!/bin/bash\n#SBATCH -N1\njobwrap run -- srun python train.py\n",  # its own
    "srun true\n",  # no #! line
    "#!/bin/bash\n#SBATCH -N1\n",  # nothing to run
    "#!/bin/bash $(reboot)\ntrue\n",  # a #! line that is not plain words
    "#!/bin/bash\n# a\x0bsrun true\nsrun true\n",  # a line break Python's reader splits on
])
def test_scripts_left_as_they_are(lua: str, tmp_path: Path, script: str) -> None:
    [result] = _submit(lua, tmp_path, [script])
    assert _script(result) is None


def test_off_by_default(lua: str, tmp_path: Path) -> None:
    [result] = _submit(lua, tmp_path, [PLAIN], wrapper="")
    assert _script(result) is None


@pytest.mark.parametrize("text", ["jobwrap", "/opt/jw bin/jobwrap", "/opt/'x'/jobwrap",
                                  "/opt/$(x)/jobwrap"])
def test_a_wrapper_path_that_cannot_be_quoted_plainly_is_refused(text: str) -> None:
    with pytest.raises(InstallError, match="absolute path of the jobwrap command"):
        batch_wrapper(text)


def test_the_marks_agree() -> None:
    plugin = template()
    assert f'local WRAP_MARK = "{MARK}"' in plugin
    assert f"'{TEST}'" in plugin


def test_a_line_that_only_mentions_the_mark_is_kept() -> None:
    script = f"#!/bin/bash\necho '{MARK}'\n"
    assert unwrap(script) == script


@pytest.mark.parametrize("shell", ["bash", "sh", "dash"])
def test_a_real_shell_runs_the_line_as_meant(lua: str, tmp_path: Path, shell: str) -> None:
    """Under Slurm (SLURM_JOB_ID set) the line execs the wrapper with the interpreter, the
    script and its arguments; under the wrapper (JOBWRAP_RUN = the job's id) the script's
    own lines run; where the wrapper is not installed, too."""
    path = shutil.which(shell)
    if path is None:
        pytest.fail(f"{shell} is not installed")
    fake = tmp_path / "bin" / "jobwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"wrapper: $*\"\n")
    fake.chmod(0o755)
    body = f"#!{path}\n#SBATCH -N1\necho \"body: $1 $2\"\n"
    [result] = _submit(lua, tmp_path, [body], wrapper=str(fake))
    wrapped = _script(result)
    assert wrapped is not None
    script = tmp_path / "slurm_script"
    script.write_text(wrapped)
    script.chmod(0o755)

    def run(**env: str) -> str:
        base = {"PATH": os.environ["PATH"], **env}
        return subprocess.run([str(script), "a", "b c"], env=base, capture_output=True,
                              text=True, timeout=10, check=True).stdout

    assert run(SLURM_JOB_ID="5") == f"wrapper: run -- {path} {script} a b c\n"
    assert run(SLURM_JOB_ID="5", JOBWRAP_RUN="5") == "body: a b c\n"
    assert run(SLURM_JOB_ID="5", JOBWRAP_RUN="4") == f"wrapper: run -- {path} {script} a b c\n"
    assert run() == "body: a b c\n"  # outside Slurm: as it was
    fake.chmod(0o644)
    assert run(SLURM_JOB_ID="5") == "body: a b c\n"  # no wrapper on the node
