"""Every refusal that says what vLLM (or the router) would do cites the file:line of the code that does it.

A static scan over stacks/: each `Problem(...)` whose `upstream` is set (by keyword or as the fourth argument)
is resolved to the text it can take (string literals and f-strings with names resolved to their module's or
the enclosing function's assignments, dict lookups to every value, conditional expressions to both branches),
and every text it can take must carry a `file.py:N` (or the router's `file.rs:N`) citation. A refusal passed on
unchanged (`problem.upstream`) is cited where it was made. The scan is checked on a snippet with an uncited
refusal, and on the count of refusals it read, so it cannot pass by reading nothing."""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from checks.python_ast import parse

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"\.(py|rs):(\d+|\{\})")
"""`file.py:{}` is a line read from a table of the rule's cases (each case's lines beside its message)."""
CITATION_FIELDS = {"options_where": "CITED.py:0", "files_where": "CITED.py:0"}
"""Attributes whose every value is itself checked for a citation (test_loader_citation_fields_cite)."""
UNRESOLVED = "\x00unresolved\x00"


@dataclass
class Module:
    """One parsed module: its top-level assignments by name and what it imports from stacks/."""

    tree: ast.Module
    assigned: dict[str, list[ast.expr]] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    local: dict[str, list[ast.expr]] = field(default_factory=dict)
    """The assignments of the function being read (they hide the module's)."""


def _assignments(nodes: list[ast.AST]) -> dict[str, list[ast.expr]]:
    found: dict[str, list[ast.expr]] = {}
    for node in nodes:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name):
                found.setdefault(target.id, []).append(value)
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                for t, v in zip(target.elts, value.elts, strict=False):
                    if isinstance(t, ast.Name):
                        found.setdefault(t.id, []).append(v)
    return found


def _module(source: str) -> Module:
    tree = parse(source)
    found = Module(tree, _assignments(list(tree.body)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stacks"):
            for alias in node.names:
                found.imported[alias.asname or alias.name] = (node.module, alias.name)
    return found


_MODULES: dict[str, Module] = {}


def _named(module: str) -> Module:
    if module not in _MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        _MODULES[module] = _module(path.read_text())
    return _MODULES[module]


def texts(expr: ast.expr, mod: Module, depth: int = 0) -> list[str]:
    """Every text `expr` can take, with parts that are not known (a number, a model name) left as '{}'."""
    if depth > 12:
        return [UNRESOLVED]
    if isinstance(expr, ast.Constant):
        return [expr.value] if isinstance(expr.value, str) else [""] if expr.value is None else [UNRESOLVED]
    if isinstance(expr, ast.JoinedStr):
        out = [""]
        for part in expr.values:
            if isinstance(part, ast.Constant):
                out = [o + str(part.value) for o in out]
                continue
            assert isinstance(part, ast.FormattedValue)
            inner = part.value
            if isinstance(inner, ast.Attribute) and inner.attr in CITATION_FIELDS:
                alts = [CITATION_FIELDS[inner.attr]]
            elif isinstance(inner, ast.Name):
                alts = [t if t != UNRESOLVED else "{}" for t in _name(inner.id, mod, depth)]
            else:
                alts = ["{}"]
            out = [o + a for o in out for a in alts][:256]
        return out
    if isinstance(expr, ast.Name):
        return _name(expr.id, mod, depth)
    if isinstance(expr, ast.IfExp):
        return texts(expr.body, mod, depth + 1) + texts(expr.orelse, mod, depth + 1)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return [a + b for a in texts(expr.left, mod, depth + 1) for b in texts(expr.right, mod, depth + 1)][:256]
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):  # a table of upstream errors
        out = []
        for table in _values(expr.value.id, mod):
            if isinstance(table, ast.Dict):
                out += [t for v in table.values for t in texts(v, mod, depth + 1)]
        return out or [UNRESOLVED]
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format":
        return texts(expr.func.value, mod, depth + 1)
    return [UNRESOLVED]


def _values(name: str, mod: Module) -> list[ast.expr]:
    if name in mod.local or name in mod.assigned:
        return [w for v in mod.local.get(name) or mod.assigned[name]
                for w in (_values(v.id, mod) if isinstance(v, ast.Name) and v.id != name else [v])]
    if name in mod.imported:
        module, original = mod.imported[name]
        return _values(original, _named(module))
    return []


def _name(name: str, mod: Module, depth: int) -> list[str]:
    if name in mod.imported and name not in mod.assigned and name not in mod.local:
        module, original = mod.imported[name]
        return _name(original, _named(module), depth + 1)
    values = mod.local.get(name) or mod.assigned.get(name, [])  # first set to "" and then to a message: the messages
    return [t for v in values for t in texts(v, mod, depth + 1) if t != ""] or [UNRESOLVED]


def refusals(source: str, module: str = "") -> list[tuple[int, list[str]]]:
    """(line, texts) of every Problem's upstream in `source`; a passed-on `x.upstream` is left out."""
    mod = _module(source)
    if module:
        _MODULES[module] = mod
    found = []
    scopes: list[ast.AST] = [mod.tree, *(n for n in ast.walk(mod.tree) if isinstance(n, ast.FunctionDef))]
    for scope in scopes:
        body = list(ast.walk(scope)) if isinstance(scope, ast.FunctionDef) else list(scope.body)  # type: ignore[attr-defined]
        mod.local = _assignments(body) if isinstance(scope, ast.FunctionDef) else {}
        calls = [n for n in (ast.walk(scope) if isinstance(scope, ast.FunctionDef) else _outside_functions(mod.tree))
                 if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "Problem"]
        for node in calls:
            if isinstance(scope, ast.FunctionDef) and _innermost(scope, node) is not scope:
                continue
            exprs = [k.value for k in node.keywords if k.arg == "upstream"] + node.args[3:4]
            for expr in exprs:
                if isinstance(expr, ast.Attribute) and expr.attr == "upstream":
                    continue
                found.append((expr.lineno, [t for t in texts(expr, mod) if t != ""]))
    mod.local = {}
    return found


def _outside_functions(tree: ast.AST) -> list[ast.AST]:
    out: list[ast.AST] = []
    for child in ast.iter_child_nodes(tree):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            out += [child, *_outside_functions(child)]
    return out


def _innermost(scope: ast.FunctionDef, node: ast.AST) -> ast.FunctionDef:
    """The innermost function of `scope` (itself or one nested in it) that holds `node`."""
    for child in ast.walk(scope):
        if isinstance(child, ast.FunctionDef) and child is not scope and node in set(ast.walk(child)):
            return _innermost(child, node)
    return scope


def uncited(source: str, module: str = "") -> list[str]:
    return list(dict.fromkeys(f"{line}: {text[:160]!r}" for line, alts in refusals(source, module) for text in alts
                              if text == UNRESOLVED or not CITED.search(text)))


def _stack_modules() -> list[tuple[str, str]]:
    return [(".".join(p.relative_to(ROOT).with_suffix("").parts), p.read_text())
            for p in sorted((ROOT / "stacks").rglob("*.py"))]


def test_every_upstream_claim_cites_the_code_that_fails() -> None:
    missing, count = [], 0
    for module, source in _stack_modules():
        count += len(refusals(source, module))
        missing += [f"{module}:{m}" for m in uncited(source, module)]
    assert count >= 90, count  # the scan reads the planner's refusals, not nothing
    assert not missing, "\n".join(missing)


def test_the_scan_finds_an_uncited_refusal() -> None:
    source = (
        'PLAIN = "ValueError: something (vLLM\'s registry)"\n'
        'GOOD = "ValueError: x (vllm/config/model.py:1465-1469)"\n'
        "TABLE = {'a': 'KeyError: a (vllm/x.py:3)', 'b': 'KeyError: b'}\n"
        "def rule(n, p):\n"
        "    where = 'vllm/config/cache.py'\n"
        "    Problem('k', 1, 'm', upstream=PLAIN)\n"
        "    Problem('k', 1, 'm', GOOD if n else f'ValueError: {n} is bad')\n"
        "    Problem('k', 1, 'm', upstream=TABLE[n].format(value=n))\n"
        "    Problem('k', 1, 'm', upstream=f'ValueError: {n} ({where}:12-14)')\n"
        "    Problem('k', 1, 'm', upstream=some_call(n))\n"
        "    Problem('k', 1, 'm', upstream=p.upstream)\n")
    bad = uncited(source)
    assert [b.split(":")[0] for b in bad] == ["6", "7", "8", "10"], bad


def test_loader_citation_fields_cite() -> None:
    loaders = importlib.import_module("stacks.planner.load_formats").LOADERS
    for name, loader in loaders.items():
        for attr in CITATION_FIELDS:
            value = getattr(loader, attr)
            assert not value or CITED.search(value), (name, attr, value)
