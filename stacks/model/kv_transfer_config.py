"""Typed model of a stack's KV transfer settings: how a prefill tier hands its KV cache to a decode tier.

The planner renders these as each tier's `--kv-transfer-config` JSON and per-node environment
(stacks/planner/kv_transfer.py). Closed and strict like the rest of the config (stacks/model/config.py): unknown
keys, coerced types and values vLLM 0.33.0 would refuse or silently replace are refused before anything is created.
Every default below is vLLM 0.33.0's own unless the description says why not.
"""

from __future__ import annotations

from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from stacks.model.field_types import WHAT_WORKS, Port, StrictModel, refuse

KvConnector = Literal["NixlConnector", "NixlPullConnector", "NixlPushConnector"]
"""The NIXL connectors vLLM 0.33.0 registers (vllm/distributed/kv_transfer/kv_connector/factory.py:177-193).
`NixlConnector` is the backward-compatible name of `NixlPullConnector` (kv_connector/v1/nixl/connector.py:9-12):
the decode tier reads the KV cache from the prefill tier; `NixlPushConnector` has the prefill tier write it into the
decode tier (nixl/push_worker.py:81-87)."""
NIXL_CONNECTORS: tuple[str, ...] = get_args(KvConnector)
PUSH_CONNECTORS = ("NixlPushConnector",)

OTHER_REGISTERED_CONNECTORS: dict[str, str] = {
    "ExampleConnector": "factory.py:153-157",
    "ExampleHiddenStatesConnector": "factory.py:159-163",
    "LMCacheConnectorV1": "factory.py:165-169",
    "LMCacheMPConnector": "factory.py:171-175",
    "MultiConnector": "factory.py:195-199",
    "HiSparseConnector": "factory.py:201-205",
    "MoRIIOConnector": "factory.py:207-211",
    "OffloadingConnector": "factory.py:213-217",
    "DecodeBenchConnector": "factory.py:219-223",
    "MooncakeConnector": "factory.py:225-229",
    "MooncakeStoreConnector": "factory.py:230-234",
    "FlexKVConnectorV1": "factory.py:235-239",
    "SimpleCPUOffloadConnector": "factory.py:240-244",
    "HF3FSKVConnector": "factory.py:245-249",
}
"""The other connectors vLLM 0.33.0 registers (vllm/distributed/kv_transfer/kv_connector/factory.py), each where.
They parse, but the planner's tier rules (what must match, TP ratios, side-channel ports) are read from the NIXL
connector's code only, so a stack may not name them yet."""

BufferDevice = Literal["cuda", "cpu"]
"""What NIXL accepts as the KV buffer on a CUDA platform (kv_connector/v1/nixl/utils.py:79-90
`_NIXL_SUPPORTED_DEVICE["cuda"]`; anything else is `RuntimeError: cuda with <x> kv_buffer is not supported.`,
nixl/base_worker.py:795-801)."""

LoadFailurePolicy = Literal["fail", "recompute"]
"""`KVTransferConfig.kv_load_failure_policy` (vllm/config/kv_transfer.py:88-91)."""

SIDE_CHANNEL_PORT_DEFAULT = 5600
"""`VLLM_NIXL_SIDE_CHANNEL_PORT`'s default (vllm/envs.py:1724-1727)."""


class KvTransferConfig(StrictModel):
    """KV cache transfer between a prefill tier and a decode tier (disaggregated prefill, docs/disaggregation.md)."""

    connector: KvConnector = Field(
        default="NixlConnector",
        description="the KV connector both tiers run (--kv-transfer-config kv_connector): NixlConnector (= "
        "NixlPullConnector: decode reads from prefill) or NixlPushConnector (prefill writes into decode); both tiers "
        "run the same one, a push and a pull side never handshake (nixl/base_worker.py:131-134)",
        json_schema_extra={WHAT_WORKS: f"one of {', '.join(NIXL_CONNECTORS)}"})
    buffer_device: BufferDevice = Field(
        default="cuda",
        description="kv_buffer_device: cuda (vLLM's default on NVIDIA, config/kv_transfer.py:50-53, 67) registers "
        "the GPU KV cache with NIXL; cpu stages every transfer through host memory (nixl/base_worker.py:807-810)",
        json_schema_extra={WHAT_WORKS: "cuda or cpu (nixl/utils.py:79-90)"})
    load_failure_policy: LoadFailurePolicy = Field(
        default="fail",
        description="kv_load_failure_policy: fail (vLLM's default) ends a request whose KV cache did not arrive "
        "with an error; recompute prefills the missing blocks on the decode tier (config/kv_transfer.py:88-91)")
    side_channel_port: Port = Field(
        default=SIDE_CHANNEL_PORT_DEFAULT,
        description="VLLM_NIXL_SIDE_CHANNEL_PORT: the NIXL handshake listener; the engine of DP rank r listens on "
        "this port + r (nixl/base_scheduler.py:76-80), so each tier needs this port to this port + DP - 1 free on "
        "its nodes")
    side_channel_network: Literal["control", "management", "data"] = Field(
        default="control",
        description="the address of VLLM_NIXL_SIDE_CHANNEL_HOST on each node: control (the fabric.control_plane "
        "address, VLLM_HOST_IP), management (management_ip) or data (the first data IP); the handshake listener "
        "binds it and the prefill tier tells the decode tier to dial it (nixl/base_scheduler.py:76, 355-357; "
        "pull_scheduler.py:284-285)")

    @field_validator("connector", mode="before")
    @classmethod
    def _nixl_only(cls, value: Any) -> Any:
        if isinstance(value, str) and value in OTHER_REGISTERED_CONNECTORS:
            raise refuse(f"is registered by vLLM 0.33.0 (kv_connector/{OTHER_REGISTERED_CONNECTORS[value]}) but the "
                         "planner checks and renders prefill/decode tiers only for the NIXL connectors",
                         f"one of {', '.join(NIXL_CONNECTORS)}")
        return value

    @property
    def push(self) -> bool:
        """The prefill tier writes into the decode tier (NixlPushConnector) instead of the decode tier reading."""
        return self.connector in PUSH_CONNECTORS


RouterPolicy = Literal["cache_aware", "round_robin", "random", "consistent_hash"]
ROUTER_POLICIES: tuple[str, ...] = get_args(RouterPolicy)
REFUSED_ROUTER_POLICIES: dict[str, str] = {
    "power_of_two": "it polls each worker's /get_load (vllm-router src/routers/http/pd_router.rs:1219), which vLLM "
                    "0.33.0 does not serve: every load reads the same, so it picks at random with extra requests",
    "kv_aware": "it needs the prefills' KV event streams (--pd-kv-events, vllm-router "
                "src/config/validation.rs:935-955), which this program does not wire",
    "sticky_least_loaded": "it pins sessions by a session id the client sends and frees them on finish_session "
                           "calls (vllm-router src/policies/sticky_least_loaded.rs:1-23); the stack's clients do "
                           "neither",
}
"""The other values vLLM router 0.1.17's --policy accepts, and why the stack may not name them."""
ROUTER_WHEEL_URL = ("https://files.pythonhosted.org/packages/26/99/48e47ba5847cbb3c3fabc65973a8de7c00ad429f29c3aace9"
                    "54b56771431/vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl")
"""PyPI's file of the pinned router (stacks/planner/router.py checks its sha256 wherever it is fetched from)."""
WHEEL_URL_SCHEMES = ("https", "http", "file")


class RouterConfig(StrictModel):
    """vllm-router in front of the prefill and decode groups, on the stack's head behind the front door."""

    policy: RouterPolicy = Field(
        default="cache_aware", description="how the router picks an instance (its --policy; cache_aware is its "
        "default); prefill_policy / decode_policy override it per tier",
        json_schema_extra={WHAT_WORKS: f"one of {', '.join(ROUTER_POLICIES)}"})
    prefill_policy: RouterPolicy | None = Field(default=None, description="--prefill-policy; unset: policy")
    decode_policy: RouterPolicy | None = Field(default=None, description="--decode-policy; unset: policy")
    port: Port = Field(default=8090, description="the router's port on the head's loopback (the front door's "
                       "upstream)")
    metrics_port: Port = Field(default=29000, description="the router's Prometheus port on the head's loopback "
                               "(vllm_router_pd_*_requests_total, read by the prefill/decode check)")
    request_timeout_s: int = Field(default=1800, ge=1, le=7 * 86_400,
                                   description="--request-timeout-secs: a request's whole time through the router")
    wheel_url: str = Field(
        default=ROUTER_WHEEL_URL, min_length=1, max_length=500,
        description="where the head fetches vllm-router 0.1.17's wheel (https, http or file://); any mirror must "
        "serve the identical file: its sha256 is pinned and checked before it is unpacked")

    @field_validator("policy", "prefill_policy", "decode_policy", mode="before")
    @classmethod
    def _usable(cls, value: Any) -> Any:
        if isinstance(value, str) and value in REFUSED_ROUTER_POLICIES:
            raise refuse(f"is a vllm-router policy not used with vLLM 0.33.0 here: {REFUSED_ROUTER_POLICIES[value]}",
                         f"one of {', '.join(ROUTER_POLICIES)}")
        return value

    @field_validator("wheel_url")
    @classmethod
    def _url(cls, value: str) -> str:
        fix = "an https://, http:// or file:/// URL of vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 or ord(c) > 126 for c in value):
            raise refuse("is not one line of printable ASCII", fix)
        parts = urlsplit(value)
        if parts.scheme not in WHEEL_URL_SCHEMES or not parts.path.endswith(".whl"):
            raise refuse("is not an https, http or file URL of a .whl file", fix)
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment or \
                value.endswith(("?", "#")):
            raise refuse("carries credentials or a query (a token there would sit in the plan, the state and the "
                         "deploy log)", fix + ", served without a token (the pinned sha256 is the check)")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise refuse("has a port that is not 1-65535", fix)
        if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/") or "/../" in parts.path):
            raise refuse("is not an absolute file:/// path on the head (no host, no ..)", fix)
        if parts.scheme != "file" and not parts.hostname:
            raise refuse("names no host", fix)
        return value


class DisaggregationConfig(KvTransferConfig):
    """Prefill and decode groups (`groups[].role`), the KV transfer between them and the router in front."""

    router: RouterConfig = Field(default_factory=RouterConfig, description="vllm-router on the head")
