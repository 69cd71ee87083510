"""The real vllm-router for tests: the pinned wheel from PyPI, checked by sha256 and unpacked, and a venv holding
the packages its launcher imports, cached under ~/.cache/vllm-cluster/ like the toolchain.

The router runs the way its container does (stacks/planner/router.py `router_container`): `python -m
vllm_router.launch_router ARGS` with the unpacked wheel on PYTHONPATH; only the Python differs (a venv with
tests/fixtures/vllm-router/requirements.txt, the versions pip resolved for the wheel on 2026-12-05, instead of the
vLLM image's). `VLLM_CLUSTER_ROUTER_CACHE` moves the cache. Two test processes take turns (a lock in the cache); a
cache counts only when its stamp names the wheel's sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from stacks.planner.router import ROUTER_VERSION, ROUTER_WHEEL, ROUTER_WHEEL_SHA256, ROUTER_WHEEL_URL
from tests.conftest import ROOT

REQUIREMENTS = ROOT / "tests" / "fixtures" / "vllm-router" / "requirements.txt"


def cache_dir() -> Path:
    base = os.environ.get("VLLM_CLUSTER_ROUTER_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "vllm-cluster" / f"vllm-router-{ROUTER_VERSION}"


def _key() -> str:
    return hashlib.sha256((ROUTER_WHEEL_SHA256 + REQUIREMENTS.read_text() + sys.version).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(target: Path) -> None:
    """The wheel from PyPI, kept only if its sha256 is the pinned one."""
    partial = target.with_suffix(".part")
    with urllib.request.urlopen(ROUTER_WHEEL_URL, timeout=120) as response, open(partial, "wb") as out:
        shutil.copyfileobj(response, out)
    digest = hashlib.sha256(partial.read_bytes()).hexdigest()
    if digest != ROUTER_WHEEL_SHA256:
        partial.unlink()
        raise RuntimeError(f"{ROUTER_WHEEL}: sha256 {digest}, pinned {ROUTER_WHEEL_SHA256}")
    partial.rename(target)


def router_runtime() -> tuple[Path, Path]:
    """(python, unpacked wheel folder), built once per cache key."""
    root = cache_dir() / _key()
    python, wheel_dir, stamp = root / "venv" / "bin" / "python", root / "wheel", root / "stamp"
    with _lock(cache_dir() / "lock"):
        if stamp.exists() and stamp.read_text() == ROUTER_WHEEL_SHA256:
            return python, wheel_dir
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        wheel = root / ROUTER_WHEEL
        _download(wheel)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(wheel_dir)
        for so in wheel_dir.rglob("*.so*"):  # zip keeps no modes: the loader needs the libraries readable
            so.chmod(0o755)
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(REQUIREMENTS)], check=True)
        stamp.write_text(ROUTER_WHEEL_SHA256)
    return python, wheel_dir


def router_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start the router with `args`, as its container does."""
    python, wheel_dir = router_runtime()
    env = dict(os.environ, PYTHONPATH=str(wheel_dir), PYTHONDONTWRITEBYTECODE="1")
    return [str(python), "-m", "vllm_router.launch_router", *args], env


def wait_http(url: str, deadline_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; fail early when `process` has exited."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {deadline_s}s")
