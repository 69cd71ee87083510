"""The load-format keys against a real vLLM 0.33.0 on CPU: the planned argv parsed, configured and handed to the
loader vLLM picks, the refused ones tried the same way.

    VLLM_PYTHON=<venv with vllm==0.33.0>/bin/python venv/bin/python bench/load_formats_real_vllm.py \
        > tests/fixtures/vllm-0.33.0-load-formats.json
    VLLM_PYTHON=... venv/bin/python bench/load_formats_real_vllm.py --check   # compare with the committed file

Every case goes through vLLM's own serve parser, `AsyncEngineArgs.create_engine_config` (which builds the
LoadConfig: vllm/engine/arg_utils.py:2076-2099) and `get_model_loader` on that LoadConfig (which constructs the
loader class the format is registered to, and with it every check a loader makes of model_loader_extra_config in
its __init__: vllm/model_executor/model_loader/__init__.py:123-128), with a model directory that holds only
Qwen3-8B's config.json (tests/fixtures/models/qwen3-8b). Nothing is bypassed. Reading the weights is not tried:
there are none, and the formats that need packages or files the image lacks are refused by the planner from the
cards (tests/test_load_formats.py), not here.

- `planned`: the argv `python -m stacks plan` renders for examples/Pulumi.lab.yaml as a real vLLM 0.33.0 stack
  (no rehearsal, the v0.33.0 image) with the loader keys set: each must be accepted, with the values asked for.
- `refused`: hand-written argv for what the planner refuses, with what vLLM does with each (its error, or that it
  takes the value: the planner is stricter where a value would do nothing or fail only when the weights load).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_vllm_capture import RESULT_LOOP, run  # noqa: E402
from bench.real_vllm_capture import main as capture_main  # noqa: E402
from stacks.model.loader import parse_config, read_stack_values  # noqa: E402
from stacks.planner.plan import build_plan  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3-8b" / "config.json"
DROP = {"--tokenizer-mode": 1, "--tool-call-parser": 1, "--reasoning-parser": 1, "--enable-auto-tool-choice": 0}
"""Flags that need the model's tokenizer (a config.json alone has none), and how many values each takes."""


def lab_values(**serving: Any) -> dict[str, Any]:
    """examples/Pulumi.lab.yaml as a real stack on vllm/vllm-openai:v0.33.0, with `serving` keys set; `tensor`
    gives every node that many GPUs and TP."""
    values = copy.deepcopy(read_stack_values("lab", ROOT / "examples"))
    values["rehearsal"] = False
    values["image"] = "vllm/vllm-openai:v0.33.0"
    values["model"].pop("source", None)
    tensor = serving.pop("tensor", 1)
    for node in values["nodes"]:
        node["gpus"] |= {"count": tensor}
    values["parallelism"] |= {"tensor": tensor}
    values["serving"] |= serving
    return values


def planned_values() -> dict[str, dict[str, Any]]:
    return {
        "fastsafetensors": lab_values(load_format="fastsafetensors"),
        "instanttensor": lab_values(load_format="instanttensor"),
        "safetensors, prefetch": lab_values(load_format="safetensors", safetensors_load_strategy="prefetch"),
        "auto, eager": lab_values(safetensors_load_strategy="eager"),
        "auto, lazy, 16 loader threads, weights tracked": lab_values(
            safetensors_load_strategy="lazy", model_loader_extra_config={
                "enable_multithread_load": True, "num_threads": 16, "enable_weights_track": True}),
        "sharded_state, TP2, default pattern": lab_values(load_format="sharded_state", tensor=2),
        "sharded_state, TP2, own pattern": lab_values(load_format="sharded_state", tensor=2,
                                                      model_loader_extra_config={
                                                          "pattern": "model-{rank}-part-{part}.safetensors"}),
        "pt": lab_values(load_format="pt"),
        "mistral": lab_values(load_format="mistral"),
    }


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


def planned_argv() -> dict[str, list[str]]:
    """Case name -> the planned `vllm serve` argv of the head after the model path, tokenizer flags left out."""
    out = {}
    for name, values in planned_values().items():
        plan = build_plan("bench", parse_config("bench", values))
        out[name] = strip(plan.node("lab1").containers[0].vllm_args or [])
    return out


def refused_argv() -> dict[str, list[str]]:
    """Hand-written argv for what the planner refuses (tests/test_load_formats.py names the key of each)."""
    base = planned_argv()["fastsafetensors"][:-2]  # the lab stack's argv without --load-format
    return {
        "unknown load format": [*base, "--load-format", "bogus"],
        "strategy not in vLLM's list": [*base, "--safetensors-load-strategy", "fast"],
        "unknown extra-config key, default loader": [*base, "--model-loader-extra-config", '{"threads":4}'],
        "multi-thread with eager": [*base, "--safetensors-load-strategy", "eager", "--model-loader-extra-config",
                                    '{"enable_multithread_load":true}'],
        "num_threads 0": [*base, "--model-loader-extra-config", '{"enable_multithread_load":true,"num_threads":0}'],
        "num_threads true": [*base, "--model-loader-extra-config",
                             '{"enable_multithread_load":true,"num_threads":true}'],
        "num_threads without multi-thread": [*base, "--model-loader-extra-config", '{"num_threads":4}'],
        "strategy with fastsafetensors": [*base, "--load-format", "fastsafetensors", "--safetensors-load-strategy",
                                          "eager"],
        "runai_streamer, unknown key": [*base, "--load-format", "runai_streamer", "--model-loader-extra-config",
                                        '{"threads":4}'],
        "runai_streamer, concurrency 0": [*base, "--load-format", "runai_streamer", "--model-loader-extra-config",
                                          '{"concurrency":0}'],
        "sharded_state, unknown key": [*base, "--load-format", "sharded_state", "--model-loader-extra-config",
                                       '{"pattern":"m-{rank}.safetensors","parts":2}'],
        "dummy with extra config": [*base, "--load-format", "dummy", "--model-loader-extra-config",
                                    '{"enable_weights_track":true}'],
        "ipc_cache, unknown key": [*base, "--load-format", "ipc_cache", "--model-loader-extra-config",
                                   '{"socket":"/tmp/x"}'],
    }


DERIVE = r'''
import contextlib, io, json, sys
import vllm
from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
from vllm.model_executor.model_loader import get_model_loader

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
    load = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless).load_config
    loader = get_model_loader(load)
    extra = json.loads(json.dumps(load.model_loader_extra_config, default=str).replace(model, "<model-dir>"))
    return {"ok": {"load_format": load.load_format, "safetensors_load_strategy": load.safetensors_load_strategy,
                   "model_loader_extra_config": extra, "loader": type(loader).__name__}}

'''


def capture(python: str) -> dict[str, Any]:
    planned, refused = planned_argv(), refused_argv()
    results, _, version = run(python, DERIVE + RESULT_LOOP, MODEL, planned, refused, "load-model-")
    return {
        "vllm_version": version,
        "origin": "bench/load_formats_real_vllm.py (its docstring: the model directory, what is and is not tried)",
        "planned": {n: {"argv": a, **results[f"planned#{n}"]} for n, a in planned.items()},
        "refused": {n: {"argv": a, **results[f"refused#{n}"]} for n, a in refused.items()},
    }


FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.33.0-load-formats.json"


def main() -> int:
    return capture_main(capture, FIXTURE)


if __name__ == "__main__":
    raise SystemExit(main())
