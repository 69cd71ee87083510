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
    """A value vLLM would refuse; the message names the rule (and the fix, when there is one)."""

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
        raise BadValue(f"{value!r} is not {'an int' if name == 'int' else 'a number'} (argparse type {name})",
                       "an integer, e.g. 8" if name == "int" else "a number, e.g. 0.9") from None
    if short in ("human_readable_int", "human_readable_int_or_auto"):
        if short.endswith("_auto") and (value.strip() == "-1" or value.strip().lower() == "auto"):
            return -1
        try:
            return human_readable_int(value)
        except ValueError as exc:
            if isinstance(exc, BadValue):
                raise
            raise BadValue(f"{value!r} is not an integer ({short}: digits with an optional k/m/g/t or K/M/G/T)",
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
        check_field_value(item, field, f"{cls}.{key}", path)
        nested = field.get("dataclasses") or []
        if isinstance(item, dict) and len(nested) == 1:
            check_fields(item, nested[0], card, path)


def check_field_value(value: Any, field: dict[str, Any], name: str, shown: str) -> None:
    """One field's pure-Literal choices and numeric bounds."""
    choices = field.get("choices")
    if choices and isinstance(value, str) and pure_literal(str(field.get("type", ""))) and value not in choices:
        raise BadValue(f"{shown}={value!r}: {name} takes one of {', '.join(map(str, choices))}",
                       f"one of {', '.join(map(str, choices[:12]))}")
    bounds = field.get("bounds")
    if bounds:
        check_bounds(value, bounds, name, shown)


_OPS: dict[str, tuple[str, Callable[[float, float], bool]]] = {
    "gt": (">", operator.gt), "ge": (">=", operator.ge), "lt": ("<", operator.lt), "le": ("<=", operator.le)}


def check_bounds(value: Any, bounds: dict[str, Any], name: str, shown: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    broken = [f"{sign} {bounds[op]}" for op, (sign, ok) in _OPS.items()
              if op in bounds and bounds[op] is not None and not ok(value, bounds[op])]
    if broken:
        rule = " and ".join(f"{sign} {bounds[op]}" for op, (sign, _) in _OPS.items() if bounds.get(op) is not None)
        raise BadValue(f"{shown + '=' + str(value) + ': ' if shown else ''}{name} must be {rule}", f"a value {rule}")


def option_value_problem(item: ArgvItem, table: OptionTable) -> tuple[str, str] | None:
    """(problem, fix) for the first value of `item` the card's vLLM would refuse, or None."""
    if item.option is None or item.option not in table.options or not item.values:
        return None
    option = table.options[item.option]
    card = table.card
    if card is None or not option.takes_value:
        return None
    name = normalise(item.word).partition("=")[0]
    try:
        if name.startswith("--") and "." in name:  # --compilation-config.mode 3: one field of the JSON
            _dotted(option, name, card)
            return None
        for value in item.values:
            parsed = convert(value, option.value_type, card)
            if option.json_class and isinstance(parsed, dict) and option.value_type and \
                    not option.value_type.get("dataclass"):
                check_fields(parsed, option.json_class, card)
            if option.field_choices and isinstance(parsed, str) and parsed not in option.field_choices:
                raise BadValue(f"{option.field_name} takes one of {', '.join(option.field_choices)} (checked when "
                               "vLLM builds its config)", f"one of {', '.join(option.field_choices[:12])}")
            if option.bounds:
                check_bounds(parsed, option.bounds, option.field_name or option.dest, "")
    except BadValue as exc:
        shown = name if name.startswith("--") and "." in name else item.option
        return f"{shown} {_short(item.values)}: {exc} (vLLM {card.vllm_version}, {card.path})", exc.fix
    return None


def _dotted(option: Option, name: str, card: ImageCard) -> None:
    key = name.split(".", 2)[1]
    cls = option.json_class
    if cls is None or card.config_class(cls) is None or key.endswith("+"):
        return
    allowed = user_fields(card, cls)
    if key not in allowed:
        near = difflib.get_close_matches(key, sorted(allowed), n=1)
        raise BadValue(f"{cls} of vLLM {card.vllm_version} has no field {key!r} (it forbids extra fields)",
                       f"did you mean {near[0]!r}?" if near else f"one of {', '.join(sorted(allowed)[:12])}")


def _short(values: list[str]) -> str:
    text = " ".join(values)
    return repr(text if len(text) <= 60 else text[:57] + "…")
