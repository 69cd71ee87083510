"""All-reduce across every node before serving: bus bandwidth per message size and the transport NCCL chose.

Run one of these per node, inside the stack's image, with exactly that node's rendered NCCL/Gloo environment
(`stacks/planner/fabric.py`, `node_env`). Each starts one process per GPU (`--procs-per-node`; forked, because the
script arrives on stdin and a spawned child could not re-import it) and all of them join one
`torch.distributed` group through a TCPStore on node rank 0: `--master-addr` is node rank 0's control IP and
`--master-port` (29700 by default, distinct from vLLM's 29500+ and the DP RPC port) is opened on that address
only (a socket bound to it and handed over as `master_listen_fd`), so the store is an internal listener and
not one on every interface. Gloo and NCCL open their own listeners on the interfaces their env names.

Before the group forms, every node puts a fingerprint of what its all-reduces depend on (`MUST_AGREE`:
--nnodes, --procs-per-node, --backend, --sizes, --warmup, --iters, the dtype) in the store; node rank 0
compares each with its own as they arrive and every rank reads the outcome, so nodes started with different
arguments fail at once, naming the flags and values, instead of in a dead rank or a send timeout; so does a
node rank claimed twice.

Per message size: warm-up all-reduces, then `--iters` timed ones; the time of a size is the slowest rank's
mean (the max over ranks, so one slow node is not averaged away). Bandwidth as nccl-tests defines it for
all-reduce (nccl-tests `doc/PERFORMANCE.md`): algbw = bytes / time, busbw = algbw * 2(n-1)/n, n = processes.
Every size is also checked for the right sum. The verdict compares the best busbw over the sizes with the
minimum (`--min-busbw-gbps`, gigabits per second, default per transport, below): it fails with every size's
numbers as evidence. With NCCL, `NCCL_DEBUG=INFO` is set for the run if the env has a quieter level (the level
changes what NCCL prints, not what it picks) and `NCCL_DEBUG_FILE` collects each process's lines, which
`checks.nccl_transport.classify` reads per process (NCCL's `host:pid` line prefix): a socket fallback or a
missing GPU Direct RDMA in any one process fails the check too, naming its rank, and so does a rank that logged
nothing.

With NCCL the check refuses to run (exit 2) while any GPU holds more than `--max-gpu-used-mib` of memory: a
serving group owns them, and measuring beside it would measure neither.

With `--rehearsal` (a stack that declares no GPUs, docs/rehearsal.md) the check runs with gloo on CPU, one process
per node, and says on its line that NCCL on GPUs was not run (`NOT RUN nccl: …`); `--backend nccl` is refused then.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import queue
import re
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from checks.nccl_transport import by_process, classify
from checks.verdict import (
    REHEARSAL,
    CheckParser,
    Verdict,
    check_name,
    count,
    emit,
    integer,
    number,
    port,
    seconds,
    unicast_ip,
)
from stacks.model.busbw import MIN_BUSBW_GBPS_RANGE

DEFAULT_MASTER_PORT = 29700
DEFAULT_SIZES = "1M,4M,16M,64M,256M"
DEFAULT_MIN_BUSBW_GBPS = {"socket": 5.0, "roce": 50.0, "ib": 100.0}
"""Floors in Gb/s of all-reduce busbw, meant to catch a broken fabric, not a 10 % regression:
socket: 5 — any data-centre NIC is 10 GbE or more (busbw reaches ~80-90 % of the line rate); below 5 the
  path is a 1 GbE link, a wrong interface or a congested route.
roce: 50 — half of one 100 GbE port, the smallest RoCE NIC in use; NCCL's socket fallback on such a port
  reaches roughly a quarter of RDMA (brief: 4-5x slower), so a silent fallback lands below it.
ib: 100 — half of one HDR 200 Gb/s port, the smallest InfiniBand generation in GPU clusters today.
A stack with more or faster NICs sets `fabric.min_busbw_gbps` nearer its own line rate (2 x 400G RoCE per
node: ~700 Gb/s busbw is healthy; 400 catches a lost HCA)."""
SIZE = re.compile(r"^(\d+)([KMG]?)$", re.I)
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_SIZE = 8 << 30
DTYPE_BYTES = 4  # float32, nccl-tests' default for all_reduce_perf


ARGS_KEY = "vllm-cluster/collective/args/"
"""Store keys of the argument check: `arrivals` (a counter), `arrival/<n>` (the n-th node's rank and
fingerprint), `verdict` (the head's answer)."""
MUST_AGREE = ("--nnodes", "--procs-per-node", "--backend", "--sizes", "--warmup", "--iters", "dtype")
"""What every node's all-reduces depend on: a difference hangs or kills a rank instead of failing cleanly."""


MAX_NODES = 4096
"""More nodes than any stack plans; a bound on the rendezvous."""


class BadArgument(Exception):
    pass


class Mismatch(Exception):
    """The nodes were started with different arguments (MUST_AGREE)."""


def short_size(size: int) -> str:
    """As `--sizes` takes it: 1M, 64K, 1G, else bytes."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def fingerprint(args: argparse.Namespace, sizes: list[int]) -> dict[str, str]:
    """The arguments every node must share, as the flags read (MUST_AGREE)."""
    values = [args.nnodes, args.procs_per_node, args.backend, ",".join(short_size(s) for s in sizes), args.warmup,
              args.iters, "float32"]
    return dict(zip(MUST_AGREE, (str(v) for v in values), strict=True))


def compare_fingerprints(head: dict[str, str], node_rank: int, theirs: dict[str, str]) -> str:
    """'' when node `node_rank` runs what the head runs, else what differs, flag by flag."""
    differ = [key for key in MUST_AGREE if theirs.get(key) != head.get(key)]
    if not differ:
        return ""
    def show(values: dict[str, str]) -> str:
        return " ".join(f"{key} {values.get(key, '(not sent)')}" for key in differ)
    return f"node rank {node_rank} runs {show(theirs)} where node rank 0 runs {show(head)}"


def _agree(store: Any, args: argparse.Namespace, sizes: list[int], local_rank: int) -> None:
    """Before the group forms: every node's local rank 0 adds its node rank and fingerprint to the store in
    order of arrival; the head's compares each with its own as it arrives and publishes the first difference
    (or a node rank claimed twice, or the node ranks still missing near `--timeout-s`), which every rank reads.
    Raises Mismatch, or RuntimeError for nodes that never came."""
    mine = fingerprint(args, sizes)
    if local_rank == 0:
        slot = store.add(f"{ARGS_KEY}arrivals", 1)
        store.set(f"{ARGS_KEY}arrival/{slot}", json.dumps({"node_rank": args.node_rank, **mine}))
    if args.node_rank == 0 and local_rank == 0:
        deadline = time.monotonic() + 0.9 * args.timeout_s  # before the other ranks' wait for the verdict ends
        seen: set[int] = set()
        outcome = {"mismatch": "", "missing": ""}
        while len(seen) < args.nnodes and not outcome["mismatch"]:
            key = f"{ARGS_KEY}arrival/{len(seen) + 1}"
            if store.check([key]):
                theirs = json.loads(store.get(key))
                node = theirs.pop("node_rank")
                outcome["mismatch"] = (compare_fingerprints(mine, node, theirs) or
                                       (f"two nodes run --node-rank {node}: each node needs its own, 0 to "
                                        f"{args.nnodes - 1}" if node in seen else ""))
                seen.add(node)
            elif time.monotonic() > deadline:
                missing = ", ".join(str(n) for n in range(args.nnodes) if n not in seen)
                outcome["missing"] = (f"node rank(s) {missing} did not join the rendezvous within --timeout-s "
                                      f"{args.timeout_s:g} (at {args.master_addr}:{args.master_port})")
                break
            else:
                time.sleep(0.2)
        store.set(f"{ARGS_KEY}verdict", json.dumps(outcome))
        if outcome["mismatch"] or outcome["missing"]:
            _await_readers(store, args)
    else:
        outcome = json.loads(store.get(f"{ARGS_KEY}verdict"))
        store.add(f"{ARGS_KEY}read", 1)
    if outcome["mismatch"]:
        raise Mismatch(outcome["mismatch"])
    if outcome["missing"]:
        raise RuntimeError(outcome["missing"])


def _await_readers(store: Any, args: argparse.Namespace, deadline_s: float = 30.0) -> None:
    """On a failed agreement the head's process ends at once, and the store it hosts goes with it: a rank that has
    not fetched the verdict yet (a loaded node that arrived late) would read "connection closed" instead of the
    difference. So the head waits, up to `deadline_s`, for every rank of the nodes that arrived to have read it."""
    arrived = store.add(f"{ARGS_KEY}arrivals", 0)
    expected = arrived * args.procs_per_node - 1
    deadline = time.monotonic() + min(deadline_s, max(1.0, 0.1 * args.timeout_s))
    while store.add(f"{ARGS_KEY}read", 0) < expected and time.monotonic() < deadline:
        time.sleep(0.05)


def parse_sizes(text: str) -> list[int]:
    """`1M,4M,16M` -> bytes (K/M/G are powers of 1024, as nccl-tests reads -b/-e), ascending, each a whole
    number of float32 elements."""
    sizes: set[int] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = SIZE.match(part)
        if not m:
            raise BadArgument(f"--sizes {text!r}: {part!r} is not a size like 64K, 16M or 1G")
        size = int(m.group(1)) * UNITS[m.group(2).upper()]
        if not DTYPE_BYTES <= size <= MAX_SIZE or size % DTYPE_BYTES:
            raise BadArgument(f"--sizes {text!r}: {part!r} must be a multiple of 4 bytes from 4 to 8G")
        sizes.add(size)
    if not sizes or len(sizes) > 16:
        raise BadArgument(f"--sizes {text!r}: give 1 to 16 sizes, e.g. {DEFAULT_SIZES}")
    return sorted(sizes)


def human_size(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def bus_bandwidth(size: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) for an all-reduce of `size` bytes over `ranks` processes."""
    algbw = size / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def gpu_usage() -> tuple[list[tuple[int, int]] | None, str]:
    """[(index, MiB used)] from nvidia-smi, or None with the reason it could not be read."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi: {exc}"
    if done.returncode != 0:
        return None, f"nvidia-smi exit {done.returncode}: {done.stderr.strip()[:200]}"
    rows = []
    for line in done.stdout.strip().splitlines():
        index, used = (part.strip() for part in line.split(",")[:2])
        rows.append((int(index), int(float(used))))
    return rows, ""


def transport_section(text: str, backend: str, transport: str, require_gdr: bool,
                      ranks: Mapping[int, int] | None = None) -> tuple[bool, str, list[str]]:
    """(ok, what was used, evidence) from the NCCL INFO lines the processes wrote, reusing nccl_transport.

    Each process is judged on its own lines (`nccl_transport.by_process`: NCCL's `host:pid` prefix), so one
    process on RDMA cannot excuse another that fell back to sockets: any one that fails fails the section, and
    is named. `ranks` (pid -> global rank) names the ranks, and a rank that logged nothing fails too."""
    if backend == "gloo":
        return True, f"gloo TCP over GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME', '(unset)')}", []
    processes = by_process(text)
    if not processes and not ranks:
        processes = {"(no process)": text}  # judged as one: "NCCL network not logged" and classify's reason
    results: list[tuple[str, bool, str, list[str]]] = []  # (label, ok, used, evidence) per process
    for key, lines in processes.items():
        network = re.findall(r"NCCL INFO Using network (\w+)", lines)
        used = f"NCCL network {network[0]}" if network else "NCCL network not logged"
        if transport == "socket":
            ok = bool(network) and network[0] == "Socket"
            results.append((_process_label(key, lines, ranks), ok, used,
                            [] if ok else [f"fabric.transport is socket but {used}"]))
            continue
        verdict = classify(lines, transport, require_gdr, "transport")
        results.append((_process_label(key, lines, ranks), verdict.status == "pass", f"{used}: {verdict.summary}",
                        verdict.evidence))
    logged = {int(key.rsplit(":", 1)[1]) for key in processes if re.fullmatch(r"[^\s:]+:\d+", key)}
    for pid, rank in sorted((ranks or {}).items(), key=lambda item: item[1]):
        if pid not in logged:
            results.append((f"rank {rank} (pid {pid})", False, "no NCCL INFO lines, so the transport is unknown", []))
    if len(results) == 1:
        _, ok, used, evidence = results[0]
        return ok, used, evidence
    groups: dict[tuple[bool, str], list[str]] = {}
    for label, ok, used, _ in results:
        groups.setdefault((ok, used), []).append(label)
    ok = all(ok for ok, _ in groups)
    if len(groups) == 1:
        ((_, used),) = groups
        return ok, f"{used} (all {len(results)} processes)", [f"{results[0][0]}: {e}" for e in results[0][3]]
    parts = [f"{_labels(labels)}: {used}" for (good, used), labels in sorted(groups.items(), key=lambda g: g[0][0])]
    shown = [r for r in results if not r[1]][:3] if not ok else results[:1]
    return ok, "; ".join(parts), [f"{label}: {e}" for label, _, _, evidence in shown for e in evidence]


def _process_label(key: str, lines: str, ranks: Mapping[int, int] | None) -> str:
    """`rank R (host:pid)` where the rank is known (from `ranks`, else the one rank NCCL logged), else the key."""
    pid = key.rsplit(":", 1)[-1]
    if ranks and pid.isdigit() and int(pid) in ranks:
        return f"rank {ranks[int(pid)]} ({key})"
    logged = set(re.findall(r" rank (\d+) nranks ", lines))
    return f"rank {logged.pop()} ({key})" if len(logged) == 1 else f"process {key}"


def _labels(labels: list[str], most: int = 8) -> str:
    return ", ".join(labels[:most]) + (f" and {len(labels) - most} more" if len(labels) > most else "")


def _worker(local_rank: int, args: argparse.Namespace, sizes: list[int], results: Any,
            inherited_fd: int | None) -> None:
    """One rank: join the group through the store, check and time every size, report to the node process."""
    if inherited_fd is not None:
        os.close(inherited_fd)  # the store's socket belongs to the node process
    rank = args.node_rank * args.procs_per_node + local_rank
    world = args.nnodes * args.procs_per_node
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            import torch.distributed as dist
        timeout = timedelta(seconds=args.timeout_s)
        if args.backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            torch.set_num_threads(1)
            device = torch.device("cpu")
        store = dist.TCPStore(  # type: ignore[attr-defined]  # public API, not re-exported in the stubs
            args.master_addr, args.master_port, is_master=False, timeout=timeout)
        _agree(store, args, sizes, local_rank)
        dist.init_process_group(args.backend, store=store, rank=rank, world_size=world, timeout=timeout,
                                device_id=device if args.backend == "nccl" else None)

        def sync() -> None:
            if args.backend == "nccl":
                torch.cuda.synchronize(device)

        rows = []
        for size in sizes:
            buffer = torch.full((size // DTYPE_BYTES,), float(rank + 1), dtype=torch.float32, device=device)
            dist.all_reduce(buffer)
            sync()
            correct = bool(torch.all(buffer == world * (world + 1) / 2).item())
            buffer.zero_()
            for _ in range(args.warmup):
                dist.all_reduce(buffer)
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(buffer)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64,
                                   device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            rows.append({"bytes": size, "time_s": float(elapsed.item()), "correct": correct})
        dist.destroy_process_group()
        results.put({"local_rank": local_rank, "rows": rows})
    except Mismatch as exc:
        results.put({"local_rank": local_rank, "mismatch": str(exc)})
    except Exception as exc:  # reported as evidence by the node process
        results.put({"local_rank": local_rank, "error": f"{type(exc).__name__}: {exc}"[:400]})


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(128)
    return sock


def run(args: argparse.Namespace, sizes: list[int]) -> Verdict:
    """Everything after argument checks: the guard, the rendezvous, the ranks, and the verdict."""
    name, world = args.name, args.nnodes * args.procs_per_node
    minimum = args.min_busbw_gbps if args.min_busbw_gbps is not None else DEFAULT_MIN_BUSBW_GBPS[args.transport]
    source = "fabric.min_busbw_gbps" if args.min_busbw_gbps is not None else f"default for {args.transport}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns when NumPy is missing; it is not used here
            import torch.distributed as dist
    except ImportError as exc:
        return Verdict(name, "cannot-run", f"torch is not importable here: {exc}", [],
                       "run the check inside the stack's image (it ships torch)")
    notes: list[str] = []
    if args.backend == "nccl":
        usage, why = gpu_usage()
        if usage is None:
            notes.append(f"GPU idle check skipped ({why})")
        else:
            busy = [f"GPU {i} {mib} MiB" for i, mib in usage if mib > args.max_gpu_used_mib]
            if busy:
                return Verdict(name, "cannot-run", "the GPUs are in use: the collective check runs only while no "
                               "serving group holds them", busy,
                               "run it before the engines start or after they are removed (`docker ps`)")
            if len(usage) < args.procs_per_node:
                return Verdict(name, "cannot-run", f"{len(usage)} GPU(s) visible, --procs-per-node "
                               f"{args.procs_per_node}", [], "give the container every GPU (--gpus all)")
        if os.environ.get("NCCL_DEBUG") not in ("INFO", "TRACE"):
            os.environ["NCCL_DEBUG"] = "INFO"
    store_available = dist.is_available() and (dist.is_nccl_available() if args.backend == "nccl"
                                               else dist.is_gloo_available())
    if not store_available:
        return Verdict(name, "cannot-run", f"this torch has no {args.backend} backend", [],
                       "run the check inside the stack's image")
    logs = tempfile.mkdtemp(prefix="vllm-cluster-collective-")
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(logs, "nccl.%h.%p.log")
    listener: socket.socket | None = None
    if args.node_rank == 0:
        try:
            listener = _listen(args.master_addr, args.master_port)
        except OSError as exc:
            shutil.rmtree(logs, ignore_errors=True)
            return Verdict(name, "cannot-run", f"cannot listen on {args.master_addr}:{args.master_port}: "
                           f"{exc.strerror}", [], "--master-addr must be this node's (node rank 0's) control IP "
                           "and the port free: is an engine group still running?")
    context = multiprocessing.get_context("fork")  # the script may come from stdin: spawn could not import it
    results = context.Queue()
    procs = [context.Process(target=_worker, args=(i, args, sizes, results,
                                                   listener.fileno() if listener else None), daemon=True)
             for i in range(args.procs_per_node)]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    store = None
    if listener is not None:  # the store's server owns the socket from here on and closes it
        store = dist.TCPStore(  # type: ignore[attr-defined]  # public API, not re-exported in the stubs
            args.master_addr, args.master_port, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=args.timeout_s), master_listen_fd=listener.detach())
    reports: dict[int, dict[str, Any]] = {}
    deadline = started + args.timeout_s + 30
    while len(reports) < len(procs) and time.monotonic() < deadline:
        try:
            report = results.get(timeout=1)
            reports[report["local_rank"]] = report
        except queue.Empty:
            dead = [p for i, p in enumerate(procs) if i not in reports and p.exitcode not in (None, 0)]
            if dead:
                for i, p in enumerate(procs):
                    if i not in reports and p.exitcode not in (None, 0):
                        reports[i] = {"local_rank": i, "error": f"process died with exit code {p.exitcode}"}
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    del store
    elapsed = time.monotonic() - started
    texts = []
    for path in sorted(glob.glob(os.path.join(logs, "nccl.*"))):  # one file per process (nccl.%h.%p.log)
        with open(path, encoding="utf-8", errors="replace") as handle:
            texts.append(handle.read())
    text = "\n".join(texts)
    ranks = {p.pid: args.node_rank * args.procs_per_node + i for i, p in enumerate(procs) if p.pid is not None}
    shutil.rmtree(logs, ignore_errors=True)
    shape = f"{args.nnodes} node(s) x {args.procs_per_node} process(es) = {world} ranks, {args.backend}"
    details: dict[str, Any] = {"node_rank": args.node_rank, "nnodes": args.nnodes, "world_size": world,
                               "backend": args.backend, "transport_declared": args.transport,
                               "min_busbw_gbps": minimum, "min_source": source, "seconds": round(elapsed, 1)}
    mismatch = sorted({r["mismatch"] for r in reports.values() if "mismatch" in r})
    if mismatch:
        return Verdict(name, "fail", f"the nodes run the check with different arguments: {mismatch[0]}",
                       [f"this node runs {' '.join(f'{k} {v}' for k, v in fingerprint(args, sizes).items())}"],
                       "start every node's command as the plan builds it (components/collective_check.py): all nodes "
                       "must agree on " + ", ".join(MUST_AGREE[:-2]) + f" and {MUST_AGREE[-2]}", details)
    errors = [f"local rank {r['local_rank']}: {r['error']}" for r in reports.values() if "error" in r]
    missing = [i for i in range(len(procs)) if i not in reports]
    if errors or missing:
        failures = errors + [f"local rank {i}: no report after {args.timeout_s + 30:.0f}s" for i in missing]
        return Verdict(name, "fail", f"the all-reduce over {shape} did not complete", failures + notes,
                       f"every node must run this check at the same time; node rank 0 listens on "
                       f"{args.master_addr}:{args.master_port}: check that address and port are reachable from "
                       "every node (firewall, control_plane network) and the NCCL/Gloo interface names",
                       details)
    rows = reports[0]["rows"]
    evidence: list[str] = []
    peak = 0.0
    for row in rows:
        algbw, busbw = bus_bandwidth(row["bytes"], row["time_s"], world)
        row.update(algbw_gbs=round(algbw, 3), busbw_gbs=round(busbw, 3), busbw_gbps=round(busbw * 8, 3))
        peak = max(peak, busbw * 8)
        evidence.append(f"{human_size(row['bytes'])}: busbw {busbw * 8:.2f} Gb/s ({busbw:.3f} GB/s), "
                        f"{row['time_s'] * 1e3:.2f} ms" + ("" if row["correct"] else ", WRONG SUM"))
    details["sizes"] = rows
    details["peak_busbw_gbps"] = round(peak, 3)
    ok_transport, used, transport_evidence = transport_section(text, args.backend, args.transport,
                                                               args.require_gdr, ranks)
    details["transport"] = {"ok": ok_transport, "used": used, "evidence": transport_evidence}
    evidence.append(f"transport: {used}")
    evidence += transport_evidence + notes
    wrong = [human_size(r["bytes"]) for r in rows if not r["correct"]]
    if wrong:
        return Verdict(name, "fail", f"the all-reduce over {shape} returned wrong sums at {', '.join(wrong)}",
                       evidence, "a rank computes or receives corrupt data: run the GPU and HCA checks "
                       "(preflight), then this check per pair of nodes", details)
    if not ok_transport:
        return Verdict(name, "fail", f"the all-reduce over {shape} ran, but not over the declared "
                       f"{args.transport} transport: {used}", evidence,
                       "check /dev/infiniband in the container, NCCL_IB_HCA and the HCA port state (preflight "
                       "fabric sections)", details)
    summary = (f"all-reduce over {shape}: peak busbw {peak:.2f} Gb/s "
               f"{'>=' if peak >= minimum else 'below the'} minimum {minimum:g} Gb/s ({source})")
    if peak < minimum:
        return Verdict(name, "fail", summary, evidence,
                       "the fabric carries collectives slower than it must: look for a socket fallback, a link "
                       "negotiated down (`ethtool`, `ibstat`), a wrong NCCL_SOCKET_IFNAME/NCCL_IB_HCA, or "
                       "traffic shaping; lower fabric.min_busbw_gbps only if the hardware really is slower",
                       details)
    return Verdict(name, "pass", summary, evidence, None, details)


def build_parser() -> argparse.ArgumentParser:
    p = CheckParser(prog="collective", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="collective", type=check_name)
    p.add_argument("--nnodes", type=count(MAX_NODES), required=True, help="nodes taking part (one check process each)")
    p.add_argument("--node-rank", type=integer(0, MAX_NODES - 1), required=True,
                   help="this node's index; 0 hosts the rendezvous")
    p.add_argument("--master-addr", required=True, type=unicast_ip,
                   help="node rank 0's control IP (VLLM_HOST_IP there)")
    p.add_argument("--master-port", type=port, default=DEFAULT_MASTER_PORT)
    p.add_argument("--procs-per-node", type=integer(1, 64), default=1,
                   help="processes on this node: one per GPU for nccl")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--transport", choices=sorted(DEFAULT_MIN_BUSBW_GBPS), default="roce",
                   help="fabric.transport: the default minimum and what NCCL must use")
    low, high = MIN_BUSBW_GBPS_RANGE
    p.add_argument("--min-busbw-gbps", type=number(low, high, " Gb/s", low_open=False), default=None,
                   help=f"fail below this busbw, Gb/s, {low:g} to {high:g} (default per transport: "
                        + ", ".join(f"{k} {v:g}" for k, v in sorted(DEFAULT_MIN_BUSBW_GBPS.items())) + ")")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes, bytes with K/M/G (powers of 1024)")
    p.add_argument("--warmup", type=integer(0, 1000), default=5)
    p.add_argument("--iters", type=integer(1, 10_000), default=20)
    p.add_argument("--timeout-s", type=seconds(86_400), default=600.0, help="rendezvous and run, per process")
    p.add_argument("--no-require-gdr", dest="require_gdr", action="store_false")
    p.add_argument("--max-gpu-used-mib", type=integer(0, 10**7), default=2048, help="nccl: GPUs above this are busy")
    p.add_argument("--rehearsal", action="store_true", help="the stack declares no GPUs (vllm-cluster:rehearsal): "
                   "gloo on CPU only, and the line says NCCL was not run")
    p.add_argument("--json", action="store_true")
    return p


def rehearsal_note(transport: str) -> str:
    """What a rehearsal's line adds: the GPU part of the check, named as not run."""
    return (f"NOT RUN nccl: {REHEARSAL}: the all-reduce ran with gloo on CPU, not with NCCL on GPUs over "
            f"fabric.transport {transport}, so the bandwidth is the CPUs' and the network's, not the fabric's")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        if not args.node_rank < args.nnodes:
            raise BadArgument(f"--node-rank {args.node_rank}: 0 to --nnodes - 1 ({args.nnodes - 1})")
        if args.nnodes * args.procs_per_node < 2:
            raise BadArgument(f"--nnodes {args.nnodes} x --procs-per-node {args.procs_per_node}: a collective over "
                              "one process proves nothing; at least 2")
        if args.rehearsal and args.backend != "gloo":
            raise BadArgument(f"--rehearsal with --backend {args.backend}: a stack without GPUs runs --backend gloo")
    except BadArgument as exc:
        return emit(Verdict(args.name, "cannot-run", f"bad argument: {exc}"), args.json)
    verdict = run(args, sizes)
    if args.rehearsal:
        verdict.summary += f"; {rehearsal_note(args.transport)}"
    return emit(verdict, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
