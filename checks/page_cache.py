"""`page-cache-<node>`: before any engine stops, read the shards this node's ranks will load into the page cache,
so that after the stop each rank reads memory, not disk (the staged change, docs/what-a-change-costs.md).

What a rank reads is vLLM 0.33.0's (model_executor/model_loader/weight_utils.py:1240-1248): every tensor of every
shard, or with `--enable-ep-weight-filter` every tensor but the other ranks' per-expert `.weight` tensors
(ep_weight_filter.py `should_skip_weight`, `compute_local_expert_ids` with the linear placement). `--experts
N:EP:FIRST-LAST` names the expert count, the EP size and this node's EP ranks; without it every byte of every shard.

Bounded by what the host can spare without starving the running engine: `MemAvailable` less the pinned host memory
(VmPin + VmLck of /proc/<pid>/status) of the running engine containers' processes (`--engine`, by container
name). What does not fit is not read; the verdict names how much was warmed and what was not. A missing index or
shard, or a shard shorter than its header says, FAILS: the update stops before any engine moves.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
from pathlib import Path

from checks.verdict import CheckParser, Verdict, check_name, container_name, emit, path

READ_CHUNK = 8 << 20
EXPERT_ID = re.compile(r"\.experts\.(\d+)\.")
"""vLLM 0.33.0 ep_weight_filter.py `_EXPERT_ID_RE`."""


def local_experts(num: int, ep_size: int, ranks: range) -> set[int]:
    """The union of `compute_local_expert_ids(num, ep_size, r, "linear")` over this node's EP ranks."""
    base, rest = divmod(num, ep_size)
    out: set[int] = set()
    for rank in ranks:
        start = rank * base + min(rank, rest)
        out.update(range(start, start + base + (1 if rank < rest else 0)))
    return out


def skipped(name: str, experts: set[int] | None) -> bool:
    """vLLM 0.33.0 `should_skip_weight`: another rank's per-expert weight (never a scale)."""
    if experts is None:
        return False
    match = EXPERT_ID.search(name)
    if match is None or not name.endswith((".weight", ".weight_packed")):
        return False
    return int(match.group(1)) not in experts


def shard_ranges(path: Path, experts: set[int] | None) -> tuple[list[tuple[int, int]], int]:
    """Byte ranges of `path` this node's ranks read (header included), merged; and the file's expected length."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    start = 8 + size
    ranges = [(0, start)]
    end = start
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        end = max(end, start + hi)
        if not skipped(name, experts):
            ranges.append((start + lo, start + hi))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged, end


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def pinned_bytes(containers: list[str]) -> tuple[int, list[str]]:
    """VmPin + VmLck of every process in the named running containers (their init's process tree)."""
    roots: list[int] = []
    seen: list[str] = []
    for name in containers:
        done = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", name], capture_output=True, text=True)
        pid = done.stdout.strip()
        if done.returncode == 0 and pid.isdigit() and int(pid) > 0:
            roots.append(int(pid))
            seen.append(name)
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, list(roots)
    while todo:
        proc = todo.pop()
        todo += children.get(proc, [])
        try:
            status = Path(f"/proc/{proc}/status").read_text()
        except OSError:
            continue
        for key in ("VmPin:", "VmLck:"):
            found = re.search(rf"^{key}\s+(\d+) kB", status, re.M)
            total += int(found.group(1)) * 1024 if found else 0
    return total, seen


def warm(path: Path, ranges: list[tuple[int, int]], budget: int) -> int:
    """Read the ranges (up to `budget` bytes) once, keeping nothing: the kernel keeps them in the page cache."""
    done = 0
    buf = bytearray(READ_CHUNK)
    with open(path, "rb", buffering=0) as handle:
        for lo, hi in ranges:
            handle.seek(lo)
            left = min(hi - lo, budget - done)
            while left > 0:
                n = handle.readinto(memoryview(buf)[:min(left, READ_CHUNK)])
                if not n:
                    return done
                done += n
                left -= n
            if done >= budget:
                break
    return done


def gb(value: int) -> str:
    return f"{value / 1e9:.1f} GB"


def run(name: str, model_dir: Path, experts: set[int] | None, engines: list[str]) -> Verdict:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        return Verdict(name, "fail", f"{model_dir} holds no model.safetensors.index.json and no *.safetensors",
                       next_step="the weights step (weights-<node>) should have put them there: read its output")
    plan: list[tuple[Path, list[tuple[int, int]]]] = []
    for file in files:
        path = model_dir / file
        try:
            ranges, length = shard_ranges(path, experts)
            actual = path.stat().st_size
        except (OSError, ValueError, KeyError, struct.error) as exc:
            return Verdict(name, "fail", f"shard {file} unreadable: {exc}", next_step="re-run the weights step")
        if actual < length:
            return Verdict(name, "fail", f"shard {file} is {actual} bytes, its header needs {length}",
                           next_step="re-run the weights step (a partial copy)")
        plan.append((path, ranges))
    need = sum(hi - lo for _, ranges in plan for lo, hi in ranges)
    available = mem_available()
    pinned, running = pinned_bytes(engines)
    budget = max(0, available - pinned)
    warmed, cold = 0, []
    for path, ranges in plan:
        size = sum(hi - lo for lo, hi in ranges)
        got = warm(path, ranges, budget - warmed) if warmed < budget else 0
        warmed += got
        if got < size:
            cold.append(path.name)
    which = "this node's ranks' tensors (EP weight filter)" if experts is not None else "every shard"
    evidence = [f"MemAvailable {gb(available)}", f"pinned by the running engine {gb(pinned)} "
                f"({', '.join(running) or 'no engine running'})", f"budget {gb(budget)}"]
    details = {"warmed_bytes": warmed, "needed_bytes": need, "files": len(files), "not_warmed": cold,
               "mem_available_bytes": available, "engine_pinned_bytes": pinned, "budget_bytes": budget}
    if cold:
        summary = (f"warmed {gb(warmed)} of {gb(need)} ({which}); not warmed: {len(cold)} of {len(files)} "
                   f"shard(s), from {cold[0]}: they load from disk")
    else:
        summary = f"warmed {gb(warmed)} of {gb(need)} ({which}), {len(files)} shard(s)"
    return Verdict(name, "pass", summary, evidence, details=details)


def experts_arg(value: str) -> tuple[int, int, range]:
    """`N:EP:FIRST-LAST`."""
    match = re.fullmatch(r"(\d+):(\d+):(\d+)-(\d+)", value)
    if not match:
        raise argparse.ArgumentTypeError(f"{value!r}: want NUM_EXPERTS:EP_SIZE:FIRST_RANK-LAST_RANK")
    num, ep, first, last = (int(g) for g in match.groups())
    if not (num > 0 and ep > 0 and first <= last < ep):
        raise argparse.ArgumentTypeError(f"{value!r}: ranks must lie in 0..EP_SIZE-1")
    return num, ep, range(first, last + 1)


def main(argv: list[str] | None = None) -> int:
    # no __doc__ here: the node runs this module pasted into a heredoc, behind checks.verdict
    parser = CheckParser(prog="page_cache", description="warm the page cache with the shards this node's ranks read")
    parser.add_argument("--name", type=check_name, default="page-cache")
    parser.add_argument("--model-dir", type=path, required=True)
    parser.add_argument("--experts", type=experts_arg, help="N:EP:FIRST-LAST, with the EP weight filter")
    parser.add_argument("--engine", type=container_name, action="append", default=[],
                        help="a running engine container's name")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    experts = local_experts(*args.experts) if args.experts else None
    return emit(run(args.name, Path(args.model_dir), experts, args.engine), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
