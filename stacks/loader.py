"""Read a stack's config from `Pulumi.<stack>.yaml` (or from Pulumi's own Config) into a StackConfig.

The offline `plan` and the Pulumi program both end in `parse_config`, so a bad config gets the same
message in `python -m stacks plan` and in `pulumi preview`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from stacks.config import SECRET_KEYS, SECRET_MARKER, SECRET_OBJECT_KEYS, StackConfig
from stacks.errors import ConfigError, Problem

PROJECT = "vllm-cluster"
PROJECT_ROOT = Path(os.environ.get("VLLM_CLUSTER_ROOT") or Path(__file__).resolve().parent.parent)
"""Where `Pulumi.<stack>.yaml` files are read; VLLM_CLUSTER_ROOT points elsewhere (tests, other repos)."""


def stack_file(stack: str, root: Path = PROJECT_ROOT) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def read_stack_values(stack: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The `vllm-cluster:*` values of a stack file, keys without the namespace, secrets masked."""
    path = stack_file(stack, root)
    if not path.exists():
        known = sorted(p.name.split(".")[1] for p in root.glob("Pulumi.*.yaml"))
        raise ConfigError(stack, [Problem("<stack>", stack, f"no {path.name} in {root}", fix=f"one of {known}")])
    return values_from_document(yaml.safe_load(path.read_text()) or {})


def values_from_document(document: dict[str, Any]) -> dict[str, Any]:
    config = document.get("config") or {}
    values: dict[str, Any] = {}
    for key, value in config.items():
        namespace, _, name = str(key).partition(":")
        if namespace == PROJECT and name:
            values[name] = mask_secrets(value)
    return values


def mask_secrets(value: Any) -> Any:
    """Replace every `{secure: …}` with the marker: the plan must never hold ciphertext or plaintext."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return SECRET_MARKER
        return {k: mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    return value


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides; list items by index (`nodes.1.ssh.host=…`), values as YAML scalars."""
    result = copy.deepcopy(values)
    problems: list[Problem] = []
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            problems.append(Problem("--set", item, "expected KEY.PATH=VALUE", fix="--set parallelism.tensor=16"))
            continue
        try:
            _set_path(result, path.split("."), yaml.safe_load(raw) if raw != "" else "")
        except (KeyError, IndexError, TypeError) as exc:
            problems.append(Problem(path, raw, f"cannot set this path: {exc}", fix="a key path that exists"))
    if problems:
        raise ConfigError("<overrides>", problems)
    return result


def _set_path(node: Any, parts: list[str], value: Any) -> None:
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        index = int(head) if head.isdigit() else None
        if index is None or index >= len(node):
            raise IndexError(f"{head!r} is not an index of a list of {len(node)}")
        if rest:
            _set_path(node[index], rest, value)
        else:
            node[index] = value
        return
    if not isinstance(node, dict):
        raise TypeError(f"{head!r} is below a scalar")
    if rest:
        if head not in node or node[head] is None:
            node[head] = {}
        _set_path(node[head], rest, value)
    else:
        node[head] = value


def parse_config(stack: str, values: dict[str, Any]) -> StackConfig:
    """Validate the raw values; every schema problem is reported at once, with the key and what works."""
    problems = [
        Problem(key, "<plain text>", "holds a secret in plain config",
                fix=f"pulumi config set --secret {PROJECT}:{key} <value>")
        for key in SECRET_KEYS
        if key in values and values[key] not in (None, SECRET_MARKER)
    ]
    for key in SECRET_OBJECT_KEYS:
        entries = values.get(key)
        if entries is None:
            continue
        if not isinstance(entries, dict):
            problems.append(Problem(key, "<secret>" if entries == SECRET_MARKER else "<plain text>",
                                    "must be an object of client name -> secret key, so names stay reviewable",
                                    fix=f"pulumi config set --secret --path '{PROJECT}:{key}.<client>' <key>"))
            continue
        problems += [Problem(f"{key}.{name}", "<plain text>", "holds a secret in plain config",
                             fix=f"pulumi config set --secret --path '{PROJECT}:{key}.{name}' <key>")
                     for name, secret in entries.items() if secret != SECRET_MARKER]
    flagged = {p.key.split(".")[0] for p in problems}
    clean = {k: v for k, v in values.items() if k not in flagged}
    try:
        config = StackConfig.model_validate(clean)
    except ValidationError as exc:
        problems.extend(_schema_problems(exc))
        raise ConfigError(stack, problems) from None
    if problems:
        raise ConfigError(stack, problems)
    return config


def _schema_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        key = ".".join(loc) or "<root>"
        kind = error["type"]
        value = error.get("input")
        if kind == "extra_forbidden":
            fix = f"one of the known keys: {', '.join(_known_keys(loc[:-1]))}"
            problems.append(Problem(key, value, "unknown key (typo?)", fix=fix))
        elif kind == "missing":
            problems.append(Problem(key, None, "required key is missing", fix="add it to the stack file"))
        else:
            message = error["msg"].removeprefix("Value error, ")
            problems.append(Problem(key, value, message, fix=_hint(error)))
    return problems


def _known_keys(loc: list[str]) -> list[str]:
    model: type[BaseModel] = StackConfig
    for part in loc:
        if part.isdigit():
            continue
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        inner = _model_in(annotation)
        if inner is None:
            return []
        model = inner
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _hint(error: Any) -> str | None:
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return f"one of {ctx['expected']}"
    for bound, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if bound in ctx:
            return f"a value {word} {ctx[bound]}"
    if "pattern" in ctx:
        return f"a value matching {ctx['pattern']}"
    return None


def load_stack(stack: str, overrides: list[str] | None = None, root: Path = PROJECT_ROOT) -> StackConfig:
    values = read_stack_values(stack, root)
    if overrides:
        values = apply_overrides(values, overrides)
    return parse_config(stack, values)
