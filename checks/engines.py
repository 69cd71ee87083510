"""Every DP engine joined: each expected rank's `EngineCore_DP<r>` process logged its KV cache, none died.

vLLM prefixes engine-core log lines with `(EngineCore_DP<rank> pid=N)`; "GPU KV cache size" is logged once
the engine has loaded weights and profiled memory, just before it reports ready to the coordinator.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from checks.verdict import Verdict, emit, read_log

RANK = re.compile(r"EngineCore_DP(\d+)")
READY = "GPU KV cache size"
DEAD = ("died unexpectedly", "Traceback (most recent call last)", "EngineCore failed to start")


def classify(text: str, ranks: list[int], name: str = "dp-engines") -> Verdict:
    ready: set[int] = set()
    dead: dict[int, str] = {}
    for line in text.splitlines():
        m = RANK.search(line)
        if not m:
            continue
        rank = int(m.group(1))
        if READY in line:
            ready.add(rank)
        if any(word in line for word in DEAD):
            dead.setdefault(rank, line.strip()[-200:])
    evidence = [f"ready ranks {sorted(ready) or 'none'} of expected {ranks}"]
    if dead:
        return Verdict(name, "fail", f"DP engine(s) {sorted(dead)} died", evidence + list(dead.values())[:2],
                       "read the first Traceback in `docker logs`; vLLM is fail-stop, redeploy the whole group")
    missing = [r for r in ranks if r not in ready]
    if missing:
        return Verdict(name, "fail", f"DP rank(s) {missing} never reported a KV cache", evidence,
                       "check that the headless node started and reaches the head's --data-parallel-address "
                       "(DP RPC port) on the control network")
    return Verdict(name, "pass", f"all {len(ranks)} DP engine(s) on this node are up", evidence)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="engines", description=__doc__)
    p.add_argument("--name", default="dp-engines")
    p.add_argument("--ranks", required=True, help="comma list of the DP ranks this node runs")
    p.add_argument("--container")
    p.add_argument("--log-file", default="-")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        text = read_log(args.container, args.log_file)
    except OSError as exc:
        return emit(Verdict(args.name, "cannot-run", str(exc)), args.json)
    ranks = [int(r) for r in args.ranks.split(",") if r]
    return emit(classify(text, ranks, args.name), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
