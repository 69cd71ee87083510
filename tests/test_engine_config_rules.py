"""vLLM 0.33.0's validation of the structured-outputs, compilation and offload configs set through extra_args
(stacks/planner/engine_config_rules.py): what vLLM refuses is refused with the item, vLLM's error, its file:line
and when it is raised; what it accepts plans; what it ignores or deprecates is warned."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest

from tests.conftest import plan_of, problems_of

CITED = re.compile(r"\(vllm/[\w/.]+\.py:\d+-\d+\)")


def _extra(values: dict[str, Any], *words: str) -> dict[str, Any]:
    values["image"] = {"repository": "vllm/vllm-openai", "tag": "v0.33.0"}  # the carded image: dests known
    values["serving"]["extra_args"] = list(words)
    return values


REFUSED = [
    (["--structured-outputs-config", '{"disable_any_whitespace": true}'], "backend 'auto'",
     "disable_any_whitespace is only supported for xgrammar and guidance backends. "
     "(vllm/config/structured_outputs.py:67-71)", "argument parsing"),
    (["--structured-outputs-config", '{"backend": "xgrammar", "disable_additional_properties": true}'],
     "backend 'xgrammar'", "only supported for the guidance backend. (vllm/config/structured_outputs.py:72-76)",
     "argument parsing"),
    (["--structured-outputs-config.disable_any_whitespace", "true"], "disable_any_whitespace with backend 'auto'",
     "structured_outputs.py:67-71", "argument parsing"),
    (["-cc", '{"custom_ops": ["rms_norm"]}'], "custom_ops", "Invalid syntax 'rms_norm' for custom op",
     "argument parsing"),
    (["--compilation-config", '{"custom_ops": ["all", "none"]}'], "custom_ops",
     "only one base mode: 'all' or 'none' (vllm/config/compilation.py:1021-1025)", "argument parsing"),
    (["-cc.custom_ops+", "+rms_norm,-rms_norm"], "custom_ops",
     "cannot both enable and disable the same operation(s): rms_norm", "argument parsing"),
    (["-cc", '{"mode": 3, "backend": "openxla"}'], "piecewise",
     "Invalid backend for piecewise compilation: openxla (vllm/config/compilation.py:1036-1046)", "argument parsing"),
    (["-cc", '{"mode": "vllm_compile", "backend": "my.backend"}'], "piecewise", "my.backend", "argument parsing"),
    (["--offload-backend", "prefetch"], "groups of 0 (--offload-group-size left at 0)",
     "offload_num_in_group (1) must be <= offload_group_size (0) (vllm/config/offload.py:100-106)",
     "engine start-up"),
    (["--offload-group-size", "4", "--offload-num-in-group", "6"], "6 layer(s) in groups of 4",
     "offload_num_in_group (6) must be <= offload_group_size (4)", "engine start-up"),
    (["--offload-group-size", "4", "--offload-prefetch-step", "0"], "prefetches no layer ahead",
     "offload_prefetch_step (0) must be >= 1 when prefetch offloading is enabled (offload_group_size > 0) "
     "(vllm/config/offload.py:107-113)", "engine start-up"),
]


@pytest.mark.parametrize(("words", "said", "cited", "when"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_a_config_vllm_refuses_is_refused(h20_values: dict[str, Any], words: list[str], said: str, cited: str,
                                          when: str) -> None:
    problems = problems_of(_extra(h20_values, *words))
    assert len(problems) == 1, [p.render() for p in problems]
    problem = problems[0]
    assert problem.key.startswith("serving.extra_args.") and said in problem.message, problem.render()
    assert cited in (problem.upstream or "") and f"({when}" in (problem.upstream or "") and problem.fix
    assert CITED.search(problem.upstream or ""), problem.upstream


def test_a_reasoning_parser_inside_the_structured_outputs_config_is_refused(h20_values: dict[str, Any]) -> None:
    problems = problems_of(_extra(h20_values, "--structured-outputs-config", '{"reasoning_parser": "qwen3"}'))
    assert len(problems) == 1 and problems[0].fix == "remove it; set serving.reasoning_parser instead"


ACCEPTED = [
    ["--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true, '
     '"disable_additional_properties": true}'],
    ["--structured-outputs-config.backend", "xgrammar"],
    ["-cc", '{"custom_ops": ["none", "+rms_norm", "-silu_and_mul"]}'],
    ["-cc", '{"mode": 3, "backend": "eager"}'],
    ["-cc", '{"backend": "openxla"}'],  # mode left to vLLM: its check in __post_init__ does not fire
    ["--offload-group-size", "8", "--offload-num-in-group", "2", "--offload-prefetch-step", "1"],
    ["--offload-prefetch-step", "0"],  # prefetch offloading off: vLLM checks nothing
]


@pytest.mark.parametrize("words", ACCEPTED, ids=[" ".join(w)[:60] for w in ACCEPTED])
def test_the_configs_vllm_accepts_still_plan(h20_values: dict[str, Any], words: list[str]) -> None:
    plan = plan_of(_extra(h20_values, *words))
    command = plan.nodes[0].containers[0].command[-1]  # h20 runs Ray: the serve command is the script's last line
    assert command.endswith(" " + shlex.join(words)), command[-300:]


@pytest.mark.parametrize(("words", "warned"), [
    (["--structured-outputs-config.backend", "lm-format-enforcer"], "structured_outputs.py:77-84"),
    (["--offload-backend", "uva", "--offload-group-size", "4"], "\"Prefetch settings will be ignored\""),
    (["--offload-group-size", "4"], "errs on the safe side"),
], ids=["lm-format-enforcer", "uva ignores prefetch", "prefetch offload and the memory rule"])
def test_what_vllm_ignores_or_deprecates_is_warned(h20_values: dict[str, Any], words: list[str], warned: str) -> None:
    plan = plan_of(_extra(h20_values, *words))
    assert [w for w in plan.warnings if warned in w], plan.warnings
