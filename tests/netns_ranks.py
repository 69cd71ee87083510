"""Test hosts for the collective check: network namespaces on one bridge, each with its own address, and
`tc tbf` to shape one host's link. Needs root and iproute2 (`make services` installs it).

Layout for n hosts: a switch namespace `<prefix>sw` holding bridge `br0`; per host a namespace `<prefix>h<i>`
with veth `<prefix>h<i>` (address 10.213.<net>.<i+1>/24) whose peer `p<i>` sits on the bridge. Nothing is
created in the host's own namespace, so the addresses exist only inside the namespaces, and deleting the
namespaces removes every link. Names carry this process id so parallel runs never collide.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    ns: str
    ifname: str
    address: str
    switch: str
    switch_port: str


def sh(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def prefix() -> str:
    return f"rk{os.getpid() % 100000}"


@contextmanager
def star(count: int, net: int = 213) -> Iterator[list[Host]]:
    """`count` hosts on one bridge; everything is deleted on exit, also when the body fails."""
    base = prefix()
    switch = f"{base}sw"
    created: list[str] = []
    try:
        sh("ip", "netns", "add", switch)
        created.append(switch)
        sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", switch, "link", "set", "br0", "up")
        hosts = []
        for i in range(count):
            ns, ifname, port = f"{base}h{i}", f"{base}h{i}", f"p{i}"
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "link", "add", "name", ifname, "netns", ns, "type", "veth", "peer", "name", port,
               "netns", switch)
            sh("ip", "-n", switch, "link", "set", port, "master", "br0", "up")
            address = f"10.{net}.{os.getpid() % 250 + 1}.{i + 1}"
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", ifname)
            sh("ip", "-n", ns, "link", "set", ifname, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            hosts.append(Host(ns, ifname, address, switch, port))
        yield hosts
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def shape(host: Host, rate_mbit: float) -> None:
    """Token-bucket both directions of one host's link: its own egress and the bridge port's egress to it."""
    burst = max(16, int(rate_mbit * 1000 / 8 / 250))  # kB: enough tokens for a 4 ms timer tick
    for ns, dev in ((host.ns, host.ifname), (host.switch, host.switch_port)):
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
           f"{rate_mbit:g}mbit", "burst", f"{burst}kb", "latency", "100ms")


def unshape(host: Host) -> None:
    for ns, dev in ((host.ns, host.ifname), (host.switch, host.switch_port)):
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True,
                       timeout=30)


def listening(host: Host) -> list[str]:
    """Local address:port of every TCP listener inside the host's namespace (`ss -ltnH`)."""
    out = sh("ip", "netns", "exec", host.ns, "ss", "-ltnH")
    return [line.split()[3] for line in out.splitlines() if line.strip()]
