"""The Grafana admin password rotation (checks/grafana_password.py), run as the program ships it (the heredoc
script, `sh -c`) against stand-ins: Grafana's HTTP API (`/api/health`; `/api/user`, 200 for the stored admin
password by basic auth, 401 otherwise, as Grafana answers) and a `docker` client whose `exec … cat FILE` reads the
uploaded password file and whose `exec -i … grafana cli admin reset-admin-password --password-from-stdin` writes
the password Grafana's database holds. No real Grafana is installed here (no Debian package, no PyPI or npm
distribution of the server)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from checks.bundle import heredoc_command

NEW = "n3w-Grafana-pass"
OLD = "old-Grafana-pass"

DOCKER = r'''#!{python}
"""Stand-in docker client: exec cat FILE, exec -i grafana cli admin reset-admin-password --password-from-stdin."""
import json, sys
from pathlib import Path
here = Path(__file__).parent
with (here / "calls.jsonl").open("a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:1] != ["exec"]:
    sys.exit(125)
args = args[1:]
interactive = args[:1] == ["-i"]
args = args[1:] if interactive else args
container, command = args[0], args[1:]
if container != "t-grafana":
    print(f"Error response from daemon: No such container: {{container}}", file=sys.stderr)
    sys.exit(1)
if command[:1] == ["cat"]:
    sys.stdout.write((here / "uploaded").read_text())
    sys.exit(0)
if command[:2] == ["grafana", "cli"] and "reset-admin-password" in command and "--password-from-stdin" in command:
    if (here / "cli-broken").exists():
        print("Error: failed to reset the admin password: database is locked", file=sys.stderr)
        sys.exit(1)
    (here / "database").write_text(sys.stdin.readline().rstrip("\n"))
    print("Admin password changed successfully")
    sys.exit(0)
sys.exit(127)
'''


class _Grafana(BaseHTTPRequestHandler):
    database: Path

    def do_GET(self) -> None:
        if self.path == "/api/health":
            self._answer(200, {"database": "ok"})
        elif self.path == "/api/user":
            expected = "Basic " + base64.b64encode(f"admin:{self.database.read_text()}".encode()).decode()
            if self.headers.get("Authorization") == expected:
                self._answer(200, {"id": 1, "login": "admin", "isGrafanaAdmin": True})
            else:
                self._answer(401, {"message": "Invalid username or password"})
        else:
            self._answer(404, {"message": "Not found"})

    def _answer(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@dataclass
class Site:
    dir: Path
    url: str

    def run(self) -> subprocess.CompletedProcess[str]:
        command = heredoc_command("grafana_password", ["--container", "t-grafana", "--url", self.url,
                                                       "--wait-s", "30", "--json"])
        env = {**os.environ, "PATH": f"{self.dir}{os.pathsep}{os.environ['PATH']}"}
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120, env=env,
                              check=False)

    def calls(self) -> list[list[str]]:
        log = self.dir / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    docker = tmp_path / "docker"
    docker.write_text(DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    (tmp_path / "uploaded").write_text(NEW)
    (tmp_path / "database").write_text(OLD)
    handler = type("Grafana", (_Grafana,), {"database": tmp_path / "database"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Site(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def _verdict(out: subprocess.CompletedProcess[str]) -> dict[str, object]:
    verdict: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return verdict


def test_a_database_that_kept_the_old_password_is_given_the_stacks(site: Site) -> None:
    out = site.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert _verdict(out)["status"] == "pass" and "set to the stack's" in str(_verdict(out)["summary"])
    assert (site.dir / "database").read_text() == NEW
    assert not [argv for argv in site.calls() if any(NEW in word for word in argv)], "the password on an argv"
    assert NEW not in out.stdout + out.stderr


def test_a_database_with_the_stacks_password_is_left_alone(site: Site) -> None:
    (site.dir / "database").write_text(NEW)
    out = site.run()
    assert out.returncode == 0 and _verdict(out)["status"] == "pass", out.stdout + out.stderr
    assert not [argv for argv in site.calls() if "reset-admin-password" in argv]


def test_a_failed_reset_is_a_fail_that_says_what_grafana_said(site: Site) -> None:
    (site.dir / "cli-broken").touch()
    out = site.run()
    verdict = _verdict(out)
    assert out.returncode == 1 and verdict["status"] == "fail", out.stdout + out.stderr
    assert "database is locked" in json.dumps(verdict) and NEW not in out.stdout
    assert (site.dir / "database").read_text() == OLD


def test_an_unreadable_password_file_cannot_run(site: Site) -> None:
    (site.dir / "uploaded").write_text("")
    out = site.run()
    assert out.returncode == 2 and _verdict(out)["status"] == "cannot-run", out.stdout + out.stderr
    assert not [argv for argv in site.calls() if "reset-admin-password" in argv]


@pytest.mark.parametrize(("flag", "value"), [("--url", "http://admin:pw@10.0.0.1:3000"), ("--url", "ftp://x"),
                                             ("--container", "a b"), ("--docker", "/bin/dock\ner"),
                                             ("--wait-s", "nan")])
def test_bad_arguments_are_exit_2_naming_the_flag(flag: str, value: str) -> None:
    args = ["--container", "g", "--url", "http://10.0.0.1:3000", flag, value]
    out = subprocess.run([sys.executable, "-m", "checks.grafana_password", *args], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2 and flag in out.stdout + out.stderr, out.stdout + out.stderr
    assert "admin:pw" not in out.stdout + out.stderr
