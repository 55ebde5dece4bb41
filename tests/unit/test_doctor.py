"""``jobwrap doctor`` on installs written into a temporary folder: a good one passes, and
each fault fails (or warns) naming its fix."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from wrapper.cli import cli
from wrapper.config import Config, HooksConfig
from wrapper.doctor import (
    Finding,
    check_folder,
    check_prolog_every_attempt,
    check_requeue_mechanism,
    diagnose,
    parse_slurm_conf,
    render_table,
)
from wrapper.submit.lua import SiteDefaults, render

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
JOBWRAP_BIN = Path(sys.executable).parent / "jobwrap"


def _chmod(path: Path, mode: int) -> None:
    """The modes a node must not have are what these tests make on purpose."""
    os.chmod(path, mode)


@dataclass
class Node:
    """A node's install: slurm.conf (+ hooks.conf), the hooks, jobwrap.toml, folders."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def hooks_conf(self) -> Path:
        return self.etc / "hooks.conf"

    @property
    def install(self) -> Path:
        return self.root / "opt" / "jobwrap"

    @property
    def config(self) -> Path:
        return self.etc / "jobwrap.toml"

    def folder(self, name: str) -> Path:
        return self.root / "var" / name

    @property
    def log_folder(self) -> Path:
        return self.folder("log") / "jobwrap"

    def edit(self, path: Path, fn: Callable[[str], str]) -> None:
        path.write_text(fn(path.read_text()))

    def diagnose(self, owner_uid: int | None = None) -> dict[str, Finding]:
        findings, _ = diagnose(config_path=str(self.config), slurm_conf=str(self.conf),
                               node="n1", env={"PATH": os.environ.get("PATH", "")},
                               owner_uid=os.getuid() if owner_uid is None else owner_uid)
        by_name = {f.check: f for f in findings}
        assert len(by_name) == len(findings)  # every check has its own name
        return by_name


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path / "node")
    n.etc.mkdir(parents=True)
    for name in ("slurm.conf", "hooks.conf"):
        text = (FIXTURES / "doctor" / name).read_text()
        (n.etc / name).write_text(text.replace("{install}", str(n.install)))
    (n.etc / "job_submit.lua").write_text(render(SiteDefaults()))
    # The hooks exactly as shipped, and their settings file as the install guide writes it.
    for hooks in ("prolog", "epilog"):
        shutil.copytree(REPO / hooks, n.install / hooks)
    for path in n.install.rglob("*"):
        _chmod(path, 0o755)
    (n.install / "jobwrap.env").write_text(f"JOBWRAP_BIN={JOBWRAP_BIN}\n"
                                           f"JOBWRAP_CONFIG={n.config}\n")
    for name in ("state", "scratch", "cache", "archive", "log"):
        n.folder(name).mkdir(parents=True, mode=0o755)
        _chmod(n.folder(name), 0o755)
    n.log_folder.mkdir(mode=0o750)
    n.config.write_text(f"""[paths]
state_dir = "{n.folder('state')}"
scratch_root = "{n.folder('scratch')}"
cache_root = "{n.folder('cache')}"
archive_root = "{n.folder('archive')}"

[log]
file = "{n.log_folder / 'jobwrap.log'}"

[gpu]
backend = "fake"
fake_inventory = "{FIXTURES / 'gpu' / 'healthy-4.toml'}"

[hooks]
prolog_budget = 60
epilog_budget = 120

[pulse]
address = "127.0.0.1"
""")
    return n


def _failed(findings: dict[str, Finding]) -> dict[str, Finding]:
    return {k: f for k, f in findings.items() if f.status == "fail"}


def test_a_good_install_passes(node: Node) -> None:
    assert JOBWRAP_BIN.exists(), "the test venv has no jobwrap program"
    findings = node.diagnose()
    assert _failed(findings) == {}
    # Only this Slurm's own flaw may warn (22.05 skips the Prolog of a quick requeue), and
    # the archive on this test machine's own disk (right only where every node is one host)
    assert {name for name, f in findings.items() if f.status != "pass"} <= {
        "slurm.prolog_every_attempt", "folder.placement"}
    assert findings["slurm.prolog"].detail == (f"Prolog={node.install}/prolog/prolog runs "
                                               "`jobwrap prolog`")
    assert findings["slurm.taskprolog"].status == "pass"
    assert findings["gpu.probe"].detail.startswith("fake: 4 GPU(s), driver 550.54.15")
    assert "jobwrap 0.1.0" in findings["versions"].detail
    assert findings["hooks.program"].detail.startswith(f"the hooks run {JOBWRAP_BIN}")
    assert findings["log.folder"].detail == (
        f"{node.log_folder} (mode 0750, uid {os.getuid()}); {node.log_folder}/jobwrap.log "
        "is made by the first hook")


def test_cli_exit_status_table_and_json(node: Node) -> None:
    args = ["--config", str(node.config), "doctor", "--slurm-conf", str(node.conf),
            "--node", "n1"]
    good = CliRunner().invoke(cli, args)
    assert good.exit_code == 0, good.output
    assert good.output.startswith("jobwrap doctor: ")
    assert " 0 failed" in good.output.splitlines()[0]
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert doc["ok"] is True
    assert doc["slurm_conf"] == str(node.conf)
    assert doc["config"] == str(node.config)
    assert set(doc["versions"]) == {"jobwrap", "slurm", "python"}
    assert {c["check"] for c in doc["checks"]} >= {"slurm.prolog", "config", "gpu.probe"}

    node.edit(node.hooks_conf, lambda t: t.replace("Prolog=", "#Prolog=", 1))
    bad = CliRunner().invoke(cli, args)
    assert bad.exit_code == 1
    assert "FAIL  slurm.prolog" in bad.output
    assert "fix: set Prolog=" in bad.output
    assert json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)["ok"] is False


def test_missing_prolog_line(node: Node) -> None:
    node.edit(node.hooks_conf, lambda t: "\n".join(
        line for line in t.splitlines() if not line.startswith("Prolog=")))
    finding = _failed(node.diagnose())["slurm.prolog"]
    assert finding.detail == f"no Prolog= line in {node.conf}"
    # The fix points at the hook beside the ones found.
    assert finding.fix.startswith(f"set Prolog={node.install}/prolog/prolog in {node.conf}")


def test_a_prolog_that_is_not_jobwraps(node: Node) -> None:
    other = node.root / "site-prolog"
    other.write_text("#!/bin/sh\n/usr/local/sbin/site-health-check\n")
    _chmod(other, 0o755)
    node.edit(node.hooks_conf, lambda t: t.replace(f"{node.install}/prolog/prolog",
                                                   f"{other},/nonexistent/*"))
    finding = _failed(node.diagnose())["slurm.prolog"]
    assert "does not run `jobwrap prolog`" in finding.detail
    assert f"in {node.hooks_conf}" in finding.detail  # where the line is


def test_one_of_several_prologs_may_be_jobwraps(node: Node) -> None:
    other = node.root / "site-prolog"
    other.write_text("#!/bin/sh\ntrue\n")
    node.edit(node.hooks_conf, lambda t: t.replace("Prolog=", f"Prolog={other},", 1))
    assert node.diagnose()["slurm.prolog"].status == "pass"


def test_task_prolog_is_not_mistaken_for_the_prolog(node: Node) -> None:
    node.edit(node.hooks_conf, lambda t: t.replace(f"{node.install}/prolog/prolog",
                                                   f"{node.install}/prolog/task-prolog", 1))
    assert "slurm.prolog" in _failed(node.diagnose())


@pytest.mark.parametrize(("mode", "phrase", "fix"), [
    (0o644, "is not executable", "chmod 0755"),
    (0o777, "is writable by others", "chmod go-w"),
])
def test_unsafe_hook_files(node: Node, mode: int, phrase: str, fix: str) -> None:
    os.chmod(node.install / "epilog" / "epilog", mode)
    finding = _failed(node.diagnose())["slurm.epilog"]
    assert phrase in finding.detail
    assert finding.fix.startswith(fix)


def test_a_hook_owned_by_someone_else(node: Node) -> None:
    findings = node.diagnose(owner_uid=os.getuid() + 1)
    assert "that user can run anything as root" in findings["slurm.prolog"].detail
    assert findings["slurm.prolog"].fix.startswith("chown root:root ")


def test_hooks_that_find_no_jobwrap(node: Node) -> None:
    (node.install / "jobwrap.env").write_text(f"JOBWRAP_BIN={node.root}/nothing\n")
    finding = _failed(node.diagnose())["hooks.program"]
    assert "let every job run unchecked" in finding.detail
    assert "JOBWRAP_BIN=" in finding.fix


def test_hooks_reading_another_config_warn(node: Node) -> None:
    (node.install / "jobwrap.env").write_text(f"JOBWRAP_BIN={JOBWRAP_BIN}\n"
                                              "JOBWRAP_CONFIG=/etc/jobwrap/other.toml\n")
    finding = node.diagnose()["hooks.program"]
    assert finding.status == "warn"
    assert finding.fix == "run jobwrap --config /etc/jobwrap/other.toml doctor"


def test_missing_nohold_on_prolog_fail(node: Node) -> None:
    node.edit(node.conf, lambda t: t.replace("nohold_on_prolog_fail", "max_rpc_cnt=8"))
    finding = _failed(node.diagnose())["slurm.nohold_on_prolog_fail"]
    assert "requeued held" in finding.detail
    assert finding.fix == f"add nohold_on_prolog_fail to SchedulerParameters in {node.conf}"


@pytest.mark.parametrize(("flags", "status"), [
    ("PrologFlags=Alloc,X11", "pass"), ("prologflags=contain", "pass"),
    ("PrologFlags=X11", "fail"), ("", "fail"),
])
def test_prolog_flags(node: Node, flags: str, status: str) -> None:
    node.edit(node.conf, lambda t: t.replace("PrologFlags=Alloc,X11", flags))
    finding = node.diagnose()["slurm.prolog_flags"]
    assert finding.status == status
    if status == "fail":
        assert "PrologFlags=Alloc" in finding.fix


@pytest.mark.parametrize(("line", "status"), [
    ("PrologEpilogTimeout=180", "pass"), ("", "pass"), ("PrologEpilogTimeout=120", "warn"),
    ("PrologEpilogTimeout=90", "fail"), ("PrologEpilogTimeout=2min", "fail"),
])
def test_prolog_epilog_timeout_covers_the_budgets(node: Node, line: str, status: str) -> None:
    node.edit(node.conf, lambda t: t.replace("PrologEpilogTimeout=180", line))
    finding = node.diagnose()["slurm.prolog_epilog_timeout"]
    assert finding.status == status, finding
    if status == "fail" and "90" in line:
        assert "shorter than jobwrap's hook budget (120 s)" in finding.detail
        assert "PrologEpilogTimeout=142 or more" in finding.fix


@pytest.mark.parametrize(("line", "lua", "status"), [
    ("JobRequeue=1", True, "pass"), ("", True, "pass"), ("JobRequeue=0", True, "pass"),
    ("JobRequeue=0", False, "fail"),
])
def test_job_requeue(node: Node, line: str, lua: bool, status: str) -> None:
    node.edit(node.conf, lambda t: t.replace("JobRequeue=1", line))
    if not lua:
        (node.etc / "job_submit.lua").unlink()
    assert node.diagnose()["slurm.job_requeue"].status == status


def test_job_submit_plugin_warnings(node: Node) -> None:
    (node.etc / "job_submit.lua").write_text("-- someone else's plugin\n")
    finding = node.diagnose()["slurm.job_submit_lua"]
    assert (finding.status, finding.detail) == ("warn", f"{node.etc}/job_submit.lua is not "
                                                        "jobwrap's")
    (node.etc / "job_submit.lua").unlink()
    assert "does not exist" in node.diagnose()["slurm.job_submit_lua"].detail
    node.edit(node.conf, lambda t: t.replace("JobSubmitPlugins=lua", ""))
    finding = node.diagnose()["slurm.job_submit_lua"]
    assert finding.status == "warn"
    assert f"jobwrap install-lua {node.etc}" in finding.fix
    assert _failed(node.diagnose()) == {}  # warnings only: the doctor still passes


def test_invalid_config(node: Node) -> None:
    node.config.write_text('[paths]\nstate_dir = "relative"\n[bogus]\n')
    findings = node.diagnose()
    finding = _failed(findings)["config"]
    assert f"invalid configuration in {node.config}" in finding.detail
    assert "[paths] state_dir" in finding.detail and "unknown section [bogus]" in finding.detail
    assert "jobwrap config defaults" in finding.fix
    # The rest of the checks still ran.
    assert findings["slurm.prolog"].status == "pass"


def test_a_missing_config_named_on_the_command_line(node: Node) -> None:
    node.config.unlink()
    assert "the file does not exist" in _failed(node.diagnose())["config"].detail


@pytest.mark.parametrize(("setup", "phrase", "fix"), [
    ("missing", "does not exist", "mkdir -p "),
    ("world-writable", "is world-writable (mode 0777)", "chmod o-w "),
    ("unwritable", "is not writable (mode 0555)", "chmod u+w "),
    ("symlink", "is a symlink", "rm "),
    ("file", "is not a directory", "rm "),
])
def test_unsafe_state_folder(node: Node, setup: str, phrase: str, fix: str) -> None:
    state = node.folder("state")
    if setup == "missing":
        state.rmdir()
    elif setup == "world-writable":
        _chmod(state, 0o777)
    elif setup == "unwritable":
        _chmod(state, 0o555)
    else:
        state.rmdir()
        if setup == "symlink":
            state.symlink_to(node.folder("scratch"))
        else:
            state.write_text("")
    finding = _failed(node.diagnose())["folder.state_dir"]
    assert phrase in finding.detail
    assert finding.fix.startswith(fix)
    assert str(state) in finding.fix


def test_a_folder_owned_by_someone_else(node: Node) -> None:
    finding = check_folder("folder.state_dir", node.folder("state"), os.getuid() + 1)
    assert finding.status == "fail"
    assert finding.fix == f"chown root:root {node.folder('state')}"


def test_a_folder_in_a_world_writable_parent(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    _chmod(parent, 0o777)
    (parent / "state").mkdir(mode=0o755)
    finding = check_folder("folder.state_dir", parent / "state", os.getuid())
    assert finding.status == "fail"
    assert finding.fix == f"chmod o-w {parent}"
    _chmod(parent, 0o1777)  # sticky, like /tmp: others cannot rename what is ours
    assert check_folder("folder.state_dir", parent / "state", os.getuid()).status == "pass"


@pytest.mark.parametrize(("setup", "status", "phrase", "fix"), [
    ("missing", "warn", "does not exist yet: the first hook that runs as root makes it "
                        "(mode 0750)", "mkdir -p {folder} && chown root:root {folder} && "
                                       "chmod 0750 {folder}"),
    ("missing-in-an-open-folder", "fail", "does not exist, and the hooks cannot make it: "
                                          "{parent} is world-writable",
     "mkdir -p {folder} && chown root:root {folder} && chmod 0750 {folder}"),
    ("symlink", "fail", "{folder} is a symlink: root's hooks log to syslog instead", "rm "),
    ("file", "fail", "{folder} is not a directory", "rm "),
    ("world-writable", "fail", "{folder} is world-writable (mode 0777)", "chmod o-w "),
    ("someone-elses", "fail", "is owned by uid {uid}, not {other}", "chown root:root "),
    ("log-symlink", "fail", "jobwrap.log is a symlink: root's hooks log to syslog instead",
     "rm {folder}/jobwrap.log"),
    ("log-world-writable", "fail", "jobwrap.log is world-writable (mode 0666)",
     "chmod o-w {folder}/jobwrap.log"),
    ("no-log-file", "warn", "[log] file is empty: root's hooks log only to their stderr, "
                            "which slurmd does not keep", "set [log] file = "),
])
def test_the_log_folder(node: Node, setup: str, status: str, phrase: str, fix: str) -> None:
    folder, parent, owner = node.log_folder, node.folder("log"), os.getuid()
    log_file = folder / "jobwrap.log"
    if setup.startswith("missing"):
        folder.rmdir()
        if setup == "missing-in-an-open-folder":
            _chmod(parent, 0o777)
    elif setup in ("symlink", "file"):
        folder.rmdir()
        if setup == "symlink":
            folder.symlink_to(node.folder("archive"))
        else:
            folder.write_text("")
    elif setup == "world-writable":
        _chmod(folder, 0o777)
    elif setup == "someone-elses":
        owner += 1
    elif setup == "log-symlink":
        log_file.symlink_to(node.folder("archive") / "x")
    elif setup == "log-world-writable":
        log_file.write_text("")
        _chmod(log_file, 0o666)
    elif setup == "no-log-file":
        node.edit(node.config, lambda text: text.replace(f'file = "{log_file}"', 'file = ""'))
    finding = node.diagnose(owner)["log.folder"]
    values = {"folder": folder, "parent": parent, "uid": os.getuid(), "other": owner}
    assert finding.status == status, finding
    assert phrase.format(**values) in finding.detail, finding
    assert finding.fix.startswith(fix.format(**values)), finding
    if setup == "missing":
        assert not _failed(node.diagnose())  # a node no job has run on yet is fine


def test_the_log_folder_the_hooks_make_passes(node: Node) -> None:
    from wrapper import log

    node.log_folder.rmdir()
    log.configure(file=str(node.log_folder / "jobwrap.log"), stderr_format="json",
                  stderr=io.StringIO())
    log.get().info("hello")
    finding = node.diagnose()["log.folder"]
    assert finding.status == "pass", finding
    assert finding.detail.startswith(f"{node.log_folder}/jobwrap.log in {node.log_folder} "
                                     "(mode 0750")


def test_gpu_probe_failures(node: Node) -> None:
    node.edit(node.config, lambda t: t.replace("healthy-4.toml", "no-such.toml"))
    finding = _failed(node.diagnose())["gpu.probe"]
    assert finding.detail.startswith("fake: ") and "does not exist" in finding.detail
    assert "fake_inventory" in finding.fix
    node.edit(node.config, lambda t: t.replace('backend = "fake"', 'backend = "nvml"'))
    nvml = node.diagnose()["gpu.probe"]
    # This machine has no NVIDIA driver: the probe's own error, and the way out.
    assert nvml.status == "fail" and nvml.detail.startswith("nvml: ")
    assert 'backend = "fake"' in nvml.fix


def test_slurm_commands_that_are_missing(node: Node) -> None:
    with node.config.open("a") as handle:
        handle.write(f'\n[slurm]\nsqueue_command = "{node.root}/no-squeue"\n')
    findings = node.diagnose()
    assert findings["slurm.scontrol"].status == "pass"
    finding = _failed(findings)["slurm.squeue"]
    assert "was not found" in finding.detail
    assert finding.fix == "install Slurm's client commands, or set [slurm] squeue_command"


def test_slurm_commands_that_fail_or_hang(node: Node) -> None:
    failing, hanging = node.root / "sinfo", node.root / "scancel"
    failing.write_text("#!/bin/sh\necho 'sinfo: error: cannot read the config' >&2\nexit 1\n")
    hanging.write_text("#!/bin/sh\nexec sleep 30\n")
    for program in (failing, hanging):
        _chmod(program, 0o755)
    with node.config.open("a") as handle:
        handle.write(f'\n[slurm]\nsinfo_command = "{failing}"\nscancel_command = "{hanging}"\n'
                     "command_timeout = 0.5\n")
    failed = _failed(node.diagnose())
    assert "sinfo: error: cannot read the config" in failed["slurm.sinfo"].detail
    assert failed["slurm.sinfo"].fix == f"check that Slurm reads {node.conf}"
    assert "timed out after 0.5 s" in failed["slurm.scancel"].detail
    assert "SlurmctldHost" in failed["slurm.scancel"].fix


def test_an_unreadable_slurm_conf(node: Node) -> None:
    node.conf.unlink()
    finding = _failed(node.diagnose())["slurm.conf"]
    assert finding.detail.startswith(f"cannot read {node.conf}")
    assert "--slurm-conf" in finding.fix


def test_slurm_conf_from_the_environment(node: Node) -> None:
    findings, _ = diagnose(config_path=str(node.config), node="n1",
                           env={"SLURM_CONF": str(node.conf), "PATH": os.environ["PATH"]},
                           owner_uid=os.getuid())
    assert findings[1] == Finding("slurm.conf", "pass", f"{node.conf} (2 files)")


def test_parse_slurm_conf(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "a.conf").write_text("JobRequeue=0\nInclude loop.conf\n")
    (tmp_path / "conf.d" / "b.conf").write_text("MinJobAge=1  # the later file wins\n")
    (tmp_path / "loop.conf").write_text("Include conf.d/a.conf\nKillWait=5\n")
    (tmp_path / "slurm.conf").write_text(
        "JobRequeue=1\nMinJobAge=300\nINCLUDE conf.d/*.conf\n"
        "SchedulerParameters=a,\\\nb   # continued\n"
        "PrologEpilogTimeout=9 # comment\n  epilog=/x/y\nNodeName=n1 Epilog=/wrong\n"
        "PartitionName=p DefMemPerCPU=100\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    assert conf.get("jobrequeue") == "0"  # from the include, read after line 1
    assert conf.get("MinJobAge") == "1"
    assert conf.get("KillWait") == "5"  # the loop is followed a bounded number of times
    assert conf.items("SchedulerParameters") == ["a", "b"]
    assert conf.get("PrologEpilogTimeout") == "9"
    assert conf.get("Epilog") == "/x/y"
    assert conf.values["epilog"][2] == 7
    assert conf.get("DefMemPerCPU") is None  # a partition's, not the cluster's
    assert conf.missing == []


def test_an_include_that_matches_nothing(node: Node) -> None:
    with node.conf.open("a") as handle:
        handle.write("Include site.d/*.conf\n")
    failed = _failed(node.diagnose())
    finding = failed["slurm.conf"]
    assert finding.detail.startswith(f"{node.conf}:18: Include site.d/*.conf: no such file")
    assert "slurm.commands" in failed  # not run: they would retry the include for minutes


def test_render_table_lists_each_fix_under_its_check() -> None:
    text = render_table([Finding("config", "pass", "ok", "never shown"),
                         Finding("slurm.prolog", "fail", "two\nlines", "do this"),
                         Finding("x", "warn", "hmm", "maybe")])
    assert text.splitlines() == [
        "jobwrap doctor: 1 passed, 1 warning, 1 failed",
        "PASS  config        ok",
        "FAIL  slurm.prolog  two",
        "                    lines",
        "                    fix: do this",
        "WARN  x             hmm",
        "                    fix: maybe",
    ]


def test_archive_access_user_is_the_default_and_is_tried_on_the_archive(node: Node) -> None:
    found = node.diagnose()["archive.access"]
    assert found.status == "pass" and "POSIX ACL" in found.detail, found
    assert not [p for p in node.folder("archive").iterdir()], "the probe file was left"


def test_archive_access_group_always_warns(node: Node) -> None:
    node.edit(node.config, lambda text: text + '\n[archive]\naccess = "group"\n')
    found = node.diagnose()["archive.access"]
    assert found.status == "warn" and "primary group" in found.detail, found
    assert 'access = "user"' in found.fix


def test_shared_primary_groups_are_named() -> None:
    import grp
    import pwd

    from wrapper.archive.access import shared_groups

    def user(name: str, uid: int, gid: int) -> pwd.struct_passwd:
        return pwd.struct_passwd((name, "x", uid, gid, "", "/", "/bin/sh"))

    users = [user("ann", 1000, 100), user("bob", 1001, 100), user("cy", 1002, 1002),
             user("dee", 1003, 1003), user("daemon", 1, 100), user("nobody", 65534, 100)]
    groups = [grp.struct_group(("users", "x", 100, [])),
              grp.struct_group(("cy", "x", 1002, [])),
              grp.struct_group(("dee", "x", 1003, ["cy"]))]
    assert shared_groups(users, groups) == {"users": ["ann", "bob"], "dee": ["cy", "dee"]}
    assert shared_groups(users[2:3], groups) == {}


def test_doctor_says_whether_this_slurm_runs_the_prolog_every_attempt() -> None:
    old = check_prolog_every_attempt("22.05.8", Config())
    assert old.status == "warn" and "bug 15656" in old.detail
    assert "the task-prolog ends such an attempt" in old.detail
    assert "upgrade Slurm to 23.02" in old.fix
    run = check_prolog_every_attempt("22.05.8", Config(hooks=HooksConfig(
        unchecked_attempt="run")))
    assert "runs unchecked" in run.detail
    for fixed in ("23.02.0", "23.11.11", "25.11.7"):
        assert check_prolog_every_attempt(fixed, Config()).status == "pass"
    assert check_prolog_every_attempt("slurm-git", Config()).status == "warn"


def test_doctor_says_what_makes_a_requeued_job_eligible(tmp_path: Path) -> None:
    conf_path = tmp_path / "slurm.conf"
    conf_path.write_text("ClusterName=c\n")
    bare = check_requeue_mechanism(parse_slurm_conf(conf_path), "22.05.8", Config())
    assert bare.status == "pass" and bare.detail.startswith("jobwrap's release")
    assert "121 s" in bare.detail and "requeue_delay=0" not in bare.detail
    assert "can do it itself: SchedulerParameters=requeue_delay=0" in \
        check_requeue_mechanism(parse_slurm_conf(conf_path), "25.11.7", Config()).detail
    conf_path.write_text("SchedulerParameters=bf_continue,requeue_delay=0\n")
    own = check_requeue_mechanism(parse_slurm_conf(conf_path), "25.11.7", Config())
    assert own.detail.startswith("Slurm's own: SchedulerParameters=requeue_delay=0")
    conf_path.write_text("SchedulerParameters=requeue_delay=300\n")
    slow = check_requeue_mechanism(parse_slurm_conf(conf_path), "25.11.7", Config())
    assert "holds a requeued job for requeue_delay=300 s" in slow.detail


MOUNTS = """/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
nfs1:/export/jobwrap /shared/jobwrap nfs4 rw 0 0
lfs@o2ib:/scratch /lustre lustre rw 0 0
/dev/sdb1 /shared/jobwrap/local ext4 rw 0 0
s3fs /mnt/my\\040bucket fuse.s3fs rw 0 0
"""


@pytest.mark.parametrize(("state", "archive", "status", "said"), [
    ("/var/lib/jobwrap", "/shared/jobwrap/archive", "pass", "archive_root on shared nfs4"),
    ("/var/lib/jobwrap", "/lustre/jobwrap", "pass", "shared lustre"),
    ("/var/lib/jobwrap", "/mnt/my bucket/archive", "pass", "shared fuse.s3fs"),
    ("/var/lib/jobwrap", "/var/lib/jobwrap/archive", "warn", "this node's own file system"),
    ("/var/lib/jobwrap", "/shared/jobwrap/local/a", "warn", "(ext4)"),  # a local disk inside
    ("/shared/jobwrap/state", "/shared/jobwrap/archive", "fail", "is on shared storage"),
])
def test_node_state_is_the_nodes_own_and_the_archive_is_shared(
        state: str, archive: str, status: str, said: str) -> None:
    """Each node keeps its state to itself; the archive is where a requeued job's next
    nodes and the login nodes read root's record of it."""
    from wrapper.config import PathsConfig
    from wrapper.doctor import check_placement

    cfg = Config(paths=PathsConfig(state_dir=state, archive_root=archive))
    found = check_placement(cfg, MOUNTS)
    assert (found.status, found.check) == (status, "folder.placement"), found
    assert said in found.detail, found
    assert found.fix or status == "pass"



def test_the_pulse_check_asks_munged_and_the_hubs_address() -> None:
    """munged runs wherever Slurm does (this test machine's too): a credential made and
    read back; an address that does not resolve, a pulse without watchers, and the
    pulse off each say so."""
    from wrapper.config import Config, PulseConfig, SupervisorConfig
    from wrapper.doctor import check_pulse

    good = check_pulse(Config(pulse=PulseConfig(address="127.0.0.1")), "n1")
    assert good.status == "pass" and f"uid {os.geteuid()}" in good.detail, good
    assert "ports 7400-7599" in good.detail
    bad = check_pulse(Config(pulse=PulseConfig(address="{node}.invalid")), "n1")
    assert bad.status == "fail" and "'n1.invalid'" in bad.detail and bad.fix, bad
    unwatched = check_pulse(Config(supervisor=SupervisorConfig(node_watch=False)), "n1")
    assert unwatched.status == "warn" and "node_watch" in unwatched.fix
    off = check_pulse(Config(pulse=PulseConfig(enabled=False)), "n1")
    assert off.status == "pass" and off.detail.startswith("off")
