"""KV cache transfer between a prefill tier and a decode tier with vLLM 0.33.0's NIXL connector: what must match
between the tiers, which tensor-parallel shapes the connector can pair, and each tier's `--kv-transfer-config` and
per-node environment. Pure: the tiers are two StackConfigs (each a replica group planned as a stack of its own,
stacks/planner/groups.py `group_config`) and the stack's `KvTransferConfig`.

Why these rules: a mismatch is found by vLLM only when the first request crosses tiers. The decode tier's worker
(the prefill tier's with NixlPushConnector) asks the other tier's side-channel listener for its metadata, compares a
hash of the "compatibility factors" (kv_connector/v1/nixl/metadata.py:146-216: vLLM and connector version, model,
dtype, KV head count, head size, layers, attention backend, KV cache dtype, hybrid KV cache manager, EAGLE/MTP
speculation, push or pull) and raises `RuntimeError: NIXL compatibility hash mismatch` (nixl/base_worker.py:
1191-1208); the tensor-parallel ratio, block size and KV layout are checked after the hash, when the remote agent is
added (base_worker.py:2389-2980, kv_connector/utils.py:522-547). Either way the request fails with the tiers up and
healthy. Here each is refused at plan time.

Directions: the side that calls `add_remote_agent` with the other's metadata is the "local" side of vLLM's
checks: the decode tier for a pull connector (it reads), the prefill tier for NixlPushConnector (it writes; the
decode tier only sends notifications, push_worker.py:347-358). `tp_ratio` and `block_size_ratio` are computed there.

What has no rule because the connector has none: expert parallelism (nothing under kv_connector/v1/nixl/ reads it)
and data parallelism, whose only effect is that DP rank r's engine listens on side-channel port + r
(base_scheduler.py:76-80) and gets its own engine id (vllm/v1/engine/core.py:1489-1496). MLA models replicate the
KV cache on every TP rank, so any TP ratio that divides works (nixl/tp_mapping.py:107-117, base_worker.py:2724-2730).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from stacks.model.config import NodeConfig, StackConfig
from stacks.model.errors import Problem
from stacks.model.kv_transfer_config import KvTransferConfig
from stacks.planner.exposure import admits_outside, bind_reachable
from stacks.planner.fabric import control_ip
from stacks.planner.listeners import SRC_SIDE_CHANNEL, Listener, cluster_addresses, collapse, listener_table
from stacks.planner.managed_options import table_for
from stacks.planner.model_cards import CardProblem, ModelProfile, get_profile
from stacks.planner.serve_options import ArgvItem, read_argv
from stacks.planner.topology import derive_topology

Tier = Literal["prefill", "decode"]
ROLES: dict[Tier, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
"""kv_role per tier: kv_both is deprecated for NIXL ("Please set kv_role='kv_producer' for prefill instances and
kv_role='kv_consumer' for decode instances", kv_connector/v1/nixl/connector.py:97-103)."""

HASH_MISMATCH = ("RuntimeError: NIXL compatibility hash mismatch. ... Prefill and decode instances have "
                 "incompatible configurations. (kv_connector/v1/nixl/base_worker.py:1193-1208), on the first request "
                 "that crosses the tiers")
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "kimi_k2")
"""Model types vLLM 0.33.0 runs with MLA (a subset of vllm/transformers_utils/model_arch_config_convertor.py:297-327;
DeepSeek V4's `head_dim` makes it MLA there). A card with an `mla` section is MLA whatever its type."""
CSA_LINEAR_MODEL_TYPES = {"deepseek_v41": "vllm/model_executor/models/deepseek_v41/compressor.py:229-237"}
"""Models whose KV cache has a CircularBufferSpec group (CSA-linear, nixl/base_worker.py:676-679), and where."""
EAGLE_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")
"""Speculative methods whose config enters the compatibility hash (vllm/config/speculative.py:2116-2120,
nixl/metadata.py:103-143, 200)."""
NVFP4_KV_DTYPES = ("nvfp4", "nvfp4_4over6")
"""KV cache dtypes of KVQuantMode.NVFP4 (vllm/v1/kv_cache_interface.py:139-140)."""


@dataclass(frozen=True)
class SideChannel:
    """The NIXL handshake listener(s) of one node: `first_port`..`last_port` on `host`, one port per DP rank."""

    node: str
    host: str
    first_port: int
    last_port: int


# --- rendering ---------------------------------------------------------------------------------------------------


def kv_transfer_json(settings: KvTransferConfig, tier: Tier) -> str:
    """The tier's `--kv-transfer-config` value. No engine_id: each instance draws its own UUID
    (vllm/config/kv_transfer.py:110-112), suffixed by its DP rank (v1/engine/core.py:1489-1496); a fixed one shared
    by both tiers would make a tier its own remote (kv_connector/utils.py:489-492)."""
    return json.dumps({"kv_connector": settings.connector, "kv_role": ROLES[tier],
                       "kv_buffer_device": settings.buffer_device,
                       "kv_load_failure_policy": settings.load_failure_policy}, separators=(",", ":"))


def kv_transfer_args(settings: KvTransferConfig, tier: Tier) -> list[str]:
    """The argv words a tier's `vllm serve` gets."""
    return ["--kv-transfer-config", kv_transfer_json(settings, tier)]


def side_channel_host(config: StackConfig, node: NodeConfig, settings: KvTransferConfig) -> str | None:
    """VLLM_NIXL_SIDE_CHANNEL_HOST of a node: vLLM's default `localhost` (envs.py:1720-1723) is what the prefill tier
    would tell the decode tier to dial (pull_scheduler.py:284-285), so every node gets an address of its own."""
    if settings.side_channel_network == "management":
        return node.management_ip
    if settings.side_channel_network == "data":
        return node.data_ips[0] if node.data_ips else None
    return control_ip(config, node)


def side_channels(config: StackConfig, settings: KvTransferConfig) -> list[SideChannel]:
    """Where each node's engines listen for NIXL handshakes: DP rank r on side_channel_port + r
    (nixl/base_scheduler.py:76-80), on the node that runs rank r's engine core (its scheduler starts the listener,
    base_scheduler.py:324-340). A node with no engine core (a worker of a replica that spans nodes) has none."""
    topo, _ = derive_topology(config)
    by_name = {n.name: n for n in config.nodes}
    ranks = {n.name: n.dp_ranks for n in topo.nodes}
    if not any(ranks.values()):  # one engine (Ray, or DP 1 where the topology names no rank): on the head
        ranks[config.head.name] = [0]
    out = []
    for name, node_ranks in ranks.items():
        host = side_channel_host(config, by_name[name], settings)
        if node_ranks and host is not None:
            out.append(SideChannel(name, host, settings.side_channel_port + min(node_ranks),
                                   settings.side_channel_port + max(node_ranks)))
    return out


def ucx_net_devices(config: StackConfig, node: NodeConfig) -> list[str]:
    """The devices NIXL's UCX may move KV blocks over, from the same lists NCCL gets (stacks/planner/fabric.py):
    RDMA ports as UCX names them, `dev:port` (`mlx5_0` is port 1, as vLLM's own mapper writes it:
    vllm/v1/executor/vllm_net_devices.py:121-133, 175-180), else the data NICs for TCP."""
    if config.fabric.transport in ("roce", "ib") and node.hcas and not _tcp_only(config.fabric.env.get("UCX_TLS")):
        return [h if ":" in h else f"{h}:1" for h in node.hcas]
    if node.nics:
        return list(node.nics)
    return [node.management_ifname] if node.management_ifname else []


def _tcp_only(tls: str | None) -> bool:
    """UCX_TLS from fabric.env that names tcp and no RDMA transport (rc, ud, dc and their variants): UCX then moves
    KV over TCP, whose devices are network interfaces (`ens1np0`), not HCA ports (`mlx5_0:1`), in UCX_NET_DEVICES."""
    if not tls or tls.startswith("^"):
        return False
    names = [t.strip() for t in tls.split(",")]
    return "tcp" in names and not any(t.startswith(("rc", "ud", "dc", "ib")) for t in names)


def node_env(config: StackConfig, node: NodeConfig, settings: KvTransferConfig) -> dict[str, str]:
    """The KV transfer part of a node's container environment. UCX_NET_DEVICES (UCX's ucp_config_table, "Specifies
    which network device(s) to use") keeps UCX off the management network and container bridges; UCX_IB_GID_INDEX
    is the RoCE GID NCCL gets as NCCL_IB_GID_INDEX. UCX_TLS is not set: with only these devices UCX picks among
    their transports. A UCX_* variable in fabric.env wins over what is derived here."""
    env: dict[str, str] = {}
    host = side_channel_host(config, node, settings)
    if host is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(settings.side_channel_port)
    devices = ucx_net_devices(config, node)
    if devices:
        env["UCX_NET_DEVICES"] = ",".join(devices)
    if config.fabric.transport in ("roce", "ib") and node.gid_index is not None:
        env["UCX_IB_GID_INDEX"] = str(node.gid_index)
    env.update({k: v for k, v in config.fabric.env.items() if k.startswith("UCX_")})
    return env


def side_channel_listeners(config: StackConfig, settings: KvTransferConfig, tier: Tier,
                           sources: list[str]) -> list[Listener]:
    """The tier's NIXL handshake listeners as rows of the listener table: what the firewall admits the other tier
    to (`sources`: this tier's cluster sources and the other tier's addresses)."""
    private = config.fabric.private_networks
    trusted = collapse([*cluster_addresses(config), *private])
    out = []
    for channel in side_channels(config, settings):
        out.append(Listener(
            node=channel.node, port=channel.first_port,
            port_end=channel.last_port if channel.last_port != channel.first_port else None, bind=channel.host,
            network=settings.side_channel_network,
            purpose=f"NIXL handshake ({tier} tier; one port per DP rank, ZMQ, unauthenticated msgpack)",
            public=admits_outside(sources, trusted) and bind_reachable(channel.host, private),
            role=f"{tier}-engine", process="vllm serve (engine core's NIXL scheduler)",
            reach="cluster", internal=True, ephemeral=False, allowed_sources=sources,
            source=SRC_SIDE_CHANNEL))
    return out


# --- rules -------------------------------------------------------------------------------------------------------


def kv_transfer_problems(prefill: StackConfig, decode: StackConfig, settings: KvTransferConfig) -> list[Problem]:
    """Everything that would make the tiers' KV transfer fail, each with the tier's own key (a group's config is a
    stack of its own: the caller maps keys to the stack file as stack_plan._in_group does)."""
    profiles: dict[Tier, ModelProfile | None] = {"prefill": _profile(prefill), "decode": _profile(decode)}
    tiers: dict[Tier, StackConfig] = {"prefill": prefill, "decode": decode}
    problems = _hash_problems(tiers, profiles)
    problems += _parallel_problems(tiers, profiles, settings)
    problems += _block_problems(tiers, profiles, settings)
    for tier, config in tiers.items():
        problems += _tier_problems(tier, config, profiles[tier], settings)
    return problems


def kv_transfer_warnings(prefill: StackConfig, decode: StackConfig) -> list[str]:
    """What the plan cannot decide offline: a block size given on one tier only (the other gets its attention
    backend's, vllm/config/cache.py:187)."""
    sizes = {t: _last(_args(c), "block_size") for t, c in (("prefill", prefill), ("decode", decode))}
    if (sizes["prefill"] is None) != (sizes["decode"] is None):
        given = "prefill" if sizes["prefill"] is not None else "decode"
        return [f"kv transfer: --block-size is set on the {given} tier only; the other tier's is its attention "
                "backend's default, which the plan cannot know: give --block-size on both tiers so the block-size "
                "rules (kv_connector/utils.py:541-547) are checked"]
    return []


def _hash_problems(tiers: dict[Tier, StackConfig], profiles: dict[Tier, ModelProfile | None]) -> list[Problem]:
    """The compatibility-hash factors (nixl/metadata.py:186-203) the stack decides, compared between the tiers."""
    p, d = tiers["prefill"], tiers["decode"]
    problems: list[Problem] = []

    def differ(key: str, mine: object, theirs: object, factor: str, fix: str) -> None:
        if mine != theirs:
            problems.append(Problem(key, theirs, f"decode tier has {theirs!r}, prefill tier {mine!r}: {factor} is "
                                    "part of the NIXL compatibility hash both tiers must share",
                                    upstream=HASH_MISMATCH, fix=fix))

    differ("image", d.image.pull_ref, p.image.pull_ref, "the vLLM version (nixl/metadata.py:188-189)",
           "the same image on both tiers (roll an image change to both)")
    differ("model.profile", d.model.profile, p.model.profile, "the model (nixl/metadata.py:190-195)",
           "the same model on both tiers")
    differ("model.path", d.model.container_path, p.model.container_path,
           "the model path vLLM is given (model_config.model, nixl/metadata.py:191)",
           "the same model.container_dir and model.path on both tiers")
    differ("serving.dtype", _dtype(d, profiles["decode"]), _dtype(p, profiles["prefill"]),
           "the model dtype (nixl/metadata.py:192)",
           "the same serving.dtype on both tiers")
    differ("serving.kv_cache_dtype", _kv_dtype(d, profiles["decode"]), _kv_dtype(p, profiles["prefill"]),
           "the KV cache dtype (nixl/metadata.py:198)", "the same serving.kv_cache_dtype on both tiers")
    pa, da = _args(p), _args(d)
    differ("serving.extra_args", _last(da, "attention_backend"), _last(pa, "attention_backend"),
           "--attention-backend (nixl/metadata.py:197)", "the same --attention-backend on both tiers, or none")
    differ("serving.extra_args", _hma_off(da), _hma_off(pa),
           "the hybrid KV cache manager switch (nixl/metadata.py:184, 199)",
           "the same --disable-hybrid-kv-cache-manager (or none) on both tiers")
    ps, ds = (_eagle(c) for c in (p, d))
    if ps is not None or ds is not None:
        differ("speculative", ds, ps, "an EAGLE/MTP speculative config (nixl/metadata.py:103-143, 200)",
               "the same speculative block on both tiers")
    return problems


def _parallel_problems(tiers: dict[Tier, StackConfig], profiles: dict[Tier, ModelProfile | None],
                       settings: KvTransferConfig) -> list[Problem]:
    """Tensor-parallel ratios, pipeline parallelism and context parallelism the connector can pair."""
    p, d = tiers["prefill"], tiers["decode"]
    local, remote = _sides(settings)
    lt, rt = tiers[local].parallelism.tensor, tiers[remote].parallelism.tensor
    problems: list[Problem] = []
    if max(lt, rt) % min(lt, rt):
        problems.append(Problem(
            "parallelism.tensor", d.parallelism.tensor, f"decode tier TP {d.parallelism.tensor} and prefill tier TP "
            f"{p.parallelism.tensor}: the larger must be a multiple of the smaller for the connector to map ranks",
            upstream=f"AssertionError: {'Local' if lt > rt else 'Remote'} tensor parallel size {max(lt, rt)} is not "
            f"divisible by {'remote' if lt > rt else 'local'} tensor parallel size {min(lt, rt)}. "
            "(kv_connector/utils.py:522-539), at the first transfer",
            fix=f"TP sizes that divide one another, e.g. decode TP {p.parallelism.tensor} or "
                f"{2 * p.parallelism.tensor}"))
    profile = profiles["decode"] or profiles["prefill"]
    if profile is not None and not _mla(profile) and rt > lt and rt > profile.kv_heads:
        problems.append(Problem(
            "parallelism.tensor", tiers[remote].parallelism.tensor,
            f"{remote} tier TP {rt} is above the {local} tier's TP {lt} and above the model's {profile.kv_heads} KV "
            f"heads: its ranks hold replicated KV heads, which the {local} tier (the side that "
            f"{'writes' if settings.push else 'reads'}) cannot gather from a larger TP",
            upstream="AssertionError in _validate_remote_agent_handshake: assert not (tp_ratio < 0 and "
            "is_kv_replicated(remote)) (kv_connector/v1/nixl/base_worker.py:2724-2730)",
            fix=f"{remote} tier TP at most {max(lt, profile.kv_heads)}, or {local} tier TP at least {rt}"))
    if profile is not None and not _mla(profile) and _kv_dtype(d, profile) in NVFP4_KV_DTYPES and \
            max(1, profile.kv_heads // lt) != max(1, profile.kv_heads // rt):
        problems.append(Problem(
            "serving.kv_cache_dtype", _kv_dtype(d, profile), f"an NVFP4 KV cache cannot be re-sharded between TP "
            f"{lt} and TP {rt}: a head's bytes are not a contiguous slice of an NVFP4 page",
            upstream="RuntimeError: NIXL KV-head re-sharding is not supported for NVFP4 KV cache ... Use matching TP "
            "sizes on prefill and decode. (kv_connector/v1/nixl/base_worker.py:2862-2877)",
            fix="the same TP on both tiers, or another serving.kv_cache_dtype"))
    if d.parallelism.pipeline > 1:
        problems.append(Problem(
            "parallelism.pipeline", d.parallelism.pipeline, "the decode tier cannot be pipeline-parallel: NIXL counts "
            "transfer completions per consumer rank",
            upstream="NotImplementedError: NixlPushConnector consumer (decode) does not support "
            "pipeline_parallel_size > 1. (kv_connector/v1/nixl/base_worker.py:885-890; the check is in the base "
            "worker, so it holds for the pull connector too)", fix="pipeline 1 on the decode tier"))
    if p.parallelism.pipeline > 1 and not settings.push:
        problems.append(Problem(
            "parallelism.pipeline", p.parallelism.pipeline, f"a pipeline-parallel prefill tier needs "
            f"NixlPushConnector: with {settings.connector} the decode tier reads a stage's layers as if they were "
            "the whole model",
            upstream="NotImplementedError: NixlConnector (pull) does not support pipeline_parallel_size > 1 with "
            "hybrid KV cache layouts (HMA); use NixlPushConnector for PP + HMA. (nixl/base_worker.py:871-877); "
            "without HMA: AssertionError: Number of KV layers must match between prefill and decode "
            "(base_worker.py:2903-2906), since only a PP worker slices the remote's layers (base_worker.py:2469-2497)",
            fix="disaggregation.connector: NixlPushConnector, or pipeline 1 on the prefill tier"))
    pcp = _int(_last(_args(d), "prefill_context_parallel_size"))
    if pcp is not None and pcp > 1:
        problems.append(Problem(
            "serving.extra_args", f"--prefill-context-parallel-size {pcp}", "the decode tier cannot run prefill "
            "context parallelism with NIXL",
            upstream="NotImplementedError: NixlConnector PCP currently supports kv_producer only. Consumers and "
            "kv_both require prefill_context_parallel_size=1. (kv_connector/v1/nixl/connector.py:105-113)",
            fix="remove --prefill-context-parallel-size from the decode tier's extra_args"))
    return problems


def _block_problems(tiers: dict[Tier, StackConfig], profiles: dict[Tier, ModelProfile | None],
                    settings: KvTransferConfig) -> list[Problem]:
    """Block sizes (where both tiers give --block-size), the KV cache layout and the host buffer."""
    p, d = tiers["prefill"], tiers["decode"]
    local, remote = _sides(settings)
    problems: list[Problem] = []
    sizes = {t: _int(_last(_args(c), "block_size")) for t, c in tiers.items()}
    lb, rb = sizes[local], sizes[remote]
    if lb is not None and rb is not None and lb != rb:
        lt, rt = tiers[local].parallelism.tensor, tiers[remote].parallelism.tensor
        why, upstream = "", ""
        if lb % rb:
            why = f"the {local} tier's block size {lb} is not a multiple of the {remote} tier's {rb}"
            upstream = (f"AssertionError: Local block size {lb} is not divisible by remote block size {rb} or vice "
                        "versa. (kv_connector/utils.py:541-547)")
        elif rt > lt:
            why = f"block sizes differ ({lb}, {rb}) while the {remote} tier's TP {rt} is above the {local} tier's {lt}"
            upstream = ("AssertionError: Different local/remote block sizes are not supported when P TP > D TP. "
                        "(kv_connector/v1/nixl/base_worker.py:2940-2944)")
        elif settings.buffer_device == "cpu":
            why = f"block sizes differ ({lb}, {rb}) with disaggregation.buffer_device cpu"
            upstream = ("AssertionError: Heterogeneous block sizes are not supported with host buffer "
                        "(kv_connector/v1/nixl/base_worker.py:2780-2787)")
        if why:
            problems.append(Problem("serving.extra_args", f"--block-size {sizes['decode']}",
                                    f"decode tier --block-size {sizes['decode']}, prefill tier {sizes['prefill']}: "
                                    f"{why}", upstream=f"{upstream}, at the first transfer",
                                    fix="the same --block-size on both tiers"))
    profile = profiles["decode"] or profiles["prefill"]
    pl, dl = (c.container.env.get("VLLM_KV_CACHE_LAYOUT") for c in (p, d))
    if pl != dl and profile is not None and not _mla(profile):
        problems.append(Problem(
            "container.env.VLLM_KV_CACHE_LAYOUT", dl, f"decode tier's KV cache layout {dl or 'unset'} differs from "
            f"the prefill tier's {pl or 'unset'} (unset: the connector's LBHNC, nixl/connector.py:148-166)",
            upstream="RuntimeError: Heterogeneous TP expects same kv_cache_layout (local ..., remote ...). "
            "(kv_connector/v1/nixl/base_worker.py:2788-2814)", fix="the same VLLM_KV_CACHE_LAYOUT on both tiers, or "
            "none"))
    if settings.buffer_device == "cpu" and profile is not None and profile.model_type in CSA_LINEAR_MODEL_TYPES:
        problems.append(Problem(
            "disaggregation.buffer_device", "cpu", f"{profile.key} has a CSA-linear KV cache "
            f"({CSA_LINEAR_MODEL_TYPES[profile.model_type]}), whose shared tensors a host buffer does not preserve",
            upstream="NotImplementedError: NIXL host staging does not preserve CSA-linear shared tensors. "
            "(kv_connector/v1/nixl/base_worker.py:1514-1517)", fix="disaggregation.buffer_device: cuda"))
    return problems


def _tier_problems(tier: Tier, config: StackConfig, profile: ModelProfile | None,
                   settings: KvTransferConfig) -> list[Problem]:
    """One tier's own: a flag that would replace the connector, side-channel addresses and ports."""
    problems: list[Problem] = []
    offload = _last(_args(config), "kv_offloading_size")
    if offload is not None:
        problems.append(Problem(
            "serving.extra_args", f"--kv-offloading-size {offload}", f"{tier} tier: --kv-offloading-size makes "
            f"vLLM replace disaggregation.connector by its offloading connector with kv_role kv_both",
            upstream="VllmConfig._post_init_kv_transfer_config sets kv_connector to OffloadingConnector (or "
            "LMCacheMPConnector) and kv_role to kv_both (vllm/config/vllm.py:1151-1185): no KV reaches the other tier",
            fix="remove --kv-offloading-size from this tier's extra_args"))
    for i, node in enumerate(config.nodes):
        if side_channel_host(config, node, settings) is None:
            problems.append(Problem(
                f"nodes.{i}.data_ips", node.data_ips, f"{tier} tier: disaggregation.side_channel_network is "
                f"{settings.side_channel_network!r} but node {node.name} has no data-plane IP for the NIXL handshake",
                fix="list the node's data IPs, or disaggregation.side_channel_network: management"))
    channels = side_channels(config, settings)
    last = max((c.last_port for c in channels), default=settings.side_channel_port)
    if last > 65535:
        problems.append(Problem(
            "disaggregation.side_channel_port", settings.side_channel_port, f"{tier} tier: DP rank r listens on "
            f"side_channel_port + r (nixl/base_scheduler.py:76-80), up to {last}, past 65535",
            fix=f"at most {65535 - (last - settings.side_channel_port)}"))
        return problems
    problems += _clashes(tier, config, channels, settings)
    return problems


def _clashes(tier: Tier, config: StackConfig, channels: list[SideChannel],
             settings: KvTransferConfig) -> list[Problem]:
    """A side-channel port that another fixed listener of the node already holds (the listener table of the tier)."""
    topo, topo_problems = derive_topology(config)
    if topo_problems:
        return []  # the tier's own plan reports these
    table = listener_table(config, topo,
                           multinode_master_port=config.parallelism.master_port if topo.spans_nodes else None)
    problems: list[Problem] = []
    ssh = {n.name: {22, n.ssh.port} for n in config.nodes}
    for channel in channels:
        held = sorted(p for p in ssh.get(channel.node, set()) if channel.first_port <= p <= channel.last_port)
        if held:
            problems.append(Problem(
                "disaggregation.side_channel_port", settings.side_channel_port,
                f"{tier} tier: the NIXL handshake listener(s) on {channel.node} ({_ports(channel)}) include port "
                f"{held[0]}, which sshd holds on every address: one fails to bind "
                "(zmq.error.ZMQError: Address already in use)",
                fix="a side_channel_port whose range avoids the SSH ports, e.g. 5600"))
            continue
        hit = next((x for x in table if x.node == channel.node and not x.ephemeral and _overlaps(x, channel)), None)
        if hit is not None:
            problems.append(Problem(
                "disaggregation.side_channel_port", settings.side_channel_port,
                f"{tier} tier: the NIXL handshake listener(s) on {channel.node} ({_ports(channel)}) and "
                f"{hit.purpose} ({hit.ports}) both listen there: one fails to bind "
                "(zmq.error.ZMQError: Address already in use)",
                fix=f"a side_channel_port whose range of {channel.last_port - channel.first_port + 1} port(s) avoids "
                    f"{hit.ports}"))
    return problems


# --- helpers -----------------------------------------------------------------------------------------------------


def _sides(settings: KvTransferConfig) -> tuple[Tier, Tier]:
    """(local, remote) of vLLM's handshake checks: the tier that adds the other's agent is local."""
    return ("prefill", "decode") if settings.push else ("decode", "prefill")


def _profile(config: StackConfig) -> ModelProfile | None:
    try:
        return get_profile(config.model.profile)
    except CardProblem:
        return None  # the tier's own plan reports a broken card


def _mla(profile: ModelProfile) -> bool:
    return profile.mla_head is not None or profile.model_type in MLA_MODEL_TYPES


def _dtype(config: StackConfig, profile: ModelProfile | None) -> str | None:
    """The model dtype as vLLM resolves it for the hash (`str(model_config.dtype)`): auto is the checkpoint's."""
    asked = config.serving.dtype
    return asked if asked not in (None, "auto") else (profile.dtype if profile else None)


def _kv_dtype(config: StackConfig, profile: ModelProfile | None) -> str | None:
    return config.serving.kv_cache_dtype or (profile.default_kv_cache_dtype if profile else None)


def _args(config: StackConfig) -> list[ArgvItem]:
    """The tier's extra_args as vLLM reads them (the image card's option table)."""
    table, _ = table_for(config)
    return read_argv(list(config.serving.extra_args), table)


def _last(items: list[ArgvItem], dest: str) -> str | None:
    """The value of the last occurrence of `dest` (argparse keeps the last); "" for a flag; None when absent."""
    item = next((i for i in reversed(items) if i.dest == dest), None)
    if item is None:
        return None
    return item.values[-1] if item.values else ""


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def _hma_off(items: list[ArgvItem]) -> bool:
    """Whether the extra_args turn the hybrid KV cache manager off: the last of `--disable-hybrid-kv-cache-manager`,
    `--enable-hybrid-kv-cache-manager` and `--no-disable-hybrid-kv-cache-manager` (one destination) decides."""
    item = next((i for i in reversed(items) if i.dest == "disable_hybrid_kv_cache_manager"), None)
    if item is None or item.option != "--disable-hybrid-kv-cache-manager":
        return False
    return not (item.values and item.values[-1].lower() in ("false", "0", "no", "off"))


def _eagle(config: StackConfig) -> tuple[str, int, str] | None:
    spec = config.speculative
    if spec is None or spec.method not in EAGLE_METHODS:
        return None
    return spec.method, spec.num_speculative_tokens, json.dumps(spec.options, sort_keys=True)


def _overlaps(listener: Listener, channel: SideChannel) -> bool:
    bind_overlap = listener.bind in ("0.0.0.0", "::") or listener.bind == channel.host
    return bind_overlap and listener.port <= channel.last_port and channel.first_port <= (
        listener.port_end or listener.port)


def _ports(channel: SideChannel) -> str:
    return str(channel.first_port) if channel.first_port == channel.last_port else \
        f"{channel.first_port}-{channel.last_port}"
