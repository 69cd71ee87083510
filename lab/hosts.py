"""Lab nodes on one machine, reached over SSH and Docker exactly as the program reaches real servers.

Layout for prefix P and subnet S (default `vlab`, 10.231.0):
- namespace `P-sw`: bridge `br0` with S.254, where the image registry (:5000) and moto's S3 (:9000) listen;
- per node `labI`: network namespace `P-labI` with interface `lab0` S.I, its peer on the bridge, and a mount and
  UTS namespace of its own, kept alive by bind mounts at STATE/ns/labI.{mnt,uts}. In it /etc, /var, /opt and /srv
  are overlays on the host's (what the node writes stays in STATE/nodes/labI/upper), /root, /var/lib/docker and
  /srv/lab-models are the node's own directories, /run, /tmp and /dev/shm fresh tmpfs, /sys shows its own links.
  No systemd runs there (PID 1 is `sleep`): /run/systemd/system exists and /usr/local/sbin/systemctl (SYSTEMCTL)
  is the real systemctl, which enables and disables units offline, less `daemon-reload`, so a unit a deployment
  writes and enables (the host firewall's) is on the node's disk as on a real server's, and its removal shows.
  Its sshd (port 22, its own host key) and dockerd (the default socket /run/docker.sock, its own /etc/docker) run
  there, so `ssh root@S.I docker …` and `DOCKER_HOST=ssh://root@S.I` reach that node's engine only;
- the root namespace gets S.253 on veth `P-host` into the bridge: the deployer reaches every node. Nothing routes
  further: the nodes have no default route and the bridge no uplink.
Every name carries the prefix and every file lives in the state dir, so `down` finds all of it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_STATE = Path("/tmp/vllm-lab")
DEADLINE_S = 180.0
"""How long a daemon may take to answer: milliseconds when idle, much longer on a loaded 2-core machine."""
MODELS_DIR = "/srv/lab-models"
REGISTRY_PORT, S3_PORT = 5000, 9000
S3_KEY_ID, S3_SECRET, S3_REGION = "AKIAVLLMLAB000000000", "vllm-lab-dummy-secret", "us-east-1"
"""moto accepts any key; these are what the stack's s3 secrets can be set to."""
OVERLAID = ("etc", "var", "opt", "srv")
IFNAME = "lab0"
"""Every node's one interface (management and data alike: `nodes[].nics`)."""
NAMESPACES = ("mount", "uts", "ipc", "pid")
MARKER = ".vllm-lab"
"""In the state dir from the start: `down` deletes only a directory that holds it."""
Log = Callable[[str], None]


class LabError(RuntimeError):
    """A lab that cannot be made, found or removed; the message says what to do."""


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    netns: str
    host_key: str
    """`ssh-ed25519 AAAA…`: the value `nodes[].ssh.host_key` takes."""


@dataclass(frozen=True)
class Lab:
    state_dir: str
    prefix: str
    subnet: str
    nodes: tuple[Node, ...]
    ssh_user: str
    key_path: str
    known_hosts: str
    ssh_config: str
    deployer_address: str
    registry: str
    s3_endpoint: str

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def enter(self, node: Node) -> list[str]:
        """argv prefix that runs a command inside the node, without SSH (for setup and status)."""
        return ["nsenter", f"--net=/run/netns/{node.netns}", *_ns_options(Path(self.state_dir), node.name), "--"]

    def ssh(self, node: Node, command: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        """`command` run by the node's sshd as the lab user, as the program's remote commands are."""
        return subprocess.run(["ssh", "-F", self.ssh_config, node.name, command], capture_output=True, text=True,
                              timeout=timeout_s)

    def docker_env(self, node: Node) -> dict[str, str]:
        """Environment for the docker CLI on this machine to use the node's engine over SSH (the lab's `ssh` wrapper
        first on PATH supplies its key and known_hosts, as ~/.ssh/config would)."""
        path = f"{Path(self.state_dir) / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {**os.environ, "PATH": path, "DOCKER_HOST": f"ssh://{self.ssh_user}@{node.address}"}


def _ns_options(state: Path, name: str) -> list[str]:
    """The node's own mount, UTS, IPC and PID namespaces, by the files that keep them (unshare's and nsenter's)."""
    return [f"--{kind}={state / 'ns' / name}.{kind[:3]}" for kind in NAMESPACES]


def _run(*argv: str, timeout_s: float = 120, quiet: bool = False) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 and not quiet:
        raise LabError(f"{shlex.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def _wait(condition: Callable[[], Any], what: Callable[[], str], deadline_s: float = DEADLINE_S) -> Any:
    """The condition's first truthy value; a LabError naming `what` (called then: it shows the state) after it."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise LabError(f"not within {deadline_s:.0f}s: {what()}")


def _listening(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=2):
        return True
    return False


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-600:] if path.exists() else "(no log)"


def _daemon(argv: list[str], log: Path) -> None:
    """Start a long-lived process detached from this one (`setsid -f`: init adopts it), output into `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        subprocess.run(["setsid", "-f", *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                       check=True, timeout=60)


def load(state_dir: Path | str = DEFAULT_STATE) -> Lab | None:
    path = Path(state_dir) / "lab.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Lab(**{**data, "nodes": tuple(Node(**n) for n in data["nodes"])})


def _netns_names(prefix: str) -> list[str]:
    listed = _run("ip", "netns", "list", quiet=True).split()
    return [n for n in listed if n.startswith(f"{prefix}-")]


def _keygen(path: Path, comment: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


SYSTEMCTL = """#!/bin/sh
# The lab node runs no systemd: there is no manager for daemon-reload to reload. Everything else is the real
# systemctl, which links and unlinks units under /etc/systemd/system offline (enable, disable, is-enabled).
# SYSTEMD_OFFLINE: /run/systemd/system exists (scripts look for it), so systemctl would look for a bus too.
[ "${1:-}" = daemon-reload ] && exit 0
SYSTEMD_OFFLINE=1 exec /usr/bin/systemctl "$@"
"""


def _node_files(lab_nodes: list[tuple[str, str]], name: str, address: str, node_dir: Path, netns: str,
                registry: str, client_key: str) -> str:
    """Everything the node's own disk holds before it boots (its /etc changes, its /root); its host key line."""
    for d in OVERLAID:
        (node_dir / "upper" / d).mkdir(parents=True, exist_ok=True)
        (node_dir / "work" / d).mkdir(parents=True, exist_ok=True)
    for d in ("docker", "models", "log", "sbin"):
        (node_dir / d).mkdir(exist_ok=True)
    (node_dir / "sbin" / "systemctl").write_text(SYSTEMCTL)
    (node_dir / "sbin" / "systemctl").chmod(0o755)
    etc = node_dir / "upper" / "etc"
    host_key = _keygen(etc / "ssh" / "ssh_host_ed25519_key", f"root@{name}")
    (etc / "ssh" / "sshd_config").write_text(
        f"ListenAddress {address}\nPort 22\nHostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PidFile /run/sshd.pid\nMaxStartups 100:30:200\nAcceptEnv LANG LC_*\n"
        "Subsystem sftp /usr/lib/openssh/sftp-server\n")
    (etc / "docker").mkdir(exist_ok=True)
    os.setxattr(etc / "docker", "trusted.overlay.opaque", b"y")  # not the host's key.json: an engine ID of its own
    (etc / "docker" / "daemon.json").write_text(json.dumps(
        {"data-root": "/var/lib/docker", "exec-root": "/run/docker", "pidfile": "/run/docker.pid",
         "hosts": ["unix:///run/docker.sock"], "cgroup-parent": f"/{netns}", "insecure-registries": [registry]},
        indent=2) + "\n")
    (etc / "hostname").write_text(f"{name}\n")
    (etc / "machine-id").write_text(f"{uuid.uuid4().hex}\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{a} {n}\n" for n, a in lab_nodes))
    ssh_dir = node_dir / "root" / ".ssh"
    ssh_dir.mkdir(parents=True, mode=0o700)
    (node_dir / "root").chmod(0o700)
    (ssh_dir / "authorized_keys").write_text(client_key + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    return host_key


def _boot_script(name: str, node_dir: Path, init: str) -> str:
    """Run first in the node's new namespaces: its own /sys (cgroups kept), disk and tmpfs mounts, host name."""
    n = shlex.quote(str(node_dir))
    overlays = " ".join(d for d in OVERLAID if Path(f"/{d}").is_dir())
    return f"""n={n}
mkdir -p $n/cgroup && mount --rbind /sys/fs/cgroup $n/cgroup
mount -t sysfs sysfs /sys && mount --move $n/cgroup /sys/fs/cgroup
for d in {overlays}; do mount -t overlay overlay -o lowerdir=/$d,upperdir=$n/upper/$d,workdir=$n/work/$d /$d; done
mkdir -p /var/lib/docker {MODELS_DIR}
mount --bind $n/root /root && mount --bind $n/docker /var/lib/docker && mount --bind $n/models {MODELS_DIR}
mount -t tmpfs -o mode=755 tmpfs /run && mkdir -p /run/sshd /run/systemd/system && mkdir -m 1777 /run/lock
mount --bind $n/sbin /usr/local/sbin
mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /tmp
hostname {shlex.quote(name)}
echo booted
exec {init} -- sleep infinity
"""


def up(count: int = 2, state_dir: Path | str = DEFAULT_STATE, prefix: str = "vlab", subnet: str = "10.231.0",
       log: Log = print) -> Lab:
    """Create a lab of `count` nodes, or return the one already up with that many nodes; anything else that exists
    is refused (run `down` first). A failed `up` removes what it made."""
    if os.geteuid() != 0:
        raise LabError("needs root: it creates network namespaces, mounts and daemons")
    tools = ("ip", "nsenter", "unshare", "setsid", "ssh", "ssh-keygen", "/usr/sbin/sshd", "dockerd", "docker",
             "containerd", "docker-registry")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing {', '.join(missing)}: apt-get install iproute2 util-linux openssh-server docker.io "
                       "docker-registry (.ci/apt-packages.txt)")
    if not 1 <= count <= 250 or not re.fullmatch(r"[a-z][a-z0-9]{0,9}", prefix) \
            or not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet):
        raise LabError("count 1-250, prefix of 1-10 lower-case letters and digits, subnet as three octets (10.231.0)")
    state = Path(state_dir).resolve()
    existing = load(state)
    if existing is not None and (existing.prefix, existing.subnet) != (prefix, subnet):
        raise LabError(f"the lab in {state} has prefix {existing.prefix!r} and subnet {existing.subnet}, not "
                       f"{prefix!r} and {subnet}: a lab of its own needs its own --state-dir")
    if existing is not None and len(existing.nodes) == count and not problems(existing):
        log(f"lab: already up in {state} ({count} node(s))")
        return existing
    if existing is not None or (state / MARKER).exists():
        raise LabError(f"a lab exists in {state}: python -m lab down --state-dir {state}")
    if state.exists() and any(state.iterdir()):
        raise LabError(f"{state} is not empty and holds no lab: choose another --state-dir")
    leftovers = _netns_names(prefix) + (["link " + prefix + "-host"] if Path(f"/sys/class/net/{prefix}-host").exists()
                                        else [])
    if leftovers:
        raise LabError(f"{', '.join(leftovers)} exist (a lab of another state dir?): python -m lab down --state-dir "
                       f"<its dir>, or choose another --prefix")
    if f" {subnet}." in _run("ip", "-o", "-4", "addr"):
        raise LabError(f"{subnet}.0/24 is already used by an interface here: choose another --subnet")
    state.mkdir(parents=True, exist_ok=True)
    (state / MARKER).write_text(prefix + "\n")
    try:
        return _create(count, state, prefix, subnet, log)
    except BaseException:
        log("lab: up failed; removing what it made")
        down(state, log=lambda _: None)
        raise


def _create(count: int, state: Path, prefix: str, subnet: str, log: Log) -> Lab:
    start = time.monotonic()
    switch, service = f"{prefix}-sw", f"{subnet}.254"
    names = [(f"lab{i + 1}", f"{subnet}.{i + 1}") for i in range(count)]
    log(f"lab: {count} node(s) on {subnet}.0/24, state in {state}")
    key = state / "id_ed25519"
    client_key = _keygen(key, "vllm-lab")
    lab = Lab(str(state), prefix, subnet, (), "root", str(key), str(state / "known_hosts"), str(state / "ssh_config"),
              f"{subnet}.253", f"{service}:{REGISTRY_PORT}", f"http://{service}:{S3_PORT}")
    for cmd in (f"netns add {switch}", f"-n {switch} link set lo up", f"-n {switch} link add br0 type bridge",
                f"-n {switch} addr add {service}/24 dev br0", f"-n {switch} link set br0 up",
                f"link add {prefix}-host type veth peer name host netns {switch}",
                f"-n {switch} link set host master br0 up", f"addr add {lab.deployer_address}/24 dev {prefix}-host",
                f"link set {prefix}-host up"):
        _run("ip", *cmd.split())
    nodes = []
    for name, address in names:
        netns = f"{prefix}-{name}"
        for cmd in (f"netns add {netns}", f"link add {IFNAME} netns {netns} type veth peer name {name} netns {switch}",
                    f"-n {switch} link set {name} master br0 up", f"-n {netns} addr add {address}/24 dev {IFNAME}",
                    f"-n {netns} link set {IFNAME} up", f"-n {netns} link set lo up"):
            _run("ip", *cmd.split())
        host_key = _node_files(names, name, address, state / "nodes" / name, netns, lab.registry, client_key)
        nodes.append(Node(name, address, netns, host_key))
    lab = Lab(**{**asdict(lab), "nodes": tuple(nodes)})
    _write_client_files(lab)
    log(f"lab: booting {count} node(s): namespaces, sshd, dockerd")
    ns = state / "ns"
    ns.mkdir()
    _run("mount", "--bind", str(ns), str(ns))
    _run("mount", "--make-private", str(ns))  # a namespace file may only be bound below a private mount
    init = shutil.which("docker-init") or "docker-init"  # tini, from docker.io: the node's pid 1 reaps orphans
    for node in nodes:
        for kind in NAMESPACES:
            (ns / f"{node.name}.{kind[:3]}").touch()
        _daemon(["nsenter", f"--net=/run/netns/{node.netns}", "--", "unshare", *_ns_options(state, node.name),
                 "--fork", "--mount-proc", "--propagation", "private", "--", "sh", "-ec",
                 _boot_script(node.name, state / "nodes" / node.name, init)],
                state / "nodes" / node.name / "log" / "init.log")
    for node in nodes:
        node_log = state / "nodes" / node.name / "log"
        _wait_boot(node_log / "init.log")
        _daemon([*lab.enter(node), "/usr/sbin/sshd", "-D", "-e"], node_log / "sshd.log")
        _daemon([*lab.enter(node), "dockerd", "--config-file", "/etc/docker/daemon.json"], node_log / "dockerd.log")
    registry = state / "registry"
    (registry / "data").mkdir(parents=True)
    (registry / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {registry / 'data'}\n"
        f"  delete:\n    enabled: true\nhttp:\n  addr: {lab.registry}\n")
    moto = Path(sys.executable).parent / "moto_server"
    if not moto.exists():
        raise LabError(f"{moto} is missing: make venv (requirements-dev.txt has moto[server])")
    in_switch = ["nsenter", f"--net=/run/netns/{switch}", "--"]
    _daemon([*in_switch, "docker-registry", "serve", str(registry / "config.yml")], registry / "registry.log")
    _daemon([*in_switch, str(moto), "-H", service, "-p", str(S3_PORT)], state / "moto.log")
    log("lab: waiting for every sshd, engine, the registry and S3")
    for node in nodes:
        _wait_node(lab, node)
    _wait(lambda: _listening(service, REGISTRY_PORT), lambda: f"registry: {_tail(registry / 'registry.log')}")
    _wait(lambda: _listening(service, S3_PORT), lambda: f"moto: {_tail(state / 'moto.log')}")
    ids = {}
    for node in nodes:  # the path the program takes: SSH with the pinned key, then the docker CLI on the node
        done = lab.ssh(node, "docker info --format '{{.ID}}'")
        if done.returncode != 0 or not done.stdout.strip():
            raise LabError(f"ssh {node.name} docker info: exit {done.returncode}: {done.stderr.strip()[-400:]}")
        ids[done.stdout.strip()] = node.name
    if len(ids) != len(nodes):
        raise LabError(f"two nodes answered with one engine ID: {ids}")
    (state / "lab.json").write_text(json.dumps(asdict(lab), indent=2) + "\n")
    log(f"lab: up in {time.monotonic() - start:.1f} s")
    return lab


def _wait_boot(log: Path) -> None:
    _wait(lambda: _tail(log).endswith("booted\n"), lambda: f"boot: {_tail(log)}")


def _wait_node(lab: Lab, node: Node) -> None:
    logs = Path(lab.state_dir) / "nodes" / node.name / "log"
    _wait(lambda: _listening(node.address, 22), lambda: f"sshd of {node.name}: {_tail(logs / 'sshd.log')}")
    _wait(lambda: _engine_id(lab, node), lambda: f"dockerd of {node.name}: {_tail(logs / 'dockerd.log')}")


def _write_client_files(lab: Lab) -> None:
    """known_hosts with each node's key, an ssh_config naming the nodes, and an `ssh` wrapper using both (first on
    PATH, it lets the docker CLI's and pulumi-docker's ssh reach the nodes as ~/.ssh/config would)."""
    state = Path(lab.state_dir)
    Path(lab.known_hosts).write_text("".join(f"{n.address} {n.host_key}\n" for n in lab.nodes))
    Path(lab.ssh_config).write_text(
        "".join(f"Host {n.name}\n  HostName {n.address}\n" for n in lab.nodes)
        + f"Host *\n  User {lab.ssh_user}\n  IdentityFile {lab.key_path}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  ConnectTimeout 15\n")
    wrapper = state / "bin" / "ssh"
    wrapper.parent.mkdir()
    ssh = shutil.which("ssh", path="/usr/bin:/bin") or "ssh"
    wrapper.write_text(f"#!/bin/sh\nexec {ssh} -F {shlex.quote(lab.ssh_config)} \"$@\"\n")
    wrapper.chmod(0o755)


def _engine_id(lab: Lab, node: Node) -> str:
    done = subprocess.run([*lab.enter(node), "docker", "info", "--format", "{{.ID}}"], capture_output=True,
                          text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else ""


def _ns_inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def lab_pids(state_dir: Path | str, prefix: str) -> dict[int, str]:
    """pid -> name of every live process of the lab: in one of its network or mount namespaces (daemons, SSH
    sessions, host-network containers) or in a node engine's cgroups (every container)."""
    inodes = {i for i in (_ns_inode(Path("/run/netns") / n) for n in _netns_names(prefix)) if i}
    ns_dir = Path(state_dir) / "ns"
    inodes |= {i for i in (_ns_inode(p) for p in (ns_dir.iterdir() if ns_dir.is_dir() else [])) if i}
    cgroup = re.compile(rf":/{re.escape(prefix)}-[^/\n]+(/|$)", re.M)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            links = {os.readlink(entry / "ns" / kind) for kind in ("net", "mnt", "pid")}
            mine = any(int(link.split("[")[1].rstrip("]")) in inodes for link in links)
            if mine or cgroup.search((entry / "cgroup").read_text()):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found[int(entry.name)] = (entry / "comm").read_text().strip()
    return found


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this namespace, deepest first."""
    points = [line.split()[4].encode().decode("unicode_escape") for line in
              Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if p == str(path) or p.startswith(f"{path}/")), key=len, reverse=True)


def down(state_dir: Path | str = DEFAULT_STATE, prefix: str | None = None, log: Log = print) -> None:
    """Remove everything a lab made: its processes (containers first among them), mounts, namespaces, links,
    cgroups and the state dir. Idempotent; works from what exists, so also after a failed `up`. The prefix is the
    state dir's own (its marker); a dir without one is left alone unless `prefix` is given."""
    start = time.monotonic()
    state = Path(state_dir).resolve()
    marker = state / MARKER
    if prefix is None:
        if not marker.is_file():  # not a lab's state dir: never guess a prefix (it would be another lab's)
            log(f"lab: no lab in {state} (no {MARKER}); give --prefix to remove one made with another state dir")
            return
        prefix = marker.read_text().strip()
    pids = lab_pids(state, prefix)
    if pids:
        log(f"lab: stopping {len(pids)} process(es): {', '.join(sorted(set(pids.values())))}")
        for sig, deadline_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 60.0)):
            for pid in lab_pids(state, prefix):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(LabError):
                _wait(lambda: not lab_pids(state, prefix), lambda: "", deadline_s)
        left = lab_pids(state, prefix)
        if left:
            raise LabError(f"processes survived SIGKILL: {left}")
    for point in _mounts_under(state):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            _run("umount", "-l", point)
    for netns in _netns_names(prefix):
        _run("ip", "netns", "del", netns)
    host_link = Path(f"/sys/class/net/{prefix}-host")
    if host_link.exists():  # the kernel tears the veth pair down on its own once the namespace end is gone
        gone = subprocess.run(["ip", "link", "del", host_link.name], capture_output=True, text=True)
        if gone.returncode != 0 and host_link.exists():
            raise LabError(f"ip link del {host_link.name}: exit {gone.returncode}: {gone.stderr.strip()}")
    for top in [*Path("/sys/fs/cgroup").glob(f"{prefix}-*"), *Path("/sys/fs/cgroup").glob(f"*/{prefix}-*")]:
        for folder, _, _ in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    if marker.is_file():
        if _mounts_under(state):
            raise LabError(f"mounts remain under {state}: {_mounts_under(state)}")
        shutil.rmtree(state)
    log(f"lab: down in {time.monotonic() - start:.1f} s")


def problems(lab: Lab) -> list[str]:
    """What is missing or not answering in a lab that was up; empty when all of it answers."""
    found = []
    present = set(_netns_names(lab.prefix))
    for node in lab.nodes:
        if node.netns not in present:
            found.append(f"{node.name}: no network namespace {node.netns}")
            continue
        if not _listening(node.address, 22):
            found.append(f"{node.name}: sshd not listening on {node.address}:22")
        if not _engine_id(lab, node):
            found.append(f"{node.name}: dockerd not answering")
    host, port = lab.registry.rsplit(":", 1)
    for what, addr, number in (("registry", host, int(port)), ("S3 (moto)", host, S3_PORT)):
        if not _listening(addr, number):
            found.append(f"{what} not listening on {addr}:{number}")
    return found


def status(state_dir: Path | str = DEFAULT_STATE) -> tuple[bool, list[str]]:
    """(whether a healthy lab is up, lines saying what exists)."""
    state = Path(state_dir).resolve()
    lab = load(state)
    marker = state / MARKER
    if lab is None and not marker.is_file():  # not a lab's state dir: another lab's prefix is not this one's
        return False, [f"state dir {state}: {'exists, no lab' if state.exists() else 'absent'}"]
    prefix = lab.prefix if lab else marker.read_text().strip()
    pids = lab_pids(state, prefix)
    lines = [f"state dir {state}: {'a lab' if lab else 'exists, no lab.json' if state.exists() else 'absent'}",
             f"namespaces: {', '.join(_netns_names(prefix)) or 'none'}",
             f"processes: {len(pids)} ({', '.join(sorted(set(pids.values()))) or 'none'})",
             f"mounts under the state dir: {len(_mounts_under(state))}"]
    if lab is None:
        return False, lines
    lines += [f"{n.name} {n.address} {n.host_key}" for n in lab.nodes]
    lines += [f"registry {lab.registry}, S3 {lab.s3_endpoint}, deployer {lab.deployer_address}"]
    trouble = problems(lab)
    return not trouble, lines + (trouble or ["every sshd, engine, the registry and S3 answer"])


@contextlib.contextmanager
def _relay(target: str) -> Iterator[int]:
    """A TCP relay on 127.0.0.1 (a free port) to `target`, for as long as the block runs."""
    host, port = target.rsplit(":", 1)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    class Pipe(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with socket.create_connection((host, int(port)), timeout=30) as upstream:
                upstream.settimeout(None)
                back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
                back.start()
                pump(self.request, upstream)
                back.join()

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Pipe)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def push_image(lab: Lab, image: str, name: str) -> str:
    """Push `image` from this machine's own Docker engine into the lab registry; returns what nodes pull
    (`<registry>/<name>`). That engine runs without --insecure-registry and speaks plain HTTP only to loopback
    registries, so the push goes through a relay on 127.0.0.1 (the registry keys images by name, not host)."""
    with _relay(lab.registry) as port:
        local = f"127.0.0.1:{port}/{name}"
        _run("docker", "tag", image, local)
        try:
            _run("docker", "push", local, timeout_s=1800)
        finally:
            _run("docker", "rmi", local, quiet=True)
    return f"{lab.registry}/{name}"


def s3_client(lab: Lab) -> Any:
    """A boto3 S3 client of the lab's S3 (boto3 from requirements-dev.txt)."""
    import boto3  # type: ignore[import-untyped]

    return boto3.session.Session().client("s3", endpoint_url=lab.s3_endpoint, region_name=S3_REGION,
                                          aws_access_key_id=S3_KEY_ID, aws_secret_access_key=S3_SECRET)


def s3_upload(lab: Lab, folder: Path | str, bucket: str, prefix: str) -> str:
    """Upload every file below `folder` to `s3://bucket/prefix/` on the lab's S3 (bucket made when missing)."""
    client = s3_client(lab)
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    root = Path(folder)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix.strip('/')}/{path.relative_to(root).as_posix()}")
    return f"s3://{bucket}/{prefix.strip('/')}"
