"""The config reference, generated from the model itself: every key with its type, range, default and meaning.

`python -m stacks reference` prints it; docs/config-reference.md embeds the same text and a test keeps the two equal, so
the reference can never drift from what the loader accepts.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from stacks.model.config import StackConfig
from stacks.model.field_types import Kind, Secret


def _args(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation)


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in _args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return inner[0], True
    return annotation, False


def _kind(annotation: Any, metadata: list[Any]) -> str:
    for item in metadata:
        if isinstance(item, Kind):
            return item.name
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = _args(annotation)
        return _kind(base, list(extra))
    origin = typing.get_origin(annotation)
    if origin is list:
        return f"list of {_kind(_args(annotation)[0], [])}"
    if origin is dict:
        key, value = _args(annotation)
        return f"map {_kind(key, [])} → {_kind(value, [])}"
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in _args(annotation))
    if annotation is Secret:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {bool: "bool", int: "int", float: "number", str: "string"}
    if annotation in names:
        return names[annotation]
    return "JSON value" if "JsonValue" in str(annotation) else str(annotation).replace("typing.", "")


def _range(info: FieldInfo, annotation: Any) -> str:
    low = high = None
    lengths = []
    unit = "items" if typing.get_origin(annotation) in (list, dict) else "chars"
    for item in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">")):
            if getattr(item, attr, None) is not None:
                low = f"{sign} {getattr(item, attr):,}".replace(",", "_")
        for attr, sign in (("le", "≤"), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                high = f"{sign} {getattr(item, attr):,}".replace(",", "_")
        if getattr(item, "max_length", None) is not None:
            lengths.append(f"≤ {item.max_length} {unit}")
        if getattr(item, "min_length", None) not in (None, 0):
            lengths.append(f"≥ {item.min_length} {unit}")
    parts = [p for p in (low, high) if p] + lengths
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(see below)"
        return f"`{value}`" if value not in ({}, []) else "empty"
    default = info.default
    if default is None or default is PydanticUndefined:
        return "–"
    return f"`{default}`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    annotation, _ = _strip_optional(annotation)
    while typing.get_origin(annotation) in (list, dict, typing.Annotated):
        annotation = _args(annotation)[-1] if typing.get_origin(annotation) is not typing.Annotated else _args(
            annotation)[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").split())
    return text.split(". ")[0].rstrip(".") + "." if text else ""


def rows(model: type[BaseModel] = StackConfig, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(key, type, range, default, meaning) for every field, depth first."""
    out: list[tuple[str, str, str, str, str]] = []
    for name, info in model.model_fields.items():
        annotation, optional = _strip_optional(info.annotation)
        key = f"{prefix}{name}"
        inner = _model_of(info.annotation)
        is_list = typing.get_origin(annotation) is list
        kind = _kind(annotation, list(info.metadata))
        if inner is not None:
            kind = "list of mappings" if is_list else ("mapping or `repo:tag[@digest]`" if name in ("image",)
                                                      else "mapping")
        meaning = info.description or (_first_sentence(inner.__doc__) if inner is not None else "")
        out.append((f"`{key}`", kind + (" or null" if optional and inner is None else ""),
                    _range(info, annotation), _default(info), meaning))
        if inner is not None:
            out += rows(inner, f"{key}[]." if is_list else f"{key}.")
    return out


def markdown() -> str:
    lines = ["| key | type | range | default | meaning |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {t} | {r} | {d} | {m.replace('|', '/')} |" for k, t, r, d, m in rows()]
    return "\n".join(lines) + "\n"
