"""Build the wheel from this checkout's tracked files and install it into a fresh venv outside the checkout: what
tests/test_wheel.py and bench/install_size.py run the installed tool from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""This checkout (not imported from conftest: bench/install_size.py uses this module outside pytest)."""
SHIPPED_PACKAGES = ("stacks", "components", "review", "heal", "checks", "policy", "vllm_cluster")


def build_wheel(into: Path) -> Path:
    """The wheel of the tracked files (and untracked ones git does not ignore), built in a copy under `into`, so
    the build's own folders (build/, *.egg-info) are never written into the checkout."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    source = into / "source"
    for rel in filter(None, listed):
        if rel.startswith(("tests/", "lab/", "bench/", "toolchain/")) or not (ROOT / rel).is_file():
            continue
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, source / rel)
    out = into / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check", "-w", str(out)], check=True, capture_output=True, cwd=into)
    (wheel,) = out.glob("vllm_cluster-*.whl")
    return wheel


def fresh_venv(at: Path) -> Path:
    """A venv with nothing but pip, made by this interpreter's base Python (no site-packages of this venv)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(at)], check=True, capture_output=True)
    return at / "bin" / "python"


def install(python: Path, requirement: str) -> subprocess.CompletedProcess[str]:
    """`pip install REQUIREMENT` into that venv from PyPI, run outside the checkout with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VLLM_CLUSTER", "PIP_"))}
    return subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
                          capture_output=True, text=True, cwd=python.parent, env=env, timeout=900)
