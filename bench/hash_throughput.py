"""Throughput of the content re-hash (`python -m checks.weights verify --content`): sha256 of every file, files in
parallel threads (hashlib releases the GIL on large buffers), as `checks.weights_verify.hash_files` runs it.

    venv/bin/python bench/hash_throughput.py [--dir /mnt/vllm-bench] [--files 8] [--file-mb 256] [--runs 5]

Writes `--files` files of `--file-mb` MB of random bytes under `--dir` (a tmpfs keeps the disk out of it: the
number is the CPU's), reads them once so they sit in memory, then times `hash_files` with 1 worker, 2 workers
and one per CPU, `--runs` times each, and prints the median, min and max in MB/s. The extrapolation line divides
511 GB by (the 1-worker median x 64 cores): what the CPUs of a 64-core node could hash, before the disks'
read rate, which on such a node is usually the tighter bound, is taken into account.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from checks.weights_verify import hash_files  # noqa: E402

CHECKPOINT_GB = 511.0
NODE_CORES = 64


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the files go [a temp dir under /tmp]")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if args.runs < 5:
        print(f"--runs {args.runs}: at least 5, so the median means something", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hashbench-", dir=args.dir))
    try:
        names = [f"model-{i + 1:05d}.safetensors" for i in range(args.files)]
        chunk = os.urandom(16 << 20)
        for name in names:
            with open(work / name, "wb") as handle:
                left = args.file_mb * 1_000_000
                while left > 0:
                    left -= handle.write(chunk[:min(left, len(chunk))])
        total = args.files * args.file_mb * 1_000_000
        hash_files(work, names, 1)  # read once: the files are in memory from here on
        cpus = os.cpu_count() or 1
        load_before = os.getloadavg()[0]
        table: dict[int, list[float]] = {}
        for workers in sorted({1, 2, cpus}):
            rates = []
            for _ in range(args.runs):
                start = time.perf_counter()
                digests, errors = hash_files(work, names, workers)
                seconds = time.perf_counter() - start
                assert len(digests) == len(names) and not errors
                rates.append(total / seconds / 1e6)
            table[workers] = rates
        load_after = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.files} files x {args.file_mb} MB = {total / 1e9:.2f} GB in {work.parent} (in memory), {cpus} CPU(s), "
          f"{args.runs} runs each; load average {load_before:.1f} before, {load_after:.1f} after")
    print("| workers | runs (MB/s) | median MB/s | min | max |\n|---|---|---|---|---|")
    for workers, rates in table.items():
        print(f"| {workers} | {', '.join(f'{r:.0f}' for r in rates)} | {statistics.median(rates):.0f} | "
              f"{min(rates):.0f} | {max(rates):.0f} |")
    per_core = statistics.median(table[1])
    node = per_core * NODE_CORES
    print(f"{CHECKPOINT_GB:.0f} GB on a {NODE_CORES}-core node at {per_core:.0f} MB/s per core "
          f"({node / 1e3:.1f} GB/s): "
          f"{CHECKPOINT_GB * 1e3 / node:.0f} s if the disks deliver that; at 5 GB/s (one fast NVMe drive) "
          f"{CHECKPOINT_GB / 5:.0f} s, at 2 GB/s {CHECKPOINT_GB / 2:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
