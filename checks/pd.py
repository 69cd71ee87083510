"""Disaggregated prefill/decode check: the golden prompt through the router, and every prefill instance with every
decode instance, each with evidence from the decode that the prompt's KV cache arrived from the prefill.

    python -m checks.pd --router-url http://10.0.0.1:8090 --prefill-urls http://10.0.0.2:8000,http://10.0.0.3:8000 \\
        --decode-urls http://10.0.0.4:8000 --served-name DeepSeek-V4.1-Flash

Exit 0 PASS, 1 FAIL (with the evidence), 2 a bad argument (naming the flag) or nothing could be checked.

The protocol is vLLM 0.33.0's NixlConnector in pull mode, spoken as vllm-router 0.1.17 speaks it
(`src/routers/http/vllm_pd_router.rs` of its sdist): the prefill gets the request with `max_tokens: 1`,
`min_tokens: 1`, `stream: false` (`prepare_prefill_request`, 834-863) and `kv_transfer_params` {`do_remote_decode`:
true, `do_remote_prefill`: false, remote fields null} (511-517), with the header `X-Request-Id:
___prefill_addr_<host:port>___decode_addr_<host:port>_<uuid>` (748-755, 1760-1769); its answer's
`kv_transfer_params` (vLLM: `nixl/pull_scheduler.py:278-293`) go unchanged into the decode's request, which is the
client's own request (586-592, 1864-1884), with the same X-Request-Id.

Pairs: the router offers no way to choose a pair (its policies pick each side on their own; round robin covers every
pair only when the two counts share no factor), so `pairs` calls each prefill and then each decode directly, exactly
as the router would. `router` sends the golden prompt through the router itself and, with `--router-metrics-url`,
learns from `vllm_router_pd_decode_requests_total{worker}` which decode served it.

Evidence that KV moved is read from the decode's /metrics before and after each request, because nothing in the
answer shows it: `usage.prompt_tokens_details.cached_tokens` on a decode is the PREFILL's own prefix-cache hits
(vLLM 0.33.0 `v1/core/sched/scheduler.py:2477-2487`, `v1/engine/output_processor.py:285-296`), and the router
rewrites it from the prefill's answer anyway (vllm-router `src/routers/http/pd_cached_tokens.rs:47-93`). A request
passes when on its decode `vllm:external_prefix_cache_hits` grew (tokens admitted from the KV connector,
`v1/metrics/loggers.py:697-706`, `v1/core/sched/scheduler.py:1487-1500`), a transfer finished
(`vllm:nixl_xfer_time_seconds` count, `nixl/stats.py:187-195`) and none failed (`vllm:nixl_num_failed_transfers`,
`nixl/stats.py:243-252`). The hits are counted at admission, before the transfer: with `kv_load_failure_policy:
recompute` a failed transfer still answers, recomputed (`scheduler.py:3688-3701`), so the failure counter is what
tells a recompute from a transfer; with the default `fail` the decode answers HTTP 500 (`scheduler.py:2557-2566`).
Each request starts with a system message holding a fresh nonce: a decode that has the prompt in its own prefix
cache pulls only the blocks it lacks (`nixl/pull_scheduler.py:59-65`), and a repeated golden prompt would leave one
block to show.

Counters are cluster-wide per decode: another client's traffic on the same decode during the check can add to them
(run it before the front door takes traffic, as the deploy does). Only pull mode is checked: a prefill answering
`transfer_mode: push` makes the router dispatch both sides at once (vllm_pd_router.rs 2212-2270), and the pair
section says so instead of guessing.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from checks.verdict import (
    THINKING_KWARGS,
    CheckParser,
    Section,
    Verdict,
    check_name,
    combine,
    emit,
    env_name,
    listed,
    mask_credentials,
    missing_extra,
    seconds,
    served_name,
    shown,
    url_port,
)

try:
    import httpx
except ModuleNotFoundError as _missing:  # run without its [checks] extra: say so, no traceback (an import fails)
    missing_extra(_missing, __name__, __spec__.name if __spec__ else "checks")
from pydantic import ValidationError

from stacks.model.golden import DEFAULT_EXPECT, DEFAULT_PROMPT, Golden, GoldenPair, compile_expect

SECTION_NAMES = ("router", "pairs")
HITS = "vllm:external_prefix_cache_hits_total"
XFERS = "vllm:nixl_xfer_time_seconds_count"
FAILED = "vllm:nixl_num_failed_transfers_total"
ROUTER_DECODES = "vllm_router_pd_decode_requests_total"
ROUTER_PREFILLS = "vllm_router_pd_prefill_requests_total"
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""What the router puts in the prefill request for NIXL (vllm_pd_router.rs:511-517)."""
REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port", "remote_block_ids")
"""What the decode needs from the prefill's answer to pull (vLLM nixl/pull_scheduler.py:59-65, 135-144)."""
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
MAX_INSTANCES = 64


class ConfigProblem(Exception):
    """A bad argument: exit 2 naming the flag, the value and what works."""


@dataclass(frozen=True)
class Counters:
    """The three decode counters a request is judged by; None where the exposition lacks the metric."""

    hits: float | None
    xfers: float | None
    failed: float | None


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text: each metric name's samples summed over their labels (engines, models)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return sums


def labelled(text: str, name: str) -> dict[str, float]:
    """`name`'s samples by their `worker` label (the router's per-worker counters)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            worker = re.search(r'worker="([^"]*)"', match.group(2) or "")
            if worker:
                found[worker.group(1)] = found.get(worker.group(1), 0.0) + float(match.group(3))
    return found


class Client:
    """HTTP to the router and the instances, the bearer key on /v1 requests."""

    def __init__(self, key: str | None, timeout_s: float) -> None:
        self.key = key
        self.http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10))

    def metrics(self, base: str) -> str:
        response = self.http.get(base + "/metrics")
        response.raise_for_status()
        return response.text

    def counters(self, base: str) -> Counters:
        sums = parse_exposition(self.metrics(base))
        return Counters(sums.get(HITS), sums.get(XFERS), sums.get(FAILED))

    def post(self, url: str, body: dict[str, Any], request_id: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        if request_id:
            headers["X-Request-Id"] = request_id
        return self.http.post(url, json=body, headers=headers)


def golden_body(served: str, golden: Golden, nonce: str, thinking_kwarg: str = "thinking") -> dict[str, Any]:
    """The client's request: the golden prompt after a system message with a fresh nonce, so that no decode has
    its blocks cached already; greedy, reasoning turned off with the model's own key, as checks/api.py's golden
    chat does: a model that reasons unless told not to (Qwen3's `enable_thinking`) would spend the 64 tokens on its
    reasoning and answer nothing; one that always reasons (`reasoning_effort`, gpt-oss) gets room for it."""
    body: dict[str, Any] = {"model": served, "temperature": 0, "max_tokens": 64, "stream": False,
                            "messages": [{"role": "system", "content": f"pd-check {nonce}"},
                                         {"role": "user", "content": golden.prompt}]}
    if thinking_kwarg == "reasoning_effort":
        body |= {"reasoning_effort": "low", "max_tokens": 2048}
    else:
        body["chat_template_kwargs"] = {thinking_kwarg: False}
    return body


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill's request, as the router builds it (vllm_pd_router.rs:834-863, 1709-1723)."""
    request = dict(body, max_tokens=1, min_tokens=1, stream=False, kv_transfer_params=dict(PREFILL_PARAMS))
    request.pop("stream_options", None)
    return request


def request_id(prefill: str, decode: str) -> str:
    """The router's X-Request-Id for a pair (vllm_pd_router.rs:748-755; addresses without the scheme, 757-770)."""
    def bare(url: str) -> str:
        return url.split("://", 1)[-1]
    return f"___prefill_addr_{bare(prefill)}___decode_addr_{bare(decode)}_{uuid.uuid4().hex}"


def _answer(response: httpx.Response) -> tuple[str | None, str]:
    """(answer, '') of a chat completion, or (None, why not)."""
    if response.status_code != 200:
        try:
            error = response.json().get("error")
        except ValueError:
            error = None
        message = error.get("message") if isinstance(error, dict) else response.text[:200]
        return None, f"HTTP {response.status_code} {str(message)[:200]!r}"
    try:
        return str(response.json()["choices"][0]["message"].get("content") or "").strip(), ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None, f"HTTP 200 without a chat completion: {response.text[:160]!r}"


def kv_verdict(label: str, before: Counters, after: Counters) -> tuple[bool, str]:
    """Pass only when, between `before` and `after` on one decode, KV was admitted from the connector, a transfer
    finished and none failed."""
    if before.hits is None:
        return False, (f"{label}: the decode's /metrics has no {HITS}: it runs without a KV connector "
                       "(--kv-transfer-config) or with --disable-log-stats, so nothing shows KV arriving")
    if before.failed is None or before.xfers is None:
        return False, (f"{label}: the decode's /metrics has no vllm:nixl_* metrics: its KV connector is not "
                       "NixlConnector (kv_transfer_config.kv_connector), which this check reads")
    hits = (after.hits or 0) - before.hits
    xfers = (after.xfers or 0) - before.xfers
    failed = (after.failed or 0) - before.failed
    numbers = f"external_prefix_cache_hits +{hits:g}, nixl transfers +{xfers:g}, failed +{failed:g}"
    if failed > 0:
        return False, (f"{label}: a KV transfer FAILED ({numbers}); the decode recomputed the prompt "
                       "(kv_load_failure_policy: recompute) or failed the request (fail)")
    if hits <= 0:
        return False, f"{label}: no KV arrived ({numbers}): the decode computed the prompt itself"
    if xfers <= 0:
        return False, f"{label}: KV admitted but no transfer finished ({numbers})"
    return True, f"{label}: KV received ({numbers})"


def _settled(before: Counters, now: Counters) -> bool:
    """A transfer's outcome shows: one failed, or KV was admitted and a transfer finished."""
    return (now.failed or 0) > (before.failed or 0) or (
        (now.xfers or 0) > (before.xfers or 0) and (now.hits or 0) > (before.hits or 0))


def settle(client: Client, before: dict[str, Counters], wait_s: float) -> dict[str, Counters]:
    """The decodes' counters once one of them shows a transfer's outcome, or at the deadline: vLLM publishes its
    counters a scheduler step after the request, so a finished answer may come before its numbers."""
    deadline = time.monotonic() + wait_s
    while True:
        now = {d: client.counters(d) for d in before}
        if any(_settled(before[d], now[d]) for d in before) or time.monotonic() >= deadline:
            return now
        time.sleep(0.2)


def check_pair(client: Client, prefill: str, decode: str, served: str, golden: Golden, wait_s: float,
               thinking_kwarg: str = "thinking") -> tuple[bool | None, str]:
    """Prefill then decode, directly, as the router does; (ok, evidence); ok None when the pair cannot be checked."""
    label = f"{prefill} -> {decode}"
    body = golden_body(served, golden, secrets.token_hex(8), thinking_kwarg)
    rid = request_id(prefill, decode)
    response = client.post(prefill + "/v1/chat/completions", prefill_body(body), rid)
    if response.status_code != 200:
        return False, f"{label}: prefill {_answer(response)[1]}"
    try:
        params = response.json().get("kv_transfer_params")
    except (ValueError, AttributeError):
        params = None
    if not isinstance(params, dict):
        return False, (f"{label}: the prefill answered without kv_transfer_params: it runs without a KV connector "
                       "(--kv-transfer-config with kv_role kv_producer)")
    if params.get("transfer_mode") == "push":
        return None, f"{label}: the prefill runs NIXL push mode, which this check does not pin"
    missing = [f for f in REMOTE_FIELDS if params.get(f) is None]
    if missing:
        return False, f"{label}: the prefill's kv_transfer_params lack {', '.join(missing)}"
    before = client.counters(decode)
    answer, why = _answer(client.post(decode + "/v1/chat/completions", dict(body, kv_transfer_params=params), rid))
    after = settle(client, {decode: before}, wait_s)[decode]
    ok, evidence = kv_verdict(label, before, after)
    if answer is None:  # with kv_load_failure_policy: fail, a failed load is an HTTP 500 (scheduler.py:2557-2566)
        return False, f"{label}: decode {why}; {evidence.removeprefix(label + ': ')}"
    if not golden.matches(answer):
        return False, f"{label}: answered {answer[:80]!r}, expected {golden.expect!r}"
    return ok, f"{evidence}; answer {answer[:40]!r}"


def check_router(client: Client, router: str, router_metrics: str, decodes: list[str], served: str,
                 golden: Golden, wait_s: float, thinking_kwarg: str = "thinking") -> Section:
    """The golden prompt through the router, with the KV evidence from the decode it chose (or from every decode
    when the router's metrics are not given): an HTTP error is judged with the decodes' counters too, so a failed
    transfer is named as one."""
    before_router = labelled(client.metrics(router_metrics), ROUTER_DECODES) if router_metrics else {}
    before = {d: client.counters(d) for d in decodes}
    answer, why = _answer(client.post(router + "/v1/chat/completions",
                                      golden_body(served, golden, secrets.token_hex(8), thinking_kwarg)))
    chosen = decodes
    if router_metrics:
        after_router = labelled(client.metrics(router_metrics), ROUTER_DECODES)
        grew = [w for w, v in after_router.items() if v > before_router.get(w, 0.0)]
        chosen = [d for d in decodes if any(w.split("@")[0].rstrip("/") == d for w in grew)]
        if not chosen:
            return Section("router", False, [f"the router answered {answer!r}{why}; its {ROUTER_DECODES} grew for "
                                             f"{grew or 'no worker'}, none of --decode-urls"],
                           "--decode-urls must list the router's --decode instances")
    after = settle(client, {d: before[d] for d in chosen}, wait_s)
    results = [kv_verdict(f"via router, decode {d}", before[d], after[d]) for d in chosen]
    received = [text for ok, text in results if ok]
    failed = [text for ok, text in results if not ok and "FAILED" in text]
    step = "the decode must receive the prefill's KV: the pairs section finds the pair (docs/disaggregation.md)"
    if answer is None:
        return Section("router", False, [f"the router answered {why}", *failed], step)
    if not golden.matches(answer):
        return Section("router", False, [f"the router answered {answer[:80]!r}, expected {golden.expect!r}"])
    if received and not failed:
        return Section("router", True, [f"answer {answer!r}", *received])
    return Section("router", False, [f"answer {answer!r}", *(failed or [text for _, text in results])], step)


def wait_ready(router: str, deadline_s: float, every_s: float = 2.0) -> bool:
    """Poll the router's /health until it answers 200 (it serves once every instance answers its own) or the
    deadline passes; printing progress every minute, for a long wait over SSH."""
    deadline = time.monotonic() + deadline_s
    said = time.monotonic()
    while True:
        try:
            if httpx.get(router + "/health", timeout=5.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        if time.monotonic() - said >= 60:
            print(f"waiting for the router at {router} ({deadline - time.monotonic():.0f}s left)", file=sys.stderr)
            said = time.monotonic()
        time.sleep(every_s)


def check_pairs(client: Client, prefills: list[str], decodes: list[str], served: str, golden: Golden,
                wait_s: float, thinking_kwarg: str = "thinking") -> Section:
    outcomes = [check_pair(client, p, d, served, golden, wait_s, thinking_kwarg) for p in prefills for d in decodes]
    bad = [text for ok, text in outcomes if ok is False]
    skipped = [text for ok, text in outcomes if ok is None]
    good = [text for ok, text in outcomes if ok]
    total = len(outcomes)
    if bad:
        return Section("pairs", False, [f"{len(bad)} of {total} pair(s) failed", *bad],
                       "a failing pair names its prefill and decode: their logs show the NIXL handshake or read "
                       "error (side channel VLLM_NIXL_SIDE_CHANNEL_HOST/PORT reachable from the decode?)")
    if skipped:
        return Section("pairs", None, [*skipped, *good])
    return Section("pairs", True, [f"all {total} pair(s) moved KV", *good])


def _base_url(flag: str, url: str) -> str:
    """scheme://host:port only: the check adds the paths."""
    try:
        parts = httpx.URL(url)
        url_port(url, parts.port)
    except (httpx.InvalidURL, TypeError, ValueError, argparse.ArgumentTypeError):
        raise ConfigProblem(f"{flag} {shown(url)}: not a URL; e.g. http://10.0.0.2:8000") from None
    if parts.scheme not in ("http", "https") or not parts.host or parts.userinfo or parts.query or parts.fragment \
            or parts.path not in ("", "/") or re.search(r"[?#@\s]", url):
        raise ConfigProblem(f"{flag} {shown(url)}: only http(s)://host:port, no credentials, path or query; "
                            "e.g. http://10.0.0.2:8000")
    host = f"[{parts.host}]" if ":" in parts.host else parts.host
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def _urls(flag: str, value: list[str]) -> list[str]:
    urls = [_base_url(flag, u) for u in value]
    if len(urls) > MAX_INSTANCES:
        raise ConfigProblem(f"{flag}: {len(urls)} URLs; at most {MAX_INSTANCES}")
    if len(set(urls)) != len(urls):
        raise ConfigProblem(f"{flag}: names an instance twice")
    return urls


def _golden(prompt: str | None, expect: str | None) -> Golden:
    pattern = DEFAULT_EXPECT if expect is None else expect
    text = DEFAULT_PROMPT if prompt is None else prompt
    try:
        compiled = compile_expect(pattern)
    except ValueError as exc:
        raise ConfigProblem(f"--expect {pattern[:40]!r}: {exc}") from None
    try:
        GoldenPair(prompt=text, expect=pattern)
    except ValidationError as exc:
        reason = str(exc.errors()[0].get("msg", "invalid")).removeprefix("Value error, ")
        raise ConfigProblem(f"--prompt {text[:40]!r}: {reason}; a question with one short, certain answer") from None
    return Golden(text, pattern, compiled)


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="pd", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--name", default="pd", type=check_name)
    p.add_argument("--router-url", default="", help="the router's address, e.g. http://10.0.0.1:8090")
    p.add_argument("--router-metrics-url", default="",
                   help="the router's Prometheus address (--prometheus-host/--prometheus-port), to learn which "
                        "decode served the router's request")
    p.add_argument("--prefill-urls", default=[], type=listed(str), help="comma list of prefill API servers")
    p.add_argument("--decode-urls", default=[], type=listed(str), help="comma list of decode API servers")
    p.add_argument("--served-name", required=True, type=served_name)
    p.add_argument("--sections", default="router,pairs", type=listed(str, SECTION_NAMES))
    p.add_argument("--api-key-env", default="VLLM_API_KEY", type=env_name,
                   help="env var holding the instances' bearer key (if any)")
    p.add_argument("--prompt", default=None, help=f"the golden prompt (default {DEFAULT_PROMPT!r})")
    p.add_argument("--expect", default=None, help=f"its expected answer, a pattern (default {DEFAULT_EXPECT!r})")
    p.add_argument("--timeout-s", type=seconds(3_600), default=300.0, help="one request's limit")
    p.add_argument("--metrics-wait-s", type=seconds(600), default=10.0,
                   help="how long a decode's counters may take to show a finished request's transfer")
    p.add_argument("--ready-wait-s", type=seconds(7 * 86_400), default=0.0,
                   help="first wait this long at most for the router's /health to answer 200 (it answers once "
                        "every instance does); 0: do not wait")
    p.add_argument("--thinking-kwarg", default="thinking", choices=THINKING_KWARGS,
                   help="how a request turns the model's reasoning off, as checks/api.py's --thinking-kwarg: "
                        "chat_template_kwargs thinking (DeepSeek), enable_thinking (Qwen3), or a low reasoning "
                        "effort (gpt-oss) [thinking]")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        golden = _golden(args.prompt, args.expect)
        prefills = _urls("--prefill-urls", args.prefill_urls)
        decodes = _urls("--decode-urls", args.decode_urls)
        router = _base_url("--router-url", args.router_url) if args.router_url else ""
        router_metrics = _base_url("--router-metrics-url", args.router_metrics_url) if args.router_metrics_url \
            else ""
        if not args.sections:
            raise ConfigProblem("--sections '': no section to run; a verdict over nothing would read as a pass")
        if not decodes:
            raise ConfigProblem("--decode-urls: empty; every section reads the decodes' /metrics, e.g. "
                                "--decode-urls http://10.0.0.4:8000")
        if "router" in args.sections and not router:
            raise ConfigProblem("--router-url: needed by the router section; give it, or --sections pairs")
        if "pairs" in args.sections and not prefills:
            raise ConfigProblem("--prefill-urls: empty; the pairs section calls each prefill, e.g. "
                                "--prefill-urls http://10.0.0.2:8000")
    except ConfigProblem as exc:
        if args.json:
            print(mask_credentials(f"{args.name}: bad argument: {exc}"), file=sys.stderr)
        return emit(Verdict(args.name, "cannot-run", f"bad argument: {exc}", next_step="pd --help"), args.json)
    client = Client(os.environ.get(args.api_key_env) or None, args.timeout_s)
    kwarg = args.thinking_kwarg
    runners = {"router": lambda: check_router(client, router, router_metrics, decodes, args.served_name, golden,
                                              args.metrics_wait_s, kwarg),
               "pairs": lambda: check_pairs(client, prefills, decodes, args.served_name, golden, args.metrics_wait_s,
                                            kwarg)}
    sections = []
    if router and args.ready_wait_s and not wait_ready(router, args.ready_wait_s):
        return emit(Verdict(args.name, "fail", f"the router at {router} did not answer /health within "
                            f"{args.ready_wait_s:.0f}s", next_step="docker logs of the router container: it "
                            "waits for every prefill and decode instance's /health first"), args.json)
    for name in args.sections:
        try:
            sections.append(runners[name]())
        except httpx.HTTPError as exc:
            sections.append(Section(name, False, [f"{type(exc).__name__}: {exc}"[:200]],
                                    "is every instance up and reachable from here?"))
    return emit(combine(args.name, sections), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
