"""`ast.parse` that CPython 3.11 (before 3.11.8) cannot fail with a false "SystemError: AST constructor recursion
depth mismatch": the AST builder's depth counter is shared, so code run inside a parse (a garbage-collection
finalizer such as asyncio's "Future exception was never retrieved" logging) can throw it off (python/cpython#106905,
fixed in 3.11.8 and 3.12.1). Seen here twice, in full test runs beside Pulumi's mocks. The collector is paused for
the parse, so no finalizer runs inside it."""

from __future__ import annotations

import ast
import gc


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """The module's tree, with no finalizer running while it is built."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if was_enabled:
            gc.enable()
