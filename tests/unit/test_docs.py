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


def test_the_readme_names_every_file_of_docs_and_tools() -> None:
    root = Path(__file__).resolve().parents[2]
    rows = {line.split("|")[1].strip(): line for line in README.splitlines()
            if line.startswith("| `docs/` |") or line.startswith("| `tools/` |")}
    for folder in ("docs", "tools"):
        row = rows[f"`{folder}/`"]
        missing = [p.name for p in sorted((root / folder).iterdir())
                   if p.is_file() and f"`{p.name}`" not in row]
        assert missing == [], f"README's {folder}/ row lacks {missing}"


def test_jobwrap_run_help_lists_every_option_it_takes() -> None:
    from click.testing import CliRunner

    from wrapper.cli import cli
    from wrapper.submit.directives import OPTIONS

    text = CliRunner().invoke(cli, ["run", "--help"]).output
    assert [o.name for o in OPTIONS if o.name not in text] == [], text
