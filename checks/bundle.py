"""Ship a host-side check as one self-contained script: `checks.verdict` (and `stacks.planner.memory`, which the
preflight shares with the planner) inlined, stdlib only.

The remote command is `python3 - ARGS <<'EOF' … EOF`, so nothing is installed on the host.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

HERE = Path(__file__).resolve().parent
_IMPORT = re.compile(r"^from checks\.verdict import (\([^)]*\)|.*)$", re.M)
_FUTURE = "from __future__ import annotations\n"
INLINED = {"stacks.planner.memory": HERE.parent / "stacks" / "planner" / "memory.py",
           "stacks.model.golden": HERE.parent / "stacks" / "model" / "golden.py",
           "stacks.model.busbw": HERE.parent / "stacks" / "model" / "busbw.py",
           "stacks.model.masking": HERE.parent / "stacks" / "model" / "masking.py"}
"""Project modules pasted in place of their (single-line or parenthesized) import: stdlib only, except
`stacks.model.golden` (pydantic), which only `api` imports and which runs inside the vLLM image (pydantic, httpx).
`stacks.model.busbw` is the collective check's floor range, shared with the stack field `fabric.min_busbw_gbps`;
`stacks.model.masking` is the masking rule of every program, which `checks.verdict` imports."""
REMOTE_MODULES = ("preflight", "nccl_transport", "engines", "ray_cluster", "vllm_args", "collective", "api",
                  "deepep_host", "page_cache", "grafana_password", "pd")
_SIBLING = re.compile(r"^from checks\.(\w+) import .*$", re.M)
_MAIN_BLOCK = re.compile(r"^if __name__ == \"__main__\":\n.*", re.M | re.S)


def _sibling(module: str) -> str:
    """Another host-side check's functions, for a check that imports them (collective uses nccl_transport's
    parser): its own verdict import and `__main__` block dropped, its names defined before the importer's."""
    if module not in REMOTE_MODULES:
        raise ValueError(f"checks.{module} is not a host-side check; one of {REMOTE_MODULES}")
    source = (HERE / f"{module}.py").read_text().replace(_FUTURE, "")
    return _MAIN_BLOCK.sub("", _IMPORT.sub("", source))


@functools.cache  # the same files for every node: read and pasted once per process
def remote_script(module: str) -> str:
    """The module's source with the verdict helpers pasted in place of their import, and any other host-side
    check it imports pasted in place of that import."""
    if module not in REMOTE_MODULES:
        raise ValueError(f"{module} is not a host-side check; one of {REMOTE_MODULES}")
    verdict = (HERE / "verdict.py").read_text().replace(_FUTURE, "")
    source = (HERE / f"{module}.py").read_text().replace(_FUTURE, "")
    if not _IMPORT.search(source):
        raise ValueError(f"checks/{module}.py does not import checks.verdict")
    for name, path in INLINED.items():
        pattern = re.compile(rf"^from {re.escape(name)} import (\([^)]*\)|.*)$", re.M)
        verdict = _paste(pattern, path.read_text().replace(_FUTURE, ""), verdict)
        source = _paste(pattern, path.read_text().replace(_FUTURE, ""), source)
    source = _SIBLING.sub(lambda m: m.group(0) if m.group(1) == "verdict" else _sibling(m.group(1)), source)
    return _FUTURE + _IMPORT.sub(lambda _: verdict, source, count=1)


def _paste(pattern: re.Pattern[str], body: str, source: str) -> str:
    return pattern.sub(lambda _: body, source, count=1)


def heredoc_command(module: str, args: list[str], prefix: str = "", timeout_s: int | None = None,
                    interpreter: str = "python3 ") -> str:
    """`[timeout N] [prefix] python3 - ARGS <<'VLLM_CLUSTER_EOF'` + script: one shell command for SSH.
    `interpreter=""` where the prefix already ends in one (`docker run --entrypoint python3 IMAGE`)."""
    script = remote_script(module)
    marker = "VLLM_CLUSTER_EOF"
    if marker in script:
        raise ValueError("script contains the heredoc marker")
    runner = f"timeout {timeout_s} " if timeout_s else ""
    return f"{runner}{prefix}{interpreter}- {shlex.join(args)} <<'{marker}'\n{script}\n{marker}"
