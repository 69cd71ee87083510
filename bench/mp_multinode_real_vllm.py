"""Replicas that span nodes (`backend: mp`, `--nnodes`) against a real vLLM 0.33.0 and its torch, on CPU.

    VLLM_PYTHON=/path/to/venv-with-vllm/bin/python venv/bin/python bench/mp_multinode_real_vllm.py

Three parts, each printed as a Markdown table:

1. Layout: every planned node's argv goes through vLLM's own serve parser and `EngineArgs.create_engine_config`
   (the code that infers DP ranks and LB modes from `--nnodes`/`--node-rank`, vllm/engine/arg_utils.py:2380-2590)
   with a tiny local MoE `config.json` in place of the model (no weights, no GPU). The fields vLLM derives are
   compared with the plan. Flags that need a real tokenizer (parsers, tokenizer mode) are left out here: the dry
   run (part 2) proves vLLM parses them. Hand-written argv for combinations the planner refuses show vLLM's own
   error for each.
2. Dry run: the shipped `checks/vllm_args.py` with each node's exact argv (as bench/dry_run_real_vllm.py does).
3. Rendezvous: torch's TCPStore (the `tcp://master_addr:master_port` rendezvous of parallel_state.py:1875-1877)
   with a client started before the master, a master alone, and the address it listens on; this is what the
   start order relies on.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.check_commands import dry_run_command
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import Plan, build_plan

TINY_MOE = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 8, "num_hidden_layers": 4, "vocab_size": 256,
    "num_local_experts": 16, "num_experts_per_tok": 2, "max_position_embeddings": 2097152, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
"""A config.json only: vLLM reads it to build ModelConfig (MoE, so --enable-expert-parallel is accepted)."""

DERIVE = r'''
import json, sys
import vllm
from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
DROP = {"--reasoning-parser": 1, "--tool-call-parser": 1, "--tokenizer-mode": 1, "--enable-auto-tool-choice": 0}
model = sys.argv[1]

def strip(argv):
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
        elif a in DROP:
            skip = DROP[a]
        else:
            out.append(a)
    return out

def derive(argv):
    got = {}
    cli_serve.ServeSubcommand.cmd = staticmethod(lambda a: got.setdefault("args", a))
    sys.argv = ["vllm", "serve", model, *strip(argv[1:]), "--skip-tokenizer-init"]
    cli_main.main()
    args = got["args"]
    args.model = args.model_tag
    pc = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless).parallel_config
    out = {k: getattr(pc, k) for k in ("data_parallel_rank", "data_parallel_size_local", "data_parallel_hybrid_lb",
           "data_parallel_external_lb", "master_addr", "master_port", "data_parallel_master_ip", "world_size")}
    out |= {"nnodes_within_dp": pc.nnodes_within_dp, "node_rank_within_dp": pc.node_rank_within_dp,
            "local_world_size": pc.local_world_size, "headless": args.headless}
    # entrypoints/cli/serve.py: headless -> run_headless; node_rank_within_dp > 0 there -> executor only (218-233)
    out["serve_path"] = (("workers only" if pc.node_rank_within_dp > 0 else "headless engine core")
                         if args.headless else "API server + engine core")
    return out

for line in sys.stdin:
    name, argv = json.loads(line)
    try:
        result = derive(argv)
    except BaseException as exc:
        result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:220]}"}
    print("RESULT " + json.dumps([name, result]), flush=True)
'''

RENDEZVOUS = r'''
import socket, subprocess, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close(); return port

rows = [("torch", torch.__version__, "")]
port, out = free_port(), {}
def client():
    t = time.monotonic()
    dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
    out["client"] = time.monotonic() - t
th = threading.Thread(target=client); th.start()
time.sleep(5)
t = time.monotonic()
master = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=30))
th.join()
rows.append(("client started 5 s before the master", f"connected after {out['client']:.1f} s",
             f"master returned {time.monotonic() - t:.1f} s after it started"))
listen = [l.split()[3] for l in subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout.splitlines()
          if l.split()[3:4] and l.split()[3].endswith(f":{port}")]
rows.append(("master asked for host 127.0.0.1", "listens on " + ", ".join(listen), "TCPStore binds every address"))
port2 = free_port(); t = time.monotonic()
try:
    dist.TCPStore("127.0.0.1", port2, 2, True, timedelta(seconds=4))
except Exception as exc:
    rows.append(("master alone, timeout 4 s", f"fails after {time.monotonic() - t:.1f} s", str(exc)[:90]))
t = time.monotonic()
try:
    dist.TCPStore("127.0.0.1", free_port(), 2, False, timedelta(seconds=4))
except Exception as exc:
    rows.append(("client alone, timeout 4 s", f"fails after {time.monotonic() - t:.1f} s", str(exc)[:90]))
from torch.distributed.distributed_c10d import _get_default_timeout, Backend
rows.append(("default timeout (NCCL backend)", str(_get_default_timeout(Backend.NCCL)), "init_process_group"))
for r in rows:
    print("ROW " + "|".join(r), flush=True)
'''


def h20_mp(nodes: int, data: int, pipeline: int = 2) -> dict[str, Any]:
    values = copy.deepcopy(read_stack_values("h20"))
    values["parallelism"] |= {"backend": "mp", "data": data, "pipeline": pipeline}
    for i in range(len(values["nodes"]), nodes):
        node = copy.deepcopy(values["nodes"][1])
        node["name"] = f"h20-{i + 1}"
        node["ssh"]["host"] = node["management_ip"] = f"192.0.2.{11 + i}"
        node["data_ips"] = [f"198.51.100.{(i + 1) * 10 + k}" for k in range(1, 5)]
        values["nodes"].append(node)
    return values


TOPOLOGIES = {
    "2 nodes, TP8 x PP2 (h20 on mp)": h20_mp(2, 1),
    "4 nodes, DP2 x (TP8 x PP2)": h20_mp(4, 2),
    "4 nodes, TP8 x PP4": h20_mp(4, 1, pipeline=4),
    "6 nodes, DP3 x (TP8 x PP2)": h20_mp(6, 3),
}
BASE = ["/m", "--distributed-executor-backend", "mp", "--master-addr", "192.0.2.11", "--master-port", "29501"]
TP8PP2 = ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
REFUSED = {
    "3 nodes, DP2 x (TP4 x PP3): 3 % 2 (planner: parallelism.data)": [
        *BASE, "--tensor-parallel-size", "4", "--pipeline-parallel-size", "3", "--nnodes", "3", "--node-rank", "1",
        "--headless", "--data-parallel-size", "2"],
    "3 nodes, TP8 x PP2: 16 % 3 (planner: parallelism.pipeline)": [*BASE, *TP8PP2, "--nnodes", "3", "--node-rank", "0"],
    "4 nodes, DP2, head with --data-parallel-start-rank 0 (never planned)": [
        *BASE, *TP8PP2, "--nnodes", "4", "--node-rank", "0", "--data-parallel-size", "2",
        "--data-parallel-size-local", "1", "--data-parallel-start-rank", "0"],
}


def expected(plan: Plan, name: str) -> dict[str, Any]:
    node = plan.node(name)
    head_ip = plan.head.containers[0].env["VLLM_HOST_IP"]
    path = {"mp-head": "API server + engine core", "mp-replica-head": "headless engine core",
            "mp-worker": "workers only"}[node.role]
    want = {"data_parallel_rank": node.replica, "local_world_size": node.gpus_used,
            "nnodes_within_dp": plan.topology["replica_nodes"], "data_parallel_hybrid_lb": False,
            "data_parallel_external_lb": False, "master_addr": head_ip, "master_port": 29501, "serve_path": path}
    if plan.topology["data"] > 1:  # with DP 1 vLLM resets it to VLLM_DP_MASTER_IP (config/parallel.py:1023-1028)
        want["data_parallel_master_ip"] = head_ip
    return want


def run_vllm(python: str, script: str, stdin: str, *args: str) -> tuple[list[str], float]:
    start = time.monotonic()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([python, "-c", script, *args], input=stdin, capture_output=True, text=True, env=env,
                          timeout=900)
    return done.stdout.splitlines(), time.monotonic() - start


def layout(python: str) -> None:
    plans = {label: build_plan("bench", parse_config("bench", values)) for label, values in TOPOLOGIES.items()}
    lines = [json.dumps([f"{label}#{n.name}", n.containers[0].vllm_args]) for label, plan in plans.items()
             for n in plan.nodes]
    lines += [json.dumps([f"{label}#-", argv]) for label, argv in REFUSED.items()]
    with tempfile.TemporaryDirectory(prefix="mpexec-tiny-") as model:
        (Path(model) / "config.json").write_text(json.dumps(TINY_MOE))
        out, seconds = run_vllm(python, DERIVE, "\n".join(lines) + "\n", model)
    results = dict(json.loads(line[7:]) for line in out if line.startswith("RESULT "))
    print(f"### 1. Layout: what vLLM derives from each planned argv ({seconds:.0f} s for {len(lines)} argv)\n")
    print("| topology | node | role | vLLM: DP rank, node_rank_within_dp, local GPUs, serve path | = plan |")
    print("|---|---|---|---|---|")
    for label, plan in plans.items():
        for n in plan.nodes:
            got = results.get(f"{label}#{n.name}", {"error": "no result"})
            if "error" in got:
                print(f"| {label} | {n.name} | {n.role} | {got['error']} | NO |")
                continue
            want = expected(plan, n.name)
            same = all(got.get(k) == v for k, v in want.items())
            print(f"| {label} | {n.name} | {n.role} | {got['data_parallel_rank']}, {got['node_rank_within_dp']}, "
                  f"{got['local_world_size']}, {got['serve_path']} | {'yes' if same else f'NO: {got}'} |")
    print("\n| refused combination | what vLLM 0.33.0 does with it |\n|---|---|")
    for label in REFUSED:
        got = results.get(f"{label}#-", {"error": "no result"})
        text = got["error"] if "error" in got else (
            f"accepted: hybrid LB {got['data_parallel_hybrid_lb']}, external LB {got['data_parallel_external_lb']}")
        print(f"| {label} | {text} |")


def dry_runs(python: str) -> None:
    print("\n### 2. Dry run: the shipped script with each node's exact argv\n")
    print("| topology | node | exit | seconds | verdict |\n|---|---|---:|---:|---|")
    for label in list(TOPOLOGIES)[:2]:
        config = parse_config("bench", TOPOLOGIES[label])
        plan = build_plan("bench", config)
        for check in (c for c in plan.checks if c.module == "checks.vllm_args"):
            first, rest = dry_run_command(config, plan, check).split("\n", 1)
            _, after = first.split(" - ", 1)
            start = time.monotonic()
            done = subprocess.run(["bash", "-c", f"VLLM_TARGET_DEVICE=cpu timeout 600 {python} - {after}\n{rest}"],
                                  capture_output=True, text=True)
            verdict = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"| {label} | {check.node} | {done.returncode} | {time.monotonic() - start:.1f} | {verdict[:150]} |")


def rendezvous(python: str) -> None:
    out, _ = run_vllm(python, RENDEZVOUS, "")
    print("\n### 3. torch's TCPStore rendezvous (what the start order relies on)\n")
    print("| case | result | note |\n|---|---|---|")
    for line in out:
        if line.startswith("ROW "):
            print("| " + " | ".join(line[4:].split("|")) + " |")


def main() -> int:
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that imports vllm", file=sys.stderr)
        return 2
    layout(python)
    dry_runs(python)
    rendezvous(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
