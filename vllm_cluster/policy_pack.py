"""`vllm-cluster policy-pack`: the path to give `pulumi preview|up --policy-pack`, from a project of the user's.

Pulumi runs a Python pack with the interpreter of the `virtualenv` its PulumiPolicy.yaml names, relative to the
pack. The installed package must not be written into (a venv there would be), so the pack Pulumi runs is a small
folder in the project, `.vllm-cluster/policy-pack/` (ignored by git): a PulumiPolicy.yaml naming the venv this
command runs from, and a `__main__.py` that serves the installed package's rules (policy/rules.py). It is
rewritten on every call, so it follows an upgrade or a new venv. This checkout runs its own `policy/` as before.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from heal.full_venv import missing_here
from stacks.model.loader import PROJECT_ROOT
from stacks.model.project import escapes, is_developer_checkout, not_a_project

PACK_DIR = Path(".vllm-cluster") / "policy-pack"
MAIN_PY = '''\
"""Written by `vllm-cluster policy-pack`: the vllm-cluster policy pack, its rules from the installed package."""

from pulumi_policy import PolicyPack

from policy.rules import POLICIES

PolicyPack(name="vllm-cluster", policies=list(POLICIES))
'''


def pack_yaml(prefix: str) -> str:
    """PulumiPolicy.yaml naming the venv at `prefix` (JSON strings are valid YAML scalars, quoting included)."""
    return ("description: vllm-cluster guard rails (API auth, private internal ports, GPU memory, ready timeout, "
            "digests)\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
            f"    virtualenv: {json.dumps(prefix)}\n")


def _policy_pack(args: argparse.Namespace) -> int:
    if is_developer_checkout(PROJECT_ROOT):
        print(PROJECT_ROOT / "policy")  # this checkout's pack (docs/policy.md: its venv link)
        return 0
    problem = not_a_project(PROJECT_ROOT)
    if problem:  # the pack is written into a vllm-cluster project, never anywhere else
        print(f"policy-pack: {problem}", file=sys.stderr)
        return 2
    lacking = missing_here("pulumi_policy")
    if lacking:
        print(f"policy-pack: the pack needs pulumi-policy, which {sys.executable} cannot import: pip install "
              "'vllm-cluster[deploy]' into this venv", file=sys.stderr)
        return 2
    folder = PROJECT_ROOT / PACK_DIR
    escaped = escapes(folder, PROJECT_ROOT)
    if escaped:
        print(f"policy-pack: nothing was written: {escaped}; make {PACK_DIR.parts[0]} a plain folder of the project",
              file=sys.stderr)
        return 2
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "PulumiPolicy.yaml").write_text(pack_yaml(sys.prefix), encoding="utf-8")
        (folder / "__main__.py").write_text(MAIN_PY, encoding="utf-8")
    except OSError as exc:
        print(f"policy-pack: cannot write {folder} ({exc.strerror}); run it in your project (VLLM_CLUSTER_ROOT or "
              "a directory with Pulumi.yaml) where you may write", file=sys.stderr)
        return 2
    print(folder)
    print(f'# pulumi preview -s STACK --policy-pack "{folder}"', file=sys.stderr)
    return 0


def add_policy_pack(sub: Any) -> None:
    """The `policy-pack` parser."""
    pack = sub.add_parser("policy-pack", help="print the policy pack's path for `pulumi preview --policy-pack` "
                          "(writes it under .vllm-cluster/ in your project, naming this venv)")
    pack.set_defaults(func=_policy_pack)
