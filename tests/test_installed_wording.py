"""The installed tool speaks to its user, not to a developer of this checkout: no `make plan`, `SECRETS=…`,
`venv/bin/python -m stacks` or `python -m stacks` in what `vllm-cluster` prints (issue 35 g). The installed layout
is laid out as the wheel has it (the packages, the cards and examples under vllm_cluster/data, no pyproject.toml)
without building it; tests/test_wheel.py builds and installs the real wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("stacks", "components", "review", "heal", "checks", "policy", "vllm_cluster")
DEVELOPER_WORDS = ("make plan", "make venv", "SECRETS=", "venv/bin/python -m stacks", "python -m stacks",
                   "this checkout")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__", "venv"))
    for data in ("models", "images", "examples"):
        shutil.copytree(ROOT / data, site / "vllm_cluster" / "data" / data)
    return site


def tool(site: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("VLLM_CLUSTER_ROOT", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "vllm_cluster", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**clean, "PYTHONPATH": str(site)})


def test_the_installed_tools_messages_name_the_installed_command(site: Path, tmp_path: Path) -> None:
    assert tool(site, "init", "clusters", cwd=tmp_path).returncode == 0
    project = tmp_path / "clusters"
    said = []
    plan = tool(site, "plan", "two-node", cwd=project)
    assert plan.returncode == 0, plan.stderr
    assert "vllm-cluster watch-unit two-node" in plan.stdout  # the plan's note: the installed command
    said.append(plan.stdout + plan.stderr)
    secrets = tool(site, "plan", "two-node", "--set", "api.proxy.enabled=true", "--set", "serving.host=127.0.0.1",
                   cwd=project)
    assert secrets.returncode == 2 and "--assume-secret api_key" in secrets.stderr, secrets.stderr
    said.append(secrets.stderr)
    dry = tool(site, "restart-group", "two-node", cwd=project)
    assert dry.returncode == 0 and "To act: vllm-cluster restart-group two-node --yes" in dry.stdout, dry.stderr
    said.append(dry.stdout + dry.stderr)
    conf = tool(site, "nginx-conf", "two-node", cwd=project)
    assert conf.returncode == 2 and "vllm-cluster nginx-conf two-node" in conf.stderr
    said.append(conf.stderr)
    for text in said:
        assert not [w for w in DEVELOPER_WORDS if w in text], text
