"""Slurm accounting for the sandbox: a private MariaDB and slurmdbd, on loopback.

``Accounting(base, db_port, dbd_port).start()`` starts a private MariaDB in
``<base>/accounting`` (jobwrap_dev/sandbox/database.py), creates a database user for
Slurm with a random password, writes ``slurmdbd.conf`` beside ``slurm.conf`` (0600,
SlurmUser's, as slurmdbd insists) and starts slurmdbd; it
returns the daemons it started, which the cluster stops with its own (by pid, checked
against the start time). ``slurm_conf()`` is what slurm.conf needs to store there.
Nothing of the machine's own MariaDB or slurmdbd (if any) is touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from jobwrap_dev.sandbox.daemons import Daemon, SandboxError
from jobwrap_dev.sandbox.database import PrivateMariaDb, sbin, spawn, wait_for
from wrapper.runner import Runner

PROGRAMS = ("mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacctmgr")


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
    def db(self) -> PrivateMariaDb:
        return PrivateMariaDb(self.dir, self.db_port, self.base / "log")

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
        runner = Runner(env)
        daemons = [self.db.start(env)]
        password = self.db.add_user("slurm", "slurm_acct_db")
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
        daemons.append(spawn("slurmdbd", [sbin(slurmdbd), "-D"], env, self.base / "log"))
        wait_for(lambda: runner.run(["sacctmgr", "-n", "show", "cluster"], timeout=10,
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
