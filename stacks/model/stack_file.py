"""Read `Pulumi.<stack>.yaml` the way the Pulumi CLI reads it, so `plan` sees what `pulumi up` will see.

The Pulumi CLI (pulumi/pulumi `sdk/go/common/encoding/marshal.go`, `workspace/loaders.go`) decodes stack
files with Go's `gopkg.in/yaml.v3`, whose scalar resolution is YAML 1.2's core schema with a few of its own
rules (go-yaml `resolve.go`): only `true`/`false` (three spellings each) are booleans, so `yes`, `on` and `off`
stay strings; `~`, `null` and empty are null; `0o17`, `0x1F`, `0b101` and also the 1.1-style `017` are
integers; `_` separates digits; `.inf`/`.nan` are floats, and Pulumi then cannot store them (JSON has no
infinity); dates become strings (`time.Time.String()` in `config/object.go`). Duplicate keys are an error
("mapping key already defined"), an anchor that contains itself is an error, and excessive aliasing is refused.
Config keys are `namespace:name` or `namespace:config:name`; a key without a namespace belongs to the project
(`stackConfigNamespacedWithProject`); `{secure: …}` is a secret.

PyYAML (YAML 1.1) would read `off` as False and `0755` the same as Go but `1_000` differently, and would
expand an alias bomb until memory runs out, so this module composes PyYAML's event stream itself and
resolves every scalar by the go-yaml rules. It is pure and bounded: at most `MAX_VALUES` values and
`MAX_DEPTH` levels, whatever the aliases do.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stacks.model.errors import ConfigError, Problem
from stacks.model.field_types import SECRET

PROJECT = "vllm-cluster"
MAX_VALUES = 100_000
"""Values one stack file may expand to, aliases included (the committed stacks hold about 300)."""
MAX_DEPTH = 48
MAX_CHARS = 8 * 1024 * 1024
"""Characters of text one stack file may expand to, aliases included: a 3 MB string aliased 2,000 times is a
handful of values but 6 GB of text for whatever reads it next (the committed stacks hold about 3,000)."""
MAX_BYTES = 4 * 1024 * 1024


@dataclass
class StackDocument:
    """The project's config values (keys without the namespace) and where each came from in the file."""

    values: dict[str, Any]
    positions: dict[tuple[str | int, ...], str] = field(default_factory=dict)
    """Key path -> `file:line:column` of its value."""
    warnings: list[str] = field(default_factory=list)


class _Node:
    __slots__ = ("anchor", "items", "kind", "mark", "style", "tag", "value")

    def __init__(self, kind: str, tag: str | None, mark: Any, anchor: str | None, style: str | None = None,
                 value: str = "") -> None:
        self.kind = kind
        self.tag = tag
        self.mark = mark
        self.anchor = anchor
        self.style = style
        self.value = value
        self.items: list[_Node] = []


class _Fail(Exception):
    def __init__(self, message: str, mark: Any = None) -> None:
        super().__init__(message)
        self.mark = mark


def _where(path: str, mark: Any) -> str:
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path


def _compose(text: str) -> _Node | None:
    """Build the node graph from PyYAML's event stream; aliases point at their anchor's node (a graph)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    anchors: dict[str, _Node] = {}
    stack: list[_Node] = []
    root: _Node | None = None
    documents = 0

    def attach(node: _Node) -> None:
        nonlocal root
        if stack:
            stack[-1].items.append(node)
        else:
            root = node

    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise _Fail("a second YAML document (---): Pulumi reads only the first; remove it", event.start_mark)
        elif isinstance(event, yaml.AliasEvent):
            target = anchors.get(str(event.anchor))
            if target is None:
                raise _Fail(f"unknown anchor '{event.anchor}'", event.start_mark)
            attach(target)
        elif isinstance(event, yaml.ScalarEvent):
            node = _Node("scalar", event.tag, event.start_mark, event.anchor, event.style or None, event.value)
            if event.anchor:
                anchors[event.anchor] = node
            attach(node)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            kind = "seq" if isinstance(event, yaml.SequenceStartEvent) else "map"
            node = _Node(kind, event.tag, event.start_mark, event.anchor)
            if event.anchor:
                anchors[event.anchor] = node
            attach(node)
            stack.append(node)
            if len(stack) > MAX_DEPTH:
                raise _Fail(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            stack.pop()
    return root


# --- scalar resolution (go-yaml v3 resolve.go) -------------------------------------------------------------

_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_NULLS = {"", "~", "null", "Null", "NULL"}
_SPECIAL_FLOATS = {".nan": math.nan, ".NaN": math.nan, ".NAN": math.nan, ".inf": math.inf, ".Inf": math.inf,
                   ".INF": math.inf, "+.inf": math.inf, "+.Inf": math.inf, "+.INF": math.inf,
                   "-.inf": -math.inf, "-.Inf": -math.inf, "-.INF": -math.inf}
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_TIMESTAMP = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})(?:(?:[Tt]|[ ])(\d{1,2}):(\d{1,2}):(\d{1,2})(\.\d+)?"
                        r"(Z|[+-]\d{2}:\d{2})?)?")
_STANDARD = "tag:yaml.org,2002:"
_TAG_TYPES: dict[str, type | tuple[type, ...]] = {
    "!!int": int, "!!float": (int, float), "!!bool": bool, "!!null": type(None), "!!timestamp": str}
_INT64 = (-(2**63), 2**63 - 1)


def _go_int(text: str) -> int | None:
    """Go's `strconv.ParseInt(s, 0, 64)` then `ParseUint`: base prefixes 0x, 0o, 0b and a leading 0 (octal)."""
    if not _GO_INT.fullmatch(text):
        return None
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body[:2].lower() in ("0x", "0o", "0b"):
        value = int(body[2:], {"x": 16, "o": 8, "b": 2}[body[1].lower()])
    elif len(body) > 1 and body.startswith("0"):
        value = int(body, 8)
    else:
        value = int(body)
    value *= sign
    return value if _INT64[0] <= value <= 2**64 - 1 else None


def _timestamp(match: re.Match[str]) -> str | None:
    """What Pulumi stores for a date: Go's `time.Time.String()` of the parsed value."""
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    import datetime as dt

    try:
        dt.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0))
    except ValueError:
        return None
    frac = (fraction or "").rstrip("0").rstrip(".") if fraction else ""
    if zone in (None, "Z"):
        offset, name = "+0000", "UTC"
    else:
        offset = zone.replace(":", "")
        name = offset
    return (f"{int(year):04d}-{int(month):02d}-{int(day):02d} {int(hour or 0):02d}:{int(minute or 0):02d}:"
            f"{int(second or 0):02d}{frac} {offset} {name}")


def resolve_plain(text: str) -> Any:
    """An untagged plain scalar, resolved as yaml.v3 resolves it for an `interface{}` target."""
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _NULLS:
        return None
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    first = text[0]
    if first == ".":
        try:
            number = float(text)
        except ValueError:
            return text
        return number if math.isfinite(number) else text
    if first.isdigit() or first in "+-":
        stamp = _TIMESTAMP.fullmatch(text)
        if stamp:
            resolved = _timestamp(stamp)
            if resolved is not None:
                return resolved
        plain = text.replace("_", "")
        integer = _go_int(plain)
        if integer is not None:
            return integer
        if _YAML_FLOAT.fullmatch(plain):
            number = float(plain)
            return number if math.isfinite(number) else text  # Go's ParseFloat errors on overflow
    return text


def _scalar(node: _Node) -> Any:
    tag = node.tag
    if tag is not None and tag.startswith(_STANDARD):
        tag = "!!" + tag[len(_STANDARD):]
    quoted = node.style in ("'", '"', "|", ">")
    if tag == "!!str" or (quoted and tag in (None, "!")):
        return node.value
    if tag == "!!binary":
        try:
            raw = base64.b64decode("".join(node.value.split()), validate=True)
        except (binascii.Error, ValueError):
            raise _Fail("!!binary value contains invalid base64 data", node.mark) from None
        return raw.decode("utf-8", errors="replace")
    if tag not in (None, "!!int", "!!float", "!!bool", "!!null", "!!timestamp"):
        return node.value  # a tag go-yaml does not resolve (`!custom`, `!!set`, …): the text as it is
    value = resolve_plain(node.value) if node.value or tag else None
    expected = _TAG_TYPES.get(tag or "")
    if expected is not None and (not isinstance(value, expected) or (tag == "!!int" and isinstance(value, bool))):
        raise _Fail(f"cannot decode `{node.value}` as a {tag}", node.mark)
    if tag == "!!float" and isinstance(value, int):
        return float(value)
    return value


# --- construction --------------------------------------------------------------------------------------------


class _Builder:
    """Node graph -> plain values, bounded whatever the aliases, with positions for every path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self.chars = 0
        self.open: set[int] = set()
        self.positions: dict[tuple[str | int, ...], str] = {}

    def build(self, node: _Node, where: tuple[str | int, ...], depth: int = 0) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise _Fail(f"document contains excessive aliasing (more than {MAX_VALUES} values)", node.mark)
        if depth > MAX_DEPTH:
            raise _Fail(f"nested deeper than {MAX_DEPTH} levels", node.mark)
        self.positions.setdefault(where, _where(self.path, node.mark))
        if node.kind == "scalar":
            self.chars += len(node.value)
            if self.chars > MAX_CHARS:
                raise _Fail(f"document expands to more than {MAX_CHARS // 1024 // 1024} MiB of text (aliases of "
                            "long values)", node.mark)
            return _scalar(node)
        if id(node) in self.open:
            raise _Fail(f"anchor '{node.anchor}' value contains itself", node.mark)
        self.open.add(id(node))
        try:
            if node.kind == "seq":
                return [self.build(item, (*where, i), depth + 1) for i, item in enumerate(node.items)]
            return self._mapping(node, where, depth)
        finally:
            self.open.discard(id(node))

    def _mapping(self, node: _Node, where: tuple[str | int, ...], depth: int) -> dict[str, Any]:
        pairs = list(zip(node.items[0::2], node.items[1::2], strict=True))
        seen: dict[str, _Node] = {}
        for key, _ in pairs:
            if key.kind != "scalar":
                raise _Fail("a mapping or list used as a key", key.mark)
            if key.value in seen and seen[key.value] is not key:
                raise _Fail(f'mapping key "{key.value}" already defined at line {seen[key.value].mark.line + 1}',
                            key.mark)
            seen[key.value] = key
        result: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key, value in pairs:
            if key.value == "<<" and key.style is None and key.tag is None:
                sources = value.items if value.kind == "seq" else [value]
                for source in sources:
                    built = self.build(source, where, depth + 1)
                    if not isinstance(built, dict):
                        raise _Fail("a merge key (<<) needs a mapping or a list of mappings", source.mark)
                    for k, v in built.items():
                        merged.setdefault(k, v)
                continue
            name = _scalar(key)
            if not isinstance(name, str):
                raise _Fail(f"key {key.value!r} is not a string (Pulumi expects only string keys): quote it",
                            key.mark)
            result[name] = self.build(value, (*where, name), depth + 1)
        return {**{k: v for k, v in merged.items() if k not in result}, **result}


def _secure(value: Any) -> Any:
    """What the program receives for a value: `{secure: <ciphertext>}` -> SECRET, anywhere (Pulumi's
    `isSecureValue`: one key, a string), and numbers as they come back from Pulumi's JSON (Go's encoding/json
    writes a whole float64 below 1e21 without a fraction, so `8.0` arrives as 8)."""
    if isinstance(value, dict):
        if set(value) == {"secure"} and isinstance(value["secure"], str):
            if not value["secure"].strip():
                raise _Fail("a `secure:` value with no ciphertext: set it with pulumi config set --secret")
            return SECRET
        return {k: _secure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_secure(v) for v in value]
    return _json_number(value)


def _json_number(value: Any) -> Any:
    """A whole float64 below 1e21 comes back from Go's JSON as an integer."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _json_number(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_number(v) for v in value]
    return value


def decode_top_level(value: Any) -> Any:
    """What `pulumi.Config.get` + JSON decoding yields for a top-level value: Pulumi stores a top-level string
    as it is and the program reads every value as text, so `"true"` and `true` both arrive as True, and a
    string that is not JSON stays a string (`config/object.go` `MarshalString`)."""
    if isinstance(value, str):
        try:
            return json.loads(value, parse_constant=_no_constant)
        except ValueError:
            return value
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's json would take NaN/Infinity; Go's does not


def near_miss(name: str, wanted: str = PROJECT) -> bool:
    """`vllm_cluster`, `VLLM-Cluster`, `vllm-clsuter`: a typo of the namespace, not another provider's."""
    folded = re.sub(r"[-_. ]", "", name.lower())
    return name != wanted and (folded == re.sub(r"[-_]", "", wanted)
                               or difflib.SequenceMatcher(None, name.lower(), wanted).ratio() >= 0.8)


STACK_FILE_KEYS = ("config", "environment", "secretsprovider", "encryptedkey", "encryptionsalt")
"""The keys of Pulumi's ProjectStack (sdk/go/common/workspace/project.go): anything else at the top of a stack
file is ignored by Pulumi."""


def parse_stack_text(text: str, path: str, project: str = PROJECT) -> StackDocument:
    """The project's config from a stack file's text; every problem is a ConfigError with file:line:column."""

    def fail(message: str, where: str = path, key: str = "<stack file>", value: Any = None,
             fix: str | None = None) -> ConfigError:
        return ConfigError(Path(path).stem.removeprefix("Pulumi."),
                           [Problem(key, value, message, fix=fix, where=where)])

    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise fail(f"the file is larger than {MAX_BYTES // 1024 // 1024} MiB", fix="a stack file of config values")
    text = text.removeprefix("\ufeff")  # Pulumi strips a UTF-8 byte-order mark (`readFileStripUTF8BOM`)
    builder = _Builder(path)
    try:
        root = _compose(text)
        document = builder.build(root, ()) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part) or "invalid YAML"
        raise fail(f"invalid YAML: {problem}", _where(path, mark), fix="fix the YAML syntax at that line") from None
    except yaml.YAMLError as exc:
        raise fail(f"invalid YAML: {exc}", fix="fix the YAML syntax") from None
    except _Fail as exc:
        raise fail(str(exc), _where(path, exc.mark), fix="fix the YAML at that line") from None
    if document is None:
        raise fail("the stack file is empty", fix="a `config:` mapping with the vllm-cluster:* keys")
    if not isinstance(document, dict):
        raise fail(f"the stack file is {_a(document)}, not a mapping",
                   _where(path, root.mark if root else None), fix="a mapping with a `config:` key")
    warnings: list[str] = []
    for key in document:
        namespace = split_config_key(key, project)[0] if ":" in key else None
        if namespace is not None and (namespace == project or near_miss(namespace, project)):
            raise fail(f"{key!r} is outside `config:` (at the top of the file): Pulumi ignores it there",
                       builder.positions.get((key,), path), key=key, fix=f"indent it under config:  {key}: …")
        if key != "config" and near_miss(key, "config"):
            raise fail(f"top-level key {key!r} looks like a misspelt `config` (Pulumi ignores it)",
                       builder.positions.get((key,), path), key=key, fix="config:")
        if key not in STACK_FILE_KEYS:
            raise fail(f"top-level key {str(key)[:60]!r} is not a Pulumi stack file key "
                       f"({', '.join(STACK_FILE_KEYS)}): Pulumi ignores it, so whatever it says would silently not "
                       "apply",
                       builder.positions.get((key,), path), key=str(key),
                       fix=f"under config:, as {project}:{key}" if isinstance(key, str) else "remove it")
    if "environment" in document:
        warnings.append("the stack imports Pulumi ESC environments: values set there are not visible to "
                        "`plan` (the Pulumi program validates them at preview)")
    config = document.get("config")
    if config is None:
        raise fail("the stack file has no `config:` mapping", fix="config: {vllm-cluster:image: …, …}")
    if not isinstance(config, dict):
        raise fail(f"`config` is {_a(config)}, not a mapping",
                   builder.positions.get(("config",), path), key="config", fix="config: {vllm-cluster:image: …}")
    values: dict[str, Any] = {}
    positions: dict[tuple[str | int, ...], str] = {}
    origin: dict[str, str] = {}
    for key, value in config.items():
        where = builder.positions.get(("config", key), path)
        try:
            checked = _secure(value)
        except _Fail as exc:
            raise fail(str(exc), where, key=key, fix="pulumi config set --secret …") from None
        namespace, name = split_config_key(key, project)
        if namespace is None:
            raise fail(f"{key!r} is not a Pulumi config key (`namespace:name`)", where, key=key,
                       fix=f"{project}:<name>")
        if namespace != project:
            if near_miss(namespace, project):
                raise fail(f"namespace {namespace!r} is not {project!r}: Pulumi would pass this key to no one and "
                           "the setting would silently disappear", where, key=key, fix=f"{project}:{name}")
            continue
        if name in origin:
            raise fail(f"{project}:{name} is set twice (as {origin[name]!r} and {key!r}); Pulumi would keep one "
                       "of them at random", where, key=name, fix="keep one")
        origin[name] = key
        values[name] = decode_top_level(checked)
        for sub, at in builder.positions.items():
            if sub[:2] == ("config", key):
                positions[(name, *sub[2:])] = at
    return StackDocument(values, positions, warnings)


def _a(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), "a value")


def split_config_key(key: str, project: str = PROJECT) -> tuple[str | None, str]:
    """Pulumi's `config.ParseKey`: `ns:name` or `ns:config:name`; a bare key is the project's own."""
    parts = key.split(":")
    if len(parts) == 1:
        return project, key
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    if len(parts) == 3 and parts[1] == "config" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None, key


_TYPED_INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)")
"""A plain decimal whole number on the command line: it stays an int whatever its size, so a refusal shows it."""


def parse_value_text(text: str) -> Any:
    """One `--set` value, resolved like a value in the stack file (`{secure: …}` stays a plain mapping: a
    secret cannot be typed on the command line; `--assume-secret` plans as if one were set)."""
    if not text.strip():
        return ""
    if _TYPED_INT.fullmatch(text.strip()):  # beyond 64 bits Go reads a float; echo the whole number as typed
        return int(text.strip().replace("_", ""))
    try:
        root = _compose(text)
        return _json_number(_Builder("--set").build(root, ())) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part) or "invalid YAML"
        raise ValueError(f"not a YAML value: {problem}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"not a YAML value: {exc}") from None
    except _Fail as exc:
        raise ValueError(str(exc)) from None
