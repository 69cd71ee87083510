"""Stand-in for vllm/entrypoints/cli/main.py: parse `vllm serve …`, validate, then dispatch.

Mirrors vLLM 0.33.0 entrypoints/cli/main.py lines 103-119: parse, `cmd.validate(args)` for the chosen
subcommand, then the dispatch function.
"""

import argparse
import sys

from vllm.entrypoints.cli import serve


def main():
    parser = argparse.ArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = serve.ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args(sys.argv[1:])
    if args.subparser == command.name:
        command.validate(args)
    if hasattr(args, "dispatch_function"):
        args.dispatch_function(args)
    else:
        parser.print_help()
