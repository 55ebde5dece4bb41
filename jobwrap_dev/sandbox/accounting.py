"""Slurm accounting for the sandbox: a private MariaDB and slurmdbd, on loopback.

``Accounting(base, db_port, dbd_port).start()`` makes a MariaDB data folder under
``<base>/accounting`` (its own socket, its own port on 127.0.0.1, run as ``mysql``),
creates a database user for Slurm with a random password, writes ``slurmdbd.conf``
beside ``slurm.conf`` (0600, SlurmUser's, as slurmdbd insists) and starts slurmdbd; it
returns the daemons it started, which the cluster stops with its own (by pid, checked
against the start time). ``slurm_conf()`` is what slurm.conf needs to store there.
Nothing of the machine's own MariaDB or slurmdbd (if any) is touched.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from jobwrap_dev.sandbox.daemons import Daemon, SandboxError, daemon_of
from wrapper.runner import Runner

PROGRAMS = ("mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacctmgr")
INSTALL_LOCK = Path("/tmp/jobwrap-sandbox-mariadb-install.lock")  # one install-db at a time


class Accounting:
    def __init__(self, base: Path, db_port: int, dbd_port: int, cluster_name: str,
                 slurm_prefix: str = "") -> None:
        self.base = base
        # slurmdbd must be the cluster's own Slurm's (22.05's cannot serve a 25.11 slurmctld)
        self.slurm_prefix = slurm_prefix
        self.dir = base / "accounting"
        self.db_port = db_port
        self.dbd_port = dbd_port
        self.cluster_name = cluster_name

    @property
    def socket(self) -> Path:
        return self.dir / "mysqld.sock"

    def slurm_conf(self) -> str:
        """The lines of slurm.conf that send the cluster's records to this slurmdbd."""
        return ("AccountingStorageType=accounting_storage/slurmdbd\n"
                "AccountingStorageHost=127.0.0.1\n"
                f"AccountingStoragePort={self.dbd_port}\n"
                "AccountingStoreFlags=job_comment\n")

    def start(self, env: dict[str, str]) -> list[Daemon]:
        from jobwrap_dev.sandbox import flavor

        slurmdbd = flavor.program(self.slurm_prefix, "slurmdbd")
        missing = [p for p in PROGRAMS if not shutil.which(p, path=env.get("PATH")) and
                   not Path(f"/usr/sbin/{p}").exists()]
        if self.slurm_prefix and not Path(slurmdbd).is_file():
            missing.append(slurmdbd)
        if missing:
            raise SandboxError(f"Slurm accounting needs {', '.join(missing)}: run "
                               "`bash tools/bootstrap` (Debian packages slurmdbd, "
                               "mariadb-server)")
        mysql = pwd.getpwnam("mysql")
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "data"
        os.chown(self.dir, mysql.pw_uid, mysql.pw_gid)
        os.chmod(self.dir, 0o755)  # slurmdbd (as slurm) reaches the port, not the files
        runner = Runner(env)
        if not (data / "mysql").exists():
            self._install_db(runner, data)
        daemons = [self._spawn("mariadbd", [
            _sbin("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=mysql",
            f"--socket={self.socket}", f"--port={self.db_port}", "--bind-address=127.0.0.1",
            f"--pid-file={self.dir / 'mysqld.pid'}", f"--log-error={self.dir / 'mysqld.err'}",
            "--skip-name-resolve", "--innodb-buffer-pool-size=32M"], env, daemon_of)]
        self._wait(lambda: self._sql("SELECT 1", check=False) == 0, "mariadbd",
                   self.dir / "mysqld.err")
        password = secrets.token_hex(16)
        self._sql(f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
                  f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
                  "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';FLUSH PRIVILEGES;")
        conf = self.base / "etc" / "slurmdbd.conf"
        conf.write_text(f"""# written by jobwrap's sandbox: this cluster's accounting
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=slurm
PidFile={self.dir}/slurmdbd.pid
LogFile={self.base}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
""")
        slurm = pwd.getpwnam("slurm")
        os.chown(conf, slurm.pw_uid, slurm.pw_gid)
        os.chmod(conf, 0o600)
        daemons.append(self._spawn("slurmdbd", [_sbin(slurmdbd), "-D"], env, daemon_of))
        self._wait(lambda: runner.run(["sacctmgr", "-n", "show", "cluster"], timeout=10,
                                      check=False).returncode == 0,
                   "slurmdbd", self.base / "log" / "slurmdbd.log")
        runner.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name], timeout=30,
                   check=False)  # already there on a second up
        return daemons

    def add_user(self, env: dict[str, str], user: str, account: str = "sandbox") -> None:
        """An association for ``user``: slurmctld then files their jobs under it."""
        runner = Runner(env)
        runner.run(["sacctmgr", "-i", "add", "account", account,
                    f"cluster={self.cluster_name}"], timeout=30, check=False)
        runner.run(["sacctmgr", "-i", "add", "user", user, f"account={account}",
                    f"cluster={self.cluster_name}"], timeout=30, check=False)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str],
               make: Callable[[str, int], Daemon]) -> Daemon:
        out = open(self.base / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 - the daemon's
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd="/")
        out.close()
        return make(name, proc.pid)

    def _install_db(self, runner: Runner, data: Path) -> None:
        """A fresh data folder, as the daemon reads it (no option file: Debian's names the
        system's pid file and socket). One at a time on a host: sandboxes side by side
        (the test tiers) once saw it abort when two ran at once. Its whole complaint, not
        its last line, when it fails."""
        import fcntl

        argv = ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=mysql",
                "--auth-root-authentication-method=socket", "--skip-test-db"]
        fd = os.open(INSTALL_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            done = runner.run(argv, timeout=120, check=False)
        finally:
            os.close(fd)
        if done.returncode != 0:
            said = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
            raise SandboxError(f"{' '.join(argv)} failed (exit {done.returncode}):\n{said}")

    def _sql(self, statement: str, *, check: bool = True) -> int:
        done = Runner().run(["mariadb", f"--socket={self.socket}", "-u", "root", "-e",
                             statement], timeout=30, check=check)
        return done.returncode

    def _wait(self, ready: Callable[[], bool], what: str, log: Path,
              timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.3)
        raise SandboxError(f"{what} did not answer within {timeout:g} s; see {log}")


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"
