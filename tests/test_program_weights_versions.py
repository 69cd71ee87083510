"""The program under Pulumi's mocks with `model.source`: the engines mount the version directory each node's sync
reported, the staged steps read it, old versions are pruned only after the new group's checks, and a new revision
re-runs the checks (docs/weights.md, "A new revision goes beside the old one")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.planner.container_spec import WEIGHTS_VERSION
from tests.pulumi_harness import SECRET_VALUES, Run, run_program, waits_for
from tests.test_program import CONTAINER
from tests.test_wire_program import S3, with_source

BASE = "/mnt/disk2/modelscope/models/deepseek-ai/DeepSeek-V4.1-Flash"
INSIDE = "/models/deepseek-ai/DeepSeek-V4.1-Flash"
V1, V2 = f"{BASE}@0123456789abcdef", f"{BASE}@fedcba9876543210"


def synced(name: str, version: str | None) -> str:
    details: dict[str, Any] = {"hash": "c" * 64}
    if version:
        details["version_dir"] = version
    return json.dumps({"check": name, "status": "pass", "summary": "ok", "details": details})


def run_with(version: str | None, **source: Any) -> Run:
    run = run_program("prod", with_source(**source), secrets={**SECRET_VALUES, **S3},
                      stdout={f"{n}-weights": synced(f"weights-{n}", version) for n in ("node1", "node2")})
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module")
def v1() -> Run:
    return run_with(V1)


def _model_volume(run: Run, node: str) -> dict[str, Any]:
    container = next(r for r in run.mocks.of_type(CONTAINER) if r.name.startswith(f"engine-{node}-"))
    return next(v for v in container.inputs["volumes"] if v["containerPath"] == INSIDE)


def test_the_engines_mount_the_version_the_sync_reported_where_the_argv_names_the_model(v1: Run) -> None:
    for node in ("node1", "node2"):
        assert _model_volume(v1, node) == {"hostPath": V1, "containerPath": INSIDE, "readOnly": True}
        container = next(r for r in v1.mocks.of_type(CONTAINER) if r.name.startswith(f"engine-{node}-"))
        assert INSIDE in container.inputs["command"], "the argv still names container_dir/path"
        assert not any(v["hostPath"] == "/mnt/disk2/modelscope/models" for v in container.inputs["volumes"])
    sync = v1.mocks.named("node1-weights").inputs["create"].split("<<'")[0]
    assert f" --dest {BASE} " in sync and " --versions " in sync
    assert "-v /mnt/disk2/modelscope/models/deepseek-ai:/mnt/disk2/modelscope/models/deepseek-ai " in sync


def test_the_staged_steps_read_the_new_version(v1: Run) -> None:
    for node in ("node1", "node2"):
        assert f"--model-dir {V1} " in v1.mocks.named(f"engine-{node}-page-cache").inputs["create"]
        assert f"src={V1},dst={INSIDE}" in v1.mocks.named(f"engine-{node}-args-dry-run").inputs["create"]
        assert f"--model-dir {V1} " in v1.mocks.named(f"{node}-preflight").inputs["create"]


def test_old_versions_are_pruned_only_after_the_new_group_passed_its_checks(v1: Run) -> None:
    api, engine = v1.result["api"], v1.result["engine"]
    for node, prune in v1.result["weights_prunes"].items():
        create = v1.mocks.named(f"weights-prune-{node}").inputs["create"]
        assert create.startswith(f"timeout 600 python3 - prune --dest {BASE} --keep {V1} --keep-last 2 ")
        for check in (api.health, api.smoke, *engine.readiness.values(), *engine.containers.values()):
            assert waits_for(v1, prune, check)


def test_a_new_revision_changes_the_mount_and_re_runs_the_checks_but_not_the_generation(v1: Run) -> None:
    v2 = run_with(V2)
    assert _model_volume(v2, "node1")["hostPath"] == V2
    before = v1.mocks.named("api-smoke").inputs["triggers"]
    after = v2.mocks.named("api-smoke").inputs["triggers"]
    assert before != after and f"weights={V2}" in str(after)
    label = "vllm-cluster.generation"

    def generation(run: Run) -> str:
        container = next(r for r in run.mocks.of_type(CONTAINER) if r.name.startswith("engine-node1-"))
        return next(lbl["value"] for lbl in container.inputs["labels"] if lbl["label"] == label)

    assert generation(v1) == generation(v2), "the plan is the same; the mount is what moves the group"
    assert "--keep-last 5 " in run_with(V1, keep_versions=5).mocks.named("weights-prune-node1").inputs["create"]


def test_a_sync_that_named_no_version_mounts_the_model_directory_itself() -> None:
    """A state written before versions (or a mocked verdict): the engines mount host_dir/path, nothing is pruned
    beyond versions."""
    run = run_with(None)
    assert _model_volume(run, "node1")["hostPath"] == BASE
    assert f"--keep {BASE} " in run.mocks.named("weights-prune-node1").inputs["create"]


def test_the_plan_shows_the_version_as_a_placeholder() -> None:
    from stacks.model.loader import parse_config
    from stacks.planner.launch import model_volume

    config = parse_config("prod", with_source())
    assert model_volume(config).host == f"{BASE}@{WEIGHTS_VERSION}"
    assert model_volume(config).container == INSIDE
    plain = config.model_copy(update={"model": config.model.model_copy(update={"source": None})})
    assert model_volume(plain).host == "/mnt/disk2/modelscope/models"


def test_keep_versions_does_not_sync_again(v1: Run) -> None:
    other = run_with(V1, keep_versions=3)
    assert other.mocks.named("node1-weights").inputs["triggers"] == v1.mocks.named("node1-weights").inputs["triggers"]
    assert other.mocks.named("node1-weights").inputs["create"] == v1.mocks.named("node1-weights").inputs["create"]


def test_drift_reads_a_version_directory_as_the_planned_version_mount() -> None:
    """`heal` compares a running container with the plan: the sync's version is the plan's `<version>`, and a mount
    of anything else (another model directory) is still drift."""
    import copy as _copy

    from heal.drift import compare_container
    from stacks.planner.container_spec import VolumeSpec
    from tests.test_drift import recorded, spec

    container, image = recorded()
    planned = spec(volumes=[VolumeSpec(host=f"/tmp@{WEIGHTS_VERSION}", container="/data", read_only=True)])
    for source, drift in (("/tmp@0123456789abcdef", False), ("/tmp", True), ("/other@0123456789abcdef", True)):
        running = _copy.deepcopy(container)
        for mount in running["Mounts"]:
            if mount.get("Destination") == "/data":
                mount["Source"] = source
        kinds = [r.kind for r in compare_container("n1", planned, running, image["Id"], image["Config"])]
        assert (kinds == ["mounts", "mounts"]) if drift else (kinds == []), (source, kinds)
