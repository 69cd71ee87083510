"""The quantization vLLM 0.33.0 resolves (stacks/planner/quantization_rules.py): the model card's method as vLLM
reads it from config.json, `--quantization` in serving.extra_args against it, deprecated methods, and the MoonEP
rule applied to what vLLM runs, not only to what the card says."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.expert_parallel_real_vllm import variant
from stacks.model.errors import Problem
from tests.conftest import ROOT, plan_of, problems_of


def _with(values: dict[str, Any], *words: str) -> dict[str, Any]:
    values["serving"]["extra_args"] = list(words)
    return values


def _keyed(values: dict[str, Any], key: str) -> list[Problem]:
    return [p for p in problems_of(values) if p.key == key]


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4.1-flash"])
def test_the_shipped_deepseek_v4_cards_record_the_fp8_quantization_of_their_config(name: str) -> None:
    """The cards said `quantization: null`; every DeepSeek V4 checkpoint carries an fp8 quantization_config
    (tests/fixtures/models/ORIGINS.md), which the cards now record as vLLM reads it."""
    card = json.loads((ROOT / "models" / f"{name}.json").read_text())
    raw = json.loads((ROOT / "tests" / "fixtures" / "models" / name / "config.json").read_text())
    assert raw["quantization_config"]["quant_method"] == "fp8"
    assert card["quantization"]["method"] == "fp8" and card["quantization"]["block_size"] == [128, 128]
    assert card["sources"]["quantization"] == "config.json: quantization_config"


def test_moonep_on_the_shipped_deepseek_v41_card_is_refused_as_vllm_refuses_it() -> None:
    """It planned: the card's null quantization hid the checkpoint's FP8 (vllm/config/vllm.py:2106-2116)."""
    problems = _keyed(variant(all2all_backend="moonep", eplb={"enabled": False}), "parallelism.all2all_backend")
    assert len(problems) == 1, [p.render() for p in problems]
    problem = problems[0]
    assert "deepseek-v4.1-flash runs quantized (deepseek_v4_fp8" in problem.message
    assert "got quantization='deepseek_v4_fp8'" in (problem.upstream or "")
    assert "vllm/config/vllm.py:2106-2116" in (problem.upstream or "") and problem.fix


def test_moonep_with_online_quantization_of_an_unquantized_model_is_refused() -> None:
    """The card is BF16 and MoonEP fits, but `--quantization fp8` makes vLLM quantize it at load: refused."""
    values = variant(profile="qwen3-30b-a3b", all2all_backend="moonep", eplb={"enabled": False})
    plan_of(values)  # without the flag it plans (the MoonEP case bench/expert_parallel_real_vllm.py runs)
    problems = _keyed(_with(values, "--quantization", "fp8"), "parallelism.all2all_backend")
    assert len(problems) == 1, [p.render() for p in problems]
    assert "qwen3-30b-a3b runs quantized (fp8, serving.extra_args: --quantization)" in problems[0].message
    assert "drop --quantization" in (problems[0].fix or "")


def test_a_quantization_flag_that_contradicts_the_checkpoint_is_refused() -> None:
    problems = _keyed(_with(variant(profile="deepseek-v3"), "--quantization", "fp8_per_tensor"),
                      "serving.extra_args.0")
    assert len(problems) == 1, [p.render() for p in problems]
    problem = problems[0]
    assert "quantized with fp8" in problem.message and "asks for fp8_per_tensor" in problem.message
    assert "Quantization method specified in the model config (fp8) does not match" in (problem.upstream or "")
    assert "vllm/config/model.py:1452-1462" in (problem.upstream or "")
    assert "(engine start-up, before the weights load)" in (problem.upstream or "")
    assert (problem.fix or "").startswith("drop --quantization")


@pytest.mark.parametrize("words", [["--quantization", "fp8"], ["-q", "deepseek_v4_fp8"]],
                         ids=["the checkpoint's own", "the method vLLM runs it as"])
def test_a_quantization_flag_vllm_agrees_with_plans(words: list[str]) -> None:
    plan = plan_of(_with(variant(), *words))
    assert plan.nodes[0].containers[0].vllm_args[-2:] == words


def test_a_flag_vllm_replaces_for_gpt_oss_is_warned_not_refused() -> None:
    values = _with(variant(profile="gpt-oss-20b", eplb={"enabled": False}), "--quantization", "fp8")
    plan = plan_of(values)
    said = [w for w in plan.warnings if "--quantization fp8 is replaced" in w]
    assert len(said) == 1, plan.warnings
    assert "gpt_oss_mxfp4" in said[0] and "mxfp4.py:128-146" in said[0]


def test_humming_on_gpt_oss_is_refused_with_the_flag_vllm_wants() -> None:
    values = _with(variant(profile="gpt-oss-20b", eplb={"enabled": False}), "--quantization",
                   "humming")
    problems = _keyed(values, "serving.extra_args.0")
    assert len(problems) == 1, [p.render() for p in problems]
    assert "humming.py:182-190" in (problems[0].upstream or "") and "--moe-backend humming" in (problems[0].fix or "")


def test_a_deprecated_method_needs_allow_deprecated_quantization() -> None:
    values = _with(variant(profile="qwen3-30b-a3b"), "--quantization", "fbgemm_fp8")
    problems = _keyed(values, "serving.extra_args.0")
    assert len(problems) == 1, [p.render() for p in problems]
    assert "fbgemm_fp8 (--quantization) is a deprecated quantization method" in problems[0].message
    assert "vllm/config/model.py:1472-1485" in (problems[0].upstream or "")
    assert "--allow-deprecated-quantization" in (problems[0].fix or "")
    plan_of(_with(values, "--quantization", "fbgemm_fp8", "--allow-deprecated-quantization"))
