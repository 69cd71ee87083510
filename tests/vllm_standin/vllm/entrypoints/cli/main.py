"""Stand-in for vllm.entrypoints.cli.main: parse `vllm serve …`, then dispatch, as the real CLI does."""

import argparse

from vllm.entrypoints.cli import serve


def main():
    parser = argparse.ArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    command = serve.ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args()
    args.dispatch_function(args)
