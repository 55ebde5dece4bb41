"""One ``os.scandir`` of a checkpoint directory, with the name rules every layout shares.

Temporary names (``*.tmp``, ``*.partial``, ``*.incomplete``, ``*~``, hidden ``.*``,
``tmp*``) are kept in the listing under a *key*, their name with those affixes removed,
so that a layout recognises ``epoch=0-step=9.ckpt.tmp`` or ``tmp-checkpoint-9`` as its
own and discovery can report it ("temporary name") in its place in the order; a
temporary entry no layout recognises is not a checkpoint and is ignored.

Symlinks are resolved only while they stay inside the directory: an entry whose link
leads outside is marked ``escapes`` and nothing behind it is ever opened or stat'ed.
Everything else about an entry (is it a directory, its mtime) is asked lazily, so a
listing of 10,000 entries costs one ``scandir`` and no ``stat``.
"""

from __future__ import annotations

import os

_TEMP_SUFFIXES = (".tmp", ".partial", ".incomplete", "~")
_TEMP_PREFIXES = (".", "tmp")


def temp_key(name: str) -> str | None:
    """The name without its temporary affixes, or None when ``name`` is not temporary."""
    if not (name.startswith(_TEMP_PREFIXES) or name.endswith(_TEMP_SUFFIXES)):
        return None
    key = name
    changed = True
    while changed:
        changed = False
        for suffix in _TEMP_SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key, changed = key[:-len(suffix)], True
        if key.startswith("."):
            key, changed = key[1:], True
        elif key.startswith("tmp"):
            key, changed = key[3:].lstrip("-_."), True
    return key


def inside(real_root: str, path: str) -> bool:
    """Whether ``path`` lies strictly below ``real_root`` (both absolute and normalised)."""
    prefix = real_root if real_root.endswith(os.sep) else real_root + os.sep
    return path.startswith(prefix) and len(path) > len(prefix)


class Entry:
    """One name in the directory; file-type questions are answered lazily and cached."""

    __slots__ = ("_facts", "claimed", "dirent", "key", "name", "temp")

    def __init__(self, dirent: os.DirEntry[str], name: str, key: str, temp: bool) -> None:
        self.dirent = dirent
        self.name = name
        self.key = key  # the name layouts parse: temporary affixes removed
        self.temp = temp
        self.claimed = False  # a layout has taken it; later layouts leave it alone
        self._facts: _Facts | None = None  # most entries are never asked anything

    def _resolve(self, real_root: str) -> _Facts:
        if self._facts is None:
            self._facts = _Facts(self, real_root)
        return self._facts

    @property
    def is_symlink(self) -> bool:
        return self.dirent.is_symlink()

    def real_path(self, real_root: str) -> str | None:
        """The path to open: the entry itself, its in-directory link target, or None (escapes)."""
        return self._resolve(real_root).real

    def escapes(self, real_root: str) -> bool:
        return self._resolve(real_root).real is None

    def is_dir(self, real_root: str) -> bool:
        """A directory, or a link to one inside the directory (never follows a link out)."""
        if not self.dirent.is_symlink():  # the listing's own file type: no system call
            return self.dirent.is_dir(follow_symlinks=False)
        facts = self._resolve(real_root)
        if facts.is_dir is None:
            if not self.is_symlink:
                facts.is_dir = self.dirent.is_dir(follow_symlinks=False)
            else:
                facts.is_dir = facts.real is not None and os.path.isdir(facts.real)
        return facts.is_dir

    def mtime(self, real_root: str) -> float:
        """For ordering only: the target's mtime, the link's own for one that escapes."""
        facts = self._resolve(real_root)
        if facts.mtime is None:
            try:
                if self.is_symlink and facts.real is not None:
                    facts.mtime = os.stat(facts.real).st_mtime
                else:
                    facts.mtime = self.dirent.stat(follow_symlinks=False).st_mtime
            except OSError:
                facts.mtime = float("-inf")
        return facts.mtime


class _Facts:
    """What was learnt about one entry with system calls, so each is asked at most once."""

    __slots__ = ("is_dir", "mtime", "real")

    def __init__(self, entry: Entry, real_root: str) -> None:
        self.is_dir: bool | None = None
        self.mtime: float | None = None
        self.real = (_link_target(entry.dirent.path, real_root) if entry.is_symlink
                     else os.path.join(real_root, entry.name))


def _link_target(link: str, real_root: str) -> str | None:
    """Where a symlink in ``real_root`` leads, or None when that is outside it (or nowhere)."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    # First lexically, so that a link to /etc/... is refused without touching it; then
    # physically, for chains of links and ``dir/..`` through other links.
    lexical = os.path.normpath(os.path.join(real_root, target))
    if not inside(real_root, lexical):
        return None
    real = os.path.realpath(lexical)
    return real if inside(real_root, real) else None


class Listing:
    """The directory's entries in one pass, for the layouts to claim."""

    def __init__(self, root: str, real_root: str) -> None:
        self.root = root
        self.real_root = real_root
        self.entries: list[Entry] = []
        self._by_name: dict[str, Entry] = {}
        # Names of files (model.pt) mostly have a dot, names of checkpoint directories
        # (checkpoint-5, global_step5, iter_0000005) do not: a layout that wants one kind
        # never walks the other, which matters with 10,000 of them.
        self._dotted: list[Entry] = []
        self._plain: list[Entry] = []

    @classmethod
    def scan(cls, root: str, real_root: str) -> Listing:
        """List ``root`` in one pass; raises OSError as ``os.scandir`` does."""
        listing = cls(root, real_root)
        entries, by_name = listing.entries, listing._by_name
        dotted, plain = listing._dotted, listing._plain
        with os.scandir(real_root) as it:
            for dirent in it:
                name = dirent.name
                if name.startswith(_TEMP_PREFIXES) or name.endswith(_TEMP_SUFFIXES):
                    entry = Entry(dirent, name, temp_key(name) or "", True)
                else:
                    entry = Entry(dirent, name, name, False)
                entries.append(entry)
                by_name[name] = entry
                (dotted if "." in entry.key else plain).append(entry)
        return listing

    def unclaimed(self, *, dotted: bool | None = None) -> list[Entry]:
        """Entries no layout took yet: all, or only those whose key has (no) dot in it."""
        pool = self.entries if dotted is None else self._dotted if dotted else self._plain
        return [e for e in pool if not e.claimed]

    def get(self, name: str) -> Entry | None:
        """The entry called exactly ``name`` (a real name, never a temporary one's key)."""
        return self._by_name.get(name)

    def path(self, name: str) -> str:
        """The absolute path reported for ``name``: under the directory as it was given."""
        return os.path.join(self.root, name)
