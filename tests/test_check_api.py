"""API checks against a real stand-in server process: each check passes and fails when it should."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.waiting import wait_for

WAIT_S = 120
"""Deadline for a process of these tests to print or count what a test waits for: generous, a loaded machine is slow."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standin(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """The server on a free port; yields once it listens (its ready line), except with --start-delay-s, whose
    tests wait through the closed port themselves."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "checks.standin", "--port", str(port), *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, text=True)
    try:
        if "--start-delay-s" not in args:
            assert proc.stdout is not None
            ready = proc.stdout.readline()  # one line, printed once it listens; '' if it exited
            assert ready.startswith("serving "), f"the test server did not start: {ready!r}"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def run_api(url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "checks.api", "--url", url, "--served-name", "DeepSeek-V4.1-Flash",
                          "--json", "--interval-s", "1", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    lines = out.stdout.strip().splitlines()
    return out.returncode, json.loads(lines[-1]), out.stdout


def test_all_sections_pass_after_slow_start_and_503() -> None:
    with standin("--start-delay-s", "2", "--unhealthy-s", "2") as url:
        start = time.monotonic()
        code, verdict, stdout = run_api(url, "--deadline-s", "90")  # generous, yet before run_api gives up
        elapsed = time.monotonic() - start
    assert code == 0, stdout
    assert verdict["status"] == "pass"
    assert set(verdict["details"]) == {"health", "models", "chat", "thinking", "stream"}
    assert elapsed >= 3.5  # waited through the closed port and the 503s
    progress = [line for line in stdout.splitlines() if line.startswith("[api]")]
    assert progress and "elapsed, phase:" in progress[0]
    assert any("loading (port closed)" in line or "starting" in line for line in progress)


def test_health_deadline_fails_with_phase() -> None:
    with standin("--unhealthy-s", "600") as url:
        code, verdict, _ = run_api(url, "--deadline-s", "3", "--sections", "health,models")
    assert code == 1 and verdict["status"] == "fail"
    assert any("phase starting" in e for e in verdict["evidence"])
    assert "models" not in verdict["details"]  # stops after health fails


@contextmanager
def canned_server(status: int, body: bytes, headers: dict[str, str] | None = None) -> Iterator[str]:
    """A loopback HTTP server answering every GET and POST with one fixed response (a front door that refuses,
    a body that lies about its encoding): what the stand-in engine never sends."""
    class Canned(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_health_refused_by_the_front_door_fails_at_once() -> None:
    """A 403 from a proxy whose allowlist lacks /health is an answer, not a loading engine: no wait to the
    deadline (the plan refuses such an allowlist too)."""
    with canned_server(403, b'{"error": "forbidden"}') as url:
        # waiting for this deadline would outlast run_api's 120 s timeout and fail the test
        code, verdict, _ = run_api(url, "--deadline-s", "3600")
    assert code == 1
    assert verdict["evidence"][0].startswith("health: /health HTTP 403"), verdict
    assert "allowed_paths must include /health" in json.dumps(verdict)


def test_a_dropped_rank_header_fails_the_chat_section() -> None:
    """A path that loses X-data-parallel-rank load-balances the probes: each "rank r" may reach any engine.
    The control probe at rank N (which vLLM refuses with 400) answers 200 there, and the section fails."""
    with standin("--dp-size", "2", "--drop-rank-header") as url:
        code, verdict, _ = run_api(url, "--sections", "chat", "--dp-size", "2")
    assert code == 1, verdict
    assert any("rank control: rank 2 of a DP2 endpoint answered 200" in e for e in verdict["evidence"]), verdict
    assert "keep X-data-parallel-rank through every proxy" in verdict["next_step"]
    with standin("--dp-size", "2") as url:
        code, verdict, _ = run_api(url, "--sections", "chat", "--dp-size", "2")
    assert code == 0 and any("rank control: rank 2 refused (HTTP 400" in e for e in verdict["evidence"])


def test_thinking_on_must_answer_right_too() -> None:
    with standin("--dp-size", "2", "--wrong-rank", "1") as url:
        code, verdict, _ = run_api(url, "--sections", "thinking", "--dp-size", "2")
    assert code == 1 and verdict["summary"].endswith("failing: rank 1"), verdict
    assert any(e.startswith("thinking: rank 1 answered '324'") for e in verdict["evidence"])


def test_wrong_answer_fails_at_once_with_answer() -> None:
    with standin("--answer", "324") as url:  # retrying to the 4200 s default deadline would outlast run_api's 120 s
        code, verdict, _ = run_api(url, "--sections", "chat")
    assert code == 1
    assert verdict["evidence"] == ["chat: the endpoint answered '324' for '17*19…' expected /323/ (full match)"]


def test_missing_reasoning_fails() -> None:
    with standin("--no-reasoning") as url:
        code, verdict, _ = run_api(url, "--sections", "thinking")
    assert code == 1 and "no reasoning content" in verdict["evidence"][0]


def test_stream_without_done_fails() -> None:
    with standin("--no-done") as url:
        code, verdict, _ = run_api(url, "--sections", "stream")
    assert code == 1 and "[DONE] missing" in verdict["evidence"][0]


def test_wrong_served_name_fails() -> None:
    with standin("--served-name", "other") as url:
        code, verdict, _ = run_api(url, "--sections", "models")
    assert code == 1 and "['other']" in verdict["evidence"][0]


def test_bearer_key_from_env_and_auth_enforced() -> None:
    env = {"STANDIN_KEY": "sk-test-123"}
    with standin("--api-key-env", "STANDIN_KEY", env=env) as url:
        code, verdict, stdout = run_api(url, "--sections", "models,chat",
                                        env={"VLLM_API_KEY": "sk-test-123"})
        assert code == 0, stdout
        assert verdict["details"]["auth"]["ok"] is True
        assert "sk-test-123" not in stdout
        code, verdict, _ = run_api(url, "--sections", "models", env={"VLLM_API_KEY": "wrong"})
        assert code == 1 and "401" in verdict["evidence"][0]


def test_auth_not_enforced_fails() -> None:
    with standin() as url:
        code, verdict, _ = run_api(url, "--sections", "models", env={"VLLM_API_KEY": "sk-x"})
    assert code == 1 and "not 401" in " ".join(verdict["evidence"])


def test_unreachable_is_a_connection_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, verdict, _ = run_api(url, "--sections", "models")
    assert code == 1 and "ConnectError" in verdict["evidence"][0]


# --- every DP rank, pinned with X-data-parallel-rank -----------------------------------------------------------

RANKED = ("--dp-size", "2", "--rank-nodes", "node1,node2")


def test_every_rank_answers_with_latency_and_tokens() -> None:
    with standin("--dp-size", "2") as url:
        code, verdict, stdout = run_api(url, "--sections", "chat,thinking,stream", *RANKED)
    assert code == 0, stdout
    chat = verdict["details"]["chat"]
    assert [(p["rank"], p["node"], p["answer"], p["tokens"]) for p in chat["probes"]] == [
        (0, "node1", "323", 3), (1, "node2", "323", 3)]
    assert chat["evidence"][0].startswith("rank 0 (node1) 323 in ") and chat["evidence"][0].endswith("s, 3 tokens")
    assert chat["evidence"][1].startswith("rank 1 (node2) 323 in ")
    assert [p["rank"] for p in verdict["details"]["thinking"]["probes"]] == [0, 1]
    stream = verdict["details"]["stream"]["evidence"]
    assert stream[1].startswith("rank 1 (node2) streamed 323 in ") and "3 tokens, [DONE]" in stream[1]


def test_one_wrong_rank_fails_and_the_verdict_names_it_and_its_node() -> None:
    with standin("--dp-size", "2", "--wrong-rank", "1") as url:
        code, verdict, stdout = run_api(url, "--sections", "chat,stream", *RANKED)
        human = subprocess.run([sys.executable, "-m", "checks.api", "--url", url, "--served-name",
                                "DeepSeek-V4.1-Flash", "--sections", "chat", "--name", "api-golden", *RANKED],
                               cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert code == 1, stdout
    assert verdict["summary"].endswith("; failing: rank 1 (node2)")
    chat = verdict["details"]["chat"]["evidence"]
    assert chat[0] == "rank 1 (node2) answered '324' for '17*19…' expected /323/ (full match)"
    assert chat[1].startswith("rank 0 (node1) 323 in ")
    assert verdict["details"]["stream"]["evidence"][0].startswith("rank 1 (node2) for '17*19…': streamed '324'")
    line = human.stdout.strip()
    assert human.returncode == 1
    assert line.startswith("FAIL api-golden: 1 failed: chat; failing: rank 1 (node2) | evidence: "
                           "chat: rank 1 (node2) answered '324' for '17*19…' expected /323/ (full match); "
                           "chat: rank 0 (node1) 323 in "), line
    assert "| next step: a wrong answer at temperature 0 on one rank" in line


def test_without_pinning_a_wrong_rank_goes_unnoticed() -> None:
    """Why the header matters: the balanced path sends the one chat request to a good rank."""
    with standin("--dp-size", "2", "--wrong-rank", "1") as url:
        code, verdict, stdout = run_api(url, "--sections", "chat")
    assert code == 0, stdout
    assert verdict["details"]["chat"]["evidence"][0].startswith("the endpoint 323 in ")


def test_a_rank_beyond_the_engines_dp_size_is_refused_as_vllm_refuses_it() -> None:
    with standin("--dp-size", "2") as url:
        code, verdict, stdout = run_api(url, "--sections", "chat,stream", "--dp-size", "3")
    assert code == 1, stdout
    assert verdict["details"]["chat"]["evidence"][0] == (
        "rank 2 for '17*19…': HTTP 400: data_parallel_rank 2 is out of range [0, 2).")
    assert verdict["details"]["stream"]["evidence"][0].startswith(
        "rank 2 for '17*19…': error in the stream: data_parallel_rank 2 is out of range [0, 2).")
    assert "must be parallelism.data" in verdict["next_step"]


def test_a_dead_rank_is_reported_with_the_engines_error() -> None:
    with standin("--dp-size", "2", "--down-rank", "0") as url:
        code, verdict, _ = run_api(url, "--sections", "chat", *RANKED)
    assert code == 1 and verdict["summary"].endswith("failing: rank 0 (node1)")
    assert verdict["evidence"][0] == ("chat: rank 0 (node1) for '17*19…': HTTP 500: The server had an error while "
                                      "processing your request.")
    assert "engine log" in verdict["next_step"]


def test_several_ranks_per_node() -> None:
    with standin("--dp-size", "4", "--wrong-rank", "2") as url:
        code, verdict, _ = run_api(url, "--sections", "chat", "--dp-size", "4",
                                   "--rank-nodes", "node1,node1,node2,node2")
    assert code == 1 and verdict["summary"].endswith("failing: rank 2 (node2)")
    assert [p["node"] for p in verdict["details"]["chat"]["probes"]] == ["node1", "node1", "node2", "node2"]


# --- the golden set --------------------------------------------------------------------------------------------

def test_golden_set_runs_every_pair_on_every_rank() -> None:
    golden = json.dumps([{"prompt": "17*19等于多少？只返回数字。", "expect": "3\\d3"},
                         {"prompt": "what is 17*19?", "expect": "32[0-9]"}], ensure_ascii=False)
    with standin("--dp-size", "2") as url:
        code, verdict, stdout = run_api(url, "--sections", "chat", *RANKED, "--golden-json", golden)
        assert code == 0, stdout
        assert len(verdict["details"]["chat"]["probes"]) == 4
        assert "for 'what …'" in verdict["details"]["chat"]["evidence"][1]
        wrong = json.dumps([{"prompt": "a", "expect": "323"}, {"prompt": "what is 2+2?", "expect": "4"}])
        code, verdict, _ = run_api(url, "--sections", "chat", *RANKED, "--golden-json", wrong)
    assert code == 1
    assert verdict["details"]["chat"]["evidence"][:2] == [
        "rank 0 (node1) answered '323' for 'what …' expected /4/ (full match)",
        "rank 1 (node2) answered '323' for 'what …' expected /4/ (full match)"]


def test_answer_is_stripped_of_one_full_stop_then_fully_matched() -> None:
    with standin("--answer", " 323。\n") as url:
        assert run_api(url, "--sections", "chat")[0] == 0
    with standin("--answer", "1323") as url:
        assert run_api(url, "--sections", "chat")[0] == 1  # a search would have passed this


def run_bad(*args: str) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "checks.api", "--url", "http://127.0.0.1:9", "--served-name", "m",
                          *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout + out.stderr


def test_bad_arguments_exit_2_with_the_argument_value_and_fix() -> None:
    cases = {
        ("--dp-size", "2", "--rank-nodes", "node1"): "--rank-nodes 'node1': needs one node name per DP rank (2)",
        ("--dp-size", "0"): "--dp-size '0': out of range; 1 to 1024",
        ("--dp-size", "100000"): "--dp-size '100000': out of range; 1 to 1024",
        ("--timeout-s", "-5"): "--timeout-s '-5': a finite number more than 0 and at most 3600 seconds",
        ("--timeout-s", "0"): "--timeout-s '0': a finite number more than 0",
        ("--deadline-s", "nan"): "--deadline-s 'nan': a finite number more than 0",
        ("--url", "ftp://x"): "--url 'ftp://x': needs http:// or https:// and a host",
        ("--url", "http://127.0.0.1:9/v1"): "--url 'http://127.0.0.1:9/v1': only scheme, host and port",
        ("--url", "http://u:p@127.0.0.1:9"): "--url 'http://***@127.0.0.1:9': carries credentials",
        ("--watch", "--url", "ftp://10.0.0.1", "--max-iterations", "1"): "needs http:// or https://",
        ("--sections", ""): "--sections '': no section to run",
        ("--prompt", ""): "--prompt '': String should have at least 1 character",
        ("--expect", "|"): "--expect '|': '|' also matches ''",
        ("--expect", "[0-9]*|.*"): "also matches ''",
        ("--golden-json", "[]"): "--golden-json must be a list of 1 to 16 objects",
        ("--golden-json", '[{"prompt": "x", "expect": "(a+)+"}]'): "--golden-json [0.expect]: '(a+)+': "
                                                                   "a repeated group",
        ("--golden-json", '[{"prompt": "x", "expect": "1"}]', "--expect", "2"): "give the golden set one way",
        ("--expect", "(3"): "--expect '(3': '(3' is not a regular expression",
        ("--watch", "--interval-s", "0"): "--interval-s '0': a finite number at least 0.01",
        ("--watch", "--interval-s", "1e-300"): "a finite number at least 0.01",
        ("--url", "http://127.0.0.1:9#"): "only scheme, host and port",
        ("--url", "http://127.0.0.1:9?"): "only scheme, host and port",
        ("--ca-file", "/nonexistent.pem"): "--ca-file '/nonexistent.pem': No such file or directory",
        ("--sections", "chat,nope"): "--sections 'chat,nope': unknown nope",
    }
    for args, message in cases.items():
        code, text = run_bad(*args)
        assert code == 2, (args, text)
        assert message in text, (args, text)


# --- deny: every method ------------------------------------------------------------------------------------------

def test_deny_tries_every_method_and_reports_each_open_one() -> None:
    with standin() as url:
        code, verdict, _ = run_api(url, "--sections", "deny", "--deny-paths", "/metrics,/tokenize")
    assert code == 1
    text = verdict["evidence"][0]
    for wrong in ("GET /metrics 200", "POST /tokenize 200", "PUT /metrics 405", "DELETE /tokenize 405",
                  "PATCH /metrics 405"):
        assert wrong in text, text
    assert "/v1/no-such-endpoint" not in text  # the stand-in says 404 to every method there


# --- watch mode ------------------------------------------------------------------------------------------------

def golden_rounds(metrics_url: str, rank: int, result: str) -> int:
    """The watch's own count of golden rounds on one rank (`--metrics-listen`): how a test knows rounds happened."""
    text = httpx.get(metrics_url, timeout=30).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("vllm_cluster_golden_rounds_total{") and f'dp_rank="{rank}"' in line
               and f'result="{result}"' in line)


def test_watch_prints_one_line_per_transition(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    metrics_port = free_port()
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    with standin("--dp-size", "2", "--control-file", str(control)) as url:
        proc = subprocess.Popen([sys.executable, "-m", "checks.api", "--url", url, "--served-name",
                                 "DeepSeek-V4.1-Flash", "--name", "api-watch", "--watch", "--interval-s", "0.1",
                                 "--metrics-listen", f"127.0.0.1:{metrics_port}", *RANKED], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        out = proc.stdout
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(out), daemon=True)  # a line at a time, never blocks
        reader.start()
        seen = [0]  # lines already matched: each `until` looks only at later ones

        def until(needle: str) -> str:
            def found() -> tuple[int] | None:
                return next(((i,) for i in range(seen[0], len(lines)) if needle in lines[i]), None)
            index: int = wait_for(found, lambda: f"{needle!r} in {lines}", WAIT_S)[0]
            seen[0] = index + 1
            return lines[index]

        def rounds_pass(rank: int, result: str, more: int) -> None:
            """Until the watch has probed `rank` `more` more times with that result."""
            start = golden_rounds(metrics, rank, result)
            wait_for(lambda: golden_rounds(metrics, rank, result) >= start + more,
                     f"{more} more {result} rounds on rank {rank}", WAIT_S)

        def control_with(faults: dict[str, int]) -> None:  # atomically: the stand-in reads it on every request
            (tmp_path / "next.json").write_text(json.dumps(faults))
            (tmp_path / "next.json").replace(control)

        try:
            until("FIRST api-watch: 2 of 2 target(s) answer the golden set")
            rounds_pass(1, "pass", 5)  # several healthy rounds: no output
            control_with({"down_rank": 1})
            down = until("DOWN api-watch")
            rounds_pass(1, "fail", 10)  # rank 1 stays down for ten rounds: still one line
            control_with({})
            up = until("UP api-watch")
            control_with({"wrong_rank": 0})
            wrong = until("DOWN api-watch")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            reader.join(timeout=60)
    assert proc.returncode == 0  # SIGTERM is a clean stop
    assert down.split(" ", 1)[1].strip() == ("DOWN api-watch: rank 1 (node2): for '17*19…': HTTP 500: "
                                             "The server had an error while processing your request.")
    assert " UP api-watch: rank 1 (node2) back after " in up and "s down: 323 in " in up
    assert "DOWN api-watch: rank 0 (node1): answered '324' for '17*19…' expected /323/" in wrong
    transitions = [line for line in lines if " DOWN " in line or " UP " in line]
    assert len(transitions) == 3, transitions
    assert lines[0].split(" ", 1)[1].startswith("WATCH api-watch: 2 target(s) (rank 0 (node1), rank 1 (node2))")


def test_watch_bounded_run_reports_a_rank_down_from_the_start_once_as_json() -> None:
    with standin("--dp-size", "2", "--wrong-rank", "1") as url:
        out = subprocess.run([sys.executable, "-m", "checks.api", "--url", url, "--served-name",
                              "DeepSeek-V4.1-Flash", "--watch", "--interval-s", "0.05", "--max-iterations", "4",
                              "--json", *RANKED], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr  # failures are reported, never an exit code
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(events) == 1
    assert events[0] | {"time": "t"} == {"time": "t", "check": "api", "event": "down", "rank": 1, "node": "node2",
                                         "detail": "answered '324' for '17*19…' expected /323/ (full match)"}
    assert "FIRST api: 1 of 2 target(s)" in out.stdout


def test_watch_through_an_unreachable_endpoint_reports_every_rank_down_once() -> None:
    out = subprocess.run([sys.executable, "-m", "checks.api", "--url", f"http://127.0.0.1:{free_port()}",
                          "--served-name", "m", "--watch", "--interval-s", "0.05", "--max-iterations", "3", *RANKED],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    down = [line for line in out.stdout.splitlines() if " DOWN " in line]
    assert [d.split("DOWN api: ")[1].split(":")[0] for d in down] == ["rank 0 (node1)", "rank 1 (node2)"]
    assert "ConnectError" in down[0]


# --- through the generated nginx front door ----------------------------------------------------------------------

def test_rank_header_passes_through_the_generated_nginx_and_the_check_runs_there(tmp_path: Path) -> None:
    from checks.api import tls_context
    from stacks.model.config import ProxyConfig
    from stacks.planner.proxy import DENIED_PATHS
    from tests.nginx_harness import CLIENT_KEYS, UPSTREAM_KEY, make_certificate, running_nginx, write_conf

    tls = make_certificate(tmp_path)
    with standin("--api-key-env", "STANDIN_KEY", "--dp-size", "2", "--wrong-rank", "1",
                 env={"STANDIN_KEY": UPSTREAM_KEY}) as upstream:
        port = free_port()
        conf = write_conf(tmp_path, ProxyConfig(enabled=True, bind="127.0.0.1", port=port),
                          int(upstream.rsplit(":", 1)[1]), tls)
        url = f"https://localhost:{port}"
        key = {"Authorization": f"Bearer {CLIENT_KEYS['team-a']}"}
        with running_nginx(conf, port), httpx.Client(base_url=url, verify=tls_context(tls.pem), timeout=30) as c:
            answers = {r: c.post("/v1/chat/completions", headers={**key, "X-data-parallel-rank": str(r)},
                                 json={"messages": [{"role": "user", "content": "17*19"}]}) for r in (0, 1)}
            answers[2] = c.post("/v1/completions", headers={**key, "x-data-parallel-rank": "1"},
                                json={"prompt": "17*19="})
            for answer in answers.values():
                assert answer.status_code == 200, (answer.status_code, answer.text)
            chat = {r: answers[r].json() for r in (0, 1)}
            completion = answers[2].json()
            out = subprocess.run(
                [sys.executable, "-m", "checks.api", "--url", url, "--served-name", "DeepSeek-V4.1-Flash",
                 "--ca-env", "VLLM_TLS_CA", "--sections", "chat,thinking,stream,deny", *RANKED,
                 "--deny-paths", ",".join(DENIED_PATHS), "--json"], cwd=ROOT, capture_output=True, text=True,
                timeout=120, env={**os.environ, "VLLM_API_KEY": CLIENT_KEYS["team-a"], "VLLM_TLS_CA": tls.pem})
    # Only the stand-in's rank 1 answers 324: the header reached it through nginx, on both generate paths.
    assert chat[0]["choices"][0]["message"]["content"] == "323"
    assert chat[1]["choices"][0]["message"]["content"] == "324"
    assert "rank control: rank 2 refused (HTTP 400 'data_parallel_rank 2 is out of range [0, 2).'): the header " \
        "reaches vLLM" in out.stdout
    assert completion["choices"][0]["text"] == "324"
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1, out.stdout
    assert verdict["summary"] == "3 failed: chat, thinking, stream; 2 passed: deny, auth; failing: rank 1 (node2)"
    assert verdict["details"]["deny"]["ok"] is True and verdict["details"]["thinking"]["ok"] is False
    assert "each with GET/POST/PUT/PATCH/DELETE" in verdict["details"]["deny"]["evidence"][0]
    assert [p["ok"] for p in verdict["details"]["chat"]["probes"]] == [True, False]
    assert CLIENT_KEYS["team-a"] not in out.stdout


def test_watch_survives_a_body_httpx_cannot_decode() -> None:
    """`Content-Encoding: gzip` over a body that is not gzip raises httpx.DecodingError, not a transport error:
    watch mode reports the rank down and goes on (it exits non-zero only on configuration errors)."""
    with canned_server(200, b"this is not gzip", {"Content-Encoding": "gzip"}) as url:
        out = subprocess.run([sys.executable, "-m", "checks.api", "--url", url, "--served-name", "m", "--watch",
                              "--interval-s", "0.2", "--max-iterations", "2"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "DecodingError" in out.stdout, out.stdout


@pytest.mark.parametrize("args", [("--url", "http://127.0.0.1:99999", "--served-name", "m"),
                                  ("--url", "http://127.0.0.1:9")])
def test_a_bad_argument_is_printed_once(args: tuple[str, ...]) -> None:
    """One refusal, one line (a terminal shows stdout and stderr together); with --json the verdict is the one
    JSON document on stdout and the person's line goes to stderr."""
    plain = subprocess.run([sys.executable, "-m", "checks.api", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    text = plain.stdout + plain.stderr
    assert plain.returncode == 2 and text.count("bad argument:") == 1, text
    assert plain.stdout.startswith("CANNOT-RUN api: bad argument:") and not plain.stderr, text
    done = subprocess.run([sys.executable, "-m", "checks.api", *args, "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    verdict = json.loads(done.stdout)
    assert done.returncode == 2 and verdict["status"] == "cannot-run" and verdict["exit_code"] == 2, done
    assert done.stderr.count("bad argument:") == 1, done.stderr


@pytest.mark.parametrize("key", ["enable_thinking", "reasoning_effort"])
def test_the_cards_thinking_key_reaches_the_server(key: str) -> None:
    """Qwen3 (vllm/parser/qwen3.py:317-318) reads only `enable_thinking` and thinks unless told not to; gpt-oss
    always reasons (a reasoning effort instead). With DeepSeek's `thinking` key the golden answer is lost in the
    reasoning; with the card's key (`--thinking-kwarg`, from the plan) chat, thinking and stream pass."""
    sections = "chat,thinking,stream"
    with standin("--reasoning-key", key) as url:
        code, verdict, out = run_api(url, "--sections", sections, "--thinking-kwarg", key)
        assert code == 0, out
        code, verdict, out = run_api(url, "--sections", "chat")
    assert code == 1 and "the endpoint answered '' for '17*19" in verdict["evidence"][0], out


def test_the_request_body_follows_the_key() -> None:
    from checks.api import _chat

    assert _chat("m", "p", True)["chat_template_kwargs"] == {"thinking": True}
    assert _chat("m", "p", False, kwarg="enable_thinking")["chat_template_kwargs"] == {"enable_thinking": False}
    effort = _chat("m", "p", False, kwarg="reasoning_effort")
    assert "chat_template_kwargs" not in effort and effort["reasoning_effort"] == "low"
    assert effort["max_tokens"] == 2048  # it reasons before it answers, even at low effort
    assert _chat("m", "p", True, kwarg="reasoning_effort")["reasoning_effort"] == "medium"
