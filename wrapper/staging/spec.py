"""Parse the values of ``--stage-in`` and ``--stage-out`` into checked, normalized specs.

Grammar (a colon separates the parts, so SRC and DEST cannot contain one)::

    --stage-in=SRC            copy SRC to $JOBWRAP_SCRATCH/<basename of SRC>
    --stage-in=SRC:DEST       copy SRC to $JOBWRAP_SCRATCH/DEST
    --stage-in=SRC:DEST:unpack  unpack the archive SRC into $JOBWRAP_SCRATCH/DEST
    --stage-out=SRC:DEST      after the job, copy $JOBWRAP_SCRATCH/SRC to DEST

SRC of a stage-in and DEST of a stage-out live on shared storage: absolute, or relative
to the job's working directory, and used with the user's own rights. The other side is
inside the scratch folder and must stay there: a path that is absolute, climbs with
``..``, starts with ``~`` (never expanded) or holds a control character is refused, so
every accepted path, joined to the scratch folder, names something inside it. (Symlinks
planted inside scratch are the file-system side's business: every walk there is
no-follow.) Everything here is a pure function.
"""

from __future__ import annotations

import os
import posixpath
import re

from wrapper.errors import UserInputError
from wrapper.fastdataclass import dataclass

UNPACK = "unpack"
MAX_PATH_BYTES = 4095  # PATH_MAX less the terminating NUL
MAX_NAME_BYTES = 255  # NAME_MAX of every Linux file system jobwrap meets
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class StageIn:
    """One ``--stage-in``: where the data is, and where it goes inside scratch."""

    text: str  # the value as the user wrote it, quoted back in messages
    source: str  # absolute, or relative to the job's working directory
    dest: str  # relative to scratch, normalized; "." is the scratch folder itself
    unpack: bool = False

    @property
    def directive(self) -> str:
        return f"--stage-in={self.text}"


@dataclass(frozen=True)
class StageOut:
    """One ``--stage-out``: what to keep from scratch, and where it goes."""

    text: str
    source: str  # relative to scratch, normalized; "." is the whole scratch folder
    dest: str  # absolute, or relative to the job's working directory

    @property
    def directive(self) -> str:
        return f"--stage-out={self.text}"


def parse_stage_in(value: str) -> StageIn:
    """Parse ``SRC[:DEST[:unpack]]``; raises UserInputError naming the directive."""
    directive = f"--stage-in={value}"
    parts = _split(value, directive, "--stage-in=SRC[:DEST[:unpack]]")
    unpack = False
    if len(parts) == 3:
        if parts[2] != UNPACK:
            raise UserInputError(f"{directive}: unknown mode {parts[2]!r}; the only mode is "
                                 f"{UNPACK!r} (--stage-in=SRC:DEST:unpack)")
        unpack = True
    source = shared_path(parts[0], directive=directive, role="SRC")
    if len(parts) >= 2:
        dest = scratch_path(parts[1], directive=directive, role="DEST")
    else:
        name = posixpath.basename(posixpath.normpath(source))
        if name in ("", ".", "..", "/"):
            raise UserInputError(f"{directive}: cannot name the copy after SRC {source!r}; "
                                 "give DEST: --stage-in=SRC:DEST")
        dest = scratch_path(name, directive=directive, role="DEST")
    return StageIn(text=value, source=source, dest=dest, unpack=unpack)


def parse_stage_out(value: str) -> StageOut:
    """Parse ``SRC:DEST``; raises UserInputError naming the directive."""
    directive = f"--stage-out={value}"
    parts = _split(value, directive, "--stage-out=SRC:DEST")
    if len(parts) != 2:
        raise UserInputError(f"{directive}: expected SRC:DEST (SRC inside the scratch folder, "
                             "DEST on shared storage), e.g. --stage-out=results:/shared/me/run1")
    source = scratch_path(parts[0], directive=directive, role="SRC")
    dest = shared_path(parts[1], directive=directive, role="DEST")
    return StageOut(text=value, source=source, dest=dest)


def scratch_path(text: str, *, directive: str, role: str) -> str:
    """Normalize a path that must stay inside the scratch folder, or raise UserInputError.

    Returns the path without empty and ``.`` components (``"."`` for the folder itself).
    """
    where = f"{directive}: {role} {text!r}"
    _common_checks(text, where, "name a path inside the scratch folder, e.g. 'data'")
    if text.startswith("/"):
        raise UserInputError(f"{where} is absolute; {role} is relative to the job's scratch "
                             f"folder, e.g. {text.strip('/') or 'data'!r}")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UserInputError(f"{where} uses '..' to leave the scratch folder; name a path "
                             "inside it, e.g. 'data'")
    for part in parts:
        if len(part.encode()) > MAX_NAME_BYTES:
            raise UserInputError(f"{where} has a component longer than {MAX_NAME_BYTES} "
                                 "bytes; use shorter names")
    if parts and parts[0].startswith("~"):  # "./~": its normal form would start with '~'
        raise UserInputError(f"{where} starts with '~' once './' is dropped, which is not "
                             "expanded; name a path inside the scratch folder, e.g. 'data'")
    return "/".join(parts) or "."


def member_path(name: str, *, where: str) -> str:
    """Normalize the path of an archive member inside its tree ("" for the tree's root).

    Only what could leave the tree is refused (absolute, ``..``, NUL, over-long
    components): a dataset may hold names a user would never type, such as a newline.
    """
    if "\0" in name:
        raise UserInputError(f"{where}: member {name!r} contains a NUL byte; the archive is "
                             "damaged")
    if name.startswith("/"):
        raise UserInputError(f"{where}: member {name!r} is absolute; an archive to unpack "
                             "must hold relative paths only")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UserInputError(f"{where}: member {name!r} uses '..' to leave DEST; repack the "
                             "archive with paths inside it")
    if any(len(os.fsencode(p)) > MAX_NAME_BYTES for p in parts):
        raise UserInputError(f"{where}: member {name!r} has a name longer than "
                             f"{MAX_NAME_BYTES} bytes")
    return "/".join(parts)


def shared_path(text: str, *, directive: str, role: str) -> str:
    """Check a path on shared storage (used with the job user's rights, so '..' is fine)."""
    where = f"{directive}: {role} {text!r}"
    _common_checks(text, where, "write the full path")
    return posixpath.normpath(text) if text != "/" else text


def _split(value: str, directive: str, usage: str) -> list[str]:
    if not value:
        raise UserInputError(f"{directive}: the value is empty; write {usage}")
    if "://" in value:
        raise UserInputError(f"{directive}: this looks like a URL; staging copies paths on "
                             f"file systems mounted on the node: write {usage}")
    parts = value.split(":")
    if len(parts) > 3:
        raise UserInputError(f"{directive}: too many ':' (SRC and DEST cannot contain ':'); "
                             f"write {usage}")
    return parts


def _common_checks(text: str, where: str, tilde_hint: str) -> None:
    if not text:
        raise UserInputError(f"{where} is empty; give a path")
    bad = _CONTROL.search(text)
    if bad:
        raise UserInputError(f"{where} contains the control character {bad.group()!r}; "
                             "use printable names")
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserInputError(f"{where} is not valid UTF-8; rename it") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise UserInputError(f"{where} is longer than {MAX_PATH_BYTES} bytes; use a shorter "
                             "path")
    if text.startswith("~"):
        raise UserInputError(f"{where} starts with '~', which is not expanded; {tilde_hint}")
