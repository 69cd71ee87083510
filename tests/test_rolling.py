"""Taking a replica group out of the real nginx front door and back (stacks/planner/rolling.py): the generated
nginx.conf marks each group's servers, the drain script flips them to `down` and reloads, and waits for the
requests the group held; a streamed answer in flight when the drain starts is answered whole."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from checks.api import tls_context
from stacks.model.config import ProxyConfig, ProxyLimits
from stacks.planner.proxy import FrontDoor, ProxyConfigError
from stacks.planner.rolling import GROUP_MARK, NginxControl, check_group_name, drain_script, undrain_script
from tests.nginx_harness import (
    CLIENT_KEYS,
    NGINX,
    Tls,
    free_port,
    make_certificate,
    nginx_test,
    running_nginx,
    write_conf,
)
from tests.test_load_balancing import api_server

pytestmark = pytest.mark.xdist_group("nginx")
AUTH = {"Authorization": f"Bearer {CLIENT_KEYS['team-a']}"}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def door(front: int, ports: tuple[int, int]) -> FrontDoor:
    proxy = ProxyConfig(enabled=True, bind="127.0.0.1", port=front,
                        limits=ProxyLimits(requests_per_minute_per_key=100000, requests_per_minute_per_client=100000))
    base = FrontDoor.of(proxy, ports[0])
    return dataclasses.replace(base, more_upstreams=(("127.0.0.1", ports[1]),), server_groups=("a", "b"))


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)


def ask(client: httpx.Client) -> str:
    r = client.post("/v1/chat/completions", headers=AUTH,
                    json={"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "q"}]})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_the_conf_marks_every_server_with_its_group(tmp_path: Path, tls: Tls) -> None:
    conf = write_conf(tmp_path, door(free_port(), (8001, 8002)), 0, tls)
    text = conf.read_text()
    assert f'server "127.0.0.1:8001"; {GROUP_MARK}a\n' in text
    assert f'server "127.0.0.1:8002"; {GROUP_MARK}b\n' in text
    assert nginx_test(conf).returncode == 0
    with pytest.raises(ProxyConfigError, match="1 group names for 2 upstream servers"):
        write_conf(tmp_path, dataclasses.replace(door(1, (8001, 8002)), server_groups=("a",)), 0, tls)


@pytest.mark.parametrize("name", ["", "A", "a b", "a;rm -rf /", "a/../b", "ä", "a\n", "-a", "a" * 33, "a$(id)"])
def test_group_names_that_could_break_a_pattern_or_a_file_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters"):
        check_group_name(name)


def test_drain_moves_every_request_to_the_other_group_and_lets_a_streamed_answer_finish(tmp_path: Path,
                                                                                       tls: Tls) -> None:
    front, ports = free_port(), (free_port(), free_port())
    conf = write_conf(tmp_path, door(front, ports), 0, tls)
    control = NginxControl(conf=str(conf), pid=str(tmp_path / "nginx.pid"), nginx=(NGINX, "-e", "stderr"))
    with api_server("127.0.0.1", ports[0], "111"), api_server("127.0.0.1", ports[1], "222"), \
            running_nginx(conf, front), httpx.Client(base_url=f"https://localhost:{front}",
                                                     verify=tls_context(tls.pem), timeout=120) as client:
        assert {ask(client) for _ in range(8)} == {"111", "222"}
        # a streamed answer held by group a while it drains: the drain waits for it, and it arrives whole
        streamed: list[str] = []

        def stream() -> None:
            with httpx.Client(base_url=f"https://localhost:{front}", verify=tls_context(tls.pem),
                              timeout=120) as own, own.stream(
                    "POST", "/v1/chat/completions", headers=AUTH,
                    json={"model": "DeepSeek-V4.1-Flash", "stream": True, "max_tokens": 64,
                          "messages": [{"role": "user", "content": "q"}]}) as r:
                streamed.extend(line for line in r.iter_lines() if line.startswith("data:"))

        threads = [threading.Thread(target=stream) for _ in range(4)]  # least_conn: some land on each group
        for t in threads:
            t.start()
        done = run(drain_script("a", control, bound_s=60))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "drain a: out of the upstreams" in done.stdout
        assert f'server "127.0.0.1:{ports[0]}" down; {GROUP_MARK}a' in conf.read_text()
        assert {ask(client) for _ in range(8)} == {"222"}
        for t in threads:
            t.join(timeout=60)
        assert streamed.count("data: [DONE]") == 4, streamed[-3:]
        # twice is an error that changes nothing
        again = run(drain_script("a", control, bound_s=5))
        assert again.returncode == 3 and "no upstream server of group a is up" in again.stdout
        back = run(undrain_script("a", control))
        assert back.returncode == 0 and "undrain a: back in the upstreams" in back.stdout, back.stdout + back.stderr
        assert {ask(client) for _ in range(12)} == {"111", "222"}
        unknown = run(drain_script("c", control, bound_s=5))
        assert unknown.returncode == 3 and "no upstream server of group c" in unknown.stdout


def test_a_drain_nginx_refuses_leaves_the_file_as_it_was(tmp_path: Path, tls: Tls) -> None:
    conf = write_conf(tmp_path, door(free_port(), (8001, 8002)), 0, tls)
    before = conf.read_text()
    # an nginx whose -t fails stands for a configuration the running nginx would not load
    control = NginxControl(conf=str(conf), pid=str(tmp_path / "nginx.pid"), nginx=("false",))
    (tmp_path / "nginx.pid").write_text("1\n")
    done = run(drain_script("a", control, bound_s=5))
    assert done.returncode == 1 and "nginx -t refused the edited file; nothing changed" in done.stdout
    assert conf.read_text() == before and not Path(f"{conf}.rolling").exists()
