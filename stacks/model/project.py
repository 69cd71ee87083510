"""Where things are: the user's project (their stacks and cards) and what ships with the code (cards, examples).

The code runs two ways: from this repository's checkout (the developer path: `python -m stacks`, `make plan`) and
installed from the wheel (`vllm-cluster …` in a project of the user's that `vllm-cluster init` made). The project
is found the same way in both, so no command guesses from where its code lives:

1. `VLLM_CLUSTER_ROOT`, when set;
2. else the nearest directory holding a `Pulumi.yaml`, from the working directory up (Pulumi runs the program
   there, and an operator runs the tools there);
3. else this checkout, when the code runs from one (the old default: tests and scripts that run elsewhere), or the
   working directory.

The shipped cards and examples are the checkout's `models/`, `images/` and `examples/`; in the wheel they are the
package data `vllm_cluster/data/…` (pyproject.toml maps them there). Stdlib only: the policy pack imports this.
"""

from __future__ import annotations

import os
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parents[2]
"""The directory that holds the `stacks` package: this checkout, or site-packages when installed."""
IN_CHECKOUT = (CODE_ROOT / "pyproject.toml").is_file() and (CODE_ROOT / "stacks" / "__main__.py").is_file()
"""The code runs from this repository's checkout (the developer path), not from an installed wheel."""
PACKAGE_DATA = CODE_ROOT / "vllm_cluster" / "data"


def shipped(name: str) -> Path:
    """The shipped `models`, `images` or `examples` directory (read-only: no command writes into it)."""
    return CODE_ROOT / name if IN_CHECKOUT else PACKAGE_DATA / name


def project_root(cwd: Path | None = None) -> Path:
    """The user's project: VLLM_CLUSTER_ROOT, else the nearest directory with a Pulumi.yaml from `cwd` (the working
    directory) up, else this checkout (when running from one) or `cwd`."""
    env = os.environ.get("VLLM_CLUSTER_ROOT")
    if env:
        return Path(env)
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "Pulumi.yaml").is_file():
            return folder
    return CODE_ROOT if IN_CHECKOUT else here


def is_developer_checkout(root: Path) -> bool:
    """`root` is this repository's checkout: only there do commands rewrite generated docs (README, docs/)."""
    return IN_CHECKOUT and root.resolve() == CODE_ROOT


def same_file(a: Path, b: Path) -> bool:
    """Both name one file (a project may link a shipped card); False when either is missing."""
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def not_a_project(root: Path) -> str | None:
    """Why a command may not write the user's files (cards) under `root`, or None: a folder with a Pulumi.yaml,
    or this checkout (the developer path), and never inside the installed code or its shipped cards."""
    via = " (from VLLM_CLUSTER_ROOT)" if os.environ.get("VLLM_CLUSTER_ROOT") else ""
    fix = "run it in your project (a folder with Pulumi.yaml, or VLLM_CLUSTER_ROOT=DIR), or make one: " \
          "vllm-cluster init DIR"
    if not IN_CHECKOUT:
        here = root.resolve()
        if here == CODE_ROOT or CODE_ROOT in here.parents:
            return f"{root}{via} is inside the installed vllm-cluster ({CODE_ROOT}): {fix}"
    if is_developer_checkout(root):
        return None
    if not root.is_dir():
        return f"{root}{via} is not a folder: {fix}"
    if not (root / "Pulumi.yaml").is_file():
        return f"{root}{via} holds no Pulumi.yaml: {fix}"
    return None
