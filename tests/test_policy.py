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
    PolicyResourceOptions,
    ResourceValidationArgs,
)
from pulumi_policy.deserialize import deserialize_properties

from policy.rules import POLICIES, stack_of
from stacks.loader import read_stack_values
from tests.conftest import ROOT
from tests.pulumi_harness import Run, run_program
from tests.test_program_proxy import SECRETS, proxied_values

BY_NAME = {p.name: p for p in POLICIES}
URN_TYPES = {"docker:index/container:Container": "vllm-cluster:index:VllmEngine$docker:index/container:Container",
             "docker:index/remoteImage:RemoteImage": "vllm-cluster:index:GpuNode$docker:index/remoteImage:RemoteImage"}


def violations(run: Run, stack: str, config: dict[str, Any] | None = None) -> dict[str, list[tuple[str, str]]]:
    """policy name -> [(resource, message)] over every resource the program registered."""
    found: dict[str, list[tuple[str, str]]] = {name: [] for name in BY_NAME}
    for resource in run.mocks.resources:
        chain = URN_TYPES.get(resource.typ, resource.typ)
        urn = f"urn:pulumi:{stack}::vllm-cluster::{chain}::{resource.name}"
        props = deserialize_properties(copy.deepcopy(resource.inputs))
        for name, policy in BY_NAME.items():
            args = ResourceValidationArgs(resource.typ, props, urn, resource.name,
                                          PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), []),
                                          None, config if config is not None else {})
            policy.validate(args, lambda message, _urn=None, n=name, r=resource.name: found[n].append((r, message)))
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
    values["fabric"] |= {"private_networks": [], "public_private_networks": []}  # 1.1.1.0/24: public space
    run = run_program("prod", values, secrets={"ssh_private_key": "k"})  # and no api_key
    found = violations(run, "prod")
    assert any("0.97" in m for _, m in found["vllm-gpu-memory-utilization"])
    assert any("VLLM_ENGINE_READY_TIMEOUT_S 600 is below the estimated weight-load time of 2855s" in m
               for _, m in found["vllm-engine-ready-timeout"])
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
    """Analyze() per registered resource, with its wire-form inputs in a protobuf Struct, as `pulumi preview
    --policy-pack policy` sends them: the committed prod stack gets exactly the two digest rules per image."""
    from google.protobuf import struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    run = run_program("prod")
    reported: dict[str, set[str]] = {}
    for resource in run.mocks.resources:
        if not resource.typ.startswith(("docker:", "command:")):
            continue
        properties = struct_pb2.Struct()
        properties.update(copy.deepcopy(resource.inputs))
        urn = f"urn:pulumi:prod::vllm-cluster::{URN_TYPES.get(resource.typ, resource.typ)}::{resource.name}"
        response = analyzer.Analyze(analyzer_pb2.AnalyzeRequest(type=resource.typ, properties=properties, urn=urn,
                                                                name=resource.name))
        for diagnostic in response.diagnostics:
            reported.setdefault(diagnostic.policyName, set()).add(resource.name)
    assert reported == {"image-pinned-by-digest": {"node1-image", "node2-image"},
                        "prod-image-pinned-by-digest": {"node1-image", "node2-image"}}
