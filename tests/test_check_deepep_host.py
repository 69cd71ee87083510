"""The DeepEP host check on fixture trees of /proc, /sys, /dev and /etc (the base is a real H200 capture, each edit
named), its arguments, the shipped script, and the reach section between real network namespaces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.bundle import remote_script
from checks.deepep_host import DRIVER_OPTIONS, SECTIONS, Nic, interface_addresses, probe, registry_dwords
from stacks.planner.deepep import HOST_SECTIONS
from tests.conftest import ROOT

H200 = ROOT / "tests" / "fixtures" / "deepep_host" / "h200"


def run(*args: str, prefix: tuple[str, ...] = ()) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = subprocess.run([*prefix, sys.executable, "-m", "checks.deepep_host", "--json", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A copy of the real H200 tree to edit."""
    root = tmp_path / "root"
    shutil.copytree(H200, root)
    return root


def edit_params(root: Path, **values: str) -> None:
    path = root / "proc/driver/nvidia/params"
    lines = [f"{k}: {values.pop(k)}" if k in values else line
             for line in path.read_text().splitlines() for k in [line.split(":")[0]]]
    assert not values, f"no such params line: {values}"
    path.write_text("\n".join(lines) + "\n")


def text(v: dict) -> str:  # type: ignore[type-arg]
    return " ".join(v["evidence"])


def test_sections_match_the_planner() -> None:
    assert tuple(SECTIONS) == HOST_SECTIONS


def test_real_h200_lacks_the_driver_options_and_has_dma_buf() -> None:
    """The captured machine runs the open kernel module without the IBGDA options: ibgda fails on the lines read."""
    code, v = run("--root", str(H200), "--sections", "ibgda,peermem")
    assert code == 1 and v["status"] == "fail"
    assert f"ibgda: {H200}/proc/driver/nvidia/params: EnableStreamMemOPs: 0" in v["evidence"]
    assert f'ibgda: {H200}/proc/driver/nvidia/params: RegistryDwords: ""' in v["evidence"]
    assert "lacks EnableStreamMemOPs=1 and PeerMappingOverride=1" in text(v)
    assert "gdrdrv module is not loaded" in text(v)
    assert DRIVER_OPTIONS in v["next_step"] and "update-initramfs -u" in v["next_step"] and "reboot" in v["next_step"]
    assert "gdrdrv-dkms" in v["next_step"]
    peer = v["details"]["peermem"]
    assert peer["ok"] is True and "dma-buf (open kernel module, Linux 6.18.44-fc-v1147-gpu)" in peer["evidence"][0]


@pytest.mark.parametrize(("handler", "ok"), [("auto", True), ("gpu", True), ("cpu", False)])
def test_driver_options_make_gpu_initiated_ibgda(host: Path, handler: str, ok: bool) -> None:
    edit_params(host, EnableStreamMemOPs="1", RegistryDwords='"PeerMappingOverride=1;"')
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", handler)
    assert (code, v["details"]["ibgda"]["ok"]) == ((0, True) if ok else (1, False)), v
    if ok:
        assert "GPU-initiated (driver options)" in text(v)
    else:
        assert "gdrdrv" in v["next_step"] and DRIVER_OPTIONS not in v["next_step"]


@pytest.mark.parametrize(("handler", "ok"), [("auto", True), ("cpu", True), ("gpu", False)])
def test_gdrcopy_makes_cpu_assisted_ibgda(host: Path, handler: str, ok: bool) -> None:
    (host / "sys/module/gdrdrv").mkdir(parents=True)
    (host / "dev").mkdir(exist_ok=True)  # git keeps no empty folder: the captured tree has no dev/
    (host / "dev/gdrdrv").write_text("")  # a plain file standing in for the character device
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", handler)
    assert code == (0 if ok else 1), v
    if not ok:
        assert "lacks EnableStreamMemOPs=1" in text(v) and "gdrdrv-dkms" not in v["next_step"]


def test_one_option_missing_is_named(host: Path) -> None:
    edit_params(host, EnableStreamMemOPs="1")
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", "gpu")
    assert code == 1 and "lacks PeerMappingOverride=1" in text(v) and "EnableStreamMemOPs=1 and" not in text(v)


def test_gdrdrv_without_its_device(host: Path) -> None:
    (host / "sys/module/gdrdrv").mkdir(parents=True)
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", "cpu")
    assert code == 1 and "gdrdrv is loaded but /dev/gdrdrv is missing" in text(v)


def test_option_written_but_driver_not_reloaded(host: Path) -> None:
    conf = host / "etc/modprobe.d/nvidia.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# IBGDA\n" + DRIVER_OPTIONS + "\n")
    code, v = run("--root", str(host), "--sections", "ibgda")
    assert code == 1
    assert f"written in {conf}:2: {DRIVER_OPTIONS} but not in the running driver" in text(v)
    assert v["next_step"].startswith("run update-initramfs -u (dracut --force on RHEL) and reboot")


def test_half_written_options_name_what_is_still_missing(host: Path) -> None:
    """Only EnableStreamMemOPs in the file: a reboot alone would still lack PeerMappingOverride, so the next step
    says to add it."""
    conf = host / "etc/modprobe.d/nvidia.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("options nvidia NVreg_EnableStreamMemOPs=1\n")
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", "gpu")
    assert code == 1
    assert f"written in {conf}:1: options nvidia NVreg_EnableStreamMemOPs=1 but not in the running" in text(v)
    assert v["next_step"].startswith(f"add `{DRIVER_OPTIONS}` to /etc/modprobe.d/nvidia.conf (not in any "
                                     "/etc/modprobe.d/*.conf: PeerMappingOverride=1), run update-initramfs")


@pytest.mark.parametrize("line", ["options nvidia NVreg_EnableStreamMemOPs=10",
                                  'options nvidia NVreg_RegistryDwords="PeerMappingOverride=10;"',
                                  'options nvidia NVreg_RegistryDwords="RMPeerMappingOverride=1;"'])
def test_an_option_with_another_value_is_not_written(host: Path, line: str) -> None:
    conf = host / "etc/modprobe.d/nvidia.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(line + "\n")
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", "gpu")
    assert code == 1 and "written in" not in text(v) and v["next_step"].startswith(f"add `{DRIVER_OPTIONS}`")


def test_other_registry_dwords_are_kept_in_the_fix(host: Path) -> None:
    edit_params(host, RegistryDwords='"RMSmallBarP2PPeerBar1=1;"')
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", "gpu")
    assert code == 1 and 'NVreg_RegistryDwords="RMSmallBarP2PPeerBar1=1;PeerMappingOverride=1;"' in v["next_step"]


def test_other_registry_dwords_are_kept_as_written(host: Path) -> None:
    edit_params(host, RegistryDwords='"RMFoo=abc;RMBar=0x10;PeerMappingOverride=0;"')
    code, v = run("--root", str(host), "--sections", "ibgda", "--nic-handler", "gpu")
    assert code == 1 and 'NVreg_RegistryDwords="RMFoo=abc;RMBar=0x10;PeerMappingOverride=1;"' in v["next_step"]


def test_registry_dwords_values() -> None:
    assert registry_dwords('"PeerMappingOverride=0x1;RMFoo=2"') == {"PeerMappingOverride": 1, "RMFoo": 2}
    assert registry_dwords('""') == {}
    assert registry_dwords('"PeerMappingOverride=yes"') == {"PeerMappingOverride": None}


def test_no_driver(tmp_path: Path) -> None:
    code, v = run("--root", str(tmp_path), "--sections", "ibgda")
    assert code == 1 and "the NVIDIA driver is not loaded" in text(v)


def test_a_fifo_params_file_is_not_opened(host: Path) -> None:
    """Opening a FIFO blocks until a writer comes: the check must end in a verdict instead (the run's own
    timeout is far beyond what reading a few files takes)."""
    params = host / "proc/driver/nvidia/params"
    params.unlink()
    os.mkfifo(params)
    code, v = run("--root", str(host), "--sections", "ibgda")
    assert code == 2 and f"ibgda: {params} is a FIFO, not a regular file: not read" in v["evidence"]


def test_a_link_to_dev_zero_is_not_read(host: Path) -> None:
    for name in ("params", "version"):
        (host / f"proc/driver/nvidia/{name}").unlink()
        (host / f"proc/driver/nvidia/{name}").symlink_to("/dev/zero")
    code, v = run("--root", str(host), "--sections", "ibgda,peermem")
    assert code != 0
    assert f"ibgda: {host}/proc/driver/nvidia/params is a character device, not a regular file: not read" in v[
        "evidence"]
    assert f"{host}/proc/driver/nvidia/version: (is a character device, not a regular file: not read)" in text(v)


def test_a_huge_file_is_not_read(host: Path) -> None:
    params = host / "proc/driver/nvidia/params"
    params.write_text("EnableStreamMemOPs: 1\n" + "x" * (2 << 20))
    code, v = run("--root", str(host), "--sections", "ibgda")
    assert code == 2 and f"ibgda: {params} is larger than 1 MiB: not read" in v["evidence"]


@pytest.mark.parametrize("root", ["/nonexistent", "/dev/null"])
def test_root_must_be_a_directory(root: str) -> None:
    code, v = run("--root", root, "--sections", "ibgda")
    assert code == 2 and v["summary"] == f"bad argument: --root '{root}': no such directory; a directory holding " \
        "proc/, sys/, dev/ and etc/ (default /)"


def test_no_driver_says_so_in_short_lines(tmp_path: Path) -> None:
    """A host without the driver fails every file section: peermem names the missing driver (not the proprietary
    module), and the text verdict is a status line and one line per item, none of them a wall of text."""
    code, v = run("--root", str(tmp_path), "--sections", "ibgda,peermem")
    peer = v["details"]["peermem"]
    assert code == 1 and peer["evidence"][0] == (f"the NVIDIA driver is not loaded ({tmp_path}/proc/driver/nvidia/"
                                                 "version does not exist)")
    assert "proprietary" not in text(v) and peer["next_step"].startswith("install and load the NVIDIA driver")
    out = subprocess.run([sys.executable, "-m", "checks.deepep_host", "--root", str(tmp_path), "--sections",
                          "ibgda,peermem"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert out.returncode == 1 and lines[0] == "FAIL deepep-host: 2 failed: ibgda, peermem"
    assert f"  evidence: ibgda: {tmp_path}/proc/driver/nvidia/params does not exist: the NVIDIA driver is not " \
        "loaded" in lines
    assert "  next step (peermem): install and load the NVIDIA driver first; then this section can tell dma-buf " \
        "from nvidia_peermem" in lines
    assert len(lines) == 7 and max(len(line) for line in lines) <= 160 + len(str(tmp_path)), lines


def test_peermem_needs_dma_buf_or_nvidia_peermem(host: Path) -> None:
    version = host / "proc/driver/nvidia/version"
    version.write_text(version.read_text().replace("Open Kernel Module", "Kernel Module"))  # the proprietary one
    code, v = run("--root", str(host), "--sections", "peermem")
    assert code == 1 and "the proprietary kernel module cannot export dma-buf" in text(v)
    assert "modprobe nvidia_peermem" in v["next_step"]
    (host / "sys/module/nvidia_peermem").mkdir(parents=True)
    (host / "sys/module/nvidia_peermem/version").write_text("580.159.04\n")
    code, v = run("--root", str(host), "--sections", "peermem")
    assert code == 0 and "through nvidia_peermem" in text(v)


def test_open_module_on_an_old_kernel(host: Path) -> None:
    (host / "proc/sys/kernel/osrelease").write_text("5.4.0-150-generic\n")
    code, v = run("--root", str(host), "--sections", "peermem")
    assert code == 1 and "Linux 5.4.0-150-generic is older than 5.12" in text(v)


@pytest.mark.parametrize("args", [
    ["--root", "relative/dir"],
    ["--nic-handler", "both"],
    ["--sections", "ibgda,nvlink"],
    ["--local", "ens1"],
    ["--local", "ens1=10.0.0.300"],
    ["--peers", "ens1=10.0.0.2"],
    ["--peers", "n2:ens1=0.0.0.0"],
    ["--probe-timeout-s", "nan"],
    ["--parallel", "0"],
    ["--local", ",".join(f"e{i}=10.0.0.{i + 1}" for i in range(64)),
     "--peers", ",".join(f"n{i // 200}:e{i % 200}=10.1.{i // 250}.{i % 250 + 1}" for i in range(257))],
])
def test_bad_arguments_exit_2(args: list[str]) -> None:
    code, v = run(*args)
    assert code == 2 and v["status"] == "cannot-run" and v["summary"].startswith("bad argument: --")


def test_shipped_script_gives_the_same_verdict() -> None:
    script = remote_script("deepep_host")
    assert "from checks" not in script
    out = subprocess.run([sys.executable, "-", "--json", "--root", str(H200), "--sections", "ibgda,peermem"],
                         input=script, capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 1 and json.loads(out.stdout) == run("--root", str(H200), "--sections",
                                                                 "ibgda,peermem")[1]


# ---- reach: two nodes of two NICs each, on one switch, in network namespaces -----------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def lab() -> Iterator[dict[str, str]]:
    """Namespaces dh<pid>a and dh<pid>b (two NICs each: a0/a1, b0/b1) and a switch namespace with a bridge.
    arp_ignore=1 as on a multi-NIC host (preflight's sysctl section), so an address answers on its own NIC only."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.fail("the reach test needs iproute2 and root (network namespaces)")
    tag = f"dh{os.getpid() % 100000}"
    net = f"10.215.{os.getpid() % 250}"
    names = {"a": f"{tag}a", "b": f"{tag}b", "sw": f"{tag}sw"}
    addresses = {"a0": f"{net}.1", "a1": f"{net}.2", "b0": f"{net}.3", "b1": f"{net}.4"}
    made: list[str] = []
    try:
        for ns in names.values():
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", names["sw"], "link", "add", "br0", "type", "bridge")
        _ip("-n", names["sw"], "link", "set", "br0", "up")
        for host in ("a", "b"):
            subprocess.run(["ip", "netns", "exec", names[host], "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1"],
                           check=True, capture_output=True, timeout=30)
            for i in (0, 1):
                nic = f"{host}{i}"
                _ip("link", "add", f"{tag}{nic}", "netns", names[host], "type", "veth", "peer", "name",
                    f"{tag}p{nic}", "netns", names["sw"])
                _ip("-n", names[host], "link", "set", f"{tag}{nic}", "name", nic)
                _ip("-n", names["sw"], "link", "set", f"{tag}p{nic}", "master", "br0", "up")
                _ip("-n", names[host], "addr", "add", f"{addresses[nic]}/24", "dev", nic)
                _ip("-n", names[host], "link", "set", nic, "up")
        yield {**names, **addresses}
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def reach(lab: dict[str, str], *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    return run("--sections", "reach", "--local", f"a0={lab['a0']},a1={lab['a1']}",
               "--peers", f"node2:b0={lab['b0']},node2:b1={lab['b1']}", "--probe-timeout-s", "3", *extra,
               prefix=("ip", "netns", "exec", lab["a"]))


def test_every_nic_pair_reachable(lab: dict[str, str]) -> None:
    code, v = reach(lab)
    assert code == 0, v
    summary = "reach: 4 pair(s) from 2 local NIC(s) to 2 NIC(s) on 1 peer node(s), TCP port 9: 4 reachable"
    assert summary in v["evidence"]
    assert "reach: bound to device and address" in v["evidence"]


def test_a_dropped_peer_nic_is_named_per_pair(lab: dict[str, str]) -> None:
    rules = ("table inet dh {\n chain input {\n type filter hook input priority 0;\n"
             f" ip daddr {lab['b1']} drop\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", lab["b"], "nft", "-f", "-"], input=rules, text=True, check=True,
                   capture_output=True, timeout=30)
    code, v = reach(lab)
    assert code == 1, v
    evidence = v["evidence"]
    assert "reach: 4 pair(s) from 2 local NIC(s) to 2 NIC(s) on 1 peer node(s), TCP port 9: 2 reachable" in evidence
    for local in ("a0", "a1"):
        assert f"reach: {local} ({lab[local]}) cannot reach node2 b1 ({lab['b1']}): no answer within 3s" in evidence
    assert not any(f"node2 b0 ({lab['b0']})" in e for e in evidence)
    assert "ip route get PEER_IP from LOCAL_IP" in v["next_step"]


def test_a_local_address_not_on_this_host(lab: dict[str, str]) -> None:
    code, v = run("--sections", "reach", "--local", "a0=10.215.251.9", "--peers", f"node2:b0={lab['b0']}",
                  prefix=("ip", "netns", "exec", lab["a"]))
    assert code == 2 and v["summary"].startswith("bad argument: --local: a0=10.215.251.9: 10.215.251.9 is not an "
                                                 f"address of a0; its addresses: {lab['a0']}, fe80::")


def test_a_local_nic_this_host_lacks(lab: dict[str, str]) -> None:
    """As root, binding to a missing device fails with ENODEV: that must not pass as "bound to address only"."""
    code, v = run("--sections", "reach", "--local", f"b0={lab['a0']}", "--peers", f"node2:b0={lab['b0']}",
                  prefix=("ip", "netns", "exec", lab["a"]))
    assert code == 2 and v["summary"] == (f"bad argument: --local: b0={lab['a0']}: no interface b0 on this host; its "
                                          "interfaces: a0, a1, lo")


@pytest.mark.parametrize(("args", "summary"), [
    (["--local", "nosuch0=127.0.0.1", "--peers", "n2:lo=127.0.0.2"],
     "--local: nosuch0=127.0.0.1: no interface nosuch0 on this host; its interfaces: "),
    (["--local", "lo=10.9.9.9", "--peers", "n2:lo=127.0.0.2"],
     "--local: lo=10.9.9.9: 10.9.9.9 is not an address of lo; its addresses: 127.0.0.1"),
    (["--local", "lo=127.0.0.1", "--peers", "n2:lo=::1"],
     "--local/--peers: IPv4 and IPv6 addresses mixed (--local lo=127.0.0.1, --peers n2:lo=::1)"),
    (["--local", "lo=127.0.0.1", "--peers", "n2:e0=127.0.0.1"],
     "--peers: n2:e0=127.0.0.1: 127.0.0.1 is also --local lo=127.0.0.1; a probe would reach this host itself"),
    (["--local", "lo=127.0.0.1", "--peers", "n2:e0=10.0.0.2,n3:e0=10.0.0.2"],
     "--peers: n3:e0=10.0.0.2: 10.0.0.2 is also --peers n2:e0=10.0.0.2; every data NIC has its own address"),
    (["--local", "lo=127.0.0.1", "--peers", "n2:e0=10.0.0.2,n2:e1=10.0.0.2"],
     "--peers: n2:e1=10.0.0.2: 10.0.0.2 is also --peers n2:e0=10.0.0.2"),
    (["--local", "lo=127.0.0.1", "--peers", "n2:e0=10.0.0.2,n2:e0=10.0.0.3"],
     "--peers: n2:e0=10.0.0.3: n2:e0 is given twice"),
    (["--local", "lo=127.0.0.1", "--parallel", "1", "--probe-timeout-s", "60", "--peers",
      ",".join(f"n{i}:e0=10.0.{i // 250}.{i % 250 + 1}" for i in range(31))],
     "--parallel/--probe-timeout-s: 31 pairs, 1 at a time, 60s each could take 31 min, more than 30"),
])
def test_nic_arguments_a_probe_would_misread(args: list[str], summary: str) -> None:
    code, v = run("--sections", "reach", *args)
    assert code == 2 and v["summary"].startswith("bad argument: " + summary), v


def test_interface_addresses_of_this_host() -> None:
    assert "127.0.0.1" in interface_addresses()["lo"]


def test_a_probe_from_a_missing_device_fails() -> None:
    """The argument check names a missing NIC first; a NIC that goes away before its probe still fails the pair
    (as root the device bind says ENODEV), never a pass "bound to address only"."""
    if os.geteuid() != 0:
        pytest.fail("binding to a device needs root")
    ok, how = probe(Nic("", "nosuch0", "127.0.0.1"), Nic("n2", "lo", "127.0.0.2"), 9, 3.0)
    assert (ok, how) == (False, "cannot bind to device nosuch0: No such device")
