"""`parallelism.dp_load_balancing`: the plan of each mode (argv, listeners, firewall, proxy upstreams, checks), its
refusals, what real vLLM 0.33.0 derives from the planned argv (a captured fixture), and the Pulumi program.

Golden argv are typed from vLLM 0.33.0's hybrid-LB flags (engine/arg_utils.py:1285-1293, 2489-2505), not
produced by the code under test.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.dp_lb_real_vllm import REFUSED, dp16
from checks.api import tls_context
from components.check_commands import api_command, node_api_command
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.image_cards import card_of_version
from stacks.planner.load_balancing import EXTERNAL_SHAPE, HYBRID_HEADLESS, HYBRID_LOCAL_ONE, HYBRID_ONE_NODE
from stacks.planner.plan import Plan, build_plan
from stacks.planner.proxy import front_door, masked_nginx_conf
from stacks.planner.render import render_plan
from stacks.planner.serve_options import card_table, read_serve_argv
from tests.conftest import ROOT, flag_pairs, plan_of, problems_of
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
from tests.pulumi_harness import run_program
from tests.test_check_api import run_api, standin
from tests.test_mp_multinode import h20_mp
from tests.test_program_proxy import SECRETS, proxied_values
from tests.test_proxy_nginx import bearer

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.33.0-dp-lb.json"
V4 = "/data/models/DeepSeek-V4-Flash"
HEAD = [("--served-model-name", "DeepSeek-V4-Flash"), ("--trust-remote-code", None), ("--dtype", "auto"),
        ("--tensor-parallel-size", "1"), ("--distributed-executor-backend", "mp"), ("--data-parallel-size", "16"),
        ("--data-parallel-size-local", "8")]
DP = [("--data-parallel-address", "192.0.2.11"), ("--data-parallel-rpc-port", "29550"),
      ("--data-parallel-backend", "mp"), ("--enable-expert-parallel", None)]
GOLDEN_HYBRID = {
    "h20-1": [("--host", "0.0.0.0"), ("--port", "8000"), *HEAD, ("--data-parallel-start-rank", "0"),
              ("--data-parallel-hybrid-lb", None), *DP],
    "h20-2": [("--host", "0.0.0.0"), ("--port", "8000"), *HEAD, ("--data-parallel-start-rank", "8"),
              ("--data-parallel-hybrid-lb", None), *DP],
}
GOLDEN_INTERNAL = {
    "h20-1": [("--host", "0.0.0.0"), ("--port", "8000"), *HEAD, *DP],
    "h20-2": [("--headless", None), *HEAD, ("--data-parallel-start-rank", "8"), *DP],
}


def proxied(values: dict[str, Any]) -> dict[str, Any]:
    """The front door on, vLLM on loopback, with the secrets the proxy requires (as markers)."""
    values = copy.deepcopy(values)
    values["serving"] = values["serving"] | {"host": "127.0.0.1"}
    values["api"] = {"proxy": {"enabled": True}}
    return values | {"api_key": SECRET, "proxy_keys": {"team-a": SECRET}, "tls_certificate": SECRET,
                     "tls_private_key": SECRET}


def head_args(plan: Plan, node: str) -> list[tuple[str, str | None]]:
    """The planned argv up to the serving flags (`--max-model-len` onwards is the stack's, unchanged by the mode)."""
    args = plan.node(node).containers[0].vllm_args or []
    assert args[0] == V4
    pairs = flag_pairs(args[1:])
    return pairs[:[p[0] for p in pairs].index("--max-model-len")]


# --- the plan of each mode ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "golden", "roles", "starts"), [
    ("hybrid", GOLDEN_HYBRID, ["dp-head", "dp-api-engine"], [0, 8]),
    ("internal", GOLDEN_INTERNAL, ["dp-head", "headless-engine"], [None, 8]),
])
def test_argv_roles_and_start_ranks_per_mode(mode: str, golden: dict[str, Any], roles: list[str],
                                             starts: list[int | None]) -> None:
    plan = plan_of(dp16(mode))
    assert [n.role for n in plan.nodes] == roles
    assert [n.dp_start_rank for n in plan.nodes] == starts
    assert [n.dp_ranks for n in plan.nodes] == [list(range(8)), list(range(8, 16))]
    assert plan.start_order == ["h20-2", "h20-1"]  # the other node dials the head's DP RPC port either way
    for node, want in golden.items():
        assert head_args(plan, node) == want, node


def test_the_default_is_internal_and_changes_nothing(h20_values: dict[str, Any]) -> None:
    values = dp16("internal")
    del values["parallelism"]["dp_load_balancing"]
    assert plan_of(values).to_json_dict() == plan_of(dp16("internal")).to_json_dict()
    assert parse_config("t", h20_values).parallelism.dp_load_balancing == "internal"


def test_every_planned_argv_is_read_by_the_033_option_table() -> None:
    """The image card's option table (vLLM 0.33.0's own argparse, captured) reads every word of every node."""
    table = card_table(card_of_version("0.33.0"))
    for mode in ("hybrid", "internal"):
        for node in plan_of(dp16(mode)).nodes:
            items = read_serve_argv(node.containers[0].vllm_args or [], table)
            assert [i.problem for i in items if i.problem] == [], (mode, node.name)
            dests = {i.dest for i in items}
            assert ("data_parallel_hybrid_lb" in dests) == (mode == "hybrid"), (mode, node.name)
            assert ("headless" in dests) == (mode == "internal" and node.name == "h20-2")


def test_every_api_server_holds_the_key_and_a_healthcheck() -> None:
    plan = plan_of(dp16("hybrid") | {"api_key": SECRET})
    for node in plan.nodes:
        spec = node.containers[0]
        assert spec.secret_env.get("VLLM_API_KEY") == "api_key" and "VLLM_API_KEY" not in spec.env
        assert spec.healthcheck is not None and "http://127.0.0.1:8000/health" in spec.healthcheck.test[-1]
    internal = plan_of(dp16("internal") | {"api_key": SECRET})
    assert [("VLLM_API_KEY" in n.containers[0].secret_env, n.containers[0].healthcheck is not None)
            for n in internal.nodes] == [(True, True), (False, False)]


def listening(plan: Plan, node: str) -> dict[str, tuple[str, str]]:
    return {x.purpose: (x.ports, x.reach) for x in plan.listeners if x.node == node}


def test_listeners_and_firewall_per_mode() -> None:
    hybrid, internal = plan_of(dp16("hybrid")), plan_of(dp16("internal"))
    head, other = listening(hybrid, "h20-1"), listening(hybrid, "h20-2")
    assert head["OpenAI API (vLLM)"] == ("8000", "clients")
    assert other["OpenAI API (vLLM, this node's DP ranks)"] == ("8000", "clients")
    assert head["DP handshake (ZMQ ROUTER, unauthenticated pickle)"] == ("29550", "cluster")
    # hybrid: the head's API server reaches only its own engines, over IPC; the coordinator publishes over TCP
    assert "engine input/output (ZMQ ROUTER/PULL)" not in head
    assert "DP coordinator to engines and to every node's API server (ZMQ XPUB/PULL)" in head
    assert "engine input/output (ZMQ ROUTER/PULL)" in listening(internal, "h20-1")
    assert not [p for p in listening(internal, "h20-2") if p.startswith("OpenAI API")]
    assert [n.api_ports for n in hybrid.firewall.nodes] == [["8000"], ["8000"]]
    assert [n.api_ports for n in internal.firewall.nodes] == [["8000"], []]
    assert "8000" not in ",".join(internal.firewall.nodes[1].internal_ports)


def test_behind_the_proxy_nginx_balances_over_every_node() -> None:
    config = parse_config("t", proxied(dp16("hybrid")))
    plan = build_plan("t", config)
    assert head_args(plan, "h20-1")[:2] == [("--host", "127.0.0.1"), ("--port", "8000")]
    assert head_args(plan, "h20-2")[:2] == [("--host", "192.0.2.12"), ("--port", "8000")]  # its control IP
    assert plan.proxy is not None and plan.proxy.upstream == "127.0.0.1:8000, 192.0.2.12:8000"
    conf = masked_nginx_conf(front_door(config), ["team-a"])
    block = conf[conf.index("upstream vllm {"):]
    block = block[:block.index("}")]
    assert block.split("\n")[1:4] == ['        least_conn;', '        server "127.0.0.1:8000";',
                                      '        server "192.0.2.12:8000";']
    # the other node's vLLM port is for the proxy only: neither a client port nor one for every cluster host
    assert listening(plan, "h20-2")["OpenAI API (vLLM, this node's DP ranks; reached through the head's proxy)"] == (
        "8000", "proxy")
    assert plan.firewall.nodes[1].api_ports == [] and "8000" not in plan.firewall.nodes[1].internal_ports
    internal = build_plan("t", parse_config("t", proxied(dp16("internal"))))
    assert internal.proxy is not None and internal.proxy.upstream == "127.0.0.1:8000"
    assert "least_conn" not in masked_nginx_conf(front_door(parse_config("t", proxied(dp16("internal")))), ["team-a"])


def test_behind_the_proxy_the_other_nodes_vllm_admits_only_the_proxy() -> None:
    """vLLM's key guards only /v1: /invocations, /tokenize, /pause, /metrics, /collective_rpc of node2 must not be
    open to every cluster host, only to the head's nginx (from its address on the network node2 binds)."""
    from stacks.planner.firewall import render_table

    plan = build_plan("t", parse_config("t", proxied(dp16("hybrid"))))
    api = next(x for x in plan.listeners if x.node == "h20-2" and x.port == 8000)
    assert (api.bind, api.allowed_sources, api.public) == ("192.0.2.12", ["192.0.2.11/32"], False)
    fw = plan.firewall.nodes[1]
    assert (fw.upstream_ports, fw.upstream_sources, fw.upstream_who) == (["8000"], ["192.0.2.11/32"], ["h20-1: nginx"])
    assert "8000" not in ",".join([*fw.internal_ports, *fw.kept_open])
    table = render_table(fw)
    assert "elements = { 8000 }" in table and "elements = { 192.0.2.11/32 }" in table
    assert 'tcp dport @upstream_ports ip saddr != @upstream_v4 counter drop' in table
    assert 'tcp dport @upstream_ports ip6 saddr != @upstream_v6 counter drop' in table  # no IPv6 source: all dropped
    text = render_plan(plan)
    assert "h20-2: " in text and "API behind the proxy 8000 only from 192.0.2.11/32 (h20-1: nginx)" in text
    # Prometheus (on the head: vLLM there binds loopback) scrapes node2's API server from the same address: named
    values = proxied(dp16("hybrid")) | {"observability": {"enabled": True}, "grafana_admin_password": SECRET}
    on_head = build_plan("t", parse_config("t", values)).firewall.nodes[1]
    assert (on_head.upstream_sources, on_head.upstream_who) == (
        ["192.0.2.11/32"], ["h20-1: nginx and h20-1: Prometheus"])


def test_checks_pin_ranks_per_node_with_local_headers() -> None:
    values = dp16("hybrid")
    config = parse_config("t", values)
    plan = build_plan("t", config)
    names = [c.name for c in plan.checks if c.module == "checks.api"]
    assert names == ["api-health", "api-models", "api-golden", "api-node-h20-1", "api-node-h20-2"]
    assert plan.summary.checks_by_kind["api-node"] == 2
    through_endpoint = api_command(config, plan, ["chat"], "api-smoke")
    assert "--dp-size 1" in through_endpoint and "--rank-nodes" not in through_endpoint  # the balanced path
    node2 = next(c for c in plan.checks if c.name == "api-node-h20-2")
    assert node2.node == "h20-2" and node2.runs_on == "node"
    command = node_api_command(config, plan, node2)
    first = command.splitlines()[0]
    container = plan.node("h20-2").containers[0].name
    assert first.startswith("timeout ") and f"docker exec -i {container} python3 - " in first
    for words in ("--url http://127.0.0.1:8000", "--dp-size 8", "--first-rank 8",
                  "--rank-nodes h20-2,h20-2,h20-2,h20-2,h20-2,h20-2,h20-2,h20-2", "--sections health,models,chat"):
        assert words in first, words
    proxied_plan = build_plan("t", parse_config("t", proxied(values)))
    command = node_api_command(parse_config("t", proxied(values)), proxied_plan,
                               next(c for c in proxied_plan.checks if c.name == "api-node-h20-2"))
    assert "--url http://192.0.2.12:8000" in command.splitlines()[0]  # where that node's vLLM binds
    internal = plan_of(dp16("internal"))
    assert [c.name for c in internal.checks if c.name.startswith("api-golden")] == [
        f"api-golden-rank-{r}" for r in range(16)]


def test_a_nodes_check_sends_local_indexes_and_names_global_ranks() -> None:
    """A stand-in API server of one node holding 2 ranks (its range is [0, 2), as vLLM's with hybrid LB):
    global ranks 8 and 9 go out as headers 0 and 1; rank 9 (local 1) answers wrong and is named as rank 9."""
    with standin("--dp-size", "2", "--wrong-rank", "1") as url:
        code, verdict, stdout = run_api(url, "--sections", "chat", "--dp-size", "2", "--first-rank", "8",
                                        "--rank-nodes", "h20-2,h20-2")
        wrong_code, wrong, _ = run_api(url, "--sections", "chat", "--dp-size", "2", "--first-rank", "0",
                                       "--rank-nodes", "h20-2,h20-2")
    assert code == 1, stdout
    assert verdict["summary"].endswith("failing: rank 9 (h20-2)")
    probes = verdict["details"]["chat"]["probes"]
    assert [(p["rank"], p["answer"]) for p in probes] == [(8, "323"), (9, "324")]
    assert any(e.startswith("rank control: rank 2 refused") for e in verdict["details"]["chat"]["evidence"])
    # without the offset the same server is asked for its ranks 0 and 1 and labels them so
    assert wrong_code == 1 and wrong["summary"].endswith("failing: rank 1 (h20-2)")


def test_first_rank_out_of_range_is_a_bad_argument() -> None:
    out = subprocess.run([sys.executable, "-m", "checks.api", "--url", "http://127.0.0.1:9", "--served-name", "m",
                          "--first-rank", "-1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--first-rank" in out.stdout + out.stderr


# --- refusals -------------------------------------------------------------------------------------------------


def one(values: dict[str, Any], key: str) -> Any:
    found = [p for p in problems_of(values) if p.key == key]
    assert found, [p.render() for p in problems_of(values)]
    return found[0]


def test_a_misspelt_mode_names_the_modes() -> None:
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--set",
                          "parallelism.dp_load_balancing=Hybrid"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stderr
    assert "vllm-cluster:parallelism.dp_load_balancing = 'Hybrid': is not one of the allowed values" in out.stderr
    assert "what works: one of 'internal', 'hybrid' or 'external'" in out.stderr
    assert "Traceback" not in out.stderr


def test_hybrid_where_a_replica_spans_nodes_is_refused(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values, nodes=4, data=2)  # DP2 x (TP8 x PP2) over four nodes
    values["parallelism"]["dp_load_balancing"] = "hybrid"
    problem = one(values, "parallelism.dp_load_balancing")
    assert "spans nodes" in problem.message and problem.upstream == HYBRID_HEADLESS


def test_hybrid_on_one_node_and_with_one_local_rank_quote_vllm() -> None:
    values = dp16("hybrid")
    values["parallelism"] |= {"data": 8}
    values["nodes"] = values["nodes"][:1]
    assert one(values, "parallelism.dp_load_balancing").upstream == HYBRID_ONE_NODE
    values = dp16("hybrid")
    values["parallelism"] |= {"tensor": 8, "data": 2}
    problem = one(values, "parallelism.dp_load_balancing")
    assert "silently switches that node to external" in problem.message and problem.upstream == HYBRID_LOCAL_ONE


def test_a_refusal_exits_2_before_anything_is_planned() -> None:
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--set",
                          "parallelism.dp_load_balancing=hybrid"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "vllm-cluster:parallelism.dp_load_balancing = 'hybrid'" in text and "autoswitch" in text
    assert "Traceback" not in text


def test_hybrid_without_a_load_balancer_warns_where_requests_go() -> None:
    plan = plan_of(dp16("hybrid"))
    warning = next(w for w in plan.warnings if w.startswith("parallelism.dp_load_balancing: hybrid without"))
    assert "192.0.2.12:8000" in warning
    assert not [w for w in plan_of(proxied(dp16("hybrid"))).warnings if "dp_load_balancing" in w]


def test_hybrid_behind_the_proxy_without_the_firewall_warns_the_other_nodes_are_open() -> None:
    values = proxied(dp16("hybrid")) | {"firewall": {"enabled": False}}
    plan = plan_of(values)
    warning = next(w for w in plan.warnings if "hybrid behind api.proxy with firewall.enabled: false" in w)
    assert "192.0.2.12:8000" in warning and "/invocations" in warning
    assert plan.firewall.nodes == []
    api = next(x for x in plan.listeners if x.node == "h20-2" and x.port == 8000)
    assert api.allowed_sources == ["0.0.0.0/0", "::/0"]


# --- real vLLM 0.33.0 (captured: bench/dp_lb_real_vllm.py --write) ---------------------------------------------


@pytest.fixture(scope="module")
def captured() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    assert data["origin"]["vllm"] == "0.33.0" and data["origin"]["produced_by"] == "bench/dp_lb_real_vllm.py"
    return data


def test_the_fixture_holds_the_current_plans_argv(captured: dict[str, Any]) -> None:
    """A change of the planned argv makes the capture stale: rerun the bench with --write (docs/load-balancing.md)."""
    for mode in ("hybrid", "internal"):
        for node in plan_of(dp16(mode)).nodes:
            assert captured["argv"][f"{mode}#{node.name}"] == node.containers[0].vllm_args, (mode, node.name)
    external = {c.name: c.vllm_args for n in plan_of(dp16("external")).nodes for c in n.containers}
    assert {k.split("#", 1)[1]: v for k, v in captured["argv"].items() if k.startswith("external#")} == external
    assert {k.split("#", 1)[1]: v for k, v in captured["argv"].items() if k.startswith("refused#")} == REFUSED


def test_vllm_runs_each_node_as_the_plan_says(captured: dict[str, Any]) -> None:
    for mode in ("hybrid", "internal"):
        plan = plan_of(dp16(mode))
        for node in plan.nodes:
            got = captured["vllm"][f"{mode}#{node.name}"]
            headless = node.role == "headless-engine"
            assert got["data_parallel_hybrid_lb"] is (mode == "hybrid") and got["data_parallel_external_lb"] is False
            assert (got["data_parallel_rank"], got["data_parallel_size_local"]) == (node.dp_ranks[0], 8)
            assert got["data_parallel_master_ip"] == "192.0.2.11" and got["data_parallel_rpc_port"] == 29550
            assert got["headless"] is headless and got["local_engines_only"] is (mode == "hybrid")
            # serve.py:113-130: one API server per local rank with hybrid, per rank of the group on the head
            want = (("headless", 0) if headless else ("api servers", 8 if mode == "hybrid" else 16))
            assert (got["launcher"], got["api_servers"]) == want, (mode, node.name)


def test_vllm_does_what_the_refusals_say(captured: dict[str, Any]) -> None:
    got = {k.split("#", 1)[1]: v for k, v in captured["vllm"].items() if k.startswith("refused#")}
    assert HYBRID_HEADLESS.startswith(got["hybrid on a headless node"]["error"])
    one_local = got["hybrid with 1 local rank"]
    assert (one_local["data_parallel_hybrid_lb"], one_local["data_parallel_external_lb"]) == (False, True)
    single = got["hybrid with every rank on one node"]
    assert (single["data_parallel_hybrid_lb"], single["data_parallel_external_lb"]) == (False, False)
    assert EXTERNAL_SHAPE.split(" (vllm/")[0].removesuffix("`") in got["external with 2 local ranks"]["error"]
    # why the internal head never gets a start rank: vLLM would run it hybrid
    assert got["internal head given a start rank"]["data_parallel_hybrid_lb"] is True


# --- the Pulumi program under mocks ------------------------------------------------------------------------------


def test_program_registers_an_api_server_and_its_check_on_every_node() -> None:
    values = proxied(dp16("hybrid"))
    plain = {k: v for k, v in values.items() if k not in SECRETS}
    run = run_program("h20", plain, secrets=SECRETS)
    assert run.error is None, run.error
    containers = {r.name: r.inputs for r in run.mocks.of_type("docker:index/container:Container")}
    name = values["container"]["name"]
    for node, host in (("h20-1", "127.0.0.1"), ("h20-2", "192.0.2.12")):
        inputs = containers[f"engine-{node}-{name}"]
        command = inputs["command"]
        assert command[command.index("--host") + 1] == host and "--data-parallel-hybrid-lb" in command
        assert "healthcheck" in inputs
        check = run.mocks.named(f"api-{node}-api").inputs
        assert check["create"].startswith("timeout ") and f"docker exec -i {name} python3 -" in check["create"]
        assert f"--name api-node-{node}" in check["create"]
        assert run.all_options[f"api-{node}-api"].depends_on  # after the engines
    assert "server \"192.0.2.12:8000\"" not in json.dumps(run.mocks.named("api-proxy").inputs)  # conf is secret
    internal = run_program("h20", {k: v for k, v in proxied(dp16("internal")).items() if k not in SECRETS},
                           secrets=SECRETS)
    assert internal.error is None, internal.error
    assert not [r for r in internal.mocks.resources if r.name.endswith("-api") and r.name.startswith("api-h20")]


def test_prometheus_scrapes_every_nodes_api_server_with_hybrid() -> None:
    """Each API server reports only the engines it manages (local_engines_only): one target per node."""
    from stacks.planner.observability import prometheus_config
    from stacks.planner.topology import derive_topology

    for mode, targets in (("hybrid", [["192.0.2.11:8000"], ["192.0.2.12:8000"]]), ("internal", [["192.0.2.11:8000"]])):
        values = dp16(mode) | {"observability": {"enabled": True}, "grafana_admin_password": SECRET}
        config = parse_config("t", values)
        plan = build_plan("t", config)
        topo, _ = derive_topology(config)
        job = prometheus_config("t", config, topo, {n.name: n.containers for n in plan.nodes})["scrape_configs"][0]
        assert job["job_name"] == "vllm"
        assert [c["targets"] for c in job["static_configs"]] == targets, mode
        assert [c["labels"]["dp_ranks"] for c in job["static_configs"]][-1] == (
            "8,9,10,11,12,13,14,15" if mode == "hybrid" else ",".join(map(str, range(16))))


# --- a real nginx over two API servers ---------------------------------------------------------------------------


@contextmanager
def api_server(host: str, port: int, answer: str) -> Iterator[None]:
    """The stand-in API server on host:port (it checks vLLM's key, as every node's vLLM does)."""
    proc = subprocess.Popen([sys.executable, "-m", "checks.standin", "--host", host, "--port", str(port),
                             "--answer", answer, "--api-key-env", "STANDIN_KEY"], cwd=ROOT,
                            env={**os.environ, "STANDIN_KEY": UPSTREAM_KEY}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("serving "), f"the stand-in did not start: {ready!r}"
        yield
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def test_nginx_spreads_requests_over_every_nodes_api_server(tmp_path: Path, tls: Tls) -> None:
    """The generated nginx.conf with two upstreams (the head's on 127.0.0.1, the other node's on 127.0.0.2, both
    loopback here): requests reach both, and with one gone every request still gets an answer."""
    port, upstream_port = free_port(), free_port()
    values = proxied(dp16("hybrid"))
    values["api"]["proxy"] |= {"bind": "127.0.0.1", "port": port}
    door = dataclasses.replace(front_door(parse_config("t", values)), upstream_port=upstream_port,
                               more_upstreams=(("127.0.0.2", upstream_port),))
    conf = write_conf(tmp_path, door, 0, tls)
    assert nginx_test(conf).returncode == 0

    def answers(client: httpx.Client, n: int) -> list[str]:
        out = []
        for _ in range(n):
            r = client.post("/v1/chat/completions", headers=bearer(CLIENT_KEYS["team-a"]),
                            json={"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "q"}]})
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0]["message"]["content"])
        return out

    with api_server("127.0.0.1", upstream_port, "111"), running_nginx(conf, port), httpx.Client(
            base_url=f"https://localhost:{port}", verify=tls_context(tls.pem), timeout=60) as client:
        with api_server("127.0.0.2", upstream_port, "222"):
            both = answers(client, 6)
        alone = answers(client, 4)  # the other node's server is gone: nginx passes each request to the head's
    assert set(both) == {"111", "222"}, both
    assert alone == ["111"] * 4


# --- the prod policy pack reads every node's API server ----------------------------------------------------------


def test_the_policy_pack_holds_every_api_server_to_its_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    from tests.test_policy import violations, with_host_keys

    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    values = with_host_keys(read_stack_values("prod"))
    values["image"] |= {"tag": "v0.33.0", "digest": "sha256:" + "ab" * 32}  # an image with a card
    values["parallelism"] |= {"tensor": 4, "data": 4, "dp_load_balancing": "hybrid"}
    assert {n: v for n, v in violations(run_program("prod", values), "prod").items() if v} == {}
    keyless = violations(run_program("prod", values, secrets={"ssh_private_key": "k"}), "prod")
    assert sorted(r for r, _ in keyless["vllm-api-auth-on-non-loopback"]) == [
        "engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"]
    # behind the proxy node2's vLLM binds its control-plane address: private, firewalled to the proxy, keyed
    behind = with_host_keys(proxied_values("prod"))
    behind["image"] |= {"tag": "v0.33.0", "digest": "sha256:" + "ab" * 32}
    behind["parallelism"] |= {"tensor": 4, "data": 4, "dp_load_balancing": "hybrid"}
    found = violations(run_program("prod", behind, secrets=SECRETS), "prod")
    assert {n for n, v in found.items() if v} == {"image-pinned-by-digest", "prod-image-pinned-by-digest"}
    assert {r for n in ("image-pinned-by-digest", "prod-image-pinned-by-digest") for r, _ in found[n]} == {
        "api-proxy-image"}  # only nginx's unpinned image


def test_stacks_diff_calls_a_mode_change_a_group_restart() -> None:
    """Every node's argv changes (the flag, the head's start rank, node2's --headless): the whole group moves."""
    from review.downtime import assess
    from review.plan_diff import diff_plans, to_markdown

    found = diff_plans("t", "base", plan_of(dp16("internal")).to_json_dict(), plan_of(dp16("hybrid")).to_json_dict())
    assert assess(found).kind == "group"
    text = to_markdown(found)
    assert "added `api-node-h20-2`" in text and "**removed** `api-golden-rank-15`" in text


def test_stacks_diff_shows_the_firewall_rules_hybrid_adds(tmp_path: Path) -> None:
    """`+ node2:8030` under listening ports is not enough: the reviewer must see who the new port admits and that
    node2's nftables table changes (markdown and --json)."""
    from tests.test_review_tools import diff, edit, make_repo

    repo = make_repo(tmp_path)
    edit(repo, "prod", ("tensor: 8", "tensor: 4"), ("data: 2", "data: 4"),
         ("backend: mp", "backend: mp\n    dp_load_balancing: hybrid"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    md = out.stdout
    section = md[md.index("### Host firewall"):]
    assert "- `node2`: table sha256 `" in section
    assert "  - + API 8030 only from 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24\n" in section
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    node2 = data["firewall"]["nodes"]["node2"]
    assert node2["added"] == ["API 8030 only from 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24"] and node2["removed"] == []
    assert node2["sha256"][0] != node2["sha256"][1] and "node1" not in data["firewall"]["nodes"]
