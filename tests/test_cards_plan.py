"""Every committed model card plans on the carded vLLM 0.33.0 image: what the README's support table promises.

The parsers a card names are checked against what the image's own vLLM registered (its card's registries), not
a hand-kept list; a parser the image lacks is still refused, naming the card it came from.
"""

from __future__ import annotations

import copy
import json

import pytest

from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config
from stacks.planner.plan import build_plan
from tests.conftest import ROOT

CARDS = sorted(p.stem for p in (ROOT / "models").glob("*.json"))


def _two_node(profile: str, **serving: object) -> dict[str, object]:
    import yaml

    raw = yaml.safe_load((ROOT / "examples" / "Pulumi.two-node.yaml").read_text())["config"]
    values = {k.split(":", 1)[1]: v for k, v in raw.items()}
    values = copy.deepcopy(values)
    values["image"] = "vllm/vllm-openai:v0.33.0"
    card = json.loads((ROOT / "models" / f"{profile}.json").read_text())
    values["model"] = {**values["model"], "profile": profile}
    values["serving"] = {**values.get("serving", {}), "max_model_len": min(32768, int(card["max_model_len"])),
                         **serving}
    if card.get("moe") is None:  # vLLM refuses expert parallelism on a dense model (vllm/config/model.py:1498-1503)
        values["parallelism"] = {**values["parallelism"], "expert": False}
    return values


@pytest.mark.parametrize("profile", CARDS)
def test_every_card_plans_on_the_carded_image(profile: str) -> None:
    plan = build_plan("cards", parse_config("cards", _two_node(profile)))
    assert plan.model["profile"] == profile


def test_a_parser_the_image_lacks_is_refused_with_the_cards_registry() -> None:
    with pytest.raises(ConfigError) as caught:
        build_plan("cards", parse_config("cards", _two_node("qwen3-8b", tool_call_parser="no_such_parser")))
    problem = next(p for p in caught.value.problems if p.key == "serving.tool_call_parser")
    assert "hermes" in problem.fix and "deepseek_v41" in problem.fix  # the card's registry, not two names


def test_no_reasoning_parser_no_thinking_check() -> None:
    """Llama 3.1 has no reasoning parser: no answer carries reasoning, so the plan lists no thinking check and says
    why; asking for one explicitly is refused."""
    plan = build_plan("cards", parse_config("cards", _two_node("llama-3.1-8b-instruct")))
    assert not [c for c in plan.checks if "thinking" in c.sections]
    assert any(n.startswith("no thinking check: the card llama-3.1-8b-instruct names no reasoning parser")
               for n in plan.notes), plan.notes
    values = _two_node("llama-3.1-8b-instruct")
    values["api"] = {**values.get("api", {}), "smoke": {"thinking_check": True}}
    with pytest.raises(ConfigError) as caught:
        build_plan("cards", parse_config("cards", values))
    problem = next(p for p in caught.value.problems if p.key == "api.smoke.thinking_check")
    assert "names no reasoning parser" in problem.message and problem.fix
    plan = build_plan("cards", parse_config("cards", _two_node("llama-3.1-8b-instruct", reasoning_parser="qwen3")))
    assert [c for c in plan.checks if "thinking" in c.sections]


@pytest.mark.parametrize(("profile", "flag"), [("qwen3-8b", ["--thinking-kwarg", "enable_thinking"]),
                                               ("gpt-oss-20b", ["--thinking-kwarg", "reasoning_effort"]),
                                               ("deepseek-v3", []), ("llama-3.1-8b-instruct", [])])
def test_the_api_check_sends_the_cards_thinking_key(profile: str, flag: list[str]) -> None:
    """The key comes from the card's reasoning parser (stacks/planner/model_cards.py THINKING_KWARG_BY_PARSER):
    Qwen3's parser reads enable_thinking, gpt-oss reasons at an effort; DeepSeek's `thinking` is the default."""
    import shlex

    from components.check_commands import api_command

    config = parse_config("cards", _two_node(profile))
    plan = build_plan("cards", config)
    words = shlex.split(api_command(config, plan, ["chat", "thinking", "stream"], "api"))
    at = [i for i, w in enumerate(words) if w == "--thinking-kwarg"]
    assert [words[i + j] for i in at for j in (0, 1)] == flag


def test_a_cards_thinking_kwarg_overrides_the_parsers() -> None:
    from review.model_card import CardError, parse_facts

    assert parse_facts(["thinking_kwarg=thinking"]) == {"thinking_kwarg": "thinking"}
    with pytest.raises(CardError, match="thinking_kwarg"):
        parse_facts(["thinking_kwarg=think"])


@pytest.mark.parametrize(("change", "said"), [
    ({"architecture": "FooForCausalLM"}, "architecture FooForCausalLM (models/foo.json) is not one of the 415 model "
     "architectures vLLM 0.33.0 registers (images/vllm_vllm-openai_v0.33.0.json: registries.architectures)"),
    ({"quantization": {"method": "bogus", "format": None, "block_size": None, "modules_not_converted": None}},
     "quantization method 'bogus' (models/foo.json: quantization.method, from the checkpoint's "
     "quantization_config.quant_method) is not one of the 30 methods vLLM 0.33.0 knows"),
])
def test_a_carded_image_refuses_what_its_vllm_does_not_register(tmp_path: object, change: dict[str, object],
                                                                said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image card lists the architectures and quantization methods its vLLM registered: a model card outside
    them is refused with the image card's rule, not planned clean."""
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "models").mkdir()
    card = {**json.loads((ROOT / "models" / "qwen3-8b.json").read_text()), "name": "foo", **change}
    (root / "models" / "foo.json").write_text(json.dumps(card))
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(root))
    values = _two_node("qwen3-8b")
    values["model"] = {**values["model"], "profile": "foo"}
    with pytest.raises(ConfigError) as caught:
        build_plan("cards", parse_config("cards", values))
    problem = next(p for p in caught.value.problems if p.key == "model.profile")
    assert said in problem.message, problem.message


def test_a_carded_image_gets_no_unknown_image_warnings_and_its_cards_routes() -> None:
    """v0.32.0 has a card (flags, registries, routes) but no capability entry: no "not a known image" or "no routes
    table" warning, and the proxy's deny list comes from the routes the card recorded."""
    values = _two_node("qwen3-8b")
    values["image"] = "vllm/vllm-openai:v0.32.0"
    plan = build_plan("cards", parse_config("cards", values))
    assert plan.image["card"] == "images/vllm_vllm-openai_v0.32.0.json"
    texts = "\n".join(plan.warnings)
    assert "not a known image" not in texts and "capability table" not in texts and "stacks/planner" not in texts
    from stacks.planner.proxy import proxy_routes, routes_problems

    values["api"] = {**values.get("api", {}), "proxy": {**values.get("api", {}).get("proxy", {}), "enabled": True}}
    config = parse_config("cards", values)
    problems, warnings = routes_problems(config)
    assert warnings == [] and problems == []
    routes = proxy_routes(config)
    assert routes.source == "vLLM 0.32.0 routes (images/vllm_vllm-openai_v0.32.0.json: routes)"
    assert "/start_profile" not in routes.denied and "/abort_requests" in routes.denied  # 0.32.0 had no profiler


def test_a_cards_routes_know_the_control_paths() -> None:
    """The card's route endpoints map to the same origins the wheel-read tables use: pausing, sleeping, worker RPC
    and metrics are control paths a client key cannot be allowed by accident."""
    from stacks.planner.proxy import admin_routes

    control = admin_routes("card:vllm_vllm-openai_v0.32.0")
    assert {"/pause", "/sleep", "/collective_rpc", "/metrics", "/docs", "/abort_requests"} <= control
    assert "/v1/chat/completions" not in control


@pytest.mark.parametrize(("profile", "flag"), [("qwen3-8b", ["--thinking-kwarg", "enable_thinking"]),
                                               ("deepseek-v3", [])])
def test_the_group_restarts_golden_round_sends_the_cards_thinking_key(profile: str, flag: list[str]) -> None:
    """The supervisor's and `restart-group`'s golden round is a chat check too: with DeepSeek's `thinking` key a
    Qwen3 server would think through the round's small token budget and the restart would count as failed."""
    from heal.cli import golden_argv

    config = parse_config("cards", _two_node(profile))
    words = list(golden_argv(build_plan("cards", config), config, "python3"))
    at = [i for i, w in enumerate(words) if w == "--thinking-kwarg"]
    assert [words[i + j] for i in at for j in (0, 1)] == flag


def test_a_dense_models_memory_lines_name_no_experts_and_no_engram() -> None:
    """A dense model's plan says its weights are in every DP rank over TP, with no expert or Engram parts and no
    host-RAM line (nothing is pinned); an MoE model keeps its expert part."""
    from stacks.planner.render import render_summary

    dense = build_plan("cards", parse_config("cards", _two_node("qwen3-8b")))
    note = next(n for n in dense.notes if n.startswith("memory per GPU"))
    assert "experts" not in note and "Engram" not in note and "weights in every DP rank over TP" in note, note
    assert not [line for line in render_summary(dense) if line.startswith("host RAM")]
    moe = build_plan("cards", parse_config("cards", _two_node("qwen3-30b-a3b")))
    note = next(n for n in moe.notes if n.startswith("memory per GPU"))
    assert "weights experts " in note and "experts over DP" in note and "Engram" not in note, note
