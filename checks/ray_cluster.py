"""The Ray cluster as Ray itself sees it: every node alive and the total GPU count, before serving.

Runs where Ray is installed (inside the head container: `docker exec -i <name> python3 - …`).
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from checks.verdict import CheckParser, Verdict, check_name, count, emit, seconds, shown


def snapshot(address: str) -> tuple[list[dict[str, Any]], float]:
    import ray  # imported here: the module must load where Ray is absent, to report cannot-run

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        gpus = float(sum(n.get("Resources", {}).get("GPU", 0) for n in alive))
        return alive, gpus
    finally:
        ray.shutdown()


def check(address: str, nodes: int, gpus: int, wait_s: float, interval_s: float, name: str) -> Verdict:
    try:
        import ray  # noqa: F401
    except ImportError:
        return Verdict(name, "cannot-run", "ray is not importable here", [], "run inside the engine image")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            alive, seen = snapshot(address)
            error = None
        except Exception as exc:  # Ray raises ConnectionError and others when no cluster answers
            alive, seen, error = [], 0.0, f"{type(exc).__name__}: {exc}"[:300]
        evidence = [f"{len(alive)}/{nodes} nodes alive, {seen:g}/{gpus} GPUs"]
        evidence += [f"{n.get('NodeManagerAddress')} GPU={n.get('Resources', {}).get('GPU', 0):g}" for n in alive]
        if error:
            evidence.append(error)
        if len(alive) >= nodes and seen >= gpus:
            return Verdict(name, "pass", f"Ray sees {len(alive)} nodes and {seen:g} GPUs", evidence)
        if time.monotonic() >= deadline:
            return Verdict(name, "fail", f"Ray cluster incomplete: {len(alive)}/{nodes} nodes, {seen:g}/{gpus} GPUs",
                           evidence, "check the worker container (`docker logs`) and that it reaches the head's "
                           "GCS port on the control network; vllm serve would wait on its placement group")
        print(f"[{name}] waiting: {evidence[0]}", flush=True)
        time.sleep(interval_s)


def _address(value: str) -> str:
    """`auto` or HOST:PORT: what `ray.init(address=…)` takes for an existing cluster."""
    host, sep, port_text = value.rpartition(":")
    if value != "auto" and not (sep and host and port_text.isdigit() and 1 <= int(port_text) <= 65535
                                and re.fullmatch(r"[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]", host)):
        raise argparse.ArgumentTypeError(f"{shown(value)}: auto, or the head's GCS address HOST:PORT, "
                                         "e.g. 10.0.0.1:6379")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="ray_cluster", description=__doc__)
    p.add_argument("--name", default="ray-cluster", type=check_name)
    p.add_argument("--address", default="auto", type=_address, help="auto, or the head's GCS HOST:PORT")
    p.add_argument("--nodes", type=count(4096), required=True)
    p.add_argument("--gpus", type=count(4096 * 16), required=True)
    p.add_argument("--wait-s", type=seconds(86_400, low_open=False), default=0.0)
    p.add_argument("--interval-s", type=seconds(3_600, low=0.1, low_open=False), default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    return emit(check(args.address, args.nodes, args.gpus, args.wait_s, args.interval_s, args.name), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
