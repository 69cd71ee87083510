"""Rollback: a `pulumi stack history --json` in the CLI's own shape, read page by page through a stand-in
`pulumi` that pages as Pulumi's diy backend does; the history matched to its stack; the choice of image by
prefix; the capability check of the target; and the comment-keeping rewrite."""

from __future__ import annotations

import copy
import difflib
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pulumi.automation._stack import _DATETIME_FORMAT, UpdateSummary

from review.rollback import (
    History,
    RollbackError,
    check_same_stack,
    choose,
    current_image,
    past_images,
    read_pages,
    rewrite_image,
)
from stacks.model.config import ImageConfig
from stacks.model.loader import read_stack_values
from tests.conftest import ROOT

HISTORY = ROOT / "tests" / "fixtures" / "pulumi" / "stack-history-prod.json"
NEW = "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
C7A1C = "vllm/vllm-openai:nightly-7a1c9e2f4b6d8a0c1e3f5b7d9a2c4e6f8b0d2a4c@sha256:" + "3f" * 32
C7A1D = "vllm/vllm-openai:nightly-7a1d0b3c5e7f9a1b3d5f7a9c1e3b5d7f9a1c3e5b@sha256:" + "4e" * 32
OLD = "vllm/vllm-openai:deepseekv41-flash-0909"


def history() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(HISTORY.read_text())
    return data


def history_of(stack: str) -> list[dict[str, Any]]:
    """The prod sample as another stack's would look: the same updates, that stack's nodes."""
    nodes = read_stack_values(stack)["nodes"]
    out = copy.deepcopy(history())
    for update in out:
        if "vllm-cluster:nodes" in update["config"]:
            update["config"]["vllm-cluster:nodes"] = {"value": json.dumps(nodes, separators=(",", ":")),
                                                      "objectValue": nodes, "secret": False}
    return out


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


def test_the_sample_has_the_fields_the_cli_prints() -> None:
    """pkg/cmd/pulumi/stack/stack_history.go: updateInfoJSON and configValueJSON {value, objectValue, secret}."""
    for item in history():
        assert set(item) <= {"version", "kind", "startTime", "message", "environment", "config", "result",
                             "endTime", "resourceChanges"}
        for value in item["config"].values():
            assert set(value) <= {"value", "objectValue", "secret"}
            assert ("value" in value) != value["secret"]
            if "objectValue" in value:
                assert json.loads(value["value"]) == value["objectValue"]


def test_past_images_are_successful_updates_newest_first() -> None:
    images = past_images(history())
    assert [p.version for p in images] == [24, *range(21, 2, -1)]  # refresh 23, failed 22, image-less 2, 1: out
    assert images[1].image.pull_ref == C7A1C and images[1].commit
    assert images[-1].image.pull_ref == OLD  # the string form of the image key


def test_choose_previous_and_unique_prefixes() -> None:
    images = past_images(history())
    current = ImageConfig.model_validate(NEW)
    assert choose(images, current).image.pull_ref == C7A1C  # not the failed v22 image
    assert choose(images, current).version == 21  # the newest update that ran it
    assert choose(images, current, "nightly-7a1c").image.pull_ref == C7A1C
    assert choose(images, current, "nightly-7a1d0b").image.pull_ref == C7A1D
    assert choose(images, current, "sha256:4e4e").image.pull_ref == C7A1D
    assert choose(images, current, "sha256:" + "3f" * 32).version == 21
    assert choose(images, current, "deepseekv41-flash-0909").version == 4
    assert choose(images, current, "vllm/vllm-openai:deepseek").image.pull_ref == OLD  # a prefix of repo:tag
    # The image the stack file already has is not a candidate: from 7a1c, `nightly-7a1` can only mean 7a1d.
    assert choose(images, ImageConfig.model_validate(C7A1C), "nightly-7a1").image.pull_ref == C7A1D


def test_an_ambiguous_or_unknown_target_is_an_error_that_lists_the_images() -> None:
    images = past_images(history())
    current = ImageConfig.model_validate(NEW)
    with pytest.raises(RollbackError) as info:
        choose(images, current, "nightly-7a1")
    message = str(info.value)
    assert message.startswith("--to nightly-7a1 matches 2 images this stack ran: ")
    assert f"{C7A1C} (last served by update 21 of " in message and f"{C7A1D} (last served by update 12 of " in message
    with pytest.raises(RollbackError, match=r"no successful update .* ran tag nightly-1b2c"):
        choose(images, current, "nightly-1b2c")  # it only ever failed
    with pytest.raises(RollbackError, match=r"ran digest sha256:ff…; images it ran, newest first: "):
        choose(images, current, "sha256:ff")
    with pytest.raises(RollbackError, match="already has"):
        choose(images, ImageConfig.model_validate(C7A1C), "sha256:3f")
    with pytest.raises(RollbackError, match="names nothing"):
        choose(images, current, "")


def test_pages_are_read_until_one_is_empty() -> None:
    updates = history()
    calls: list[int] = []

    def fetch(page: int) -> str:
        calls.append(page)
        return json.dumps(updates[(page - 1) * 10:page * 10])

    got, pages, complete = read_pages(fetch, page_size=10)
    assert got == updates and pages == 3 and complete and calls == [1, 2, 3, 4]
    calls.clear()

    def capped(page: int) -> str:  # a service that returns fewer than asked: a short page is not the end
        calls.append(page)
        return json.dumps(updates[(page - 1) * 7:page * 7][:5])

    assert len(read_pages(capped, page_size=7)[0]) == 5 + 5 + 5 + 3 and calls == [1, 2, 3, 4, 5]
    bounded = read_pages(lambda page: json.dumps([{"version": page}]), page_size=1, max_pages=5)
    assert bounded == ([{"version": n} for n in range(1, 6)], 5, False)
    with pytest.raises(RollbackError, match="returned the same updates for page 1 and 2: this CLI ignores --page"):
        read_pages(lambda page: json.dumps(updates[:10]), page_size=10)
    with pytest.raises(RollbackError, match="page 1 of `pulumi stack history --json` is not JSON"):
        read_pages(lambda page: "Stack has never been updated")


def test_a_history_is_matched_to_its_stack_by_nodes() -> None:
    prod, h20 = read_stack_values("prod"), read_stack_values("h20")
    sample = History(history(), "file h.json", from_cli=False)
    assert "matched to stack prod by its newest update with nodes (update 24 of " in check_same_stack(
        sample, "prod", prod, "Pulumi.prod.yaml")
    with pytest.raises(RollbackError) as info:
        check_same_stack(sample, "h20", h20, "Pulumi.h20.yaml")
    assert str(info.value).startswith("file h.json is not the history of stack h20: its newest update with nodes "
                                      "(update 24 of 2026-11-30T12:48:37.000Z) ran on 10.30.8.1, 10.30.8.2, and "
                                      "Pulumi.h20.yaml has 192.0.2.11, 192.0.2.12")
    bare = [{**u, "config": {k: v for k, v in u["config"].items() if k != "vllm-cluster:nodes"}} for u in history()]
    with pytest.raises(RollbackError, match="has no update that recorded vllm-cluster:nodes"):
        check_same_stack(History(bare, "file b.json", False), "prod", prod, "Pulumi.prod.yaml")
    other = [{**u, "config": {"aws:region": {"value": "eu-west-1", "secret": False}}} for u in history()]
    with pytest.raises(RollbackError, match="records no vllm-cluster:\\* config"):
        check_same_stack(History(other, "file o.json", False), "prod", prod, "Pulumi.prod.yaml")
    assert check_same_stack(History([], "`pulumi stack history`", True), "h20", h20, "x").startswith("read from")


def test_rewrite_changes_only_the_image_lines_and_keeps_comments() -> None:
    for stack in ("prod", "h20"):
        text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
        new = rewrite_image(text, ImageConfig.model_validate(C7A1C))
        changed = [line for line in difflib.unified_diff(text.splitlines(), new.splitlines(), lineterm="", n=0)
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert all("tag:" in line or "digest:" in line for line in changed), changed
        assert current_image(new).pull_ref == C7A1C
        assert [c for c in text.splitlines() if "#" in c] == [c for c in new.splitlines() if "#" in c]
        back = rewrite_image(new, ImageConfig.model_validate(current_image(text).pull_ref))
        assert back == text  # rolling forward again restores the file byte for byte


def test_string_form_image_stays_a_string() -> None:
    text = "config:\n  vllm-cluster:image: vllm/vllm-openai:v0.33.0   # pinned below\n  vllm-cluster:vision: false\n"
    new = rewrite_image(text, ImageConfig.model_validate(C7A1C))
    first, second = new.splitlines()[1:3]
    assert first.startswith(f"  vllm-cluster:image: {C7A1C} ") and first.endswith("# pinned below")  # comment kept
    assert second == "  vllm-cluster:vision: false"


def _cli(root: Path, *args: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "VLLM_CLUSTER_ROOT": str(root), "PATH": path})


def test_cli_rewrites_the_stack_file_and_prints_where_the_image_came_from(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    out = _cli(tmp_path, "rollback", "prod", "--history", str(HISTORY), "--to", "nightly-7a1c")
    assert out.returncode == 0, out.stderr
    assert f"-> {C7A1C}" in out.stdout and "last served by update 21 of 2026-11-27T09:27:37.000Z, commit " in out.stdout
    assert (f"history read from file {HISTORY}; matched to stack prod by its newest update with nodes (update 24 "
            "of 2026-11-30T12:48:37.000Z: 10.30.8.1, 10.30.8.2)") in out.stdout
    assert ("WARNING: vllm/vllm-openai:nightly-7a1c9e2f4b6d8a0c1e3f5b7d9a2c4e6f8b0d2a4c is not a known image (no "
            "image card)") in out.stdout
    assert out.stdout.lower().count("warning") == 1, out.stdout  # the missing card said once, with its command
    assert "python -m stacks image-card vllm/vllm-openai:nightly-7a1c" in out.stdout
    assert "pulumi preview -s prod --diff" in out.stdout and "pulumi up -s prod" in out.stdout
    assert current_image((tmp_path / "Pulumi.prod.yaml").read_text()).pull_ref == C7A1C
    plan = _cli(tmp_path, "plan", "prod")
    assert plan.returncode == 0 and "digest sha256:3f3f" in plan.stdout
    dry = _cli(tmp_path, "rollback", "prod", "--history", str(HISTORY), "--to", "deepseekv41", "--dry-run")
    assert dry.returncode == 0 and "--dry-run: Pulumi.prod.yaml not changed" in dry.stdout
    assert "capability entry vllm/vllm-openai:deepseekv41-flash-0909 (vLLM 0.1.dev20904+g179dd0fa9) accepts " \
           "this topology (mp-dp2-tp8-pp1-ep16), model deepseek-v4.1-flash and parsers" in dry.stdout, dry.stdout
    assert "warning: image vllm/vllm-openai:deepseekv41-flash-0909 is not pinned by digest" in dry.stdout
    assert current_image((tmp_path / "Pulumi.prod.yaml").read_text()).pull_ref == C7A1C


def test_cli_refuses_another_stacks_history_and_leaves_the_file(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Pulumi.h20.yaml", tmp_path)
    before = (tmp_path / "Pulumi.h20.yaml").read_text()
    out = _cli(tmp_path, "rollback", "h20", "--history", str(HISTORY))
    assert out.returncode == 2 and "is not the history of stack h20" in out.stderr
    assert "Traceback" not in out.stderr and (tmp_path / "Pulumi.h20.yaml").read_text() == before


def test_cli_refuses_a_target_whose_capability_entry_refuses_the_topology(tmp_path: Path) -> None:
    """h20 (DeepSeek-V4-Flash, TP8 x PP2) back to the 0909 image, whose table entry ships only V4.1."""
    shutil.copy(ROOT / "Pulumi.h20.yaml", tmp_path)
    (tmp_path / "h20.json").write_text(json.dumps(history_of("h20")))
    before = (tmp_path / "Pulumi.h20.yaml").read_text()
    out = _cli(tmp_path, "rollback", "h20", "--history", str(tmp_path / "h20.json"), "--to", "deepseekv41-flash")
    assert out.returncode == 2, out.stdout
    assert f"the current config with {OLD} is refused, so Pulumi.h20.yaml was not changed" in out.stderr
    assert "cannot run deepseek-v4-flash" in out.stderr and (tmp_path / "Pulumi.h20.yaml").read_text() == before
    known = _cli(tmp_path, "rollback", "h20", "--history", str(tmp_path / "h20.json"), "--dry-run")
    assert known.returncode == 0, known.stderr
    assert f"-> {NEW}" in known.stdout and f"capability entry {NEW} (vLLM nightly eed1f3d0) accepts" in known.stdout


def test_cli_input_errors_are_exit_2_with_the_next_step(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    out = _cli(tmp_path, "rollback", "prod")
    assert out.returncode == 2 and "pulumi stack history --json -s prod --page-size 10000 > history.json" in out.stderr
    (tmp_path / "h.json").write_text("{not json")
    bad = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "h.json"))
    assert bad.returncode == 2 and "is not JSON" in bad.stderr
    (tmp_path / "o.json").write_text('{"steps": []}')
    obj = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "o.json"))
    assert obj.returncode == 2 and "must be a JSON list of updates" in obj.stderr
    missing = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read the history file" in missing.stderr
    nostack = _cli(tmp_path, "rollback", "staging", "--history", str(HISTORY))
    assert nostack.returncode == 2 and "no Pulumi.staging.yaml" in nostack.stderr
    ambiguous = _cli(tmp_path, "rollback", "prod", "--history", str(HISTORY), "--to", "nightly-7a1")
    assert ambiguous.returncode == 2 and "matches 2 images this stack ran" in ambiguous.stderr
    zero = _cli(tmp_path, "rollback", "prod", "--history", str(HISTORY), "--page-size", "0")
    assert zero.returncode == 2 and "--page-size '0': out of range; 1 to 1000" in zero.stderr
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    deep = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "deep.json"))
    assert deep.returncode == 2 and "is not JSON (nested too deep)" in deep.stderr
    typed = history()
    typed[0]["version"] = "24"
    (tmp_path / "typed.json").write_text(json.dumps(typed))
    wrong_type = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "typed.json"))
    assert wrong_type.returncode == 2 and "update 0 has `version` = '24', not a number" in wrong_type.stderr
    path_like = _cli(tmp_path, "rollback", "../prod", "--history", str(HISTORY))
    assert path_like.returncode == 2 and "'../prod': is not a stack name" in path_like.stderr
    for result in (out, bad, obj, missing, nostack, ambiguous, zero, deep, wrong_type, path_like):
        assert "Traceback" not in result.stderr


FAKE_PULUMI = """#!{python}
# Stand-in `pulumi`: records its argv and pages the sample as the diy backend does
# (pkg/backend/diy/state.go getHistory: start = (page-1)*pageSize, default page size 10, page 1).
import json, os, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(os.getcwd() + " " + " ".join(args) + "\\n")
size = int(args[args.index("--page-size") + 1]) if "--page-size" in args else 10
page = int(args[args.index("--page") + 1]) if "--page" in args else 1
updates = json.load(open({history!r}))
print(json.dumps(updates[(page - 1) * size:page * size], indent=4))
"""


def test_cli_reads_every_page_from_the_pulumi_cli(tmp_path: Path) -> None:
    """The oldest image is on the third page of ten: rollback asks page after page until one is empty."""
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv"
    fake = bin_dir / "pulumi"
    fake.write_text(FAKE_PULUMI.format(python=sys.executable, log=str(log), history=str(HISTORY)))
    fake.chmod(0o755)
    out = _cli(tmp_path, "rollback", "prod", "--page-size", "10", "--to", "deepseekv41", "--dry-run",
               path=f"{bin_dir}:/usr/bin:/bin")
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [
        f"{tmp_path} stack history --json -s prod --page-size 10 --page {page}" for page in (1, 2, 3, 4)]
    assert f"-> {OLD}" in out.stdout and "last served by update 4 of 2026-11-10T12:28:37.000Z" in out.stdout
    assert "history read from `pulumi stack history --json -s prod` (24 updates in 3 page(s) of 10)" in out.stdout
    log.unlink()
    default = _cli(tmp_path, "rollback", "prod", "--dry-run", path=f"{bin_dir}:/usr/bin:/bin")
    assert default.returncode == 0 and f"-> {C7A1C}" in default.stdout
    assert [line.split(" --page ")[1] for line in log.read_text().splitlines()] == ["1", "2"]
    assert "--page-size 100 " in log.read_text()


def test_a_target_from_another_repository_is_pointed_out(tmp_path: Path) -> None:
    """`--to v0.33.0` matches a tag this stack once pulled from another registry: the rollback may be right,
    but the repository change must not pass unnoticed."""
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    updates = history()
    other = copy.deepcopy(next(u for u in updates if u["result"] == "succeeded" and u.get("config")))
    other["version"] = 1
    image = {"repository": "mirror.example/vllm", "tag": "v0.33.0"}
    other["config"]["vllm-cluster:image"] = {"value": json.dumps(image, separators=(",", ":")),
                                             "objectValue": image, "secret": False}
    (tmp_path / "h.json").write_text(json.dumps([*updates, other]))
    out = _cli(tmp_path, "rollback", "prod", "--history", str(tmp_path / "h.json"), "--to", "v0.33", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "warning: the repository changes: vllm/vllm-openai -> mirror.example/vllm" in out.stdout
