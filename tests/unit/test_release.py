"""A release a site can pin: ``python -m build`` makes a wheel and an sdist of one version,
the one ``jobwrap --version`` prints and every manifest records; the wheel holds what a
node runs and nothing of the developer's; the sdist carries the licence and changelog.
And the README's tables name every doc and tool there is."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from wrapper import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and sdist built offline from a copy of the tracked files."""
    src = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                           str(out), str(src)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [wheel] = out.glob("*.whl")
    [sdist] = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_and_sdist_carry_the_one_version(built: dict[str, Path]) -> None:
    assert built["wheel"].name == f"jobwrap-{__version__}-py3-none-any.whl"
    assert built["sdist"].name == f"jobwrap-{__version__}.tar.gz"
    with zipfile.ZipFile(built["wheel"]) as wheel:
        [meta] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        assert f"\nVersion: {__version__}\n" in wheel.read(meta).decode()
    printed = subprocess.run([str(Path(sys.executable).parent / "jobwrap"), "--version"],
                             capture_output=True, text=True, check=False)
    assert printed.stdout.strip() == f"jobwrap, version {__version__}", printed
    from wrapper.archive import manifest

    assert manifest.__version__ == __version__  # what each manifest's generator records
    assert f"## {__version__} " in (ROOT / "CHANGELOG.md").read_text()


def test_the_wheel_holds_what_a_node_runs_and_no_developer_code(built: dict[str, Path]
                                                                ) -> None:
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = wheel.namelist()
    assert "wrapper/submit/job_submit.lua" in names and "wrapper/py.typed" in names
    assert "wrapper/watch/flight.py" in names and "wrapper/pulse/judge.py" in names
    # what `jobwrap install` places on a node: every file of the checkout's hooks and units
    shipped_files = {str(p.relative_to(ROOT)) for p in (ROOT / "wrapper" / "ship").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts}
    assert shipped_files and shipped_files <= set(names)
    assert {"wrapper/ship/prolog/prolog", "wrapper/ship/systemd/jobwrap-indexer.timer"
            } <= shipped_files
    shipped = {n for n in names if n.startswith("wrapper/") and n.endswith(".py")}
    assert shipped == {str(p.relative_to(ROOT)) for p in (ROOT / "wrapper").rglob("*.py")}
    assert not [n for n in names if n.startswith(("jobwrap_dev/", "tests/", "tools/"))]
    assert any(n.endswith("entry_points.txt") for n in names)


def test_the_sdist_carries_the_licence_changelog_and_readme(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml",
            "wrapper/ship/prolog/prolog", "wrapper/ship/epilog/epilog",
            "wrapper/ship/systemd/jobwrap-login-guard.service", "docs/security.md"} <= names


def test_the_readme_names_every_doc_and_tool() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z/]+)` \| (.*) \|$",
                                                        readme, re.M)}
    for folder, suffix in (("docs", ".md"), ("tools", "")):
        listed = set(re.findall(r"`([\w.-]+)`", rows[f"{folder}/"]))
        there = {p.name for p in (ROOT / folder).iterdir() if p.is_file()}
        missing = {name for name in there if name not in listed
                   and name.removesuffix(suffix) not in listed}
        assert not missing, f"README's {folder}/ row does not name {sorted(missing)}"
