"""What the nginx front door costs: time to first SSE chunk and /v1/models latency, direct vs through the
proxy (TLS, key check, limits), with Debian's nginx in front of the OpenAI stand-in on this machine.

    venv/bin/python bench/proxy_latency.py [--requests 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checks.api import tls_context  # noqa: E402
from stacks.model.config import ProxyConfig, ProxyLimits  # noqa: E402
from tests.nginx_harness import (  # noqa: E402
    CLIENT_KEYS,
    UPSTREAM_KEY,
    free_port,
    make_certificate,
    running_nginx,
    write_conf,
)

BODY = {"stream": True, "messages": [{"role": "user", "content": "17*19"}]}


def first_chunk_s(client: httpx.Client, url: str, key: str) -> float:
    start = time.perf_counter()
    first = None
    with client.stream("POST", url + "/v1/chat/completions", json=BODY,
                       headers={"Authorization": f"Bearer {key}"}) as response:
        for line in response.iter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no SSE chunk")
    return first


def models_s(client: httpx.Client, url: str, key: str) -> float:
    start = time.perf_counter()
    client.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).raise_for_status()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    port = free_port()
    standin = subprocess.Popen([sys.executable, str(ROOT / "checks" / "standin.py"), "--port", str(port),
                                "--api-key-env", "STANDIN_KEY", "--first-token-delay-s", "0.2",
                                "--token-delay-s", "0.01"], env={**os.environ, "STANDIN_KEY": UPSTREAM_KEY})
    try:
        time.sleep(0.5)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            tls = make_certificate(work)
            proxy_port = free_port()
            proxy = ProxyConfig(enabled=True, bind="127.0.0.1", port=proxy_port,
                                limits=ProxyLimits(requests_per_minute_per_key=100000,
                                                   requests_per_minute_per_client=100000))
            conf = write_conf(work, proxy, port, tls)
            direct, proxied = f"http://127.0.0.1:{port}", f"https://localhost:{proxy_port}"
            with running_nginx(conf, proxy_port), httpx.Client(timeout=30) as plain, \
                    httpx.Client(timeout=30, verify=tls_context(tls.pem)) as secure:
                rows = []
                for label, fn in (("first SSE chunk (0.2 s simulated prefill)", first_chunk_s),
                                  ("GET /v1/models", models_s)):
                    d = [fn(plain, direct, UPSTREAM_KEY) for _ in range(args.requests)]
                    p = [fn(secure, proxied, CLIENT_KEYS["team-a"]) for _ in range(args.requests)]
                    rows.append((label, statistics.median(d), statistics.median(p), max(d), max(p)))
        print(f"{args.requests} sequential requests each, keep-alive clients, nginx {nginx_version()}\n")
        print("| request | direct median (ms) | proxy median (ms) | added (ms) | direct max | proxy max |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, dm, pm, dx, px in rows:
            print(f"| {label} | {dm * 1000:.1f} | {pm * 1000:.1f} | {(pm - dm) * 1000:+.1f} | {dx * 1000:.1f} | "
                  f"{px * 1000:.1f} |")
    finally:
        standin.kill()
        standin.wait()
    return 0


def nginx_version() -> str:
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
    return out.stderr.strip().split("/")[-1]


if __name__ == "__main__":
    raise SystemExit(main())
