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
