"""The replacement matrix: for every config key of every stack, change it, run the program, and say what `pulumi
up` would replace, update in place or re-run, and what that costs in serving time (review/replacement.py).

Pure apart from the `register` function it is given (review/registrations.py runs the real program under
Pulumi's mocks), so the rules and the key walk are testable on their own.

Besides the config keys there are code rows: a change of this repository that alters no process (a recalibrated
load estimate, the plan's prose) must restart nothing. And keys of a feature that is off in a stack (the proxy)
are evaluated with the feature on as well, so their row says what they cost where they matter.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from review.config_mutations import BASE_SECRETS, Leaf, Mutation, canonical, leaves, mutate, plan_of
from review.downtime import assess
from review.plan_diff import diff_plans
from review.replacement import Downtime, Impact, Registration, Row, downtime, impact, merge, normaliser
from stacks.model.errors import ConfigError
from stacks.planner import launch, outage
from stacks.planner.plan import Plan

Register = Callable[[str, dict[str, Any], dict[str, Any]], list[Registration]]


class RegisterError(Exception):
    """The program refused a config the plan accepted (raised by a Register function)."""


@dataclass(frozen=True)
class Context:
    """A feature switched on for the keys that only matter with it (the baseline of their rows)."""

    name: str
    switch: str
    """the key whose own row is switching the feature on"""
    prefixes: tuple[str, ...]
    apply: Callable[[dict[str, Any], dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]
    requires: str = ""
    """what switching it on alone takes, for the switch's own row"""
    on: Any = True
    """the switch's value when the feature is on (`hybrid` for a mode, true for a flag)"""


def _proxy_on(values: dict[str, Any], secrets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The proxy on, with what the plan requires of it: vLLM on loopback, TLS material and client keys."""
    values = copy.deepcopy(values)
    values.setdefault("api", {}).setdefault("proxy", {})["enabled"] = True
    values["serving"]["host"] = "127.0.0.1"
    return values, {**secrets, "tls_certificate": "matrix-certificate", "tls_private_key": "matrix-key",
                    "proxy_keys": {"team-a": "matrix-client-key", "client-x": "matrix-client-key-2"}}


def _observability_on(values: dict[str, Any], secrets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Monitoring on, with its admin password and a webhook (so Alertmanager's keys matter too)."""
    values = copy.deepcopy(values)
    values.setdefault("observability", {})["enabled"] = True
    return values, {**secrets, "grafana_admin_password": "matrix-grafana-password",
                    "alert_webhook_url": "https://hooks.example.com/matrix"}


def _hybrid_on(values: dict[str, Any], secrets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Hybrid load balancing, with the layout it requires: mp, one pipeline stage, two DP ranks per node."""
    values = copy.deepcopy(values)
    gpus = min(int(n["gpus"]["count"]) for n in values["nodes"])
    values["parallelism"] |= {"backend": "mp", "pipeline": 1, "tensor": max(1, gpus // 2),
                              "data": 2 * len(values["nodes"]), "dp_load_balancing": "hybrid"}
    return values, dict(secrets)


def _external_on(values: dict[str, Any], secrets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """External load balancing, with the layout hybrid's row uses (two DP ranks per node, so a node holds two rank
    containers) and each rank's container on its own GPUs (CUDA_VISIBLE_DEVICES, which external requires)."""
    values, secrets = _hybrid_on(values, secrets)
    values["parallelism"]["dp_load_balancing"] = "external"
    values["container"] = dict(values.get("container") or {}) | {"set_cuda_visible_devices": True}
    return values, secrets


CONTEXTS = (
    Context("with the proxy on", "api.proxy.enabled", ("api.proxy.", "tls_certificate", "tls_private_key",
                                                         "proxy_keys"), _proxy_on,
            "serving.host 127.0.0.1 and the tls_certificate, tls_private_key and proxy_keys secrets"),
    Context("with observability on", "observability.enabled", ("observability.", "grafana_admin_password",
                                                                 "alert_webhook_url"), _observability_on,
            "the grafana_admin_password and alert_webhook_url secrets"),
    Context("with hybrid load balancing", "parallelism.dp_load_balancing", ("parallelism.dp_load_balancing",),
            _hybrid_on, "backend mp, pipeline 1 and two DP ranks per node", on="hybrid"),
    Context("with external load balancing", "parallelism.dp_load_balancing", ("parallelism.dp_load_balancing",),
            _external_on, "backend mp, pipeline 1, two DP ranks per node and container.set_cuda_visible_devices "
            "true", on="external"),
)
"""Contexts that share a switch (the load-balancing modes) make one row for it, with a change per mode."""


@dataclass(frozen=True)
class CodeChange:
    """A change of this repository's code that alters no process: what a release of the project may do."""

    key: str
    change: str
    patch: Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _startup_plus_60() -> Iterator[None]:
    before = outage.STARTUP_S
    outage.STARTUP_S = before + 60
    try:
        yield
    finally:
        outage.STARTUP_S = before


@contextlib.contextmanager
def _purpose_reworded() -> Iterator[None]:
    before = dict(launch._PURPOSE)
    launch._PURPOSE.update({role: f"{text} (reworded)" for role, text in before.items()})
    try:
        yield
    finally:
        launch._PURPOSE.clear()
        launch._PURPOSE.update(before)


CODE_CHANGES = (
    CodeChange("(code) stacks/planner/outage.py STARTUP_S", "the outage model recalibrated (+60 s)",
               _startup_plus_60),
    CodeChange("(code) stacks/planner/launch.py container purpose", "the plan's prose for every container reworded",
               _purpose_reworded),
)


@dataclass
class Baseline:
    stack: str
    values: dict[str, Any]
    secrets: dict[str, Any]
    plan: Plan
    registrations: list[Registration]


def _names(values: dict[str, Any]) -> tuple[list[str], list[str]]:
    nodes = [str(n.get("name")) for n in values.get("nodes") or [] if isinstance(n, dict)]
    container = (values.get("container") or {}).get("name")
    return nodes, [str(container)] if container else []


def _row(base: Baseline, key: str, context: str, mutations: list[Mutation], register: Register,
         refused: str | None) -> Row:
    if refused is not None and not mutations:
        return Row(base.stack, key, context, "", refused, Impact(), Downtime("none", None, "refused alone"))
    total: Impact | None = None
    estimates: list[int] = []
    seen_by_diff = "none"
    for mutation in mutations:
        seen_by_diff = _stronger(seen_by_diff, diff_downtime(base, mutation))
        try:
            after = register(base.stack, mutation.values, mutation.secrets)
        except RegisterError as exc:
            return Row(base.stack, key, context, "", f"the program refuses it: {exc}", Impact(),
                       Downtime("none", None, "refused alone"))
        nodes, boxes = _names(base.values)
        more_nodes, more_boxes = _names(mutation.values)
        found = impact(base.registrations, after, normaliser([*nodes, *more_nodes], [*boxes, *more_boxes]))
        total = found if total is None else merge(total, found)
        modelled = mutation.plan.model["outage"]
        estimates.append(int(modelled[modelled["applies"]]["total_s"]))
    assert total is not None
    return Row(base.stack, key, context, "; ".join(m.change for m in mutations), None, total,
               downtime(total.engines, total.proxy, max(estimates) if estimates else None), seen_by_diff)


_ORDER = ("none", "proxy", "group", "lone-rank", "unknown")


def _stronger(a: str, b: str) -> str:
    return a if _ORDER.index(a) >= _ORDER.index(b) else b


def diff_downtime(base: Baseline, mutation: Mutation) -> str:
    """The downtime kind `stacks diff` gives the same change, from the base and changed plans only."""
    found = diff_plans(base.stack, "base", base.plan.to_json_dict(), mutation.plan.to_json_dict())
    return assess(found).kind


def baseline(stack: str, values: dict[str, Any], secrets: dict[str, Any], register: Register) -> Baseline:
    return Baseline(stack, values, secrets, plan_of(stack, values, secrets), register(stack, values, secrets))


def stack_rows(stack: str, values: dict[str, Any], others: list[dict[str, Any]], register: Register,
               keys: list[Leaf] | None = None) -> list[Row]:
    """Every key of the schema changed alone in one stack, the context keys with their feature on, the code rows."""
    values, own_secrets = canonical(values)
    secrets = dict(BASE_SECRETS) | own_secrets
    base = baseline(stack, values, secrets, register)
    rows: list[Row] = []
    contexts: dict[str, Baseline | None] = {}
    for leaf in keys if keys is not None else leaves():
        context = next((c for c in CONTEXTS if leaf.key.startswith(c.prefixes) and leaf.key != c.switch), None)
        switches = [c for c in CONTEXTS if leaf.key == c.switch and not _is_on(values, c)]
        if switches:
            switched: list[Mutation] = []
            refused: str | None = None
            for switch in switches:
                on_values, on_secrets = switch.apply(values, secrets)
                try:
                    plan = plan_of(stack, on_values, on_secrets)
                except ConfigError as exc:
                    refused = refused or exc.problems[0].message
                    continue
                off = "false" if switch.on is True else _show_value(_switch_value(values, switch))
                on = "true" if switch.on is True else str(switch.on)
                change = f"{leaf.key}: {off} → {on} (with {switch.requires} it requires)"
                switched.append(Mutation(leaf.key, change, on_values, on_secrets, plan))
            rows.append(_row(base, leaf.key, "", switched, register, None if switched else refused))
            continue
        used = base
        label = ""
        if context is not None and not _is_on(values, context):
            if context.name not in contexts:
                on_values, on_secrets = context.apply(values, secrets)
                try:
                    contexts[context.name] = baseline(stack, on_values, on_secrets, register)
                except (ConfigError, RegisterError):
                    contexts[context.name] = None  # the keys are then evaluated on the stack as it is
            found = contexts[context.name]
            if found is not None:
                used, label = found, context.name
        outcome = mutate(leaf, stack, used.values, used.secrets, others)
        rows.append(_row(used, leaf.key, label, outcome.mutations, register, outcome.refused))
    for code in CODE_CHANGES:
        with code.patch():
            after_plan = plan_of(stack, values, secrets)
            rows.append(_row(base, code.key, "", [Mutation(code.key, code.change, values, secrets, after_plan)],
                             register, None))
    return rows


def _switch_value(values: dict[str, Any], context: Context) -> Any:
    node: Any = values
    for part in context.switch.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _show_value(value: Any) -> str:
    return "(unset)" if value is None else str(value)


def _is_on(values: dict[str, Any], context: Context) -> bool:
    node = _switch_value(values, context)
    return node is True if context.on is True else node == context.on


def compute(stacks: dict[str, dict[str, Any]], register: Register, keys: list[Leaf] | None = None) -> list[Row]:
    """The matrix of every stack: stack name -> its plain config values (as read from Pulumi.<stack>.yaml)."""
    rows: list[Row] = []
    for stack, values in stacks.items():
        others = [canonical(v)[0] for s, v in stacks.items() if s != stack]
        rows += stack_rows(stack, values, others, register, keys)
    return rows
