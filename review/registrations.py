"""What the Pulumi program registers for a stack config, without an engine: the real program under Pulumi's mocks.

Used by `python -m stacks matrix` (review/replacement.py) to see, for a change of one config key, which resource
inputs move. The mocks answer like the providers where an output feeds another input: a RemoteImage's `imageId`
is derived from the image it pulls (a new image gives the containers a new `image` input, as a real pull does);
everything else echoes its inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime.settings import ROOT

from review.matrix import RegisterError
from review.replacement import REMOTE_IMAGE, Registration


class ProgramError(RegisterError):
    """The program raised (a config the plan refuses); nothing was registered."""


@dataclass
class _Mocks(pulumi.runtime.Mocks):
    seen: list[tuple[str, str, dict[str, Any], bool]] = field(default_factory=list)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.seen.append((args.typ, args.name, dict(args.inputs), bool(args.custom)))
        state = dict(args.inputs)
        if args.typ == REMOTE_IMAGE:
            state["imageId"] = "sha256:" + hashlib.sha256(str(args.inputs.get("name")).encode()).hexdigest()
        if args.typ.startswith("command:"):
            state["stdout"] = f"PASS {args.name}"
            # pulumi-command gives each create a new random ID; a replacement (changed triggers) is a create
            triggers = json.dumps(args.inputs.get("triggers"), sort_keys=True, default=str)
            return f"{args.name}-{hashlib.sha256(triggers.encode()).hexdigest()[:16]}", state
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The program's plan warnings go to pulumi.log, which the mocks route to the root logger."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


class _ProcessThreads(ThreadPoolExecutor):
    """The mocks' monitor calls run in the loop's default executor, and each of its threads keeps an event loop of
    its own (pulumi.runtime.sync_await._ensure_event_loop). One pool for the process, which a closing loop may not
    shut down, so those thread loops are made once rather than orphaned by every run."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Kept for the next run; the threads end with the process."""


_MONITOR_THREADS = _ProcessThreads(thread_name_prefix="pulumi-mocks")


@contextlib.contextmanager
def own_event_loop() -> Iterator[None]:
    """Run one program under mocks on an event loop of its own, closed afterwards.

    Pulumi's `runtime.test` reuses the thread's loop, so tasks left by an earlier run (one the program refused
    raises mid-registration) stay scheduled on it; after hundreds of runs in one process (the replacement matrix)
    a run under load was seen waiting forever with nothing ready. The SDK's own tests hit the same cross-run
    contamination (pulumi/pulumi#7746). A fresh loop per run leaves nothing behind to wait on.
    """
    try:
        previous: asyncio.AbstractEventLoop | None = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:  # none set in this thread
        previous = None
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_MONITOR_THREADS)
    asyncio.set_event_loop(loop)
    ROOT.set(None)  # set_mocks makes a root stack only when none is set: the old one's futures are another loop's
    try:
        yield
    finally:
        ROOT.set(None)
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()
        asyncio.set_event_loop(previous)  # the caller's loop back: none is left for the collector to close


def register(stack: str, values: dict[str, Any], secrets: dict[str, Any]) -> list[Registration]:
    """Run components.program.deploy with this config (plain values) and these secret values; every resource it
    registers, with the options that decide replacement. Raises ProgramError when the program refuses."""
    with own_event_loop():
        return _register(stack, values, secrets)


def _register(stack: str, values: dict[str, Any], secrets: dict[str, Any]) -> list[Registration]:
    from components.program import deploy, restored_gc

    mocks = _Mocks()
    pulumi.runtime.set_mocks(mocks, project="vllm-cluster", stack=stack, preview=False)
    config = {f"vllm-cluster:{k}": json.dumps(v) for k, v in values.items() if k not in secrets}
    config |= {f"vllm-cluster:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in secrets.items()}
    pulumi.runtime.set_all_config(config, secret_keys=[f"vllm-cluster:{k}" for k in secrets])
    options: dict[str, pulumi.ResourceOptions] = {}
    custom_init = pulumi.CustomResource.__init__

    def spy(self: Any, t: str, name: str, props: Any = None, opts: Any = None, *args: Any, **kwargs: Any) -> None:
        options[name] = opts or pulumi.ResourceOptions()
        custom_init(self, t, name, props, opts, *args, **kwargs)

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> None:
        deploy(stack)

    pulumi.CustomResource.__init__ = spy  # type: ignore[method-assign]
    try:
        with _quiet(), restored_gc():  # deploy() defers full collections for the rest of its process
            program()
    except Exception as exc:  # the program refuses a bad config before anything registers
        raise ProgramError(str(exc)) from None
    finally:
        pulumi.CustomResource.__init__ = custom_init  # type: ignore[method-assign]
    out = []
    for typ, name, inputs, custom in mocks.seen:
        opts = options.get(name) or pulumi.ResourceOptions()
        out.append(Registration(typ, name, inputs, custom=custom,
                                replace_on_changes=tuple(opts.replace_on_changes or ()),
                                delete_before_replace=bool(opts.delete_before_replace)))
    return out
