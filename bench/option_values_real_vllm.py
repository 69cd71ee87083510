"""What vLLM's own parser and config classes decide for hand-picked `vllm serve` values, recorded as test data.

    VLLM_TARGET_DEVICE=cpu <venv with vllm 0.33.0>/bin/python bench/option_values_real_vllm.py --write

Builds `vllm serve`'s parser as the `vllm` command does (vllm/entrypoints/cli/main.py), parses each argv of
tests/fixtures/vllm/option_values_0.33.0.json and, since `--optimization-level` is read as text by argparse and
validated only when VllmConfig is built (config/vllm.py:435, an `OptimizationLevel` IntEnum field of a pydantic
dataclass), validates that text as pydantic does. Prints one line per case; `--write` records each decision
(`accept` or `refuse`) in the fixture, which tests/test_image_cards.py holds the offline check to.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm" / "option_values_0.33.0.json"


def decide(argv: list[str]) -> str:
    """`accept` or `refuse`, as vLLM 0.33.0 would before any engine starts."""
    from pydantic import TypeAdapter
    from vllm.config.vllm import OptimizationLevel
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    serve.cmd_init()[0].subparser_init(top.add_subparsers(required=False, dest="subparser"))
    try:
        args = top.parse_args(["serve", "model", *argv])
    except SystemExit:
        return "refuse"
    except Exception:  # e.g. CUDAGraphMode's validator raises KeyError through argparse
        return "refuse"
    try:
        TypeAdapter(OptimizationLevel).validate_python(args.optimization_level)
    except Exception:  # pydantic's ValidationError
        return "refuse"
    return "accept"


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    cases = json.loads(FIXTURE.read_text())
    import vllm

    for case in cases["cases"]:
        case["vllm"] = decide(case["argv"])
        print(case["vllm"], json.dumps(case["argv"]))
    cases["decided_with"] = f"vLLM {vllm.__version__} (bench/option_values_real_vllm.py)"
    if "--write" in sys.argv:
        FIXTURE.write_text(json.dumps(cases, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
