"""`stacks diff` shows what a change does to memory per GPU and pinned host RAM, and what a secret rotation
replaces (from the stack files' encrypted values: no plan holds a secret). Real git commits, real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from review.git_base import secure_values
from tests.test_review_tools import GIT, diff, edit, make_repo

IMAGE_TAG = "tag: nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
OFFLOADING = "tag: v0.33.0\n    digest: sha256:" + "ab" * 32
"""An image whose vLLM keeps Engram tables in pinned host memory by default (stacks/planner/image_capabilities.py)."""
KEY_A = "  vllm-cluster:api_key:\n    secure: v1:AAAAAAAAAAAAAAAA:cmVkYWN0ZWQtb25l\n"
KEY_B = "  vllm-cluster:api_key:\n    secure: v1:BBBBBBBBBBBBBBBB:cmVkYWN0ZWQtdHdv\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def memory(repo: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--json"], cwd=repo, text=True,
                          capture_output=True, env={**os.environ, "VLLM_CLUSTER_ROOT": str(repo)}, timeout=120)
    assert done.returncode == 0, done.stderr
    value: dict[str, Any] = json.loads(done.stdout)["summary"]["memory"]
    return value


def test_an_image_bump_shows_memory_per_gpu_and_pinned_host_ram(repo: Path) -> None:
    before = memory(repo)
    edit(repo, "prod", (IMAGE_TAG, OFFLOADING))
    after = memory(repo)
    assert after["per_gpu_gb"] < before["per_gpu_gb"] and after["host_pinned_gb_per_node"] > 0, (before, after)
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    md = out.stdout
    assert "### Memory" in md
    assert (f"- memory per GPU (GB: weights + KV of one full-length sequence + reserve): `{before['per_gpu_gb']}` → "
            f"`{after['per_gpu_gb']}`") in md
    assert (f"- pinned host RAM per node (GB, Engram tables): `{before['host_pinned_gb_per_node']}` → "
            f"`{after['host_pinned_gb_per_node']}`") in md
    assert "- Engram tables in: `gpu` → `host`" in md
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    assert data["memory"]["per_gpu_gb"] == [before["per_gpu_gb"], after["per_gpu_gb"]]
    assert data["memory"]["node"] == ["node1", "node1"]
    assert data["secrets"] == []


def test_no_memory_section_when_memory_does_not_move(repo: Path) -> None:
    edit(repo, "prod", ("nccl_debug: INFO", "nccl_debug: WARN"))
    md = diff(repo, "prod", "--base", "HEAD~1").stdout
    assert "### Memory" not in md and "### Secrets" not in md


def test_an_api_key_rotation_replaces_the_whole_group(repo: Path) -> None:
    (repo / "Pulumi.prod.yaml").write_text((repo / "Pulumi.prod.yaml").read_text() + KEY_A)
    subprocess.run([*GIT, "commit", "-qam", "api key"], cwd=repo, check=True)
    edit(repo, "prod", (KEY_A, KEY_B))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    md = out.stdout
    assert "v1:AAAA" not in md and "v1:BBBB" not in md, "no ciphertext in the review"
    assert ("- `api_key` changed: if its value changed, `pulumi up` **replaces the whole engine group**") in md
    assert "- **Downtime:** the whole engine group (2 container(s)) is down about " in md
    assert "No change to what gets deployed" not in md
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    assert data["secrets"] == [{"key": "api_key", "change": "changed", "replaces": "engine-group"}]


def test_an_unchanged_secret_is_no_change(repo: Path) -> None:
    (repo / "Pulumi.prod.yaml").write_text((repo / "Pulumi.prod.yaml").read_text() + KEY_A)
    subprocess.run([*GIT, "commit", "-qam", "api key"], cwd=repo, check=True)
    edit(repo, "prod", ("max_num_seqs: 128", "max_num_seqs: 64"))
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    assert data["secrets"] == []


def test_secure_values_reads_nested_secrets_and_nothing_else() -> None:
    text = ("config:\n  vllm-cluster:api_key:\n    secure: v1:x\n  vllm-cluster:proxy_keys:\n    team-a:\n"
            "      secure: v1:y\n  vllm-cluster:serving:\n    port: 8000\n  other:thing:\n    secure: v1:z\n")
    assert secure_values(text) == {"api_key": "v1:x", "proxy_keys.team-a": "v1:y"}
    assert secure_values("config: [") == {}
