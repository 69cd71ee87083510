"""How fast a rank's safetensors shards reach the GPU from disk (cold page cache) and from a warm page cache.

    python3 bench/page_cache_load.py [--dir /var/tmp] [--files 8] [--file-gb 2] [--runs 3]

The outage model (stacks/planner/outage.py) needs the second figure: the staged change warms the page cache with
the shards a node's ranks will read, so after the stop each rank reads them from memory. This writes `--files`
safetensors files of `--file-gb` GB each (bf16 tensors of 256 MiB, random bytes), then per run:

- cold: `sync`, these files dropped from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`; the rest of the
  machine's page cache is left alone), then the load;
- warm-read: the staged step's warming, `checks/page_cache.py`'s way (8 MiB reads of every file, nothing kept);
- warm: the load again, now from the page cache.

"The load" is what vLLM 0.33.0's default loader does with a shard (model_executor/model_loader/weight_utils.py
`safetensors_weights_iterator`: `safe_open(..., framework="pt")`, `get_tensor` per name; the model's
`weight_loader` then copies each tensor into the GPU parameter): here `get_tensor` and `.to(device)` with a
synchronize at the end, one process. It needs torch and safetensors (the GPU machine's image has both); without a
GPU, `--device cpu` measures the host side alone. Prints one JSON line per run and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TENSOR_BYTES = 256 << 20
READ_CHUNK = 8 << 20


def write_shards(work: Path, files: int, file_gb: float) -> list[Path]:
    """Safetensors files written by hand (the header, then random bytes as bf16 tensors): no numpy needed."""
    per_file = max(1, int(file_gb * 1e9) // TENSOR_BYTES)
    block = os.urandom(TENSOR_BYTES)
    paths = []
    for i in range(files):
        names = [f"model.layers.{i}.mlp.experts.{j}.weight" for j in range(per_file)]
        header = {name: {"dtype": "BF16", "shape": [TENSOR_BYTES // 2],
                         "data_offsets": [j * TENSOR_BYTES, (j + 1) * TENSOR_BYTES]} for j, name in enumerate(names)}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        path = work / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with open(path, "wb") as handle:
            handle.write(len(raw).to_bytes(8, "little") + raw)
            for _ in names:
                handle.write(block)
        paths.append(path)
    return paths


def drop(paths: list[Path]) -> str:
    """Evict these files (only these: a shared machine keeps the rest of its page cache) from the page cache."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise(DONTNEED)"


def read_all(paths: list[Path]) -> int:
    total = 0
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while True:
                n = handle.readinto(view)
                if not n:
                    break
                total += n
    return total


def load(paths: list[Path], device: str) -> int:
    import torch
    from safetensors import safe_open

    total = 0
    for path in paths:
        with safe_open(str(path), framework="pt") as shard:
            for name in shard.keys():  # noqa: SIM118 (safe_open is no mapping)
                # a copy, as the weight_loader's `param.data.copy_` makes one: on the CPU `.to` would keep the mmap
                tensor = shard.get_tensor(name).to(device, copy=True)
                total += tensor.numel() * tensor.element_size()
                del tensor
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return total


def timed(fn: Any, *args: Any) -> tuple[int, float]:
    start = time.perf_counter()
    nbytes = fn(*args)
    return nbytes, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pcload-", dir=args.dir))
    rows: dict[str, list[float]] = {"cold": [], "warm-read": [], "warm": []}
    try:
        paths = write_shards(work, args.files, args.file_gb)
        for run in range(args.runs):
            how = drop(paths)
            cold_b, cold_s = timed(load, paths, args.device)
            drop(paths)
            read_b, read_s = timed(read_all, paths)
            warm_b, warm_s = timed(load, paths, args.device)
            for key, b, s in (("cold", cold_b, cold_s), ("warm-read", read_b, read_s), ("warm", warm_b, warm_s)):
                rows[key].append(b / s / 1e9)
            print(json.dumps({"run": run, "evicted_by": how, "bytes": cold_b, "cold_load_s": round(cold_s, 3),
                              "warm_read_s": round(read_s, 3), "warm_load_s": round(warm_s, 3)}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total_gb = args.files * max(1, int(args.file_gb * 1e9) // TENSOR_BYTES) * TENSOR_BYTES / 1e9
    print(f"{args.files} shards, {total_gb:.1f} GB, device {args.device}, {args.runs} runs, "
          f"{os.cpu_count()} CPUs")
    print("| step | GB/s per run | median GB/s |\n|---|---|---:|")
    labels = {"cold": "load, cold page cache (disk)", "warm-read": "warming: read every shard once (disk)",
              "warm": "load, warm page cache"}
    for key, rates in rows.items():
        print(f"| {labels[key]} | {', '.join(f'{r:.2f}' for r in rates)} | {statistics.median(rates):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
