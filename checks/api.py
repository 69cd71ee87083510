"""API verification from where `pulumi up` runs: health, models, chat, thinking, streaming, auth, deny.

With `--dp-size N` the chat, thinking and stream sections run once per data-parallel rank: each request
carries `X-data-parallel-rank: r` (`r - --first-rank` against one node's API server with hybrid load
balancing), which vLLM 0.33.0 reads in `_get_data_parallel_rank`
(`vllm/entrypoints/generate/base/serving.py`) and passes to the engine client, which sends the request to
engine r instead of the least loaded one (`vllm/v1/engine/core_client.py`, `get_core_engine_for_request`).
A rank outside [0, N) is refused with HTTP 400 `data_parallel_rank R is out of range [0, N).`
(`vllm/v1/engine/input_processor.py`); with streaming that arrives as an error event inside a 200 stream.
A header that is not an integer is ignored by vLLM (the request is load balanced), so only integers are sent.
With `VLLM_USE_RUST_FRONTEND=1` (prod) HTTP is served by the compiled `vllm/vllm-rs` instead; its strings hold
the same header name (next to `X-Request-Id`) and an `InvalidDataParallelRank {connected_ranks}` error, but its
source is not in the wheel, so its out-of-range status is not known here: any non-200 fails with its message.

`--watch` probes the golden set on every rank forever and prints one line per transition (a rank going down
or coming back), never one per probe; it exits non-zero only for configuration errors.

The bearer key is read from the environment variable named by --api-key-env, never from argv; the
certificate to trust (the proxy's) from --ca-env or --ca-file: with one, it is the only certificate trusted.
Only connection-level failures (and 429s) are retried; a wrong answer or an HTTP error fails at once, with the
answer shown.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Protocol

from checks.verdict import (
    THINKING_KWARGS,
    ArgumentProblem,
    CheckParser,
    Section,
    Verdict,
    check_name,
    combine,
    emit,
    env_name,
    integer,
    listed,
    mask_credentials,
    missing_extra,
    node_names,
    optional_path,
    seconds,
    served_name,
    shown,
    url_path,
    url_port,
)

try:
    import httpx
except ModuleNotFoundError as _missing:  # run without its [checks] extra: say so, no traceback (an import fails)
    missing_extra(_missing, __name__, __spec__.name if __spec__ else "checks")
from pydantic import ValidationError

from stacks.model.golden import DEFAULT_EXPECT, DEFAULT_PROMPT, Golden, GoldenPair, compile_expect, parse_golden

RETRYABLE = (httpx.TransportError,)
RANK_HEADER = "X-data-parallel-rank"
SECTION_NAMES = ("health", "models", "chat", "thinking", "stream", "auth", "deny")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
UNKNOWN_PATH = "/v1/no-such-endpoint"


PEM_END = "-----END CERTIFICATE-----"


def tls_context(ca_pem: str | None) -> ssl.SSLContext:
    """With the stack's certificate: trust that certificate and nothing else (no system CA, no CA of its chain),
    so the bearer key reaches only the holder of its private key (`tls_private_key`), never another server a
    public or private CA vouches for under the same name. The first certificate of the PEM is the stack's own
    (the chain after it only helps a client build a path); `VERIFY_X509_PARTIAL_CHAIN` lets it anchor the
    verification itself. Names are still checked. Without one: the system's trust, for other endpoints."""
    if not ca_pem:
        return ssl.create_default_context()
    leaf = ca_pem.split(PEM_END, 1)[0].strip()
    if "-----BEGIN CERTIFICATE-----" not in leaf:
        raise ValueError("the stack's certificate is not a PEM certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    context.load_verify_locations(cadata=f"{leaf}\n{PEM_END}\n")
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


class Api:
    def __init__(self, url: str, key: str | None, timeout_s: float, ca_pem: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.thinking_kwarg = "thinking"
        """The request key that turns reasoning on and off (--thinking-kwarg)."""
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10), verify=tls_context(ca_pem))

    def headers(self, with_key: bool = True, rank: int | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.key}"} if (self.key and with_key) else {}
        if rank is not None:
            headers[RANK_HEADER] = str(rank)
        return headers

    def request(self, method: str, path: str, retries: int = 3, **kwargs: Any) -> httpx.Response:
        for attempt in range(retries):
            try:
                response = self.client.request(method, self.url + path, **kwargs)
                if response.status_code == 429 and attempt < retries - 1:  # the proxy's limits: wait, retry
                    time.sleep(_retry_after(response.headers.get("Retry-After")))
                    continue
                return response
            except RETRYABLE:
                if attempt == retries - 1:
                    raise
                time.sleep(2 * (attempt + 1))
        raise AssertionError("unreachable")


def _retry_after(value: str | None) -> float:
    """Seconds to wait on a 429: the header's delay-seconds, 1 s when absent or an HTTP date, never over 30 s."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), 30.0) if seconds == seconds else 1.0


@dataclass(frozen=True)
class Target:
    """Where a request goes: a DP rank (the header) and the node it runs on, or None for the balanced path."""

    rank: int | None
    node: str | None = None
    first: int = 0
    """`--first-rank`: with hybrid load balancing a node's API server numbers its own ranks from 0, so rank r is
    sent as header r - first (vLLM's range there is [0, local ranks): vllm/v1/engine/input_processor.py:392-400)."""

    @property
    def header(self) -> int | None:
        """What `X-data-parallel-rank` carries for this target."""
        return None if self.rank is None else self.rank - self.first

    @property
    def label(self) -> str:
        if self.rank is None:
            return "the endpoint"
        return f"rank {self.rank}" + (f" ({self.node})" if self.node else "")


@dataclass
class Probe:
    """One request to one target: what came back, how fast, how many tokens."""

    section: str
    rank: int | None
    node: str | None
    prompt: str
    ok: bool
    answer: str = ""
    latency_s: float = 0.0
    tokens: int | None = None
    error: str = ""
    reasoning_chars: int = 0
    first_chunk_s: float | None = None


def wait_health(api: Api, deadline_s: float, interval_s: float, name: str,
                clock: Callable[[], float] = time.monotonic) -> Section:
    """Poll /health until 200; connection refused means weights are still loading."""
    start = clock()
    last_print = start
    phase, last_error = "connecting", ""
    polls = 0
    while True:
        polls += 1
        try:
            response = api.client.get(api.url + "/health", headers=api.headers())
            if response.status_code == 200:
                return Section("health", True, [f"/health 200 after {clock() - start:.0f}s ({polls} polls)"])
            if response.status_code in (401, 403, 404, 405):  # an answer, not a load: waiting will not fix it
                return Section("health", False, [f"/health HTTP {response.status_code} {response.text[:160]!r} "
                                                 f"after {clock() - start:.0f}s"],
                               "something answers but will not serve /health: the proxy's api.proxy.allowed_paths "
                               "must include /health, and the endpoint must be this stack's (api.public_host, "
                               "serving.port)")
            from_proxy = response.status_code in (502, 504) or '"type":"unavailable"' in response.text
            phase = "loading (proxy up, engine not answering)" if from_proxy else "starting"
            last_error = f"HTTP {response.status_code} {response.text[:120]!r}"
        except httpx.ConnectError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):  # not transient: waiting will not fix a certificate
                return Section("health", False, [f"TLS: {exc}"[:300]],
                               "the API checks trust the stack's tls_certificate: its names (SAN) must cover the "
                               "endpoint's host (api.public_host or api.proxy.server_name)")
            phase, last_error = "loading (port closed)", f"connection refused: {exc}"[:160]
        except httpx.TransportError as exc:
            phase, last_error = "unreachable", f"{type(exc).__name__}: {exc}"[:160]
        elapsed = clock() - start
        if elapsed >= deadline_s:
            return Section("health", False, [f"/health not 200 after {elapsed:.0f}s", f"phase {phase}",
                                             f"last error {last_error}"],
                           "read the head container's log (`docker logs`): OOM, NCCL timeout or a rejected flag; "
                           "raise serving.engine_ready_timeout_s only if weights are still loading")
        if clock() - last_print >= interval_s:
            print(f"[{name}] {elapsed:.0f}s/{deadline_s:.0f}s elapsed, phase: {phase}, last error: {last_error}",
                  flush=True)
            last_print = clock()
        time.sleep(min(interval_s, 5, max(0.05, deadline_s - elapsed)))


def check_models(api: Api, served: str) -> Section:
    response = api.request("GET", "/v1/models", headers=api.headers())
    if response.status_code != 200:
        return Section("models", False, [f"/v1/models HTTP {response.status_code}: {response.text[:200]}"],
                       "check the bearer key (api_key) and the head's API port")
    ids = [m.get("id") for m in response.json().get("data", [])]
    if served not in ids:
        return Section("models", False, [f"/v1/models lists {ids}"], f"model.served_name must be {served!r}")
    return Section("models", True, [f"/v1/models lists {served}"])




def _chat(served: str, prompt: str, thinking: bool, stream: bool = False, kwarg: str = "thinking"
          ) -> dict[str, Any]:
    always = kwarg == "reasoning_effort"  # harmony reasons on every request: room for it in every answer
    body: dict[str, Any] = {"model": served, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                            "max_tokens": 2048 if thinking or always else 64, "stream": stream}
    if always:
        body["reasoning_effort"] = "medium" if thinking else "low"
    else:
        body["chat_template_kwargs"] = {kwarg: thinking}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _error_text(response: httpx.Response) -> str:
    """vLLM's ErrorResponse message when there is one, else the body's start."""
    try:
        error = response.json().get("error")
    except (json.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:300]
    return response.text[:300]


def probe_chat(api: Api, served: str, golden: Golden, target: Target, thinking: bool = False,
               retries: int = 3) -> Probe:
    """One non-streamed chat completion pinned to the target's rank."""
    section = "thinking" if thinking else "chat"
    probe = Probe(section, target.rank, target.node, golden.prompt, False)
    start = time.monotonic()
    try:
        response = api.request("POST", "/v1/chat/completions", retries=retries,
                               json=_chat(served, golden.prompt, thinking, kwarg=api.thinking_kwarg),
                               headers=api.headers(rank=target.header))
    except httpx.HTTPError as exc:  # transport, and a body httpx cannot decode: a failed probe, never a crash
        probe.error = f"{type(exc).__name__}: {exc}"[:200]
        return probe
    probe.latency_s = time.monotonic() - start
    if response.status_code != 200:
        probe.error = f"HTTP {response.status_code}: {_error_text(response)}"
        return probe
    try:
        body = response.json()
        message = body["choices"][0]["message"]
        probe.answer = (message.get("content") or "").strip()
        probe.tokens = (body.get("usage") or {}).get("completion_tokens")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        probe.error = f"HTTP 200 without a chat completion: {response.text[:200]!r}"
        return probe
    if thinking:
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        probe.reasoning_chars = len(reasoning.strip()) if isinstance(reasoning, str) else 0
        if probe.reasoning_chars == 0:
            probe.error = f"no reasoning content; message keys {sorted(message)}"
        elif not probe.answer:
            probe.error = (f"{probe.reasoning_chars} chars of reasoning but no answer (finish_reason "
                           f"{(body['choices'][0] or {}).get('finish_reason')!r})")
        probe.ok = not probe.error and golden.matches(probe.answer)  # thinking on must answer right too
    else:
        probe.ok = golden.matches(probe.answer)
    return probe


def probe_stream(api: Api, served: str, golden: Golden, target: Target) -> Probe:
    """One streamed chat completion: SSE chunks, an answer matching the golden pattern, then [DONE]."""
    probe = Probe("stream", target.rank, target.node, golden.prompt, False)
    chunks, done, text, errors = 0, False, "", []
    body = _chat(served, golden.prompt, False, stream=True, kwarg=api.thinking_kwarg)
    for attempt in range(3):
        start = time.monotonic()
        try:
            with api.client.stream("POST", api.url + "/v1/chat/completions", json=body,
                                   headers=api.headers(rank=target.header)) as response:
                if response.status_code != 200:
                    response.read()
                    probe.error = f"HTTP {response.status_code}: {_error_text(response)}"
                    return probe
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        errors.append(f"not JSON: {data[:80]!r}")
                        continue
                    if not isinstance(event, dict):
                        errors.append(f"not an event object: {data[:80]!r}")
                        continue
                    if "error" in event:  # vLLM reports errors after the 200 as an event in the stream
                        error = event["error"]
                        errors.append(str(error.get("message", error) if isinstance(error, dict) else error)[:200])
                        continue
                    if probe.first_chunk_s is None:
                        probe.first_chunk_s = time.monotonic() - start
                    usage = event.get("usage")
                    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                        probe.tokens = usage["completion_tokens"]
                    choices = event.get("choices")
                    for choice in choices if isinstance(choices, list) else []:  # the usage chunk has none
                        delta = choice.get("delta") if isinstance(choice, dict) else None
                        content = delta.get("content") if isinstance(delta, dict) else None
                        chunks += 1
                        text += content if isinstance(content, str) else ""
            probe.latency_s = time.monotonic() - start
            break
        except RETRYABLE as exc:
            if attempt == 2:
                probe.error = f"{type(exc).__name__}: {exc}"[:200]
                return probe
            time.sleep(2)
        except httpx.HTTPError as exc:  # a body httpx cannot decode: a failed probe, never a crash (watch runs on)
            probe.error = f"{type(exc).__name__}: {exc}"[:200]
            return probe
    probe.answer = text.strip()
    facts = f"{chunks} SSE chunk(s), [DONE] {'seen' if done else 'missing'}"
    if errors:
        probe.error = f"error in the stream: {errors[0]}; {facts}"
    elif chunks == 0 or not done:
        probe.error = facts
    elif not golden.matches(probe.answer):
        probe.error = f"streamed {probe.answer[:40]!r}, expected fullmatch /{golden.expect}/; {facts}"
    probe.ok = not probe.error
    return probe


def _describe(probe: Probe, golden: Golden, several: bool) -> str:
    """One evidence item: `rank 1 (node2) answered '324' for '17*19…' expected /323/`, or the good numbers."""
    label = Target(probe.rank, probe.node).label
    tokens = f", {probe.tokens} tokens" if probe.tokens is not None else ""
    which = f" for {golden.short_prompt!r}" if several else ""
    if probe.error:
        return f"{label} for {golden.short_prompt!r}: {probe.error}"
    if not probe.ok:
        return (f"{label} answered {probe.answer[:60]!r} for {golden.short_prompt!r} "
                f"expected /{golden.expect}/ (full match)")
    if probe.section == "thinking":
        return (f"{label} {probe.reasoning_chars} chars of reasoning in {probe.latency_s:.2f}s{tokens}, "
                f"answer {probe.answer[:40]!r}")
    if probe.section == "stream":
        first = f", first chunk {probe.first_chunk_s:.2f}s" if probe.first_chunk_s is not None else ""
        return f"{label} streamed {probe.answer[:40]} in {probe.latency_s:.2f}s{first}{tokens}, [DONE]"
    return f"{label} {probe.answer[:40]} in {probe.latency_s:.2f}s{tokens}{which}"


_WRONG_ANSWER = ("a wrong answer at temperature 0 on one rank means a broken GPU or a wrong shard on its node; on "
                 "every rank: broken weights, parser or tokenizer mode (compare model files and "
                 "serving.tokenizer_mode with the profile). Read the named node's engine log")
_NO_ANSWER = ("the rank did not answer: read the named node's engine log (`docker logs`); vLLM is fail-stop, so one "
              "dead engine takes the group down")


def _next_step(probe: Probe) -> str:
    """What to do about one failed probe, from what went wrong."""
    if "is out of range" in probe.error:
        return "--dp-size is larger than the engine's data-parallel size: it must be parallelism.data"
    if probe.error.startswith(("ConnectError", "ReadTimeout", "ReadError", "RemoteProtocolError", "HTTP 5")):
        return _NO_ANSWER
    if probe.section == "thinking" and probe.error:
        return "check serving.reasoning_parser matches the model (profile default)"
    if probe.section == "stream" and probe.error and not probe.error.startswith("streamed "):
        return ("a proxy in front may buffer SSE (proxy_buffering off); an error event in the stream names the "
                "engine's failure")
    if probe.error.startswith("HTTP "):
        return "read the head log for the request error"
    return _WRONG_ANSWER


def run_ranked(section: str, probes: list[Probe], goldens: list[Golden]) -> Section:
    """Failures first, then every rank's numbers, so a verdict line names the bad rank and shows the good."""
    by_prompt = {g.prompt: g for g in goldens}
    several = len(goldens) > 1 and section == "chat"
    ordered = [p for p in probes if not p.ok] + [p for p in probes if p.ok]
    evidence = [_describe(p, by_prompt[p.prompt], several) for p in ordered]
    if all(p.ok for p in probes):
        return Section(section, True, evidence)
    steps = list(dict.fromkeys(_next_step(p) for p in probes if not p.ok))
    return Section(section, False, evidence, "; ".join(steps))


def check_chat(api: Api, served: str, goldens: list[Golden], targets: list[Target]) -> tuple[Section, list[Probe]]:
    probes = [probe_chat(api, served, g, t) for t in targets for g in goldens]
    section = run_ranked("chat", probes, goldens)
    if len(targets) > 1:
        control = rank_control(api, served, goldens[0], len(targets))
        section.evidence.append(control[1])
        if not control[0]:
            section.ok = False
            section.next_step = "; ".join(filter(None, [
                section.next_step, "the rank header does not reach vLLM: keep X-data-parallel-rank through every "
                "proxy and load balancer in front of it (the generated nginx passes it)"]))
    return section, probes


def rank_control(api: Api, served: str, golden: Golden, dp_size: int) -> tuple[bool, str]:
    """Proof that the rank header is honoured: vLLM refuses rank `dp_size` (input_processor.py: `data_parallel_rank
    R is out of range [0, N).`, HTTP 400). A 200 means something on the path drops or ignores the header, and then
    every "rank r" probe above may have reached one and the same engine."""
    try:
        response = api.request("POST", "/v1/chat/completions", retries=3,
                               json=_chat(served, golden.prompt, False, kwarg=api.thinking_kwarg),
                               headers=api.headers(rank=dp_size))
    except httpx.HTTPError as exc:
        return False, f"rank control (rank {dp_size}): {type(exc).__name__}: {exc}"[:200]
    if response.status_code == 200:
        return False, (f"rank control: rank {dp_size} of a DP{dp_size} endpoint answered 200; the "
                       "X-data-parallel-rank header is dropped or ignored, so the per-rank answers prove nothing")
    text = _error_text(response)
    refused = 400 <= response.status_code < 500 and response.status_code not in (401, 403, 404, 405, 429)
    # Python frontend: "data_parallel_rank N is out of range"; Rust frontend: InvalidDataParallelRank
    if refused and re.search(r"data_parallel_rank|DataParallelRank|\brank\b.*\b(out of range|invalid)", text, re.I):
        return True, (f"rank control: rank {dp_size} refused (HTTP {response.status_code} {text[:80]!r}): the "
                      "header reaches vLLM")
    return False, (f"rank control: rank {dp_size} got HTTP {response.status_code}: {text[:120]!r}, not a refusal "
                   "of the rank")


def check_thinking(api: Api, served: str, goldens: list[Golden], targets: list[Target]
                   ) -> tuple[Section, list[Probe]]:
    probes = [probe_chat(api, served, goldens[0], t, thinking=True) for t in targets]
    return run_ranked("thinking", probes, goldens), probes


def check_stream(api: Api, served: str, goldens: list[Golden], targets: list[Target]
                 ) -> tuple[Section, list[Probe]]:
    probes = [probe_stream(api, served, goldens[0], t) for t in targets]
    return run_ranked("stream", probes, goldens), probes


def check_auth(api: Api) -> Section:
    evidence, ok = [], True
    for label, headers in (("without a key", {}), ("with a wrong key", {"Authorization": "Bearer wrong-key-0000"})):
        response = api.request("GET", "/v1/models", headers=headers)
        ok &= response.status_code == 401
        evidence.append(f"/v1/models {label}: {response.status_code}"
                        + ("" if response.status_code == 401 else ", not 401"))
    if not ok:
        return Section("auth", False, evidence, "the key is not enforced: VLLM_API_KEY must reach the head "
                       "container, or the proxy's key map is empty")
    return Section("auth", True, evidence)


def check_deny(api: Api, denied: list[str]) -> Section:
    """Every named path 403 and an unknown one 404, for each of GET, POST, PUT, PATCH and DELETE, each with a
    valid key: the allowlist, not the key or the method, refuses."""
    wrong: list[str] = []
    for path, expected in [(p, 403) for p in denied] + [(UNKNOWN_PATH, 404)]:
        for method in HTTP_METHODS:
            body: dict[str, Any] | None = {} if method in ("POST", "PUT", "PATCH") else None
            response = api.request(method, path, headers=api.headers(), json=body)
            if response.status_code != expected:
                wrong.append(f"{method} {path} {response.status_code}")
    if wrong:
        return Section("deny", False, [f"expected 403 (404 for the unknown path), got: {', '.join(wrong[:40])}"
                                       + (f" and {len(wrong) - 40} more" if len(wrong) > 40 else "")],
                       "the request reached vLLM: is the client talking to the proxy's port, not vLLM's?")
    methods = "/".join(HTTP_METHODS)
    return Section("deny", True, [f"{len(denied)} named paths 403 (e.g. {', '.join(denied[:3])}), unknown 404, "
                                  f"each with {methods}"])


# --- watch mode ----------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def watch(api: Api, served: str, goldens: list[Golden], targets: list[Target], interval_s: float, name: str,
          max_iterations: int | None = None, as_json: bool = False,
          sleep: Callable[[float], None] = time.sleep, metrics: WatchMetrics | None = None) -> int:
    """Probe every rank every interval; print a line when a rank goes down or comes back, and nothing else
    (apart from one line when it starts and one after the first round). Runs until stopped: exit 0."""
    state: dict[int | None, tuple[bool, float]] = {}
    iteration = 0

    def say(event: str, target: Target, detail: str, since: float | None = None) -> None:
        if as_json:
            record: dict[str, Any] = {"time": _now(), "check": name, "event": event, "rank": target.rank,
                                      "node": target.node, "detail": detail}
            if since is not None:
                record["after_s"] = round(since, 1)
            print(json.dumps(record, ensure_ascii=False), flush=True)
        else:
            after = f" back after {since:.0f}s down" if since is not None and event == "up" else ""
            print(f"{_now()} {event.upper()} {name}: {target.label}{after}: {detail}", flush=True)

    labels = ", ".join(t.label for t in targets)
    print(f"{_now()} WATCH {name}: {len(targets)} target(s) ({labels}), {len(goldens)} golden prompt(s), "
          f"every {interval_s:g}s", flush=True)
    while True:
        iteration += 1
        for target in targets:
            started = time.monotonic()
            probes = [probe_chat(api, served, g, target, retries=1) for g in goldens]
            ok = all(p.ok for p in probes)
            if metrics is not None:
                metrics.record(target, ok, time.monotonic() - started)
            bad = next((p for p in probes if not p.ok), probes[0])
            golden = next(g for g in goldens if g.prompt == bad.prompt)
            detail = _describe(bad, golden, len(goldens) > 1).removeprefix(target.label + " ")
            previous = state.get(target.rank)
            now = time.monotonic()
            if previous is None:
                if not ok:
                    say("down", target, detail)
                state[target.rank] = (ok, now)
            elif previous[0] != ok:
                say("up" if ok else "down", target, detail, now - previous[1])
                state[target.rank] = (ok, now)
        if iteration == 1:
            up = sum(1 for ok, _ in state.values() if ok)
            print(f"{_now()} FIRST {name}: {up} of {len(targets)} target(s) answer the golden set", flush=True)
        if max_iterations is not None and iteration >= max_iterations:
            return 0
        sleep(interval_s)


# --- watch metrics: the golden results and the info series, for Prometheus -----------------------------------
# Served over HTTP by the watch process itself rather than written as a node exporter textfile: the watch unit runs
# on the deploying host, which need not run a node exporter, and a textfile outlives a dead watcher (its last
# "all ranks pass" would stay true), while a scrape of a dead process makes `up` 0 and the target-down alert fires.

METRIC_HELP = {
    "vllm_cluster_engine_info": ("gauge", "One series per DP rank: its node, GPUs, image and generation (1)."),
    "vllm_cluster_golden_ok": ("gauge", "1 when the rank answered its whole golden set in the last round."),
    "vllm_cluster_golden_consecutive_failures": ("gauge", "Rounds in a row the rank failed its golden set."),
    "vllm_cluster_golden_latency_seconds": ("gauge", "Seconds the rank's last golden round took."),
    "vllm_cluster_golden_rounds_total": ("counter", "Golden rounds probed on the rank, by result."),
    "vllm_cluster_golden_last_round_timestamp_seconds": (
        "gauge", "Unix time the rank's last golden round ended: how fresh its vllm_cluster_golden_ok is."),
}


def _label_text(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    """`%g` where it loses nothing (1, 0.25), else every digit: a Unix time in `%g` is off by minutes."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def metric_family(name: str, kind: str, text: str, samples: Sequence[tuple[dict[str, str], float]]) -> list[str]:
    """One family in Prometheus text format 0.0.4: HELP, TYPE, then one line per sample (none is valid: the family
    is declared, no series yet). Shared by the watch unit and the group supervisor (heal/supervisor.py)."""
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}",
            *(f"{name}{_label_text(labels)} {_number(value)}" for labels, value in samples)]


class WatchMetrics:
    """The series `--metrics-listen` serves (Prometheus text format 0.0.4); updated by the watch loop."""

    def __init__(self, info: dict[str, Any] | None, stack: str = "") -> None:
        self.lock = threading.Lock()
        self.info = info or {}
        self.stack = str(self.info.get("stack", stack))
        self.nodes = {int(r["dp_rank"]): str(r["node"]) for r in self.info.get("ranks", [])}
        self.ok: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self.latency: dict[int, float] = {}
        self.rounds: dict[tuple[int, str], int] = {}
        self.last_round: dict[int, float] = {}

    def record(self, target: Target, ok: bool, latency_s: float, at: float | None = None) -> None:
        rank = target.rank or 0
        with self.lock:
            if target.node and rank not in self.nodes:
                self.nodes[rank] = target.node
            self.ok[rank] = int(ok)
            self.failures[rank] = 0 if ok else self.failures.get(rank, 0) + 1
            self.latency[rank] = latency_s
            key = (rank, "pass" if ok else "fail")
            self.rounds[key] = self.rounds.get(key, 0) + 1
            self.last_round[rank] = time.time() if at is None else at

    def _labels(self, rank: int, **more: str) -> dict[str, str]:
        return {"stack": self.stack, "node": self.nodes.get(rank, ""), "dp_rank": str(rank), **more}

    def render(self) -> str:
        lines: list[str] = []

        def family(name: str, samples: list[tuple[dict[str, str], float]]) -> None:
            lines.extend(metric_family(name, *METRIC_HELP[name], samples))

        with self.lock:
            family("vllm_cluster_engine_info", [
                ({"stack": self.stack, "node": str(r["node"]), "dp_rank": str(r["dp_rank"]), "gpus": str(r["gpus"]),
                  "image": str(self.info.get("image", "")), "image_digest": str(self.info.get("image_digest", "")),
                  "generation": str(r.get("generation", "")), "topology": str(self.info.get("topology", ""))}, 1)
                for r in self.info.get("ranks", [])])
            family("vllm_cluster_golden_ok", [(self._labels(r), v) for r, v in sorted(self.ok.items())])
            family("vllm_cluster_golden_consecutive_failures",
                   [(self._labels(r), v) for r, v in sorted(self.failures.items())])
            family("vllm_cluster_golden_latency_seconds",
                   [(self._labels(r), v) for r, v in sorted(self.latency.items())])
            family("vllm_cluster_golden_rounds_total",
                   [(self._labels(r, result=res), v) for (r, res), v in sorted(self.rounds.items())])
            family("vllm_cluster_golden_last_round_timestamp_seconds",
                   [(self._labels(r), round(v, 3)) for r, v in sorted(self.last_round.items())])
        return "\n".join(lines) + "\n"


class Exposition(Protocol):
    """What `serve_metrics` serves: the whole text, rendered at each scrape."""

    def render(self) -> str: ...


def serve_metrics(listen: tuple[str, int], metrics: Exposition, thread: str = "watch-metrics"
                  ) -> ThreadingHTTPServer:
    """GET /metrics on `listen`, in a daemon thread; anything else 404. OSError when it cannot bind (the address is
    not this host's, the port is held): the caller says so and exits 2 before it does anything else."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # one journal line per scrape would bury the transitions

    family = 10 if ":" in listen[0] else 2  # AF_INET6 / AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server: ThreadingHTTPServer = server_class(listen, Handler)
    threading.Thread(target=server.serve_forever, name=thread, daemon=True).start()
    return server


def parse_listen(value: str, flag: str = "--metrics-listen", example: str = "10.30.8.1:9464") -> tuple[str, int]:
    """`ADDRESS:PORT` -> (address, port) for `serve_metrics`: an IP literal of one host or a wildcard (an IPv6 one
    in brackets, `[fd00::1]:9464`: unbracketed, `fd00::1:9464` could be either), a port of ASCII digits from 1 to
    65535. ConfigProblem naming `flag`, the value and an example otherwise."""
    shown = f"{flag} {value[:80]!r}"
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[0-9.]+):([0-9]{1,5})", value)
    if match is None:
        why = ("an IPv6 address needs brackets" if value.count(":") > 1 and not value.startswith("[")
               else "needs ADDRESS:PORT, an IP address and a port")
        raise ConfigProblem(f"{shown}: {why}, e.g. {example} or [fd00::1]:{example.rpartition(':')[2]}")
    host, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigProblem(f"{shown}: {host!r} is not an IP address; e.g. {example}") from None
    if (address.version == 6) != match.group(1).startswith("["):
        raise ConfigProblem(f"{shown}: brackets go around an IPv6 address only; e.g. {example}")
    if not 1 <= port <= 65535:
        raise ConfigProblem(f"{shown}: port {port} is not from 1 to 65535; e.g. {example}")
    return str(address), port


def _info(value: str) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        info = json.loads(value)
        ranks = info["ranks"]
        if not isinstance(info, dict) or not isinstance(ranks, list) or not all(
                isinstance(r, dict) and {"dp_rank", "node", "gpus"} <= set(r) for r in ranks):
            raise ValueError("ranks must be a list of {dp_rank, node, gpus, generation}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigProblem(f"--info-json: {exc}; python -m stacks watch-unit writes it") from None
    return info


# --- command line --------------------------------------------------------------------------------------------

class ConfigProblem(Exception):
    """A bad argument: exit 2 with the argument, the value and a fix."""


MAX_DP_SIZE = 1024
"""More ranks than any stack this tool plans (and a bound on the requests one round sends)."""


def _url(url: str) -> str:
    """http(s)://host[:port] and nothing after it: the checks add the paths; a path or query here would send
    every probe (and the bearer key) somewhere the stack did not name."""
    if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        raise ConfigProblem(f"--url {shown(url)}: carries credentials; give only scheme, host and port, and the key "
                            "in the variable --api-key-env names")
    try:
        parts = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ConfigProblem(f"--url {shown(url)}: not a URL; e.g. https://llm.example.com:443") from None
    try:
        url_port(url, parts.port)
    except ArgumentProblem as exc:
        raise ConfigProblem(f"--url {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.host:
        raise ConfigProblem(f"--url {shown(url)}: needs http:// or https:// and a host, e.g. http://10.30.8.1:8030")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.userinfo or re.search(r"[?#@\s]", url):
        raise ConfigProblem(f"--url {shown(url)}: only scheme, host and port; the checks add /health, /v1/models, "
                            "/v1/chat/completions themselves")
    # brackets as stacks.model.field_types.bracket_host, not imported: the bundle run on the head pastes only golden
    host = (f"[{parts.host}]" if ":" in parts.host else parts.host) + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{host}"  # rebuilt from the parsed parts: what is checked is what is used


def _targets(dp_size: int, nodes: list[str], first_rank: int = 0) -> list[Target]:
    if nodes and dp_size == 1:  # one rank is the balanced path: no header pins it, so a node name proves nothing
        raise ConfigProblem(f"--rank-nodes {shown(','.join(nodes))}: names the node of each DP rank, and --dp-size "
                            "is 1 (nothing to pin); leave it out, or give --dp-size N with N node names")
    if nodes and len(nodes) != dp_size:
        raise ConfigProblem(f"--rank-nodes {shown(','.join(nodes))}: needs one node name per DP rank ({dp_size}), "
                            "in rank order, e.g. node1,node1,node2,node2 for two ranks per node")
    if dp_size == 1:
        return [Target(None, nodes[0] if nodes else None)]  # nothing to pin: no header
    return [Target(first_rank + r, nodes[r] if nodes else None, first_rank) for r in range(dp_size)]


def _goldens(golden_json: str, prompt: str | None, expect: str | None) -> list[Golden]:
    if golden_json:
        if prompt is not None or expect is not None:
            raise ConfigProblem("--golden-json with --prompt/--expect: give the golden set one way")
        try:
            return parse_golden(golden_json)
        except ValueError as exc:
            raise ConfigProblem(f"--golden-json {exc}; fix: a JSON list such as "
                                f'[{{"prompt": "{DEFAULT_PROMPT}", "expect": "{DEFAULT_EXPECT}"}}]') from None
    pattern = DEFAULT_EXPECT if expect is None else expect
    try:
        compiled = compile_expect(pattern)
    except ValueError as exc:
        raise ConfigProblem(f"--expect {pattern!r}: {exc}") from None
    text = DEFAULT_PROMPT if prompt is None else prompt
    try:
        GoldenPair(prompt=text, expect=pattern)  # the stack's own rule for a prompt
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = error.get("msg", "invalid").removeprefix("Value error, ")
        if "expect" in error.get("loc", ()):  # the refusal names the flag that holds the value
            raise ConfigProblem(f"--expect {pattern[:40]!r}: {reason}; a regular expression of the one right "
                                "answer, e.g. 323") from None
        raise ConfigProblem(f"--prompt {text[:40]!r}: {reason}; a question with one short, certain answer") from None
    return [Golden(text, pattern, compiled)]


def _ca_pem(ca_env: str, ca_file: str) -> str | None:
    if ca_file:
        try:
            with open(ca_file, encoding="utf-8") as handle:
                pem: str | None = handle.read()
        except OSError as exc:
            raise ConfigProblem(f"--ca-file {ca_file!r}: {exc.strerror}; give a readable PEM file") from None
    else:
        pem = os.environ.get(ca_env) if ca_env else None
    if pem is not None:
        try:
            tls_context(pem)
        except (ValueError, ssl.SSLError) as exc:
            where = f"--ca-file {ca_file!r}" if ca_file else f"${ca_env}"
            raise ConfigProblem(f"{where}: {exc}; give the stack's PEM certificate (tls_certificate)") from None
    return pem


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="api", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--name", default="api", type=check_name)
    p.add_argument("--url", required=True)
    p.add_argument("--served-name", required=True, type=served_name)
    p.add_argument("--sections", default="health,models,chat,thinking,stream", type=listed(str, SECTION_NAMES))
    p.add_argument("--api-key-env", default="VLLM_API_KEY", type=env_name,
                   help="env var holding the bearer key (if any)")
    p.add_argument("--deadline-s", type=seconds(7 * 86_400), default=4200.0)
    p.add_argument("--interval-s", type=seconds(86_400, low=0.01, low_open=False), default=30.0,
                   help="health: seconds between progress lines; --watch: seconds between probe rounds")
    p.add_argument("--timeout-s", type=seconds(3_600), default=300.0)
    p.add_argument("--prompt", default=None, help=f"one golden prompt (default {DEFAULT_PROMPT!r})")
    p.add_argument("--expect", default=None,
                   help=f"its expected answer: a regular expression the stripped answer must fully match "
                        f"(default {DEFAULT_EXPECT!r})")
    p.add_argument("--golden-json", default="",
                   help='the golden set: JSON [{"prompt": ..., "expect": ...}, ...] (1-16 pairs); thinking and '
                        "stream use the first")
    p.add_argument("--thinking-kwarg", default="thinking", choices=THINKING_KWARGS,
                   help="how a request turns reasoning on and off: chat_template_kwargs thinking (DeepSeek), "
                        "enable_thinking (Qwen3), or reasoning_effort (gpt-oss, which always reasons)")
    p.add_argument("--dp-size", type=integer(1, MAX_DP_SIZE), default=1,
                   help="data-parallel ranks: chat, thinking and stream run once per rank (X-data-parallel-rank)")
    p.add_argument("--rank-nodes", default=[], type=node_names,
                   help="node of each DP rank in rank order, e.g. node1,node2 (with --dp-size 2 or more)")
    p.add_argument("--first-rank", type=integer(0, MAX_DP_SIZE), default=0,
                   help="the global number of the first rank (hybrid load balancing: the node's start rank); "
                        "the header carries rank - first-rank, the index the node's own API server expects")
    p.add_argument("--ca-env", default="", type=env_name,
                   help="env var holding a PEM certificate to trust (the proxy's)")
    p.add_argument("--ca-file", default="", type=optional_path,
                   help="file holding a PEM certificate to trust (for --watch units)")
    p.add_argument("--deny-paths", default=[], type=listed(url_path),
                   help="comma-separated paths the proxy must refuse with 403")
    p.add_argument("--watch", action="store_true", help="probe every rank forever, one line per transition")
    p.add_argument("--max-iterations", type=integer(1, 10**9), default=None,
                   help="--watch: stop after N rounds (tests)")
    p.add_argument("--metrics-listen", default="", metavar="ADDRESS:PORT",
                   help="--watch: serve the golden results and the info series for Prometheus on GET /metrics")
    p.add_argument("--info-json", default="", help="--watch: the stack's ranks, nodes, image and generation "
                   "(python -m stacks watch-unit writes it)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        targets = _targets(args.dp_size, args.rank_nodes, args.first_rank)
        goldens = _goldens(args.golden_json, args.prompt, args.expect)
        ca_pem = _ca_pem(args.ca_env, args.ca_file)
        args.url = _url(args.url)
        if not args.sections:
            raise ConfigProblem("--sections '': no section to run; a verdict over nothing would read as a pass")
        listen = parse_listen(args.metrics_listen) if args.metrics_listen else None
        info = _info(args.info_json)
        if listen is None and info is not None:
            raise ConfigProblem("--info-json without --metrics-listen: nothing would serve it")
    except ConfigProblem as exc:
        if args.json:  # stdout is one JSON document for a program; the person gets the line on stderr
            print(mask_credentials(f"{args.name}: bad argument: {exc}"), file=sys.stderr)
        emit(Verdict(args.name, "cannot-run", f"bad argument: {exc}", next_step="api --help"), args.json)
        return 2
    key = os.environ.get(args.api_key_env) or None
    api = Api(args.url, key, args.timeout_s, ca_pem)
    api.thinking_kwarg = args.thinking_kwarg
    if args.watch:
        signal.signal(signal.SIGTERM, _stop)
        metrics = WatchMetrics(info) if listen is not None else None
        if listen is not None and metrics is not None:
            try:
                serve_metrics(listen, metrics)
            except OSError as exc:
                print(f"CANNOT-RUN {args.name}: --metrics-listen {args.metrics_listen}: {exc.strerror}; an address "
                      "of this host and a free port")
                return 2
        try:
            return watch(api, args.served_name, goldens, targets, args.interval_s, args.name, args.max_iterations,
                         args.json, metrics=metrics)
        except KeyboardInterrupt:
            return 0
    probes: list[Probe] = []

    def ranked(run: Callable[[Api, str, list[Golden], list[Target]], tuple[Section, list[Probe]]]
               ) -> Callable[[], Section]:
        def call() -> Section:
            section, done = run(api, args.served_name, goldens, targets)
            probes.extend(done)
            return section
        return call

    runners: dict[str, Callable[[], Section]] = {
        "health": lambda: wait_health(api, args.deadline_s, args.interval_s, args.name),
        "models": lambda: check_models(api, args.served_name),
        "chat": ranked(check_chat),
        "thinking": ranked(check_thinking),
        "stream": ranked(check_stream),
        "auth": lambda: check_auth(api),
        "deny": lambda: check_deny(api, args.deny_paths),
    }
    names = list(args.sections)
    if key and "auth" not in names:
        names.append("auth")
    sections: list[Section] = []
    for section in names:
        try:
            result = runners[section]()
        except httpx.TransportError as exc:
            result = Section(section, False, [f"{type(exc).__name__}: {exc}"[:200]], "is the head reachable?")
        sections.append(result)
        if section == "health" and not result.ok:
            break
    return emit(_with_ranks(combine(args.name, sections), sections, probes), args.json)


def _with_ranks(verdict: Verdict, sections: list[Section], probes: list[Probe]) -> Verdict:
    """Name the failing ranks and their nodes in the summary; every probe's numbers go into its section's
    JSON details (`details.chat.probes`: rank, node, prompt, ok, answer, latency_s, tokens, error, …)."""
    failing = sorted({(p.rank, p.node or "") for p in probes if not p.ok and p.rank is not None})
    if failing:
        verdict.summary += "; failing: " + ", ".join(Target(r, n or None).label for r, n in failing)
    for probe in probes:
        verdict.details[probe.section].setdefault("probes", []).append(asdict(probe))
    if verdict.status == "fail":  # chat and stream failing for one wrong rank give the same advice once
        verdict.next_step = "; ".join(dict.fromkeys(s.next_step for s in sections if s.ok is False and s.next_step))
    return verdict


if __name__ == "__main__":
    raise SystemExit(main())
