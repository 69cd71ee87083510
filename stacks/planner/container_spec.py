"""What a planned container is: the spec the plan shows and the components copy into `docker.Container`, and the
labels every engine container carries. Built by `stacks.planner.launch`; read by the plan, the monitoring files, the
components and the review tools.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

LABEL_PREFIX = "vllm-cluster"
GENERATION_LABEL = f"{LABEL_PREFIX}.generation"
"""The label holding the group's generation (`launch.group_generation`), on every engine container."""
NODE_LABEL = f"{LABEL_PREFIX}.node"
"""The node an engine container runs on (what `stacks preview-summary` places a container in its group by)."""
SECRETS_LABEL = f"{LABEL_PREFIX}.secrets-generation"
"""Set by the program, not the plan: the ID of the group's secrets holder (components/vllm_engine.py), new each
time the secrets change. Random, so it tells nothing about them."""


WEIGHTS_VERSION = "<version>"
"""Stands for the version a node's weight sync reports in a planned mount (`<host_dir>/<path>@<version>`): the plan
cannot know the listing's hash offline; the program mounts the directory the sync printed (docs/weights.md)."""


def is_versioned(host: str) -> bool:
    """Is this planned mount's host path the model's version directory, filled in by the program?"""
    return host.endswith("@" + WEIGHTS_VERSION)


class VolumeSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    host: str
    container: str
    read_only: bool


class HealthcheckSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    test: list[str]
    interval_s: int
    timeout_s: int
    retries: int
    start_period_s: int


class ContainerSpec(BaseModel):
    """One container of the engine group, as the plan shows it and the component creates it."""

    model_config = ConfigDict(frozen=True)
    name: str
    purpose: str
    image: str
    vllm_args: list[str] | None
    command: list[str]
    entrypoint: list[str] | None
    env: dict[str, str]
    """Plain variables only: what the plan, the dry run and labels may show."""
    secret_env: dict[str, str]
    """Variable -> the secret config key its value comes from (`api_key`, `env_secrets.HF_TOKEN`): the
    component takes each from a Pulumi secret; it never appears in argv, labels, the dry run or the plan."""
    network_mode: str
    ipc_mode: str
    privileged: bool
    gpus: str | None
    ulimits: dict[str, list[int]]
    shm_size_mb: int | None
    volumes: list[VolumeSpec]
    devices: list[str]
    capabilities: list[str]
    restart: str
    labels: dict[str, str]
    healthcheck: HealthcheckSpec | None
