"""Hostile arguments to the check programs and `stacks drift` (review of issue 36, item 6): an unknown flag is named
even when a required argument is missing too; a path or a container name with control characters is refused with
exit 2 before anything runs, the value shown escaped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


PROGRAMS = [
    ("-m", "checks.api"), ("-m", "checks.collective"), ("-m", "checks.page_cache"), ("-m", "checks.pd"),
    ("-m", "checks.ray_cluster"), ("-m", "checks.weights"), ("-m", "checks.weights", "verify"),
    ("-m", "checks.weights_verify"), ("-m", "stacks", "drift"), ("-m", "stacks", "drift", "--json"),
]


@pytest.mark.parametrize("program", PROGRAMS, ids=[" ".join(p[1:]) for p in PROGRAMS])
def test_an_unknown_flag_is_named_beside_the_missing_argument(program: tuple[str, ...]) -> None:
    done = _run(*program, "--bogus-flag=sk-SECRETVALUE123")
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "the following arguments are required" in said and "unrecognized arguments: --bogus-flag" in said, said
    assert "SECRETVALUE123" not in said  # the value after `=` is never shown


def test_a_negative_number_and_a_known_flag_are_not_taken_for_unknown_ones() -> None:
    done = _run("-m", "checks.ray_cluster", "--gpus", "-1", "--json")
    assert done.returncode == 2 and "unrecognized" not in done.stdout + done.stderr, done.stdout + done.stderr


HOSTILE = [
    (("-m", "checks.page_cache", "--model-dir", "/tmp/x\x1b[31m\ny"), "--model-dir '/tmp/x\\x1b[31m\\ny'"),
    (("-m", "checks.page_cache", "--model-dir", "/tmp", "--engine", "a\x1bb"), "--engine 'a\\x1bb'"),
    (("-m", "checks.standin", "--control-file", "/tmp/a\nb"), "--control-file: holds control characters"),
    (("-m", "checks.standin", "--metrics-file", "/tmp/a\x1b[2Jb"), "--metrics-file: holds control characters"),
]


@pytest.mark.parametrize(("argv", "said"), HOSTILE, ids=["model-dir", "engine", "control-file", "metrics-file"])
def test_control_characters_are_refused_with_exit_2(argv: tuple[str, ...], said: str) -> None:
    done = _run(*argv)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and said in out, out
    assert "\x1b" not in out and "PASS" not in out and "FAIL" not in out, out
