"""Which programs and libraries only root can have put there: what exemptions rest on.

A process's name, its command line and even its ``comm`` are the user's to choose
(``exec -a``, a symlink or copy named ``make``, a write to ``/proc/self/comm``). What the
user cannot choose is the file the kernel runs. So an exemption (an exempt command's own
CPU allowance, a login shell's protection) goes only to a process whose program is a
*root file*:

- the file behind ``/proc/PID/exe`` is the file its path names in root's view (same
  device and inode: a user's bind mount over ``/usr/bin/make`` in a namespace of their
  own, or a program deleted since, does not qualify);
- that file is owned by root and writable by no one else;
- every folder from ``/`` down to it is owned by root and writable by no one else, so
  no user can have put it there (a hard link into a user's folder, a copy in ``/tmp``);

and, since a root program runs the user's code all the same when told to load it,
only while it maps no executable code from anything but root files (``LD_PRELOAD``,
``LD_LIBRARY_PATH``, ``LD_AUDIT``, ``dlopen`` of a user's ``.so``, ``memfd`` code) and
its environment names no loader path outside root's folders.

Limits: programs that interpret what they are given (``vim -c 'py3 ...'``, ``emacs
--batch``, ``make``'s recipes run in children, so those are counted apart) can still
spend CPU on the user's behalf within their own allowance; a process the user ptraces
after it started can be made to run anything. Neither gains more than that command's
allowance.
"""

from __future__ import annotations

import glob
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import field

from wrapper.fastdataclass import dataclass
from wrapper.osl.files import owned_alone

# A folder's or file's ownership rarely changes; look again at least this often.
_CACHE_SECONDS = 300.0
# The environment is read whole or not trusted: the kernel caps it near 2 MiB by default.
ENVIRON_MAX = 4 << 20
LOADER_VARIABLES = (b"LD_PRELOAD", b"LD_LIBRARY_PATH", b"LD_AUDIT")


@dataclass
class Trust:
    """Answers "could only root have put this here?", with its answers cached a while."""

    monotonic: Callable[[], float] = time.monotonic
    _dirs: dict[str, tuple[bool, float]] = field(default_factory=dict, repr=False)
    _files: dict[str, tuple[tuple[int, int] | None, float]] = field(default_factory=dict,
                                                                     repr=False)

    def root_dir(self, path: str) -> bool:
        """``path`` is a folder, and it and every folder above it are root's alone."""
        now = self.monotonic()
        cached = self._dirs.get(path)
        if cached is not None and now - cached[1] < _CACHE_SECONDS:
            return cached[0]
        try:
            info = os.lstat(path)
            ok = stat.S_ISDIR(info.st_mode) and owned_alone(info, 0)
        except OSError:
            ok = False
        if ok and path != "/":
            ok = self.root_dir(os.path.dirname(path) or "/")
        self._dirs[path] = (ok, now)
        return ok

    def root_file(self, path: str) -> tuple[int, int] | None:
        """(device, inode) of ``path`` when it is a root file in root's folders; else None.

        ``path`` must be absolute and free of symlinks (as the kernel shows programs and
        mappings); a symlink in it is not followed (it fails the check).
        """
        now = self.monotonic()
        cached = self._files.get(path)
        if cached is not None and now - cached[1] < _CACHE_SECONDS:
            return cached[0]
        identity = None
        if os.path.isabs(path) and os.path.normpath(path) == path:
            try:
                info = os.lstat(path)
                if (stat.S_ISREG(info.st_mode) and owned_alone(info, 0)
                        and self.root_dir(os.path.dirname(path))):
                    identity = (info.st_dev, info.st_ino)
            except OSError:
                pass
        self._files[path] = (identity, now)
        return identity

    def program(self, proc_root: str, pid: int) -> tuple[str, tuple[int, int] | None]:
        """The path of a process's program and, when it is a root file and the very one
        the process runs, its (device, inode); else None.

        ('', None) when it cannot be read (a process that ended, a kernel thread).
        """
        exe = f"{proc_root}/{pid}/exe"
        try:
            path = os.readlink(exe)
            running = os.stat(exe)  # the file the process runs, wherever it is now
        except OSError:
            return "", None
        if path.endswith(" (deleted)"):
            return path.removesuffix(" (deleted)"), None
        identity = self.root_file(path)
        return path, identity if identity == (running.st_dev, running.st_ino) else None

    def foreign_code(self, maps: bytes) -> str:
        """The first executable mapping of ``/proc/PID/maps`` not from a root file, or ''."""
        for line in maps.splitlines():
            fields = line.split(None, 5)
            if len(fields) < 6 or b"x" not in fields[1]:
                continue
            path = fields[5].decode(errors="surrogateescape")
            if not path.startswith("/"):
                if path.startswith("["):
                    continue  # [vdso], [vsyscall]: the kernel's
                return path  # anonymous yet named: not a file root put anywhere
            identity = self.root_file(path)
            if identity is None or identity[1] != int(fields[4]):
                return path  # not root's, or not the file mapped (deleted, replaced)
        return ""

    def foreign_loader_setting(self, environ: bytes) -> str:
        """A loader variable in a process's environment naming anything not root's, or ''.

        ``environ`` is ``/proc/PID/environ`` (NUL-separated). LD_PRELOAD and LD_AUDIT
        entries must be root files (a bare name is looked up in the library path, which
        must then be root's too); LD_LIBRARY_PATH entries must be root's folders (an
        empty entry is the working directory).
        """
        if len(environ) >= ENVIRON_MAX:
            return "an environment too large to read"
        for entry in environ.split(b"\0"):
            name, sep, value = entry.partition(b"=")
            if not sep or name not in LOADER_VARIABLES or not value:
                continue
            text = value.decode(errors="surrogateescape")
            if name == b"LD_LIBRARY_PATH":
                parts: Iterable[str] = text.replace(";", ":").split(":")
                bad = [p for p in parts if not self._root_dir_resolved(p)]
            else:
                parts = text.replace(":", " ").split()
                bad = [p for p in parts if "/" in p and not self._root_file_resolved(p)]
            if bad:
                return f"{name.decode()}={text}"
        return ""

    def _root_dir_resolved(self, path: str) -> bool:
        return os.path.isabs(path) and self.root_dir(os.path.realpath(path))

    def _root_file_resolved(self, path: str) -> bool:
        return os.path.isabs(path) and self.root_file(os.path.realpath(path)) is not None

    def resolve(self, names: Iterable[str], folders: Iterable[str]) -> dict[tuple[int, int], str]:
        """(device, inode) of each root file that one of ``names`` is in ``folders``.

        ``folders`` may hold glob patterns (``/usr/lib/gcc/*/*``). A name found through a
        symlink (``gcc`` -> ``x86_64-linux-gnu-gcc-12``) counts as its target; the first
        name found for a file wins.
        """
        found: dict[tuple[int, int], str] = {}
        wanted = list(dict.fromkeys(names))
        for pattern in folders:
            magic = any(c in pattern for c in "*?[")
            for folder in sorted(glob.glob(pattern)) if magic else [pattern]:
                for name in wanted:
                    target = os.path.realpath(os.path.join(folder, name))
                    identity = self.root_file(target)
                    if identity is not None:
                        found.setdefault(identity, name)
        return found
