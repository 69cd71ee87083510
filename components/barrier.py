"""Fan-in barriers: one resource waits for N, and the next N wait for that one.

A rollout step that must finish on every node before the next step starts anywhere ("every dry run before any
collective check") written as N x N `depends_on` edges grows the graph quadratically, and the Pulumi SDK walks
each new edge's transitive dependencies (`resource_cycle_breaker`), which made the program slow at 128 nodes.
With a barrier in between the graph has 2N edges and the same order: Pulumi registers a resource only after
every resource it depends on has finished its step, and a barrier that changes nothing is still registered (a
"same" step) only after its own dependencies finish. A failed dependency stops the barrier and, through it,
the whole next step.

A barrier must be a custom resource: depending on a local component means depending on each of its children
(`pulumi.runtime.rpc._add_dependency`), which is the N x N graph again. It is a `command.local.Command` on the
deploying host whose input never changes, so it runs `echo` once and never again.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import pulumi
import pulumi_command as command


def barrier(name: str, after: Sequence[pulumi.Resource], parent: pulumi.Resource | None = None
            ) -> command.local.Command:
    """`name` waits for every resource in `after`; depend on it instead of on all of them."""
    return command.local.Command(
        name, create=f"echo {shlex.quote(f'{name}: every step before it is done')}",
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(after)))
