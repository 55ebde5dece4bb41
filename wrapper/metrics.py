"""Prometheus metrics in a node_exporter textfile, which every hook updates in place.

node_exporter's textfile collector reads ``*.prom`` files whole, so each update is a
read-merge-write of the one file (``[metrics] textfile``) under an exclusive lock on a
``.lock`` file beside it, written to a temporary file and renamed over the old one: the
collector never sees half a file, and the prolog, the epilog and the login guard each
change only their own series. The format is written by hand (the text exposition format
0.0.4) because prometheus-client is not a dependency of the hooks.

Series written by the helpers (every one also gets ``node`` when a node name is given):

- ``jobwrap_node_check{check,gpu,verdict}`` gauge, 1 for a check's current verdict
  (pass/warn/fail) and 0 for the other two; ``gpu=""`` for node-wide checks.
- ``jobwrap_node_healthy`` gauge, 1 when no check failed; and
  ``jobwrap_node_check_timestamp_seconds`` gauge, when they last ran.
- ``jobwrap_job_failures_total{class,action}`` counter (action: requeue or stop), and
  ``jobwrap_restarts_total{class}`` counter, the requeues, by failure class.
- ``jobwrap_staged_bytes_total{direction,source}`` counter (direction: in/out; source:
  copy or cache), ``jobwrap_staged_files_total{direction}``,
  ``jobwrap_stage_cache_hits_total`` and ``jobwrap_stage_cache_misses_total`` counters.
- ``jobwrap_login_guard_actions_total{rule,action}`` counter.
- Goodput (``record_goodput``, once per attempt end, by the job's first node):
  ``jobwrap_goodput_productive_seconds_total`` and ``jobwrap_goodput_wall_seconds_total``
  counters (cluster goodput = the ratio of their rates), ``jobwrap_lost_seconds_total{class}``
  (work after the last checkpoint before a failure), ``jobwrap_restart_gap_seconds_total
  {class}`` and ``jobwrap_restart_gaps_total{class}`` (a failure -> the next attempt's first
  progress, by the class of the failure), ``jobwrap_jobs_ended_total`` and
  ``jobwrap_jobs_ettr_sum_total`` counters (mean ETTR of ended jobs), and
  ``jobwrap_job_last_ettr`` gauge.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import re
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import field
from pathlib import Path

from wrapper.config import MetricsConfig
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass

Labels = tuple[tuple[str, str], ...]
TYPES = ("counter", "gauge", "untyped")
VERDICTS = ("pass", "warn", "fail")

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SAMPLE_HEAD = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{?)")
_LABEL_START = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"')
_LABELS_END = re.compile(r"\s*\}")
_LABEL_SEP = re.compile(r"\s*(,|\})")
_PLAIN_PAIR_TEXT = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"'
_PLAIN_SAMPLE = re.compile(rf'([a-zA-Z_:][a-zA-Z0-9_:]*)'
                           rf'\{{((?:{_PLAIN_PAIR_TEXT}(?:,{_PLAIN_PAIR_TEXT})*,?)?)\}} (\S+)')
_PLAIN_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
_GOOD_LABELS: set[str] = set()  # label names already checked against _LABEL
# One whole sample line as this module writes it (and as the format allows): the name,
# labels with quoted values (escapes inside), a value, an optional timestamp.
_SAMPLE_LINE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{\s*(?:[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\.)*"'
    r'\s*(?:,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\.)*"\s*)*,?\s*)?\})?'
    r'\s+(?:[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.|Inf|inf|NaN|nan))'
    r'(?:\s+-?[0-9]+)?')


class MetricsError(JobwrapError):
    """The metrics textfile could not be read, locked or written."""


def labels(**pairs: object) -> Labels:
    """``labels(check="ecc", gpu=0)`` -> a sorted label tuple (the key of one series)."""
    return normalise({k: str(v) for k, v in pairs.items()}.items())


def normalise(pairs: Iterable[tuple[str, str]]) -> Labels:
    """One order for a series' labels, so that the same series is never written twice."""
    out = tuple(sorted((str(k), str(v)) for k, v in pairs))
    for name, _ in out:
        if name not in _GOOD_LABELS:
            if not _LABEL.match(name) or name.startswith("__"):
                raise MetricsError(f"{name!r} is not a Prometheus label name")
            _GOOD_LABELS.add(name)
    if len({name for name, _ in out}) != len(out):
        raise MetricsError(f"a label is given twice in {out}")
    return out


@dataclass
class Family:
    name: str
    help: str = ""
    type: str = "untyped"
    samples: dict[Labels, float] = field(default_factory=dict)
    # A family this update does not change: its checked sample lines, kept as written.
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Change:
    """One family's update: set (or, with ``add``, increase) the given series.

    ``replace_where`` first drops the family's series whose labels include all of those
    pairs (``{}``: every series), so a snapshot (a node's check verdicts) can replace the
    previous one without leaving series of checks that no longer run.
    """

    family: str
    help: str
    type: str
    samples: Mapping[Labels, float]
    add: bool = False
    replace_where: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.family):
            raise MetricsError(f"{self.family!r} is not a Prometheus metric name")
        if self.type not in TYPES:
            raise MetricsError(f"metric type {self.type!r}: expected one of {', '.join(TYPES)}")
        if self.type == "counter" and not self.family.endswith("_total"):
            # Prometheus' convention, and its parsers rename counters that break it.
            raise MetricsError(f"counter {self.family!r}: a counter's name ends with _total")


def update(path: str, family: str, help: str, type: str,
           samples: Mapping[Labels, float], *, add: bool = False,
           replace_where: Mapping[str, str] | None = None, lock_timeout: float = 5.0) -> None:
    """Set (``add``: increase) the series ``samples`` of ``family`` in the textfile."""
    apply(path, [Change(family, help, type, samples, add, replace_where)],
          lock_timeout=lock_timeout)


def apply(path: str, changes: Iterable[Change], *, lock_timeout: float = 5.0) -> None:
    """Make every change in one locked read-merge-write of the textfile."""
    target = Path(path)
    changes = list(changes)
    with _locked(target, lock_timeout):
        # Only the families that change are parsed: the rest (another hook's series) are
        # checked line by line and written back as they were.
        families = read(target, only={change.family for change in changes})
        for change in changes:
            _merge(families, change)
        _write(target, render(families))


def read(path: Path, *, only: Collection[str] | None = None) -> dict[str, Family]:
    """The families in a textfile (none when it does not exist); see :func:`parse`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise MetricsError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        return parse(handle.read(), only=only)


def parse(text: str, *, only: Collection[str] | None = None) -> dict[str, Family]:
    """Read the text format; a line that does not parse is dropped, never fatal (a
    hand-edited or truncated file must not stop the hooks from writing theirs).

    ``only``: parse the samples of these families; the others' sample lines are only
    checked (one pattern match each) and kept in ``Family.lines`` as they are."""
    families: dict[str, Family] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            words = line.split(None, 3)
            if len(words) >= 3 and words[1] in ("HELP", "TYPE") and _NAME.match(words[2]):
                fam = families.setdefault(words[2], Family(words[2]))
                rest = words[3] if len(words) == 4 else ""
                if words[1] == "HELP":
                    fam.help = _unescape(rest)
                elif rest in TYPES:
                    fam.type = rest
            continue
        if only is not None:
            kept = _SAMPLE_LINE.fullmatch(line)
            if kept is None:
                continue
            if kept.group(1) not in only:
                families.setdefault(kept.group(1), Family(kept.group(1))).lines.append(line)
                continue
        sample = _parse_sample(line)
        if sample is not None:
            name, series, value = sample
            families.setdefault(name, Family(name)).samples[series] = value
    return families


def render(families: Mapping[str, Family]) -> str:
    out: list[str] = []
    for name in sorted(families):
        fam = families[name]
        if not fam.samples and not fam.lines:
            continue
        if fam.help:
            out.append(f"# HELP {name} {_escape(fam.help, help_text=True)}")
        out.append(f"# TYPE {name} {fam.type}")
        out.extend(fam.lines)
        for series in sorted(fam.samples):
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in series)
            out.append(f"{name}{{{text}}} {_number(fam.samples[series])}" if text
                       else f"{name} {_number(fam.samples[series])}")
    return "\n".join(out) + "\n" if out else ""


# -- helpers for the hooks -----------------------------------------------------------------
def record_node_health(cfg: MetricsConfig, results: Iterable[tuple[str, str, str]], *,
                       node: str = "", now: float | None = None) -> bool:
    """A node's check verdicts, as (check, gpu or "", verdict); replaces the last ones."""
    node_labels = {"node": node} if node else {}
    samples: dict[Labels, float] = {}
    healthy = 1.0
    for check, gpu, verdict in results:
        if verdict not in VERDICTS:
            raise MetricsError(f"verdict {verdict!r}: expected one of {', '.join(VERDICTS)}")
        healthy = 0.0 if verdict == "fail" else healthy
        for state in VERDICTS:
            key = labels(check=check, gpu=gpu, verdict=state, **node_labels)
            samples[key] = 1.0 if state == verdict else 0.0
    return _apply_quietly(cfg, [
        Change("jobwrap_node_check", "Verdict of a jobwrap check (1: the current one).",
               "gauge", samples, replace_where=node_labels),
        Change("jobwrap_node_healthy", "1 when no jobwrap check failed on the node.",
               "gauge", {labels(**node_labels): healthy}),
        Change("jobwrap_node_check_timestamp_seconds", "When jobwrap's checks last ran.",
               "gauge", {labels(**node_labels): time.time() if now is None else now}),
    ])


def record_failure(cfg: MetricsConfig, failure_class: str, *, requeued: bool,
                   node: str = "") -> bool:
    """A failed job attempt, by class; a requeue also counts as a restart."""
    extra = {"node": node} if node else {}
    action = "requeue" if requeued else "stop"
    changes = [Change("jobwrap_job_failures_total", "Failed job attempts, by failure class "
                      "and what jobwrap did.", "counter",
                      {labels(action=action, **{"class": failure_class}, **extra): 1.0},
                      add=True)]
    if requeued:
        changes.append(Change("jobwrap_restarts_total", "Jobs requeued by jobwrap, by "
                              "failure class.", "counter",
                              {labels(**{"class": failure_class}, **extra): 1.0}, add=True))
    return _apply_quietly(cfg, changes)


def record_slow_node(cfg: MetricsConfig, *, node: str, score: float) -> bool:
    """A node the pulse named slow in a job: how often, and its score then."""
    return _apply_quietly(cfg, [
        Change("jobwrap_slow_node_total", "Jobs in which the pulse named the node slow "
               "(its speed score under [pulse] slow_below).", "counter",
               {labels(node=node): 1.0}, add=True),
        Change("jobwrap_slow_node_score", "The node's speed score when the pulse last named "
               "it slow (1.0 = as fast as the job's typical rank).", "gauge",
               {labels(node=node): score})])


def record_indexer(cfg: MetricsConfig, *, folded: int, left: int) -> bool:
    """A run of the archive's indexer (`jobwrap archive index`, its timer's)."""
    import time

    return _apply_quietly(cfg, [
        Change("jobwrap_archive_indexer_last_run_timestamp_seconds", "When the archive's "
               "indexer last ran (jobwrap-indexer.timer).", "gauge", {labels(): time.time()}),
        Change("jobwrap_archive_indexer_folded_total", "Epilog records the indexer folded "
               "into the archive's index.", "counter", {labels(): float(folded)}, add=True),
        Change("jobwrap_archive_spool_records", "Epilog records waiting in the archive's "
               "spool after the indexer's last run.", "gauge", {labels(): float(left)})])


def record_goodput(cfg: MetricsConfig, *, failure_class: str, productive_s: float,
                   wall_s: float, lost_s: float, gap: tuple[str, float] | None = None,
                   ended_ettr: float | None = None, node: str = "") -> bool:
    """One attempt's share of its job's goodput ledger (``wrapper.archive.ledger``).

    ``gap``: the restart gap before this attempt and the class that caused it;
    ``ended_ettr``: the job's ETTR when this attempt ended the job."""
    extra = {"node": node} if node else {}
    here = labels(**extra)
    changes = [
        Change("jobwrap_goodput_productive_seconds_total", "Job seconds that produced kept "
               "progress.", "counter", {here: max(0.0, productive_s)}, add=True),
        Change("jobwrap_goodput_wall_seconds_total", "Job wall seconds, first start to end, "
               "restart gaps included.", "counter", {here: max(0.0, wall_s)}, add=True),
    ]
    if failure_class != "success":
        changes.append(Change("jobwrap_lost_seconds_total", "Work lost to failures (the last "
                              "checkpoint before a failure -> the failure), by class.",
                              "counter", {labels(**{"class": failure_class}, **extra):
                                          max(0.0, lost_s)}, add=True))
    if gap is not None:
        by = labels(**{"class": gap[0]}, **extra)
        changes += [
            Change("jobwrap_restart_gap_seconds_total", "Seconds from a failure to the next "
                   "attempt's first progress, by the failure's class.", "counter",
                   {by: max(0.0, gap[1])}, add=True),
            Change("jobwrap_restart_gaps_total", "Restarts whose gap was measured, by the "
                   "failure's class.", "counter", {by: 1.0}, add=True)]
    if ended_ettr is not None:
        changes += [
            Change("jobwrap_jobs_ended_total", "Jobs whose last attempt ended (goodput "
                   "measured).", "counter", {here: 1.0}, add=True),
            Change("jobwrap_jobs_ettr_sum_total", "Sum of the ETTR of ended jobs (divide by "
                   "jobwrap_jobs_ended_total).", "counter", {here: ended_ettr}, add=True),
            Change("jobwrap_job_last_ettr", "ETTR of the last job that ended here.", "gauge",
                   {here: ended_ettr})]
    return _apply_quietly(cfg, changes)


def record_staging(cfg: MetricsConfig, *, direction: str, bytes_copied: int,
                   bytes_from_cache: int = 0, files: int = 0, cache_hits: int = 0,
                   cache_misses: int = 0, node: str = "") -> bool:
    """What one staging (direction ``in`` or ``out``) moved, and how the cache did."""
    extra = {"node": node} if node else {}
    return _apply_quietly(cfg, [
        Change("jobwrap_staged_bytes_total", "Bytes staged, by direction and by source "
               "(copy: read from the source; cache: served from the node cache).", "counter",
               {labels(direction=direction, source="copy", **extra): float(bytes_copied),
                labels(direction=direction, source="cache", **extra): float(bytes_from_cache)},
               add=True),
        Change("jobwrap_staged_files_total", "Files staged, by direction.", "counter",
               {labels(direction=direction, **extra): float(files)}, add=True),
        Change("jobwrap_stage_cache_hits_total", "Staged datasets served from the node "
               "cache.", "counter", {labels(**extra): float(cache_hits)}, add=True),
        Change("jobwrap_stage_cache_misses_total", "Staged datasets copied because the "
               "node cache did not hold them.", "counter",
               {labels(**extra): float(cache_misses)}, add=True),
    ])


def record_login_guard(cfg: MetricsConfig, *, rule: str, action: str,
                       node: str = "") -> bool:
    """One login-guard step (warn, throttle, terminate) taken for a rule (cpu, memory, ...)."""
    extra = {"node": node} if node else {}
    return _apply_quietly(cfg, [
        Change("jobwrap_login_guard_actions_total", "Login-guard actions, by rule and "
               "action.", "counter", {labels(rule=rule, action=action, **extra): 1.0},
               add=True),
    ])


def _apply_quietly(cfg: MetricsConfig, changes: list[Change]) -> bool:
    """Metrics never fail a hook: a write that fails is logged as a warning; False then."""
    if not cfg.textfile:
        return False
    try:
        apply(cfg.textfile, changes, lock_timeout=cfg.lock_timeout)
    except (MetricsError, OSError) as exc:
        from wrapper import log

        log.get().warning("metrics.write_failed", path=cfg.textfile, error=str(exc))
        return False
    return True


# -- internals -----------------------------------------------------------------------------
def _merge(families: dict[str, Family], change: Change) -> None:
    fam = families.get(change.family)
    if fam is None or fam.type not in (change.type, "untyped"):
        fam = families[change.family] = Family(change.family)  # a new type: start over
    fam.help, fam.type = change.help, change.type
    if change.replace_where is not None:
        where = set(change.replace_where.items())
        fam.samples = {k: v for k, v in fam.samples.items() if not where <= set(k)}
    for series, value in change.samples.items():
        key = normalise(series)
        number = float(value)
        fam.samples[key] = fam.samples.get(key, 0.0) + number if change.add else number


@contextlib.contextmanager
def _locked(target: Path, timeout: float) -> Iterator[None]:
    lock = target.with_name(target.name + ".lock")
    try:
        # 0600: a user who could open it to read could also hold a flock on it for ever
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise MetricsError(f"cannot open the lock {lock}: {exc.strerror}") from None
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o600)  # a lock file an earlier jobwrap made 0644
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise MetricsError(f"cannot lock {lock}: {exc.strerror}") from None
                if time.monotonic() >= deadline:
                    raise MetricsError(f"{lock} is held by another writer for more than "
                                       f"{timeout:g} s") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write(target: Path, text: str) -> None:
    # Not *.prom: node_exporter never reads the temporary file.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # node_exporter runs as its own user
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise MetricsError(f"cannot write {target}: {exc.strerror}") from None


def _parse_sample(line: str) -> tuple[str, Labels, float] | None:
    plain = _PLAIN_SAMPLE.fullmatch(line)
    if plain is not None:  # as render writes it: no escapes, no spaces, no timestamp
        try:
            return plain.group(1), normalise(_PLAIN_PAIR.findall(plain.group(2))), \
                _float(plain.group(3))
        except (ValueError, MetricsError):
            return None
    head = _SAMPLE_HEAD.match(line)
    if head is None:
        return None
    name, pos = head.group(1), head.end()
    pairs: list[tuple[str, str]] = []
    if head.group(2):
        while True:
            match = _LABEL_START.match(line, pos)
            if match is None:
                close = _LABELS_END.match(line, pos)
                if close is None:
                    return None
                pos = close.end()
                break
            value, pos = _read_quoted(line, match.end())
            if value is None:
                return None
            pairs.append((match.group(1), value))
            sep = _LABEL_SEP.match(line, pos)
            if sep is None:
                return None
            pos = sep.end()
            if sep.group(1) == "}":
                break
    words = line[pos:].split()
    if not words or len(words) > 2:
        return None
    try:
        return name, normalise(pairs), _float(words[0])
    except (ValueError, MetricsError):
        return None


def _read_quoted(line: str, pos: int) -> tuple[str | None, int]:
    out: list[str] = []
    while pos < len(line):
        char = line[pos]
        if char == "\\" and pos + 1 < len(line):
            nxt = line[pos + 1]
            out.append("\n" if nxt == "n" else nxt)
            pos += 2
        elif char == '"':
            return "".join(out), pos + 1
        else:
            out.append(char)
            pos += 1
    return None, pos


def _escape(text: str, *, help_text: bool = False) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text if help_text else text.replace('"', '\\"')


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "\\n\"":
            out.append("\n" if text[i + 1] == "n" else text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _float(text: str) -> float:
    special = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    return special[text.lower()] if text.lower() in special else float(text)


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
