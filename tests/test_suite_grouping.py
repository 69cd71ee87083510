"""The suite's own speed contract: under `make test` (pytest-xdist `--dist loadgroup`) a module-scoped fixture is
built once per run, on one worker, not once per worker. It broke silently once (pytest 9.2 no longer reads the
test id pytest-xdist 3.8 rewrites to group tests): every worker then computed the replacement matrix, about six
CPU-minutes of a run. This runs a small suite through tests/conftest.py's grouping hook in a child pytest and
counts how often its fixture was built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SUITE = '''
import os
import pytest

@pytest.fixture(scope="module")
def built_once():
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1

@pytest.mark.parametrize("n", range(8))
def test_uses_the_module_fixture(built_once, n):
    assert built_once == 1

@pytest.mark.parametrize("n", range(8))
def test_spread_freely(n):
    assert n >= 0
'''

CONFTEST = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401  (the hook under test)\n"


def test_a_module_fixture_is_built_once_under_loadgroup(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(SUITE)
    log = tmp_path / "built.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BUILT_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4", "--dist", "loadgroup",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 passed" in done.stdout, done.stdout
    workers = log.read_text().split()
    assert len(workers) == 1, f"the module fixture was built on {workers}: pytest-xdist did not group the tests " \
        "(is requirements-dev.txt's pinned pytest installed?)"
