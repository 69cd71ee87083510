"""API verification from where `pulumi up` runs: health, models, chat, thinking, streaming, auth, deny.

The bearer key is read from the environment variable named by --api-key-env, never from argv; the
certificate to trust (the proxy's) from --ca-env. Only
connection-level failures are retried; a wrong answer or an HTTP error fails at once, with the answer shown.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from checks.verdict import Section, combine, emit

RETRYABLE = (httpx.TransportError,)


def tls_context(ca_pem: str | None) -> ssl.SSLContext:
    """System trust plus the stack's own certificate (a self-signed or private-CA leaf is trusted as is)."""
    context = ssl.create_default_context()
    if ca_pem:
        context.load_verify_locations(cadata=ca_pem)
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


class Api:
    def __init__(self, url: str, key: str | None, timeout_s: float, ca_pem: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10), verify=tls_context(ca_pem))

    def headers(self, with_key: bool = True) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if (self.key and with_key) else {}

    def request(self, method: str, path: str, retries: int = 3, **kwargs: Any) -> httpx.Response:
        for attempt in range(retries):
            try:
                response = self.client.request(method, self.url + path, **kwargs)
                if response.status_code == 429 and attempt < retries - 1:  # the proxy's limits: wait, retry
                    time.sleep(float(response.headers.get("Retry-After", "1")))
                    continue
                return response
            except RETRYABLE:
                if attempt == retries - 1:
                    raise
                time.sleep(2 * (attempt + 1))
        raise AssertionError("unreachable")


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


def _chat(api: Api, served: str, prompt: str, thinking: bool, stream: bool = False) -> dict[str, Any]:
    return {"model": served, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": 2048 if thinking else 64, "stream": stream,
            "chat_template_kwargs": {"thinking": thinking}}


def check_chat(api: Api, served: str, prompt: str, expect: str) -> Section:
    response = api.request("POST", "/v1/chat/completions", json=_chat(api, served, prompt, False),
                           headers=api.headers())
    if response.status_code != 200:
        return Section("chat", False, [f"HTTP {response.status_code}: {response.text[:300]}"],
                       "read the head log for the request error")
    content = (response.json()["choices"][0]["message"].get("content") or "").strip()
    if content.rstrip("。.").strip() != expect:
        return Section("chat", False, [f"asked {prompt!r}, expected {expect!r}, got {content[:200]!r}"],
                       "a wrong answer at temperature 0 means broken weights, parser or tokenizer mode: "
                       "compare model files and serving.tokenizer_mode with the profile")
    return Section("chat", True, [f"{prompt} -> {content}"])


def check_thinking(api: Api, served: str, prompt: str) -> Section:
    response = api.request("POST", "/v1/chat/completions", json=_chat(api, served, prompt, True),
                           headers=api.headers())
    if response.status_code != 200:
        return Section("thinking", False, [f"HTTP {response.status_code}: {response.text[:300]}"],
                       "read the head log for the request error")
    message = response.json()["choices"][0]["message"]
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    if not reasoning.strip():
        return Section("thinking", False, [f"no reasoning content; message keys {sorted(message)}"],
                       "check serving.reasoning_parser matches the model (profile default)")
    return Section("thinking", True, [f"{len(reasoning)} chars of reasoning, answer {message.get('content')!r}"])


def check_stream(api: Api, served: str, prompt: str) -> Section:
    chunks, done, text = 0, False, ""
    body = _chat(api, served, prompt, False, stream=True)
    for attempt in range(3):
        try:
            with api.client.stream("POST", api.url + "/v1/chat/completions", json=body,
                                   headers=api.headers()) as response:
                if response.status_code != 200:
                    return Section("stream", False, [f"HTTP {response.status_code}"], "read the head log")
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunks += 1
                    delta = json.loads(data)["choices"][0].get("delta", {})
                    text += delta.get("content") or ""
            break
        except RETRYABLE:
            if attempt == 2:
                raise
            time.sleep(2)
    evidence = [f"{chunks} SSE chunk(s), [DONE] {'seen' if done else 'missing'}, text {text.strip()[:40]!r}"]
    if chunks == 0 or not done:
        return Section("stream", False, evidence, "a proxy in front may buffer SSE: proxy_buffering off")
    return Section("stream", True, evidence)


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
    """Every named path 403, an unknown one 404, each with a valid key: the allowlist, not the key, refuses."""
    wrong: list[str] = []
    for path in denied:
        response = api.request("GET", path, headers=api.headers())
        if response.status_code != 403:
            wrong.append(f"{path} {response.status_code}")
    unknown = api.request("POST", "/v1/no-such-endpoint", headers=api.headers(), json={})
    if unknown.status_code != 404:
        wrong.append(f"/v1/no-such-endpoint {unknown.status_code}")
    if wrong:
        return Section("deny", False, [f"expected 403 (404 for the unknown path), got: {', '.join(wrong)}"],
                       "the request reached vLLM: is the client talking to the proxy's port, not vLLM's?")
    return Section("deny", True, [f"{len(denied)} named paths 403 (e.g. {', '.join(denied[:3])}), unknown 404"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="api", description=__doc__)
    p.add_argument("--name", default="api")
    p.add_argument("--url", required=True)
    p.add_argument("--served-name", required=True)
    p.add_argument("--sections", default="health,models,chat,thinking,stream")
    p.add_argument("--api-key-env", default="VLLM_API_KEY", help="env var holding the bearer key (if any)")
    p.add_argument("--deadline-s", type=float, default=4200)
    p.add_argument("--interval-s", type=float, default=30)
    p.add_argument("--timeout-s", type=float, default=300)
    p.add_argument("--prompt", default="17*19等于多少？只返回数字。")
    p.add_argument("--expect", default="323")
    p.add_argument("--ca-env", default="", help="env var holding a PEM certificate to trust (the proxy's)")
    p.add_argument("--deny-paths", default="", help="comma-separated paths the proxy must refuse with 403")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    key = os.environ.get(args.api_key_env) or None
    api = Api(args.url, key, args.timeout_s, os.environ.get(args.ca_env) if args.ca_env else None)
    runners: dict[str, Callable[[], Section]] = {
        "health": lambda: wait_health(api, args.deadline_s, args.interval_s, args.name),
        "models": lambda: check_models(api, args.served_name),
        "chat": lambda: check_chat(api, args.served_name, args.prompt, args.expect),
        "thinking": lambda: check_thinking(api, args.served_name, args.prompt),
        "stream": lambda: check_stream(api, args.served_name, args.prompt),
        "auth": lambda: check_auth(api),
        "deny": lambda: check_deny(api, [p for p in args.deny_paths.split(",") if p]),
    }
    names = [s for s in args.sections.split(",") if s]
    if key and "auth" not in names:
        names.append("auth")
    sections: list[Section] = []
    for section in names:
        if section not in runners:
            print(f"unknown section {section!r}; known: {', '.join(runners)}")
            return 2
        try:
            result = runners[section]()
        except httpx.TransportError as exc:
            result = Section(section, False, [f"{type(exc).__name__}: {exc}"[:200]], "is the head reachable?")
        sections.append(result)
        if section == "health" and not result.ok:
            break
    return emit(combine(args.name, sections), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
