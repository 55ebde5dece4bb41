"""The shipped systemd units, tested as they ship (issue 37 item 3).

No systemd runs here (nor on CI), so each unit is checked three ways:

- ``systemd-analyze verify`` accepts it, as shipped, in a ``--root=`` that holds
  systemd's own units and a stub at each path its ``ExecStart=`` runs (verify checks that
  the program exists and is executable, nothing more of it);
- the supervisor unit's file-system restrictions (``ProtectSystem=``, ``ProtectHome=``,
  ``PrivateTmp=``, ``ReadWritePaths=``, ``ReadOnlyPaths=``) are rebuilt in a mount
  namespace of their own as systemd builds them, and there the supervisor's own code,
  dropped to the project's real test user as ``jobwrap supervise`` drops, must replace a
  stale save file with a fresh one in checkpoint folders under /home, /tmp, /var/tmp and a
  top-level folder (a /scratch or /lustre): seen from outside, where the job looks;
- the supervisor unit's process (``EnvironmentFile=``, ``Environment=``, ``ExecStart=``,
  as systemd builds it) and the Slurm hooks' (prolog/prolog with prolog/hook-env.sh) run
  the same program with the same settings, whichever of /opt/jobwrap/jobwrap.env and
  /etc/jobwrap/hooks.env exist.

The last two also run against the unit as it was before this fix (``OLD_SUPERVISOR``) and
must find its two faults there, so neither can pass for nothing.

Run as a program (``python -m tests.unit.test_systemd_units PLAN``), this module is the
part that runs inside the mount namespace.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "systemd"
SUPERVISOR = SYSTEMD / "jobwrap-supervisor@.service"
UNITS = {"jobwrap-supervisor@.service": "jobwrap-supervisor@4242.service",
         "jobwrap-login-guard.service": "jobwrap-login-guard.service",
         "jobwrap-indexer.service": "jobwrap-indexer.service"}
TIMERS = {"jobwrap-indexer.timer": "jobwrap-indexer.service"}  # each, the service it starts
SYSTEM_UNITS = Path("/usr/lib/systemd/system")
JOB_ID = "4242"

# The supervisor unit before issue 37 item 3, its directives that the two checks read,
# as they were shipped.
OLD_SUPERVISOR = """\
[Service]
Type=exec
EnvironmentFile=-/etc/jobwrap/hooks.env
ExecStart=/opt/jobwrap/venv/bin/jobwrap supervise %i
PrivateTmp=yes
ProtectSystem=strict
PrivateMounts=yes
ReadWritePaths=-/var/lib/jobwrap
ProtectHome=read-only
UMask=0077
"""

# What a fix by two EnvironmentFile= lines would be: the file the hooks prefer read last,
# so that it wins. Its fault: systemd merges the files key by key.
TWO_ENVIRONMENT_FILES = """\
[Service]
EnvironmentFile=-/etc/jobwrap/hooks.env
EnvironmentFile=-/opt/jobwrap/jobwrap.env
ExecStart=/bin/sh -c 'exec "$${JOBWRAP_BIN:-/opt/jobwrap/venv/bin/jobwrap}" supervise "$$1"' sh %i
"""


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: apt-get install -y systemd (tools/bootstrap)"
    return found


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test builds mount namespaces and acts as the real test user: run "
                    "it as root, as CI does")


def _service(text: str) -> dict[str, list[str]]:
    """The [Service] directives of a unit, each key's values in order; an empty value
    empties the list, as systemd does for list settings."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        assert not line.endswith("\\"), f"continued lines are not modelled here: {raw}"
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, eq, value = line.partition("=")
            assert eq, f"not a directive: {raw}"
            values = out.setdefault(key.strip(), [])
            if value.strip():
                values.append(value.strip())
            else:
                values.clear()
    return out


# -- (a) systemd-analyze verify, on each unit as shipped ------------------------------------
def _verify_root(tmp_path: Path) -> Path:
    """A file system root with systemd's own units, the shipped units, and an executable
    stub at every path an ExecStart= of theirs runs."""
    assert SYSTEM_UNITS.is_dir(), f"{SYSTEM_UNITS} is missing: apt-get install -y systemd"
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "etc/systemd/system").mkdir(parents=True)
    for name in TIMERS:
        shutil.copy(SYSTEMD / name, root / "etc/systemd/system" / name)
    for name in UNITS:
        unit = SYSTEMD / name
        shutil.copy(unit, root / "etc/systemd/system" / name)
        for command in _service(unit.read_text())["ExecStart"]:
            program = root / shlex.split(command)[0].lstrip("/")
            program.parent.mkdir(parents=True, exist_ok=True)
            program.write_text("#!/bin/sh\n")
            program.chmod(0o755)
    return root


def _verify(root: Path, instance: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_analyze(), "verify", "--man=no", f"--root={root}", instance],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("name", list(UNITS))
def test_verify_accepts_each_unit_as_shipped(tmp_path: Path, name: str) -> None:
    result = _verify(_verify_root(tmp_path), UNITS[name])
    # verify only warns (exit 0) about unknown keys and bad values: any output fails here
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("name", list(UNITS))
def test_verify_reports_what_is_wrong(tmp_path: Path, name: str) -> None:
    """The check can fail: a misspelt key, then a missing program, are reported."""
    root = _verify_root(tmp_path)
    unit = root / "etc/systemd/system" / name
    unit.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    assert "Unknown key 'NoNewPrivilege'" in _verify(root, UNITS[name]).stderr
    program = shlex.split(_service(unit.read_text())["ExecStart"][0])[0]
    (root / program.lstrip("/")).unlink()
    result = _verify(root, UNITS[name])
    assert result.returncode != 0 and f"Command {program} is not executable" in result.stderr


def test_every_shipped_unit_is_checked() -> None:
    assert {p.name for p in SYSTEMD.iterdir()} == set(UNITS) | set(TIMERS)


@pytest.mark.parametrize("name", list(TIMERS))
def test_verify_accepts_each_timer_and_it_starts_its_service(tmp_path: Path,
                                                              name: str) -> None:
    root = _verify_root(tmp_path)
    result = _verify(root, name)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    text = (SYSTEMD / name).read_text()
    assert f"Unit={TIMERS[name]}" in text and "OnUnitActiveSec=" in text
    timer = root / "etc/systemd/system" / name
    timer.write_text(text.replace("OnUnitActiveSec=", "OnUnitActivSec="))
    assert "Unknown key 'OnUnitActivSec'" in _verify(root, name).stderr


# -- (b) the save in the job's checkpoint folder, under the unit's restrictions -------------
TRUE = ("yes", "true", "on", "1")
FALSE = ("no", "false", "off", "0")
HOME = ("/home", "/root", "/run/user")
# The directives the reproduction rebuilds, and those that change neither where a job's
# checkpoint folder can be nor whether the job user may write there. A directive of the
# unit in neither set fails the test until the reproduction below knows it.
REPRODUCED = {"ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths",
              "ReadOnlyPaths", "UMask"}
NOT_ABOUT_PATHS = {
    "Type", "ExecStart", "EnvironmentFile", "Environment", "Restart", "RestartSec",
    "TimeoutStopSec", "CapabilityBoundingSet", "AmbientCapabilities", "NoNewPrivileges",
    "PrivateMounts", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectHostname", "ProtectProc", "RestrictNamespaces",
    "RestrictRealtime", "RestrictSUIDSGID", "LockPersonality", "RestrictAddressFamilies",
    "SystemCallArchitectures", "SystemCallFilter", "SystemCallErrorNumber"}


def _paths(values: list[str]) -> list[str]:
    """A path list setting's paths that exist ("-": one that does not is ignored)."""
    out = []
    for value in values:
        for word in value.split():
            optional = word.startswith("-")
            path = word.lstrip("-")
            assert path.startswith("/"), f"a path prefix not modelled here: {word}"
            if os.path.exists(path):
                out.append(path)
            else:
                assert optional, f"{path} is missing: systemd would not start the unit"
    return out


def _mount_plan(service: dict[str, list[str]]) -> dict[str, Any]:
    """The mounts systemd gives the unit's processes, as the namespace below rebuilds them:
    read-only trees, then read-write ones (the more specific wins), then fresh tmpfs
    mounts (a private /tmp and /var/tmp; ProtectHome=yes or tmpfs hide /home)."""
    unknown = set(service) - REPRODUCED - NOT_ABOUT_PATHS
    assert not unknown, f"not modelled by this test yet: {sorted(unknown)}"

    def one(key: str, default: str) -> str:
        return (service.get(key) or [default])[-1]

    read_only: list[str] = []
    hidden: list[str] = []
    system = one("ProtectSystem", "no")
    if system in TRUE:
        read_only += ["/usr", "/boot", "/efi"]
    elif system == "full":
        read_only += ["/usr", "/boot", "/efi", "/etc"]
    elif system == "strict":
        read_only.append("/")
    else:
        assert system in FALSE, f"ProtectSystem={system}"
    home = one("ProtectHome", "no")
    if home == "read-only":
        read_only += HOME
    elif home in TRUE or home == "tmpfs":
        hidden += HOME
    else:
        assert home in FALSE, f"ProtectHome={home}"
    read_only += _paths(service.get("ReadOnlyPaths", []))
    private_tmp = one("PrivateTmp", "no")
    assert private_tmp in TRUE + FALSE, f"PrivateTmp={private_tmp}"

    def depth(path: str) -> int:
        return len(Path(path).parts)

    return {"read_only": sorted((p for p in read_only if os.path.exists(p)), key=depth),
            "read_write": sorted(_paths(service.get("ReadWritePaths", [])), key=depth),
            "hidden": [p for p in hidden if os.path.exists(p)],
            "private_tmp": ["/tmp", "/var/tmp"] if private_tmp in TRUE else [],
            "umask": int(one("UMask", "0022"), 8)}


def _mounts() -> list[tuple[str, bool]]:
    """This namespace's mount points (unescaped), and whether each is read-only now."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        out.append((point, "ro" in fields[5].split(",")))
    return out


def _set_read_only(path: str, read_only: bool, *, recursive: bool = True) -> None:
    """Make the mount tree at ``path`` (made a mount point first) read-only, or writable,
    in this mount namespace only: mount_setattr(2) changes the mounts' own flag, never the
    file system's (no remount of a superblock, which would reach the host)."""
    import ctypes

    if path not in {point for point, _ro in _mounts()}:
        subprocess.run(["mount", "--rbind", path, path], check=True)
    libc = ctypes.CDLL(None, use_errno=True)
    sys_mount_setattr, at_fdcwd, at_recursive, mount_attr_rdonly = 442, -100, 0x8000, 0x1
    attr = (ctypes.c_uint64 * 4)(mount_attr_rdonly if read_only else 0,
                                 0 if read_only else mount_attr_rdonly, 0, 0)
    if libc.syscall(sys_mount_setattr, at_fdcwd, path.encode(), at_recursive * recursive,
                    ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
        raise OSError(ctypes.get_errno(), f"mount_setattr {path}")


def _in_unit_namespace(plan: dict[str, Any]) -> dict[str, str]:
    """Inside ``unshare --mount``, as root: build the unit's mounts, become the job user as
    ``jobwrap supervise`` does, and let the supervisor's own code remove the stale save file
    and ask for a save in each checkpoint folder. Each folder's outcome: the save file's
    path, or the supervisor's warning."""
    from types import SimpleNamespace

    # Imported as root, before the drop: the checkout may be root's alone (CI's is).
    import wrapper.restart.resume  # noqa: F401  (what the supervisor's methods import)
    from wrapper.osl.users import UserIds, drop_to
    from wrapper.supervisor.monitor import Supervisor

    api = [(p, ro) for p, ro in _mounts() if p.split("/")[1] in ("proc", "sys", "dev")]
    for path in plan["read_only"]:
        _set_read_only(path, True)
        if path == "/":  # strict leaves the API file systems as they were
            for point, ro in api:
                if not ro:
                    _set_read_only(point, False, recursive=False)
    for path in plan["read_write"]:
        _set_read_only(path, False)
    for path in plan["hidden"]:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,mode=0000", "tmpfs", path],
                       check=True)
    for path in plan["private_tmp"]:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", path], check=True)
    os.umask(plan["umask"])
    os.chdir("/")
    drop_to(UserIds.of(plan["uid"], plan["gid"]))
    outcome = {}
    for folder in plan["checkpoint_dirs"]:
        said: list[str] = []
        supervisor: Any = SimpleNamespace(
            record=SimpleNamespace(checkpoint_dir=folder), seen=SimpleNamespace(save_asked=0.0),
            logger=SimpleNamespace(warning=lambda event, said=said, **kw: said.append(
                f"{event} {kw}")))
        Supervisor.remove_save_file(supervisor)  # an earlier attempt's, at the start
        path = Supervisor._ask_for_a_save(supervisor, 1.0)  # at the time limit
        outcome[folder] = path or " ".join(said)
    return outcome


def _user() -> tuple[int, int]:
    from tests.support import USER

    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", USER], check=True)
        entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def checkpoint_dirs() -> Iterator[list[Path]]:
    """The job user's checkpoint folders under /home, /tmp, /var/tmp and / (a /scratch),
    each holding a stale save file of an earlier attempt; removed afterwards."""
    _require_root()
    uid, gid = _user()
    from wrapper.restart.resume import SAVE_FILE_NAME

    tops = [Path(tempfile.mkdtemp(prefix="jobwrap-test-unit-", dir=parent))
            for parent in ("/home", "/tmp", "/var/tmp", "/")]
    try:
        folders = []
        for top in tops:
            top.chmod(0o755)
            folder = top / "checkpoints"
            folder.mkdir()
            os.chown(folder, uid, gid)
            stale = folder / SAVE_FILE_NAME
            stale.write_text("stale\n")
            os.chown(stale, uid, gid)
            folders.append(folder)
        yield folders
    finally:
        for top in tops:
            shutil.rmtree(top)


def _save_under(unit_text: str, folders: list[Path]) -> dict[str, str]:
    plan = _mount_plan(_service(unit_text))
    uid, gid = _user()
    plan.update(uid=uid, gid=gid, checkpoint_dirs=[str(f) for f in folders])
    unshare = shutil.which("unshare")
    assert unshare, "unshare is missing: apt-get install -y util-linux"
    done = subprocess.run([unshare, "--mount", "--propagation", "private", sys.executable,
                           "-m", "tests.unit.test_systemd_units", json.dumps(plan)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    outcome: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return outcome


def _fresh_save_file(folder: Path) -> bool:
    """Whether the job sees a fresh save file there: the stale one removed, a new one made
    by the job user."""
    from wrapper.restart.resume import SAVE_FILE_NAME

    path = folder / SAVE_FILE_NAME
    return path.exists() and path.read_text() == "" and \
        path.stat().st_uid == folder.stat().st_uid != 0


def test_the_supervisor_saves_in_any_checkpoint_folder(checkpoint_dirs: list[Path]) -> None:
    outcome = _save_under(SUPERVISOR.read_text(), checkpoint_dirs)
    from wrapper.restart.resume import SAVE_FILE_NAME

    for folder in checkpoint_dirs:
        assert outcome[str(folder)] == str(folder / SAVE_FILE_NAME), outcome
        assert _fresh_save_file(folder), f"the job does not see a fresh save file in {folder}"


def test_the_old_unit_kept_the_save_from_every_checkpoint_folder(
        checkpoint_dirs: list[Path]) -> None:
    """The reproduction can fail: under the old unit's restrictions, each folder refuses
    (a read-only /home and /scratch) or is not the job's (a private /tmp and /var/tmp)."""
    outcome = _save_under(OLD_SUPERVISOR, checkpoint_dirs)
    home, tmp, var_tmp, scratch = (outcome[str(f)] for f in checkpoint_dirs)
    assert "supervisor.save_file_unwritable" in home and "Read-only file system" in home
    assert "Read-only file system" in scratch
    assert "No such file or directory" in tmp and "No such file or directory" in var_tmp
    for folder in checkpoint_dirs:
        assert not _fresh_save_file(folder), folder


def test_the_reproduction_rebuilds_the_old_restrictions() -> None:
    plan = _mount_plan(_service(OLD_SUPERVISOR))
    assert plan["read_only"][0] == "/" and "/home" in plan["read_only"]
    assert plan["private_tmp"] == ["/tmp", "/var/tmp"]
    new = _mount_plan(_service(SUPERVISOR.read_text()))
    assert (new["private_tmp"], new["hidden"], new["read_write"]) == ([], [], [])
    assert set(new["read_only"]) <= {"/usr", "/boot", "/efi", "/etc"}
    assert "/usr" in new["read_only"] and "/etc" in new["read_only"]
    with pytest.raises(AssertionError, match="InaccessiblePaths"):
        _mount_plan(_service("[Service]\nInaccessiblePaths=/home\n"))


# -- (c) the unit and the hooks: one program, one environment file --------------------------
INSTALL, ETC = "/opt/jobwrap", "/etc/jobwrap"
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SITUATIONS = {"install only": ("install",), "etc only": ("etc",),
              "both": ("install", "etc"), "neither": ()}


def _relocated(text: str, tmp: Path) -> str:
    """``text`` with the install folder and /etc/jobwrap moved under ``tmp``; every
    occurrence, so that nothing can reach the real ones."""
    out = text.replace(INSTALL, f"{tmp}{INSTALL}").replace(ETC, f"{tmp}{ETC}")
    assert out.count(str(tmp)) == text.count(INSTALL) + text.count(ETC)
    return out


def _env_file(path: Path) -> dict[str, str]:
    """systemd's reading of an environment file, for the plain KEY=VALUE lines used here."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, eq, value = line.partition("=")
        assert eq and "\\" not in value and "$" not in value, f"not modelled here: {raw}"
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _systemd_word(word: str, env: dict[str, str]) -> list[str]:
    """One ExecStart= word as systemd passes it: %i and %% resolved, then $$ as $, ${NAME}
    as NAME's value, and a word that is $NAME alone as the value's words."""
    def specifier(match: re.Match[str]) -> str:
        assert match.group(1) in "i%", f"specifier %{match.group(1)} not modelled here"
        return JOB_ID if match.group(1) == "i" else "%"

    word = re.sub(r"%(.)", specifier, word)
    whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
    if whole:
        return env.get(whole.group(1), "").split()
    out, i = "", 0
    while i < len(word):
        if word.startswith("$$", i):
            out, i = out + "$", i + 2
        elif word.startswith("${", i):
            end = word.index("}", i)
            out, i = out + env.get(word[i + 2:end], ""), end + 1
        else:
            assert word[i] != "$", f"a $ not modelled here: {word}"
            out, i = out + word[i], i + 1
    return [out]


def _unit_process(unit_text: str) -> tuple[list[str], dict[str, str]]:
    """The supervisor unit's command and environment, as systemd would start it."""
    service = _service(unit_text)
    env = {"PATH": SYSTEMD_PATH}
    for value in service.get("EnvironmentFile", []):
        path = Path(value.lstrip("-"))
        if value.startswith("-") and not os.access(path, os.R_OK):
            continue
        env.update(_env_file(path))  # a later file wins, key by key
    for value in service.get("Environment", []):
        for assignment in shlex.split(value):
            key, _, val = assignment.partition("=")
            env[key] = val
    (command,) = service["ExecStart"]
    assert command[0] not in "-@:+!" and "\\" not in command, f"not modelled: {command}"
    argv = [part for word in shlex.split(command) for part in _systemd_word(word, env)]
    return argv, env


def _what_runs(argv: list[str], env: dict[str, str], record: Path) -> str:
    record.unlink(missing_ok=True)
    done = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=30,
                          check=False)
    assert record.exists(), f"{argv} ran no jobwrap: {done.stdout}{done.stderr}"
    return record.read_text()


def _install(tmp: Path, unit_text: str) -> tuple[Path, str]:
    """The hooks under tmp/opt/jobwrap (prolog/ as shipped but for /etc/jobwrap), stub
    jobwrap programs that write down which one ran with what, and the unit to match."""
    record = tmp / "ran"
    stub = ("#!/bin/sh\n{ echo \"program $0 $*\"; env | grep '^JOBWRAP_' | LC_ALL=C sort; } "
            f"> {record}\n")
    install = Path(f"{tmp}{INSTALL}")
    shutil.copytree(REPO / "prolog", install / "prolog")
    hook_env = install / "prolog" / "hook-env.sh"
    hook_env.write_text(_relocated(hook_env.read_text(), tmp))
    for program in (install / "venv/bin/jobwrap", tmp / "bin/jobwrap-install",
                    tmp / "bin/jobwrap-etc"):
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text(stub)
        program.chmod(0o755)
    Path(f"{tmp}{ETC}").mkdir(parents=True)
    return record, _relocated(unit_text, tmp)


def _situation(tmp: Path, files: tuple[str, ...]) -> None:
    """Each environment file names its own program and config, and one key of its own."""
    install, etc = Path(f"{tmp}{INSTALL}/jobwrap.env"), Path(f"{tmp}{ETC}/hooks.env")
    for which, path in (("install", install), ("etc", etc)):
        path.unlink(missing_ok=True)
        if which in files:
            path.write_text(f"# {which}\nJOBWRAP_BIN={tmp}/bin/jobwrap-{which}\n"
                            f"JOBWRAP_CONFIG={tmp}/{which}.toml\n"
                            f"JOBWRAP_ONLY_{which.upper()}=1\n")


def _disagreements(tmp: Path, unit_text: str) -> dict[str, tuple[str, str]]:
    """The situations where the unit's process and the prolog's differ in the program they
    run or any JOBWRAP_ setting: (hook's, unit's)."""
    record, unit = _install(tmp, unit_text)
    prolog = Path(f"{tmp}{INSTALL}/prolog/prolog")
    out = {}
    for name, files in SITUATIONS.items():
        _situation(tmp, files)
        # Slurm starts its hooks with a bare environment (and the job's SLURM_ values)
        hook = _what_runs([str(prolog)], {"SLURM_JOB_ID": JOB_ID}, record)
        assert hook.startswith(f"program {tmp}") and " prolog\n" in hook, hook
        argv, env = _unit_process(unit)
        supervised = _what_runs(argv, env, record)
        assert f" supervise {JOB_ID}\n" in supervised, supervised
        if hook.replace(" prolog\n", "\n") != supervised.replace(f" supervise {JOB_ID}\n", "\n"):
            out[name] = (hook, supervised)
    return out


def test_the_supervisor_unit_reads_what_the_hooks_read(tmp_path: Path) -> None:
    assert _disagreements(tmp_path, SUPERVISOR.read_text()) == {}


def test_the_old_unit_and_the_hooks_disagreed(tmp_path: Path) -> None:
    """The check can fail: the old unit read /etc/jobwrap/hooks.env alone and ran the venv's
    jobwrap, where the hooks prefer jobwrap.env and its JOBWRAP_BIN."""
    found = _disagreements(tmp_path, OLD_SUPERVISOR)
    assert set(found) == {"install only", "etc only", "both"}
    hook, unit = found["install only"]
    assert "JOBWRAP_CONFIG" in hook and "JOBWRAP_CONFIG" not in unit


def test_two_environment_files_would_leak_keys(tmp_path: Path) -> None:
    """The check can fail on a per-key merge: with both files, systemd keeps a key that
    only /etc/jobwrap/hooks.env sets, which the hooks never read."""
    found = _disagreements(tmp_path, TWO_ENVIRONMENT_FILES)
    assert set(found) == {"both"}
    hook, unit = found["both"]
    assert "JOBWRAP_ONLY_ETC=1" in unit and "JOBWRAP_ONLY_ETC" not in hook


if __name__ == "__main__":
    print(json.dumps(_in_unit_namespace(json.loads(sys.argv[1]))))
