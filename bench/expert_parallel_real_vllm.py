"""The expert-parallel keys against a real vLLM 0.33.0 on CPU: the planned argv accepted, the refused ones refused.

    VLLM_PYTHON=<venv with vllm==0.33.0>/bin/python venv/bin/python bench/expert_parallel_real_vllm.py \
        > tests/fixtures/vllm-0.33.0-expert-parallel.json
    VLLM_PYTHON=... venv/bin/python bench/expert_parallel_real_vllm.py --check   # compare with the committed file

Every case goes through vLLM's own serve parser and `AsyncEngineArgs.create_engine_config` (as
bench/mp_multinode_real_vllm.py does), with a model directory that holds only a published config.json from
tests/fixtures/models: DeepSeek-V3's (FP8, 256 routed experts, like the DeepSeek-V4.1-Flash card; the V4.1
config.json there is assembled from field reports and vLLM's config reader refuses its layer names), and
Qwen3-30B-A3B's (BF16, 128 experts) where MoonEP needs an unquantized model. Parser flags that need a real
tokenizer (tokenizer mode, tool-call and reasoning parsers) are left out; the dry run checks those.

- `planned`: the argv `python -m stacks plan` renders for examples/Pulumi.wide-ep.yaml (both nodes) and variants of
  it (every all-to-all backend, every EPLB field, DBO, round-robin placement, the weight filter): each must be
  accepted, with the values the stack asked for.
- `refused`: hand-written argv for what the planner refuses, with what vLLM does with each (its error, or the value
  it silently runs instead).

Two CPU-only lines of vLLM are bypassed, and only these: ParallelConfig's "EPLB is only supported on CUDA, ROCm or
XPU" check (vllm/config/parallel.py:563-568, `current_platform.is_cuda_alike()` answers True inside that module
only) and the CPU platform turning DBO off before VllmConfig's micro-batching assertion
(vllm/platforms/cpu.py:362-365; enable_dbo is put back after `check_and_update_config`), so that the CUDA checks
of config/vllm.py:2180-2204 run as on a GPU host. Everything else is vLLM's own code.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_vllm_capture import main as capture_main  # noqa: E402
from stacks.model.config import ALL2ALL_BACKENDS  # noqa: E402
from stacks.model.loader import parse_config, read_stack_values  # noqa: E402
from stacks.planner.plan import build_plan  # noqa: E402

MODELS = ROOT / "tests" / "fixtures" / "models"
V3, QWEN = "deepseek-v3", "qwen3-30b-a3b"
DROP = {"--tokenizer-mode": 1, "--tool-call-parser": 1, "--reasoning-parser": 1, "--enable-auto-tool-choice": 0}
"""Flags that need the model's tokenizer (a config.json alone has none), and how many values each takes."""


def example_values() -> dict[str, Any]:
    return read_stack_values("wide-ep", ROOT / "examples")


def variant(**parallelism: Any) -> dict[str, Any]:
    """The example with `parallelism` keys replaced; `profile` switches the model card."""
    values = copy.deepcopy(example_values())
    profile = parallelism.pop("profile", None)
    if profile:
        values["model"]["profile"] = profile
        values["serving"]["max_model_len"] = 32768
    values["parallelism"] |= parallelism
    return values


def planned_values() -> dict[str, tuple[dict[str, Any], str, str]]:
    """Case name -> (stack values, node whose argv is tried, config.json it is tried against)."""
    cases: dict[str, tuple[dict[str, Any], str, str]] = {
        "wide-ep example, head": (example_values(), "gpu1", V3),
        "wide-ep example, second node": (example_values(), "gpu2", V3),
    }
    for backend in ALL2ALL_BACKENDS:
        if backend.startswith("mori_"):  # AMD's: refused on the example's NVIDIA GPUs, tried under `refused`
            continue
        if backend.startswith("flashinfer_nvlink_"):  # multi-node NVLink: planned on an NVL72 rack's GPUs
            values = variant(all2all_backend=backend)
            for node in values["nodes"]:
                node["gpus"] |= {"model": "NVIDIA GB200", "memory_gb": 186}
            cases[f"all2all_backend {backend}"] = (values, "gpu1", V3)
        elif backend == "moonep":  # unquantized BF16 only, without EPLB (vllm/config/vllm.py:2106-2132)
            cases[f"all2all_backend {backend} (Qwen3-30B-A3B card, no EPLB)"] = (variant(
                profile=QWEN, all2all_backend=backend, eplb={"enabled": False}), "gpu1", QWEN)
        else:
            cases[f"all2all_backend {backend}"] = (variant(all2all_backend=backend), "gpu1", V3)
    cases["eplb, every field"] = (variant(eplb={
        "enabled": True, "num_redundant_experts": 32, "window_size": 500, "step_interval": 2000,
        "log_balancedness": True, "log_balancedness_interval": 10, "use_async": False, "communicator": "pynccl",
        "enable_migration_batching": True}), "gpu1", V3)
    cases["dbo, deepep_high_throughput (DeepSeek-V3 card)"] = (variant(
        profile=V3, all2all_backend="deepep_high_throughput",
        dbo={"enabled": True, "decode_token_threshold": 64, "prefill_token_threshold": 1024}), "gpu1", V3)
    cases["round_robin, deepep_low_latency, no EPLB (DeepSeek-V3 card)"] = (variant(
        profile=V3, eplb={"enabled": False}, expert_placement="round_robin"), "gpu1", V3)
    cases["ep_weight_filter, no EPLB"] = (variant(eplb={"enabled": False}, ep_weight_filter=True), "gpu1", V3)
    return cases


def planned_argv() -> dict[str, tuple[str, list[str]]]:
    """Case name -> (config.json, the planned `vllm serve` argv after the model path, tokenizer flags left out)."""
    out = {}
    for name, (values, node, model) in planned_values().items():
        plan = build_plan("bench", parse_config("bench", values))
        out[name] = (model, strip(plan.node(node).containers[0].vllm_args or []))
    return out


def strip(argv: list[str]) -> list[str]:
    kept, skip = [], 0
    for word in argv[1:]:  # argv[0] is the model path
        if skip:
            skip -= 1
        elif word in DROP:
            skip = DROP[word]
        else:
            kept.append(word)
    return kept


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv less each flag and its value (a value is a word that does not start with --)."""
    out, skip = [], False
    for word in argv:
        if skip and not word.startswith("--"):
            skip = False
            continue
        skip = word in flags
        if not skip:
            out.append(word)
    return out


def refused_argv() -> dict[str, tuple[str, list[str]]]:
    """Hand-written argv for what the planner refuses (tests/test_expert_parallel.py names the key of each)."""
    planned = planned_argv()
    head = planned["wide-ep example, head"][1]
    plain = _without(head, "--all2all-backend", "--enable-eplb", "--eplb-config")
    qwen = _without(next(a for m, a in planned.values() if m == QWEN), "--all2all-backend")
    cases = {
        "eplb without expert parallelism": _without(head, "--enable-expert-parallel"),
        "eplb at TP1 DP1": ["--enable-expert-parallel", "--enable-eplb", "--max-model-len", "32768"],
        "redundant experts without eplb": [*plain, "--eplb-config", '{"num_redundant_experts":16}'],
        "async eplb with torch_nccl": [*plain, "--enable-eplb", "--eplb-config", '{"communicator":"torch_nccl"}'],
        "dbo with allgather_reducescatter": [*plain, "--enable-dbo"],
        "dbo decode threshold 1": [*plain, "--all2all-backend", "deepep_high_throughput", "--enable-dbo",
                                   "--dbo-decode-token-threshold", "1"],
        "all2all_backend pplx": [*plain, "--all2all-backend", "pplx"],
        "all2all_backend naive": [*plain, "--all2all-backend", "naive"],
        "all2all_backend passthrough": [*plain, "--all2all-backend", "passthrough"],
        "moonep with an FP8 model": [*plain, "--all2all-backend", "moonep"],
    }
    out = {name: (V3, argv) for name, argv in cases.items()}
    out["moonep with eplb"] = (QWEN, [*qwen, "--all2all-backend", "moonep", "--enable-eplb"])
    out["moonep with round_robin"] = (QWEN, [*qwen, "--all2all-backend", "moonep", "--expert-placement-strategy",
                                             "round_robin"])
    for backend in ("mori_high_throughput", "mori_low_latency"):  # vLLM's parser takes them; the GPUs do not
        out[f"all2all_backend {backend} on NVIDIA GPUs"] = (V3, [  # the example's argv with that backend
            backend if before == "--all2all-backend" else word
            for before, word in zip(["", *head[:-1]], head, strict=True)])
    return out


DERIVE = r'''
import contextlib, io, json, logging, sys
import vllm
import vllm.config.parallel as parallel_module
from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
from vllm.platforms import current_platform as platform

class CudaAlike:  # inside config/parallel.py only: the EPLB platform check (parallel.py:563-568)
    def __getattr__(self, name):
        return getattr(platform, name)
    def is_cuda_alike(self):
        return True

parallel_module.current_platform = CudaAlike()
cpu = type(platform)
own = cpu.check_and_update_config.__func__

def keep_dbo(cls, vllm_config):  # platforms/cpu.py:362-365 turns DBO off before config/vllm.py:2180-2204
    dbo = vllm_config.parallel_config.enable_dbo
    own(cls, vllm_config)
    vllm_config.parallel_config.enable_dbo = dbo

cpu.check_and_update_config = classmethod(keep_dbo)
said = []
call_handlers = logging.Logger.callHandlers

def keep(self, record):  # vLLM reconfigures its handlers; every record still passes here
    text = record.getMessage()
    if record.levelno >= logging.WARNING and any(k in text for k in ("all2all", "EPLB", "Round-robin", "Dual")):
        said.append(text)
    call_handlers(self, record)

logging.Logger.callHandlers = keep
FIELDS = ("tensor_parallel_size", "data_parallel_size", "data_parallel_rank", "enable_expert_parallel",
          "all2all_backend", "enable_eplb", "enable_dbo", "dbo_decode_token_threshold", "dbo_prefill_token_threshold",
          "expert_placement_strategy", "enable_ep_weight_filter")

def derive(model, argv):
    got = {}
    cli_serve.ServeSubcommand.cmd = staticmethod(lambda a: got.setdefault("args", a))
    sys.argv = ["vllm", "serve", model, *argv, "--skip-tokenizer-init"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli_main.main()
    except SystemExit as exc:
        lines = [l.strip() for l in err.getvalue().splitlines() if "error" in l.lower() and "errors.pydantic" not in l]
        return {"error": "SystemExit", "message": (lines[-1] if lines else str(exc)).replace(model, "<model-dir>")}
    args = got["args"]
    args.model = args.model_tag
    pc = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless).parallel_config
    out = {k: getattr(pc, k) for k in FIELDS}
    out["eplb_config"] = {k: getattr(pc.eplb_config, k) for k in ("window_size", "step_interval",
                          "num_redundant_experts", "log_balancedness", "log_balancedness_interval", "use_async",
                          "policy", "communicator", "enable_migration_batching")}
    return {"ok": out}

models = json.loads(sys.argv[1])
for line in sys.stdin:
    name, fixture, argv = json.loads(line)
    model = models[fixture]
    del said[:]
    try:
        result = derive(model, argv)
    except BaseException as exc:
        text = str(exc)
        if "validation error" in text:  # pydantic: the line that carries the message
            text = next((l.strip() for l in text.splitlines()[1:] if l.strip()), text)
        result = {"error": type(exc).__name__, "message": text.split(" [type=")[0].replace(model, "<model-dir>")}
    result["warnings"] = list(dict.fromkeys(said))
    print("RESULT " + json.dumps([name, result]), flush=True)
'''


def capture(python: str) -> dict[str, Any]:
    planned, refused = planned_argv(), refused_argv()
    lines = [json.dumps([f"planned#{n}", m, a]) for n, (m, a) in planned.items()]
    lines += [json.dumps([f"refused#{n}", m, a]) for n, (m, a) in refused.items()]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    with tempfile.TemporaryDirectory(prefix="ep-model-") as root:
        dirs = {}
        for fixture in (V3, QWEN):
            (Path(root) / fixture).mkdir()
            (Path(root) / fixture / "config.json").write_bytes((MODELS / fixture / "config.json").read_bytes())
            dirs[fixture] = str(Path(root) / fixture)
        done = subprocess.run([python, "-c", DERIVE, json.dumps(dirs)], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, env=env, timeout=1800)
        version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                                 text=True, env=env, timeout=600).stdout.strip().splitlines()[-1:]
    results = dict(json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT "))
    missing = [n for n in (*(f"planned#{n}" for n in planned), *(f"refused#{n}" for n in refused))
               if n not in results]
    if missing:
        raise SystemExit(f"no result for {missing}: {done.stderr[-2000:]}")
    return {
        "vllm_version": version[0] if version else "?",
        "origin": "bench/expert_parallel_real_vllm.py (its docstring: the model directory, the flags left out and "
                  "the two CPU-only checks bypassed)",
        "planned": {n: {"model": m, "argv": a, **results[f"planned#{n}"]} for n, (m, a) in planned.items()},
        "refused": {n: {"model": m, "argv": a, **results[f"refused#{n}"]} for n, (m, a) in refused.items()},
    }


FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.33.0-expert-parallel.json"


def main() -> int:
    return capture_main(capture, FIXTURE)


if __name__ == "__main__":
    raise SystemExit(main())
