"""The argument dry run against a real vLLM (not the test stand-in): time and verdict per node argv.

    VLLM_PYTHON=/path/to/venv-with-vllm/bin/python venv/bin/python bench/dry_run_real_vllm.py

It runs the exact script the program ships (`checks/vllm_args.py` with the verdict inlined) with the exact
argv of each node, swapping only `docker run … <image>` for that interpreter with VLLM_TARGET_DEVICE=cpu (as
the command sets). A case with a made-up flag proves the real parser rejects it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.check_commands import dry_run_command
from stacks.loader import load_stack
from stacks.plan import build_plan


def cases(python: str) -> list[tuple[str, str]]:
    out = []
    for stack in ("prod", "h20"):
        config = load_stack(stack)
        plan = build_plan(stack, config)
        for check in (c for c in plan.checks if c.module == "checks.vllm_args"):
            command = dry_run_command(config, plan, check)
            first, rest = command.split("\n", 1)
            _, after = first.split(" - ", 1)
            local = f"VLLM_TARGET_DEVICE=cpu timeout 600 {python} - {after}\n{rest}"
            out.append((f"{stack} {check.node}", local))
            if stack == "prod" and check.node == plan.head.name:
                out.append((f"{stack} {check.node} + --made-up-flag",
                            local.replace(" -- /models/", " -- /models/", 1).replace(
                                "--max-num-seqs 128", "--max-num-seqs 128 --made-up-flag", 1)))
    return out


def main() -> int:
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that imports vllm", file=sys.stderr)
        return 2
    version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                             env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).stdout.strip().splitlines()[-1:]
    print(f"vLLM {version[0] if version else '?'} at {python}\n")
    print("| argv of | exit | seconds | verdict |\n|---|---:|---:|---|")
    for label, command in cases(python):
        start = time.monotonic()
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        verdict = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"| {label} | {done.returncode} | {time.monotonic() - start:.1f} | {verdict[:160]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
