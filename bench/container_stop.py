"""How long the stop phase of a group restart takes: `docker rm -f` of a running engine container.

    venv/bin/python bench/container_stop.py [--runs 5]

The engine containers carry no `destroy_grace_seconds`, so the docker provider removes them without a stop
attempt (a forced remove: SIGKILL, then the container's removal). This times that on the local Docker engine with
the test image (tests/docker_harness.py: Debian's python3 and the vLLM stand-in), its engine process serving on a
free port as the stand-in does; `--runs` containers, one at a time. The GPUs' release on a real node adds the
driver's teardown, which no GPU-less machine shows (stacks/planner/outage.py counts 5 s for both).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.waiting import wait_for  # noqa: E402

# Imported by name: mypy then does not type-check the test harness behind it (it is the tests' to keep).
harness = importlib.import_module("tests.docker_harness")

SERVE = ("import http.server,socketserver; socketserver.TCPServer(('127.0.0.1', 0), "
         "http.server.SimpleHTTPRequestHandler).serve_forever()")


def _running(name: str) -> bool:
    done = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True)
    return done.stdout.strip() == "true"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    problem = harness.docker_ready()
    if problem:
        print(f"docker: {problem}", file=sys.stderr)
        return 2
    run = harness.RUN
    tag = f"vllm-cluster-stopbench:{run}"
    with tempfile.TemporaryDirectory() as work:
        harness.build_image(tag, Path(work), with_vllm=False)
    times: list[float] = []
    try:
        for i in range(args.runs):
            name = f"stopbench-{run}-{i}"
            subprocess.run(["docker", "run", "-d", "--name", name, tag, "python3", "-c", SERVE], check=True,
                           capture_output=True)
            wait_for(functools.partial(_running, name), f"{name} running", 60)
            start = time.perf_counter()
            subprocess.run(["docker", "rm", "-f", name], check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    finally:
        subprocess.run(["docker", "rm", "-f", *(f"stopbench-{run}-{i}" for i in range(args.runs))],
                       capture_output=True)
        harness.remove_image(tag)
    print(f"docker rm -f of a running container, {args.runs} runs (s): {', '.join(f'{t:.2f}' for t in times)}; "
          f"median {statistics.median(times):.2f}, max {max(times):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
