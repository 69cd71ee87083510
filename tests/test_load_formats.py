"""serving.load_format, serving.safetensors_load_strategy and serving.model_loader_extra_config: rendered as vLLM's
flags, checked against the image card (load_formats and their packages), vLLM 0.33.0's loaders and the model card's
weight files (stacks/planner/load_formats.py). The planned argv and vLLM's own verdicts on it were captured with a
real vLLM 0.33.0 on CPU (bench/load_formats_real_vllm.py -> tests/fixtures/vllm-0.33.0-load-formats.json)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.load_formats_real_vllm import lab_values, planned_argv, planned_values
from stacks.model.errors import ConfigError, Problem
from stacks.model.loader import parse_config
from stacks.planner.plan import Plan, build_plan
from tests.conftest import ROOT

CAPTURE = json.loads((ROOT / "tests" / "fixtures" / "vllm-0.33.0-load-formats.json").read_text())
FLAGS = ("--load-format", "--safetensors-load-strategy", "--model-loader-extra-config")


def _plan(values: dict[str, Any]) -> Plan:
    return build_plan("loaders", parse_config("loaders", values))


def _problems(values: dict[str, Any]) -> list[Problem]:
    with pytest.raises(ConfigError) as caught:
        _plan(values)
    return caught.value.problems


def _argv(plan: Plan) -> list[str]:
    return plan.node("lab1").containers[0].vllm_args or []


def _one(problems: list[Problem], key: str) -> Problem:
    found = [p for p in problems if p.key == key]
    assert len(found) == 1, [p.render() for p in problems]
    return found[0]


# --- the capture from real vLLM ----------------------------------------------------------------------------------


def test_the_capture_ran_the_argv_the_planner_renders_now() -> None:
    """Else recapture: `VLLM_PYTHON=... venv/bin/python bench/load_formats_real_vllm.py > tests/fixtures/...`."""
    assert CAPTURE["vllm_version"] == "0.33.0"
    assert {name: case["argv"] for name, case in CAPTURE["planned"].items()} == planned_argv()


@pytest.mark.parametrize("name", list(CAPTURE["planned"]))
def test_real_vllm_takes_each_planned_argv_as_asked(name: str) -> None:
    """vLLM 0.33.0's parser, create_engine_config and the loader's own __init__ accepted the argv and kept every
    value the stack asked for."""
    serving = planned_values()[name]["serving"]
    got = CAPTURE["planned"][name]
    assert "ok" in got, got
    assert got["ok"]["load_format"] == serving.get("load_format", "auto")
    assert got["ok"]["safetensors_load_strategy"] == serving.get("safetensors_load_strategy")
    assert got["ok"]["model_loader_extra_config"] == serving.get("model_loader_extra_config", {})


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    # the capture's refused case -> (the stack's serving keys that ask for the same, the key the plan names)
    "unknown load format": ({"load_format": "bogus"}, "serving.load_format"),
    "strategy not in vLLM's list": ({"safetensors_load_strategy": "fast"}, "serving.safetensors_load_strategy"),
    "unknown extra-config key, default loader": ({"model_loader_extra_config": {"threads": 4}},
                                                 "serving.model_loader_extra_config.threads"),
    "multi-thread with eager": ({"safetensors_load_strategy": "eager",
                                 "model_loader_extra_config": {"enable_multithread_load": True}},
                                "serving.model_loader_extra_config.enable_multithread_load"),
    "num_threads 0": ({"model_loader_extra_config": {"enable_multithread_load": True, "num_threads": 0}},
                      "serving.model_loader_extra_config.num_threads"),
    "num_threads true": ({"model_loader_extra_config": {"enable_multithread_load": True, "num_threads": True}},
                         "serving.model_loader_extra_config.num_threads"),
    "num_threads without multi-thread": ({"model_loader_extra_config": {"num_threads": 4}},
                                         "serving.model_loader_extra_config.num_threads"),
    "strategy with fastsafetensors": ({"load_format": "fastsafetensors", "safetensors_load_strategy": "eager"},
                                      "serving.safetensors_load_strategy"),
    "runai_streamer, unknown key": ({"load_format": "runai_streamer", "model_loader_extra_config": {"threads": 4}},
                                    "serving.model_loader_extra_config.threads"),
    "runai_streamer, concurrency 0": ({"load_format": "runai_streamer",
                                       "model_loader_extra_config": {"concurrency": 0}},
                                      "serving.model_loader_extra_config.concurrency"),
    "sharded_state, unknown key": ({"load_format": "sharded_state", "model_loader_extra_config": {
        "pattern": "m-{rank}.safetensors", "parts": 2}}, "serving.model_loader_extra_config.parts"),
    "dummy with extra config": ({"load_format": "dummy", "model_loader_extra_config": {"enable_weights_track": True}},
                                "serving.load_format"),
    "ipc_cache, unknown key": ({"load_format": "ipc_cache", "model_loader_extra_config": {"socket": "/tmp/x"}},
                               "serving.load_format"),
}
VLLM_TAKES_IT = {"num_threads true", "num_threads without multi-thread", "strategy with fastsafetensors"}
"""Where vLLM 0.33.0 starts anyway and the plan is stricter: `True` passes its isinstance(int) check
(default_loader.py:123-129, one thread), and the other two settings are read by no code path with that loader."""


def test_every_refused_capture_has_its_stack_case() -> None:
    assert set(REFUSED) == set(CAPTURE["refused"])


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_real_vllm_refuses_the_plan_refuses_first(name: str) -> None:
    serving, key = REFUSED[name]
    got = CAPTURE["refused"][name]
    assert ("ok" in got) == (name in VLLM_TAKES_IT), got
    problems = _problems(lab_values(**serving))
    assert key in {p.key for p in problems}, [p.render() for p in problems]


# --- accepted combinations and what they render -----------------------------------------------------------------


def test_the_defaults_render_no_flag() -> None:
    argv = _argv(_plan(lab_values()))
    assert not [w for w in argv if w in FLAGS]


@pytest.mark.parametrize(("serving", "flags"), [
    ({"load_format": "fastsafetensors"}, ["--load-format", "fastsafetensors"]),
    ({"load_format": "instanttensor"}, ["--load-format", "instanttensor"]),
    ({"safetensors_load_strategy": "prefetch"}, ["--safetensors-load-strategy", "prefetch"]),
    ({"load_format": "safetensors", "safetensors_load_strategy": "eager"},
     ["--load-format", "safetensors", "--safetensors-load-strategy", "eager"]),
    ({"model_loader_extra_config": {"num_threads": 8, "enable_multithread_load": True}},
     ["--model-loader-extra-config", '{"enable_multithread_load":true,"num_threads":8}']),
    ({"load_format": "hf", "model_loader_extra_config": {"enable_weights_track": False}},
     ["--load-format", "hf", "--model-loader-extra-config", '{"enable_weights_track":false}']),
])
def test_accepted_settings_render_as_vllms_flags(serving: dict[str, Any], flags: list[str]) -> None:
    argv = _argv(_plan(lab_values(**serving)))
    start = argv.index(flags[0])
    assert argv[start:start + len(flags)] == flags
    assert sum(w in FLAGS for w in argv) == sum(w in FLAGS for w in flags)


def test_extra_args_cannot_set_a_loader_flag() -> None:
    values = lab_values()
    values["serving"]["extra_args"] = ["--load-format", "safetensors"]
    problem = _one(_problems(values), "serving.extra_args.0")
    assert "which the config manages" in problem.message and "serving.load_format" in (problem.fix or "")


# --- the image card ------------------------------------------------------------------------------------------------


def test_a_format_whose_package_the_image_lacks_is_refused() -> None:
    problem = _one(_problems(lab_values(load_format="runai_streamer")), "serving.load_format")
    assert "runai-model-streamer" in problem.message
    assert "images/vllm_vllm-openai_v0.33.0.json: load_formats.runai_streamer.packages" in problem.message
    assert "vllm/utils/import_utils.py" in (problem.upstream or "")


def test_a_format_the_card_does_not_list_names_the_registry() -> None:
    problem = _one(_problems(lab_values(load_format="bitsandbytes")), "serving.load_format")
    assert "registers no such load format" in problem.message
    assert "model_loader/__init__.py:126-127" in (problem.upstream or "")
    assert "fastsafetensors" in (problem.fix or "") and "bitsandbytes" not in (problem.fix or "")


def test_a_card_without_load_formats_accepts_only_the_default() -> None:
    """The 0.32.0 card was taken with probe 2: it does not say which formats its image registers."""
    values = lab_values(load_format="fastsafetensors")
    values["image"] = "vllm/vllm-openai:v0.32.0"
    problem = _one(_problems(values), "serving.load_format")
    assert "records no load formats" in problem.message and "image-card" in (problem.fix or "")
    values["serving"]["load_format"] = "auto"
    assert not [w for w in _argv(_plan(values)) if w in FLAGS]


def _own_image_card(root: Path, found: bool) -> str:
    """A project image card of another reference whose loader packages are all `found`."""
    card = json.loads((ROOT / "images" / "vllm_vllm-openai_v0.33.0.json").read_text())
    card["image"] = {"refs": ["example.org/vllm-loaders:v0.33.0"], "digests": [], "taken_with": "test"}
    for entry in [*card["load_formats"].values(), *card["safetensors_load_strategies"].values()]:
        for package in entry["packages"].values():
            package |= {"found": found, "version": "0.15.1" if found else None}
    (root / "images").mkdir(exist_ok=True)
    (root / "images" / "example.org_vllm-loaders_v0.33.0.json").write_text(json.dumps(card))
    return "example.org/vllm-loaders:v0.33.0"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path))
    from stacks.planner import image_cards
    image_cards.cards_in.cache_clear()
    yield tmp_path
    image_cards.cards_in.cache_clear()


def test_an_image_with_the_packages_plans_runai_and_tensorizer(project: Path) -> None:
    image = _own_image_card(project, found=True)
    values = lab_values(load_format="runai_streamer", model_loader_extra_config={
        "concurrency": 16, "memory_limit": -1, "distributed": True})
    values["image"] = image
    argv = _argv(_plan(values))
    assert argv[argv.index("--model-loader-extra-config") + 1] == '{"concurrency":16,"distributed":true,' \
                                                                  '"memory_limit":-1}'
    values = lab_values(load_format="tensorizer", tensor=2, model_loader_extra_config={
        "tensorizer_uri": "s3://weights/qwen3-8b/model-rank-%03d.tensors", "num_readers": 4, "verify_hash": True})
    values["image"] = image
    _plan(values)


def test_torchao_needs_the_package_and_a_torchao_checkpoint(project: Path) -> None:
    problems = _problems(lab_values(safetensors_load_strategy="torchao"))
    messages = [p.message for p in problems if p.key == "serving.safetensors_load_strategy"]
    assert any("records no torchao" in m for m in messages), messages
    assert any("models/qwen3-8b.json records quantization none" in m for m in messages), messages
    values = lab_values(safetensors_load_strategy="torchao")
    values["image"] = _own_image_card(project, found=True)
    problem = _one(_problems(values), "serving.safetensors_load_strategy")  # the package is there now
    assert "not torchao" in problem.message and "vllm/config/load.py:82-85" in problem.message


# --- the loaders' own rules --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "why"), [("dummy", "random values"), ("ipc_cache", "vllm preload")])
def test_formats_this_tool_cannot_serve_are_refused(fmt: str, why: str) -> None:
    problem = _one(_problems(lab_values(load_format=fmt)), "serving.load_format")
    assert why in problem.message and "auto" in (problem.fix or "")


@pytest.mark.parametrize(("tensor", "pattern", "said"), [
    (2, "model-part-{part}.safetensors", "has no {tp_rank} or {rank} while parallelism.tensor is 2"),
    (1, "model-pp-{pp_rank}-part-{part}.safetensors", "has {pp_rank} while parallelism.pipeline is 1"),
    (1, "model-{shard}-{part}.safetensors", "placeholders other than pp_rank, tp_rank, rank and part"),
    (1, "../elsewhere-{part}.safetensors", "outside the model directory"),
    (1, "model-{}-{part}.safetensors", "placeholders other than"),
    (1, "model-{rank-{part}.safetensors", "placeholders other than"),
])
def test_shard_patterns_are_checked_against_tp_and_pp(tensor: int, pattern: str, said: str) -> None:
    values = lab_values(load_format="sharded_state", tensor=tensor, model_loader_extra_config={"pattern": pattern})
    problem = _one(_problems(values), "serving.model_loader_extra_config.pattern")
    assert said in problem.message, problem.render()
    assert "sharded_state_loader.py" in problem.message


def test_tensorizer_over_tp_needs_a_per_rank_uri_and_no_plain_credentials(project: Path) -> None:
    image = _own_image_card(project, found=True)
    values = lab_values(load_format="tensorizer", tensor=2)
    values["image"] = image
    problems = _problems(values)
    assert any("no per-rank template" in p.message for p in problems if p.key == "serving.load_format")
    values["serving"]["model_loader_extra_config"] = {"tensorizer_uri": "s3://b/model.tensors",
                                                      "s3_secret_access_key": "abc123"}
    problems = _problems(values)
    assert "has no per-rank template" in _one(problems, "serving.model_loader_extra_config.tensorizer_uri").message
    secret = _one(problems, "serving.model_loader_extra_config.s3_secret_access_key")
    assert secret.value == "…" and "env_secrets.S3_SECRET_ACCESS_KEY" in (secret.fix or "")
    values["serving"]["model_loader_extra_config"] = {"tensorizer_uri": "/elsewhere/model-%03d.tensors"}
    problem = _one(_problems(values), "serving.model_loader_extra_config.tensorizer_uri")
    assert "not inside a directory the engine container mounts" in problem.message


# --- the model card's files ----------------------------------------------------------------------------------------


def _card_with_shards(root: Path, names: list[str]) -> str:
    card = json.loads((ROOT / "models" / "qwen3-8b.json").read_text())
    card["name"] = "qwen3-8b-shards"
    card["weights"] = {**card["weights"], "shards": [{"name": n, "bytes": 1} for n in names],
                       "source": "model.safetensors.index.json and every shard's safetensors header"}
    (root / "models").mkdir(exist_ok=True)
    (root / "models" / "qwen3-8b-shards.json").write_text(json.dumps(card))
    return "qwen3-8b-shards"


HF_SHARDS = [f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)]


@pytest.mark.parametrize(("fmt", "reads"), [
    ("sharded_state", "model-rank-0-part-*.safetensors"),
    ("mistral", "consolidated*.safetensors"),
    ("pt", "*.pt"),
    ("npcache", "*.bin"),
])
def test_a_format_whose_files_the_model_card_lacks_is_refused(project: Path, fmt: str, reads: str) -> None:
    values = lab_values(load_format=fmt)
    values["model"]["profile"] = _card_with_shards(project, HF_SHARDS)
    problem = _one(_problems(values), "serving.load_format")
    assert f"reads {reads} from the model directory" in problem.message
    assert "model-00001-of-00005.safetensors" in problem.message
    assert "default_loader.py" in problem.message or "sharded_state_loader.py" in problem.message


def test_the_files_a_format_reads_plan_when_the_card_lists_them(project: Path) -> None:
    values = lab_values(load_format="sharded_state", tensor=2)
    values["model"]["profile"] = _card_with_shards(project, ["model-rank-0-part-0.safetensors",
                                                             "model-rank-1-part-0.safetensors"])
    _plan(values)
    values["serving"]["load_format"] = "safetensors"
    values["model"]["profile"] = _card_with_shards(project, HF_SHARDS)
    _plan(values)


def test_a_card_without_file_names_warns_instead() -> None:
    plan = _plan(lab_values(load_format="sharded_state"))
    warning = next(w for w in plan.warnings if w.startswith("serving.load_format sharded_state"))
    assert "lists no weight files" in warning and "model-rank-0-part-*.safetensors" in warning


# --- hostile values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [
    ("load_format", ""), ("load_format", "safetensörs"), ("load_format", "auto;rm -rf /"),
    ("load_format", "auto\n--trust-remote-code"), ("load_format", "AUTO"), ("load_format", "x" * 65),
    ("load_format", 7), ("safetensors_load_strategy", "Eager"), ("safetensors_load_strategy", ""),
    ("model_loader_extra_config", {"pattern": "a b"}), ("model_loader_extra_config", {"pattern": "a;b"}),
    ("model_loader_extra_config", {"pattern": "é-{part}"}), ("model_loader_extra_config", {"pattern": ""}),
    ("model_loader_extra_config", {"pattern": "x\n"}), ("model_loader_extra_config", {"pattern": "x" * 1025}),
    ("model_loader_extra_config", {"num_threads": 1.5}), ("model_loader_extra_config", {"num_threads": 2**60}),
    ("model_loader_extra_config", {"num_threads": {"a": [1] * 1000}}),
    ("model_loader_extra_config", {f"k{i}": True for i in range(9)}),
    ("model_loader_extra_config", {"Bad-Key": True}),
    ("model_loader_extra_config", {"tensorizer_uri": "https://user:hunter2@example.org/m.tensors"}),
    ("model_loader_extra_config", "enable_multithread_load=true"),
])
def test_hostile_values_are_refused_before_anything_is_planned(key: str, value: Any) -> None:
    values = lab_values()
    values["serving"][key] = copy.deepcopy(value)
    problems = _problems(values)
    assert any(p.key.startswith(f"serving.{key}") for p in problems), [p.render() for p in problems]
    for problem in problems:
        assert "hunter2" not in problem.render()


def test_every_format_the_shipped_card_lists_has_rules_here() -> None:
    """The 0.33.0 card lists vLLM's registry (model_loader/__init__.py:50-66); the planner has a rule for each, with
    the loader class vLLM registers it to, so no format of that image plans unchecked."""
    from stacks.planner.load_formats import LOADERS

    card = json.loads((ROOT / "images" / "vllm_vllm-openai_v0.33.0.json").read_text())
    assert set(card["load_formats"]) == set(LOADERS)
    for name, entry in card["load_formats"].items():
        assert entry["loader"].rsplit(".", 1)[-1] == LOADERS[name].loader, name
    assert set(card["safetensors_load_strategies"]) == {"lazy", "eager", "prefetch", "torchao"}


@pytest.mark.parametrize("name", ["unknown extra-config key, default loader", "runai_streamer, unknown key",
                                  "sharded_state, unknown key"])
def test_an_unknown_key_is_refused_with_the_loaders_own_words(name: str) -> None:
    serving, key = REFUSED[name]
    problem = _one(_problems(lab_values(**serving)), key)
    assert (problem.upstream or "").startswith(f"ValueError: {CAPTURE['refused'][name]['message']} ("), problem.render()


def _wide_ep(**changes: Any) -> dict[str, Any]:
    from stacks.model.loader import read_stack_values

    values = copy.deepcopy(read_stack_values("wide-ep", ROOT / "examples"))
    values["parallelism"] |= {"ep_weight_filter": True, "eplb": {"enabled": False}}
    values["serving"] |= changes
    return values


@pytest.mark.parametrize(("serving", "said"), [
    ({"load_format": "fastsafetensors"}, "does nothing with load format fastsafetensors"),
    ({"model_loader_extra_config": {"enable_multithread_load": True}}, "auto and enable_multithread_load"),
])
def test_the_expert_weight_filter_needs_a_reader_that_skips_experts(serving: dict[str, Any], said: str) -> None:
    """default_loader.py:312-349: only the plain safetensors reader and InstantTensor get the rank's expert ids."""
    _plan(_wide_ep())
    _plan(_wide_ep(load_format="instanttensor"))
    problem = _one(_problems(_wide_ep(**serving)), "parallelism.ep_weight_filter")
    assert said in problem.message and "default_loader.py:312-349" in problem.message
