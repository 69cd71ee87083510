"""The exact `vllm serve` argv, Ray commands and container settings for every node.

This is the single source of truth for what gets launched: the Pulumi components copy these specs into
`docker.Container` resources field by field and compute nothing of their own.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence

from stacks.model.config import NodeConfig, ParallelismConfig, StackConfig
from stacks.model.field_types import host_port
from stacks.planner.addresses import api_bind, node_api_host, rank_port
from stacks.planner.container_spec import (
    GENERATION_LABEL,
    LABEL_PREFIX,
    NODE_LABEL,
    WEIGHTS_VERSION,
    ContainerSpec,
    HealthcheckSpec,
    VolumeSpec,
)
from stacks.planner.fabric import control_ip, node_env
from stacks.planner.listeners import RAY_PORTS
from stacks.planner.load_formats import load_flags
from stacks.planner.model_cards import ModelProfile
from stacks.planner.topology import NodeTopology, Role, Topology

ENGINE_REPLACE_ON_CHANGES = ("healthcheck", "envs", "labels", "command", "entrypoints")
"""VllmEngine's `replace_on_changes`: `healthcheck` would otherwise be an update the daemon ignores until the
container is recreated; the rest are replacing already and stated again so a provider release that relaxes one
cannot turn a launch change into a silent no-op."""


def vllm_args(config: StackConfig, profile: ModelProfile, topo: Topology, node: NodeTopology,
              rank: int | None = None, kv_args: Sequence[str] = ()) -> list[str]:
    """Everything after `vllm serve`, model path first (the image's entrypoint is `vllm serve`).

    `rank`: with external load balancing, the DP rank whose own server this argv starts (`rank_port`,
    `--data-parallel-size-local 1 --data-parallel-rank r --data-parallel-external-lb`, vllm/engine/arg_utils.py:
    2447-2485); every rank still names the head's DP address and RPC port, where rank 0 runs the handshake
    every engine joins (vllm/v1/engine/utils.py:1318-1336).

    Where a replica spans nodes every node gets `--nnodes/--node-rank/--master-addr/--master-port` (vllm/engine/
    arg_utils.py:1175-1178); ranks > 0 are `--headless`, which vLLM requires there (no API server: entrypoints/
    cli/serve.py:69-77). With DP > 1 no node gets `--data-parallel-start-rank`: vLLM infers each node's DP rank
    from `--node-rank` (engine/arg_utils.py:2421-2424, 2506-2511), and a start rank on the head would switch it
    to hybrid load balancing, which refuses the headless replica heads (v1/engine/utils.py:1502-1514).
    """
    par, serving = config.parallelism, config.serving
    args = [config.model.container_path]
    if node.role.headless:
        args.append("--headless")
    else:
        port = serving.port if rank is None else rank_port(config, node, rank)
        args += ["--host", api_bind(config, node), "--port", str(port)]
    args += ["--served-model-name", config.model.served_name]
    if serving.trust_remote_code:
        args.append("--trust-remote-code")
    if serving.dtype:
        args += ["--dtype", serving.dtype]
    args += ["--tensor-parallel-size", str(par.tensor)]
    if par.pipeline > 1:
        args += ["--pipeline-parallel-size", str(par.pipeline)]
    args += ["--distributed-executor-backend", par.backend]
    if topo.spans_nodes:
        args += ["--nnodes", str(len(topo.nodes)), "--node-rank", str(node.node_rank),
                 "--master-addr", str(control_ip(config, config.head)), "--master-port", str(par.master_port)]
    if par.backend == "mp" and par.data > 1:
        # Spanning: one DP rank per group of nodes, so 1 on every node (what vLLM infers: arg_utils.py:2442-2446).
        local = 1 if topo.spans_nodes or rank is not None else node.dp_local
        args += ["--data-parallel-size", str(par.data), "--data-parallel-size-local", str(local)]
        if rank is not None:
            # external: the rank itself, never a start rank (both at once: "Cannot use more than one data parallel
            # load balancing mode", vllm/entrypoints/cli/serve.py:99-105); the flag said outright as with hybrid.
            args += ["--data-parallel-rank", str(rank), "--data-parallel-external-lb"]
        elif node.dp_start_rank is not None:
            args += ["--data-parallel-start-rank", str(node.dp_start_rank)]
        if topo.hybrid:
            # Said outright, not left to vLLM's inference from a start rank without --headless
            # (engine/arg_utils.py:2489-2491, entrypoints/cli/serve.py:90-97): the plan names the mode it runs.
            args.append("--data-parallel-hybrid-lb")
        args += [
            "--data-parallel-address", str(control_ip(config, config.head)),
            "--data-parallel-rpc-port", str(par.data_parallel_rpc_port),
            "--data-parallel-backend", "mp",
        ]
    if par.expert:
        args.append("--enable-expert-parallel")
    args += expert_parallel_args(par)
    args += ["--max-model-len", str(serving.max_model_len)]
    if serving.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(serving.max_num_batched_tokens)]
    args += ["--max-num-seqs", str(serving.max_num_seqs)]
    args += ["--gpu-memory-utilization", str(serving.gpu_memory_utilization)]
    args += ["--kv-cache-dtype", serving.kv_cache_dtype or profile.default_kv_cache_dtype]
    if serving.prefix_caching:
        args.append("--enable-prefix-caching")
    args += ["--tokenizer-mode", serving.tokenizer_mode or profile.tokenizer_mode]
    tool_parser = serving.tool_call_parser or profile.tool_call_parser
    if tool_parser:  # a model card without one: vLLM's default (no tool calls parsed)
        args += ["--tool-call-parser", tool_parser]
        if serving.auto_tool_choice:
            args.append("--enable-auto-tool-choice")
    reasoning = serving.reasoning_parser or profile.reasoning_parser
    if reasoning:
        args += ["--reasoning-parser", reasoning]
    if profile.vision and not config.vision:
        args.append("--language-model-only")
    args += load_flags(config)
    if config.speculative is not None:
        spec = {
            "method": config.speculative.method,
            "num_speculative_tokens": config.speculative.num_speculative_tokens,
            **config.speculative.options,
        }
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"), ensure_ascii=False)]
    args += list(kv_args)  # a prefill/decode group's --kv-transfer-config (stacks/planner/kv_transfer.py)
    args += list(serving.extra_args)
    return args


def expert_parallel_args(par: ParallelismConfig) -> list[str]:
    """The expert-parallel choices as vLLM 0.33.0 spells them (vllm/engine/arg_utils.py:1313-1358), the same on
    every node; a key left at vLLM's default renders nothing, so such a stack's argv does not change."""
    args: list[str] = []
    if par.all2all_backend != "allgather_reducescatter":
        args += ["--all2all-backend", par.all2all_backend]
    if par.eplb.enabled:
        args.append("--enable-eplb")
        if changed := par.eplb.changed():
            args += ["--eplb-config", json.dumps(changed, separators=(",", ":"))]
    if par.dbo.enabled:
        args.append("--enable-dbo")
        for name in ("decode_token_threshold", "prefill_token_threshold"):  # defaults: vllm/config/parallel.py:263, 268
            value = getattr(par.dbo, name)
            if value != type(par.dbo).model_fields[name].default:
                args += [f"--dbo-{name.replace('_', '-')}", str(value)]
    if par.expert_placement != "linear":
        args += ["--expert-placement-strategy", par.expert_placement]
    if par.ep_weight_filter:
        args.append("--enable-ep-weight-filter")
    return args


def rank_gpus(config: StackConfig, node: NodeTopology, rank: int) -> list[int]:
    """External load balancing: the node's GPUs of DP rank `rank` (TP x PP of them, in rank order). Each rank's
    vLLM has one local DP rank, 0, so without its own CUDA_VISIBLE_DEVICES it would place its workers on GPUs
    0 .. TP x PP - 1 like every other rank of the node (`get_physical_gpu_ids_for_local_dp_rank`, vllm/v1/engine/
    utils.py:439-474; `get_local_gpu_index`, vllm/config/parallel.py:842-856)."""
    per_rank = config.parallelism.tensor * config.parallelism.pipeline
    first = node.dp_ranks.index(rank) * per_rank
    return list(range(first, first + per_rank))


def engine_env(config: StackConfig, node: NodeConfig, node_topo: NodeTopology, rank: int | None = None
               ) -> dict[str, str]:
    """The plain env of a node's engine (with `rank`, of that external-LB rank's container): GPUs, fabric,
    timeout, the user's extras, then any override the config explicitly allows (`container.managed_env_overrides`,
    each a plan warning). A rehearsal (no GPUs, stacks/planner/rehearsal.py) gets no CUDA_VISIBLE_DEVICES."""
    env: dict[str, str] = {}
    if config.container.set_cuda_visible_devices and not config.rehearsal:
        gpus = range(node_topo.gpus_used) if rank is None else rank_gpus(config, node_topo, rank)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
    fabric = node_env(config, node)
    if "VLLM_HOST_IP" in fabric:
        env["VLLM_HOST_IP"] = fabric.pop("VLLM_HOST_IP")
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(config.serving.engine_ready_timeout_s)
    env.update(config.container.env)
    env.update(fabric)
    env.update(config.container.managed_env_overrides)
    return env


def secret_env(config: StackConfig, node_topo: NodeTopology) -> dict[str, str]:
    """Variables whose values are Pulumi secrets: vLLM's key on the node that serves the API, and every
    `env_secrets` entry on every engine."""
    refs = {name: f"env_secrets.{name}" for name in sorted(config.env_secrets or {})}
    if node_topo.role.serves_api and config.api_key is not None:
        refs["VLLM_API_KEY"] = "api_key"
    return refs


def ray_head_script(config: StackConfig, topo: Topology, serve_args: list[str]) -> str:
    """Head container: start Ray, wait until every node and GPU has joined, then exec `vllm serve`."""
    ray = config.ray
    ip = control_ip(config, config.head)
    start = [
        "ray", "start", "--head", f"--node-ip-address={ip}", f"--port={ray.gcs_port}",
        f"--num-gpus={topo.head.gpus_used}", "--dashboard-host=127.0.0.1", f"--dashboard-port={ray.dashboard_port}",
        f"--ray-client-server-port={ray.client_port}", *RAY_PORTS.start_flags(), "--disable-usage-stats",
    ]
    wait = cluster_ready_snippet(len(topo.nodes), topo.gpus_used, ray.cluster_ready_timeout_s)
    return "\n".join([
        "set -euo pipefail",
        shlex.join(start),
        shlex.join(["python3", "-c", wait]),
        shlex.join(["exec", "vllm", "serve", *serve_args]),
    ])


def cluster_ready_snippet(nodes: int, gpus: int, timeout_s: int) -> str:
    """Python run inside the head container: Ray's own view must show every node and GPU before serving."""
    return (
        "import sys,time,ray\n"
        "ray.init(address='auto',logging_level='ERROR')\n"
        f"want_n,want_g,deadline={nodes},{gpus},time.time()+{timeout_s}\n"
        "while True:\n"
        " alive=[n for n in ray.nodes() if n['Alive']]\n"
        " g=sum(n['Resources'].get('GPU',0) for n in alive)\n"
        " print(f'[cluster-ready] {len(alive)}/{want_n} nodes, {g:g}/{want_g} GPUs',flush=True)\n"
        " if len(alive)>=want_n and g>=want_g: break\n"
        " if time.time()>deadline: sys.exit('[cluster-ready] timed out: Ray cluster incomplete')\n"
        " time.sleep(5)\n"
    )


def ray_worker_command(config: StackConfig, node: NodeConfig, node_topo: NodeTopology) -> list[str]:
    head_ip = control_ip(config, config.head)
    return [
        "start", f"--address={host_port(str(head_ip), config.ray.gcs_port)}",
        f"--node-ip-address={control_ip(config, node)}",
        f"--num-gpus={node_topo.gpus_used}", *RAY_PORTS.start_flags(), "--disable-usage-stats", "--block",
    ]


def cache_key(image: str, entrypoint: list[str] | None, command: list[str], env: dict[str, str]) -> str:
    """The subdirectory of `container.cache_dir` one engine container uses as /root/.cache: the same image, argv and
    plain env find their caches again after a restart, and any other never reads them.

    vLLM 0.33.0 keys its own torch.compile cache by content (vllm/compilation/backends.py:1059-1098:
    `VLLM_CACHE_ROOT/torch_compile_cache/<sha256 of env factors (envs.py:2353 compile_factors), the config's
    compute_hash, the traced code files, the compiler's hash>`, with Inductor's and Triton's caches inside it,
    compilation/compiler_interface.py:29-42). The rest of ~/.cache (kernel JIT caches of Triton outside torch.compile,
    DeepGEMM, TileLang, FlashInfer's autotuning) follows each library's own rules, none of them the image; this key
    adds that guarantee. Secret env values never enter it (they are not in `env`)."""
    payload = json.dumps([image, entrypoint, command, sorted(env.items())], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def model_volume(config: StackConfig) -> VolumeSpec:
    """The weights, read-only. With `model.source` each revision lives in its own version directory beside
    `host_dir/path` (checks/weights_versions.py), mounted at `container_dir/path`, where the argv names the model:
    the program fills in the version the sync reported, so a running group keeps the files it was started with."""
    if config.model.source is not None:
        return VolumeSpec(host=f"{config.model.host_path}@{WEIGHTS_VERSION}", container=config.model.container_path,
                          read_only=True)
    return VolumeSpec(host=config.model.host_dir, container=config.model.container_dir, read_only=True)


def _volumes(config: StackConfig, key: str) -> list[VolumeSpec]:
    vols = [model_volume(config)]
    if config.container.cache_dir:
        vols.append(VolumeSpec(host=f"{config.container.cache_dir.rstrip('/')}/{key}", container="/root/.cache",
                               read_only=False))
    vols += [VolumeSpec(host=v.host, container=v.container, read_only=v.read_only) for v in config.container.volumes]
    return vols


def _healthcheck(config: StackConfig, node: NodeTopology, port: int | None = None) -> HealthcheckSpec:
    url = f"http://{host_port(node_api_host(config, node), port or config.serving.port)}/health"
    probe = f"import urllib.request as u; u.urlopen('{url}', timeout=5)"
    return HealthcheckSpec(test=["CMD", "python3", "-c", probe], interval_s=30, timeout_s=10, retries=3,
                           start_period_s=config.serving.engine_ready_timeout_s)


_PURPOSE = {
    Role.DP_HEAD: "vllm API server, DP coordinator and local DP engine(s)",
    Role.HEADLESS_ENGINE: "headless vLLM DP engine(s), joins the head's coordinator",
    Role.RAY_HEAD: "Ray head; waits for the whole cluster, then runs vllm serve",
    Role.RAY_WORKER: "Ray worker: lends its GPUs to the head's vllm serve",
    Role.MP_HEAD: "vllm API server (and DP coordinator), engine core and workers of replica 0's first node; "
                  "hosts the torch.distributed rendezvous on --master-port",
    Role.MP_REPLICA_HEAD: "headless: engine core and workers of a replica's first node; joins the head's DP RPC "
                          "port and --master-port",
    Role.MP_WORKER: "headless: TP/PP workers only (no engine core, no API); joins the head's --master-port",
    Role.DP_API_ENGINE: "vllm API server over this node's own DP engine(s) (hybrid load balancing); the engines "
                        "join the head's DP RPC port and coordinator",
    Role.DP_RANK_SERVERS: "one vllm server per DP rank (external load balancing); the engines join the head's DP "
                          "RPC port and coordinator",
}


def engine_containers(
    stack: str, config: StackConfig, profile: ModelProfile, topo: Topology, kv_args: Sequence[str] = (),
    kv_env: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, list[ContainerSpec]]:
    """Containers per node name, in the order they start. All share one `generation` label (group_generation): a
    change that replaces one container replaces every one, and nothing else moves it.

    One container per node, except with external load balancing: one per DP rank (`rank_containers`). `kv_args`
    and `kv_env` (node -> variables): a prefill/decode group's KV transfer settings (stacks/planner/kv_transfer.py),
    in every engine's argv and environment."""
    draft: dict[str, list[ContainerSpec]] = {}
    for node, node_topo in zip(config.nodes, topo.nodes, strict=True):
        if topo.external:
            draft[node.name] = rank_containers(config, profile, topo, node, node_topo)
            continue
        role = node_topo.role
        serve = vllm_args(config, profile, topo, node_topo, kv_args=kv_args) if role is not Role.RAY_WORKER else None
        if role is Role.RAY_HEAD:
            assert serve is not None
            entrypoint: list[str] | None = ["/bin/bash", "-c"]
            command = [ray_head_script(config, topo, serve)]
        elif role is Role.RAY_WORKER:
            entrypoint, command = ["ray"], ray_worker_command(config, node, node_topo)
        else:
            assert serve is not None
            entrypoint, command = None, list(serve)
        draft[node.name] = [_container(
            config, config.container.name,
            _PURPOSE[role] + (" (hybrid load balancing: its API server serves this node's ranks only)"
                              if topo.hybrid and role is Role.DP_HEAD else ""),
            serve, command, entrypoint, {**engine_env(config, node, node_topo), **(kv_env or {}).get(node.name, {})},
            secret_env(config, node_topo),
            _healthcheck(config, node_topo) if role.serves_api else None)]
    # One container per node hashes under the node's name (as it always has); several under node/container.
    generation = group_generation({(name if len(specs) == 1 else f"{name}/{spec.name}"): spec
                                   for name, specs in draft.items() for spec in specs},
                                  config.container.restart_epoch)
    result: dict[str, list[ContainerSpec]] = {}
    for node_topo in topo.nodes:
        # Only facts that change exactly when a process changes: labels force replacement (pulumi-docker marks
        # `labels` willReplaceOnChanges). Planning facts for the policy pack travel in PolicyFacts instead.
        labels = {
            f"{LABEL_PREFIX}.stack": stack,
            NODE_LABEL: node_topo.name,
            f"{LABEL_PREFIX}.role": node_topo.role.value,
            f"{LABEL_PREFIX}.topology": topo.label,
            GENERATION_LABEL: generation,
        }
        result[node_topo.name] = [spec.model_copy(update={"labels": labels}) for spec in draft[node_topo.name]]
    return result


def rank_name(config: StackConfig, rank: int) -> str:
    """External load balancing: the container of DP rank `rank` (`<container.name>-dp<r>`, unique in the stack)."""
    return f"{config.container.name}-dp{rank}"


def rank_containers(config: StackConfig, profile: ModelProfile, topo: Topology, node: NodeConfig,
                    node_topo: NodeTopology) -> list[ContainerSpec]:
    """External load balancing: one container per DP rank of the node, each `vllm serve` with its own API port
    (`rank_port`), its own GPUs (`rank_gpus`, as CUDA_VISIBLE_DEVICES), key and healthcheck. A container per rank,
    not several servers in one: Docker then sees each rank's process (its exit, health and log are the rank's),
    and the group restart, drift and ownership checks act on each as on any engine container.

    Start order: on the head rank 0 comes last. It binds the DP RPC handshake that every other rank's engine
    dials and retries (vllm/v1/engine/utils.py:1318-1372), and starts the clock that waits for all of them."""
    ranks = node_topo.dp_ranks
    if node_topo.role.is_head:
        ranks = [*ranks[1:], ranks[0]]
    specs = []
    for rank in ranks:
        serve = vllm_args(config, profile, topo, node_topo, rank)
        gpus = ",".join(map(str, rank_gpus(config, node_topo, rank)))
        purpose = (f"vllm server of DP rank {rank} (external load balancing): its own API server on port "
                   f"{rank_port(config, node_topo, rank)} and engine on GPU(s) {gpus}; ")
        purpose += ("also the DP coordinator and the DP RPC handshake every rank's engine joins" if rank == 0 else
                    "its engine joins rank 0's DP RPC handshake and coordinator on the head")
        specs.append(_container(config, rank_name(config, rank), purpose, serve, list(serve),
                                None, engine_env(config, node, node_topo, rank), secret_env(config, node_topo),
                                _healthcheck(config, node_topo, rank_port(config, node_topo, rank))))
    return specs


def _container(config: StackConfig, name: str, purpose: str, serve: list[str] | None, command: list[str],
               entrypoint: list[str] | None, env: dict[str, str], secrets: dict[str, str],
               healthcheck: HealthcheckSpec | None) -> ContainerSpec:
    c = config.container
    return ContainerSpec(
        name=name,
        purpose=purpose,
        image=config.image.pull_ref,
        vllm_args=serve,
        command=command,
        entrypoint=entrypoint,
        env=env,
        secret_env=secrets,
        network_mode=c.network_mode,
        ipc_mode=c.ipc_mode,
        privileged=c.privileged,
        gpus=None if config.rehearsal else "all",  # a rehearsal's nodes have no GPU (stacks/planner/rehearsal.py)
        ulimits={k: [v[0], v[1]] for k, v in c.ulimits.items()},
        shm_size_mb=c.shm_size_mb,
        volumes=_volumes(config, cache_key(config.image.pull_ref, entrypoint, command, env)),
        devices=list(c.devices),
        capabilities=list(c.capabilities),
        restart=c.restart,
        labels={},
        healthcheck=healthcheck,
    )


GENERATION_FIELDS = ("name", "image", "command", "entrypoint", "env", "secret_env", "network_mode", "ipc_mode",
                     "privileged", "gpus", "ulimits", "shm_size_mb", "volumes", "devices", "capabilities",
                     "healthcheck")
"""The ContainerSpec fields whose docker inputs replace a container when they change (provider schema
`willReplaceOnChanges`, or VllmEngine's replace_on_changes for `healthcheck`): exactly what the group's
generation hashes, so one node's replacement is every node's (vLLM is fail-stop) and nothing else moves it."""

NOT_GENERATION_FIELDS = ("purpose", "vllm_args", "restart", "labels")
"""Fields that change no container on their own: prose, a copy of `command`, the restart policy (docker updates it
in place: terraform-provider-docker resourceDockerContainerUpdate), and the labels the generation goes into."""


def group_generation(specs: dict[str, ContainerSpec], restart_epoch: int = 0) -> str:
    """Hash of every engine container's replacing fields (GENERATION_FIELDS): one node's change is every node's.

    `container.restart_epoch` enters only when it is not 0, so a stack that never sets it keeps its hash."""
    payload: dict[str, object] = {name: spec.model_dump(include=set(GENERATION_FIELDS))
                                  for name, spec in sorted(specs.items())}
    if restart_epoch:
        payload["restart_epoch"] = restart_epoch
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def restart_policy_warnings(config: StackConfig) -> list[str]:
    """A Docker restart policy restarts one dead rank alone; vLLM is fail-stop, so that rank hangs."""
    policy = config.container.restart
    if policy == "no":
        return []
    return [f"container.restart is {policy!r}: Docker restarts one dead rank alone, and it hangs against its stale "
            "peers (vLLM is fail-stop; the other ranks keep waiting on the old group) while the API looks half "
            "alive; use 'no' and restart the whole group: bump container.restart_epoch, then pulumi up "
            "(docs/what-a-change-costs.md; docs/runbooks.md: An engine died)"]
