"""The listener table: golden rows for both stacks (typed from the upstream code read for stacks/planner/listeners.py),
variants, and the table checked against real processes in network namespaces — a real two-node Ray 2.60
cluster started with the planned `ray start` argv, torch's TCPStore and Gloo — with the firewall applied.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.model.config import SECRET_MARKER
from stacks.model.errors import ConfigError
from stacks.model.loader import load_stack, parse_config, read_stack_values
from stacks.planner.firewall import firewall_command
from stacks.planner.listeners import Listener, listener_table
from stacks.planner.plan import Plan, build_plan
from stacks.planner.topology import derive_topology
from tests.conftest import clone_node, plan_of, problems_of
from tests.netns_firewall import Lab, lab_config, stop

EPH = (32768, 60999)
# (node, role, port, port_end, bind, network, reach, purpose starts with) — from the code cited in listeners.py
PROD = [
    ("node1", "dp-head", 8030, None, "0.0.0.0", "all", "clients", "OpenAI API (vLLM)"),
    ("node1", "dp-head", 13399, None, "1.1.1.2", "data", "cluster", "DP handshake (ZMQ ROUTER"),
    ("node1", "dp-head", 28028, None, "127.0.0.1", "loopback", "local", "NCCL RAS client socket"),
    ("node1", "dp-head", 29700, None, "1.1.1.2", "data", "cluster", "collective check rendezvous (torch TCPStore"),
    ("node1", "dp-head", *EPH, "1.1.1.2", "data", "cluster", "engine input/output (ZMQ"),
    ("node1", "dp-head", *EPH, "1.1.1.2", "data", "cluster", "DP coordinator to engines (ZMQ"),
    ("node1", "dp-head", *EPH, "::", "all", "cluster", "DP coordination store (torch TCPStore"),
    ("node1", "dp-head", *EPH, "1.1.1.2", "data", "cluster", "DP process group store (TCPStore on a bound socket"),
    ("node1", "dp-head", *EPH, "::", "all", "cluster", "world process group store (torch TCPStore"),
    ("node1", "dp-head", *EPH, "1.1.1.2", "data", "cluster", "Gloo pair listeners"),
    ("node1", "dp-head", *EPH, "1.1.1.2", "data", "cluster", "NCCL bootstrap, proxy and network listeners"),
    ("node2", "headless-engine", 28028, None, "127.0.0.1", "loopback", "local", "NCCL RAS client socket"),
    ("node2", "headless-engine", *EPH, "1.1.1.1", "data", "cluster", "Gloo pair listeners"),
    ("node2", "headless-engine", *EPH, "1.1.1.1", "data", "cluster", "NCCL bootstrap, proxy and network listeners"),
]
_RAY_NODE = [
    (6380, None, "::", "all", "cluster", "Ray raylet node manager"),
    (6381, None, "::", "all", "cluster", "Ray object manager"),
    (6382, None, "{ip}", "management", "cluster", "Ray runtime env agent"),
    (6383, None, "::", "all", "cluster", "Ray dashboard agent gRPC"),
    (6384, None, "0.0.0.0", "all", "cluster", "Ray metrics export"),
]
H20 = [
    ("h20-1", "ray-head", 8000, None, "0.0.0.0", "all", "clients", "OpenAI API (vLLM)"),
    ("h20-1", "ray-head", 6379, None, "::", "all", "cluster", "Ray GCS"),
    *[("h20-1", "ray-head", p, e, b.format(ip="192.0.2.11"), n, r, t) for p, e, b, n, r, t in _RAY_NODE],
    ("h20-1", "ray-head", 8265, None, "127.0.0.1", "loopback", "local", "Ray dashboard and jobs API"),
    ("h20-1", "ray-head", 10001, None, "192.0.2.11", "management", "cluster", "Ray client server"),
    ("h20-1", "ray-head", 10001, None, "127.0.0.1", "loopback", "local", "Ray client server"),
    ("h20-1", "ray-head", 10002, 19999, "::", "all", "cluster", "Ray worker and driver gRPC"),
    ("h20-1", "ray-head", 23000, 23999, "127.0.0.1", "loopback", "local", "Ray client per-session servers"),
    ("h20-1", "ray-head", 28028, None, "127.0.0.1", "loopback", "local", "NCCL RAS client socket"),
    ("h20-1", "ray-head", 29700, None, "192.0.2.11", "management", "cluster", "collective check rendezvous"),
    ("h20-1", "ray-head", 44227, None, "0.0.0.0", "all", "cluster", "Ray dashboard metrics"),
    ("h20-1", "ray-head", 52365, None, "192.0.2.11", "management", "cluster", "Ray dashboard agent HTTP"),
    ("h20-1", "ray-head", 52365, None, "127.0.0.1", "loopback", "local", "Ray dashboard agent HTTP"),
    ("h20-1", "ray-head", *EPH, "192.0.2.11", "management", "cluster", "executor message queues"),
    ("h20-1", "ray-head", *EPH, "::", "all", "cluster", "world process group store (torch TCPStore"),
    ("h20-1", "ray-head", *EPH, "192.0.2.11", "management", "cluster", "Gloo pair listeners"),
    ("h20-1", "ray-head", *EPH, "192.0.2.11", "management", "cluster", "NCCL bootstrap, proxy and network listeners"),
    *[("h20-2", "ray-worker", p, e, b.format(ip="192.0.2.12"), n, r, t) for p, e, b, n, r, t in _RAY_NODE],
    ("h20-2", "ray-worker", 10002, 19999, "::", "all", "cluster", "Ray worker and driver gRPC"),
    ("h20-2", "ray-worker", 28028, None, "127.0.0.1", "loopback", "local", "NCCL RAS client socket"),
    ("h20-2", "ray-worker", 52365, None, "192.0.2.12", "management", "cluster", "Ray dashboard agent HTTP"),
    ("h20-2", "ray-worker", 52365, None, "127.0.0.1", "loopback", "local", "Ray dashboard agent HTTP"),
    ("h20-2", "ray-worker", *EPH, "192.0.2.12", "management", "cluster", "executor message queues"),
    ("h20-2", "ray-worker", *EPH, "192.0.2.12", "management", "cluster", "Gloo pair listeners"),
    ("h20-2", "ray-worker", *EPH, "192.0.2.12", "management", "cluster", "NCCL bootstrap, proxy and network listeners"),
]


def _rows(plan: Plan) -> list[tuple[Any, ...]]:
    return [(x.node, x.role, x.port, x.port_end, x.bind, x.network, x.reach) for x in plan.listeners]


@pytest.mark.parametrize("stack,golden", [("prod", PROD), ("h20", H20)])
def test_golden_listener_tables(stack: str, golden: list[tuple[Any, ...]]) -> None:
    plan = build_plan(stack, load_stack(stack))
    assert _rows(plan) == [g[:7] for g in golden]
    for x, g in zip(plan.listeners, golden, strict=True):
        assert x.purpose.startswith(g[7]), (x.purpose, g[7])
        assert x.source and x.protocol == "tcp"
        assert x.ephemeral == (x.port_end == EPH[1] and x.port == EPH[0])
        assert x.internal == (x.reach != "clients") and not x.public
        assert x.allowed_sources == ([] if x.network == "loopback" else
                                     ["1.1.1.0/24", "1.1.2.0/24", "10.30.8.0/24"] if stack == "prod" else
                                     ["192.0.2.0/24", "198.51.100.0/24"])


def test_plan_json_and_text_show_the_table() -> None:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "h20", "--json"], cwd=root, capture_output=True,
                         text=True, timeout=60)
    data = json.loads(out.stdout)
    gcs = next(x for x in data["listeners"] if x["port"] == 6379)
    assert {k: gcs[k] for k in ("node", "port", "port_end", "protocol", "bind", "network", "public", "role",
                                "reach", "internal", "ephemeral")} == {
        "node": "h20-1", "port": 6379, "port_end": None, "protocol": "tcp", "bind": "::", "network": "all",
        "public": False, "role": "ray-head", "reach": "cluster", "internal": True, "ephemeral": False}
    assert gcs["source"].startswith("ray-project/ray src/ray/gcs/gcs_server.cc")
    assert data["firewall"]["table"] == "inet vllm_cluster" and len(data["firewall"]["nodes"]) == 2
    text = subprocess.run([sys.executable, "-m", "stacks", "plan", "h20"], cwd=root, capture_output=True, text=True,
                          timeout=60).stdout
    assert "h20-1        ray-head        6379        ::               all        cluster cluster" in text
    assert "h20-2        ray-worker      ephemeral   192.0.2.12       management cluster cluster" in text
    assert "host firewall: table inet vllm_cluster on every node" in text
    assert "ray-project/ray src/ray/rpc/grpc_server.cc GrpcServer::Run" in text


def _table(values: dict[str, Any]) -> list[Listener]:
    """The table without the plan's memory rules (a 1-GPU DeepSeek is refused long before its ports matter)."""
    config = parse_config("t", values)
    return listener_table(config, derive_topology(config)[0])


def test_single_node_and_socket_variants(prod_values: dict[str, Any]) -> None:
    values = json.loads(json.dumps(prod_values))
    values["nodes"] = values["nodes"][:1]
    values["parallelism"]["data"] = 1
    purposes = [x.purpose for x in _table(values)]
    assert not any("DP" in p or "world process group" in p for p in purposes)   # FileStore, IPC: no TCP
    assert any(p.startswith("NCCL bootstrap") for p in purposes)               # TP8 still uses NCCL
    values["parallelism"].update(tensor=1, expert=False)
    values["nodes"][0]["gpus"]["count"] = 1
    assert [x.purpose for x in _table(values)] == ["OpenAI API (vLLM)"]         # one rank: no peer to listen for
    prod_values["fabric"]["transport"] = "socket"
    nccl = [x for x in plan_of(prod_values).listeners if x.node == "node2" and "NCCL" in x.purpose and x.ephemeral]
    assert [(x.bind, x.purpose.split(" (")[0]) for x in nccl] == [
        ("1.1.1.1", "NCCL bootstrap, proxy and network listeners"), ("1.1.2.1", "NCCL NET/Socket listener")]


def test_dp_on_one_node_keeps_the_handshake_on_ipc(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"] = prod_values["nodes"][:1]
    prod_values["nodes"][0]["gpus"]["count"] = 16
    purposes = [x.purpose for x in _table(prod_values)]
    assert not any("handshake" in p or "ZMQ" in p for p in purposes)   # all engines local: IPC
    assert any("DP coordination store" in p for p in purposes)         # but the TCPStore binds all addresses


def test_more_nodes_and_the_multinode_master_port(prod_values: dict[str, Any], h20_values: dict[str, Any]) -> None:
    prod_values["nodes"] += [clone_node(prod_values["nodes"][1], 2), clone_node(prod_values["nodes"][1], 3)]
    prod_values["parallelism"]["data"] = 4
    table = plan_of(prod_values).listeners  # DP4 x TP8, one rank per node: no replica spans nodes
    assert sorted({x.node for x in table}) == ["node1", "node2", "node3", "node4"]
    assert not [x for x in table if x.port == 29501]
    prod_values.pop("speculative")  # DSpark has no PP
    prod_values["parallelism"] |= {"data": 2, "pipeline": 2}  # DP2 x (TP8 x PP2): each replica spans 2 nodes
    spanning = plan_of(prod_values)
    master = [x for x in spanning.listeners if x.port == 29501]
    assert [(x.node, x.bind) for x in master] == [("node1", "::")]
    queues = {x.node for x in spanning.listeners if "worker response queues" in x.purpose}
    assert queues == {"node1", "node2", "node3", "node4"}
    h20_values["nodes"].append(clone_node(h20_values["nodes"][1], 2))
    h20_values["nodes"][2]["management_ip"] = "192.0.2.13"
    h20_values["parallelism"]["pipeline"] = 3
    ray = plan_of(h20_values)
    assert [x.node for x in ray.listeners if x.port == 6380] == ["h20-1", "h20-2", "node3"]
    assert [x.bind for x in ray.listeners if x.port == 6382 and x.node == "node3"] == ["192.0.2.13"]


def test_a_port_clash_with_a_pinned_ray_port_is_refused(h20_values: dict[str, Any]) -> None:
    h20_values["serving"]["port"] = 6381
    [problem] = problems_of(h20_values)
    assert problem.key == "serving.port" and problem.value == 6381
    assert "Ray object manager" in problem.message and "Address already in use" in problem.message
    assert "RAY_PORTS" in (problem.fix or "")
    h20_values["serving"]["port"] = 15000                               # inside the worker port range
    with pytest.raises(ConfigError, match="Ray worker and driver gRPC"):
        plan_of(h20_values)


def _ephemeral(plan: Plan) -> list[str]:
    return [w for w in plan.warnings if "ephemeral range" in w]


def test_a_chosen_port_in_the_kernels_ephemeral_range_is_warned_with_one_reservation_for_all(
        prod_values: dict[str, Any], h20_values: dict[str, Any]) -> None:
    """serving.port 40000 can be held by an outgoing connection when vLLM restarts: warned under its key; then one
    line reserves every fixed port in the range at once (the kernel keeps one list; a sysctl per key would undo the
    one before), Ray's pinned ports included. Ray's defaults alone (dashboard metrics 44227, agent 52365) are not
    warned: the stack did not choose them."""
    assert _ephemeral(plan_of(prod_values)) == [] and _ephemeral(plan_of(h20_values)) == []
    prod_values["serving"]["port"] = 40000
    prod_values["parallelism"] = prod_values["parallelism"] | {"data_parallel_rpc_port": 40100}
    first, second, reserve = _ephemeral(plan_of(prod_values))
    assert first.startswith("serving.port: port(s) 40000 (OpenAI API) lie in the kernel's ephemeral range "
                            "32768-60999")
    assert second.startswith("parallelism.data_parallel_rpc_port: port(s) 40100 ")
    assert reserve.startswith("ephemeral range 32768-60999: reserve") and ": 40000,40100 -> " in reserve
    h20_values["serving"]["port"] = 40000
    assert ": 40000,44227,52365 -> net.ipv4.ip_local_reserved_ports" in _ephemeral(plan_of(h20_values))[-1]
    prod_values["firewall"] = {"ephemeral_ports": [50000, 60999]}     # the range the nodes really have
    assert _ephemeral(plan_of(prod_values)) == []
    prod_values["firewall"] = {"ephemeral_ports": [40050, 60999]}
    assert [w.split(":")[0] for w in _ephemeral(plan_of(prod_values))] == [
        "parallelism.data_parallel_rpc_port", "ephemeral range 40050-60999"]


def test_the_watch_units_port_clash_is_its_own_keys() -> None:
    """The watch unit's metrics port moves most easily: a clash with it is filed under observability.ports.watch."""
    values = read_stack_values("prod") | {"grafana_admin_password": SECRET_MARKER}
    values["observability"] = {"enabled": True, "ports": {"watch": values["serving"]["port"]}}
    keys = [p.key for p in problems_of(values) if "watch unit" in p.message]
    assert keys == ["observability.ports.watch"], [p.render() for p in problems_of(values)]


def test_planned_ray_flags_pin_every_fixed_ray_port() -> None:
    plan = build_plan("h20", load_stack("h20"))
    head, worker = (n.containers[0] for n in plan.nodes)
    start = next(line for line in head.command[0].splitlines() if line.startswith("ray start"))
    for argv, node in ((shlex.split(start), "h20-1"), (worker.command, "h20-2")):
        flags = " ".join(argv)
        for x in plan.listeners:
            if x.node == node and x.process in ("raylet", "runtime env agent") and x.reach != "local":
                assert f"={x.port}" in flags, (x.purpose, flags)


# --- real processes -------------------------------------------------------------------------------------------

RAY = shutil.which("ray", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab(f"{os.getpid() % 100000}r") as lab:
        yield lab


def _covered(table: list[Listener], node: str, address: str, port: int) -> Listener | None:
    """The table row that explains an observed socket: same node, port in range, and the same bind — `*` (dual
    stack) is `::`, `0.0.0.0` is `0.0.0.0` or `::`, an address (v4-mapped ones unwrapped) is itself."""
    address = address.removeprefix("::ffff:")
    for x in table:
        if x.node != node or not x.port <= port <= (x.port_end or x.port):
            continue
        if (address == "*" and x.bind == "::") or (address == "0.0.0.0" and x.bind in ("0.0.0.0", "::")) \
                or address == x.bind:
            return x
    return None


def _wait_ports(lab: Lab, role: str, ports: set[int], proc: subprocess.Popen[str], log: Path,
                timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if ports <= {p for _, p, _ in lab.listening(role)}:
            return
        time.sleep(1)
    raise AssertionError(f"{role}: {sorted(ports)} never all listened: {lab.listening(role)}\n"
                         f"{_logs(log.parent)}")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Ray's AF_UNIX socket paths must stay under 108 bytes: pytest's tmp_path is too deep."""
    path = Path(tempfile.mkdtemp(prefix="fw-ray-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


DRIVER = """
import json, subprocess, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
head, peer = sys.argv[1], sys.argv[2]
ray.init(address=f"{head}:6379", logging_level="ERROR")
alive = [n for n in ray.nodes() if n["Alive"]]
target = next(n["NodeID"] for n in alive if n["NodeManagerAddress"] == peer)
def listening():
    return subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
@ray.remote(num_cpus=1)
def where():
    return ray.util.get_node_ip_address(), listening()   # while this worker (and its port) is alive
ran_on, peer_ss = ray.get(
    where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(target, soft=False)).remote(), timeout=120)
print(json.dumps({"alive": len(alive), "ran_on": ran_on, "ss": listening(), "peer_ss": peer_ss}), flush=True)
"""


def test_real_ray_cluster_matches_the_table_and_works_behind_the_firewall(lab: Lab, short_tmp: Path) -> None:
    tmp_path = short_tmp
    assert RAY, "ray must be installed (requirements-dev.txt)"
    config = lab_config(lab, "h20")
    plan = build_plan("lab", config)
    head_c, worker_c = (n.containers[0] for n in plan.nodes)
    start = shlex.split(next(line for line in head_c.command[0].splitlines() if line.startswith("ray start")))
    small = ["--num-cpus=1", "--object-store-memory=78643200"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    head = lab.spawn("head", [RAY, *start[1:], *small, f"--temp-dir={tmp_path}/h", "--block"], env=env,
                     log=tmp_path / "head.log")
    _wait_ports(lab, "head", {6379, 6380, 6381}, head, tmp_path / "head.log")
    peer = lab.spawn("peer", [RAY, *worker_c.command, *small, f"--temp-dir={tmp_path}/p"], env=env,
                     log=tmp_path / "peer.log")
    _wait_ports(lab, "peer", {6380, 6381}, peer, tmp_path / "peer.log")

    # Control: --node-ip-address is the lab address, yet the GCS and raylets answer on every address.
    for port in (6379, 6380):
        assert lab.connect("out", lab.v4("head"), port) == "ok"
    assert lab.connect("out", lab.v6("head"), 6379) == "ok"

    commands = {spec.node: firewall_command(spec, node, state_dir=f"{tmp_path}/{spec.node}-fw", unit_dir=str(tmp_path))
                for spec, node in zip(plan.firewall.nodes, config.nodes, strict=True)}
    for role in ("head", "peer"):
        done = lab.run(role, ["sh", "-c", commands[role].create], check=False, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
    try:
        for role, port in (("head", 6379), ("head", 6380), ("head", 6381), ("head", 10001), ("peer", 6380)):
            assert lab.connect("out", lab.v4(role), port) == "timeout", (role, port)
        assert lab.connect("out", lab.v6("head"), 6379) == "timeout"

        assert lab.connect("head", lab.v4("head"), 6379) == "ok", _logs(tmp_path)
        try:
            driver = lab.run("head", [sys.executable, "-c", DRIVER, lab.v4("head"), lab.v4("peer")], env=env,
                             timeout=180)
        except (subprocess.TimeoutExpired, AssertionError) as exc:
            raise AssertionError(f"{exc}\n{_logs(tmp_path)}") from None
        result = json.loads(driver.stdout.strip().splitlines()[-1])
        assert result["alive"] == 2 and result["ran_on"] == lab.v4("peer")   # through the firewall, both ways

        observed = {"head": _parse_ss(result["ss"]), "peer": _parse_ss(result["peer_ss"])}
        worker_range = range(10002, 20000)
        for role, rows in observed.items():
            for address, port, proc in rows:
                assert _covered(plan.listeners, role, address, port), f"{role} {address}:{port} ({proc}) not in table"
            ports = {p for _, p, _ in rows}
            assert {6380, 6381, 6382} <= ports and ports & set(worker_range), (role, sorted(ports))
        head_ports = {p for _, p, _ in observed["head"]}
        assert {6379, 10001} <= head_ports
        gcs = [a for a, p, _ in observed["head"] if p == 6379]
        assert gcs == ["*"]                                                  # dual-stack wildcard, as the table says
    finally:
        for role in ("head", "peer"):
            lab.run(role, ["sh", "-c", commands[role].delete], check=False)
        stop(peer)
        stop(head)
        lab.reap(lab.ns("head"))
        lab.reap(lab.ns("peer"))


def _logs(root: Path) -> str:
    """The tails of Ray's own logs, for a failure message. A `ray stop --force` anywhere on the machine (another
    test run's fixture) kills Ray processes in every namespace: the GCS line of ps says whether that happened."""
    gcs = subprocess.run(["pgrep", "-af", f"gcs_server.*{root}"], capture_output=True, text=True).stdout.strip()
    parts = [f"--- gcs_server of this test: {gcs or 'NOT RUNNING (killed from outside? ray stop --force)'}"]
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".log", ".out", ".err") and path.stat().st_size:
            parts.append(f"--- {path.relative_to(root)}\n{path.read_text(errors='replace')[-1500:]}")
    return "\n".join(parts)[-20000:]


def _parse_ss(text: str) -> list[tuple[str, int, str]]:
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        address, _, port = parts[3].rpartition(":")
        rows.append((address.strip("[]"), int(port), parts[5].split('"')[1] if len(parts) > 5 else ""))
    return rows


GLOO = """
import datetime, json, subprocess, sys
import torch, torch.distributed as dist
rank, host = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://{host}:29555", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
t = torch.ones(1); dist.all_reduce(t)
if rank == 0:
    print(subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout, flush=True)
# Rank 1 leaves only once rank 0 (whose exit status the test reads) is past every collective: a rank that exits
# first resets the connection under one still in a collective. Was a 0.5 s sleep, which a loaded machine outlasts.
if rank == 0:
    dist.send(t, 1)
else:
    dist.recv(t, 0)
"""


def test_real_gloo_and_tcpstore_bind_as_the_table_says(lab: Lab) -> None:
    """Two ranks in the head namespace with GLOO_SOCKET_IFNAME=eth0 (dual-stack: IPv4 and an IPv6 ULA): the
    rendezvous TCPStore is on every address, Gloo's pair listeners on the interface's IPv4 address only, on
    OS-picked ports — the table's control IP and ephemeral range."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
    other = lab.spawn("head", [sys.executable, "-c", GLOO, "1", lab.v4("head")], env=env)
    out = lab.run("head", [sys.executable, "-c", GLOO, "0", lab.v4("head")], env=env, timeout=180).stdout
    other.wait(timeout=60)
    rows = _parse_ss(out)
    store = [a for a, p, _ in rows if p == 29555]
    gloo = [(a, p) for a, p, _ in rows if p != 29555]
    assert store == ["*"]
    assert gloo and all(a == lab.v4("head") and EPH[0] <= p <= EPH[1] for a, p in gloo), rows
    config = lab_config(lab, "prod")
    table = build_plan("lab", config).listeners
    assert any(x.node == "head" and x.purpose.startswith("Gloo") and x.bind == lab.v4("head") for x in table)
    for address, port in gloo:
        row = _covered(table, "head", address, port)
        assert row is not None and row.ephemeral, (address, port)
