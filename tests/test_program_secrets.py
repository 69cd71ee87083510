"""Secrets enforced by the Pulumi program itself, not only by `plan`: under Pulumi's mocks, with config shaped
as the language host hands it over (PULUMI_CONFIG values plus the list of secret keys)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from stacks.model.loader import read_stack_values
from tests.pulumi_harness import SECRET_VALUES, run_program

SECRET_SIG = "4dabf18193072939515e22adb298388d"
ROOT = Path(__file__).resolve().parent.parent


def _text(run: Any) -> str:
    return json.dumps([r.inputs for r in run.mocks.resources], default=str)


def test_plain_api_key_in_pulumi_config_is_refused_before_anything_registers() -> None:
    values = copy.deepcopy(read_stack_values("prod")) | {"api_key": "sk-plaintext-do-not-deploy"}
    run = run_program("prod", values, secrets={})
    assert run.error is not None and "vllm-cluster:api_key" in str(run.error)
    assert "holds a secret in plain config" in str(run.error) and "sk-plaintext" not in str(run.error)
    assert run.mocks.resources == []


def test_literal_secret_marker_text_is_plain_text() -> None:
    values = copy.deepcopy(read_stack_values("prod")) | {"api_key": "[secret]"}
    run = run_program("prod", values, secrets={})
    assert run.error is not None and "holds a secret in plain config" in str(run.error)
    assert run.mocks.resources == []


def test_a_secret_inside_plain_config_is_refused() -> None:
    """`pulumi config set --secret --path vllm-cluster:container.env.HF_TOKEN …` makes the whole key secret;
    the program would otherwise decrypt it into the container's plain env."""
    values = copy.deepcopy(read_stack_values("prod"))
    container = values.pop("container")
    container["env"]["HF_TOKEN"] = "hf_secret_value"
    run = run_program("prod", values, secrets={**SECRET_VALUES, "container": container})
    assert run.error is not None and "vllm-cluster:container" in str(run.error)
    assert "hf_secret_value" not in str(run.error) and run.mocks.resources == []


def test_env_secrets_reach_every_engine_as_secrets_and_nowhere_plain() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    token = "hf_" + "t0ken" * 6
    run = run_program("prod", values, secrets={**SECRET_VALUES, "env_secrets": {"HF_TOKEN": token}})
    assert run.error is None, run.error
    engines = [r for r in run.mocks.of_type("docker:index/container:Container")]
    assert len(engines) == 2
    for engine in engines:
        envs = engine.inputs["envs"]
        assert SECRET_SIG in envs and f"HF_TOKEN={token}" in envs["value"]  # the env list travels as a secret
    plain = [r for r in run.mocks.resources if r.typ != "docker:index/container:Container"]
    assert token not in json.dumps([r.inputs for r in plain], default=str)  # dry runs, checks, labels
    dry_runs = [r for r in run.mocks.resources if r.name.endswith("args-dry-run")]
    assert dry_runs and all("HF_TOKEN" not in json.dumps(r.inputs) for r in dry_runs)


def test_unknown_key_and_namespace_typo_fail_the_program_too() -> None:
    values = copy.deepcopy(read_stack_values("prod")) | {"speculativ": {"method": "dspark"}}
    run = run_program("prod", values)
    assert run.error is not None and "vllm-cluster:speculativ" in str(run.error) and "speculative" in str(run.error)
    assert run.mocks.resources == []


def test_plain_leaf_in_a_secret_object_is_found_in_the_stack_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Pulumi flags only whole keys as secret; with the stack file at hand the program checks each leaf."""
    text = (ROOT / "Pulumi.prod.yaml").read_text() + (
        "  vllm-cluster:env_secrets:\n    HF_TOKEN:\n      secure: AAABAxyz\n    OTHER_TOKEN: plain-value\n")
    (tmp_path / "Pulumi.prod.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    values = copy.deepcopy(read_stack_values("prod"))
    run = run_program("prod", values, secrets={**SECRET_VALUES,
                                               "env_secrets": {"HF_TOKEN": "x", "OTHER_TOKEN": "plain-value"}})
    assert run.error is not None and "env_secrets.OTHER_TOKEN" in str(run.error)
    assert "plain-value" not in str(run.error) and run.mocks.resources == []
