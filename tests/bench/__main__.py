"""Benchmark runner: ``python -m tests.bench [NAME ...]``."""

from __future__ import annotations

import sys

from tests.bench import prolog_overhead

BENCHMARKS = {
    "prolog-overhead": prolog_overhead.main,
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    worst = 0
    for name in names:
        worst = max(worst, BENCHMARKS[name]())
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
