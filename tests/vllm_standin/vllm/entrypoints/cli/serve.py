"""Stand-in for vllm/entrypoints/cli/serve.py: the serve subparser built from the captured flag table, and
serve's own launch logic up to the engine config.

Mirrored from vLLM 0.33.0 entrypoints/cli/serve.py:
- `ServeSubcommand.cmd` lines 54-154: model_tag, `--headless` with `--api-server-count` (ValueError), the
  load-balancing mode and "Cannot use more than one data parallel load balancing mode" (lines 83-108), the
  API server count default (lines 113-145, rust frontend and elastic EP included) and the launcher choice
  (lines 147-154). The gRPC server (lines 59-64) is not reproduced.
- `validate` line 158-159 (`validate_parsed_serve_args`).
- `run_headless` lines 181-197: the API server count check, engine args, engine config, then the hybrid LB
  check.
- `run_multi_api_server` lines 269-313: the asserts, the rust frontend with more than one API server,
  `setup_server`, engine args, engine config.
The parser is built from tests/fixtures/vllm-0.33.0-serve-flags.json (option strings, dest, nargs, type,
default of the real parser); argparse does the parsing, so an unknown flag fails with argparse's message.
"""


import vllm
import vllm.envs as envs
from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
from vllm.entrypoints.launchers.api_server.entry import run_server
from vllm.entrypoints.launchers.launcher import create_server_socket, setup_server

_TYPES = {"int": int, "float": float}
__all__ = ["create_server_socket"]


def _table():
    data = vllm._fixture("_flags.json", "VLLM_STANDIN_FLAGS")
    vllm.__version__ = data.get("vllm_version", vllm.__version__)
    return data["flags"]


class ServeSubcommand:
    name = "serve"

    @staticmethod
    def cmd(args):
        if hasattr(args, "model_tag") and args.model_tag is not None:
            args.model = args.model_tag
        rust_frontend_path = envs.VLLM_RUST_FRONTEND_PATH if envs.VLLM_USE_RUST_FRONTEND else None
        if args.headless:
            if args.api_server_count is not None and args.api_server_count > 0:
                raise ValueError(
                    f"--api-server-count={args.api_server_count} cannot be "
                    "used with --headless (no API servers are started in "
                    "headless mode).")
            args.api_server_count = 0
        is_external_lb = args.data_parallel_external_lb or args.data_parallel_rank is not None
        is_hybrid_lb = is_multi_port = False
        if not args.data_parallel_hybrid_lb and not args.data_parallel_multi_port_external_lb:
            is_hybrid_lb = args.data_parallel_start_rank is not None
        else:
            is_hybrid_lb = args.data_parallel_hybrid_lb
            is_multi_port = args.data_parallel_multi_port_external_lb
        if sum([is_multi_port, is_external_lb, is_hybrid_lb]) > 1:
            raise ValueError(
                "Cannot use more than one data parallel load balancing mode. "
                "Choose one of: --data-parallel-multi-port-external-lb, "
                "--data-parallel-external-lb (or --data-parallel-rank), "
                "--data-parallel-hybrid-lb (or --data-parallel-start-rank).")
        if args.api_server_count is None:
            if is_multi_port or is_external_lb or rust_frontend_path:
                args.api_server_count = 1
            elif is_hybrid_lb:
                args.api_server_count = args.data_parallel_size_local or 1
            else:
                args.api_server_count = args.data_parallel_size
        elif rust_frontend_path and args.api_server_count > 1:
            args.api_server_count = 1
        if getattr(args, "enable_elastic_ep", False) and args.api_server_count > 1:
            args.api_server_count = 1
        if is_multi_port:
            run_dp_supervisor(args)
        elif args.api_server_count < 1:
            run_headless(args)
        elif args.api_server_count > 1 or rust_frontend_path:
            run_multi_api_server(args)
        else:
            args.api_server_count = None
            import asyncio

            asyncio.run(run_server(args))

    def validate(self, args):
        validate_parsed_serve_args(args)

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser("serve")
        for flag in _table():
            if "positional" in flag:
                parser.add_argument(flag["positional"], nargs="?")
                continue
            options = [o for o in flag["options"] if o != "-h" and o != "--help"]
            if not options:
                continue
            default = flag.get("default")
            if flag["takes_value"]:
                nargs = flag["nargs"] if flag["nargs"] in ("+", "*", "?") else None
                parser.add_argument(*options, dest=flag["dest"], nargs=nargs,
                                    type=_TYPES.get(flag["type"] or "", str), default=default)
            else:
                # argparse.BooleanOptionalAction adds `--no-x` for the declared `--x`; vLLM 0.33.0's
                # EnableDisableAction (utils/argparse_utils.py:120-145) adds the inverse `--disable-x` of a
                # declared `--enable-x` (and the other way round), both setting the dest to False. A store_true
                # flag (`--headless`) has one string. The default is the dumped one (None: vLLM decides later).
                declared = options[0]
                swapped = {"--enable-": "--disable-", "--disable-": "--enable-"}
                inverse = next((to + declared[len(frm):] for frm, to in swapped.items() if declared.startswith(frm)),
                               None)
                negative = [o for o in options if o.startswith("--no-") or o == inverse]
                if len(options) > 1 or (flag.get("nargs") == 0 and default is None):
                    negative.append(f"--no-{declared[2:]}")
                positive = [o for o in options if o not in negative]
                parser.add_argument(*positive, dest=flag["dest"], action="store_true", default=default)
                if negative:
                    parser.add_argument(*dict.fromkeys(negative), dest=flag["dest"], action="store_false")
        return parser


def run_dp_supervisor(args):
    raise NotImplementedError("the vLLM stand-in has no multi-port DP supervisor")


def run_headless(args):
    if args.api_server_count > 1:
        raise ValueError("api_server_count can't be set in headless mode")
    engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
    engine_args.create_engine_config(usage_context=None, headless=True)
    if engine_args.data_parallel_hybrid_lb:
        raise ValueError("data_parallel_hybrid_lb is not applicable in headless mode")


def run_multi_api_server(args):
    assert not args.headless
    rust_frontend_path = envs.VLLM_RUST_FRONTEND_PATH if envs.VLLM_USE_RUST_FRONTEND else None
    num_api_servers = args.api_server_count
    assert num_api_servers > 0
    if rust_frontend_path and num_api_servers > 1:
        raise ValueError("VLLM_RUST_FRONTEND_PATH does not support api_server_count > 1")
    _listen_address, sock = setup_server(args, reuse_port=num_api_servers > 1)
    engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
    engine_args.create_engine_config(usage_context=None)
    sock.close()


def cmd_init():
    """vLLM 0.33.0 entrypoints/cli/serve.py `cmd_init`: the subcommands this module adds to `vllm`."""
    return [ServeSubcommand()]
