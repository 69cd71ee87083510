"""The Docker provider's SSH, pinned to the node's host key, against a real sshd (OpenSSH, on a loopback port).

The client argv is the one pulumi-docker builds (docker/cli connhelper: `ssh -l USER -p PORT <ssh_opts> -T --
HOST <command>`) with the program's own `docker_ssh_opts`, and the known_hosts file is the one the program
writes (`write_known_hosts`, at the `~` path ssh expands itself). Only `-F /dev/null`, the test's client key and
`ControlMaster=no` come first (ssh keeps the first value of an option), so no multiplexed master outlives the test
and no user config interferes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from components.ssh_trust import KNOWN_HOSTS_DIR, deployer_home, docker_ssh_opts, known_hosts_name, write_known_hosts
from stacks.model.loader import parse_config, read_stack_values
from tests.waiting import START_DEADLINE_S, output_of

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, capture_output=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not Path(SSHD).exists() or os.geteuid() != 0:
        pytest.fail("these tests need root and OpenSSH's sshd (.ci/apt-packages.txt: openssh-server)")
    d = tmp_path_factory.mktemp("fdssh")
    node, impostor = _keygen(d / "node_host"), _keygen(d / "impostor_host")
    client = _keygen(d / "client")
    (d / "authorized_keys").write_text(client + "\n")
    return {"dir": d, "node": node, "impostor": impostor}


@contextmanager
def sshd(keys: dict[str, Any], host_key: str, port: int) -> Iterator[None]:
    d: Path = keys["dir"]
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory sshd insists on
    conf = d / f"sshd-{host_key}.conf"
    conf.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d / host_key}
PidFile {d / f'sshd-{port}.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
""")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not listen on {port} within {START_DEADLINE_S}s: "
                                       f"{output_of(proc)}") from None
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def stack_name() -> Iterator[str]:
    """A stack name of this test's own, and its known_hosts file removed afterwards (it lives in the real
    home: that is the path ssh expands `~` to)."""
    name = f"fdtest{os.getpid()}"
    directory = deployer_home() / KNOWN_HOSTS_DIR
    existed = directory.exists()
    yield name
    (directory / known_hosts_name(name)).unlink(missing_ok=True)
    if not existed:
        with contextlib.suppress(OSError):  # only if empty: a real stack's file stays
            directory.rmdir()


def _config(stack: str, port: int, host_key: str | None, host: str = "127.0.0.1") -> Any:
    values = read_stack_values("prod")
    values["nodes"][0]["ssh"] = {"host": host, "port": port, **({"host_key": host_key} if host_key else {})}
    return parse_config(stack, values)


def _docker_ssh(keys: dict[str, Any], stack: str, config: Any) -> subprocess.CompletedProcess[str]:
    """`ssh` exactly as pulumi-docker runs it for node1, with `true` as the remote command."""
    node = config.nodes[0]
    first = ["-F", "/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "BatchMode=yes",
             "-o", "IdentitiesOnly=yes", "-i", str(keys["dir"] / "client")]
    argv = ["ssh", *first, "-l", node.ssh.user, "-p", str(node.ssh.port), *docker_ssh_opts(stack, node), "-T", "--",
            node.ssh.host, "echo pinned-ok"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_the_pinned_key_connects_and_an_impostor_is_refused(keys: dict[str, Any], stack_name: str) -> None:
    port = _free_port()
    config = _config(stack_name, port, keys["node"])
    path = write_known_hosts(stack_name, config)
    assert path == deployer_home() / KNOWN_HOSTS_DIR / known_hosts_name(stack_name)
    with sshd(keys, "node_host", port):
        ok = _docker_ssh(keys, stack_name, config)
        assert ok.returncode == 0 and ok.stdout.strip() == "pinned-ok", ok.stderr
        # The alias, not the spelling: the same node reached as `localhost` still matches its entry.
        same = _docker_ssh(keys, stack_name, _config(stack_name, port, keys["node"], host="localhost"))
        assert same.returncode == 0, same.stderr
    with sshd(keys, "impostor_host", port):  # someone else answers on the node's address
        bad = _docker_ssh(keys, stack_name, config)
    assert bad.returncode == 255 and "pinned-ok" not in bad.stdout
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in bad.stderr and "Host key verification failed" in bad.stderr
    # Nothing was added or changed: StrictHostKeyChecking=yes never writes the file.
    assert path.read_text() == f"node1.{stack_name}.vllm-cluster {keys['node']}\n"


def test_a_node_whose_key_is_not_in_the_file_is_refused(keys: dict[str, Any], stack_name: str) -> None:
    """Pinned options, but the file holds another node's key only: ssh refuses instead of asking or learning."""
    port = _free_port()
    config = _config(stack_name, port, keys["impostor"])
    write_known_hosts(stack_name, config)
    with sshd(keys, "node_host", port):
        out = _docker_ssh(keys, stack_name, config)
    assert out.returncode == 255 and "Host key verification failed" in out.stderr


def test_ssh_keyscan_output_is_what_the_config_takes(keys: dict[str, Any], stack_name: str) -> None:
    port = _free_port()
    with sshd(keys, "node_host", port):
        scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(port), "127.0.0.1"], capture_output=True,
                                 text=True, timeout=30).stdout
    line = next(x for x in scanned.splitlines() if not x.startswith("#"))
    host, key = line.split(" ", 1)
    assert host == f"[127.0.0.1]:{port}" and key == keys["node"]
    assert _config(stack_name, port, key).nodes[0].ssh.host_key == key
