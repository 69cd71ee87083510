"""The entrypoint of the lab's engine image: a substitute for `vllm serve` on nodes without GPUs (a rehearsal).

The container runs the plan's own command (`vllm serve`'s arguments after the image's entrypoint, as the real
image's `ENTRYPOINT ["vllm", "serve"]` does). The head (no `--headless`) serves vLLM's OpenAI API with
checks/standin.py on the plan's --host/--port, one rank per --data-parallel-size, with the plan's API key; a headless
rank idles. Both stop on SIGTERM, as vLLM does. `/lab-answer` in the image, when present, is what every rank answers
to the golden prompt (an image that fails the post-deploy check).
"""

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
sys.exit(standin.main(["--host", option("--host", "0.0.0.0"), "--port", option("--port", "8000"),
                       "--served-name", option("--served-model-name", "model"),
                       "--dp-size", option("--data-parallel-size", "1"), *answer, *key, *reasoning]))
