"""The argument dry run on a real vLLM and on the test stand-in, side by side: verdict, agreement and time.

    VLLM_PYTHON=/path/to/venv-with-vllm/bin/python venv/bin/python bench/dry_run_real_vllm.py
    VLLM_PYTHON=… venv/bin/python bench/dry_run_real_vllm.py --capture   # rewrite the stand-in's fixtures

Every case runs the exact script the program ships (`checks.bundle.remote_script("vllm_args")`) with the
exact arguments and container env of `components.check_commands.dry_run_command`, swapping only
`docker run … <image>` for an interpreter with VLLM_TARGET_DEVICE=cpu (as the command sets): the real vLLM
(VLLM_PYTHON) and this interpreter with tests/vllm_standin first on the path. Cases: every node of the
committed stacks (must pass), and argv that `vllm serve` rejects before loading anything (must fail with the
same message on both). `--capture` dumps, from the real package, the serve flag table with defaults and the
tool/reasoning parser registries into tests/fixtures (the stand-in builds its parser from them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checks.bundle import remote_script
from components.check_commands import dry_run_command
from stacks.model.loader import load_stack
from stacks.planner.plan import build_plan

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "fixtures"
STANDIN = {"PYTHONPATH": str(ROOT / "tests" / "vllm_standin"),
           "VLLM_STANDIN_FLAGS": str(DATA / "vllm-0.33.0-serve-flags.json"),
           "VLLM_STANDIN_REGISTRIES": str(DATA / "vllm-0.33.0-registries.json")}
"""What tests/docker_harness.py puts into the test images, here as the environment of this interpreter."""
UNKNOWN_TOOL_PARSER = "deepseek_v5"


@dataclass(frozen=True)
class Case:
    label: str
    env: dict[str, str]
    args: list[str]
    expect_pass: bool


def _split(command: str) -> tuple[dict[str, str], list[str]]:
    """(container env, script arguments) of a dry-run command: `… docker run … -e K=V … IMAGE - ARGS <<'EOF'`."""
    words = shlex.split(command.split("\n", 1)[0].rsplit(" <<", 1)[0])
    dash = words.index("-")
    env = dict(words[i + 1].split("=", 1) for i in range(dash) if words[i] == "-e")
    return env, words[dash + 1:]


def _edit(args: list[str], change: Callable[[list[str]], list[str]]) -> list[str]:
    split = args.index("--")
    return args[:split + 1] + change(args[split + 1:])


def _replace_value(flag: str, value: str) -> Callable[[list[str]], list[str]]:
    def change(argv: list[str]) -> list[str]:
        out = list(argv)
        out[out.index(flag) + 1] = value
        return out
    return change


def cases() -> list[Case]:
    out: list[Case] = []
    for stack in ("prod", "h20"):
        config = load_stack(stack)
        plan = build_plan(stack, config)
        for check in (c for c in plan.checks if c.module == "checks.vllm_args"):
            env, args = _split(dry_run_command(config, plan, check))
            node = plan.node(str(check.node))
            out.append(Case(f"{stack} {node.name} ({node.role}), as planned", env, args, True))
            if stack != "prod":
                continue
            if node.role == "headless-engine":
                out.append(Case(f"{stack} {node.name} + `--api-server-count 2`", env,
                                _edit(args, lambda a: [*a, "--api-server-count", "2"]), False))
                out.append(Case(f"{stack} {node.name} + `--data-parallel-rank 1`", env,
                                _edit(args, lambda a: [*a, "--data-parallel-rank", "1"]), False))
            else:
                out.append(Case(f"{stack} {node.name} `--tool-call-parser {UNKNOWN_TOOL_PARSER}`", env,
                                _edit(args, _replace_value("--tool-call-parser", UNKNOWN_TOOL_PARSER)), False))
                out.append(Case(f"{stack} {node.name} `--reasoning-parser {UNKNOWN_TOOL_PARSER}`", env,
                                _edit(args, _replace_value("--reasoning-parser", UNKNOWN_TOOL_PARSER)), False))
                out.append(Case(f"{stack} {node.name} + `--made-up-flag`", env,
                                _edit(args, lambda a: [*a, "--made-up-flag"]), False))
    return out


def run(python: str, case: Case, extra_env: dict[str, str]) -> tuple[int, float, dict[str, object]]:
    env = {**os.environ, **case.env, **extra_env, "VLLM_TARGET_DEVICE": "cpu"}
    split = case.args.index("--") if "--" in case.args else len(case.args)
    start = time.monotonic()
    done = subprocess.run([python, "-", *case.args[:split], "--json", *case.args[split:]],
                          input=remote_script("vllm_args"), capture_output=True, text=True, env=env, timeout=600)
    seconds = time.monotonic() - start
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {"summary": done.stderr[-300:]}
    except json.JSONDecodeError:
        verdict = {"summary": lines[-1][:300]}
    return done.returncode, seconds, verdict


CAPTURE = r'''
import json, sys
out_dir = sys.argv[1]
from vllm.entrypoints.cli import serve
seen = {}
original = serve.ServeSubcommand.subparser_init
def capture(self, subparsers):
    seen["parser"] = original(self, subparsers)
    return seen["parser"]
serve.ServeSubcommand.subparser_init = capture
serve.ServeSubcommand.cmd = staticmethod(lambda args: None)
serve.ServeSubcommand.validate = lambda self, args: None
from vllm.entrypoints.cli import main
sys.argv = ["vllm", "serve", "m"]
main.main()
def plain(value):
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False
flags = []
for a in seen["parser"]._actions:
    if not a.option_strings:
        row = {"positional": a.dest, "nargs": a.nargs}
    else:
        row = {"options": a.option_strings, "dest": a.dest, "takes_value": a.nargs != 0, "nargs": a.nargs,
               "type": getattr(a.type, "__name__", None) if a.type else None,
               "choices": list(a.choices) if a.choices and plain(list(a.choices)) else None}
    if plain(a.default):
        row["default"] = a.default
    flags.append(row)
import vllm
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
version = vllm.__version__
origin = f"vLLM {version} from PyPI (pip install vllm=={version}), VLLM_TARGET_DEVICE=cpu, no GPU; "
json.dump({"origin": origin + "the `vllm serve` subparser's actions with their defaults (a default that is not "
           "JSON, e.g. a config dataclass, is left out), dumped by `bench/dry_run_real_vllm.py --capture`",
           "vllm_version": version, "flags": flags},
          open(f"{out_dir}/vllm-{version}-serve-flags.json", "w"), indent=1)
json.dump({"origin": origin + "ToolParserManager.list_registered() and ReasoningParserManager.list_registered(), "
           "dumped by `bench/dry_run_real_vllm.py --capture`", "vllm_version": version,
           "tool_parsers": ToolParserManager.list_registered(),
           "reasoning_parsers": ReasoningParserManager.list_registered()},
          open(f"{out_dir}/vllm-{version}-registries.json", "w"), indent=1)
print(f"wrote {out_dir}/vllm-{version}-serve-flags.json and vllm-{version}-registries.json")
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", action="store_true", help="rewrite the stand-in's fixtures from VLLM_PYTHON")
    args = parser.parse_args()
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        print("set VLLM_PYTHON to an interpreter that imports vllm", file=sys.stderr)
        return 2
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    if args.capture:
        done = subprocess.run([python, "-c", CAPTURE, str(DATA)], env=env, capture_output=True, text=True)
        print(done.stdout.strip() or done.stderr[-2000:])
        return done.returncode
    version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                             env=env).stdout.strip().splitlines()[-1:]
    print(f"real: vLLM {version[0] if version else '?'} at {python}; stand-in: {sys.executable} + tests/vllm_standin\n")
    print("| argv | expected | real vLLM exit | real s | stand-in exit | stand-in s | agree | real vLLM's verdict |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    disagreements = 0
    for case in cases():
        real_rc, real_s, real = run(python, case, {})
        stand_rc, stand_s, stand = run(sys.executable, case, STANDIN)
        agree = real_rc == stand_rc and (real_rc == 0 or real.get("evidence") == stand.get("evidence"))
        expected_ok = (real_rc == 0) == case.expect_pass
        disagreements += (not agree) + (not expected_ok)
        evidence = real.get("evidence")
        text = str(real.get("summary", "")) + (" | " + "; ".join(str(e) for e in evidence)[:220]
                                                if isinstance(evidence, list) and evidence else "")
        print(f"| {case.label} | {'pass' if case.expect_pass else 'fail'} | {real_rc} | {real_s:.1f} | {stand_rc} | "
              f"{stand_s:.2f} | {'yes' if agree else 'NO'} | {text.replace('|', '/')[:300]} |")
        if not agree:
            print(f"<!-- stand-in said: {json.dumps(stand)[:600]} -->")
    print(f"\n{disagreements} disagreement(s) or unexpected verdict(s)")
    return 1 if disagreements else 0


if __name__ == "__main__":
    raise SystemExit(main())
