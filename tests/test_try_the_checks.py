"""docs/try-the-checks.md runs as written: every ```sh block of the page, in order, with the expectation in the
HTML comment above it. Servers run in the background until the test ends (then get Ctrl-C and must exit 0);
the rest run verbatim in bash from the checkout, with `venv/bin/python` this interpreter, and the ports
8000/9000 and the /tmp paths swapped for free ports and the test's own directory (a shared machine may use them).

Also the two servers' command lines on their own: bad arguments exit 2 naming the flag, and local S3's printed
commands run as printed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "try-the-checks.md"
BLOCK = re.compile(r"<!-- test: (?P<spec>.*?) -->\n```sh\n(?P<body>.*?)```", re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A long-running command and every line it printed so far (read on a thread, so a full pipe never blocks)."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def start_reading(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
        threading.Thread(target=read, daemon=True).start()

    def wait_for(self, text: str, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return "".join(self.lines)
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {''.join(self.lines)}"
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout_s} s: {''.join(self.lines)}")

    def interrupt(self) -> int:
        """Ctrl-C, as a user stops it."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    codes = [s.interrupt() for s in started if s.proc.poll() is None]
    assert all(code == 0 for code in codes), codes


def start(argv: list[str], env: dict[str, str] | None = None) -> Server:
    server = Server(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}))
    server.start_reading()
    return server


def test_the_page_starts_with_its_commands() -> None:
    text = PAGE.read_text()
    first = text.split("\n## ", 1)[0]
    assert first.count("```sh") == len(BLOCK.findall(text)) + 1, "every block (make venv first) opens the page"
    for word in ("stand-in", "seed", "issue", "brief"):
        assert word not in text.lower(), word


def test_every_command_of_the_page_runs_as_documented(tmp_path: Path, servers: list[Server]) -> None:
    swaps = {"8000": str(free_port()), "9000": str(free_port()), "/tmp/": f"{tmp_path}/",
             "venv/bin/python": shlex.quote(sys.executable)}
    blocks = BLOCK.findall(PAGE.read_text())
    assert len(blocks) == 7, "the page's blocks changed: update this test's reading of them"
    for spec, body in blocks:
        for old, new in swaps.items():
            body = re.sub(rf"(?<=[ :]){re.escape(old)}\b" if old.isdigit() else re.escape(old), new, body)
        if spec.startswith("server"):
            ready = re.search(r'waits for "(.*?)"', spec)
            assert ready, spec
            server = start(shlex.split(body.replace("\\\n", " ")))
            servers.append(server)
            server.wait_for(ready[1])
            continue
        code = re.match(r"exit (\d+)", spec)
        assert code, spec
        done = subprocess.run(["bash", "-c", body], cwd=ROOT, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == int(code[1]), f"{body}\n{output}"
        for needle in re.findall(r'contains "(.*?)"(?:,|$)', spec):
            assert needle in output, f"{body}\n---\n{output}"
        assert "Traceback" not in output
    assert (tmp_path / "tiny-model" / "config.json").is_file()
    assert not (ROOT / "Pulumi.prod.yaml").read_text().count("nightly-7a1c"), "--dry-run left the stack file alone"


@pytest.mark.parametrize("args,needle", [
    (["--dp-size", "2", "--wrong-rank", "2"], "--wrong-rank 2: must be a DP rank of this server, 0-1"),
    (["--dp-size", "0"], "--dp-size 0: must be 1-1024"),
    (["--port", "70000"], "--port 70000: must be 0-65535"),
    (["--api-key-env", "NO_SUCH_VARIABLE_HERE"], "--api-key-env NO_SUCH_VARIABLE_HERE: that environment variable"),
    (["--served-model-name", " "], "--served-model-name"),
    (["--down-rank", "-1"], "--down-rank -1"),
])
def test_server_arguments_are_checked_before_it_listens(args: list[str], needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", "checks.standin", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k != "NO_SUCH_VARIABLE_HERE"})
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_busy_port_is_exit_2_naming_it(servers: list[Server]) -> None:
    first = start([sys.executable, "-m", "checks.standin", "--port", "0"])
    servers.append(first)
    url = re.search(r"http://127\.0\.0\.1:(\d+)", first.wait_for("Ctrl-C stops"))
    assert url
    done = subprocess.run([sys.executable, "-m", "checks.standin", "--port", url[1]], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and f"--port {url[1]}: cannot listen there" in done.stderr, done.stderr


@pytest.mark.parametrize("args,needle", [
    (["--bucket", "Bad_Bucket"], "--bucket 'Bad_Bucket'"),
    (["--prefix", "a//b"], "--prefix 'a//b'"),
    (["--dest", "relative/dir"], "--dest 'relative/dir'"),
    (["--port", "-1"], "--port -1"),
    (["--port", "0", "--prefix", "../../etc"], "--prefix '../../etc': the sync it prints would refuse it"),
    (["--port", "0", "--prefix", "a/./b"], "--prefix 'a/./b': the sync it prints would refuse it"),
])
def test_local_s3_arguments_exit_2(args: list[str], needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", "checks.local_s3", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_local_s3_prints_commands_that_sync_and_verify(tmp_path: Path, servers: list[Server]) -> None:
    dest = tmp_path / "model"
    server = start([sys.executable, "-m", "checks.local_s3", "--port", "0", "--bucket", "ckpt", "--prefix",
                    "org/tiny", "--dest", str(dest)])
    servers.append(server)
    printed = [line.strip() for line in server.wait_for("Ctrl-C stops").splitlines() if line.startswith("   ")]
    assert printed[0].startswith("export ") and len(printed) == 3, printed
    env = {**os.environ} | dict(item.split("=", 1) for item in shlex.split(printed[0])[1:])
    for line in printed[1:]:
        done = subprocess.run(shlex.split(line), cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0 and done.stdout.startswith("PASS "), done.stdout + done.stderr
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json"]
