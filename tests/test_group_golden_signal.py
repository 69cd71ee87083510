"""The supervisor reads the watch unit's per-rank golden results, and only fresh ones.

The watch side is the real thing: `checks.api.WatchMetrics` served by `serve_metrics` on loopback, the code the
watch unit runs. The ranks' containers are reported running by an in-memory Docker stand-in and the head's
/health answers 200, so the golden result is the only signal that can fail here. Time is a test clock: `probe()` is
called directly, as the supervisor's loop calls it.
"""

from __future__ import annotations

import http.server
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checks.api import Target, WatchMetrics, serve_metrics
from heal.cli import check_golden_url, golden_max_age_s, golden_url
from heal.group import Group, Rank
from heal.supervisor import DeployLock, Log, Settings, Supervisor, read_golden
from stacks.model.loader import parse_config
from tests.conftest import plan_of
from tests.nginx_harness import free_port
from tests.test_observability import enabled

HANG_S = 30.0


@dataclass
class RunningContainers:
    """Every rank's container is running (the signal under test is the golden one)."""

    calls: list[list[str]] = field(default_factory=list)

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        return subprocess.CompletedProcess(args, 0, json.dumps({"Running": True, "Status": "running"}), "")

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        raise AssertionError("no restart step may run in these tests")

    def container(self, node: str, planned: str) -> str:
        return planned


class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()


@dataclass
class Watch:
    metrics: WatchMetrics
    url: str


@pytest.fixture
def watch() -> Iterator[Watch]:
    metrics = WatchMetrics({"stack": "t", "ranks": [{"dp_rank": 0, "node": "node1", "gpus": 8},
                                                    {"dp_rank": 1, "node": "node2", "gpus": 8}]})
    port = free_port()
    server = serve_metrics(("127.0.0.1", port), metrics)
    yield Watch(metrics, f"http://127.0.0.1:{port}/metrics")
    server.shutdown()


class Clock:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, 1_764_775_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def supervisor(health: str, golden: str | None, clock: Clock, tmp_path: Path, max_age_s: float = 300) -> Supervisor:
    group = Group(stack="t", ranks=(Rank("node1", "engine"), Rank("node2", "engine")), ready_timeout_s=60,
                  health_url=health)
    # 60 s: the loopback servers answer at once; only a frozen probe would need it (5 s a loaded machine can use)
    settings = Settings(hang_s=HANG_S, health_timeout_s=60, golden_url=golden, golden_max_age_s=max_age_s)
    return Supervisor(group, RunningContainers(), Log(io.StringIO(), "t"), settings,
                      DeployLock(tmp_path / "lock"),
                      clock=lambda: clock.mono, wall=lambda: clock.wall, sleep=lambda s: None)


def test_a_fresh_golden_failure_is_a_death_after_the_stated_time(health_url: str, watch: Watch, tmp_path: Path) -> None:
    clock = Clock()
    watch.metrics.record(Target(0, "node1"), True, 0.5, at=clock.wall - 5)
    for _ in range(3):
        watch.metrics.record(Target(1, "node2"), False, 9.0, at=clock.wall - 5)
    sup = supervisor(health_url, watch.url, clock, tmp_path)
    assert sup.probe() is None, "not dead before hang_s"
    degraded = [line for line in sup.log.lines if " degraded: " in line]
    assert len(degraded) == 1 and "watch unit: DP rank 1 on node2 failed its golden set (3 round(s) in a row" \
        in degraded[0] and "DP rank 0" not in degraded[0]
    clock.advance(HANG_S)
    reason = sup.probe()
    assert reason is not None and reason.startswith(f"no progress for {HANG_S:.0f}s: watch unit: DP rank 1 on node2")
    # the rank answers again before the stated time: the count starts over
    sup.failing_since = None
    watch.metrics.record(Target(1, "node2"), True, 0.5, at=clock.wall)
    assert sup.probe() is None and sup.failing_since is None


def test_a_stale_result_is_not_used_and_says_so_once(health_url: str, watch: Watch, tmp_path: Path) -> None:
    clock = Clock()
    watch.metrics.record(Target(0, "node1"), True, 0.5, at=clock.wall - 400)
    watch.metrics.record(Target(1, "node2"), False, 9.0, at=clock.wall - 400)
    sup = supervisor(health_url, watch.url, clock, tmp_path, max_age_s=300)
    for _ in range(3):
        assert sup.probe() is None
        clock.advance(HANG_S)
    notes = [line for line in sup.log.lines if " golden: " in line]
    assert len(notes) == 1 and "stale results" in notes[0] and "DP rank 1 (last round 400s ago)" in notes[0]
    assert not any(" degraded: " in line for line in sup.log.lines)
    # the watcher comes back with a fresh failure: used again, and the log says so
    watch.metrics.record(Target(0, "node1"), True, 0.5, at=clock.wall)
    watch.metrics.record(Target(1, "node2"), False, 9.0, at=clock.wall)
    assert sup.probe() is None
    assert "signal back" in sup.log.lines[-2] and "DP rank 1 on node2" in sup.log.lines[-1]


def test_results_from_before_the_last_restart_are_not_used(health_url: str, watch: Watch, tmp_path: Path) -> None:
    clock = Clock()
    watch.metrics.record(Target(0, "node1"), True, 0.5, at=clock.wall - 10)
    watch.metrics.record(Target(1, "node2"), False, 9.0, at=clock.wall - 10)
    sup = supervisor(health_url, watch.url, clock, tmp_path)
    sup.restarted_at = clock.wall - 5  # the group was restarted after that round
    clock.advance(HANG_S)
    assert sup.probe() is None and not any(" degraded: " in line for line in sup.log.lines)
    watch.metrics.record(Target(1, "node2"), False, 9.0, at=clock.wall)  # a round of the new group fails
    assert sup.probe() is None and " degraded: " in sup.log.lines[-1]


def test_an_unreachable_watch_unit_is_no_death(health_url: str, tmp_path: Path) -> None:
    clock = Clock()
    url = f"http://127.0.0.1:{free_port()}/metrics"
    sup = supervisor(health_url, url, clock, tmp_path)
    for _ in range(3):
        assert sup.probe() is None
        clock.advance(HANG_S)
    notes = [line for line in sup.log.lines if " golden: " in line]
    assert len(notes) == 1 and f"cannot read {url}" in notes[0] and "Connection refused" in notes[0]


def test_the_watch_serves_the_round_time_in_full(watch: Watch) -> None:
    watch.metrics.record(Target(1, "node2"), False, 2.0, at=1_764_775_123.25)
    results = read_golden(watch.url, 5)
    assert results["1"].ended_at == 1_764_775_123.25 and results["1"].node == "node2"
    assert not results["1"].ok and results["1"].failures == 1 and "0" not in results


def test_where_the_supervisor_reads_the_golden_results(prod_values: dict[str, Any]) -> None:
    plan = plan_of(prod_values, "prod")
    assert plan.observability is None and golden_url(plan, None) is None
    on = plan_of(enabled(prod_values), "prod")
    assert on.observability is not None
    assert golden_url(on, None) == f"http://{on.observability.watch_target}/metrics"
    assert golden_url(on, "") is None and golden_url(plan, "http://10.0.0.9:9464/metrics") == \
        "http://10.0.0.9:9464/metrics"
    config = parse_config("prod", prod_values)
    assert golden_max_age_s(config, 2) == 3 * config.api.watch_interval_s + 2 * len(config.api.smoke.golden) * \
        config.api.request_timeout_s
    for bad in ("ftp://x/metrics", "http://user:pw@x:1/metrics", "http://x:1/metrics?a=1", "10.0.0.9:9464"):
        problem = check_golden_url(bad)
        assert problem is not None and "--golden-metrics-url" in problem and "pw" not in problem.replace(bad, ""), bad
    assert check_golden_url("http://[::1]:9464/metrics") is None and check_golden_url("") is None
