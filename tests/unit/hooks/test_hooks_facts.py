"""The prolog remembers, per node, that its scontrol has no ``--json`` (Slurm < 23.02), so
it does not start a failing scontrol on every job; an upgraded scontrol is asked again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from wrapper import config
from wrapper.slurm import CliBackend
from wrapper.slurm.commands import ABILITIES


def site(tmp_path: Path) -> tuple[config.Config, Path]:
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    shutil.copy2("/bin/true", scontrol)  # never run here: only its identity counts
    cfg = config.parse(f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                       f'[slurm]\nscontrol_command = "{scontrol}"\n'.encode(), "t.toml")
    (tmp_path / "state").mkdir()
    return cfg, scontrol


def test_no_json_is_remembered_for_the_same_scontrol(tmp_path: Path) -> None:
    cfg, _ = site(tmp_path)
    first = CliBackend(cfg.slurm)
    first.recall_abilities(cfg.paths.state_dir)
    assert first.json_supported is None  # nothing known yet: the backend asks
    first.json_supported = False  # what asking found
    first.remember_abilities(cfg.paths.state_dir)
    assert (tmp_path / "state" / "nodes" / ABILITIES).is_file()
    later = CliBackend(cfg.slurm)
    later.recall_abilities(cfg.paths.state_dir)
    assert later.json_supported is False


def test_an_upgraded_scontrol_is_asked_again(tmp_path: Path) -> None:
    cfg, scontrol = site(tmp_path)
    first = CliBackend(cfg.slurm)
    first.json_supported = False
    first.remember_abilities(cfg.paths.state_dir)
    scontrol.unlink()
    shutil.copy2("/bin/true", scontrol)  # a new binary: another inode
    os.utime(scontrol, ns=(1, 1))
    later = CliBackend(cfg.slurm)
    later.recall_abilities(cfg.paths.state_dir)
    assert later.json_supported is None


def test_json_support_and_garbage_are_not_cached(tmp_path: Path) -> None:
    cfg, _ = site(tmp_path)
    backend = CliBackend(cfg.slurm)
    backend.json_supported = True  # the real call is the JSON call: nothing to spare
    backend.remember_abilities(cfg.paths.state_dir)
    facts = tmp_path / "state" / "nodes" / ABILITIES
    assert not facts.exists()
    facts.parent.mkdir()
    facts.write_text("[not, json")
    later = CliBackend(cfg.slurm)
    later.recall_abilities(cfg.paths.state_dir)
    assert later.json_supported is None
