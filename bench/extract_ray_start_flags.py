"""`ray start`'s options as data, in the format of `tests/fixtures/vllm-<v>-serve-flags.json`, for the policy pack.

    venv/bin/python bench/extract_ray_start_flags.py   # -> stacks/planner/data/ray-<version>-start-flags.json

Read from the installed Ray's click command (`ray/scripts/scripts.py` `start`): every option string, its
destination, whether it takes a value. The policy reads `ray start` argv with `stacks.planner.serve_options.read_argv`
against this table instead of matching words.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import ray
import ray.scripts.scripts as scripts

OUT = Path(__file__).resolve().parent.parent / "stacks" / "planner" / "data"


def main() -> int:
    flags = []
    for param in scripts.start.params:
        if not isinstance(param, click.Option):
            continue
        choices = list(param.type.choices) if isinstance(param.type, click.Choice) else None
        flags.append({"options": [*param.opts, *param.secondary_opts], "dest": param.name,
                      "takes_value": not param.is_flag and not param.count, "nargs": None if param.nargs == 1
                      else str(param.nargs), "choices": choices})
    data = {"origin": f"Ray {ray.__version__} (pip), the click command ray.scripts.scripts.start, dumped by "
                      "bench/extract_ray_start_flags.py", "vllm_version": f"ray-{ray.__version__}", "flags": flags}
    target = OUT / f"ray-{ray.__version__}-start-flags.json"
    target.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {target}: {len(flags)} options")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
