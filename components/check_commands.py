"""Shell commands for every planned check, built from the plan (pure: no Pulumi imports).

Host-side checks are shipped as one stdlib-only script through a heredoc and wrapped in `timeout`, because
remote commands ignore Pulumi's own timeouts.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from itertools import groupby

from checks import deepep_host
from checks.bundle import heredoc_command
from checks.preflight import outer_timeout_s
from checks.weights_node import node_prune_command, node_sync_command, node_verify_command
from components.collective_check import COLLECTIVE_TIMEOUT_S, CollectiveRun, collective_runs
from stacks.model.config import StackConfig
from stacks.model.field_types import bracket_host, host_port
from stacks.model.golden import golden_json
from stacks.planner.addresses import local_api_host, node_api_host, rank_port
from stacks.planner.container_spec import LABEL_PREFIX
from stacks.planner.deepep import nic_handler, reach_targets
from stacks.planner.launch import rank_name
from stacks.planner.load_estimate import EngineMemory, engine_memory
from stacks.planner.model_cards import ModelProfile, get_profile
from stacks.planner.outage import warm_experts
from stacks.planner.plan import CheckSpec, Plan, api_on_head, min_busbw_gbps, thinking_args
from stacks.planner.topology import derive_topology, endpoint_rank_nodes

DRY_RUN_TIMEOUT_S = 600
"""Importing vLLM (torch, CUDA libraries) from a cold page cache takes a minute or two."""
DRY_RUN_PER_SERVER_S = 120
"""More time for each further rank server of a node (external load balancing): one more engine config, no import."""
EXPECTED_FIELDS = {
    "--tensor-parallel-size": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
    "--data-parallel-size": "data_parallel_size", "--data-parallel-size-local": "data_parallel_size_local",
    "--data-parallel-start-rank": "data_parallel_start_rank", "--data-parallel-rank": "data_parallel_rank",
    "--host": "host", "--port": "port",
    "--max-model-len": "max_model_len", "--max-num-seqs": "max_num_seqs",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--nnodes": "nnodes", "--node-rank": "node_rank", "--master-addr": "master_addr", "--master-port": "master_port",
}
"""Flags whose parsed value must come out exactly as planned (vLLM's argparse dest names)."""
EVIDENCE_TIMEOUT_S = 300
TLS_CA_ENV = "VLLM_TLS_CA"
API_PYTHON = "venv/bin/python"
"""The deployer's interpreter: Pulumi's pip toolchain creates venv/ (Pulumi.yaml)."""


def preflight_command(config: StackConfig, plan: Plan, check: CheckSpec, model_dir: str | None = None) -> str:
    """Only the arguments the check's sections read, so e.g. an image change does not re-run the fabric check.
    The outer `timeout` is the sum of the sections' budgets (`checks.preflight.outer_timeout_s`): every call inside
    has a shorter one, so a hung docker ends in a verdict. Sections in `checks.preflight.BEFORE_PULL` need no image
    (ownership, disk, gpu, model): run them in a command the image pull depends on."""
    node = next(n for n in config.nodes if n.name == check.node)
    node_plan = plan.node(node.name)
    sections = set(check.sections)
    profile = get_profile(config.model.profile)
    args = ["--name", check.name, "--sections", ",".join(check.sections)]
    if sections & {"gpu", "toolkit"}:
        args += ["--gpus", str(node.gpus.count)]
    if sections & {"gpu", "model"}:
        args += ["--gpu-memory-gb", f"{node.gpus.memory_gb:g}"]
    if "gpu" in sections:
        args += ["--gpu-model", node.gpus.model]
    if sections & {"toolkit", "memlock", "disk"}:
        args += ["--image", config.image.pull_ref]
    if "model" in sections:
        args += ["--model-dir", model_dir or config.model.host_path]
        if profile is not None:
            args += ["--heads", str(profile.num_attention_heads)]
            if profile.o_groups is not None:
                args += ["--o-groups", str(profile.o_groups)]
            args += _memory_args(config, plan, node.name)
    if "ownership" in sections:
        names = [c.name for c in node_plan.containers]
        if plan.proxy is not None and plan.proxy.node == node.name:
            names.append(plan.proxy.container)
        # Fixed ports only: an OS-picked (ephemeral) port or a range cannot be held for us in advance.
        ports = sorted({x.port for x in plan.listeners if x.node == node.name and not x.ephemeral
                        and x.port_end is None})
        # Every container the program creates carries the stack label, the proxy included (ApiEndpoint).
        args += ["--owned-label", f"{LABEL_PREFIX}.stack={plan.stack}", "--container-names", ",".join(names)]
        if ports:
            args += ["--ports", ",".join(map(str, ports))]
    if sections & {"hca", "gid"}:
        args += ["--hcas", ",".join(node.hcas)]
    if "hca" in sections:
        args += ["--link-layer", "InfiniBand" if config.fabric.transport == "ib" else "Ethernet"]
    if "gid" in sections and node.gid_index is not None:
        args += ["--gid-index", str(node.gid_index)]
    if "sysctl" in sections:
        args += ["--nics", ",".join(node.nics)]
    if config.rehearsal:  # no GPUs: gpu, toolkit and the RDMA sections print NOT RUN (stacks/planner/rehearsal.py)
        args.append("--rehearsal")
    assert node_plan.gpus_present == node.gpus.count
    return heredoc_command("preflight", args, timeout_s=outer_timeout_s(check.sections))


def deepep_host_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    """`deepep-host-<node>` on the node's own python3, before the image pull: the IBGDA driver options or gdrdrv
    for the NIC handler the engine will run (NVSHMEM_IBGDA_NIC_HANDLER from its env, NVSHMEM's `auto` when unset),
    GPU memory registration, and the node's data NICs against every peer's."""
    node = next(n for n in config.nodes if n.name == check.node)
    handler = nic_handler(config)
    args = ["--name", check.name, "--sections", ",".join(check.sections)]
    if handler != "auto":
        args += ["--nic-handler", handler]
    pairs = 0
    if "reach" in check.sections:
        local, peers = reach_targets(config, node)
        args += ["--local", ",".join(local)]
        for _, group in groupby(peers, key=lambda peer: peer.split(":", 1)[0]):
            args += ["--peers", ",".join(group)]  # one per peer node: each far below the per-argument cap
        pairs = len(local) * len(peers)
    if config.rehearsal:  # no GPUs: ibgda and peermem print NOT RUN, reach runs
        args.append("--rehearsal")
    return heredoc_command("deepep_host", args, timeout_s=deepep_host.outer_timeout_s(pairs))


_MEMORY: list[tuple[StackConfig, ModelProfile, EngineMemory]] = []
"""The last config's engine memory: the same for every node, and deriving it walks every node (the topology),
so deriving it once per node's preflight made the program quadratic. Keyed by the (frozen) config and the
model card it was derived with, both by identity."""


def _engine_memory(config: StackConfig, profile: ModelProfile) -> EngineMemory:
    if not (_MEMORY and _MEMORY[0][0] is config and _MEMORY[0][1] is profile):
        topo, _ = derive_topology(config)
        _MEMORY[:] = [(config, profile, engine_memory(config, profile, topo))]
    return _MEMORY[0][2]


def _memory_args(config: StackConfig, plan: Plan, node_name: str) -> list[str]:
    """What the model section needs to recompute per-GPU memory from the real files, as the planner placed it."""
    profile = get_profile(config.model.profile)
    assert profile is not None
    mem = _engine_memory(config, profile)
    par, serving = config.parallelism, config.serving
    data = par.data if par.backend == "mp" else 1
    local = len(plan.node(node_name).dp_ranks) or 1
    edp = mem.engram_shards // par.tensor
    copies = local / edp if par.backend == "mp" else 1 / par.pipeline
    dtype = serving.kv_cache_dtype or profile.default_kv_cache_dtype
    return ["--tp", str(par.tensor), "--pp", str(par.pipeline), "--dp", str(data),
            "--engram", "gpu" if mem.engram_on_gpu else "host", "--engram-shards", str(mem.engram_shards),
            "--engram-copies", f"{copies:g}", "--ranks-on-node", str(plan.node(node_name).gpus_used),
            "--gpu-memory-utilization", f"{serving.gpu_memory_utilization:g}",
            "--max-model-len", str(serving.max_model_len), "--kv-cache-dtype", dtype,
            "--kv-fallback-bytes", f"{mem.gpu.kv_bytes_per_token:.0f}", "--planned-gb", f"{mem.gpu.total:.1f}",
            *(["--redundant-experts", str(par.eplb.num_redundant_experts), "--routed-experts",
               str(profile.routed_experts)] if par.expert and par.eplb.enabled and par.eplb.num_redundant_experts
              and profile.routed_experts else [])]


def model_mount(config: StackConfig, model_dir: str | None = None) -> str:
    """The node's model directory, read-only at the path the argv names, where it holds a config.json: vLLM's
    create_engine_config reads it in the dry run (no weights). A shell test on the node, so a node without it
    runs the dry run without (the verdict says the engine config was not built); a path with characters a
    shell would split is not mounted."""
    host, inside = model_dir or config.model.host_path, config.model.container_path
    if not all(re.fullmatch(r"[A-Za-z0-9._/@+-]+", p) for p in (host, inside)):
        return ""
    return (f"$(test -f {host}/config.json && echo --mount type=bind,src={host},dst={inside},readonly) ")


def dry_run_command(config: StackConfig, plan: Plan, check: CheckSpec, model_dir: str | None = None) -> str:
    """`docker run --rm -i --network none --pull never --entrypoint python3 <new image> - …`: no GPU, no network,
    the node's own non-secret env, and the node's `vllm serve` argv after `--`."""
    node = plan.node(str(check.node))
    spec = node.containers[0]
    image = config.image.pull_ref
    env = [part for key, value in spec.env.items() for part in ("-e", f"{key}={value}")]  # plain env only
    # Without a GPU vLLM cannot even build its parser ("Failed to infer device type"); the CPU platform
    # builds the same serve parser. Seen with vLLM 0.33.0 (bench/dry_run_real_vllm.py).
    env += ["-e", "VLLM_TARGET_DEVICE=cpu"]
    prefix = shlex.join(["docker", "run", "--rm", "-i", "--network", "none", "--pull", "never",
                         "--entrypoint", "python3", *env]) + f" {model_mount(config, model_dir)}{shlex.quote(image)} "
    args = ["--name", check.name, "--image", image]
    if spec.vllm_args is not None:
        args.append("--engine-config")
    if spec.vllm_args is None:
        args += ["--import-only", "vllm,ray"]
    else:
        argv = spec.vllm_args
        args += [part for key, value in expected_fields(argv).items() for part in ("--expect", f"{key}={value}")]
        # external load balancing: every other rank server of the node, in the same process (one vLLM import)
        more = [c for c in node.containers[1:] if c.vllm_args is not None]
        if more:
            args += ["--server", spec.name]
        for other in more:
            assert other.vllm_args is not None
            args += ["--more-argv", json.dumps({"name": other.name, "argv": other.vllm_args,
                                                "expect": expected_fields(other.vllm_args)},
                                               separators=(",", ":"), ensure_ascii=False)]
        args += ["--", *argv]
    timeout = DRY_RUN_TIMEOUT_S + DRY_RUN_PER_SERVER_S * (len(node.containers) - 1)
    return heredoc_command("vllm_args", args, prefix=prefix, timeout_s=timeout, interpreter="")


def page_cache_command(config: StackConfig, plan: Plan, check: CheckSpec, model_dir: str | None = None) -> str:
    """`page-cache-<node>` on the node's python3 (the page cache is the host's): this node's shards, with the EP
    weight filter only its ranks' experts, bounded by MemAvailable less the running engine's pinned memory (its
    containers by name). Its timeout: twice the engine-ready timeout plus ten minutes, the time a cold load may
    take (not the load-rate estimate: re-estimating it must not read the weights again)."""
    node = next(n for n in config.nodes if n.name == check.node)
    topo, _ = derive_topology(config)
    profile = get_profile(config.model.profile)
    args = ["--name", check.name, "--model-dir", model_dir or config.model.host_path]
    node_topo = next(n for n in topo.nodes if n.name == node.name)
    experts = warm_experts(config, profile, node_topo) if profile is not None else None
    if experts:
        args += ["--experts", experts]
    for container in plan.node(node.name).containers:
        args += ["--engine", container.name]
    prefix = "" if node.ssh.user == "root" else "sudo -n "
    return heredoc_command("page_cache", args, prefix=prefix,
                           timeout_s=2 * config.serving.engine_ready_timeout_s + 600)


def expected_fields(argv: list[str]) -> dict[str, str]:
    """The parsed fields a dry run compares with the plan (EXPECTED_FIELDS present in `argv`)."""
    return {dest: argv[argv.index(flag) + 1] for flag, dest in EXPECTED_FIELDS.items()
            if flag in argv and argv.index(flag) + 1 < len(argv)}


def ray_ready_command(config: StackConfig, plan: Plan) -> str:
    container = plan.head.containers[0].name
    args = ["--name", "ray-cluster", "--address", "auto", "--nodes", str(len(plan.nodes)),
            "--gpus", str(plan.topology["gpus_used"]), "--wait-s", str(config.ray.cluster_ready_timeout_s),
            "--interval-s", "10"]
    return heredoc_command("ray_cluster", args, prefix=f"docker exec -i {shlex.quote(container)} ",
                           timeout_s=config.ray.cluster_ready_timeout_s + 120)


def nccl_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    container = plan.node(str(check.node)).containers[0].name
    transport = "ib" if config.fabric.transport == "ib" else "roce"
    rehearsal = ["--rehearsal"] if config.rehearsal else []  # no engine runs NCCL: the check prints NOT RUN
    return heredoc_command("nccl_transport", ["--name", check.name, "--container", container,
                                              "--transport", transport, *rehearsal], timeout_s=EVIDENCE_TIMEOUT_S)


def engines_command(plan: Plan, check: CheckSpec) -> str:
    node = plan.node(str(check.node))
    args = ["--name", check.name, *(part for c in node.containers for part in ("--container", c.name)),
            "--ranks", ",".join(map(str, node.dp_ranks))]
    if "workers" in check.sections:  # a replica spans nodes: this node's own workers are evidence too
        args += ["--workers", str(node.gpus_used)]
    if plan.rehearsal is not None:  # no vLLM engine loads onto a GPU: the check prints NOT RUN
        args.append("--rehearsal")
    return heredoc_command("engines", args, timeout_s=EVIDENCE_TIMEOUT_S)


def health_deadline_s(config: StackConfig) -> int:
    return config.api.health_timeout_s or config.serving.engine_ready_timeout_s + 600


def api_command(config: StackConfig, plan: Plan, sections: list[str], name: str, *, group_direct: bool = False,
                pin_ranks: bool = True) -> str:
    """Runs on the deployer, through `plan.endpoint` (the proxy when it is on: `X-data-parallel-rank` passes through
    nginx unchanged). The key arrives in VLLM_API_KEY (with the proxy: the check client's key) and the proxy's
    certificate in VLLM_TLS_CA, both through the command's environment. The golden set, thinking and streaming run
    once per DP rank (`--dp-size`, `--rank-nodes` from the plan); with one rank (Ray, DP 1) nothing is pinned.

    With vLLM on loopback and no proxy (`stacks.planner.plan.api_on_head`) nothing off the head reaches the port: the
    same check then runs on the head, inside the engine container (`docker exec -i <container> python3 -`, the
    script as a heredoc; the image has httpx and pydantic), against the bind address. The key is the
    container's own VLLM_API_KEY, so it never travels; the outer `timeout` covers the health deadline.

    `group_direct`: a replica group's own check (stacks/planner/groups.py), on its head in its engine container
    against its own vLLM, never through the front door (which sends requests to the other groups while this one
    is drained). `pin_ranks=False`: no DP rank pinned (through a front door spread over several groups, a rank
    header would reach whichever group nginx picked)."""
    dp_size, rank_nodes = endpoint_rank_nodes([(n.name, n.dp_ranks, n.role) for n in plan.nodes],
                                              plan.topology.get("load_balancing", "internal"))
    if not pin_ranks:
        dp_size, rank_nodes = 1, []
    direct = f"http://{bracket_host(local_api_host(config))}:{config.serving.port}"
    args = ["--name", name, "--url", direct if group_direct else plan.endpoint,
            "--served-name", config.model.served_name, "--sections", ",".join(sections),
            "--deadline-s", str(health_deadline_s(config)), "--interval-s", str(config.api.progress_interval_s),
            "--timeout-s", str(config.api.request_timeout_s), "--dp-size", str(dp_size)]
    if rank_nodes:
        args += ["--rank-nodes", ",".join(rank_nodes)]
    args += ["--golden-json", golden_json(config.api.smoke.golden), *thinking_args(config, sections)]
    if plan.proxy is not None and plan.proxy.tls and not group_direct:
        args += ["--ca-env", TLS_CA_ENV]
    if "deny" in sections and plan.proxy is not None and not group_direct:
        args += ["--deny-paths", ",".join(plan.proxy.denied_paths)]
    if group_direct or api_on_head(config):
        container = plan.head.containers[0].name
        # a few requests per section, per rank and golden pair, each within --timeout-s
        requests = (1 + 3 * len(sections)) * max(1, dp_size) * len(config.api.smoke.golden) + 2
        budget = (health_deadline_s(config) if "health" in sections else 0) + \
            requests * config.api.request_timeout_s + 120
        return heredoc_command("api", args, prefix=f"docker exec -i {shlex.quote(container)} ", timeout_s=budget)
    return shlex.join([API_PYTHON, "-m", "checks.api", *args])


def node_api_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    """`api-node-<node>` (hybrid load balancing): the node's own API server, from inside its engine container
    over SSH, as `api_on_head` runs the head's. Its ranks are pinned with node-local headers (`--first-rank` =
    the node's start rank, `--dp-size` = its local ranks); the key is the container's own VLLM_API_KEY.
    `api-server-rank-<r>` (external load balancing): the same for one DP rank's own server, in its container."""
    topo, _ = derive_topology(config)
    node = plan.node(str(check.node))
    node_topo = next(n for n in topo.nodes if n.name == node.name)
    rank = server_rank(check)
    if rank is not None:
        # `api-server-rank-<r>` (external load balancing): rank r's own server, in its own container; it holds
        # one engine, so no rank header (vLLM's range there is [0, 1): vllm/v1/engine/input_processor.py:392-400)
        port, container, ranks = rank_port(config, node_topo, rank), rank_name(config, rank), [rank]
        pin = ["--dp-size", "1"]
    else:
        port, container, ranks = config.serving.port, node.containers[0].name, node.dp_ranks
        pin = ["--dp-size", str(len(ranks)), "--first-rank", str(ranks[0]), "--rank-nodes",
               ",".join([node.name] * len(ranks))]
    url = f"http://{host_port(node_api_host(config, node_topo), port)}"
    args = ["--name", check.name, "--url", url, "--served-name", config.model.served_name,
            "--sections", ",".join(check.sections), "--deadline-s", str(health_deadline_s(config)),
            "--interval-s", str(config.api.progress_interval_s), "--timeout-s", str(config.api.request_timeout_s),
            *pin, "--golden-json", golden_json(config.api.smoke.golden), *thinking_args(config, check.sections)]
    requests = (1 + 3 * len(check.sections)) * len(ranks) * len(config.api.smoke.golden) + 2
    budget = health_deadline_s(config) + requests * config.api.request_timeout_s + 120
    return heredoc_command("api", args, prefix=f"docker exec -i {shlex.quote(container)} ", timeout_s=budget)


SERVER_CHECK = "api-server-rank-"
"""The name of the check of one DP rank's own server (external load balancing), before its rank."""


def server_rank(check: CheckSpec) -> int | None:
    """The DP rank of an `api-server-rank-<r>` check; None for any other."""
    tail = check.name.removeprefix(SERVER_CHECK)
    return int(tail) if check.name.startswith(SERVER_CHECK) and tail.isdigit() else None


# ---- weights, collective: the commands between the image pull and the engines -------------------------------


def weights_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    """`weights-<node>`: with `model.source` the sync, in the stack's image (`--pull never`: `RemoteImage` pulled it;
    boto3 ships in vllm/vllm-openai), credentials on the command's stdin; without one the completeness check on
    the node's own python3 (as every host preflight), before the image pull. Both print the JSON verdict whose
    hash `checks.weights_node.weights_hash` reads."""
    source = config.model.source
    dest = config.model.host_path
    if "sync" in check.sections:
        assert source is not None
        return node_sync_command(source.url, dest, config.image.pull_ref, endpoint_url=source.endpoint_url,
                                 region=source.region, workers=source.workers, part_size_mb=source.part_size_mb,
                                 delete=source.delete, name=check.name, timeout_s=source.timeout_s, pull="never",
                                 versions=True)
    return node_verify_command(dest, image=None, name=check.name)


def weights_prune_command(config: StackConfig, node_name: str, keep: str) -> str:
    """`weights-prune-<node>`: old version directories beside the model directory removed once the group that mounts
    `keep` passed its checks; never one a container on the node mounts (checks/weights_versions.py)."""
    source = config.model.source
    assert source is not None
    node = next(n for n in config.nodes if n.name == node_name)
    return node_prune_command(config.model.host_path, keep, source.keep_versions, sudo=node.ssh.user != "root",
                              name=f"weights-prune-{node_name}")


def weights_match_command(hashes: dict[str, str | None], name: str = "weights-match") -> str:
    """The deployer-side comparison of every node's weights hash (`checks.weights_match`); no secret in it."""
    pairs = [f"{node}={value or ''}" for node, value in hashes.items()]
    return shlex.join([API_PYTHON, "-m", "checks.weights_match", "--name", name, *pairs])


COLLECTIVE_STOP_S = 30
"""`docker stop --time`: the engine is about to be replaced anyway (delete_before_replace)."""


def collective_command(config: StackConfig, plan: Plan, check: CheckSpec,
                       runs: Sequence[CollectiveRun] | None = None) -> str:
    """`collective-<node>`: an engine guard, then the all-reduce in the stack's image with the node's fabric env
    (`components/collective_check.py`).

    The command text holds the image, the node's fabric env and the check's arguments, nothing else (not the
    group's generation), so pulumi-command runs it again only when one of those changes. The guard then looks at
    this stack's engine on the node (`container.name`, `vllm-cluster.stack=<stack>`): when it runs another image
    or other fabric values, this update replaces the group (both are in its generation), so it is stopped here and
    the downtime starts; when it runs this image with these values, only the floor, port or sizes changed, the
    group stays, and the check is skipped rather than stop a group nothing would restart. A container of that
    name without this stack's label is left alone (the check then refuses: its GPUs are in use).

    `runs`: `collective_runs` with the stack's floor and port, when the caller built them already (the program
    builds every node's command from one list; rebuilding it for each node made the program quadratic)."""
    if runs is None:
        floor, _ = min_busbw_gbps(config)
        runs = collective_runs(config, plan, min_busbw_gbps=floor, master_port=config.fabric.collective_port)
    run = next(r for r in runs if r.node == check.node)
    specs = plan.node(run.node).containers
    name, q, image = check.name, shlex.quote, config.image.pull_ref
    state_fmt = f'{{{{index .Config.Labels "{LABEL_PREFIX}.stack"}}}} {{{{.State.Running}}}} {{{{.Image}}}}'
    env_fmt = "{{range .Config.Env}}{{println .}}{{end}}"

    def guard_one(container: str, pause: str, env: dict[str, str]) -> list[str]:
        pairs = " ".join(q(f"{key}={value}") for key, value in env.items())
        skip = (f"SKIP {name}: engine {container} of this stack already runs {image} with this node's fabric env, "
                "so this update does not replace it and its GPUs are not free; the fabric is measured at the next "
                "image or fabric change, or by hand in a maintenance window (docs/checks-by-hand.md: Collective "
                "check)")
        stopping = (f"{name}: stopping this stack's engine {container} (this update replaces the group after the "
                    "collective check): the downtime starts here")
        failed = f"FAIL {name}: docker stop {container} failed; nothing else was touched"
        return [
            f"state=$(docker container inspect --format {q(state_fmt)} {q(container)} 2>/dev/null) || state=",
            'case "$state" in',
            f"  {q(plan.stack + ' true ')}*)",
            f"    new=$(docker image inspect --format {q('{{.Id}}')} {q(image)} 2>/dev/null) || new=",
            f"    env=$(docker container inspect --format {q(env_fmt)} {q(container)} 2>/dev/null) || env=",
            "    same=yes",
            '    [ -n "$new" ] && [ "${state##* }" = "$new" ] || same=no',
            f"    for kv in {pairs}; do",
            """      printf '%s\\n' "$env" | grep -qxF -e "$kv" || same=no""",
            "    done",
            f'    if [ "$same" = yes ]; then echo {q(skip)}; exit 0; fi',
            f"    echo {q(stopping)} >&2",
            f"    docker stop --time {COLLECTIVE_STOP_S} {q(container)} >/dev/null || {{ echo {q(failed)}; exit 1; }}",
            f"    {pause} ;;",
            "esac",
        ]

    if len(specs) == 1:
        guard = "\n".join([*guard_one(specs[0].name, "sleep 5", run.env), ""])
    else:  # external load balancing: every rank's container holds some of the node's GPUs, each its own share
        lines = ["stopped="]
        for spec in specs:
            env = dict(run.env)
            if "CUDA_VISIBLE_DEVICES" in env:
                env["CUDA_VISIBLE_DEVICES"] = spec.env.get("CUDA_VISIBLE_DEVICES", "")
            lines += guard_one(spec.name, "stopped=yes", env)
        guard = "\n".join([*lines, '[ -z "$stopped" ] || sleep 5', ""])
    return guard + heredoc_command("collective", run.args, prefix=run.prefix, interpreter="",
                                   timeout_s=COLLECTIVE_TIMEOUT_S)
