"""`python -m stacks plan|nginx-conf <stack>`: offline views of a stack, no Pulumi CLI needed."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from stacks.config import SECRET_MARKER
from stacks.errors import ConfigError
from stacks.loader import load_stack
from stacks.plan import build_plan
from stacks.proxy import masked_nginx_conf
from stacks.render import render_plan


def _overrides(args: argparse.Namespace) -> list[str]:
    """`--set` values plus `--assume-secret KEY`: plan as if that secret were set, without its value."""
    return [*args.set, *(f"{key}={json.dumps(SECRET_MARKER)}" for key in args.assume_secret)]


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value, e.g. parallelism.tensor=16 (repeatable)")
    parser.add_argument("--assume-secret", action="append", default=[], metavar="KEY",
                        help="plan as if this secret were set, e.g. api_key or proxy_keys.team-a (repeatable)")


def _plan(args: argparse.Namespace) -> int:
    try:
        config = load_stack(args.stack, _overrides(args))
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


def _nginx_conf(args: argparse.Namespace) -> int:
    try:
        config = load_stack(args.stack, _overrides(args))
        build_plan(args.stack, config)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    if not config.api.proxy.enabled:
        print(f"stack {args.stack!r}: api.proxy.enabled is false; there is no proxy config", file=sys.stderr)
        return 1
    print(masked_nginx_conf(config.api.proxy, config.serving.port, sorted(config.proxy_keys or {})), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stacks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="validate a stack and print what would be launched")
    plan.add_argument("stack", help="stack name: reads Pulumi.<stack>.yaml")
    plan.add_argument("--json", action="store_true", help="machine-readable plan")
    _add_overrides(plan)
    plan.set_defaults(func=_plan)
    conf = sub.add_parser("nginx-conf", help="print the proxy's nginx.conf with placeholder keys (review it)")
    conf.add_argument("stack")
    _add_overrides(conf)
    conf.set_defaults(func=_nginx_conf)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
