"""DeepEP hosts in the plan and the program: which backends need the host check, the NVSHMEM variables each node
gets, the managed names, and (under Pulumi's mocks) the host check before every image pull. The backend comes from
`stacks.planner.deepep.configured_backend`, the one place the program reads it; the tests set it there."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest

from checks.deepep_host import outer_timeout_s
from components.collective_check import collective_runs
from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner import deepep
from stacks.planner.fabric import node_env
from stacks.planner.plan import build_plan, node_checks
from tests.conftest import ROOT
from tests.pulumi_harness import dependency_edges, run_program, waits_for

FLAGS = ROOT / "tests" / "fixtures" / "vllm-0.33.0-serve-flags.json"


def vllm_backends() -> list[str]:
    """`--all2all-backend`'s choices in the real vLLM 0.33.0 parser (the committed capture)."""
    flags = json.loads(FLAGS.read_text())["flags"]
    return list(next(f for f in flags if "--all2all-backend" in f.get("options", []))["choices"])


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(deepep, "configured_backend", lambda config: "deepep_low_latency")
    yield "deepep_low_latency"


def test_which_backends_need_the_hosts() -> None:
    names = vllm_backends()
    assert set(deepep.NVSHMEM_BACKENDS) <= set(names)
    needing = [b for b in names if deepep.needs_nvshmem(b)]
    assert needing == ["deepep_high_throughput", "deepep_low_latency"]
    for name in names:
        needs = deepep.deepep_host_requirements(name)
        assert (needs is not None) == (name in needing)
        assert deepep.deepep_host_requirements(name, spans_nodes=False) is None  # NVLink only on one node
    assert deepep.deepep_host_requirements(None) is None
    needs = deepep.deepep_host_requirements("deepep_high_throughput")
    assert needs is not None and needs.sections == ("ibgda", "peermem", "reach")


def test_configured_backend_is_none_without_the_key() -> None:
    config = parse_config("prod", read_stack_values("prod"))
    assert deepep.configured_backend(config) is None


def test_nvshmem_env_per_node_from_the_fabric() -> None:
    prod = parse_config("prod", read_stack_values("prod"))
    h20 = parse_config("h20", read_stack_values("h20"))
    assert deepep.nvshmem_env(prod.nodes[0], prod.fabric, "deepep_low_latency") == {
        "NVSHMEM_ENABLE_NIC_PE_MAPPING": "1", "NVSHMEM_HCA_LIST": "mlx5_0:1,mlx5_2:1",
        "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "ens11np0"}  # prod: control plane on the first data NIC, no GID index
    assert deepep.nvshmem_env(h20.nodes[1], h20.fabric, "deepep_high_throughput") == {
        "NVSHMEM_ENABLE_NIC_PE_MAPPING": "1", "NVSHMEM_HCA_LIST": "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
        "NVSHMEM_IB_GID_INDEX": "3", "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "bond0"}  # h20: management control plane
    for other in ("allgather_reducescatter", "deepep_v2", "nixl_ep", None):
        assert deepep.nvshmem_env(prod.nodes[0], prod.fabric, other) == {}
    socket = prod.fabric.model_copy(update={"transport": "socket"})
    assert deepep.nvshmem_env(prod.nodes[0], socket, "deepep_low_latency") == {}


def test_enabled_plan_checks_hosts_before_the_pull_and_renders_nvshmem(backend: str) -> None:
    config = parse_config("prod", read_stack_values("prod"))
    plan = build_plan("prod", config)
    names = [c.name for c in plan.checks]
    for node in ("node1", "node2"):
        host = next(c for c in plan.checks if c.name == f"deepep-host-{node}")
        assert host.module == "checks.deepep_host" and host.sections == ["ibgda", "peermem", "reach"]
        assert names.index(f"deepep-host-{node}") < names.index(f"pre-pull-{node}")
        assert host.proves.startswith("deepep_low_latency: ")
        env = plan.node(node).containers[0].env
        assert env["NVSHMEM_HCA_LIST"] == "mlx5_0:1,mlx5_2:1" and env["NVSHMEM_ENABLE_NIC_PE_MAPPING"] == "1"
    assert plan.summary.checks_by_kind["deepep-host"] == 2
    for run in collective_runs(config, plan):  # the collective check runs with the engine's fabric env
        assert run.env["NVSHMEM_HCA_LIST"] == "mlx5_0:1,mlx5_2:1"
    assert deepep.reach_targets(config, config.nodes[0]) == (
        ["ens11np0=1.1.1.2", "ens13np0=1.1.2.2"], ["node2:ens11np0=1.1.1.1", "node2:ens13np0=1.1.2.1"])


def test_disabled_plan_has_no_host_check_and_no_nvshmem() -> None:
    config = parse_config("prod", read_stack_values("prod"))
    plan = build_plan("prod", config)
    assert not [c for c in plan.checks if c.module == "checks.deepep_host"]
    assert not [k for n in plan.nodes for c in n.containers for k in c.env if k.startswith("NVSHMEM_")]
    assert not [k for k in node_env(config, config.nodes[0]) if k.startswith("NVSHMEM_")]


def test_one_node_needs_no_host_check(backend: str) -> None:
    values = read_stack_values("prod")
    values["nodes"] = values["nodes"][:1]
    checks = node_checks(parse_config("prod", values))
    assert [c.name for c in checks] == ["weights-node1", "pre-pull-node1", "preflight-node1", "fabric-node1"]
    values["nodes"] = read_stack_values("prod")["nodes"]
    assert "deepep-host-node1" in [c.name for c in node_checks(parse_config("prod", values))]


@pytest.mark.parametrize("where", ["fabric", "container"])
def test_nvshmem_names_cannot_be_set_by_hand(where: str) -> None:
    values = read_stack_values("prod")
    values[where] = {**values.get(where, {}), "env": {"NVSHMEM_HCA_LIST": "mlx5_1:1"}}
    with pytest.raises(ConfigError) as caught:
        build_plan("prod", parse_config("prod", values))
    report = caught.value.report()
    assert f"{where}.env.NVSHMEM_HCA_LIST" in report and "nodes[].hcas, with a DeepEP all-to-all backend" in report


def test_program_runs_the_host_check_before_every_image_pull(backend: str) -> None:
    run = run_program("prod")
    assert run.error is None, run.error
    for name, node in run.result["nodes"].items():
        host = node.host_check
        assert host is not None
        assert waits_for(run, node.image, host) and waits_for(run, host, node.weights)
        assert not waits_for(run, host, node.image)
        create = run.mocks.named(f"{name}-deepep-host").inputs["create"]
        assert create.startswith(f"timeout {outer_timeout_s(4)} python3 - --name deepep-host-{name} "
                                 "--sections ibgda,peermem,reach --local ")
        assert "def check_ibgda(" in create  # the script itself travels in the heredoc
    assert "--local ens11np0=1.1.1.2,ens13np0=1.1.2.2 --peers node2:ens11np0=1.1.1.1,node2:ens13np0=1.1.2.1 <<" in \
        run.mocks.named("node1-deepep-host").inputs["create"]


def test_program_without_the_backend_registers_no_host_check() -> None:
    run = run_program("prod")
    assert all(node.host_check is None for node in run.result["nodes"].values())
    assert not [name for name in run.all_options if name.endswith("-deepep-host")]


def test_host_check_edges_stay_linear(backend: str) -> None:
    from bench.plan_scale import scaled

    per_node = {}
    for nodes in (8, 32):
        run = run_program("prod", scaled(nodes))
        assert run.error is None, run.error
        assert len([n for n in run.all_options if n.endswith("-deepep-host")]) == nodes
        per_node[nodes] = dependency_edges(run) / nodes
    assert per_node[32] <= per_node[8] * 1.1, per_node


def test_nic_handler_reaches_the_check_and_a_wrong_one_is_refused(backend: str) -> None:
    from components.check_commands import deepep_host_command

    values = read_stack_values("prod")
    values["fabric"] = {**values.get("fabric", {}), "env": {"NVSHMEM_IBGDA_NIC_HANDLER": "cpu"}}
    config = parse_config("prod", values)
    plan = build_plan("prod", config)
    check = next(c for c in plan.checks if c.name == "deepep-host-node2")
    assert "--sections ibgda,peermem,reach --nic-handler cpu --local" in deepep_host_command(config, plan, check)
    values["fabric"]["env"] = {"NVSHMEM_IBGDA_NIC_HANDLER": "GPU"}
    with pytest.raises(ConfigError) as caught:
        build_plan("prod", parse_config("prod", values))
    assert "fabric.env.NVSHMEM_IBGDA_NIC_HANDLER" in caught.value.report() and "gpu (needs" in caught.value.report()


def test_host_check_arguments_at_128_nodes_of_8_nics(backend: str) -> None:
    """Every peer NIC of 127 nodes in one argument would be ~30 000 characters, over the check's per-argument cap
    (checks.verdict.MAX_ARG_CHARS): one --peers per node keeps each short. The command is one argument of the
    remote shell, so it must also stay under Linux's 128 KiB per-argument limit (MAX_ARG_STRLEN)."""
    from bench.plan_scale import scaled
    from checks.deepep_host import argument_problem, build_parser
    from checks.verdict import MAX_ARG_CHARS
    from components.check_commands import deepep_host_command

    values = scaled(128)
    for i, node in enumerate(values["nodes"]):
        node["nics"] = [f"ens{10 + k}np0" for k in range(8)]
        node["hcas"] = [f"mlx5_{k}:1" for k in range(8)]
        node["data_ips"] = [f"10.{100 + k}.{i // 250}.{i % 250 + 1}" for k in range(8)]
    values["fabric"]["private_networks"] = [f"10.{100 + k}.0.0/16" for k in range(8)] + ["10.30.0.0/16"]
    values["fabric"].pop("public_private_networks", None)
    config = parse_config("prod", values)
    plan = build_plan("prod", config)
    check = next(c for c in plan.checks if c.name == "deepep-host-node5")
    command = deepep_host_command(config, plan, check)
    assert len(command.encode()) < 128 * 1024
    argv = shlex.split(command.split(" <<", 1)[0])
    args = argv[argv.index("-") + 1:]
    assert args.count("--peers") == 127 and max(len(a) for a in args) <= MAX_ARG_CHARS
    parsed = build_parser().parse_args(args)
    assert (len(parsed.local), len(parsed.peers)) == (8, 127 * 8)
    assert "10.100.0.5" not in {nic.ip for nic in parsed.peers} and "10.107.0.128" in {nic.ip for nic in parsed.peers}
    problem = argument_problem(parsed)  # addresses, families and duration pass; only the NICs are not on this host
    assert problem is not None and problem.startswith("--local: ens10np0=10.100.0.5: no interface ens10np0")
