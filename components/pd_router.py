"""The router in front of prefill/decode groups, on the stack's head: its pinned wheel fetched and checked there,
its container, and the prefill/decode check through it (checks/pd.py). Everything it runs is rendered by the pure
planner (stacks/planner/router.py); this only wires the resources, after every group's turn."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from checks.bundle import heredoc_command
from components.gpu_node import GpuNode
from components.vllm_engine import container_args, secrets_trigger
from stacks.model.config import StackConfig
from stacks.planner.container_spec import ContainerSpec
from stacks.planner.plan import thinking_kwarg
from stacks.planner.router import (
    ROUTER_RESOURCE,
    RouterSpec,
    check_pd_argv,
    wheel_install_script,
    wheel_remove_script,
)

ROUTER_KEY_ENV = "OPENAI_API_KEY"
"""What the router sends the instances (stacks/planner/router.py): the check reads the key from the same variable
inside the router's container, so it never travels."""


@dataclass
class PdRouter:
    wheel: command.remote.Command
    container: docker.Container
    check: command.remote.Command


def check_command(config: StackConfig, spec: RouterSpec, container: str, timeout_s: int) -> str:
    """checks/pd.py inside the router's container (its image is vLLM's: httpx and pydantic are there), as a heredoc
    over SSH; the key is the container's own OPENAI_API_KEY; reasoning off with the model's own key, as the API
    checks turn it off (a Qwen3 reasons unless told not to)."""
    args = [*check_pd_argv(spec, config.model.served_name, program=(), api_key_env=ROUTER_KEY_ENV,
                           thinking_kwarg=thinking_kwarg(config)[0]),
            "--ready-wait-s", str(spec.worker_startup_timeout_s)]
    return heredoc_command("pd", args, prefix=f"docker exec -i {shlex.quote(container)} ",
                           timeout_s=timeout_s)


def pd_router(config: StackConfig, spec: RouterSpec, plan_spec: ContainerSpec, head: GpuNode,
              secrets: Mapping[str, pulumi.Output[Any]], triggers: Sequence[pulumi.Input[str]],
              after: Sequence[pulumi.Resource]) -> PdRouter:
    """The wheel on the head, then the router (once every group's turn is over: it waits for every instance's
    /health before it serves), then the check of every prefill x decode pair through it. `plan_spec`: the router's
    container as the plan renders it (stack_plan.py `StackPlan.router_container_spec`)."""
    settings = config.disaggregation
    assert settings is not None
    sudo = "" if config.head.ssh.user == "root" else "sudo -n "
    wheel = command.remote.Command(
        "router-wheel", connection=head.connection, triggers=[settings.router.wheel_url],
        create=f"{sudo}sh -c {shlex.quote(wheel_install_script(settings.router.wheel_url))}",
        delete=f"{sudo}sh -c {shlex.quote(wheel_remove_script())}",
        opts=pulumi.ResourceOptions(depends_on=[head.preflight]))
    key = {"api_key": secrets["api_key"]}
    container = docker.Container(
        ROUTER_RESOURCE, args=container_args(plan_spec, head.image.image_id, key, secrets_trigger(key)),
        opts=pulumi.ResourceOptions(provider=head.provider, depends_on=[wheel, *after], delete_before_replace=True))
    timeout = spec.worker_startup_timeout_s + 600
    check = command.remote.Command(
        "check-pd", connection=head.connection, triggers=[*triggers, container.id],
        create=check_command(config, spec, plan_spec.name, timeout),
        opts=pulumi.ResourceOptions(depends_on=[container], custom_timeouts=pulumi.CustomTimeouts(
            create=f"{timeout + 60}s", update=f"{timeout + 60}s")))
    return PdRouter(wheel, container, check)
