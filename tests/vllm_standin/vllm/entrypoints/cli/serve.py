"""Stand-in for vllm.entrypoints.cli.serve: the serve subparser built from the captured flag table."""

import json
import os

import vllm

_HERE = os.path.dirname(os.path.abspath(vllm.__file__))
_TYPES = {"int": int, "float": float}


def _table():
    local = os.path.join(_HERE, "_flags.json")
    path = local if os.path.exists(local) else os.environ["VLLM_STANDIN_FLAGS"]
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    vllm.__version__ = data.get("vllm_version", vllm.__version__)
    return data["flags"]


class ServeSubcommand:
    name = "serve"

    @staticmethod
    def cmd(args):
        raise SystemExit("the stand-in cannot serve")

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser("serve")
        for flag in _table():
            if "positional" in flag:
                parser.add_argument(flag["positional"], nargs="?")
                continue
            options = [o for o in flag["options"] if o != "-h" and o != "--help"]
            if not options:
                continue
            if flag["takes_value"]:
                nargs = flag["nargs"] if flag["nargs"] in ("+", "*", "?") else None
                parser.add_argument(*options, dest=flag["dest"], nargs=nargs, type=_TYPES.get(flag["type"] or "", str))
            else:
                parser.add_argument(*options, dest=flag["dest"], action="store_true")
        return parser
