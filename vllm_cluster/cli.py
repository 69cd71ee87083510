"""`vllm-cluster`: every subcommand of `python -m stacks` (review/cli.py, heal/cli.py), plus what only the
installed tool needs: `init` (a project of the user's) and `policy-pack` (the policy pack's path for Pulumi)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any

from review.cli import main as stacks_main
from vllm_cluster import __version__
from vllm_cluster.init import add_init
from vllm_cluster.policy_pack import add_policy_pack


def _extend(parser: argparse.ArgumentParser, sub: Any) -> None:
    parser.add_argument("--version", action="version", version=f"vllm-cluster {__version__}")
    add_init(sub)
    add_policy_pack(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script's entry point: `python -m stacks`'s parser and error handling under the tool's name."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `vllm-cluster plan prod | head` ends quietly
    return stacks_main(argv, prog="vllm-cluster", extend=_extend)


if __name__ == "__main__":
    sys.exit(main())
