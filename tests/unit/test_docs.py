"""The README documents every config key with its real default."""

from __future__ import annotations

from pathlib import Path

from wrapper import config

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_config_key_and_default_is_in_the_readme() -> None:
    rows = config.documented_defaults()
    assert {section for section, *_ in rows} == set(config.SECTIONS) and len(rows) > 100
    for section, key, default, _doc in rows:
        row = f"| `[{section}] {key}` | `{config._toml_value(default)}` |"
        assert row in README, f"README lacks (or has a stale default for) [{section}] {key}"


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "\nbash tools/test\n" in README
    assert "\nbash tools/test\n" in ci
