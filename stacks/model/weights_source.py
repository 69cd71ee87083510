"""`model.source`: where every node syncs the model directory from (S3, MinIO, Ceph RGW), validated at plan time.

The values are checked by the functions the sync itself uses (`stacks/model/s3_source.py`: `parse_source`,
`check_endpoint`, `REGION_RE`, the workers and part-size bounds), so a source the node would refuse with exit 2 is
refused at preview instead, with the key and a fix; and masked by its `mask_source` / `mask_endpoint` before
validation, so a presigned signature, a password or an endpoint path never reaches a message.

Credentials are not here: they are the top-level secrets `s3_access_key_id`, `s3_secret_access_key` and
`s3_session_token` (stacks/model/config.py `SECRET_KEYS`), which reach the node on the remote command's stdin, never in
argv or plain state.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from stacks.model.field_types import Kind, refuse
from stacks.model.s3_source import (
    DEFAULT_PART_MB,
    DEFAULT_WORKERS,
    MAX_PART_MB,
    MAX_WORKERS,
    MIN_PART_MB,
    REGION_RE,
    SYNC_TIMEOUT_S,
    CannotRun,
    check_endpoint,
    mask_endpoint,
    mask_source,
    parse_source,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CREDENTIAL_KEY = re.compile(r"key|secret|token|passw|credential", re.I)


def _reason(exc: Exception, flag: str, shown: str) -> str:
    """The sync's message without its leading `--flag 'value'` (the loader prints the key and the value)."""
    return str(exc).removeprefix(f"{flag} {shown!r}").lstrip(": ")


def _s3_url(value: str) -> str:
    if _CONTROL.search(value):
        raise refuse("contains a control character", "s3://BUCKET/PREFIX on one line")
    try:
        parse_source(value)
    except CannotRun as exc:
        message = _reason(exc, "--source", mask_source(value)).replace("--endpoint-url", "endpoint_url")
        raise refuse(message.replace("the AWS_* credentials", "the s3_* secrets"),
                     "s3://BUCKET/PREFIX, e.g. s3://team-weights/deepseek/DeepSeek-V4.1-Flash (MinIO / "
                     "Ceph RGW: add endpoint_url)") from None
    return value


def _endpoint(value: str) -> str:
    if _CONTROL.search(value):
        raise refuse("contains a control character", "http(s)://HOST[:PORT] on one line")
    try:
        check_endpoint(value)
    except CannotRun as exc:
        message = _reason(exc, "--endpoint-url", mask_endpoint(value)).replace("--source", "url")
        raise refuse(message.replace(" and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment", ""),
                     "http(s)://HOST[:PORT] of the store, e.g. https://minio.internal:9000; credentials go in "
                     "the s3_* secrets") from None
    return value


def _masked(value: Any, mask: Callable[[str], str]) -> Any:
    """A URL with what must not be echoed (userinfo, a query or presigned signature, an endpoint's path) masked
    before anything can print it; the masked value is refused as the original would be."""
    return mask(value) if isinstance(value, str) else value


def _region(value: str) -> str:
    if not REGION_RE.match(value):
        raise refuse("is not a region name", "e.g. us-east-1 (MinIO and Ceph RGW accept any; us-east-1 is usual)")
    return value


S3Url = Annotated[str, Kind("s3:// URL"), Field(min_length=8, max_length=1024), AfterValidator(_s3_url)]
EndpointUrl = Annotated[str, Kind("http(s) URL"), Field(min_length=8, max_length=2048), AfterValidator(_endpoint)]
Region = Annotated[str, Kind("region"), Field(min_length=1, max_length=63), AfterValidator(_region)]


class WeightsSource(BaseModel):
    """An S3 prefix every node syncs `model.host_dir`/`model.path` from (`checks.weights sync`, inside the stack's
    image), before any engine moves. A plain string is the url alone."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    url: S3Url = Field(description="s3://BUCKET/PREFIX holding config.json, the tokenizer and the shards")
    endpoint_url: EndpointUrl | None = Field(
        default=None, description="S3-compatible store (MinIO, Ceph RGW): http(s)://HOST[:PORT]; default AWS")
    region: Region | None = Field(default=None, description="signing region (default: us-east-1)")
    workers: int = Field(default=DEFAULT_WORKERS, ge=1, le=MAX_WORKERS, description="parallel ranged GETs per node")
    part_size_mb: int = Field(default=DEFAULT_PART_MB, ge=MIN_PART_MB, le=MAX_PART_MB,
                              description="MiB per ranged GET, the unit an interrupted sync resumes from")
    delete: bool = Field(default=False, description="delete files in the model directory that the prefix lacks")
    timeout_s: int = Field(default=SYNC_TIMEOUT_S, ge=600, le=172_800,
                           description="outer timeout of one node's sync; a sync cut by it resumes at the next "
                           "`pulumi up`")
    keep_versions: int = Field(default=2, ge=1, le=20,
                               description="version directories kept on each node after the group passed its checks, "
                               "the one in use included (older ones, never one a container mounts, are removed)")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {"url": value}
        if not isinstance(value, dict):
            return value
        # Credentials written here by mistake are refused as unknown keys without being echoed back.
        value = {k: "[redacted: credentials go in the s3_* secrets]" if k not in cls.model_fields
                 and _CREDENTIAL_KEY.search(str(k)) else v for k, v in value.items()}
        if "url" in value:  # nor a presigned URL's signature
            value["url"] = _masked(value["url"], mask_source)
        if "endpoint_url" in value:  # nor a password or a path in the endpoint
            value["endpoint_url"] = _masked(value["endpoint_url"], mask_endpoint)
        return value

    def identity(self) -> dict[str, Any]:
        """What selects the bytes: a change to any of these is a different checkpoint (the engines are replaced).
        Workers, part size, delete and timeout only change how they travel and what else the directory holds."""
        return {"url": self.url.rstrip("/"), "endpoint_url": self.endpoint_url, "region": self.region}
