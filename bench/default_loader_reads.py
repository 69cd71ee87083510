"""What vLLM 0.33.0's default loader reads from a warm page cache: the bytes its weight loaders copy, not the file.

    VLLM_PYTHON=<python with vllm==0.33.0> venv/bin/python bench/default_loader_reads.py [--dir /var/tmp] \
        [--file-gb 2] [--runs 5]

`safetensors_weights_iterator` (model_executor/model_loader/weight_utils.py:1243-1249) calls `f.get_tensor(name)`
for every tensor of every shard. safetensors' `get_tensor` (framework "pt") returns a view of the file's mmap, so
a page of the file is read only when the model's weight loader copies from it: a TP rank copies its slice
(`narrow`), an EP rank returns before touching another rank's expert (layers/fused_moe/routed_experts.py:735-737).
This writes one safetensors shard of 2-D bf16 tensors, reads it into the page cache, then in a fresh process per
run feeds vLLM's own iterator to one of these consumers and reports the file bytes the process mapped (RssFile:
an upper bound of what it read, as the kernel maps up to 64 KiB of cached pages around each one touched) and the
copy's rate, CPU only (the host half; the copy to a GPU is not measured here). About 10 s per run go to importing
vLLM.

- `none`: iterate, copy nothing; `tp8-rows` / `tp8-cols`: copy a TP=8 slice of each tensor on dim 0 / dim 1;
- `ep16`: copy one tensor in 16 whole (a rank's own experts under EP=16); `full`: copy every byte;
- `multithread-none`: the multi-thread loader's iterator (`enable_multithread_load`, weight_utils.py:1252-1279:
  `safetensors.torch.load_file` per shard), copy nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROWS, COLS = 4096, 16384
"""One bf16 tensor: 128 MiB, a row 32 KiB (a TP=8 slice of a row is one 4 KiB page). At least 16 per file."""
MODES = ("none", "tp8-rows", "tp8-cols", "ep16", "full", "multithread-none")

CONSUMER = r'''
import json, sys, time
import torch
from vllm.model_executor.model_loader.weight_utils import (
    multi_thread_safetensors_weights_iterator,
    safetensors_weights_iterator,
)

def rss_file() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no RssFile in /proc/self/status")

path, mode = sys.argv[1], sys.argv[2]
held, copied = [], 0
before, start = rss_file(), time.perf_counter()
iterator = (multi_thread_safetensors_weights_iterator if mode.startswith("multithread")
            else safetensors_weights_iterator)
for i, (name, tensor) in enumerate(iterator([path], use_tqdm_on_load=False)):
    held.append(tensor)  # keep every view alive: what is mapped stays counted
    part = {"tp8-rows": lambda t: t.narrow(0, 0, t.shape[0] // 8),
            "tp8-cols": lambda t: t.narrow(1, 0, t.shape[1] // 8),
            "ep16": lambda t: t if i % 16 == 0 else None,
            "full": lambda t: t}.get(mode, lambda t: None)(tensor)
    if part is not None:
        torch.empty_like(part).copy_(part)
        copied += part.nbytes
seconds = time.perf_counter() - start
print(json.dumps({"mode": mode, "copied_gb": copied / 1e9, "mapped_gb": (rss_file() - before) / 1e9,
                  "seconds": seconds}))
'''


def write_shard(path: Path, file_gb: float) -> int:
    """A safetensors file written by hand (header, then one random block repeated): no numpy needed."""
    size = ROWS * COLS * 2
    count = max(16, round(file_gb * 1e9 / size))
    header = {f"model.layers.0.mlp.experts.{i}.w1.weight": {
        "dtype": "BF16", "shape": [ROWS, COLS], "data_offsets": [i * size, (i + 1) * size]} for i in range(count)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    block = os.urandom(size)
    with open(path, "wb") as handle:
        handle.write(len(raw).to_bytes(8, "little") + raw)
        for _ in range(count):
            handle.write(block)
    return count * size


def warm(path: Path) -> None:
    with open(path, "rb", buffering=0) as handle:
        while handle.read(8 << 20):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--file-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help=f"a comma-separated subset of {', '.join(MODES)}")
    args = parser.parse_args()
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that has vLLM 0.33.0 installed (VLLM_TARGET_DEVICE=cpu is set "
              "for it)", file=sys.stderr)
        return 2
    unknown = sorted(set(args.modes.split(",")) - set(MODES))
    if unknown:
        print(f"--modes {args.modes}: no such consumer {', '.join(unknown)}; give a subset of {', '.join(MODES)}",
              file=sys.stderr)
        return 2
    if args.runs < 5:
        print(f"--runs {args.runs}: give at least 5 (a median of fewer says little)", file=sys.stderr)
        return 2
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="loader-reads-") as work:
        path = Path(work) / "model-00001-of-00001.safetensors"
        file_gb = write_shard(path, args.file_gb) / 1e9
        rows = []
        for mode in args.modes.split(","):
            runs = []
            for _ in range(args.runs):
                warm(path)
                done = subprocess.run([python, "-W", "ignore", "-c", CONSUMER, str(path), mode], env=env,
                                      capture_output=True, text=True, timeout=600, check=False)
                line = next((x for x in done.stdout.splitlines() if x.startswith("{")), None)
                if line is None:
                    print(f"{mode}: no result: {done.stderr[-1500:]}", file=sys.stderr)
                    return 1
                runs.append(json.loads(line))
                print(json.dumps({**runs[-1], "file_gb": file_gb}))
            rate = [r["copied_gb"] / r["seconds"] for r in runs if r["copied_gb"]]
            rows.append(f"| {mode} | {file_gb:.2f} | {statistics.median(r['copied_gb'] for r in runs):.2f} | "
                        f"{statistics.median(r['mapped_gb'] for r in runs):.2f} | "
                        + (f"{statistics.median(rate):.2f} |" if rate else "– |"))
    print("\n| consumer | file GB | copied GB | file GB mapped (RssFile) | copy GB/s (median) |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
