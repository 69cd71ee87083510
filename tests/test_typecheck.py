"""Mocks accept any input, so the SDKs' type hints are the guard: mypy must reject a wrong property or type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

BAD = '''
import pulumi_docker as docker

docker.ContainerArgs(image="x", shm_size="256g")
docker.ContainerArgs(image="x", gpu="all")
'''


def test_mypy_rejects_wrong_container_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "bad_program.py"
    bad.write_text(BAD)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout
    assert 'Argument "shm_size" to "ContainerArgs" has incompatible type "str"' in out.stdout
    assert 'Unexpected keyword argument "gpu"' in out.stdout
