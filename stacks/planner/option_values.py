"""Option values checked offline against an image card: type, choices, JSON and its fields, numeric bounds.

argparse converts each value with the option's `type=` callable and vLLM's config classes validate the rest when
the engine config is built (pydantic: `Literal` choices, `Field(gt=…, le=…)` bounds, `extra="forbid"`). The card
names each callable (`int`, `float`, `human_readable_int`, `optional_type(…)`, `json.loads`, `parse_dataclass`
for a config class) and holds each config field's type, choices and bounds, so a plan can refuse `--seed abc`,
`--compilation-config '{bad'`, `--eplb-config '{"window_sise": 8}'` or `--gpu-memory-utilization 1.5` before any
node is touched. A callable the card cannot describe (a lambda) is left to the in-image dry run.
"""

from __future__ import annotations

import difflib
import json
import operator
import re
from collections.abc import Callable
from typing import Any

from stacks.planner.image_cards import ImageCard
from stacks.planner.serve_options import ArgvItem, Option, OptionTable, normalise, pure_literal, user_fields

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


class BadValue(ValueError):
    """A value vLLM would refuse; the message names the rule and where (a JSON field's path), never the value
    itself: the refusal shows the value once, next to its key."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def human_readable_int(value: str) -> int:
    """vllm/utils/argparse_utils.py `human_readable_int` (0.33.0 lines 30-74): `1k` = 1000, `1K` = 1024, `25.6k`;
    no decimals with a binary suffix."""
    value = value.strip()
    match = _HUMAN.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        if "." in number:
            raise BadValue(f"decimals are not allowed with binary suffixes like {suffix}",
                           f"{number}{suffix.lower()} (decimal) or a whole number")
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(value)


def _expand_human(text: str) -> str:
    """`_expand_json_human_readable_numbers` (engine/arg_utils.py:302-321): `80m` outside JSON strings."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b", lambda m: str(human_readable_int(m.group())), parts[i])
    return "".join(parts)


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadValue(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); vLLM parses it as {what}",
                       "valid JSON in one argv word, e.g. '{\"key\": 1}' (double quotes around keys)") from None


def convert(value: str, kind: dict[str, Any] | None, card: ImageCard | None) -> Any:
    """The value as the card's `type=` callable would return it; BadValue where vLLM's parser refuses it. An
    unknown callable returns the text unchecked."""
    if kind is None:
        return value
    name = str(kind.get("name", ""))
    short = name.rsplit(".", 1)[-1]
    if kind.get("optional") or short == "_optional_type":
        if value in ("", "None"):
            return None
        return convert(value, kind.get("wraps"), card)
    if short == "_parse_type":
        return convert(value, kind.get("wraps"), card)
    try:
        if kind.get("kind") == "builtin" and name == "int":
            return int(value)
        if kind.get("kind") == "builtin" and name == "float":
            return float(value)
    except ValueError:
        raise BadValue(f"not {'an int' if name == 'int' else 'a number'} (argparse type {name})",
                       "an integer, e.g. 8" if name == "int" else "a number, e.g. 0.9") from None
    if short in ("human_readable_int", "human_readable_int_or_auto"):
        if short.endswith("_auto") and (value.strip() == "-1" or value.strip().lower() == "auto"):
            return -1
        try:
            return human_readable_int(value)
        except ValueError as exc:
            if isinstance(exc, BadValue):
                raise
            raise BadValue(f"not an integer ({short}: digits with an optional k/m/g/t or K/M/G/T)",
                           "e.g. 32768, 32k or 32K" + (" or auto" if short.endswith("_auto") else "")) from None
    if kind.get("kind") == "json" or short == "loads":
        return _json(value, "a JSON object")
    if short == "union_dict_and_str":
        return _json(value, "a JSON object") if re.match(r"(?s)^\s*{.*}\s*$", value) else value
    if kind.get("kind") == "json->dataclass" or kind.get("dataclass"):
        cls = str(kind.get("dataclass"))
        parsed = _json(_expand_human(value), cls)
        check_fields(parsed, cls, card)
        return parsed
    return value


def check_fields(data: Any, cls: str, card: ImageCard | None, where: str = "") -> None:
    """A JSON object against a config class of the card: known fields only (vLLM's configs forbid extra ones),
    each field's choices and bounds; nested config classes too."""
    spec = card.config_class(cls) if card is not None else None
    if spec is None or card is None:
        return
    if not isinstance(data, dict):
        raise BadValue(f"{where or 'the value'} must be a JSON object for {cls}, not {type(data).__name__}",
                       "{\"field\": value, …}")
    allowed = user_fields(card, cls)
    for key, item in data.items():
        path = f"{where}.{key}" if where else key
        if key not in allowed:
            near = difflib.get_close_matches(key, sorted(allowed), n=1)
            raise BadValue(f"{cls} of vLLM {card.vllm_version} has no field {path!r} (it forbids extra fields)",
                           f"did you mean {near[0]!r}?" if near else f"one of {', '.join(sorted(allowed)[:12])}")
        field = spec["fields"][key]
        shape = field.get("shape")
        if isinstance(shape, dict):
            wanted = shape_problem(item, shape)
            if wanted is not None:
                raise BadValue(f"{path}: {cls}.{key} takes {wanted}", wanted)
        check_field_value(item, field, f"{cls}.{key}", path)
        nested = field.get("dataclasses") or []
        if isinstance(item, dict) and len(nested) == 1:
            check_fields(item, nested[0], card, path)


def check_field_value(value: Any, field: dict[str, Any], name: str, shown: str) -> None:
    """One field's pure-Literal choices and numeric bounds."""
    choices = field.get("choices")
    if choices and isinstance(value, str) and pure_literal(str(field.get("type", ""))) and value not in choices:
        raise BadValue(f"{shown}: {name} takes one of {', '.join(map(str, choices))}",
                       f"one of {', '.join(map(str, choices[:12]))}")
    bounds = field.get("bounds")
    if bounds:
        check_bounds(value, bounds, name, shown)


_TRUE_FALSE = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}
"""The strings pydantic's lax mode reads as a bool (case-insensitive)."""


def _is_int_text(text: str) -> bool:
    return re.fullmatch(r"\s*[+-]?\d+\s*", text) is not None


def _enum_problem(value: Any, shape: dict[str, Any]) -> bool:
    """True when the enum field refuses `value`: the card's `accepts` says which spellings the field's own
    validators took when the card was taken (the value, the value as text, the name, the name in lower case)."""
    accepts = shape.get("accepts") or {}
    if not accepts:
        return False  # the probe could not tell: left to the in-image dry run
    members = shape.get("members") or []
    values = [m["value"] for m in members if isinstance(m.get("value"), int | str)]
    names = [str(m["name"]) for m in members]
    if isinstance(value, bool | int | float) and not isinstance(value, str):
        return not (accepts.get("value") and _whole(value) and int(value) in values)
    if isinstance(value, str):
        if accepts.get("value") and value in values:
            return False
        if accepts.get("value_string") and _is_int_text(value) and int(value) in values:
            return False
        if accepts.get("name") and value in names:
            return False
        return not (accepts.get("name_lower") and value.upper() in names)
    return True


def _describe(shape: dict[str, Any]) -> str:
    kind = shape.get("kind")
    if kind == "union":
        return " or ".join(dict.fromkeys(_describe(o) for o in shape.get("options") or []))
    if kind == "list":
        return f"a JSON list, each item {_describe(shape.get('items') or {})}"
    if kind == "enum":
        accepts = shape.get("accepts") or {}
        members = shape.get("members") or []
        forms = [json.dumps(m["value"]) for m in members
                 if accepts.get("value") and isinstance(m.get("value"), int | str)]
        forms += [str(m["name"]) for m in members if accepts.get("name") or accepts.get("name_lower")]
        case = " (names in any case)" if accepts.get("name_lower") else ""
        return f"one of {', '.join(forms)}{case}"
    if kind == "literal":
        return f"one of {', '.join(json.dumps(v) for v in shape.get('values') or [])}"
    return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
            "none": "null", "dict": "a JSON object", "dataclass": "a JSON object"}.get(str(kind), "any value")


def shape_problem(value: Any, shape: dict[str, Any]) -> str | None:
    """None when vLLM's config (pydantic, lax mode) accepts `value` for a field of this shape (the card's
    structured type); otherwise what the field takes. A shape the card could not describe accepts anything."""
    kind = shape.get("kind")
    ok: bool
    if kind == "union":
        ok = any(shape_problem(value, o) is None for o in shape.get("options") or [])
    elif kind == "none":
        ok = value is None
    elif kind == "int":
        ok = (isinstance(value, int | float) and _whole(value)) or (isinstance(value, str) and _is_int_text(value))
    elif kind == "float":  # pydantic refuses an integer beyond a float's range ("Input should be a valid number")
        ok = (isinstance(value, int | float) and fits_float(value)) or (
            isinstance(value, str) and _is_float_text(value))
    elif kind == "str":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool) or value in (0, 1) or (
            isinstance(value, str) and value.strip().lower() in _TRUE_FALSE)
    elif kind == "list":
        items = shape.get("items") or {}
        ok = isinstance(value, list) and all(shape_problem(v, items) is None for v in value)
    elif kind in ("dict", "dataclass"):
        ok = isinstance(value, dict)
    elif kind == "enum":
        ok = not _enum_problem(value, shape)
    elif kind == "literal":
        ok = value in (shape.get("values") or [])
    else:
        ok = True
    return None if ok else _describe(shape)


def fits_float(value: Any) -> bool:
    """Whether a JSON number converts to a float: a 400-digit integer does not (OverflowError), and pydantic's
    float check refuses it; anything that is no number is not this function's to judge (True)."""
    try:
        float(value)
    except OverflowError:
        return False
    except (TypeError, ValueError):
        return True
    return True


def _whole(value: float) -> bool:
    """A whole number, however large (float() of a 400-digit integer would overflow)."""
    return isinstance(value, int) or value.is_integer()


def _is_float_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_OPS: dict[str, tuple[str, Callable[[float, float], bool]]] = {
    "gt": (">", operator.gt), "ge": (">=", operator.ge), "lt": ("<", operator.lt), "le": ("<=", operator.le)}


def check_bounds(value: Any, bounds: dict[str, Any], name: str, shown: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    broken = [f"{sign} {bounds[op]}" for op, (sign, ok) in _OPS.items()
              if op in bounds and bounds[op] is not None and not ok(value, bounds[op])]
    if broken:
        rule = " and ".join(f"{sign} {bounds[op]}" for op, (sign, _) in _OPS.items() if bounds.get(op) is not None)
        raise BadValue(f"{shown + ': ' if shown else ''}{name} must be {rule}", f"a value {rule}")


def option_value_problem(item: ArgvItem, table: OptionTable) -> tuple[str, str] | None:
    """(problem, fix) for the first value of `item` the card's vLLM would refuse, or None. The problem shows the
    value once: the option's words, or the JSON field's `key=value` when the rule is about one field."""
    if item.option is None or item.option not in table.options or not item.values:
        return None
    option = table.options[item.option]
    card = table.card
    if card is None or not option.takes_value:
        return None
    name = normalise(item.word).partition("=")[0]
    dotted = "." in name and name.split(".", 1)[0] in table.options
    try:
        if dotted:  # --compilation-config.mode 3: one field of the JSON
            _dotted(option, name, item.values[0], card)
            return None
        for value in item.values:
            parsed = convert(value, option.value_type, card)
            if option.json_class and isinstance(parsed, dict) and option.value_type and \
                    not option.value_type.get("dataclass"):
                check_fields(parsed, option.json_class, card)
            if option.field_choices and isinstance(parsed, str) and parsed not in option.field_choices:
                raise BadValue(f"{option.field_name} takes one of {', '.join(option.field_choices)} (checked when "
                               "vLLM builds its config)", f"one of {', '.join(option.field_choices[:12])}")
            if option.field_shape and isinstance(parsed, str):
                wanted = shape_problem(parsed, option.field_shape)
                if wanted is not None:
                    raise BadValue(f"{option.field_name} takes {wanted} (checked when vLLM builds its config)",
                                   wanted)
            if option.bounds:
                check_bounds(parsed, option.bounds, option.field_name or option.dest, "")
    except BadValue as exc:  # the caller shows the argv words: the value is not repeated here
        shown = name if dotted else item.option
        if item.option == "--optimization-level" and not item.word.startswith("--"):
            shown = "-O (--optimization-level)"
        return f"{shown}: {exc} (vLLM {card.vllm_version}, {card.path})", exc.fix
    return None


def _dotted(option: Option, name: str, text: str, card: ImageCard) -> None:
    """`--compilation-config.pass_config.fuse_norm_quant true` as FlexibleArgumentParser reads it
    (utils/argparse_utils.py:462-490, 0.33.0): the value is JSON, else a human-readable int, else the text;
    `key+` makes a list of the comma-separated texts. Then the object is checked as the JSON option would be."""
    keys = name.split(".")[1:]
    cls = option.json_class
    if cls is None or card.config_class(cls) is None or not keys:
        return
    if keys[-1].endswith("+"):
        keys[-1] = keys[-1][:-1]
        value: Any = text.split(",")
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = human_readable_int(text)
            except ValueError:
                value = text
    for key in reversed(keys):
        value = {key: value}
    check_fields(value, cls, card)
