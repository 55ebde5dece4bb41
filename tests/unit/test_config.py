from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wrapper import config
from wrapper.errors import ConfigError


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_defaults_when_no_file_and_default_path_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "DEFAULT_PATH", "/nonexistent/jobwrap/config.toml")
    cfg = config.load(None, env={})
    assert cfg == config.Config()
    assert cfg.paths.state_dir == "/var/lib/jobwrap"
    assert cfg.hooks.on_internal_error == "run"
    assert cfg.source == "(defaults)"


def test_every_key_is_documented() -> None:
    rows = config.documented_defaults()
    assert len(rows) >= 15
    for section, key, _default, doc in rows:
        assert doc, f"[{section}] {key} has no documentation"


def test_valid_file_overrides_only_what_it_sets(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[paths]\nstate_dir = "/srv/jw"\n[slurm]\n'
                 "command_timeout = 3\n")
    cfg = config.load(path)
    assert cfg.paths.state_dir == "/srv/jw"
    assert cfg.slurm.command_timeout == 3.0
    assert isinstance(cfg.slurm.command_timeout, float)
    assert cfg.paths.scratch_root == config.PathsConfig().scratch_root
    assert cfg.source == path


def test_env_var_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[log]\nlevel = "debug"\n')
    assert config.load(None, env={"JOBWRAP_CONFIG": path}).log.level == "debug"
    # --config wins over the environment
    other = write(tmp_path / "d.toml", '[log]\nlevel = "error"\n')
    assert config.load(other, env={"JOBWRAP_CONFIG": path}).log.level == "error"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[log]\nlevl = 'info'\n", ["unknown key [log] levl", "valid keys in [log]: file, level"]),
        ("[paths]\nstate_dir = 3\n", ["[paths] state_dir = 3: expected a string, not an integer"]),
        ("[slurm]\ncommand_timeout = 'fast'\n",
         ['[slurm] command_timeout = "fast": expected a number, not a string']),
        ("[slurm]\ncommand_timeout = true\n", ["expected a number, not a boolean"]),
        ("[slurm]\ncommand_timeout = 0\n", ["expected a number greater than 0"]),
        ("[hooks]\non_internal_error = 'panic'\n", ["expected one of 'run', 'drain'"]),
        ("[paths]\nscratch_root = 'relative/dir'\n", ["expected an absolute path"]),
        ("[gpus]\n", ["unknown section [gpus]", "valid sections: archive, checks, gpu, hooks"]),
        ("log = 3\n", ["log must be a table ([log]), not an integer"]),
        ("[log\nlevel=1\n", ["not valid TOML"]),
    ],
)
def test_bad_files_give_clear_errors(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    message = str(info.value)
    assert message.startswith(f"invalid configuration in {path}:")
    for part in expected:
        assert part in message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.toml", "[log]\nlevel = 'loud'\nfoo = 1\n[slurm]\nbackend = 2\n")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert len(info.value.problems) == 3


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(str(tmp_path / "nope.toml"))


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe[log]")
    with pytest.raises(ConfigError, match="not UTF-8"):
        config.load(str(path))


_safe_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@given(file=_safe_text, level=st.sampled_from(["debug", "info", "warning", "error"]),
       timeout=st.floats(min_value=0.001, max_value=1e6, allow_nan=False))
def test_to_toml_round_trips(file: str, level: str, timeout: float) -> None:
    cfg = config.Config(log=config.LogConfig(file=file, level=level),
                        slurm=config.SlurmConfig(command_timeout=timeout))
    again = config.parse(config.to_toml(cfg).encode(), "x.toml")
    assert again == cfg
    assert again.digest() == cfg.digest()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wrapper", *args], capture_output=True,
                          text=True, env=env, check=False)


def test_cli_bad_config_is_one_message_and_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.toml", "[log]\nlevel = 7\n")
    res = run_cli("--config", path, "config", "show")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"invalid configuration in {path}" in res.stderr
    assert "[log] level = 7: expected a string" in res.stderr


def test_cli_config_show_prints_the_effective_config(tmp_path: Path) -> None:
    path = write(tmp_path / "ok.toml", '[paths]\nstate_dir = "/srv/state"\n')
    res = run_cli("--config", path, "config", "show")
    assert res.returncode == 0, res.stderr
    assert 'state_dir = "/srv/state"' in res.stdout
    assert 'level = "info"' in res.stdout  # defaults are shown too
    assert config.parse(res.stdout.encode(), "shown").paths.state_dir == "/srv/state"
    res = run_cli("--config", path, "config", "show", "--json")
    assert '"state_dir": "/srv/state"' in res.stdout


def test_node_local_paths_take_the_nodes_own_name(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[paths]\nstate_dir = "/srv/{node}/state"\n'
                 'scratch_root = "/srv/{node}/scratch"\narchive_root = "/shared/{node}"\n'
                 '[log]\nfile = "/var/log/{node}.log"\n')
    cfg = config.load(path, env={"SLURMD_NODENAME": "gpu-a01"})
    assert (cfg.paths.state_dir, cfg.paths.scratch_root, cfg.log.file) == \
        ("/srv/gpu-a01/state", "/srv/gpu-a01/scratch", "/var/log/gpu-a01.log")
    assert cfg.paths.archive_root == "/shared/{node}"  # the shared place is not per node
    assert config.load(path, env={"SLURMD_NODENAME": "x"}, node="n7").paths.state_dir == \
        "/srv/n7/state"  # --node wins over the environment


@pytest.mark.parametrize("node", ["../n2", "n1/../../etc", ".hidden", "a b", "x" * 65])
def test_a_node_name_that_cannot_be_a_folder_is_refused(tmp_path: Path, node: str) -> None:
    path = write(tmp_path / "c.toml", '[paths]\nstate_dir = "/srv/{node}/state"\n')
    with pytest.raises(ConfigError) as caught:
        config.load(path, env={"SLURMD_NODENAME": node})
    assert "[paths] state_dir has {node}" in str(caught.value), caught.value
    # a file without {node} needs no name
    plain = write(tmp_path / "p.toml", '[paths]\nstate_dir = "/srv/state"\n')
    assert config.load(plain, env={"SLURMD_NODENAME": node}).paths.state_dir == "/srv/state"
