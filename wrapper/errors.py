"""The error hierarchy, and the one place errors become hook exit codes.

Exit codes (a contract, see DESIGN.md): 0 healthy, 1 the node is unhealthy,
2 jobwrap itself or its configuration is broken.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_BROKEN = 2


class JobwrapError(Exception):
    """Base of every error jobwrap raises on purpose; its message is one line for a human."""

    exit_code = EXIT_BROKEN


class ConfigError(JobwrapError):
    """The configuration file cannot be read or is invalid. Carries every problem found."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration in {path}:\n{lines}")


class UserInputError(JobwrapError):
    """Something the job's user supplied (a directive, a path) is wrong; never a node fault."""


class SlurmError(JobwrapError):
    """A Slurm command failed, timed out or answered something we cannot read."""


class CommandError(JobwrapError):
    """An external command failed; the message names the command and why."""

    def __init__(self, argv: list[str], reason: str, stderr: str = "") -> None:
        self.argv = argv
        self.reason = reason
        self.stderr = stderr.strip()
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        # The most telling line: the last that says "error", else the last one.
        telling = next((ln for ln in reversed(lines) if "error" in ln.lower()),
                       lines[-1] if lines else "")
        detail = f": {telling}" if telling else ""
        super().__init__(f"command {' '.join(argv)!r} {reason}{detail}")


class CommandTimeout(CommandError):
    """An external command ran past its timeout and was killed with its process group."""


class NotUnderSlurm(JobwrapError):
    """A hook verb was run without the environment Slurm gives its hooks."""


class StateError(JobwrapError):
    """The per-job state cannot be written safely (wrong owner, a symlink, a bad job id)."""


class FormatTooNew(JobwrapError):
    """A file a newer jobwrap wrote, in a format this one cannot read (an upgrade not yet
    on every node, or a downgrade). Not a node fault, whatever ``[hooks]
    on_internal_error`` says: a hook that meets it logs this one line and lets Slurm go on;
    nothing is drained (docs/upgrades.md)."""

    def __init__(self, path: object, what: str, version: object, known: int) -> None:
        from wrapper import __version__

        self.path, self.what, self.version, self.known = str(path), what, version, known
        newer = "written by a newer jobwrap" if isinstance(version, int) and version > known \
            else "which no jobwrap writes"
        super().__init__(
            f"{path} is in {what} format {version}, {newer}; this jobwrap "
            f"({__version__}) reads {what} formats 1 to {known}. Finish the upgrade: install "
            "the same jobwrap on every node (a downgrade cannot read what the newer one wrote)")


def format_of(data: object, key: str, *, known: int, path: object, what: str) -> int:
    """The format version of a record ``data`` (a JSON object) keeps under ``key``: absent,
    1 (every file written before formats were numbered); above ``known``, or not a whole
    number, FormatTooNew. The one rule every versioned jobwrap file is read by."""
    version = data.get(key, 1) if isinstance(data, dict) else 1
    if isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= known:
        return version
    raise FormatTooNew(path, what, version if isinstance(version, int)
                       and not isinstance(version, bool) else repr(version), known)
