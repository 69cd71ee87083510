"""Typed model of a stack's KV transfer settings: how a prefill tier hands its KV cache to a decode tier.

The planner renders these as each tier's `--kv-transfer-config` JSON and per-node environment
(stacks/planner/kv_transfer.py). Closed and strict like the rest of the config (stacks/model/config.py): unknown
keys, coerced types and values vLLM 0.33.0 would refuse or silently replace are refused before anything is created.
Every default below is vLLM 0.33.0's own unless the description says why not.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from stacks.model.config import WHAT_WORKS, _Model
from stacks.model.field_types import Port, refuse

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


class KvTransferConfig(_Model):
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
