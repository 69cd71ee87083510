"""A loopback stand-in for the Hugging Face Hub's file server, for `model-card hf://...` tests (no traffic leaves the
machine): `/{repo}/resolve/{revision}/{file}` as huggingface_hub builds it, `X-Repo-Commit` on the Hub's answers,
`X-Error-Code` on its errors, a 302 to a CDN of another origin for `*.safetensors` (as Git LFS / Xet files are served)
and ranged GETs answered 206 with `Content-Range` (416 past the end). Every request is logged with whether it carried
the token, so a test can show the CDN never got it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    """One repository: its files (a model directory) and how the server treats it."""

    root: Path
    token: str | None = None
    """When set, every request for this repository needs `Authorization: Bearer <token>` (401 without, as the Hub
    answers for a private or gated repository)."""
    renamed_from: str | None = None
    """An old name that answers with a relative redirect to this one (the Hub does this for a renamed repo)."""


@dataclass
class Hub:
    repos: dict[str, Repo]
    port: int = 0
    log: list[dict[str, object]] = field(default_factory=list)
    served: int = 0
    """Body bytes sent, over all requests."""
    hostile: str | None = None
    """'reflect': echo the Authorization header into the error answers; 'loop': redirect every shard forever;
    'file': redirect shards to a file: URL; 'ignore-range': answer ranged GETs with the whole file (200)."""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            hub.served += len(body)

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            hub.log.append({"path": self.path, "host": self.headers.get("Host"), "auth": auth,
                            "range": self.headers.get("Range")})
            cdn = re.fullmatch(r"/cdn/(.+)/([^/]+)", self.path)
            if cdn:
                repo = hub.repos[unquote(cdn.group(1))]
                return self._file(repo.root / unquote(cdn.group(2)), {})
            match = re.fullmatch(r"/(.+?)/resolve/([^/]+)/([^/]+)", self.path)
            if not match:
                return self._send(404, b"no such route")
            name, revision, file = unquote(match.group(1)), unquote(match.group(2)), unquote(match.group(3))
            moved = next((n for n, r in hub.repos.items() if r.renamed_from == name), None)
            if moved:  # a relative Location, as the Hub sends for a renamed repository
                return self._send(307, headers={"Location": f"/{moved}/resolve/{match.group(2)}/{match.group(3)}"})
            repo = hub.repos.get(name)
            commit = {"X-Repo-Commit": COMMIT}
            echo = (auth or "") if hub.hostile == "reflect" else ""
            if repo is None:
                return self._send(401, f"Repository not found {echo}".encode(),
                                  {"X-Error-Code": "RepoNotFound", "X-Error-Message": f"no {echo}"})
            if repo.token is not None and auth != f"Bearer {repo.token}":
                return self._send(401, f"Invalid credentials {echo}".encode(),
                                  {"X-Error-Code": "RepoNotFound", "X-Error-Message": f"Invalid {echo}"})
            if revision not in ("main", COMMIT):
                return self._send(404, b"Revision Not Found", {"X-Error-Code": "RevisionNotFound", **commit})
            path = repo.root / file
            if not path.is_file():
                return self._send(404, f"Entry not found {echo}".encode(), {"X-Error-Code": "EntryNotFound", **commit})
            if file.endswith(".safetensors"):
                if hub.hostile == "loop":
                    return self._send(302, headers={"Location": self.path, **commit})
                if hub.hostile == "file":
                    return self._send(302, headers={"Location": f"file:///etc/passwd?{echo}", **commit})
                host = f"localhost:{hub.port}"  # another origin: the token must not follow
                return self._send(302, headers={"Location": f"http://{host}/cdn/{match.group(1)}/{match.group(3)}",
                                                **commit})
            return self._file(path, commit)

        def _file(self, path: Path, headers: dict[str, str]) -> None:
            if not path.is_file():
                return self._send(404, b"gone from the CDN")
            data = path.read_bytes()
            wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
            if not wanted or hub.hostile == "ignore-range":
                return self._send(200, data, headers)
            start, end = int(wanted.group(1)), int(wanted.group(2))
            if start >= len(data):
                return self._send(416, headers={"Content-Range": f"bytes */{len(data)}", **headers})
            end = min(end, len(data) - 1)
            return self._send(206, data[start:end + 1],
                              {"Content-Range": f"bytes {start}-{end}/{len(data)}", **headers})

    return Handler


@contextmanager
def hub_server(repos: dict[str, Repo]) -> Iterator[Hub]:
    """The server on 127.0.0.1 (an ephemeral port) for the `with` block."""
    hub = Hub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
