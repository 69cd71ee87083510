"""Program evaluation time under Pulumi's mocks for 2, 8, 32 and 128 nodes (no engine, no network).

Run: venv/bin/python bench/program_scale.py 2>/dev/null   (numbers go into docs/speed.md; stderr carries the
stacks' warnings, once per run)

`--bare`: the same program under bare mocks (nothing recorded, no spies on the constructors), to show what the
test harness (tests/pulumi_harness.py) adds to the figures. The machine is shared: report `uptime` with them.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.simplefilter("ignore", DeprecationWarning)

import pulumi  # noqa: E402

from bench.plan_scale import scaled  # noqa: E402
from tests.pulumi_harness import SECRET_VALUES, dependency_edges, run_program  # noqa: E402

REPEATS = 3
"""Samples per node count; the table shows their medians."""


class BareMocks(pulumi.runtime.Mocks):
    """What the program needs back from the engine (ids, an image id, a command's stdout), nothing recorded."""

    count = 0

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.count += 1
        state = dict(args.inputs)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            state["imageId"] = f"sha256:mock-{args.name}"
        if args.typ.startswith("command:"):
            state["stdout"] = f"PASS {args.name}: mocked"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


def run_bare(values: dict[str, Any]) -> int:
    """components.program.deploy under BareMocks, config set as the harness sets it; the resource count."""
    from components.program import deploy, restored_gc

    mocks = BareMocks()
    pulumi.runtime.set_mocks(mocks, project="vllm-cluster", stack="prod", preview=False)
    config = {f"vllm-cluster:{k}": json.dumps(v) for k, v in values.items() if k not in SECRET_VALUES}
    config |= {f"vllm-cluster:{k}": v for k, v in SECRET_VALUES.items()}
    pulumi.runtime.set_all_config(config, secret_keys=[f"vllm-cluster:{k}" for k in SECRET_VALUES])

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> None:
        deploy("prod")

    with restored_gc():
        program()
    return mocks.count


def one(nodes: int, bare: bool) -> dict[str, float]:
    """One evaluation, in this process: wall and CPU seconds, resources, `depends_on` edges."""
    import components.program  # noqa: F401  (imports are not the program's evaluation)

    values = scaled(nodes)
    start, start_cpu = time.perf_counter(), time.process_time()
    if bare:
        count, edges = run_bare(values), -1
    else:
        run = run_program("prod", values)
        assert run.error is None, run.error
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if not bare:
        count, edges = len(run.mocks.resources), dependency_edges(run)
    return {"wall": seconds, "cpu": cpu, "resources": count, "edges": edges,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    """Each sample in a fresh interpreter, as the Pulumi language host runs the program once per process (imports
    not counted)."""
    bare = "--bare" in sys.argv[1:]
    if "--one" in sys.argv[1:]:
        print(json.dumps(one(int(sys.argv[sys.argv.index("--one") + 1]), bare)))
        return
    print(f"{'nodes':>6} {'resources':>10} {'edges':>6} {'eval (s, median)':>17} {'cpu (s, median)':>16} "
          f"{'per node (ms)':>14} {'max RSS (MB)':>13}")
    for nodes in (2, 8, 32, 128):
        samples = []
        for _ in range(REPEATS):
            out = subprocess.run([sys.executable, __file__, "--one", str(nodes), *(["--bare"] if bare else [])],
                                 check=True, capture_output=True, text=True).stdout
            samples.append(json.loads(out.strip().splitlines()[-1]))
        seconds = statistics.median(x["wall"] for x in samples)
        cpu = statistics.median(x["cpu"] for x in samples)
        edges = "-" if bare else str(int(samples[0]["edges"]))
        print(f"{nodes:>6} {int(samples[0]['resources']):>10} {edges:>6} {seconds:>17.2f} {cpu:>16.2f} "
              f"{seconds * 1000 / nodes:>14.1f} {max(x['maxrss_mb'] for x in samples):>13.0f}", flush=True)


if __name__ == "__main__":
    main()
