"""A local server that answers like vLLM 0.33.0's OpenAI API, for trying the checks without GPUs.

    python -m checks.standin --port 8000 --dp-size 2 --wrong-rank 1

Then `python -m checks.api --url http://127.0.0.1:8000 --served-name DeepSeek-V4.1-Flash --dp-size 2` passes
for rank 0 and fails naming rank 1 (docs/checks-by-hand.md). Standard library only: it also runs as a bare
script inside a container (`python3 standin.py ...`).

What it does as vLLM 0.33.0 does: `X-data-parallel-rank: r` pins a chat/completion request to DP rank r
(`vllm/entrypoints/generate/base/serving.py`, `_get_data_parallel_rank`: a value that is not an integer is
ignored and the request is load balanced); a rank outside [0, dp size) is refused by
`vllm/v1/engine/input_processor.py` with `data_parallel_rank R is out of range [0, N).`, a 400 without
streaming and, with streaming, a 200 whose stream carries the error and then [DONE]
(`chat_completion/serving.py`). Without the header requests go round robin over the ranks. Bearer auth on /v1
paths like `--api-key` (the key read from the environment variable `--api-key-env` names), with some keyless
paths left open as in vLLM (/metrics, /tokenize). SSE streaming with [DONE]; answers carry `usage` (one token
per character), and streams a usage chunk when `stream_options.include_usage` is set.

Faults to try the checks against: a slow start (`--start-delay-s`: the port opens late, as while weights load),
/health 503 before 200 (`--unhealthy-s`), wrong answers (`--answer`, `--wrong-rank`), a rank that fails like a
dead engine (`--down-rank`: HTTP 500), no reasoning, no [DONE], a proxy that drops the rank header;
`--control-file` (JSON, read on every request: `wrong_rank`, `down_rank`) changes the faults while it runs.

For tests of streaming through a proxy, a request header `X-Standin-Hold: <path> <seconds>` holds a stream after
its first token until `<path>` exists (the client creates it once it has read that token) or the seconds pass;
the next event says which (`{"standin_hold": "released"}` or `"expired"`), so no test has to time chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ARGS: argparse.Namespace
STARTED = 0.0
ROUND_ROBIN = [0]
ENGINE_DEAD = "The server had an error while processing your request."  # vllm/v1/engine/exceptions.py
COMPLETIONS = ("/v1/completions", "/v1/chat/completions")


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    """vLLM's ErrorResponse (`vllm/entrypoints/serve/engine/protocol.py`)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


LAST_CONTROL: list[dict[str, Any]] = []


def _faults() -> tuple[int | None, int | None]:
    """(wrong rank, down rank): the control file when there is one (the last complete one while it is being
    rewritten), else the flags."""
    if ARGS.control_file and os.path.exists(ARGS.control_file):
        try:
            with open(ARGS.control_file) as handle:
                LAST_CONTROL[:] = [json.load(handle)]
        except ValueError:
            pass
    if LAST_CONTROL:
        return LAST_CONTROL[0].get("wrong_rank"), LAST_CONTROL[0].get("down_rank")
    return ARGS.wrong_rank, ARGS.down_rank


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
        elif self.path == "/metrics" and ARGS.metrics_file:  # a recorded vLLM exposition, served as is
            with open(ARGS.metrics_file, encoding="utf-8") as handle:
                self._send(200, handle.read(), "text/plain; version=0.0.4; charset=utf-8")
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
        if self.path not in COMPLETIONS:
            self._send(404, {"error": "not found"})
            return
        self._complete(body)

    def _response_fields(self) -> dict[str, Any]:
        """More top-level fields of a non-streamed answer: none here; the prefill/decode stand-in
        (tests/pd_standin.py) adds the prefill's `kv_transfer_params`."""
        return {}

    def _complete(self, body: dict[str, Any]) -> None:
        """Answer a chat or completion request (its key already checked): DP rank, faults, reasoning, streaming."""
        stream = bool(body.get("stream"))
        usage_chunk = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        rank = self._rank()
        if rank is not None and not 0 <= rank < ARGS.dp_size:
            error = _error(f"data_parallel_rank {rank} is out of range [0, {ARGS.dp_size}).", "BadRequestError", 400)
            if stream:
                self._stream("", chat=self.path.endswith("chat/completions"), error=error)
            else:
                self._send(400, error)
            return
        if rank is None:
            rank = ROUND_ROBIN[0] % ARGS.dp_size
            ROUND_ROBIN[0] += 1
        wrong, down = _faults()
        if rank == down:
            self._send(500, _error(ENGINE_DEAD, "InternalServerError", 500))
            return
        answer = ARGS.wrong_answer if rank == wrong else ARGS.answer
        if self.path == "/v1/completions":
            if stream:
                self._stream(answer, chat=False, usage=usage_chunk)
            else:
                self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": ARGS.served_name,
                                 "choices": [{"index": 0, "text": answer, "finish_reason": "stop"}],
                                 "usage": _usage(answer), **self._response_fields()})
            return
        kwargs = body.get("chat_template_kwargs") or {}
        if ARGS.reasoning_key == "enable_thinking":  # Qwen3: on unless turned off (vllm/parser/qwen3.py:317-318)
            thinking = kwargs.get("enable_thinking", True) is not False
        elif ARGS.reasoning_key == "reasoning_effort":  # gpt-oss: harmony reasons on every request
            thinking = True
        else:  # DeepSeek's templates: `thinking`
            thinking = bool(kwargs.get("thinking", False))
        reasoning = ""
        if thinking and not ARGS.no_reasoning:
            reasoning = "17*19 = 17*20 - 17 = 340 - 17 = 323"
            if int(body.get("max_tokens") or 4096) < 256:  # the reasoning used up max_tokens: no answer
                answer = ""
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if reasoning:
            message["reasoning_content"] = reasoning
        if stream:
            self._stream(answer, usage=usage_chunk)
            return
        self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": ARGS.served_name,
                         "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                         "usage": _usage(answer + reasoning), **self._response_fields()})

    def _rank(self) -> int | None:
        """As vLLM's `_get_data_parallel_rank`: the header as an int, None when absent or not an int."""
        value = self.headers.get("X-data-parallel-rank")
        if value is None or ARGS.drop_rank_header:  # as a frontend or proxy that loses the header would
            return None
        try:
            return int(value)
        except ValueError:
            return None

    def do_PUT(self) -> None:
        self._other_method()

    def do_PATCH(self) -> None:
        self._other_method()

    def do_DELETE(self) -> None:
        self._other_method()

    def _other_method(self) -> None:
        """Like FastAPI: a known path with another method is 405, an unknown one 404; keyless paths stay open."""
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        known = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/metrics", "/tokenize")
        self._send(405 if self.path in known else 404, {"detail": "Method Not Allowed" if self.path in known
                                                        else "Not Found"})

    def _stream(self, text: str, chat: bool = True, usage: bool = False, error: dict[str, Any] | None = None
                ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(payload: str) -> None:
            data = payload.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        time.sleep(ARGS.first_token_delay_s)  # prefill
        if error is not None:
            chunk(f"data: {json.dumps(error)}\n\n")
        hold = self.headers.get("X-Standin-Hold")
        for i, piece in enumerate([text[i:i + 1] for i in range(len(text))]):
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            chunk(f"data: {json.dumps({'choices': [choice]})}\n\n")
            if i == 0 and hold:
                path, seconds = hold.rsplit(" ", 1)
                deadline = time.monotonic() + float(seconds)
                while not os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.02)
                chunk(f"data: {json.dumps({'standin_hold': 'released' if os.path.exists(path) else 'expired'})}\n\n")
            time.sleep(ARGS.token_delay_s)
        if usage:
            chunk(f"data: {json.dumps({'choices': [], 'usage': _usage(text)})}\n\n")
        if not ARGS.no_done:
            chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


def _usage(text: str) -> dict[str, int]:
    return {"prompt_tokens": 12, "completion_tokens": len(text), "total_tokens": 12 + len(text)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.standin", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000, help="port to listen on, 0 for any free one [8000]")
    p.add_argument("--host", default="127.0.0.1", help="address to bind [127.0.0.1] (::1 for IPv6 loopback)")
    p.add_argument("--served-model-name", "--served-name", dest="served_name", default="DeepSeek-V4.1-Flash",
                   help="the model name /v1/models lists [DeepSeek-V4.1-Flash]")
    p.add_argument("--answer", default="323", help="what every rank answers [323, the default golden answer]")
    p.add_argument("--start-delay-s", type=float, default=0, help="open the port this late (weights loading)")
    p.add_argument("--unhealthy-s", type=float, default=0, help="/health answers 503 this long after start")
    p.add_argument("--api-key-env", default="",
                   help="environment variable holding the bearer key /v1 paths require (like vllm --api-key)")
    p.add_argument("--no-reasoning", action="store_true", help="thinking on returns no reasoning_content")
    p.add_argument("--reasoning-key", default="thinking", choices=("thinking", "enable_thinking", "reasoning_effort"),
                   help="what turns reasoning on, as the model's parser reads it: chat_template_kwargs thinking "
                        "(DeepSeek, off by default), enable_thinking (Qwen3, on by default), or nothing (gpt-oss "
                        "always reasons); reasoning leaves no answer within max_tokens below 256")
    p.add_argument("--no-done", action="store_true", help="streams end without [DONE]")
    p.add_argument("--token-delay-s", type=float, default=0.01, help="seconds between streamed tokens")
    p.add_argument("--first-token-delay-s", type=float, default=0, help="seconds before the first token")
    p.add_argument("--dp-size", type=int, default=1, help="data-parallel ranks [1]")
    p.add_argument("--wrong-rank", type=int, default=None, help="this DP rank answers --wrong-answer")
    p.add_argument("--wrong-answer", default="324")
    p.add_argument("--down-rank", type=int, default=None, help="this DP rank fails like a dead engine (500)")
    p.add_argument("--control-file", default="", help="JSON {wrong_rank, down_rank} read on every request")
    p.add_argument("--metrics-file", default="", help="serve this file as /metrics (a recorded exposition)")
    p.add_argument("--drop-rank-header", action="store_true", help="ignore X-data-parallel-rank (balance instead)")
    return p


def _problem(args: argparse.Namespace) -> str | None:
    """The first bad argument: flag, value and what works."""
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: must be 0-65535 (0 picks a free port)"
    if not 1 <= args.dp_size <= 1024:
        return f"--dp-size {args.dp_size}: must be 1-1024"
    for flag, rank in (("--wrong-rank", args.wrong_rank), ("--down-rank", args.down_rank)):
        if rank is not None and not 0 <= rank < args.dp_size:
            return f"{flag} {rank}: must be a DP rank of this server, 0-{args.dp_size - 1} (--dp-size {args.dp_size})"
    for flag, value in (("--start-delay-s", args.start_delay_s), ("--unhealthy-s", args.unhealthy_s),
                        ("--token-delay-s", args.token_delay_s), ("--first-token-delay-s", args.first_token_delay_s)):
        if not 0 <= value <= 86_400:
            return f"{flag} {value}: must be 0-86400 seconds"
    for flag, value in (("--control-file", args.control_file), ("--metrics-file", args.metrics_file)):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):  # not echoed: the terminal would act on them
            return f"{flag}: holds control characters; give a plain file path, e.g. /tmp/standin-control.json"
    if not args.served_name.strip():
        return "--served-model-name '': give the name clients ask for, e.g. DeepSeek-V4.1-Flash"
    if not re.fullmatch(r"[A-Za-z0-9.:%\[\]-]{1,253}", args.host):  # not echoed: it may be a URL with a password
        return "--host: not an address or host name; give one such as 127.0.0.1, ::1 or localhost"
    if args.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", args.api_key_env):
        return ("--api-key-env: not an environment variable's name (the value is not shown: it may be a key); "
                "give the NAME of the variable that holds the key, e.g. VLLM_API_KEY")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        return (f"--api-key-env {args.api_key_env}: that environment variable is not set or empty; export it with "
                "the key, or leave --api-key-env out for a server without a key")
    return None


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    global ARGS, STARTED
    parser = _parser()
    ARGS, unknown = parser.parse_known_args(argv)
    if unknown:  # name the unknown options only: a value after one may be a key (`--api-key sk-…`)
        flags = [word.split("=", 1)[0] for word in unknown if word.startswith("-")] or ["a word without a flag"]
        parser.error(f"unknown option(s) {', '.join(flags)} (values not shown); see --help")
    problem = _problem(ARGS)
    if problem:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops it, even started from a script
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        time.sleep(ARGS.start_delay_s)
        server_class = ThreadingHTTPServer
        if ":" in ARGS.host:
            class Server6(ThreadingHTTPServer):
                address_family = socket.AF_INET6
            server_class = Server6
        try:
            server = server_class((ARGS.host, ARGS.port), Handler)
        except (OSError, ValueError) as exc:
            print(f"{parser.prog}: error: --host {ARGS.host} --port {ARGS.port}: cannot listen there ({exc}); "
                  "pick another port (0 for any free one) or a local address", file=sys.stderr)
            return 2
        STARTED = time.monotonic()
        host = f"[{ARGS.host}]" if ":" in ARGS.host else ARGS.host
        faults = "".join([f", rank {ARGS.wrong_rank} answers {ARGS.wrong_answer!r}" if ARGS.wrong_rank is not None
                          else "", f", rank {ARGS.down_rank} fails (500)" if ARGS.down_rank is not None else "",
                          f", key from ${ARGS.api_key_env}" if ARGS.api_key_env else ""])
        print(f"serving {ARGS.served_name!r} (DP{ARGS.dp_size}{faults}) on http://{host}:{server.server_port} "
              "- Ctrl-C stops", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
