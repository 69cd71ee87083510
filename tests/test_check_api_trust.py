"""The API checks send the bearer key only to the stack's own endpoint: with a certificate, only that one.

Real TLS: a private CA signs two certificates for `localhost`. The stack's `tls_certificate` is leaf A with the CA
after it (a usual chain file). A server holding leaf B, also signed by that CA and also for `localhost`, must not
receive the key; before this change (system trust plus every certificate of the PEM) it did.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from checks.api import main, tls_context


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fdpki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fdtest-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    for leaf in ("a", "b"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(d / f"{leaf}.key"),
                 "-out", str(d / f"{leaf}.csr"))
        ext = d / "ext.cnf"
        ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        _openssl("x509", "-req", "-in", str(d / f"{leaf}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(d / f"{leaf}.crt"))
    (d / "stack.pem").write_text((d / "a.crt").read_text() + (d / "ca.crt").read_text())
    return d


@contextmanager
def https_server(cert: Path, key: Path, seen: list[str]) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = b'{"data": [{"id": "DeepSeek-V4.1-Flash"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _old_context(ca_pem: str) -> ssl.SSLContext:
    """What the checks trusted before: the system's CAs plus every certificate of the stack's PEM."""
    context = ssl.create_default_context()
    context.load_verify_locations(cadata=ca_pem)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def test_only_the_stacks_own_certificate_is_trusted(pki: Path) -> None:
    stack_pem = (pki / "stack.pem").read_text()
    context = tls_context(stack_pem)
    assert context.cert_store_stats() == {"x509": 1, "crl": 0, "x509_ca": 0}  # the leaf: no system CA, no chain CA
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    for leaf, expected in (("a", True), ("b", False)):
        seen: list[str] = []
        with https_server(pki / f"{leaf}.crt", pki / f"{leaf}.key", seen) as port:
            url = f"https://localhost:{port}/v1/models"
            try:
                ok = httpx.get(url, headers={"Authorization": "Bearer sk-secret"}, verify=context).status_code == 200
            except httpx.ConnectError as exc:
                ok = False
                assert "CERTIFICATE_VERIFY_FAILED" in str(exc)
            assert ok is expected, leaf
            assert seen == (["Bearer sk-secret"] if expected else []), leaf
            # Negative control: the old trust store sends the key to B as well.
            old = httpx.get(url, headers={"Authorization": "Bearer sk-old"}, verify=_old_context(stack_pem))
            assert old.status_code == 200


def test_the_check_refuses_a_pem_that_is_not_a_certificate(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FDTEST_CA", "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    code = main(["--url", "https://localhost:1", "--served-name", "x", "--ca-env", "FDTEST_CA", "--sections",
                 "health"])
    assert code == 2 and "$FDTEST_CA" in capsys.readouterr().out
