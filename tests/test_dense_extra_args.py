"""extra_args values vLLM 0.33.0 refuses on a dense model with the v0.33.0 image card, each refused with vLLM's own
words and file:line; and the histogram buckets vLLM's lax pydantic accepts, accepted (review of issue 36, items 4
and 5)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.expert_parallel_real_vllm import variant
from tests.conftest import plan_of, problems_of


def _dense(*words: str) -> dict[str, Any]:
    values = variant(profile="qwen3-8b", expert=False, eplb={"enabled": False},
                     all2all_backend="allgather_reducescatter")
    values["image"] = "vllm/vllm-openai:v0.33.0"
    values["serving"]["extra_args"] = list(words)
    return values


def _buckets(text: str) -> list[str]:
    return ["--custom-histogram-buckets", text]


REFUSED = [
    (["--quantization", "bogusq"], "'bogusq' is not one of the", "registries.quantization_methods",
     "Unknown quantization method: bogusq. Must be one of [...]. (vllm/config/model.py:1464-1469)"),
    (["-q", "bogusq"], "'bogusq' is not one of the", "registries.quantization_methods", "model.py:1464-1469"),
    (["--custom-histogram-buckets=[1,2]"], "histogram buckets", "",
     "custom_histogram_buckets: Input should be a valid dictionary (vllm/config/observability.py:70)"),
    (["--custom-histogram-buckets=5"], "histogram buckets", "", "Input should be a valid dictionary"),
    (_buckets('{"request_tokens": {"a": 1}}'), "histogram buckets", "",
     "custom_histogram_buckets['request_tokens']: Input should be a valid list (vllm/config/observability.py:70)"),
    (_buckets('{"request_tokens": "x"}'), "histogram buckets", "",
     "custom_histogram_buckets['request_tokens']: Input should be a valid list"),
    (_buckets('{"request_tokens": [1, "abc"]}'), "histogram buckets", "",
     "custom_histogram_buckets['request_tokens'][1]: Input should be a valid number, unable to parse string"),
    (_buckets('{"request_tokens": [2, "1"]}'), "histogram buckets", "",
     "bounds [2.0, 1.0] must be strictly increasing (vllm/config/observability.py:209-213)"),
    (_buckets('{"request_tokens": [1, false]}'), "histogram buckets", "",
     "bound False must be a number, not a boolean (vllm/config/observability.py:167-182)"),
    (_buckets('{"request_tokens": []}'), "histogram buckets", "",
     "bucket list must not be empty (vllm/config/observability.py:198-202)"),
    (["-cc", '{"decoder_replay_cudagraph_capture_sizes": [0]}'], "decoder_replay_cudagraph_capture_sizes has 0", "",
     "All decoder_replay_cudagraph_capture_sizes must be positive (vllm/config/compilation.py:1048-1051)"),
    (["-cc", '{"decoder_replay_cudagraph_capture_sizes": [4, "-2"]}'], "has '-2'", "", "compilation.py:1048-1051"),
    (["--offload-group-size", "-1"], "PrefetchOffloadConfig.offload_group_size must be >= 0", "", ""),
    (["--offload-num-in-group", "0"], "PrefetchOffloadConfig.offload_num_in_group must be >= 1", "", ""),
]


@pytest.mark.parametrize(("words", "said", "card", "upstream"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_a_value_vllm_refuses_is_refused_once_with_its_words(words: list[str], said: str, card: str,
                                                              upstream: str) -> None:
    problems = [p for p in problems_of(_dense(*words)) if p.key.startswith("serving.extra_args.")]
    assert len(problems) == 1, [p.render() for p in problems]
    problem = problems[0]
    assert said in problem.message and card in problem.message and problem.fix, problem.render()
    assert upstream in (problem.upstream or ""), problem.render()


ACCEPTED = [
    ["--quantization", "fp8"],
    _buckets('{"request_tokens": [1, "2"]}'),  # lax pydantic: "2" is 2.0
    _buckets('{"request_tokens": [1, " 2.5 ", 1e3]}'),
    _buckets("null"),
    ["-cc", '{"decoder_replay_cudagraph_capture_sizes": [1, 2, "4"]}'],
    ["--offload-group-size", "0"],
]


@pytest.mark.parametrize("words", ACCEPTED, ids=[" ".join(w) for w in ACCEPTED])
def test_a_value_vllm_accepts_plans(words: list[str]) -> None:
    plan = plan_of(_dense(*words))
    assert any(" ".join(words) in " ".join(c.command) for n in plan.nodes for c in n.containers)
