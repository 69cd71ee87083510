"""The layers (docs/architecture.md): imports run one way, review -> components -> planner -> model.

An AST walk of every production module (top-level and function-level imports alike), so a lazy import cannot hide
an arrow that points up. The few links between the core and the host checks are listed by name, with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PROJECT = ("stacks", "review", "components", "checks", "policy", "bench")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "stacks.model": ("stacks.model",),
    "stacks.planner": ("stacks.model", "stacks.planner"),
    "components": ("stacks.model", "stacks.planner", "components", "checks"),
    "review": ("stacks.model", "stacks.planner", "components", "review", "checks"),
    "checks": ("checks",),
    "policy": ("stacks.model", "stacks.planner", "policy"),
    "bench": ("stacks.model", "stacks.planner", "components", "checks", "review", "policy", "bench", "tests"),
}
"""Which packages a module of each layer may import (its own included)."""
LINKS = {
    ("checks.api", "stacks.model.golden"): "the golden set's type and matcher, pasted into the on-node API check",
    ("checks.collective", "stacks.model.busbw"): "the bus-bandwidth floor's range, shared with fabric.min_busbw_gbps",
    ("checks.preflight", "stacks.planner.memory"): "the memory model, pasted into the node preflight",
    ("checks.weights", "stacks.model.s3_source"): "the S3 source rule the stack file is validated by, pasted into the "
                                                   "weight sync's node script",
    ("checks.weights_verify", "stacks.model.s3_source"): "the same rule's path check, for every listed and indexed key",
    ("checks.weights_node", "stacks.model.s3_source"): "the same rule, so a bad source fails at preview",
    ("checks.local_s3", "stacks.model.s3_source"): "the same rule, so the sync command it prints runs",
    ("stacks.__main__", "review.cli"): "`python -m stacks` is the users' entry point to the review tools",
}
"""Arrows outside MAY_IMPORT, each one a deliberate link (the pasted modules are stdlib and pydantic only)."""


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    for layer in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module.split(".")[0]


def project_imports() -> list[tuple[str, str]]:
    """(importer, imported) for every import of a project module in production code."""
    found = []
    for top in PROJECT:
        for path in sorted((ROOT / top).rglob("*.py")):
            importer = _module(path)
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    if name.split(".")[0] in (*PROJECT, "tests") and _is_module(name):
                        found.append((importer, name))
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_import_points_down_or_is_a_named_link() -> None:
    wrong = []
    for importer, imported in project_imports():
        if _layer(imported) not in MAY_IMPORT.get(_layer(importer), ()) and (importer, imported) not in LINKS:
            wrong.append(f"{importer} -> {imported}")
    assert not wrong, "imports against the layers (docs/architecture.md):\n" + "\n".join(sorted(set(wrong)))


def test_every_named_link_still_exists() -> None:
    """A link that is gone is removed from LINKS, so the list never grows stale."""
    present = set(project_imports())
    assert {link for link in LINKS if link not in present} == set()


def test_the_layers_are_folders() -> None:
    """Where each concern lives, by folder name alone."""
    for folder in ("stacks/model", "stacks/planner", "components", "checks", "review", "policy"):
        assert (ROOT / folder / "__init__.py").is_file(), folder
    assert not [p.name for p in (ROOT / "stacks").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
