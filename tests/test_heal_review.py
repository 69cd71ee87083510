"""The group-healing tools against hostile input: replies that trickle or are not HTTP, bad flags and paths,
credentials in URLs, an unreachable node, and golden results that cannot be trusted."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heal.group import Group, Rank
from heal.node_access import NODE_MAP_ENV
from heal.supervisor import DeployLock, Log, Settings, Supervisor, http_ok, read_golden
from tests.conftest import ROOT

DEADLINE_S = 120.0
"""How long a probe may take here before the test calls it frozen (its own deadline is 1 s)."""
ANSWERED_S = 60.0
"""A probe's deadline where the reply comes at once (not HTTP, say): only a frozen probe could need it, whereas 1 s
could run out before a loaded machine's server thread answers and turn "cannot read" into "no reply"."""


def stacks(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


class RawServer:
    """A TCP server on loopback that answers each connection with `reply(conn)`, whatever it is."""

    def __init__(self, reply: Callable[[socket.socket, threading.Event], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        self.reply = reply
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.reply(conn, self.stop)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    """A 200 header, then one byte at a time, never ending (until the test is over)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    while not stop.wait(0.2):
        conn.sendall(b"#")


def ssh_banner(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")


def huge_header(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n")


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    srv = RawServer(request.param)
    yield srv
    srv.close()


def bare_supervisor(tmp_path: Path, golden: str | None, probe_timeout_s: float = 1, **settings: object) -> Supervisor:
    group = Group(stack="t", ranks=(Rank("node1", "engine"),), ready_timeout_s=60,
                  health_url="http://127.0.0.1:9/health")
    return Supervisor(group, RunningContainers(), Log(io.StringIO(), "t"),
                      Settings(health_timeout_s=probe_timeout_s, golden_url=golden, **settings),  # type: ignore[arg-type]
                      DeployLock(tmp_path / "lock"), sleep=lambda s: None)


class RunningContainers:
    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, json.dumps({"Running": True, "Status": "running"}), "")

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        raise AssertionError("no restart step may run here")

    def container(self, node: str, planned: str) -> str:
        return planned


def finishes(call: Callable[[], object]) -> object:
    """`call()`'s result; fails the test when it has not returned within DEADLINE_S (a frozen probe)."""
    out: list[object] = []
    raised: list[BaseException] = []

    def target() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if raised:
        raise raised[0]
    assert out, f"still running after {DEADLINE_S:g}s: the probe has no total deadline"
    return out[0]


@pytest.mark.parametrize("server", [trickle], indirect=True)
def test_a_reply_that_trickles_is_cut_at_the_deadline_and_not_used(server: RawServer, tmp_path: Path) -> None:
    with pytest.raises(TimeoutError):
        finishes(lambda: read_golden(server.url, 1.0))
    sup = bare_supervisor(tmp_path, server.url)
    assert finishes(sup.golden_failures) == []
    notes = [line for line in sup.log.lines if " golden: " in line]
    assert len(notes) == 1 and "signal not used" in notes[0] and "no complete reply within 1s" in notes[0], notes
    ok, what = finishes(lambda: http_ok(server.url, 1.0))  # type: ignore[misc]
    assert not ok and "TimeoutError" in what


@pytest.mark.parametrize("server", [ssh_banner, huge_header], indirect=True)
def test_a_reply_that_is_not_http_is_a_failed_signal_not_a_crash(server: RawServer, tmp_path: Path) -> None:
    sup = bare_supervisor(tmp_path, server.url, ANSWERED_S)
    assert finishes(sup.golden_failures) == []
    notes = [line for line in sup.log.lines if " golden: " in line]
    assert len(notes) == 1 and "signal not used" in notes[0] and f"cannot read {server.url}" in notes[0], notes
    ok, what = finishes(lambda: http_ok(server.url, ANSWERED_S))  # type: ignore[misc]
    assert not ok and ("BadStatusLine" in what or "LineTooLong" in what), what


def test_a_malformed_webhook_never_crashes_the_give_up_and_never_shows_its_token(tmp_path: Path) -> None:
    sup = bare_supervisor(tmp_path, None, webhook="https://hooks.example:abc/T0KEN")
    assert sup.give_up("test") == 3
    alert = [line for line in sup.log.lines if " alert: " in line]
    assert len(alert) == 1 and "failed" in alert[0] and "T0KEN" not in "\n".join(sup.log.lines), alert


@pytest.mark.parametrize("webhook", ["https://hooks.example:abc/T0KEN", "https://hooks.example:0/T0KEN",
                                     "ftp://hooks.example/T0KEN?sig=T0KEN", "https:///T0KEN"])
def test_supervise_refuses_a_malformed_webhook_at_start_masked(webhook: str) -> None:
    out = stacks("supervise", "h20", env={"VLLM_CLUSTER_ALERT_WEBHOOK": webhook})
    assert out.returncode == 2 and "VLLM_CLUSTER_ALERT_WEBHOOK" in out.stderr, out.stderr
    assert "T0KEN" not in out.stderr + out.stdout and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["supervise", "supervisor-unit"])
@pytest.mark.parametrize("port", ["99999", "0", "-1", "abc"])
def test_a_golden_url_with_no_valid_port_is_exit_2(command: str, port: str) -> None:
    out = stacks(command, "h20", "--golden-metrics-url", f"http://10.0.0.1:{port}/metrics")
    assert out.returncode == 2 and f"--golden-metrics-url 'http://10.0.0.1:{port}/metrics'" in out.stderr, out.stderr
    assert "port from 1 to 65535" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["supervise", "supervisor-unit"])
def test_a_refused_golden_url_never_shows_its_token(command: str) -> None:
    for url in ("http://10.0.0.1:9464/metrics?token=s3cretTOK", "http://u:s3cretTOK@10.0.0.1:9464/metrics",
                "http://10.0.0.1:9464/metrics#s3cretTOK"):
        out = stacks(command, "h20", "--golden-metrics-url", url)
        assert out.returncode == 2 and "--golden-metrics-url 'http://" in out.stderr, out.stderr
        assert "s3cretTOK" not in out.stderr + out.stdout


def test_drift_that_cannot_run_is_a_wait_and_only_a_real_drift_gives_up(tmp_path: Path) -> None:
    from heal.node_access import AccessError

    answers: list[list[str] | AccessError] = [
        AccessError("node node2: docker container inspect failed (exit 124): timed out after 120s: ssh …"),
        AccessError("node node2: docker container inspect failed (exit 124): timed out after 120s: ssh …"),
        AccessError("node node2: docker container inspect failed (exit 255): ssh: connect to host: refused"),
        ["node2 engine restart-policy: plan no, found always"]]

    def drift_check() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, AccessError):
            raise answer
        return answer

    sup = bare_supervisor(tmp_path, None)
    sup.drift_check = drift_check
    assert sup.heal("rank node2 container engine exited") == 3
    assert not answers and sup.restarts == 0
    assert sup.lock.try_acquire(), "the deploy lock is released while it waits"
    sup.lock.release()
    waits = [line for line in sup.log.lines if " wait: drift cannot run: " in line]
    assert len(waits) == 2 and "timed out" in waits[0] and "refused" in waits[1], sup.log.lines
    gave_up = [line for line in sup.log.lines if " give-up: " in line]
    assert len(gave_up) == 1 and "drifted state: node2 engine restart-policy" in gave_up[0]
    assert "drift cannot run" not in gave_up[0]


@pytest.mark.parametrize(("args", "says"), [
    (["--backoff-first-s", "100", "--backoff-max-s", "10"],
     "--backoff-first-s 100 is more than --backoff-max-s 10: the first wait must be at most the longest"),
    (["--hang-s", "5", "--interval-s", "60"], "--hang-s 5 is less than --interval-s 60"),
    (["--hang-s", "5"], "--hang-s 5 is less than --interval-s 30"),
    (["--probe-timeout-s", "1e-300"], "--probe-timeout-s 1e-300: must be at least 0.1 and at most 604800 seconds"),
    (["--probe-timeout-s", "700"], "--probe-timeout-s 700 is more than --hang-s 600"),
    (["--interval-s", "nan"], "--interval-s nan: must be at least 0.1"),
    (["--max-per-hour", "0"], "--max-per-hour 0: must be a whole number of restarts from 1 to 60 in any hour; "
                              "default 4"),
    (["--backoff-max-s", "0"], "--backoff-max-s 0.0: must be at least 0.1 and at most 604800 seconds (a week); "
                               "default 1800"),
])
def test_supervise_refuses_timing_that_cannot_work_naming_the_relation(args: list[str], says: str) -> None:
    out = stacks("supervise", "h20", *args)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "at most 604800 (a week)" not in out.stderr or "--max-per-hour" not in out.stderr


def test_supervisor_unit_passes_the_timing_flags_checked_as_supervise_checks_them(tmp_path: Path) -> None:
    base = ["supervisor-unit", "h20", "--python", sys.executable, "--user", "deploy"]
    out = stacks(*base, "--interval-s", "15", "--hang-s", "300", "--golden-max-age-s", "900")
    assert out.returncode == 0, out.stderr
    exec_start = next(line for line in out.stdout.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith("supervise h20 --interval-s 15 --hang-s 300 --golden-max-age-s 900"), exec_start
    for args, says in ((["--hang-s", "5"], "--hang-s 5 is less than --interval-s 30"),
                       (["--interval-s", "0"], "--interval-s 0.0: must be at least 0.1"),
                       (["--golden-max-age-s", "inf"], "--golden-max-age-s inf: must be more than 0")):
        bad = stacks(*base, *args)
        assert bad.returncode == 2 and says in bad.stderr and "ExecStart" not in bad.stdout, bad.stderr


def test_a_multi_line_error_stays_one_log_line(tmp_path: Path) -> None:
    out = io.StringIO()
    log = Log(out, "t")
    log("restart", "failed: node node2: docker inspect failed (exit 255): kex_exchange_identification:\r\n"
        "Connection closed by remote host\nConnection closed by 10.0.0.2 port 22\n", "a rank\nexited")
    assert out.getvalue().count("\n") == 1 and len(log.lines) == 1
    assert "Connection closed by remote host | Connection closed by 10.0.0.2 port 22" in log.lines[0]
    assert log.lines[0].endswith("(reason: a rank | exited)")


def test_drift_json_that_cannot_run_prints_a_json_error(h20_values: dict[str, object]) -> None:
    from heal.node_access import NODE_MAP_ENV

    unreachable = json.dumps({"h20-1": {"docker_host": "unix:///nonexistent/docker.sock"},
                              "h20-2": {"docker_host": "unix:///nonexistent/docker.sock"}})
    out = stacks("drift", "h20", "--json", env={NODE_MAP_ENV: unreachable})
    assert out.returncode == 2, out.stderr
    answer = json.loads(out.stdout)
    assert answer["stack"] == "h20" and answer["error"].startswith("cannot run: node ") and answer["next"]


@pytest.mark.parametrize("command", ["restart-group", "supervise"])
def test_a_lock_in_a_missing_folder_is_exit_2_naming_lock(command: str, tmp_path: Path) -> None:
    from heal.node_access import NODE_MAP_ENV

    for lock, says in ((tmp_path / "nonexistent" / "x.lock", "does not exist"), (tmp_path, "is a folder")):
        out = stacks(command, "h20", "--yes" if command == "restart-group" else "--hang-s=60", "--lock", str(lock),
                     env={NODE_MAP_ENV: json.dumps({"h20-1": {"docker_host": "unix:///nonexistent/docker.sock"},
                                                    "h20-2": {"docker_host": "unix:///nonexistent/docker.sock"}})})
        assert out.returncode == 2 and f"--lock {str(lock)!r}: " in out.stderr and says in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "stop:" not in out.stdout


def test_supervisor_unit_refuses_a_python_that_is_not_there(tmp_path: Path) -> None:
    missing = str(tmp_path / "venv" / "bin" / "python")
    out = stacks("supervisor-unit", "h20", "--user", "deploy", "--python", missing)
    assert out.returncode == 2 and f"--python {missing!r}: no executable file there" in out.stderr, out.stderr
    assert "ExecStart" not in out.stdout
    out = stacks("supervisor-unit", "h20", "--user", "deploy", "--python", sys.executable)
    assert out.returncode == 0 and f"ExecStart={sys.executable} -m stacks supervise h20" in out.stdout, out.stderr


def metrics_cases(tmp_path: Path) -> list[tuple[str, str]]:
    other = tmp_path / "other.prom"
    other.write_text("# HELP node_textfile_thing another collector's file\n")
    link = tmp_path / "link.prom"
    link.symlink_to("/etc/passwd")
    return [("/", "not a *.prom file"), ("/etc/passwd", "not a *.prom file"), (str(tmp_path), "not a *.prom file"),
            ("/etc/vllm.prom", "'/etc' is a system folder"), ("/usr/lib/vllm.prom", "'/usr/lib' is a system folder"),
            ("/vllm.prom", "'/' is a system folder"), (str(link), "not a *.prom file"),
            (str(tmp_path / "missing" / "x.prom"), "does not exist"),
            (str(other), "exists and is not this supervisor's textfile")]


@pytest.mark.parametrize("command", ["supervise", "supervisor-unit"])
def test_a_metrics_file_that_is_not_a_textfile_of_ours_is_exit_2(command: str, tmp_path: Path,
                                                                  textfile_dir: Path) -> None:
    extra = ["--hang-s=60"] if command == "supervise" else ["--user", "deploy", "--python", sys.executable]
    if command == "supervisor-unit":
        tmp_path = textfile_dir  # not under /tmp, which the unit refuses first (PrivateTmp)
    for path, says in metrics_cases(tmp_path):
        out = stacks(command, "h20", *extra, "--metrics-file", path)
        assert out.returncode == 2 and f"--metrics-file {path!r}: " in out.stderr and says in out.stderr, \
            (path, out.stderr)
        assert "Traceback" not in out.stderr and "ReadWritePaths" not in out.stdout
    assert "HELP node_textfile_thing" in (tmp_path / "other.prom").read_text()


def test_supervisor_unit_wants_a_user_and_opens_only_the_textfile_folder(textfile_dir: Path) -> None:
    tmp_path = textfile_dir
    prom = tmp_path / "vllm.prom"
    out = stacks("supervisor-unit", "h20", "--python", sys.executable, "--metrics-file", str(prom))
    assert out.returncode == 2 and "--user is missing: the unit would run as root" in out.stderr, out.stderr
    out = stacks("supervisor-unit", "h20", "--python", sys.executable, "--user", "deploy", "--metrics-file", str(prom))
    assert out.returncode == 0, out.stderr
    assert f"ReadWritePaths=/run/lock {tmp_path}\n" in out.stdout and "User=deploy" in out.stdout
    assert "%h" not in out.stdout, "in a system unit %h is root's home whatever User= says"
    assert "RuntimeDirectory=vllm-cluster-supervisor-h20\nRuntimeDirectoryMode=0700\n" in out.stdout


def test_ssh_puts_its_shared_socket_in_the_units_runtime_directory(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from heal.node_access import RUNTIME_DIR_ENV, SshAccess
    from stacks.model.loader import load_stack

    access = SshAccess("h20", load_stack("h20"))
    node = access.config.nodes[0].name
    monkeypatch.delenv(RUNTIME_DIR_ENV, raising=False)
    outside = access._ssh(node)
    assert "ControlPath=~/.ssh/vllm-cluster-%r@%h:%p" in outside, "by hand: as the Docker provider does"
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path))
    inside = access._ssh(node)
    paths = [o for o in inside if o.startswith("ControlPath=")]
    assert paths == [f"ControlPath={tmp_path}/%C"], inside
    assert len(inside) == len(outside)


NOW = 1_764_775_000.0


def golden_text(*rows: tuple[str, str, int, str]) -> str:
    """The watch unit's series for (dp_rank, node, ok, round time as written)."""
    out = []
    for rank, node, ok, at in rows:
        labels = f'{{dp_rank="{rank}",node="{node}"}}'
        out += [f"vllm_cluster_golden_ok{labels} {ok}", f"vllm_cluster_golden_consecutive_failures{labels} {1 - ok}",
                f"vllm_cluster_golden_last_round_timestamp_seconds{labels} {at}"]
    return "\n".join(out) + "\n"


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, list[str]]]:
    body = [""]

    def reply(conn: socket.socket, stop: threading.Event) -> None:
        data = body[0].encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                     + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)

    srv = RawServer(reply)
    yield srv.url, body
    srv.close()


def ranked_supervisor(tmp_path: Path, url: str) -> Supervisor:
    group = Group(stack="t", ranks=(Rank("node1", "engine"), Rank("node2", "engine")), ready_timeout_s=60,
                  health_url=url)  # the metrics server answers 200: health passes
    settings = Settings(hang_s=30, health_timeout_s=ANSWERED_S, golden_url=url, golden_max_age_s=300,
                        golden_ranks={"0": "node1", "1": "node2"})
    clock = [1000.0]
    return Supervisor(group, RunningContainers(), Log(io.StringIO(), "t"), settings, DeployLock(tmp_path / "lock"),
                      clock=lambda: clock[0], wall=lambda: NOW, sleep=lambda s: None)


def test_results_for_ranks_the_stack_does_not_have_are_ignored_and_said_once(
        metrics_server: tuple[str, list[str]], tmp_path: Path) -> None:
    url, body = metrics_server
    body[0] = golden_text(("0", "node1", 1, f"{NOW - 5}"), ("1", "node7", 0, f"{NOW - 5}"),
                          ("5", "node9", 0, f"{NOW - 5}"))
    sup = ranked_supervisor(tmp_path, url)
    for _ in range(3):
        assert sup.golden_failures() == []
    notes = [line for line in sup.log.lines if " golden: " in line]
    assert len(notes) == 1 and "ignoring results for DP ranks the stack does not have" in notes[0], notes
    assert "DP rank 1 on node7" in notes[0] and "DP rank 5 on node9" in notes[0]
    body[0] = golden_text(("0", "node1", 1, f"{NOW - 5}"), ("1", "node2", 0, f"{NOW - 5}"))
    failures = sup.golden_failures()
    assert len(failures) == 1 and "DP rank 1 on node2 failed its golden set" in failures[0]


@pytest.mark.parametrize(("at", "says"), [(f"{NOW + 3600}", "last round 3600s in the future"),
                                          ("NaN", "nan as round time"), ("+Inf", "inf as round time")])
def test_a_round_time_in_the_future_or_not_a_number_is_not_used(
        metrics_server: tuple[str, list[str]], tmp_path: Path, at: str, says: str) -> None:
    url, body = metrics_server
    body[0] = golden_text(("0", "node1", 1, f"{NOW - 5}"), ("1", "node2", 0, at))
    sup = ranked_supervisor(tmp_path, url)
    for _ in range(3):
        assert sup.golden_failures() == []
    notes = [line for line in sup.log.lines if " golden: " in line]
    assert len(notes) == 1 and "signal not used" in notes[0] and f"DP rank 1 ({says}" in notes[0], notes
    body[0] = golden_text(("0", "node1", 1, f"{NOW - 5}"), ("1", "node2", 0, f"{NOW + 10}"))  # a little skew: used
    assert len(sup.golden_failures()) == 1 and "signal back" in sup.log.lines[-1]


def test_a_short_hang_without_a_probe_timeout_is_accepted() -> None:
    """The probe timeout's default (10 s) shrinks to a shorter --hang-s instead of refusing it."""
    from heal.cli import check_timing

    args = type("Args", (), {"interval_s": 1.0, "hang_s": 8.0, "probe_timeout_s": None})()
    assert check_timing(args) is None  # type: ignore[arg-type]
    args.probe_timeout_s = 9.0
    assert "--probe-timeout-s 9 is more than --hang-s 8" in (check_timing(args) or "")  # type: ignore[arg-type]


UNREACHABLE_NODES = json.dumps({"h20-1": {"docker_host": "unix:///nonexistent/docker.sock"},
                                "h20-2": {"docker_host": "unix:///nonexistent/docker.sock"}})
"""A node map no node of which answers: a command that reached a node would say so, not the flag's refusal."""


@pytest.mark.parametrize(("listen", "says"), [
    ("127.0.0.1", "needs ADDRESS:PORT"),
    ("127.0.0.1:0", "port 0 is not from 1 to 65535"),
    ("127.0.0.1:65536", "port 65536 is not from 1 to 65535"),
    ("127.0.0.1:-1", "needs ADDRESS:PORT"),
    ("127.0.0.1:９４６５", "needs ADDRESS:PORT"),  # digits that int() reads, but not ASCII
    ("127.0.0.1:9465\nExecStartPre=/bin/sh", "needs ADDRESS:PORT"),
    ("::1:9465", "an IPv6 address needs brackets"),
    ("[127.0.0.1]:9465", "brackets go around an IPv6 address only"),
    ("[::1]:99999", "port 99999 is not from 1 to 65535"),
    ("[::1]:123456", "needs ADDRESS:PORT"),
    ("localhost:9465", "needs ADDRESS:PORT"),
    ("999.1.1.1:9465", "is not an IP address"),
])
def test_supervise_refuses_a_metrics_listen_it_cannot_serve_before_anything_runs(listen: str, says: str,
                                                                               tmp_path: Path) -> None:
    out = stacks("supervise", "h20", "--hang-s=60", "--lock", str(tmp_path / "lock"), "--metrics-listen", listen,
                 env={NODE_MAP_ENV: UNREACHABLE_NODES})
    assert out.returncode == 2 and f"--metrics-listen {listen!r}: " in out.stderr and says in out.stderr, out.stderr
    assert "e.g. 10.30.8.1:9465" in out.stderr and "Traceback" not in out.stderr and "start:" not in out.stdout


def test_supervise_that_cannot_bind_its_metrics_address_is_exit_2_before_any_probe(tmp_path: Path) -> None:
    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    try:
        for listen, says in ((f"127.0.0.1:{port}", "Address already in use"),
                             ("192.0.2.1:9465", "Cannot assign requested address")):  # not this host's
            out = stacks("supervise", "h20", "--hang-s=60", "--lock", str(tmp_path / "lock"), "--metrics-listen",
                         listen, env={NODE_MAP_ENV: UNREACHABLE_NODES})
            assert out.returncode == 2 and f"--metrics-listen {listen}: cannot listen ({says})" in out.stderr, \
                out.stderr
            assert "--metrics-listen '' to serve nothing" in out.stderr and "start:" not in out.stdout
    finally:
        held.close()
    # from the stack: the keys to change are named
    out = stacks("supervise", "h20", "--hang-s=60", "--lock", str(tmp_path / "lock"), "--set",
                 "observability.enabled=true", "--assume-secret", "grafana_admin_password", "--set",
                 "observability.supervisor_address=192.0.2.1", env={NODE_MAP_ENV: UNREACHABLE_NODES})
    assert out.returncode == 2 and "--metrics-listen 192.0.2.1:9465: cannot listen" in out.stderr, out.stderr
    assert "change observability.supervisor_address or observability.ports.supervisor" in out.stderr


def test_a_metrics_listen_given_to_the_unit_renderer_cannot_add_a_line(tmp_path: Path) -> None:
    from heal.supervisor_unit import render_supervisor_unit

    with pytest.raises(ValueError, match="--metrics-listen"):
        render_supervisor_unit(stack="h20", python=sys.executable, workdir=str(ROOT), env_file="/etc/x.env",
                               metrics_listen="10.0.0.1:9465\nExecStartPre=/bin/sh")


class CleanFails(RunningContainers):
    """Every rank exited (Docker says so: the evidence a restart needs), and the clean step fails."""

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, json.dumps({"Running": False, "Status": "exited",
                                                                "ExitCode": 1}), "")

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "rm: cannot remove: No space left on device")


def test_the_served_metrics_follow_the_back_off_and_the_give_up(tmp_path: Path) -> None:
    """What the HTTP thread renders while the loop works: the back-off running, the restarts in the hour, the last
    restart's result and time, the give-up."""
    now = [1000.0]
    seen: list[str] = []
    sup = bare_supervisor(tmp_path, None, max_per_hour=2, backoff_first_s=60)
    sup.access, sup.clock, sup.wall = CleanFails(), (lambda: now[0]), (lambda: NOW)

    def sleep(seconds: float) -> None:  # what a scrape during the back-off reads, then the time passes
        seen.append(sup.render())
        now[0] += seconds

    sup.sleep = sleep
    assert 'vllm_cluster_group_gave_up{stack="t"} 0' in sup.render()
    assert "vllm_cluster_group_last_restart_success{" not in sup.render()  # none yet: no series, not a 0
    failed = sup.heal("rank node1 container engine exited")  # every restart fails at its clean step
    assert failed == 3
    text = sup.render()
    for line in ('vllm_cluster_group_gave_up{stack="t"} 1', 'vllm_cluster_group_restarts_total{stack="t"} 2',
                 'vllm_cluster_group_restarts_last_hour{stack="t"} 2',
                 'vllm_cluster_group_max_restarts_per_hour{stack="t"} 2',
                 'vllm_cluster_group_backoff_seconds{stack="t"} 120',
                 'vllm_cluster_group_next_restart_in_seconds{stack="t"} 0',
                 'vllm_cluster_group_last_restart_success{stack="t"} 0'):
        assert line in text.splitlines(), (line, text)
    stamp = next(line for line in text.splitlines() if line.startswith("vllm_cluster_group_last_restart_timestamp"))
    assert float(stamp.split()[-1]) == NOW, stamp  # every digit: a Unix time in %g would be minutes off
    backing_off = [s for s in seen if 'vllm_cluster_group_next_restart_in_seconds{stack="t"} 60' in s]
    assert len(backing_off) == 1 and 'vllm_cluster_group_gave_up{stack="t"} 0' in backing_off[0], seen


def observed_plan(stack: str = "h20", *extra: str) -> object:
    from stacks.model.loader import load_stack
    from stacks.planner.plan import build_plan

    config = load_stack(stack, ["observability.enabled=true", *extra], assume_secret=[
        "grafana_admin_password", "api_key", "proxy_keys.team-a", "tls_certificate", "tls_private_key"])
    return build_plan(stack, config)


@pytest.mark.parametrize("extra", [(), ("api.proxy.enabled=true", "api.proxy.tls=false", "serving.host=127.0.0.1")])
def test_the_clean_step_requires_free_only_the_ports_the_restart_stops(extra: tuple[str, ...]) -> None:
    from heal.group import group_of
    from stacks.planner.plan import Plan

    plan = observed_plan("h20", *extra)
    assert isinstance(plan, Plan)
    kept_running = {(lst.node, lst.port) for lst in plan.listeners
                    if lst.role in ("monitoring", "proxy") or lst.process.startswith("checks.")}
    assert any(lst.role == "monitoring" for lst in plan.listeners), "observability is on: exporters listen"
    group = group_of(plan)
    for rank in group.ranks:
        engine = {lst.port for lst in plan.listeners if lst.node == rank.node and lst.role not in
                  ("monitoring", "proxy") and not lst.process.startswith("checks.") and not lst.ephemeral
                  and lst.port_end is None and lst.protocol == "tcp"}
        assert set(rank.ports) == engine and engine, (rank, engine)
        assert not {(rank.node, p) for p in rank.ports} & kept_running, rank


class Nodes(RunningContainers):
    """Docker over SSH as the supervisor sees it: every container running, or exited, or no answer at all."""

    def __init__(self) -> None:
        self.mode = "running"
        self.shells = 0

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        if self.mode == "blind":
            return subprocess.CompletedProcess(args, 255, "", "ssh: connect to host 10.0.0.2 port 22: Connection "
                                               "timed out")
        state = {"Running": self.mode == "running", "Status": "running" if self.mode == "running" else "exited",
                 "ExitCode": 0 if self.mode == "running" else 137}
        return subprocess.CompletedProcess(args, 0, json.dumps(state), "")

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        self.shells += 1
        return subprocess.CompletedProcess(args, 1, "", "stop here: the test only counts restarts")


def watched(tmp_path: Path, health_url: str) -> tuple[Supervisor, Nodes, list[float]]:
    group = Group(stack="t", ranks=(Rank("node1", "engine"), Rank("node2", "engine")), ready_timeout_s=60,
                  health_url=health_url)
    clock = [1000.0]
    nodes = Nodes()

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    sup = Supervisor(group, nodes, Log(io.StringIO(), "t"), Settings(interval_s=30, hang_s=60, health_timeout_s=5),
                     DeployLock(tmp_path / "lock"), clock=lambda: clock[0], wall=lambda: NOW, sleep=sleep)
    return sup, nodes, clock


def test_losing_sight_of_the_nodes_is_blind_never_a_hang(tmp_path: Path,
                                                         metrics_server: tuple[str, list[str]]) -> None:
    url, _ = metrics_server  # answers 200: the group serves
    sup, nodes, clock = watched(tmp_path, url)
    assert sup.probe() is None and sup.seen_healthy
    nodes.mode = "blind"
    sup.group = Group(stack="t", ranks=sup.group.ranks, ready_timeout_s=60, health_url="http://127.0.0.1:9/health")
    for _ in range(10):  # ten minutes without SSH and without /health: ten times --hang-s
        assert sup.probe() is None, sup.log.lines
        clock[0] += 60
    blind = [line for line in sup.log.lines if " blind: " in line]
    assert len(blind) == 1 and "Connection timed out" in blind[0] and "unreachable is not dead" in blind[0]
    assert not any(" degraded: " in line for line in sup.log.lines), sup.log.lines
    nodes.mode = "exited"
    assert "exited" in (sup.probe() or ""), "Docker reporting an exit is a death at once"


class OneBlind(Nodes):
    """node2 does not answer over SSH; node1 does, as `mode` says."""

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        if node == "node2":
            return subprocess.CompletedProcess(args, 255, "", "ssh: connect to host 10.0.0.2 port 22: Connection "
                                               "timed out")
        return super().docker(node, args, timeout_s)


def test_a_blind_node_is_not_seen_again_because_another_node_answered(
        tmp_path: Path, metrics_server: tuple[str, list[str]]) -> None:
    url, _ = metrics_server
    sup, nodes, _ = watched(tmp_path, url)
    assert sup.probe() is None and sup.seen_healthy
    nodes.mode = "blind"
    assert sup.probe() is None
    split = OneBlind()
    split.mode = "exited"  # node1 answers again, its rank exited; node2 still does not answer
    sup.access = split
    assert "node1" in (sup.probe() or "")
    assert not any(" sight: " in line for line in sup.log.lines), sup.log.lines
    assert "10.0.0.2" in sup.unseen


def test_a_released_deploy_lock_logs_serving_again(tmp_path: Path, metrics_server: tuple[str, list[str]]) -> None:
    """The group died while a `pulumi up` held the lock and serves once it is released: no restart, and the log
    says why."""
    url, _ = metrics_server
    sup, nodes, _ = watched(tmp_path, url)
    answers = [False, False, True]
    sup._take_lock = lambda: answers.pop(0)  # type: ignore[method-assign]
    assert sup.heal("rank node1 container engine exited") is None
    assert sup.restarts == 0 and nodes.shells == 0, sup.log.lines
    lines = sup.log.lines
    released = next(i for i, line in enumerate(lines) if " lock: " in line and "released" in line)
    assert any(" recovered: serving again after the deploy lock was released" in line
               for line in lines[released:]), lines


def test_a_restart_waits_for_fresh_evidence_and_none_when_the_group_came_back(
        tmp_path: Path, metrics_server: tuple[str, list[str]]) -> None:
    from heal.node_access import AccessError

    url, _ = metrics_server
    sup, nodes, clock = watched(tmp_path, url)
    nodes.mode = "exited"
    reason = sup.probe()
    assert reason and "exited" in reason
    nodes.mode = "blind"
    answers: list[list[str] | AccessError] = [AccessError("node node2: ssh: Connection timed out")] * 2 + [[]]

    def drift_check() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, AccessError):
            raise answer
        if not answers:
            nodes.mode = "running"  # SSH is back, and the group runs and serves: the exit was a blip seen blind
        return answer

    sup.drift_check = drift_check
    assert sup.heal(reason) is None
    assert sup.restarts == 0 and nodes.shells == 0, sup.log.lines
    assert any(" recovered: " in line for line in sup.log.lines), sup.log.lines
    # blind right before the restart: no restart until it sees again
    nodes.mode = "blind"
    sup.drift_check = None
    looks = [0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        looks[0] += 1
        if looks[0] == 3:
            nodes.mode = "exited"  # seen again, and exited: now a restart may run

    sup.sleep = sleep
    sup.heal("rank node1 container engine exited")
    assert nodes.shells >= 1 and sup.restarts >= 1
    blind_at = next(i for i, line in enumerate(sup.log.lines) if " blind: " in line)
    evidence_at = next(i for i, line in enumerate(sup.log.lines) if " evidence: " in line)
    first_restart = next(i for i, line in enumerate(sup.log.lines) if " restart: whole group" in line)
    assert blind_at < evidence_at < first_restart, sup.log.lines


def test_never_seen_healthy_health_failing_alone_restarts_nothing(tmp_path: Path) -> None:
    sup, nodes, clock = watched(tmp_path, "http://127.0.0.1:9/health")  # this host cannot reach the endpoint
    for _ in range(10):
        assert sup.probe() is None, sup.log.lines
        clock[0] += 60
    unproven = [line for line in sup.log.lines if " unproven: " in line]
    assert len(unproven) == 1 and "firewall.api_sources" in unproven[0], sup.log.lines
    nodes.mode = "exited"
    assert "exited" in (sup.probe() or ""), "a container Docker reports exited still is a death"


def test_a_deploy_lock_this_user_cannot_open_is_exit_2_not_a_crash(tmp_path: Path) -> None:
    class Refused(DeployLock):
        def try_acquire(self) -> bool:
            raise PermissionError(13, "Permission denied")

    sup = bare_supervisor(tmp_path, None)
    sup.access = CleanFails()  # every rank exited: a death, so the supervisor goes for the lock
    sup.lock = Refused(tmp_path / "lock")
    assert sup.run() == 2
    assert "deploy lock" in sup.log.lines[-1] and "Permission denied" in sup.log.lines[-1], sup.log.lines
    assert not any(" restart: " in line for line in sup.log.lines)


@pytest.mark.parametrize("command", ["restart-group", "supervise"])
def test_a_stack_with_a_key_and_no_vllm_api_key_is_exit_2_before_anything_acts(command: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    extra = ["--yes"] if command == "restart-group" else ["--hang-s=60", "--metrics-listen", "192.0.2.1:9465"]
    out = subprocess.run([sys.executable, "-m", "stacks", command, "h20", *extra, "--lock", str(tmp_path / "lock"),
                          "--assume-secret", "api_key"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                         env={**env, NODE_MAP_ENV: UNREACHABLE_NODES})
    assert out.returncode == 2, out.stderr
    assert "VLLM_API_KEY is not set" in out.stderr and "/etc/vllm-cluster/h20-supervisor.env" in out.stderr
    assert "stop:" not in out.stdout and "Traceback" not in out.stderr
    dry = stacks("restart-group", "h20", "--assume-secret", "api_key", env={"VLLM_API_KEY": ""})
    assert dry.returncode == 0, "the dry run needs no key: " + dry.stderr
    keyed = subprocess.run([sys.executable, "-m", "stacks", command, "h20", *extra, "--lock", str(tmp_path / "lock"),
                            "--assume-secret", "api_key"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                           env={**env, "VLLM_API_KEY": "k", NODE_MAP_ENV: UNREACHABLE_NODES})
    assert keyed.returncode == 2 and "VLLM_API_KEY is not set" not in keyed.stderr, keyed.stderr
    assert ("cannot listen" if command == "supervise" else "cannot run") in keyed.stderr, "went on past the check"


@pytest.mark.parametrize(("args", "env", "says"), [
    (["supervise", "h20", "--golden-metrics-url", "http://[fd00::1:9464/metrics"], {},
     "--golden-metrics-url 'http://"),
    (["supervise", "h20"], {"VLLM_CLUSTER_ALERT_WEBHOOK": "https://[fd00::1/x"}, "VLLM_CLUSTER_ALERT_WEBHOOK "),
    (["supervise", "h20", "--metrics-listen", "0.0.0.0:9465"], {}, "a wildcard address"),
    (["supervise", "h20", "--metrics-listen", "[::]:9465"], {}, "a wildcard address"),
    (["supervisor-unit", "h20", "--user", "deploy", "--python", sys.executable, "--metrics-file", "/tmp/vllm.prom"],
     {}, "PrivateTmp=yes"),
    (["supervisor-unit", "h20", "--user", "deploy", "--python", sys.executable, "--metrics-file",
      "/var/tmp/x/vllm.prom"], {}, "PrivateTmp=yes"),
])
def test_low_bad_inputs_are_exit_2_naming_the_flag(args: list[str], env: dict[str, str], says: str) -> None:
    out = stacks(*args, env=env)
    assert out.returncode == 2 and says in out.stderr and "internal error" not in out.stderr, out.stderr
    assert "ExecStart" not in out.stdout


def test_a_metrics_file_name_too_long_is_exit_2(textfile_dir: Path) -> None:
    path = str(textfile_dir / ("a" * 300 + ".prom"))
    out = stacks("supervise", "h20", "--hang-s=60", "--metrics-file", path)
    assert out.returncode == 2 and "--metrics-file '" in out.stderr and "File name too long" in out.stderr, out.stderr


def test_supervise_help_says_every_flag_and_its_default() -> None:
    out = stacks("supervise", "--help")
    text = " ".join(out.stdout.split())
    for flag, default in (("--lock", "/run/lock/vllm-cluster-STACK.lock"), ("--ca-file", "system's CAs"),
                          ("--backoff-first-s", "default 60"), ("--max-per-hour", "default 4")):
        assert flag in text and default in text, (flag, text)


OBSERVED = ["--set", "observability.enabled=true", "--assume-secret", "grafana_admin_password"]


@pytest.mark.parametrize(("args", "what"), [
    (["restart-group", "h20", "--yes"], "the API check (checks.api)"),
    (["restart-group", "h20", "--ca-file", "CERT"], "the API check (checks.api)"),
    (["supervise", "h20", "--hang-s=60", "--metrics-listen", "192.0.2.1:9465"], "the API check (checks.api)"),
    (["supervisor-unit", "h20", "--user", "me", "--python", sys.executable], "the unit's `supervise`"),
    (["supervisor-unit", "h20", "--user", "me", "--python", sys.executable, *OBSERVED], "the unit's `supervise`"),
    (["watch-unit", "h20", "--python", sys.executable], "the watch unit's command"),
    (["watch-unit", "h20", "--python", sys.executable, *OBSERVED], "the watch unit's command"),
])
def test_the_heal_tools_in_the_plan_only_venv_are_exit_2_naming_httpx_before_anything_acts(
        args: list[str], what: str, tmp_path: Path) -> None:
    """`make venv-plan` has no httpx: each tool that runs the API check, or prints a unit that does, says so and
    what installs it before it reads a node, takes the lock or prints a unit; nothing is stopped."""
    from tests.nginx_harness import make_certificate
    from tests.test_tutorial import plan_only_site

    args = [str(make_certificate(tmp_path).cert) if a == "CERT" else a for a in args]
    lock = tmp_path / "lock"
    extra = ["--lock", str(lock)] if args[0] in ("restart-group", "supervise") else []
    env = {NODE_MAP_ENV: UNREACHABLE_NODES, "PYTHONPATH": str(plan_only_site(tmp_path / "plan-only"))}
    out = stacks(*args, *extra, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{args[0]} h20: {what}" in out.stderr and f"needs httpx (requirements.txt), which {sys.executable} " \
        "cannot import" in out.stderr and "run `make venv`" in out.stderr, out.stderr
    assert "internal error" not in out.stderr and "cannot run" not in out.stderr, out.stderr  # no node was asked
    assert out.stdout == "" and not lock.exists()  # no step, no unit; the lock was never taken
    if args[:3] == ["restart-group", "h20", "--yes"]:
        went_on = stacks(*args, *extra, env={NODE_MAP_ENV: UNREACHABLE_NODES})  # with httpx: on to the nodes
        assert went_on.returncode == 2 and "cannot run" in went_on.stderr, went_on.stderr


def test_the_restart_dry_run_needs_no_httpx(tmp_path: Path) -> None:
    """The steps come from the plan alone: the plan-only venv shows them."""
    from tests.test_tutorial import plan_only_site

    out = stacks("restart-group", "h20", env={NODE_MAP_ENV: UNREACHABLE_NODES,
                                              "PYTHONPATH": str(plan_only_site(tmp_path / "plan-only"))})
    assert out.returncode == 0 and "dry run: nothing was touched" in out.stdout, out.stderr


@pytest.mark.parametrize("command", ["supervisor-unit", "watch-unit"])
def test_a_unit_whose_python_has_no_httpx_is_exit_2(command: str, tmp_path: Path) -> None:
    """--python another interpreter on this host: it is asked, as the unit would run it, before the unit is
    printed; this interpreter (with httpx) gets the unit."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    out = stacks(command, "h20", "--user", "me", "--python", python)
    assert out.returncode == 2 and f"needs httpx (requirements.txt), which {python} cannot import" in out.stderr, \
        out.stderr
    assert "or give --python the python of a venv that has it" in out.stderr and "ExecStart" not in out.stdout
    good = stacks(command, "h20", "--user", "me", "--python", sys.executable)
    assert good.returncode == 0 and f"ExecStart={sys.executable} -m " in good.stdout, good.stderr


def _keyed_api(right: str) -> RawServer:
    """An OpenAI-style API that answers /v1/models 200 with `right` as bearer key and 401 otherwise, as vLLM does."""
    def reply(conn: socket.socket, stop: threading.Event) -> None:
        raise AssertionError("replaced below")

    server = RawServer(reply)

    def one(conn: socket.socket) -> None:
        with conn:
            request = conn.recv(65536).decode(errors="replace")
            ok = f"authorization: bearer {right}".lower() in request.lower()
            body = b'{"data": []}' if ok else b'{"error": "Unauthorized"}'
            conn.sendall(f"HTTP/1.1 {200 if ok else 401} X\r\nContent-Type: application/json\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)

    server._one = one  # type: ignore[method-assign]
    return server


def test_a_wrong_api_key_is_found_before_any_rank_is_stopped(tmp_path: Path) -> None:
    """restart-group --yes and supervise ask the serving group with VLLM_API_KEY first: a refused key is exit 2
    naming the variable (never its value) before drift runs or a rank is touched; the right key goes on."""
    server = _keyed_api("sk-right-0123")
    port = server.sock.getsockname()[1]
    where = ["--set", "serving.host=127.0.0.1", "--set", f"serving.port={port}", "--lock", str(tmp_path / "lock")]
    try:
        for command in (["restart-group", "h20", "--yes"], ["supervise", "h20", "--metrics-listen", ""]):
            out = stacks(*command, *where, env={NODE_MAP_ENV: UNREACHABLE_NODES, "VLLM_API_KEY": "sk-wrong-4567"})
            assert out.returncode == 2, (command, out.stdout, out.stderr)
            assert "VLLM_API_KEY (value not shown) is refused by the serving group" in out.stderr and "HTTP 401" \
                in out.stderr, out.stderr
            assert "sk-wrong-4567" not in out.stdout + out.stderr and "nonexistent" not in out.stdout + out.stderr
        out = stacks("restart-group", "h20", "--yes", *where,
                     env={NODE_MAP_ENV: UNREACHABLE_NODES, "VLLM_API_KEY": "sk-right-0123"})
        assert out.returncode == 2 and "refused by the serving group" not in out.stderr, out.stderr
        assert "nonexistent" in out.stderr, "the right key goes on to the nodes (unreachable here)"
    finally:
        server.stop.set()
        server.sock.close()
