"""How fast a bad config gets its answer: every case of the bad-config table (tests/test_bad_configs.py) through
parse + validate in process, and the worst file-level cases (alias bomb, 5 MiB file, deep nesting) through the
real CLI, as a user runs it. Prints a Markdown table for docs/speed.md."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stacks.model.errors import ConfigError  # noqa: E402
from stacks.model.loader import parse_config  # noqa: E402
from stacks.model.stack_file import parse_stack_text  # noqa: E402
from stacks.planner.plan import build_plan  # noqa: E402
from tests.test_bad_configs import TEXT, TEXT_CASES, VALUE_CASES, _mutated  # noqa: E402


def _answer_ms(run: object) -> float:
    start = time.perf_counter()
    try:
        run()  # type: ignore[operator]
    except ConfigError:
        pass
    else:
        raise SystemExit("a bad config was accepted")
    return (time.perf_counter() - start) * 1000


def main() -> None:
    value_ms = [_answer_ms(lambda s=s, c=c: build_plan("t", parse_config("t", _mutated(s, c))))
                for _, s, c, _ in VALUE_CASES]
    text_ms = [_answer_ms(lambda s=s, t=t: build_plan(s, parse_config(s, parse_stack_text(t(TEXT[s]), "x").values)))
               for _, s, t, _ in TEXT_CASES]
    print("| cases | median (ms) | max (ms) |\n|---|---:|---:|")
    for name, ms in (("value cases (in process)", value_ms), ("file cases (in process)", text_ms)):
        print(f"| {len(ms)} {name} | {statistics.median(ms):.1f} | {max(ms):.1f} |")
    bomb = ("config:\n  vllm-cluster:x: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"  vllm-cluster:y{i}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
        f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n" for i in range(9)))
    files = {"alias bomb (9 levels x 9)": bomb,
             "5 MiB file": (ROOT / "Pulumi.prod.yaml").read_text() + "#" * (5 * 1024 * 1024),
             "nesting 200 deep": (ROOT / "Pulumi.prod.yaml").read_text() + "  vllm-cluster:x: " + "[" * 200
             + "]" * 200 + "\n"}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / "Pulumi.bad.yaml").write_text(text)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "stacks", "plan", "bad"], cwd=ROOT, capture_output=True,
                                  text=True, env={**os.environ, "VLLM_CLUSTER_ROOT": tmp})
            elapsed = (time.perf_counter() - start) * 1000
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            print(f"| CLI: {name}, exit {done.returncode} | {elapsed:.0f} | {elapsed:.0f} |")


if __name__ == "__main__":
    main()
