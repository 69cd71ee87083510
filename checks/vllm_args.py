"""Argument dry run: the new image's own `vllm serve` runs on this node's argv, up to the engine start.

Runs inside the new image with no GPU and no network (`docker run --rm -i --network none --entrypoint
python3 <image> - …`, `VLLM_TARGET_DEVICE=cpu`). It drives vLLM's real CLI (`vllm.entrypoints.cli.main`):
parsing, `validate_parsed_serve_args`, and the serve command itself (vLLM 0.33.0
`vllm/entrypoints/cli/serve.py`, `ServeSubcommand.cmd`: `--headless` with `--api-server-count`, the data
parallel load-balancing mode, the API server count, the rust frontend), then whichever launcher it picks
(`run_headless`, `run_multi_api_server`, `run_server`) up to the point where vLLM builds the engine config.
Only what needs the model, a GPU or the network is stubbed:

- `EngineArgs.create_engine_config` (every launcher calls it before any process starts) raises
  `_EngineStartReached`: that is the dry run's success. With `--engine-config` the real one runs first, on the
  model directory the command mounts read-only (only its config.json is read: no weights, tokenizer skipped), so
  vLLM's cross-field rules (scheduler budgets, heads over TP, max_model_len against the model, speculative,
  parallel) answer here; a refusal is a FAIL with vLLM's message;
- the API server's listening socket (`create_server_socket`, `create_server_unix_socket` in
  `vllm/entrypoints/launchers/launcher.py`) is created but never bound, so `setup_server` still runs its own
  checks (`validate_api_server_args`: the tool call parser name);
- the multi-port DP supervisor and the forkserver are not started.

At that point the engine would look up `--reasoning-parser` in the image's registry before serving
(`v1/structured_output/__init__.py`, `ReasoningParserManager.get_reasoning_parser`); the dry run makes the
same lookup. A rejected argv fails the update while the old engines still serve.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import socket
import sys
from collections.abc import Sequence
from typing import Any

from checks.verdict import CheckParser, Verdict, check_name, container_name, emit, listed, printable_line, shown


class _EngineStartReached(BaseException):
    """Raised where vLLM would build the engine config; a BaseException so no `except Exception` in vLLM
    swallows it on the way out."""


def _errors(text: str) -> list[str]:
    """argparse's `error:` line, or the exception; not vLLM's import-time noise about optional kernels."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and "Failed to import from vllm._C" not in line]
    picked = [line for line in lines if ": error:" in line or line.split(":", 1)[0].endswith("Error")]
    return [line[:400] for line in (picked or lines[-3:])[-4:]]


def _engine_error(exc: BaseException) -> str:
    """vLLM's own words from a config class's refusal: pydantic's `1 validation error for SchedulerConfig` /
    `  Value error, max_num_batched_tokens (8192) is smaller … [type=value_error, input_value=…]` becomes
    `SchedulerConfig: max_num_batched_tokens (8192) is smaller …`; other exceptions keep their type."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if type(exc).__name__ == "ValidationError" and len(lines) > 1:
        head = lines[0].split(" for ", 1)[-1]
        body = " ".join(line.split(" [type=", 1)[0] for line in lines[1:] if not line.startswith("For further"))
        return f"{head}: {body.replace('Value error, ', '')}"[:600]
    return f"{type(exc).__name__}: {text}"[:600]


def _config_facts(config: Any) -> str:
    """What vLLM derived (model, parallel and scheduler config), for the PASS line."""
    model, parallel = getattr(config, "model_config", None), getattr(config, "parallel_config", None)
    scheduler, cache = getattr(config, "scheduler_config", None), getattr(config, "cache_config", None)
    facts = [("max_model_len", model), ("tensor_parallel_size", parallel), ("pipeline_parallel_size", parallel),
             ("data_parallel_size", parallel), ("max_num_batched_tokens", scheduler), ("max_num_seqs", scheduler),
             ("enable_chunked_prefill", scheduler), ("cache_dtype", cache)]
    return ", ".join(f"{name}={getattr(owner, name)}" for name, owner in facts if hasattr(owner, name))


def _stub_launch(seen: dict[str, Any], build_config: bool = False) -> bool:
    """Swap the engine start and the socket binding for recorders; False where this vLLM lacks the hooks (then
    only parsing and validation run, and the verdict says so). With `build_config`, vLLM's own
    `create_engine_config` runs first where the model directory holds a config.json (no weights are read; the
    tokenizer is skipped, it is not part of the config)."""
    try:
        from vllm.engine import arg_utils
        from vllm.entrypoints.cli import serve
        from vllm.entrypoints.launchers import launcher
    except ImportError:
        return False
    if not hasattr(arg_utils.EngineArgs, "create_engine_config") or not hasattr(launcher, "create_server_socket"):
        return False

    real_engine_config = _real(arg_utils.EngineArgs, "create_engine_config")

    def engine_config(self: Any, usage_context: Any = None, headless: bool = False) -> Any:
        seen["engine_headless"] = headless
        model = str(getattr(self, "model", "") or "")
        if build_config and os.path.isfile(os.path.join(model, "config.json")):
            self.skip_tokenizer_init = True
            try:
                seen["engine_config"] = _config_facts(real_engine_config(self, usage_context=usage_context,
                                                                         headless=headless))
            except Exception as exc:  # vLLM's config classes refuse with ValueError / pydantic's ValidationError
                seen["engine_error"] = _engine_error(exc)
        elif build_config:
            seen["engine_config"] = f"not built: no config.json in {model} here (the node's model directory)"
        raise _EngineStartReached

    def unbound_socket(addr: Any, *, reuse_port: bool = False) -> socket.socket:
        seen["listen"] = f"{addr[0] or '0.0.0.0'}:{addr[1]}"
        return socket.socket(socket.AF_INET6 if ":" in str(addr[0]) else socket.AF_INET, socket.SOCK_STREAM)

    def unbound_unix_socket(path: str) -> socket.socket:
        seen["listen"] = f"unix:{path}"
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def dp_supervisor(args: argparse.Namespace) -> None:
        seen["launcher"] = "run_dp_supervisor"
        with contextlib.suppress(ImportError):  # its constructor validates the multi-port arguments
            from vllm.entrypoints.launchers.dp_supervisor import DPSupervisor

            DPSupervisor(args)
        raise _EngineStartReached

    arg_utils.EngineArgs.create_engine_config = engine_config
    launcher.create_server_socket = unbound_socket
    if hasattr(launcher, "create_server_unix_socket"):
        launcher.create_server_unix_socket = unbound_unix_socket
    if hasattr(serve, "create_server_socket"):
        serve.create_server_socket = unbound_socket
    if hasattr(serve, "run_dp_supervisor"):
        serve.run_dp_supervisor = dp_supervisor
    for name in ("run_headless", "run_multi_api_server"):
        if hasattr(serve, name):
            setattr(serve, name, _recording(name, _real(serve, name), seen))
    if hasattr(serve, "run_server"):
        real_run_server = _real(serve, "run_server")

        async def run_server(args: argparse.Namespace, **kwargs: Any) -> None:
            seen["launcher"] = "run_server"
            await real_run_server(args, **kwargs)

        serve.run_server = run_server
    with contextlib.suppress(ImportError, AttributeError):
        import multiprocessing.forkserver

        multiprocessing.forkserver.ensure_running = lambda: None  # VLLM_WORKER_MULTIPROC_METHOD=forkserver
    real_cmd = _real(serve.ServeSubcommand, "cmd")

    def cmd(args: argparse.Namespace) -> None:
        seen["args"] = args
        real_cmd(args)

    serve.ServeSubcommand.cmd = staticmethod(cmd)
    return True


_REAL: dict[tuple[int, str], Any] = {}
"""vLLM's own functions, as found before the first stub: the stubs of a later argv (`--more-argv`) wrap these,
never the stubs of an earlier one."""


def _real(owner: Any, name: str) -> Any:
    return _REAL.setdefault((id(owner), name), getattr(owner, name))


def _recording(name: str, function: Any, seen: dict[str, Any]) -> Any:
    def wrapper(args: argparse.Namespace) -> Any:
        seen["launcher"] = name
        return function(args)

    return wrapper


def _engine_lookups(args: argparse.Namespace) -> None:
    """What the engine resolves by name before serving and needs no model for: the reasoning parser."""
    name = getattr(args, "reasoning_parser", None)
    if not name:
        return
    from vllm.reasoning import ReasoningParserManager

    plugin = getattr(args, "reasoning_parser_plugin", None)
    if plugin and len(plugin) > 3:
        ReasoningParserManager.import_reasoning_parser(plugin)
    ReasoningParserManager.get_reasoning_parser(name)


def parse_with_vllm(argv: list[str], build_config: bool = False) -> tuple[bool, str, dict[str, Any]]:
    """(accepted, what vLLM printed, parsed fields plus `_launcher`). Raises ImportError where vLLM is missing.
    With `build_config`, `_engine_config` holds what vLLM's create_engine_config derived (or why it did not run)
    and `_engine_error` its refusal."""
    import vllm

    parsed: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        from vllm.entrypoints.cli import main as cli_main
        from vllm.entrypoints.cli import serve as cli_serve
    except ImportError:  # vLLM before the `vllm` CLI package: the OpenAI server's own parser
        cli_main = None
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            if cli_main is not None:
                stubbed = _stub_launch(seen, build_config)
                if not stubbed:  # no hooks to stop at the engine start: parse and validate only
                    cli_serve.ServeSubcommand.cmd = staticmethod(lambda args: seen.setdefault("args", args))
                saved = sys.argv
                sys.argv = ["vllm", "serve", *argv]
                try:
                    cli_main.main()
                except _EngineStartReached:
                    pass
                finally:
                    sys.argv = saved
                if "args" not in seen:
                    return False, stderr.getvalue() + stdout.getvalue() + "\nvLLM's serve command was not reached", {}
                if stubbed and "engine_headless" not in seen and seen.get("launcher") != "run_dp_supervisor":
                    return False, stderr.getvalue() + "\nserve returned before building the engine", {}
                if "engine_error" in seen:
                    return False, stderr.getvalue() + f"\nengine config: {seen['engine_error']}", {
                        "_engine_error": seen["engine_error"]}
                _engine_lookups(seen["args"])
                parsed["_launcher"] = seen.get("launcher") if stubbed else None
                parsed["_engine_config"] = seen.get("engine_config")
                parsed["_listen"] = seen.get("listen")
                args = seen["args"]
            else:
                from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
                from vllm.utils import FlexibleArgumentParser

                args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *argv])
                validate_parsed_serve_args(args)
                parsed["_launcher"] = None
        except SystemExit as exc:  # argparse: exit 2 and `error: unrecognized arguments: …`
            return False, stderr.getvalue() + stdout.getvalue() + f"\n(exit {exc.code})", {}
        except Exception as exc:  # serve's checks raise ValueError/TypeError/KeyError
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            return False, stderr.getvalue() + f"\n{type(exc).__name__}: {message}", {}
    parsed.update({k: v for k, v in vars(args).items() if not callable(v)})
    parsed["_vllm_version"] = getattr(vllm, "__version__", "?")
    return True, stderr.getvalue(), parsed


def _reached(parsed: dict[str, Any]) -> str:
    launcher = parsed.get("_launcher")
    if launcher is None:
        return "parsed and validated (this vLLM has no launch hooks: serve's launch logic was not run)"
    servers = parsed.get("api_server_count")
    what = {"run_headless": "headless engines", "run_server": "one API server in this process",
            "run_multi_api_server": f"API server processes ({servers if servers is not None else '?'})",
            "run_dp_supervisor": "the multi-port DP supervisor"}.get(str(launcher), str(launcher))
    return f"serve reached {launcher} ({what}) and stopped where it builds the engine"


def check(name: str, argv: list[str], expect: dict[str, str], import_only: list[str], image: str,
          build_config: bool = False) -> Verdict:
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
        ok, printed, parsed = parse_with_vllm(argv, build_config)
    except ImportError as exc:
        return Verdict(name, "cannot-run", f"vLLM is not importable in {image}", [str(exc)[:300]],
                       "is this a vLLM image? its python3 must import vllm")
    if not ok and parsed.get("_engine_error"):
        return Verdict(name, "fail", f"vLLM's create_engine_config in {image} refuses this node's argv with the "
                       "model's config.json; the running engines were not touched", [parsed["_engine_error"]],
                       "change the value it names (its serving.* key or serving.extra_args), or keep the previous "
                       "image: `python -m stacks rollback <stack>`")
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
    evidence = [_reached(parsed), *([f"engine config {parsed['_engine_config']}"] if parsed.get("_engine_config")
                                    else []), *[f"{key}={parsed.get(key)!r}" for key in expect][:6]]
    return Verdict(name, "pass", f"vLLM {parsed['_vllm_version']} in {image} accepts all {len(argv)} argv items",
                   evidence, details={"launcher": parsed.get("_launcher"),
                                      "api_server_count": parsed.get("api_server_count")})


def check_servers(name: str, servers: list[tuple[str, list[str], dict[str, str]]], image: str,
                  build_config: bool = False) -> Verdict:
    """Several `vllm serve` argv of one node (external load balancing: one server per DP rank), each as `check`
    runs one, in one process: the first refusal fails the whole check, naming its server."""
    passed: list[Verdict] = []
    for label, argv, expect in servers:
        verdict = check(name, argv, expect, [], image, build_config)
        if verdict.status != "pass":
            verdict.summary = f"{label}: {verdict.summary}"
            verdict.evidence.append(f"{len(passed)} server argv before it accepted: "
                                    + (", ".join(s[0] for s in servers[:len(passed)]) or "none"))
            return verdict
        passed.append(verdict)
    first = passed[0]
    labels = [label for label, _, _ in servers]
    summary = f"{first.summary} of {labels[0]}, and every other server's: {len(servers)} servers accepted"
    shown_ = [f"{label}: {v.evidence[0]}" for label, v in zip(labels, passed, strict=True)][:3]
    more = [f"… and {len(servers) - 3} more server(s), each accepted"] if len(servers) > 3 else []
    return Verdict(name, "pass", summary, shown_ + first.evidence[1:] + more,
                   details={"servers": labels, "launchers": [v.details.get("launcher") for v in passed]})


def _more_argv(value: str) -> tuple[str, list[str], dict[str, str]]:
    """`--more-argv '{"name": …, "argv": […], "expect": {…}}'`: another server's argv and its expectations."""
    try:
        raw = json.loads(_text_value(value))
        label, argv, expect = raw["name"], raw["argv"], raw.get("expect", {})
        if not (isinstance(label, str) and isinstance(argv, list) and all(isinstance(a, str) for a in argv)
                and isinstance(expect, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in expect.items())):
            raise TypeError
        for key in expect:
            _expectation(f"{key}=")
    except (ValueError, TypeError, KeyError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{shown(value)}: not a JSON object {{\"name\": …, \"argv\": [words], "
                                         "\"expect\": {field: value}}") from None
    return container_name(label), argv, expect


def _text_value(value: str) -> str:
    if len(value) > 65536:
        raise ValueError("too long")
    return value


_FIELD = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _expectation(value: str) -> tuple[str, str]:
    field, sep, expected = value.partition("=")
    if not sep or not _FIELD.fullmatch(field) or len(value) > 1024:
        raise argparse.ArgumentTypeError(f"{shown(value)}: not FIELD=VALUE with a vLLM argument name, e.g. "
                                         "tensor_parallel_size=8")
    return field, expected


def _module(value: str) -> str:
    if not _MODULE.fullmatch(value) or len(value) > 128:
        raise argparse.ArgumentTypeError(f"{shown(value)}: not a module name, e.g. vllm")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="vllm_args", description=__doc__)
    p.add_argument("--name", default="args-dry-run", type=check_name)
    p.add_argument("--image", default="this image", type=printable_line)
    p.add_argument("--expect", action="append", default=[], metavar="FIELD=VALUE", type=_expectation,
                   help="a parsed field that must come out as planned, e.g. tensor_parallel_size=8")
    p.add_argument("--import-only", default=[], type=listed(_module),
                   help="comma-separated modules: only prove they import")
    p.add_argument("--engine-config", action="store_true", help="also run vLLM's create_engine_config where the "
                   "model directory (the first argv word) holds a config.json")
    p.add_argument("--json", action="store_true")
    p.add_argument("--server", type=container_name, help="the name of the server whose argv follows `--` (with "
                   "--more-argv: a container name)")
    p.add_argument("--more-argv", action="append", default=[], type=_more_argv, metavar="JSON",
                   help='another server of this node, checked after the first: {"name": container, "argv": '
                        '[words], "expect": {field: value}} (external load balancing: one per DP rank)')
    p.add_argument("serve_argv", nargs=argparse.REMAINDER, help="after `--`: the argv of `vllm serve`")
    args = p.parse_args(argv)
    serve = args.serve_argv[1:] if args.serve_argv[:1] == ["--"] else args.serve_argv
    expect = dict(args.expect)
    modules = args.import_only
    if not serve and not modules:
        p.error("nothing to check: give the `vllm serve` argv after `--`, or --import-only MODULES")
    if args.more_argv and not serve:
        p.error("--more-argv needs the first server's argv after `--`")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the config comes from the mounted directory, never the Hub
    if args.more_argv:
        servers = [(args.server or "the first server", serve, expect), *args.more_argv]
        return emit(check_servers(args.name, servers, args.image, args.engine_config), args.json)
    return emit(check(args.name, serve, expect, modules, args.image, args.engine_config), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
