"""slurm.conf as Slurm reads it: ``Key=Value`` parameters, comments, continued lines and
``Include`` files (relative to slurm.conf's folder, globs allowed). ``jobwrap doctor``
reads it to find the settings jobwrap depends on.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from dataclasses import field
from pathlib import Path

from wrapper.fastdataclass import dataclass

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
# Lines that declare things (nodes, partitions) rather than set the cluster's parameters.
_ENTITY_KEYS = {"nodename", "partitionname", "nodeset", "downnodes", "frontendname",
                "switchname"}
_MAX_INCLUDE_DEPTH = 8


@dataclass
class SlurmConf:
    """The parameters of a slurm.conf and its includes; keys are lower-case."""

    path: Path
    files: list[Path] = field(default_factory=list)
    values: dict[str, tuple[str, Path, int]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # Include lines that match no file

    def get(self, key: str) -> str | None:
        found = self.values.get(key.lower())
        return found[0] if found else None

    def items(self, key: str) -> list[str]:
        """A comma-separated parameter as lower-case items (PrologFlags=Alloc,Contain)."""
        return [v.strip().lower() for v in (self.get(key) or "").split(",") if v.strip()]


def parse_slurm_conf(path: Path) -> SlurmConf:
    """Read slurm.conf: ``Key=Value`` words, ``#`` comments, ``Include`` lines followed
    (relative to slurm.conf's folder, globs allowed). Raises OSError for the main file."""
    conf = SlurmConf(path)
    _read_conf(conf, path, depth=0)
    return conf


def _read_conf(conf: SlurmConf, path: Path, depth: int) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    conf.files.append(path)
    for number, line in _logical_lines(text):
        words = line.split(None, 1)
        if words[0].lower() == "include" and len(words) == 2:
            if depth >= _MAX_INCLUDE_DEPTH:
                continue  # a loop of includes; Slurm would refuse it too
            pattern = words[1].strip().strip('"')
            if not os.path.isabs(pattern):
                pattern = str(conf.path.parent / pattern)
            matches = sorted(glob.glob(pattern))
            for included in matches:
                try:
                    _read_conf(conf, Path(included), depth + 1)
                except OSError:
                    matches.remove(included)
            if not matches:
                conf.missing.append(f"{path}:{number}: Include {words[1].strip()}")
            continue
        try:
            tokens = shlex.split(line, comments=False, posix=True)
        except ValueError:
            tokens = line.split()
        pairs = [t.partition("=") for t in tokens]
        if not pairs or not pairs[0][1] or pairs[0][0].lower() in _ENTITY_KEYS:
            continue
        for key, eq, value in pairs:
            if eq:
                conf.values[key.lower()] = (value, path, number)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(?<!\\)#.*", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1]  # Slurm joins continued lines as they are
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, line))
    return out
