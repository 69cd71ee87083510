"""Test images for a real Docker engine with no registry: a minimal rootfs (Debian's python3 and its libraries,
plus the vLLM stand-in) turned into an image by `docker import`."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
STANDIN = ROOT / "tests" / "vllm_standin"
FLAGS = ROOT / "tests" / "fixtures" / "vllm-0.33.0-serve-flags.json"
REGISTRIES = ROOT / "tests" / "fixtures" / "vllm-0.33.0-registries.json"
SITE = "usr/local/lib/python3.11/dist-packages"
RUN = uuid.uuid4().hex[:8]
"""In every image tag and container name a test makes: two test runs sharing one Docker engine never touch each
other's (nor remove the other's images at teardown)."""
_SKIP = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "__pycache__", "turtledemo"}


def docker_ready() -> str | None:
    """None when `docker info` answers, else why not (the tests fail with it: `make services` starts dockerd)."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"docker info failed: {done.stderr.strip()[:200]}"


def shared_libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    paths = []
    for line in out.splitlines():
        parts = line.split()
        candidate = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if candidate.startswith("/"):
            paths.append(Path(candidate))
    return paths


def build_image(tag: str, workdir: Path, flags: dict[str, Any] | None = None, with_vllm: bool = True,
                modules: tuple[str, ...] = (), files: dict[Path, str] | None = None,
                libraries_of: tuple[Path, ...] = (), changes: tuple[str, ...] = (),
                docker_host: str | None = None) -> str:
    """A python3 image; with the vLLM stand-in (its flag table and parser registries, and the executable
    `vllm-rs` placeholder the real wheel ships) unless `with_vllm` is false. `modules`: packages copied from this
    virtualenv (the vLLM image has httpx and pydantic, for example); `files`: more files, source -> path;
    `libraries_of`: binaries whose shared libraries the image needs too (e.g. `_ssl`'s libssl); `changes`: Dockerfile
    instructions for `docker import --change` (an ENTRYPOINT); `docker_host`: another engine than the default."""
    if not PYTHON.exists():
        raise RuntimeError(f"{PYTHON} is missing: `make services` installs Debian's python3")
    archive = workdir / f"{tag.replace('/', '_').replace(':', '_')}.tar"

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if _SKIP & set(Path(info.name).parts) else info

    with tarfile.open(archive, "w") as tar:
        libraries = [*shared_libraries(PYTHON), *(x for b in libraries_of for x in shared_libraries(b))]
        for lib in dict.fromkeys([PYTHON, *libraries]):
            tar.add(lib.resolve(), arcname=str(lib).lstrip("/"))
        link = tarfile.TarInfo("usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        tar.addfile(link)
        for directory in ("tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(STDLIB, arcname=str(STDLIB).lstrip("/"), filter=keep)
        if with_vllm:
            tar.add(STANDIN / "vllm", arcname=f"{SITE}/vllm", filter=keep)
            tar.add(STANDIN / "ray", arcname=f"{SITE}/ray", filter=keep)
            table = workdir / f"{archive.stem}-flags.json"
            table.write_text(json.dumps(flags if flags is not None else json.loads(FLAGS.read_text())))
            tar.add(table, arcname=f"{SITE}/vllm/_flags.json")
            tar.add(REGISTRIES, arcname=f"{SITE}/vllm/_registries.json")
        for module in modules:
            found = importlib.util.find_spec(module)
            if found is None or found.origin is None:
                raise RuntimeError(f"{module} is not installed here")
            origin = Path(found.origin)
            source = origin.parent if origin.name == "__init__.py" else origin
            tar.add(source, arcname=f"{SITE}/{source.name}", filter=keep)
        for source, target in (files or {}).items():
            tar.add(source, arcname=target.lstrip("/"))
    host = ["-H", docker_host] if docker_host else []
    subprocess.run(["docker", *host, "import", *(f"--change={c}" for c in changes), str(archive), tag], check=True,
                   capture_output=True)
    return tag


HOOK = "nvidia-container-runtime-hook"


@contextmanager
def private_dockerd(workdir: Path, deadline_s: float = 120) -> Iterator[str]:
    """A Docker engine of the test's own (its socket's `unix://` address), stopped and removed afterwards.

    It answers `--gpus` like a GPU node's engine: dockerd registers its NVIDIA device driver when it finds
    `nvidia-container-runtime-hook` on its PATH (moby daemon/nvidia_linux.go), so a do-nothing hook there lets a
    container created with `--gpus all` start, with `DeviceRequests` as on a real node and no GPU inside. Its
    default network is a bridge of its own that the harness creates and deletes (never `--bridge=none`: with it,
    dockerd deletes the host's `docker0`, the default engine's bridge, moby daemon_unix.go
    `removeDefaultBridgeInterface`), and it writes no iptables rules; containers run on the system's containerd in
    a namespace of their own, so nothing is shared with the default engine's containers or images."""
    root = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))  # short: a unix socket path has ~107 bytes
    (root / "bin").mkdir()
    hook = root / "bin" / HOOK
    hook.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    hook.chmod(0o755)
    sock = f"unix://{root}/docker.sock"
    ns = f"testd-{RUN}-{uuid.uuid4().hex[:8]}"  # containerd: letters and digits between single separators
    containerd = Path("/var/run/docker/containerd/containerd.sock")
    shared = ["--containerd", str(containerd)] if containerd.exists() else []
    docker0 = Path("/sys/class/net/docker0").exists()
    bridge = _own_bridge()
    log = open(workdir / "dockerd.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        ["dockerd", "--data-root", f"{root}/data", "--exec-root", f"{root}/exec", "--pidfile", f"{root}/pid", "-H",
         sock, "--iptables=false", "--ip-masq=false", "--bridge", bridge, *shared, "--containerd-namespace", ns,
         "--containerd-plugins-namespace", f"{ns}-p"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": f"{root}/bin:{os.environ['PATH']}"})
    try:
        end = time.monotonic() + deadline_s
        while subprocess.run(["docker", "-H", sock, "info"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"dockerd did not answer on {sock}: {(workdir / 'dockerd.log').read_text()[-800:]}")
            time.sleep(0.3)
        yield sock
    finally:
        listed = subprocess.run(["docker", "-H", sock, "ps", "-aq"], capture_output=True, text=True).stdout.split()
        if listed:
            subprocess.run(["docker", "-H", sock, "rm", "-f", *listed], capture_output=True)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for mount in reversed([line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                               if len(line.split()) > 1 and line.split()[1].startswith(str(root))]):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    if docker0 and not Path("/sys/class/net/docker0").exists():
        raise RuntimeError("the host's docker0 bridge vanished while a test's own dockerd ran")


def _own_bridge() -> str:
    """A bridge for a test's own dockerd, on a /24 of 198.18.0.0/15 (RFC 2544, never routed) that no interface
    of this host uses."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    name = f"hdbr{uuid.uuid4().hex[:8]}"
    for third in random.sample(range(256), 256):
        if f" 198.18.{third}." not in used:
            subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True, capture_output=True)
            subprocess.run(["ip", "addr", "add", f"198.18.{third}.1/24", "dev", name], check=True,
                           capture_output=True)
            subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True)
            return name
    raise RuntimeError("no free /24 in 198.18.0.0/16 for a test's own dockerd")


def renamed_flag(old: str, new: str, version: str) -> dict[str, Any]:
    """The captured 0.33.0 table with one flag renamed: what a newer vLLM that renamed a flag looks like."""
    table: dict[str, Any] = json.loads(FLAGS.read_text())
    for flag in table["flags"]:
        if old in flag.get("options", []):
            flag["options"] = [new if o == old else o for o in flag["options"]]
    table["vllm_version"] = version
    return table


def remove_image(tag: str) -> None:
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def standin_env() -> dict[str, str]:
    """Environment that makes this interpreter import the stand-in with the captured fixtures."""
    return {"PYTHONPATH": str(STANDIN), "VLLM_STANDIN_FLAGS": str(FLAGS), "VLLM_STANDIN_REGISTRIES": str(REGISTRIES)}


def run_shell(command: str, timeout_s: int = 180) -> subprocess.CompletedProcess[str]:
    """What `remote.Command` runs over SSH, run by bash here."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout_s,
                          env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                               "HOME": str(Path.home())})


def parse_started_at(text: str) -> datetime:
    """Docker's `State.StartedAt` (RFC 3339 in UTC; Go trims the nanoseconds' trailing zeros) as a datetime, to
    order container starts by what Docker itself recorded."""
    head, _, fraction = text.strip().rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{fraction[:6].ljust(6, '0')}+00:00")
