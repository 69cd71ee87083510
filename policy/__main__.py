"""`pulumi preview --policy-pack policy` / `pulumi up --policy-pack policy`: the vllm-cluster policy pack.

Pulumi runs this file with policy/ as the working directory and policy/venv's interpreter. The rules import
the stdlib-only parts of `stacks` (argv tables and parser, the exposure rule) from the repository itself, so
the repository root goes on sys.path first: the pack is run from a checkout, not published on its own.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pulumi_policy import PolicyPack  # noqa: E402
from rules import POLICIES  # type: ignore[import-not-found]  # noqa: E402  # the pack runs with policy/ as its directory

PolicyPack(name="vllm-cluster", policies=list(POLICIES))
