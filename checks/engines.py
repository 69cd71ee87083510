"""Every DP engine joined: each expected rank's `EngineCore_DP<r>` process logged its KV cache, none died.

vLLM prefixes engine-core log lines with `(EngineCore_DP<rank> pid=N)` (`(EngineCore pid=N)` when DP is 1,
vllm/v1/engine/core.py:1476-1481); "GPU KV cache size" is logged once the engine has loaded weights and
profiled memory, just before it reports ready to the coordinator.

Where a replica spans nodes (`--workers N`), a node's own workers are the evidence too: each worker process
logs `(Worker[_DP<d>][_PP<p>][_TP<t>][_EP<e>] pid=N) … Model loading took …` once (vllm/v1/executor/
multiproc_executor.py:1195-1229, vllm/v1/worker/gpu_model_runner.py:5088-5092), on the node it runs on.

With `--rehearsal` (a stack that declares no GPUs, docs/rehearsal.md) the check prints `NOT RUN` and reads no log:
no vLLM engine core loads weights onto a GPU there, and a substitute engine's log lines would prove nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from checks.verdict import (
    REHEARSAL,
    CheckParser,
    Verdict,
    check_name,
    container_name,
    emit,
    integer,
    listed,
    path,
    read_log,
)

RANK = re.compile(r"EngineCore_DP(\d+)|\(EngineCore pid=")
WORKER = re.compile(r"\((Worker(?:_[A-Z]+\d+)*) pid=(\d+)\)")
WORKER_DIED = re.compile(r"Worker proc (\S+) died unexpectedly")
"""Logged by the executor that watches the workers (vllm/v1/executor/multiproc_executor.py:380-385)."""
READY = "GPU KV cache size"
LOADED = "Model loading took"
DEAD = ("died unexpectedly", "Traceback (most recent call last)", "EngineCore failed to start")


def classify(text: str, ranks: list[int], name: str = "dp-engines", workers: int = 0) -> Verdict:
    ready: set[int] = set()
    dead: dict[int, str] = {}
    loaded: set[str] = set()
    dead_workers: dict[str, str] = {}
    for line in text.splitlines():
        gone = WORKER_DIED.search(line)
        if gone:
            dead_workers.setdefault(gone.group(1), line.strip()[-200:])
            continue
        w = WORKER.search(line)
        if w:
            if LOADED in line:
                loaded.add(f"{w.group(1)} pid={w.group(2)}")
            if any(word in line for word in DEAD):
                dead_workers.setdefault(w.group(1), line.strip()[-200:])
            continue
        m = RANK.search(line)
        if not m:
            continue
        rank = int(m.group(1) or 0)
        if READY in line:
            ready.add(rank)
        if any(word in line for word in DEAD):
            dead.setdefault(rank, line.strip()[-200:])
    evidence = [f"ready ranks {sorted(ready) or 'none'} of expected {ranks}"]
    if workers:
        evidence.append(f"{len(loaded)} of {workers} local worker(s) loaded their weights")
    if dead or dead_workers:
        what = (f"DP engine(s) {sorted(dead)}" if dead else "") + (" and " if dead and dead_workers else "") + (
            f"worker(s) {sorted(dead_workers)}" if dead_workers else "")
        return Verdict(name, "fail", f"{what} died", evidence + [*dead.values(), *dead_workers.values()][:2],
                       "read the first Traceback in `docker logs`; vLLM is fail-stop, redeploy the whole group")
    if len(loaded) < workers:
        return Verdict(name, "fail", f"only {len(loaded)} of this node's {workers} worker(s) loaded their weights",
                       evidence, "check that this node reaches the head's --master-addr:--master-port on the control "
                       "network (the workers wait there first), then the first Traceback in `docker logs`")
    missing = [r for r in ranks if r not in ready]
    if missing:
        return Verdict(name, "fail", f"DP rank(s) {missing} never reported a KV cache", evidence,
                       "check that the headless node started and reaches the head's --data-parallel-address "
                       "(DP RPC port) on the control network")
    if workers and not ranks:
        return Verdict(name, "pass", f"all {workers} worker(s) on this node loaded their weights", evidence)
    extra = f" and its {workers} worker(s) loaded their weights" if workers else ""
    return Verdict(name, "pass", f"all {len(ranks)} DP engine(s) on this node are up{extra}", evidence)


MAX_RANK = 1023
"""The highest DP rank a stack can plan (parallelism.data is at most 1024)."""


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="engines", description=__doc__)
    p.add_argument("--name", default="dp-engines", type=check_name)
    p.add_argument("--ranks", required=True, type=listed(integer(0, MAX_RANK)),
                   help="comma list of the DP ranks this node runs (may be empty)")
    p.add_argument("--workers", type=integer(0, 4096), default=0,
                   help="worker processes that must have loaded weights here")
    p.add_argument("--container", type=container_name, action="append", default=[],
                   help="read `docker logs CONTAINER`; repeated: every one's log (external load balancing: a "
                        "container per DP rank)")
    p.add_argument("--log-file", default="-", type=path)
    p.add_argument("--json", action="store_true")
    p.add_argument("--rehearsal", action="store_true", help="the stack declares no GPUs (vllm-cluster:rehearsal): "
                   "print NOT RUN, read no log")
    args = p.parse_args(argv)
    if not args.ranks and not args.workers:
        p.error("--ranks '' with --workers 0: nothing to check; give the node's DP ranks or its worker count")
    if args.rehearsal:
        what = f"DP rank(s) {','.join(map(str, args.ranks))}" if args.ranks else f"{args.workers} worker(s)"
        return emit(Verdict(args.name, "not-run", f"{REHEARSAL}: no vLLM engine core loads weights onto a GPU or "
                            f"logs its GPU KV cache, so the logs of {what} are not read (the substitute engine's "
                            "answers are checked by the api-* checks)"), args.json)
    try:
        text = "\n".join(read_log(c, args.log_file) for c in args.container) if args.container else \
            read_log(None, args.log_file)
    except OSError as exc:
        return emit(Verdict(args.name, "cannot-run", str(exc)), args.json)
    return emit(classify(text, args.ranks, args.name, args.workers), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
