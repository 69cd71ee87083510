"""Rollback: a realistic `pulumi stack history --json`, the choice of image, and the comment-keeping rewrite."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from pulumi.automation._stack import _DATETIME_FORMAT, UpdateSummary

from stacks.config import ImageConfig
from stacks.rollback import RollbackError, choose, current_image, past_images, rewrite_image
from tests.conftest import ROOT

HISTORY = ROOT / "tests" / "fixtures" / "pulumi" / "stack-history-prod.json"
NEW = "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
OLD = "vllm/vllm-openai:nightly-7a1c9e2f4b6d8a0c1e3f5b7d9a2c4e6f8b0d2a4c@sha256:" + "3f" * 32


def history() -> list[dict]:  # type: ignore[type-arg]
    return json.loads(HISTORY.read_text())


def test_the_sample_parses_with_pulumis_own_history_reader() -> None:
    """The fixture is in the shape Pulumi's automation API reads from `pulumi stack history --json`."""
    for item in history():
        summary = UpdateSummary(
            kind=item["kind"], start_time=datetime.strptime(item["startTime"], _DATETIME_FORMAT),
            message=item["message"], environment=item["environment"], config=item["config"],
            result=item["result"], end_time=datetime.strptime(item["endTime"], _DATETIME_FORMAT),
            version=item["version"], resource_changes=item["resourceChanges"])
        if "vllm-cluster:api_key" in item["config"]:
            assert summary.config["vllm-cluster:api_key"].value == "[secret]"


def test_past_images_are_successful_updates_newest_first() -> None:
    images = past_images(history())
    assert [p.version for p in images] == [7, 4, 3]  # refresh, failed update, image-less update: skipped
    assert images[1].image.pull_ref == OLD and images[1].commit == "5b3d1f7e9a2c4e6a8b0d2f4a6c8e0b2d4f6a8c0e"
    assert images[2].image.tag == "deepseekv41-flash-0909"  # the string form of the image key


def test_choose_previous_tag_and_digest() -> None:
    images = past_images(history())
    current = ImageConfig.model_validate(NEW)
    assert choose(images, current).image.pull_ref == OLD  # not the failed v5 image
    assert choose(images, current, "deepseekv41-flash-0909").version == 3
    assert choose(images, current, "sha256:" + "3f" * 32).version == 4
    with pytest.raises(RollbackError, match=r"no successful update .* ran tag nightly-1b2c"):
        choose(images, current, "nightly-1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c")  # it only ever failed
    with pytest.raises(RollbackError, match="already has"):
        choose(images, ImageConfig.model_validate(OLD), "sha256:" + "3f" * 32)


def test_rewrite_changes_only_the_image_lines_and_keeps_comments() -> None:
    for stack in ("prod", "h20"):
        text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
        new = rewrite_image(text, ImageConfig.model_validate(OLD))
        changed = [line for line in difflib.unified_diff(text.splitlines(), new.splitlines(), lineterm="", n=0)
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert all("tag:" in line or "digest:" in line for line in changed), changed
        assert current_image(new).pull_ref == OLD
        assert [c for c in text.splitlines() if "#" in c] == [c for c in new.splitlines() if "#" in c]
        back = rewrite_image(new, ImageConfig.model_validate(current_image(text).pull_ref))
        assert back == text  # rolling forward again restores the file byte for byte


def test_string_form_image_stays_a_string() -> None:
    text = "config:\n  vllm-cluster:image: vllm/vllm-openai:v0.33.0   # pinned below\n  vllm-cluster:vision: false\n"
    new = rewrite_image(text, ImageConfig.model_validate(OLD))
    first, second = new.splitlines()[1:3]
    assert first.startswith(f"  vllm-cluster:image: {OLD} ") and first.endswith("# pinned below")  # comment kept
    assert second == "  vllm-cluster:vision: false"


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "VLLM_CLUSTER_ROOT": str(root), "PATH": "/usr/bin:/bin"})


def test_cli_rewrites_the_stack_file_and_prints_the_commands(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    out = _cli(tmp_path, "rollback", "prod", "--history", str(HISTORY))
    assert out.returncode == 0, out.stderr
    assert f"-> {OLD}" in out.stdout and "update 4 of 2026-11-28T08:15:37.000Z, commit 5b3d1f7e9a2c" in out.stdout
    assert "pulumi preview -s prod --diff" in out.stdout and "pulumi up -s prod" in out.stdout
    assert current_image((tmp_path / "Pulumi.prod.yaml").read_text()).pull_ref == OLD
    plan = _cli(tmp_path, "plan", "prod")
    assert plan.returncode == 0 and "digest sha256:3f3f" in plan.stdout
    dry = _cli(tmp_path, "rollback", "prod", "--history", str(HISTORY), "--to", "deepseekv41-flash-0909", "--dry-run")
    assert dry.returncode == 0 and "--dry-run: Pulumi.prod.yaml not changed" in dry.stdout
    assert current_image((tmp_path / "Pulumi.prod.yaml").read_text()).pull_ref == OLD


def test_cli_refuses_a_target_the_current_config_cannot_run(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Pulumi.h20.yaml", tmp_path)
    before = (tmp_path / "Pulumi.h20.yaml").read_text()
    out = _cli(tmp_path, "rollback", "h20", "--history", str(HISTORY), "--to", "deepseekv41-flash-0909")
    assert out.returncode == 2 and "was not changed" in out.stderr and "cannot run deepseek-v4-flash" in out.stderr
    assert (tmp_path / "Pulumi.h20.yaml").read_text() == before


def test_cli_without_history_or_pulumi_says_what_to_run(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    out = _cli(tmp_path, "rollback", "prod")
    assert out.returncode == 2 and "pulumi stack history --json -s prod > history.json" in out.stderr
    (tmp_path / "h.json").write_text("{not json")
    bad = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "h.json"))
    assert bad.returncode == 2 and "not JSON" in bad.stderr
    missing = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read the history file" in missing.stderr
    nostack = _cli(tmp_path, "rollback", "staging", "--history", str(HISTORY))
    assert nostack.returncode == 2 and "no Pulumi.staging.yaml" in nostack.stderr


def test_cli_reads_the_history_from_the_pulumi_cli_when_no_file_is_given(tmp_path: Path) -> None:
    """A stand-in `pulumi` on PATH records its argv and prints the sample: the command is exactly
    `pulumi stack history --json -s <stack>`, run in the project directory."""
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pulumi"
    fake.write_text(f"#!/bin/sh\necho \"$PWD $*\" > {tmp_path / 'argv'}\ncat {HISTORY}\n")
    fake.chmod(0o755)
    out = subprocess.run([sys.executable, "-m", "stacks", "rollback", "prod", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "argv").read_text().strip() == f"{tmp_path} stack history --json -s prod"
    assert f"-> {OLD}" in out.stdout
