from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.archive import jobwrap
from wrapper.archive.cli import parse_since
from wrapper.cli import cli
from wrapper.osl.child import call_as as as_user
from wrapper.osl.users import UserIds


def test_list_and_show(archived: str, user: UserIds) -> None:
    code, out = jobwrap(archived, "archive", "list", "--json")
    assert code == 0
    (info,) = json.loads(out)
    assert (info["job_id"], info["user"], info["complete"], info["attempts"]) == (
        "42", user.name, True, [0, 1])
    code, out = jobwrap(archived, "archive", "list")
    assert code == 0 and "42" in out and "complete" in out and "train" in out
    assert json.loads(jobwrap(archived, "archive", "list", "--user", "nobody", "--json")[1]) \
        == []
    assert json.loads(jobwrap(archived, "archive", "list", "--since", "1d", "--json")[1])
    code, out = jobwrap(archived, "archive", "show", "42", "--json")
    assert code == 0 and json.loads(out)["job"]["name"] == "train"
    code, out = jobwrap(archived, "archive", "show", "42")
    assert code == 0
    assert "archive complete" in out and "attempt 0" in out and "attempt 1" in out
    assert "attempt-0/n1/stdout.gz  archived" in out
    code, out = jobwrap(archived, "archive", "show", "77")
    assert code == 2 and "no archive of job 77" in out


def test_the_user_lists_and_reads_their_own_archive(archived: str, user: UserIds) -> None:
    def as_the_user() -> list[str]:
        listed = CliRunner().invoke(cli, ["--config", archived, "archive", "list", "--json"])
        shown = CliRunner().invoke(cli, ["--config", archived, "archive", "show", "42",
                                         "--json"])
        return [*(a["job_id"] for a in json.loads(listed.output)),
                json.loads(shown.output)["job"]["user"]]

    assert as_user(user, as_the_user) == ["42", user.name]

    def show_as_someone_else() -> list[object]:
        result = CliRunner().invoke(cli, ["--config", archived, "archive", "show", "42"])
        return [result.exit_code, result.output]

    code, out = as_user(UserIds.of(65534), show_as_someone_else)
    assert code == 2 and "no archive of job 42" in out


def test_extract_and_refuse_to_overwrite(archived: str, shared: Path) -> None:
    dest = shared / "restored"
    code, out = jobwrap(archived, "archive", "extract", "42", str(dest))
    assert code == 0 and "extracted" in out
    assert (dest / "attempt-1" / "n1" / "stdout").read_text() == "hello from the job\n"
    assert json.loads((dest / "manifest.json").read_text())["job"]["id"] == "42"
    code, out = jobwrap(archived, "archive", "extract", "42", str(dest))
    assert code == 2 and "never overwrites" in out


def test_prune_dry_run_then_for_real(archived: str, shared: Path, user: UserIds) -> None:
    manifest = shared / "archive" / user.name / "42" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["updated_at"] -= 86400  # a day old: past max_age_days = 0.5
    manifest.write_text(json.dumps(data))
    code, out = jobwrap(archived, "archive", "prune", "--dry-run", "--json")
    assert code == 0 and json.loads(out) == []  # the index does not know of the hand edit
    code, out = jobwrap(archived, "archive", "reindex")
    assert code == 0 and "archive index" in out and ": 1 jobs" in out
    code, out = jobwrap(archived, "archive", "prune", "--dry-run", "--json")
    assert code == 0 and [r["reason"] for r in json.loads(out)] == ["age"]
    assert manifest.exists()
    code, out = jobwrap(archived, "archive", "prune")
    assert code == 0 and "removed" in out
    assert not manifest.parent.exists()


def test_status_from_the_state_and_from_the_archive(archived: str, shared: Path) -> None:
    code, out = jobwrap(archived, "status", "42")
    assert code == 0
    assert out.index("attempt 0") < out.index("attempt 1")
    assert "hang" in out and "latest step 9" in out
    data = json.loads(jobwrap(archived, "status", "42", "--json")[1])
    assert data["source"] == "state" and [a["attempt"] for a in data["attempts"]] == [0, 1]
    assert "goodput  ETTR" in out
    ledger = data["goodput"]
    assert 0 <= ledger["ettr"] <= 1 and [a["number"] for a in ledger["attempts"]] == [0, 1]
    assert ledger["failures"] == 1 and ledger["attempts"][0]["kind"] == "hang"
    for name in os.listdir(shared / "state" / "jobs" / "42"):  # another node: no state here
        os.unlink(shared / "state" / "jobs" / "42" / name)
    data = json.loads(jobwrap(archived, "status", "42", "--json")[1])
    assert data["source"] == "archive" and data["attempts"][1]["decision"] == "done"
    code, out = jobwrap(archived, "status", "43")
    assert code == 2 and "no record of job 43" in out
    code, out = jobwrap(archived, "status", "../x")
    assert code == 2 and "not a job id" in out


def test_since_reads_dates_and_durations() -> None:
    assert parse_since("2h", 10000.0) == 10000.0 - 7200
    assert parse_since("2024-05-01", 0.0) > 1.7e9
    with pytest.raises(Exception, match="neither a date"):
        parse_since("yesterday-ish", 0.0)
