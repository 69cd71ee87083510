"""Prefill and decode stand-ins that speak vLLM 0.33.0's disaggregated prefill/decode protocol (NixlConnector, pull
mode), for testing the router and checks/pd.py without GPUs, and the lab's engine image when the plan's argv has
`--kv-transfer-config` (tests/lab/lab_engine.py). Built on checks/standin.py's server: after the connector's part of
a request (below), it is answered as that server answers any (the key, DP ranks, reasoning, streaming, faults), so a
tier's own API check passes as on vLLM, whose tiers answer requests without `kv_transfer_params` as any vLLM does.
Standard library only, like checks/standin.py.

    python -m tests.pd_standin --role prefill --port 0 --port-file /tmp/p.port
    python -m tests.pd_standin --role decode --port 0 --port-file /tmp/d.port [--fail-transfers]

What each side does, as vLLM 0.33.0 does it (paths under vllm/ of the wheel):

- Prefill (`kv_role` kv_producer). A chat or completion request whose `kv_transfer_params` has `do_remote_decode:
  true` is prefilled, answered (the router reads only its `kv_transfer_params`) and holds its KV blocks for the
  decode to read. Its response carries, at
  the top level (`entrypoints/openai/chat_completion/protocol.py:159`, set at `chat_completion/serving.py:1151`), the
  `kv_transfer_params` the connector returns when the request finishes
  (`distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py:278-293`): `do_remote_prefill: true`,
  `do_remote_decode: false`, `remote_block_ids`, `remote_engine_id`, `remote_request_id` (the request's id: the
  X-Request-Id header, `entrypoints/serve/engine/serving.py:133-142`, with `chatcmpl-` before it and 8 random
  characters after, `v1/engine/input_processor.py:371`), `remote_host`, `remote_port` (the NIXL side channel,
  `VLLM_NIXL_SIDE_CHANNEL_HOST`/`_PORT`, `nixl/base_scheduler.py:76-80`; the handshake listener binds that host
  and port, `base_scheduler.py:324-357`: here `--side-channel-host`/`--side-channel-port`, apart from the API's
  `--host`, as a prefill whose API listens on loopback behind the router still serves its side channel on the
  cluster's network), `tp_size`, `dcp_size`, `pp_size`,
  `remote_num_tokens`, `remote_blocks_expiry_time`, `remote_registration_generation`, `transfer_mode: "pull"`; and
  `remote_prefill_cached_tokens`, its own prefix-cache hits (`v1/core/sched/scheduler.py:2477-2487`). Here the side
  channel is a second HTTP port: GET /blocks/<remote_request_id> hands the blocks over once, as the real prefill frees
  them once the decode has read them.
- Decode (kv_consumer). A request whose `kv_transfer_params` has `do_remote_prefill: true` and every remote field
  (`nixl/pull_scheduler.py:59-65`, `135-144`) pulls the prompt's KV from the prefill's side channel instead of
  computing it: `vllm:external_prefix_cache_queries` and `vllm:external_prefix_cache_hits` grow by the tokens pulled
  (recorded at admission, `v1/core/sched/scheduler.py:1487-1500`; the counters at `v1/metrics/loggers.py:685-706`),
  `vllm:prompt_tokens_cached_by_source{source="p2p"}` with them (the NIXL connector's `_cache_hit_source = P2P`,
  `nixl/connector.py:81`), and `vllm:nixl_xfer_time_seconds` counts a transfer (`nixl/stats.py:187-195`, observed
  for each finished transfer, `nixl/base_worker.py:3420-3424`). The decode's own prefix cache counts first: tokens
  it has cached are not pulled (`pull_scheduler.py:61-65`: the remote count is the prompt less the local hits, and
  vLLM keeps at least the last token to compute). Without `kv_transfer_params` the decode computes the prompt itself.
- A transfer that fails (`--fail-transfers`, or a prefill that no longer holds the blocks) counts in
  `vllm:nixl_num_failed_transfers` (`nixl/base_worker.py:3474-3490`, `nixl/stats.py:243-252`); then
  `--kv-load-failure-policy` decides, as `kv_transfer_config.kv_load_failure_policy` does (`config/kv_transfer.py:88`,
  default `fail`): `fail` finishes the request with an error (`v1/core/sched/scheduler.py:2557-2566`), which the API
  answers as HTTP 500 `Internal server error` (`entrypoints/generate/base/serving.py:200-206`,
  `entrypoints/serve/exception_handling/error_response.py:60-66`); `recompute` computes the prompt locally
  (`scheduler.py:3688-3701`) and answers normally, the external hit already counted at admission.
- The decode's `usage.prompt_tokens_details.cached_tokens` is the PREFILL's cache hits (`remote_prefill_cached_tokens`,
  `v1/engine/output_processor.py:285-296`, `798-799`), not the tokens received: the usage field proves nothing about
  the transfer, which is why checks/pd.py reads the decode's /metrics. This stand-in's `usage` is checks/standin.py's
  (no `prompt_tokens_details`).
- /metrics carries `engine="0"` labels: the router counts them to learn each worker's DP size
  (vllm-router 0.1.17 `src/routers/http/dp_utils.rs:13-25`, `31-71`).

One character of the prompt is one token; a block is 16 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from typing import Any

try:
    from checks import standin
except ModuleNotFoundError:  # the lab's engine image (tests/lab/engine_image.py): checks/standin.py is /standin.py
    import standin  # type: ignore[no-redef]

BLOCK_SIZE = 16
ARGS: argparse.Namespace
LOCK = threading.Lock()
HELD: dict[str, dict[str, Any]] = {}
"""Prefill: blocks held for a decode to read, by remote_request_id."""
SEEN: dict[str, int] = {}
"""Prompt text -> tokens this instance holds in its prefix cache."""
COUNTERS: dict[str, float] = {
    "external_prefix_cache_queries": 0, "external_prefix_cache_hits": 0, "prefix_cache_queries": 0,
    "prefix_cache_hits": 0, "p2p": 0, "local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0,
    "nixl_xfer_count": 0, "nixl_xfer_sum": 0, "nixl_failed": 0, "requests_ok": 0, "requests_error": 0,
}
LOG: list[dict[str, Any]] = []
"""Every completion request as it arrived: headers that matter and the kv_transfer_params (GET /standin/log)."""
REQUIRED_REMOTE = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
"""The fields without which the decode does not pull (nixl/pull_scheduler.py:136-144)."""


def _prompt(body: dict[str, Any]) -> str:
    """The prompt text: the messages' contents in order, or the completion prompt."""
    if "messages" in body:
        return "\n".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
    return str(body.get("prompt", ""))


def _local_hit(prompt: str) -> int:
    """Tokens of `prompt` this instance's prefix cache already holds: full blocks only, never the last token."""
    if prompt not in SEEN:
        return 0
    return ((len(prompt) - 1) // BLOCK_SIZE) * BLOCK_SIZE


def _pull(params: dict[str, Any]) -> str | None:
    """Read the held blocks from the prefill's side channel; None when done, else why it failed."""
    if ARGS.fail_transfers:
        return "NIXL READ failed (--fail-transfers)"
    host, port = params["remote_host"], params["remote_port"]
    url = f"http://{host}:{port}/blocks/{params['remote_request_id']}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            held = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"side channel {host}:{port}: {exc}"
    if held.get("engine_id") != params["remote_engine_id"]:
        return f"engine {held.get('engine_id')!r} holds it, not {params['remote_engine_id']!r}"
    if held.get("block_ids") != params.get("remote_block_ids"):
        return "block ids differ from the prefill's kv_transfer_params"
    return None


class Handler(standin.Handler):
    """checks/standin.py's vLLM API (key, DP ranks, reasoning, streaming, faults) with the connector's side of each
    request first: the prefill holds the prompt's blocks and adds `kv_transfer_params` to its answer, the decode
    pulls them (or fails as vLLM does) before it answers. A request without `kv_transfer_params` is answered as any
    vLLM answers it: a tier's own API check sends those."""

    kv: dict[str, Any] | None = None

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, _exposition(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/standin/log":
            with LOCK:
                self._send(200, {"requests": LOG})
        elif self.path.startswith("/blocks/") and self.server.server_port == SIDE_PORT[0]:
            with LOCK:
                held = HELD.pop(self.path.removeprefix("/blocks/"), None)
            self._send(200 if held else 404, held or {"error": "no such request held (read already, or expired)"})
        else:
            super().do_GET()

    def do_POST(self) -> None:
        if self.path not in standin.COMPLETIONS:
            super().do_POST()
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if not self._authorized():
            self._send(401, {"error": "Unauthorized"})
            return
        params = body.get("kv_transfer_params")
        with LOCK:
            LOG.append({"path": self.path, "x_request_id": self.headers.get("X-Request-Id"),
                        "authorization": bool(self.headers.get("Authorization")), "max_tokens": body.get("max_tokens"),
                        "stream": body.get("stream"), "kv_transfer_params": params})
        prompt = _prompt(body)
        params = params if isinstance(params, dict) else None
        self.kv = None
        if ARGS.role == "prefill":
            self.kv = self._prefill(prompt, params)
        elif not self._decode(prompt, params):
            return
        with LOCK:
            COUNTERS["requests_ok"] += 1
        self._complete(body)

    def _response_fields(self) -> dict[str, Any]:
        """vLLM's answers carry `kv_transfer_params` at the top level (chat_completion/protocol.py:159)."""
        return {"kv_transfer_params": self.kv}

    def _prefill(self, prompt: str, params: dict[str, Any] | None) -> dict[str, Any] | None:
        """Count the prompt, and hold its blocks for a decode when asked to (`do_remote_decode`): the parameters
        that tell the decode where they are."""
        cached = _local_hit(prompt)
        with LOCK:
            SEEN[prompt] = len(prompt)
            COUNTERS["prefix_cache_queries"] += len(prompt)
            COUNTERS["prefix_cache_hits"] += cached
            COUNTERS["local_cache_hit"] += cached
            COUNTERS["local_compute"] += len(prompt) - cached
        if not (params and params.get("do_remote_decode")) or ARGS.no_connector:
            return None
        request_id = f"chatcmpl-{self.headers.get('X-Request-Id') or secrets.token_hex(16)}-{secrets.token_hex(4)}"
        blocks = [list(range(math.ceil(len(prompt) / BLOCK_SIZE)))]
        with LOCK:
            HELD[request_id] = {"engine_id": ARGS.engine_id, "block_ids": blocks}
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": blocks,
                "remote_engine_id": ARGS.engine_id, "remote_request_id": request_id,
                "remote_host": ARGS.side_channel_host or ARGS.host, "remote_port": SIDE_PORT[0], "tp_size": 1,
                "dcp_size": 1, "pp_size": 1, "remote_num_tokens": len(prompt), "remote_blocks_expiry_time": None,
                "remote_registration_generation": 0, "transfer_mode": "pull", "remote_prefill_cached_tokens": cached}

    def _decode(self, prompt: str, params: dict[str, Any] | None) -> bool:
        """Pull the prompt's blocks the prefill holds, counting as vLLM does; False when the transfer failed under
        `--kv-load-failure-policy fail` (the request has been answered with vLLM's error)."""
        local = _local_hit(prompt)
        remote = bool(params and params.get("do_remote_prefill") and params.get("remote_block_ids")
                      and all(params.get(k) is not None for k in REQUIRED_REMOTE)) and not ARGS.no_connector
        pulled = len(prompt) - local if remote else 0
        failure = None
        if pulled > 0 and params is not None:
            with LOCK:  # counted at admission, before the transfer (scheduler.py:1487-1500)
                COUNTERS["external_prefix_cache_queries"] += pulled
                COUNTERS["external_prefix_cache_hits"] += pulled
                COUNTERS["p2p"] += pulled
            started = time.monotonic()
            failure = _pull(params)
            with LOCK:
                if failure is None:
                    COUNTERS["nixl_xfer_count"] += 1
                    COUNTERS["nixl_xfer_sum"] += time.monotonic() - started
                else:
                    COUNTERS["nixl_failed"] += 1
        with LOCK:
            COUNTERS["prefix_cache_queries"] += len(prompt)
            COUNTERS["prefix_cache_hits"] += local
            COUNTERS["local_cache_hit"] += local
            if failure is None:
                COUNTERS["external_kv_transfer"] += pulled
                COUNTERS["local_compute"] += len(prompt) - local - pulled
            else:
                COUNTERS["local_compute"] += len(prompt) - local
        if failure is not None and ARGS.kv_load_failure_policy == "fail":
            with LOCK:
                COUNTERS["requests_error"] += 1
            print(f"KV load failed for {params and params.get('remote_request_id')}: {failure}", file=sys.stderr,
                  flush=True)
            self._send(500, standin._error("Internal server error", "InternalServerError", 500))
            return False
        with LOCK:
            SEEN[prompt] = len(prompt)
        return True


SIDE_PORT = [0]


def _exposition() -> str:
    """The decode-relevant counters as vLLM 0.33.0's /metrics names them (prometheus_client adds `_total`)."""
    labels = f'engine="0",model_name="{ARGS.served_name}"'
    with LOCK:
        c = dict(COUNTERS)
    lines = []
    for name in ("prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_queries",
                 "external_prefix_cache_hits"):
        lines += [f"# TYPE vllm:{name}_total counter", f"vllm:{name}_total{{{labels}}} {float(c[name])}"]
    lines.append("# TYPE vllm:prompt_tokens_cached_by_source_total counter")
    for source in ("device", "host", "p2p", "disk", "external_unspecified"):
        value = c["p2p"] if source == "p2p" else c["prefix_cache_hits"] if source == "device" else 0.0
        lines.append(f'vllm:prompt_tokens_cached_by_source_total{{{labels},source="{source}"}} {float(value)}')
    lines.append("# TYPE vllm:prompt_tokens_by_source_total counter")
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        lines.append(f'vllm:prompt_tokens_by_source_total{{{labels},source="{source}"}} {float(c[source])}')
    lines.append("# TYPE vllm:request_success_total counter")
    lines.append(f'vllm:request_success_total{{{labels},finished_reason="stop"}} {float(c["requests_ok"])}')
    if not ARGS.no_connector:  # the NIXL connector's own metrics exist only with it (nixl/stats.py:162)
        lines += ["# TYPE vllm:nixl_xfer_time_seconds histogram",
                  f'vllm:nixl_xfer_time_seconds_bucket{{{labels},le="+Inf"}} {float(c["nixl_xfer_count"])}',
                  f"vllm:nixl_xfer_time_seconds_count{{{labels}}} {float(c['nixl_xfer_count'])}",
                  f"vllm:nixl_xfer_time_seconds_sum{{{labels}}} {c['nixl_xfer_sum']}",
                  "# TYPE vllm:nixl_num_failed_transfers_total counter",
                  f"vllm:nixl_num_failed_transfers_total{{{labels}}} {float(c['nixl_failed'])}"]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    """checks/standin.py's options (the answer, the key, DP ranks, reasoning, faults) and the connector's."""
    p = standin._parser()
    p.prog, p.description = "python -m tests.pd_standin", __doc__
    p.set_defaults(port=0)
    p.add_argument("--role", required=True, choices=("prefill", "decode"))
    p.add_argument("--side-channel-host", default="",
                   help="prefill: where the NIXL side channel listens, the host its kv_transfer_params name "
                        "(VLLM_NIXL_SIDE_CHANNEL_HOST) [--host]")
    p.add_argument("--side-channel-port", type=int, default=0,
                   help="prefill: the NIXL side-channel port its kv_transfer_params name, 0 for any free one")
    p.add_argument("--port-file", default="", help="write 'API_PORT SIDE_PORT' here once listening")
    p.add_argument("--engine-id", default="", help="this instance's NIXL engine id [a random one]")
    p.add_argument("--fail-transfers", action="store_true", help="decode: every KV pull fails (NIXL READ error)")
    p.add_argument("--kv-load-failure-policy", default="fail", choices=("fail", "recompute"),
                   help="decode: what a failed pull does, as vLLM's kv_transfer_config option [fail]")
    p.add_argument("--no-connector", action="store_true",
                   help="started without --kv-transfer-config: no kv_transfer_params, no pull, no nixl metrics")
    return p


def main(argv: list[str] | None = None) -> int:
    global ARGS
    parser = _parser()
    ARGS = standin.ARGS = parser.parse_args(argv)
    problem = standin._problem(ARGS)
    if problem:
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    ARGS.engine_id = ARGS.engine_id or secrets.token_hex(8)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    side = ThreadingHTTPServer((ARGS.side_channel_host or ARGS.host, ARGS.side_channel_port), Handler)
    SIDE_PORT[0] = side.server_port
    threading.Thread(target=side.serve_forever, daemon=True).start()
    standin.STARTED = time.monotonic()
    if ARGS.port_file:
        with open(ARGS.port_file + ".tmp", "w") as handle:
            handle.write(f"{server.server_port} {side.server_port}\n")
        os.replace(ARGS.port_file + ".tmp", ARGS.port_file)
    print(f"{ARGS.role} stand-in {ARGS.engine_id} on http://{ARGS.host}:{server.server_port} (side channel "
          f"{ARGS.side_channel_host or ARGS.host}:{side.server_port})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
