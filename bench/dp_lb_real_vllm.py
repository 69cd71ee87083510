"""DP load-balancing modes (`parallelism.dp_load_balancing`) against a real vLLM 0.33.0, on CPU.

    VLLM_PYTHON=/path/to/venv-with-vllm/bin/python venv/bin/python bench/dp_lb_real_vllm.py \
        [--write tests/fixtures/vllm-0.33.0-dp-lb.json]

Every planned node's argv of a 2-node DP16 x TP1 x EP16 stack, with `hybrid` and with `internal` load balancing,
goes through vLLM's own serve parser, `EngineArgs.create_engine_config` (vllm/engine/arg_utils.py:2380-2530, where
the LB mode, the DP rank and the local size are decided) and `ServeSubcommand.cmd` with its launchers stubbed out
(vllm/entrypoints/cli/serve.py:54-156: the API-server count it defaults to, and which launcher it picks). A tiny
local MoE `config.json` stands in for the model (no weights, no GPU). Hand-written argv show what vLLM does with
the combinations the planner refuses. `--write` stores everything as the fixture that
tests/test_load_balancing.py compares with the current plan (CI has no vLLM).
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

from bench.mp_multinode_real_vllm import TINY_MOE
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan

DERIVE = r'''
import copy, json, sys, types
import vllm
from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
DROP = {"--reasoning-parser": 1, "--tool-call-parser": 1, "--tokenizer-mode": 1, "--enable-auto-tool-choice": 0}
model = sys.argv[1]
original_cmd = cli_serve.ServeSubcommand.cmd
launch = {}
cli_serve.run_dp_supervisor = lambda a: launch.update(path="dp supervisor", api_servers=a.api_server_count)
cli_serve.run_headless = lambda a: launch.update(path="headless", api_servers=a.api_server_count)
cli_serve.run_multi_api_server = lambda a: launch.update(path="api servers", api_servers=a.api_server_count)
cli_serve.run_server = lambda a: None
cli_serve.uvloop = types.SimpleNamespace(run=lambda coro: launch.update(path="api servers", api_servers=1))

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
    launch.clear()
    original_cmd(copy.copy(args))   # serve.py:54-156 with the launchers stubbed: the API-server count it picks
    pc = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless).parallel_config
    out = {k: getattr(pc, k) for k in ("data_parallel_size", "data_parallel_rank", "data_parallel_size_local",
           "data_parallel_hybrid_lb", "data_parallel_external_lb", "data_parallel_master_ip",
           "data_parallel_rpc_port", "local_engines_only")}
    out |= {"headless": args.headless, "launcher": launch.get("path"), "api_servers": launch.get("api_servers")}
    return out

for line in sys.stdin:
    name, argv = json.loads(line)
    try:
        result = derive(argv)
    except BaseException as exc:
        result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:220]}"}
    print("RESULT " + json.dumps([name, result]), flush=True)
'''


def dp16(mode: str) -> dict[str, Any]:
    """Two 8-GPU nodes, DP16 x TP1 x EP16 on mp (the h20 stack's nodes), with the given load balancing."""
    values = copy.deepcopy(read_stack_values("h20"))
    values["parallelism"] |= {"backend": "mp", "tensor": 1, "pipeline": 1, "data": 16, "dp_load_balancing": mode}
    return values


STACKS = {"hybrid": dp16("hybrid"), "internal": dp16("internal")}
BASE = ["/m", "--tensor-parallel-size", "1", "--distributed-executor-backend", "mp", "--data-parallel-size", "16",
        "--data-parallel-address", "192.0.2.11", "--data-parallel-rpc-port", "29550", "--data-parallel-backend", "mp",
        "--enable-expert-parallel"]
REFUSED = {
    "hybrid on a headless node": [*BASE, "--headless", "--data-parallel-size-local", "8",
                                  "--data-parallel-start-rank", "8", "--data-parallel-hybrid-lb"],
    "hybrid with 1 local rank": [*BASE, "--data-parallel-size-local", "1", "--data-parallel-start-rank", "1",
                                 "--data-parallel-hybrid-lb"],
    "hybrid with every rank on one node": [*BASE, "--data-parallel-size-local", "16", "--data-parallel-start-rank",
                                           "0", "--data-parallel-hybrid-lb"],
    "external with 2 local ranks": [*BASE, "--data-parallel-size-local", "2", "--data-parallel-rank", "2"],
    "internal head given a start rank": [*BASE, "--data-parallel-size-local", "8", "--data-parallel-start-rank", "0"],
}


def run(python: str) -> dict[str, Any]:
    plans = {mode: build_plan("bench", parse_config("bench", values)) for mode, values in STACKS.items()}
    argv = {f"{mode}#{n.name}": n.containers[0].vllm_args or [] for mode, plan in plans.items() for n in plan.nodes}
    argv |= {f"refused#{label}": words for label, words in REFUSED.items()}
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dplb-tiny-") as model:
        (Path(model) / "config.json").write_text(json.dumps(TINY_MOE))
        done = subprocess.run([python, "-c", DERIVE, model], capture_output=True, text=True, env=env, timeout=900,
                              input="".join(json.dumps([k, v]) + "\n" for k, v in argv.items()))
    results = dict(json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT "))
    version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, env=env).stdout.strip()
    return {"origin": {"vllm": version, "produced_by": "bench/dp_lb_real_vllm.py", "model": "tiny MoE config.json "
                       "(TINY_MOE of bench/mp_multinode_real_vllm.py)", "seconds": round(time.monotonic() - start)},
            "argv": argv, "vllm": results}


def main() -> int:
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that imports vllm", file=sys.stderr)
        return 2
    data = run(python)
    print(f"vLLM {data['origin']['vllm']}, {len(data['argv'])} argv in {data['origin']['seconds']} s\n")
    print("| argv | LB (hybrid / external) | DP rank, local size | launcher, API servers |\n|---|---|---|---|")
    for name, got in data["vllm"].items():
        if "error" in got:
            print(f"| {name} | {got['error']} | | |")
        else:
            print(f"| {name} | {got['data_parallel_hybrid_lb']} / {got['data_parallel_external_lb']} | "
                  f"{got['data_parallel_rank']}, {got['data_parallel_size_local']} | {got['launcher']}, "
                  f"{got['api_servers']} |")
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        Path(sys.argv[2]).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
