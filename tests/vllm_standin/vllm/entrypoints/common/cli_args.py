"""Stand-in for vllm/entrypoints/common/cli_args.py: the serve argument checks that run before any engine.

Mirrored from vLLM 0.33.0 entrypoints/common/cli_args.py:
- `validate_parsed_serve_args` lines 535-536 (other subcommands skip it) and 553-556 (auto tool choice needs a
  tool call parser; output logging needs request logging). Its chat template, gRPC port, reasoning effort
  map, keep-alive, per-request metrics and multi-port checks (lines 538-551, 558-578) are not reproduced.
- `validate_api_server_args` lines 615-623 (the tool call parser name). Lines 625-632 check the reasoning
  parser inside `--structured-outputs-config`, which the stand-in parses as a plain string: not reproduced.
"""

from vllm.tool_parsers import ToolParserManager


def validate_parsed_serve_args(args):
    if hasattr(args, "subparser") and args.subparser not in ("serve", "launch"):
        return
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_log_outputs and not args.enable_log_requests:
        raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")


def validate_api_server_args(args):
    valid_tool_parses = ToolParserManager.list_registered()
    if args.enable_auto_tool_choice and args.tool_call_parser not in valid_tool_parses:
        raise KeyError(
            f"invalid tool call parser: {args.tool_call_parser} "
            f"(chose from {{ {','.join(valid_tool_parses)} }})")
