"""Where things are: the user's project (their stacks and cards) and what ships with the code (cards, examples).

The code runs two ways: from this repository's checkout (the developer path: `python -m stacks`, `make plan`) and
installed from the wheel (`vllm-cluster …` in a project of the user's that `vllm-cluster init` made). The project
is found the same way in both, so no command guesses from where its code lives:

1. `VLLM_CLUSTER_ROOT`, when set;
2. else the nearest directory holding a vllm-cluster `Pulumi.yaml` (`name: vllm-cluster`, as `init` writes it:
   the stack files' keys are `vllm-cluster:<key>`), from the working directory up (Pulumi runs the program there,
   and an operator runs the tools there); another Pulumi project's `Pulumi.yaml` is passed over, and named when
   no project is found (`project_problem`);
3. else this checkout, when the code runs from one (the old default: tests and scripts that run elsewhere), or the
   working directory.

The shipped cards and examples are the checkout's `models/`, `images/` and `examples/`; in the wheel they are the
package data `vllm_cluster/data/…` (pyproject.toml maps them there). Stdlib only: the policy pack imports this.
"""

from __future__ import annotations

import errno
import os
import re
import unicodedata
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parents[2]
"""The directory that holds the `stacks` package: this checkout, or site-packages when installed."""
IN_CHECKOUT = (CODE_ROOT / "pyproject.toml").is_file() and (CODE_ROOT / "stacks" / "__main__.py").is_file()
"""The code runs from this repository's checkout (the developer path), not from an installed wheel."""
PACKAGE_DATA = CODE_ROOT / "vllm_cluster" / "data"
STACKS = "python -m stacks" if IN_CHECKOUT else "vllm-cluster"
"""How a message names the command: `python -m stacks` in this checkout, the installed `vllm-cluster` elsewhere
(where `python` may be another interpreter than the tool's, with pipx say)."""
STACKS_VENV = "venv/bin/python -m stacks" if IN_CHECKOUT else "vllm-cluster"
"""The same where the checkout's messages name its venv's interpreter."""


def shipped(name: str) -> Path:
    """The shipped `models`, `images` or `examples` directory (read-only: no command writes into it)."""
    return CODE_ROOT / name if IN_CHECKOUT else PACKAGE_DATA / name


PROJECT_NAME = "vllm-cluster"
"""The `name:` of a vllm-cluster project's Pulumi.yaml: Pulumi's config namespace of every stack file key."""
ROOT_ENV = "VLLM_CLUSTER_ROOT"


def pulumi_project_name(folder: Path) -> str | None:
    """The `name:` of `folder`/Pulumi.yaml ('' when it has none), None without a readable Pulumi.yaml. Read from
    its top-level `name:` line, without a YAML library (the policy pack imports this module)."""
    try:
        text = (folder / "Pulumi.yaml").read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):  # no such file, a folder of that name, a name too long
        return None
    for line in text.splitlines():
        found = re.match(r"name:\s*(.*?)\s*(?:\s#.*)?$", line)
        if found:
            return found[1].strip("'\"")
    return ""


def is_project(folder: Path) -> bool:
    """`folder` holds a vllm-cluster project's Pulumi.yaml (another Pulumi project's does not count)."""
    return pulumi_project_name(folder) == PROJECT_NAME


def _up(cwd: Path | None) -> list[Path]:
    here = (cwd or Path.cwd()).resolve()
    return [here, *here.parents]


def project_root(cwd: Path | None = None) -> Path:
    """The user's project: VLLM_CLUSTER_ROOT, else the nearest directory with a vllm-cluster Pulumi.yaml from `cwd`
    (the working directory) up, else this checkout (when running from one) or `cwd`."""
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env)
    folders = _up(cwd)
    return next((f for f in folders if is_project(f)), CODE_ROOT if IN_CHECKOUT else folders[0])


def passed_over(root: Path, cwd: Path | None = None) -> Path | None:
    """The nearest other Pulumi project's folder from `cwd` up to `root` (or the top), which the search passed
    over: when a stack is not found, the user may have meant it."""
    if os.environ.get(ROOT_ENV):
        return None
    for folder in _up(cwd):
        if folder == root:
            return None
        if pulumi_project_name(folder) not in (None, PROJECT_NAME):
            return folder
    return None


def project_problem(root: Path, cwd: Path | None = None) -> str | None:
    """Why `root` (PROJECT_ROOT) is no vllm-cluster project, naming it and where it came from (VLLM_CLUSTER_ROOT or
    the working directory), or None: a project, or this checkout. Without the variable, the nearest other Pulumi
    project up from `cwd` is named: its Pulumi.yaml was passed over."""
    via = f" (from {ROOT_ENV})" if os.environ.get(ROOT_ENV) else ""
    try:
        if is_developer_checkout(root):
            return None
        if not root.exists():
            return f"{root}{via} does not exist"
        if not root.is_dir():
            return f"{root}{via} is not a folder"
    except (OSError, ValueError):
        return f"{root}{via} cannot be read"
    name = pulumi_project_name(root)
    if name == PROJECT_NAME:
        return None
    if name is not None:
        return (f"{root}{via} holds the Pulumi project {name[:60]!r}, not a vllm-cluster project (its Pulumi.yaml "
                f"would say name: {PROJECT_NAME})")
    other = passed_over(root, cwd)
    if other is not None:
        return f"{root} holds no Pulumi.yaml; {passed_over_note(other)}"
    return f"{root}{via} holds no Pulumi.yaml"


def passed_over_note(folder: Path) -> str:
    """What a passed-over Pulumi project is, in a refusal."""
    return (f"{folder / 'Pulumi.yaml'} is the Pulumi project {pulumi_project_name(folder)!r}, not a vllm-cluster "
            f"project (its Pulumi.yaml would say name: {PROJECT_NAME}), so it was passed over")


def is_developer_checkout(root: Path) -> bool:
    """`root` is this repository's checkout: only there do commands rewrite generated docs (README, docs/)."""
    return IN_CHECKOUT and root.resolve() == CODE_ROOT


def same_file(a: Path, b: Path) -> bool:
    """Both name one file (a project may link a shipped card); False when either is missing."""
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def unsafe_name(text: str) -> str | None:
    """Why `text` (a folder name or path a command would create or read) cannot be used, or None: control
    characters; invisible or direction-changing formatting characters (U+200F RIGHT-TO-LEFT MARK, U+202E, U+2066
    …, Unicode category Cf), which make a name read as another one in a terminal or a review; bytes that are not
    UTF-8 (Python holds them as lone surrogates), which no stack file or unit can name."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "has control characters"
    if any(0xDC80 <= ord(c) <= 0xDCFF for c in text):
        return "is not valid UTF-8"
    hidden = sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in ("Cf", "Cs")})
    if hidden:
        return (f"has invisible or right-to-left formatting characters ({', '.join(hidden[:3])}), which make it "
                "read as another name")
    return None


PATH_ERRORS = (errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM)
"""What makes a path unusable, not merely absent: a name over NAME_MAX or PATH_MAX, a loop of links, no access."""


def root_variable_problem() -> str | None:
    """Why VLLM_CLUSTER_ROOT cannot name a project at all (checked before any command reads it), or None: unset, or
    a path that may simply not exist yet (the command says so in its own words)."""
    value = os.environ.get(ROOT_ENV)
    if not value:
        return None
    shown = repr(value[:80] + ("…" if len(value) > 80 else "")).replace("\\udc", "\\x")
    why = unsafe_name(value)
    if why is None:
        try:
            os.stat(value)
        except OSError as exc:
            if exc.errno in PATH_ERRORS:
                size = f", {len(value)} characters" if exc.errno == errno.ENAMETOOLONG else ""
                why = f"cannot be used ({exc.strerror}{size})"
        except ValueError:  # an embedded NUL
            why = "has control characters"
    return f"{ROOT_ENV} {shown}: {why}; {PROJECT_FIX}" if why else None


def not_a_project(root: Path) -> str | None:
    """Why a command may not write the user's files (cards) under `root`, or None: a folder with a Pulumi.yaml,
    or this checkout (the developer path), and never inside the installed code or its shipped cards."""
    via = f" (from {ROOT_ENV})" if os.environ.get(ROOT_ENV) else ""
    if not IN_CHECKOUT:
        here = root.resolve()
        if here == CODE_ROOT or CODE_ROOT in here.parents:
            return f"{root}{via} is inside the installed vllm-cluster ({CODE_ROOT}): {PROJECT_FIX}"
    problem = project_problem(root)
    return f"{problem}: {PROJECT_FIX}" if problem else None


def escapes(target: Path, root: Path) -> str | None:
    """Why a command may not write `target` (a file or folder it is about to write for the project at `root`), or
    None. Links are followed: a `models/` or `.vllm-cluster/` that is a link out of the project would put the file
    elsewhere while the command says it wrote it in the project. Never inside the installed package; in this
    checkout (the developer path) its own folders are the project's."""
    try:
        here = target.resolve()
        home = root.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links, a name too long
        return f"{target} cannot be resolved ({getattr(exc, 'strerror', None) or exc.__class__.__name__})"
    if not IN_CHECKOUT and (here == CODE_ROOT or CODE_ROOT in here.parents):
        return f"{target} leads into the installed vllm-cluster ({CODE_ROOT})"
    if here != home and home not in here.parents:
        return f"{target} leads out of the project {root} (to {here}, through a link)"
    return None


def workdir_problem(workdir: str | None) -> str | None:
    """Why a unit's `--workdir` cannot be its working directory, or None (unset: the project in use): it must be a
    vllm-cluster project, whose stack file and cards the unit's commands read (an unchecked one started a unit that
    failed at its first plan, or read another project's files)."""
    if workdir is None:
        return None
    folder = Path(workdir)
    if not folder.is_dir():
        return f"--workdir {workdir}: not a directory; give your project's folder"
    problem = project_problem(folder)
    if problem:
        return (f"--workdir {workdir}: {problem}; give your project's folder (a Pulumi.yaml that says "
                f"name: {PROJECT_NAME})")
    if not IN_CHECKOUT and (folder.resolve() == CODE_ROOT or CODE_ROOT in folder.resolve().parents):
        return f"--workdir {workdir}: inside the installed vllm-cluster ({CODE_ROOT}); give your project's folder"
    return None


PROJECT_FIX = (f"run it in your project (a folder whose Pulumi.yaml says name: {PROJECT_NAME}, or {ROOT_ENV}=DIR), "
               "or make one: vllm-cluster init DIR")
