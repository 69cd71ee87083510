"""The installed tool's cost: the wheel's size, the time `pip install` takes for planning only (no extras) and with
`[deploy]`, each venv's size on disk, and `init` + the first plan, all in fresh venvs outside the checkout.

Run: venv/bin/python bench/install_size.py [--runs N] [--deploy]   (numbers go into docs/speed.md; pip reads PyPI,
so the times include the download: run it twice and keep the second, which pip's cache serves)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.wheel_harness import build_wheel, fresh_venv, install  # noqa: E402


def size_mb(folder: Path) -> float:
    """Bytes on disk under `folder`, in MB (du's count: what the venv takes)."""
    out = subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def timed_install(work: Path, requirement: str) -> tuple[float, float, Path]:
    """(seconds pip took, the venv's MB, its python) for one fresh venv."""
    python = fresh_venv(work)
    before = size_mb(work)
    start = time.perf_counter()
    done = install(python, requirement)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"pip install {requirement}: {done.stderr[-1500:]}")
    return took, size_mb(work) - before, python


def first_plan(python: Path, work: Path) -> float:
    """Seconds for `vllm-cluster init` and the example's first plan."""
    tool = python.parent / "vllm-cluster"
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(work)}
    start = time.perf_counter()
    subprocess.run([str(tool), "init", str(work / "p")], check=True, capture_output=True, env=env, cwd=work)
    subprocess.run([str(tool), "plan", "two-node"], check=True, capture_output=True, env=env, cwd=work / "p")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="fresh venvs per install kind [3]")
    parser.add_argument("--deploy", action="store_true", help="also time `pip install vllm-cluster[deploy]`")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vllm-cluster-install-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        wheel = build_wheel(work)
        print(f"wheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KB, built in "
              f"{time.perf_counter() - start:.1f} s")
        kinds = [("plan only", str(wheel))] + ([("[deploy]", f"{wheel}[deploy]")] if args.deploy else [])
        for label, requirement in kinds:
            times, sizes, plans = [], [], []
            for run in range(args.runs):
                took, mb, python = timed_install(work / f"{label[:4].strip('[')}-{run}", requirement)
                times.append(took)
                sizes.append(mb)
                plans.append(first_plan(python, work / f"{label[:4].strip('[')}-{run}"))
            print(f"pip install ({label}), {args.runs} fresh venvs: median {statistics.median(times):.1f} s "
                  f"(min {min(times):.1f}, max {max(times):.1f}); venv grows by {statistics.median(sizes):.0f} MB; "
                  f"init + first plan {statistics.median(plans):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
