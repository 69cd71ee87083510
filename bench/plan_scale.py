"""Time `plan` (parse + validate + derive) for 2, 8, 32 and 128 nodes, and the CLI end to end.

Run: venv/bin/python bench/plan_scale.py   (numbers go into docs/speed.md)
"""

from __future__ import annotations

import copy
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stacks.model.loader import parse_config, read_stack_values  # noqa: E402
from stacks.planner.plan import build_plan  # noqa: E402


def scaled(nodes: int) -> dict[str, Any]:
    """prod's DP x TP8 with `nodes` nodes: one DP rank per node, EP = 8 x nodes."""
    values = copy.deepcopy(read_stack_values("prod"))
    template = values["nodes"][1]
    values["nodes"] = []
    for i in range(nodes):
        node = copy.deepcopy(template)
        node["name"] = f"node{i + 1}"
        node["ssh"]["host"] = node["management_ip"] = f"10.{30 + i // 250}.{i % 250}.1"
        node["data_ips"] = [f"1.{1 + i // 250}.{i % 250}.2", f"1.{101 + i // 250}.{i % 250}.2"]
        values["nodes"].append(node)
    values["parallelism"]["data"] = nodes
    return values


def time_plan(values: dict[str, Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_plan("bench", parse_config("bench", values))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    print(f"{'nodes':>6} {'plan (ms, median)':>18} {'per node (ms)':>14} {'growth vs previous':>20}")
    previous: tuple[int, float] | None = None
    for nodes in (2, 8, 32, 128):
        seconds = time_plan(scaled(nodes), repeats=20 if nodes < 128 else 5)
        growth = "" if previous is None else f"x{seconds / previous[1]:.1f} for x{nodes // previous[0]} nodes"
        print(f"{nodes:>6} {seconds * 1000:>18.2f} {seconds * 1000 / nodes:>14.3f} {growth:>20}")
        previous = (nodes, seconds)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--json"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        runs.append(time.perf_counter() - start)
    print(f"CLI `python -m stacks plan prod --json` end to end: median {statistics.median(runs) * 1000:.0f} ms "
          f"(interpreter start and imports included)")


if __name__ == "__main__":
    main()
