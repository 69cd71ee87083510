"""Typed model of one stack's config, exactly as written under `vllm-cluster:` in `Pulumi.<stack>.yaml`.

Every model forbids unknown keys so a typo (`tensor_paralel`) fails at preview instead of being ignored.
The model holds only what the user wrote plus defaults; everything derived (ranks, env, argv) lives in
`topology`, `fabric` and `launch` so the derivation is testable on its own.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SECRET_MARKER = "[secret]"
"""What a `secure:` value becomes in the pure model: the plan never sees secret plaintext."""

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
_HCA = re.compile(r"^[A-Za-z0-9_]+(:[0-9]+)?$")
_CLIENT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_image_ref(ref: str) -> dict[str, str | None]:
    """`[registry[:port]/]path:tag[@sha256:…]` -> repository, tag, digest. A tag is required: it is what
    reviewers read; the digest is what Docker pulls."""
    name, _, digest = ref.strip().partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon <= slash:
        raise ValueError(f"{ref!r} has no tag: write repo:tag or repo:tag@sha256:<64 hex>")
    return {"repository": name[:colon], "tag": name[colon + 1:], "digest": digest or None}


class ImageConfig(_Model):
    """The engine image: a mapping, or one string `repo:tag@sha256:…`. Pin the digest in prod: a tag like
    `nightly-…` can be re-pushed."""

    repository: str = Field(min_length=1)
    tag: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    digest: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return parse_image_ref(value) if isinstance(value, str) else value

    @field_validator("digest")
    @classmethod
    def _digest_form(cls, value: str | None) -> str | None:
        if value is not None and not _DIGEST.match(value):
            raise ValueError(f"must look like 'sha256:' followed by 64 hex digits, got {value!r}")
        return value

    @property
    def ref(self) -> str:
        """`repo:tag` — the key of the image capability table."""
        return f"{self.repository}:{self.tag}"

    @property
    def pull_ref(self) -> str:
        """What Docker pulls: `repo:tag@sha256:…` when pinned, so the tag stays readable in reviews."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref


class ModelConfig(_Model):
    """Where the weights live. The same host dir must hold them on every node."""

    profile: str
    served_name: str = Field(min_length=1)
    host_dir: str
    container_dir: str = "/models"
    path: str = Field(min_length=1, description="path of the model inside host_dir")
    weights_gb: float | None = Field(default=None, gt=0, description="overrides the profile's size")
    load_gb_per_s: float = Field(default=0.1, gt=0, description="weights read per node per second (seed 000)")

    @field_validator("host_dir", "container_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return value.rstrip("/") or "/"

    @property
    def container_path(self) -> str:
        """The model path vLLM receives (first argument of `vllm serve`)."""
        return f"{self.container_dir.rstrip('/')}/{self.path.strip('/')}"

    @property
    def host_path(self) -> str:
        return f"{self.host_dir.rstrip('/')}/{self.path.strip('/')}"


class SshConfig(_Model):
    host: str = Field(min_length=1)
    user: str = "root"
    port: int = Field(default=22, ge=1, le=65535)


class GpuConfig(_Model):
    count: int = Field(ge=1, le=64)
    model: str = Field(min_length=1, description="as nvidia-smi names it, e.g. 'NVIDIA H100 80GB HBM3'")
    memory_gb: float = Field(gt=0, description="memory of one GPU in GB")


def _ip(value: str) -> str:
    ipaddress.ip_address(value)
    return value


IpAddress = Annotated[str, Field(min_length=2)]


class NodeConfig(_Model):
    """One GPU host. The first node of the list is the head (API, DP coordinator or Ray head)."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
    ssh: SshConfig
    gpus: GpuConfig
    management_ip: IpAddress
    management_ifname: str | None = None
    data_ips: list[IpAddress] = Field(default_factory=list)
    nics: list[str] = Field(default_factory=list, description="data-plane NICs, same order as data_ips")
    hcas: list[str] = Field(default_factory=list, description="RDMA HCAs as dev:port, e.g. mlx5_0:1")
    gid_index: int | None = Field(default=None, ge=0, le=255)
    data_parallel_local: int | None = Field(default=None, ge=1, description="DP ranks on this node (mp)")

    @field_validator("management_ip")
    @classmethod
    def _mgmt_ip(cls, value: str) -> str:
        return _ip(value)

    @field_validator("data_ips")
    @classmethod
    def _data_ips(cls, value: list[str]) -> list[str]:
        return [_ip(v) for v in value]

    @field_validator("nics")
    @classmethod
    def _nics(cls, value: list[str]) -> list[str]:
        for nic in value:
            if not _IFNAME.match(nic):
                raise ValueError(f"{nic!r} is not a Linux interface name (1-15 chars, no spaces)")
        return value

    @field_validator("management_ifname")
    @classmethod
    def _mgmt_ifname(cls, value: str | None) -> str | None:
        if value is not None and not _IFNAME.match(value):
            raise ValueError(f"{value!r} is not a Linux interface name (1-15 chars, no spaces)")
        return value

    @field_validator("hcas")
    @classmethod
    def _hcas(cls, value: list[str]) -> list[str]:
        for hca in value:
            if not _HCA.match(hca):
                raise ValueError(f"{hca!r} is not an HCA name like 'mlx5_0:1'")
        return value


class FabricConfig(_Model):
    """How the node's networks map onto vLLM, NCCL and Gloo.

    `control_plane` picks the network for VLLM_HOST_IP, Gloo, Ray and DP RPC; `nccl_socket` the interfaces
    NCCL bootstraps over. Seed 000 runs both on the first 400G NIC; seed 001 keeps them on management.
    """

    transport: Literal["roce", "ib", "socket"] = "roce"
    control_plane: Literal["data", "management"] = "data"
    nccl_socket: Literal["data", "management"] = "data"
    nccl_net: Literal["IB", "Socket"] | None = None
    nccl_debug: Literal["INFO", "WARN", "TRACE", "VERSION"] | None = "INFO"
    exact_ifnames: bool = Field(default=True, description="prefix NCCL lists with '=' (no prefix match)")
    env: dict[str, str] = Field(default_factory=dict, description="extra NCCL_*/UCX_* variables")
    private_networks: list[str] = Field(default_factory=list, description="CIDRs declared private")

    @field_validator("private_networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value


class ParallelismConfig(_Model):
    tensor: int = Field(ge=1, le=64)
    pipeline: int = Field(default=1, ge=1, le=64)
    data: int = Field(default=1, ge=1, le=1024)
    expert: bool = False
    backend: Literal["mp", "ray"] = "mp"
    data_parallel_rpc_port: int = Field(default=29550, ge=1, le=65535)


class ServingConfig(_Model):
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=1, le=65535)
    max_model_len: int = Field(ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    kv_cache_dtype: str | None = Field(default=None, description="default: the profile's")
    prefix_caching: bool = False
    trust_remote_code: bool = False
    dtype: str | None = None
    tokenizer_mode: str | None = Field(default=None, description="default: the profile's")
    tool_call_parser: str | None = Field(default=None, description="default: the profile's")
    reasoning_parser: str | None = Field(default=None, description="default: the profile's")
    auto_tool_choice: bool = True
    engine_ready_timeout_s: int = Field(default=3600, ge=60)
    extra_args: list[str] = Field(default_factory=list)


class SpeculativeConfig(_Model):
    """Rendered as `--speculative-config` JSON: method, num_speculative_tokens, then `options` in order."""

    method: str
    num_speculative_tokens: int = Field(ge=1, le=64)
    options: dict[str, Any] = Field(default_factory=dict)


class VolumeConfig(_Model):
    host: str
    container: str
    read_only: bool = False

    @field_validator("host", "container")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path (Docker's API has no compose directory), got {value!r}")
        return value


class ContainerConfig(_Model):
    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
    restart: Literal["no", "on-failure", "always", "unless-stopped"] = "unless-stopped"
    network_mode: Literal["host"] = "host"
    ipc_mode: Literal["host", "private", "shareable"] = "host"
    privileged: bool = False
    shm_size_mb: int | None = Field(default=None, ge=64)
    ulimits: dict[str, tuple[int, int]] = Field(
        default_factory=lambda: {"memlock": (-1, -1), "stack": (67108864, 67108864)}
    )
    cache_dir: str | None = Field(default=None, description="host dir mounted at /root/.cache")
    volumes: list[VolumeConfig] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    capabilities: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    set_cuda_visible_devices: bool = True

    @field_validator("cache_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute host path, got {value!r}")
        return value


class RayConfig(_Model):
    gcs_port: int = Field(default=6379, ge=1, le=65535)
    dashboard_port: int = Field(default=8265, ge=1, le=65535)
    client_port: int = Field(default=10001, ge=1, le=65535)
    cluster_ready_timeout_s: int = Field(default=600, ge=10)


class SmokeConfig(_Model):
    prompt: str = "17*19等于多少？只返回数字。"
    expect: str = "323"
    thinking_check: bool = True
    stream_check: bool = True


class ProxyLimits(_Model):
    """nginx limit_req / limit_conn. Per key = per client name in `proxy_keys`; per client = per source IP."""

    requests_per_minute_per_key: int = Field(default=600, ge=1)
    requests_per_minute_per_client: int = Field(default=1200, ge=1)
    burst: int = Field(default=20, ge=0, description="requests allowed above the rate before 429")
    connections_per_key: int = Field(default=64, ge=1, description="open requests (SSE streams count)")
    connections_per_client: int = Field(default=128, ge=1)


class ProxyConfig(_Model):
    """The nginx front door on the head node: TLS, bearer keys, limits, a path allowlist, SSE pass-through.

    Off by default, so a stack keeps its direct vLLM port until its config turns this on.
    """

    enabled: bool = False
    image: ImageConfig = Field(default_factory=lambda: ImageConfig(repository="nginx", tag="1.27-alpine"))
    container_name: str = Field(default="vllm-proxy", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
    bind: str = "0.0.0.0"
    port: int = Field(default=443, ge=1, le=65535)
    tls: bool = Field(default=True, description="certificate and key from the tls_* secrets")
    server_name: str | None = Field(default=None, description="nginx server_name and the endpoint's host")
    max_body_mb: int = Field(default=8, ge=1, le=1024)
    read_timeout_s: int = Field(default=3600, ge=30, description="longest silence on a streamed answer")
    limits: ProxyLimits = Field(default_factory=ProxyLimits)
    check_client: str | None = Field(default=None, description="whose key the API checks use; default the first")

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        return _ip(value)


class ApiConfig(_Model):
    """Post-deploy API checks and the optional front proxy. Neither ever touches an engine."""

    public_host: str | None = Field(default=None, description="address clients use; default head mgmt IP")
    health_timeout_s: int | None = Field(default=None, ge=10, description="default: engine timeout + 600")
    progress_interval_s: int = Field(default=30, ge=1)
    request_timeout_s: int = Field(default=300, ge=1)
    smoke: SmokeConfig = Field(default_factory=SmokeConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)


class FirewallConfig(_Model):
    """The host firewall (`stacks/firewall.py`): one nftables table per node that lets only the cluster reach
    its unauthenticated ports. On by default; `enabled: false` leaves the hosts' rules alone (plan warning)."""

    enabled: bool = True
    api_sources: list[str] | None = Field(
        default=None, description="CIDRs that may reach the API/proxy port; default: fabric.private_networks "
        "with the proxy off, anywhere with it on")
    ephemeral_ports: tuple[int, int] = Field(
        default=(32768, 60999), description="OS-picked listener ports (net.ipv4.ip_local_port_range) to guard")

    @field_validator("api_sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        for cidr in value or []:
            ipaddress.ip_network(cidr, strict=False)
        return value

    @field_validator("ephemeral_ports")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"must be [low, high] with 1024 <= low <= high <= 65535, got {list(value)}")
        return value


class StackConfig(_Model):
    """The whole `vllm-cluster:` namespace of a stack file."""

    image: ImageConfig
    model: ModelConfig
    nodes: list[NodeConfig] = Field(min_length=1)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    parallelism: ParallelismConfig
    serving: ServingConfig
    speculative: SpeculativeConfig | None = None
    vision: bool = False
    container: ContainerConfig
    ray: RayConfig = Field(default_factory=RayConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    firewall: FirewallConfig = Field(default_factory=FirewallConfig)
    api_key: str | None = Field(default=None, description="secret; set with `pulumi config set --secret`")
    ssh_private_key: str | None = Field(default=None, description="secret; for check commands (default: agent)")
    tls_certificate: str | None = Field(default=None, description="secret; PEM chain the proxy serves")
    tls_private_key: str | None = Field(default=None, description="secret; PEM key of tls_certificate")
    proxy_keys: dict[str, str] | None = Field(
        default=None, description="client name -> bearer key, each a secret: `config set --secret --path`")

    @field_validator("api_key", "ssh_private_key", "tls_certificate", "tls_private_key")
    @classmethod
    def _secret_only(cls, value: str | None) -> str | None:
        if value is not None and value != SECRET_MARKER:
            raise ValueError(
                "must be a Pulumi secret: run `pulumi config set --secret vllm-cluster:<key> <value>`"
            )
        return value

    @field_validator("proxy_keys")
    @classmethod
    def _client_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, key in (value or {}).items():
            if not _CLIENT.match(name):
                raise ValueError(f"client name {name!r} must match {_CLIENT.pattern} (it appears in access logs)")
            if key != SECRET_MARKER:
                raise ValueError(f"the key of client {name!r} must be a Pulumi secret: run "
                                 f"`pulumi config set --secret --path 'vllm-cluster:proxy_keys.{name}' <key>`")
        return value

    @property
    def head(self) -> NodeConfig:
        return self.nodes[0]


SECRET_KEYS: tuple[str, ...] = ("api_key", "ssh_private_key", "tls_certificate", "tls_private_key")
"""Top-level keys that must be `secure:` values; the Pulumi program reads them with get_secret."""

SECRET_OBJECT_KEYS: tuple[str, ...] = ("proxy_keys",)
"""Top-level objects whose every value is a secret (`config set --secret --path`); their keys are plain names."""

CONFIG_KEYS: tuple[str, ...] = tuple(StackConfig.model_fields)
