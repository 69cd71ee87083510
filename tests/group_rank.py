"""A stand-in engine rank for the group supervisor tests: records its start, serves /health and /golden.

Control files in /ctl (a bind mount the test writes): `hang` makes /health answer 503 while the process lives,
`crash-<node>` makes this rank exit 1 two seconds after it starts (a crash loop).
"""

import http.server
import os
import signal
import sys
import threading
import time

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # as vLLM does: stop on SIGTERM
NODE = os.environ["RANK_NODE"]
PORT = int(os.environ.get("RANK_PORT", "8000"))
with open("/log/starts", "a") as log:
    log.write(f"{NODE} {time.time():.3f}\n")
if os.path.exists(f"/ctl/crash-{NODE}"):
    threading.Timer(2, lambda: os._exit(1)).start()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            code, body = (503, b"hung") if os.path.exists("/ctl/hang") else (200, b"ok")
        elif self.path == "/golden":
            code, body = 200, b"323"
        else:
            code, body = 404, b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


print(f"rank {NODE} serving on {PORT}", file=sys.stderr, flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
