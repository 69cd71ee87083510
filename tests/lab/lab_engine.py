"""The entrypoint of the lab's engine image: a substitute for `vllm serve` on nodes without GPUs (a rehearsal).

The container runs the plan's own command (`vllm serve`'s arguments after the image's entrypoint, as the real
image's `ENTRYPOINT ["vllm", "serve"]` does). The head (no `--headless`) serves vLLM's OpenAI API with
checks/standin.py on the plan's --host/--port, one rank per --data-parallel-size, with the plan's API key; a headless
rank idles. Both stop on SIGTERM, as vLLM does. `/lab-answer` in the image, when present, is what every rank answers
to the golden prompt (an image that fails the post-deploy check).

With `--kv-transfer-config` (a prefill or decode group, docs/disaggregation.md) the head serves the same API through
tests/pd_standin.py, which speaks vLLM's NIXL pull protocol: its `kv_role` picks the side (kv_producer: prefill,
kv_consumer: decode), `kv_load_failure_policy` what a failed pull does, and the side channel listens where vLLM's
would, on VLLM_NIXL_SIDE_CHANNEL_HOST and VLLM_NIXL_SIDE_CHANNEL_PORT plus the engine's first DP rank
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76-80, vLLM 0.33.0).
"""

import json
import os
import signal
import sys

argv = sys.argv[1:]
if argv[:1] == ["serve"]:
    argv = argv[1:]


def option(name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
if "--headless" in argv:
    signal.pause()
    sys.exit(0)
sys.path.insert(0, "/")
import standin  # noqa: E402 (copied into the image next to this file)

answer = []
if os.path.exists("/lab-answer"):
    with open("/lab-answer") as wrong:
        answer = ["--answer", wrong.read().strip()]
key = ["--api-key-env", "VLLM_API_KEY"] if os.environ.get("VLLM_API_KEY") else []
# How the model's reasoning parser turns reasoning on (stacks/planner/model_cards.py THINKING_KWARG_BY_PARSER, the
# few the lab's cards use); no parser: no reasoning, as vLLM without --reasoning-parser.
parser = option("--reasoning-parser", "")
KWARGS = {"qwen3": "enable_thinking", "openai_gptoss": "reasoning_effort"}
reasoning = ["--reasoning-key", KWARGS.get(parser, "thinking")] if parser else ["--no-reasoning"]
served = ["--host", option("--host", "0.0.0.0"), "--port", option("--port", "8000"),
          "--served-name", option("--served-model-name", "model"),
          "--dp-size", option("--data-parallel-size", "1"), *answer, *key, *reasoning]
if "--kv-transfer-config" not in argv:
    sys.exit(standin.main(served))
kv = json.loads(option("--kv-transfer-config", "{}"))
ROLES = {"kv_producer": "prefill", "kv_consumer": "decode"}
if kv.get("kv_role") not in ROLES:
    print(f"lab engine: --kv-transfer-config kv_role {kv.get('kv_role')!r}: the stand-in serves "
          f"{' or '.join(ROLES)} (what the plan renders for prefill and decode groups)", file=sys.stderr)
    sys.exit(2)
import pd_standin  # noqa: E402 (copied into the image next to this file)

side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")) + int(option("--data-parallel-start-rank", "0"))
sys.exit(pd_standin.main([*served, "--role", ROLES[kv["kv_role"]],
                          "--side-channel-host", os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                          "--side-channel-port", str(side_port),
                          "--kv-load-failure-policy", kv.get("kv_load_failure_policy", "fail")]))
