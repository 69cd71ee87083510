"""The group restart as data: which ranks, in which order, what is cleaned, how long to wait (pure).

vLLM is fail-stop: when one rank dies the others hang or exit, and a lone rank restarted against stale peers
hangs. So the only safe restart is the whole group: stop every rank, clean what would block a fresh start, start
the ranks in the plan's start order, wait for readiness within the plan's load estimate, re-run the golden check.
The containers are the ones Pulumi created (`docker start`, never `docker run`): the restart cannot change the
topology, the image or the arguments; `drift` says when those no longer match the plan.

What the clean step removes, and nothing else (CLEAN_SCRIPT):
- the engine container's running processes: `docker stop -t 30` (SIGTERM, then SIGKILL), and `docker kill` if it
  is still running; vLLM's engine, worker and Ray processes live in the container's PID namespace, so none
  outlives it (an engine orphaned by a start-up timeout goes with its container);
- shared-memory segments in /dev/shm named like the engine's (`psm_*`: Python shared_memory, vLLM's message
  queues; `nccl-*`: NCCL's shared-memory transport; `torch_*`: torch's tensor sharing; `sem.mp-*`: multiprocessing
  semaphores) that no process on the node has open or mapped. With `ipc_mode: host` they outlive the container and
  turn a crash into a crash loop;
- ports: nothing is killed. A port the engine container listens on (`engine_ports`: not the monitoring
  containers', the proxy's, the watch unit's or the supervisor's, which the restart never stops, nor the collective
  check's, which runs only during `pulumi up`) still listened on after the stop fails the step with the holder's
  `ss` line: the restart stops there (a process the stack does not own is a person's decision).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from stacks.planner.plan import Plan

SHM_PATTERNS = ("psm_*", "nccl-*", "torch_*", "sem.mp-*")
STOP_TIMEOUT_S = 30
START_RUNNING_S = 60
"""How long `docker start` may take to report the container running before the attempt fails."""


@dataclass(frozen=True)
class Rank:
    """One node's engine container, and how to reach its host."""

    node: str
    container: str
    ports: tuple[int, ...] = ()
    """Planned TCP ports (not ephemeral ones) that must be free before the container starts again."""
    shm_dir: str = "/dev/shm"


@dataclass(frozen=True)
class Group:
    stack: str
    ranks: tuple[Rank, ...]
    """In the plan's start order (the head first)."""
    ready_timeout_s: int
    """How long the group may take to serve after the last start: the plan's load estimate, doubled, plus 10
    minutes for NCCL and the API server."""
    health_url: str
    golden_argv: tuple[str, ...] = field(default=())
    """The golden check (exit 0: every answer right); empty: the health probe is the whole check."""

    def rank(self, node: str) -> Rank:
        return next(r for r in self.ranks if r.node == node)


def ready_timeout_s(estimated_load_s: int) -> int:
    return 2 * estimated_load_s + 600


NOT_ENGINE_ROLES = ("monitoring", "proxy")
"""Listener roles of processes outside the engine containers (exporters, Prometheus, Grafana, Alertmanager, the watch
unit, the supervisor itself, nginx): they keep running through a restart, so their ports are held by design."""
NOT_ENGINE_PROCESS_PREFIX = "checks."
"""The collective check's rendezvous (`checks.collective`): it listens only while `pulumi up` runs it, never during a
restart, and the engine does not need its port."""


def engine_ports(plan: Plan, node: str) -> tuple[int, ...]:
    """The fixed TCP ports the node's engine containers listen on: the only ones a stopped group must have freed."""
    return tuple(sorted({listener.port for listener in plan.listeners
                         if listener.node == node and listener.protocol == "tcp" and not listener.ephemeral
                         and listener.port_end is None and listener.role not in NOT_ENGINE_ROLES
                         and not listener.process.startswith(NOT_ENGINE_PROCESS_PREFIX)}))


def group_of(plan: Plan, golden_argv: tuple[str, ...] = ()) -> Group:
    """The group the plan deployed, ranks in `plan.start_order`."""
    ranks: list[Rank] = []
    for name in plan.start_order:
        node = plan.node(name)
        ports = engine_ports(plan, name)
        ranks.extend(Rank(node=name, container=c.name, ports=ports) for c in node.containers)
    return Group(stack=plan.stack, ranks=tuple(ranks), ready_timeout_s=ready_timeout_s(
        int(plan.model["estimated_load_s"])), health_url=plan.endpoint.rstrip("/") + "/health", golden_argv=golden_argv)


CLEAN_SCRIPT = r"""
set -u
container=$1; shm=$2; shift 2
if [ "$(docker inspect -f '{{.State.Running}}' "$container" 2>&1)" = true ]; then
  echo "FAIL: $container is still running after docker stop and docker kill"; exit 1
fi
open=$(ls -l /proc/[0-9]*/fd 2>/dev/null; cat /proc/[0-9]*/maps 2>/dev/null)
removed=""
for f in "$shm"/psm_* "$shm"/nccl-* "$shm"/torch_* "$shm"/sem.mp-*; do
  [ -e "$f" ] || continue
  if printf '%s\n' "$open" | grep -qF -- "$f"; then echo "kept $f: a process still has it open"; continue; fi
  if rm -f -- "$f"; then removed="$removed ${f##*/}"; else echo "FAIL: cannot remove $f"; exit 1; fi
done
echo "removed from $shm:${removed:- nothing}"
for port in "$@"; do
  held=$(ss -Hltnp "sport = :$port" 2>/dev/null)
  if [ -n "$held" ]; then echo "FAIL: port $port is still held: $held"; exit 1; fi
done
echo "ports free: ${*:-none planned}"
"""
"""Run on the node (`bash -s -- CONTAINER SHM_DIR PORT...` over SSH): exit 0 clean, 1 with the evidence."""


@dataclass(frozen=True)
class Step:
    action: str
    """stop, clean, start, wait or check."""
    node: str | None
    what: str


def restart_steps(group: Group) -> list[Step]:
    """The restart, in order, as the dry run prints it and the supervisor runs it."""
    steps = [Step("stop", r.node, f"docker stop -t {STOP_TIMEOUT_S} {r.container} (then docker kill if still "
                  "running)") for r in reversed(group.ranks)]
    steps += [Step("clean", r.node, f"remove {', '.join(SHM_PATTERNS)} from {r.shm_dir} that no process holds; "
                   f"check ports {','.join(map(str, r.ports)) or '(none planned)'} are free (a held port stops the "
                   "restart; nothing is killed)") for r in group.ranks]
    steps += [Step("start", r.node, f"docker start {r.container}; running within {START_RUNNING_S}s")
              for r in group.ranks]
    steps.append(Step("wait", None, f"every rank running and GET {group.health_url} answers 200, within "
                      f"{group.ready_timeout_s}s (a rank that stops meanwhile fails the restart at once)"))
    steps.append(Step("check", None, shlex.join(group.golden_argv) if group.golden_argv else
                      f"GET {group.health_url} (no golden check configured)"))
    return steps


def render_steps(group: Group) -> str:
    lines = [f"restart-group {group.stack}: {len(group.ranks)} rank(s), start order "
             f"{' -> '.join(r.node for r in group.ranks)}"]
    for i, step in enumerate(restart_steps(group), 1):
        lines.append(f"{i:3d}. {step.action:<5} {step.node or '(group)':<12} {step.what}")
    return "\n".join(lines) + "\n"
