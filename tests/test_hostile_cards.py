"""A card is data a user can edit: every field a plan reads is typed and bounded (stacks/model/card_schema.py), so
a hand-edited or hostile card is exit 2 naming the card's file and the field, never an internal error and never
a plan on impossible numbers."""

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

from stacks.planner.model_cards import CardProblem, profile_from_card
from tests.conftest import ROOT

CARD = "deepseek-v4.1-flash"
"""The card prod plans with."""
SHIPPED = json.loads((ROOT / "models" / f"{CARD}.json").read_text())
GQA = json.loads((ROOT / "models" / "gpt-oss-20b.json").read_text())
FP8 = json.loads((ROOT / "models" / "deepseek-v3.json").read_text())

NUMBERS = ["layers", "attention_heads", "kv_heads", "head_dim", "max_model_len"]
HOSTILE: list[tuple[dict[str, Any], str, Any, str]] = [
    *[(SHIPPED, field, value, field) for field in NUMBERS for value in (0, -1, float("nan"), 1e300, "8", True,
                                                                        [8], None)],
    *[(SHIPPED, f"weights.{field}", value, f"weights.{field}")
      for field in ("experts_bytes", "dense_bytes", "replicated_bytes", "engram_bytes")
      for value in (-1, float("nan"), float("inf"), 1e300, "1e9", None)],
    (SHIPPED, "family", "moe-foo", "family"),
    (SHIPPED, "family", None, "family"),
    (SHIPPED, "name", f"{CARD}\n", "name"),
    (SHIPPED, "architecture", "DeepseekV41ForCausalLM\n", "architecture"),
    (SHIPPED, "architecture", 5, "architecture"),
    (SHIPPED, "moe.routed_experts", 0, "moe.routed_experts"),
    (SHIPPED, "moe", 5, "moe"),
    (SHIPPED, "o_groups", -1, "o_groups"),
    (SHIPPED, "engram_hash_heads", "24", "engram_hash_heads"),
    (SHIPPED, "kv_ratios", [0] * 61, "kv_ratios.0"),
    (SHIPPED, "kv_ratios", ["4"] * 61, "kv_ratios.0"),
    (SHIPPED, "kv_ratios", [4, 128], "kv_ratios"),
    (SHIPPED, "layer_types", 5, "layer_types"),
    (SHIPPED, "serving.supports_pp", "yes", "serving.supports_pp"),
    (SHIPPED, "serving.min_vram_gb", float("nan"), "serving.min_vram_gb"),
    (SHIPPED, "serving.tokenizer_mode", "auto\nx", "serving.tokenizer_mode"),
    (SHIPPED, "sources", 5, "sources"),
    (GQA, "sliding_window", -128, "sliding_window"),
    (GQA, "sliding_window", 0, "sliding_window"),
    (GQA, "weights.layer_bytes", [[1, 2]], "weights.layer_bytes.0"),
    (GQA, "weights.first_stage_bytes", [1, 2], "weights.first_stage_bytes"),
    (FP8, "quantization.block_size", [0, 128], "quantization.block_size.0"),
    (FP8, "quantization.block_size", [128], "quantization.block_size"),
    (FP8, "quantization", 5, "quantization"),
]


def _edited(card: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    edited = copy.deepcopy(card)
    *parents, last = path.split(".")
    node = edited
    for part in parents:
        node = node[part]
    node[last] = value
    return edited


@pytest.mark.parametrize(("card", "path", "value", "named"), HOSTILE,
                         ids=[f"{c['name']} {p}={v!r}"[:60] for c, p, v, _ in HOSTILE])
def test_a_hostile_field_is_refused_naming_the_file_and_the_field(card: dict[str, Any], path: str, value: Any,
                                                                 named: str) -> None:
    with pytest.raises(CardProblem) as caught:
        profile_from_card(_edited(card, path, value), "models/edited.json")
    assert str(caught.value).startswith(f"models/edited.json: field {named} "), str(caught.value)


@pytest.mark.parametrize("card", [SHIPPED, GQA, FP8], ids=lambda c: c["name"])
def test_every_shipped_card_passes_the_types(card: dict[str, Any]) -> None:
    assert profile_from_card(card, "x").key == card["name"]


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, json.dumps(_edited(SHIPPED, "layers", 0)),
                                  json.dumps(_edited(SHIPPED, "weights.engram_bytes", float("nan")))],
                         ids=["deeply nested", "zero layers", "NaN bytes"])
def test_plan_with_a_hostile_card_is_exit_2_naming_the_card(tmp_path: Path, text: str) -> None:
    """The same through `python -m stacks plan`: NaN bytes and nested JSON were internal errors, zero layers a plan."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path / "Pulumi.prod.yaml")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{CARD}.json").write_text(text)
    done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--assume-secret", "api_key"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VLLM_CLUSTER_ROOT": str(tmp_path)})
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-2000:]
    assert f"the card {tmp_path}/models/{CARD}.json: " in done.stderr, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
