"""Every port the processes of every node open, the address they really bind, and the upstream code that says so.

`--node-ip-address`, `--data-parallel-address` and `VLLM_HOST_IP` choose what a process *advertises*; many of
the servers behind them still bind every address of the host, and with host networking that is every
interface of the node. The table below is what the processes do, read from Ray 2.60 (`ray start` on
`b7f4259e`), vLLM 0.33.0 and torch, and checked against real processes in network namespaces
(`tests/test_listeners.py`):

- gRPC servers of Ray's C++ core (GCS, raylet node and object manager, every worker and driver) listen on
  `0.0.0.0:<port>` unless the node IP is 127.0.0.1 (`src/ray/rpc/grpc_server.cc` `GrpcServer::Run`); gRPC makes
  that a dual-stack `[::]` socket, so they are reachable over IPv6 too (`ss` shows `*:6379`).
- torch's `TCPStore` server binds `::` (or `0.0.0.0`) whatever host name it is given
  (`TCPStoreLibUvBackend.cpp` `UvTcpServer::makeWithPort`; the legacy backend too) unless it is handed a bound
  socket; vLLM 0.33.0 creates three of them with port 0, so they sit on OS-picked ports on all addresses.
- vLLM's ZMQ sockets, Gloo and NCCL bind one address (the DP address / `VLLM_HOST_IP`, `GLOO_SOCKET_IFNAME`,
  `NCCL_SOCKET_IFNAME`) but on OS-picked ports: `ephemeral`, i.e. anywhere in `net.ipv4.ip_local_port_range`.

A firewall needs fixed ports, so Ray's otherwise random ports are pinned (`RAY_PORTS`, added to `ray start`
by `stacks.planner.launch`), and ephemeral listeners are guarded as the whole `firewall.ephemeral_ports` range
(`stacks.planner.firewall`: new connections from outside the cluster are dropped; replies to the node's own
outgoing connections are `established` and pass).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from stacks.model.config import NodeConfig, StackConfig
from stacks.model.errors import Problem
from stacks.planner.addresses import api_bind, rank_port
from stacks.planner.exposure import ANYWHERE, WILDCARDS, admits_outside, bind_reachable, is_loopback
from stacks.planner.fabric import control_ip
from stacks.planner.observability import (
    PORT_KEYS,
    SRC_ALERTMANAGER,
    SRC_ALERTMANAGER_CLUSTER,
    SRC_DCGM,
    SRC_GRAFANA,
    SRC_NODE_EXPORTER,
    SRC_PROMETHEUS,
    SRC_SUPERVISOR,
    SRC_WATCH,
    alertmanager_enabled,
    monitor_node,
    supervisor_host,
    watch_host,
)
from stacks.planner.topology import NodeTopology, Role, Topology


@dataclass(frozen=True)
class RayPorts:
    """Fixed ports for every Ray process that would otherwise take a random one (`ray start` flags)."""

    node_manager: int = 6380
    object_manager: int = 6381
    runtime_env_agent: int = 6382
    dashboard_agent_grpc: int = 6383
    metrics_export: int = 6384
    dashboard_agent_http: int = 52365   # Ray's own default (ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT)
    min_worker: int = 10002             # `ray start` defaults (scripts.py --min/--max-worker-port), made explicit
    max_worker: int = 19999
    dashboard_metrics: int = 44227      # dashboard/consts.py DASHBOARD_METRIC_PORT (env only, no flag)
    client_specific_min: int = 23000    # util/client/server/proxier.py MIN/MAX_SPECIFIC_SERVER_PORT
    client_specific_max: int = 23999

    def start_flags(self) -> list[str]:
        """Flags for `ray start` (head and workers) that pin every port a firewall must know."""
        return [
            f"--node-manager-port={self.node_manager}", f"--object-manager-port={self.object_manager}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--dashboard-agent-grpc-port={self.dashboard_agent_grpc}",
            f"--dashboard-agent-listen-port={self.dashboard_agent_http}",
            f"--metrics-export-port={self.metrics_export}",
            f"--min-worker-port={self.min_worker}", f"--max-worker-port={self.max_worker}",
        ]


RAY_PORTS = RayPorts()
NCCL_RAS_PORT = 28028

# Where each bind was read: Ray 2.60's wheel (ray/..., its line numbers) and ray-project/ray src/ (C++);
# vLLM 0.33.0's wheel; pytorch/pytorch and NVIDIA/nccl. Checked against real processes in tests/test_listeners.py.
RAY_SRC = "ray-project/ray src/ray/"
GRPC = f"{RAY_SRC}rpc/grpc_server.cc GrpcServer::Run (\"0.0.0.0:\" unless localhost-only)"
SRC_GCS = f"{RAY_SRC}gcs/gcs_server.cc GcsServer (rpc_server_, node_ip_address == \"127.0.0.1\"); {GRPC}"
SRC_RAYLET = (f"{RAY_SRC}raylet/node_manager.cc (node_manager_server_, node_manager_address == "
              f"\"127.0.0.1\"); {GRPC}")
SRC_OBJECT = (f"{RAY_SRC}object_manager/object_manager.cc (object_manager_server_, object_manager_address == "
              f"\"127.0.0.1\"); {GRPC}")
SRC_WORKER = (f"{RAY_SRC}core_worker/core_worker_process.cc (GrpcServer(assigned_port, node_ip_address == "
              "\"127.0.0.1\")); range: ray/scripts/scripts.py:516-530 --min/--max-worker-port")
SRC_RUNTIME_ENV = "ray/_private/runtime_env/agent/main.py:243-248 (socket bound to the node IP)"
SRC_AGENT_GRPC = "ray/dashboard/agent.py:164-169 (get_all_interfaces_ip() = 0.0.0.0)"
SRC_AGENT_HTTP = "ray/dashboard/http_server_agent.py:54-66 (TCPSite(node IP) and TCPSite(127.0.0.1))"
SRC_METRICS = ("ray/dashboard/modules/reporter/reporter_agent.py:530-535 (address \"\"), "
               "ray/_private/prometheus_exporter.py:329 (wsgiref make_server)")
SRC_CLIENT = ("ray/_private/services.py:2464-2472 (--host=node IP), "
              "ray/util/client/server/proxier.py:929-931 (node IP and 127.0.0.1)")
SRC_CLIENT_SPECIFIC = "ray/util/client/server/proxier.py:64-65, 371-374 (127.0.0.1)"
SRC_DASHBOARD = "ray/dashboard/http_server_head.py:474 (TCPSite(--dashboard-host))"
SRC_DASHBOARD_METRICS = ("ray/dashboard/head.py:361-366 (prometheus_client.start_http_server, "
                         "addr 0.0.0.0), ray/dashboard/consts.py:67")
TORCH_STORE = ("torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp UvTcpServer::makeWithPort (binds \"::\" "
               "or \"0.0.0.0\")")
SRC_API = "vllm/entrypoints/launchers/launcher.py:340-353, 378 (bind (--host or \"\", --port))"
SRC_HANDSHAKE = "vllm/v1/engine/utils.py:1348-1363 (ZMQ ROUTER bound at tcp://<DP address>:<DP RPC port>)"
SRC_FRONTEND_ZMQ = "vllm/v1/engine/utils.py:1150-1160 (tcp://<DP address>:0 when engines are remote)"
SRC_COORDINATOR = "vllm/v1/engine/coordinator.py:85-97 (tcp://<DP address>:0 when engines are remote)"
SRC_COORDINATOR_HYBRID = ("vllm/v1/engine/coordinator.py:85-97 (front publish tcp://<DP address>:0 too: hybrid or "
                          "external LB, local_engines_only)")
SRC_API_HYBRID = (f"{SRC_API}; one per node with --data-parallel-hybrid-lb (vllm/entrypoints/cli/serve.py:90-123)")
SRC_API_EXTERNAL = (f"{SRC_API}; one per DP rank with --data-parallel-rank, --port = serving.port + the rank's "
                    "index on its node (vllm/entrypoints/cli/serve.py:83-85, 113-115)")
SRC_COORD_STORE = f"vllm/v1/engine/utils.py:1283-1299 (TCPStore(host, 0, is_master=True)); {TORCH_STORE}"
SRC_DP_STORE = "vllm/config/parallel.py:697-702 (socket bound to (DP address, 0), handed to the TCPStore)"
SRC_WORLD_STORE = f"vllm/distributed/parallel_state.py:1892-1906 (create_tcp_store(ip, 0, is_master=True)); " \
    f"{TORCH_STORE}"
SRC_MASTER = ("vllm/distributed/parallel_state.py:1875-1878 (tcp://--master-addr:--master-port), "
              f"torch/distributed/rendezvous.py:162-205; {TORCH_STORE}")
SRC_RAY_STORE = f"vllm/v1/executor/ray_executor_v2.py:130-142 (TCPStore(node IP, 0, is_master=True)); {TORCH_STORE}"
SRC_MQ = "vllm/distributed/device_communicators/shm_broadcast.py:573 (XPUB tcp://<connect IP>:0 for remote readers)"
SRC_GLOO = ("torch/csrc/distributed/c10d/GlooDeviceFactory.cpp (attr.iface = GLOO_SOCKET_IFNAME), gloo tcp "
            "device: listens on that interface's address, port 0")
SRC_NCCL = ("NVIDIA/nccl src/bootstrap.cc (bootstrapNetIfAddr from NCCL_SOCKET_IFNAME; root, ring and proxy "
            "sockets bind it with port 0), src/transport/net_ib.cc / net_socket.cc (listen on the same address)")
SRC_NCCL_RAS = "NVIDIA/nccl src/ras/client_support.cc rasClientInitSocket (\"localhost:28028\", NCCL_RAS_ADDR)"
SRC_PROXY = "stacks/planner/proxy.py (nginx.conf `listen api.proxy.bind:api.proxy.port`)"
SRC_SIDE_CHANNEL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76-80, 324-340"
"""Where a prefill/decode engine binds its NIXL handshake listener (stacks/planner/kv_transfer.py)."""
SRC_ROUTER = "stacks/planner/router.py (--host/--prometheus-host 127.0.0.1)"
"""The router's two loopback ports (stacks/planner/plan.py `tier_listeners`)."""
SRC_COLLECTIVE = ("checks/collective.py (a socket bound to --master-addr:--master-port, handed to "
                  "TCPStore(master_listen_fd=...)); components/collective_check.py")


class Listener(BaseModel):
    """One port (or port range) a node's processes listen on, as a reviewer and the firewall need it."""

    model_config = ConfigDict(frozen=True)
    node: str
    port: int
    port_end: int | None = None
    """Last port of a range (inclusive); None for one port."""
    protocol: str = "tcp"
    bind: str
    """What the socket really binds: an address, `0.0.0.0` (all IPv4) or `::` (all, IPv4 and IPv6)."""
    network: str
    """all, loopback, management, data, or the address itself."""
    purpose: str
    public: bool
    """Reachable from outside the declared private networks and the cluster's own addresses, firewall included."""
    role: str
    """dp-head, headless-engine, dp-api-engine, ray-head, ray-worker, proxy or monitoring."""
    process: str
    reach: str
    """Who must connect: clients, cluster (the other nodes), proxy (only the head's nginx and the named
    scrapers: `proxy_upstream_sources`) or local (this host only)."""
    internal: bool
    ephemeral: bool
    """The port is picked by the OS at bind time: port..port_end is the range it comes from."""
    allowed_sources: list[str]
    """What the host firewall lets connect (CIDRs); [] when only this host can (loopback)."""
    source: str
    """The upstream code the bind was read from."""

    @property
    def ports(self) -> str:
        return f"{self.port}-{self.port_end}" if self.port_end is not None else str(self.port)


@dataclass(frozen=True)
class _Row:
    port: int
    bind: str
    purpose: str
    process: str
    source: str
    reach: str = "cluster"
    port_end: int | None = None
    ephemeral: bool = False
    role: str | None = None
    sources: tuple[str, ...] | None = None
    """Who the firewall admits when it is neither the cluster nor `firewall.api_sources` (reach proxy)."""


def listener_table(config: StackConfig, topo: Topology, *, multinode_master_port: int | None = None
                   ) -> list[Listener]:
    """Every listener of every node, client-facing ones first. `multinode_master_port`: the head's
    `--master-port` when the mp executor spans nodes (`--nnodes`, vLLM's default 29501)."""
    out: list[Listener] = []
    sources = _Sources.of(config)
    for node_cfg, node_topo in zip(config.nodes, topo.nodes, strict=True):
        rows = _rows(config, topo, node_cfg, node_topo, multinode_master_port)
        rows.sort(key=lambda r: (r.reach != "clients", r.ephemeral, r.port))
        out += [_listener(config, sources, node_cfg, node_topo, r) for r in rows]
    return out


@dataclass(frozen=True)
class _Sources:
    """Who the firewall admits, computed once per plan (not once per listener: N nodes x N addresses)."""

    internal: list[str]
    api: list[str]
    internal_public: bool
    api_public: bool
    trusted: list[str]

    @classmethod
    def of(cls, config: StackConfig) -> _Sources:
        internal, api = internal_sources(config), api_sources(config)
        trusted = collapse([*cluster_addresses(config), *config.fabric.private_networks])
        return cls(internal, api, admits_outside(internal, trusted), admits_outside(api, trusted), trusted)


def _rows(config: StackConfig, topo: Topology, node: NodeConfig, node_topo: NodeTopology,
          master_port: int | None) -> list[_Row]:
    role = node_topo.role
    ip = control_ip(config, node) or node.management_ip
    low, high = config.firewall.ephemeral_ports
    rows: list[_Row] = []

    def eph(bind: str, purpose: str, process: str, source: str) -> None:
        rows.append(_Row(low, bind, purpose, process, source, port_end=high, ephemeral=True))

    if topo.external:
        rows += _rank_api_rows(config, node_topo)
    elif role.is_head:
        rows += _api_rows(config)
    elif role is Role.DP_API_ENGINE:
        rows += _hybrid_api_rows(config, node_topo)
    if role in (Role.DP_HEAD, Role.MP_HEAD) and topo.data > 1:
        # engines on other nodes, or every rank its own server (external: one local engine of DP > 1, so the
        # handshake and the coordinator's sockets are TCP even on one node, vllm/v1/engine/utils.py:1342-1352,
        # coordinator.py:85-97): TCP, not IPC
        if role is Role.MP_HEAD or node_topo.dp_local != topo.data or topo.external:
            rows.append(_Row(config.parallelism.data_parallel_rpc_port, ip,
                             "DP handshake (ZMQ ROUTER, unauthenticated pickle)",
                             "vllm serve (DP rank 0's server)" if topo.external else "vllm serve (API server)",
                             SRC_HANDSHAKE))
            if not topo.local_engines_only:  # hybrid, external: each API server reaches its own engines over IPC
                eph(ip, "engine input/output (ZMQ ROUTER/PULL)", "vllm serve (API server)", SRC_FRONTEND_ZMQ)
            eph(ip, "DP coordinator to engines (ZMQ XPUB/PULL)" if not topo.local_engines_only else
                "DP coordinator to engines and to every node's API server (ZMQ XPUB/PULL)" if topo.hybrid else
                "DP coordinator to engines and to every rank's API server (ZMQ XPUB/PULL)", "vllm DP coordinator",
                SRC_COORDINATOR if not topo.local_engines_only else SRC_COORDINATOR_HYBRID)
        eph("::", "DP coordination store (torch TCPStore, unauthenticated)", "vllm serve (API server)",
            SRC_COORD_STORE)
        eph(ip, "DP process group store (TCPStore on a bound socket)", "vllm engine core DP0", SRC_DP_STORE)
        eph("::", "world process group store (torch TCPStore, unauthenticated)", "vllm worker rank 0",
            SRC_WORLD_STORE)
    if node.name == config.head.name and len(config.nodes) > 1:
        rows.append(_Row(config.fabric.collective_port, ip, "collective check rendezvous (torch TCPStore, "
                         "unauthenticated; listens only while `checks.collective` runs, before the engines start)",
                         "checks.collective (node rank 0)", SRC_COLLECTIVE))
    if master_port is not None and role is Role.MP_HEAD:
        rows.append(_Row(master_port, "::", "multi-node executor store (torch TCPStore, --master-port)",
                         "vllm worker rank 0", SRC_MASTER))
    if role in (Role.MP_HEAD, Role.MP_REPLICA_HEAD):
        eph(ip, "scheduler broadcast to remote workers (ZMQ XPUB)", "vllm executor", SRC_MQ)
    if role in (Role.MP_HEAD, Role.MP_REPLICA_HEAD, Role.MP_WORKER):
        eph(ip, "worker response queues to the replica's executor (ZMQ XPUB, one per worker)", "vllm workers",
            SRC_MQ)
    if role in (Role.RAY_HEAD, Role.RAY_WORKER):
        rows += _ray_rows(config, ip, head=role is Role.RAY_HEAD)
        eph(ip, "executor message queues to remote workers (ZMQ XPUB)", "vllm Ray workers", SRC_MQ)
        if role is Role.RAY_HEAD:
            eph("::", "world process group store (torch TCPStore, unauthenticated)", "vllm Ray worker rank 0",
                SRC_RAY_STORE)
    if config.observability.enabled:
        rows += _observability_rows(config, node)
    if topo.tensor * topo.pipeline * topo.data == 1:
        return rows  # one GPU, one rank: no process group has a peer, so neither Gloo nor NCCL listens
    gloo = _gloo_ip(config, node)
    if gloo is not None:
        eph(gloo, "Gloo pair listeners (CPU process groups)", "vllm workers / engine cores", SRC_GLOO)
    for k, nccl in enumerate(_nccl_ips(config, node)):
        eph(nccl, "NCCL bootstrap, proxy and network listeners" if k == 0 else
            "NCCL NET/Socket listener (one per listed interface)", "vllm workers", SRC_NCCL)
    rows.append(_Row(NCCL_RAS_PORT, "127.0.0.1", "NCCL RAS client socket (NCCL >= 2.24)", "vllm workers",
                     SRC_NCCL_RAS, reach="local"))
    return rows


def _api_rows(config: StackConfig) -> list[_Row]:
    proxy = config.api.proxy
    rows: list[_Row] = []
    if proxy.enabled:
        rows.append(_Row(proxy.port, proxy.bind, "OpenAI API (nginx: TLS, bearer keys, limits, allowlist)"
                         if proxy.tls else "OpenAI API (nginx, plain HTTP: bearer keys, limits, allowlist)",
                         "nginx", SRC_PROXY, reach="clients", role="proxy"))
    rows.append(_Row(config.serving.port, _bind_of(config.serving.host),
                     "OpenAI API (vLLM; reached through the proxy)" if proxy.enabled else "OpenAI API (vLLM)",
                     "vllm serve (API server)", SRC_API, reach="local" if proxy.enabled else "clients"))
    return rows


def _hybrid_api_rows(config: StackConfig, node: NodeTopology) -> list[_Row]:
    """A node after the head with hybrid load balancing: its own API server, on `serving.port`. Behind the proxy
    only the head's nginx (and Prometheus, when it scrapes) may call it: vLLM's key guards only /v1 paths, so
    /invocations, /tokenize, /metrics... would be open to every cluster host. Without the proxy clients and their
    load balancer call it."""
    proxy = config.api.proxy.enabled
    sources = tuple(c for c, _ in proxy_upstream_sources(config, config.nodes[node.index])) if proxy else None
    return [_Row(config.serving.port, _bind_of(api_bind(config, node)),
                 "OpenAI API (vLLM, this node's DP ranks; reached through the head's proxy)" if proxy else
                 "OpenAI API (vLLM, this node's DP ranks)", "vllm serve (API server)", SRC_API_HYBRID,
                 reach="proxy" if proxy else "clients", sources=sources)]


def _rank_api_rows(config: StackConfig, node: NodeTopology) -> list[_Row]:
    """External load balancing: each DP rank's own API server, on `serving.port` + its index on the node
    (`addresses.rank_port`). On the head they bind `serving.host` like the head's API server (the proxy's row comes
    first); on the other nodes they are reached as hybrid's are (`_hybrid_api_rows`): behind the proxy only by the
    head's nginx (and Prometheus), else by clients and their load balancer."""
    proxy = config.api.proxy
    head = node.role.is_head
    rows = [r for r in _api_rows(config) if r.process == "nginx"] if head else []
    sources = (tuple(c for c, _ in proxy_upstream_sources(config, config.nodes[node.index]))
               if proxy.enabled and not head else None)
    reach = ("local" if head else "proxy") if proxy.enabled else "clients"
    for rank in node.dp_ranks:
        purpose = f"OpenAI API (vLLM, DP rank {rank}'s own server" + (
            "; reached through the proxy)" if proxy.enabled and head else
            "; reached through the head's proxy)" if proxy.enabled else ")")
        rows.append(_Row(rank_port(config, node, rank), _bind_of(api_bind(config, node)), purpose,
                         f"vllm serve (DP rank {rank})", SRC_API_EXTERNAL, reach=reach, sources=sources))
    return rows


def proxy_upstream_sources(config: StackConfig, node: NodeConfig) -> list[tuple[str, str]]:
    """(CIDR, who) allowed to open a connection to a node's API server behind the proxy (hybrid load balancing).

    The node's vLLM binds its control-plane address (`addresses.api_bind`); the head's nginx connects to it from
    the head's control-plane address (same `fabric.control_plane`, so the same network), and Prometheus, when
    it runs on another node, scrapes it from that node's control-plane address. The node's own checks
    (`api-node-<node>`) and container healthcheck connect from the node itself, which the firewall's `iif lo`
    accepts. With the firewall off: anywhere, like every other port."""
    if not config.firewall.enabled:
        return [(c, "anywhere (firewall.enabled: false)") for c in ANYWHERE]

    def addr(n: NodeConfig) -> str:
        return collapse([control_ip(config, n) or n.management_ip])[0]

    who: dict[str, list[str]] = {addr(config.head): [f"{config.head.name}: nginx"]}
    mon = monitor_node(config)
    if config.observability.enabled and mon != node.name:
        mon_cfg = next(n for n in config.nodes if n.name == mon)
        who.setdefault(addr(mon_cfg), []).append(f"{mon}: Prometheus")
    return [(c, " and ".join(names)) for c, names in who.items()]


def _ray_rows(config: StackConfig, ip: str, *, head: bool) -> list[_Row]:
    p = RAY_PORTS
    deps = " (if the image has ray[default])"
    rows = [
        _Row(p.node_manager, "::", "Ray raylet node manager (gRPC, unauthenticated)", "raylet", SRC_RAYLET),
        _Row(p.object_manager, "::", "Ray object manager (gRPC)", "raylet", SRC_OBJECT),
        _Row(p.runtime_env_agent, ip, "Ray runtime env agent (HTTP)", "runtime env agent", SRC_RUNTIME_ENV),
        _Row(p.dashboard_agent_grpc, "::", "Ray dashboard agent gRPC" + deps, "dashboard agent", SRC_AGENT_GRPC),
        _Row(p.dashboard_agent_http, ip, "Ray dashboard agent HTTP" + deps, "dashboard agent", SRC_AGENT_HTTP),
        _Row(p.dashboard_agent_http, "127.0.0.1", "Ray dashboard agent HTTP" + deps, "dashboard agent",
             SRC_AGENT_HTTP, reach="local"),
        _Row(p.metrics_export, "0.0.0.0", "Ray metrics export (Prometheus)" + deps, "dashboard agent", SRC_METRICS),
        _Row(p.min_worker, "::", "Ray worker and driver gRPC (one port per process, unauthenticated: runs tasks)",
             "Ray core workers (vllm serve driver, RayWorkerWrapper actors)", SRC_WORKER, port_end=p.max_worker),
    ]
    if head:
        ray = config.ray
        rows += [
            _Row(ray.gcs_port, "::", "Ray GCS (gRPC, unauthenticated)", "gcs_server", SRC_GCS),
            _Row(ray.client_port, ip, "Ray client server (remote code execution)", "ray client server", SRC_CLIENT),
            _Row(ray.client_port, "127.0.0.1", "Ray client server (remote code execution)", "ray client server",
                 SRC_CLIENT, reach="local"),
            _Row(ray.dashboard_port, "127.0.0.1", "Ray dashboard and jobs API (remote code execution)" + deps,
                 "dashboard", SRC_DASHBOARD, reach="local"),
            _Row(p.dashboard_metrics, "0.0.0.0", "Ray dashboard metrics (Prometheus)" + deps, "dashboard",
                 SRC_DASHBOARD_METRICS),
            _Row(p.client_specific_min, "127.0.0.1", "Ray client per-session servers", "ray client server",
                 SRC_CLIENT_SPECIFIC, reach="local", port_end=p.client_specific_max),
        ]
    return rows


def _observability_rows(config: StackConfig, node: NodeConfig) -> list[_Row]:
    """Exporters on every node, Prometheus/Grafana/Alertmanager on the monitoring node: each binds the management
    address only (never a wildcard), so the firewall's cluster sources and an SSH tunnel reach it, nothing else.
    The watch unit and the group supervisor listen on the node whose management address is theirs (default: the
    monitoring node); on a host that is no node, nothing of this table."""
    ports = config.observability.ports
    ip = node.management_ip
    rows = [_Row(ports.node_exporter, ip, "node exporter (host metrics, unauthenticated)", "node_exporter",
                 SRC_NODE_EXPORTER, role="monitoring"),
            _Row(ports.dcgm_exporter, ip, "DCGM exporter (GPU metrics, unauthenticated)", "dcgm-exporter", SRC_DCGM,
                 role="monitoring")]
    if node.name == monitor_node(config):
        rows += [_Row(ports.prometheus, ip, "Prometheus web and API (unauthenticated; SSH tunnel)", "prometheus",
                      SRC_PROMETHEUS, role="monitoring"),
                 _Row(ports.grafana, ip, "Grafana (admin password; SSH tunnel)", "grafana", SRC_GRAFANA,
                      role="monitoring")]
        if watch_host(config) == ip:  # the watch unit runs here (its default place)
            rows += [_Row(ports.watch, ip, "watch unit: golden results and info series (unauthenticated)",
                          "watch-unit", SRC_WATCH, role="monitoring")]
        if alertmanager_enabled(config):
            rows += [_Row(ports.alertmanager, ip, "Alertmanager API (unauthenticated)", "alertmanager",
                          SRC_ALERTMANAGER, role="monitoring"),
                     _Row(ports.alertmanager_cluster, "127.0.0.1", "Alertmanager gossip (one instance)",
                          "alertmanager", SRC_ALERTMANAGER_CLUSTER, reach="local", role="monitoring")]
    if supervisor_host(config) == ip:
        rows.append(_Row(ports.supervisor, ip, "group supervisor: restart and give-up metrics (unauthenticated)",
                         "group-supervisor", SRC_SUPERVISOR, role="monitoring"))
    return rows


def _bind_of(host: str) -> str:
    return "0.0.0.0" if host == "" else host


def _gloo_ip(config: StackConfig, node: NodeConfig) -> str | None:
    """GLOO_SOCKET_IFNAME is the control-plane interface (stacks/planner/fabric.py), so Gloo binds the control IP."""
    if config.fabric.control_plane == "management":
        return node.management_ip if node.management_ifname else None
    return node.data_ips[0] if node.data_ips and node.nics else None


def _nccl_ips(config: StackConfig, node: NodeConfig) -> list[str]:
    """Addresses of NCCL_SOCKET_IFNAME's interfaces: the first for bootstrap/proxy/IB; all with NET/Socket."""
    if config.fabric.nccl_socket == "management":
        ips = [node.management_ip] if node.management_ifname else []
    else:
        ips = list(node.data_ips[: len(node.nics)])
    return ips if config.fabric.transport == "socket" else ips[:1]


def _listener(config: StackConfig, sources: _Sources, node: NodeConfig, node_topo: NodeTopology,
              row: _Row) -> Listener:
    loopback = is_loopback(row.bind)
    clients = row.reach == "clients"
    allowed = [] if loopback else list(row.sources if row.sources is not None else
                                       sources.api if clients else sources.internal)
    admits_public = (admits_outside(list(row.sources), sources.trusted) if row.sources is not None else
                     sources.api_public if clients else sources.internal_public)
    return Listener(
        node=node.name, port=row.port, port_end=row.port_end, bind=row.bind, network=_network(node, row.bind),
        purpose=row.purpose,
        public=not loopback and admits_public and bind_reachable(row.bind, config.fabric.private_networks),
        role=row.role or node_topo.role.value, process=row.process, reach=row.reach, internal=not clients,
        ephemeral=row.ephemeral, allowed_sources=allowed, source=row.source)


def cluster_addresses(config: StackConfig) -> list[str]:
    """Every node's management and data addresses: what the nodes talk to each other from."""
    return [ip for n in config.nodes for ip in (n.management_ip, *n.data_ips)]


def internal_sources(config: StackConfig) -> list[str]:
    """Who may reach internal ports: the cluster's own addresses and the declared private networks."""
    if not config.firewall.enabled:
        return list(ANYWHERE)
    return collapse([*cluster_addresses(config), *config.fabric.private_networks])


def api_sources(config: StackConfig) -> list[str]:
    """Who may reach the API/proxy port: `firewall.api_sources`, else anywhere with the proxy on and the private
    networks (or, with none declared, the cluster's own addresses) with it off."""
    fw = config.firewall
    if not fw.enabled:
        return list(ANYWHERE)
    if fw.api_sources is not None:
        return collapse(fw.api_sources)
    if config.api.proxy.enabled:
        return list(ANYWHERE)
    return collapse(list(config.fabric.private_networks) or cluster_addresses(config))


def collapse(cidrs: list[str]) -> list[str]:
    """Sorted, merged CIDRs (IPv4 first): `1.1.1.2` inside `1.1.1.0/24` disappears; nft refuses overlaps."""
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    v4 = ipaddress.collapse_addresses(n for n in nets if n.version == 4)
    v6 = ipaddress.collapse_addresses(n for n in nets if n.version == 6)
    return [str(n) for n in (*v4, *v6)]


def _network(node: NodeConfig, bind: str) -> str:
    if bind in WILDCARDS:
        return "all"
    if ipaddress.ip_address(bind).is_loopback:
        return "loopback"
    if bind == node.management_ip:
        return "management"
    return "data" if bind in node.data_ips else bind


def listener_problems(listeners: list[Listener]) -> list[Problem]:
    """Two fixed listeners of different processes on one port of one node: one fails with `Address already in
    use`. Compared as intervals within a node, so the 10k-port worker range and 128 nodes cost nothing."""
    by_node: dict[str, list[Listener]] = {}
    for x in listeners:
        if not x.ephemeral:
            by_node.setdefault(x.node, []).append(x)
    problems: list[Problem] = []
    for fixed in by_node.values():
        for i, x in enumerate(fixed):
            other = next((o for o in fixed[:i] if _clash(o, x)), None)
            if other is not None:
                problems.append(_clash_problem(x, other, fixed))
    return problems


def _clash_problem(x: Listener, other: Listener, on_node: list[Listener]) -> Problem:
    """Name the key the user should move and its own value. A DP rank's server (external load balancing) is on
    a computed port, serving.port + the rank's index on its node: the other listener's key comes first, and when
    serving.port is the key its value is serving.port itself, not the rank's port."""
    port = max(x.port, other.port)
    ranks = sorted(o.port for o in on_node if o.source == SRC_API_EXTERNAL)
    pair = sorted((x, other), key=lambda o: o.source == SRC_API_EXTERNAL)  # a rank's server last
    key = (PORT_KEYS.get(x.source) or PORT_KEYS.get(other.source)  # monitoring ports move most easily
           or _KEYS.get(pair[0].source) or _KEYS.get(pair[1].source) or "<listeners>")
    value = ranks[0] if key == "serving.port" and ranks else port

    def named(o: Listener) -> str:
        if o.source != SRC_API_EXTERNAL or o.port == ranks[0]:
            return o.purpose
        return f"{o.purpose.removesuffix(')')}, on serving.port {ranks[0]} + {o.port - ranks[0]})"

    if ranks and SRC_API_EXTERNAL in (x.source, other.source):
        fix = (f"keep {key} outside {ranks[0]}-{ranks[-1]} (on {x.node}, serving.port to serving.port + "
               f"{len(ranks) - 1}: one port per DP rank), or move serving.port so that range avoids {port}")
        if key == "serving.port":
            fix = f"move serving.port so that {len(ranks)} ports from it ({ranks[0]}-{ranks[-1]} now) avoid {port}"
    else:
        fix = "another port"
    if RAY_SRC in x.source or RAY_SRC in other.source or x.source.startswith("ray/") or other.source.startswith(
            "ray/"):
        fix += (f"; Ray's fixed ports are stacks/planner/listeners.py RAY_PORTS ({RAY_PORTS.node_manager}-"
                f"{RAY_PORTS.metrics_export}, {RAY_PORTS.min_worker}-{RAY_PORTS.max_worker}, "
                f"{RAY_PORTS.dashboard_agent_http}, {RAY_PORTS.dashboard_metrics})")
    return Problem(key, value, f"{named(x)} and {named(other)} both listen on {x.node}:{port}: one fails to bind "
                   "(OSError: [Errno 98] Address already in use)", fix=fix)


def ephemeral_port_warnings(config: StackConfig, table: list[Listener]) -> list[str]:
    """A fixed port the user chose inside the kernel's ephemeral range (`firewall.ephemeral_ports`, Linux's
    32768-60999 by default): an outgoing connection or an OS-picked listener (NCCL, Gloo, ZMQ, TCPStore) can hold
    it when the process (re)starts, which then fails to bind now and then. One line per key the user can move,
    then one line with every fixed port in the range (Ray's pinned ones too, which alone are not warned: they are
    Ray's defaults) to reserve at once: the kernel keeps
    one list, and `sysctl -w` replaces it, so a reservation per key would undo the one before."""
    low, high = config.firewall.ephemeral_ports
    inside = [x for x in table if not x.ephemeral and x.port <= high and (x.port_end or x.port) >= low]
    if not inside:
        return []
    seen: dict[str, list[Listener]] = {}
    for x in inside:
        key = _KEYS.get(x.source)  # monitoring ports included (PORT_KEYS)
        if key:
            seen.setdefault(key, []).append(x)

    def spans_of(rows: list[Listener]) -> str:
        return _spans(sorted({(max(x.port, low), min(x.port_end or x.port, high)) for x in rows}))

    if not seen:  # only Ray's own pinned ports (its defaults): nothing the stack chose
        return []
    warnings = [f"{key}: port(s) {spans_of(hits)} ({hits[0].purpose.split(' (')[0]}) lie in the kernel's ephemeral "
                f"range {low}-{high} (firewall.ephemeral_ports): an outgoing connection or an OS-picked port can hold "
                "one when the process restarts, and the bind fails (Address already in use); pick a port outside "
                "that range, or reserve it (next line)" for key, hits in seen.items()]
    return [*warnings, f"ephemeral range {low}-{high}: reserve the fixed ports in it on every node, all in one list "
            f"(it is one setting; sysctl -w replaces what it held, so add to it): {spans_of(inside)} -> "
            "net.ipv4.ip_local_reserved_ports, in a file under /etc/sysctl.d"]


def _spans(ranges: list[tuple[int, int]]) -> str:
    """Sorted (first, last) port ranges merged where they touch, as sysctl's list syntax: `8000-8007,9090`."""
    merged: list[list[int]] = []
    for first, last in ranges:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in merged)


def _clash(a: Listener, b: Listener) -> bool:
    return (a.process != b.process and _overlap(a.bind, b.bind)
            and a.port <= (b.port_end or b.port) and b.port <= (a.port_end or a.port))


_KEYS = {SRC_PROXY: "api.proxy.port", SRC_API: "serving.port", SRC_API_HYBRID: "serving.port",
         SRC_API_EXTERNAL: "serving.port",
         SRC_HANDSHAKE: "parallelism.data_parallel_rpc_port",
         SRC_GCS: "ray.gcs_port", SRC_CLIENT: "ray.client_port", SRC_DASHBOARD: "ray.dashboard_port",
         SRC_COLLECTIVE: "fabric.collective_port", SRC_MASTER: "parallelism.master_port",
         SRC_SIDE_CHANNEL: "disaggregation.side_channel_port", SRC_ROUTER: "disaggregation.router.port", **PORT_KEYS}


def _overlap(a: str, b: str) -> bool:
    return a in WILDCARDS or b in WILDCARDS or a == b


