"""The prefill and decode tiers' `--kv-transfer-config` against a real vLLM 0.33.0 on CPU: each tier's planned argv
parsed by vLLM's own serve parser, built into a VllmConfig by `AsyncEngineArgs.create_engine_config`, and its
connector class resolved by `KVConnectorFactory.get_connector_class` (kv_connector/factory.py:96-129).

    VLLM_PYTHON=/tmp/loaders-py venv/bin/python bench/kv_transfer_real_vllm.py \
        > tests/fixtures/vllm-0.33.0-kv-transfer.json
    VLLM_PYTHON=... venv/bin/python bench/kv_transfer_real_vllm.py --check   # compare with the committed file

What this proves and what it does not: vLLM's parser takes the JSON, KVTransferConfig validates it
(vllm/config/kv_transfer.py:56-124: the role, the failure policy), the engine config keeps every value the plan
asked for, and the connector name resolves to the class the planner's rules were read from. The connector itself is
not constructed: that needs the `nixl` package (the capture records whether it was importable; on the CPU
interpreter it is not, and vLLM logs "NIXL is not available", vllm/distributed/nixl_utils.py) and a GPU KV cache to
register. The handshake rules (stacks/planner/kv_transfer.py) are therefore read from the code, not run here.

- `planned`: each tier of examples/Pulumi.lab.yaml as a real vLLM 0.33.0 stack of one node (no rehearsal, the
  v0.33.0 image), its planned head argv with the tier's `kv_transfer_args` appended.
- `refused`: hand-written argv for what the planner never renders, with what vLLM does with each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.load_formats_real_vllm import MODEL, lab_values, strip  # noqa: E402
from bench.real_vllm_capture import RESULT_LOOP, run  # noqa: E402
from bench.real_vllm_capture import main as capture_main  # noqa: E402
from stacks.model.config import StackConfig  # noqa: E402
from stacks.model.kv_transfer_config import KvTransferConfig  # noqa: E402
from stacks.model.loader import parse_config  # noqa: E402
from stacks.planner.kv_transfer import Tier, kv_transfer_args  # noqa: E402
from stacks.planner.plan import build_plan  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "NixlConnector, defaults": {},
    "NixlPushConnector, cpu buffer, recompute": {"connector": "NixlPushConnector", "buffer_device": "cpu",
                                                 "load_failure_policy": "recompute"},
}
"""The stack's kv_transfer settings each case renders (KvTransferConfig fields)."""


def tier_config(tier: Tier) -> StackConfig:
    """One node of the lab stack as a tier of its own: lab1 prefills, lab2 decodes, TP1, DP1."""
    values = lab_values()
    values["nodes"] = [values["nodes"][0 if tier == "prefill" else 1]]
    values["parallelism"] |= {"data": 1}
    return parse_config("bench", values)


def tier_argv(tier: Tier, settings: KvTransferConfig) -> list[str]:
    """The tier's planned head argv after the model path (tokenizer flags left out) and its KV transfer flag."""
    config = tier_config(tier)
    plan = build_plan("bench", config)
    return [*strip(plan.nodes[0].containers[0].vllm_args or []), *kv_transfer_args(settings, tier)]


def planned_argv() -> dict[str, list[str]]:
    return {f"{tier}, {name}": tier_argv(tier, KvTransferConfig(**values))
            for name, values in SETTINGS.items() for tier in ("prefill", "decode")}


def planned_settings() -> dict[str, tuple[Tier, KvTransferConfig]]:
    """Case name -> (its tier, its settings), as `planned_argv` names them."""
    return {f"{tier}, {name}": (tier, KvTransferConfig(**values))
            for name, values in SETTINGS.items() for tier in ("prefill", "decode")}


def refused_argv() -> dict[str, list[str]]:
    base = strip(build_plan("bench", tier_config("prefill")).nodes[0].containers[0].vllm_args or [])
    return {
        "connector without kv_role": [*base, "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'],
        "failure policy not in vLLM's list": [*base, "--kv-transfer-config",
                                              '{"kv_connector":"NixlConnector","kv_role":"kv_producer",'
                                              '"kv_load_failure_policy":"retry"}'],
        "unregistered connector": [*base, "--kv-transfer-config",
                                   '{"kv_connector":"NixlConnectr","kv_role":"kv_producer"}'],
        "--kv-offloading-size with the producer": [*base, "--kv-transfer-config",
                                                   '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
                                                   "--kv-offloading-size", "4"],
    }


DERIVE = r'''
import contextlib, importlib.util, io, json, sys
import vllm
from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

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
    config = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless)
    kv = config.kv_transfer_config
    try:
        connector = KVConnectorFactory.get_connector_class(kv).__name__
    except Exception as exc:
        connector = f"{type(exc).__name__}: {exc}"
    return {"ok": {"kv_connector": kv.kv_connector, "kv_role": kv.kv_role, "kv_buffer_device": kv.kv_buffer_device,
                   "kv_load_failure_policy": kv.kv_load_failure_policy,
                   "kv_connector_extra_config": kv.kv_connector_extra_config,
                   "engine_id_drawn": bool(kv.engine_id), "is_kv_producer": kv.is_kv_producer,
                   "is_kv_consumer": kv.is_kv_consumer, "connector_class": connector}}

print("NIXL " + json.dumps(importlib.util.find_spec("nixl") is not None), flush=True)
'''


def capture(python: str) -> dict[str, Any]:
    planned, refused = planned_argv(), refused_argv()
    results, stdout, version = run(python, DERIVE + RESULT_LOOP, MODEL, planned, refused, "kv-model-")
    nixl = next((json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("NIXL ")), None)
    return {
        "vllm_version": version,
        "origin": "bench/kv_transfer_real_vllm.py (its docstring: what is and is not tried)",
        "nixl_importable": nixl,
        "planned": {n: {"argv": a, **results[f"planned#{n}"]} for n, a in planned.items()},
        "refused": {n: {"argv": a, **results[f"refused#{n}"]} for n, a in refused.items()},
    }


FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.33.0-kv-transfer.json"


def main() -> int:
    return capture_main(capture, FIXTURE)


if __name__ == "__main__":
    raise SystemExit(main())
