"""The generated nginx front door, run by a real nginx in front of the OpenAI stand-in (which wants vLLM's key).

Everything here goes over real sockets: TLS with a certificate made by openssl, bearer keys, the allowlist,
limits, the body cap, SSE timing against the direct port, the access log, and the API checks themselves.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import shlex
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from checks.api import tls_context
from components.check_commands import api_command
from stacks.model.config import SECRET_MARKER, ProxyConfig, ProxyLimits
from stacks.model.loader import parse_config
from stacks.planner.plan import api_sections, build_plan
from stacks.planner.proxy import DENIED_PATHS, FrontDoor, front_door, masked_nginx_conf
from tests.conftest import ROOT
from tests.nginx_harness import (
    CLIENT_KEYS,
    UPSTREAM_KEY,
    Tls,
    free_port,
    make_certificate,
    nginx_test,
    running_nginx,
    write_conf,
)
from tests.test_check_api import standin
from tests.waiting import wait_for

FIRST_TOKEN_S = 0.4
TOKEN_S = 0.3
HTTP_TIMEOUT_S = 60
"""Every request of these tests: nginx and the stand-in answer in milliseconds, a loaded machine in seconds (httpx's
default is 5 s); only a failing test waits it out."""
PACE_S = 60 / ProxyLimits().requests_per_minute_per_client
"""Between the requests of a long series through the default limits: never faster than the per-client rate, so
the burst allowance is never what keeps a fast machine under the limit."""


def with_proxy(values: dict[str, Any], **proxy: Any) -> dict[str, Any]:
    """A stack's values with the proxy on and every secret it needs marked as set."""
    out = copy.deepcopy(values)
    out.setdefault("api", {})["proxy"] = {"enabled": True, **proxy}
    out["serving"]["host"] = "127.0.0.1"
    out |= {"api_key": SECRET_MARKER, "tls_certificate": SECRET_MARKER, "tls_private_key": SECRET_MARKER,
            "proxy_keys": {name: SECRET_MARKER for name in CLIENT_KEYS}}
    return out


@dataclass
class Front:
    url: str
    direct: str
    tls: Tls
    directory: Path

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=tls_context(self.tls.pem), timeout=HTTP_TIMEOUT_S, **kwargs)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with standin("--api-key-env", "STANDIN_KEY", "--first-token-delay-s", str(FIRST_TOKEN_S),
                 "--token-delay-s", str(TOKEN_S), "--dp-size", "2",  # prod's DP: the checks pin each rank
                 env={"STANDIN_KEY": UPSTREAM_KEY}) as url:  # yields once it listens (its ready line)
        yield url


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def start_front(directory: Path, upstream: str, tls: Tls, **proxy: Any) -> tuple[ProxyConfig, Path, int]:
    port = free_port()
    config = ProxyConfig(enabled=True, bind="127.0.0.1", port=port, **proxy)
    return config, write_conf(directory, config, int(upstream.rsplit(":", 1)[1]), tls), port


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, upstream: str, tls: Tls) -> Iterator[Front]:
    directory = tmp_path_factory.mktemp("nginx")
    _, conf, port = start_front(directory, upstream, tls)
    with running_nginx(conf, port):
        yield Front(f"https://localhost:{port}", upstream, tls, directory)


# --- every generated config is valid nginx ---------------------------------------------------------------

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "prod": ("prod", {}),
    "h20": ("h20", {}),
    "plain-http": ("prod", {"tls": False, "port": 8080}),
    "ipv6-any": ("h20", {"bind": "::"}),
    "server-name": ("prod", {"server_name": "api.example.internal"}),
    "wildcard-server-name": ("prod", {"server_name": "*.llm.example.com", "api_public_host": "llm.example.com"}),
    "punycode-server-name": ("prod", {"server_name": "xn--nde1-lra.example"}),
    "more-paths": ("h20", {"allowed_paths": ["/v1/chat/completions", "/v1/embeddings", "/v1/responses",
                                             "/v1/messages", "/v1/models", "/health"]}),
    "ipv6-upstream": ("h20", {"bind": "::", "serving_host": "::1"}),
    "tight-limits": ("prod", {"limits": {"requests_per_minute_per_key": 1, "burst": 0, "connections_per_key": 1},
                              "max_body_mb": 1, "read_timeout_s": 30}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_nginx_accepts_every_generated_config(variant: str, request: pytest.FixtureRequest, tmp_path: Path,
                                             tls: Tls) -> None:
    stack, proxy = VARIANTS[variant]
    proxy = dict(proxy)
    host = proxy.pop("serving_host", None)
    public_host = proxy.pop("api_public_host", None)
    values = with_proxy(request.getfixturevalue(f"{stack}_values"), **proxy)
    if host:
        values["serving"]["host"] = host
    if public_host:  # a wildcard server_name needs the name the checks call
        values["api"]["public_host"] = public_host
    config = parse_config(stack, values)
    plan = build_plan(stack, config)
    assert plan.proxy is not None and plan.proxy.upstream == front_door(config).upstream
    conf = write_conf(tmp_path, front_door(config), 0, tls if config.api.proxy.tls else None)
    result = nginx_test(conf)
    assert result.returncode == 0, result.stderr + conf.read_text()
    assert "syntax is ok" in result.stderr


def test_nginx_accepts_many_clients_and_the_reviewers_copy(tmp_path: Path, tls: Tls) -> None:
    keys = {f"client-{i:03d}": f"sk-{i:03d}-{'x' * 24}" for i in range(200)}
    result = nginx_test(write_conf(tmp_path, ProxyConfig(enabled=True), 8000, tls, keys))
    assert result.returncode == 0, result.stderr
    masked = masked_nginx_conf(FrontDoor.of(ProxyConfig(enabled=True), 8000), ["team-a"])
    assert "SECRET-KEY-OF-TEAM-A" in masked and "SECRET-UPSTREAM-API-KEY" in masked


def test_nginx_t_catches_a_broken_config(tmp_path: Path, tls: Tls) -> None:
    """The gate above can fail: a config nginx cannot load is reported, not passed."""
    conf = write_conf(tmp_path, ProxyConfig(enabled=True), 8000, tls)
    conf.write_text(conf.read_text().replace("proxy_buffering off;", "proxy_buffering sometimes;"))
    result = nginx_test(conf)
    assert result.returncode != 0 and "proxy_buffering" in result.stderr


# --- bearer keys --------------------------------------------------------------------------------------------

def test_no_key_and_wrong_keys_get_401(front: Front) -> None:
    with front.client() as c:
        for headers in ({}, bearer("sk-wrong-0000000000000000"), bearer(CLIENT_KEYS["team-a"].upper()),
                        bearer(UPSTREAM_KEY), {"Authorization": CLIENT_KEYS["team-a"]}):
            response = c.get("/v1/models", headers=headers)
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["type"] == "unauthorized"
        assert c.post("/v1/chat/completions", json={}, headers=bearer("nope-nope-nope-nope")).status_code == 401


def test_each_client_key_gets_200_and_vllm_sees_only_its_own_key(front: Front) -> None:
    with front.client() as c:
        for key in CLIENT_KEYS.values():
            response = c.get("/v1/models", headers=bearer(key))
            assert response.status_code == 200, response.text
            assert response.json()["data"][0]["id"] == "DeepSeek-V4.1-Flash"
        chat = c.post("/v1/chat/completions", headers=bearer(CLIENT_KEYS["ops"]),
                      json={"messages": [{"role": "user", "content": "17*19"}]})
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"] == "323"
        completion = c.post("/v1/completions", headers=bearer(CLIENT_KEYS["ops"]), json={"prompt": "17*19="})
        assert completion.status_code == 200, completion.text
        assert completion.json()["choices"][0]["text"] == "323"
        assert c.get("/health").status_code == 200  # open, as load balancers probe it
    # The stand-in refuses client keys: the 200s above prove the proxy swapped in vLLM's key.
    direct = httpx.get(front.direct + "/v1/models", headers=bearer(CLIENT_KEYS["ops"]), timeout=HTTP_TIMEOUT_S)
    assert direct.status_code == 401


# --- allowlist ----------------------------------------------------------------------------------------------

def test_named_vllm_paths_403_and_unknown_paths_404_even_with_a_key(front: Front) -> None:
    with front.client() as c:
        for path in DENIED_PATHS:
            for method in ("GET", "POST"):
                response = c.request(method, path, headers=bearer(CLIENT_KEYS["team-a"]))
                assert response.status_code == 403, (method, path)
                time.sleep(PACE_S)
        for path in ("/metrics/extra", "/pause/now", "/v1/load_lora_adapter/x"):  # below a named path: 403 too
            assert c.get(path, headers=bearer(CLIENT_KEYS["team-a"])).status_code == 403, path
            time.sleep(PACE_S)
        for path in ("/v1/embeddings", "/v2/models", "/", "/v1/models/x", "/healthz", "/metricsx"):
            assert c.get(path, headers=bearer(CLIENT_KEYS["team-a"])).status_code == 404, path
            time.sleep(PACE_S)
    # What the proxy refuses really is open on vLLM itself: the allowlist, not the key, protects it.
    assert httpx.get(front.direct + "/metrics", timeout=HTTP_TIMEOUT_S).status_code == 200
    assert httpx.post(front.direct + "/tokenize", json={}, timeout=HTTP_TIMEOUT_S).status_code == 200


def test_dot_segments_and_encoded_paths_do_not_escape_the_allowlist(front: Front) -> None:
    context = tls_context(front.tls.pem)
    port = int(front.url.rsplit(":", 1)[1])
    codes = {}
    for raw in ("/v1/models/../../metrics", "/v1/models/%2e%2e/%2e%2e/metrics", "/v1/chat/completions/../../tokenize",
                "/%6d%65%74%72%69%63%73", "//metrics"):
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
        conn.request("GET", raw, headers=bearer(CLIENT_KEYS["team-a"]))
        codes[raw] = conn.getresponse().status
        conn.close()
    assert all(code in (403, 404) for code in codes.values()), codes
    assert codes["/v1/models/../../metrics"] == 403 and codes["/%6d%65%74%72%69%63%73"] == 403


# --- limits and body cap ------------------------------------------------------------------------------------

def test_a_burst_over_the_rate_gets_429(tmp_path: Path, upstream: str, tls: Tls) -> None:
    # one request a minute: the 9 requests below are over the rate however slowly a loaded machine sends them
    limits = ProxyLimits(requests_per_minute_per_key=1, requests_per_minute_per_client=60000, burst=2)
    _, conf, port = start_front(tmp_path, upstream, tls, limits=limits)
    with running_nginx(conf, port), httpx.Client(base_url=f"https://localhost:{port}",
                                                  verify=tls_context(tls.pem), timeout=HTTP_TIMEOUT_S) as c:
        codes = [c.get("/v1/models", headers=bearer(CLIENT_KEYS["team-a"])).status_code for _ in range(8)]
        other = c.get("/v1/models", headers=bearer(CLIENT_KEYS["ops"])).status_code
        limited = c.get("/v1/models", headers=bearer(CLIENT_KEYS["team-a"]))
    assert codes[:3] == [200, 200, 200] and codes.count(429) == 5, codes
    assert other == 200  # per key: another client is not throttled by team-a's burst
    assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
    assert limited.json()["error"]["type"] == "rate_limited"


def test_a_burst_from_one_address_is_limited_across_keys(tmp_path: Path, upstream: str, tls: Tls) -> None:
    limits = ProxyLimits(requests_per_minute_per_key=60000, requests_per_minute_per_client=1, burst=3)
    _, conf, port = start_front(tmp_path, upstream, tls, limits=limits)
    with running_nginx(conf, port), httpx.Client(base_url=f"https://localhost:{port}",
                                                  verify=tls_context(tls.pem), timeout=HTTP_TIMEOUT_S) as c:
        keys = [CLIENT_KEYS["team-a"], CLIENT_KEYS["ops"]] * 4
        codes = [c.get("/v1/models", headers=bearer(key)).status_code for key in keys]
        unauthenticated = [c.get("/v1/models").status_code for _ in range(3)]
    assert codes[:4] == [200] * 4 and codes[4:] == [429] * 4, codes  # burst 3 + 1, whichever key
    assert unauthenticated == [429] * 3  # key guessing from that address is throttled too (auth_request)


def test_open_streams_over_the_connection_limit_get_429(tmp_path: Path, upstream: str, tls: Tls) -> None:
    _, conf, port = start_front(tmp_path, upstream, tls, limits=ProxyLimits(connections_per_key=1))
    url = f"https://localhost:{port}/v1/chat/completions"
    body = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    release = tmp_path / "release"
    started, codes = threading.Event(), []

    def hold_a_stream() -> None:
        # The stand-in holds this stream after its first token until `release` exists: it is still open when the
        # second request arrives however slow the machine (it used to end on its own ~1.3 s after it started).
        hold = {**bearer(CLIENT_KEYS["team-a"]), "X-Standin-Hold": f"{release} {HTTP_TIMEOUT_S}"}
        with httpx.Client(verify=tls_context(tls.pem), timeout=HTTP_TIMEOUT_S) as c, \
                c.stream("POST", url, json=body, headers=hold) as response:
            started.set()
            codes.append(response.status_code)
            response.read()

    with running_nginx(conf, port):
        holder = threading.Thread(target=hold_a_stream)
        holder.start()
        try:
            assert started.wait(HTTP_TIMEOUT_S)
            second = httpx.post(url, json=body, headers=bearer(CLIENT_KEYS["team-a"]), verify=tls_context(tls.pem),
                                timeout=HTTP_TIMEOUT_S)
        finally:
            release.touch()
            holder.join(HTTP_TIMEOUT_S)
    assert codes == [200] and second.status_code == 429


def test_a_body_over_the_cap_gets_413(tmp_path: Path, upstream: str, tls: Tls) -> None:
    _, conf, port = start_front(tmp_path, upstream, tls, max_body_mb=1)
    with running_nginx(conf, port), httpx.Client(base_url=f"https://localhost:{port}",
                                                  verify=tls_context(tls.pem), timeout=HTTP_TIMEOUT_S) as c:
        big = c.post("/v1/chat/completions", headers=bearer(CLIENT_KEYS["team-a"]),
                     content=b'{"prompt":"' + b"x" * (1024 * 1024 + 10) + b'"}')
        small = c.post("/v1/completions", headers=bearer(CLIENT_KEYS["team-a"]), json={"prompt": "x" * 1000})
    assert big.status_code == 413 and small.status_code == 200


# --- TLS ----------------------------------------------------------------------------------------------------

def test_tls_handshake_with_the_generated_certificate(front: Front) -> None:
    port = int(front.url.rsplit(":", 1)[1])

    with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT_S) as raw, \
            tls_context(front.tls.pem).wrap_socket(raw, server_hostname="localhost") as conn:
        assert conn.version() in ("TLSv1.2", "TLSv1.3")
        assert dict(x[0] for x in conn.getpeercert()["subject"])["commonName"] == "localhost"
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # not trusted without the stack's cert
        httpx.get(front.url + "/health", verify=ssl.create_default_context(), timeout=HTTP_TIMEOUT_S)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):  # both protocols nginx is told to offer
        context = tls_context(front.tls.pem)
        context.minimum_version = context.maximum_version = version
        with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT_S) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as conn:
            assert conn.version() == version.name.replace("_", ".")
    with pytest.raises(ssl.SSLCertVerificationError), socket.create_connection(("127.0.0.1", port)) as raw:
        tls_context(front.tls.pem).wrap_socket(raw, server_hostname="api.other.example")  # name not on the cert
    plain = httpx.get(f"http://localhost:{port}/health", timeout=HTTP_TIMEOUT_S)  # plain HTTP on the TLS port: 400
    assert plain.status_code == 400


# --- SSE ----------------------------------------------------------------------------------------------------

def stream_through(url: str, headers: dict[str, str], verify: ssl.SSLContext | bool, release: Path,
                   hold_s: float) -> tuple[str, int, bool]:
    """One streamed chat. The stand-in holds the answer after its first token until `release` exists or `hold_s`
    pass; this client creates `release` as soon as it reads that first token. Returns how the hold ended
    ("released": the first token reached the client while the rest was still held back, i.e. unbuffered;
    "expired": it did not), the number of content chunks and whether [DONE] came."""
    body = {"stream": True, "messages": [{"role": "user", "content": "17*19"}]}
    hold, chunks, done = "", 0, False
    with httpx.Client(verify=verify, timeout=HTTP_TIMEOUT_S) as c, \
            c.stream("POST", url + "/v1/chat/completions", json=body,
                     headers={**headers, "X-Standin-Hold": f"{release} {hold_s:g}"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line.removeprefix("data:"))
            if "standin_hold" in event:
                hold = event["standin_hold"]
                continue
            chunks += 1
            release.touch()
    return hold, chunks, done


def test_streamed_chunks_pass_through_unbuffered_and_end_with_done(front: Front, tmp_path: Path) -> None:
    direct = stream_through(front.direct, bearer(UPSTREAM_KEY), False, tmp_path / "direct", 60)
    proxied = stream_through(front.url, bearer(CLIENT_KEYS["team-a"]), tls_context(front.tls.pem),
                             tmp_path / "proxied", 60)
    assert direct == ("released", 3, True)
    assert proxied == ("released", 3, True)  # the first token arrived while the stand-in held the rest back


def test_the_sse_check_fails_when_nginx_buffers(tmp_path: Path, upstream: str, tls: Tls) -> None:
    """Negative control: with proxy_buffering on, the first chunk waits for the whole answer, so the client cannot
    release the hold: it expires (after 3 s, only the length of this control)."""
    _, conf, port = start_front(tmp_path, upstream, tls)
    conf.write_text(conf.read_text().replace("proxy_buffering off;", "proxy_buffering on;"))
    with running_nginx(conf, port):
        buffered = stream_through(f"https://localhost:{port}", bearer(CLIENT_KEYS["team-a"]), tls_context(tls.pem),
                                  tmp_path / "buffered", 3)
    assert buffered == ("expired", 3, True)


# --- access log ---------------------------------------------------------------------------------------------

def test_access_log_names_the_client_never_the_key(front: Front) -> None:
    log = front.directory / "access.log"
    before = log.stat().st_size  # the front is shared: only this test's entries count

    def entries() -> list[dict[str, Any]]:
        text = log.read_bytes()[before:].decode()
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]  # whole lines only

    with front.client() as c:
        c.get("/v1/models", headers=bearer(CLIENT_KEYS["ops"]))
        c.get("/v1/models", headers=bearer("sk-wrong-0000000000000000"))
    # nginx writes an entry once the response is sent, so it may come after the client has its answer
    wait_for(lambda: len(entries()) >= 2, lambda: f"both requests in the access log: {entries()}", 120)
    assert any(e["client"] == "ops" and e["path"] == "/v1/models" and e["status"] == 200 for e in entries())
    assert any(e["client"] == "" and e["status"] == 401 for e in entries())
    text = log.read_text()
    for secret in (*CLIENT_KEYS.values(), UPSTREAM_KEY, "sk-wrong"):
        assert secret not in text


# --- the post-deploy API checks, through the proxy ----------------------------------------------------------

def test_planned_api_checks_pass_through_the_proxy_with_a_client_key(front: Front, prod_values: dict[str, Any]
                                                                      ) -> None:
    config = parse_config("prod", with_proxy(prod_values))
    plan = build_plan("prod", config)
    sections = api_sections(plan)
    assert {"auth", "deny"} <= set(sections)
    argv = shlex.split(api_command(config, plan, sections, "api-smoke"))
    assert argv[argv.index("--url") + 1] == plan.endpoint == "https://10.30.8.1:443"
    argv[argv.index("--url") + 1] = front.url
    argv[0] = sys.executable
    env = {"VLLM_API_KEY": CLIENT_KEYS["team-a"], "VLLM_TLS_CA": front.tls.pem, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([*argv, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, out.stdout
    assert set(verdict["details"]) == {"health", "models", "chat", "thinking", "stream", "auth", "deny"}
    assert {p["rank"] for p in verdict["details"]["chat"]["probes"]} == {0, 1}  # each rank pinned through nginx
    assert CLIENT_KEYS["team-a"] not in out.stdout and "BEGIN CERTIFICATE" not in out.stdout
    # Without the stack's certificate the same check refuses the connection: TLS is verified, not skipped.
    del env["VLLM_TLS_CA"]
    out = subprocess.run([*argv, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in out.stdout


def test_deny_check_fails_against_vllm_directly(front: Front) -> None:
    """Pointed at vLLM's own port (no proxy in the way), the deny check reports the open paths."""
    argv = [sys.executable, "-m", "checks.api", "--url", front.direct, "--served-name", "DeepSeek-V4.1-Flash",
            "--sections", "deny", "--deny-paths", ",".join(DENIED_PATHS[:8]), "--json"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"VLLM_API_KEY": UPSTREAM_KEY, "PATH": "/usr/bin:/bin"})
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1 and "/metrics 200" in verdict["evidence"][0]


# --- the upstream follows serving.host -----------------------------------------------------------------------

def test_requests_reach_vllm_on_ipv6_loopback(tmp_path: Path, tls: Tls, h20_values: dict[str, Any]) -> None:
    """vLLM bound to ::1 (serving.host): the generated upstream is `[::1]:port` and requests arrive there. Before,
    the upstream was hard-coded 127.0.0.1 and every request would have been a 503."""
    port = free_port()
    with standin("--host", "::1", "--api-key-env", "STANDIN_KEY", env={"STANDIN_KEY": UPSTREAM_KEY}) as url:
        upstream_port = int(url.rsplit(":", 1)[1])  # listening on ::1 only (standin waits for it)
        values = with_proxy(h20_values, bind="127.0.0.1", port=port)
        values["serving"] |= {"host": "::1", "port": upstream_port}
        config = parse_config("h20", values)
        door = front_door(config)
        assert door.upstream == f"[::1]:{upstream_port}"
        assert build_plan("h20", config).proxy is not None
        conf = write_conf(tmp_path, door, 0, tls)
        assert f'server "[::1]:{upstream_port}";' in conf.read_text()
        with running_nginx(conf, port), httpx.Client(base_url=f"https://localhost:{port}",
                                                      verify=tls_context(tls.pem), timeout=HTTP_TIMEOUT_S) as c:
            models = c.get("/v1/models", headers=bearer(CLIENT_KEYS["team-a"]))
            health = c.get("/health")
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "DeepSeek-V4.1-Flash"
        assert health.status_code == 200
        wrong = FrontDoor.of(config.api.proxy, upstream_port)  # 127.0.0.1: nothing listens there
        conf = write_conf(tmp_path, wrong, 0, tls)
        with running_nginx(conf, port), httpx.Client(base_url=f"https://localhost:{port}",
                                                      verify=tls_context(tls.pem), timeout=HTTP_TIMEOUT_S) as c:
            assert c.get("/health").status_code == 503


# --- slow and half-open clients -------------------------------------------------------------------------------

FLOOD = 4500
"""More connections than the worker's 4096 of the config before the stream limit: enough to starve it then."""


def _half_open_flood(source: str, port: int, count: int, deadline_s: float) -> list[socket.socket]:
    """`count` TCP connections from `source` to the proxy, each sending the first 3 bytes of a TLS record and
    nothing more (a half-open TLS handshake); returns the sockets, the caller closes them. Non-blocking connects
    with one overall deadline: a server that stops accepting cannot hang this."""
    import selectors

    selector = selectors.DefaultSelector()
    sockets: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((source, 0))
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE)
        sockets.append(sock)
    pending = len(sockets)
    deadline = time.monotonic() + deadline_s
    while pending and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            selector.unregister(sock)
            pending -= 1
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                with contextlib.suppress(OSError):
                    sock.send(b"\x16\x03\x01")
    selector.close()
    return sockets


def _closed_by_peer(sockets: list[socket.socket], enough: int, deadline_s: float) -> int:
    """How many of `sockets` the server closed (EOF or reset), waiting until `enough` are or the deadline."""
    import selectors

    selector = selectors.DefaultSelector()
    for sock in sockets:
        with contextlib.suppress(ValueError, OSError):
            selector.register(sock, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + deadline_s
    while closed < enough and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            selector.unregister(sock)
            try:
                closed += sock.recv(1) == b""
            except OSError:
                closed += 1
    selector.close()
    return closed


def test_half_open_connections_from_one_address_do_not_stop_another(tmp_path: Path, upstream: str,
                                                                     tls: Tls) -> None:
    """One address (127.0.0.2) opens thousands of connections that never finish the TLS handshake; another
    (127.0.0.3) still gets its answer. nginx runs with the open-files limit a container often gets (soft 1024):
    before the stream limit the flood took every descriptor (`accept4() failed (24: Too many open files)`) and the
    other address waited for the flood's 60 s header timeout. Now the stream server counts connections per address
    as they are accepted and closes all but `connections_per_client` of the flood at once."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FLOOD + 4096), hard))
    _, conf, port = start_front(tmp_path, upstream, tls, limits=ProxyLimits(connections_per_client=20))
    conf_text = conf.read_text()
    assert "client_header_timeout 10s;" in conf_text and "limit_conn tcp_per_address 20;" in conf_text
    with running_nginx(conf, port, nofile=1024):
        flood = _half_open_flood("127.0.0.2", port, FLOOD, deadline_s=30)
        try:
            answer: list[httpx.Response | BaseException] = []

            def other_address() -> None:
                transport = httpx.HTTPTransport(local_address="127.0.0.3", verify=tls_context(tls.pem))
                try:
                    with httpx.Client(transport=transport, timeout=60) as other:
                        answer.append(other.get(f"https://localhost:{port}/v1/models",
                                                headers=bearer(CLIENT_KEYS["ops"])))
                except Exception as exc:  # reported by the assertion below
                    answer.append(exc)

            asking = threading.Thread(target=other_address, daemon=True)
            asking.start()
            # Generous: an answer takes well under a second; a starved worker answers only once the flood's
            # connections time out (60 s, nginx's default header timeout, before this change).
            asking.join(30)
            assert answer, "the other address got no answer within 30 s: the flood starved the worker"
            reply = answer[0]
            assert isinstance(reply, httpx.Response) and reply.status_code == 200, reply
            # the flood itself was cut at the limit: nginx closed all but 20 of its connections at once
            assert _closed_by_peer(flood, FLOOD - 20, deadline_s=30) >= FLOOD - 20
        finally:
            for sock in flood:
                sock.close()
    log = (tmp_path / "error.log").read_text()
    refused = [line for line in log.splitlines() if 'limiting connections by zone "tcp_per_address"' in line]
    assert refused and all("client: 127.0.0.2," in line for line in refused), log[-2000:]
