"""The entrypoint of the test image that stands in for vLLM in the end-to-end healing tests.

The container runs the plan's own command (`vllm serve`'s arguments after the image's entrypoint, as the real
image's `ENTRYPOINT ["vllm", "serve"]` does). The head (no `--headless`) serves the OpenAI API with
checks/standin.py on the plan's --host/--port, one rank per --data-parallel-size; a headless rank idles. Both
stop on SIGTERM, as vLLM does. Each start appends `<VLLM_HOST_IP> <time>` to /root/.cache/starts (the plan's
cache mount); the head reads faults from /models/control.json (the plan's model mount), and a rank whose
VLLM_HOST_IP is that file's `crash` exits 1 a second after it starts (a crash loop).
"""

import json
import os
import signal
import sys
import threading
import time

argv = sys.argv[1:]


def option(name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


with open("/root/.cache/starts", "a") as log:
    log.write(f"{os.environ.get('VLLM_HOST_IP', '?')} {time.time():.3f}\n")
try:
    with open("/models/control.json") as control:
        crash = json.load(control).get("crash")
except (OSError, ValueError):
    crash = None
if crash and crash == os.environ.get("VLLM_HOST_IP"):
    threading.Timer(1, lambda: os._exit(1)).start()
if "--headless" in argv:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        time.sleep(3600)
sys.path.insert(0, "/")
import standin  # noqa: E402 (copied into the image next to this file)

sys.exit(standin.main(["--host", option("--host", "127.0.0.1"), "--port", option("--port", "8000"),
                       "--served-name", option("--served-model-name", "model"),
                       "--dp-size", option("--data-parallel-size", "1"), "--control-file", "/models/control.json"]))
