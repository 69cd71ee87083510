"""Which vLLM model class serves each architecture on CUDA, and whether it supports LoRA, read from vLLM's source.

Standard library only. The image card probe (checks/image_card_probe.py) is sent to the image's interpreter with
this file in front of it (review/image_card.py), so its `lora_architectures` section can call
`lora_by_architecture`. It reads the source rather than importing the classes because the class behind an
architecture depends on the platform it is imported on: vLLM 0.33.0's `vllm/models/deepseek_v4/__init__.py`
imports `cpu/model.py`'s DeepseekV4ForCausalLM (no LoRA) where `current_platform.is_cpu()`, `nvidia/model.py`'s
(SupportsLoRA) on CUDA, and a card is taken without a GPU (VLLM_TARGET_DEVICE=cpu). So each module is parsed and
its `current_platform.is_*()` branches are taken as CUDA takes them.

A class supports LoRA as vLLM decides it (vllm/model_executor/models/interfaces.py:760-796, `supports_lora`):
`supports_lora = True` on the class or a base, which `SupportsLoRA` sets (interfaces.py:719-723). The answer is
None (unresolved, with the reason) where the source cannot say it: a class made by a function call, a base that
cannot be found, a platform test this reader does not know.
"""

import ast
import os
from typing import Any

CUDA_TESTS = {"is_cuda": True, "is_cuda_alike": True, "is_rocm": False, "is_xpu": False, "is_cpu": False,
              "is_tpu": False, "is_out_of_tree": False, "is_neuron": False, "is_hpu": False}
"""`current_platform.is_*()` as vLLM's CudaPlatform answers them."""


class Unresolved(Exception):
    """The source does not say which class it is or whether it supports LoRA."""


class _Reader:
    """Parses the modules of one vLLM tree on demand (`vllm_dir` is the directory of the `vllm` package)."""

    def __init__(self, vllm_dir: str) -> None:
        self.root = os.path.dirname(os.path.abspath(vllm_dir))
        self.trees: dict[str, tuple[str, ast.Module]] = {}

    def module(self, name: str) -> tuple[str, ast.Module]:
        """(path relative to site-packages, tree) of a module `vllm.a.b`, or Unresolved."""
        if name not in self.trees:
            base = os.path.join(self.root, *name.split("."))
            for path in (base + ".py", os.path.join(base, "__init__.py")):
                if os.path.isfile(path):
                    with open(path, encoding="utf-8") as f:
                        self.trees[name] = (os.path.relpath(path, self.root), ast.parse(f.read()))
                    break
            else:
                raise Unresolved(f"no source for module {name}")
        return self.trees[name]


def _test(node: ast.expr, type_checking: bool) -> bool | None:
    """An `if` test as it comes out on CUDA at run time (TYPE_CHECKING as given), or None where unknown."""
    if isinstance(node, ast.Name) and node.id == "TYPE_CHECKING":
        return type_checking
    if isinstance(node, ast.Attribute) and node.attr == "TYPE_CHECKING":
        return type_checking
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
        return CUDA_TESTS.get(node.func.attr)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _test(node.operand, type_checking)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        values = [_test(v, type_checking) for v in node.values]
        if isinstance(node.op, ast.Or):
            return True if True in values else None if None in values else False
        return False if False in values else None if None in values else True
    return None


def _statements(body: list[ast.stmt], type_checking: bool, functions: bool) -> list[ast.stmt]:
    """The statements of `body` that run on CUDA, `if` branches chosen, `try` bodies and (when `functions`) the
    bodies of module functions such as a lazy `__getattr__` included."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            taken = _test(stmt.test, type_checking)
            if taken is not None:
                out += _statements(stmt.body if taken else stmt.orelse, type_checking, functions)
        elif isinstance(stmt, ast.Try) or (functions and isinstance(stmt, ast.FunctionDef)):
            out += _statements(stmt.body, type_checking, functions)
        else:
            out.append(stmt)
    return out


def _absolute(module: str, is_package: bool, target: str | None, level: int) -> str:
    """The absolute name of `from <level dots><target> import ...` inside `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _bindings(reader: _Reader, module: str, name: str) -> list[tuple[Any, ...]]:
    """Where `name` is bound in `module` on CUDA: ("class", node), ("from", module, name), ("module", module) or
    ("other", line); at run time first, then with TYPE_CHECKING true and lazy `__getattr__` bodies read."""
    path, tree = reader.module(module)
    is_package = path.endswith("__init__.py")
    for type_checking, functions in ((False, False), (True, True)):
        found: list[tuple[Any, ...]] = []
        for stmt in _statements(tree.body, type_checking, functions):
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                found.append(("class", stmt))
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, is_package, stmt.module, stmt.level)
                        found.append(("from", source, alias.name))
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname == name or (alias.asname is None and alias.name.split(".")[0] == name):
                        found.append(("module", alias.name if alias.asname else name))
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets) and stmt.value is not None:
                    found.append(("other", stmt))
        if found:
            return found
    return []


def _class(reader: _Reader, module: str, name: str, depth: int = 0) -> tuple[str, str, ast.ClassDef]:
    """(module, file:line, class node) that `module.name` is on CUDA, following imports and `X = Y` aliases."""
    if depth > 12:
        raise Unresolved(f"{module}.{name}: imports too deep")
    bound = _bindings(reader, module, name)
    if not bound:
        raise Unresolved(f"{module} defines no {name}")
    kind, *rest = bound[-1]  # the last binding wins, as at run time
    if kind == "class":
        path, _ = reader.module(module)
        return module, f"{path}:{rest[0].lineno}", rest[0]
    if kind == "from":
        source, original = rest
        return _class(reader, source, original, depth + 1)
    if kind == "other" and isinstance(rest[0].value, ast.Name):
        return _class(reader, module, rest[0].value.id, depth + 1)
    path, _ = reader.module(module)
    line = rest[0].lineno if kind == "other" else "?"
    raise Unresolved(f"{module}.{name} is not a class statement ({path}:{line})")


def _base(reader: _Reader, module: str, node: ast.expr) -> tuple[str, str] | None:
    """(module, name) of a base class expression, None for one outside vLLM (torch's nn.Module, typing)."""
    if isinstance(node, ast.Subscript):
        return _base(reader, module, node.value)
    if isinstance(node, ast.Name):
        bound = _bindings(reader, module, node.id)
        if not bound:
            if node.id in ("object", "Protocol", "Generic"):
                return None
            raise Unresolved(f"base {node.id} of a class in {module} is not bound there")
        kind, *rest = bound[-1]
        if kind == "from":
            return None if not rest[0].startswith("vllm") else (rest[0], rest[1])
        return module, node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        bound = _bindings(reader, module, node.value.id)
        if bound and bound[-1][0] == "module":
            target = bound[-1][1]
            return None if not target.startswith("vllm") else (target, node.attr)
        if bound and bound[-1][0] == "from":
            source, original = bound[-1][1], bound[-1][2]
            full = f"{source}.{original}"
            return None if not full.startswith("vllm") else (full, node.attr)
        return None  # e.g. nn.Module (torch)
    raise Unresolved(f"base {ast.dump(node)[:80]} of a class in {module}")


def _own_flag(node: ast.ClassDef) -> bool | None:
    """`supports_lora = True/False` in the class body itself."""
    for stmt in node.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
            stmt.target if isinstance(stmt, ast.AnnAssign) else None)
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and target.id == "supports_lora" and isinstance(value, ast.Constant):
            return bool(value.value)
    return None


def _supports(reader: _Reader, module: str, node: ast.ClassDef, depth: int = 0) -> bool:
    """Whether the class (or the first base, left to right and depth first, that says it) sets supports_lora."""
    if depth > 20:
        raise Unresolved(f"class {node.name}: bases too deep")
    own = _own_flag(node)
    if own is not None:
        return own
    for base in node.bases:
        where = _base(reader, module, base)
        if where is None:
            continue
        base_module, base_name = where
        found_module, _, base_node = _class(reader, base_module, base_name)
        if _supports(reader, found_module, base_node, depth + 1):
            return True
    return False


def lora_by_architecture(vllm_dir: str, registry: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """For each architecture (-> (module, class) as vLLM's model registry lists it), the class CUDA imports and
    whether it supports LoRA: {"supported": {arch: "file:line Class"}, "unsupported": {...}, "unresolved":
    {arch: why}}."""
    reader = _Reader(vllm_dir)
    out: dict[str, dict[str, str]] = {"supported": {}, "unsupported": {}, "unresolved": {}}
    for arch, (module, name) in sorted(registry.items()):
        try:
            found_module, where, node = _class(reader, module, name)
            verdict = _supports(reader, found_module, node)
        except (Unresolved, SyntaxError, OSError, UnicodeDecodeError) as exc:
            out["unresolved"][arch] = str(exc)[:300]
            continue
        out["supported" if verdict else "unsupported"][arch] = f"{where} {node.name}"
    return out
