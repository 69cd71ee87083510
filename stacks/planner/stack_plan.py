"""A whole stack's plan: one engine group's (a stack without `groups:`), or one plan per replica group, and
whether a change can roll (stacks/planner/groups.py). What `python -m stacks plan` prints and the program deploys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stacks.model.config import StackConfig
from stacks.model.errors import ConfigError, Problem
from stacks.planner.groups import GroupContext, Rolling, contexts, group_problems, rolling
from stacks.planner.plan import Plan, build_plan


@dataclass(frozen=True)
class GroupPlan:
    name: str | None
    """None: the stack's one engine group (no `groups:`)."""
    config: StackConfig
    """The group's config as a stack of its own (stacks/planner/groups.py `group_config`)."""
    context: GroupContext | None
    plan: Plan


@dataclass(frozen=True)
class StackPlan:
    stack: str
    groups: tuple[GroupPlan, ...]
    rolling: Rolling

    @property
    def grouped(self) -> bool:
        return self.groups[0].name is not None

    def to_json_dict(self) -> dict[str, Any]:
        """A stack without groups: its plan as before, plus `rolling`. With groups: every group's plan."""
        if not self.grouped:
            return {**self.groups[0].plan.to_json_dict(), "rolling": self.rolling.as_dict()}
        return {"stack": self.stack, "rolling": self.rolling.as_dict(),
                "groups": [{"name": g.name, "plan": g.plan.to_json_dict()} for g in self.groups]}


def build_stack(stack: str, config: StackConfig) -> StackPlan:
    """Plan every group; raises ConfigError with the problems of every group at once, each key under its group."""
    if not config.groups:
        return StackPlan(stack, (GroupPlan(None, config, None, build_plan(stack, config)),), rolling(config))
    problems = group_problems(config)
    if problems:
        raise ConfigError(stack, problems)
    parts = contexts(config)
    plans: list[GroupPlan] = []
    found: dict[tuple[str, str, str, str | None, str | None, str | None], tuple[Problem, list[str]]] = {}
    for i, (group, sub, context) in enumerate(parts):
        try:
            plans.append(GroupPlan(group.name, sub, context, build_plan(stack, sub, context)))
        except ConfigError as exc:
            for p in exc.problems:  # a stack-wide value wrong in every group: one problem naming the groups
                q = _in_group(p, i, sub, config)
                found.setdefault((q.key, repr(q.value), q.message, q.upstream, q.fix, q.where), (q, []))[1].append(
                    group.name)
    for q, names in found.values():
        said = f"group {names[0]}" if len(names) == 1 else f"groups {', '.join(names)}"
        problems.append(dataclasses.replace(q, message=f"{said}: {q.message}"))
    if problems:
        raise ConfigError(stack, problems)
    return StackPlan(stack, tuple(plans), rolling(config))


def _in_group(problem: Problem, index: int, sub: StackConfig, config: StackConfig) -> Problem:
    """A group's problem as the stack file spells it: its node indexes are the group's, so `nodes.0` becomes the
    stack's index of that node; `parallelism.*` is the group's own when it has one."""
    key = problem.key
    parts = key.split(".")
    if parts[0] == "nodes" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(sub.nodes):
        stack_index = [n.name for n in config.nodes].index(sub.nodes[int(parts[1])].name)
        key = ".".join(["nodes", str(stack_index), *parts[2:]])
    elif parts[0] == "parallelism" and config.groups[index].parallelism is not None:
        key = f"groups.{index}.{key}"
    return Problem(key, problem.value, problem.message, problem.upstream, problem.fix, problem.where)
