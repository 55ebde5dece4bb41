"""Alternating runs and medians: the subject and its anchor share the machine's noise."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence


def time_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(list(argv), env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def alternate(subject: Callable[[], float], anchor: Callable[[], float],
              rounds: int = 21, warmup: int = 2) -> tuple[float, float]:
    """Median seconds of (subject, anchor), run in turn so that drift hits both."""
    for _ in range(warmup):
        subject()
        anchor()
    subject_times, anchor_times = [], []
    for i in range(rounds):
        first, second = (subject, anchor) if i % 2 == 0 else (anchor, subject)
        a, b = first(), second()
        s, n = (a, b) if first is subject else (b, a)
        subject_times.append(s)
        anchor_times.append(n)
    return statistics.median(subject_times), statistics.median(anchor_times)


def verdict(name: str, key: str, value: float, op: str, goal: float) -> int:
    import operator

    compare = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}[op]
    ok = compare(value, goal)
    print(f"{name} {key}={value:.2f} goal{op}{goal:g}")
    return 0 if ok else 1
