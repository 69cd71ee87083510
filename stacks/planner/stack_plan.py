"""A whole stack's plan: one engine group's (a stack without `groups:`), or one plan per replica group, and
whether a change can roll (stacks/planner/groups.py). What `python -m stacks plan` prints and the program deploys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stacks.model.config import GroupConfig, StackConfig
from stacks.model.errors import ConfigError, Problem
from stacks.planner.container_spec import ContainerSpec
from stacks.planner.groups import GroupContext, Rolling, contexts, disaggregated, group_problems, rolling, tier_urls
from stacks.planner.kv_transfer import kv_transfer_problems
from stacks.planner.plan import Plan, build_plan
from stacks.planner.router import (
    MAX_TIMEOUT_S,
    ROUTER_HOST_DIR,
    ROUTER_WHEEL_SHA256,
    RouterSpec,
    router_container,
    router_problems,
    router_summary,
)


@dataclass(frozen=True)
class GroupPlan:
    name: str | None
    """None: the stack's one engine group (no `groups:`)."""
    config: StackConfig
    """The group's config as a stack of its own (stacks/planner/groups.py `group_config`)."""
    context: GroupContext | None
    plan: Plan

    @property
    def role(self) -> str:
        """replica, prefill or decode (the stack's one engine group is a replica)."""
        return self.context.role if self.context else "replica"


@dataclass(frozen=True)
class StackPlan:
    stack: str
    groups: tuple[GroupPlan, ...]
    rolling: Rolling
    router: RouterSpec | None = None
    """Prefill/decode groups: the vllm-router on the stack's head, in front of every group."""

    @property
    def grouped(self) -> bool:
        return self.groups[0].name is not None

    def router_container_spec(self) -> ContainerSpec | None:
        """The router's container on the first group's head (named after the engines, `-router`), as the plan
        shows it and the program creates it; None without prefill/decode groups."""
        if self.router is None:
            return None
        head = self.groups[0].config
        return router_container(self.router, f"{head.container.name}-router", head.image.pull_ref, ROUTER_HOST_DIR,
                                self.stack)

    def to_json_dict(self) -> dict[str, Any]:
        """A stack without groups: its plan as before, plus `rolling`. With groups: every group's plan."""
        if not self.grouped:
            return {**self.groups[0].plan.to_json_dict(), "rolling": self.rolling.as_dict()}
        out: dict[str, Any] = {"stack": self.stack, "rolling": self.rolling.as_dict(),
                               "groups": [{"name": g.name, "role": g.role,
                                           "plan": g.plan.to_json_dict()} for g in self.groups]}
        container = self.router_container_spec()
        if self.router is not None and container is not None:
            head = self.groups[0].config
            out["router"] = {**router_summary(self.router), "node": head.head.name,
                             "container": container.model_dump(), "checks": [
                                 {"name": "router-wheel", "node": head.head.name,
                                  "proves": f"the wheel at disaggregation.router.wheel_url has sha256 "
                                            f"{ROUTER_WHEEL_SHA256} and is unpacked in {ROUTER_HOST_DIR}"},
                                 {"name": "check-pd", "node": head.head.name, "module": "checks.pd",
                                  "proves": "the golden prompt through the router with the decode's evidence that "
                                            "KV moved, and every prefill x decode pair once (inside the router's "
                                            "container)"}]}
        return out


def build_stack(stack: str, config: StackConfig) -> StackPlan:
    """Plan every group; raises ConfigError with the problems of every group at once, each key under its group."""
    if not config.groups and config.disaggregation is not None:
        raise ConfigError(stack, [Problem("disaggregation", "set", "a stack without groups has no prefill or decode "
                                          "group to use it", fix="declare groups with role prefill and decode "
                                          "(docs/disaggregation.md), or remove disaggregation:")])
    if not config.groups:
        return StackPlan(stack, (GroupPlan(None, config, None, build_plan(stack, config)),), rolling(config))
    problems = group_problems(config)
    if problems:
        raise ConfigError(stack, problems)
    parts = contexts(config)
    problems += tier_pair_problems(config, parts)
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
    router = pd_router(config) if disaggregated(config) else None
    if router is not None:
        problems += [dataclasses.replace(p, key=f"disaggregation.{p.key}") for p in router_problems(router)]
    if problems:
        raise ConfigError(stack, problems)
    return StackPlan(stack, tuple(plans), rolling(config), router)


def tier_pair_problems(config: StackConfig, parts: list[tuple[GroupConfig, StackConfig, GroupContext]]
                       ) -> list[Problem]:
    """What would make a prefill group's KV cache fail to reach a decode group, for every pair of them
    (stacks/planner/kv_transfer.py), each key as the stack file spells it and said once."""
    settings = config.disaggregation
    if settings is None or not disaggregated(config):
        return []
    index = {g.name: i for i, (g, _, _) in enumerate(parts)}
    found: dict[tuple[str, str, str], Problem] = {}
    for pg, psub, _ in (x for x in parts if x[0].role == "prefill"):
        for dg, dsub, _ in (x for x in parts if x[0].role == "decode"):
            for p in kv_transfer_problems(psub, dsub, settings):
                tier = _subject_tier(p.message)
                group = dg if tier == "decode" else pg
                q = _in_group(p, index[group.name], dsub if tier == "decode" else psub, config)
                q = dataclasses.replace(q, message=f"prefill group {pg.name} and decode group {dg.name}: {q.message}")
                found.setdefault((q.key, repr(q.value), p.message), q)
    return list(found.values())


def _subject_tier(message: str) -> str:
    """Which tier a KV transfer problem is about: the one its message names first (kv_transfer.py says "decode tier
    TP 4 and prefill tier TP 3", "prefill tier: ..."); a message naming neither is about the stack's own keys."""
    d, p = message.find("decode tier"), message.find("prefill tier")
    return "decode" if d >= 0 and (p < 0 or d < p) else "prefill"


def pd_router(config: StackConfig) -> RouterSpec | None:
    """The router's spec: every prefill and decode group's API server, the settings of `disaggregation.router`,
    and a start-up wait of the engines' own (`serving.engine_ready_timeout_s`, the stack's: not a group's modelled
    load, which would restart the router on a change of one tier's shape)."""
    settings = config.disaggregation
    if settings is None:
        return None
    urls = tier_urls(config)
    load_s = config.serving.engine_ready_timeout_s
    r = settings.router
    return RouterSpec(prefill_urls=tuple(urls["prefill"]), decode_urls=tuple(urls["decode"]), host="127.0.0.1",
                      port=r.port, policy=r.policy, prefill_policy=r.prefill_policy, decode_policy=r.decode_policy,
                      prometheus_host="127.0.0.1", prometheus_port=r.metrics_port,
                      worker_startup_timeout_s=min(MAX_TIMEOUT_S, max(600, load_s)),
                      request_timeout_s=r.request_timeout_s)


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
