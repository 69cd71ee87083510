"""PR review: `stacks diff` on a temp git repository with real commits, and `stacks preview-summary` on a
realistic `pulumi preview --json` (the shape of Pulumi's preview digest) and the engine event log of the same
preview (apitype.EngineEvent lines: the only place Pulumi writes policy violations)."""

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

from review.downtime import downtime_of
from review.plan_diff import to_markdown as diff_markdown
from review.preview_summary import summarize, to_markdown
from tests.conftest import ROOT

PREVIEW = ROOT / "tests" / "fixtures" / "pulumi" / "preview-image-change-prod.json"
EVENTS = ROOT / "tests" / "fixtures" / "pulumi" / "preview-events-image-change-prod.jsonl"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def make_repo(tmp_path: Path) -> Path:
    """This project's planner and stack files, committed once as the base."""
    for package in ("stacks", "review", "heal", "checks", "components", "models", "images"):  # cards: models, images
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
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
    # nccl_debug WARN: the warning with its text, and the NCCL checks that no longer run
    assert ("### Warnings\n\n- added: fabric.nccl_debug is not INFO: the NCCL transport (RDMA vs socket fallback) "
            "will not be verified\n") in md
    assert "- removed: ~~image vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657 is not pinned" in md
    assert ("### Checks\n\n- **removed** `nccl-transport-node1` (it no longer runs)\n- **removed** "
            "`nccl-transport-node2` (it no longer runs)\n") in md
    plan = json.loads(subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--json"], cwd=repo, text=True,
                                     capture_output=True, env={**os.environ, "VLLM_CLUSTER_ROOT": str(repo)}).stdout)
    estimate = plan["model"]["estimated_load_s"]
    outage = plan["model"]["outage"][plan["model"]["outage"]["applies"]]
    minutes, seconds = divmod(outage["total_s"], 60)
    assert (f"- **Downtime:** the whole engine group (2 container(s)) is down about {minutes} min {seconds} s (the "
            "new plan's modelled outage)") in md
    for phase in outage["phases"]:  # each phase on its own line, with its figure and source
        assert f"{phase['figure']}. Source: {phase['source']}" in md
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    assert data["containers"]["engine-node2-deepseek-v41-flash"]["argv"]["--max-num-seqs"] == ["128", "64"]
    assert data["replaced"] == ["engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"]
    assert data["checks"] == {"added": [], "removed": ["nccl-transport-node1", "nccl-transport-node2"], "changed": []}
    assert data["estimated_load_s"] == {"base": estimate, "head": estimate}
    assert data["downtime"].startswith("the whole engine group (2 container(s)) is down about ")


def test_downtime_comes_from_one_swappable_function() -> None:
    valid = {"base": {"valid": True}, "head": {"valid": True}}
    engines = {"validation": valid, "replaced": ["engine-a", "engine-b"], "containers": {},
               "estimated_load_s": {"base": 2855, "head": 3000}, "proxy": {}}
    assert downtime_of(engines).startswith("the whole engine group (2 container(s)) is down about 50 min 0 s")
    added = {**engines, "replaced": [], "containers": {"engine-c": {"created": True}}}
    assert downtime_of(added).startswith("the whole engine group (1 container(s))")
    proxy = {**engines, "replaced": [], "proxy": {"listen": ["0.0.0.0:443", "0.0.0.0:8443"]}}
    assert downtime_of(proxy) == "seconds: the proxy container is replaced; the engines keep serving"
    quiet = {**engines, "replaced": []}
    assert downtime_of(quiet).startswith("none: no engine or proxy container is replaced")
    broken = {**engines, "validation": {"base": {"valid": True}, "head": {"valid": False}}}
    assert downtime_of(broken).startswith("unknown")
    full = {"stack": "prod", "base": "main", "validation": {side: v | {"problems": [], "warnings": []}
                                                             for side, v in valid.items()},
            "topology": {}, "image": {}, "nodes": {"added": [], "removed": []}, "containers": {}, "replaced": [],
            "proxy": {}, "listeners": {"added": [], "removed": []}, "warnings": {"added": [], "removed": []},
            "checks": {"added": ["api-deny"], "removed": []}}
    md = diff_markdown(full, downtime_of=lambda d: "from the computed matrix")
    assert "- **Downtime:** from the computed matrix" in md and "- added `api-deny`" in md


def test_topology_change_and_an_invalid_result_are_shown_with_the_rules(repo: Path) -> None:
    edit(repo, "h20", ("pipeline: 2", "pipeline: 1"), ("tensor: 8", "tensor: 16"))
    out = diff(repo, "h20", "--base", "main~1")
    assert out.returncode == 2  # the change does not validate: a bad input, as for `plan`
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
    assert "- **Downtime:** none: no engine or proxy container is replaced" in out.stdout
    shutil.copy(repo / "Pulumi.prod.yaml", repo / "Pulumi.staging.yaml")
    new = diff(repo, "staging", "--base", "HEAD")
    assert new.returncode == 2 and "HEAD has no Pulumi.staging.yaml: the stack is new" in new.stderr


def test_a_code_change_in_the_planner_shows_up_as_an_argv_change(repo: Path) -> None:
    """The base plan comes from the base's code: a launch.py edit is reviewed like a stack file edit."""
    launch = repo / "stacks" / "planner" / "launch.py"
    text = launch.read_text()
    assert '"--max-num-seqs", str(serving.max_num_seqs)' in text
    launch.write_text(text.replace('"--max-num-seqs", str(serving.max_num_seqs)',
                                   '"--max-num-seqs", str(serving.max_num_seqs * 2)'))
    out = diff(repo, "prod", "--base", "HEAD")
    assert "argv `--max-num-seqs`: `128` → `256`" in out.stdout


def _summary(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", "preview-summary", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_preview_summary_of_an_image_change() -> None:
    out = _summary(str(PREVIEW))
    assert out.returncode == 0, out.stderr
    md = out.stdout
    assert md.startswith("## `pulumi preview`: 10 to replace, 1 to create (4 unchanged)\n")
    assert "- `image`: `vllm/vllm-openai:nightly-7a1c" in md and "→ `vllm/vllm-openai:nightly-eed1f3d0" in md
    assert ("| `engine-node1-deepseek-v41-flash` | `docker:index/container:Container` | `image`, `labels[4].value` "
            "| – |") in md
    assert "| `node2-preflight` | `command:remote:Command` | `triggers[0]` | `create` |" in md
    assert "| `api-smoke` | `command:local:Command` | `triggers` | – |" in md  # from replaceReasons (no detail)
    assert "node1-docker" not in md and "fabric-node1-fabric-preflight" not in md  # unchanged: not listed
    assert "[secret]" not in md and "`engine`" not in md  # values and output-only component updates stay out
    # the digest's warning, and no claim about policy: the digest does not carry policy events
    assert "- diagnostics: 0 error(s), 1 warning(s)" in md
    assert ("| warning | diagnostic | `vllm-cluster-prod` | image vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443"
            "ee198dd56f657 is not pinned by digest: the tag can be re-pushed") in md
    assert "- policy violations: **not in this input**: `pulumi preview --json` leaves policy events out" in md


def test_policy_violations_from_the_event_log_block_with_exit_1() -> None:
    out = _summary(str(PREVIEW), "--events", str(EVENTS))
    assert out.returncode == 1, out.stderr
    md = out.stdout
    assert md.startswith("## `pulumi preview`: 10 to replace, 1 to create (4 unchanged) — **BLOCKED** (2 blocking")
    assert "- policy violations: 2 mandatory, 2 advisory" in md
    assert ("| **mandatory** | `vllm-cluster/prod-image-pinned-by-digest` | `node1-image` | image vllm/vllm-openai:"
            "nightly-eed1f3d0c6043bd494424a22443ee198dd56f657 is not pinned by digest: a tag can be re-pushed; write "
            "repo:tag@sha256:&lt;digest&gt; |") in md
    assert "| advisory | `vllm-cluster/image-pinned-by-digest` | `node2-image` |" in md
    assert "<{%" not in md and md.count("| warning | diagnostic |") == 1  # colour tags gone; the warning once
    alone = _summary(str(EVENTS))  # the streamed event log on its own gives the same review
    assert alone.returncode == 1 and alone.stdout == md
    data = json.loads(_summary(str(EVENTS), "--json").stdout)
    assert data["ok"] is False and len(data["blocking"]) == 2 and data["counts"]["replace"] == 10
    advisory_only = "\n".join(line for line in EVENTS.read_text().splitlines() if '"mandatory"' not in line)
    relaxed = _summary("-", stdin=advisory_only)
    assert relaxed.returncode == 0 and "- policy violations: 0 mandatory, 2 advisory" in relaxed.stdout


def test_an_error_diagnostic_blocks() -> None:
    preview: dict[str, Any] = json.loads(PREVIEW.read_text())
    preview["diagnostics"].append({"urn": preview["steps"][0]["urn"], "severity": "error", "message":
                                   "error: Program failed with an unhandled exception:\nstack 'prod': 1 config "
                                   "problem(s), nothing was created\n"})
    preview["diagnostics"].append({"severity": "info", "message": "Previewing update (prod)"})
    out = _summary("-", stdin=json.dumps(preview))
    assert out.returncode == 1
    assert "- diagnostics: 1 error(s), 1 warning(s)" in out.stdout
    assert ("| **error** | diagnostic | `vllm-cluster-prod` | Program failed with an unhandled exception: ⏎ stack "
            "'prod': 1 config problem(s), nothing was created |") in out.stdout
    assert "Previewing update" not in out.stdout


def test_preview_summary_topology_and_json() -> None:
    preview: dict[str, Any] = json.loads(PREVIEW.read_text())
    changed = copy.deepcopy(preview)
    stack = changed["steps"][0]
    stack["newState"]["outputs"]["topology"] = stack["newState"]["outputs"]["topology"] | {"tensor": 16, "data": 1}
    summary = summarize(changed)
    assert summary["counts"] == {"replace": 10, "update": 0, "create": 1, "delete": 0}
    assert "- `topology`: tensor: `8` → `16`; data: `2` → `1`" in to_markdown(summary)
    empty = summarize({"steps": [], "changeSummary": {}})
    assert empty["counts"] == {"replace": 0, "update": 0, "create": 0, "delete": 0} and empty["ok"]
    assert to_markdown(empty).startswith("## `pulumi preview`: no resource changes (0 unchanged)\n")


@pytest.mark.parametrize(("stdin", "args", "message"), [
    ("not json", [], "stdin is not JSON"),
    ("{}", [], "stdin is not a `pulumi preview --json` digest: it is an empty object `{}`, and a digest has `steps` "
               "and `changeSummary`"),
    ("[1, 2]", [], "it is a JSON list of 2 item(s)"),
    ('{"version": 3, "deployment": {}}', [], "it is a stack export (`pulumi stack export`)"),
    ('{"steps": [{"op": "same"}]}', [], "steps[0] has no `op` and `urn` strings"),
    ('{"steps": [], "diagnostics": "boom"}', [], "`diagnostics` is str, not a list"),
    ('{"sequence": 0, "summaryEvent": {"isPreview": false, "resourceChanges": {}}}', [],
     "is the event log of an update (`summaryEvent.isPreview` is false), not of a preview"),
    # an explicit id: pytest would name the test after the 200,000-character input and put that name in the
    # child's environment (PYTEST_CURRENT_TEST), past the kernel's limit for one variable
    pytest.param("[" * 100_000 + "]" * 100_000, [], "stdin is JSON nested too deep to be a preview",
                 id="json-nested-100000-deep"),
    ('{"config": {}, "steps": []}', [], "has no steps and no changeSummary counts"),
    ('{"steps": [{"op": "explode", "urn": "urn:pulumi:prod::p::t::n"}]}', [], "has op 'explode', not a Pulumi step op"),
    ('{"steps": [{"op": "same", "urn": "prod-node1"}]}', [], "has urn 'prod-node1', not a Pulumi URN"),
    ('{"steps": [{"op": "update", "urn": "urn:pulumi:prod::p::t::n", "detailedDiff": [1]}]}', [],
     "steps[0].detailedDiff is not a map of property diffs"),
    ('{"steps": [{"op": "replace", "urn": "urn:pulumi:prod::p::t::n", "replaceReasons": "image"}]}', [],
     "steps[0].replaceReasons is not a list of property names"),
    ('{"steps": [{"op": "update", "urn": "urn:pulumi:prod::p::t::n", "newState": 5}]}', [],
     "steps[0].newState is not an object"),
])
def test_what_is_not_a_preview_is_exit_2_naming_what_is_missing(stdin: str, args: list[str], message: str) -> None:
    out = _summary("-", *args, stdin=stdin)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_bad_files_for_preview_summary_are_exit_2(tmp_path: Path) -> None:
    history = ROOT / "tests" / "fixtures" / "pulumi" / "stack-history-prod.json"
    out = _summary(str(history))
    assert out.returncode == 2 and "(it looks like `pulumi stack history --json`)" in out.stderr
    missing = _summary(str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "e.jsonl").write_text('{"hello": 1}\n')
    bad_events = _summary(str(PREVIEW), "--events", str(tmp_path / "e.jsonl"))
    assert bad_events.returncode == 2 and "line 1 is an object with keys hello, not a Pulumi engine event" in \
        bad_events.stderr
    twice = _summary(str(EVENTS), "--events", str(EVENTS))
    assert twice.returncode == 2 and "already an event stream" in twice.stderr
    for result in (out, missing, bad_events, twice):
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "package", "pinned"), [
    (["matrix", "h20"], "pulumi", "requirements.txt"),
    (["model-card", "s3://bucket/models/x", "--name", "x"], "boto3", "requirements-dev.txt"),
])
def test_the_review_tools_beyond_planning_name_what_the_plan_only_venv_lacks(
        args: list[str], package: str, pinned: str, tmp_path: Path) -> None:
    """The same answer as the heal tools' (heal/full_venv.py): exit 2, the package, its requirements file and
    `make venv`, before the program runs or a bucket is asked."""
    from tests.test_tutorial import plan_only_site

    out = subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=180, env=os.environ | {"PYTHONPATH": str(plan_only_site(tmp_path / "plan-only"))})
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{args[0]}: " in out.stderr and f"needs {package} ({pinned}), which {sys.executable} cannot import" \
        in out.stderr and "run `make venv`" in out.stderr and "internal error" not in out.stderr, out.stderr
    assert out.stdout == ""


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


def test_an_absolute_symlink_committed_by_mistake_does_not_break_the_diff(repo: Path) -> None:
    """A link to an absolute path (a venv link, say) is left out of the base's copy, not a crash of the review."""
    (repo / "venv-link").symlink_to("/usr")
    (repo / "escape").symlink_to("../../etc")
    subprocess.run([*GIT, "add", "venv-link", "escape"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "links"], cwd=repo, check=True)
    edit(repo, "prod", ("max_num_seqs: 128", "max_num_seqs: 96"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    assert "planned by the code at HEAD~1" in out.stdout and "argv `--max-num-seqs`: `128` → `96`" in out.stdout


def test_a_restart_policy_change_is_an_update_in_place(repo: Path) -> None:
    edit(repo, "prod", ("restart: unless-stopped", 'restart: "no"'))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    assert "- **Downtime:** none: the engine containers are updated in place (docker update)" in out.stdout
    assert "### Updated in place by `pulumi up`" in out.stdout and "### Replaced by" not in out.stdout
    assert "  - restart: `unless-stopped` → `no`" in out.stdout
    assert "- removed: ~~container.restart is 'unless-stopped': Docker restarts one dead rank alone" in out.stdout
    data = json.loads(diff(repo, "prod", "--base", "HEAD~1", "--json").stdout)
    assert data["replaced"] == [] and data["updated_in_place"] == ["engine-node1-deepseek-v41-flash",
                                                                   "engine-node2-deepseek-v41-flash"]


def test_a_load_rate_change_restarts_nothing_and_says_what_a_restart_costs_now(repo: Path) -> None:
    edit(repo, "prod", ("    path: deepseek-ai/DeepSeek-V4.1-Flash\n",
                        "    path: deepseek-ai/DeepSeek-V4.1-Flash\n    load_gb_per_s: 0.2\n"))
    out = diff(repo, "prod", "--base", "HEAD~1")
    assert out.returncode == 0, out.stderr
    assert "- **Downtime:** none: no engine or proxy container is replaced" in out.stdout
    assert "- **Estimated load time:** 3035 s → 1758 s" in out.stdout
    assert "No change to what gets deployed." in out.stdout


def test_a_base_planned_by_older_code_reads_its_labels() -> None:
    """Upgrading from a version that kept planning facts in labels: the labels leave, so the group is replaced
    once; the base's estimate comes from its label, the head's from model.estimated_load_s."""
    from review.plan_diff import diff_plans
    from stacks.model.loader import parse_config, read_stack_values
    from stacks.planner.plan import build_plan

    head = build_plan("prod", parse_config("prod", read_stack_values("prod"))).to_json_dict()
    base = copy.deepcopy(head)
    del base["model"]["estimated_load_s"]
    for node in base["nodes"]:
        node["containers"][0]["labels"] |= {"vllm-cluster.estimated-load-s": "2800",
                                            "vllm-cluster.private-networks": "1.1.1.0/24"}
    found = diff_plans("prod", "old", base, head)
    assert found["estimated_load_s"] == {"base": 2800, "head": head["model"]["estimated_load_s"]}
    assert found["replaced"] == ["engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"]
    modelled = head["model"]["outage"][head["model"]["outage"]["applies"]]["total_s"]
    minutes, seconds = divmod(modelled, 60)
    assert downtime_of(found).startswith(f"the whole engine group (2 container(s)) is down about {minutes} min "
                                         f"{seconds} s")
    unchanged = diff_plans("prod", "same", copy.deepcopy(head), head)
    assert unchanged["replaced"] == [] and downtime_of(unchanged).startswith("none: no engine or proxy")


def test_the_diff_markdown_cannot_be_broken_out_of_by_a_value() -> None:
    """Whatever a stack file holds (backticks, newlines, an HTML comment) stays inside one inline code span on
    one line: a reviewer sees every change, and a crafted key cannot hide the rest of the review."""
    hostile = "x`\n\n## Approved\n<!-- "
    diff: dict[str, Any] = {
        "stack": "prod", "base": "HEAD", "topology": {}, "image": {}, "proxy": {}, "replaced": [],
        "nodes": {"added": [], "removed": []}, "listeners": {"added": [], "removed": []},
        "validation": {"base": {"valid": True, "warnings": []},
                       "head": {"valid": False, "problems": [{"key": hostile, "value": hostile,
                                                             "message": "bad\n## Approved <b>"}]}},
    }
    md = diff_markdown(diff)
    problems = [line for line in md.splitlines() if line.startswith("  - ")]
    # `<!--` inside a code span is literal text on GitHub; outside one it is escaped
    assert problems == ["  - `x'  ## Approved <!-- ` = `x'  ## Approved <!-- `: bad ## Approved &lt;b&gt;"], md
    assert not any(line.startswith("## Approved") for line in md.splitlines())
    assert all(line.count("`") % 2 == 0 for line in md.splitlines()), md


def test_a_weakened_check_is_shown_though_no_process_changes(repo: Path) -> None:
    """Thinking and streaming off and a looser golden pattern restart nothing, but the review must say that
    two verifications stop and what the golden check now accepts."""
    text = (repo / "Pulumi.prod.yaml").read_text()
    (repo / "Pulumi.prod.yaml").write_text(text + "  vllm-cluster:api:\n    smoke: {thinking_check: false, "
                                           "stream_check: false, "
                                           "golden: [{prompt: '17*19?', expect: '3[0-9][0-9]'}]}\n")
    md = diff(repo, "prod", "--base", "HEAD").stdout
    assert "- changed `api-golden-rank-0`: **no longer checks** `thinking`, `stream`; proves " in md
    assert "('17*19?' -&gt; /3[0-9][0-9]/)" in md and "(was: DP rank 0 on node1" in md
    assert "No change to the engines, the proxy or the listeners; only the checks above change." in md
    assert "No change to what gets deployed." not in md


def test_a_restart_epoch_bump_shows_the_generation_and_the_replaced_group(repo: Path) -> None:
    """The runbooks' group restart changes only the generation label: the review must not say "no change"."""
    edit(repo, "prod", ("  vllm-cluster:container:\n", "  vllm-cluster:container:\n    restart_epoch: 1\n"),
         commit=False)
    md = diff(repo, "prod", "--base", "HEAD").stdout
    assert "No change to what gets deployed." not in md
    assert "  - label `vllm-cluster.generation`: `" in md
    assert "### Replaced by `pulumi up`" in md and "- `engine-node2-deepseek-v41-flash`" in md


def test_a_change_to_any_golden_pair_shows_in_the_review(repo: Path) -> None:
    """The check's claim names the first pair; the whole set is named by its hash, so loosening pair 2 shows."""
    golden = "  vllm-cluster:api:\n    smoke:\n      golden:\n        - {prompt: '17*19?', expect: '323'}\n" \
             "        - {prompt: 'capital of France?', expect: 'Paris'}\n"
    (repo / "Pulumi.prod.yaml").write_text((repo / "Pulumi.prod.yaml").read_text() + golden)
    subprocess.run([*GIT, "commit", "-qam", "golden"], cwd=repo, check=True)
    edit(repo, "prod", ("expect: 'Paris'", "expect: '(?i)paris|巴黎'"), commit=False)
    md = diff(repo, "prod", "--base", "HEAD").stdout
    assert "- changed `api-golden-rank-0`: proves " in md and "[golden set " in md, md
    assert "No change to what gets deployed." not in md


def test_turning_tls_off_moves_the_endpoint_and_the_diff_tells_clients() -> None:
    """With the proxy on and no port, TLS off means plain HTTP on 80: the endpoint moves from :443, and the review
    says so under Clients; the plan's clear-text warning names the port."""
    from review.plan_diff import diff_plans, to_markdown
    from stacks.model.config import SECRET_MARKER
    from stacks.model.loader import parse_config, read_stack_values
    from stacks.planner.plan import build_plan

    values = read_stack_values("prod")
    values["serving"]["host"] = "127.0.0.1"
    values |= {"api_key": SECRET_MARKER, "proxy_keys": {"team-a": SECRET_MARKER},
               "tls_certificate": SECRET_MARKER, "tls_private_key": SECRET_MARKER}
    values["api"] = {"proxy": {"enabled": True}}
    base = build_plan("prod", parse_config("prod", values)).to_json_dict()
    values["api"] = {"proxy": {"enabled": True, "tls": False}}
    head_plan = build_plan("prod", parse_config("prod", values))
    assert any("clear text (on port 80" in w for w in head_plan.warnings)
    text = to_markdown(diff_plans("prod", "HEAD", base, head_plan.to_json_dict()))
    assert "- **Clients:** the endpoint moves: `https://10.30.8.1:443` → `http://10.30.8.1:80`" in text, text
    assert "**Clients:**" not in to_markdown(diff_plans("prod", "HEAD", base, copy.deepcopy(base)))


def _engine_step(op: str, name: str, node: str) -> dict[str, Any]:
    state = {"type": "docker:index/container:Container",
             "inputs": {"labels": [{"label": "vllm-cluster.generation", "value": "g"},
                                   {"label": "vllm-cluster.node", "value": node}]}}
    return {"op": op, "urn": f"urn:pulumi:pd::vllm-cluster::docker:index/container:Container::{name}",
            "oldState": state, "newState": state}


def test_preview_summary_says_which_groups_restart() -> None:
    """A stack with groups: the groups its last update exported, each engine placed by its node label; a group
    with every engine replaced restarts, one with some is the fail-stop bug, the router's step is said. The
    steps are shaped as `pulumi preview --json` writes them (the lab's prefill/decode workflow checks a real one)."""
    stack = {"op": "same", "urn": "urn:pulumi:pd::vllm-cluster::pulumi:pulumi:Stack::vllm-cluster-pd",
             "oldState": {"type": "pulumi:pulumi:Stack", "outputs": {
                 "router": "pd-router", "groups": {"prefill": {"nodes": ["gpu1", "gpu2"], "role": "prefill"},
                                                   "decode": {"nodes": ["gpu3", "gpu4"], "role": "decode"}}}}}
    router = {"op": "same", "urn": "urn:pulumi:pd::vllm-cluster::docker:index/container:Container::router",
              "oldState": {"type": "docker:index/container:Container", "inputs": {}}}
    steps = [stack, router, _engine_step("same", "engine-prefill-gpu1-x", "gpu1"),
             _engine_step("same", "engine-prefill-gpu2-x", "gpu2"),
             _engine_step("replace", "engine-decode-gpu3-x", "gpu3"),
             _engine_step("replace", "engine-decode-gpu4-x", "gpu4")]
    found = summarize({"steps": steps})
    groups = found["engine_groups"]["groups"]
    assert {g: v["verdict"] for g, v in groups.items()} == {"prefill": "keeps running", "decode": "restarts"}
    assert groups["decode"]["replaced_on"] == ["gpu3", "gpu4"] and found["engine_groups"]["router"] == "unchanged"
    text = to_markdown(found)
    assert "- group `prefill` (prefill tier): keeps running" in text
    assert "- group `decode` (decode tier): **restarts**: 2 engine container(s) replaced, on gpu3, gpu4" in text
    replacement = [dict(steps[4], op=op) for op in ("create-replacement", "replace", "delete-replaced")]
    counted = summarize({"steps": [*steps[:4], *replacement, steps[5]]})["engine_groups"]["groups"]["decode"]
    assert counted["replaced"] == ["engine-decode-gpu3-x", "engine-decode-gpu4-x"]  # one resource, three steps
    assert "- router: keeps running" in text
    # the real CLI lists no unchanged resource without --show-sames: the same verdicts from the moves alone
    moves = [s for s in steps if s["op"] != "same" or s is stack]
    assert summarize({"steps": moves})["engine_groups"] == found["engine_groups"] | {
        "groups": {**groups, "prefill": {**groups["prefill"], "kept_on": []}}}
    steps[4] = _engine_step("same", "engine-decode-gpu3-x", "gpu3")  # one of the decode group's two engines
    text = to_markdown(summarize({"steps": steps}))
    assert "**PART OF THE GROUP RESTARTS**: engines replaced on gpu4, kept on gpu3" in text
    del steps[4]  # without --show-sames: replaced on gpu4 only, and gpu3 is the group's too
    assert "**PART OF THE GROUP RESTARTS**: engines replaced on gpu4, kept on gpu3" in to_markdown(
        summarize({"steps": steps}))
    router["op"] = "replace"
    assert "- router: **replace**" in to_markdown(summarize({"steps": steps}))
    router["op"] = "update"
    assert "- router: updated in place (no restart)" in to_markdown(summarize({"steps": steps}))
    stack["oldState"]["outputs"] = {"topology": {}}  # type: ignore[index]  # one engine group: no section
    assert summarize({"steps": steps})["engine_groups"] is None
    assert "### Engine groups" not in to_markdown(summarize({"steps": steps}))


def _junk_engine(inputs: Any) -> dict[str, Any]:
    state = {"type": "docker:index/container:Container", "inputs": inputs}
    return {"op": "replace", "urn": "urn:pulumi:pd::vllm-cluster::docker:index/container:Container::e",
            "oldState": state, "newState": state}


@pytest.mark.parametrize(("groups", "engine", "says"), [
    ({"decode": {"role": "decode"}}, _engine_step("replace", "e", "gpu3"), "names no node of it"),
    ({"d": {"nodes": ["gpu4"]}}, _engine_step("replace", "e", "gpu3"), "cannot place in a group"),
    ({"d": {"nodes": 5}}, _engine_step("replace", "e", "gpu3"), "names no node of it"),
    ({"d": {"nodes": ["gpu3"]}}, _junk_engine([1]), "cannot place in a group"),
    ({"d": {"nodes": ["gpu3"]}}, _junk_engine({"labels": 5}), "cannot place in a group"),
    ({"d": {"nodes": ["gpu3"]}}, _junk_engine({"labels": [["a", "b"]]}), "cannot place in a group"),
    ({"d": {"nodes": ["gpu3"], "role": {"a": [1]}}}, _engine_step("replace", "e", "gpu3"), "`d`: **restarts**"),
])
def test_preview_summary_never_says_a_group_keeps_running_when_it_cannot_tell(
        groups: dict[str, Any], engine: dict[str, Any], says: str) -> None:
    """A digest written by hand or by another tool: groups without nodes, engines on an unknown node, labels of
    the wrong shape. The summary says it cannot tell, never that a group keeps running, and never fails."""
    stack = {"op": "same", "urn": "urn:pulumi:pd::vllm-cluster::pulumi:pulumi:Stack::vllm-cluster-pd",
             "oldState": {"type": "pulumi:pulumi:Stack", "outputs": {"groups": groups}}}
    text = to_markdown(summarize({"steps": [stack, engine]}))
    assert says in text and "keeps running" not in text, text
