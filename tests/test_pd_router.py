"""The router in front of disaggregated prefill/decode, and checks/pd.py: the real vllm-router 0.1.17 (the pinned
wheel, tests/router_harness.py) in front of the prefill/decode stand-ins (tests/pd_standin.py), which speak vLLM
0.33.0's NixlConnector protocol.

What is proved here: the router's command line as stacks/planner/router.py renders it starts the real router and its
own parser reads it back; a request goes prefill (max_tokens 1, kv_transfer_params do_remote_decode) -> decode (the
prefill's kv_transfer_params, the stack's key from OPENAI_API_KEY); checks/pd.py passes when every pair moved KV and
fails, with the decode's counters as evidence, when a transfer fails (either kv_load_failure_policy) or the decode
computes the prompt itself; hostile router settings are refused before anything starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checks import pd
from stacks.planner.router import (
    ROUTER_MOUNT,
    RouterSpec,
    check_pd_argv,
    router_args,
    router_argv,
    router_container,
    router_problems,
    router_url,
)
from tests.conftest import ROOT
from tests.nginx_harness import free_port
from tests.router_harness import router_command, router_runtime, wait_http

SERVED = "DeepSeek-V4.1-Flash"
KEY = "sk-pd-test-key"


class Instance:
    """One stand-in process: its API base URL, side-channel port and engine id."""

    def __init__(self, stack: ExitStack, tmp: Path, name: str, role: str, *flags: str) -> None:
        port_file = tmp / f"{name}.port"
        log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 (closed by the stack)
        stack.callback(log.close)
        self.engine_id = f"engine-{name}"
        env = dict(os.environ, PD_KEY=KEY)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.pd_standin", "--role", role, "--port-file", str(port_file),
             "--engine-id", self.engine_id, "--served-model-name", SERVED, "--api-key-env", "PD_KEY", *flags],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        stack.callback(_stop, self.process)
        deadline = time.monotonic() + 20
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {(tmp / f'{name}.log').read_text()}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text().split()[0]}"

    def log(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/standin/log", timeout=5) as response:
            return list(json.load(response)["requests"])


def _stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_router(stack: ExitStack, tmp: Path, spec: RouterSpec) -> subprocess.Popen[bytes]:
    argv, env = router_command(router_args(spec))
    env["OPENAI_API_KEY"] = KEY  # what the container gets from the stack's api_key secret
    log = open(tmp / "router.log", "wb")  # noqa: SIM115 (closed by the stack)
    stack.callback(log.close)
    process = subprocess.Popen(argv, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env=env)
    stack.callback(_stop, process)
    try:
        wait_http(router_url(spec) + "/health", 30, process)
    except (RuntimeError, TimeoutError) as exc:
        raise RuntimeError(f"{exc}\n{(tmp / 'router.log').read_text(errors='replace')[-3000:]}") from None
    return process


def spec_for(prefills: list[Instance], decodes: list[Instance], **kwargs: Any) -> RouterSpec:
    return RouterSpec(prefill_urls=tuple(p.url for p in prefills), decode_urls=tuple(d.url for d in decodes),
                      host="127.0.0.1", port=free_port(), prometheus_port=free_port(),
                      worker_startup_check_interval_s=1, **kwargs)


def run_check(spec: RouterSpec, *extra: str) -> tuple[int, dict[str, Any]]:
    argv = check_pd_argv(spec, SERVED, program=(sys.executable, "-m", "checks.pd"), api_key_env="PD_KEY")
    done = subprocess.run([*argv, "--metrics-wait-s", "3", "--json", *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PD_KEY=KEY))
    return done.returncode, json.loads(done.stdout)


def chat(url: str, content: str) -> dict[str, Any]:
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": 64})
    request = urllib.request.Request(url + "/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.load(response))


@pytest.fixture(scope="module")
def runtime() -> tuple[Path, Path]:
    """The pinned router, fetched and unpacked once per cache (tests/router_harness.py)."""
    return router_runtime()


@pytest.fixture(scope="module")
def cluster(runtime: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[RouterSpec, list[Instance], list[Instance]]]:
    """Two prefills and two decodes behind the real router, round robin on both sides."""
    tmp = tmp_path_factory.mktemp("pd")
    with ExitStack() as stack:
        prefills = [Instance(stack, tmp, f"p{i}", "prefill") for i in range(2)]
        decodes = [Instance(stack, tmp, f"d{i}", "decode") for i in range(2)]
        spec = spec_for(prefills, decodes, policy="round_robin")
        start_router(stack, tmp, spec)
        yield spec, prefills, decodes


# --- the real router --------------------------------------------------------------------------------------------

def test_the_routers_own_parser_reads_the_rendered_arguments(runtime: tuple[Path, Path]) -> None:
    spec = RouterSpec(prefill_urls=("http://10.30.8.2:8000", "http://[fd00::3]:8000"),
                      decode_urls=("http://10.30.8.4:8000",), host="127.0.0.1", port=8090,
                      prefill_policy="cache_aware", decode_policy="round_robin")
    argv, env = router_command([])
    probe = ("import json, sys; from vllm_router.launch_router import parse_router_args; "
             "a = parse_router_args(sys.argv[1:]); a._validate_router_args(); "
             "print(json.dumps({k: getattr(a, k) for k in ('vllm_pd_disaggregation', 'prefill_urls', 'decode_urls', "
             "'policy', 'prefill_policy', 'decode_policy', 'host', 'port', 'prometheus_host', 'prometheus_port', "
             "'kv_connector', 'api_key', 'worker_startup_check_interval')}))")
    done = subprocess.run([argv[0], "-c", probe, *router_args(spec)], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    parsed = json.loads(done.stdout)
    assert parsed["vllm_pd_disaggregation"] is True
    assert parsed["prefill_urls"] == [["http://10.30.8.2:8000", None], ["http://[fd00::3]:8000", None]]
    assert parsed["decode_urls"] == ["http://10.30.8.4:8000"]
    assert (parsed["policy"], parsed["prefill_policy"], parsed["decode_policy"]) == ("cache_aware", "cache_aware",
                                                                                      "round_robin")
    assert (parsed["host"], parsed["port"], parsed["kv_connector"]) == ("127.0.0.1", 8090, "nixl")
    assert (parsed["prometheus_host"], parsed["prometheus_port"]) == ("127.0.0.1", 29000)
    assert parsed["api_key"] is None  # the key travels in OPENAI_API_KEY, never in argv
    assert parsed["worker_startup_check_interval"] == 5


def test_a_request_goes_prefill_then_decode_with_the_prefills_kv_params(
        cluster: tuple[RouterSpec, list[Instance], list[Instance]]) -> None:
    spec, prefills, decodes = cluster
    client = pd.Client(KEY, 10)
    before = {d.url: client.counters(d.url) for d in decodes}
    seen = {i.url: len(i.log()) for i in (*prefills, *decodes)}
    answer = chat(router_url(spec), "17*19?")
    assert answer["choices"][0]["message"]["content"] == "323"
    to_prefill = [r for p in prefills for r in p.log()[seen[p.url]:]]
    to_decode = {d.url: d.log()[seen[d.url]:] for d in decodes}
    assert len(to_prefill) == 1 and sum(map(len, to_decode.values())) == 1, (to_prefill, to_decode)
    sent = to_prefill[0]
    # the router's prefill request: one token, not streamed, kv_transfer_params asking for a remote decode
    assert (sent["max_tokens"], sent["stream"]) == (1, False)
    assert sent["kv_transfer_params"] == pd.PREFILL_PARAMS
    assert re.fullmatch(r"___prefill_addr_127\.0\.0\.1:\d+___decode_addr_127\.0\.0\.1:\d+_[0-9a-f]{32}",
                        sent["x_request_id"])
    assert sent["authorization"]  # OPENAI_API_KEY: the stand-ins refuse /v1 without the key
    decode, received = next((url, got[0]) for url, got in to_decode.items() if got)
    assert received["x_request_id"] == sent["x_request_id"]
    params = received["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["transfer_mode"] == "pull"
    assert params["remote_engine_id"] in {p.engine_id for p in prefills}
    assert params["remote_request_id"].startswith("chatcmpl-" + sent["x_request_id"] + "-")
    assert (received["max_tokens"], received["authorization"]) == (64, True)  # the client's request, with the key
    ok, evidence = pd.kv_verdict("handoff", before[decode], pd.settle(client, {decode: before[decode]}, 5)[decode])
    assert ok, evidence


def test_the_check_passes_every_pair_and_the_router(cluster: tuple[RouterSpec, list[Instance], list[Instance]]
                                                   ) -> None:
    spec, prefills, decodes = cluster
    code, verdict = run_check(spec)
    assert (code, verdict["status"]) == (0, "pass"), verdict
    pairs = verdict["details"]["pairs"]["evidence"]
    assert pairs[0] == "all 4 pair(s) moved KV"
    for p in prefills:
        for d in decodes:
            assert any(line.startswith(f"{p.url} -> {d.url}: KV received") for line in pairs), (p.url, d.url)
    router = verdict["details"]["router"]["evidence"]
    assert router[0] == "answer '323'"
    assert re.search(r"via router, decode http://127\.0\.0\.1:\d+: KV received \(external_prefix_cache_hits "
                     r"\+\d+, nixl transfers \+1, failed \+0\)", router[1]), router


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_failed_transfer_fails_the_check(runtime: tuple[Path, Path], tmp_path: Path, policy: str) -> None:
    with ExitStack() as stack:
        prefill = Instance(stack, tmp_path, "p", "prefill")
        decode = Instance(stack, tmp_path, "d", "decode", "--fail-transfers", "--kv-load-failure-policy", policy)
        spec = spec_for([prefill], [decode])
        start_router(stack, tmp_path, spec)
        if policy == "recompute":  # the client sees a right answer: only the decode's counters tell
            assert chat(router_url(spec), "17*19?")["choices"][0]["message"]["content"] == "323"
        code, verdict = run_check(spec)
    assert (code, verdict["status"]) == (1, "fail"), verdict
    for section in ("router", "pairs"):
        text = " ".join(verdict["details"][section]["evidence"])
        assert "a KV transfer FAILED" in text and "failed +1" in text, (section, text)
    if policy == "fail":
        assert "decode HTTP 500 'Internal server error'" in " ".join(verdict["details"]["pairs"]["evidence"])


def test_a_decode_that_computes_the_prompt_itself_fails_the_check(runtime: tuple[Path, Path], tmp_path: Path
                                                                  ) -> None:
    with ExitStack() as stack:  # a prefill started without the KV connector returns no kv_transfer_params
        prefill = Instance(stack, tmp_path, "p", "prefill", "--no-connector")
        decode = Instance(stack, tmp_path, "d", "decode")
        spec = spec_for([prefill], [decode])
        start_router(stack, tmp_path, spec)
        code, verdict = run_check(spec)
    assert (code, verdict["status"]) == (1, "fail"), verdict
    assert "no KV arrived" in " ".join(verdict["details"]["router"]["evidence"])
    assert "the prefill answered without kv_transfer_params" in " ".join(verdict["details"]["pairs"]["evidence"])


def _authorized_chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.load(response))


def test_the_lab_engine_serves_each_tier_from_its_planned_argv(runtime: tuple[Path, Path], tmp_path: Path) -> None:
    """tests/lab/lab_engine.py laid out as in the lab's engine image (beside checks/standin.py and
    tests/pd_standin.py, nothing of this repository importable), started with each tier's argv and environment as
    the lab's prefill/decode stack plans them, only the addresses moved to this machine's loopback: the real router
    and checks/pd.py pass through both tiers, a reasoning request through the router keeps its reasoning (the front
    door's thinking check), and each tier answers a request without kv_transfer_params as a plain engine does (its
    own API check)."""
    from tests.test_pd_stack import pd as pd_values
    from tests.test_pd_stack import stack as plan_stack

    image = tmp_path / "image"
    image.mkdir()
    for source in (ROOT / "tests" / "lab" / "lab_engine.py", ROOT / "checks" / "standin.py",
                   ROOT / "tests" / "pd_standin.py"):
        (image / source.name).write_bytes(source.read_bytes())
    urls: dict[str, str] = {}
    with ExitStack() as stack:
        for group in plan_stack(pd_values()).groups:
            container = group.plan.head.containers[0]
            args, port = list(container.vllm_args or []), free_port()
            args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env |= {**container.env, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                    "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), "VLLM_API_KEY": KEY}
            log = open(tmp_path / f"{group.name}.log", "w")  # noqa: SIM115 (closed by the stack)
            stack.callback(log.close)
            process = subprocess.Popen([sys.executable, str(image / "lab_engine.py"), "serve", *args], cwd=tmp_path,
                                       stdout=log, stderr=subprocess.STDOUT, env=env)
            stack.callback(_stop, process)
            role = group.context.role if group.context else "replica"
            urls[role] = f"http://127.0.0.1:{port}"
            try:
                wait_http(urls[role] + "/health", 30, process)
            except (RuntimeError, TimeoutError) as exc:
                raise AssertionError(f"{role}: {exc}: {(tmp_path / f'{group.name}.log').read_text()}") from None
        spec = RouterSpec(prefill_urls=(urls["prefill"],), decode_urls=(urls["decode"],), host="127.0.0.1",
                          port=free_port(), prometheus_port=free_port(), worker_startup_check_interval_s=1)
        start_router(stack, tmp_path, spec)
        code, verdict = run_check(spec, "--thinking-kwarg", "enable_thinking")  # as the program runs it (Qwen3)
        assert (code, verdict["status"]) == (0, "pass"), verdict
        thinking = {"model": "Qwen3-8B", "messages": [{"role": "user", "content": "17*19?"}], "max_tokens": 1024}
        via_router = chat(router_url(spec), thinking["messages"][0]["content"]) | {}
        answered = _authorized_chat(router_url(spec), thinking)["choices"][0]["message"]
        assert answered["content"] == "323" and answered.get("reasoning_content"), answered
        streamed = json.dumps(thinking | {"stream": True, "chat_template_kwargs": {"enable_thinking": False}})
        request = urllib.request.Request(router_url(spec) + "/v1/chat/completions", streamed.encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:  # the front door's stream check
            events = [line.decode().strip() for line in response if line.startswith(b"data:")]
        pieces = [json.loads(e[5:])["choices"][0]["delta"].get("content", "") for e in events[:-1]
                  if json.loads(e[5:]).get("choices")]
        assert events[-1] == "data: [DONE]" and "".join(pieces) == "323", events
        for role, url in urls.items():
            plain = _authorized_chat(url, thinking)
            assert plain["choices"][0]["message"]["content"] == "323" and plain["kv_transfer_params"] is None, role
        assert via_router["choices"][0]["message"]["content"] == "", via_router  # thinking used up 64 tokens


# --- the rendering and its refusals -----------------------------------------------------------------------------

GOOD = RouterSpec(prefill_urls=("http://10.30.8.2:8000",), decode_urls=("http://10.30.8.3:8000",),
                  host="127.0.0.1", port=8090)


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"prefill_urls": ("http://u:pw@10.30.8.2:8000",)}, "router.prefill_urls.0", "credentials"),
    ({"prefill_urls": ("http://10.30.8.2:8000/v1",)}, "router.prefill_urls.0", "path, query"),
    ({"prefill_urls": ("http://10.30.8.2:8000?x=1",)}, "router.prefill_urls.0", "path, query"),
    ({"prefill_urls": ("http://10.30.8.2:8000 --api-key sk-x",)}, "router.prefill_urls.0", "one line"),
    ({"prefill_urls": ("--api-key=sk-x",)}, "router.prefill_urls.0", "over http://"),
    ({"prefill_urls": ("https://10.30.8.2:8000",)}, "router.prefill_urls.0", "over http://"),
    ({"decode_urls": ("http://10.30.8.3",)}, "router.decode_urls.0", "explicit port"),
    ({"decode_urls": ("http://10.30.8.3:99999",)}, "router.decode_urls.0", "port"),
    ({"decode_urls": ("http://0.0.0.0:8000",)}, "router.decode_urls.0", "no one host"),
    ({"decode_urls": ("http://10.30.8.2:8000",)}, "router.decode_urls.0", "either a prefill or a decode"),
    ({"decode_urls": ()}, "router.decode_urls", "no decode instance"),
    ({"host": "0.0.0.0"}, "router.host", "checks no client key"),
    ({"host": "::"}, "router.host", "checks no client key"),
    ({"host": "8.8.8.8"}, "router.host", "public address"),
    ({"host": "router.example.com"}, "router.host", "not an IP address"),
    ({"prometheus_host": "0.0.0.0"}, "router.prometheus_host", "checks no client key"),
    ({"port": 0}, "router.port", "not a TCP port"),
    ({"port": True}, "router.port", "not a TCP port"),
    ({"prometheus_port": 8090}, "router.prometheus_port", "router's own port"),
    ({"policy": "power_of_two"}, "router.policy", "does not serve: every load reads the same"),
    ({"decode_policy": "kv_aware"}, "router.decode_policy", "not used with vLLM 0.33.0"),
    ({"prefill_policy": "least_loaded; rm -rf /"}, "router.prefill_policy", "not a router policy"),
    ({"request_timeout_s": -1}, "router.request_timeout_s", "not a number of seconds"),
])
def test_hostile_router_settings_are_refused(change: dict[str, Any], key: str, words: str) -> None:
    spec = replace(GOOD, **change)
    problems = router_problems(spec)
    assert [p.key for p in problems] == [key], [p.render() for p in problems]
    assert words in problems[0].message + (problems[0].upstream or "")
    assert problems[0].fix
    with pytest.raises(ValueError, match=re.escape(key)):
        router_args(spec)


def test_the_container_gets_the_key_by_environment_and_the_wheel_read_only() -> None:
    container = router_container(GOOD, "vllm-router-prod", "vllm/vllm-openai:v0.33.0", "/var/lib/vllm-cluster/router",
                                 "prod")
    assert container.secret_env == {"OPENAI_API_KEY": "api_key"}
    assert not any("key" in word.lower() for word in container.command)
    assert container.entrypoint == ["python3", "-m", "vllm_router.launch_router"]
    assert container.env["PYTHONPATH"] == ROUTER_MOUNT
    assert [(v.host, v.container, v.read_only) for v in container.volumes] == [
        ("/var/lib/vllm-cluster/router", ROUTER_MOUNT, True)]
    assert container.command == router_args(GOOD) == router_argv(GOOD)[1:]
    assert router_argv(GOOD)[0] == "vllm-router"  # the wheel's console script, where it is installed


def test_the_check_refuses_bad_arguments_naming_the_flag() -> None:
    cases = [
        (["--decode-urls", "http://u:p@10.0.0.1:8000", "--sections", "pairs", "--prefill-urls",
          "http://10.0.0.2:8000"], "--decode-urls 'http://***@10.0.0.1:8000'"),
        (["--decode-urls", "http://10.0.0.1:8000"], "--router-url: needed by the router section"),
        (["--decode-urls", "http://10.0.0.1:8000", "--sections", "pairs"], "--prefill-urls: empty"),
        (["--sections", "pairs", "--prefill-urls", "http://10.0.0.2:8000"], "--decode-urls: empty"),
        (["--decode-urls", "http://10.0.0.1:8000,http://10.0.0.1:8000/", "--sections", "router", "--router-url",
          "http://10.0.0.3:8090"], "--decode-urls: names an instance twice"),
        (["--decode-urls", "http://10.0.0.1:8000", "--router-url", "http://10.0.0.3:8090/v1", "--sections",
          "router"], "--router-url 'http://10.0.0.3:8090/v1': only http(s)://host:port"),
        (["--decode-urls", "http://10.0.0.1:8000", "--sections", "router", "--router-url", "http://10.0.0.3:8090",
          "--expect", ".*"], "--expect '.*'"),
        (["--sections", "everything"], "--sections"),
    ]
    for args, words in cases:
        done = subprocess.run([sys.executable, "-m", "checks.pd", "--served-name", SERVED, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stdout.startswith("CANNOT-RUN pd: bad argument: ") and words in done.stdout, (args, done.stdout)
        assert "u:p@" not in done.stdout + done.stderr
