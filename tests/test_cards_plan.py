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
    """The key comes from the card's reasoning parser (stacks/planner/profiles.py THINKING_KWARG_BY_PARSER):
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
