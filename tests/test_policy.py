"""The policy pack's validators, called on the resources the real program registers under Pulumi's mocks,
with their inputs deserialized the way the policy analyzer deserializes them."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.deserialize import deserialize_properties

from components.policy_facts import TYPE as FACTS_TYPE
from policy.rules import POLICIES, stack_of
from stacks.loader import read_stack_values
from tests.conftest import ROOT
from tests.pulumi_harness import Run, run_program
from tests.test_program_proxy import SECRETS, proxied_values

BY_NAME = {p.name: p for p in POLICIES}
URN_TYPES = {"docker:index/container:Container": "vllm-cluster:index:VllmEngine$docker:index/container:Container",
             "docker:index/remoteImage:RemoteImage": "vllm-cluster:index:GpuNode$docker:index/remoteImage:RemoteImage"}
OPTS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def urn_of(stack: str, typ: str, name: str) -> str:
    return f"urn:pulumi:{stack}::vllm-cluster::{URN_TYPES.get(typ, typ)}::{name}"


def policy_resources(run: Run, stack: str, drop: str | None = None) -> list[PolicyResource]:
    """Every registered resource as the analyzer hands it to a policy: its wire inputs deserialized (a custom
    resource's outputs hold its inputs; PolicyFacts registers its inputs as its outputs)."""
    return [PolicyResource(r.typ, deserialize_properties(copy.deepcopy(r.inputs)), urn_of(stack, r.typ, r.name),
                           r.name, OPTS, None, None, [], {})
            for r in run.mocks.resources if r.typ != drop]


def violations(run: Run, stack: str, config: dict[str, Any] | None = None,
               drop: str | None = None) -> dict[str, list[tuple[str, str]]]:
    """policy name -> [(resource, message)]: resource policies on every registered resource, stack policies once
    over all of them (`drop` leaves a resource type out)."""
    found: dict[str, list[tuple[str, str]]] = {name: [] for name in BY_NAME}
    resources = policy_resources(run, stack, drop)
    names = {r.urn: r.name for r in resources}
    for name, policy in BY_NAME.items():
        if isinstance(policy, StackValidationPolicy):
            policy.validate(StackValidationArgs(resources, config if config is not None else {}),
                            lambda message, urn=None, n=name: found[n].append((names.get(urn or "", "?"), message)))
            continue
        assert isinstance(policy, ResourceValidationPolicy)
        for r in resources:
            args = ResourceValidationArgs(r.resource_type, r.props, r.urn, r.name, OPTS, None,
                                          config if config is not None else {})
            policy.validate(args, lambda message, _urn=None, n=name, rn=r.name: found[n].append((rn, message)))
    return found


def test_levels() -> None:
    assert {n for n, p in BY_NAME.items() if p.enforcement_level == EnforcementLevel.MANDATORY} == {
        "vllm-api-auth-on-non-loopback", "vllm-internal-ports-private", "vllm-gpu-memory-utilization",
        "vllm-engine-ready-timeout", "prod-image-pinned-by-digest"}
    assert BY_NAME["image-pinned-by-digest"].enforcement_level == EnforcementLevel.ADVISORY
    assert stack_of("urn:pulumi:prod::vllm-cluster::docker:index/container:Container::x") == "prod"


def test_committed_prod_passes_everything_but_the_digest_rule() -> None:
    """Seed 000 pins no digest: the advisory and the prod-mandatory digest rules fire, on both node images.
    (The harness sets the api_key secret, as `pulumi config set --secret` would.)"""
    found = violations(run_program("prod"), "prod")
    assert sorted(n for n, v in found.items() if v) == ["image-pinned-by-digest", "prod-image-pinned-by-digest"]
    assert sorted(r for r, _ in found["prod-image-pinned-by-digest"]) == ["node1-image", "node2-image"]


def test_prod_with_key_and_digest_passes_every_policy() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["image"]["digest"] = "sha256:" + "ab" * 32
    found = violations(run_program("prod", values), "prod")
    assert {n: v for n, v in found.items() if v} == {}


def test_h20_is_not_held_to_the_prod_digest_rule() -> None:
    found = violations(run_program("h20"), "h20")
    assert found["prod-image-pinned-by-digest"] == [] and len(found["image-pinned-by-digest"]) == 2
    assert found["vllm-internal-ports-private"] == []  # management and RoCE ranges are declared private
    other = violations(run_program("h20"), "h20", {"stacks": ["h20"]})
    assert len(other["prod-image-pinned-by-digest"]) == 2  # the list of strict stacks is policy config


def test_each_rule_fires_on_the_config_that_breaks_it() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"] |= {"gpu_memory_utilization": 0.97, "engine_ready_timeout_s": 600}
    values["fabric"]["private_networks"] = []  # 1.1.1.0/24 is public space unless the stack declares it
    run = run_program("prod", values, secrets={"ssh_private_key": "k"})  # and no api_key
    found = violations(run, "prod")
    assert any("0.97" in m for _, m in found["vllm-gpu-memory-utilization"])
    assert [(r, m) for r, m in found["vllm-engine-ready-timeout"] if "VLLM_ENGINE_READY_TIMEOUT_S 600 is below the "
            "estimated weight-load time of 2855s" in m] != []
    assert {r for r, _ in found["vllm-engine-ready-timeout"]} == {"engine-node1-deepseek-v41-flash",
                                                                  "engine-node2-deepseek-v41-flash"}
    private = found["vllm-internal-ports-private"]
    assert any("DP coordinator RPC on 1.1.1.2" in m for _, m in private)
    assert any("VLLM_HOST_IP on 1.1.1.1" in m for _, m in private)
    assert [r for r, _ in found["vllm-api-auth-on-non-loopback"]] == ["engine-node1-deepseek-v41-flash"]
    assert "listens on 0.0.0.0 without a key" in found["vllm-api-auth-on-non-loopback"][0][1]


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_the_proxy_satisfies_the_auth_rule_and_binds_loopback(stack: str) -> None:
    found = violations(run_program(stack, proxied_values(stack), secrets=SECRETS), stack)
    assert found["vllm-api-auth-on-non-loopback"] == []
    assert found["vllm-internal-ports-private"] == []
    assert "api-proxy-image" in [r for r, _ in found["image-pinned-by-digest"]]  # nginx:1.27-alpine has no digest


def test_the_facts_come_from_the_policy_facts_component_not_from_labels() -> None:
    """prod's RoCE ranges are public space made private by fabric.private_networks: without PolicyFacts they are
    refused; with it they pass. The estimate is PolicyFacts' too: no container carries either any more."""
    run = run_program("prod")
    facts = [r for r in run.mocks.resources if r.typ == FACTS_TYPE]
    assert [f.inputs for f in facts] == [{"privateNetworks": ["1.1.1.0/24", "1.1.2.0/24", "10.30.8.0/24"],
                                         "estimatedLoadS": 2855}]
    for container in run.mocks.of_type("docker:index/container:Container"):
        labels = {x["label"] for x in container.inputs["labels"]}
        assert labels == {f"vllm-cluster.{k}" for k in ("stack", "node", "role", "topology", "generation")}
    assert violations(run, "prod")["vllm-internal-ports-private"] == []
    blind = violations(run, "prod", drop=FACTS_TYPE)["vllm-internal-ports-private"]
    assert blind and all("no vllm-cluster:index:PolicyFacts resource" in m for _, m in blind)
    assert {r for r, _ in blind} == {"engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"}


def test_a_facts_change_touches_the_facts_only() -> None:
    """A new CIDR and another load rate change what the policy reads and nothing the engines run (preflights,
    whose triggers digest the model and fabric sections, re-run: checks only)."""
    base = run_program("prod")
    values = copy.deepcopy(read_stack_values("prod"))
    values["fabric"]["private_networks"] = [*values["fabric"]["private_networks"], "10.99.0.0/16"]
    values["model"]["load_gb_per_s"] = 0.05
    changed = run_program("prod", values)
    before = {r.name: r.inputs for r in base.mocks.resources}
    after = {r.name: r.inputs for r in changed.mocks.resources}
    kinds = {r.name: r.typ for r in changed.mocks.resources}
    moved = {n for n in before if before[n] != after[n]}
    assert "policy-facts" in moved
    assert {kinds[n] for n in moved - {"policy-facts"}} <= {"command:remote:Command"}
    assert after["policy-facts"]["estimatedLoadS"] > before["policy-facts"]["estimatedLoadS"]
    found = violations(changed, "prod")
    assert any("estimated weight-load time" in m for _, m in found["vllm-engine-ready-timeout"])  # 0.05 GB/s: slow


# --- the pack as the Pulumi engine talks to it: its own process, over the analyzer gRPC protocol ------------

@pytest.fixture(scope="module")
def analyzer() -> Iterator[Any]:
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    proc = subprocess.Popen([sys.executable, "__main__.py"], cwd=ROOT / "policy", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip())  # the pack prints its port, as the engine expects
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=20)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.kill()
        proc.wait()


def test_the_pack_serves_its_policies_to_the_engine(analyzer: Any) -> None:
    from google.protobuf import empty_pb2

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "vllm-cluster"
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert set(levels) == set(BY_NAME)
    assert levels["prod-image-pinned-by-digest"] != levels["image-pinned-by-digest"]


def test_the_engine_path_reports_the_violations_the_rules_find(analyzer: Any) -> None:
    """Analyze() per registered resource (components too, as the engine does), with its wire-form inputs in a
    protobuf Struct, then AnalyzeStack() with all of them, as `pulumi preview --policy-pack policy` sends them: the
    committed prod stack gets exactly the two digest rules per image; prod with its networks undeclared gets the
    stack policy's findings on both containers."""
    from google.protobuf import struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    def wire(run: Run, stack: str) -> list[Any]:
        out = []
        for r in run.mocks.resources:
            properties = struct_pb2.Struct()
            properties.update(copy.deepcopy(r.inputs))
            out.append(analyzer_pb2.AnalyzerResource(type=r.typ, properties=properties,
                                                     urn=urn_of(stack, r.typ, r.name), name=r.name))
        return out

    def reported(run: Run, stack: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        resources = wire(run, stack)
        for resource in resources:
            response = analyzer.Analyze(analyzer_pb2.AnalyzeRequest(type=resource.type, properties=resource.properties,
                                                                    urn=resource.urn, name=resource.name))
            for diagnostic in response.diagnostics:
                found.setdefault(diagnostic.policyName, set()).add(resource.name)
        response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources))
        for diagnostic in response.diagnostics:
            found.setdefault(diagnostic.policyName, set()).add(diagnostic.urn.rsplit("::", 1)[-1])
        return found

    assert reported(run_program("prod"), "prod") == {"image-pinned-by-digest": {"node1-image", "node2-image"},
                                                     "prod-image-pinned-by-digest": {"node1-image", "node2-image"}}
    values = copy.deepcopy(read_stack_values("prod"))
    values["fabric"]["private_networks"] = []
    values["image"]["digest"] = "sha256:" + "ab" * 32
    assert reported(run_program("prod", values), "prod") == {
        "vllm-internal-ports-private": {"engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"}}
