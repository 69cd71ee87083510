"""The docs' config reference (docs/config-reference.md) is the generated one: it cannot drift from what the loader
accepts."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from review.reference import markdown
from stacks.model.config import StackConfig

PAGE = Path(__file__).resolve().parent.parent / "docs" / "config-reference.md"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def embedded() -> str:
    text = PAGE.read_text()
    return text[text.index(START) + len(START):text.index(END)]


def test_the_docs_hold_the_generated_reference() -> None:
    assert embedded() == markdown(), "regenerate: venv/bin/python -m tests.test_readme_reference"


def _numbers(annotation: Any, metadata: list[Any], where: str) -> list[tuple[str, bool]]:
    """(field, bounded) for every int/float inside an annotation, lists and optionals included."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        flat = [m for e in extra for m in (getattr(e, "metadata", None) or [e])]
        return _numbers(base, [*metadata, *flat], where)
    if origin in (typing.Union, types.UnionType, list, dict):
        return [x for a in typing.get_args(annotation) for x in _numbers(a, metadata if origin is not dict else [],
                                                                          where)]
    if annotation in (int, float):
        low = any(getattr(m, a, None) is not None for m in metadata for a in ("ge", "gt"))
        high = any(getattr(m, a, None) is not None for m in metadata for a in ("le", "lt"))
        return [(where, low and high)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [x for name, f in annotation.model_fields.items()
                for x in _numbers(f.annotation, list(f.metadata), f"{where}.{name}")]
    return []


def test_every_numeric_field_has_a_range() -> None:
    found = _numbers(StackConfig, [], "config")
    assert len(found) > 30
    assert all(bounded for _, bounded in found), [w for w, b in found if not b]


if __name__ == "__main__":  # rewrite the docs page's table from the model
    text = PAGE.read_text()
    PAGE.write_text(text[:text.index(START) + len(START)] + markdown() + text[text.index(END):])
