"""Every rank's argv of examples/Pulumi.pd.yaml against a real vLLM 0.33.0 on CPU: the prefill group's two nodes and
the decode group's two (wide EP), each parsed by vLLM's own serve parser and built into a VllmConfig by
`AsyncEngineArgs.create_engine_config`, with the parallel config and the KV transfer config vLLM derived.

    VLLM_PYTHON=<venv with vllm==0.33.0>/bin/python venv/bin/python bench/pd_example_real_vllm.py \
        > tests/fixtures/vllm-0.33.0-pd-example.json
    VLLM_PYTHON=... venv/bin/python bench/pd_example_real_vllm.py --check   # compare with the committed file

The driver is bench/expert_parallel_real_vllm.py's (the same model directory: DeepSeek-V3's published config.json,
whose vLLM reader accepts it where the assembled V4.1 one is refused; the same tokenizer flags left out; the same two
CPU-only checks bypassed), extended to record `kv_transfer_config`. The NIXL connector itself is not constructed
(no `nixl` package and no GPU KV cache on CPU): the handshake rules are read from vLLM's code
(stacks/planner/kv_transfer.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.expert_parallel_real_vllm import DERIVE, MODELS, V3, strip  # noqa: E402
from bench.real_vllm_capture import main as capture_main  # noqa: E402
from stacks.model.field_types import SECRET  # noqa: E402
from stacks.model.loader import parse_config, read_stack_values  # noqa: E402
from stacks.planner.stack_plan import build_stack  # noqa: E402

KV_FIELDS = ("kv_connector", "kv_role", "kv_buffer_device", "kv_load_failure_policy")
PD_DERIVE = DERIVE.replace(
    "    pc = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless).parallel_config\n",
    "    vc = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless)\n"
    "    pc = vc.parallel_config\n").replace(
    '    return {"ok": out}\n',
    f'    out["kv_transfer_config"] = {{k: getattr(vc.kv_transfer_config, k, None) for k in {KV_FIELDS!r}}} '
    'if vc.kv_transfer_config else None\n'
    '    return {"ok": out}\n')
assert "    vc = vllm" in PD_DERIVE and 'out["kv_transfer_config"]' in PD_DERIVE, "the expert-parallel driver changed"
ASSUMED = {"api_key": SECRET, "proxy_keys": {"team-a": SECRET}, "tls_certificate": SECRET, "tls_private_key": SECRET}
"""The front door's secrets, as `plan --assume-secret` takes them: the plan never sees their values."""


def planned_argv() -> dict[str, list[str]]:
    """`<group> <node>` -> that node's planned `vllm serve` argv after the model path, tokenizer flags left out."""
    values = read_stack_values("pd", ROOT / "examples")
    whole = build_stack("bench", parse_config("bench", {**values, **ASSUMED}))
    return {f"{g.name} {n.name}": strip(n.containers[0].vllm_args or []) for g in whole.groups for n in g.plan.nodes}


def capture(python: str) -> dict[str, Any]:
    planned = planned_argv()
    lines = [json.dumps([name, V3, argv]) for name, argv in planned.items()]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    with tempfile.TemporaryDirectory(prefix="pd-model-") as root:
        (Path(root) / V3).mkdir()
        (Path(root) / V3 / "config.json").write_bytes((MODELS / V3 / "config.json").read_bytes())
        done = subprocess.run([python, "-c", PD_DERIVE, json.dumps({V3: str(Path(root) / V3)})],
                              input="\n".join(lines) + "\n", capture_output=True, text=True, env=env, timeout=1800)
    results = dict(json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT "))
    missing = [n for n in planned if n not in results]
    if missing:
        raise SystemExit(f"no result for {missing}: {done.stderr[-2000:]}")
    return {"origin": "bench/pd_example_real_vllm.py (its docstring: the model directory, the flags left out and "
                      "the two CPU-only checks bypassed)",
            "planned": {n: {"argv": a, **results[n]} for n, a in planned.items()}}


FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.33.0-pd-example.json"


def main() -> int:
    return capture_main(capture, FIXTURE)


if __name__ == "__main__":
    raise SystemExit(main())
