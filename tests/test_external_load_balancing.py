"""`parallelism.dp_load_balancing: external`: every DP rank a vLLM server of its own. The plan (argv per rank,
containers and GPUs, listeners, firewall, nginx upstreams, checks) for two and three nodes and one, its refusals,
what real vLLM 0.33.0 derives from each rank's argv (the captured fixture), and the Pulumi program under mocks.

Golden argv are typed from vLLM 0.33.0's external-LB flags (vllm/engine/arg_utils.py:2447-2485,
vllm/entrypoints/cli/serve.py:83-115), not produced by the code under test.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.dp_lb_real_vllm import REFUSED, dp16
from components.check_commands import api_command, collective_command, dry_run_command, node_api_command
from components.collective_check import collective_runs
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config
from stacks.planner.firewall import render_table
from stacks.planner.image_cards import card_of_version
from stacks.planner.load_balancing import EXTERNAL_DENSE, EXTERNAL_DP_ONE, EXTERNAL_HEADLESS
from stacks.planner.managed_options import HYBRID_LB_ERROR, TWO_LB_MODES_ERROR
from stacks.planner.plan import Plan, build_plan
from stacks.planner.proxy import front_door, masked_nginx_conf
from stacks.planner.render import render_plan
from stacks.planner.serve_options import card_table, read_serve_argv
from tests.conftest import ROOT, flag_pairs, plan_of, problems_of
from tests.docker_harness import standin_env
from tests.pulumi_harness import run_program, waits_for
from tests.test_check_api import run_api, standin
from tests.test_load_balancing import FIXTURE, proxied
from tests.test_mp_multinode import h20_mp
from tests.test_program_proxy import SECRETS

KEY = "parallelism.dp_load_balancing"
SERVE = [("--served-model-name", "DeepSeek-V4-Flash"), ("--trust-remote-code", None), ("--dtype", "auto")]
DP = [("--data-parallel-address", "192.0.2.11"), ("--data-parallel-rpc-port", "29550"),
      ("--data-parallel-backend", "mp"), ("--enable-expert-parallel", None)]


def rank_argv(rank: int, port: int, tensor: int = 1, data: int = 16, host: str = "0.0.0.0") -> list[Any]:
    """vLLM 0.33.0's argv for one external-LB rank, typed by hand."""
    return [("--host", host), ("--port", str(port)), *SERVE, ("--tensor-parallel-size", str(tensor)),
            ("--distributed-executor-backend", "mp"), ("--data-parallel-size", str(data)),
            ("--data-parallel-size-local", "1"), ("--data-parallel-rank", str(rank)),
            ("--data-parallel-external-lb", None), *DP]


def external(nodes: int = 2, tensor: int = 1) -> dict[str, Any]:
    """DP x TP over `nodes` 8-GPU h20 nodes (every GPU used), external load balancing."""
    values = h20_mp(dp16("external"), nodes=nodes, data=8 * nodes // tensor)
    values["nodes"] = values["nodes"][:nodes]
    values["parallelism"] |= {"tensor": tensor, "pipeline": 1, "dp_load_balancing": "external"}
    return values


def served(args: list[str] | None) -> list[Any]:
    """A rank's argv up to the stack's serving flags (the mode changes nothing from `--max-model-len` on)."""
    assert args is not None and args[0] == "/data/models/DeepSeek-V4-Flash"
    pairs = flag_pairs(args[1:])
    return pairs[:[p[0] for p in pairs].index("--max-model-len")]


def containers(plan: Plan) -> dict[str, list[str]]:
    return {n.name: [c.name for c in n.containers] for n in plan.nodes}


# --- the plan ------------------------------------------------------------------------------------------------


def test_every_rank_is_a_server_of_its_own_on_its_gpu_and_port() -> None:
    values = dp16("external") | {"api_key": SECRET}
    plan = plan_of(values)
    assert [n.role for n in plan.nodes] == ["dp-head", "dp-rank-servers"]
    assert [n.dp_ranks for n in plan.nodes] == [list(range(8)), list(range(8, 16))]
    assert plan.topology["load_balancing"] == "external"
    assert plan.start_order == ["h20-2", "h20-1"]
    # on the head rank 0 starts last: it binds the DP RPC handshake every other rank's engine dials
    assert containers(plan) == {"h20-1": [f"vllm-ray-dp{r}" for r in (1, 2, 3, 4, 5, 6, 7, 0)],
                                "h20-2": [f"vllm-ray-dp{r}" for r in range(8, 16)]}
    for node in plan.nodes:
        for spec in node.containers:
            rank = int(spec.name.removeprefix("vllm-ray-dp"))
            local = rank % 8
            assert served(spec.vllm_args) == rank_argv(rank, 8000 + local), spec.name
            assert spec.command == spec.vllm_args and spec.entrypoint is None
            assert spec.env["CUDA_VISIBLE_DEVICES"] == str(local)
            assert spec.secret_env == {"VLLM_API_KEY": "api_key"} and "VLLM_API_KEY" not in spec.env
            health = spec.healthcheck
            assert health is not None and f"http://127.0.0.1:{8000 + local}/health" in health.test[-1]
            assert spec.labels["vllm-cluster.node"] == node.name and spec.labels["vllm-cluster.role"] == node.role
    assert len({c.labels["vllm-cluster.generation"] for n in plan.nodes for c in n.containers}) == 1
    text = render_plan(plan)
    assert "start order: h20-2 -> h20-1 (each node's rank containers in the order listed below; on h20-1 " \
           "vllm-ray-dp0 last)" in text
    assert "container vllm-ray-dp0 — vllm server of DP rank 0 (external load balancing): its own API server on " \
           "port 8000 and engine on GPU(s) 0; also the DP coordinator" in text


def test_a_rank_of_tp2_takes_its_two_gpus() -> None:
    plan = plan_of(external(tensor=2))
    node2 = plan.node("h20-2")
    assert [c.name for c in node2.containers] == ["vllm-ray-dp4", "vllm-ray-dp5", "vllm-ray-dp6", "vllm-ray-dp7"]
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in node2.containers] == ["0,1", "2,3", "4,5", "6,7"]
    assert [served(c.vllm_args) for c in node2.containers] == [
        rank_argv(r, 8000 + r - 4, tensor=2, data=8) for r in range(4, 8)]


@pytest.mark.parametrize("nodes", [2, 3])
def test_listeners_firewall_upstreams_and_checks_cover_every_rank_of_every_node(nodes: int) -> None:
    plan = plan_of(external(nodes))
    ranks = 8 * nodes
    for node in plan.nodes:
        api = [x for x in plan.listeners if x.node == node.name and x.purpose.startswith("OpenAI API")]
        assert [(x.port, x.reach) for x in api] == [(8000 + i, "clients") for i in range(8)], node.name
        assert [x.purpose for x in api] == [f"OpenAI API (vLLM, DP rank {r}'s own server)" for r in node.dp_ranks]
    head = {x.purpose: x.ports for x in plan.listeners if x.node == "h20-1"}
    assert head["DP handshake (ZMQ ROUTER, unauthenticated pickle)"] == "29550"
    assert "DP coordinator to engines and to every rank's API server (ZMQ XPUB/PULL)" in head
    assert "engine input/output (ZMQ ROUTER/PULL)" not in head  # each rank reaches its own engine over IPC
    assert not [x for x in plan.listeners if x.node != "h20-1" and x.port == 29550]
    assert [n.api_ports for n in plan.firewall.nodes] == [["8000-8007"]] * nodes
    names = [c.name for c in plan.checks if c.module == "checks.api"]
    assert names == ["api-health", "api-models", "api-golden", *[f"api-server-rank-{r}" for r in range(ranks)]]
    assert plan.summary.checks_by_kind["api-server"] == ranks
    assert [c.name for c in plan.checks if c.module == "checks.engines"] == [f"dp-engines-{n.name}"
                                                                            for n in plan.nodes]
    behind = build_plan("t", config := parse_config("t", proxied(external(nodes))))
    assert behind.proxy is not None
    servers = behind.proxy.upstream.split(", ")
    assert len(servers) == ranks
    assert servers[:8] == [f"127.0.0.1:{8000 + i}" for i in range(8)]
    assert servers[8:] == [f"192.0.2.{11 + n}:{8000 + i}" for n in range(1, nodes) for i in range(8)]
    conf = masked_nginx_conf(front_door(config), ["team-a"])
    block = conf[conf.index("upstream vllm {"):]
    block = block[:block.index("}")]
    assert "least_conn;" in block and block.count("        server ") == ranks
    # behind the proxy the head's ranks stay on loopback, the others admit only the head's nginx
    assert [n.api_ports for n in behind.firewall.nodes] == [["443"]] + [[]] * (nodes - 1)  # nginx's port
    assert [n.upstream_ports for n in behind.firewall.nodes] == [[]] + [["8000-8007"]] * (nodes - 1)
    assert all(n.upstream_sources == ["192.0.2.11/32"] for n in behind.firewall.nodes[1:])


def test_one_node_is_enough_and_its_handshake_is_still_tcp() -> None:
    """vLLM runs external LB whatever the node count; each rank's engine has dp_size != size_local, so the
    handshake and coordinator sockets are TCP even here (vllm/v1/engine/utils.py:1342-1352)."""
    values = proxied(external(1))
    plan = plan_of(values)
    assert [len(n.containers) for n in plan.nodes] == [8]
    assert plan.proxy is not None and plan.proxy.upstream == ", ".join(f"127.0.0.1:{8000 + i}" for i in range(8))
    assert [x.port for x in plan.listeners if x.purpose.startswith("DP handshake")] == [29550]
    assert all(x.bind == "127.0.0.1" and x.reach == "local" for x in plan.listeners
               if x.purpose.startswith("OpenAI API (vLLM"))


def test_behind_the_proxy_each_ranks_port_admits_only_the_heads_nginx() -> None:
    plan = build_plan("t", parse_config("t", proxied(dp16("external"))))
    assert [served(c.vllm_args)[:2] for c in plan.node("h20-2").containers] == [
        [("--host", "192.0.2.12"), ("--port", str(8000 + i))] for i in range(8)]
    fw = plan.firewall.nodes[1]
    assert (fw.upstream_ports, fw.upstream_sources, fw.upstream_who) == (["8000-8007"], ["192.0.2.11/32"],
                                                                         ["h20-1: nginx"])
    assert fw.api_ports == [] and "8000" not in ",".join(fw.internal_ports)
    table = render_table(fw)
    assert "elements = { 8000-8007 }" in table and "elements = { 192.0.2.11/32 }" in table
    assert "API behind the proxy 8000-8007 only from 192.0.2.11/32 (h20-1: nginx)" in render_plan(plan)


def test_each_ranks_check_runs_in_its_container_against_its_own_port() -> None:
    for values, host in ((dp16("external"), "127.0.0.1"), (proxied(dp16("external")), "192.0.2.12")):
        config = parse_config("t", values)
        plan = build_plan("t", config)
        check = next(c for c in plan.checks if c.name == "api-server-rank-9")
        assert (check.node, check.runs_on, check.sections[:2]) == ("h20-2", "node", ["health", "models"])
        first = node_api_command(config, plan, check).splitlines()[0]
        assert first.startswith("timeout ") and "docker exec -i vllm-ray-dp9 python3 - " in first
        assert f"--url http://{host}:8001" in first and "--dp-size 1 " in first
        assert "--first-rank" not in first and "--rank-nodes" not in first  # one engine: no rank header
        through = api_command(config, plan, ["chat"], "api-smoke")
        assert "--dp-size 1" in through and "--rank-nodes" not in through  # whichever rank the balancer picks


def test_a_ranks_check_passes_against_a_server_with_one_engine() -> None:
    """The check's own arguments against a stand-in that holds one engine, as a rank's server does: it answers
    without a rank header."""
    config = parse_config("t", dp16("external"))
    plan = build_plan("t", config)
    first = node_api_command(config, plan, next(c for c in plan.checks if c.name == "api-server-rank-3"))
    words = shlex.split(first.split(" python3 - ", 1)[1].split(" <<", 1)[0])
    url = words.index("--url")
    with standin("--dp-size", "1", "--served-name", "DeepSeek-V4-Flash") as base:
        words[url + 1] = base
        code, verdict, stdout = run_api(base, *words, "--deadline-s", "30")
    assert code == 0, stdout
    assert verdict["check"] == "api-server-rank-3" and verdict["status"] == "pass"


def test_the_collective_check_stops_every_rank_and_uses_every_gpu_of_the_node() -> None:
    config = parse_config("t", dp16("external"))
    plan = build_plan("t", config)
    runs = collective_runs(config, plan)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in runs] == ["0,1,2,3,4,5,6,7"] * 2
    assert all("--procs-per-node" in r.args and r.args[r.args.index("--procs-per-node") + 1] == "8" for r in runs)
    assert all("--name vllm-ray-collective" in " ".join(r.docker) for r in runs)
    command = collective_command(config, plan, next(c for c in plan.checks if c.name == "collective-h20-2"), runs)
    for rank in range(8, 16):
        assert f"docker stop --time 30 vllm-ray-dp{rank} " in command
    assert command.count('[ -z "$stopped" ] || sleep 5') == 1


def test_the_dry_run_checks_every_rank_servers_argv_of_the_node() -> None:
    config = parse_config("t", dp16("external"))
    plan = build_plan("t", config)
    command = dry_run_command(config, plan, next(c for c in plan.checks if c.name == "args-dry-run-h20-2"))
    first = command.splitlines()[0]
    assert first.startswith("timeout 1440 docker run ")  # 600 s, and 120 s for each further server
    words = shlex.split(first.split(" - ", 1)[1].split(" <<", 1)[0])
    assert words[words.index("--server") + 1] == "vllm-ray-dp8"
    more = [json.loads(words[i + 1]) for i, w in enumerate(words) if w == "--more-argv"]
    assert [m["name"] for m in more] == [f"vllm-ray-dp{r}" for r in range(9, 16)]
    assert more[0]["argv"] == plan.node("h20-2").containers[1].vllm_args
    assert more[0]["expect"]["data_parallel_rank"] == "9" and more[0]["expect"]["port"] == "8001"
    assert "--expect data_parallel_rank=8" in first and words[words.index("--") + 1:] == \
        plan.node("h20-2").containers[0].vllm_args


def _dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **standin_env()}
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{ROOT}"
    return subprocess.run([sys.executable, "-m", "checks.vllm_args", "--json", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_dry_run_names_the_rank_server_whose_argv_is_refused() -> None:
    """Against the stand-in vLLM (0.33.0's parser and serve launch checks): two rank servers accepted; a third
    whose argv parses to another rank, or names a start rank too, fails naming it."""
    base = ["/m", "--data-parallel-size", "4", "--data-parallel-size-local", "1", "--data-parallel-external-lb"]

    def server(name: str, rank: int, *extra: str, expect: int | None = None) -> str:
        argv = [*base, "--data-parallel-rank", str(rank), *extra]
        want = str(rank if expect is None else expect)
        return json.dumps({"name": name, "argv": argv, "expect": {"data_parallel_rank": want}})

    first = ["--server", "m-dp1", "--expect", "data_parallel_rank=1", "--", *base, "--data-parallel-rank", "1"]
    ok = _dry_run("--more-argv", server("m-dp2", 2), "--more-argv", server("m-dp0", 0), *first)
    verdict = json.loads(ok.stdout)
    assert ok.returncode == 0, verdict
    assert verdict["details"]["servers"] == ["m-dp1", "m-dp2", "m-dp0"]
    assert verdict["details"]["launchers"] == ["run_server"] * 3  # one API server each (serve.py:113-115)
    wrong = json.loads(_dry_run("--more-argv", server("m-dp2", 2), "--more-argv", server("m-dp3", 3, expect=0),
                                *first).stdout)
    assert wrong["status"] == "fail" and wrong["summary"].startswith("m-dp3: the vLLM in")
    assert "data_parallel_rank=3, expected '0'" in wrong["evidence"][0]
    assert wrong["evidence"][-1] == "2 server argv before it accepted: m-dp1, m-dp2"
    two = json.loads(_dry_run("--more-argv", server("m-dp2", 2, "--data-parallel-start-rank", "2"), *first).stdout)
    assert two["status"] == "fail" and two["summary"].startswith("m-dp2: ")
    assert any("Cannot use more than one data parallel load balancing mode" in e for e in two["evidence"])
    bad = _dry_run("--more-argv", "{not json", *first)
    assert bad.returncode == 2 and "--more-argv" in bad.stdout + bad.stderr and "Traceback" not in bad.stderr


def test_dp_engines_reads_every_rank_containers_log(tmp_path: Path) -> None:
    """`checks.engines --container a --container b`: each rank's engine logs in its own container."""
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\ncase "$2" in\n'
                      '  m-dp2) echo "(EngineCore_DP2 pid=7) INFO GPU KV cache size: 1,024 tokens";;\n'
                      '  m-dp3) echo "(EngineCore_DP3 pid=9) INFO GPU KV cache size: 1,024 tokens";;\n'
                      '  *) echo "(EngineCore_DP4 pid=1) INFO loading";;\nesac\n')
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}

    def engines(*containers: str) -> subprocess.CompletedProcess[str]:
        words = [w for c in containers for w in ("--container", c)]
        return subprocess.run([sys.executable, "-m", "checks.engines", "--ranks", "2,3", *words], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)

    both = engines("m-dp2", "m-dp3")
    assert both.returncode == 0 and "all 2 DP engine(s) on this node are up" in both.stdout
    one = engines("m-dp2", "m-dp4")
    assert one.returncode == 1 and "DP rank(s) [3] never reported a KV cache" in one.stdout


# --- refusals -------------------------------------------------------------------------------------------------


def _set(values: dict[str, Any], **changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(values)
    for path, value in changes.items():
        section, key = path.split("__")
        values[section] = values.get(section, {}) | {key: value}
    return values


def _dense() -> dict[str, Any]:
    values = dp16("external")
    values["model"] = values["model"] | {"profile": "qwen3-8b"}
    return values


def _spanning() -> dict[str, Any]:
    values = h20_mp(dp16("external"), nodes=4, data=2)  # DP2 x (TP8 x PP2) over four nodes
    values["parallelism"] |= {"tensor": 8, "pipeline": 2, "dp_load_balancing": "external"}
    return values


REFUSALS = [
    ("ray", lambda: _set(dp16("external"), parallelism__backend="ray", parallelism__data=1,
                         parallelism__tensor=8, parallelism__pipeline=2), KEY, EXTERNAL_DP_ONE),
    ("dp-1", lambda: _set(external(1), parallelism__data=1, parallelism__tensor=8), KEY, EXTERNAL_DP_ONE),
    ("dense-model", _dense, KEY, EXTERNAL_DENSE),
    ("replica-spans-nodes", _spanning, KEY, EXTERNAL_HEADLESS),
    ("headless-in-extra-args", lambda: _set(dp16("external"), serving__extra_args=["--headless"]),
     "serving.extra_args.0", HYBRID_LB_ERROR),
    ("a-rank-in-extra-args", lambda: _set(dp16("external"), serving__extra_args=["--data-parallel-rank", "3"]),
     "serving.extra_args.0", TWO_LB_MODES_ERROR),
    ("a-start-rank-in-extra-args", lambda: _set(dp16("external"),
                                                serving__extra_args=["--data-parallel-start-rank", "0"]),
     "serving.extra_args.0", TWO_LB_MODES_ERROR),
    ("shared-gpus", lambda: _set(dp16("external"), container__set_cuda_visible_devices=False),
     "container.set_cuda_visible_devices", None),
    ("one-gpu-list-for-every-rank", lambda: _set(dp16("external"), container__managed_env_overrides={
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}), "container.managed_env_overrides.CUDA_VISIBLE_DEVICES", None),
    ("ports-past-65535", lambda: _set(dp16("external"), serving__port=65530), "serving.port", None),
    ("head-address", lambda: _set(dp16("external"), serving__host="192.0.2.11"), "serving.host", None),
    ("loopback-without-proxy", lambda: _set(dp16("external"), serving__host="127.0.0.1"), "serving.host", None),
]


@pytest.mark.parametrize(("build", "key", "upstream"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_each_broken_combination_is_refused_with_its_key_and_vllms_reason(build: Any, key: str,
                                                                          upstream: str | None) -> None:
    problems = problems_of(build())
    found = [p for p in problems if p.key == key]
    assert found, [p.render() for p in problems]
    assert found[0].message and found[0].fix
    if upstream is not None:
        assert found[0].upstream == upstream


def test_the_refusals_say_what_vllm_and_the_layout_need() -> None:
    ports = next(p for p in problems_of(_set(dp16("external"), serving__port=65530)) if p.key == "serving.port")
    assert "serving.port to serving.port + 7 (8 ranks on one node), past 65535" in ports.message
    assert ports.fix == "at most 65528"
    gpus = next(p for p in problems_of(_set(dp16("external"), container__set_cuda_visible_devices=False))
                if p.key == "container.set_cuda_visible_devices")
    assert "every rank of a node would load onto the same GPUs" in gpus.message and "utils.py:439-474" in gpus.message
    dense = next(p for p in problems_of(_dense()) if p.key == KEY)
    assert "qwen3-8b is a dense model" in dense.message and dense.value == "external"


def test_a_rank_port_on_another_listeners_port_is_refused() -> None:
    """Rank 1 of the head listens on serving.port + 1: the DP RPC port there is refused as a clash, under the
    fixed port's own key and value (serving.port is 8000, not the rank's 8001), with the rank range to avoid."""
    values = _set(dp16("external"), parallelism__data_parallel_rpc_port=8001)
    clash = [p for p in problems_of(values) if "both listen on h20-1:8001" in p.message]
    assert len(clash) == 1, [p.render() for p in problems_of(values)]
    assert (clash[0].key, clash[0].value) == ("parallelism.data_parallel_rpc_port", 8001)
    assert "DP rank 1's own server, on serving.port 8000 + 1)" in clash[0].message
    assert "outside 8000-8007" in (clash[0].fix or "") and "RAY_PORTS" not in (clash[0].fix or "")


def test_a_rank_port_on_a_monitoring_port_names_the_monitoring_key() -> None:
    """A monitoring port moves most easily: the clash with rank 3's server is that key's, with its own value."""
    values = _set(dp16("external"), observability__enabled=True) | {"grafana_admin_password": SECRET}
    values["observability"]["ports"] = {"node_exporter": 8003}
    clash = [p for p in problems_of(values) if "both listen on h20-2:8003" in p.message]
    assert clash and (clash[0].key, clash[0].value) == ("observability.ports.node_exporter", 8003), [
        p.render() for p in problems_of(values)]


def test_warnings_name_every_ranks_server() -> None:
    plan = plan_of(dp16("external"))
    warning = next(w for w in plan.warnings if w.startswith(f"{KEY}: external without api.proxy"))
    assert "(192.0.2.11:8000-8007, 192.0.2.12:8000-8007)" in warning
    assert not [w for w in plan_of(proxied(dp16("external"))).warnings if KEY in w]
    open_ = plan_of(proxied(dp16("external")) | {"firewall": {"enabled": False}})
    assert any("external behind api.proxy with firewall.enabled: false" in w and "192.0.2.12:8000-8007" in w
               for w in open_.warnings)


# --- real vLLM 0.33.0 (captured: bench/dp_lb_real_vllm.py --write) ---------------------------------------------


@pytest.fixture(scope="module")
def captured() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    assert data["origin"]["vllm"] == "0.33.0" and data["origin"]["produced_by"] == "bench/dp_lb_real_vllm.py"
    return data


def test_vllm_runs_each_rank_as_a_server_of_its_own(captured: dict[str, Any]) -> None:
    plan = plan_of(dp16("external"))
    for node in plan.nodes:
        for spec in node.containers:
            got = captured["vllm"][f"external#{spec.name}"]
            rank = int(spec.name.removeprefix("vllm-ray-dp"))
            assert (got["data_parallel_rank"], got["data_parallel_size_local"], got["data_parallel_size"]) == (
                rank, 1, 16), spec.name
            assert got["data_parallel_external_lb"] is True and got["data_parallel_hybrid_lb"] is False
            assert got["local_engines_only"] is True and got["headless"] is False
            assert got["data_parallel_master_ip"] == "192.0.2.11" and got["data_parallel_rpc_port"] == 29550
            # serve.py:113-115, 153-156: one API server in this process for an external rank
            assert (got["launcher"], got["api_servers"]) == ("api servers", 1)
            assert got["port"] == 8000 + rank % 8 and got["needs_dp_coordinator"] is True


def test_vllm_refuses_what_the_planner_refuses_for_external(captured: dict[str, Any]) -> None:
    got = {k.split("#", 1)[1]: v for k, v in captured["vllm"].items() if k.startswith("refused#")}
    assert EXTERNAL_DP_ONE.split(" (vllm/")[0].removeprefix("ValueError: ") in got["external with DP 1"]["error"]
    assert EXTERNAL_DENSE.split(" (vllm/")[0] == got["external on a dense model"]["error"]
    for both in ("external rank given a start rank too", "external and hybrid together"):
        assert "Cannot use more than one data parallel load balancing mode" in got[both]["error"]
    assert "requires a data-parallel rank" in got["external without a rank"]["error"]
    assert "data_parallel_rank (16) must be in the range [0, 16)" in got["external rank out of range"]["error"]
    # a headless rank passes the config (headless launcher, no API server) and is refused only when rank 0's
    # handshake meets it (v1/engine/utils.py:1502-1508): the planner never renders one
    headless = got["external rank on a headless node"]
    assert (headless["launcher"], headless["data_parallel_external_lb"]) == ("headless", True)
    assert not [a for n in plan_of(dp16("external")).nodes for c in n.containers for a in c.vllm_args or []
                if a in ("--headless", "--data-parallel-start-rank", "--data-parallel-hybrid-lb")]
    assert set(REFUSED) >= set(got)


def test_the_shipped_dry_run_accepts_every_rank_server_on_vllm(captured: dict[str, Any]) -> None:
    plan = plan_of(dp16("external"))
    for node in plan.nodes:
        got = captured["dry_run"][node.name]
        assert (got["exit"], got["status"]) == (0, "pass"), got
        assert got["servers"] == [c.name for c in node.containers]


def test_every_ranks_argv_is_read_by_the_033_option_table() -> None:
    table = card_table(card_of_version("0.33.0"))
    for node in plan_of(dp16("external")).nodes:
        for spec in node.containers:
            items = read_serve_argv(spec.vllm_args or [], table)
            assert [i.problem for i in items if i.problem] == [], spec.name
            dests = {i.dest for i in items}
            assert {"data_parallel_rank", "data_parallel_external_lb"} <= dests
            assert not dests & {"headless", "data_parallel_start_rank", "data_parallel_hybrid_lb"}


# --- the Pulumi program under mocks ------------------------------------------------------------------------------


def test_program_registers_one_engine_per_rank_in_start_order() -> None:
    values = proxied(dp16("external"))
    plain = {k: v for k, v in values.items() if k not in SECRETS}
    run = run_program("h20", plain, secrets=SECRETS)
    assert run.error is None, run.error
    engines = {r.name: r for r in run.mocks.of_type("docker:index/container:Container")
               if r.name.startswith("engine-")}
    assert sorted(engines) == sorted(f"engine-h20-{1 + r // 8}-vllm-ray-dp{r}" for r in range(16))
    for rank in range(16):
        reg = engines[f"engine-h20-{1 + rank // 8}-vllm-ray-dp{rank}"]
        command = reg.inputs["command"]
        assert command[command.index("--data-parallel-rank") + 1] == str(rank)
        assert f"CUDA_VISIBLE_DEVICES={rank % 8}" in reg.inputs["envs"]["value"]
        assert "healthcheck" in reg.inputs
    # the start order is what Pulumi waits for: the other node's ranks together, then the head's one by one, rank 0
    # last (registration order under mocks is not start order)
    engine = run.result["engine"]
    node2, head = engine.node_containers["h20-2"], engine.node_containers["h20-1"]
    assert [c._name for c in head] == [f"engine-h20-1-vllm-ray-dp{r}" for r in (1, 2, 3, 4, 5, 6, 7, 0)]
    assert all(waits_for(run, h, c) for h in head for c in node2)
    assert all(waits_for(run, later, earlier) for i, later in enumerate(head) for earlier in head[:i])
    assert not any(waits_for(run, c, other) for c in node2 for other in [*node2, *head] if other is not c)
    assert engine.containers["h20-1/vllm-ray-dp0"] is head[-1]
    for rank in range(16):
        node = "h20-1" if rank < 8 else "h20-2"
        check = run.mocks.named(f"api-{node}-rank-{rank}-api").inputs["create"]
        assert f"docker exec -i vllm-ray-dp{rank} python3 -" in check and f"--name api-server-rank-{rank}" in check
        assert all(waits_for(run, run.result["api"].node_checks[f"{node}-rank-{rank}"], c)
                   for c in engine.containers.values())
    dry = run.mocks.named("engine-h20-1-args-dry-run").inputs["create"]
    assert dry.splitlines()[0].count("--more-argv") == 7
    exporter = [r for r in run.mocks.resources if r.name.endswith("node-exporter")]
    assert exporter == []  # observability is off here; the exporter's wait on every rank is the next test's


def test_the_node_exporter_follows_every_rank_container_of_its_node() -> None:
    values = proxied(dp16("external")) | {"observability": {"enabled": True}}
    plain = {k: v for k, v in values.items() if k not in SECRETS}
    run = run_program("h20", plain, secrets={**SECRETS, "grafana_admin_password": "mock-grafana-password"})
    assert run.error is None, run.error
    engine, monitoring = run.result["engine"], run.result["observability"]
    exporter = monitoring.containers["h20-2-node-exporter"]
    assert all(waits_for(run, exporter, c) for c in engine.node_containers["h20-2"])


def test_prometheus_scrapes_every_ranks_own_server() -> None:
    from stacks.planner.observability import prometheus_config
    from stacks.planner.topology import derive_topology

    values = dp16("external") | {"observability": {"enabled": True}, "grafana_admin_password": SECRET}
    config = parse_config("t", values)
    plan = build_plan("t", config)
    topo, _ = derive_topology(config)
    job = prometheus_config("t", config, topo, {n.name: n.containers for n in plan.nodes})["scrape_configs"][0]
    assert [c["targets"] for c in job["static_configs"]] == [
        [f"192.0.2.{11 + r // 8}:{8000 + r % 8}"] for r in range(16)]
    assert [c["labels"]["dp_ranks"] for c in job["static_configs"]] == [str(r) for r in range(16)]


def test_stacks_diff_calls_a_switch_to_external_a_group_restart() -> None:
    from review.downtime import assess
    from review.plan_diff import diff_plans, to_markdown

    found = diff_plans("t", "base", plan_of(dp16("internal")).to_json_dict(), plan_of(dp16("external")).to_json_dict())
    assert assess(found).kind == "group"
    text = to_markdown(found)
    assert "added `api-server-rank-15`" in text and "**removed** `api-golden-rank-15`" in text


def test_stacks_diff_shows_the_firewall_rules_external_adds(tmp_path: Path) -> None:
    """prod to external with two ranks per node: each node's table opens its two rank ports, and the reviewer sees
    that in `stacks diff` (markdown and --json)."""
    from tests.test_review_tools import diff, edit, make_repo

    repo = make_repo(tmp_path)
    edit(repo, "prod", ("tensor: 8", "tensor: 4"), ("data: 2", "data: 4"),
         ("backend: mp", "backend: mp\n    dp_load_balancing: external"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    md = out.stdout
    assert "added `api-server-rank-3`" in md
    section = md[md.index("### Host firewall"):]
    assert "  - + API 8030-8031 only from 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24\n" in section
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    node2 = data["firewall"]["nodes"]["node2"]
    assert node2["added"] == ["API 8030-8031 only from 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24"]
    node1 = data["firewall"]["nodes"]["node1"]
    assert node1["added"] == ["API 8030-8031 only from 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24"]
    assert node1["removed"] == ["API 8030 only from 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24"]


def test_the_policy_pack_holds_every_ranks_server_to_its_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """The prod policies read every engine container: each rank's server is held to the API-auth, firewall and
    image rules as the one API server of internal load balancing is."""
    from stacks.model.loader import read_stack_values
    from tests.test_policy import violations, with_host_keys
    from tests.test_program_proxy import proxied_values

    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    values = with_host_keys(read_stack_values("prod"))
    values["image"] |= {"tag": "v0.33.0", "digest": "sha256:" + "ab" * 32}  # an image with a card
    values["parallelism"] |= {"tensor": 4, "data": 4, "dp_load_balancing": "external"}
    assert {n: v for n, v in violations(run_program("prod", values), "prod").items() if v} == {}
    keyless = violations(run_program("prod", values, secrets={"ssh_private_key": "k"}), "prod")
    assert sorted(r for r, _ in keyless["vllm-api-auth-on-non-loopback"]) == [
        f"engine-node{1 + r // 2}-deepseek-v41-flash-dp{r}" for r in range(4)]
    behind = with_host_keys(proxied_values("prod"))
    behind["image"] |= {"tag": "v0.33.0", "digest": "sha256:" + "ab" * 32}
    behind["parallelism"] |= {"tensor": 4, "data": 4, "dp_load_balancing": "external"}
    found = violations(run_program("prod", behind, secrets=SECRETS), "prod")
    assert {r for n, v in found.items() for r, _ in v} == {"api-proxy-image"}  # only nginx's unpinned image


def test_the_collective_guard_skips_a_running_group_and_stops_every_rank_of_a_replaced_one(tmp_path: Path) -> None:
    """The guard in front of the all-reduce, run by bash against a fake `docker`: while every rank container runs
    this image with this node's fabric env (each with its own CUDA_VISIBLE_DEVICES) the check is skipped and
    nothing stops; with another image every rank container of the node is stopped."""
    config = parse_config("t", dp16("external"))
    plan = build_plan("t", config)
    check = next(c for c in plan.checks if c.name == "collective-h20-2")
    guard = collective_command(config, plan, check).split("\ntimeout ", 1)[0]
    for spec in plan.node("h20-2").containers:
        (tmp_path / f"env-{spec.name}").write_text("".join(f"{k}={v}\n" for k, v in spec.env.items()))
    docker = tmp_path / "docker"
    docker.write_text(f'''#!/bin/bash
d={tmp_path}
case "$1 $2" in
  "container inspect")
    name="${{@: -1}}"
    case "$4" in *State.Running*) echo "t true sha256:running";; *) cat "$d/env-$name";; esac ;;
  "image inspect") cat "$d/image" ;;
  "stop "*) echo "${{@: -1}}" >> "$d/stopped" ;;
esac
''')
    docker.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}

    def run_guard(image: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "image").write_text(image + "\n")
        (tmp_path / "stopped").write_text("")
        return subprocess.run(["bash", "-c", guard + "\necho GUARD-DONE"], env=env, capture_output=True,
                              text=True, timeout=120)

    same = run_guard("sha256:running")
    assert same.returncode == 0 and same.stdout.startswith("SKIP collective-h20-2: engine vllm-ray-dp8"), same
    assert "GUARD-DONE" not in same.stdout and (tmp_path / "stopped").read_text() == ""
    new = run_guard("sha256:new")
    assert new.returncode == 0 and "GUARD-DONE" in new.stdout, new
    assert (tmp_path / "stopped").read_text().split() == [f"vllm-ray-dp{r}" for r in range(8, 16)]
