"""DP load-balancing modes (`parallelism.dp_load_balancing`) against a real vLLM 0.33.0, on CPU.

    VLLM_PYTHON=/path/to/venv-with-vllm/bin/python venv/bin/python bench/dp_lb_real_vllm.py \
        [--write tests/fixtures/vllm-0.33.0-dp-lb.json]

Every planned argv of a 2-node DP16 x TP1 x EP16 stack, with `hybrid`, `internal` and `external` load balancing
(external: the argv of each of the 16 rank servers), goes through vLLM's own serve parser,
`EngineArgs.create_engine_config` (vllm/engine/arg_utils.py:2380-2530, where the LB mode, the DP rank and the
local size are decided) and `ServeSubcommand.cmd` with its launchers stubbed out (vllm/entrypoints/cli/serve.py:
54-156: the API-server count it defaults to, and which launcher it picks). A tiny local MoE `config.json` stands
in for the model (no weights, no GPU); a tiny dense one for the argv marked `/dense`. Hand-written argv show what
vLLM does with the combinations the planner refuses. Then the shipped dry run (`checks/vllm_args.py`, the
command `args-dry-run-<node>` runs, without Docker) checks each node of the external stack: every rank server's
argv in one process. `--write` stores everything as the fixture that tests/test_load_balancing.py compares with
the current plan (CI has no vLLM).
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
from components.check_commands import dry_run_command
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import Plan, build_plan

ROOT = Path(__file__).resolve().parent.parent

DERIVE = r'''
import copy, json, sys, types
import vllm
from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
DROP = {"--reasoning-parser": 1, "--tool-call-parser": 1, "--tokenizer-mode": 1, "--enable-auto-tool-choice": 0}
model, models = sys.argv[1], {"/dense": sys.argv[2]}
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
    sys.argv = ["vllm", "serve", models.get(argv[0], model), *strip(argv[1:]), "--skip-tokenizer-init"]
    cli_main.main()
    args = got["args"]
    args.model = args.model_tag
    launch.clear()
    original_cmd(copy.copy(args))   # serve.py:54-156 with the launchers stubbed: the API-server count it picks
    config = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless)
    pc = config.parallel_config
    out = {k: getattr(pc, k) for k in ("data_parallel_size", "data_parallel_rank", "data_parallel_size_local",
           "data_parallel_hybrid_lb", "data_parallel_external_lb", "data_parallel_master_ip",
           "data_parallel_rpc_port", "local_engines_only")}
    out |= {"headless": args.headless, "launcher": launch.get("path"), "api_servers": launch.get("api_servers"),
            "host": args.host, "port": args.port, "needs_dp_coordinator": config.needs_dp_coordinator}
    return out

def error(exc):
    """The exception's first line, and for pydantic's ValidationError the message under it."""
    lines = [l.strip() for l in str(exc).splitlines() if l.strip() and not l.strip().startswith("For further")]
    text = lines[0] if lines else ""
    if type(exc).__name__ == "ValidationError" and len(lines) > 1:
        text += ": " + " ".join(l.split(" [type=", 1)[0] for l in lines[1:])
    return f"{type(exc).__name__}: {text[:300]}"

for line in sys.stdin:
    name, argv = json.loads(line)
    try:
        result = derive(argv)
    except BaseException as exc:
        result = {"error": error(exc)}
    print("RESULT " + json.dumps([name, result]), flush=True)
'''


def dp16(mode: str) -> dict[str, Any]:
    """Two 8-GPU nodes, DP16 x TP1 x EP16 on mp (the h20 stack's nodes), with the given load balancing. External
    needs each rank's container on its own GPU: h20 leaves CUDA_VISIBLE_DEVICES unset, so it is turned on there."""
    values = copy.deepcopy(read_stack_values("h20"))
    values["parallelism"] |= {"backend": "mp", "tensor": 1, "pipeline": 1, "data": 16, "dp_load_balancing": mode}
    if mode == "external":
        values["container"] = values["container"] | {"set_cuda_visible_devices": True}
    return values


STACKS = {"hybrid": dp16("hybrid"), "internal": dp16("internal"), "external": dp16("external")}
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
    "external rank given a start rank too": [*BASE, "--data-parallel-size-local", "1", "--data-parallel-rank", "9",
                                             "--data-parallel-start-rank", "9"],
    "external and hybrid together": [*BASE, "--data-parallel-size-local", "1", "--data-parallel-rank", "9",
                                     "--data-parallel-external-lb", "--data-parallel-hybrid-lb"],
    "external without a rank": [*BASE, "--data-parallel-size-local", "1", "--data-parallel-external-lb"],
    "external with DP 1": ["/m", "--tensor-parallel-size", "1", "--distributed-executor-backend", "mp",
                           "--data-parallel-size", "1", "--data-parallel-rank", "0", "--data-parallel-external-lb"],
    "external rank out of range": [*BASE, "--data-parallel-size-local", "1", "--data-parallel-rank", "16",
                                   "--data-parallel-external-lb"],
    "external on a dense model": ["/dense", *BASE[1:], "--data-parallel-size-local", "1", "--data-parallel-rank",
                                  "9", "--data-parallel-external-lb"],
    "external rank on a headless node": [*BASE, "--headless", "--data-parallel-size-local", "1",
                                         "--data-parallel-rank", "9", "--data-parallel-external-lb"],
}
TINY_DENSE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 2097152, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
}
"""A dense config.json: vLLM refuses external DP ranks for non-MoE models (vllm/engine/arg_utils.py:2456-2465)."""


def argv_of(mode: str, plan: Plan) -> dict[str, list[str]]:
    """`<mode>#<node>` -> the node's argv; external: `external#<container>` for each rank's server."""
    if mode == "external":
        return {f"{mode}#{c.name}": c.vllm_args or [] for n in plan.nodes for c in n.containers}
    return {f"{mode}#{n.name}": n.containers[0].vllm_args or [] for n in plan.nodes}


def dry_runs(python: str, model: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The shipped dry run of every node of the external stack, as `args-dry-run-<node>` runs it, on `python`
    instead of `docker run … <image>`: the same script and argv, the model path replaced by `model`, an existing
    directory without a config.json (a path that does not exist is taken for a Hugging Face repo id). The tiny
    config has no tokenizer, which the DeepSeek-V4 tokenizer mode and parsers of the argv need once
    create_engine_config runs (`'NoneType' object has no attribute 'get_vocab'`, for every mode alike); so here
    vLLM parses each argv and runs serve's launch logic, and the engine config of the same argv (parsers left
    out) is what DERIVE records."""
    config = parse_config("bench", STACKS["external"])
    plan = build_plan("bench", config)
    out: dict[str, dict[str, Any]] = {}
    for check in (c for c in plan.checks if c.module == "checks.vllm_args"):
        first, rest = dry_run_command(config, plan, check).split("\n", 1)
        _, after = first.split(" - ", 1)
        after = after.replace(config.model.container_path, model)
        start = time.monotonic()
        done = subprocess.run(["bash", "-c", f"timeout 900 {python} - --json {after}\n{rest}"], capture_output=True,
                              text=True, env=env)
        verdict: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {
            "status": "no output", "summary": done.stderr[-500:], "details": {}}
        out[str(check.node)] = {"exit": done.returncode, "seconds": round(time.monotonic() - start, 1),
                                "status": verdict["status"], "summary": verdict["summary"],
                                "servers": verdict.get("details", {}).get("servers", [])}
    return out


def run(python: str) -> dict[str, Any]:
    plans = {mode: build_plan("bench", parse_config("bench", values)) for mode, values in STACKS.items()}
    argv = {key: words for mode, plan in plans.items() for key, words in argv_of(mode, plan).items()}
    argv |= {f"refused#{label}": words for label, words in REFUSED.items()}
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dplb-tiny-") as moe, tempfile.TemporaryDirectory(prefix="dplb-dense-") \
            as dense, tempfile.TemporaryDirectory(prefix="dplb-empty-") as empty:
        (Path(moe) / "config.json").write_text(json.dumps(TINY_MOE))
        (Path(dense) / "config.json").write_text(json.dumps(TINY_DENSE))
        done = subprocess.run([python, "-c", DERIVE, moe, dense], capture_output=True, text=True, env=env,
                              timeout=900, input="".join(json.dumps([k, v]) + "\n" for k, v in argv.items()))
        derived = round(time.monotonic() - start)
        checked = dry_runs(python, empty, {**env, "PYTHONPATH": str(ROOT)})
    results = dict(json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT "))
    version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, env=env).stdout.strip()
    return {"origin": {"vllm": version, "produced_by": "bench/dp_lb_real_vllm.py", "model": "tiny MoE config.json "
                       "(TINY_MOE of bench/mp_multinode_real_vllm.py); TINY_DENSE for /dense",
                       "seconds": derived, "dry_run_seconds": round(time.monotonic() - start - derived)},
            "argv": argv, "vllm": results, "dry_run": checked}


def main() -> int:
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that imports vllm", file=sys.stderr)
        return 2
    data = run(python)
    print(f"vLLM {data['origin']['vllm']}, {len(data['argv'])} argv in {data['origin']['seconds']} s, the external "
          f"stack's dry runs in {data['origin']['dry_run_seconds']} s\n")
    print("| argv | LB (hybrid / external) | DP rank, local size | launcher, API servers |\n|---|---|---|---|")
    for name, got in data["vllm"].items():
        if "error" in got:
            print(f"| {name} | {got['error']} | | |")
        else:
            print(f"| {name} | {got['data_parallel_hybrid_lb']} / {got['data_parallel_external_lb']} | "
                  f"{got['data_parallel_rank']}, {got['data_parallel_size_local']} | {got['launcher']}, "
                  f"{got['api_servers']} |")
    print("\n| external stack: dry run of node | exit | seconds | servers | verdict |\n|---|---:|---:|---:|---|")
    for node, got in data["dry_run"].items():
        print(f"| {node} | {got['exit']} | {got['seconds']} | {len(got['servers'])} | {got['summary'][:160]} |")
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        Path(sys.argv[2]).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
