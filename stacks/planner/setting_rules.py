"""Settings that do nothing, contradict each other or break a check: refused (a `Problem` with the key, the
value and the fix) or warned, each with the reason. Called from `validation.validate`."""

from __future__ import annotations

import re

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.planner.gpus import expected_memory_gb, memory_fits
from stacks.planner.observability import supervisor_host, watch_host
from stacks.planner.topology import NodeTopology, Topology

NUMACTL_CPUSET = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
"""numactl's CPU list syntax as vLLM 0.33.0 checks it (vllm/config/parallel.py:35)."""
NCCL_LOG_SUBSYS = ("INIT", "NET")
"""NCCL_DEBUG_SUBSYS groups that print the lines `checks.nccl_transport` reads (`NET/IB : Using …`, `via NET/IB/…`,
`GPU Direct RDMA …`); NCCL's default (INIT,BOOTSTRAP,ENV) prints them."""


def gpu_rules(config: StackConfig) -> tuple[list[Problem], list[str]]:
    """memory_gb against the model's known memory (stacks/planner/gpus.py); unknown models are warned once."""
    problems: list[Problem] = []
    unknown: list[str] = []
    for i, node in enumerate(config.nodes):
        known = expected_memory_gb(node.gpus.model)
        if known is None:
            unknown.append(node.gpus.model)
            continue
        gpu, allowed = known
        if not memory_fits(node.gpus.memory_gb, allowed):
            sizes = " or ".join(f"{s:g}" for s in allowed)
            problems.append(Problem(
                f"nodes.{i}.gpus.memory_gb", node.gpus.memory_gb,
                f"contradicts nodes.{i}.gpus.model {node.gpus.model!r}: an {gpu.family} has {sizes} GB per GPU "
                f"({gpu.source}); the plan sizes every shard and the KV cache from memory_gb",
                fix=f"memory_gb: {allowed[0]:g}, or the model name nvidia-smi prints for these GPUs"))
    # A rehearsal's GPUs are pretended and its preflight asks no nvidia-smi (docs/rehearsal.md): nothing to warn of.
    warnings = [] if config.rehearsal else [
        f"GPU model {model!r} is not in the table of known GPUs (stacks/planner/gpus.py): its memory_gb was not "
        "checked against the model; the preflight compares it with nvidia-smi" for model in dict.fromkeys(unknown)]
    return problems, warnings


def backend_rules(config: StackConfig, topo: Topology) -> list[str]:
    """Keys one backend reads and the other ignores, set where they do nothing."""
    par, warnings = config.parallelism, []
    if par.backend == "mp" and config.ray.model_fields_set:
        keys = ", ".join(f"ray.{k}" for k in sorted(config.ray.model_fields_set))
        warnings.append(f"{keys} set, but parallelism.backend is mp: no Ray runs, the setting does nothing "
                        "(remove it, or set backend: ray)")
    if "data_parallel_rpc_port" in par.model_fields_set and not (par.backend == "mp" and par.data > 1):
        warnings.append(f"parallelism.data_parallel_rpc_port {par.data_parallel_rpc_port} set, but only vLLM's "
                        "internal DP (backend mp, data > 1) opens it: the setting does nothing")
    if "master_port" in par.model_fields_set and not topo.spans_nodes:
        warnings.append(f"parallelism.master_port {par.master_port} set, but no replica spans nodes here: "
                        "--master-port is not passed, the setting does nothing")
    return warnings


def nccl_log_rules(config: StackConfig, topo: Topology) -> tuple[list[Problem], list[str]]:
    """What would hide NCCL's network lines from the transport check (`checks.nccl_transport` reads
    `docker logs`)."""
    fabric = config.fabric
    if len(topo.nodes) < 2 or fabric.transport == "socket":
        return [], []
    problems: list[Problem] = []
    warnings: list[str] = []
    if fabric.nccl_debug != "INFO":  # the plan warns already (stacks/planner/plan.py) and drops the check
        return problems, warnings
    if "NCCL_DEBUG_FILE" in fabric.env:
        problems.append(Problem("fabric.env.NCCL_DEBUG_FILE", fabric.env["NCCL_DEBUG_FILE"],
                                "sends NCCL's log to a file inside the container, so `docker logs` (what the NCCL "
                                "transport check reads) holds none of its lines and the check cannot pass",
                                fix="remove NCCL_DEBUG_FILE from fabric.env"))
    subsys = fabric.env.get("NCCL_DEBUG_SUBSYS")
    if subsys is not None:
        words = [w.strip().upper() for w in subsys.split(",") if w.strip()]
        excluded = words[:1] and words[0].startswith("^")
        names = {w.lstrip("^") for w in words}
        hidden = ([s for s in NCCL_LOG_SUBSYS if s in names] if excluded
                  else [] if "ALL" in names else [s for s in NCCL_LOG_SUBSYS if s not in names])
        if hidden:
            problems.append(Problem("fabric.env.NCCL_DEBUG_SUBSYS", subsys,
                                    f"hides NCCL's {','.join(hidden)} lines, which the NCCL transport check reads "
                                    "(the network NCCL chose and GPU Direct RDMA)",
                                    fix="remove it, or include INIT,NET (e.g. INIT,NET,ENV)"))
    return problems, warnings


def timeout_rules(config: StackConfig, load_s: int | None) -> list[Problem]:
    """api.health_timeout_s below the plan's own load estimate: the health check gives up while the engines
    still load, and every deploy fails."""
    health = config.api.health_timeout_s
    if health is None or load_s is None or health >= load_s:
        return []
    return [Problem("api.health_timeout_s", health,
                    f"is below the plan's estimated weight-load time of {load_s}s (model.load_gb_per_s "
                    f"{config.model.load_gb_per_s:g}): the health check would fail while the engines still load",
                    fix=f"api.health_timeout_s: {load_s + 600} or more, leave it unset (engine timeout + 600), or "
                        "raise model.load_gb_per_s if these nodes load faster")]


def endpoint_name_rules(config: StackConfig) -> list[Problem]:
    """A wildcard server_name is a pattern, not a host: without api.public_host it would become the checks' URL."""
    proxy = config.api.proxy
    if proxy.enabled and proxy.server_name and proxy.server_name.startswith("*.") and not config.api.public_host:
        return [Problem("api.proxy.server_name", proxy.server_name,
                        "is a wildcard pattern, and without api.public_host it would be the host of the endpoint "
                        f"the API checks call (https://{proxy.server_name}:{proxy.port}), which no resolver answers",
                        fix=f"set api.public_host to the name clients use, e.g. {proxy.server_name[2:]} or "
                            f"llm.{proxy.server_name[2:]}")]
    return []


def monitoring_port_rules(config: StackConfig) -> list[Problem]:
    """A monitoring port that is a node's SSH port: the exporter would take sshd's port (or fail to start), and the
    deploy reaches every node over SSH."""
    obs = config.observability
    if not obs.enabled:
        return []
    problems = []
    for field, port in obs.ports.model_dump().items():
        nodes = [n.name for n in config.nodes if n.ssh.port == port]
        if nodes:
            problems.append(Problem(f"observability.ports.{field}", port,
                                    f"is the SSH port of {', '.join(nodes)}: the deploy and the checks reach the "
                                    "nodes over SSH", fix="another port, e.g. the default"))
    host = supervisor_host(config)
    if obs.ports.supervisor == obs.ports.watch and host == watch_host(config) and host not in [
            n.management_ip for n in config.nodes]:  # on a node, the listener table names the clash
        problems.append(Problem("observability.ports.supervisor", obs.ports.supervisor,
                                f"is also observability.ports.watch, and the group supervisor and the watch unit "
                                f"both listen on {host}: the one started second fails to bind (Address already in "
                                "use)", fix=f"another port, e.g. {type(obs.ports).model_fields['supervisor'].default}"
                                f" (the default), or observability.supervisor_address another host"))
    return problems


def numa_rules(config: StackConfig, topo: Topology) -> tuple[list[Problem], list[str]]:
    """`--numa-bind-nodes` / `--numa-bind-cpus` in `serving.extra_args`, decided without the image: vLLM 0.33.0
    refuses them without `--numa-bind` (vllm/config/parallel.py:556-561), and a worker whose GPU index is past
    the end of either list fails at start-up, after the weights are fetched (vllm/utils/numa_utils.py:238-242,
    314-318: "Ensure the binding lists cover every visible GPU"). The index counts the GPUs its container sees
    (its CUDA_VISIBLE_DEVICES): all the node's used GPUs, or with external load balancing one DP rank's TP x PP
    (`_numa_containers`), and every container reads the same list."""
    from stacks.planner.managed_options import table_for  # managed reads the image card; the rules above need none
    from stacks.planner.serve_options import last_values, read_argv

    values = last_values(read_argv(list(config.serving.extra_args), table_for(config)[0]))
    problems: list[Problem] = []
    warnings: list[str] = []
    lists = {dest: values[dest] for dest in ("numa_bind_nodes", "numa_bind_cpus") if values.get(dest)}
    if lists and "numa_bind" not in values:
        flags = " and ".join("--" + d.replace("_", "-") for d in lists)
        problems.append(Problem("serving.extra_args", " ".join(config.serving.extra_args),
                                f"{flags} without --numa-bind: vLLM 0.33.0 refuses it (\"numa_bind_nodes and "
                                "numa_bind_cpus require numa_bind=True\", vllm/config/parallel.py:556-561)",
                                fix="add --numa-bind, or drop the binding lists"))
    problems += [Problem("serving.extra_args", f"--{dest.replace('_', '-')} {' '.join(items)}", why,
                         upstream=f"ValueError (engine start-up, when ParallelConfig is built): {said} "
                                  f"(vllm/config/parallel.py:{lines})", fix=fix)
                 for dest, items in lists.items() if (bad := _numa_list_problem(dest, items)) is not None
                 for why, said, lines, fix in [bad]]
    for dest, items in lists.items():
        flag = "--" + dest.replace("_", "-")
        short = next(((node, seen) for node, seen in _numa_containers(topo) if len(items) < seen), None)
        if short is not None:
            node, seen = short
            what = (f"each DP rank's container on node {node.name} (nodes.{node.index}) sees {seen} GPUs (its TP x "
                    f"PP, external load balancing)" if topo.external else
                    f"the engine container on node {node.name} (nodes.{node.index}) sees {seen} GPUs")
            problems.append(Problem(
                "serving.extra_args", f"{flag} {' '.join(items)}",
                f"lists {len(items)} entries and {what}: the worker of GPU {len(items)} fails at start-up "
                f"(\"GPU index {len(items)} exceeds {dest} size {len(items)}\", vllm/utils/numa_utils.py:"
                f"{'238-242' if dest == 'numa_bind_nodes' else '314-318'})",
                fix=f"one entry per GPU the container sees: {seen} entries, in GPU order"))
            continue
        if topo.external:
            refused, warned = _external_numa(flag, items, topo)
            problems += refused
            warnings += warned
            continue
        longest = max(_numa_containers(topo), key=lambda c: c[1], default=None)
        if longest is not None and len(items) > longest[1]:
            warnings.append(f"serving.extra_args {flag}: {len(items)} entries and node {longest[0].name} has "
                            f"{longest[1]} GPUs; vLLM uses the first {longest[1]}")
    return problems, warnings


def _numa_containers(topo: Topology) -> list[tuple[NodeTopology, int]]:
    """(node, the GPUs one engine container there sees) for every node that runs engines: the node's used GPUs
    (CUDA_VISIBLE_DEVICES, launch.engine_env), or with external load balancing one rank's TP x PP
    (launch.rank_gpus). vLLM numbers a worker's GPU `local_rank + dp_local_rank x world_size`
    (vllm/config/parallel.py:842-856), below what the container sees."""
    per_rank = topo.tensor * topo.pipeline
    return [(node, per_rank if topo.external else node.gpus_used) for node in topo.nodes if node.gpus_used]


def _external_numa(flag: str, items: list[str], topo: Topology) -> tuple[list[Problem], list[str]]:
    """External load balancing: every rank's container numbers its own GPUs from 0 (one engine, local DP rank 0:
    vllm/v1/engine/utils.py:1376 with 281, set at vllm/v1/engine/core.py:1478, so GPU index = local rank,
    vllm/config/parallel.py:842-856) and reads the same list. A list written for the whole node binds every rank
    to the first rank's entries; one written per rank binds every rank of a node alike."""
    per_rank = topo.tensor * topo.pipeline
    dest = flag[2:].replace("-", "_")
    for node in topo.nodes:
        ranks = len(node.dp_ranks)
        if ranks < 2:
            continue
        first = items[:per_rank]
        if len(items) >= node.gpus_used:
            for k, rank in enumerate(node.dp_ranks[1:], start=1):
                meant = items[k * per_rank:(k + 1) * per_rank]
                if meant != first:
                    gpus = f"{k * per_rank}-{(k + 1) * per_rank - 1}" if per_rank > 1 else str(k * per_rank)
                    return [Problem(
                        "serving.extra_args", f"{flag} {' '.join(items)}",
                        f"with parallelism.dp_load_balancing: external every DP rank runs in a container of its "
                        f"own that sees only its {per_rank} GPU(s), numbered from 0, and all read this one list: "
                        f"DP rank {rank} on node {node.name} (GPUs {gpus}) would be bound to {' '.join(first)} "
                        f"(entries 0-{per_rank - 1}), not the {' '.join(meant)} this list gives its GPUs. vLLM "
                        f"raises no error; it indexes {dest} by the container's own GPU index "
                        "(vllm/utils/numa_utils.py:226-244 and 322-328, vllm/config/parallel.py:842-856)",
                        fix=f"drop {flag} and keep --numa-bind: vLLM then reads the NUMA node of each container's "
                            "own GPUs (vllm/platforms/cuda.py:847-853); or dp_load_balancing: hybrid (one "
                            "container per node reads the whole list)")], []
            continue
        return [], [f"serving.extra_args {flag} {' '.join(items)}: with parallelism.dp_load_balancing: external "
                    f"each of the {ranks} DP ranks' containers on node {node.name} reads these entries for its own "
                    f"GPUs, so all {ranks} are bound alike; that is right only if their GPUs share those NUMA "
                    f"nodes. Drop {flag} (keep --numa-bind) to let vLLM read each container's GPUs' NUMA nodes"]
    return [], []


def _numa_list_problem(dest: str, items: list[str]) -> tuple[str, str, str, str] | None:
    """(why, vLLM's error, its lines, fix) for a NUMA binding list ParallelConfig's validators refuse, or None
    (a value that is not an int is the option-value check's)."""
    if dest == "numa_bind_nodes":
        if any(re.fullmatch(r"-\d+", node) for node in items):
            return ("lists a negative NUMA node", "numa_bind_nodes must contain non-negative integers.", "484-493",
                    "one NUMA node number (0, 1, …) per GPU, as `nvidia-smi topo -m` shows them")
        return None
    for cpuset in items:
        if not NUMACTL_CPUSET.fullmatch(cpuset):
            return (f"{cpuset!r} is not a numactl CPU list", "numa_bind_cpus entries must use numactl CPU list "
                    "syntax, for example '0-3' or '0,2,4-7'.", "503-510", "one CPU list per GPU, e.g. 0-15 16-31")
        for part in cpuset.split(","):
            start, _, end = part.partition("-")
            if end and int(start) > int(end):
                return (f"{cpuset!r} has a descending range", f"numa_bind_cpus ranges must be ascending, but got "
                        f"'{cpuset}'.", "511-518", f"{end}-{start} instead of {start}-{end}")
    return None
