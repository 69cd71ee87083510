"""Argument dry run: the new image's own vLLM parses this node's `vllm serve` argv, before any engine moves.

Runs inside the new image with no GPU and no network (`docker run --rm -i --network none --entrypoint
python3 <image> - …`). It drives vLLM's real CLI (`vllm.entrypoints.cli.main`) with the serve command's
action swapped for a no-op, so parsing and vLLM's own post-parse validation run exactly as in
`vllm serve`, and nothing loads. A rejected flag fails the update while the old engines still serve.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence
from typing import Any

from checks.verdict import Verdict, emit


def _errors(text: str) -> list[str]:
    """argparse's `error:` line, or the exception; not vLLM's import-time noise about optional kernels."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and "Failed to import from vllm._C" not in line]
    picked = [line for line in lines if ": error:" in line or line.split(":", 1)[0].endswith("Error")]
    return [line[:400] for line in (picked or lines[-3:])[-4:]]


def parse_with_vllm(argv: list[str]) -> tuple[bool, str, dict[str, Any]]:
    """(accepted, what vLLM printed, parsed fields). Raises ImportError where vLLM is not installed."""
    import vllm

    parsed: dict[str, Any] = {}

    def accept(args: argparse.Namespace) -> None:
        parsed.update({k: v for k, v in vars(args).items() if not callable(v)})

    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        from vllm.entrypoints.cli import main as cli_main
        from vllm.entrypoints.cli import serve as cli_serve
    except ImportError:  # vLLM before the `vllm` CLI package: the OpenAI server's own parser
        cli_main = None
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            if cli_main is not None:
                cli_serve.ServeSubcommand.cmd = staticmethod(accept)
                saved = sys.argv
                sys.argv = ["vllm", "serve", *argv]
                try:
                    cli_main.main()
                finally:
                    sys.argv = saved
            else:
                from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
                from vllm.utils import FlexibleArgumentParser

                args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *argv])
                validate_parsed_serve_args(args)
                accept(args)
        except SystemExit as exc:  # argparse: exit 2 and `error: unrecognized arguments: …`
            return False, stderr.getvalue() + stdout.getvalue() + f"\n(exit {exc.code})", {}
        except Exception as exc:  # vLLM's post-parse validation raises ValueError/TypeError
            return False, stderr.getvalue() + f"\n{type(exc).__name__}: {exc}", {}
    if not parsed:
        return False, stderr.getvalue() + stdout.getvalue() + "\nvLLM's serve command was not reached", {}
    parsed["_vllm_version"] = getattr(vllm, "__version__", "?")
    return True, stderr.getvalue(), parsed


def check(name: str, argv: list[str], expect: dict[str, str], import_only: list[str], image: str) -> Verdict:
    if import_only:
        versions = []
        for module in import_only:
            try:
                versions.append(f"{module} {getattr(__import__(module), '__version__', '?')}")
            except ImportError as exc:
                return Verdict(name, "fail", f"{image} cannot import {module}", [str(exc)[:300]],
                               "this node runs the image's own Ray/vLLM: use an image that ships them")
        return Verdict(name, "pass", f"{image} starts here and imports " + ", ".join(versions), versions)
    try:
        ok, printed, parsed = parse_with_vllm(argv)
    except ImportError as exc:
        return Verdict(name, "cannot-run", f"vLLM is not importable in {image}", [str(exc)[:300]],
                       "is this a vLLM image? its python3 must import vllm")
    if not ok:
        return Verdict(name, "fail", f"the vLLM in {image} rejects this node's argv; the running engines were not "
                       "touched", _errors(printed),
                       "remove or rename the flag (serving.extra_args, or a field whose flag this vLLM renamed), or "
                       "keep the previous image: `python -m stacks rollback <stack>`")
    wrong = [f"{key}={parsed.get(key)!r}, expected {value!r}" for key, value in expect.items()
             if str(parsed.get(key)) != value]
    if wrong:
        return Verdict(name, "fail", f"the vLLM in {image} parsed the argv differently than planned", wrong,
                       "a flag changed meaning in this vLLM: compare `vllm serve --help` of the two images")
    return Verdict(name, "pass", f"vLLM {parsed['_vllm_version']} in {image} accepts all {len(argv)} argv items",
                   [f"{key}={parsed.get(key)!r}" for key in expect][:6])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm_args", description=__doc__)
    p.add_argument("--name", default="args-dry-run")
    p.add_argument("--image", default="this image")
    p.add_argument("--expect", action="append", default=[], metavar="FIELD=VALUE",
                   help="a parsed field that must come out as planned, e.g. tensor_parallel_size=8")
    p.add_argument("--import-only", default="", help="comma-separated modules: only prove they import")
    p.add_argument("--json", action="store_true")
    p.add_argument("serve_argv", nargs=argparse.REMAINDER, help="after `--`: the argv of `vllm serve`")
    args = p.parse_args(argv)
    serve = args.serve_argv[1:] if args.serve_argv[:1] == ["--"] else args.serve_argv
    expect = dict(item.split("=", 1) for item in args.expect)
    modules = [m for m in args.import_only.split(",") if m]
    return emit(check(args.name, serve, expect, modules, args.image), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
