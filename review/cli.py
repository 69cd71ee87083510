"""`python -m stacks plan|nginx-conf|rollback|diff|preview-summary|matrix|watch-unit|observability|reference|
model-card|image-card`: offline tools, no Pulumi engine needed; `restart-group|drift|supervisor-unit|supervise`
(heal/cli.py) reach the nodes."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from checks.verdict import (
    abs_path,
    argument_message,
    count,
    mask_credentials,
    one_line,
    path,
    shown,
    with_unknown_options,
)
from heal.full_venv import CHECKS, needs, unit_python
from review.downtime import downtime_of
from review.git_base import BaseError, base_plan, secret_changes
from review.group_diff import diff_stacks, grouped, to_markdown_grouped
from review.plan_diff import diff_plans
from review.plan_diff import to_markdown as diff_markdown
from review.preview_summary import PreviewInputError, parse_events, summarize
from review.preview_summary import exit_code as preview_exit_code
from review.preview_summary import read_input as read_preview
from review.preview_summary import to_markdown as preview_markdown
from review.rollback import MAX_PAGES, PAGE_SIZE, RollbackError, prepare, read_history
from stacks.model.errors import ConfigError
from stacks.model.loader import (
    PROJECT_ROOT,
    load_stack,
    load_stack_document,
    locate,
    read_stack_values,
    stack_file,
    stack_names,
)
from stacks.model.project import (
    CODE_ROOT,
    IN_CHECKOUT,
    PROJECT_FIX,
    ROOT_ENV,
    STACKS_VENV,
    is_developer_checkout,
    root_variable_problem,
    workdir_problem,
)
from stacks.planner.image_cards import CARDS
from stacks.planner.plan import build_plan, card_override_warnings
from stacks.planner.proxy import front_door, masked_nginx_conf
from stacks.planner.render import render_stack
from stacks.planner.stack_plan import build_stack


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value, e.g. parallelism.tensor=16 (repeatable)")
    parser.add_argument("--assume-secret", action="append", default=[], metavar="KEY",
                        help="plan as if this secret were set, e.g. api_key or proxy_keys.team-a (repeatable)")


def project_line(stack: str) -> str:
    """Which project a plan read (stderr, every plan): a folder found by its Pulumi.yaml, or VLLM_CLUSTER_ROOT."""
    via = f" (from {ROOT_ENV})" if os.environ.get(ROOT_ENV) else ""
    return f"# project: {PROJECT_ROOT}{via}, stack file {stack_file(stack).name}"


def _refused_plan_warnings(stack: str) -> list[str]:
    """What a refused plan still warns about: the project's cards that hide shipped ones (as every plan does), the
    model card's from the stack file's own `model.profile` when it can be read."""
    try:
        model = read_stack_values(stack).get("model")
    except ConfigError:
        model = None
    return card_override_warnings(model.get("profile") if isinstance(model, dict) else None)


def _plan(args: argparse.Namespace) -> int:
    with contextlib.suppress(ConfigError):  # not a stack name: the refusal below says so
        print(project_line(args.stack), file=sys.stderr)
    try:
        config, document = load_stack_document(args.stack, args.set, args.assume_secret)
        try:
            whole = build_stack(args.stack, config)
        except ConfigError as exc:
            raise ConfigError(exc.stack, locate(exc.problems, document.positions)) from None
    except ConfigError as exc:
        warnings = _refused_plan_warnings(args.stack)
        if args.json:
            print(json.dumps({"stack": args.stack, "valid": False, "errors": [p.as_dict() for p in exc.problems],
                              "warnings": warnings}, indent=2, ensure_ascii=False))
        else:
            print(exc.report(), file=sys.stderr)
            for warning in warnings:
                print(f"warning: {warning}", file=sys.stderr)
        return 2
    groups = tuple(dataclasses.replace(g, plan=g.plan.model_copy(
        update={"warnings": [*document.warnings, *g.plan.warnings]})) for g in whole.groups)
    whole = dataclasses.replace(whole, groups=groups)
    if args.json:
        print(json.dumps(whole.to_json_dict(), indent=2, ensure_ascii=False))
    else:
        print(render_stack(whole, full=not args.summary))
    return 0


def _nginx_conf(args: argparse.Namespace) -> int:
    try:
        config = load_stack(args.stack, args.set, assume_secret=args.assume_secret)
        whole = build_stack(args.stack, config)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    front = whole.groups[0]  # with groups: the first group holds the front door (stacks/planner/groups.py)
    if not config.api.proxy.enabled:
        print(f"stack {args.stack!r}: api.proxy.enabled is false; there is no proxy config (to see one: "
              f"{STACKS_VENV} nginx-conf {args.stack} --set api.proxy.enabled=true --set "
              "serving.host=127.0.0.1 --assume-secret api_key --assume-secret proxy_keys.team-a --assume-secret "
              "tls_certificate --assume-secret tls_private_key)", file=sys.stderr)
        return 2
    print(masked_nginx_conf(front_door(front.config, front.context), sorted(config.proxy_keys or {})), end="")
    return 0


def _watch_unit(args: argparse.Namespace) -> int:
    """The systemd service that runs `checks.api --watch` for this stack (heal/watch_unit.py) on stdout; what to
    put next to it (the key file, the proxy's certificate) on stderr."""
    from heal.watch_unit import render_watch_unit, unit_name
    from stacks.planner.plan import check_client, thinking_kwarg
    from stacks.planner.topology import endpoint_rank_nodes

    python = args.python or unit_python(PROJECT_ROOT)[0]
    problem = workdir_problem(args.workdir) or needs("the watch unit's command (checks.api --watch)", CHECKS, python)
    if problem:  # the unit would start, fail at its first import and watch nothing
        print(f"watch-unit {args.stack}: {problem}; or give --python the python of a venv that has it",
              file=sys.stderr)
        return 2
    config = load_stack(args.stack, args.set, assume_secret=args.assume_secret)
    plan = build_plan(args.stack, config)
    client = check_client(config)
    needs_key = client is not None or config.api_key is not None
    env_file = args.env_file or (f"/etc/vllm-cluster/{args.stack}-watch.env" if needs_key else None)
    tls = plan.proxy is not None and plan.proxy.tls
    ca_file = args.ca_file or (f"/etc/vllm-cluster/{args.stack}-ca.pem" if tls else None)
    dp_size, rank_nodes = endpoint_rank_nodes([(n.name, n.dp_ranks, n.role) for n in plan.nodes],
                                              plan.topology.get("load_balancing", "internal"))
    metrics_listen, info_json = None, None
    if plan.observability is not None:
        from stacks.planner.observability import engine_info
        from stacks.planner.topology import derive_topology

        topo, _ = derive_topology(config)
        metrics_listen = plan.observability.watch_target
        info_json = json.dumps(engine_info(args.stack, config, topo, {n.name: n.containers for n in plan.nodes}),
                               separators=(",", ":"), sort_keys=True)
    try:
        name = unit_name(args.stack)
        text = render_watch_unit(
            stack=args.stack, python=python, workdir=args.workdir or str(PROJECT_ROOT), url=plan.endpoint,
            served_name=config.model.served_name,
            dp_size=dp_size, rank_nodes=rank_nodes, golden=config.api.smoke.golden,
            interval_s=config.api.watch_interval_s, timeout_s=config.api.request_timeout_s, env_file=env_file,
            ca_file=ca_file, user=args.user, metrics_listen=metrics_listen, info_json=info_json,
            thinking_kwarg=thinking_kwarg(config)[0])
    except ValueError as exc:
        print(mask_credentials(f"watch-unit {args.stack}: {exc}"), file=sys.stderr)
        return 2
    print(text, end="")
    steps = [f"# {name}: save stdout as /etc/systemd/system/{name}, then: systemctl daemon-reload && "
             f"systemctl enable --now {name}"]
    if env_file:
        whose = (f"the proxy key of client {client!r} (pulumi config get --path vllm-cluster:proxy_keys.{client})"
                 if client else "api_key (pulumi config get vllm-cluster:api_key)")
        steps.append(f"# {env_file}: one line VLLM_API_KEY=<{whose}>, mode 0600 "
                     f"(install -m 600 /dev/null {env_file} first)")
    if ca_file:
        steps.append(f"# {ca_file}: pulumi config get vllm-cluster:tls_certificate > {ca_file}")
    print("\n".join(steps), file=sys.stderr)
    return 0


def out_problem(out: Path) -> str | None:
    """Why `observability --out` may not write there: inside vllm-cluster's own code (the installed package, or this
    checkout's tracked folders: its docs and code are nobody's output), links followed."""
    try:
        here = out.resolve()
    except (OSError, RuntimeError) as exc:
        return f"cannot be resolved ({getattr(exc, 'strerror', None) or exc.__class__.__name__})"
    if here == CODE_ROOT or CODE_ROOT in here.parents:
        what = "this checkout" if IN_CHECKOUT else "the installed vllm-cluster"
        return f"is inside {what} ({CODE_ROOT}), whose files no command writes"
    return None


def _observability(args: argparse.Namespace) -> int:
    """Write the monitoring files the program deploys (stacks/planner/observability.py) under --out, offline.
    The webhook URL is a secret: alertmanager.yml holds a placeholder where the program puts it."""
    from stacks.planner.observability import WEBHOOK_PLACEHOLDER, render_files
    from stacks.planner.topology import derive_topology

    config = load_stack(args.stack, args.set, assume_secret=args.assume_secret)
    plan = build_plan(args.stack, config)
    if plan.observability is None:
        print(f"stack {args.stack!r}: observability.enabled is false; to see its files: {STACKS_VENV} "
              f"observability {args.stack} --out DIR --set observability.enabled=true --assume-secret "
              "grafana_admin_password", file=sys.stderr)
        return 2
    topo, _ = derive_topology(config)
    files = render_files(args.stack, config, topo, {n.name: n.containers for n in plan.nodes},
                         webhook_url=WEBHOOK_PLACEHOLDER)
    out = Path(args.out)
    inside = out_problem(out)
    if inside:
        print(f"--out {args.out!r}: {inside}; give a folder of your own, e.g. ./monitoring", file=sys.stderr)
        return 2
    try:
        for rel, text in files.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"--out {args.out!r}: {exc.strerror}; give a writable directory", file=sys.stderr)
        return 2
    for rel in files:
        print(out / rel)
    return 0


def _rollback(args: argparse.Namespace) -> int:
    try:
        path = stack_file(args.stack)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    try:
        if not path.exists():
            raise RollbackError(f"no {path.name} in {path.parent}")
        history = read_history(args.stack, args.history, PROJECT_ROOT, args.page_size)
        decided = prepare(args.stack, path.read_text(), path.name, history, args.to)
    except RollbackError as exc:
        print(f"rollback {args.stack}: {exc}", file=sys.stderr)
        return 2
    target = decided.target
    print(f"stack {args.stack}: image {decided.current.pull_ref}\n          -> {target.image.pull_ref}")
    print(f"   last served by {target.describe()}")
    print(f"   history {decided.provenance}")
    if not decided.complete:
        print(f"   note: stopped after {MAX_PAGES} pages; older updates were not read")
    print(f"   {decided.capability}")
    for warning in decided.warnings:
        print(f"   warning: {warning}")
    if args.dry_run:
        print(f"   --dry-run: {path.name} not changed")
    else:
        path.write_text(decided.new_text)
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
        base, base_errors, how = base_plan(args.stack, args.base, PROJECT_ROOT, args.assume_secret)
        secrets = secret_changes(args.stack, args.base, PROJECT_ROOT)
    except BaseError as exc:
        print(f"diff {args.stack}: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_stack(args.stack, assume_secret=args.assume_secret)
        head: dict[str, Any] | None = build_stack(args.stack, config).to_json_dict()
        head_errors: list[dict[str, Any]] = []
    except ConfigError as exc:
        head, head_errors = None, [p.as_dict() for p in exc.problems]
    if grouped(head) or grouped(base):  # replica groups on either side: per group, and the rolling verdict
        result = diff_stacks(args.stack, args.base, base, head, base_errors, head_errors, secrets) | {
            "base_plan": how}
        text = to_markdown_grouped(result)
    else:
        result = diff_plans(args.stack, args.base, base, head, base_errors, head_errors, secrets) | {"base_plan": how}
        result["downtime"] = downtime_of(result)
        text = diff_markdown(result)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(text, end="")
        print(f"\n<sub>base: {how}</sub>")
    return 0 if head is not None else 2  # the change under review does not validate: a bad input


def _preview_summary(args: argparse.Namespace) -> int:
    try:
        name = "stdin" if args.file == "-" else args.file
        preview, events = read_preview(_read_text(args.file), name)
        if args.events:
            if events is not None:
                raise PreviewInputError(f"{name} is already an event stream; --events goes with a digest")
            events = parse_events(_read_text(args.events), args.events)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"preview-summary: cannot read {exc} (expected `pulumi preview --json > FILE`)", file=sys.stderr)
        return 2
    except PreviewInputError as exc:
        print(f"preview-summary: {exc}", file=sys.stderr)
        return 2
    summary = summarize(preview, events)
    print(json.dumps(summary, indent=2) if args.json else preview_markdown(summary), end="" if not args.json else "\n")
    return preview_exit_code(summary)


def _read_text(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text()


MATRIX_BEGIN = "<!-- replacement-matrix:begin (python -m stacks matrix --update-docs) -->"
MATRIX_END = "<!-- replacement-matrix:end -->"
GROUP_MATRIX_BEGIN = "<!-- group-matrix:begin (python -m stacks matrix --update-docs) -->"
GROUP_MATRIX_END = "<!-- group-matrix:end -->"
MATRIX_PAGE = Path("docs") / "what-a-change-costs.md"
"""The docs page that holds the generated tables, relative to the project root."""
EXAMPLES = Path("examples")
"""The example stacks; those with groups get the docs' per-group table (the committed stacks have none)."""


def matrix_stacks(names: list[str]) -> list[str]:
    """The stacks the matrix covers: those named, else every Pulumi.<stack>.yaml in the project, sorted."""
    return names or stack_names(PROJECT_ROOT)


def grouped_examples(root: Path) -> dict[str, dict[str, Any]]:
    """examples/Pulumi.<name>.yaml stacks with `groups:`, by name: their values as the stack file reader gives them."""
    from stacks.model.stack_file import parse_stack_text

    out = {}
    for file in sorted((root / EXAMPLES).glob("Pulumi.*.yaml")):
        values = parse_stack_text(file.read_text(), file.name).values
        if values.get("groups"):
            out[file.name.removeprefix("Pulumi.").removesuffix(".yaml")] = values
    return out


def page_with_matrix(page: str, table: str, begin: str = MATRIX_BEGIN, end: str = MATRIX_END) -> str:
    """The docs page's text with the generated table between the markers (ValueError when they are missing)."""
    start, stop = page.find(begin), page.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{MATRIX_PAGE} has no {begin!r} … {end!r} block")
    return page[:start + len(begin)] + "\n" + table + page[stop:]


def _matrix(args: argparse.Namespace) -> int:
    from review.group_matrix import group_markdown, group_row_dict, group_rows, group_text
    from review.matrix import RegisterError, compute
    from review.replacement import markdown, row_dict, text

    if args.update_docs and not is_developer_checkout(PROJECT_ROOT):  # never this repository's docs from elsewhere
        print(f"matrix --update-docs: {PROJECT_ROOT} is not the vllm-cluster checkout, whose docs hold the table; "
              "print it instead: matrix --markdown", file=sys.stderr)
        return 2
    problem = needs("running the Pulumi program under mocks", "review.registrations")
    if problem:
        print(f"matrix: {problem}", file=sys.stderr)
        return 2
    from review.registrations import register

    names = matrix_stacks(args.stack)
    values = {name: read_stack_values(name) for name in names}
    with_groups = {name: v for name, v in values.items() if v.get("groups")}
    if args.update_docs:
        with_groups |= grouped_examples(PROJECT_ROOT)
    plain = [name for name in names if name not in with_groups]
    try:
        rows = compute({name: values[name] for name in plain}, register)
        by_group = [r for name, v in with_groups.items() for r in group_rows(name, v, register)]
    except RegisterError as exc:  # the committed stack itself: the program refuses what the plan accepted
        print(f"matrix: the Pulumi program refuses a committed stack: {exc}", file=sys.stderr)
        return 2
    table = markdown(rows, plain) if plain else ""
    if args.update_docs:
        path = PROJECT_ROOT / MATRIX_PAGE
        try:
            page = page_with_matrix(path.read_text(), table)
            path.write_text(page_with_matrix(page, group_markdown(by_group), GROUP_MATRIX_BEGIN, GROUP_MATRIX_END))
        except (OSError, ValueError) as exc:
            print(f"matrix --update-docs: {exc}", file=sys.stderr)
            return 2
        print(f"{MATRIX_PAGE}: replacement matrix rewritten ({len(rows)} rows, stacks {', '.join(plain)}; "
              f"{len(by_group)} rows of stacks with groups: {', '.join(with_groups)})")
    elif args.json:
        print(json.dumps([row_dict(r) for r in rows] + [group_row_dict(r) for r in by_group], indent=2,
                         ensure_ascii=False))
    elif args.markdown:
        print(table + ("\n" if table and by_group else "") + group_markdown(by_group), end="")
    else:
        print((text(rows) if rows else "") + (group_text(by_group) if by_group else ""), end="")
    return 0


def _image_card(args: argparse.Namespace) -> int:
    from review.image_card import CardError, summary, take_card
    from stacks.planner.image_cards import card_file_name

    def refuse(text: str) -> int:  # the reference may carry credentials or control characters: the one rule
        print(mask_credentials(one_line(text)), file=sys.stderr)
        return 2

    out = Path(args.out) if args.out else PROJECT_ROOT / "images"
    developer = is_developer_checkout(PROJECT_ROOT) and out.resolve() == CARDS.resolve()
    if not developer and out.resolve() == CARDS.resolve():
        return refuse(f"image-card {args.image}: --out {str(out)!r} is the shipped cards' directory, which no "
                      f"command writes into; give --out DIR in your project (default: {PROJECT_ROOT / 'images'})")
    shipped = CARDS / f"{card_file_name(args.image)}.json"
    hides = out.resolve() == (PROJECT_ROOT / "images").resolve()  # the project's cards, which plans read
    if not developer and hides and shipped.is_file() and not args.override_shipped:
        return refuse(f"image-card {args.image}: a card of that name ships with vllm-cluster ({shipped}); yours in "
                      f"{out} would hide it from every stack of this project. Give --override-shipped to take it "
                      "anyway (every plan then names it in a warning)")
    try:
        taken = take_card(args.image, python=args.python, out_dir=out, timeout_s=args.timeout)
    except CardError as exc:
        return refuse(f"image-card {args.image}: {exc}")
    print(summary(taken))
    if developer:  # this checkout's images/: its support rows list every card
        from review.support import rewrite_support_tables

        changed = rewrite_support_tables(CARDS.parent)
        if changed:
            print(f"wrote {', '.join(changed)}: the support tables now list {args.image} (commit them with the card)")
    return 0


def _reference(args: argparse.Namespace) -> int:
    from review.reference import markdown

    print(markdown(), end="")
    return 0


def _model_card(args: argparse.Namespace) -> int:
    from review.model_card import main as model_card
    from review.support import rewrite_support_tables
    from stacks.model.loader import PROJECT_ROOT
    from stacks.planner.model_cards import SHIPPED

    if args.src.startswith("s3://"):
        problem = needs("reading the model from S3", "boto3")
        if problem:
            print(f"model-card: {problem}", file=sys.stderr)
            return 2
    # only this checkout's generated support tables (README, docs) list the cards; a user's project has none, and
    # no command writes into the installed package or this repository's docs from elsewhere
    in_checkout = is_developer_checkout(PROJECT_ROOT) and PROJECT_ROOT.resolve() == SHIPPED.parent.resolve()
    return model_card(args.src, args.name, synthesize_weights=args.synthesize_weights, facts=args.fact or [],
                      why=args.why, endpoint_url=args.endpoint_url, region=args.region, root=PROJECT_ROOT,
                      guard_shipped=not args.override_shipped, require_project=True,
                      on_written=rewrite_support_tables if in_checkout else None,
                      command=["python", "-m", "stacks", *(sys.argv[1:] if args.argv is None else args.argv)],
                      echo=lambda line: print(mask_credentials(line),  # SRC may carry credentials: the one rule
                                              file=sys.stderr if not line.startswith("wrote") else sys.stdout))


def _git_ref(value: str) -> str:
    """A revision git can name: not an option (a leading '-'), one printable line."""
    if value.startswith("-") or not value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise argparse.ArgumentTypeError(f"{shown(value)}: not a git revision, e.g. origin/main")
    return value


class _BadArgument(SystemExit):
    """argparse's exit 2, carrying its one-line refusal (masked) for a caller that answers in JSON."""

    def __init__(self, refusal: str) -> None:
        super().__init__(2)
        self.refusal = refusal


class _Parser(argparse.ArgumentParser):
    """A bad flag: the usage, then `python -m stacks SUB: bad argument: --flag 'value': what works`; exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a mistyped `--api-key=…` is refused (masked), never taken as a flag
        super().__init__(*args, **kwargs)
        self.words: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self.words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        message = with_unknown_options(self, message, self.words)
        refusal = mask_credentials(f"{self.prog}: bad argument: {argument_message(message)}")
        print(refusal, file=sys.stderr)
        raise _BadArgument(refusal)


JSON_ON_EVERY_EXIT = ("drift",)
"""Commands whose `--json` promises JSON on stdout at every exit, a refused argument and a crash included: a caller
(a cron job, the monitoring) parses stdout whatever happened."""


def _json_answer(argv: Sequence[str]) -> str | None:
    """The command of `argv` when it answers in JSON at every exit (`drift … --json`), else None."""
    words = list(argv)
    asked = any(w == "--json" or w.startswith("--json=") for w in words[1:])  # `--json=1`: refused, in JSON
    return words[0] if words and words[0] in JSON_ON_EVERY_EXIT and asked else None


def _json_refusal(argv: Sequence[str], error: str, next_step: str, **more: Any) -> None:
    """The JSON answer of a command that could not run: its stack (the first word after the command that is not
    a flag, when there is one), the error and what to do next."""
    stack = next((w for w in list(argv)[1:] if not w.startswith("-")), None)
    print(json.dumps({"stack": stack, "error": error, "next": next_step, **more}, indent=2, ensure_ascii=False))


Extend = Callable[[argparse.ArgumentParser, Any], None]
"""Adds subcommands to the parser (its subparsers given): the installed `vllm-cluster` adds `init` and
`policy-pack` (vllm_cluster/cli.py) without this layer importing the one above it."""


def build_parser(prog: str = "python -m stacks", extend: Extend | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("reference", help="the config reference (every key, type, range, default) as Markdown")
    ref.set_defaults(func=_reference)
    plan = sub.add_parser("plan", help="validate a stack and print what would be launched")
    plan.add_argument("stack", help="stack name: reads Pulumi.<stack>.yaml")
    plan.add_argument("--json", action="store_true", help="machine-readable plan (its `summary` key: memory per "
                      "GPU, roles, checks by kind)")
    plan.add_argument("--summary", action="store_true", help="print only the summary (at most 25 lines), not the "
                      "full plan after it")
    _add_overrides(plan)
    plan.set_defaults(func=_plan)
    conf = sub.add_parser("nginx-conf", help="print the proxy's nginx.conf with placeholder keys (review it)")
    conf.add_argument("stack")
    _add_overrides(conf)
    conf.set_defaults(func=_nginx_conf)
    watch = sub.add_parser("watch-unit", help="print the systemd service that probes every DP rank of the stack "
                           "with its golden set (checks.api --watch) from the deploying host")
    watch.add_argument("stack")
    watch.add_argument("--python", metavar="ABS_PATH", type=abs_path,
                       help="interpreter with httpx [the project's venv/bin/python]")
    watch.add_argument("--workdir", metavar="ABS_PATH", type=abs_path,
                       help="the project (its stack file and cards) [this one]")
    watch.add_argument("--env-file", metavar="ABS_PATH", type=abs_path,
                       help="file with VLLM_API_KEY=… [/etc/vllm-cluster/<stack>-watch.env when a key is needed]")
    watch.add_argument("--ca-file", metavar="ABS_PATH", type=abs_path,
                       help="the proxy's certificate [/etc/vllm-cluster/<stack>-ca.pem with TLS]")
    watch.add_argument("--user", help="run as this user (default: root)")
    _add_overrides(watch)
    watch.set_defaults(func=_watch_unit)
    obs = sub.add_parser("observability", help="write the generated Prometheus config, alert rules, Alertmanager "
                         "config, Grafana provisioning and dashboards of a stack (what the program deploys)")
    obs.add_argument("stack")
    obs.add_argument("--out", required=True, metavar="DIR", help="directory to write them under")
    _add_overrides(obs)
    obs.set_defaults(func=_observability)
    back = sub.add_parser("rollback", help="rewrite the stack's image to one a past successful update ran")
    back.add_argument("stack")
    back.add_argument("--to", default="previous", metavar="previous|TAG|sha256:DIGEST",
                      help="previous (default): the newest successful update with another image; a tag, repo:tag "
                      "or sha256:digest, or a unique start of one")
    back.add_argument("--history", metavar="FILE", type=path,
                      help="`pulumi stack history --json` output with every update "
                      "(default: run it, every page)")
    back.add_argument("--page-size", type=count(1000), default=PAGE_SIZE, metavar="N",
                      help=f"updates per `pulumi stack history` call [{PAGE_SIZE}]; pages are read until one is "
                      "empty")
    back.add_argument("--dry-run", action="store_true", help="print the choice, leave the stack file alone")
    back.set_defaults(func=_rollback)
    diff = sub.add_parser("diff", help="Markdown review of what a change does to a stack's plan")
    diff.add_argument("stack")
    diff.add_argument("--base", required=True, metavar="GIT_REF", type=_git_ref, help="e.g. origin/main")
    diff.add_argument("--json", action="store_true")
    diff.add_argument("--assume-secret", action="append", default=[], metavar="KEY",
                      help="plan both sides as if this secret were set (repeatable), as plan --assume-secret")
    diff.set_defaults(func=_diff)
    matrix = sub.add_parser("matrix", help="what a change of each config key costs: replaced / updated / re-run "
                            "resources and the downtime (the program run under Pulumi's mocks)")
    matrix.add_argument("stack", nargs="*", help="stacks to cover (default: every Pulumi.<stack>.yaml)")
    form = matrix.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="every row with every resource's action")
    form.add_argument("--markdown", action="store_true", help="the docs table (keys with one effect share a row)")
    form.add_argument("--update-docs", "--update-readme", dest="update_docs", action="store_true",
                      help=f"rewrite the table in {MATRIX_PAGE}")
    matrix.set_defaults(func=_matrix)
    card = sub.add_parser("image-card", help="read what an image's vLLM accepts (options, types, choices, bounds, "
                          "config fields, routes) into images/<name>.json, the card plans check values against")
    card.add_argument("image", help="repository:tag[@sha256:digest], as in the stack's image")
    card.add_argument("--python", metavar="PATH", help="run the probe with this interpreter (a host or venv with "
                      "vLLM installed) instead of inside the image with docker")
    card.add_argument("--out", metavar="DIR", help="where to write the card [the project's images/]")
    card.add_argument("--override-shipped", action="store_true", help="write it even where a shipped card has "
                      "its name: the project's card is then used, and every plan warns")
    card.add_argument("--timeout", type=int, default=600, metavar="S", help="seconds the probe may take [600]")
    card.set_defaults(func=_image_card)
    summary = sub.add_parser("preview-summary", help="condense `pulumi preview --json` into Markdown; exit 1 on "
                             "errors and mandatory policy violations")
    summary.add_argument("file", help="`pulumi preview --json` output (or a streamed event log), or - for stdin")
    summary.add_argument("--events", metavar="FILE", type=path, help="the engine event log of the same preview "
                         "(`PULUMI_DEBUG_COMMANDS=true pulumi preview --json --event-log FILE`): policy violations")
    summary.add_argument("--json", action="store_true")
    summary.set_defaults(func=_preview_summary)
    card = sub.add_parser("model-card", help="write models/NAME.json from a model's config.json and safetensors "
                          "headers (local directory, s3://bucket/prefix or hf://ORG/NAME[@REVISION])")
    card.add_argument("src", help="model directory, s3://bucket/prefix (AWS_* credentials as for model.source), or "
                      "hf://ORG/NAME[@REVISION]: the Hugging Face Hub, headers only (HF_TOKEN, HF_ENDPOINT)")
    card.add_argument("--name", required=True, help="the card's name: model.profile in a stack")
    card.add_argument("--synthesize-weights", action="store_true",
                      help="no shard headers at hand: build the tensor list from config.json (recorded as "
                      "synthesized; an index beside it must name the same tensors)")
    card.add_argument("--fact", action="append", metavar="KEY=VALUE",
                      help="a fact the model's files do not hold (parsers, defaults, an assumed split); recorded as "
                      "given on the command line")
    card.add_argument("--why", help="where the --fact values come from (recorded in the card)")
    card.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph RGW)")
    card.add_argument("--region", help="S3 region [AWS_REGION or us-east-1]")
    card.add_argument("--override-shipped", action="store_true", help="write it even where a shipped card has "
                      "--name: the project's card is then used, and every plan warns")
    card.set_defaults(func=_model_card, argv=None)
    from heal.cli import add_commands
    add_commands(sub, _add_overrides)
    if extend is not None:
        extend(parser, sub)
    return parser


def _stdout_closed(what: str) -> int:
    """The reader of stdout went away (`python -m stacks plan prod --json | head -c 10`): the output is cut, which a
    script must be able to tell, so one line on stderr says so and the exit is 141 (128 + SIGPIPE); the
    interpreter's last flush is kept from raising again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    with contextlib.suppress(OSError):  # stderr is gone too: the exit status is all that is left
        print(f"{what}: stdout was closed before the output was complete (the reader, e.g. `head`, stopped "
              "reading): what it got is cut; exit 141", file=sys.stderr)
    return 141


def main(argv: Sequence[str] | None = None, prog: str = "python -m stacks", extend: Extend | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    json_answer = _json_answer(words)
    try:
        args = build_parser(prog, extend).parse_args(words)
    except _BadArgument as exc:
        if json_answer:
            _json_refusal(words, exc.refusal, f"{prog} {json_answer} --help")
        raise
    if args.command == "model-card":
        args.argv = list(argv) if argv is not None else None
    problem = root_variable_problem() if args.command != "init" else None
    if problem:  # before anything reads the project: exit 2 naming the variable, not an internal error
        if json_answer:
            _json_refusal(words, problem, PROJECT_FIX)
        print(f"{prog} {args.command}: {problem}", file=sys.stderr)
        return 2
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _stdout_closed(f"{prog} {args.command}")
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG) and exc.filename is None:
            # no file named: the write that failed is stdout's (a file the command writes names itself)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            print(f"{prog} {args.command}: could not write the output ({exc.strerror}): what was written is cut; "
                  "free space where stdout goes, or write elsewhere", file=sys.stderr)
            return 1
        return _crash(prog, args.command, words, json_answer, exc)
    except ConfigError as exc:
        if json_answer:
            _json_refusal(words, "the stack is refused", "fix each key `errors` names",
                          errors=[p.as_dict() for p in exc.problems])
        print(exc.report(), file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: say so in one line, keep the traceback behind a switch
        return _crash(prog, args.command, words, json_answer, exc)


def _crash(prog: str, command: str, words: list[str], json_answer: str | None, exc: Exception) -> int:
    """An exception no command handled: a name the file system cannot hold is bad input (exit 2); anything else is
    a bug, said in one line (exit 3), the traceback behind VLLM_CLUSTER_DEBUG."""
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        # a folder or stack name the file system cannot hold: bad input, not a bug
        name = str(exc.filename or "")
        said = mask_credentials(f"{prog} {command}: {exc.strerror}: {shown(name)} ({len(name)} characters); "
                                "shorten the folder or stack name")
        if json_answer:
            _json_refusal(words, said, "a shorter folder or stack name")
        print(said, file=sys.stderr)
        return 2
    if os.environ.get("VLLM_CLUSTER_DEBUG"):
        raise exc
    crash = mask_credentials(f"internal error in vllm-cluster ({type(exc).__name__}: {exc}); this is a bug, not "
                             "your config")
    if json_answer:
        _json_refusal(words, crash, "rerun with VLLM_CLUSTER_DEBUG=1 for the traceback and report it")
    print(f"{crash}: rerun with VLLM_CLUSTER_DEBUG=1 for the traceback and report it", file=sys.stderr)
    return 3
