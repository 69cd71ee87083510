"""Every config key of the schema, and for each one a change to another valid value: the inputs of the
replacement matrix (`review.replacement`).

Keys come from the model itself (`StackConfig`, depth first, as `python -m stacks reference` lists them), so a
field another change adds gets a row without touching this module. Values are derived from the field's type
(its `Kind`, bounds, literals, list/map shape) and from the stack's current value; a candidate counts only if the
whole plan still validates (`build_plan`), so every change the matrix reports is one `pulumi up` would accept.
Where a key sits in an unset part of the config (an empty list, an unset optional section), the same part of
another committed stack is the representative value, else one built from the first valid candidate per field.

Secrets are mutated as Pulumi would hold them: rotated or added in the secret values handed to the program, never
in the plain config (the model only ever sees the SECRET marker).
"""

from __future__ import annotations

import copy
import ipaddress
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from stacks.model.config import SECRET_KEYS, SECRET_OBJECT_KEYS, StackConfig, parse_image_ref
from stacks.model.errors import ConfigError
from stacks.model.field_types import SECRET, Kind, Secret, is_ip_literal
from stacks.model.loader import parse_config
from stacks.planner.model_cards import CardProblem, card_names, get_profile
from stacks.planner.plan import Plan, build_plan
from stacks.planner.stack_plan import StackPlan, build_stack

LIST = "[]"

BASE_SECRETS: dict[str, Any] = {"api_key": "sk-matrix-base-0", "ssh_private_key": "matrix-ssh-key-0"}
"""The secrets every stack is assumed to hold, as docs/deploy.md sets them (`api_key`, `ssh_private_key`)."""


@dataclass(frozen=True)
class Desc:
    """A field's shape, reduced to what picking another value needs."""

    kind: str
    """bool, int, float, literal, str, list, dict, model, secret, json"""
    name: str = ""
    """the field type's Kind name (str kinds), the model class name (model)"""
    low: float | None = None
    high: float | None = None
    options: tuple[Any, ...] = ()
    item: Desc | None = None
    key: Desc | None = None
    model: type[BaseModel] | None = None
    optional: bool = False
    min_items: int = 0


def _bounds(metadata: list[Any], integer: bool) -> tuple[float | None, float | None, int]:
    low = high = None
    min_items = 0
    step = 1 if integer else 1e-6
    for item in metadata:
        if getattr(item, "ge", None) is not None:
            low = item.ge
        if getattr(item, "gt", None) is not None:
            low = item.gt + step
        if getattr(item, "le", None) is not None:
            high = item.le
        if getattr(item, "lt", None) is not None:
            high = item.lt - step
        if getattr(item, "min_length", None):
            min_items = int(item.min_length)
    return low, high, min_items


def describe(annotation: Any, metadata: list[Any] | None = None) -> Desc:
    """The Desc of a pydantic field annotation (with the FieldInfo's metadata for top-level constraints)."""
    metadata = list(metadata or [])
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(inner) < len(typing.get_args(annotation))
        annotation = inner[0] if len(inner) == 1 else annotation
    while typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        for e in extra:
            metadata += list(e.metadata) if isinstance(e, FieldInfo) else [e]
        annotation = base
    low, high, min_items = _bounds(metadata, annotation is int)
    kind_name = next((m.name for m in metadata if isinstance(m, Kind)), "")
    origin = typing.get_origin(annotation)
    if annotation is Secret or kind_name == "secret":
        return Desc("secret", optional=optional)
    if origin is Literal:
        return Desc("literal", options=typing.get_args(annotation), optional=optional)
    if origin is list:
        return Desc("list", kind_name, item=describe(typing.get_args(annotation)[0]), optional=optional,
                    min_items=min_items)
    if origin is dict:
        key, value = typing.get_args(annotation)
        return Desc("dict", kind_name, key=describe(key), item=describe(value), optional=optional)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return Desc("model", annotation.__name__, model=annotation, optional=optional)
    if annotation is bool:
        return Desc("bool", optional=optional)
    if annotation is int:
        return Desc("int", kind_name, low, high, optional=optional)
    if annotation is float:
        return Desc("float", kind_name, low, high, optional=optional)
    if annotation is str:
        return Desc("str", kind_name, optional=optional)
    return Desc("json", kind_name, optional=optional)


KEY_EXAMPLES: dict[str, list[Any]] = {
    "serving.extra_args": [["--disable-log-stats"]],
    "observability.node": ["node2", "h20-2"],   # another node of the committed stacks
    "observability.watch_address": ["10.30.8.250", "192.0.2.250"],
    "observability.supervisor_address": ["10.30.8.251", "192.0.2.251"],
}
"""Values a field's type cannot produce on its own (a real `vllm serve` flag the config does not manage); a
field's own `Field(examples=...)` is used the same way."""


@dataclass(frozen=True)
class Leaf:
    """One key of the schema (`nodes[].ssh.host`); lists of sections are `[]`, a map is one leaf."""

    key: str
    parts: tuple[str, ...]
    desc: Desc
    default: Any
    """the field's default (PydanticUndefined when required)"""
    examples: tuple[Any, ...] = ()


def _default(info: Any) -> Any:
    if info.default_factory is not None:
        value = info.default_factory()
        return value.model_dump() if isinstance(value, BaseModel) else value
    return info.default


def leaves(model: type[BaseModel] = StackConfig, parts: tuple[str, ...] = ()) -> list[Leaf]:
    """Every leaf key of the schema, depth first, in declaration order."""
    out: list[Leaf] = []
    for name, info in model.model_fields.items():
        desc = describe(info.annotation, list(info.metadata))
        here = (*parts, name)
        if desc.kind == "model" and desc.model is not None:
            out += leaves(desc.model, here)
        elif desc.kind == "list" and desc.item is not None and desc.item.kind == "model" and desc.item.model:
            out += leaves(desc.item.model, (*here, LIST))
        else:
            key = ".".join(here).replace(f".{LIST}", LIST)
            examples = tuple(KEY_EXAMPLES.get(key, [])) + tuple(info.examples or ())
            out.append(Leaf(key, here, desc, _default(info), examples))
    return out


# --- another valid value, by type ------------------------------------------------------------------------

def _bump_ip(value: str) -> list[str]:
    """Nearby addresses (same network, most likely), skipping .0 and .255; loopback for a wildcard bind."""
    address = ipaddress.ip_address(value)
    if address.is_unspecified:
        return ["127.0.0.1" if address.version == 4 else "::1"]
    out = []
    for step in (1, 10, 100, -1):
        try:
            other = str(address + step)
        except (ValueError, ipaddress.AddressValueError):
            continue
        if not other.endswith((".0", ".255")):
            out.append(other)
    return out


def _str_candidates(kind: str, current: Any, key: str) -> list[str]:
    """Other values of a string field, by its Kind (stacks/model/field_types.py)."""
    cur = current if isinstance(current, str) else None
    suffix = [f"{cur}-x"] if cur else []
    table: dict[str, Callable[[], list[str]]] = {
        "IP address": lambda: _bump_ip(cur) if cur and is_ip_literal(cur) else ["10.99.0.1"],
        "env name": lambda: ["VLLM_CLUSTER_MATRIX", "NCCL_IB_TIMEOUT", "NCCL_DEBUG"],
        "host (IP or RFC 1123 name)": lambda: ((_bump_ip(cur) if cur and is_ip_literal(cur) else [])
                                               + ["node-x.example.com"]),
        "CIDR": lambda: ["10.99.0.0/16", "192.168.99.0/24"],
        "absolute path": lambda: [f"{cur.rstrip('/')}-x"] if cur and cur != "/" else ["/srv/vllm-cluster-x"],
        "relative path": lambda: [f"{cur}-x"] if cur else ["x"],
        "name [a-z0-9-]": lambda: [f"{cur}-x"] if cur else ["x1"],
        "container name": lambda: suffix or ["vllm-x"],
        "client name [a-z0-9_-]": lambda: suffix or ["client-x"],
        "model name": lambda: suffix or ["model-x"],
        "model card name [a-z0-9._-]": lambda: sorted(card_names(), key=lambda n: _family(n) != _family(cur)),
        "POSIX user": lambda: ["deploy", "ops"],
        "vLLM name [A-Za-z0-9_.-]": lambda: ["auto", "fp8", "bfloat16", "deepseek_v4", "deepseek_v41", "deepseek_v3",
                                             "hermes", "slow", "fp8_e4m3"],
        "identifier [a-z0-9_]": lambda: [f"{cur}_x"] if cur else (
            ["enable_weights_track"] if key.endswith("model_loader_extra_config") else ["x"]),
        "vLLM load format [a-z0-9_]": lambda: ["safetensors", "fastsafetensors"],
        "env value (one line)": lambda: [f"{cur}x" if cur else "1"],
        "Docker tag": lambda: [f"{cur[:120]}-x"] if cur else ["v0.33.0"],
        "sha256 digest": lambda: ["sha256:" + "ab" * 32, "sha256:" + "cd" * 32],
        "interface name": lambda: ["ethx9", "ethx8"],
        "HCA dev:port": lambda: ["mlx5_9:1", "mlx5_8:1"],
        "text (one line)": lambda: [f"{cur} x" if cur else "x"],
        "DNS name": lambda: ["llm-x.example.com"],
        "Docker repository": lambda: [f"{cur}-x"] if cur else ["vllm/vllm-openai"],
        "image reference": lambda: [f"{cur.partition('@')[0]}-x", f"{cur.partition('@')[0]}@sha256:{'ab' * 32}"]
        if cur else ["busybox:1.36"],
        "/dev path": lambda: ["/dev/fuse", "/dev/null"],
        "Linux capability": lambda: ["SYS_NICE", "NET_ADMIN", "IPC_LOCK"],
        "ulimit name": lambda: ["nofile", "core", "nproc"],
    }
    if kind not in table:
        return suffix or ["x"]
    return [c for c in table[kind]() if c != cur]


def _family(card: str | None) -> str | None:
    """A card's architecture family: the matrix tries another card of the same family first."""
    try:
        profile = get_profile(card) if card else None
    except CardProblem:  # the plan names a broken card; the matrix just has no family for it
        return None
    return profile.family if profile else None


def _number_candidates(desc: Desc, current: Any) -> list[Any]:
    integer = desc.kind == "int"
    low = desc.low if desc.low is not None else (0 if integer else 0.0)
    high = desc.high if desc.high is not None else (1_000_000 if integer else 1e6)
    if current is None or isinstance(current, bool):
        raw = [low + 1 if integer else (low + high) / 2, low, high]
    elif integer:
        raw = [current + 1, current - 1, current * 2, current // 2, low, high]
    else:
        raw = [current * 1.5, current * 0.5, current * 0.9, low, high]
    out: list[Any] = []
    for value in raw:
        value = int(value) if integer else round(float(value), 6)
        if low <= value <= high and value != current and value not in out:
            out.append(value)
    return out


def _json_candidates(current: Any, key: str = "") -> list[Any]:
    if current is None and key.endswith("model_loader_extra_config"):  # its default loader reads booleans
        return [True]
    if isinstance(current, bool):
        return [not current]
    if isinstance(current, int | float):
        return [current + 1]
    if isinstance(current, str):
        return [f"{current}_x"]
    return [1]


def candidates(desc: Desc, current: Any, key: str = "") -> list[Any]:
    """Other values of a field, most plausible first; `current` None means unset (or null)."""
    out: list[Any]
    if desc.kind == "bool":
        out = [not current] if isinstance(current, bool) else [True, False]
    elif desc.kind in ("int", "float"):
        out = _number_candidates(desc, current)
    elif desc.kind == "literal":
        out = [o for o in desc.options if o != current]
    elif desc.kind == "str":
        out = _str_candidates(desc.name, current, key)
    elif desc.kind == "json":
        out = _json_candidates(current, key)
    elif desc.kind == "list" and desc.item is not None:
        items = list(current or [])
        if desc.name == "[soft, hard]":  # a pair, not a growing list
            return [[v, v] for v in _number_candidates(Desc("int", low=-1, high=2**62), items[0] if items else None)]
        others = candidates(desc.item, items[-1] if items else None, key)
        replaced = [[*items[:-1], v] for v in others if v not in items] if items else []
        if desc.min_items and len(items) == desc.min_items:
            out = replaced
        else:
            out = replaced + [[*items, v] for v in others if v not in items] + ([items[:-1]] if items else [])
    elif desc.kind == "dict" and desc.key is not None and desc.item is not None:
        entries = dict(current or {})
        changed = [{**entries, k: v} for k in list(entries)[:1]
                   for v in candidates(desc.item, entries[k], key)[:2]]
        added = [{**entries, k: v} for k in candidates(desc.key, None, key)[:3] if k not in entries
                 for v in candidates(desc.item, None, key)[:1]]
        out = changed + added
    else:
        out = []
    if desc.optional and current is not None and desc.kind not in ("list", "dict"):
        return [*out, None]
    return out


# --- locating a key in a stack's values ------------------------------------------------------------------

def _get(values: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        if isinstance(values, dict) and isinstance(part, str):
            values = values.get(part)
        elif isinstance(values, list) and isinstance(part, int) and part < len(values):
            values = values[part]
        else:
            return None
    return values


def _set(values: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = values
    for part in path[:-1]:
        node = node[part]
    if value is None and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def _schema_at(parts: tuple[str, ...]) -> Desc:
    desc = Desc("model", model=StackConfig)
    for part in parts:
        if part == LIST:
            assert desc.item is not None
            desc = desc.item
            continue
        assert desc.model is not None
        info = desc.model.model_fields[part]
        desc = describe(info.annotation, list(info.metadata))
    return desc


def _representative(parts: tuple[str, ...], others: list[dict[str, Any]]) -> Any:
    """A value for the (unset) section at `parts`: the first other stack that sets it, else one built from each
    required field's first candidate."""
    for other in others:
        found = [other]
        for part in parts:
            nxt: list[Any] = []
            for node in found:
                if part == LIST:
                    nxt += list(node or []) if isinstance(node, list) else []
                elif isinstance(node, dict) and node.get(part) is not None:
                    nxt.append(node[part])
            found = nxt
        if found:
            return copy.deepcopy(found[0])
    return _build(_schema_at(parts))


def _section_default(parts: tuple[str, ...]) -> Any:
    """The default of the section at `parts` (a mapping or a list), None when it has none (required, or None)."""
    model: type[BaseModel] = StackConfig
    for part in parts[:-1]:
        if part == LIST:
            continue
        desc = describe(model.model_fields[part].annotation, list(model.model_fields[part].metadata))
        target = desc.item if desc.kind == "list" else desc
        assert target is not None and target.model is not None
        model = target.model
    info = model.model_fields[parts[-1]]
    if info.is_required():
        return None
    return _default(info)


def _build(desc: Desc) -> Any:
    if desc.kind != "model" or desc.model is None:
        options = candidates(desc, None)
        return options[0] if options else None
    out: dict[str, Any] = {}
    for name, info in desc.model.model_fields.items():
        if info.is_required():
            out[name] = _build(describe(info.annotation, list(info.metadata)))
    return out


@dataclass
class Located:
    """One concrete place of a key in a stack's values: the path with list indexes, and what had to be created
    (an unset section) to get there."""

    path: tuple[str | int, ...]
    created: tuple[str | int, ...] | None = None


def locate(leaf: Leaf, values: dict[str, Any], others: list[dict[str, Any]]
           ) -> Iterator[tuple[Located, dict[str, Any]]]:
    """Each concrete place of `leaf` in `values` (every item of a list of sections), with a copy of the values in
    which that place exists; an unset section is filled with a representative one."""
    def walk(node_values: dict[str, Any], done: tuple[str | int, ...], rest: tuple[str, ...],
             created: tuple[str | int, ...] | None) -> Iterator[tuple[Located, dict[str, Any]]]:
        if len(rest) == 1:
            yield Located((*done, rest[0]), created), node_values
            return
        part, *tail = rest
        if part == LIST:
            items = _get(node_values, done)
            if not items:
                schema_parts = leaf.parts[:len(leaf.parts) - len(rest) + 1]
                filled = copy.deepcopy(node_values)
                _set(filled, done, [_representative(schema_parts, others)])
                yield from walk(filled, (*done, 0), tuple(tail), created or done)
                return
            for index in range(len(items)):
                yield from walk(node_values, (*done, index), tuple(tail), created)
            return
        here = _get(node_values, (*done, part))
        if here is None:
            schema_parts = leaf.parts[:len(leaf.parts) - len(rest) + 1]
            filled = copy.deepcopy(node_values)
            parent = _get(filled, done)
            if not isinstance(parent, dict):
                return
            default = _section_default(schema_parts)
            if default is not None:  # an unset section with a default is that default: nothing is created
                parent[part] = copy.deepcopy(default)
                yield from walk(filled, (*done, part), tuple(tail), created)
                return
            parent[part] = _representative(schema_parts, others)
            if parent[part] is None:
                return
            yield from walk(filled, (*done, part), tuple(tail), created or (*done, part))
            return
        yield from walk(node_values, (*done, part), tuple(tail), created)

    yield from walk(values, (), leaf.parts, None)


# --- the mutations ---------------------------------------------------------------------------------------

@dataclass
class Mutation:
    key: str
    change: str
    """what was changed, for people: `nodes.1.ssh.host: 10.30.8.2 → 10.30.8.3`"""
    values: dict[str, Any]
    secrets: dict[str, Any]
    plan: Any
    """what the planner made of it: a Plan (plan_of), or a StackPlan for a stack with groups (stack_plan_of)"""


Planner = Callable[[str, dict[str, Any], dict[str, Any]], Any]


@dataclass
class Outcome:
    """The mutations of one key in one stack (one per concrete place), or why there is none."""

    key: str
    mutations: list[Mutation] = field(default_factory=list)
    refused: str | None = None
    """set when every candidate was refused by the plan: the first problem"""


def canonical(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stack's values as the mutations need them: the one-string forms of the images and `model.source` as
    mappings (a key path needs a mapping to change), and every secret (a SECRET marker, as the stack file reader
    leaves it) moved out into stand-in secret values, as Pulumi hands them to the program."""
    plain = copy.deepcopy(values)
    secrets: dict[str, Any] = {}
    for key in list(plain):
        value = plain[key]
        if isinstance(value, Secret):
            secrets[key] = f"matrix-{key}-0"
            del plain[key]
        elif isinstance(value, dict) and any(isinstance(v, Secret) for v in value.values()):
            secrets[key] = {k: f"matrix-{key}-{k}-0-padding" for k in value}
            del plain[key]
    if isinstance(plain.get("image"), str):
        plain["image"] = {k: v for k, v in parse_image_ref(plain["image"]).items() if v is not None}
    api = plain.get("api")
    proxy = api.get("proxy") if isinstance(api, dict) else None
    if isinstance(proxy, dict) and isinstance(proxy.get("image"), str):
        proxy["image"] = {k: v for k, v in parse_image_ref(proxy["image"]).items() if v is not None}
    model = plain.get("model")
    if isinstance(model, dict) and isinstance(model.get("source"), str):
        model["source"] = {"url": model["source"]}
    return plain, secrets


def _marked(values: dict[str, Any], secrets: dict[str, Any]) -> dict[str, Any]:
    marked = copy.deepcopy(values)
    for key, value in secrets.items():
        marked[key] = {k: SECRET for k in value} if isinstance(value, dict) else SECRET
    return marked


def plan_of(stack: str, values: dict[str, Any], secrets: dict[str, Any]) -> Plan:
    """The plan of plain values plus the secrets the program would get (as SECRET markers): ConfigError if not."""
    return build_plan(stack, parse_config(stack, _marked(values, secrets)))


def stack_plan_of(stack: str, values: dict[str, Any], secrets: dict[str, Any]) -> StackPlan:
    """plan_of for a stack with groups: every group's plan (and the router's), as `pulumi up` builds it."""
    return build_stack(stack, parse_config(stack, _marked(values, secrets)))


def _show(value: Any) -> str:
    text = "(unset)" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path)


def _secret_outcome(leaf: Leaf, stack: str, values: dict[str, Any], secrets: dict[str, Any],
                    planner: Planner) -> Outcome:
    name = leaf.key
    outcome = Outcome(name)
    current = secrets.get(name)
    tries: list[tuple[str, Any]]
    if name in SECRET_OBJECT_KEYS:
        entries = dict(current or {})
        key_desc = leaf.desc.key or Desc("str")
        first = next(iter(entries), None)
        tries = ([(f"{name}.{first}: rotated", {**entries, first: f"{entries[first]}-rotated"})] if first else [])
        tries += [(f"{name}.{k}: added", {**entries, k: f"matrix-{k}"}) for k in candidates(key_desc, None)[:1]
                  if k not in entries]
    else:
        tries = [(f"{name}: rotated" if current else f"{name}: set", f"{current}-rotated" if current else
                  f"matrix-{name}")]
    problems = []
    for change, value in tries:
        mutated = {**secrets, name: value}
        try:
            plan = planner(stack, values, mutated)
        except ConfigError as exc:
            problems.append(exc.problems[0].message)
            continue
        outcome.mutations.append(Mutation(name, change, copy.deepcopy(values), mutated, plan))
        break
    if not outcome.mutations:
        outcome.refused = problems[0] if problems else "no candidate value"
    return outcome


def mutate(leaf: Leaf, stack: str, values: dict[str, Any], secrets: dict[str, Any], others: list[dict[str, Any]],
           limit: int = 12, planner: Planner = plan_of,
           accept: Callable[[dict[str, Any], dict[str, Any], Any], bool] | None = None) -> Outcome:
    """For every concrete place of `leaf`, the first candidate value whose plan validates (and that `accept` takes,
    given the values, secrets and plan: e.g. one that changes something, so a value equal in effect to the current
    one is not reported as free)."""
    if leaf.desc.kind == "secret" or leaf.key in SECRET_KEYS or leaf.key in SECRET_OBJECT_KEYS:
        return _secret_outcome(leaf, stack, values, secrets, planner)
    outcome = Outcome(leaf.key)
    problems: list[str] = []
    for place, base in locate(leaf, values, others):
        current = _get(base, place.path)
        if current is None and leaf.default is not PydanticUndefined:
            current = leaf.default
        tried = 0
        for value in [*(e for e in leaf.examples if e != current), *candidates(leaf.desc, current, leaf.key)]:
            if tried >= limit:
                break
            tried += 1
            mutated = copy.deepcopy(base)
            _set(mutated, place.path, value)
            try:
                plan = planner(stack, mutated, secrets)
            except ConfigError as exc:
                problems.append(f"{exc.problems[0].key}: {exc.problems[0].message}")
                continue
            if accept is not None and not accept(mutated, secrets, plan):
                problems.append(f"{_dotted(place.path)}: {_show(value)} changes nothing {_show(current)} does not")
                continue
            if place.created is not None:
                change = (f"{_dotted(place.created)}: (unset) → {_show(_get(mutated, place.created))}"
                          f" (to reach {_dotted(place.path)})")
            else:
                change = f"{_dotted(place.path)}: {_show(current)} → {_show(value)}"
            outcome.mutations.append(Mutation(leaf.key, change, mutated, dict(secrets), plan))
            break
    if not outcome.mutations:
        if problems:
            outcome.refused = problems[0]
        elif leaf.desc.kind == "literal" and len(leaf.desc.options) == 1:
            outcome.refused = f"the schema allows one value only: {leaf.desc.options[0]!r}"
        else:
            outcome.refused = "no candidate value for this type"
    return outcome
