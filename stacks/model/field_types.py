"""The types of every stack config value: what a field may hold, in one place.

Each type here refuses what would break a process, a command line, a file or a URL downstream, with a
message that says what works. Every config class in `stacks.model.config` builds on these, so a host is checked the
same way whether it is an SSH host, a public endpoint or a server name, and an IPv6 literal is bracketed the
same way wherever `host:port` is formed (`host_port`).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from stacks.model.masking import mask_secrets

WHAT_WORKS = "what_works"
"""A field's `json_schema_extra` key: the refusal's "what works" when not every allowed value is usable."""


class StrictModel(BaseModel):
    """The base of every config section: unknown keys refused, nothing coerced, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class Kind:
    """A field type's name in the config reference (docs/config-reference.md) and in error messages."""

    name: str


def refuse(message: str, fix: str) -> PydanticCustomError:
    """A field error in the project's words; the loader prints `message` and `fix` with the key and value."""
    return PydanticCustomError("vllm_cluster", message, {"fix": fix})


# --- secrets -----------------------------------------------------------------------------------------------


class Secret:
    """A value Pulumi holds as a secret. The pure model keeps only this marker, never the plaintext.

    A marker object (not a string) so that a plain `api_key: "[secret]"` in a file is a plain string, refused
    like any other plaintext secret, and never mistaken for one.
    """

    _instance: Secret | None = None

    def __new__(cls) -> Secret:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "[secret]"

    __str__ = __repr__

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _only_secret, serialization=core_schema.plain_serializer_function_ser_schema(lambda _: SECRET_TEXT))


SECRET = Secret()
SECRET_TEXT = "[secret]"
"""How a secret reads in the plan, in messages and in digests."""


def _only_secret(value: Any) -> Secret:
    if isinstance(value, Secret):
        return value
    raise refuse("holds a secret in plain config",
                 "pulumi config set --secret vllm-cluster:<key> <value> (the value is then encrypted)")


SecretValue = Annotated[Secret, Kind("secret")]


# --- text ------------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise refuse("contains a control character (newline, tab, NUL, ...)",
                     "one line of printable text")
    return value


def _pattern(regex: str, what: str, example: str) -> AfterValidator:
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise refuse(f"is not {what}", f"e.g. {example}")
        return value

    return AfterValidator(check)


Text = Annotated[str, Kind("text (one line)"), Field(min_length=1, max_length=2000), AfterValidator(_no_control)]
"""One line of printable text (prompts, expected answers, descriptions)."""

NodeName = Annotated[str, Kind("name [a-z0-9-]"), _pattern(
    r"[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?", "a node name: 1-42 of a-z 0-9 -, not starting or ending with -",
    "node1")]
GroupName = Annotated[str, Kind("group name [a-z0-9-]"), _pattern(
    r"[a-z][a-z0-9-]{0,31}", "a replica group name: 1-32 of a-z 0-9 -, starting with a letter (it names resources, "
    "firewall rule comments and containers)", "a")]
ContainerName = Annotated[str, Kind("container name"), _pattern(
    r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}", "a Docker container name: 1-63 of A-Z a-z 0-9 _ . -, starting with a "
    "letter or digit", "vllm-engine")]
ClientName = Annotated[str, Kind("client name [a-z0-9_-]"), _pattern(
    r"[a-z0-9][a-z0-9_-]{0,62}", "a client name: 1-63 of a-z 0-9 _ -, starting with a letter or digit (it "
    "appears in access logs)", "team-a")]
ServedModelName = Annotated[str, Kind("model name"), _pattern(
    r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}", "a served model name: 1-128 of A-Z a-z 0-9 . _ : / @ + -, no spaces",
    "DeepSeek-V4.1-Flash")]
ModelCardName = Annotated[str, Kind("model card name [a-z0-9._-]"), _pattern(
    r"[a-z0-9][a-z0-9._-]{0,62}", "a model card name (models/<name>.json): 1-63 of a-z 0-9 . _ -", "qwen3-8b")]
SshUser = Annotated[str, Kind("POSIX user"), _pattern(
    r"[a-z_][a-z0-9_.-]{0,31}", "a POSIX user name: 1-32 of a-z 0-9 _ . -, starting with a letter or _", "root")]
ParserName = Annotated[str, Kind("vLLM name [A-Za-z0-9_.-]"), _pattern(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", "a vLLM option value: 1-64 of A-Z a-z 0-9 _ . -", "deepseek_v41")]
Identifier = Annotated[str, Kind("identifier [a-z0-9_]"), _pattern(
    r"[a-z_][a-z0-9_]{0,63}", "a lower-case identifier: a-z 0-9 _", "draft_sample_method")]
EnvName = Annotated[str, Kind("env name"), _pattern(
    r"[A-Za-z_][A-Za-z0-9_]{0,127}", "an environment variable name: A-Z a-z 0-9 _, not starting with a digit, "
    "no '='", "NCCL_ASYNC_ERROR_HANDLING")]
def _no_credentials(value: str) -> str:
    """A credential in a plain env value would be printed by every plan and kept in `docker inspect`."""
    if mask_secrets(value) != value:
        raise refuse("holds a credential (user:password@, a token or a signature) in plain config",
                     "the whole variable as a secret: pulumi config set --secret --path "
                     "'vllm-cluster:env_secrets.<NAME>' <value>, and remove it here")
    return value


EnvValue = Annotated[str, Kind("env value (one line)"), Field(max_length=4096), AfterValidator(_no_control),
                     AfterValidator(_no_credentials)]
"""One line, at most 4096 characters: Docker passes env as `NAME=value` lines."""
LoadFormatName = Annotated[str, Kind("vLLM load format [a-z0-9_]"), _pattern(
    r"[a-z][a-z0-9_]{0,63}", "a vLLM load format: 1-64 of a-z 0-9 _, lower case (the names the image card lists "
    "under load_formats)", "safetensors")]
_LOADER_TEXT = re.compile(r"[A-Za-z0-9._~:/%{}@+=-]{1,1024}")


def _loader_value(value: Any) -> Any:
    """One check per value, so a wrong one gets one message (a union would report every branch)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > 2**53:
            raise refuse("is a number too large for JSON", "an integer within +-2**53")
        return value
    if isinstance(value, str):
        if not _LOADER_TEXT.fullmatch(value):
            raise refuse("is not a loader option string: 1-1024 of A-Z a-z 0-9 . _ ~ : / % { } @ + = - (a path, URL "
                         "or file-name pattern; no spaces, quotes, ';', control or non-ASCII characters)",
                         "e.g. s3://bucket/model-%03d.tensors")
        return _no_credentials(value)
    raise refuse("is not a boolean, an integer or a string (the loaders of vLLM 0.33.0 read no other JSON here)",
                 "true/false, a whole number, or one string")


LoaderOptionValue = Annotated[bool | Annotated[int, Field(ge=-(2**53), le=2**53)] | str,
                              Kind("boolean, integer or string"), BeforeValidator(_loader_value)]
"""A `serving.model_loader_extra_config` value: the loaders of vLLM 0.33.0 read only booleans, integers and strings
(stacks/planner/load_formats.py checks each key against the chosen loader); no nested JSON."""
Tag = Annotated[str, Kind("Docker tag"), _pattern(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", "a Docker tag: 1-128 of A-Z a-z 0-9 _ . -, not starting with . or -",
    "v0.33.0")]
Digest = Annotated[str, Kind("sha256 digest"), _pattern(
    r"sha256:[0-9a-f]{64}", "an image digest", "sha256:<64 lower-case hex digits>")]
def _fabric_ifname(value: str) -> str:
    """Loopback and container bridges carry no traffic between nodes: NCCL/Gloo on them cannot connect."""
    if value == "lo" or value == "docker0" or value.startswith(("veth", "virbr", "br-", "cni", "flannel")):
        raise refuse("is a loopback or container-bridge interface: nothing reaches another node through it",
                     "the NIC of the network between the nodes, e.g. ens11np0 or bond0")
    return value


IfName = Annotated[str, Kind("interface name"), _pattern(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}", "a Linux interface name: 1-15 of A-Z a-z 0-9 _ . -", "ens11np0"),
    AfterValidator(_fabric_ifname)]
HcaName = Annotated[str, Kind("HCA dev:port"), _pattern(
    r"[A-Za-z0-9_]{1,32}(:[1-9][0-9]{0,2})?", "an RDMA device and port", "mlx5_0:1")]


# --- numbers ---------------------------------------------------------------------------------------------

Port = Annotated[int, Kind("port"), Field(ge=1, le=65535)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


# --- addresses -------------------------------------------------------------------------------------------

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_ip_literal(value: str) -> bool:
    """An IPv4 or IPv6 literal (a host that needs no name resolution)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def is_hostname(value: str) -> bool:
    """RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens; the last label is not
    all digits (so a mistyped IPv4 like `10.30.8` is not taken for a name)."""
    if not value or len(value) > 253 or value.endswith("."):
        return False
    labels = value.split(".")
    return (all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()
            and not looks_like_mistyped_ipv4(value))


def looks_like_mistyped_ipv4(value: str) -> bool:
    """Three numbers of an IPv4 address and a fourth part of digits and letters that look like digits
    (`192.168.10.2l`: a letter l for a one; O for 0): RFC 1123 allows it as a name, but no one names a host that
    way. A real name (`1.2.3.example`, `10.40.0.1e2`) is left alone."""
    labels = value.split(".")
    return (len(labels) == 4 and all(label.isdigit() and int(label) <= 255 for label in labels[:3])
            and 0 < len(labels[3]) <= 3 and any(c.isdigit() for c in labels[3])
            and not labels[3].isdigit() and all(c.isdigit() or c in "lIoO" for c in labels[3]))


def _ip(value: str) -> str:
    if "%" in value:
        raise refuse("has an IPv6 zone (%...)", "the address without its zone; the interface is set elsewhere")
    if value.startswith("["):
        raise refuse("is bracketed", "the bare address (brackets are added where host:port is formed)")
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise refuse("is not an IPv4 or IPv6 address", "e.g. 10.30.8.1 or fd00::1") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise refuse("is an IPv4 address written as IPv6 (::ffff:…): it would compare unequal to the same address "
                     "elsewhere and land in the firewall's IPv6 set", f"{address.ipv4_mapped}")
    return str(address)


def _host(value: str) -> str:
    """A host something connects to: a name, or the address of one host (not 0.0.0.0, ::, multicast, broadcast).
    Spaces around it are dropped, as for an IP address field."""
    value = value.strip()
    if is_hostname(value):
        return value.lower()
    if looks_like_mistyped_ipv4(value):
        raise refuse("looks like a mistyped IPv4 address (three numbers and a fourth part that is not one)",
                     "the address with digits only, e.g. 192.168.10.21, or a real host name")
    try:
        literal = _ip(value)
    except PydanticCustomError as exc:
        if "written as IPv6" in str(exc):
            raise
        raise refuse("is neither an IP address nor an RFC 1123 host name",
                     "e.g. 10.30.8.1, fd00::1 or gpu-node-1.example.com") from None
    return _one_host(literal)


def _one_host(value: str) -> str:
    address = ipaddress.ip_address(value)
    if address.is_unspecified or address.is_multicast or value == "255.255.255.255":
        raise refuse("is not the address of one host (unspecified, multicast or broadcast)",
                     "the host's own address, e.g. 10.30.8.1")
    return value


def _server_name(value: str) -> str:
    name = value[2:] if value.startswith("*.") else value
    if not is_hostname(name) or (value.startswith("*.") and "." not in name):
        raise refuse("is not a DNS host name (nginx server_name takes host names only here)",
                     "e.g. llm.example.com or *.llm.example.com")
    return value.lower()


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise refuse("is not a CIDR network", "e.g. 10.30.8.0/24 or fd00::/64") from None
        raise refuse(f"has host bits set ({exc})", f"{loose}") from None


IpAddress = Annotated[str, Kind("IP address"), BeforeValidator(lambda v: v if not isinstance(v, str) else v.strip()),
                      Field(min_length=2, max_length=45), AfterValidator(_ip)]
"""An IPv4 or IPv6 literal, stored in its canonical form (`fd00:0::1` reads `fd00::1`)."""
HostAddress = Annotated[str, Kind("IP address of one host"),
                        BeforeValidator(lambda v: v if not isinstance(v, str) else v.strip()),
                        Field(min_length=2, max_length=45), AfterValidator(_ip), AfterValidator(_one_host)]
"""A node's own address: a literal that is not unspecified, multicast or broadcast."""
Host = Annotated[str, Kind("host (IP or RFC 1123 name)"), Field(min_length=1, max_length=253), AfterValidator(_host)]
"""An IP literal or an RFC 1123 host name (what SSH, URLs and nginx can all take)."""
ServerName = Annotated[str, Kind("DNS name"), Field(min_length=1, max_length=253), AfterValidator(_server_name)]
Cidr = Annotated[str, Kind("CIDR"), Field(min_length=3, max_length=49), AfterValidator(_cidr)]


URL_PATH = re.compile(r"/[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*")
"""An absolute URL path of RFC 3986 unreserved characters only: nothing nginx, PCRE or a shell reads specially
(no `$ { } ; ' " \\ ( ) | ^ * ? + % #`, no spaces, no percent-encoding), no empty segment, no trailing `/`."""


def _url_path(value: str) -> str:
    if not URL_PATH.fullmatch(value):
        raise refuse("is not an absolute URL path of letters, digits and . _ ~ - between single '/' (no regex, "
                     "no trailing '/', no percent-encoding)", "e.g. /v1/embeddings")
    if any(segment in (".", "..") for segment in value.split("/")):
        raise refuse("has a '.' or '..' segment", "the normalised path, e.g. /v1/embeddings")
    return value


UrlPath = Annotated[str, Kind("URL path"), Field(min_length=2, max_length=256), AfterValidator(_url_path)]
"""An exact path the proxy passes to vLLM (`location = …`)."""


def host_port(host: str, port: int | str) -> str:
    """`host:port` with IPv6 bracketed: Ray (`ray._raylet.parse_address`), URLs and nginx all need it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bracket_host(host: str) -> str:
    """An IPv6 literal in brackets (URLs, nginx `listen`); names and IPv4 as they are."""
    return f"[{host}]" if ":" in host else host


# --- SSH host keys ---------------------------------------------------------------------------------------

HOST_KEY_TYPES = {"ssh-ed25519": None, "ecdsa-sha2-nistp256": 65, "ecdsa-sha2-nistp384": 97,
                  "ecdsa-sha2-nistp521": 133}
"""Host key types and, for ECDSA, the length of the uncompressed point (RFC 5656 3.1). No `ssh-rsa`:
pulumi-command offers the key's own type as its only host key algorithm (provider/pkg/provider/remote/
connection.go `SSHConfig`: `HostKeyAlgorithms = []string{publicKey.Type()}`), which for RSA is SHA-1 `ssh-rsa`,
and OpenSSH >= 8.8 servers refuse that by default: the pinned connection would never come up."""


def _ssh_string(blob: bytes, at: int) -> tuple[bytes, int]:
    if at + 4 > len(blob):
        raise ValueError("truncated")
    size = int.from_bytes(blob[at:at + 4], "big")
    if at + 4 + size > len(blob):
        raise ValueError("truncated")
    return blob[at + 4:at + 4 + size], at + 4 + size


def _host_key(value: str) -> str:
    import binascii

    fix = ("the node's key as `ssh-keyscan -t ed25519 <host>` prints it, without the host: "
           "`ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA…` (verify its fingerprint on the console: ssh-keygen -lf)")
    parts = value.split(" ")
    if len(parts) != 2:
        raise refuse("is not `<type> <base64>` (no host name in front, no options, no comment after)", fix)
    kind, data = parts
    if kind == "ssh-rsa":
        raise refuse("is an RSA key: pulumi-command would offer only SHA-1 ssh-rsa, which OpenSSH >= 8.8 refuses",
                     "the node's ed25519 (or ecdsa) host key: ssh-keyscan -t ed25519 <host>")
    if kind not in HOST_KEY_TYPES:
        raise refuse(f"has key type {kind[:40]!r}", f"one of {', '.join(HOST_KEY_TYPES)}; {fix}")
    try:
        blob = binascii.a2b_base64(data, strict_mode=True)
        name, at = _ssh_string(blob, 0)
        if name.decode("ascii", "replace") != kind:
            raise ValueError(f"the key inside is {name[:40]!r}")
        if kind == "ssh-ed25519":
            point, at = _ssh_string(blob, at)
            if len(point) != 32:
                raise ValueError("an ed25519 key is 32 bytes")
        else:
            curve, at = _ssh_string(blob, at)
            point, at = _ssh_string(blob, at)
            if curve.decode("ascii", "replace") != kind.rsplit("-", 1)[1] or len(point) != HOST_KEY_TYPES[kind] \
                    or point[:1] != b"\x04":
                raise ValueError("not a valid ECDSA public key for its curve")
        if at != len(blob):
            raise ValueError("trailing bytes")
    except (binascii.Error, ValueError) as exc:
        raise refuse(f"is not a {kind} public key ({exc})", fix) from None
    return value


SshHostKey = Annotated[str, Kind("SSH host key"), Field(min_length=20, max_length=1024), AfterValidator(_host_key)]
"""One OpenSSH public key line, `<type> <base64>`: what `ssh-keyscan` prints after the host name."""


# --- paths -----------------------------------------------------------------------------------------------

_PATH_CHARS = re.compile(r"[A-Za-z0-9_.+@%=~/-]+")


def _abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise refuse("is not an absolute path", "e.g. /mnt/models (Docker's API has no working directory)")
    if not _PATH_CHARS.fullmatch(value):
        raise refuse("has characters a path here may not hold (spaces, ':', ',', quotes, $, control "
                     "characters, ...)", "letters, digits and _ . + @ % = ~ / -")
    parts = value.split("/")
    if ".." in parts or "." in parts:
        raise refuse("has '.' or '..' segments", f"the normalised path {posixpath.normpath(value)}")
    normal = "/" + posixpath.normpath(value).lstrip("/")  # POSIX keeps a leading `//`; nothing here should
    if normal != value:
        raise refuse("is not normalised (double or trailing '/')", normal)
    return value


def _rel_path(value: str) -> str:
    value = value.strip("/")
    if not value:
        raise refuse("is empty", "the model's directory inside model.host_dir, e.g. deepseek-ai/DeepSeek-V4.1-Flash")
    if not _PATH_CHARS.fullmatch(value):
        raise refuse("has characters a path here may not hold (spaces, ':', ',', quotes, $, ...)",
                     "letters, digits and _ . + @ % = ~ / -")
    parts = value.split("/")
    if ".." in parts or "." in parts or "" in parts:
        raise refuse("has '.', '..' or empty segments", "a plain relative path, e.g. deepseek-ai/DeepSeek-V4.1-Flash")
    return value


AbsPath = Annotated[str, Kind("absolute path"), Field(min_length=1, max_length=4096), AfterValidator(_abs_path)]
"""Absolute and normalised: no `..`, no `//`, nothing a Docker bind string or a shell could misread."""
RelPath = Annotated[str, Kind("relative path"), Field(min_length=1, max_length=4096), AfterValidator(_rel_path)]


def _device(value: str) -> str:
    _abs_path(value)
    if not value.startswith("/dev/"):
        raise refuse("is not a device path", "e.g. /dev/infiniband")
    return value


DevicePath = Annotated[str, Kind("/dev path"), Field(min_length=6, max_length=256), AfterValidator(_device)]


# --- Docker ----------------------------------------------------------------------------------------------

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?"
REPOSITORY = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
"""Docker's reference grammar (distribution/reference `reference.go`): `[domain[:port]/]path`, path
components lower-case alphanumerics joined by `.`, `_`, `__` or dashes."""


def _repository(value: str) -> str:
    first, _, rest = value.partition("/")
    has_domain = bool(rest) and ("." in first or ":" in first or first == "localhost" or first != first.lower())
    if not REPOSITORY.fullmatch(value) or len(value) > 255 or (not has_domain and value != value.lower()):
        raise refuse("is not a Docker repository name ([registry[:port]/]path, path in lower case)",
                     "e.g. vllm/vllm-openai or registry.example.com:5000/vllm/vllm-openai")
    return value


Repository = Annotated[str, Kind("Docker repository"), Field(min_length=1, max_length=255), AfterValidator(_repository)]

_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _image_ref(value: str) -> str:
    """`repo:tag` or `repo:tag@sha256:<64 hex>`: the tag is what reviewers read, the digest what Docker pulls."""
    name, at, digest = value.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    example = "e.g. grafana/grafana:11.6.0@sha256:<64 hex>"
    if colon <= slash or not _TAG.fullmatch(name[colon + 1:]) or (at and not _DIGEST.fullmatch(digest)):
        raise refuse("is not repo:tag or repo:tag@sha256:<64 hex>", example)
    _repository(name[:colon])
    return value


ImageRef = Annotated[str, Kind("image reference"), Field(min_length=3, max_length=512), AfterValidator(_image_ref)]

CAPABILITIES = frozenset({
    "AUDIT_CONTROL", "AUDIT_READ", "AUDIT_WRITE", "BLOCK_SUSPEND", "BPF", "CHECKPOINT_RESTORE", "CHOWN",
    "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "IPC_LOCK", "IPC_OWNER", "KILL", "LEASE",
    "LINUX_IMMUTABLE", "MAC_ADMIN", "MAC_OVERRIDE", "MKNOD", "NET_ADMIN", "NET_BIND_SERVICE", "NET_BROADCAST",
    "NET_RAW", "PERFMON", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYSLOG", "SYS_ADMIN", "SYS_BOOT",
    "SYS_CHROOT", "SYS_MODULE", "SYS_NICE", "SYS_PACCT", "SYS_PTRACE", "SYS_RAWIO", "SYS_RESOURCE", "SYS_TIME",
    "SYS_TTY_CONFIG", "WAKE_ALARM",
})
"""Linux capabilities (capabilities(7)), the names Docker's `--cap-add` takes."""


def _capability(value: str) -> str:
    name = value.upper().removeprefix("CAP_")
    if name not in CAPABILITIES:
        raise refuse("is not a Linux capability", "e.g. IPC_LOCK (capabilities(7))")
    return name


Capability = Annotated[str, Kind("Linux capability"), Field(min_length=1, max_length=32), AfterValidator(_capability)]

ULIMITS = frozenset({"core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
                     "rss", "rtprio", "rttime", "sigpending", "stack"})
"""The ulimit names Docker accepts (`docker run --ulimit`, go-units `ulimit.go`)."""


def _ulimit_name(value: str) -> str:
    if value not in ULIMITS:
        raise refuse("is not a ulimit Docker knows", f"one of {', '.join(sorted(ULIMITS))}")
    return value


UlimitName = Annotated[str, Kind("ulimit name"), AfterValidator(_ulimit_name)]
UlimitValue = Annotated[int, Field(ge=-1, le=2**62)]
"""-1 is unlimited."""


def _ulimit_pair(value: list[int]) -> list[int]:
    soft, hard = value
    if hard != -1 and (soft == -1 or soft > hard):
        raise refuse("has a soft limit above the hard limit", "[soft, hard] with soft <= hard, or -1 for both")
    return value


UlimitPair = Annotated[list[UlimitValue], Kind("[soft, hard]"), Field(min_length=2, max_length=2),
                       AfterValidator(_ulimit_pair)]
