"""The layers (docs/architecture.md): imports run one way, review -> heal -> components -> planner -> model.

An AST walk of every production module (top-level, function-level and `TYPE_CHECKING` imports alike, relative ones
resolved to the module they name), so a lazy or relative import cannot hide an arrow that points up or a cycle.
The few links between the core and the host checks are listed by name, with the reason. Which third-party
packages the core may use is listed too, and nothing the core, the checks or the pure command builders reach may
import Pulumi.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from checks.bundle import INLINED
from checks.weights_node import MODULES as WEIGHTS_SCRIPT_MODULES
from tests.conftest import ROOT

PROJECT = ("stacks", "review", "heal", "components", "checks", "policy", "bench", "vllm_cluster")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "stacks.model": ("stacks.model",),
    "stacks.planner": ("stacks.model", "stacks.planner"),
    "components": ("stacks.model", "stacks.planner", "components", "checks"),
    "review": ("stacks.model", "stacks.planner", "components", "heal", "review", "checks"),
    "heal": ("stacks.model", "stacks.planner", "components", "heal", "checks"),
    "checks": ("checks",),
    "policy": ("stacks.model", "stacks.planner", "policy"),
    "bench": ("stacks.model", "stacks.planner", "components", "checks", "heal", "review", "policy", "bench",
              "tests"),
    "vllm_cluster": ("stacks.model", "stacks.planner", "components", "checks", "heal", "review", "vllm_cluster"),
}
"""Which packages a module of each layer may import (its own included)."""
LINKS = {
    ("checks.api", "stacks.model.golden"): "the golden set's type and matcher, pasted into the on-node API check",
    ("checks.pd", "stacks.model.golden"): "the same golden type and matcher, for the prompt through the P/D router",
    ("checks.collective", "stacks.model.busbw"): "the bus-bandwidth floor's range, shared with fabric.min_busbw_gbps",
    ("checks.preflight", "stacks.planner.memory"): "the memory model, pasted into the node preflight",
    ("checks.weights", "stacks.model.s3_source"): "the S3 source rule the stack file is validated by, pasted into the "
                                                   "weight sync's node script",
    ("checks.weights_verify", "stacks.model.s3_source"): "the same rule's path check, for every listed and indexed key",
    ("checks.weights_node", "stacks.model.s3_source"): "the same rule, so a bad source fails at preview",
    ("checks.weights_versions", "stacks.model.s3_source"): "the same rule's listing entries, to link unchanged files "
                                                          "from an earlier version",
    ("checks.local_s3", "stacks.model.s3_source"): "the same rule, so the sync command it prints runs",
    ("checks.verdict", "stacks.model.masking"): "the one masking rule of every program, pasted with the verdict",
    ("stacks.__main__", "review.cli"): "`python -m stacks` is the users' entry point to the review tools",
}
"""Arrows outside MAY_IMPORT, each one a deliberate link (the pasted modules are stdlib and pydantic only)."""
CORE = ("stacks.model", "stacks.planner")
CORE_THIRD_PARTY = {
    "pydantic": "the typed config and the plan's models",
    "pydantic_core": "pydantic's own error type, for one-line messages (field_types, golden)",
    "yaml": "stack files (stack_file) and the monitoring files (observability)",
}
"""The only packages outside the standard library that the model and the planner may import, each with its use:
anything else would have to be installed wherever a plan is made."""
PULUMI_FREE = (*CORE, "checks", "components.check_commands", "components.collective_check")
"""Modules that must not reach Pulumi, directly or through any project module they import: the core plans without
it, the checks run on nodes, and the two command builders of components/ are pure (their docstrings say so).
`stacks.__main__` is not one: it is the entry point to the review tools, which run the program."""
PASTED_THIRD_PARTY = {"stacks.model.golden": ("pydantic", "pydantic_core")}
"""What a module pasted into a node program may import besides the standard library: golden runs in the vLLM image
(checks/bundle.py INLINED)."""


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _production_modules() -> Iterator[tuple[str, Path]]:
    for top in PROJECT:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield _module(path), path


def imported_names(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every name an import in `source` (the text of `module`) may bind, as an absolute dotted name: `import a.b`
    gives `a.b`, `from a import b` gives `a` and `a.b`, and a relative `from ..planner import plan` inside
    stacks/model/x.py gives `stacks.planner` and `stacks.planner.plan`. Imports inside functions and under `if
    TYPE_CHECKING:` count like the others."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                assert node.level <= len(package), f"{module}: relative import beyond the top-level package"
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            names += [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _imports(module: str, path: Path) -> list[str]:
    return imported_names(path.read_text(), module, path.name == "__init__.py")


def _layer(module: str) -> str:
    for layer in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module.split(".")[0]


def project_imports() -> list[tuple[str, str]]:
    """(importer, imported) for every import of a project module in production code."""
    return [(importer, name) for importer, path in _production_modules() for name in _imports(importer, path)
            if name.split(".")[0] in (*PROJECT, "tests") and _is_module(name)]


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _third_party(name: str) -> str | None:
    top = name.split(".")[0]
    return None if top in sys.stdlib_module_names or top in (*PROJECT, "tests") else top


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
    for folder in ("stacks/model", "stacks/planner", "components", "checks", "heal", "review", "policy"):
        assert (ROOT / folder / "__init__.py").is_file(), folder
    assert not [p.name for p in (ROOT / "stacks").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]


def test_relative_imports_resolve_to_the_modules_they_name() -> None:
    """`from ..planner import plan` in the model is the arrow stacks.model -> stacks.planner.plan, not nothing."""
    assert imported_names("from ..planner import plan", "stacks.model.loader") == [
        "stacks.planner", "stacks.planner.plan"]
    assert imported_names("from . import config", "stacks.model.loader") == ["stacks.model", "stacks.model.config"]
    assert imported_names("from .config import X", "stacks.model", is_package=True) == [
        "stacks.model.config", "stacks.model.config.X"]
    assert imported_names("def f():\n    import pulumi", "stacks.model.loader") == ["pulumi"]


def test_the_core_imports_only_the_standard_library_and_its_named_packages() -> None:
    wrong = [f"{module} imports {name}" for module, path in _production_modules() if _in(module, CORE)
             for name in _imports(module, path) if _third_party(name) not in (None, *CORE_THIRD_PARTY)]
    assert not wrong, ("stacks/model and stacks/planner import only the standard library and "
                       f"{', '.join(CORE_THIRD_PARTY)} (docs/architecture.md):\n" + "\n".join(sorted(set(wrong))))


def test_nothing_the_core_checks_and_pure_builders_reach_imports_pulumi() -> None:
    """Followed through every project import, so a pure module cannot reach Pulumi through another one."""
    graph: dict[str, set[str]] = {}
    for importer, imported in project_imports():
        graph.setdefault(importer, set()).add(imported)
    paths = dict(_production_modules())
    came_from: dict[str, str | None] = {m: None for m in paths if _in(m, PULUMI_FREE)}
    todo = list(came_from)
    wrong = []
    while todo:
        module = todo.pop()
        for name in _imports(module, paths[module]):
            top = name.split(".")[0]
            if top == "pulumi" or top.startswith("pulumi_"):
                chain, at = [module], came_from[module]
                while at is not None:
                    chain.append(at)
                    at = came_from[at]
                wrong.append(f"{name} imported by {' <- '.join(chain)}")
        for imported in graph.get(module, ()):
            if imported in paths and imported not in came_from:
                came_from[imported] = module
                todo.append(imported)
    assert not wrong, "Pulumi reached from a module that must not need it (PULUMI_FREE):\n" + "\n".join(sorted(wrong))


def test_the_modules_pasted_into_node_programs_import_only_the_standard_library() -> None:
    """A pasted module travels alone: a project import inside it would be left unresolved in the node's script,
    unless the module it imports is pasted before it into every script it travels in (s3_source's masking rule:
    it travels only in the weights script, after stacks.model.masking)."""
    pasted = {*INLINED, *(m for m in WEIGHTS_SCRIPT_MODULES if not m.startswith("checks."))}
    assert "stacks.model.s3_source" in pasted and "stacks.model.s3_source" not in INLINED
    paths = dict(_production_modules())

    def before(module: str) -> tuple[str, ...]:
        order = list(WEIGHTS_SCRIPT_MODULES)
        return tuple(order[:order.index(module)]) if module in order and module not in INLINED else ()

    wrong = [f"{module} imports {name}" for module in sorted(pasted) for name in _imports(module, paths[module])
             if (name.split(".")[0] in (*PROJECT, "tests") and not any(name == m or name.startswith(m + ".")
                                                                       for m in before(module)))
             or _third_party(name) not in (None, *PASTED_THIRD_PARTY.get(module, ()))]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_among_the_production_modules() -> None:
    """Counting function-level and TYPE_CHECKING imports: a cycle broken only by a lazy import is still a cycle
    (the planner's launch -> listeners -> observability -> launch was one). One shortest cycle is shown for each
    group of modules that import each other, with the group."""
    graph: dict[str, set[str]] = {}
    back: dict[str, set[str]] = {}
    for importer, imported in project_imports():
        if imported != importer:
            graph.setdefault(importer, set()).add(imported)
            back.setdefault(imported, set()).add(importer)

    def reach(start: str, edges: dict[str, set[str]]) -> dict[str, str]:
        """Each module reachable from `start` -> the one it was first reached from (breadth first)."""
        came_from: dict[str, str] = {}
        todo = [start]
        while todo:
            module = todo.pop(0)
            for other in sorted(edges.get(module, ())):
                if other not in came_from:
                    came_from[other] = module
                    todo.append(other)
        return came_from

    found: list[str] = []
    covered: set[str] = set()
    for start in sorted(graph):
        forward = reach(start, graph)
        if start in covered or start not in forward:
            continue
        group = set(forward) & set(reach(start, back))
        covered |= group
        cycle, at = [start], forward[start]
        while at != start:
            cycle.append(at)
            at = forward[at]
        found.append(" -> ".join([start, *reversed(cycle)]) + f"   (group: {', '.join(sorted(group))})")
    assert not found, "import cycles (lazy imports included):\n" + "\n".join(found)
