"""Stand-in for vllm/entrypoints/launchers/api_server/entry.py: the single API server's path to the engine.

Mirrors vLLM 0.33.0 entry.py lines 164-177 (`run_server`: `setup_server`, then the worker) and the worker's
way to the engine config: lines 52 and 82 (`AsyncEngineArgs.from_cli_args`, `create_engine_config`).
"""

import vllm
from vllm.entrypoints.launchers import launcher


async def run_server(args, **uvicorn_kwargs):
    _listen_address, sock = launcher.setup_server(args, reuse_port=False)
    engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
    engine_args.create_engine_config()
    sock.close()
