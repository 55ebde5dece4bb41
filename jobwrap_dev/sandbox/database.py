"""A private MariaDB on loopback, in a folder of its own: what the sandbox's accounting
(slurmdbd) and the archive index's tests (``[archive] index_backend = "mariadb"``) run.

``PrivateMariaDb(folder, port, log_dir).start(env)`` makes a data folder under ``folder``
(its own socket, its own port on 127.0.0.1, run as ``mysql``) and returns the daemon,
which its caller stops by pid (``daemons.terminate``). Nothing of the machine's own
MariaDB (if any) is touched.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from jobwrap_dev.sandbox.daemons import Daemon, SandboxError, daemon_of, terminate
from wrapper.runner import Runner

PROGRAMS = ("mariadbd", "mariadb-install-db", "mariadb")
INSTALL_LOCK = Path("/tmp/jobwrap-sandbox-mariadb-install.lock")  # one install-db at a time


class PrivateMariaDb:
    def __init__(self, folder: Path, port: int, log_dir: Path,
                 buffer_pool: str = "32M") -> None:
        self.dir = folder
        self.port = port
        self.log_dir = log_dir
        # InnoDB's cache: 32M keeps four sandboxes side by side small (slurmdbd's tables
        # fit); a benchmark gives it MariaDB's own default, 128M, which a site exceeds
        self.buffer_pool = buffer_pool

    @property
    def socket(self) -> Path:
        return self.dir / "mysqld.sock"

    def start(self, env: dict[str, str]) -> Daemon:
        """mariadbd on its own data folder (made the first time); returns once it answers."""
        missing = [p for p in PROGRAMS if not shutil.which(p, path=env.get("PATH")) and
                   not Path(f"/usr/sbin/{p}").exists()]
        if missing:
            raise SandboxError(f"a private MariaDB needs {', '.join(missing)}: run "
                               "`bash tools/bootstrap` (Debian package mariadb-server)")
        mysql = pwd.getpwnam("mysql")
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "data"
        os.chown(self.dir, mysql.pw_uid, mysql.pw_gid)
        os.chmod(self.dir, 0o755)  # clients (slurmdbd as slurm) reach the port, not the files
        if not (data / "mysql").exists():
            self._install_db(Runner(env), data)
        daemon = spawn("mariadbd", [
            sbin("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=mysql",
            f"--socket={self.socket}", f"--port={self.port}", "--bind-address=127.0.0.1",
            f"--pid-file={self.dir / 'mysqld.pid'}", f"--log-error={self.dir / 'mysqld.err'}",
            "--skip-name-resolve", f"--innodb-buffer-pool-size={self.buffer_pool}"], env,
            self.log_dir)
        wait_for(lambda: self.sql("SELECT 1", check=False) == 0, "mariadbd",
                 self.dir / "mysqld.err")
        return daemon

    def add_user(self, user: str, database: str) -> str:
        """A database user on 127.0.0.1 with every right on ``database``; its password."""
        password = secrets.token_hex(16)
        self.sql(f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{password}';"
                 f"ALTER USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}';"
                 f"GRANT ALL ON {database}.* TO '{user}'@'127.0.0.1';FLUSH PRIVILEGES;")
        return password

    def new_database(self, name: str, option_file: Path, user: str = "jobwrap") -> Path:
        """An empty database ``name`` (dropped first if there is one), ``user`` with every
        right on it, and the client option file that reaches it, root's and 0600 (what
        ``[archive] index_connection`` names)."""
        self.sql(f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}")
        password = self.add_user(user, name)
        option_file.write_text(f"[client]\nhost = 127.0.0.1\nport = {self.port}\n"
                               f"user = {user}\npassword = {password}\ndatabase = {name}\n")
        os.chmod(option_file, 0o600)
        return option_file

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

    def sql(self, statement: str, *, check: bool = True) -> int:
        """Run ``statement`` as the database's root (over the socket); its exit status."""
        done = Runner().run(["mariadb", f"--socket={self.socket}", "-u", "root", "-e",
                             statement], timeout=30, check=check)
        return done.returncode


@contextlib.contextmanager
def throwaway(prefix: str, buffer_pool: str = "32M") -> Iterator[PrivateMariaDb]:
    """A private MariaDB in a new folder under /tmp (not under a 0700 one: mariadbd runs
    as mysql) on a free loopback port, stopped and removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(folder, 0o755)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    db = PrivateMariaDb(folder / "db", port, folder, buffer_pool)
    daemon = db.start(dict(os.environ))
    try:
        yield db
    finally:
        terminate(daemon, grace=30)
        shutil.rmtree(folder, ignore_errors=True)


def spawn(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Daemon:
    """Start a daemon in the foreground of its own session, its output in ``log_dir``."""
    out = open(log_dir / f"{name}.stdout", "ab")  # noqa: SIM115 - the daemon's
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd="/")
    out.close()
    return daemon_of(name, proc.pid)


def wait_for(ready: Callable[[], bool], what: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    raise SandboxError(f"{what} did not answer within {timeout:g} s; see {log}")


def sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"
