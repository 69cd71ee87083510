"""The README's config reference is the generated one: it cannot drift from what the loader accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from review.reference import markdown
from stacks.model.config import StackConfig
from tests.conftest import ROOT

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def embedded() -> str:
    text = README.read_text()
    return text[text.index(START) + len(START):text.index(END)]


def test_readme_holds_the_generated_reference() -> None:
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


if __name__ == "__main__":  # rewrite the README's table from the model
    text = README.read_text()
    README.write_text(text[:text.index(START) + len(START)] + markdown() + text[text.index(END):])


def test_the_readme_quick_start_stack_plans(tmp_path: Path) -> None:
    """The example stack of README "Quick start" is a real, valid stack file (3 nodes, mp, proxy, S3 source)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- example-stack:start -->\n```yaml\n", 1)[1].split("```\n<!-- example-stack:end -->", 1)[0]
    (tmp_path / "Pulumi.example.yaml").write_text(block)
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "example", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "VLLM_CLUSTER_ROOT": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert [n["role"] for n in plan["nodes"]] == ["dp-head", "headless-engine", "headless-engine"]
    assert plan["topology"]["data"] == 3 and plan["proxy"] is not None
