"""Run the real Pulumi program under Pulumi's own mocks, with config taken from a committed stack file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker

from review.registrations import own_event_loop
from stacks.model.loader import read_stack_values

SECRET_VALUES = {"api_key": "sk-mock-key-123", "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----mock"}


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None


@dataclass
class Mocks(pulumi.runtime.Mocks):
    resources: list[Registered] = field(default_factory=list)
    stdout: dict[str, str] = field(default_factory=dict)
    """What a command resource of that name printed (default `PASS <name>: mocked`)."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(Registered(args.typ, args.name, dict(args.inputs), args.provider))
        state = dict(args.inputs)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            state["imageId"] = f"sha256:mock-{args.name}"
        if args.typ.startswith("command:"):
            state["stdout"] = self.stdout.get(args.name, f"PASS {args.name}: mocked")
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> Registered:
        return next(r for r in self.resources if r.name == name)


@dataclass
class Run:
    mocks: Mocks
    result: dict[str, Any]
    options: dict[str, pulumi.ResourceOptions]
    outputs: dict[str, Any]
    error: Exception | None = None
    all_options: dict[str, pulumi.ResourceOptions] = field(default_factory=dict)
    """Options of every custom resource (containers, commands, images), by name."""


def run_program(stack: str, values: dict[str, Any] | None = None, preview: bool = False,
                secrets: dict[str, Any] | None = None, stdout: dict[str, str] | None = None) -> Run:
    """Evaluate components.program.deploy under mocks; returns what was registered and with which options."""
    with own_event_loop():
        return _run_program(stack, values, preview, secrets, stdout)


def _run_program(stack: str, values: dict[str, Any] | None, preview: bool,
                 secrets: dict[str, Any] | None, stdout: dict[str, str] | None) -> Run:
    from components.program import deploy, restored_gc

    values = values if values is not None else read_stack_values(stack)
    secrets = SECRET_VALUES if secrets is None else secrets
    mocks = Mocks(stdout=dict(stdout or {}))
    pulumi.runtime.set_mocks(mocks, project="vllm-cluster", stack=stack, preview=preview)
    config = {f"vllm-cluster:{k}": json.dumps(v) for k, v in values.items() if k not in secrets}
    config |= {f"vllm-cluster:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in secrets.items()}
    pulumi.runtime.set_all_config(config, secret_keys=[f"vllm-cluster:{k}" for k in secrets])
    options: dict[str, pulumi.ResourceOptions] = {}
    original = docker.Container.__init__

    def spy(self: Any, resource_name: str, *args: Any, **kwargs: Any) -> None:
        options[resource_name] = kwargs.get("opts") or pulumi.ResourceOptions()
        original(self, resource_name, *args, **kwargs)

    run = Run(mocks, {}, options, {})
    custom_init = pulumi.CustomResource.__init__

    def spy_all(self: Any, t: str, name: str, props: Any = None, opts: Any = None, *args: Any, **kwargs: Any) -> None:
        run.all_options[name] = opts or pulumi.ResourceOptions()
        custom_init(self, t, name, props, opts, *args, **kwargs)

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> pulumi.Output[Any]:
        run.result.update(deploy(stack))
        return pulumi.Output.from_input(run.result["outputs"]).apply(run.outputs.update)

    docker.Container.__init__ = spy  # type: ignore[method-assign,assignment]
    pulumi.CustomResource.__init__ = spy_all  # type: ignore[method-assign]
    try:
        with restored_gc():  # deploy() defers full collections for the rest of its process
            program()
    except Exception as exc:  # a bad config must raise before anything registers
        run.error = exc
    finally:
        docker.Container.__init__ = original  # type: ignore[method-assign]
        pulumi.CustomResource.__init__ = custom_init  # type: ignore[method-assign]
    return run


def _expanded(resource: pulumi.Resource) -> list[pulumi.Resource]:
    """A local component stands for its children, as Pulumi expands it (`rpc._add_dependency`)."""
    if isinstance(resource, pulumi.ComponentResource):
        return [x for child in resource._childResources for x in _expanded(child)]
    return [resource]


def waits_for(run: Run, resource: pulumi.Resource, target: pulumi.Resource) -> bool:
    """Whether Pulumi starts `resource` only after `target` finished: a path of `depends_on` edges from one to the
    other (Pulumi registers a resource only after all it depends on have finished their steps)."""
    seen: set[int] = set()
    todo = [resource]
    while todo:
        opts = run.all_options.get(todo.pop()._name)
        for dep in (opts.depends_on if opts and isinstance(opts.depends_on, list) else []) or []:
            for x in _expanded(dep):
                if x is target:
                    return True
                if id(x) not in seen:
                    seen.add(id(x))
                    todo.append(x)
    return False


def dependency_edges(run: Run) -> int:
    """Explicit `depends_on` edges of the custom resources, components expanded (what the engine receives)."""
    return sum(len(_expanded(d)) for opts in run.all_options.values()
               for d in (opts.depends_on if isinstance(opts.depends_on, list) else []) or [])
