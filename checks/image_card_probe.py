"""Image card probe: what a vLLM image offers, as one JSON document on stdout.

Run inside a vLLM image (stdin to the image's interpreter) or with a venv's interpreter:

    cat model_classes.py image_card_probe.py |
        docker run --rm -i -e VLLM_TARGET_DEVICE=cpu --entrypoint python3 vllm/vllm-openai:v0.33.0 -
    cat model_classes.py image_card_probe.py | VLLM_TARGET_DEVICE=cpu venv/bin/python - > card.json

Stdlib + vllm (and what vllm itself imports) only. Every section is wrapped in try/except: a section that fails
is recorded under "errors" (section -> "Type: message") and the rest of the card is still produced. Everything vLLM
or its libraries print (logs, warnings) goes to stderr; stdout carries the JSON document alone.

Sections:
- vllm_version, python, torch_version, platform, env (the VLLM_TARGET_DEVICE the card was taken with);
- serve_parser: the parser `vllm serve` uses, built as vllm/entrypoints/cli/main.py builds it (a top-level
  FlexibleArgumentParser, subparsers, the serve module's `cmd_init()[0].subparser_init(subparsers)`, which calls
  `make_arg_parser`); fallback: `make_arg_parser(FlexibleArgumentParser())` from
  vllm.entrypoints.common.cli_args (0.33), vllm.entrypoints.launchers.cli_args (0.32) or
  vllm.entrypoints.openai.cli_args (older);
  per option: option_strings (as shown in help), all_option_strings (every string argparse accepts for it,
  hidden ones included, e.g. --no-enable-x), dest, group (the config class / group title), action kind, type,
  nargs, const, choices, metavar, default, required, deprecated (argparse `deprecated=` kwarg), help_deprecated
  (help text mentions "deprecat"), help (first paragraph), bounds (pydantic ge/gt/le/lt of the config field behind
  the option, when the group is a config class), json_config (the dataclass a JSON-valued option is validated as);
- config_classes: fields of the dataclasses behind JSON-valued options and behind option groups (recursively:
  nested dataclasses too): type, default, bounds, nested dataclass, and `shape`: the type as a structure
  (int/float/str/bool, list with its item shape, union, Literal values, enum members with the inputs the field's
  own validators accept, tried here against pydantic: the value, the value as a string, the name, the name in
  lower case);
- routes: the OpenAI server app's routes (method + path), built with vLLM's own build_app for each task set;
- registries (cheap extras): quantization methods, tool/reasoning parsers, model architectures, env var names;
- load_formats (probe 3): every `--load-format` the image's vLLM registers (its loader registry, after the general
  plugins ran, as EngineArgs does), each with its loader class and the optional packages that loader imports
  (LOADER_PACKAGES below, read from vLLM 0.33.0's loaders) and whether this interpreter has them
  (importlib.util.find_spec, the distribution's version); safetensors_load_strategies and the packages they need;
- lora_architectures (probe 4): per registered architecture, the class vLLM imports on CUDA and whether it supports
  LoRA (`supported` / `unsupported`: arch -> "file:line Class"; `unresolved`: arch -> why), read from the source by
  checks/model_classes.py, which `stacks image-card` sends in front of this file (a card is taken on CPU, where
  some architectures import another class).
"""

import contextlib
import dataclasses
import enum
import json
import math
import os
import platform as _platform
import re
import sys
import time
import traceback
from collections import abc as collections_abc
from collections.abc import Iterator
from typing import Any

PROBE_VERSION = 4
T0 = time.monotonic()
CARD: dict[str, Any] = {"probe_version": PROBE_VERSION, "errors": {}, "timings_s": {}}

# ---- keep stdout for the JSON document only ------------------------------------------------------------------------
_REAL_STDOUT_FD = os.dup(1)
os.dup2(2, 1)  # anything written to fd 1 (C extensions, print) now lands on stderr
sys.stdout = sys.stderr
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
# vLLM fills the help texts of config-derived options only when "--help" is on the command line
# (vllm/engine/arg_utils.py NEEDS_HELP); pretend to be `vllm serve --help` while the parser is built.
_SAVED_ARGV = list(sys.argv)
sys.argv = ["vllm", "serve", "--help"]


def _err(section: str, exc: BaseException) -> None:
    CARD["errors"][section] = f"{type(exc).__name__}: {str(exc)[:800]}"
    CARD.setdefault("tracebacks", {})[section] = traceback.format_exc()[-3000:]


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    except BaseException as exc:  # SystemExit from argparse too
        _err(name, exc)
    finally:
        CARD["timings_s"][name] = round(time.monotonic() - start, 3)


def jsonsafe(value: Any, depth: int = 0) -> Any:
    """A JSON-safe rendering of a default value (enums by value, sets sorted, dataclasses as dicts)."""
    if depth > 6:
        return stable_repr(repr(value))[:200]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return {"enum": type(value).__name__, "name": value.name, "value": jsonsafe(value.value, depth + 1)}
    if isinstance(value, dict):
        return {str(k): jsonsafe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonsafe(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonsafe(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"__dataclass__": type(value).__name__}
        for f in dataclasses.fields(value):
            try:
                out[f.name] = jsonsafe(getattr(value, f.name), depth + 1)
            except Exception as exc:
                out[f.name] = f"<unreadable: {type(exc).__name__}>"
        return out
    if isinstance(value, type):
        return f"<class {value.__module__}.{value.__qualname__}>"
    if callable(value):
        return stable_repr(f"<callable {getattr(value, '__module__', '?')}."
                           f"{getattr(value, '__qualname__', repr(value))}>")
    return stable_repr(repr(value))[:300]


def describe_type(t: Any, depth: int = 0) -> Any:
    """Name the callable argparse uses as `type=`; look through vLLM's wrappers (closures)."""
    if t is None:
        return None
    if depth > 4:
        return {"name": stable_repr(repr(t))[:100]}
    if isinstance(t, type):
        if dataclasses.is_dataclass(t):
            return {"name": t.__name__, "kind": "dataclass", "module": t.__module__}
        return {"name": t.__name__, "kind": "builtin" if t.__module__ == "builtins" else "class",
                "module": t.__module__}
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or stable_repr(repr(t))
    out: dict[str, Any] = {"name": name, "module": getattr(t, "__module__", None), "kind": "function"}
    if name == "json.loads" or (getattr(t, "__module__", "") == "json" and getattr(t, "__name__", "") == "loads"):
        out["kind"] = "json"
    # closures: optional_type(x) -> _optional_type, parse_type(x) -> _parse_type (cell 'return_type')
    code = getattr(t, "__code__", None)
    closure = getattr(t, "__closure__", None)
    if code is not None and closure:
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure), strict=False))
        inner = cells.get("return_type")
        if inner is not None:
            out["wraps"] = describe_type(inner, depth + 1)
        other = {k: jsonsafe(v) for k, v in cells.items() if k != "return_type"}
        if other:
            out["closure"] = other
    # parse_dataclass(val, cls=<dataclass>): the dataclass is a default argument
    defaults = getattr(t, "__defaults__", None)
    if defaults:
        for d in defaults:
            if isinstance(d, type) and dataclasses.is_dataclass(d):
                out["kind"] = "json->dataclass"
                out["dataclass"] = d.__name__
                out["dataclass_module"] = d.__module__
    short = name.rsplit(".", 1)[-1].lstrip("_")
    if short in ("optional_type",):
        out["optional"] = True
    return out


def _bounds_from_metadata(metadata: Any) -> dict[str, Any]:
    bounds = {}
    for m in metadata or ():
        for attr in ("ge", "gt", "le", "lt", "multiple_of", "min_length", "max_length"):
            v = getattr(m, attr, None)
            if v is not None and not callable(v):
                bounds[attr] = jsonsafe(v)
    return bounds


def _annotated_bounds(tp: Any) -> dict[str, Any]:
    """Bounds carried in typing.Annotated[..., Field(ge=...)] / annotated_types.Ge(...) / Union members."""
    import typing

    bounds = {}
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        meta = list(typing.get_args(tp)[1:])
        expanded = []
        for m in meta:
            expanded.append(m)
            expanded.extend(getattr(m, "metadata", None) or [])  # pydantic FieldInfo inside Annotated
        bounds.update(_bounds_from_metadata(expanded))
        bounds.update(_annotated_bounds(typing.get_args(tp)[0]))
    elif origin is not None:
        for a in typing.get_args(tp):
            if a is not type(None):
                bounds.update(_annotated_bounds(a))
    return bounds


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def stable_repr(text: str) -> str:
    """A repr without the object addresses (`<function <lambda> at 0x7f…>` -> `<function <lambda>>`): they differ
    on every run, and a card must come out byte for byte the same from the same image."""
    return _ADDRESS.sub(">", text)


def _type_str(tp: Any) -> str:
    s = getattr(tp, "__name__", None) if isinstance(tp, type) else None
    s = s or repr(tp)
    return stable_repr(s).replace("typing.", "")[:300]


def _literal_values(tp: Any, out: list[Any] | None = None, depth: int = 0) -> list[Any]:
    """Every value of the Literal[...] members of a type hint (through Optional / Union / Annotated / list)."""
    import typing

    out = [] if out is None else out
    if depth > 5:
        return out
    if typing.get_origin(tp) is typing.Literal:
        out.extend(jsonsafe(a) for a in typing.get_args(tp))
    else:
        for a in typing.get_args(tp) or ():
            _literal_values(a, out, depth + 1)
    return out


def _nested_dataclasses(tp: Any, found: list[Any]) -> None:
    import typing

    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        found.append(tp)
        return
    for a in typing.get_args(tp) or ():
        _nested_dataclasses(a, found)


def _before_validators(cls: Any, name: str) -> list[Any]:
    """The field's pydantic `mode="before"` validators (e.g. CompilationConfig.mode reads enum names)."""
    found = []
    decorators = getattr(cls, "__pydantic_decorators__", None)
    for d in getattr(decorators, "field_validators", {}).values():
        if name in getattr(d.info, "fields", ()) and getattr(d.info, "mode", "") == "before":
            found.append(d.func)
    return found


def _none_by_validator(cls: Any, name: str) -> bool:
    """A `mode="wrap"` validator that returns None without validating (vLLM's `_skip_none_validation`)."""
    decorators = getattr(cls, "__pydantic_decorators__", None)

    def refuse(value: Any) -> Any:
        raise ValueError("validated")

    for d in getattr(decorators, "field_validators", {}).values():
        if name in getattr(d.info, "fields", ()) and getattr(d.info, "mode", "") == "wrap":
            try:
                if getattr(d.func, "__func__", d.func)(cls, None, refuse) is None:
                    return True
            except Exception:
                continue
    return False


def _enum_inputs(cls: Any, name: str, tp: Any) -> dict[str, bool]:
    """Which spellings of the enum's first member the field accepts: run the field's own before validators, then
    pydantic's validation of the type (lax, as vLLM builds its configs)."""
    from pydantic import TypeAdapter

    adapter = TypeAdapter(tp)
    validators = _before_validators(cls, name)
    member = next(iter(tp))
    value = member.value

    def ok(candidate: Any) -> bool:
        try:
            for v in validators:
                candidate = getattr(v, "__func__", v)(cls, candidate)
            adapter.validate_python(candidate)
            return True
        except Exception:
            return False

    return {"value": ok(value), "value_string": isinstance(value, int) and ok(str(value)), "name": ok(member.name),
            "name_lower": member.name.lower() != value and ok(member.name.lower()),  # read as the value otherwise
            "other_string": ok("__not_a_member__")}


def describe_shape(tp: Any, cls: Any = None, name: str = "", depth: int = 0) -> dict[str, Any]:
    """A type hint as a structure the planner checks JSON and argv values against (pydantic's lax rules)."""
    import types
    import typing

    if depth > 6:
        return {"kind": "any", "type": _type_str(tp)}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return describe_shape(args[0], cls, name, depth + 1)
    if tp is type(None) or tp is None:
        return {"kind": "none"}
    if tp is typing.Any:
        return {"kind": "any", "type": "Any"}
    if origin is typing.Literal:
        return {"kind": "literal", "values": [jsonsafe(a) for a in args]}
    if origin is typing.Union or (hasattr(types, "UnionType") and isinstance(tp, types.UnionType)):
        return {"kind": "union", "options": [describe_shape(a, cls, name, depth + 1) for a in args]}
    if origin in (list, set, frozenset, tuple, collections_abc.Sequence, collections_abc.Set):
        items = args[0] if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)) else None
        return {"kind": "list", "container": getattr(origin, "__name__", str(origin)),
                "items": describe_shape(items, cls, name, depth + 1) if items is not None else {"kind": "any"}}
    if origin in (dict, collections_abc.Mapping):
        return {"kind": "dict"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        out: dict[str, Any] = {"kind": "enum", "enum": tp.__name__, "int_enum": issubclass(tp, int),
                               "members": [{"name": m.name, "value": jsonsafe(m.value)} for m in tp]}
        try:
            out["accepts"] = _enum_inputs(cls, name, tp)
        except Exception as exc:
            out["accepts_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return out
    if tp is bool:
        return {"kind": "bool"}
    if tp in (int, float, str):
        return {"kind": tp.__name__}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return {"kind": "dataclass", "name": tp.__name__}
    if tp is dict or tp is list:
        return {"kind": "dict"} if tp is dict else {"kind": "list", "container": "list", "items": {"kind": "any"}}
    return {"kind": "any", "type": _type_str(tp)}


def describe_config_class(cls: Any) -> tuple[dict[str, Any], list[Any]]:
    """Fields of a (pydantic) dataclass: type, default, bounds (pydantic Field ge/gt/le/lt), nested dataclasses."""
    import typing

    out: dict[str, Any] = {"module": cls.__module__, "fields": {}}
    pyd = getattr(cls, "__pydantic_fields__", None) or {}
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        hints = {}
        out["type_hints_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    nested = []
    for f in dataclasses.fields(cls):
        entry: dict[str, Any] = {}
        tp = hints.get(f.name, f.type)
        entry["type"] = _type_str(tp)
        bounds = {}
        info = pyd.get(f.name)
        default = dataclasses.MISSING
        if info is not None:
            bounds.update(_bounds_from_metadata(getattr(info, "metadata", None)))
            if getattr(info, "default_factory", None) is not None:
                entry["default_factory"] = jsonsafe(info.default_factory)
            else:
                d = getattr(info, "default", dataclasses.MISSING)
                if d is not dataclasses.MISSING and type(d).__name__ != "PydanticUndefinedType":
                    default = d
        if default is dataclasses.MISSING:
            d = f.default
            if d is not dataclasses.MISSING and type(d).__name__ == "FieldInfo":
                bounds.update(_bounds_from_metadata(getattr(d, "metadata", None)))
                d = getattr(d, "default", dataclasses.MISSING)
                if type(d).__name__ == "PydanticUndefinedType":
                    d = dataclasses.MISSING
            if d is not dataclasses.MISSING:
                default = d
            elif f.default_factory is not dataclasses.MISSING:
                entry.setdefault("default_factory", jsonsafe(f.default_factory))
        if default is not dataclasses.MISSING:
            entry["default"] = jsonsafe(default)
        elif "default_factory" not in entry:
            entry["required"] = True
        bounds.update(_annotated_bounds(tp))
        lits = _literal_values(tp)
        if lits:
            entry["choices"] = lits
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            entry["choices"] = [jsonsafe(m) for m in tp]
        if bounds:
            entry["bounds"] = bounds
        sub: list[Any] = []
        _nested_dataclasses(tp, sub)
        if sub:
            entry["dataclasses"] = [s.__name__ for s in sub]
            nested.extend(sub)
        try:
            entry["shape"] = describe_shape(tp, cls, f.name)
            if _none_by_validator(cls, f.name):
                entry["shape"] = {"kind": "union", "options": [entry["shape"], {"kind": "none"}],
                                  "none_by_validator": True}
        except Exception as exc:
            entry["shape"] = {"kind": "any", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        if not f.init:
            entry["init"] = False
        out["fields"][f.name] = entry
    return out, nested


# ---- version / platform --------------------------------------------------------------------------------------------
with section("versions"):
    CARD["python"] = _platform.python_version()
    CARD["env"] = {k: os.environ.get(k) for k in ("VLLM_TARGET_DEVICE", "VLLM_SERVER_DEV_MODE")}
    try:
        from importlib.metadata import version as _dist_version

        CARD["vllm_dist_version"] = _dist_version("vllm")
    except Exception as exc:
        _err("vllm_dist_version", exc)
    import vllm

    CARD["vllm_version"] = getattr(vllm, "__version__", None) or CARD.get("vllm_dist_version")
    CARD["vllm_path"] = os.path.dirname(vllm.__file__)
    try:
        import torch

        CARD["torch_version"] = torch.__version__
    except Exception as exc:
        _err("torch", exc)

with section("platform"):
    from vllm.platforms import current_platform

    CARD["platform"] = {"class": type(current_platform).__name__,
                        "device_type": getattr(current_platform, "device_type", None)}

# ---- the serve parser ------------------------------------------------------------------------------------------------
SERVE: Any = None
with section("serve_parser"):
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    build = None
    try:
        import vllm.entrypoints.cli.serve as cli_serve

        top = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        cmd = cli_serve.cmd_init()[0]
        SERVE = cmd.subparser_init(subparsers)
        build = "vllm.entrypoints.cli.serve.cmd_init()[0].subparser_init(subparsers) (as cli/main.py)"
    except Exception as exc:
        _err("serve_parser.cli_serve", exc)
        make_arg_parser: Any = None
        for mod in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                    "vllm.entrypoints.openai.cli_args"):
            try:
                make_arg_parser = __import__(mod, fromlist=["make_arg_parser"]).make_arg_parser
                build = f"{mod}.make_arg_parser(FlexibleArgumentParser())"
                break
            except Exception as exc2:
                _err(f"serve_parser.{mod}", exc2)
        SERVE = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    CARD["serve_parser_build"] = build

sys.argv = _SAVED_ARGV

JSON_DATACLASSES: dict[str, Any] = {}  # name -> class
GROUP_CLASSES: dict[str, Any] = {}  # group title -> class
OPTIONS: list[dict[str, Any]] = []
with section("options"):
    import argparse

    accepted: dict[int, list[str]] = {}
    for opt, act in SERVE._option_string_actions.items():
        accepted.setdefault(id(act), []).append(opt)
    group_of = {}
    for g in SERVE._action_groups:
        for a in g._group_actions:
            group_of[id(a)] = g.title
    deprecated_set = {id(a) for a in getattr(SERVE, "_deprecated", ())}
    try:
        import vllm.config as vcfg
    except Exception:
        vcfg = None
    for title in set(group_of.values()):
        cls = getattr(vcfg, title, None) if (vcfg and title) else None
        if cls is None and title == "Frontend":
            for mod in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                    "vllm.entrypoints.openai.cli_args"):
                try:
                    cls = __import__(mod, fromlist=["FrontendArgs"]).FrontendArgs
                    break
                except Exception:
                    pass
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            GROUP_CLASSES[title] = cls

    for act in SERVE._actions:
        if isinstance(act, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        help_text = act.help if isinstance(act.help, str) else ("SUPPRESS" if act.help is not None else None)
        entry = {
            "option_strings": list(act.option_strings),
            "all_option_strings": sorted(accepted.get(id(act), [])),
            "dest": act.dest,
            "positional": not act.option_strings,
            "group": group_of.get(id(act)),
            "action": type(act).__name__,
            "action_bases": [b.__name__ for b in type(act).__mro__[1:] if b.__module__ == "argparse"][:3],
            "type": describe_type(act.type),
            "nargs": act.nargs,
            "const": jsonsafe(act.const),
            "choices": jsonsafe(list(act.choices)) if act.choices is not None else None,
            "metavar": jsonsafe(act.metavar),
            "default": jsonsafe(act.default),
            "required": act.required,
            "deprecated": bool(getattr(act, "deprecated", False)) or id(act) in deprecated_set,
            "help_deprecated": bool(help_text and "deprecat" in help_text.lower()),
            "help": (help_text or "").split("\n\n", 1)[0].strip()[:400] if help_text else help_text,
        }
        t = entry["type"] or {}
        dc_type = t if t.get("kind") == "json->dataclass" else (t.get("wraps") or {})
        if dc_type.get("kind") == "json->dataclass":
            entry["json_config"] = dc_type["dataclass"]
            fn = act.type
            while fn is not None and not any(isinstance(d, type) and dataclasses.is_dataclass(d)
                                             for d in (getattr(fn, "__defaults__", None) or ())):
                cells = dict(zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()),
                                 (c.cell_contents for c in (getattr(fn, "__closure__", None) or ())), strict=False))
                fn = cells.get("return_type")
            for d in (getattr(fn, "__defaults__", None) or ()):
                if isinstance(d, type) and dataclasses.is_dataclass(d):
                    JSON_DATACLASSES[d.__name__] = d
        elif (t.get("wraps") or {}).get("kind") == "json" or t.get("kind") == "json":
            entry["json_config"] = "dict (json.loads)"
        elif t.get("name", "").endswith("union_dict_and_str") or (t.get("wraps") or {}).get("name", "").endswith(
                "union_dict_and_str"):
            entry["json_config"] = "dict or str (union_dict_and_str)"
        OPTIONS.append(entry)
    CARD["options"] = OPTIONS
    CARD["option_count"] = sum(1 for o in OPTIONS if not o["positional"])

# ---- dataclasses behind the options ----------------------------------------------------------------------------------
CONFIGS: dict[str, Any] = {}
with section("config_classes"):
    todo = list(JSON_DATACLASSES.values()) + list(GROUP_CLASSES.values())
    seen = set()
    while todo:
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            desc, nested = describe_config_class(cls)
        except Exception as exc:
            _err(f"config_classes.{cls.__name__}", exc)
            continue
        desc["json_valued_option"] = cls.__name__ in JSON_DATACLASSES
        desc["option_group"] = [t for t, c in GROUP_CLASSES.items() if c is cls] or None
        CONFIGS[cls.__name__] = desc
        todo.extend(n for n in nested if n not in seen)
    CARD["config_classes"] = CONFIGS
    CARD["json_valued_options"] = {o["option_strings"][0]: o["json_config"] for o in OPTIONS
                                   if o.get("json_config") and o["option_strings"]}

with section("option_bounds"):
    for o in OPTIONS:
        cls = GROUP_CLASSES.get(o["group"])
        if cls is None:
            continue
        f = CONFIGS.get(cls.__name__, {}).get("fields", {}).get(o["dest"])
        if not f:
            continue
        o["config_field"] = f"{cls.__name__}.{o['dest']}"
        if f.get("bounds"):
            o["bounds"] = f["bounds"]
        # a JSON option parsed as a plain dict whose config field is a dataclass (e.g. --speculative-config ->
        # SpeculativeConfig, validated later by the config): name that dataclass
        if o.get("json_config") and f.get("dataclasses") and o["json_config"] not in f["dataclasses"]:
            o["json_config_validated_as"] = f["dataclasses"]
    CARD["json_valued_options"] = {o["option_strings"][0]: o.get("json_config_validated_as") or o["json_config"]
                                   for o in OPTIONS if o.get("json_config") and o["option_strings"]}

# ---- API routes --------------------------------------------------------------------------------------------------
with section("routes"):
    import typing
    import warnings

    build_app: Any = None
    for mod in ("vllm.entrypoints.launchers.app", "vllm.entrypoints.openai.api_server"):
        try:
            build_app = __import__(mod, fromlist=["build_app"]).build_app
            CARD["routes_build"] = f"{mod}.build_app(args, supported_tasks)"
            break
        except Exception as exc:
            _err(f"routes.import.{mod}", exc)
    if build_app is None:
        raise RuntimeError("no build_app found")
    import inspect

    takes_tasks = "supported_tasks" in inspect.signature(build_app).parameters
    tasks = []
    try:
        import vllm.tasks as vtasks

        def _lits(tp: Any) -> list[Any]:
            out = []
            for a in typing.get_args(tp):
                out.extend(_lits(a) if typing.get_origin(a) is not None else [a])
            return out

        tasks = [t for t in _lits(vtasks.SupportedTask) if isinstance(t, str)]
    except Exception as exc:
        _err("routes.tasks", exc)
    CARD["supported_task_values"] = tasks
    base_args = SERVE.parse_args([])
    variants: list[tuple[str, tuple[str, ...]]] = [("generate", ("generate",))]
    variants += [(t, (t,)) for t in tasks if t != "generate"]
    variants.append(("all_tasks", tuple(tasks)))
    routes: dict[Any, Any] = {}

    def _collect(app: Any, label: str) -> None:
        for r in getattr(app, "routes", []):
            path = getattr(r, "path", None)
            if path is None:
                continue
            methods = sorted(getattr(r, "methods", None) or []) or [type(r).__name__]
            for m in methods:
                key = f"{m} {path}"
                e = routes.setdefault(key, {"method": m, "path": path, "kind": type(r).__name__, "when": []})
                ep = getattr(r, "endpoint", None)
                if ep is not None and "endpoint" not in e:
                    e["endpoint"] = f"{getattr(ep, '__module__', '?')}.{getattr(ep, '__qualname__', '?')}"
                if label not in e["when"]:
                    e["when"].append(label)

    pooling: set[str] = set()
    with contextlib.suppress(Exception):
        pooling = set(getattr(vtasks, "POOLING_TASKS", ()))

    class _StubHF:
        num_labels = 1  # entrypoints/pooling/utils.py enable_scoring_api: classify scores only with 1 label

    class _StubModelConfig:
        """Only what the pooling routers ask of a ModelConfig: the pooling task and hf_config.num_labels."""
        hf_config = _StubHF()
        architectures = ["StubModel"]  # noqa: RUF012 (read as a list by vLLM, never mutated)

        def __init__(self, task: Any) -> None:
            self.task = task

        def get_pooling_task(self, supported_tasks: Any) -> Any:
            return self.task if self.task in supported_tasks else None

    def _build(args: Any, ts: Any, model_config: Any = None) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not takes_tasks:
                return build_app(args)
            if model_config is not None:
                return build_app(args, supported_tasks=ts, model_config=model_config)
            return build_app(args, supported_tasks=ts)

    for label, ts in variants:
        try:
            stub = _StubModelConfig(ts[0]) if (len(ts) == 1 and ts[0] in pooling) else None
            try:
                app = _build(base_args, ts, stub)
            except Exception as exc:
                if stub is None:
                    raise
                _err(f"routes.task={label}.stub_model_config", exc)
                app = _build(base_args, ts)
            _collect(app, f"task={label}")
        except Exception as exc:
            _err(f"routes.task={label}", exc)
        if not takes_tasks:
            break
    baseline = {k for k, e in routes.items() if "task=generate" in e["when"]}

    def _collect_new(app: Any, label: str) -> None:
        before = {k: list(e["when"]) for k, e in routes.items()}
        _collect(app, label)
        for k in baseline:  # a flag/env variant only claims the routes it adds to the generate baseline
            routes[k]["when"] = before.get(k, routes[k]["when"])
    # optional routers: --enable-fault-tolerance (args) and VLLM_SERVER_DEV_MODE=1 (env, read lazily by vllm.envs)
    try:
        import copy

        ft_args = copy.copy(base_args)
        ft_args.enable_fault_tolerance = True
        _collect_new(_build(ft_args, ("generate",)), "flag=--enable-fault-tolerance")
    except Exception as exc:
        _err("routes.fault_tolerance", exc)
    old = os.environ.get("VLLM_SERVER_DEV_MODE")
    try:
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"
        try:
            import vllm.envs as venvs

            if hasattr(venvs, "disable_envs_cache"):
                venvs.disable_envs_cache()
        except Exception:
            pass
        _collect_new(_build(base_args, ("generate",)), "env=VLLM_SERVER_DEV_MODE=1")
    except Exception as exc:
        _err("routes.dev_mode", exc)
    finally:
        if old is None:
            os.environ.pop("VLLM_SERVER_DEV_MODE", None)
        else:
            os.environ["VLLM_SERVER_DEV_MODE"] = old
    all_labels = {f"task={label}" for label, _ in variants}
    for e in routes.values():
        e["always"] = all_labels.issubset(e["when"])
    CARD["routes"] = sorted(routes.values(), key=lambda e: (e["path"], e["method"]))
    CARD["routes_note"] = ("built with vLLM's build_app per task set (no engine, no model; pooling task sets get a "
                           "stub model_config whose pooling task is that task and hf_config.num_labels == 1, so the "
                           "score/rerank routes appear); 'when' lists the task sets / flags / env under which the "
                           "route exists ('always' = in every task set); endpoint plugins add more at run time")

# ---- cheap registries ------------------------------------------------------------------------------------------------
REG: dict[str, Any] = {}
with section("registries.quantization"):
    import typing

    from vllm.model_executor.layers import quantization as q

    methods = getattr(q, "QUANTIZATION_METHODS", None) or typing.get_args(q.QuantizationMethods)
    REG["quantization_methods"] = sorted(methods)
with section("registries.tool_parsers"):
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager
    names = set(getattr(ToolParserManager, "tool_parsers", {}) or {})
    names |= set(getattr(ToolParserManager, "lazy_parsers", {}) or {})
    REG["tool_parsers"] = sorted(names)
with section("registries.reasoning_parsers"):
    from vllm.reasoning import ReasoningParserManager

    names = set(getattr(ReasoningParserManager, "reasoning_parsers", {}) or {})
    names |= set(getattr(ReasoningParserManager, "lazy_parsers", {}) or {})
    REG["reasoning_parsers"] = sorted(names)
with section("registries.architectures"):
    from vllm.model_executor.models import ModelRegistry

    REG["architectures"] = sorted(ModelRegistry.get_supported_archs())
with section("registries.env_vars"):
    import vllm.envs as venvs

    REG["env_vars"] = sorted(getattr(venvs, "environment_variables", {}) or {})
CARD["registries"] = REG

LOADER_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    # load format -> (import name, distribution) of each optional package its loader imports (vLLM 0.33.0)
    "fastsafetensors": (("fastsafetensors", "fastsafetensors"),),  # model_loader/weight_utils.py:61-65, 1330
    "instanttensor": (("instanttensor", "instanttensor"),),  # weight_utils.py:1402-1407
    "runai_streamer": (("runai_model_streamer", "runai-model-streamer"),),  # weight_utils.py:55-59
    "runai_streamer_sharded": (("runai_model_streamer", "runai-model-streamer"),),  # sharded_state_loader.py:257
    "tensorizer": (("tensorizer", "tensorizer"),),  # model_loader/tensorizer.py:34-45
    "modelexpress": (("modelexpress", "modelexpress"),),  # model_loader/modelexpress_loader.py:15-30
}
STRATEGY_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "torchao": (("torchao", "torchao"),),  # weight_utils.py:1216-1221 (torchao >= 0.15.0)
}


def _package(module: str, dist: str) -> dict[str, Any]:
    """Whether this interpreter can import `module` (without importing it) and its distribution's version."""
    import importlib.metadata
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    try:
        version: str | None = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"module": module, "found": found, "version": version if found else None}


with section("load_formats"):
    try:
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # plugins register their loaders here (EngineArgs.__post_init__ does the same)
    except Exception as exc:
        _err("load_formats.plugins", exc)
    from vllm.model_executor import model_loader as _ml

    _registry = getattr(_ml, "_LOAD_FORMAT_TO_MODEL_LOADER", None)
    if isinstance(_registry, dict):
        _formats = {str(k): f"{v.__module__}.{v.__qualname__}" for k, v in _registry.items()}
        CARD["load_formats_source"] = "vllm.model_executor.model_loader._LOAD_FORMAT_TO_MODEL_LOADER"
    else:
        import typing

        _formats = {str(k): "" for k in typing.get_args(_ml.LoadFormats)}  # loader unknown
        CARD["load_formats_source"] = "vllm.model_executor.model_loader.LoadFormats (no registry found)"
    CARD["load_formats"] = {
        name: {"loader": loader, "packages": {dist: _package(module, dist)
                                              for module, dist in LOADER_PACKAGES.get(name, ())}}
        for name, loader in sorted(_formats.items())}
with section("safetensors_load_strategies"):
    import typing

    from vllm.config import load as _load

    CARD["safetensors_load_strategies"] = {
        str(name): {"packages": {dist: _package(module, dist) for module, dist in STRATEGY_PACKAGES.get(name, ())}}
        for name in typing.get_args(_load.SafetensorsLoadStrategy)}

with section("lora_architectures"):
    # probe 4: which class CUDA imports per architecture and whether it supports LoRA, read from the source by
    # checks/model_classes.py (sent in front of this file): importing here would read the CPU classes.
    from vllm.model_executor.models import ModelRegistry as _model_registry

    _reader = globals().get("lora_by_architecture")
    if _reader is None:
        raise RuntimeError("checks/model_classes.py was not sent in front of the probe (cat it first)")
    _models: dict[str, Any] = dict(getattr(_model_registry, "models", {}))
    _lazy = {arch: (str(m.module_name), str(m.class_name)) for arch, m in _models.items()
             if hasattr(m, "module_name") and hasattr(m, "class_name")}
    _lora = _reader(os.path.dirname(vllm.__file__), _lazy)
    _lora["unresolved"].update({arch: "registered as a class object at run time" for arch in _models
                                if arch not in _lazy})
    CARD["lora_architectures"] = {
        "platform": "cuda", "source": "the model registry's module and class per architecture, each module's "
        "source read as on CUDA (current_platform.is_*() branches), supports_lora on the class or a base", **_lora}

CARD["timings_s"]["total"] = round(time.monotonic() - T0, 3)
if not CARD["errors"]:
    CARD.pop("tracebacks", None)
doc = json.dumps(CARD, indent=1, sort_keys=False, default=lambda o: stable_repr(repr(o))[:300])
with os.fdopen(_REAL_STDOUT_FD, "w") as out:
    out.write(doc + "\n")
