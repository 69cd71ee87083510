"""PR review: `stacks diff` on a temp git repository with real commits, and `stacks preview-summary` on a
realistic `pulumi preview --json` (the shape of Pulumi's preview digest)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.preview_summary import summarize, to_markdown
from tests.conftest import ROOT

PREVIEW = ROOT / "tests" / "fixtures" / "pulumi" / "preview-image-change-prod.json"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """This project's planner and stack files, committed once as the base."""
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks", ignore=shutil.ignore_patterns("__pycache__"))
    for stack in ("prod", "h20"):
        shutil.copy(ROOT / f"Pulumi.{stack}.yaml", tmp_path)
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    return tmp_path


def edit(repo: Path, stack: str, *replacements: tuple[str, str], commit: bool = True) -> None:
    path = repo / f"Pulumi.{stack}.yaml"
    text = path.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)
    if commit:
        subprocess.run([*GIT, "commit", "-qam", "change"], cwd=repo, check=True)


def diff(repo: Path, stack: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", "diff", stack, *args], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "VLLM_CLUSTER_ROOT": str(repo)})


def test_image_argv_and_env_changes_and_the_replaced_group(repo: Path) -> None:
    edit(repo, "prod", ("tag: nightly-eed1f3d0c6043bd494424a22443ee198dd56f657",
                        "tag: v0.33.0\n    digest: sha256:" + "ab" * 32),
         ("max_num_seqs: 128", "max_num_seqs: 64"), ("nccl_debug: INFO", "nccl_debug: WARN"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    md = out.stdout
    assert "## `prod`: plan at `HEAD~1` → working tree" in md
    assert "- tag: `nightly-eed1f3d0c6043bd494424a22443ee198dd56f657` → `v0.33.0`" in md
    assert "- digest: – → `sha256:" in md
    assert "argv `--max-num-seqs`: `128` → `64`" in md
    assert "env `NCCL_DEBUG`: `INFO` → `WARN`" in md
    assert "- `engine-node1-deepseek-v41-flash`\n- `engine-node2-deepseek-v41-flash`\n" in md
    assert "- `node1-image` (pull)" in md and "planned by the code at HEAD~1" in md
    assert "### Topology" not in md  # nothing about parallelism changed
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    assert data["containers"]["engine-node2-deepseek-v41-flash"]["argv"]["--max-num-seqs"] == ["128", "64"]
    assert data["replaced"] == ["engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"]


def test_topology_change_and_an_invalid_result_are_shown_with_the_rules(repo: Path) -> None:
    edit(repo, "h20", ("pipeline: 2", "pipeline: 1"), ("tensor: 8", "tensor: 16"))
    out = diff(repo, "h20", "--base", "main~1")
    assert out.returncode == 1  # the change does not validate
    assert "**Validation (base):** valid" in out.stdout
    assert "**Validation (this change):** INVALID, 1 problem(s):" in out.stdout
    assert "`vllm-cluster:parallelism.tensor` = `16`: FlashMLA gets n_local_groups" in out.stdout


def test_valid_topology_change_lists_tensor_and_ranks(repo: Path) -> None:
    """prod on one node more (3 x 8 H100, DP3): node3 appears, data 2 → 3, EP 16 → 24, node argv moves."""
    text = (repo / "Pulumi.prod.yaml").read_text()
    head_block = text[text.index("    - name: node2"):text.index("  vllm-cluster:fabric:")]
    node3 = head_block.replace("node2", "node3").replace("10.30.8.2", "10.30.8.3").replace("1.1.1.1", "1.1.1.3") \
        .replace("1.1.2.1", "1.1.2.3")
    edit(repo, "prod", (head_block, head_block + node3), ("data: 2", "data: 3"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "- data: `2` → `3`" in out.stdout and "- expert: `16` → `24`" in out.stdout
    assert "- added `node3`" in out.stdout and "`engine-node3-deepseek-v41-flash`: created" in out.stdout
    assert "argv `--data-parallel-size`: `2` → `3`" in out.stdout


def test_no_change_and_a_new_stack(repo: Path) -> None:
    out = diff(repo, "prod", "--base", "HEAD")
    assert out.returncode == 0 and "No change to what gets deployed." in out.stdout
    shutil.copy(repo / "Pulumi.prod.yaml", repo / "Pulumi.staging.yaml")
    new = diff(repo, "staging", "--base", "HEAD")
    assert new.returncode == 2 and "HEAD has no Pulumi.staging.yaml: the stack is new" in new.stderr


def test_a_code_change_in_the_planner_shows_up_as_an_argv_change(repo: Path) -> None:
    """The base plan comes from the base's code: a launch.py edit is reviewed like a stack file edit."""
    launch = repo / "stacks" / "launch.py"
    text = launch.read_text()
    assert '"--max-num-seqs", str(serving.max_num_seqs)' in text
    launch.write_text(text.replace('"--max-num-seqs", str(serving.max_num_seqs)',
                                   '"--max-num-seqs", str(serving.max_num_seqs * 2)'))
    out = diff(repo, "prod", "--base", "HEAD")
    assert "argv `--max-num-seqs`: `128` → `256`" in out.stdout


def test_preview_summary_of_an_image_change() -> None:
    out = subprocess.run([sys.executable, "-m", "stacks", "preview-summary", str(PREVIEW)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    md = out.stdout
    assert md.startswith("## `pulumi preview`: 10 to replace, 1 to create (4 unchanged)")
    assert "- `image`: `vllm/vllm-openai:nightly-7a1c" in md and "→ `vllm/vllm-openai:nightly-eed1f3d0" in md
    assert ("| `engine-node1-deepseek-v41-flash` | `docker:index/container:Container` | `image`, `labels[4].value` "
            "| – |") in md
    assert "| `node2-preflight` | `command:remote:Command` | `triggers[0]` | `create` |" in md
    assert "| `api-smoke` | `command:local:Command` | `triggers` | – |" in md  # from replaceReasons (no detail)
    assert "node1-docker" not in md and "fabric-node1-fabric-preflight" not in md  # unchanged: not listed
    assert "[secret]" not in md and "`engine`" not in md  # values and output-only component updates stay out


def test_preview_summary_topology_and_json() -> None:
    preview: dict[str, Any] = json.loads(PREVIEW.read_text())
    changed = copy.deepcopy(preview)
    stack = changed["steps"][0]
    stack["newState"]["outputs"]["topology"] = stack["newState"]["outputs"]["topology"] | {"tensor": 16, "data": 1}
    summary = summarize(changed)
    assert summary["counts"] == {"replace": 10, "update": 0, "create": 1, "delete": 0}
    assert "- `topology`: tensor: `8` → `16`; data: `2` → `1`" in to_markdown(summary)
    assert summarize({"steps": []})["counts"] == {"replace": 0, "update": 0, "create": 0, "delete": 0}
    assert to_markdown(summarize({"steps": []})).startswith("## `pulumi preview`: no changes (0 unchanged)")
    bad = subprocess.run([sys.executable, "-m", "stacks", "preview-summary", "-"], cwd=ROOT, input="not json",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "pulumi preview --json > FILE" in bad.stderr
    wrong = subprocess.run([sys.executable, "-m", "stacks", "preview-summary", "-"], cwd=ROOT, input="[1, 2]",
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "not a preview digest" in wrong.stderr


def test_a_base_that_cannot_plan_is_planned_by_the_working_trees_code(repo: Path) -> None:
    main = repo / "stacks" / "__main__.py"
    good = main.read_text()
    main.write_text('raise SystemExit("this old revision has no plan --json")\n')
    subprocess.run([*GIT, "commit", "-qam", "an old planner"], cwd=repo, check=True)
    main.write_text(good)
    edit(repo, "prod", ("max_num_seqs: 128", "max_num_seqs: 96"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    assert "the stack file at HEAD~1, planned by the working tree's code" in out.stdout
    assert "this old revision has no plan --json" in out.stdout
    assert "argv `--max-num-seqs`: `128` → `96`" in out.stdout
