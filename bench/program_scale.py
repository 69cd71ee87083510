"""Program evaluation time under Pulumi's mocks for 2, 8, 32 and 128 nodes (no engine, no network).

Run: venv/bin/python bench/program_scale.py   (numbers go into docs/speed.md)
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.simplefilter("ignore", DeprecationWarning)

from bench.plan_scale import scaled  # noqa: E402
from tests.pulumi_harness import run_program  # noqa: E402


def main() -> None:
    print(f"{'nodes':>6} {'resources':>10} {'eval (s, median)':>17} {'per node (ms)':>14}")
    for nodes in (2, 8, 32, 128):
        values = scaled(nodes)
        samples, count = [], 0
        for _ in range(3 if nodes < 128 else 1):
            start = time.perf_counter()
            run = run_program("prod", values)
            samples.append(time.perf_counter() - start)
            assert run.error is None, run.error
            count = len(run.mocks.resources)
        seconds = statistics.median(samples)
        print(f"{nodes:>6} {count:>10} {seconds:>17.2f} {seconds * 1000 / nodes:>14.1f}")


if __name__ == "__main__":
    main()
