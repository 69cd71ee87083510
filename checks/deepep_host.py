"""Host check for DeepEP's NVSHMEM/IBGDA kernels: run on every node before the image is pulled.

Standard library only, shipped by `checks.bundle`. Every file is read under `--root` (default `/`), so a test
points it at a fixture tree of /proc, /sys, /dev and /etc. Sections (docs/deepep-hosts.md):

- ibgda: GPU-initiated RDMA needs either the NVIDIA driver loaded with `EnableStreamMemOPs: 1` and
  `PeerMappingOverride=1` in `RegistryDwords` (read from /proc/driver/nvidia/params; the GPU rings the NIC), or
  GDRCopy's `gdrdrv` module and its /dev/gdrdrv device (CPU-assisted IBGDA). DeepEP third-party/README.md,
  "Enable NVSHMEM IBGDA support"; vLLM tools/ep_kernels/configure_system_drivers.sh writes the same option line.
  `--nic-handler` is NVSHMEM_IBGDA_NIC_HANDLER as the engine will run: auto takes either, gpu needs the driver
  options, cpu needs gdrdrv. An option written in /etc/modprobe.d but not in the running driver is named: the
  driver was loaded before it (update the initramfs and reboot).
- peermem: NVSHMEM registers GPU memory with the NIC through dma-buf or, failing that, nv_peer_mem /
  nvidia_peermem (NVSHMEM src/modules/transport/common/transport_ib_common.cpp,
  `nvshmemt_ib_common_check_dmabuf_support` and `nvshmemt_ib_common_nv_peer_mem_available`, whose three paths
  are read here). dma-buf needs the open kernel module (/proc/driver/nvidia/version) on Linux 5.12 or later.
- reach: from each local data NIC (`--local IFNAME=IP`, the socket bound to that device and address) a TCP
  connection to every peer NIC (`--peers NODE:IFNAME=IP`) on `--probe-port`: an answer, even a refusal (RST),
  proves the path; a timeout or "no route" names the pair. NICs x peer NICs probes, `--parallel` at a time.

With `--rehearsal` (a stack that declares no GPUs, docs/rehearsal.md) ibgda and peermem print `NOT RUN`; reach runs.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import re
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from checks.verdict import (
    CheckParser,
    Section,
    Verdict,
    abs_path,
    check_name,
    combine,
    emit,
    integer,
    listed,
    mask_credentials,
    port,
    rehearsal_section,
    seconds,
    shown,
    unicast_ip,
)

DRIVER_OPTIONS = 'options nvidia NVreg_EnableStreamMemOPs=1 NVreg_RegistryDwords="PeerMappingOverride=1;"'
"""The modprobe line DeepEP's and vLLM's install notes give (DeepEP third-party/README.md 2.1)."""
REBUILD = "update-initramfs -u (dracut --force on RHEL)"
PEERMEM_PATHS = ("sys/kernel/mm/memory_peers/nv_mem/version", "sys/kernel/mm/memory_peers/nvidia-peermem/version",
                 "sys/module/nvidia_peermem/version")
"""Where NVSHMEM looks for a peer-memory client (transport_ib_common.cpp, nvshmemt_ib_common_nv_peer_mem_available)."""
DMABUF_KERNEL = (5, 12)
"""Linux added dma-buf memory registration for RDMA (ib_umem_dmabuf) in 5.12."""
MAX_PAIRS = 16384
"""More probes than 64 NICs x 256 peer NICs are refused: a typo, not a cluster."""
SHOWN_PAIRS = 12
MAX_PROBE_S = 1800
"""The reach section's worst case (every probe timing out, in waves of --parallel) is refused beyond 30 min."""
MAX_READ = 1 << 20
"""Every file the check reads is a few lines; anything larger is not what the path should hold."""


def read_small(path: Path) -> tuple[str | None, str]:
    """(text, "") of a regular file of at most MAX_READ bytes, else (None, why): a FIFO would block the check and
    a link to /dev/zero would read until memory runs out, so neither is opened."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return None, ("does not exist" if exc.errno in (errno.ENOENT, errno.ENOTDIR)
                      else f"cannot be read ({exc.strerror or exc})")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
                "a directory" if stat.S_ISDIR(mode) else "not a plain file")
        return None, f"is {kind}, not a regular file: not read"
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_READ + 1)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if len(data) > MAX_READ:
        return None, f"is larger than {MAX_READ // (1 << 20)} MiB: not read"
    return data.decode(errors="replace"), ""


def _read(path: Path) -> str | None:
    return read_small(path)[0]


def existing_dir(value: str) -> str:
    """--root: an absolute path to a directory (a copied tree or /)."""
    path = abs_path(value)
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{shown(value)}: no such directory; a directory holding proc/, sys/, dev/ "
                                         "and etc/ (default /)")
    return path


def parse_params(text: str) -> dict[str, str]:
    """`Key: value` lines of /proc/driver/nvidia/params, the value as written (strings keep their quotes)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def registry_dwords(value: str) -> dict[str, int | None]:
    """`"PeerMappingOverride=1;RMFoo=0x10"` -> {name: int value, None where not a number}."""
    out: dict[str, int | None] = {}
    for entry in value.strip().strip('"').split(";"):
        name, sep, raw = entry.partition("=")
        if name.strip() and sep:
            try:
                out[name.strip()] = int(raw.strip(), 0)
            except ValueError:
                out[name.strip()] = None
    return out


def registry_entries(value: str) -> list[str]:
    """`"RMFoo=abc;RMBar=0x10;"` -> ["RMFoo=abc", "RMBar=0x10"]: each entry as written, for a fix line that keeps
    them."""
    return [entry.strip() for entry in value.strip().strip('"').split(";") if entry.strip()]


def modprobe_lines(root: Path) -> list[tuple[str, int, str]]:
    """(file, line number, line) of every `options nvidia …` line in /etc/modprobe.d/*.conf."""
    found = []
    for conf in sorted((root / "etc" / "modprobe.d").glob("*.conf")):
        for number, line in enumerate((_read(conf) or "").splitlines(), 1):
            words = line.split()
            if len(words) > 2 and words[0] == "options" and words[1] == "nvidia":
                found.append((str(conf), number, line.strip()))
    return found


def written_option(line: str, option: str) -> bool:
    """Whether an `options nvidia …` line sets `option` (EnableStreamMemOPs=1 or PeerMappingOverride=1) to exactly
    1: `NVreg_EnableStreamMemOPs=10` is not 1, nor is `PeerMappingOverride=1` outside NVreg_RegistryDwords."""
    for word in re.findall(r'(?:[^\s"]|"[^"]*")+', line):
        name, _, value = word.partition("=")
        if option == "EnableStreamMemOPs=1" and name == "NVreg_EnableStreamMemOPs" and \
                _number(value.strip('"')) == 1:
            return True
        if option == "PeerMappingOverride=1" and name == "NVreg_RegistryDwords" and \
                registry_dwords(value).get("PeerMappingOverride") == 1:
            return True
    return False


def _number(text: str) -> int | None:
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def check_ibgda(a: argparse.Namespace) -> Section:
    root = Path(a.root)
    params_path = root / "proc" / "driver" / "nvidia" / "params"
    text, why = read_small(params_path)
    if text is None and why != "does not exist":
        return Section("ibgda", None, [f"{params_path} {why}"],
                       "read the driver's parameters from the real /proc/driver/nvidia/params (or a regular-file copy)")
    if text is None:
        return Section("ibgda", False, [f"{params_path} does not exist: the NVIDIA driver is not loaded"],
                       "install and load the NVIDIA driver (nvidia-smi must answer), then run this check again")
    params = parse_params(text)
    stream = params.get("EnableStreamMemOPs")
    dwords_raw = params.get("RegistryDwords", "")
    peer = registry_dwords(dwords_raw).get("PeerMappingOverride")
    driver_ok = stream == "1" and peer == 1
    evidence = [f"{params_path}: EnableStreamMemOPs: {stream if stream is not None else '(no such line)'}",
                f"{params_path}: RegistryDwords: {dwords_raw or '(no such line)'}"]
    gdr_module, gdr_dev = root / "sys" / "module" / "gdrdrv", root / "dev" / "gdrdrv"
    gdr_ok = gdr_module.is_dir() and gdr_dev.exists()
    evidence.append(f"GDRCopy: {gdr_module} {'present' if gdr_module.is_dir() else 'absent'}, "
                    f"{gdr_dev} {'present' if gdr_dev.exists() else 'absent'}")
    handler = a.nic_handler
    ok = {"auto": driver_ok or gdr_ok, "gpu": driver_ok, "cpu": gdr_ok}[handler]
    mode = ("GPU-initiated (driver options)" if driver_ok else "") + (" and " if driver_ok and gdr_ok else "") + \
        ("CPU-assisted (gdrdrv)" if gdr_ok else "")
    if ok:
        return Section("ibgda", True, [f"IBGDA possible: {mode} (NVSHMEM_IBGDA_NIC_HANDLER={handler})", *evidence])
    lines = modprobe_lines(root)
    missing = [w for w, bad in (("EnableStreamMemOPs=1", stream != "1"), ("PeerMappingOverride=1", peer != 1)) if bad]
    in_files = {w: [f"{f}:{n}: {line}" for f, n, line in lines if written_option(line, w)] for w in missing}
    written = sorted({place for places in in_files.values() for place in places})
    unwritten = [w for w in missing if not in_files[w]]
    problems = []
    if handler != "cpu" and not driver_ok:
        problems.append("the running NVIDIA driver lacks " + " and ".join(missing))
    if handler != "gpu" and not gdr_ok:
        problems.append("GDRCopy's gdrdrv module is not loaded" if not gdr_module.is_dir()
                        else "gdrdrv is loaded but /dev/gdrdrv is missing")
    if written:
        problems.append(f"written in {'; '.join(written)} but not in the running driver: it was loaded before the "
                        "option was written")
    keep = "".join(f"{entry};" for entry in registry_entries(dwords_raw)
                   if entry.partition("=")[0].strip() != "PeerMappingOverride")
    line = DRIVER_OPTIONS if not keep else DRIVER_OPTIONS.replace('"PeerMappingOverride=1;"',
                                                                  f'"{keep}PeerMappingOverride=1;"')
    steps = []
    if handler != "cpu" and not unwritten:
        steps.append(f"run {REBUILD} and reboot (or reload the nvidia module) so the written option takes effect")
    elif handler != "cpu":
        where = " (not in any /etc/modprobe.d/*.conf: " + " and ".join(unwritten) + ")" if written else ""
        steps.append(f"add `{line}` to /etc/modprobe.d/nvidia.conf{where}, run {REBUILD} and reboot")
    if handler != "gpu":
        steps.append("install GDRCopy's kernel module (the gdrdrv-dkms package from "
                     "https://developer.download.nvidia.com/compute/redist/gdrcopy/, then `modprobe gdrdrv`) for "
                     "CPU-assisted IBGDA")
    return Section("ibgda", False, [*problems, *evidence], "; or ".join(steps) + " (docs/deepep-hosts.md)")


def _kernel(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", (text or "").strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_peermem(a: argparse.Namespace) -> Section:
    root = Path(a.root)
    clients = [str(root / p) for p in PEERMEM_PATHS if (root / p).exists()]
    version_path = root / "proc" / "driver" / "nvidia" / "version"
    version, version_why = read_small(version_path)
    first = (version or "").splitlines()[0].strip() if version else f"({version_why or 'empty'})"
    release_path = root / "proc" / "sys" / "kernel" / "osrelease"
    release_text, release_why = read_small(release_path)
    release = (release_text or "").strip()
    kernel = _kernel(release)
    open_module = "Open Kernel Module" in (version or "")
    dmabuf = open_module and kernel is not None and kernel >= DMABUF_KERNEL
    evidence = [f"{version_path}: {first}", f"{release_path}: {release or '(' + (release_why or 'empty') + ')'}",
                "peer-memory client: " + (", ".join(clients) if clients else
                                          f"none of {root}/sys/{{" + ", ".join(
                                              p.removeprefix("sys/").removesuffix("/version") for p in PEERMEM_PATHS)
                                          + "}/version")]
    if dmabuf or clients:
        how = "dma-buf (open kernel module, Linux " + release + ")" if dmabuf else "nvidia_peermem"
        return Section("peermem", True, [f"GPU memory can be registered with the NIC through {how}", *evidence])
    if version is None and version_why == "does not exist" and not clients:
        return Section("peermem", False, [f"the NVIDIA driver is not loaded ({version_path} does not exist)",
                                          *evidence[1:]],
                       "install and load the NVIDIA driver first; then this section can tell dma-buf from "
                       "nvidia_peermem")
    why = ("the proprietary kernel module cannot export dma-buf" if not open_module else
           f"Linux {release or '?'} is older than {DMABUF_KERNEL[0]}.{DMABUF_KERNEL[1]} (no RDMA dma-buf)")
    return Section("peermem", False, [f"no dma-buf ({why}) and no nvidia_peermem module", *evidence],
                   "`modprobe nvidia_peermem` (it ships with the NVIDIA driver; persist it in "
                   "/etc/modules-load.d/nvidia-peermem.conf), or run the driver's open kernel module on Linux 5.12+")


@dataclass(frozen=True)
class Nic:
    node: str
    ifname: str
    ip: str

    def __str__(self) -> str:
        return f"{self.node + ' ' if self.node else ''}{self.ifname} ({self.ip})"


def probe(local: Nic, peer: Nic, port_number: int, timeout_s: float) -> tuple[bool, str]:
    """(reachable, how): a TCP connection from `local` (bound to its device where allowed, and its address) to
    `peer`. Connected or refused: the path works. Timeout or no route: it does not."""
    family = socket.AF_INET6 if ipaddress.ip_address(local.ip).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        bound = "device and address"
        try:
            sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_BINDTODEVICE", 25), local.ifname.encode())
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EACCES):  # ENODEV: the NIC is gone, not a missing privilege
                return False, f"cannot bind to device {local.ifname}: {exc.strerror or exc}"
            bound = "address only (binding to a device needs CAP_NET_RAW)"
        try:
            sock.bind((local.ip, 0))
        except OSError as exc:
            return False, f"cannot bind {local.ip}: {exc.strerror or exc} (is the address on {local.ifname}?)"
        sock.settimeout(timeout_s)
        started = time.monotonic()
        code = sock.connect_ex((peer.ip, port_number))
        if code in (0, errno.ECONNREFUSED):
            return True, bound
        if code in (errno.EAGAIN, errno.EINPROGRESS, errno.ETIMEDOUT) or time.monotonic() - started >= timeout_s:
            return False, f"no answer within {timeout_s:g}s"
        return False, f"{errno.errorcode.get(code, str(code))}: {os.strerror(code)}"
    finally:
        sock.close()


def check_reach(a: argparse.Namespace) -> Section:
    local: list[Nic] = a.local
    peers: list[Nic] = a.peers
    if not local or not peers:
        return Section("reach", None, ["nothing to probe: --local and --peers name the data NICs (nodes[].nics and "
                                       "nodes[].data_ips)"], "list every node's data NICs and IPs")
    pairs = [(mine, theirs) for mine in local for theirs in peers]
    with ThreadPoolExecutor(max_workers=min(a.parallel, len(pairs))) as pool:
        results = list(pool.map(lambda pair: probe(pair[0], pair[1], a.probe_port, a.probe_timeout_s), pairs))
    failed = [(mine, theirs, how) for (mine, theirs), (ok, how) in zip(pairs, results, strict=True) if not ok]
    nodes = len({p.node for p in peers})
    bound = sorted({how for ok, how in results if ok})
    summary = (f"{len(pairs)} pair(s) from {len(local)} local NIC(s) to {len(peers)} NIC(s) on {nodes} peer node(s), "
               f"TCP port {a.probe_port}: {len(pairs) - len(failed)} reachable")
    if not failed:
        return Section("reach", True, [summary, *(f"bound to {b}" for b in bound)])
    lines = [f"{mine} cannot reach {theirs}: {how}" for mine, theirs, how in failed[:SHOWN_PAIRS]]
    if len(failed) > SHOWN_PAIRS:
        lines.append(f"and {len(failed) - SHOWN_PAIRS} more pair(s)")
    return Section("reach", False, [summary, *lines],
                   "NVSHMEM connects every GPU's NIC with every peer's: check the route and the switch between each "
                   "pair named (`ip route get PEER_IP from LOCAL_IP`, the peer NIC's link, rp_filter, a site firewall "
                   "dropping TCP between data networks)")


REHEARSAL_NOT_RUN = {
    "ibgda": "the NVIDIA driver's IBGDA options and gdrdrv are not read: no DeepEP kernel runs on a GPU here",
    "peermem": "GPU memory registration with the NIC (dma-buf, nvidia_peermem) is not looked for",
}
"""With --rehearsal (docs/rehearsal.md): the GPU sections print NOT RUN; reach (TCP between the data NICs) runs."""

SECTIONS: dict[str, Callable[[argparse.Namespace], Section]] = {
    "ibgda": check_ibgda,
    "peermem": check_peermem,
    "reach": check_reach,
}
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _nic(value: str, with_node: bool) -> Nic:
    form = "NODE:IFNAME=IP, e.g. node2:ens11np0=10.0.0.2" if with_node else "IFNAME=IP, e.g. ens11np0=10.0.0.1"
    head, sep, ip = value.partition("=")
    node, _, ifname = head.rpartition(":") if with_node else ("", "", head)
    if not sep or not _IFNAME.fullmatch(ifname) or ifname in (".", "..") or (with_node and not _NODE.fullmatch(node)):
        raise argparse.ArgumentTypeError(f"{shown(value)}: not {form}")
    return Nic(node, ifname, unicast_ip(ip))


def local_nic(value: str) -> Nic:
    return _nic(value, False)


def peer_nic(value: str) -> Nic:
    return _nic(value, True)


def build_parser() -> argparse.ArgumentParser:
    p = CheckParser(prog="deepep_host", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="deepep-host", type=check_name)
    p.add_argument("--sections", default=list(SECTIONS), type=listed(str, tuple(SECTIONS), empty_ok=False),
                   help="comma list of " + ",".join(SECTIONS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--root", default="/", type=existing_dir, help="where /proc, /sys, /dev and /etc are read")
    p.add_argument("--rehearsal", action="store_true", help="the stack declares no GPUs (vllm-cluster:rehearsal): "
                   "ibgda and peermem print NOT RUN, reach runs")
    p.add_argument("--nic-handler", default="auto", choices=["auto", "gpu", "cpu"],
                   help="NVSHMEM_IBGDA_NIC_HANDLER as the engine runs it")
    r = p.add_argument_group("reach")
    r.add_argument("--local", default=[], action="extend", type=listed(local_nic),
                   help="this node's data NICs as IFNAME=IP (a comma list; repeat the flag for more)")
    r.add_argument("--peers", default=[], action="extend", type=listed(peer_nic),
                   help="the other nodes' data NICs as NODE:IFNAME=IP (a comma list; repeat the flag, e.g. once per "
                   "node)")
    r.add_argument("--probe-port", default=9, type=port, help="TCP port probed on each peer NIC (a refusal counts)")
    r.add_argument("--probe-timeout-s", default=3.0, type=seconds(60))
    r.add_argument("--parallel", default=32, type=integer(1, 256), help="probes at a time")
    return p


def interface_addresses() -> dict[str, list[str]]:
    """Every interface of this network namespace and its addresses, from the kernel's netlink address dump (what
    `ip addr` prints; RTM_GETADDR, linux/if_addr.h), standard library only. OSError where netlink is unavailable."""
    names = {index: name for index, name in socket.if_nameindex()}
    out: dict[str, list[str]] = {name: [] for name in names.values()}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(5)
        # nlmsghdr (len, type RTM_GETADDR=22, flags NLM_F_REQUEST|NLM_F_DUMP, seq, pid) + ifaddrmsg (any family)
        sock.send(struct.pack("=IHHII", 24, 22, 0x301, 1, 0) + struct.pack("=BBBBI", 0, 0, 0, 0, 0))
        while True:
            data = sock.recv(1 << 16)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == 3:  # NLMSG_DONE
                    return out
                if kind == 2:  # NLMSG_ERROR
                    raise OSError("netlink address dump refused")
                if kind == 20 and length >= 24:  # RTM_NEWADDR
                    family, _, _, _, index = struct.unpack_from("=BBBBI", data, offset + 16)
                    found: dict[int, bytes] = {}
                    at = offset + 24
                    while at + 4 <= offset + length:
                        size, attr = struct.unpack_from("=HH", data, at)
                        if size < 4:
                            break
                        found[attr] = data[at + 4:at + size]
                        at += (size + 3) & ~3
                    raw = found.get(2) or found.get(1)  # IFA_LOCAL, else IFA_ADDRESS
                    if raw and family in (socket.AF_INET, socket.AF_INET6) and index in names:
                        out[names[index]].append(socket.inet_ntop(family, raw))
                if length < 16:
                    break
                offset += (length + 3) & ~3


def argument_problem(a: argparse.Namespace) -> str | None:
    """What makes `--local`/`--peers`/`--parallel` unusable, as a bad-argument message, or None. A pair of
    families, an address given twice, a NIC this host does not have or an address not on its NIC would all turn
    into a misleading reach verdict (a PASS by probing itself, a crash, route advice for a typo)."""
    local: list[Nic] = a.local
    peers: list[Nic] = a.peers
    nics = [("--local", n) for n in local] + [("--peers", n) for n in peers]
    versions = {ipaddress.ip_address(n.ip.split("%")[0]).version for _, n in nics}
    if len(versions) > 1:
        v4 = next(f"{flag} {_arg(n)}" for flag, n in nics if ":" not in n.ip)
        v6 = next(f"{flag} {_arg(n)}" for flag, n in nics if ":" in n.ip)
        return (f"--local/--peers: IPv4 and IPv6 addresses mixed ({v4}, {v6}); give every data NIC's address in one "
                "family (the one the data networks route)")
    seen: dict[str, tuple[str, Nic]] = {}
    names: set[tuple[str, str]] = set()
    for flag, nic in nics:
        if (nic.node, nic.ifname) in names:
            return f"{flag}: {_arg(nic)}: {nic.node + ':' if nic.node else ''}{nic.ifname} is given twice; once each"
        names.add((nic.node, nic.ifname))
        if nic.ip in seen:
            first_flag, first = seen[nic.ip]
            why = ("a probe would reach this host itself" if first_flag == "--local" and flag == "--peers" else
                   "every data NIC has its own address")
            return f"{flag}: {_arg(nic)}: {nic.ip} is also {first_flag} {_arg(first)}; {why}"
        seen[nic.ip] = (flag, nic)
    pairs = len(local) * len(peers)
    worst = -(-pairs // a.parallel) * a.probe_timeout_s
    if worst > MAX_PROBE_S:
        return (f"--parallel/--probe-timeout-s: {pairs} pairs, {a.parallel} at a time, {a.probe_timeout_s:g}s each "
                f"could take {worst / 60:.0f} min, more than {MAX_PROBE_S // 60}; raise --parallel (up to 256) or "
                "lower --probe-timeout-s")
    if not local:
        return None
    try:
        addresses = interface_addresses()
    except OSError:
        return None  # no netlink here: a bad NIC still shows as a failed bind in the verdict
    for nic in local:
        if nic.ifname not in addresses:
            return (f"--local: {_arg(nic)}: no interface {nic.ifname} on this host; its interfaces: "
                    f"{', '.join(sorted(addresses)) or 'none'}")
        if nic.ip.split("%")[0] not in addresses[nic.ifname]:
            return (f"--local: {_arg(nic)}: {nic.ip} is not an address of {nic.ifname}; its addresses: "
                    f"{', '.join(addresses[nic.ifname]) or 'none'}")
    return None


def _arg(nic: Nic) -> str:
    return f"{nic.node + ':' if nic.node else ''}{nic.ifname}={nic.ip}"


def outer_timeout_s(pairs: int, parallel: int = 32, probe_timeout_s: float = 3.0) -> int:
    """The shell `timeout` for one run: start-up and the file sections, plus the probes in waves."""
    waves = -(-pairs // parallel) if pairs else 0
    return 60 + int(waves * (probe_timeout_s + 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.local) * len(args.peers) > MAX_PAIRS:
        parser.error(f"--local x --peers: {len(args.local) * len(args.peers)} pairs, more than {MAX_PAIRS}")
    problem = argument_problem(args)
    if problem:
        parser.error(problem)
    sections = []
    for name in args.sections:
        if args.rehearsal and name in REHEARSAL_NOT_RUN:
            sections.append(rehearsal_section(name, REHEARSAL_NOT_RUN[name]))
            continue
        try:
            sections.append(SECTIONS[name](args))
        except Exception as exc:  # an unexpected host must still end in a verdict
            sections.append(Section(name, None, [f"crashed: {type(exc).__name__}: {exc}"],
                                    "report this check's failure with its evidence"))
    verdict = combine(args.name, sections)
    if args.json:
        return emit(verdict, True)
    return emit_lines(verdict, sections)


def emit_lines(verdict: Verdict, sections: list[Section]) -> int:
    """The verdict as a status line, then one line per evidence item and per section's next step: a host without
    a driver fails every section, and one line of all of it is unreadable."""
    out = [f"{verdict.label} {verdict.check}: {verdict.summary}"]
    out += [f"  evidence: {item}" for item in verdict.evidence]
    if verdict.status != "pass":
        out += [f"  next step ({s.name}): {s.next_step}" for s in sections if s.ok is not True and s.next_step]
    print(mask_credentials("\n".join(out)))
    sys.stdout.flush()
    return verdict.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
