"""`vllm-cluster init DIR [--example NAME]`: a project of the user's, holding only what is theirs.

Their stacks, their cards and a `__main__.py` of a few lines that runs the installed package's program: the tool
itself upgrades with `pip install -U <new wheel>`, never by merging upstream into a fork (docs/install.md).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from checks.verdict import shown
from stacks.model.project import CODE_ROOT, shipped, unsafe_name
from vllm_cluster import __version__

DEFAULT_EXAMPLE = "two-node"
"""Plans without secrets and without a front door: the shortest way to a first plan."""

PULUMI_YAML = """\
# The name must stay vllm-cluster: the stack files' keys are `vllm-cluster:<key>` (Pulumi's config namespace).
name: vllm-cluster
description: vLLM clusters deployed with the vllm-cluster package
runtime:
  name: python
  options:
    toolchain: pip
    virtualenv: venv
"""
MAIN_PY = '''\
"""Pulumi's entry point (`pulumi preview|up -s STACK`): the program of the installed vllm-cluster package, for
Pulumi.STACK.yaml in this directory."""

from vllm_cluster.program import run

run()
'''
GITIGNORE = """\
venv
__pycache__/
*.pyc
.vllm-cluster/
"""
README = """\
# My vLLM clusters

Stacks deployed with vllm-cluster {version}: one `Pulumi.<stack>.yaml` per cluster, my own
model cards in `models/` and image cards in `images/`.

```sh
vllm-cluster plan {stack}                      # what every node will run, offline
vllm-cluster diff {stack} --base origin/main   # what a change costs, for the pull request
vllm-cluster model-card /path/to/model --name my-model   # a card in models/ (model.profile: my-model)
pulumi up -s {stack} --policy-pack "$(vllm-cluster policy-pack)"   # deploy (venv/ gets requirements.txt)
```

Upgrade from the new wheel file, never by name (a package of that name on a public index would run with your
deploy credentials): `pip install -U /path/to/vllm_cluster-<new>-py3-none-any.whl`, point the pin in
requirements.txt at it, then `vllm-cluster plan` and `vllm-cluster diff` every stack before `pulumi up`
(docs/install.md in vllm-cluster's repository).
"""


def examples() -> dict[str, Path]:
    """The shipped example stacks by name (`Pulumi.<name>.yaml`)."""
    return {p.name.split(".")[1]: p for p in sorted(shipped("examples").glob("Pulumi.*.yaml"))}


def _bad(flag: str, value: str, why: str, fix: str) -> int:
    print(f"init: {flag} {shown(value)}: {why}; {fix}", file=sys.stderr)
    return 2


NAME_MAX = 255
"""The longest file or folder name, in bytes, of Linux file systems (ext4, XFS, btrfs)."""


def check_dir(value: str) -> tuple[Path | None, int]:
    """The directory to create, or an exit code 2 after saying why not (a path that is not plain, or a
    directory that already holds files)."""
    fix = "give a new or empty directory, e.g. vllm-cluster init ./my-clusters"
    if not value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return None, _bad("DIR", value, "has control characters or is empty", fix)
    unsafe = unsafe_name(value)
    if unsafe:  # a right-to-left mark or bytes that are not UTF-8: a name no stack file, unit or review shows right
        return None, _bad("DIR", value, unsafe, fix + " (plain characters)")
    if ".." in Path(value).parts:
        return None, _bad("DIR", value, "contains '..'", fix + " (a path without '..')")
    longest = max((len(os.fsencode(part)) for part in Path(value).parts), default=0)  # `.` has no parts
    if longest > NAME_MAX:  # checked before anything is created: mkdir would fail half way
        return None, _bad("DIR", value, f"cannot be used (File name too long: a folder name of {longest} bytes, at "
                          f"most {NAME_MAX})", fix + " (a shorter name)")
    folder = Path(value).expanduser()
    try:
        if folder.exists() and not folder.is_dir():
            return None, _bad("DIR", value, "is a file", fix)
        if folder.is_dir() and any(p.name != ".git" for p in folder.iterdir()):  # a clone of an empty repo is fine
            return None, _bad("DIR", value, "is not empty (init never overwrites files)",
                              fix + ", or a fresh clone of an empty repository (only .git)")
        here = folder.resolve()
    except (OSError, RuntimeError) as exc:  # a name over NAME_MAX or PATH_MAX, a loop of links, no access
        why = getattr(exc, "strerror", None) or exc.__class__.__name__
        size = f", {len(value)} characters" if getattr(exc, "errno", None) == errno.ENAMETOOLONG else ""
        return None, _bad("DIR", value, f"cannot be used ({why}{size})", fix + " (a shorter name)" * bool(size))
    if here == CODE_ROOT or CODE_ROOT in here.parents:
        return None, _bad("DIR", value, f"is inside vllm-cluster's own code ({CODE_ROOT})",
                          fix + " outside it: your project is yours, upgrades replace that folder")
    inside = next((p for p in here.parents if (p / "Pulumi.yaml").is_file()), None)
    if inside is not None:
        return None, _bad("DIR", value, f"is inside the Pulumi project {inside} (its Pulumi.yaml would run instead)",
                          fix + " outside any project")
    return folder, 0


def requirements() -> str:
    """What Pulumi installs into the project's venv/: the very wheel this tool was installed from when pip
    recorded one (its direct_url.json). vllm-cluster is not on PyPI: a bare name would fail, or install whoever
    registers the name there into the venv that deploys with the stack's credentials."""
    head = "# What Pulumi installs into venv/ to run the program (`pulumi up`).\n"
    try:
        origin = json.loads(metadata.distribution("vllm-cluster").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        origin = {}
    url = origin.get("url", "") if isinstance(origin, dict) else ""
    if url.startswith("file://") and url.endswith(".whl") and "\n" not in url:
        return head + f"vllm-cluster[deploy] @ {url}\n"
    return (head + "# vllm-cluster is not on PyPI: replace this line with the wheel's path or your package index's\n"
            "# name before `pulumi up` (docs/install.md), e.g. vllm-cluster[deploy] @ file:///path/to/the.whl\n"
            f"vllm-cluster[deploy]=={__version__}\n")


def for_project(text: str, stack: str) -> str:
    """A shipped example as a stack of the user's project: its comments name this checkout's commands (`cp
    examples/… && make plan`, `--policy-pack policy`, `docs/…`), which the project does not have."""
    text = text.replace("# Copy it to the project root under your stack's name and plan it:", "# Plan it:")
    text = re.sub(r"(?m)^#   cp examples/\S+ Pulumi\.mycluster\.yaml && make plan STACK=mycluster$",
                  f"#   vllm-cluster plan {stack}", text)

    def assumed(match: re.Match[str]) -> str:
        keys = [w for w in re.findall(r"[\w.-]+", match.group(1))]
        return f"vllm-cluster plan {stack} " + " ".join(f"--assume-secret {k}" for k in keys)

    text = re.sub(r'make plan STACK=mycluster SECRETS="([^"]*)"', assumed, text)
    text = text.replace("`pulumi up --policy-pack policy`", '`pulumi up --policy-pack "$(vllm-cluster policy-pack)"`')
    return re.sub(r"\bdocs/([\w-]+\.md)", r"vllm-cluster's docs/\1", text)


def _init(args: argparse.Namespace) -> int:
    known = examples()
    if args.example not in known:
        return _bad("--example", args.example, "is not a shipped example",
                    f"one of: {', '.join(known) or '(none shipped: a broken install, reinstall vllm-cluster)'}")
    folder, code = check_dir(args.dir)
    if folder is None:
        return code
    stack = args.example
    files = {
        "Pulumi.yaml": PULUMI_YAML,
        "__main__.py": MAIN_PY,
        "requirements.txt": requirements(),
        f"Pulumi.{stack}.yaml": for_project(known[stack].read_text(encoding="utf-8"), stack),
        "models/.gitkeep": "",
        "images/.gitkeep": "",
        ".gitignore": GITIGNORE,
        "README.md": README.format(version=__version__, stack=stack),
    }
    try:
        for rel, text in files.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        return _bad("DIR", args.dir, f"cannot write ({exc.strerror})", "give a writable directory")
    print(f"created {folder}: {', '.join(sorted(files))}")
    print("next:")  # shell words: a folder named `my clusters` or `a;b` is one argument of cd
    git = "" if (folder / ".git").exists() else "git init && "  # a clone already is a repository
    print(f"   cd {shlex.quote(str(folder))} && {git}git add -A && git commit -m 'vllm-cluster project'")
    print(f"   vllm-cluster plan {shlex.quote(stack)}")
    return 0


def add_init(sub: Any) -> None:
    """The `init` parser."""
    init = sub.add_parser("init", help="create a project of your own: Pulumi.yaml, __main__.py, requirements.txt, "
                          "an example stack, models/ and images/ for your cards")
    init.add_argument("dir", metavar="DIR", help="a new or empty directory")
    init.add_argument("--example", default=DEFAULT_EXAMPLE, metavar="NAME",
                      help=f"the example stack to start from [{DEFAULT_EXAMPLE}]: " + ", ".join(examples()))
    init.set_defaults(func=_init)
