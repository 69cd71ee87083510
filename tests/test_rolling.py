"""Taking a replica group out of the real nginx front door and back (stacks/planner/rolling.py): the drain refuses
new connections to the group at the host firewall (nftables, a table of its own), nginx passes every new request to
the other group without a reload, and the drain waits until the group's running requests are answered; streamed
answers in flight when the drain starts arrive whole.

The rules are made in this machine's own network namespace (the engines must be reachable by this process's
client), each for a free port on 127.0.0.2 only, and deleted by the undrain. nginx's workers run as `www-data`
(not root, as in the nginx images); the rules leave root's connections alone, so this test (root, like the group
check's `docker exec`) still reaches a drained group on the address nginx uses."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from checks.api import tls_context
from stacks.model.config import ProxyConfig, ProxyLimits
from stacks.planner.proxy import FrontDoor
from stacks.planner.rolling import DRAIN_TABLE, check_group_name, drain_script, undrain_script
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

pytestmark = pytest.mark.xdist_group("nginx")
AUTH = {"Authorization": f"Bearer {CLIENT_KEYS['team-a']}"}
UPSTREAM = "127.0.0.2"
"""Where nginx reaches the engines, and the only address the drain rules name."""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_certificate(tmp_path_factory.mktemp("tls"))


@contextmanager
def engine(port: int, answer: str) -> Iterator[None]:
    """The OpenAI stand-in on every local address (127.0.0.1 for the checks, 127.0.0.2 for nginx)."""
    proc = subprocess.Popen([sys.executable, "-m", "checks.standin", "--host", "0.0.0.0", "--port", str(port),
                             "--answer", answer, "--api-key-env", "STANDIN_KEY", "--token-delay-s", "0.05"],
                            cwd=ROOT, env={**os.environ, "STANDIN_KEY": UPSTREAM_KEY}, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("serving "), "the stand-in did not start"
        yield
    finally:
        proc.kill()
        proc.wait()


def door(front: int, ports: tuple[int, int]) -> FrontDoor:
    proxy = ProxyConfig(enabled=True, bind="127.0.0.1", port=front,
                        limits=ProxyLimits(requests_per_minute_per_key=100000, requests_per_minute_per_client=100000))
    base = dataclasses.replace(FrontDoor.of(proxy, ports[0]), upstream_host=UPSTREAM)
    return dataclasses.replace(base, more_upstreams=((UPSTREAM, ports[1]),), server_groups=("a", "b"))


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)


def ask(client: httpx.Client) -> str:
    r = client.post("/v1/chat/completions", headers=AUTH,
                    json={"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "q"}]})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_with_groups_the_front_door_keeps_no_idle_connection_to_an_engine(tmp_path: Path, tls: Tls) -> None:
    grouped = write_conf(tmp_path, door(free_port(), (8001, 8002)), 0, tls).read_text()
    assert "keepalive 32;" not in grouped and f'server "{UPSTREAM}:8002" max_fails=1 fail_timeout=10s;' in grouped
    assert nginx_test(tmp_path / "nginx.conf").returncode == 0
    plain = write_conf(tmp_path, dataclasses.replace(door(free_port(), (8001, 8002)), server_groups=()), 0, tls)
    assert "keepalive 32;" in plain.read_text()


@pytest.mark.parametrize("name", ["", "A", "a b", "a;rm -rf /", "a/../b", "ä", "a\n", "-a", "a" * 33, "a$(id)",
                                  'a"'])
def test_group_names_that_could_break_a_rule_or_a_pattern_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters"):
        check_group_name(name)
    with pytest.raises(ValueError, match="lowercase letters"):
        drain_script(name, [(UPSTREAM, 8001)])


@pytest.mark.parametrize(("servers", "why"), [
    ([], "at least one"), ([("node2", 8001)], "not an IP address"), ([("127.0.0.1; nft flush ruleset", 1)],
                                                                        "not an IP address"),
    ([(UPSTREAM, 0)], "1-65535"), ([(UPSTREAM, 70000)], "1-65535"), ([(UPSTREAM, True)], "1-65535"),
])
def test_servers_that_are_not_an_address_and_port_are_refused(servers: list, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        drain_script("a", servers)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory nginx's workers (www-data) can use: pytest's own are open to root only."""
    path = Path(tempfile.mkdtemp(prefix="vc-rolling-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_drain_moves_new_requests_to_the_other_group_without_a_failure(open_dir: Path, tls: Tls) -> None:
    front, ports = free_port(), (free_port(), free_port())
    group = f"t{os.getpid()}"  # its own rules: other runs on this machine drain other names
    conf = write_conf(open_dir, dataclasses.replace(door(front, ports), server_groups=(group, "b")), 0, tls,
                      workers_as="www-data")
    with engine(ports[0], "111"), engine(ports[1], "222"), running_nginx(conf, front), httpx.Client(
            base_url=f"https://localhost:{front}", verify=tls_context(tls.pem), timeout=120) as client:
        try:
            assert {ask(client) for _ in range(8)} == {"111", "222"}
            streamed: list[list[str]] = []

            def stream() -> None:
                with httpx.Client(base_url=f"https://localhost:{front}", verify=tls_context(tls.pem),
                                  timeout=120) as own, own.stream(
                        "POST", "/v1/chat/completions", headers=AUTH,
                        json={"model": "DeepSeek-V4.1-Flash", "stream": True, "max_tokens": 40,
                              "messages": [{"role": "user", "content": "q"}]}) as r:
                    streamed.append([line for line in r.iter_lines() if line.startswith("data:")])

            threads = [threading.Thread(target=stream) for _ in range(4)]  # least_conn: both groups get some
            for t in threads:
                t.start()
            done = run(drain_script(group, [(UPSTREAM, ports[0])], bound_s=90))
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"drain {group}: out of the upstreams, no request left in flight" in done.stdout
            for t in threads:  # the drain waited for group a's streams: they are answered by now, or soon
                t.join(timeout=90)
            assert len(streamed) == 4 and all(s and s[-1] == "data: [DONE]" for s in streamed), streamed
            assert {ask(client) for _ in range(8)} == {"222"}
            # root still reaches the drained group on the very address nginx uses (its own check after a replace)
            direct = httpx.get(f"http://{UPSTREAM}:{ports[0]}/health", timeout=10)
            assert direct.status_code == 200
            # a drain of a group still drained (a change stopped in its turn) makes its rules anew and goes on
            again = run(drain_script(group, [(UPSTREAM, ports[0])], bound_s=5))
            assert again.returncode == 0 and "was still out of the upstreams" in again.stdout, again
        except BaseException:
            run(undrain_script(group, [(UPSTREAM, ports[0])]))
            raise
        back = run(undrain_script(group, [(UPSTREAM, ports[0])]))
        assert back.returncode == 0 and f"undrain {group}: back in the upstreams" in back.stdout, back
        # nginx counts the refused connections against the server for fail_timeout (10 s by default); ask until
        # the group takes requests again, within a generous deadline
        seen: set[str] = set()
        deadline = time.monotonic() + 120
        while seen != {"111", "222"} and time.monotonic() < deadline:
            seen.add(ask(client))
            time.sleep(0.1)  # polling pace, not a wait: the loop ends on the condition
        assert seen == {"111", "222"}
        twice = run(undrain_script(group, [(UPSTREAM, ports[0])]))
        assert twice.returncode == 3 and "it was not drained" in twice.stdout
    rules = subprocess.run(["nft", "list", "table", "inet", DRAIN_TABLE], capture_output=True, text=True)
    assert group not in rules.stdout
