"""A three-host lab in network namespaces for the firewall tests: a head, a peer and an outsider on one bridge.

Each host is its own namespace (`fw-<tag>-head` …) with its own loopback, nftables ruleset and addresses
(10.214.<n>.1-3/24 and fd00:214:<n>::1-3/64), wired by veth pairs to a bridge in a fourth namespace, so the
outsider sits on the same LAN as the cluster — the case a host firewall exists for. Nothing touches the
machine's own network namespace or ruleset. Everything is torn down on exit, failures included.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from stacks.model.config import StackConfig
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values
from tests.waiting import wait_for

ROLES = ("head", "peer", "out")
HOST = {"head": 1, "peer": 2, "out": 3}


class Lab:
    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or f"{os.getpid() % 100000}"
        self.subnet = os.getpid() % 250 + 1
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []

    def ns(self, role: str) -> str:
        return f"fw-{self.tag}-{role}"

    def v4(self, role: str) -> str:
        return f"10.214.{self.subnet}.{HOST[role]}"

    def v6(self, role: str) -> str:
        return f"fd00:214:{self.subnet:x}::{HOST[role]}"

    def __enter__(self) -> Lab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _build(self) -> None:
        switch = self.ns("sw")
        for name in (switch, *(self.ns(r) for r in ROLES)):
            _ip("netns", "add", name)
            self.namespaces.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for role in ROLES:
            inner, outer = "eth0", f"p-{role}"
            _ip("link", "add", f"fw{self.tag}{role[0]}a", "netns", self.ns(role), "type", "veth",
                "peer", "name", f"fw{self.tag}{role[0]}b", "netns", switch)
            _ip("-n", self.ns(role), "link", "set", f"fw{self.tag}{role[0]}a", "name", inner)
            _ip("-n", switch, "link", "set", f"fw{self.tag}{role[0]}b", "name", outer)
            _ip("-n", switch, "link", "set", outer, "master", "br0", "up")
            _ip("-n", self.ns(role), "addr", "add", f"{self.v4(role)}/24", "dev", inner)
            _ip("-n", self.ns(role), "addr", "add", f"{self.v6(role)}/64", "dev", inner, "nodad")
            _ip("-n", self.ns(role), "link", "set", inner, "up")

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        for name in reversed(self.namespaces):
            self.reap(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        self.namespaces.clear()

    def reap(self, name: str, grace_s: float = 15) -> None:
        """Wait for, then SIGKILL, whatever still runs in one of this lab's namespaces (`ip netns pids`) until nothing
        does: only processes this test started live there, e.g. Ray workers that outlive their raylet by a few
        seconds."""
        if not name.startswith(f"fw-{self.tag}-"):
            raise ValueError(f"{name} is not a namespace of this lab")

        def pids() -> list[int]:
            return [int(p) for p in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                                                   check=False).stdout.split()]

        with contextlib.suppress(AssertionError):
            wait_for(lambda: not pids(), f"the processes in {name} ended", grace_s)
            return
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):  # the namespace is deleted either way
            wait_for(lambda: not pids(), f"the processes in {name} gone after SIGKILL", 60)

    def run(self, role: str, argv: list[str], *, check: bool = True, timeout: float = 60,
            input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["ip", "netns", "exec", self.ns(role), *argv], capture_output=True, text=True,
                              timeout=timeout, input=input, env=env)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in {role} exit {done.returncode}: {done.stdout}{done.stderr}")
        return done

    def spawn(self, role: str, argv: list[str], env: dict[str, str] | None = None,
              log: Path | None = None) -> subprocess.Popen[str]:
        """A background process in its own session (killed as a group on exit)."""
        out = log.open("w") if log else subprocess.DEVNULL
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(role), *argv], stdout=out, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def sh(self, role: str, script: str, *, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run(role, ["sh", "-c", script], check=check)

    def ruleset(self, role: str, *extra: str) -> str:
        return self.run(role, ["nft", *extra, "list", "ruleset"]).stdout

    def nft_file(self, role: str, text: str) -> subprocess.CompletedProcess[str]:
        return self.run(role, ["nft", "-f", "-"], input=text, check=False)

    def connect(self, role: str, host: str, port: int, timeout: float = 1.5) -> str:
        """`ok` when the TCP handshake completes, `timeout` (dropped), `refused` (nothing listens) or an error."""
        code = ("import socket,sys\nh,p,t=sys.argv[1],int(sys.argv[2]),float(sys.argv[3])\n"
                "s=socket.socket(socket.AF_INET6 if ':' in h else socket.AF_INET)\ns.settimeout(t)\n"
                "try:\n s.connect((h,p)); print('ok')\nexcept socket.timeout: print('timeout')\n"
                "except ConnectionRefusedError: print('refused')\nexcept OSError as e: print('error', e)\n")
        return self.run(role, [sys.executable, "-c", code, host, str(port), str(timeout)]).stdout.strip()

    def listening(self, role: str) -> list[tuple[str, int, str]]:
        """(local address, port, process) of every TCP listener in the namespace (`ss -ltnpH`)."""
        rows = []
        for line in self.run(role, ["ss", "-ltnpH"]).stdout.splitlines():
            parts = line.split()
            address, _, port = parts[3].rpartition(":")
            proc = parts[5].split('"')[1] if len(parts) > 5 and '"' in parts[5] else ""
            rows.append((address.strip("[]"), int(port), proc))
        return rows


def stop(proc: subprocess.Popen[str], grace_s: float = 8) -> None:
    """SIGTERM the process group this test started, SIGKILL it after the grace period."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


SERVER = r"""
import json, socket, sys, threading
specs = json.loads(sys.argv[1])
out = {}
def serve(s):
    while True:
        try:
            c, _ = s.accept(); c.close()
        except OSError:
            return
for name, host, port in specs:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(64)
    out[name] = s.getsockname()[1]
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print(json.dumps(out), flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def listeners(lab: Lab, role: str, specs: list[tuple[str, str, int]]) -> Iterator[dict[str, int]]:
    """Plain TCP listeners (name, bind host, port; 0 = OS-picked) in one process; yields name -> port."""
    proc = subprocess.Popen(["ip", "netns", "exec", lab.ns(role), sys.executable, "-c", SERVER, json.dumps(specs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lab.procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"listener process failed: {proc.stderr.read() if proc.stderr else ''}")
    try:
        yield json.loads(line)
    finally:
        stop(proc, 2)


def lab_config(lab: Lab, stack: str = "h20", front_door: bool = False, **firewall: Any) -> StackConfig:
    """A committed stack with the lab's addresses: head and peer are the two nodes (IPv4 management = control
    plane, IPv6 data), no private networks declared, so the outsider — on the same /24 — is outside the cluster.
    h20 is Ray (GCS 6379); `h20-mp` is the same TP8 x PP2 replica on vLLM's own multi-node executor, whose
    `--master-port` is set to 29500 (a fixed, all-address TCPStore on the head)."""
    values = copy.deepcopy(read_stack_values(stack.removesuffix("-mp")))
    if stack.endswith("-mp"):
        values["parallelism"] |= {"backend": "mp", "master_port": 29500}
    for node, role in zip(values["nodes"], ("head", "peer"), strict=True):
        node.update(name=role, ssh={"host": lab.v4(role)}, management_ip=lab.v4(role), management_ifname="eth0",
                    data_ips=[lab.v6(role)], nics=["eth0"], hcas=["mlx5_0:1"])
    values["fabric"].update(private_networks=[], public_private_networks=[], control_plane="management",
                            nccl_socket="management")
    values["firewall"] = firewall
    if front_door:
        # The client-facing port is the proxy's, on 8000 here; vLLM itself moves to loopback (8001), so any
        # `api_sources` is a valid config (vLLM's own port may never face sources outside the private networks).
        values["api"] = {"proxy": {"enabled": True, "port": 8000}}
        values["serving"] |= {"host": "127.0.0.1", "port": 8001}
        values |= {"api_key": SECRET, "tls_certificate": SECRET, "tls_private_key": SECRET,
                   "proxy_keys": {"lab": SECRET}}
    return parse_config("lab", values)
