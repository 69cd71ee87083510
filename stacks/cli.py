"""`python -m stacks plan|nginx-conf|rollback|diff|preview-summary`: offline tools, no Pulumi engine needed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacks.config import ImageConfig
from stacks.errors import ConfigError
from stacks.git_base import BaseError, base_plan
from stacks.loader import PROJECT_ROOT, load_stack, load_stack_document, locate, parse_config, stack_file
from stacks.plan import build_plan
from stacks.plan_diff import diff_plans
from stacks.plan_diff import to_markdown as diff_markdown
from stacks.preview_summary import summarize
from stacks.preview_summary import to_markdown as preview_markdown
from stacks.proxy import masked_nginx_conf
from stacks.render import render_plan
from stacks.rollback import RollbackError, choose, past_images, read_history, rewrite_image
from stacks.stack_file import parse_stack_text


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value, e.g. parallelism.tensor=16 (repeatable)")
    parser.add_argument("--assume-secret", action="append", default=[], metavar="KEY",
                        help="plan as if this secret were set, e.g. api_key or proxy_keys.team-a (repeatable)")


def _plan(args: argparse.Namespace) -> int:
    try:
        config, document = load_stack_document(args.stack, args.set, args.assume_secret)
        try:
            plan = build_plan(args.stack, config)
        except ConfigError as exc:
            raise ConfigError(exc.stack, locate(exc.problems, document.positions)) from None
    except ConfigError as exc:
        if args.json:
            print(json.dumps({"stack": args.stack, "valid": False,
                              "errors": [p.as_dict() for p in exc.problems]}, indent=2, ensure_ascii=False))
        else:
            print(exc.report(), file=sys.stderr)
        return 2
    plan = plan.model_copy(update={"warnings": [*document.warnings, *plan.warnings]})
    if args.json:
        print(json.dumps(plan.to_json_dict(), indent=2, ensure_ascii=False))
    else:
        print(render_plan(plan))
    return 0


def _nginx_conf(args: argparse.Namespace) -> int:
    try:
        config = load_stack(args.stack, args.set, assume_secret=args.assume_secret)
        build_plan(args.stack, config)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    if not config.api.proxy.enabled:
        print(f"stack {args.stack!r}: api.proxy.enabled is false; there is no proxy config", file=sys.stderr)
        return 1
    print(masked_nginx_conf(config.api.proxy, config.serving.port, sorted(config.proxy_keys or {})), end="")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    path = stack_file(args.stack)
    try:
        if not path.exists():
            raise RollbackError(f"no {path.name} in {path.parent}")
        text = path.read_text()
        values = parse_stack_text(text, path.name).values
        current = ImageConfig.model_validate(values.get("image"))
        history = past_images(read_history(args.stack, args.history, PROJECT_ROOT))
        target = choose(history, current, args.to)
        values["image"] = target.image.model_dump()
        build_plan(args.stack, parse_config(args.stack, values))
    except RollbackError as exc:
        print(f"rollback {args.stack}: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"rollback {args.stack}: the current config with {target.image.pull_ref} is refused, so "
              f"{path.name} was not changed:\n{exc.report()}", file=sys.stderr)
        return 2
    print(f"stack {args.stack}: image {current.pull_ref}\n          -> {target.image.pull_ref}")
    print(f"   last served by {target.describe()}")
    if args.dry_run:
        print(f"   --dry-run: {path.name} not changed")
    else:
        path.write_text(rewrite_image(text, target.image))
        print(f"   {path.name}: image rewritten, comments and layout kept (review: git diff {path.name})")
    print("next:")
    print(f"   pulumi preview -s {args.stack} --diff   # expect every engine-* container and *-image replaced, "
          "the checks re-run, no provider change")
    print(f"   pulumi up -s {args.stack}")
    print("The image is still on every node (RemoteImage keep_locally), so nothing is downloaded; the argument "
          "dry run still runs before the group is replaced.")
    return 0


def _diff(args: argparse.Namespace) -> int:
    try:
        base, base_errors, how = base_plan(args.stack, args.base, PROJECT_ROOT)
    except BaseError as exc:
        print(f"diff {args.stack}: {exc}", file=sys.stderr)
        return 2
    try:
        head: dict[str, Any] | None = build_plan(args.stack, load_stack(args.stack)).to_json_dict()
        head_errors: list[dict[str, Any]] = []
    except ConfigError as exc:
        head, head_errors = None, [p.as_dict() for p in exc.problems]
    result = diff_plans(args.stack, args.base, base, head, base_errors, head_errors) | {"base_plan": how}
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(diff_markdown(result), end="")
        print(f"\n<sub>base: {how}</sub>")
    return 0 if head is not None else 1


def _preview_summary(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        preview = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"preview-summary: cannot read {args.file}: {exc} (expected `pulumi preview --json > FILE`)",
              file=sys.stderr)
        return 2
    if not isinstance(preview, dict) or not isinstance(preview.get("steps", []), list):
        print(f"preview-summary: {args.file} is not a preview digest (an object with `steps`), as "
              "`pulumi preview --json` prints", file=sys.stderr)
        return 2
    summary = summarize(preview)
    print(json.dumps(summary, indent=2) if args.json else preview_markdown(summary), end="" if not args.json else "\n")
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
    back = sub.add_parser("rollback", help="rewrite the stack's image to one a past successful update ran")
    back.add_argument("stack")
    back.add_argument("--to", default="previous", metavar="previous|TAG|DIGEST",
                      help="previous (default): the newest successful update with another image")
    back.add_argument("--history", metavar="FILE", help="`pulumi stack history --json` output (default: run it)")
    back.add_argument("--dry-run", action="store_true", help="print the choice, leave the stack file alone")
    back.set_defaults(func=_rollback)
    diff = sub.add_parser("diff", help="Markdown review of what a change does to a stack's plan")
    diff.add_argument("stack")
    diff.add_argument("--base", required=True, metavar="GIT_REF", help="e.g. origin/main")
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=_diff)
    summary = sub.add_parser("preview-summary", help="condense `pulumi preview --json` into Markdown")
    summary.add_argument("file", help="the JSON file, or - for stdin")
    summary.add_argument("--json", action="store_true")
    summary.set_defaults(func=_preview_summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: say so in one line, keep the traceback behind a switch
        if os.environ.get("VLLM_CLUSTER_DEBUG"):
            raise
        print(f"internal error in vllm-cluster ({type(exc).__name__}: {exc}); this is a bug, not your config: "
              "rerun with VLLM_CLUSTER_DEBUG=1 for the traceback and report it", file=sys.stderr)
        return 3
