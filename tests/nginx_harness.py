"""A real nginx (Debian's, from `make services`) running a generated config, and a throwaway TLS certificate."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stacks.model.config import ProxyConfig
from stacks.planner.proxy import FrontDoor, NginxRuntime, render_nginx_conf
from tests.waiting import START_DEADLINE_S, output_of

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
"""Debian builds the stream module as a dynamic one (package libnginx-mod-stream); the official image has it in."""
CLIENT_KEYS = {"team-a": "sk-team-a-4f1d9c2b7e8a6d35", "ops": "sk-ops.9b2e+7c1d/5a3f=0e8d"}
UPSTREAM_KEY = "sk-upstream-b7e3a9c1d5f20846"


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path

    @property
    def pem(self) -> str:
        return self.cert.read_text()


def make_certificate(directory: Path, address: str | None = None) -> Tls:
    """A self-signed certificate, made by the openssl CLI: for localhost and 127.0.0.1, or for `address` alone
    (a lab node's, the endpoint's host)."""
    tls = Tls(directory / "server.crt", directory / "server.key")
    subject, names = (f"/CN={address}", f"IP:{address}") if address else ("/CN=localhost", "DNS:localhost,IP:127.0.0.1")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", subject,
                    "-addext", f"subjectAltName={names}", "-keyout", str(tls.key), "-out", str(tls.cert)],
                   check=True, capture_output=True)
    return tls


def runtime(directory: Path, tls: Tls | None, workers_as: str | None = None) -> NginxRuntime:
    """`workers_as`: the user nginx's workers run as (default: root when the tests run as root, as nginx's own
    default user may not reach the test's files); the directory must then be open to that user."""
    return NginxRuntime(
        pid=str(directory / "nginx.pid"), access_log=str(directory / "access.log"),
        error_log=str(directory / "error.log"), temp_dir=str(directory),
        cert=str(tls.cert) if tls else "/nonexistent.crt", key=str(tls.key) if tls else "/nonexistent.key",
        user=workers_as or ("root" if os.geteuid() == 0 else None), worker_processes="1",
        front_socket=str(directory / "front.sock"),
        stream_module=STREAM_MODULE if os.path.exists(STREAM_MODULE) else None)


def nginx_test(conf_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NGINX, "-t", "-e", "stderr", "-c", str(conf_path)], capture_output=True, text=True,
                          timeout=30)


def write_conf(directory: Path, proxy: ProxyConfig | FrontDoor, upstream_port: int, tls: Tls | None,
               keys: dict[str, str] | None = None, workers_as: str | None = None) -> Path:
    """A bare ProxyConfig gets the built-in deny list and a 127.0.0.1 upstream; a FrontDoor is used as is."""
    door = proxy if isinstance(proxy, FrontDoor) else FrontDoor.of(proxy, upstream_port)
    conf = render_nginx_conf(door, keys or CLIENT_KEYS, UPSTREAM_KEY, runtime(directory, tls, workers_as))
    path = directory / "nginx.conf"
    path.write_text(conf)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_nginx(conf_path: Path, port: int, nofile: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """nginx in the foreground; `nofile`: its soft open-files limit (a container's is often 1024), the hard one
    left as it is."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen([NGINX, "-e", "stderr", "-c", str(conf_path), "-g", "daemon off;"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit,
                            start_new_session=True)  # its workers go with it in output_of
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not listen on {port} within {START_DEADLINE_S}s: "
                                       f"{output_of(proc)}") from None
                time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
