"""Whether an interpreter has what a tool beyond planning needs, asked before the tool acts or prints a unit.

`make venv-plan` installs only what a plan needs (requirements-plan.txt). The API check (`checks.api`: httpx),
the Pulumi program under mocks and the S3 readers need what `make venv` adds (requirements.txt and
requirements-dev.txt). Without them a tool answers exit 2 naming the package, instead of stopping a group and
then failing its golden check on an import, or printing a unit whose interpreter cannot run its command.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

from stacks.model.project import CODE_ROOT, IN_CHECKOUT

PROJECT = ("stacks", "review", "heal", "components", "checks", "policy", "bench", "tests", "vllm_cluster")
"""The project's own packages: one of them missing is a bug, never an install."""
CHECKS = "checks.api"
"""What the heal tools run: the health and golden probes, the supervisor's metrics server, the CA file's check."""
CHECKS_WHAT = "the API check (checks.api)"
REQUIREMENTS = ("requirements.txt", "requirements-dev.txt")
PROBE = """import importlib, sys
if sys.argv[1]:
    sys.path.insert(0, sys.argv[1])
try:
    importlib.import_module(sys.argv[2])
except ModuleNotFoundError as exc:
    print(exc.name or sys.argv[2])
"""
"""Run by another interpreter: prints the module it lacks to import the one named, nothing when it imports."""


def missing_here(module: str) -> str | None:
    """The package (its top-level name) this interpreter lacks to import `module`, or None when it imports."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or module).partition(".")[0]
        if top in PROJECT:
            raise
        return top
    return None


def missing_in(python: str, module: str) -> str | None:
    """The same for `python` (a unit's ExecStart interpreter), asked as the unit runs it: this checkout first on
    its path (installed, nothing: that interpreter needs vllm-cluster itself, named when it lacks it), no PYTHON*
    variables (`-I`). None when it imports, or when it cannot be asked here (no such file: a unit for another
    host; a relative path, which a unit refuses anyway)."""
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        return missing_here(module)
    if not (os.path.isabs(python) and Path(python).is_file() and os.access(python, os.X_OK)):
        return None
    try:
        done = subprocess.run([python, "-I", "-c", PROBE, str(CODE_ROOT) if IN_CHECKOUT else "", module],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = done.stdout.strip().partition(".")[0]
    if top in PROJECT and not IN_CHECKOUT:  # the wheel is not installed there
        return "vllm-cluster"
    return top if top and top not in PROJECT else None


def pinned_in(package: str) -> str | None:
    """The requirements file that pins `package`, or None (a package one of them pulls in)."""
    for name in REQUIREMENTS:
        try:
            text = (CODE_ROOT / name).read_text()
        except OSError:
            continue
        if re.search(rf"^{re.escape(package)}\s*(\[|[=<>~!;]|$)", text, re.M | re.I):
            return name
    return None


def unit_python(root: Path) -> tuple[str, str]:
    """The interpreter a unit runs by default, and what it is: in this checkout its venv (`make venv`); in a user's
    project its venv/ (where Pulumi installs requirements.txt), else the interpreter running this command (the one
    `pip install vllm-cluster` put the tool in)."""
    venv = root / "venv" / "bin" / "python"
    if IN_CHECKOUT and root.resolve() == CODE_ROOT:
        return str(venv), "this checkout's venv"
    if venv.is_file():
        return str(venv), f"the project's venv ({root})"
    return sys.executable, "the interpreter running vllm-cluster"


def needs(what: str, module: str, python: str | None = None) -> str | None:
    """Why `python` (default: this interpreter) cannot run `what` (it imports `module`), or None: the package it
    lacks, where it is pinned, and `make venv`."""
    python = python or sys.executable
    package = missing_in(python, module)
    if package is None:
        return None
    if not IN_CHECKOUT:  # installed from the wheel: the extras hold what planning does not need
        return (f"{what} needs {package}, which {python} cannot import: a plain `pip install vllm-cluster` has only "
                "what a plan needs; install the extras into that interpreter's venv: pip install "
                "'vllm-cluster[deploy,s3,checks]'")
    pin = pinned_in(package)
    return (f"{what} needs {package}{f' ({pin})' if pin else ''}, which {python} cannot import: the planning-only "
            "venv (`make venv-plan`) has only what a plan needs; run `make venv` (installs requirements.txt and "
            "requirements-dev.txt)")
