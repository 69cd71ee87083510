"""ApiEndpoint: the OpenAI-compatible entry point and the post-deploy smoke tests that prove it answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command


@dataclass(frozen=True)
class ApiEndpointArgs:
    endpoint: str
    served_model: str
    health_command: str
    smoke_command: str
    triggers: list[str]
    """Engine generation plus the API check settings: either change re-runs the checks."""
    after: Sequence[pulumi.Resource]
    api_key: pulumi.Input[str] | None = None


class ApiEndpoint(pulumi.ComponentResource):
    health: command.local.Command
    smoke: command.local.Command

    def __init__(self, name: str, args: ApiEndpointArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-cluster:index:ApiEndpoint", name, None, opts)
        env: dict[str, pulumi.Input[str]] = {}
        if args.api_key is not None:
            env["VLLM_API_KEY"] = pulumi.Output.secret(args.api_key)
        # Runs where `pulumi up` runs (the project dir); the key travels in the environment,
        # never in argv or state outputs.
        self.health = command.local.Command(
            f"{name}-health", create=args.health_command, environment=env or None,
            triggers=list(args.triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)))
        self.smoke = command.local.Command(
            f"{name}-smoke", create=args.smoke_command, environment=env or None,
            triggers=list(args.triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=[self.health]))
        self.endpoint = pulumi.Output.from_input(args.endpoint)
        self.served_model = pulumi.Output.from_input(args.served_model)
        self.verification = pulumi.Output.all(self.health.stdout, self.smoke.stdout).apply(
            lambda outs: " / ".join(_last_line(o) for o in outs))
        self.register_outputs({"endpoint": self.endpoint, "served_model": self.served_model,
                               "verification": self.verification})


def _last_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[-1] if (text or "").strip() else ""
