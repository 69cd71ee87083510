"""The argument dry run up to vLLM's own create_engine_config, on a real vLLM (pip wheel, CPU).

    VLLM_PYTHON=<venv with vllm>/bin/python venv/bin/python bench/engine_config_real_vllm.py

Runs checks/vllm_args.py (the script the program sends into the image) with the real interpreter, the
`--engine-config` switch and a model directory that holds only a config.json (what the dry run mounts from the
node, read-only), for argv that vLLM's config classes accept or refuse. Prints one Markdown row per case: the
verdict, what vLLM derived or its message, and the seconds it took. Results are recorded in docs/your-image.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIG = {  # a Llama-shaped 8B model: 32 heads, 8 KV heads, 32 layers, 32K positions
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
    "vocab_size": 128256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
}

CASES: list[tuple[str, list[str], str]] = [
    # (case, argv after the model directory, expected verdict)
    ("defaults", [], "PASS"),
    ("TP8 PP2, batched 8192, max_model_len 32768 (chunked prefill on)",
     ["-tp", "8", "-pp", "2", "--max-model-len", "32768", "--max-num-batched-tokens", "8192"], "PASS"),
    ("chunked prefill off, batched 8192 < max_model_len 32768",
     ["--max-model-len", "32768", "--max-num-batched-tokens", "8192", "--no-enable-chunked-prefill"], "FAIL"),
    ("the same with --disable-chunked-prefill",
     ["--max-model-len", "32768", "--max-num-batched-tokens", "8192", "--disable-chunked-prefill"], "FAIL"),
    ("batched 64 < max_num_seqs 256", ["--max-num-batched-tokens", "64", "--max-num-seqs", "256"], "FAIL"),
    ("max_num_active_seqs 300 > max_num_seqs 256", ["--max-num-seqs", "256", "--max-num-active-seqs", "300"],
     "FAIL"),
    ("TP3 (32 heads)", ["-tp", "3"], "FAIL"),
    ("max_model_len 65536 > 32768 positions", ["--max-model-len", "65536"], "FAIL"),
    ("gpu_memory_utilization 1.5", ["--gpu-memory-utilization", "1.5"], "FAIL"),
    ("the headless second node of a TP16 replica over 2 nodes",
     ["-tp", "16", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501",
      "--headless"], "PASS"),
    ("DP2 head, one rank per node", ["-tp", "8", "--data-parallel-size", "2", "--data-parallel-size-local", "1",
                                     "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"],
     "PASS"),
]


def main() -> int:
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that has vLLM installed (pip install vllm in a venv)",
              file=sys.stderr)
        return 2
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    wrong = 0
    print("| case | expected | verdict | what vLLM said | s |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="engine-config-") as root:
        model = Path(root) / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(CONFIG))
        for name, argv, expected in CASES:
            start = time.monotonic()
            done = subprocess.run([python, "-m", "checks.vllm_args", "--json", "--engine-config", "--",
                                   str(model), *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=600)
            seconds = time.monotonic() - start
            try:
                verdict = json.loads(done.stdout.strip().splitlines()[-1])
            except (json.JSONDecodeError, IndexError):
                verdict = {"status": "no verdict", "evidence": [done.stderr.strip()[-300:]]}
            status = str(verdict.get("status", "?")).upper()
            said = next((e for e in verdict.get("evidence", []) if "engine config" in e or ":" in e), "")
            wrong += status != expected
            print(f"| {name} | {expected} | {status} | {said.replace('|', '/')[:260]} | {seconds:.1f} |")
    print(f"\n{len(CASES) - wrong}/{len(CASES)} as expected", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
