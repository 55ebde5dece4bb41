"""``jobwrap check`` as an admin runs it: a subprocess, its output and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wrapper.gpu.fake import load_inventory

HEALTHY = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "healthy-4.toml"


def site(tmp_path: Path, inventory: str | Path = HEALTHY, extra: str = "") -> Path:
    config = tmp_path / "jobwrap.toml"
    # A scontrol that is not there: these tests never talk to a real Slurm.
    config.write_text(f'[gpu]\nbackend = "fake"\nfake_inventory = "{inventory}"\n'
                      f'[slurm]\nbackend = "cli"\nscontrol_command = "{tmp_path}/no-scontrol"\n'
                      + extra)
    return config


def jobwrap(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wrapper", "--config", str(config), "check",
                           *args], capture_output=True, text=True, check=False)


def with_fault(tmp_path: Path, old: str, new: str, *, gpu: int = 1) -> Path:
    """The healthy inventory with one line of one GPU changed."""
    blocks = HEALTHY.read_text().split("[[gpu]]")
    assert old in blocks[gpu + 1]
    blocks[gpu + 1] = blocks[gpu + 1].replace(old, new, 1)
    path = tmp_path / "faulty.toml"
    path.write_text("[[gpu]]".join(blocks))
    return path


def test_a_healthy_node_exits_0_with_json(tmp_path: Path) -> None:
    res = jobwrap(site(tmp_path), "all", "--json", "--node", "n1")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["verdict"], doc["node"], doc["target"], doc["drain_reason"]) == \
        ("pass", "n1", "all", None)
    assert doc["slurm"]["gres"] is None and "no-scontrol" in doc["slurm"]["error"]
    assert doc["resume"] is None
    assert {r["check"] for r in doc["results"]} >= {"ecc", "xid", "driver", "cuda"}


def test_an_unhealthy_node_exits_1_and_names_the_gpu(tmp_path: Path) -> None:
    bad = with_fault(tmp_path, "row_remap_failed = false", "row_remap_failed = true")
    res = jobwrap(site(tmp_path, bad), "gpu")
    assert res.returncode == 1, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "GPU", "STATUS", "REASON"]
    [failed] = [ln for ln in lines if ln.split()[3:4] == ["FAIL"]]
    assert failed.split()[:4] == ["row_remap", "1", "GPU-11a2b3c4", "FAIL"]
    assert any(ln.startswith("  FAIL row_remap gpu1 (GPU-11a2b3c4-5d6e-7f80-91a2-b3c4d5e6f701)"
                             ": row remapping failed") for ln in lines)
    assert "FAIL (1 failed, 0 warnings" in res.stdout
    assert "drain reason: jobwrap: row_remap gpu1(GPU-11a2b3c4): row remapping failed" \
        in res.stdout
    res = jobwrap(site(tmp_path, bad), "gpu", "--json")
    assert res.returncode == 1
    assert json.loads(res.stdout)["drain_reason"].startswith("jobwrap: row_remap gpu1(")


def test_a_warning_is_healthy(tmp_path: Path) -> None:
    warm = with_fault(tmp_path, "temperature = 33", "temperature = 84", gpu=2)
    res = jobwrap(site(tmp_path, warm), "gpu")
    assert res.returncode == 0, res.stderr
    assert "WARN temperature gpu2 (GPU-21a2b3c4" in res.stdout


def test_versions_only(tmp_path: Path) -> None:
    res = jobwrap(site(tmp_path, extra='[versions]\ndriver_min = "560"\n'), "versions", "--json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert [r["check"] for r in doc["results"]] == ["driver", "cuda"]
    assert doc["drain_reason"] == "jobwrap: driver: driver 550.54.15 is older than driver_min 560"


@pytest.mark.parametrize(("config_text", "words"), [
    ("[checks]\necc = 3\n", "[checks] ecc = 3: expected true or false"),
    ('[gpu]\nbackend = "fake"\n', "needs [gpu] fake_inventory"),
    ('[gpu]\nbackend = "fake"\nfake_inventory = "/nonexistent/inv.toml"\n',
     "fake GPU inventory /nonexistent/inv.toml: the file does not exist"),
    ('[gpu]\nbackend = "nvml"\n[slurm]\nbackend = "cli"\nscontrol_command = "/nonexistent"\n',
     "NVML: cannot initialise NVML: libnvidia-ml.so.1 was not found"),
    ('[gpu]\nbackend = "fake"\nfake_inventory = "INV"\n[checks]\nthrottle_warn = ["hot"]\n',
     "unknown throttle reason 'hot'"),
])
def test_a_broken_jobwrap_or_config_exits_2(tmp_path: Path, config_text: str,
                                            words: str) -> None:
    config = tmp_path / "jobwrap.toml"
    config.write_text(config_text.replace("INV", str(HEALTHY)))
    res = jobwrap(config, "all")
    assert res.returncode == 2, res.stdout
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("jobwrap: error: ")
    assert words in res.stderr


def test_a_bad_inventory_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    bad = with_fault(tmp_path, "temperature = 33", 'temperature = "warm"')
    res = jobwrap(site(tmp_path, bad), "gpu")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert f"fake GPU inventory {bad}: [[gpu]] #2 (index 1): temperature = \"warm\": " \
           "expected an integer" in res.stderr


def test_node_placeholder_follows_node(tmp_path: Path) -> None:
    (tmp_path / "n1.toml").write_text(HEALTHY.read_text())
    with_fault(tmp_path, "row_remap_failed = false", "row_remap_failed = true") \
        .rename(tmp_path / "n2.toml")
    config = site(tmp_path, tmp_path / "{node}.toml")
    assert jobwrap(config, "gpu", "--node", "n1").returncode == 0
    assert jobwrap(config, "gpu", "--node", "n2").returncode == 1


def test_dump_inventory_round_trips(tmp_path: Path) -> None:
    source = with_fault(tmp_path, "xid_events = []", "xid_events = [13, 79]")
    first = tmp_path / "first.toml"
    res = jobwrap(site(tmp_path, source), "gpu", "--dump-inventory", str(first), "--node", "n1")
    assert res.returncode == 0, res.stderr
    assert "wrote the inventory of 4 GPUs" in res.stderr
    assert first.read_text().startswith("# jobwrap fake GPU inventory: read by the fake probe "
                                        "on n1 at ")
    assert load_inventory(str(first)) == load_inventory(str(source))
    # Replaying the dump gives the same readings, dump and verdict again.
    replay = tmp_path / "replay"
    replay.mkdir()
    res = jobwrap(site(replay, first), "gpu", "--dump-inventory", "-")
    assert res.returncode == 0, res.stderr
    assert load_inventory(str(first)) == load_inventory(str(_save(tmp_path, res.stdout)))
    one = json.loads(jobwrap(site(tmp_path, source), "all", "--json").stdout)
    two = json.loads(jobwrap(site(replay, first), "all", "--json").stdout)
    assert one["results"] == two["results"] and one["verdict"] == two["verdict"] == "fail"


def _save(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "from-stdout.toml"
    path.write_text(text)
    return path


def test_dump_to_an_unwritable_place_exits_2(tmp_path: Path) -> None:
    res = jobwrap(site(tmp_path), "--dump-inventory", str(tmp_path / "no" / "such" / "x.toml"))
    assert res.returncode == 2
    assert "cannot write the inventory to" in res.stderr and "Traceback" not in res.stderr


def test_resume_needs_slurm_and_says_so(tmp_path: Path) -> None:
    res = jobwrap(site(tmp_path), "--resume", "--node", "n1")
    assert res.returncode == 2
    assert res.stderr.startswith("jobwrap: error: command ")
    assert "no-scontrol" in res.stderr and "was not found" in res.stderr


def test_check_is_listed_in_help(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "wrapper", "check", "--help"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0
    for option in ("--json", "--dump-inventory", "--resume", "--node"):
        assert option in res.stdout
