"""A stand-in for the vLLM package inside a test image: the real 0.33.0 `vllm serve` flag surface and the
part of serve's own logic that runs before the engine is built, no engine.

Flags (with their defaults) come from tests/fixtures/vllm-0.33.0-serve-flags.json and the parser registries
from tests/fixtures/vllm-0.33.0-registries.json, both dumped from the real package (tests/fixtures/README.md);
`_flags.json` / `_registries.json` beside this file override them (a "newer vLLM" that renamed a flag).
Every check reproduced here names the upstream lines it mirrors; nothing else of vLLM is imitated.
bench/dry_run_real_vllm.py runs the same argv through this stand-in and the real vLLM 0.33.0 and compares.
"""

import json
import os

__version__ = "0.33.0"

_HERE = os.path.dirname(os.path.abspath(__file__))


def _fixture(local_name, env_name):
    local = os.path.join(_HERE, local_name)
    path = local if os.path.exists(local) else os.environ[env_name]
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def __getattr__(name):
    # vllm/__init__.py exports AsyncEngineArgs lazily; serve.py calls vllm.AsyncEngineArgs.from_cli_args.
    if name == "AsyncEngineArgs":
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs
    raise AttributeError(name)
