"""What the benches that ask real vLLM 0.33.0 on CPU share: the loop that feeds it one argv per line and prints
one `RESULT [name, result]` per argv (an exception's message, the model dir hidden), the run of that program in the
interpreter `VLLM_PYTHON` names against a model directory holding one config.json, and `--check` against the
committed capture. Each bench supplies its own `derive(model, argv)`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_LOOP = r'''
model = sys.argv[1]
for line in sys.stdin:
    name, argv = json.loads(line)
    try:
        result = derive(model, argv)
    except BaseException as exc:
        text = str(exc)
        if "validation error" in text:  # pydantic: the line that carries the message
            text = next((l.strip() for l in text.splitlines()[1:] if l.strip()), text)
        result = {"error": type(exc).__name__, "message": text.split(" [type=")[0].replace(model, "<model-dir>")}
    print("RESULT " + json.dumps([name, result]), flush=True)
'''
"""Appended to a bench's program, after its `derive`."""


def run(python: str, program: str, model_config: Path, planned: dict[str, list[str]],
        refused: dict[str, list[str]], prefix: str) -> tuple[dict[str, Any], str, str]:
    """(results by `planned#name` / `refused#name`, the program's stdout, vLLM's version); exits naming any argv
    that got no result."""
    lines = [json.dumps([f"planned#{n}", a]) for n, a in planned.items()]
    lines += [json.dumps([f"refused#{n}", a]) for n, a in refused.items()]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        (Path(root) / "config.json").write_bytes(model_config.read_bytes())
        done = subprocess.run([python, "-c", program, root], input="\n".join(lines) + "\n", capture_output=True,
                              text=True, env=env, timeout=1800)
        version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                                 text=True, env=env, timeout=600).stdout.strip().splitlines()[-1:]
    results = dict(json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT "))
    missing = [n for n in (*(f"planned#{n}" for n in planned), *(f"refused#{n}" for n in refused))
               if n not in results]
    if missing:
        raise SystemExit(f"no result for {missing}: {done.stderr[-2000:]}")
    return results, done.stdout, version[0] if version else "?"


def main(capture: Callable[[str], dict[str, Any]], fixture: Path) -> int:
    """Print the capture, or with `--check` compare it with the committed one (exit 1 when it differs)."""
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that has vLLM 0.33.0 installed", file=sys.stderr)
        return 2
    out = capture(python)
    if "--check" in sys.argv[1:]:
        same = out == json.loads(fixture.read_text())
        print("the committed capture matches" if same else "the committed capture differs: recapture it",
              file=sys.stderr)
        return 0 if same else 1
    print(json.dumps(out, indent=1, ensure_ascii=False))
    return 0
