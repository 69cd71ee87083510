"""OpenAI-compatible stand-in for the GPU engine, for tests: a real HTTP server in its own process.

Behaviours: a slow start (the port opens late, as while weights load), /health 503 before 200, wrong
answers, no reasoning, SSE streaming with [DONE] (chat and completions), bearer auth on /v1 paths like vLLM's
--api-key, and like vLLM some keyless paths left open (/metrics, /tokenize).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ARGS: argparse.Namespace
STARTED = 0.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn does: no 40 ms delayed-ACK stall between headers and body

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, code: int, body: dict[str, Any] | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        key = os.environ.get(ARGS.api_key_env) if ARGS.api_key_env else None
        if not key or not self.path.startswith("/v1"):
            return True
        return self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self) -> None:
        if self.path == "/health":
            ready = time.monotonic() - STARTED >= ARGS.unhealthy_s
            self._send(200 if ready else 503, "" if ready else "engine not ready", "text/plain")
        elif not self._authorized():
            self._send(401, {"error": "Unauthorized"})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": ARGS.served_name, "object": "model"}]})
        elif self.path in ("/metrics", "/server_info", "/is_paused"):  # like vLLM: open, no key needed
            self._send(200, "vllm:num_requests_running 0\n", "text/plain")
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if not self._authorized():
            self._send(401, {"error": "Unauthorized"})
            return
        if self.path in ("/tokenize", "/pause", "/collective_rpc", "/invocations"):  # open in vLLM, no key
            self._send(200, {"ok": True, "path": self.path})
            return
        if self.path == "/v1/completions":
            if body.get("stream"):
                self._stream(ARGS.answer, chat=False)
            else:
                self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": ARGS.served_name,
                                 "choices": [{"index": 0, "text": ARGS.answer, "finish_reason": "stop"}]})
            return
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        thinking = (body.get("chat_template_kwargs") or {}).get("thinking", False)
        message: dict[str, Any] = {"role": "assistant", "content": ARGS.answer}
        if thinking and not ARGS.no_reasoning:
            message["reasoning_content"] = "17*19 = 17*20 - 17 = 340 - 17 = 323"
        if body.get("stream"):
            self._stream(ARGS.answer)
            return
        self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": ARGS.served_name,
                         "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    def _stream(self, text: str, chat: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(payload: str) -> None:
            data = payload.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        time.sleep(ARGS.first_token_delay_s)  # prefill
        for piece in [text[i:i + 1] for i in range(len(text))]:
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            chunk(f"data: {json.dumps({'choices': [choice]})}\n\n")
            time.sleep(ARGS.token_delay_s)
        if not ARGS.no_done:
            chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


def main() -> None:
    global ARGS, STARTED
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-name", default="DeepSeek-V4.1-Flash")
    p.add_argument("--answer", default="323")
    p.add_argument("--start-delay-s", type=float, default=0)
    p.add_argument("--unhealthy-s", type=float, default=0)
    p.add_argument("--api-key-env", default="")
    p.add_argument("--no-reasoning", action="store_true")
    p.add_argument("--no-done", action="store_true")
    p.add_argument("--token-delay-s", type=float, default=0.01)
    p.add_argument("--first-token-delay-s", type=float, default=0)
    ARGS = p.parse_args()
    time.sleep(ARGS.start_delay_s)
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    STARTED = time.monotonic()
    server.serve_forever()


if __name__ == "__main__":
    main()
