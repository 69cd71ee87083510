"""Read a stack's config from `Pulumi.<stack>.yaml` (or from Pulumi's own Config) into a StackConfig.

The offline `plan` and the Pulumi program both end in `parse_config`, so a bad config gets the same
message in `python -m stacks plan` and in `pulumi preview`. Every problem names the key, the value (never a
secret's plaintext) and what works, in the project's words rather than pydantic's.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from stacks.model.config import DBO_MIN_THRESHOLD, SECRET_KEYS, SECRET_OBJECT_KEYS, StackConfig
from stacks.model.errors import ConfigError, Problem
from stacks.model.field_types import SECRET, SECRET_TEXT, WHAT_WORKS, Kind
from stacks.model.project import (
    PROJECT_FIX,
    PROJECT_NAME,
    ROOT_ENV,
    is_developer_checkout,
    passed_over,
    passed_over_note,
    project_problem,
    project_root,
    pulumi_project_name,
    shadowing,
)
from stacks.model.stack_file import PROJECT, StackDocument, parse_stack_text, parse_value_text

PROJECT_ROOT = project_root()
"""Where `Pulumi.<stack>.yaml` files are read: VLLM_CLUSTER_ROOT, else the project around the working directory
(stacks/project.py)."""

HIDDEN = "<not shown>"
"""What a problem shows for an unknown key's text: a misspelt `s3_secret_acess_key` must not print its value."""
PLAIN = "<plain text>"
"""What a problem shows instead of a secret written in plain text."""


def is_stack_name(stack: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", stack)) and stack not in (".", "..")


def stack_names(root: Path) -> list[str]:
    """The stacks whose files are in `root` (`Pulumi.prod.eu-1.yaml` is `prod.eu-1`), only names a command takes."""
    names = (p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
    return sorted(n for n in names if is_stack_name(n))


def stack_file(stack: str, root: Path = PROJECT_ROOT) -> Path:
    """`Pulumi.<stack>.yaml`; a name that is not a Pulumi stack name (a path, a space, `;`) is refused here, so no
    command reads or rewrites a file outside the project."""
    if not is_stack_name(stack):
        raise ConfigError(stack[:100], [Problem("<stack>", stack, "is not a stack name",
                                                fix="letters, digits, _ . - (e.g. prod)")])
    return root / f"Pulumi.{stack}.yaml"


def read_stack_document(stack: str, root: Path = PROJECT_ROOT) -> StackDocument:
    """The `vllm-cluster:*` values of a stack file as Pulumi reads them, secrets masked, with positions."""
    path = stack_file(stack, root)
    name = pulumi_project_name(root)
    if name is not None and name != PROJECT_NAME and not is_developer_checkout(root):  # another Pulumi project's
        raise ConfigError(stack, [Problem("<stack>", stack, f"{project_problem(root)}: its stack files are not "
                                          "vllm-cluster's", fix=PROJECT_FIX)])
    shadow = shadowing(root)
    if shadow:  # the program and the checks would import the project's folder instead of vllm-cluster's
        raise ConfigError(stack, [Problem("<stack>", stack, shadow,
                                          fix="rename that folder (or module) of your project")])
    if not path.is_file():
        try:
            known = stack_names(root)
        except OSError:
            known = []
        why = project_problem(root)  # where the project came from, and why it is none
        other = passed_over(root)
        fix = f"one of {known}" if known else PROJECT_FIX  # not in a project at all: say how to reach one
        where = f"{root} (from {ROOT_ENV})" if os.environ.get(ROOT_ENV) else str(root)
        if why and not known:
            said = f"no {path.name} in {where}, which {why.removeprefix(where + ' ')}"
        else:
            said = f"no {path.name} in {where}" + (f" ({passed_over_note(other)})" if other is not None else "")
        raise ConfigError(stack, [Problem("<stack>", stack, said, fix=fix)])
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(stack, [Problem("<stack>", stack, f"cannot read {path.name}: {exc}",
                                          fix="a UTF-8 text file")]) from None
    return parse_stack_text(text, path.name)


def read_stack_values(stack: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    return read_stack_document(stack, root).values


def _path(key: str) -> list[str | int]:
    return [int(p) if p.isdigit() else p for p in key.split(".")]


def set_path(values: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.0.c` in nested values; list items by index. Raises ValueError with what is wrong."""
    parts = _path(key)
    if not key or any(p == "" for p in parts):
        raise ValueError("empty key path segment")
    node: Any = values
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise ValueError(f"{part!r} is not an index of a list of {len(node)}")
            if last:
                node[part] = value
            else:
                node = node[part]
            continue
        if not isinstance(node, dict):
            raise ValueError(f"{'.'.join(map(str, parts[:depth]))} is a value, not a mapping")
        name = str(part)
        if last:
            node[name] = value
        else:
            if node.get(name) is None:
                node[name] = {}
            node = node[name]


UNECHOED_SET = ("model.source",)
"""Keys whose `--set` value is not repeated even when the override itself cannot be read: a URL there may carry
a presigned signature or a password (a valid override's location is always `--set KEY=…`)."""


def _unechoed(key: str) -> bool:
    key = key.strip()
    return any(key == k or key.startswith(f"{k}.") or k.startswith(f"{key}.") for k in UNECHOED_SET)


def apply_overrides(values: dict[str, Any], overrides: list[str], assume_secret: Iterable[str] = (),
                    stack: str = "<overrides>") -> dict[str, Any]:
    """`--set key.path=value` (values resolved like the stack file's) and `--assume-secret key.path`."""
    import copy

    result = copy.deepcopy(values)
    # A plaintext secret the file holds is refused whatever the flags: --assume-secret stands in only for a value
    # the file does not hold, and --set cannot replace one either (the plaintext would stay in the file).
    problems = [p for p in secret_problems(values)[0] if p.value == PLAIN]
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path.strip():
            problems.append(Problem("--set", item, "expected KEY.PATH=VALUE", fix="--set parallelism.tensor=16"))
            continue
        if path.strip().split(".", 1)[0] in SECRET_KEYS + SECRET_OBJECT_KEYS:  # typed in a shell: plain text
            problems.append(Problem(path.strip(), PLAIN, "--set cannot give a secret (it would be plain text in "
                                    "argv and the shell's history)",
                                    fix=f"--assume-secret {path.strip()} to plan as if it were set, or "
                                    f"pulumi config set --secret {PROJECT}:{path.strip()} <value>"))
            continue
        control = next((c for c in item if ord(c) < 32 or ord(c) == 127), None)
        if control is not None:  # YAML would strip or fold it (`hq\n` -> `hq`); the stack file keeps and refuses it
            problems.append(Problem(path.strip(), "…" if _unechoed(path) else raw, f"--set: holds the control "
                                    f"character {control!r}, which the command line would drop or fold while the "
                                    "stack file keeps it", fix="the key and value on one line, without control "
                                    "characters"))
            continue
        try:
            set_path(result, path.strip(), parse_value_text(raw))
        except ValueError as exc:
            problems.append(Problem(path, "…" if _unechoed(path) else raw, f"--set: {exc}",
                                    fix="a key path of the config and a YAML value"))
    for key in assume_secret:
        top = key.split(".", 1)[0]
        if top not in SECRET_KEYS + SECRET_OBJECT_KEYS or (top in SECRET_OBJECT_KEYS) != ("." in key):
            problems.append(Problem("--assume-secret", key, "is not a secret key",
                                    fix=f"one of {', '.join(SECRET_KEYS)}, or proxy_keys.<client> / "
                                    "env_secrets.<NAME>"))
            continue
        try:
            set_path(result, key, SECRET)
        except ValueError as exc:
            problems.append(Problem("--assume-secret", key, str(exc), fix="e.g. --assume-secret proxy_keys.team-a"))
    if problems:
        raise ConfigError(stack, problems)
    return result


# --- secrets --------------------------------------------------------------------------------------------------


def _secret_fix(path: str) -> str:
    top, _, rest = path.partition(".")
    if top in ("container", "fabric") and rest.startswith("env."):
        name = rest.removeprefix("env.")
        return (f"remove it from {top}.env and run: pulumi config set --secret --path "
                f"'{PROJECT}:env_secrets.{name}' <value>")
    return f"only {', '.join(SECRET_KEYS)} and {', '.join(SECRET_OBJECT_KEYS)}.* hold secrets"


def secret_problems(values: dict[str, Any]) -> tuple[list[Problem], dict[str, Any]]:
    """Plain text where a secret belongs, and secrets where plain config belongs. Returns the problems and the
    values with the offending keys removed, so no later message can echo a secret's plaintext."""
    problems: list[Problem] = []
    clean = dict(values)
    for key in SECRET_KEYS:
        if key in values and values[key] is not None and values[key] is not SECRET:
            problems.append(Problem(key, PLAIN, "holds a secret in plain config",
                                    fix=f"pulumi config set --secret {PROJECT}:{key} <value>"))
            clean.pop(key)
    for key in SECRET_OBJECT_KEYS:
        entries = values.get(key)
        if entries is None:
            continue
        if not isinstance(entries, dict):
            problems.append(Problem(key, "[secret]" if entries is SECRET else PLAIN,
                                    "must be a mapping of name -> secret, so the names stay reviewable",
                                    fix=f"pulumi config set --secret --path '{PROJECT}:{key}.<name>' <value>"))
            clean.pop(key)
            continue
        plain = [name for name, secret in entries.items() if secret is not SECRET]
        problems += [Problem(f"{key}.{name}", PLAIN, "holds a secret in plain config",
                             fix=f"pulumi config set --secret --path '{PROJECT}:{key}.{name}' <value>")
                     for name in plain]
        if plain:
            clean.pop(key)

    def walk(value: Any, path: str) -> Any:
        """Report each misplaced secret and stand the marker text in for it, so the schema checks the rest."""
        if value is SECRET:
            problems.append(Problem(path, SECRET, "holds a secret here, where Pulumi would pass the decrypted "
                                    "value into plain resource inputs (env, argv, labels)", fix=_secret_fix(path)))
            return SECRET_TEXT
        if isinstance(value, dict):
            return {k: walk(v, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(value)]
        return value

    for key, value in values.items():
        if key not in SECRET_KEYS + SECRET_OBJECT_KEYS:
            clean[key] = walk(value, key)
    return problems, clean


# --- pydantic errors in the project's words ----------------------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X; Annotated[X, …] -> X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def field_at(loc: tuple[Any, ...]) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The FieldInfo a validation error location points at, and the model that holds it."""
    model: type[BaseModel] | None = StackConfig
    info: FieldInfo | None = None
    annotation: Any = None
    holder: type[BaseModel] | None = None
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if model is not None and isinstance(part, str) and part in model.model_fields:
            holder = model
            info = model.model_fields[part]
            annotation = _unwrap(info.annotation)
        elif annotation is not None and typing.get_origin(annotation) in (list, dict):
            annotation = _unwrap(typing.get_args(annotation)[-1])
        else:
            return info, holder
        while typing.get_origin(annotation) in (list, dict) and parts and (
                isinstance(parts[0], int) or typing.get_origin(annotation) is dict):
            parts.pop(0)
            annotation = _unwrap(typing.get_args(annotation)[-1])
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return info, holder


def _bounds(info: FieldInfo | None) -> tuple[Any, Any]:
    low = high = None
    for item in info.metadata if info else []:
        for attr in ("ge", "gt"):
            if getattr(item, attr, None) is not None:
                low = getattr(item, attr)
        for attr in ("le", "lt"):
            if getattr(item, attr, None) is not None:
                high = getattr(item, attr)
    return low, high


def _kind(info: FieldInfo | None) -> str | None:
    if info is None:
        return None
    for item in info.metadata:
        if isinstance(item, Kind):
            return item.name
    annotation = info.annotation
    for arg in typing.get_args(annotation) or ():
        for meta in typing.get_args(arg)[1:] if typing.get_origin(arg) is typing.Annotated else ():
            if isinstance(meta, Kind):
                return meta.name
    return None


def _example(info: FieldInfo | None, low: Any) -> str:
    if info is not None and info.examples:
        return str(info.examples[0])
    default = info.default if info is not None else None
    if isinstance(default, bool) or default is None or not isinstance(default, int | float):
        return f"{low}" if low is not None else "8"
    return f"{default}"


def _range_text(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"from {low} to {high}"
    if low is not None:
        return f"at least {low}"
    return f"at most {high}" if high is not None else "a number"


def _dbo_on(values: dict[str, Any]) -> bool:
    parallelism = values.get("parallelism")
    dbo = parallelism.get("dbo") if isinstance(parallelism, dict) else None
    return isinstance(dbo, dict) and dbo.get("enabled") is True


def _problem(error: Any, values: dict[str, Any] | None = None) -> Problem:
    loc = tuple(part for part in error["loc"] if part != "[key]")
    key = ".".join(str(part) for part in loc) or "<root>"
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    info, _ = field_at(loc)
    what = f" ({info.description})" if info is not None and info.description else ""
    low, high = _bounds(info)
    if kind == "vllm_cluster":
        return Problem(key, value, error["msg"], fix=ctx.get("fix"))
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        near = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}? " if near else ""
        shown = value if isinstance(value, bool | int | float) or value is None else HIDDEN  # a mistyped secret key
        return Problem(key, shown, "unknown key (Pulumi would pass it on and nothing would read it)",
                       fix=f"{hint}known keys here: {', '.join(known)}")
    if kind == "missing":
        return Problem(key, None, f"required key is missing{what}", fix="add it (docs/config-reference.md)")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return Problem(key, value, f"must be a whole number{what}",
                       fix=f"a whole number {_range_text(low, high)}, e.g. {_example(info, low)} (unquoted)")
    if kind in ("float_type", "float_parsing", "finite_number"):
        return Problem(key, value, f"must be a finite number{what}",
                       fix=f"a number {_range_text(low, high)}, e.g. {_example(info, low)}")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        if low is None and high is None:  # a list item's own bound: pydantic names only the one it broke
            low, high = ctx.get("ge", ctx.get("gt")), ctx.get("le", ctx.get("lt"))
        if loc[:2] == ("parallelism", "dbo") and str(loc[-1]).endswith("_threshold") and _dbo_on(values or {}):
            return Problem(key, value, f"is out of range{what}", fix=f"a value {_range_text(DBO_MIN_THRESHOLD, high)}"
                           " (dbo.enabled is true: 0 and 1 are refused, vllm/config/parallel.py:1178-1187)")
        if len(loc) == 4 and loc[0] == "nodes" and loc[2:] == ("gpus", "count") and value == 0:
            return Problem(key, value, f"is out of range{what}", fix=f"a value {_range_text(low, high)}; nodes without "
                           "GPUs: vllm-cluster:rehearsal: true on the stack, with gpus as the GPUs its substitute "
                           "engine pretends (docs/rehearsal.md)")
        return Problem(key, value, f"is out of range{what}", fix=f"a value {_range_text(low, high)}")
    if kind in ("bool_type", "bool_parsing"):
        return Problem(key, value, f"must be true or false{what}",
                       fix="true or false, unquoted (yes/no/on/off are strings in YAML 1.2, as Pulumi reads it)")
    if kind == "string_type":
        return Problem(key, value, f"must be a string{what}",
                       fix=f"quote it: \"{value}\" (YAML reads 1.20 as the number 1.2)"
                       if isinstance(value, int | float) and not isinstance(value, bool) else
                       "quote it: YAML reads `::`, `a: b` or `[a]` unquoted as a mapping or a list, e.g. '\"::\"'"
                       if isinstance(value, dict | list) else "a quoted string")
    if kind == "string_too_short":
        if value:
            return Problem(key, value, f"is shorter than {ctx.get('min_length')} characters{what}",
                           fix=f"a whole {_kind(info) or 'value'}")
        return Problem(key, value, f"is empty{what}", fix=f"a {_kind(info) or 'value'}")
    if kind == "string_too_long":
        return Problem(key, value, f"is longer than {ctx.get('max_length')} characters{what}",
                       fix="a shorter value")
    if kind in ("too_short", "too_long"):
        bound = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        word = "at least" if kind == "too_short" else "at most"
        return Problem(key, f"{ctx.get('actual_length')} item(s)", f"needs {word} {bound} item(s){what}",
                       fix=f"{word} {bound} item(s)")
    if kind == "list_type":
        return Problem(key, value, f"must be a list{what}", fix="a YAML list: [a, b] or one '- item' per line")
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        keys = _known_keys(loc)
        return Problem(key, value, f"must be a mapping{what}",
                       fix=f"a mapping with keys {', '.join(keys)}" if keys else "a mapping of name: value")
    if kind in ("literal_error", "enum"):
        extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
        works = extra.get(WHAT_WORKS)
        return Problem(key, value, f"is not one of the allowed values{what}",
                       fix=str(works) if works else f"one of {ctx.get('expected')}")
    if kind == "is_instance_of":
        return Problem(key, value, f"must be a Pulumi secret{what}",
                       fix=f"pulumi config set --secret {PROJECT}:{key} <value>")
    message = str(error["msg"]).removeprefix("Value error, ")
    return Problem(key, value, f"{message}{what}", fix=f"a {_kind(info)}" if _kind(info) else None)


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    if not loc:
        return list(StackConfig.model_fields)
    info, _ = field_at(loc)
    if info is None:
        return []
    annotation = _unwrap(info.annotation)
    while typing.get_origin(annotation) in (list, dict):
        annotation = _unwrap(typing.get_args(annotation)[-1])
    return list(annotation.model_fields) if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _non_finite(value: Any, path: str) -> list[Problem]:
    """Pulumi cannot store NaN or infinity (its config values are JSON): refuse them anywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        info, _ = field_at(tuple(_path(path)))
        annotation = _unwrap(info.annotation) if info is not None else None
        names = [str(a) for a in typing.get_args(annotation) if a is not None] \
            if typing.get_origin(annotation) is typing.Literal else []
        if names:  # a key that takes names: YAML read `.nan`/`.inf` as a number
            return [Problem(path, value, "is not one of the allowed values (YAML reads .nan and .inf as numbers, "
                            "and Pulumi's JSON config has no NaN or infinity)", fix=f"one of {', '.join(names)}")]
        return [Problem(path, value, "is not a finite number (Pulumi stores config as JSON, which has no "
                        "infinity or NaN)", fix="a quoted string" if annotation is str else "a finite number")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{path}.{i}")]
    return []


def parse_config(stack: str, values: dict[str, Any], positions: dict[tuple[str | int, ...], str] | None = None
                 ) -> StackConfig:
    """Validate the raw values; every schema problem is reported at once, with the key and what works."""
    problems, clean = secret_problems(values)
    problems += [p for key in clean for p in _non_finite(clean[key], key)]
    try:
        config = StackConfig.model_validate(clean)
    except ValidationError as exc:
        reported = {p.key for p in problems}
        problems += [p for p in (_problem(error, clean) for error in exc.errors())
                     if not any(p.key == r or p.key.startswith(f"{r}.") for r in reported)]
        raise ConfigError(stack, locate(problems, positions)) from None
    if problems:
        raise ConfigError(stack, locate(problems, positions))
    return config


def locate(problems: list[Problem], positions: dict[tuple[str | int, ...], str] | None) -> list[Problem]:
    """Add `file:line:column` to each problem whose key (or its nearest parent) came from the stack file."""
    if not positions:
        return problems
    located = []
    for problem in problems:
        parts: tuple[str | int, ...] = tuple(_path(problem.key.replace("[]", "")))
        where = None
        while parts and where is None:
            where = positions.get(parts)
            parts = parts[:-1]
        located.append(problem if where is None or problem.where else
                       Problem(problem.key, problem.value, problem.message, problem.upstream, problem.fix, where))
    return located


def load_stack_document(stack: str, overrides: list[str] | None = None, assume_secret: Iterable[str] = (),
                        root: Path = PROJECT_ROOT) -> tuple[StackConfig, StackDocument]:
    """The validated config and the document it came from; values set on the command line are located at
    `--set …` / `--assume-secret …` instead of the file line they replaced."""
    document = read_stack_document(stack, root)
    values = document.values
    if overrides or assume_secret:
        values = apply_overrides(values, list(overrides or []), assume_secret, stack)
        # the origin names the key only: a value set on the command line may be a secret typed in plain text
        for item, origin in [(o.partition("=")[0], f"--set {o.partition('=')[0]}=…") for o in overrides or []] + [
                (k, f"--assume-secret {k}") for k in assume_secret]:
            path = tuple(_path(item.strip()))
            for known in [p for p in document.positions if p[:len(path)] == path]:
                del document.positions[known]
            document.positions[path] = origin
    return parse_config(stack, values, document.positions), document


def load_stack(stack: str, overrides: list[str] | None = None, root: Path = PROJECT_ROOT,
               assume_secret: Iterable[str] = ()) -> StackConfig:
    return load_stack_document(stack, overrides, assume_secret, root)[0]
