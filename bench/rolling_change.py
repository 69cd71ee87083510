"""An image change of two replica groups under a steady client load: the whole group at once vs group by group.

    venv/bin/python bench/rolling_change.py [--clients 4] [--load-s 3] [--drain-bound-s 120]

Real parts only: two engine containers (the OpenAI stand-in, checks/standin.py, in an image made by
`docker import` as the tests make theirs; `--start-delay-s` stands for the weights load) on this machine's dockerd,
host network, each a replica group of its own, behind this machine's nginx running the generated nginx.conf (TLS,
client keys, limits; stacks/planner/proxy.py) with each group's server marked. `--clients` threads send chat
requests through the front door the whole time, alternating streamed and plain answers; a request fails when it
gets no complete 200 answer (a refused connection, a 5xx, a cut stream).

- `at once` (what a stack that is one DP/EP group does today): both containers removed, both new ones started,
  wait until both answer /health.
- `rolling` (stacks/planner/rolling.py): per group, the drain script (new connections to the group refused at
  this host's firewall, so nginx passes new requests to the other group; requests in flight answered), `docker rm
  -f`, the new container, /health and the golden question on the group's own port, the undrain script.

nginx reaches the engines on 127.0.0.2 (the only address the drain rules name), its workers as www-data; the
checks (root, whom the rules let through) on 127.0.0.1. The rules go into this machine's nftables (table
`inet vllm_cluster_drain`, only this run's ports) and are deleted by the undrain or at exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stacks.model.config import ProxyConfig, ProxyLimits  # noqa: E402
from stacks.planner.proxy import FrontDoor  # noqa: E402
from stacks.planner.rolling import drain_script, undrain_script  # noqa: E402
from tests.client_load import Load  # noqa: E402
from tests.docker_harness import build_image, docker_ready, remove_image  # noqa: E402
from tests.nginx_harness import (  # noqa: E402
    CLIENT_KEYS,
    UPSTREAM_KEY,
    free_port,
    make_certificate,
    running_nginx,
    write_conf,
)

STANDIN = ROOT / "checks" / "standin.py"
UPSTREAM = "127.0.0.2"
"""Where nginx reaches the engines: the drain rules name this address only, so the checks (127.0.0.1) pass."""
GROUPS = ("a", "b")
DEADLINE_S = 180


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


def start(name: str, image: str, port: int, load_s: float) -> None:
    docker("rm", "-f", name)
    done = docker("run", "-d", "--init", "--name", name, "--network", "host", "-e", f"STANDIN_KEY={UPSTREAM_KEY}",
                  "--entrypoint", "python3", image, "/standin.py", "--host", "0.0.0.0", "--port", str(port),
                  "--api-key-env", "STANDIN_KEY", "--start-delay-s", str(load_s), "--token-delay-s", "0.02")
    if done.returncode:
        raise RuntimeError(f"docker run {name}: {done.stderr.strip()}")


def serving(port: int) -> None:
    """/health 200 and the golden answer on the group's own port (what the check after a replacement asks)."""
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine on port {port} did not answer /health within {DEADLINE_S} s")
            time.sleep(0.2)
        r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {UPSTREAM_KEY}"},
                        json={"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "17*19?"}]})
        answer = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None
        if answer != "323":
            raise RuntimeError(f"golden question on port {port}: {r.status_code} {answer!r}")


def change(mode: str, ports: dict[str, int], new: str, load_s: float, bound_s: int, prefix: str
           ) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    began = time.monotonic()
    if mode == "at once":
        for g in GROUPS:
            docker("rm", "-f", f"{prefix}-{g}")
        for g in GROUPS:
            start(f"{prefix}-{g}", new, ports[g], load_s)
        for g in GROUPS:
            serving(ports[g])
        steps.append({"step": "replace both, wait for both", "s": round(time.monotonic() - began, 2)})
        return {"steps": steps}
    for g in GROUPS:
        t0 = time.monotonic()
        out = subprocess.run(["sh", "-c", drain_script(f"{prefix}-{g}", [(UPSTREAM, ports[g])], bound_s)],
                             capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"drain {g}: {out.stdout}{out.stderr}")
        t1 = time.monotonic()
        docker("rm", "-f", f"{prefix}-{g}")
        start(f"{prefix}-{g}", new, ports[g], load_s)
        serving(ports[g])
        t2 = time.monotonic()
        out = subprocess.run(["sh", "-c", undrain_script(f"{prefix}-{g}", [(UPSTREAM, ports[g])])],
                             capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"undrain {g}: {out.stdout}{out.stderr}")
        steps.append({"group": g, "drain_s": round(t1 - t0, 2), "replace_and_check_s": round(t2 - t1, 2),
                      "undrain_s": round(time.monotonic() - t2, 2)})
    return {"steps": steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4, help="client threads sending requests throughout [4]")
    parser.add_argument("--load-s", type=float, default=3.0, help="each new engine's start-up delay [3]")
    parser.add_argument("--drain-bound-s", type=int, default=120, help="the drain's wait for in-flight requests")
    parser.add_argument("--settle-s", type=float, default=2.0, help="load before and after each change [2]")
    args = parser.parse_args()
    if not 1 <= args.clients <= 64 or not 0 <= args.load_s <= 600 or not 0 <= args.settle_s <= 60:
        parser.error("--clients 1-64, --load-s 0-600, --settle-s 0-60")
    if (why := docker_ready()) is not None:
        print(f"bench/rolling_change.py: {why} (make services starts dockerd)", file=sys.stderr)
        return 2
    prefix = f"vcbench-roll-{os.getpid()}"
    old, new = f"{prefix}:old", f"{prefix}:new"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        build_image(old, work, with_vllm=False, files={STANDIN: "/standin.py"})
        docker("tag", old, new)
        try:
            for mode in ("at once", "rolling"):
                ports = {g: free_port() for g in GROUPS}
                front = free_port()
                proxy = ProxyConfig(enabled=True, bind="127.0.0.1", port=front, limits=ProxyLimits(
                    requests_per_minute_per_key=100000, requests_per_minute_per_client=100000))
                door = dataclasses.replace(FrontDoor.of(proxy, ports["a"]), upstream_host=UPSTREAM,
                                           more_upstreams=((UPSTREAM, ports["b"]),), server_groups=GROUPS)
                site = work / mode.replace(" ", "-")
                site.mkdir()
                site.chmod(0o777)  # nginx's workers run as www-data, as in the nginx images (never root)
                tls = make_certificate(site)
                conf = write_conf(site, door, 0, tls, workers_as="www-data")
                for g in GROUPS:
                    start(f"{prefix}-{g}", old, ports[g], 0)
                for g in GROUPS:
                    serving(ports[g])
                with running_nginx(conf, front), Load(f"https://localhost:{front}", tls.pem, CLIENT_KEYS["team-a"],
                                                      "DeepSeek-V4.1-Flash", args.clients) as load:
                    time.sleep(args.settle_s)  # load before the change: pacing, not a wait on a condition
                    began = time.monotonic()
                    detail = change(mode, ports, new, args.load_s, args.drain_bound_s, prefix)
                    took = time.monotonic() - began
                    time.sleep(args.settle_s)
                row = {"mode": mode, "requests": load.sent, "failed": len(load.failed),
                       "why": sorted(set(load.failed)), "change_s": round(took, 2),
                       "slowest_request_s": round(load.slowest_s, 2), **detail}
                print(json.dumps(row))
                rows.append(row)
                for g in GROUPS:
                    docker("rm", "-f", f"{prefix}-{g}")
        finally:
            for g in GROUPS:
                docker("rm", "-f", f"{prefix}-{g}")
                subprocess.run(["sh", "-c", undrain_script(f"{prefix}-{g}", [(UPSTREAM, 1)], settle_s=1)],
                               capture_output=True)
            remove_image(old)
            remove_image(new)
    print(f"\n{args.clients} clients, engines start in {args.load_s:g} s, 2 groups\n")
    print("| change | requests | failed | change took (s) | slowest request (s) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['requests']} | {r['failed']} | {r['change_s']} | {r['slowest_request_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
