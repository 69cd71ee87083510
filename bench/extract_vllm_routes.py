"""Every HTTP path a vLLM wheel's API server can register, read from its source with `ast` (nothing imported).

    venv/bin/python bench/extract_vllm_routes.py /work/vllm-src/vllm 0.33.0
    # writes stacks/planner/data/vllm-0.33.0-routes.json

What counts as a route (vllm/entrypoints/**.py):
- a decorator `@<router or app>.<get|post|put|patch|delete|head|options|api_route>("/path", …)`;
- a call `<x>.add_api_route("/path", …)` (or `path=`);
- `Mount("/path", …)` and `<app>.mount("/path", …)` (`/metrics`, the offline docs' `/static`);
- FastAPI's own `/docs`, `/docs/oauth2-redirect`, `/redoc` and `/openapi.json`, which
  `launchers/app.py` `build_app` keeps unless `--disable-fastapi-docs`.
A path that is not a string literal is reported on stderr and left out (0.33.0 has one: the offline docs'
`app.swagger_ui_oauth2_redirect_url`, which is FastAPI's `/docs/oauth2-redirect`, listed above).
Routes that plugins or third-party packages add at run time (`model_hosting_container_standards`, endpoint
plugins) are not in the wheel and not here: the deny list is "every path we know", the allowlist is what opens.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

METHODS = {"get", "post", "put", "patch", "delete", "head", "options", "api_route"}
FASTAPI_DEFAULTS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
OUT = Path(__file__).resolve().parent.parent / "stacks" / "planner" / "data"


def _literal_path(call: ast.Call) -> str | None:
    arg: ast.expr | None = call.args[0] if call.args else None
    for kw in call.keywords:
        if kw.arg == "path":
            arg = kw.value
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _methods(call: ast.Call, attr: str) -> list[str]:
    if attr in METHODS - {"api_route"}:
        return [attr.upper()]
    for kw in call.keywords:
        if kw.arg == "methods" and isinstance(kw.value, ast.List | ast.Tuple):
            return [str(e.value).upper() for e in kw.value.elts if isinstance(e, ast.Constant)]
    return ["*"]


def routes_of(package: Path) -> tuple[dict[str, dict[str, list[str]]], list[str]]:
    """path -> {"methods": [...], "origins": ["vllm/entrypoints/x.py:12", ...]}, and what could not be read."""
    found: dict[str, dict[str, set[str]]] = {}
    skipped: list[str] = []

    def add(path: str, methods: list[str], origin: str) -> None:
        entry = found.setdefault(path, {"methods": set(), "origins": set()})
        entry["methods"].update(methods)
        entry["origins"].add(origin)

    root = package / "entrypoints"
    for file in sorted(root.rglob("*.py")):
        rel = f"vllm/{file.relative_to(package)}"
        tree = ast.parse(file.read_text(), filename=str(file))
        for node in ast.walk(tree):
            calls: list[ast.Call] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
            elif isinstance(node, ast.Call):
                calls = [node]
            for call in calls:
                func = call.func
                if isinstance(func, ast.Attribute):
                    attr = func.attr
                    is_route = (attr in METHODS and call in getattr(node, "decorator_list", [])) or attr in (
                        "add_api_route", "mount")
                elif isinstance(func, ast.Name) and func.id == "Mount":
                    attr, is_route = "mount", True
                else:
                    continue
                if not is_route:
                    continue
                path = _literal_path(call)
                where = f"{rel}:{call.lineno}"
                if path is None:
                    skipped.append(f"{where}: {ast.unparse(call)[:120]}")
                    continue
                methods = ["*"] if attr == "mount" else _methods(call, attr)
                add(path, methods, where)
    for path in FASTAPI_DEFAULTS:
        add(path, ["GET"], "fastapi FastAPI() defaults, kept by vllm/entrypoints/launchers/app.py build_app "
                           "unless --disable-fastapi-docs")
    out = {p: {"methods": sorted(e["methods"]), "origins": sorted(e["origins"])} for p, e in sorted(found.items())}
    return out, skipped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: extract_vllm_routes.py <unpacked vllm package dir> <version>", file=sys.stderr)
        return 2
    package, version = Path(argv[0]), argv[1]
    routes, skipped = routes_of(package)
    for line in skipped:
        print(f"not a literal path, left out: {line}", file=sys.stderr)
    data = {
        "origin": f"vLLM {version} wheel from PyPI, unpacked; every route in vllm/entrypoints read with ast by "
                  "bench/extract_vllm_routes.py (decorators @router/@app.<method>, add_api_route, Mount, "
                  "app.mount) plus FastAPI's default docs paths",
        "vllm_version": version,
        "routes": routes,
    }
    target = OUT / f"vllm-{version}-routes.json"
    target.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {target}: {len(routes)} paths")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
