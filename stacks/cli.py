"""`python -m stacks plan <stack>`: the offline plan, no Pulumi CLI needed."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from stacks.errors import ConfigError
from stacks.loader import load_stack
from stacks.plan import build_plan
from stacks.render import render_plan


def _plan(args: argparse.Namespace) -> int:
    try:
        config = load_stack(args.stack, args.set)
        plan = build_plan(args.stack, config)
    except ConfigError as exc:
        if args.json:
            print(json.dumps({"stack": args.stack, "valid": False,
                              "errors": [p.as_dict() for p in exc.problems]}, indent=2, ensure_ascii=False))
        else:
            print(exc.report(), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_json_dict(), indent=2, ensure_ascii=False))
    else:
        print(render_plan(plan))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stacks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="validate a stack and print what would be launched")
    plan.add_argument("stack", help="stack name: reads Pulumi.<stack>.yaml")
    plan.add_argument("--json", action="store_true", help="machine-readable plan")
    plan.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                      help="override a config value, e.g. parallelism.tensor=16 (repeatable)")
    plan.set_defaults(func=_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
