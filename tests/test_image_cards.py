"""Image cards: the offline value checks against the real vLLM 0.33.0 and 0.32.0 cards in images/, the card
matching, and the warning for an image without a card.

The two cards were taken by checks/image_card_probe.py from the vLLM wheels on PyPI (throwaway venvs,
VLLM_TARGET_DEVICE=cpu); each expectation below is what that release's parser or config classes do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from review.plan_diff import diff_plans, to_markdown
from stacks.model.errors import Problem
from stacks.planner import image_cards
from stacks.planner.image_cards import all_cards, card_file_name, card_for, card_of_version
from stacks.planner.managed_options import NO_CARD
from stacks.planner.option_values import option_value_problem
from stacks.planner.serve_options import card_table, read_argv
from tests.conftest import ROOT, plan_of, problems_of
from tests.docker_harness import FLAGS, build_image, docker_ready, remove_image, standin_env


def _extra(values: dict[str, Any], *words: str, tag: str = "v0.33.0") -> dict[str, Any]:
    values["image"] = {"repository": "vllm/vllm-openai", "tag": tag}
    values["serving"]["extra_args"] = list(words)
    return values


def _one(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, [p.render() for p in problems]
    return problems[0]


# (extra argv, the problem's text, what works): one row per kind of rule the card holds.
KINDS = [
    (["--seed", "abc"], "--seed: not an int (argparse type int)", "an integer"),
    (["--compilation-config", '{"compile_cache_save_format": "zip"}'],
     '--compilation-config: compile_cache_save_format: CompilationConfig.compile_cache_save_format takes one of '
     '"binary", "unpacked"', 'one of "binary", "unpacked"'),
    (["--compilation-config", "{bad"], "--compilation-config: not JSON (Expecting property name enclosed in "
     "double quotes at line 1 column 2); vLLM parses it as CompilationConfig", "valid JSON"),
    (["--attention-config", '{"flash_attn_versoin": 3}'], "AttentionConfig of vLLM 0.33.0 has no field "
     "'flash_attn_versoin' (it forbids extra fields)", "did you mean 'flash_attn_version'?"),
    (["--compilation-config", '{"pass_config": {"fuse_norm_quantt": true}}'],
     "PassConfig of vLLM 0.33.0 has no field 'pass_config.fuse_norm_quantt'", "did you mean 'fuse_norm_quant'?"),
    (["--compilation-config.levle", "3"], "--compilation-config.levle: CompilationConfig of vLLM 0.33.0 has no "
     "field 'levle'", "one of backend,"),
    (["--enable-chunked-prefill", "--long-prefill-token-threshold", "-5"],
     "SchedulerConfig.long_prefill_token_threshold must be >= 0", "a value >= 0"),
    (["--enable-chunked-prefill", "--max-num-active-seqs", "0"],
     "SchedulerConfig.max_num_active_seqs must be >= 1", "a value >= 1"),
    (["--max-logprobs", "1.5"], "--max-logprobs: not an int", "an integer"),
    (["--max-num-queued-tokens", "3.5K"], "decimals are not allowed with binary suffixes like K", "3.5k (decimal)"),
    (["--max-lora-rank", "7"], "--max-lora-rank takes one of 1, 8, 16", "one of 1, 8"),
    (["-O9"], "-O (--optimization-level): VllmConfig.optimization_level takes one of 0, 1, 2, 3", "one of 0, 1, 2, 3"),
    (["-Obanana"], "-O (--optimization-level): VllmConfig.optimization_level takes one of 0, 1, 2, 3",
     "one of 0, 1, 2, 3"),
    (["--optimization-level", "9"], "--optimization-level: VllmConfig.optimization_level takes one of 0, 1, 2, 3",
     "one of 0, 1, 2, 3"),
    (["--compilation-config", '{"mode":"banana"}'], '--compilation-config: mode: CompilationConfig.mode '
     "takes one of 0, 1, 2, 3, NONE, STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE (names in any case) or null",
     "one of 0, 1, 2, 3, NONE"),
    (["--compilation-config", '{"cudagraph_capture_sizes":"x"}'], '--compilation-config: cudagraph_capture_sizes: '
     "CompilationConfig.cudagraph_capture_sizes takes a JSON list, each item an integer", "a JSON list"),
    (["--compilation-config", '{"cudagraph_capture_sizes":[1, "x"]}'], "CompilationConfig.cudagraph_capture_sizes "
     "takes a JSON list, each item an integer", "each item an integer"),
]


@pytest.mark.parametrize(("words", "message", "fix"), KINDS, ids=[
    "int-type", "literal-choice", "json-parse", "json-unknown-field", "json-nested-field", "dotted-field",
    "bound-ge0", "bound-ge1", "float-for-int", "human-readable-int", "argparse-choice", "O-joined-range",
    "O-joined-text", "optimization-level", "json-enum", "json-list-type", "json-list-item-type"])
def test_v033_card_refuses_a_wrong_value_offline(words: list[str], message: str, fix: str,
                                                 h20_values: dict[str, Any]) -> None:
    problem = _one(problems_of(_extra(h20_values, *words)))
    assert problem.key.startswith("serving.extra_args.")
    assert message in problem.message, problem.render()
    assert fix in (problem.fix or ""), problem.render()
    if "takes one of 1, 8" not in problem.message:  # argparse's own choice check names no card
        assert "images/vllm_vllm-openai_v0.33.0.json" in problem.message  # the card that holds the rule
    assert words[-1] in str(problem.value)  # the value once, next to its key; the message names the rule
    values = [words[-1]] + ([v for v in json.loads(words[-1]).values() if isinstance(v, str)]
                            if words[-1].startswith('{"') else [])
    for value in values:
        assert not re.search(rf"(?<![\w.]){re.escape(value)}(?![\w.])", problem.message), problem.render()

DECIDED = json.loads((ROOT / "tests" / "fixtures" / "vllm" / "option_values_0.33.0.json").read_text())


@pytest.mark.parametrize("case", DECIDED["cases"], ids=[" ".join(c["argv"])[:60] for c in DECIDED["cases"]])
def test_the_card_decides_as_vllms_own_parser(case: dict[str, Any]) -> None:
    """Each argv was parsed by vLLM 0.33.0 itself (bench/option_values_real_vllm.py, recorded in the fixture):
    the offline check against its card accepts and refuses the same values."""
    table = card_table(card_of_version("0.33.0"))
    items = read_argv(case["argv"], table)
    problems = [i.problem for i in items if i.problem] + [
        bad[0] for i in items if not i.problem and (bad := option_value_problem(i, table)) is not None]
    assert ("refuse" if problems else "accept") == case["vllm"], problems


@pytest.mark.parametrize("words", [
    ["--seed", "7"], ["--max-num-queued-tokens", "32k"], ["--max-num-active-seqs", "4"],
    ["--compilation-config", '{"mode": 3, "pass_config": {"fuse_norm_quant": true}}'],
    ["--compilation-config.cudagraph_mode", "FULL"], ["--attention-config", '{"flash_attn_version": 3}'],
    ["--structured-outputs-config", '{"backend": "auto"}'],
    ["--enable-log-requests"],
])
def test_v033_card_accepts_what_vllm_accepts(words: list[str], h20_values: dict[str, Any]) -> None:
    plan = plan_of(_extra(h20_values, *words))
    assert plan.image["card"] == "images/vllm_vllm-openai_v0.33.0.json"
    assert not [w for w in plan.warnings if NO_CARD in w]


def test_a_rendered_value_is_checked_against_the_card_too(h20_values: dict[str, Any]) -> None:
    """0.32.0 has no capability-table entry, so only its card knows that `fp3` is no KV cache dtype."""
    h20_values["image"] = {"repository": "vllm/vllm-openai", "tag": "v0.32.0"}
    h20_values["serving"]["kv_cache_dtype"] = "fp3"
    problem = _one(problems_of(h20_values))
    assert problem.key == "serving.kv_cache_dtype" and problem.value == "fp3"
    assert problem.message.startswith("--kv-cache-dtype takes one of auto, bfloat16, float16, fp8,")  # argparse's
    assert problem.message.endswith("(images/vllm_vllm-openai_v0.32.0.json)")


@pytest.mark.parametrize(("words", "on_033", "on_032"), [
    (["--disable-chunked-prefill"], None, "vLLM 0.32.0 has no option '--disable-chunked-prefill'"),
    (["--watchdog-config", "{}"], None, "vLLM 0.32.0 has no option '--watchdog-config'"),
    (["--no-disable-cascade-attn"], None, None),
    (["--enable-cascade-attn"], None, "vLLM 0.32.0 has no option '--enable-cascade-attn'"),
    (["--no-enable-cascade-attn"], "vLLM 0.33.0 has no option '--no-enable-cascade-attn'",
     "vLLM 0.32.0 has no option '--no-enable-cascade-attn'"),  # argparse registers --no- for the declared name only
])
def test_the_two_releases_differ_where_their_parsers_differ(words: list[str], on_033: str | None,
                                                            on_032: str | None, h20_values: dict[str, Any]) -> None:
    for tag, expected in (("v0.33.0", on_033), ("v0.32.0", on_032)):
        values = _extra(json.loads(json.dumps(h20_values)), *words, tag=tag)
        if expected is None:
            plan_of(values)
        else:
            assert expected in _one(problems_of(values)).message


def test_cards_are_the_releases_own(h20_values: dict[str, Any]) -> None:
    new, old = card_table(card_of_version("0.33.0")), card_table(card_of_version("0.32.0"))
    assert new.options["--enable-chunked-prefill"].dest == "enable_chunked_prefill"
    assert "--disable-chunked-prefill" in new.options and "--disable-chunked-prefill" not in old.options
    assert new.options["--kv-cache-dtype"].choices is None  # 0.33.0 validates it in CacheConfig instead
    assert old.options["--kv-cache-dtype"].choices and "fp8" in old.options["--kv-cache-dtype"].choices
    assert new.options["--gpu-memory-utilization"].bounds == {"gt": 0, "le": 1}
    item = read_argv(["--tensor_parallel_size=8"], new)[0]
    assert item.dest == "tensor_parallel_size" and item.values == ["8"]
    for card in all_cards():
        assert (ROOT / card.path).is_file() and card.refs and card.vllm_version in card.path


def test_an_image_without_a_card_warns_in_every_plan(h20_values: dict[str, Any], prod_values: dict[str, Any]
                                                     ) -> None:
    plan = plan_of(prod_values)  # the committed prod stack runs a nightly nobody has carded
    warning = next(w for w in plan.warnings if NO_CARD in w)
    assert "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657" in warning
    assert "python -m stacks image-card" in warning and plan.image["card"] is None
    # without a card the values are not checked, only named: a wrong int still plans, with the warning
    plan = plan_of(_extra(h20_values, "--seed", "abc", tag="v0.99.0"))
    assert any(NO_CARD in w for w in plan.warnings)


def test_a_tag_card_does_not_describe_another_digest() -> None:
    card, _ = card_for("docker.io/vllm/vllm-openai:v0.33.0", None)
    assert card is not None and card.vllm_version == "0.33.0"
    assert card_for("vllm/vllm-openai:v0.33.0", "sha256:" + "ab" * 32)[0] is not None  # the card records none
    assert card_for("vllm/vllm-openai:v0.34.0", None) == (None, None)
    assert card_file_name("vllm/vllm-openai:v0.33.0@sha256:" + "ab" * 32) == "vllm_vllm-openai_v0.33.0"


def test_scheduler_rules_are_decided_offline(h20_values: dict[str, Any]) -> None:
    """vllm/config/scheduler.py:317-345 (0.33.0): the messages are vLLM's, checked by create_engine_config on
    real vLLM in bench/engine_config_real_vllm.py."""
    h20_values["serving"]["max_num_batched_tokens"] = 8192
    problems = problems_of(_extra(h20_values, "--disable-chunked-prefill", "--max-num-active-seqs", "16"))
    budget = next(p for p in problems if p.key == "serving.max_num_batched_tokens")
    assert budget.upstream is not None and budget.upstream.startswith(
        "ValueError: max_num_batched_tokens (8192) is smaller than max_model_len (65536). This effectively limits")
    active = next(p for p in problems if p.key == "serving.extra_args.1")
    assert active.upstream is not None and active.upstream.startswith(
        "ValueError: max_num_active_seqs (16) cannot be greater than max_num_seqs (8).")
    h20_values["serving"]["max_num_batched_tokens"] = 65536  # a whole prompt fits: fine without chunking
    plan_of(_extra(h20_values, "--no-enable-chunked-prefill", "--max-num-active-seqs", "8"))


def _image_card(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", "image-card", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_image_card_with_an_interpreter_writes_a_card_the_planner_reads(tmp_path: Path, h20_values: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--python`: the probe runs with that interpreter (here one that imports the test vLLM package, whose
    parser is built from the real 0.33.0 option dump); the card it writes is what a plan then checks against."""
    out = _image_card("vllm-cluster-test/vllm:0.33.0", "--python", sys.executable, "--out", str(tmp_path),
                      env=standin_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"wrote {tmp_path}/vllm-cluster-test_vllm_0.33.0.json: vLLM 0.33.0, ")
    assert "sections the probe could not read" in out.stdout and "routes" in out.stdout  # named, not hidden
    document = json.loads((tmp_path / "vllm-cluster-test_vllm_0.33.0.json").read_text())
    assert document["image"]["refs"] == ["vllm-cluster-test/vllm:0.33.0"] and document["image"]["digests"] == []
    flags = json.loads(FLAGS.read_text())["flags"]
    dumped = {o for f in flags for o in f.get("options", []) if o not in ("-h", "--help")}
    carded = {o for entry in document["options"] for o in entry["all_option_strings"]}
    assert dumped <= carded
    monkeypatch.setattr(image_cards, "CARDS", tmp_path)
    image_cards.cards_in.cache_clear()
    image_cards.card_of_version.cache_clear()
    try:
        values = _extra(h20_values, "--seed", "abc")
        values["image"] = {"repository": "vllm-cluster-test/vllm", "tag": "0.33.0"}
        problem = _one(problems_of(values))
        assert "--seed: not an int (argparse type int)" in problem.message
        assert "images/vllm-cluster-test_vllm_0.33.0.json" in problem.message
    finally:
        image_cards.cards_in.cache_clear()
        image_cards.card_of_version.cache_clear()


def test_image_card_runs_the_probe_inside_the_image(tmp_path: Path) -> None:
    why = docker_ready()
    assert why is None, f"this test needs a Docker engine (.ci/run starts dockerd): {why}"
    # tags unique to this process: a second test run on the same Docker engine removes its own images, not ours
    tag = f"card-{os.getpid()}"
    good = build_image(f"vllm-cluster-test/vllm:{tag}", tmp_path)
    bare = build_image(f"vllm-cluster-test/python:{tag}-bare", tmp_path, with_vllm=False)
    try:
        out = _image_card(good, "--out", str(tmp_path / "cards"))
        assert out.returncode == 0, out.stderr
        card = image_cards.parse_card("c", json.loads((tmp_path / "cards" / f"vllm-cluster-test_vllm_{tag}.json")
                                                      .read_text()))
        assert card.refs == (f"vllm-cluster-test/vllm:{tag}",) and card.vllm_version == "0.33.0"
        assert "--tensor-parallel-size" in card_table(card).options
        assert "docker run --network none" in card.taken_with
        refused = _image_card(bare, "--out", str(tmp_path / "cards"))
        assert refused.returncode == 2
        assert refused.stderr.startswith(f"image-card {bare}: the probe ")
        assert "vllm" in refused.stderr.lower() and "Traceback" not in refused.stderr.splitlines()[0]
    finally:
        remove_image(good)
        remove_image(bare)


def test_a_diff_names_the_missing_card_every_time(prod_values: dict[str, Any]) -> None:
    plan = plan_of(prod_values).to_json_dict()
    md = to_markdown(diff_plans("prod", "main", plan, plan))  # no change at all: still said
    assert f"- **Image card:** {NO_CARD} vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657" in md


@pytest.mark.parametrize(("args", "said"), [
    (["vllm/vllm-openai"], "has no tag; write it as repository:tag"),
    (["vllm/vllm-openai:v0.34.0", "--python", "/nonexistent/python"], "'/nonexistent/python' is not installed"),
    (["vllm/vllm-openai:v0.34.0", "--python", sys.executable], "the probe found no `vllm serve` options"),
])
def test_image_card_refuses_with_exit_2_and_why(args: list[str], said: str, tmp_path: Path) -> None:
    out = _image_card(*args, "--out", str(tmp_path))  # this interpreter has no vLLM
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_image_card_names_a_python_path_with_a_newline_escaped_every_time(tmp_path: Path) -> None:
    """The path was named twice, the second time raw: a newline in it printed a second line."""
    out = _image_card("vllm/vllm-openai:v0.34.0", "--python", "/tmp/a\nb", "--out", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--python '/tmp/a\\nb' is not installed here" in out.stderr, out.stderr


def test_probe_reprs_carry_no_object_addresses() -> None:
    """A default or type that holds a function renders as `<function ...<lambda>>`, not `... at 0x7f...>`: the
    same image gives the same card bytes on every run (timings aside), and the committed cards hold no address.
    The probe is a script (importing it runs it), so its helpers are compiled from its source."""
    import ast
    import re
    import typing

    tree = ast.parse((ROOT / "checks" / "image_card_probe.py").read_text())
    wanted = {"_ADDRESS", "stable_repr", "_type_str", "jsonsafe"}
    nodes = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in wanted) or (
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in wanted for t in n.targets))]
    assert len(nodes) == len(wanted)
    space: dict[str, Any] = {"re": re, "Any": Any, "math": __import__("math"),
                             "dataclasses": __import__("dataclasses"), "enum": __import__("enum")}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "image_card_probe.py", "exec"), space)

    hint = typing.Annotated[int | None, (lambda x: x)]
    assert " at 0x" in repr(hint)
    assert " at 0x" not in space["_type_str"](hint) and "<lambda>>" in space["_type_str"](hint)
    assert " at 0x" not in str(space["jsonsafe"](object()))
    for card in sorted((ROOT / "images").glob("*.json")):
        assert not re.search(r" at 0x[0-9a-fA-F]+>", card.read_text()), card


def _program(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("make", "said"), [
    (lambda d: str(d), "is a directory"),
    (lambda d: _program(d / "garbage", "echo 'not a card'"), "printed no card: not a card"),
    (lambda d: _program(d / "dies", "kill -9 $$"), "killed by signal 9"),
    (lambda d: _program(d / "exits", "exit 3"), "(exit 3)"),
    (lambda d: _program(d / "list", "echo '[1, 2]'"), "JSON that is not a card (a list)"),
    (lambda d: _program(d / "shape", """echo '{"options": [1], "vllm_version": "x"}'"""), "not a list of options"),
    (lambda d: _program(d / "bytes", r"printf '\377\376'"), "printed no card"),
    (lambda d: (d / "noexec").write_text("x") and str(d / "noexec"), "is not executable"),
    (lambda d: "/bin/true", "printed no card"),
], ids=["directory", "garbage", "killed", "exit-3", "json-list", "bad-shape", "not-utf8", "no-exec-bit", "true"])
def test_image_card_python_that_is_no_interpreter_is_exit_2_naming_the_path(
        make: Any, said: str, tmp_path: Path) -> None:
    """Whatever `--python` turns out to be, the refusal names it; a program that exits without reading the probe
    on its stdin does not kill `python -m stacks` with SIGPIPE (it once ended 141 without a word)."""
    where = tmp_path / "p"
    where.mkdir()
    python = make(where)
    out = _image_card("vllm/vllm-openai:v0.34.0", "--python", python, "--out", str(tmp_path / "cards"))
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert f"--python {python!r}" in out.stderr and said in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert not (tmp_path / "cards").exists()


def test_model_class_reader_takes_the_cuda_branch_and_follows_bases(tmp_path: Path) -> None:
    """checks/model_classes.py on a small tree shaped like vLLM 0.33.0's: a package that imports a CPU class
    without LoRA where `current_platform.is_cpu()` and the NVIDIA one (SupportsLoRA through a base) otherwise;
    a lazy `__getattr__` package; an `X = Y` alias; a class made by a call, which stays unresolved."""
    from checks.model_classes import lora_by_architecture

    files = {
        "vllm/__init__.py": "",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/models/__init__.py": "",
        "vllm/model_executor/models/interfaces.py":
            "class SupportsLoRA(Protocol):\n    supports_lora: ClassVar[Literal[True]] = True\n"
            "class SupportsPP(Protocol):\n    supports_pp = True\n",
        "vllm/model_executor/models/plain.py":
            "from torch import nn\nfrom .interfaces import SupportsPP\nfrom . import interfaces\n"
            "class Base(nn.Module, interfaces.SupportsLoRA):\n    pass\n"
            "class Plain(nn.Module, SupportsPP):\n    pass\n"
            "class Lora(Base):\n    pass\nAlias = Lora\nMade = wrap(Lora)\n",
        "vllm/models/__init__.py": "",
        "vllm/models/split/__init__.py":
            "from vllm.platforms import current_platform\nif current_platform.is_rocm():\n"
            "    from .amd import Split\nelif current_platform.is_cpu():\n    from .cpu import Split\n"
            "else:\n    from .nvidia import Split\n",
        "vllm/models/split/cpu.py": "from torch import nn\nclass Split(nn.Module):\n    pass\n",
        "vllm/models/split/nvidia.py":
            "from vllm.model_executor.models.plain import Base\nclass Split(Base):\n    pass\n",
        "vllm/models/lazy/__init__.py":
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .nvidia import Lazy\n"
            "def __getattr__(name):\n    from .nvidia import Lazy\n    return Lazy\n",
        "vllm/models/lazy/nvidia.py":
            "from vllm.model_executor.models.interfaces import SupportsPP\nclass Lazy(SupportsPP):\n    pass\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    models = "vllm.model_executor.models.plain"
    found = lora_by_architecture(str(tmp_path / "vllm"), {
        "PlainArch": (models, "Plain"), "LoraArch": (models, "Lora"), "AliasArch": (models, "Alias"),
        "MadeArch": (models, "Made"), "SplitArch": ("vllm.models.split", "Split"),
        "LazyArch": ("vllm.models.lazy", "Lazy"), "GoneArch": ("vllm.models.gone", "Gone")})
    assert found["supported"] == {"AliasArch": "vllm/model_executor/models/plain.py:8 Lora",
                                  "LoraArch": "vllm/model_executor/models/plain.py:8 Lora",
                                  "SplitArch": "vllm/models/split/nvidia.py:2 Split"}
    assert found["unsupported"] == {"LazyArch": "vllm/models/lazy/nvidia.py:2 Lazy",
                                    "PlainArch": "vllm/model_executor/models/plain.py:6 Plain"}
    assert set(found["unresolved"]) == {"MadeArch", "GoneArch"}
    assert "not a class statement" in found["unresolved"]["MadeArch"]


def test_the_cards_say_which_committed_models_support_lora_on_cuda() -> None:
    """Every committed model card's architecture is resolved in both cards' lora_architectures (read from the
    wheels by checks/model_classes.py); DeepSeek V4.1's CUDA class has no SupportsLoRA, V3's and Llama's have."""
    for card in (card_of_version("0.33.0"), card_of_version("0.32.0")):
        lora = card.raw["lora_architectures"]
        assert lora["platform"] == "cuda"
        for model in sorted((ROOT / "models").glob("*.json")):
            arch = json.loads(model.read_text())["architecture"]
            assert arch in lora["supported"] or arch in lora["unsupported"], (card.name, model.name, arch)
        assert "DeepseekV41ForCausalLM" in lora["unsupported"]
        assert {"DeepseekV3ForCausalLM", "LlamaForCausalLM", "DeepseekV4ForCausalLM"} <= set(lora["supported"])
