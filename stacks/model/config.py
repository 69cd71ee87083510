"""Typed model of one stack's config, exactly as written under `vllm-cluster:` in `Pulumi.<stack>.yaml`.

Closed and strict: every model forbids unknown keys (a typo fails at preview instead of being ignored), no
value is coerced from another type (`"8"` is not 8, `off` is not false), every number is finite and bounded,
and every string has a type from `stacks.model.field_types`. The model holds only what the user wrote plus
defaults; everything derived (ranks, env, argv) lives in `topology`, `fabric` and `launch`.
Each field's `description` is what error messages and the config reference (docs/config-reference.md) says about it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, JsonValue, field_validator, model_validator

from stacks.model.busbw import MIN_BUSBW_GBPS_RANGE
from stacks.model.field_types import (
    SECRET,
    AbsPath,
    Capability,
    Cidr,
    ClientName,
    ContainerName,
    DevicePath,
    Digest,
    EnvName,
    EnvValue,
    FiniteFloat,
    GroupName,
    HcaName,
    Host,
    HostAddress,
    Identifier,
    IfName,
    ImageRef,
    IpAddress,
    LoaderOptionValue,
    LoadFormatName,
    ModelCardName,
    NodeName,
    ParserName,
    Port,
    RelPath,
    Repository,
    SecretValue,
    ServedModelName,
    ServerName,
    SshHostKey,
    SshUser,
    StrictModel,
    Tag,
    Text,
    UlimitName,
    UlimitPair,
    UrlPath,
    refuse,
)
from stacks.model.golden import DEFAULT_GOLDEN, MAX_PAIRS, GoldenPair
from stacks.model.kv_transfer_config import DisaggregationConfig
from stacks.model.masking import has_userinfo, holds_secret, secret_name
from stacks.model.weights_source import WeightsSource

SECRET_MARKER = SECRET
"""What a `secure:` value becomes in the pure model: the plan never sees secret plaintext."""





def parse_image_ref(ref: str) -> dict[str, str | None]:
    """`[registry[:port]/]path:tag[@sha256:…]` -> repository, tag, digest. A tag is required: it is what
    reviewers read; the digest is what Docker pulls."""
    if has_userinfo(ref) or ("@" in ref and not ref.partition("@")[2].startswith("sha256:")):
        raise refuse("carries registry credentials (user:password@), which would sit in the plan, the state and "
                     "every node's process list", "the reference alone, e.g. registry.example.com/vllm:v0.33.0; log "
                     "each node in to the registry (docker login) for a private one")
    name, _, digest = ref.strip().partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon <= slash:
        raise refuse("has no tag", "repo:tag or repo:tag@sha256:<64 hex>, e.g. vllm/vllm-openai:v0.33.0")
    return {"repository": name[:colon], "tag": name[colon + 1:], "digest": digest or None}


class ImageConfig(StrictModel):
    """The engine image: a mapping, or one string `repo:tag@sha256:…`. Pin the digest in prod: a tag like
    `nightly-…` can be re-pushed."""

    repository: Repository = Field(description="Docker repository, e.g. vllm/vllm-openai")
    tag: Tag = Field(description="tag reviewers read, e.g. v0.33.0")
    digest: Digest | None = Field(default=None, description="sha256:<64 hex>; what Docker pulls when set")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return parse_image_ref(value) if isinstance(value, str) else value

    @property
    def ref(self) -> str:
        """`repo:tag` — the key of the image capability table."""
        return f"{self.repository}:{self.tag}"

    @property
    def pull_ref(self) -> str:
        """What Docker pulls: `repo:tag@sha256:…` when pinned, so the tag stays readable in reviews."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref


class ModelConfig(StrictModel):
    """Where the weights live. The same host dir must hold them on every node."""

    profile: ModelCardName = Field(
        description="model card: models/<profile>.json, written by `python -m stacks model-card` (docs/your-model.md)")
    served_name: ServedModelName = Field(description="the model name clients send")
    host_dir: AbsPath = Field(description="host directory mounted read-only into the engines")
    container_dir: AbsPath = Field(default="/models", description="where host_dir appears in the container")
    path: RelPath = Field(description="the model's directory inside host_dir")
    weights_gb: FiniteFloat | None = Field(default=None, ge=1, le=100_000,
                                           description="weight size in GB (default: the profile's)")
    load_gb_per_s: FiniteFloat = Field(default=0.1, ge=0.001, le=100,
                                       description="GB a node reads per second while loading (~0.1 seen on 2 x 8 H100)")
    source: WeightsSource | None = Field(
        default=None, description="S3 (or MinIO / Ceph RGW) prefix every node syncs host_dir/path from before "
        "any engine moves (a mapping, or the s3:// URL alone); without it each node's own directory is verified")

    @field_validator("container_dir")
    @classmethod
    def _not_root(cls, value: str) -> str:
        if value == "/":
            raise refuse("would mount the model over the container's root", "/models")
        return value

    @property
    def container_path(self) -> str:
        """The model path vLLM receives (first argument of `vllm serve`)."""
        return f"{self.container_dir.rstrip('/')}/{self.path}"

    @property
    def host_path(self) -> str:
        return f"{self.host_dir.rstrip('/')}/{self.path}"


class SshConfig(StrictModel):
    host: Host = Field(description="address the deployer reaches the node's sshd on")
    user: SshUser = Field(default="root", description="SSH user (must run docker)")
    port: Port = Field(default=22, description="sshd port")
    host_key: SshHostKey | None = Field(
        default=None, description="the node's SSH host key, `ssh-ed25519 AAAA…` (`ssh-keyscan -t ed25519 <host>` "
        "without the host): the check commands and Docker connect only to the holder of its private key; unset: "
        "any key is accepted (plan warning, refused by the prod policy)")


class GpuConfig(StrictModel):
    count: int = Field(ge=1, le=64, description="GPUs in the node", examples=[8])
    model: Text = Field(description="GPU name as nvidia-smi prints it, e.g. 'NVIDIA H100 80GB HBM3'")
    memory_gb: FiniteFloat = Field(ge=1, le=1024, description="memory of one GPU in GB", examples=[80])


class NodeConfig(StrictModel):
    """One GPU host. The first node of the list is the head (API, DP coordinator or Ray head)."""

    name: NodeName = Field(description="node name (resource names, labels)")
    ssh: SshConfig = Field(description="how the deployer reaches the node")
    gpus: GpuConfig = Field(description="the node's GPUs")
    management_ip: HostAddress = Field(description="the node's management address")
    management_ifname: IfName | None = Field(default=None, description="the management interface, e.g. bond0")
    data_ips: list[HostAddress] = Field(default_factory=list, max_length=64,
                                      description="data-plane (RDMA NIC) addresses, same order as nics")
    nics: list[IfName] = Field(default_factory=list, max_length=64, description="data-plane NICs")
    hcas: list[HcaName] = Field(default_factory=list, max_length=64, description="RDMA HCAs as dev:port")
    gid_index: int | None = Field(default=None, ge=0, le=255, description="RoCE v2 GID index (NCCL_IB_GID_INDEX)")
    data_parallel_local: int | None = Field(default=None, ge=1, le=64, description="DP ranks on this node (mp)")

    @field_validator("data_ips", "nics", "hcas")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        seen = [v for i, v in enumerate(value) if v in value[:i]]
        if seen:
            raise refuse(f"lists {seen[0]!r} twice", "each entry once")
        return value

    @field_validator("hcas")
    @classmethod
    def _one_entry_per_port(cls, value: list[str]) -> list[str]:
        """`mlx5_0` is port 1 of mlx5_0 (NCCL's default): it and `mlx5_0:1` are the same port."""
        ports = [h if ":" in h else f"{h}:1" for h in value]
        twice = [p for i, p in enumerate(ports) if p in ports[:i]]
        if twice:
            raise refuse(f"names port {twice[0]!r} twice (a device without :port is its port 1)", "each dev:port once")
        return value


_NCCL_ENV = re.compile(r"(NCCL|UCX|GLOO|NVSHMEM)_[A-Z0-9_]+")


class FabricConfig(StrictModel):
    """How the node's networks map onto vLLM, NCCL and Gloo.

    `control_plane` picks the network for VLLM_HOST_IP, Gloo, Ray and DP RPC; `nccl_socket` the interfaces
    NCCL bootstraps over. `prod` runs both on the first 400G NIC; `h20` keeps them on management.
    """

    transport: Literal["roce", "ib", "socket"] = Field(default="roce", description="NCCL's data transport")
    control_plane: Literal["data", "management"] = Field(
        default="data", description="network of VLLM_HOST_IP, Gloo, DP RPC and Ray")
    nccl_socket: Literal["data", "management"] = Field(default="data", description="NCCL_SOCKET_IFNAME's network")
    nccl_net: Literal["IB", "Socket"] | None = Field(default=None, description="NCCL_NET")
    nccl_debug: Literal["INFO", "WARN", "TRACE", "VERSION"] | None = Field(
        default="INFO", description="NCCL_DEBUG (INFO is needed for the transport check)")
    exact_ifnames: bool = Field(default=True, description="prefix NCCL lists with '=' (no prefix match)")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=64,
                                         description="extra NCCL_*/UCX_*/GLOO_*/NVSHMEM_* variables")
    private_networks: list[Cidr] = Field(default_factory=list, max_length=256, description="CIDRs declared private")
    public_private_networks: list[Cidr] = Field(
        default_factory=list, max_length=256,
        description="entries of private_networks that are public address space (outside RFC 1918, ULA, loopback, "
        "link-local, CGNAT, documentation) yet private on this site, e.g. an isolated RoCE fabric on 1.1.1.0/24: "
        "each such entry must be repeated here, or it is refused; a /0 or a set covering every address is never "
        "accepted")
    min_busbw_gbps: FiniteFloat | None = Field(
        default=None, ge=MIN_BUSBW_GBPS_RANGE[0], le=MIN_BUSBW_GBPS_RANGE[1],
        description="collective check: the all-reduce bus bandwidth floor in Gb/s (default per transport: socket 5, "
        "roce 50, ib 100); the same range as the check's --min-busbw-gbps")
    collective_port: Port = Field(default=29700, description="collective check: its rendezvous store's port on "
                                  "the head's control IP, open only while the check runs")

    @field_validator("env")
    @classmethod
    def _fabric_only(cls, value: dict[str, str]) -> dict[str, str]:
        other = [k for k in value if not _NCCL_ENV.fullmatch(k)]
        if other:
            raise refuse(f"{other[0]!r} is not a fabric variable (NCCL_*, UCX_*, GLOO_*, NVSHMEM_*)",
                         "other variables go in container.env")
        return value


All2AllBackend = Literal["allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
                         "mori_high_throughput", "mori_low_latency", "moonep", "nixl_ep",
                         "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided"]
"""vLLM 0.33.0's `All2AllBackend` (vllm/config/parallel.py:45-60) less what it does not run as written
(REFUSED_ALL2ALL_BACKENDS)."""
ALL2ALL_BACKENDS: tuple[str, ...] = get_args(All2AllBackend)

REFUSED_ALL2ALL_BACKENDS: dict[str, tuple[str, str]] = {
    "pplx": ("was removed from vLLM: 0.33.0 still parses it, logs \"The 'pplx' all2all backend has been removed. "
             "Falling back to 'allgather_reducescatter'.\" and runs that instead (vllm/config/parallel.py:537-543)",
             "deepep_low_latency or deepep_high_throughput (DeepEP kernels), or allgather_reducescatter"),
    "naive": ("was removed from vLLM: 0.33.0 still parses it, logs \"The 'naive' all2all backend has been removed. "
              "Falling back to 'allgather_reducescatter'.\" and runs that instead (vllm/config/parallel.py:537-543)",
              "allgather_reducescatter (what vLLM would run anyway)"),
    "flashinfer_all2allv": ("is the deprecated name of flashinfer_nvlink_two_sided (vllm/config/parallel.py:56; "
                            "distributed/device_communicators/cuda_communicator.py:256-260 warns it will be removed)",
                            "flashinfer_nvlink_two_sided"),
    "passthrough": ("is not selectable from vLLM's command line: 0.33.0 removes it from --all2all-backend's "
                    "choices and binds it from --moe-backend (vllm/engine/arg_utils.py:1157-1161, "
                    "config/kernel.py:194-229)",
                    "one of the other backends; for passthrough leave all2all_backend at its default and put "
                    "--moe-backend flashinfer_moe_ep_cutedsl (or flashinfer_moe_ep_mega_deep_gemm) in "
                    "serving.extra_args: vLLM binds it then"),
}
"""All-to-all backends vLLM 0.33.0 accepts on its command line but does not run as named, each refused with why."""

class EplbConfig(StrictModel):
    """Expert-parallel load balancing: vLLM records each expert's load and, every `step_interval` steps,
    moves experts (and `num_redundant_experts` extra copies of the hottest ones) between EP ranks.
    `--enable-eplb` and `--eplb-config` (vLLM 0.33.0 `EPLBConfig`, vllm/config/parallel.py:63-133); only
    the fields that differ from vLLM's defaults are rendered into the JSON."""

    enabled: bool = Field(default=False, description="--enable-eplb (vllm/config/parallel.py:206); needs "
                          "parallelism.expert and TP x DP > 1 (parallel.py:563-584)")
    num_redundant_experts: int = Field(
        default=0, ge=0, le=1023,
        description="extra physical copies of experts spread over the EP ranks (parallel.py:77-78); each adds "
        "weight memory per GPU (docs/expert-parallel.md); routed + redundant must divide by the EP size "
        "(fused_moe/layer.py:271-279); at most 1023 (distributed/eplb/eplb_state.py:398-402)")
    window_size: int = Field(default=1000, ge=1, le=1_000_000,
                             description="steps of expert load recorded (parallel.py:67-68)")
    step_interval: int = Field(default=3000, ge=1, le=10_000_000,
                               description="steps between expert rearrangements (parallel.py:69-75)")
    log_balancedness: bool = Field(default=False, description="log the balancedness every interval; costs "
                                   "communication (parallel.py:80-84)")
    log_balancedness_interval: int = Field(default=1, ge=1, le=10_000_000,
                                           description="steps between balancedness logs (parallel.py:85-88)")
    use_async: bool = Field(default=True, description="non-blocking rearrangement (parallel.py:89-92)")
    policy: Literal["default"] = Field(default="default", description="rebalancing policy (parallel.py:40, 94)")
    communicator: Literal["torch_nccl", "torch_gloo", "torch_xccl", "nixl", "pynccl"] | None = Field(
        default=None, description="how expert weights move (parallel.py:97-107); unset: nixl when installed, else "
        "torch_gloo (parallel.py:1116-1134); torch_nccl and pynccl refuse use_async (parallel.py:124-130); torch_xccl "
        "(Intel XPU) is refused on NVIDIA GPUs")
    enable_migration_batching: bool = Field(
        default=False, description="migrate in rounds where each rank talks to one peer; async only "
        "(parallel.py:109-118)")

    def changed(self) -> dict[str, Any]:
        """The fields set away from vLLM 0.33.0's defaults (what `--eplb-config` carries), `enabled` aside."""
        return {name: getattr(self, name) for name, field in type(self).model_fields.items()
                if name != "enabled" and getattr(self, name) != field.default}


DBO_MIN_THRESHOLD = 2
"""With DBO on, each threshold is at least the number of micro-batches (vllm/config/parallel.py:1178-1187)."""


class DboConfig(StrictModel):
    """Dual-batch overlap: each step is split into two micro-batches so one computes while the other's
    all-to-all is in flight. `--enable-dbo` and its thresholds (vLLM 0.33.0, vllm/config/parallel.py:258-272)."""

    enabled: bool = Field(default=False, description="--enable-dbo (vllm/config/parallel.py:258); needs "
                          "expert parallelism with DP > 1 and a DeepEP or nixl_ep all2all_backend "
                          "(config/vllm.py:2180-2204; v1/worker/dp_utils.py:222-224)")
    decode_token_threshold: int = Field(
        default=32, ge=0, le=16_777_216, description="--dbo-decode-token-threshold: decode-only batches above this "
        "many tokens are split (parallel.py:263-267); at least 2 with DBO on (parallel.py:1178-1187)")
    prefill_token_threshold: int = Field(
        default=512, ge=0, le=16_777_216, description="--dbo-prefill-token-threshold: batches with a prefill above "
        "this many tokens are split (parallel.py:268-272); at least 2 with DBO on (parallel.py:1178-1187)")


class ParallelismConfig(StrictModel):
    tensor: int = Field(ge=1, le=64, description="GPUs per TP group", examples=[8])
    pipeline: int = Field(default=1, ge=1, le=64, description="pipeline stages")
    data: int = Field(default=1, ge=1, le=1024, description="data-parallel ranks")
    expert: bool = Field(default=False, description="expert parallelism (EP = DP x TP)")
    backend: Literal["mp", "ray"] = Field(default="mp", description="mp (vLLM internal DP) or ray")
    data_parallel_rpc_port: Port = Field(default=29550, description="DP coordinator RPC port")
    master_port: Port = Field(default=29501, description="--master-port when a replica spans nodes (mp)")
    dp_load_balancing: Literal["internal", "hybrid", "external"] = Field(
        default="internal",
        description="who spreads requests over the DP ranks (mp, DP > 1; docs/load-balancing.md): internal = the "
        "head's API server over every rank, the other nodes --headless; hybrid = every node runs an API server over "
        "its own ranks (--data-parallel-hybrid-lb) and the proxy, or your load balancer, spreads requests over the "
        "nodes; external = every DP rank is its own vLLM server (--data-parallel-rank), one container and API "
        "port (serving.port + its index on the node) per rank, and the proxy, or your load balancer, spreads "
        "requests over the ranks")
    all2all_backend: All2AllBackend = Field(
        default="allgather_reducescatter",
        description="--all2all-backend: how MoE tokens reach their experts' ranks (vllm/config/parallel.py:220-234); "
        "used with expert: true and DP > 1 (fused_moe/config.py:1035-1038); pplx and naive (removed), "
        "flashinfer_all2allv (renamed) and passthrough (not a CLI choice) are refused; so are AMD's mori_* on NVIDIA "
        "GPUs, and flashinfer_nvlink_* across nodes that share no NVLink (not GB200/GB300)")
    eplb: EplbConfig = Field(default_factory=EplbConfig, description="expert-parallel load balancing (EPLB)")
    dbo: DboConfig = Field(default_factory=DboConfig, description="dual-batch overlap (DBO)")
    expert_placement: Literal["linear", "round_robin"] = Field(
        default="linear", description="--expert-placement-strategy (vllm/config/parallel.py:210-219); round_robin "
        "only for models with expert groups, without EPLB, and with deepep_low_latency or nixl_ep when the "
        "all-to-all runs (fused_moe/expert_map_manager.py:116-148)")
    ep_weight_filter: bool = Field(
        default=False, description="--enable-ep-weight-filter: each rank reads only its own experts from disk "
        "(vllm/config/parallel.py:199-205); needs expert: true, and does nothing with EPLB on "
        "(model_loader/default_loader.py:438-450)")

    @field_validator("all2all_backend", mode="before")
    @classmethod
    def _runs_as_named(cls, value: Any) -> Any:
        if isinstance(value, str) and value in REFUSED_ALL2ALL_BACKENDS:
            why, fix = REFUSED_ALL2ALL_BACKENDS[value]
            raise refuse(why, fix)
        return value


class ServingConfig(StrictModel):
    host: IpAddress = Field(default="0.0.0.0", description="address vLLM's API binds (an IP literal)")
    port: Port = Field(default=8000, description="vLLM's API port")
    max_model_len: int = Field(ge=1, le=16_777_216, description="context length in tokens", examples=[65536])
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=16_777_216,
                                               description="per-iteration token budget")
    max_num_seqs: int = Field(default=256, ge=1, le=65_536, description="active sequences per DP rank")
    gpu_memory_utilization: FiniteFloat = Field(default=0.9, gt=0, le=1, description="share of GPU memory vLLM takes")
    kv_cache_dtype: ParserName | None = Field(default=None, description="KV cache dtype (default: the profile's)")
    prefix_caching: bool = Field(default=False, description="--enable-prefix-caching")
    trust_remote_code: bool = Field(default=False, description="--trust-remote-code")
    dtype: ParserName | None = Field(default=None, description="--dtype")
    tokenizer_mode: ParserName | None = Field(default=None, description="default: the profile's")
    tool_call_parser: ParserName | None = Field(default=None, description="default: the profile's")
    reasoning_parser: ParserName | None = Field(default=None, description="default: the profile's")
    auto_tool_choice: bool = Field(default=True, description="--enable-auto-tool-choice")
    engine_ready_timeout_s: int = Field(default=3600, ge=60, le=172_800, description="VLLM_ENGINE_READY_TIMEOUT_S")
    load_format: LoadFormatName = Field(
        default="auto", description="--load-format: how vLLM reads the weights (docs/speed.md); one the image card "
        "lists whose packages the image has and whose files the model directory holds; auto renders no flag")
    safetensors_load_strategy: Literal["lazy", "eager", "prefetch", "torchao"] | None = Field(
        default=None, description="--safetensors-load-strategy (vllm/config/load.py:14, 65-86): lazy (mmap), eager "
        "(whole files into RAM), prefetch (into the page cache first), torchao (torchao checkpoints); unset: vLLM's "
        "own choice (prefetch on NFS/Lustre when the files fit in RAM)")
    model_loader_extra_config: dict[Identifier, LoaderOptionValue] = Field(
        default_factory=dict, max_length=8, description="--model-loader-extra-config: the keys the chosen loader "
        "reads in vLLM 0.33.0, each with its type (docs/speed.md lists them); empty renders no flag")
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=200,
        description="more `vllm serve` argv words, one per item; no flag the config manages")


def _json_problem(value: Any, depth: int = 0) -> str | None:
    """Why a speculative option value cannot travel as JSON to vLLM, or None."""
    if depth > 4:
        return "nested deeper than 4 levels"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return "a number too large for JSON"
    if isinstance(value, str) and (len(value) > 4096 or re.search(r"[\x00-\x1f\x7f]", value)):
        return "a string with control characters or longer than 4096"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for _, item in items:
        found = _json_problem(item, depth + 1)
        if found:
            return found
    return None


class SpeculativeConfig(StrictModel):
    """Rendered as `--speculative-config` JSON: method, num_speculative_tokens, then `options` in order."""

    method: Identifier = Field(description="speculative method, e.g. dspark")
    num_speculative_tokens: int = Field(ge=1, le=64, description="draft tokens per step")
    options: dict[Identifier, JsonValue] = Field(default_factory=dict, max_length=32,
                                                 description="further SpeculativeConfig fields, in order")

    @field_validator("options")
    @classmethod
    def _options(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("method", "num_speculative_tokens"):
            if key in value:
                raise refuse(f"sets {key!r}, which overrides the checked speculative.{key}",
                             f"set speculative.{key} instead")
        for key, item in value.items():
            problem = _json_problem(item)
            if problem:
                raise refuse(f"option {key!r} is {problem}", "a JSON value: string, number, boolean, list or mapping")
            if secret_name(key) or holds_secret(json.dumps(item)):
                raise refuse(f"option {key!r} looks like a credential: --speculative-config is argv, visible in "
                             "`ps`, `docker inspect` and Pulumi state", "a draft model the image can read without "
                             "one, or a token through env_secrets (HF_TOKEN)")
        return value


class VolumeConfig(StrictModel):
    host: AbsPath = Field(description="host path")
    container: AbsPath = Field(description="container path")
    read_only: bool = Field(default=False, description="mount read-only")

    @field_validator("container")
    @classmethod
    def _not_root(cls, value: str) -> str:
        if value == "/":
            raise refuse("would mount over the container's root", "a directory, e.g. /var/log/vllm")
        return value


class ContainerConfig(StrictModel):
    name: ContainerName = Field(description="engine container name on every node")
    restart: Literal["no", "on-failure", "always", "unless-stopped"] = Field(
        default="no", description="Docker restart policy; anything but `no` restarts one dead rank alone, which "
        "hangs against its stale peers (a plan warning): restart the group with restart_epoch instead")
    restart_epoch: int = Field(
        default=0, ge=0, le=1_000_000_000,
        description="bump it to restart the whole engine group in start order (every check re-runs)")
    network_mode: Literal["host"] = Field(default="host", description="host networking (NCCL, RDMA)")
    ipc_mode: Literal["host", "private", "shareable"] = Field(default="host", description="IPC namespace")
    privileged: bool = Field(default=False, description="privileged container")
    shm_size_mb: int | None = Field(default=None, ge=64, le=4_194_304, description="/dev/shm size in MB")
    ulimits: dict[UlimitName, UlimitPair] = Field(
        default_factory=lambda: {"memlock": [-1, -1], "stack": [67108864, 67108864]}, max_length=15,
        description="name -> [soft, hard], -1 unlimited")
    cache_dir: AbsPath | None = Field(default=None, description="host dir of the engines' caches: each mounts "
                                       "<cache_dir>/<key of its image, argv and env> at /root/.cache")
    volumes: list[VolumeConfig] = Field(default_factory=list, max_length=64, description="more bind mounts")
    devices: list[DevicePath] = Field(default_factory=list, max_length=64,
                                      description="host devices, e.g. /dev/infiniband")
    capabilities: list[Capability] = Field(default_factory=list, max_length=41,
                                           description="Linux capabilities to add")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=200,
                                         description="extra container env; no variable the plan manages, no secret")
    managed_env_overrides: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=32,
        description="escape hatch: override a variable the plan manages (each one is a plan warning)")
    set_cuda_visible_devices: bool = Field(default=True, description="set CUDA_VISIBLE_DEVICES to the GPUs used")

    @field_validator("volumes")
    @classmethod
    def _distinct_targets(cls, value: list[VolumeConfig]) -> list[VolumeConfig]:
        targets = [v.container for v in value]
        twice = [t for i, t in enumerate(targets) if t in targets[:i]]
        if twice:
            raise refuse(f"mounts two volumes at {twice[0]!r}", "one volume per container path")
        return value

    @field_validator("devices", "capabilities")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        twice = [v for i, v in enumerate(value) if v in value[:i]]
        if twice:
            raise refuse(f"lists {twice[0]!r} twice", "each entry once")
        return value


class RayConfig(StrictModel):
    gcs_port: Port = Field(default=6379, description="Ray GCS port on the head")
    dashboard_port: Port = Field(default=8265, description="Ray dashboard port (bound to 127.0.0.1)")
    client_port: Port = Field(default=10001, description="Ray client server port")
    cluster_ready_timeout_s: int = Field(default=600, ge=10, le=86_400,
                                         description="how long the head waits for every node and GPU")


class SmokeConfig(StrictModel):
    """The golden set every DP rank must answer (`stacks/model/golden.py`), and which other checks run."""

    golden: list[GoldenPair] = Field(
        default_factory=lambda: list(DEFAULT_GOLDEN), min_length=1, max_length=MAX_PAIRS,
        description="prompt / expected-regex pairs every DP rank answers at temperature 0, thinking off")
    thinking_check: bool = Field(default=True, description="also check that thinking mode returns reasoning")
    stream_check: bool = Field(default=True, description="also check streaming (SSE and [DONE])")

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, value: Any) -> Any:
        if isinstance(value, dict) and ({"prompt", "expect"} & set(value)):
            raise refuse("sets prompt/expect, which became the golden set",
                         "golden: [{prompt: '17*19等于多少？只返回数字。', expect: '323'}] (1-16 pairs)")
        return value


class ProxyLimits(StrictModel):
    """nginx limit_req / limit_conn. Per key = per client name in `proxy_keys`; per client = per source IP."""

    requests_per_minute_per_key: int = Field(default=600, ge=1, le=1_000_000, description="per client key")
    requests_per_minute_per_client: int = Field(default=1200, ge=1, le=1_000_000, description="per source IP")
    burst: int = Field(default=20, ge=0, le=100_000, description="requests allowed above the rate before 429")
    connections_per_key: int = Field(default=64, ge=1, le=100_000, description="open requests per key (SSE counts)")
    connections_per_client: int = Field(default=128, ge=1, le=100_000, description="open requests per source IP")


class ProxyConfig(StrictModel):
    """The nginx front door on the head node: TLS, bearer keys, limits, a path allowlist, SSE pass-through.

    Off by default, so a stack keeps its direct vLLM port until its config turns this on.
    """

    enabled: bool = Field(default=False, description="run the nginx front door on the head")
    image: ImageConfig = Field(default_factory=lambda: ImageConfig(repository="nginx", tag="1.27-alpine"),
                               description="nginx image")
    container_name: ContainerName = Field(default="vllm-proxy", description="proxy container name")
    bind: IpAddress = Field(default="0.0.0.0", description="address the proxy listens on")
    port: Port = Field(default=443, description="proxy port (default 443; 80 with tls: false)")
    tls: bool = Field(default=True, description="certificate and key from the tls_* secrets")
    server_name: ServerName | None = Field(default=None, description="nginx server_name and the endpoint's host")
    max_body_mb: int = Field(default=8, ge=1, le=1024, description="request body cap in MB")
    read_timeout_s: int = Field(default=3600, ge=30, le=86_400, description="longest silence on a streamed answer")
    limits: ProxyLimits = Field(default_factory=ProxyLimits)
    check_client: ClientName | None = Field(default=None, description="whose key the API checks use")
    allowed_paths: list[UrlPath] = Field(
        default_factory=lambda: ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health"],
        min_length=1, max_length=64,
        description="exact paths the proxy passes to vLLM (each must be one the image's vLLM serves, "
        "stacks/planner/data/vllm-<version>-routes.json); every other known vLLM path gets 403, the rest 404; "
        "/health is the only one without a key")

    admin_paths: list[UrlPath] = Field(
        default_factory=list, max_length=64,
        description="control paths (pause, sleep, weights, collective_rpc, profiling, LoRA, metrics, docs) that "
        "allowed_paths may then pass: each is also listed there; every client key can then call it")

    @model_validator(mode="before")
    @classmethod
    def _plain_http_port(cls, data: Any) -> Any:
        """Without TLS the unset port is HTTP's 80: plain HTTP on 443 surprises every client and scanner."""
        if isinstance(data, dict) and "port" not in data and data.get("tls") is False:
            return {**data, "port": 80}
        return data

    @field_validator("allowed_paths", "admin_paths")
    @classmethod
    def _unique_paths(cls, value: list[str]) -> list[str]:
        twice = [v for i, v in enumerate(value) if v in value[:i]]
        if twice:
            raise refuse(f"lists {twice[0]!r} twice", "each path once")
        return value


class ApiConfig(StrictModel):
    """Post-deploy API checks and the optional front proxy. Neither ever touches an engine."""

    public_host: Host | None = Field(default=None, description="address clients use (default: head management IP)")
    health_timeout_s: int | None = Field(default=None, ge=10, le=172_800,
                                         description="how long the health check waits (default: engine timeout + 600)")
    progress_interval_s: int = Field(default=30, ge=1, le=3600, description="progress line interval while waiting")
    request_timeout_s: int = Field(default=300, ge=1, le=86_400, description="per-request timeout of the checks")
    smoke: SmokeConfig = Field(default_factory=SmokeConfig, description="the golden prompt checks")
    watch_interval_s: int = Field(default=60, ge=10, le=3600,
                                  description="seconds between rounds of the watch unit (python -m stacks watch-unit)")
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)


class FirewallConfig(StrictModel):
    """The host firewall (`stacks/planner/firewall.py`): one nftables table per node that lets only the cluster reach
    its unauthenticated ports. On by default; `enabled: false` leaves the hosts' rules alone (plan warning)."""

    enabled: bool = Field(default=True, description="install the project's nftables table on every node")
    api_sources: list[Cidr] | None = Field(
        default=None, max_length=256, description="CIDRs that may reach the API/proxy port; default: "
        "fabric.private_networks with the proxy off, anywhere with it on")
    ephemeral_ports: Annotated[list[Annotated[int, Field(ge=1024, le=65535)]], Field(min_length=2, max_length=2)] = (
        Field(default_factory=lambda: [32768, 60999],
              description="[low, high]: OS-picked listener ports (net.ipv4.ip_local_port_range) to guard"))

    @field_validator("ephemeral_ports")
    @classmethod
    def _range(cls, value: list[int]) -> list[int]:
        low, high = value
        if low > high:
            raise refuse("has low above high", "[low, high], e.g. [32768, 60999] (Linux's default)")
        return value


class ObservabilityImages(StrictModel):
    """The monitoring images as `repo:tag` or `repo:tag@sha256:…`. The tags are the versions the generated files
    were written for; pin each by digest in prod (a plan warning otherwise, like the engine image)."""

    prometheus: ImageRef = Field(default="prom/prometheus:v2.53.3",
                                 description="Prometheus image (its config is checked with promtool 2.42 or later)")
    grafana: ImageRef = Field(default="grafana/grafana:11.6.0",
                              description="Grafana image (dashboards and the datasource are provisioned from files)")
    alertmanager: ImageRef = Field(default="prom/alertmanager:v0.27.0",
                                   description="Alertmanager image (runs only with the alert_webhook_url secret set)")
    node_exporter: ImageRef = Field(default="prom/node-exporter:v1.8.2", description="node exporter, on every node")
    dcgm_exporter: ImageRef = Field(default="nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless",
                                    description="NVIDIA DCGM exporter image, on every node")


class ObservabilityPorts(StrictModel):
    """Ports of the monitoring processes. Each binds the node's management address (never a wildcard), so it is
    reached from the cluster and through an SSH tunnel, and the host firewall admits only the cluster to it."""

    prometheus: Port = Field(default=9090, description="Prometheus web and API")
    grafana: Port = Field(default=3000, description="Grafana web")
    alertmanager: Port = Field(default=9093, description="Alertmanager API")
    alertmanager_cluster: Port = Field(default=9094, description="Alertmanager's gossip port (bound to loopback)")
    node_exporter: Port = Field(default=9100, description="node exporter on every node")
    dcgm_exporter: Port = Field(default=9400, description="DCGM exporter on every node (its default)")
    watch: Port = Field(default=9464, description="the watch unit's metrics endpoint (on observability.watch_address)")
    supervisor: Port = Field(default=9465, description="the group supervisor's metrics endpoint (on "
                             "observability.supervisor_address)")


class ObservabilityConfig(StrictModel):
    """Prometheus, Grafana and (with a webhook) Alertmanager on one node; node and DCGM exporters on every node;
    scrape config, alert rules and dashboards generated from the plan (`python -m stacks observability`).
    Off by default."""

    enabled: bool = Field(default=False, description="run the monitoring containers")
    node: NodeName | None = Field(default=None, description="node that runs Prometheus, Grafana and Alertmanager "
                                  "(default: the head; must be the head when vLLM binds loopback)")
    ports: ObservabilityPorts = Field(default_factory=ObservabilityPorts)
    images: ObservabilityImages = Field(default_factory=ObservabilityImages)
    data_dir: AbsPath = Field(default="/var/lib/vllm-cluster/observability",
                              description="host directory for Prometheus' and Grafana's data on that node")
    retention_days: int = Field(default=15, ge=1, le=3650, description="Prometheus keeps samples this many days")
    retention_gb: int = Field(default=50, ge=1, le=100_000, description="and at most this many GB")
    scrape_interval_s: int = Field(default=15, ge=5, le=300, description="seconds between scrapes")
    watch_address: HostAddress | None = Field(
        default=None, description="address of the host running the watch unit (python -m stacks watch-unit), "
        "where it serves its metrics; default: the monitoring node's management IP (install the unit there)")
    supervisor_address: HostAddress | None = Field(
        default=None, description="address of the host running the group supervisor (python -m stacks "
        "supervisor-unit), where it serves its metrics; default: the watch unit's address (watch_address, else the "
        "monitoring node)")
    golden_failures: int = Field(default=3, ge=1, le=1000,
                                 description="alert when a DP rank fails its golden check this many rounds in a row")
    kv_cache_usage: FiniteFloat = Field(default=0.95, gt=0, le=1,
                                        description="alert when a rank's KV cache usage stays above this for 5 min")
    ttft_p99_s: FiniteFloat = Field(default=10.0, gt=0, le=3600,
                                    description="alert when a rank's time-to-first-token p99 (5 min) is above this")


class GroupConfig(StrictModel):
    """A replica group: a vLLM instance of its own on its own nodes, behind the stack's front door, so that a change
    replaces one group at a time while the others serve (docs/rolling.md)."""

    name: GroupName = Field(description="the group's name, e.g. a")
    nodes: list[NodeName] = Field(min_length=1, max_length=1024,
                                  description="names from nodes[], in start order; the first is the group's head")
    parallelism: ParallelismConfig | None = Field(
        default=None, description="this group's TP/PP/DP/EP; default: the stack's parallelism")
    role: Literal["replica", "prefill", "decode"] = Field(
        default="replica", description="replica: a whole vLLM instance (a change rolls group by group); prefill or "
        "decode: a tier of disaggregated serving, KV cache handed from prefill to decode (needs disaggregation:, "
        "docs/disaggregation.md)")


class StackConfig(StrictModel):
    """The whole `vllm-cluster:` namespace of a stack file."""

    image: ImageConfig
    model: ModelConfig
    nodes: list[NodeConfig] = Field(min_length=1, max_length=1024)
    rehearsal: bool = Field(
        default=False, description="true: a CPU-only rehearsal, no node has a GPU (docs/rehearsal.md): nodes[].gpus "
        "are what the engine image pretends (ranks and memory are planned on them), no container gets a GPU or "
        "CUDA_VISIBLE_DEVICES, the collective check runs gloo on CPU, and every GPU-only check prints NOT RUN; the "
        "image must serve the API without a GPU (a substitute engine, not a vLLM GPU image)")
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    parallelism: ParallelismConfig = Field(description="TP, PP, DP, EP and the backend")
    groups: list[GroupConfig] = Field(
        default_factory=list, max_length=256,
        description="replica groups, each its own vLLM instance on its own nodes; unset: one group of every node "
                    "(a change then replaces it whole)")
    disaggregation: DisaggregationConfig | None = Field(
        default=None, description="prefill/decode groups: the KV connector between them and the router in front "
        "(docs/disaggregation.md)")
    serving: ServingConfig = Field(description="the `vllm serve` flags")
    speculative: SpeculativeConfig | None = None
    vision: bool = Field(default=False, description="keep the vision tower (false adds --language-model-only)")
    container: ContainerConfig = Field(description="the engine container on every node")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray head settings (backend: ray)")
    api: ApiConfig = Field(default_factory=ApiConfig)
    firewall: FirewallConfig = Field(default_factory=FirewallConfig, description="the host firewall on every node")
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig,
                                               description="metrics, dashboards and alerts (docs/observability.md)")
    api_key: SecretValue | None = Field(default=None, description="vLLM's bearer key (VLLM_API_KEY), a secret")
    ssh_private_key: SecretValue | None = Field(default=None, description="SSH key for the check commands, a secret")
    tls_certificate: SecretValue | None = Field(default=None, description="PEM chain the proxy serves, a secret")
    tls_private_key: SecretValue | None = Field(default=None, description="PEM key of tls_certificate, a secret")
    proxy_keys: dict[ClientName, SecretValue] | None = Field(
        default=None, max_length=1000, description="client name -> bearer key, each a secret (--secret --path)")
    env_secrets: dict[EnvName, SecretValue] | None = Field(
        default=None, max_length=64, description="env name -> value, each a secret (tokens: HF_TOKEN, …)")
    s3_access_key_id: SecretValue | None = Field(
        default=None, description="model.source: access key id, a secret (omit both keys for a node's IAM role)")
    s3_secret_access_key: SecretValue | None = Field(
        default=None, description="model.source: secret access key, a secret")
    s3_session_token: SecretValue | None = Field(
        default=None, description="model.source: session token of temporary credentials, a secret")
    grafana_admin_password: SecretValue | None = Field(
        default=None, description="observability: Grafana's admin password, a secret (required when enabled)")
    alert_webhook_url: SecretValue | None = Field(
        default=None, description="observability: URL Alertmanager posts alerts to, a secret (unset: alerts "
        "show in Prometheus and Grafana only, no Alertmanager runs)")

    @property
    def head(self) -> NodeConfig:
        return self.nodes[0]


SECRET_KEYS: tuple[str, ...] = ("api_key", "ssh_private_key", "tls_certificate", "tls_private_key",
                                "s3_access_key_id", "s3_secret_access_key", "s3_session_token",
                                "grafana_admin_password", "alert_webhook_url")
"""Top-level keys that must be `secure:` values; the Pulumi program reads them with get_secret."""

SECRET_OBJECT_KEYS: tuple[str, ...] = ("proxy_keys", "env_secrets")
"""Top-level objects whose every value is a secret (`config set --secret --path`); their keys are plain names."""

CONFIG_KEYS: tuple[str, ...] = tuple(StackConfig.model_fields)
