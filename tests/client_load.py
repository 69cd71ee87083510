"""Clients that send chat requests through an endpoint the whole time something changes behind it, counting every
request and every failure (a refused connection, a 5xx, a stream cut before [DONE]): what "no failed request" is
measured with (bench/rolling_change.py, the lab's rolling workflow)."""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx

from checks.api import tls_context


@dataclasses.dataclass
class Load:
    """Client threads through the front door, counting every request and every failure (with why)."""

    url: str
    pem: str
    key: str
    model: str
    clients: int
    sent: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)
    slowest_s: float = 0.0
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def one(self, client: httpx.Client, stream: bool) -> str | None:
        body = {"model": self.model, "stream": stream, "max_tokens": 16,
                "messages": [{"role": "user", "content": "17*19?"}]}
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            if not stream:
                r = client.post("/v1/chat/completions", json=body, headers=headers)
                return None if r.status_code == 200 else f"HTTP {r.status_code}"
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    return f"HTTP {r.status_code}"
                lines = [line for line in r.iter_lines() if line.startswith("data:")]
                return None if lines and lines[-1] == "data: [DONE]" else "stream cut before [DONE]"
        except httpx.HTTPError as exc:
            return type(exc).__name__

    def run(self) -> None:
        with httpx.Client(base_url=self.url, verify=tls_context(self.pem), timeout=60) as client:
            stream = False
            while not self.stop.is_set():
                began = time.monotonic()
                why = self.one(client, stream)
                with self.lock:
                    self.sent += 1
                    self.slowest_s = max(self.slowest_s, time.monotonic() - began)
                    if why:
                        self.failed.append(why)
                stream = not stream

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)
