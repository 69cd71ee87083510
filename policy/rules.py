"""The vllm-cluster policy pack's rules, as pure functions over a resource's type, inputs and URN.

Self-contained (stdlib and pulumi_policy only): the pack runs in its own virtualenv, without this project.
It reads what the program registers, never the stack config: engine containers (the ones with a
`vllm-cluster.generation` label), and one `vllm-cluster:index:PolicyFacts` component with the planning facts no
process sees (declared private networks, estimated weight-load time). Those facts once rode on the containers as
labels, and a label change replaces a container; the component restarts nothing.

Rules that need only a container are resource policies (`Analyze`, before the container's step). Rules that join a
container with the facts are stack policies: `AnalyzeStack` gets every resource (their outputs; a component's
outputs are what it registers) but runs after the steps (pulumi/pulumi pkg/resource/deploy/deployment_executor.go:
`AnalyzeResources` after `stepExec.WaitForCompletion`). So they block `pulumi preview` and the preview `pulumi up`
runs first; `pulumi up --skip-preview` would report them only afterwards.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

CONTAINER = "docker:index/container:Container"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
FACTS = "vllm-cluster:index:PolicyFacts"
LABEL = "vllm-cluster."
MAX_GPU_MEMORY_UTILIZATION = 0.95
_SECRET_SIG = "4dabf18193072939515e22adb298388d"


def _plain(value: Any) -> Any:
    """A secret as the engine's wire form (seen under mocks) is unwrapped; the analyzer already does it."""
    if isinstance(value, Mapping) and _SECRET_SIG in value:
        return _plain(value.get("value"))
    return value


def _labels(props: Mapping[str, Any]) -> dict[str, str]:
    return {str(_plain(x).get("label")): str(_plain(x).get("value")) for x in _plain(props.get("labels")) or []}


def _env(props: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for item in _plain(props.get("envs")) or []:
        key, _, value = str(_plain(item)).partition("=")
        out[key] = value
    return out


def _argv(props: Mapping[str, Any]) -> list[str]:
    """The container's words: the command list, and for a start script (`bash -c`) the script's words."""
    words: list[str] = []
    for part in _plain(props.get("command")) or []:
        words += str(_plain(part)).replace("=", " ").split()
    return words


def _after(words: list[str], flag: str) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == flag]


def _is_engine(props: Mapping[str, Any]) -> bool:
    return f"{LABEL}generation" in _labels(props)


def _is_private(address: str, declared: list[str]) -> bool:
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name: cannot tell, so not proven private
    if ip.is_unspecified:
        return False
    return ip.is_loopback or ip.is_private or any(ip in ipaddress.ip_network(c, strict=False) for c in declared)


def api_auth(props: Mapping[str, Any]) -> list[str]:
    """vLLM's API on a non-loopback address must have a key (its own `VLLM_API_KEY`)."""
    if not _is_engine(props):
        return []
    words = _argv(props)
    hosts = _after(words, "--host")
    if not hosts or "--headless" in words:  # an engine container with --host serves the API
        return []
    host = hosts[-1]
    exposed = host in ("0.0.0.0", "::") or not ipaddress.ip_address(host).is_loopback
    if exposed and "VLLM_API_KEY" not in _env(props):
        return [f"vLLM's API listens on {host} without a key: set the api_key secret, or turn on api.proxy "
                "(vLLM then binds 127.0.0.1)"]
    return []


def _facts_networks(facts: Mapping[str, Any] | None) -> list[str]:
    return [str(_plain(c)) for c in _plain((facts or {}).get("privateNetworks")) or []]


def internal_ports_private(props: Mapping[str, Any], facts: Mapping[str, Any] | None) -> list[str]:
    """DP RPC, VLLM_HOST_IP (torch.distributed, ZMQ) and Ray must bind private or declared-private addresses.

    `facts` is the PolicyFacts component's properties (None when the stack has none: only loopback and RFC 1918 /
    ULA ranges count as private then)."""
    if not _is_engine(props):
        return []
    declared = _facts_networks(facts)
    words = _argv(props)
    found = [("VLLM_HOST_IP", a) for a in [_env(props).get("VLLM_HOST_IP", "")] if a]
    for flag, what in (("--data-parallel-address", "DP coordinator RPC"), ("--node-ip-address", "Ray node"),
                       ("--address", "Ray GCS"), ("--dashboard-host", "Ray dashboard/jobs")):
        found += [(what, a) for a in _after(words, flag)]
    missing = "" if facts is not None else f" (no {FACTS} resource in the stack: no declared networks were read)"
    return [f"{what} on {address}: unauthenticated and able to run code, so it must be on loopback or a private "
            f"network (declare the stack's own in fabric.private_networks){missing}"
            for what, address in found if not _is_private(address, declared)]


def gpu_memory_utilization(props: Mapping[str, Any]) -> list[str]:
    if not _is_engine(props):
        return []
    values = _after(_argv(props), "--gpu-memory-utilization")
    return [f"--gpu-memory-utilization {v} leaves no headroom for NCCL and CUDA graphs: at most "
            f"{MAX_GPU_MEMORY_UTILIZATION}" for v in values if float(v) > MAX_GPU_MEMORY_UTILIZATION]


def engine_ready_timeout(props: Mapping[str, Any], facts: Mapping[str, Any] | None) -> list[str]:
    """The engine-ready timeout in the container's env against the PolicyFacts load estimate."""
    if not _is_engine(props) or facts is None:
        return []
    estimate = _plain(facts.get("estimatedLoadS"))
    timeout = _env(props).get("VLLM_ENGINE_READY_TIMEOUT_S")
    if estimate is None or timeout is None or int(timeout) >= int(estimate):
        return []
    return [f"VLLM_ENGINE_READY_TIMEOUT_S {timeout} is below the estimated weight-load time of {int(estimate)}s: "
            "the API server would exit while the engines still load; raise serving.engine_ready_timeout_s"]


_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def image_pinned(props: Mapping[str, Any]) -> list[str]:
    name = str(_plain(props.get("name")) or "")
    if _DIGEST.search(name):
        return []
    return [f"image {name} is not pinned by digest: a tag can be re-pushed; write repo:tag@sha256:<digest>"]


def stack_of(urn: str) -> str:
    """`urn:pulumi:<stack>::<project>::…`."""
    return urn.split(":", 3)[2].split("::", 1)[0] if urn.startswith("urn:pulumi:") else ""


def _validator(rule: Callable[[Mapping[str, Any]], list[str]], resource_type: str,
               stacks_from_config: bool = False) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type != resource_type:
            return
        if stacks_from_config and stack_of(args.urn) not in list(args.get_config().get("stacks", ["prod"])):
            return
        for message in rule(args.props):
            report_violation(message, None)
    return validate


def _stack_validator(rule: Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[str]]
                     ) -> Callable[[StackValidationArgs, ReportViolation], None]:
    """Every container of the stack against the stack's PolicyFacts; each violation names its container."""
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        facts = next((r.props for r in args.resources if r.resource_type == FACTS), None)
        for resource in args.resources:
            if resource.resource_type != CONTAINER:
                continue
            for message in rule(resource.props, facts):
                report_violation(message, resource.urn)
    return validate


POLICIES: list[ResourceValidationPolicy | StackValidationPolicy] = [
    ResourceValidationPolicy(
        name="vllm-api-auth-on-non-loopback", description="vLLM's API off loopback needs a key",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_validator(api_auth, CONTAINER)),
    StackValidationPolicy(
        name="vllm-internal-ports-private",
        description="DP RPC, VLLM_HOST_IP and Ray only on loopback, private or declared-private addresses",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_stack_validator(internal_ports_private)),
    ResourceValidationPolicy(
        name="vllm-gpu-memory-utilization", description=f"--gpu-memory-utilization <= {MAX_GPU_MEMORY_UTILIZATION}",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_validator(gpu_memory_utilization, CONTAINER)),
    StackValidationPolicy(
        name="vllm-engine-ready-timeout", description="engine-ready timeout >= the estimated weight-load time",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_stack_validator(engine_ready_timeout)),
    ResourceValidationPolicy(
        name="image-pinned-by-digest", description="images pulled by digest (advice everywhere)",
        enforcement_level=EnforcementLevel.ADVISORY, validate=_validator(image_pinned, REMOTE_IMAGE)),
    ResourceValidationPolicy(
        name="prod-image-pinned-by-digest", description="images pulled by digest in the listed stacks (prod)",
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=_validator(image_pinned, REMOTE_IMAGE, stacks_from_config=True),
        config_schema=PolicyConfigSchema(properties={"stacks": {"type": "array", "items": {"type": "string"},
                                                                "default": ["prod"]}})),
]
