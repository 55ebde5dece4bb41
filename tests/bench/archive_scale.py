"""archive-scale: jobwrap's archive verbs over 10,000 and 100,000 archived jobs, through
the archive's index on each backend (SQLite, and MariaDB: a private one on loopback,
``JOBWRAP_BENCH_INDEX`` picks them), against two anchors over the same archive in the
same run.

The archive is written by the project's own code: seven template jobs archived by
``archive_attempt`` (the epilog's call: events, parts, stdout, manifest) as root, with
one to four attempts of different classes and checkpoints; then copied N times with
varied ids, users (50), nodes (512), classes and times (spread over the 90 days before
the build, the default ``max_age_days``: ``--since 7d`` holds 7.8% of them): each copy
is the template's folder with its files hard-linked, its manifest rewritten, and its
folder's mtime set to its ``updated_at``. The index is built from those manifests by
``SqliteIndex.rebuild`` (timed: what ``jobwrap archive reindex`` costs once). A built
archive is kept under /tmp, keyed by N and ``FORMAT``, because 100,000 take minutes to
write; one older than ``STALE_S`` is written again (its times would drift out of 7d).

Each verb is a fresh ``python -m wrapper`` process (what an admin types), timed against
its anchor in alternating runs, medians (``timing.alternate``):

- ``sqlite`` (``mariadb``): a fresh ``python3 -c`` that reads the same rows with a bare
  query to the backend's database (``sacct``'s way: an indexed database): the job's row
  for ``status``, the period's rows with their ledgers for ``report``;
- ``scandir``: a fresh ``python3 -c`` that lists the archive's job folders with
  ``os.scandir`` (the least any walk of the archive costs, opening no file).

Goals at 100,000 jobs: ``status`` <= 0.5 s, ``report --since 7d`` <= 2 s (also shown:
``--since 62d``, the ~70,000 rows a 7-day report reads at 10,000 jobs a day), each verb's
peak RSS < 100 MB, and ``status`` growing sub-linearly from 10k to 100k (exponent
log(t100k / t10k) / log(10) < 1; linear is 1). ``JOBWRAP_BENCH_ARCHIVE_N`` picks the
sizes (default ``10000,100000``), ``JOBWRAP_BENCH_ROUNDS`` the rounds (default 5).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.bench.timing import alternate

FORMAT = 4  # bump when the archive the bench writes changes shape
USERS = 50
NODES = 512
SPAN_S = 90 * 86400.0
CLASSES = ("success", "success", "success", "success", "hardware", "hang", "user_error",
           "node_failure", "walltime", "killed")
BASE_ID = 5_000_000
CACHE = Path("/tmp")
STALE_S = 2 * 86400.0  # a cached archive this old is built again: its --since 7d drifts


def main() -> int:
    from jobwrap_dev.sandbox.database import throwaway

    sizes = [int(n) for n in os.environ.get("JOBWRAP_BENCH_ARCHIVE_N",
                                            "10000,100000").split(",")]
    rounds = int(os.environ.get("JOBWRAP_BENCH_ROUNDS", "5"))
    backends = os.environ.get("JOBWRAP_BENCH_INDEX", "sqlite,mariadb").split(",")
    results: dict[str, dict[int, dict[str, tuple[float, float, float]]]] = {}
    with contextlib.ExitStack() as stack:
        # MariaDB's own default InnoDB cache (128M): a site's server has more
        database = stack.enter_context(throwaway("jobwrap-bench-mariadb-", "128M")) \
            if "mariadb" in backends else None
        for n in sizes:
            base = build(n)
            if "sqlite" in backends:
                results.setdefault("sqlite", {})[n] = measure(base, n, rounds)
            if database is not None:
                cfg = index_on_mariadb(base, n, database)
                results.setdefault("mariadb", {})[n] = measure(base, n, rounds, cfg=cfg,
                                                               database=database)
    largest, smallest = max(sizes), min(sizes)
    worst = 0
    line: list[str] = []
    goals: list[str] = []
    for backend, by_size in results.items():
        status_s = by_size[largest]["status"][0]
        report_s = by_size[largest]["report --since 7d"][0]
        dense_s = by_size[largest]["report --since 62d"][0]
        rss = max(r[2] for r in by_size[largest].values())
        print(f"archive-scale {backend} n={largest}: status {status_s:.3f} s (goal <= 0.5), "
              f"report --since 7d {report_s:.3f} s (goal <= 2; a dense week, 62d: "
              f"{dense_s:.3f} s), peak RSS {rss:.0f} MB (goal < 100)")
        worst |= int(status_s > 0.5) | int(report_s > 2.0) | int(rss >= 100)
        if largest > smallest:
            growth = math.log(status_s / by_size[smallest]["status"][0]) / math.log(
                largest / smallest)
            print(f"archive-scale {backend} status growth exponent {smallest}->{largest}: "
                  f"{growth:.2f} (goal < 1: sub-linear)")
            worst |= int(growth >= 1.0)
        prefix = "" if backend == "sqlite" else f"{backend}_"
        line += [f"{prefix}status_s={status_s:.2f}", f"{prefix}report_s={report_s:.2f}"]
        goals += [f"{prefix}status_s<=0.5", f"{prefix}report_s<=2"]
    print(f"archive-scale {' '.join(line)} goal {' '.join(goals)}")
    return worst


def index_on_mariadb(base: Path, n: int, database: Any) -> str:
    """The archive's index built into ``database`` (timed, as a reindex), and a config
    file that reads it."""
    from wrapper.archive.index_mariadb import MariaDbIndex

    connection = database.new_database(f"jobwrap_bench_{n}", base / "index.cnf")
    config = base / "config-mariadb.toml"
    config.write_text((base / "config.toml").read_text() + f'index_backend = "mariadb"\n'
                      f'index_connection = "{connection}"\ncluster = "bench"\n')
    index = MariaDbIndex(str(base / "archive"), str(connection), "bench")
    started = time.monotonic()
    index.rebuild()
    took = time.monotonic() - started
    index.close()
    print(f"archive-scale mariadb n={n}: reindex {took:.1f} s ({took / n * 1e3:.2f} ms a "
          "job)", flush=True)
    return str(config)


def build(n: int) -> Path:
    """An archive of ``n`` jobs and its index, cached under /tmp (an index of an older
    schema is built again, and that is timed too)."""
    from wrapper.archive.index import IndexFault, SqliteIndex

    base = CACHE / f"jobwrap-bench-archive-v{FORMAT}-{n}"
    root = base / "archive"
    built = base / "built.json"
    facts = json.loads(built.read_text()) if built.exists() else {}
    if facts and time.time() - facts["now"] < STALE_S:
        print(f"archive-scale n={n}: cached at {base} ({facts})", flush=True)
    else:
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        started = time.monotonic()
        templates = _templates(base / "templates")
        written = time.monotonic()
        root.mkdir(mode=0o711)
        now = time.time()
        for i in range(n):
            _copy(templates[i % len(templates)], root, i, now)
        facts = {"now": now, "templates_s": round(written - started, 1),
                 "copies_s": round(time.monotonic() - written, 1)}
        (base / "config.toml").write_text(
            f'[paths]\nstate_dir = "{base}/state"\narchive_root = "{root}"\n'
            '[log]\nfile = ""\n[archive]\naccess = "group"\n')
        built.write_text(json.dumps(facts))
        print(f"archive-scale n={n}: built at {base}: templates {facts['templates_s']} s, "
              f"{n} copies {facts['copies_s']} s", flush=True)
    index = SqliteIndex(str(root))
    try:
        index.check()
    except IndexFault:
        started = time.monotonic()
        index.rebuild()
        took = time.monotonic() - started
        size = (root / ".index" / "archive.sqlite").stat().st_size
        print(f"archive-scale n={n}: reindex {took:.1f} s "
              f"({took / n * 1e3:.2f} ms a job), index {size / 1e6:.1f} MB "
              f"({size / n:.0f} B a job)", flush=True)
    finally:
        index.close()
    return base


def _templates(base: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Seven jobs archived by the epilog's own call, as root."""
    from tests.support.archive import config, record, run_attempt, state
    from wrapper.archive import archive_attempt
    from wrapper.osl.users import UserIds

    root_user = UserIds.of(0, 0)
    cfg = config(base, access="group")
    (base / "work").mkdir(parents=True, exist_ok=True)
    shapes = [("success",), ("hardware", "success"), ("hang", "hang", "success"),
              ("user_error",), ("node_failure", "walltime", "success"),
              ("killed", "success"), ("hardware", "hang", "node_failure", "success")]
    out = []
    for t, kinds in enumerate(shapes):
        job_id = str(900 + t)
        (base / "work" / f"job-{job_id}.out").write_text(f"training step {t}\n" * 200)
        job = state(base, root_user, job_id)
        rec = record(base, root_user, job_id, nodes=["n1", "n2"])
        for attempt, kind in enumerate(kinds):
            last = attempt == len(kinds) - 1
            run_attempt(job, attempt, ["n1", "n2"], kind=kind,
                        decision="done" if last else "requeue",
                        checkpoints=tuple(100 * (attempt + 1) + 10 * k for k in range(3)))
            for node in ("n1", "n2"):
                archive_attempt(cfg, job, rec, attempt=attempt, node=node,
                                script_text="#!/bin/sh\npython train.py\n",
                                extra={"slurm": {"JobName": f"train-{t}"}})
        folder = base / "archive" / "root" / job_id
        out.append((folder, json.loads((folder / "manifest.json").read_text())))
    return out


def _copy(template: tuple[Path, dict[str, Any]], root: Path, i: int, now: float) -> None:
    folder, manifest = template
    user = f"user{(i * 7) % USERS:02d}"
    job_id = str(BASE_ID + i)
    updated = now - SPAN_S * ((i * 7919) % 100_003) / 100_003
    hours = 3600.0 * (1 + i % 7)  # each attempt runs 0.9 of this, then waits 0.1 in queue
    nodes = [f"gpu{(i * 13 + k * 101) % NODES:03d}" for k in range(2)]
    data = json.loads(json.dumps(manifest))
    data["updated_at"] = updated
    data["job"].update(id=job_id, user=user, name=f"train-{i % 997}")
    count = len(data["attempts"])
    for number, attempt in enumerate(data["attempts"]):
        start = updated - 600 - (count - number) * hours
        attempt["started_at"] = start
        if attempt.get("ended_at") is not None:
            attempt["ended_at"] = start + 0.9 * hours
        points = attempt.get("checkpoint_list") or []
        for k, point in enumerate(points):
            point["ts"] = start + 0.9 * hours * (k + 1) / (len(points) + 1)
        attempt["nodes"] = nodes
        if number < len(data["attempts"]) - 1:
            attempt["outcome"] = CLASSES[4 + (i + number) % (len(CLASSES) - 4)]
    user_dir = root / user
    if not user_dir.exists():
        user_dir.mkdir(mode=0o750)
    dest = user_dir / job_id
    for source, _, files in os.walk(folder):
        target = dest / os.path.relpath(source, folder)
        target.mkdir(mode=0o750, exist_ok=True)
        for name in files:
            if name != "manifest.json":
                os.link(os.path.join(source, name), target / name)
    (dest / "manifest.json").write_text(json.dumps(data, indent=1))
    os.utime(dest, (updated, updated))


# -- the measurements ----------------------------------------------------------------------
ANCHOR = """import sqlite3, sys
index, column, value = sys.argv[1:]
where = {"job_id": "job_id = ?", "updated_at": "updated_at >= ?"}[column]
rows = sqlite3.connect(index).execute(
    "SELECT user, job_id, updated_at, size, ledger FROM jobs WHERE " + where,
    (value if column == "job_id" else float(value),)).fetchall()
print(len(rows))
"""


MARIADB_ANCHOR = """import pymysql, sys
cnf, column, value = sys.argv[1:]
where = {"job_id": "job_id = %s", "updated_at": "updated_at >= %s"}[column]
con = pymysql.connect(read_default_file=cnf)
with con.cursor() as cursor:
    cursor.execute("SELECT user, job_id, updated_at, size, ledger FROM jobwrap_jobs WHERE "
                   "cluster = 'bench' AND " + where,
                   (value if column == "job_id" else float(value),))
    print(len(cursor.fetchall()))
"""


def measure(base: Path, n: int, rounds: int, *, cfg: str = "", database: Any = None
            ) -> dict[str, tuple[float, float, float]]:
    """verb -> (median s, its anchor's median s, peak RSS MB); ``cfg`` names the index
    (SQLite's by default), ``database`` makes the anchor a bare query to MariaDB."""
    root = base / "archive"
    cfg = cfg or str(base / "config.toml")
    jobwrap = [sys.executable, "-m", "wrapper", "--config", cfg]
    a_job = str(BASE_ID + 6)  # a job with four attempts and checkpoints
    index = str(root / ".index" / "archive.sqlite")
    backend = "mariadb" if database is not None else "sqlite"

    def sqlite_anchor(column: str, value: str) -> list[str]:
        if database is not None:
            return [sys.executable, "-c", MARIADB_ANCHOR, str(base / "index.cnf"), column,
                    value]
        return [sys.executable, "-c", ANCHOR, index, column, value]

    def since(days: int) -> list[str]:
        return sqlite_anchor("updated_at", f"{time.time() - days * 86400}")

    scandir_anchor = [sys.executable, "-c", (
        "import os,sys; r=sys.argv[1]; n=0\n"
        "for u in os.scandir(r):\n"
        " if u.is_dir() and not u.name.startswith('.'):\n"
        "  n+=sum(1 for j in os.scandir(u.path) if j.is_dir())\n"
        "print(n)"), str(root)]
    verbs = {"status": ([*jobwrap, "status", a_job], sqlite_anchor("job_id", a_job)),
             "report --since 7d": ([*jobwrap, "report", "--since", "7d"], since(7)),
             # 62 of 90 days: the ~70,000 rows of 100,000 that a 7-day report reads on a
             # cluster of 10,000 jobs a day
             "report --since 62d": ([*jobwrap, "report", "--since", "62d"], since(62)),
             "report --since 90d --json": ([*jobwrap, "report", "--since", "90d", "--json"],
                                           scandir_anchor),
             "archive list": ([*jobwrap, "archive", "list"], scandir_anchor),
             "archive prune --dry-run": ([*jobwrap, "archive", "prune", "--dry-run"],
                                         scandir_anchor)}
    peaks: dict[str, float] = {}
    out: dict[str, tuple[float, float, float]] = {}
    for verb, (argv, anchor) in verbs.items():
        peaks[verb] = 0.0

        def subject(argv: list[str] = argv, verb: str = verb) -> float:
            seconds, rss = _run(argv)
            peaks[verb] = max(peaks[verb], rss)
            return seconds

        def bare(anchor: list[str] = anchor) -> float:
            return _run(anchor)[0]

        took, anchored = alternate(subject, bare, rounds=rounds, warmup=1)
        out[verb] = (took, anchored, peaks[verb])
        name = "scandir" if anchor is scandir_anchor else backend
        print(f"archive-scale {backend} n={n} {verb}: {took:.3f} s ({name} anchor "
              f"{anchored:.3f} s, "
              f"x{took / anchored:.1f}), peak RSS {peaks[verb]:.0f} MB", flush=True)
    return out


def _run(argv: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one run of ``argv``; it must succeed."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"archive-scale: {' '.join(argv[-4:])} failed: {err.decode()}")
    return seconds, usage.ru_maxrss / 1024

