"""NCCL transport evidence from engine logs: RDMA with GPU Direct, or a silent socket fallback.

Reads a log file, stdin, or `docker logs <container>`. Needs NCCL_DEBUG=INFO in the engine's environment;
without NCCL INFO lines the verdict is "inconclusive" (exit 2), never a pass. With `--rehearsal` (a stack that
declares no GPUs, docs/rehearsal.md) it prints `NOT RUN` and reads no log: no engine there runs NCCL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from checks.verdict import REHEARSAL, CheckParser, Verdict, check_name, container_name, emit, path, read_log

IB_USING = re.compile(r"NET/IB : Using (.*?)(?: ?\[RO\])?; OOB")
SOCKET_BAD = ("NET/IB : No device found", "Using network Socket", "via NET/Socket")
GDR_GOOD = re.compile(r"GPU Direct RDMA Enabled|via NET/IB/\d+/GDRDMA")
GDR_OFF = re.compile(r"GPU Direct RDMA Disabled for HCA \d+ '([^']+)'")
PREFIX = re.compile(r"([^\s:]+):(\d+):\d+(?: \[-?\d+\])? NCCL INFO")
"""NCCL's own line prefix, `host:pid:tid [cudaDev] NCCL INFO` (src/debug.cc), wherever it sits in the line."""


def by_process(text: str) -> dict[str, str]:
    """The NCCL INFO lines of each process, keyed `host:pid` (in order of first appearance). A line without
    NCCL's prefix is grouped by whatever precedes `NCCL INFO` on it ("(no prefix)" when nothing does)."""
    groups: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        m = PREFIX.search(line)
        key = f"{m.group(1)}:{m.group(2)}" if m else line.split("NCCL INFO", 1)[0].strip() or "(no prefix)"
        groups.setdefault(key, []).append(line)
    return {key: "\n".join(lines) + "\n" for key, lines in groups.items()}


def classify(text: str, transport: str = "roce", require_gdr: bool = True, name: str = "nccl-transport") -> Verdict:
    nccl = [line for line in text.splitlines() if "NCCL INFO" in line]
    if not nccl:
        return Verdict(name, "inconclusive", "no 'NCCL INFO' lines in the log", [],
                       "set NCCL_DEBUG=INFO in the engine env (fabric.nccl_debug: INFO) and redeploy")
    evidence: list[str] = []
    using = [m.group(1).strip() for line in nccl if (m := IB_USING.search(line))]
    if using:
        evidence.append(f"NET/IB : Using {using[0]}")
    bad = [line.split("NCCL INFO", 1)[1].strip() for line in nccl if any(b in line for b in SOCKET_BAD)]
    network_ib = any("Using network IB" in line for line in nccl)
    via_ib = any(re.search(r"via NET/IB/", line) for line in nccl)
    gdr = [line for line in nccl if GDR_GOOD.search(line)]
    gdr_off = sorted({m.group(1) for line in nccl if (m := GDR_OFF.search(line))})
    if bad and not (network_ib or via_ib):
        return Verdict(name, "fail", "NCCL fell back to TCP sockets: it works, slowly",
                       bad[:3], "check /dev/infiniband in the container, NCCL_IB_HCA and the HCA port state "
                       "(preflight fabric sections); `ibv_devinfo` must list the HCAs")
    if not (using or network_ib or via_ib):
        return Verdict(name, "inconclusive", "NCCL INFO present but no network selection line yet", evidence,
                       "the engine may not have reached NCCL init; re-run after /health is 200")
    kinds = sorted({part.rsplit("/", 1)[-1] for entry in using for part in entry.split() if "/" in part})
    want = "RoCE" if transport == "roce" else "IB"
    if kinds and want not in kinds:
        return Verdict(name, "fail", f"NCCL uses {'/'.join(kinds)} HCAs, the stack declares {want}", evidence,
                       "fix fabric.transport or NCCL_IB_HCA / the GID index")
    evidence.append(f"{len(gdr)} GDRDMA line(s)" if gdr else "no GDRDMA line")
    if gdr_off:
        evidence.append(f"GPU Direct RDMA Disabled for {', '.join(gdr_off)}")
    if require_gdr and not gdr:
        return Verdict(name, "fail", f"NCCL uses {want} but without GPU Direct RDMA (staged through host memory)",
                       evidence, "load nvidia_peermem (lsmod | grep peermem) and check `nvidia-smi topo -m` "
                       "GPU-NIC distance; NCCL_NET_GDR_LEVEL can widen it")
    return Verdict(name, "pass", f"NCCL uses {want}" + (" with GPU Direct RDMA" if gdr else ""), evidence)


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="nccl_transport", description=__doc__)
    p.add_argument("--name", default="nccl-transport", type=check_name)
    p.add_argument("--container", type=container_name, help="read `docker logs CONTAINER`")
    p.add_argument("--log-file", default="-", type=path, help="log file, '-' for stdin")
    p.add_argument("--transport", choices=["roce", "ib"], default="roce")
    p.add_argument("--no-require-gdr", dest="require_gdr", action="store_false")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rehearsal", action="store_true", help="the stack declares no GPUs (vllm-cluster:rehearsal): "
                   "print NOT RUN, read no log")
    args = p.parse_args(argv)
    if args.rehearsal:
        return emit(Verdict(args.name, "not-run", f"{REHEARSAL}: no engine runs NCCL on GPUs, so its log holds no "
                            f"NCCL transport line ({args.transport.upper() if args.transport == 'ib' else 'RoCE'} "
                            "with GPU Direct RDMA is not looked for)"), args.json)
    try:
        text = read_log(args.container, args.log_file)
    except OSError as exc:
        return emit(Verdict(args.name, "cannot-run", str(exc)), args.json)
    return emit(classify(text, args.transport, args.require_gdr, args.name), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
