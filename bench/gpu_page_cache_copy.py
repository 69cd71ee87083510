"""From a warm page cache to a GPU, the way vLLM 0.33.0's default loader moves a weight: `safe_open(framework="pt")`,
`get_tensor(name)` (a view of the file's mmap: model_executor/model_loader/weight_utils.py:1243-1249), then the
weight loader's `param.data.copy_(loaded_weight)` into the GPU parameter. Measures, on a machine with a CUDA GPU,
what the outage model's page-cache phase rests on (docs/speed.md#outage-figures):

- `every byte`: one rank copies every tensor of the shards (GB/s per rank, no other rank beside it);
- `one in 16`: one rank copies every 16th tensor and only iterates the rest (a rank's experts under EP16): the
  seconds should follow the bytes copied, not the file;
- `iterate only`: names and `get_tensor` views, nothing copied: the per-tensor cost of walking a checkpoint;
- `8 ranks`: 8 processes at once, each copying its eighth of the tensors into the one GPU (8 ranks sharing one
  host's memory and page cache, as on a prod node; here they also share one GPU's PCIe link, so this rate is a
  floor for a host with a GPU per rank).

    python3 bench/gpu_page_cache_copy.py --dir /dev/shm/pcc --gb 16 --out result.json

Needs torch with CUDA and safetensors; vLLM itself is not needed (the iterator's per-tensor call is safetensors').
Files are written to --dir and read once before any timing (warm page cache; /dev/shm is memory, as tmpfs was in
the cited run)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

TENSOR_MB = 64
"""A large weight (a 64 MiB bf16 matrix, e.g. one expert's projection)."""
SMALL_PER_SHARD = 2000
"""Small tensors per shard (norms, scales, biases: 4 KiB each), for the per-tensor cost."""


def write_shards(root: Path, gb: float, shards: int) -> list[Path]:
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    per_shard = max(1, int(gb * 1e9 / shards / (TENSOR_MB << 20)))
    paths = []
    for s in range(shards):
        tensors = {f"model.layers.{s}.big.{i}.weight": torch.randn(TENSOR_MB << 19, dtype=torch.bfloat16)
                   .view(4096, -1) for i in range(per_shard)}
        tensors |= {f"model.layers.{s}.small.{i}.weight": torch.zeros(2048, dtype=torch.bfloat16)
                    for i in range(SMALL_PER_SHARD)}
        path = root / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(path))
        paths.append(path)
    return paths


def warm(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def load(paths: list[str], copy_every: int, offset: int, device: str) -> dict[str, float]:
    """One rank's pass: iterate every tensor of every shard, copy every `copy_every`-th (from `offset`) to the GPU
    (0: copy none)."""
    import torch
    from safetensors import safe_open

    buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
    copied = 0
    tensors = 0
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    for path in paths:
        with safe_open(path, framework="pt") as f:
            for i, name in enumerate(f.keys()):
                view = f.get_tensor(name)
                tensors += 1
                if copy_every and i % copy_every == offset:
                    key = (tuple(view.shape), view.dtype)
                    if key not in buffers:
                        buffers[key] = torch.empty(view.shape, dtype=view.dtype, device=device)
                    buffers[key].copy_(view)
                    copied += view.numel() * view.element_size()
    torch.cuda.synchronize(device)
    return {"seconds": time.perf_counter() - began, "copied_gb": copied / 1e9, "tensors": tensors}


def _rank(args: tuple[list[str], int, int, Any]) -> None:
    paths, every, offset, queue = args
    queue.put(load(paths, every, offset, "cuda:0"))


def eight_ranks(paths: list[str], ranks: int = 8) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=((paths, ranks, r, queue),)) for r in range(ranks)]
    began = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.perf_counter() - began
    slowest = max(r["seconds"] for r in results)
    share = statistics.mean(r["copied_gb"] for r in results)
    return {"ranks": ranks, "wall_s": wall, "slowest_rank_s": slowest, "gb_per_rank": share,
            "per_rank_gb_per_s": share / slowest, "host_gb_per_s": sum(r["copied_gb"] for r in results) / slowest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/dev/shm/gpu-page-cache-copy")
    parser.add_argument("--gb", type=float, default=16.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    import torch

    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "cpus": os.cpu_count()}
    made = time.perf_counter()
    paths = write_shards(Path(args.dir), args.gb, args.shards)
    out["write_s"] = time.perf_counter() - made
    out["file_gb"] = sum(p.stat().st_size for p in paths) / 1e9
    warm(paths)
    names = [str(p) for p in paths]
    load(names[:1], 1, 0, "cuda:0")  # CUDA context and allocator warm-up, not timed
    rows: dict[str, list[dict[str, float]]] = {"every byte": [], "one in 16": [], "iterate only": []}
    for _ in range(args.runs):
        rows["every byte"].append(load(names, 1, 0, "cuda:0"))
        rows["one in 16"].append(load(names, 16, 0, "cuda:0"))
        rows["iterate only"].append(load(names, 0, 0, "cuda:0"))
    out["rows"] = rows
    out["summary"] = {
        name: {"median_s": statistics.median(r["seconds"] for r in runs),
               "copied_gb": runs[0]["copied_gb"], "tensors": runs[0]["tensors"],
               "gb_per_s": (runs[0]["copied_gb"] / statistics.median(r["seconds"] for r in runs)
                            if runs[0]["copied_gb"] else None),
               "us_per_tensor": statistics.median(r["seconds"] for r in runs) / runs[0]["tensors"] * 1e6}
        for name, runs in rows.items()}
    out["8 ranks"] = [eight_ranks(names) for _ in range(args.runs)]
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    for p in paths:
        p.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
