"""The benches' documented recipes run as written: the sync bench's tmpfs recipe names a directory the sync
accepts, and both benches refuse fewer than 5 runs (a median of fewer says little)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from checks.weights import check_sync_dest
from stacks.model.s3_source import CannotRun
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "weights.md").read_text()


def _bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_documented_tmpfs_recipe_names_a_dest_the_sync_accepts() -> None:
    mount = re.search(r"mount -t tmpfs -o size=\S+ tmpfs (/\S+)", DOC)
    bench = re.search(r"bench/sync_throughput\.py .*--dest-root (/\S+)", DOC)
    assert mount and bench, "docs/weights.md gives the mount and the bench command"
    assert mount.group(1) == bench.group(1)
    for tool in ("ours", "aws", "s5cmd"):  # the bench writes each tool's run into <dest-root>/<tool>
        assert check_sync_dest(f"{bench.group(1)}/{tool}") == f"{bench.group(1)}/{tool}"
    with pytest.raises(CannotRun, match="kernel file system"):
        check_sync_dest("/dev/shm/ours")


def test_the_sync_bench_refuses_dev_shm_with_the_recipe_and_fewer_than_5_runs() -> None:
    done = _bench("sync_throughput.py", "--dest-root", "/dev/shm/wbench")
    assert done.returncode == 2 and "mount -t tmpfs" in done.stderr, done.stderr
    done = _bench("sync_throughput.py", "--runs", "3")
    assert done.returncode == 2 and "at least 5" in done.stderr, done.stderr


def test_the_hash_bench_refuses_fewer_than_5_runs() -> None:
    done = _bench("hash_throughput.py", "--runs", "2")
    assert done.returncode == 2 and "at least 5" in done.stderr, done.stderr
