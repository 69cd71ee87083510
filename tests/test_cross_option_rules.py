"""vLLM 0.33.0's cross-option rules (stacks/planner/cross_option_rules.py, managed_options.scheduler_problems):
each combination vLLM refuses is refused by the plan, naming the extra_args item or key, the value, the vLLM
error with its file:line and when vLLM would raise it; the combinations vLLM accepts still plan."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest

from bench.expert_parallel_real_vllm import variant
from stacks.model.errors import Problem
from tests.conftest import plan_of, problems_of

CITED = re.compile(r"\(vllm/[\w/.]+\.py:\d+-\d+")


def _extra(values: dict[str, Any], *words: str) -> dict[str, Any]:
    values["image"] = {"repository": "vllm/vllm-openai", "tag": "v0.33.0"}  # the carded image: dests known
    values["serving"]["extra_args"] = list(words)
    return values


def _refused(values: dict[str, Any], key: str) -> Problem:
    problems = problems_of(values)
    found = [p for p in problems if p.key == key]
    assert len(found) == 1, [p.render() for p in problems]
    return found[0]


REFUSED = [
    (["--long-prefill-token-threshold", "40000"], "long_prefill_token_threshold 40000 is above serving.max_model_len",
     "vllm/config/scheduler.py:355-360", "engine start-up"),
    (["--max-cpu-loras", "2", "--max-loras", "4"], "max_cpu_loras 2 is below max_loras 4",
     "vllm/config/lora.py:123-127", "engine start-up"),
    (["--max-loras", "3", "--max-cpu-loras=1"], "max_cpu_loras 1 is below max_loras 3",
     "vllm/config/lora.py:123-127", "engine start-up"),
    (["--enable-log-outputs"], "request logging is off", "cli_args.py:555-556", "argument check"),
    (["--disable-log-requests", "--enable-log-outputs"], "request logging is off", "cli_args.py:555-556",
     "argument check"),
    (["--sse-keep-alive-interval", "-5"], "negative keep-alive interval", "cli_args.py:558-563", "argument check"),
    (["--enable-per-request-metrics", "--disable-log-stats"], "needs the engine statistics",
     "cli_args.py:565-571", "argument check"),
    (["--collect-detailed-traces", "all"], "no --otlp-traces-endpoint", "vllm/config/observability.py:216-221",
     "engine start-up"),
    (["--custom-histogram-buckets", '{"ttft": [1, 2]}'], "histogram buckets", "unknown bucket family 'ttft'",
     "engine start-up"),
    (["--custom-histogram-buckets", '{"time_to_first_token": [1, 0.5]}'], "histogram buckets",
     "must be strictly increasing (vllm/config/observability.py:209-213)", "engine start-up"),
    (["--custom-histogram-buckets", '{"time_to_first_token": [0, 1]}'], "histogram buckets",
     "must be finite and greater than 0", "engine start-up"),
    (["--custom-histogram-buckets", '{"time_to_first_token": [true, 2]}'], "histogram buckets",
     "must be a number, not a boolean", "engine start-up"),
    (["--custom-histogram-buckets", '{"time_to_first_token": []}'], "histogram buckets", "must not be empty",
     "engine start-up"),
]


@pytest.mark.parametrize(("words", "said", "cited", "when"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_an_extra_args_combination_vllm_refuses_is_refused(h20_values: dict[str, Any], words: list[str], said: str,
                                                          cited: str, when: str) -> None:
    h20_values["serving"]["max_model_len"] = 32768
    problems = problems_of(_extra(h20_values, *words))
    assert len(problems) == 1, [p.render() for p in problems]
    problem = problems[0]
    assert problem.key.startswith("serving.extra_args.") and said in problem.message, problem.render()
    assert cited in (problem.upstream or "") and f"({when}" in (problem.upstream or "") and problem.fix
    assert CITED.search(problem.upstream or ""), problem.upstream


ACCEPTED = [
    ["--long-prefill-token-threshold", "32768"],
    ["--max-cpu-loras", "4", "--max-loras", "4"],
    ["--max-cpu-loras", "1"],
    ["--enable-log-requests", "--enable-log-outputs"],
    ["--disable-log-outputs"],
    ["--sse-keep-alive-interval", "0"],
    ["--enable-per-request-metrics"],
    ["--disable-log-stats"],
    ["--collect-detailed-traces", "all", "--otlp-traces-endpoint", "http://10.0.0.9:4317"],
    ["--custom-histogram-buckets", '{"time_to_first_token": [0.1, 0.5, 1, 5]}'],
]


@pytest.mark.parametrize("words", ACCEPTED, ids=[" ".join(w) for w in ACCEPTED])
def test_the_combinations_vllm_accepts_still_plan(h20_values: dict[str, Any], words: list[str]) -> None:
    h20_values["serving"]["max_model_len"] = 32768
    plan = plan_of(_extra(h20_values, *words))
    command = plan.nodes[0].containers[0].command[-1]  # h20 runs Ray: the serve command is the script's last line
    assert command.endswith(" " + shlex.join(words)), command[-300:]  # rendered as given, after the planned options


def test_expert_parallelism_on_a_dense_model_is_refused_with_vllms_line() -> None:
    """It was a warning ("vLLM ignores expert parallelism"); vLLM 0.33.0 raises when it builds the engine config."""
    problem = _refused(variant(profile="qwen3-8b"), "parallelism.expert")
    assert "qwen3-8b is a dense model" in problem.message and problem.fix == "parallelism.expert: false"
    assert "vllm/config/model.py:1498-1503" in (problem.upstream or "")
    assert "before the weights load" in (problem.upstream or "")


def test_eplb_on_a_model_class_without_it_is_refused_and_says_it_shows_only_at_model_load() -> None:
    problem = _refused(variant(profile="gpt-oss-20b"), "parallelism.eplb.enabled")
    assert "GptOssForCausalLM does not implement MixtureOfExperts" in problem.message
    assert "gpt_oss.py:1369-1371" in problem.message and "gpu_model_runner.py:5061-5073" in problem.message
    assert "only at model load" in problem.message and "num_redundant_experts: 0" in (problem.fix or "")
    assert not [p for p in problems_of(variant(profile="gpt-oss-20b")) if p.key == "parallelism.expert"]


def _lora(values: dict[str, Any], profile: str, *words: str) -> dict[str, Any]:
    values["model"]["profile"] = profile
    return _extra(values, *words)


def test_lora_on_a_model_class_without_supports_lora_is_refused_from_the_image_card(
        h20_values: dict[str, Any]) -> None:
    """DeepSeek V4.1's CUDA class (vllm/models/deepseek_v41/nvidia/vl_model.py, the card's lora_architectures,
    read from the 0.33.0 wheel) has no SupportsLoRA: vLLM 0.33.0 refuses --enable-lora when it builds the engine
    config. DeepSeek V4's CUDA class has it (its CPU class does not: the card is read as on CUDA) and plans."""
    problem = _refused(_lora(h20_values, "deepseek-v4.1-flash", "--enable-lora"), "serving.extra_args.0")
    assert problem.value == "--enable-lora"
    assert "DeepseekV41ForCausalLM is served on CUDA by vllm/models/deepseek_v41/nvidia/vl_model.py:118" \
        in problem.message and "images/vllm_vllm-openai_v0.33.0.json: lora_architectures" in problem.message
    assert "vllm/config/lora.py:147-155" in (problem.upstream or "") and "(engine start-up" in (problem.upstream or "")
    assert "lora_model_runner_mixin.py:49-50" in (problem.upstream or "")
    assert "drop --enable-lora" in (problem.fix or "") and CITED.search(problem.upstream or "")
    plan_of(_lora(h20_values, "deepseek-v4-flash", "--enable-lora", "--max-loras", "2"))
    plan_of(_lora(h20_values, "deepseek-v4.1-flash", "--no-enable-lora"))


def test_lora_rule_without_the_card_field_is_a_warning_not_a_crash(h20_values: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A card taken before probe 4 has no lora_architectures: the plan says the rule was not checked."""
    from stacks.planner.image_cards import all_cards

    card = next(c for c in all_cards() if c.name == "vllm_vllm-openai_v0.33.0")  # the one the plan matches
    monkeypatch.setitem(card.raw, "lora_architectures", None)
    plan = plan_of(_lora(h20_values, "deepseek-v4.1-flash", "--enable-lora"))
    assert any("supports LoRA was not checked" in w and "has no lora_architectures" in w for w in plan.warnings)
    monkeypatch.setitem(card.raw, "lora_architectures", {"supported": {}, "unsupported": {}, "unresolved": "x"})
    plan = plan_of(_lora(h20_values, "deepseek-v4.1-flash", "--enable-lora"))
    assert any("could not resolve its class" in w for w in plan.warnings)


HUGE = "1" + "0" * 400
"""A JSON integer no float holds: float() of it raises OverflowError (it once ended the plan with an internal
error, exit 3, in the histogram-bucket rule and in the option-value check of -cc)."""


def test_a_histogram_bound_beyond_a_floats_range_is_refused_as_pydantic_refuses_it(
        h20_values: dict[str, Any]) -> None:
    problems = problems_of(_extra(h20_values, f'--custom-histogram-buckets={{"request_tokens":[{HUGE}]}}'))
    assert len(problems) == 1, [p.render() for p in problems]
    problem = problems[0]
    assert problem.key == "serving.extra_args.0" and "histogram buckets" in problem.message, problem.render()
    assert "custom_histogram_buckets['request_tokens'][0]: Input should be a valid number" in (problem.upstream or "")
    assert "vllm/config/observability.py:70" in (problem.upstream or "") and problem.fix, problem.upstream
    assert len(problem.render()) < 2000, problem.render()  # the 401 digits are cut, not printed in full


@pytest.mark.parametrize(("words", "said"), [
    (["-cc", f'{{"cudagraph_mode": {HUGE}}}'], "cudagraph_mode takes one of"),
    (["--kv-cache-metrics-sample", HUGE], "kv_cache_metrics_sample must be"),
])
def test_a_json_integer_beyond_a_floats_range_in_a_checked_value_is_refused_not_a_crash(
        h20_values: dict[str, Any], words: list[str], said: str) -> None:
    problems = problems_of(_extra(h20_values, *words))
    assert [p.key for p in problems] == ["serving.extra_args.0"] and said in problems[0].message, [
        p.render() for p in problems]


def test_a_huge_json_integer_for_an_int_field_is_no_crash(h20_values: dict[str, Any]) -> None:
    """pydantic takes any Python int for an `int` field; the value check reads it as a whole number, not through a
    float that overflows."""
    from stacks.planner.option_values import fits_float, shape_problem

    assert shape_problem(10**400, {"kind": "int"}) is None
    assert shape_problem(10**400, {"kind": "float"}) == "a number" and not fits_float(10**400)
    assert shape_problem(1e300, {"kind": "float"}) is None and fits_float(True)
