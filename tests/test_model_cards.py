"""Model cards (review/model_card.py, `python -m stacks model-card`) and the per-family rules they feed.

The accept/refuse cases were decided by vLLM 0.33.0 itself: tests/fixtures/models/decide_with_vllm.py runs
`vllm serve`'s parser and `create_engine_config()` on a CPU host against each fixture's config.json and its output
is committed as tests/fixtures/models/vllm-0.33.0-decisions.json (the CI has no vLLM). What that call does not
check, vLLM asserts when it builds the model on the GPUs; those cases name the code line that decides them.
The fixtures' origins are in tests/fixtures/models/ORIGINS.md.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from review.model_card import (
    CardError,
    LocalSource,
    Tensors,
    _bytes,
    build_card,
    main,
    model_facts,
    support_matrix,
    synthesize,
)
from stacks.model.errors import ConfigError, Problem
from stacks.planner.memory import gqa_kv_bytes_per_layer, mla_kv_bytes_per_layer, pp_partition
from stacks.planner.model_cards import get_profile
from tests.checkpoint_layout import (
    DEFAULT_MAX_SHARD_SIZE,
    QWEN3_MAX_SHARD_SIZE,
    header_bounds,
    index_json,
    published,
    safetensors_header,
    save_order,
    shard_names,
)
from tests.conftest import ROOT, clone_node, plan_of

FIXTURES = ROOT / "tests" / "fixtures" / "models"
DECISIONS = json.loads((FIXTURES / "vllm-0.33.0-decisions.json").read_text())["cases"]
SHIPPED_FAMILIES = {"deepseek-v3": "moe-mla", "deepseek-v4-flash": "deepseek-v4", "deepseek-v4.1-flash": "deepseek-v4",
                    "devstral-small-2507": "dense-gqa", "gpt-oss-20b": "moe-gqa", "llama-3.1-8b-instruct": "dense-gqa",
                    "qwen3-235b-a22b-instruct-2507": "moe-gqa", "qwen3-30b-a3b": "moe-gqa", "qwen3-8b": "dense-gqa"}
"""The cards this repository ships, by name. A user's own card in models/ (docs/your-model.md) is not one: these
tests are about the shipped cards' provenance, and must stay green for a user who adds a card."""
CARDS = sorted(SHIPPED_FAMILIES)


def _regenerate(command: str, root: Path) -> dict[str, Any]:
    """Run a card's recorded command into another root and read what it wrote."""
    from review.cli import build_parser

    argv = shlex.split(command)[3:]  # after "python -m stacks"
    args = build_parser().parse_args(argv)
    lines: list[str] = []
    code = main(args.src, args.name, synthesize_weights=args.synthesize_weights, facts=args.fact or [], why=args.why,
                endpoint_url=None, region=None, root=root, command=shlex.split(command)[:3] + argv,
                echo=lines.append)
    assert code == 0, lines
    return dict(json.loads((root / "models" / f"{args.name}.json").read_text()))


@pytest.mark.parametrize("name", CARDS)
def test_committed_cards_are_what_the_command_writes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    monkeypatch.chdir(ROOT)
    card = json.loads((ROOT / "models" / f"{name}.json").read_text())
    assert _regenerate(card["generated_by"], tmp_path) == card


def test_nine_cards_seven_public_families() -> None:
    assert {n: get_profile(n).family for n in CARDS} == SHIPPED_FAMILIES  # type: ignore[union-attr]
    assert set(CARDS) <= {p.stem for p in (ROOT / "models").glob("*.json")}


def test_a_card_written_into_this_checkout_rewrites_the_support_tables(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # (the command line passes on_written=rewrite_support_tables when the project root is this checkout)
    """A user who makes a card for their model as docs/your-model.md says gets the README's support rows and the
    page's card table rewritten with it, so the tests comparing those tables with the cards stay green."""
    from review.support import rewrite_support_tables, with_rows

    for part in ("models", "images"):
        (tmp_path / part).mkdir()
        for card in (ROOT / part).glob("*.json"):
            (tmp_path / part / card.name).write_text(card.read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # the cards' sources (fixtures) as the table reads them
    for page in ("README.md", "docs/your-model.md"):
        (tmp_path / page).write_text((ROOT / page).read_text())
    assert rewrite_support_tables(tmp_path) == []  # the committed tables are current
    monkeypatch.chdir(ROOT)
    lines: list[str] = []
    assert main("tests/fixtures/models/tiny-llama-48h-8kv", "my-llama", synthesize_weights=True, facts=[], why=None,
                endpoint_url=None, region=None, root=tmp_path, command=[], echo=lines.append,
                on_written=rewrite_support_tables) == 0, lines
    assert any("README.md, docs/your-model.md" in line and "my-llama" in line for line in lines), lines
    readme, page = (tmp_path / "README.md").read_text(), (tmp_path / "docs/your-model.md").read_text()
    assert readme == with_rows(readme, tmp_path) and "my-llama" in readme.split("<!-- support: end -->")[0]
    assert f"<!-- cards -->\n{support_matrix(tmp_path / 'models')}<!-- /cards -->" in page and "| my-llama |" in page


def test_synthesized_gpt_oss_matches_the_published_index() -> None:
    """The one public index at hand: every tensor name matches, and the synthesized bytes equal total_size."""
    card = json.loads((ROOT / "models" / "gpt-oss-20b.json").read_text())
    real = json.loads((FIXTURES / "gpt-oss-20b" / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    assert card["weights"]["index_total_size"] == real == 13_761_264_768
    assert abs(card["weights"]["total_bytes"] - real) / real < 0.10
    assert card["weights"]["total_bytes"] == real  # MXFP4 blocks + scales + bf16 rest, byte for byte
    assert "every name matches" in card["weights"]["source"]


# ------------------------------------------------------------------------------------- published checkpoints

PUBLISHED = ("qwen3-8b", "qwen3-30b-a3b", "deepseek-v3", "llama-3.1-8b-instruct", "devstral-small-2507")
"""Cards with figures published for the real checkpoint (tests/fixtures/models/<card>/published-shards.json, origins
in ORIGINS.md): shard file sizes (all), their SHA-256 (all but Devstral), header digests (Qwen3-8B), index tensor
count and total_size (Qwen3-30B-A3B, Llama, Devstral; the Llama and Devstral indexes are fixtures too). gpt-oss-20b's
index is itself a fixture (above). Nothing was found for qwen3-235b-a22b-instruct-2507 (ORIGINS.md says what was
searched)."""


@functools.cache
def _tensors(name: str) -> Tensors:
    """What `model-card --synthesize-weights` builds for the card's fixture config.json (read, never changed)."""
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    return synthesize(model_facts(raw, raw)[0])


def _card_weights(name: str) -> dict[str, Any]:
    return dict(json.loads((ROOT / "models" / f"{name}.json").read_text())["weights"])


def _qwen3_files(tensors: Tensors, max_shard_size: int = QWEN3_MAX_SHARD_SIZE) -> list[tuple[list[str], bytes, int]]:
    """Each shard save_pretrained writes for these tensors: its tensor names, header bytes and file size."""
    sizes = {n: _bytes(d, s) for n, (d, s) in tensors.items()}
    files = []
    for names in shard_names(save_order(list(tensors)), sizes, max_shard_size):
        head = safetensors_header(tensors, names)
        files.append((names, head, 8 + len(head) + sum(sizes[n] for n in names)))
    return files


def _published_tensor_bytes(name: str) -> tuple[int, float]:
    """The real checkpoint's tensor bytes and how exactly the published figures pin them (relative): the index's
    total_size or the header-verified data (exact, checked to 0.1 %), or the shard files minus the headers they
    can hold (checked to 0.5 %, and to the header bounds below)."""
    pub = published(FIXTURES / name / "published-shards.json")
    if "tensor_bytes" in pub:
        return int(pub["tensor_bytes"]), 0.001
    files = sum(s["bytes"] for s in pub["shards"])
    least, most = header_bounds(_tensors(name), len(pub["shards"]))
    return files - (least + most) // 2, 0.005


def _byte_problems(name: str, card_bytes: int) -> list[str]:
    """Why `card_bytes` cannot be the tensor bytes of the published checkpoint (empty when it can)."""
    real, tolerance = _published_tensor_bytes(name)
    problems = []
    if abs(card_bytes - real) / real > tolerance:
        problems.append(f"{name}: card {card_bytes:,} B vs published {real:,} B ({(card_bytes - real) / real:+.4%}, "
                        f"allowed {tolerance:.1%})")
    pub = published(FIXTURES / name / "published-shards.json")
    if "tensor_bytes" not in pub:
        files = sum(s["bytes"] for s in pub["shards"])
        least, most = header_bounds(_tensors(name), len(pub["shards"]))
        if not files - most <= card_bytes <= files - least:
            problems.append(f"{name}: {files:,} B of shard files less {least:,}..{most:,} B of headers cannot hold "
                            f"{card_bytes:,} B of tensors")
    return problems


def test_qwen3_8b_tensors_rebuild_the_published_shard_headers() -> None:
    """The synthesized Qwen3-8B tensors (names, dtypes, shapes), laid out as save_pretrained shards them and
    serialized as safetensors headers, give every published shard's header length and SHA-256 and its file size:
    the card's tensor list is the real one, byte for byte, and so is its total."""
    pub = published(FIXTURES / "qwen3-8b" / "published-shards.json")
    config = (FIXTURES / "qwen3-8b" / "config.json").read_bytes()
    assert hashlib.sha256(config.rstrip(b"\n")).hexdigest() == pub["config_json_sha256"]  # the same revision
    files = _qwen3_files(_tensors("qwen3-8b"))
    assert len(files) == len(pub["shards"]) == 5
    for (_, head, size), shard in zip(files, pub["shards"], strict=True):
        assert (len(head), hashlib.sha256(head).hexdigest()) == (shard["header_bytes"], shard["header_sha256"]), \
            shard["name"]
        assert size == shard["bytes"], shard["name"]
    assert sum(len(names) for names, _, _ in files) == 399
    assert _card_weights("qwen3-8b")["total_bytes"] == pub["tensor_bytes"] == 16_381_470_720


def test_qwen3_30b_a3b_tensors_rebuild_the_published_shard_sizes() -> None:
    """The synthesized Qwen3-30B-A3B tensors in save_pretrained's 4 GB shards give all 16 published file sizes to
    the byte (each holds its header, whose length follows every tensor's name, shape and offsets), the index's
    18,867 tensors and its total_size."""
    pub = published(FIXTURES / "qwen3-30b-a3b" / "published-shards.json")
    config = (FIXTURES / "qwen3-30b-a3b" / "config.json").read_bytes()
    assert hashlib.sha256(config.rstrip(b"\n")).hexdigest() == pub["config_json_sha256"]
    files = _qwen3_files(_tensors("qwen3-30b-a3b"))
    assert [size for _, _, size in files] == [s["bytes"] for s in pub["shards"]]
    assert sum(len(names) for names, _, _ in files) == pub["index"]["tensor_count"] == 18_867
    assert _card_weights("qwen3-30b-a3b")["total_bytes"] == pub["tensor_bytes"] == 61_064_245_248


def test_llama_3_1_8b_config_and_index_are_the_published_files() -> None:
    """The fixture config.json and index have the length and SHA-256 the published files' Git LFS pointers record
    (ORIGINS.md), and the index is what save_pretrained writes for the synthesized tensors in 5 GB shards: 291
    names, 16,060,522,496 bytes."""
    pub = published(FIXTURES / "llama-3.1-8b-instruct" / "published-shards.json")
    for file, key in (("config.json", "config_json"), ("model.safetensors.index.json", "index")):
        data = (FIXTURES / "llama-3.1-8b-instruct" / file).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (pub[key]["bytes"], pub[key]["sha256"]), file
    tensors = _tensors("llama-3.1-8b-instruct")
    names = [n for n, _, _ in _qwen3_files(tensors, DEFAULT_MAX_SHARD_SIZE)]
    index = index_json({"total_size": pub["tensor_bytes"]}, names)
    assert hashlib.sha256(index).hexdigest() == pub["index"]["sha256"]
    assert len(tensors) == pub["index"]["tensor_count"] == 291


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "devstral-small-2507"])
def test_dense_tensors_rebuild_the_published_shard_files(name: str) -> None:
    """Llama 3.1 8B's 4 and Devstral Small 2507's 10 shard files: the synthesized tensors split as save_pretrained
    splits at 5 GB, each file its header plus data, give every published size to the byte (and Devstral's tensor
    count per file), the index's weight_map file for file, and its total_size."""
    pub = published(FIXTURES / name / "published-shards.json")
    files = _qwen3_files(_tensors(name), DEFAULT_MAX_SHARD_SIZE)
    assert [size for _, _, size in files] == [s["bytes"] for s in pub["shards"]]
    if "tensor_count" in pub["shards"][0]:
        assert [len(names) for names, _, _ in files] == [s["tensor_count"] for s in pub["shards"]]
    index = json.loads((FIXTURES / name / "model.safetensors.index.json").read_text())
    assert json.loads(index_json(index["metadata"], [n for n, _, _ in files]))["weight_map"] == index["weight_map"]
    assert _card_weights(name)["total_bytes"] == index["metadata"]["total_size"] == pub["tensor_bytes"]
    assert _card_weights(name)["index_total_size"] == pub["tensor_bytes"]


def test_deepseek_v3_bytes_fit_the_published_shard_files() -> None:
    """DeepSeek-R1's 163 shard files (the V3 architecture, config for config) hold 688,586,727,753 bytes: the card's
    tensors (the MTP layer included, as in the files) plus headers between the least and most its 91,991 tensor
    entries can take. The MTP layer is on the card as unused: vLLM loads it only for MTP decoding."""
    pub = published(FIXTURES / "deepseek-v3" / "published-shards.json")
    assert sum(s["bytes"] for s in pub["shards"]) == 688_586_727_753 and len(pub["shards"]) == 163
    raw = json.loads((FIXTURES / "deepseek-v3" / "config.json").read_text())
    assert (raw["architectures"], raw["num_hidden_layers"], raw["n_routed_experts"], raw["quantization_config"]) == \
        (["DeepseekV3ForCausalLM"], 61, 256, {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                              "weight_block_size": [128, 128]})
    card = _card_weights("deepseek-v3")
    assert card["total_bytes"] == sum(_bytes(d, s) for d, s in _tensors("deepseek-v3").values())
    assert _byte_problems("deepseek-v3", card["total_bytes"]) == []
    assert card["unused_bytes"] > 0


@pytest.mark.parametrize("name", PUBLISHED)
def test_card_bytes_match_the_published_checkpoint(name: str) -> None:
    assert _byte_problems(name, _card_weights(name)["total_bytes"]) == []


@pytest.mark.parametrize("name", PUBLISHED)
@pytest.mark.parametrize("off", [-0.006, 0.006])
def test_a_card_with_wrong_bytes_is_caught(name: str, off: float) -> None:
    """The check above is not vacuous: bytes 0.6 % off fail it (a decoder layer is 2.4 % of Qwen3-8B, one layer's
    experts 2.0 % of Qwen3-30B-A3B)."""
    assert _byte_problems(name, round(_card_weights(name)["total_bytes"] * (1 + off)))


@pytest.mark.parametrize(("name", "tp"), [("qwen3-8b", 2), ("qwen3-30b-a3b", 4), ("deepseek-v3", 8),
                                         ("llama-3.1-8b-instruct", 1), ("llama-3.1-8b-instruct", 2),
                                         ("devstral-small-2507", 2), ("devstral-small-2507", 4)])
def test_memory_per_gpu_is_the_published_bytes_over_tp(name: str, tp: int, h20_values: dict[str, Any]) -> None:
    """The plan's weights per GPU at a TP the model is served with are within 10 % of the real checkpoint's tensor
    bytes / TP. What keeps them apart: norms and routers whole on every GPU, and DeepSeek's MTP layer (2.2 % of its
    files), which vLLM 0.33.0 does not load without MTP decoding."""
    row = plan_of(_stack(h20_values, name, ["-tp", str(tp)], {})).to_json_dict()["memory"][0]
    real = _published_tensor_bytes(name)[0] / tp / 1e9
    assert abs(row["weights_gb"] - real) / real < 0.10, (row["weights_gb"], real)


# ------------------------------------------------------------------------------------- headers, S3, bad input


def _write_shards(model: Path, shapes: dict[str, tuple[str, list[int]]], shards: int = 2) -> None:
    """Real safetensors files (written by the `safetensors` library) holding `shapes`, split over `shards`."""
    import ctypes

    import safetensors

    lib_dtype = {"BF16": "bfloat16", "F32": "float32", "U8": "uint8", "F8_E4M3": "float8_e4m3fn"}
    width = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
    names = sorted(shapes)
    weight_map = {}
    total = 0
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        spec = {}
        keep = []
        for n in part:
            dtype, shape = shapes[n]
            size = math.prod(shape) * width[dtype]
            total += size
            buf = ctypes.create_string_buffer(max(size, 1))
            keep.append(buf)
            spec[n] = safetensors.TensorSpec(dtype=lib_dtype[dtype], shape=shape, data_ptr=ctypes.addressof(buf),
                                             data_len=size)
        safetensors.serialize_file(spec, str(model / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}))


TINY = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
        "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
        "vocab_size": 100, "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def _tiny_model(root: Path, config: dict[str, Any] | None = None) -> Path:
    model = root / "tiny"
    model.mkdir()
    cfg = config or TINY
    (model / "config.json").write_text(json.dumps(cfg))
    return model


def test_card_from_real_headers_equals_the_synthesized_one(tmp_path: Path) -> None:
    """The header path (index + every shard's header, files written by the safetensors library) and the
    synthesized path agree on every byte of the split."""
    model = _tiny_model(tmp_path)
    _write_shards(model, synthesize({**json.loads((model / "config.json").read_text()), **_facts(model)}))
    real = build_card(LocalSource(model), "tiny", synthesize_weights=False, facts_given={}, why=None, command=[])
    made = build_card(LocalSource(model), "tiny", synthesize_weights=True, facts_given={}, why=None, command=[])
    assert real["weights"]["source"].startswith("model.safetensors.index.json and every shard")
    assert [s["name"] for s in real["weights"]["shards"]] == ["model-00001-of-00002.safetensors",
                                                              "model-00002-of-00002.safetensors"]
    for key in ("total_bytes", "experts_bytes", "dense_bytes", "replicated_bytes", "embeddings_bytes",
                "layer_bytes", "first_stage_bytes", "last_stage_bytes"):
        assert real["weights"][key] == made["weights"][key], key
    assert real["weights"]["experts_bytes"] == 2 * 4 * 3 * 32 * 64 * 2


def _facts(model: Path) -> dict[str, Any]:
    raw = json.loads((model / "config.json").read_text())
    return model_facts(raw, raw)[0]


def _card_exit(*args: str, root: Path) -> tuple[int, str]:
    """`model-card` as a user runs it, in a project `root` (it writes only into a project)."""
    if root.is_dir() and not (root / "Pulumi.yaml").exists():
        (root / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    done = subprocess.run([sys.executable, "-m", "stacks", "model-card", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"VLLM_CLUSTER_ROOT": str(root), "PATH": "/usr/bin:/bin"})
    return done.returncode, done.stdout + done.stderr


def test_cli_writes_under_the_project_root(tmp_path: Path) -> None:
    code, out = _card_exit("tests/fixtures/models/qwen3-8b", "--name", "q", "--synthesize-weights", root=tmp_path)
    assert code == 0, out
    assert json.loads((tmp_path / "models" / "q.json").read_text())["architecture"] == "Qwen3ForCausalLM"


@pytest.mark.parametrize(("fact", "said"), [
    ("tool_call_parser=a;rm", "--fact 'tool_call_parser=a;rm': tool_call_parser is not a vLLM option value: 1-64"),
    ("reasoning_parser=", "--fact 'reasoning_parser=': reasoning_parser is not a vLLM option value"),
    ("default_kv_cache_dtype=fp8 --x", "default_kv_cache_dtype is not a vLLM option value"),
    ("min_vram_gb=-80", "--fact 'min_vram_gb=-80': min_vram_gb: Input should be greater than 0"),
    ("min_vram_gb=1e400", "--fact 'min_vram_gb=1e400': min_vram_gb"),
    ("engram_hash_heads=0", "--fact 'engram_hash_heads=0': engram_hash_heads: Input should be greater than or equal "
     "to 1"),
    ("routed_experts=-2", "routed_experts: Input should be greater than or equal to 1"),
    ('draft_supports_pp={"a b": true}', "draft_supports_pp.a b"),
    ('draft_supports_pp={"mtp": "yes"}', "draft_supports_pp.mtp: Input should be a valid boolean"),
    ('weights_split_gb={"experts": "x", "dense": 1, "replicated": 1, "engram": 0}', "weights_split_gb.experts"),
])
def test_a_fact_is_checked_by_its_type(tmp_path: Path, fact: str, said: str) -> None:
    """`--fact` values land in the card and from there in vLLM's argv: each is checked as the stack file checks
    the same value (a parser name is a ParserName, numbers are finite and in range), and nothing is written."""
    code, out = _card_exit("tests/fixtures/models/qwen3-8b", "--name", "q", "--synthesize-weights", "--fact", fact,
                           root=tmp_path)
    assert code == 2 and said in out and "Traceback" not in out, out
    assert not (tmp_path / "models" / "q.json").exists()


def test_a_card_that_would_hide_a_shipped_one_is_refused(tmp_path: Path) -> None:
    """Under a project root of its own, `--name` of a shipped card would silently replace it for every stack
    there: refused, naming both files, and nothing is written."""
    code, out = _card_exit("tests/fixtures/models/qwen3-8b", "--name", "qwen3-8b", "--synthesize-weights",
                           root=tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert f"a card of that name ships with vllm-cluster ({ROOT / 'models' / 'qwen3-8b.json'})" in out
    assert f"{tmp_path / 'models' / 'qwen3-8b.json'} would hide it" in out and "--name qwen3-8b-local" in out
    assert not (tmp_path / "models").exists()


def test_a_card_put_over_a_shipped_one_by_hand_is_named_in_every_plan(tmp_path: Path, h20_values: dict[str, Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    name = h20_values["model"]["profile"]
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{name}.json").write_text((ROOT / "models" / f"{name}.json").read_text())
    assert not [w for w in plan_of(copy.deepcopy(h20_values)).warnings if "hides the shipped card" in w]
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path))
    warning = next(w for w in plan_of(h20_values).warnings if "hides the shipped card" in w)
    assert f"{tmp_path / 'models' / name}.json is used, and it hides the shipped card " \
           f"{ROOT / 'models' / name}.json" in warning


def _bad(tmp_path: Path, mutate: Any) -> str:
    model = _tiny_model(tmp_path)
    _write_shards(model, synthesize({**TINY, **_facts(model)}))
    mutate(model)
    code, out = _card_exit(str(model), "--name", "bad", root=tmp_path)
    assert code == 2, out
    assert "Traceback" not in out
    return out


def test_directory_without_config_json(tmp_path: Path) -> None:
    assert "no config.json" in _bad(tmp_path, lambda m: (m / "config.json").unlink())


def test_truncated_index(tmp_path: Path) -> None:
    def cut(m: Path) -> None:
        index = m / "model.safetensors.index.json"
        index.write_text(index.read_text()[:200])
    out = _bad(tmp_path, cut)
    assert "model.safetensors.index.json: not JSON" in out


def test_index_that_lost_entries_against_the_headers(tmp_path: Path) -> None:
    def drop(m: Path) -> None:
        index = m / "model.safetensors.index.json"
        data = json.loads(index.read_text())
        data["metadata"]["total_size"] += 2
        index.write_text(json.dumps(data))
    assert "metadata.total_size" in _bad(tmp_path, drop)


def test_shard_the_index_names_but_the_directory_lacks(tmp_path: Path) -> None:
    out = _bad(tmp_path, lambda m: (m / "model-00002-of-00002.safetensors").unlink())
    assert "model.safetensors.index.json: weight_map names model-00002-of-00002.safetensors" in out


def test_truncated_shard(tmp_path: Path) -> None:
    def cut(m: Path) -> None:
        shard = m / "model-00001-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:-10])
    assert "truncated" in _bad(tmp_path, cut)


@pytest.mark.parametrize(("patch", "key"), [
    ({"num_key_value_heads": 3}, "num_key_value_heads = 3 contradicts num_attention_heads = 4"),
    ({"num_hidden_layers": 10_000_000}, "num_hidden_layers = 10000000 is not plausible"),
    ({"num_hidden_layers": 10**400}, "num_hidden_layers = 10000000000000000000… (401 digits) is not plausible"),
    ({"num_attention_heads": 10**400}, "num_attention_heads = 10000000000000000000… (401 digits) is not plausible"),
    ({"hidden_size": 10**400}, "hidden_size = 10000000000000000000… (401 digits) is not plausible"),
    ({"max_position_embeddings": 10**400}, "max_position_embeddings = 10000000000000000000… (401 digits)"),
    ({"vocab_size": 10**400}, "vocab_size = 10000000000000000000… (401 digits) is not plausible"),
    ({"rope_scaling": {"rope_type": "linear", "factor": float("inf")}},
     "rope_scaling.factor = inf is not a rope scaling factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": float("nan")}},
     "rope_scaling.factor = nan is not a rope scaling factor"),
    ({"num_attention_heads": -4}, "num_attention_heads = -4 is not plausible"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok = 9 contradicts 4 routed experts"),
    ({"max_position_embeddings": "long"}, "max_position_embeddings = 'long' is not an integer"),
    ({"architectures": "Qwen3MoeForCausalLM"}, "architectures must be a list"),
    ({"architectures": ["Qwen3\u202eMoeForCausalLM"]}, "architectures[0] = 'Qwen3\\u202eMoeForCausalLM' is not a "
     "class name"),
    ({"architectures": ["Qwen3\x1b[2JMoe"]}, "architectures[0] = 'Qwen3\\x1b[2JMoe' is not a class name"),
])
def test_contradictory_or_absurd_config(tmp_path: Path, patch: dict[str, Any], key: str) -> None:
    def write(m: Path) -> None:
        (m / "config.json").write_text(json.dumps({**TINY, **patch}))
    out = _bad(tmp_path, write)
    assert f"config.json: {key}" in out or key in out, out


def test_s3_source_reads_headers_and_names_a_missing_shard(tmp_path: Path) -> None:
    """The same card from a bucket (moto's S3 API on loopback, the sync's client and source rule), and exit 2
    naming the shard when one the index names is not in the bucket."""
    from tests.weights_harness import KEY_ID, SECRET, moto_server

    model = _tiny_model(tmp_path, {**TINY, "vocab_size": 40_000})  # above the planner's 10 MB floor
    _write_shards(model, synthesize(_facts(model)))
    local = build_card(LocalSource(model), "tiny", synthesize_weights=False, facts_given={}, why=None, command=[])
    with moto_server() as s3:
        client = s3.client()
        client.create_bucket(Bucket="models")
        for file in model.iterdir():
            client.upload_file(str(file), "models", f"tiny/{file.name}")
        (tmp_path / "Pulumi.yaml").write_text("name: vllm-cluster\n")  # model-card writes only into a project
        env = {"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": KEY_ID,
               "AWS_SECRET_ACCESS_KEY": SECRET}
        run = [sys.executable, "-m", "stacks", "model-card", "s3://models/tiny", "--name", "tiny",
               "--endpoint-url", s3.endpoint]
        done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        remote = json.loads((tmp_path / "models" / "tiny.json").read_text())
        assert remote["weights"]["layer_bytes"] == local["weights"]["layer_bytes"]
        assert remote["weights"]["shards"] == local["weights"]["shards"]
        client.delete_object(Bucket="models", Key="tiny/model-00002-of-00002.safetensors")
        done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 2, done.stderr
        assert "weight_map names model-00002-of-00002.safetensors" in done.stderr
        run[4] = "s3://no-such-bucket/tiny"  # the sync's texts name --source; here the URL is SRC
        done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 2 and "no-such-bucket" in done.stderr, done.stderr
        assert "--source" not in done.stderr and "SRC" in done.stderr, done.stderr


def test_no_index_needs_the_synthesize_switch(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    with pytest.raises(CardError, match="--synthesize-weights"):
        build_card(LocalSource(model), "t", synthesize_weights=False, facts_given={}, why=None, command=[])


# ------------------------------------------------------------------------------------- accept / refuse


def _stack(h20: dict[str, Any], card: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """A stack that runs `vllm serve <card> <argv>` on H200 nodes of 8 GPUs (ray for one replica, mp for DP)."""
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    tp, pp, dp = int(opts.get("-tp", 1)), int(opts.get("-pp", 1)), int(opts.get("-dp", 1))
    gpus = tp * pp * dp
    nodes = max(1, math.ceil(gpus / 8))
    values = copy.deepcopy(h20)
    values["nodes"] = [clone_node(h20["nodes"][0], i) for i in range(nodes)]
    for node in values["nodes"]:
        node["gpus"] |= {"count": gpus // nodes, "model": "NVIDIA H200", "memory_gb": 141}
    values["model"] |= {"profile": card, "served_name": card, "path": card}
    values["image"]["tag"] = "v0.33.0-model-cards"  # not in the image table: the general rules only
    values["parallelism"] = {"tensor": tp, "pipeline": pp, "data": dp, "expert": "--enable-expert-parallel" in argv,
                             "backend": "mp" if dp > 1 else "ray"}
    serving = values["serving"]
    for key in ("tokenizer_mode", "tool_call_parser", "reasoning_parser", "kv_cache_dtype"):
        serving.pop(key, None)
    profile = get_profile(card)
    assert profile is not None
    serving["max_model_len"] = int(opts.get("--max-model-len", profile.max_context))
    serving["max_num_seqs"] = 8
    values["container"] = {**values.get("container", {}), "env": env}
    return values


CARD_OF = {"qwen3-235b-a22b-instruct-2507": "qwen3-235b-a22b-instruct-2507"}
BY_MODEL_INIT = {
    # vLLM's engine config passes these; the model's constructor on the GPUs refuses (or idles GPUs):
    "qwen3-8b pp48": ("parallelism.pipeline", "get_pp_indices"),  # distributed/utils.py:198-241: 0-layer stages
    "llama-3.1-8b pp40": ("parallelism.pipeline", "get_pp_indices"),  # 32 layers over 40 stages: 8 stages idle
    "gpt-oss-20b tp16": ("parallelism.tensor", "num_local_key_value_heads"),  # models/gpt_oss.py:156: 8 // 16 = 0
    "tiny-llama tp12": ("parallelism.tensor", "tp_size % self.total_num_kv_heads"),  # models/llama.py:148-156
}


def _outcome(values: dict[str, Any]) -> list[Problem]:
    try:
        plan_of(values)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.fixture
def tiny_llama_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 48-head / 8-KV-head Llama fixture as a card in a project root of its own (not a shipped card)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path))
    assert main("tests/fixtures/models/tiny-llama-48h-8kv", "tiny-llama-48h-8kv", synthesize_weights=True, facts=[],
                why=None, endpoint_url=None, region=None, root=tmp_path, command=[], echo=print) == 0


@pytest.mark.parametrize("case", sorted(DECISIONS))
def test_accept_and_refuse_as_vllm_does(case: str, h20_values: dict[str, Any], tiny_llama_card: None) -> None:
    decided = DECISIONS[case]
    card = decided["model"]
    argv, env = decided["argv"], decided["env"]
    problems = _outcome(_stack(h20_values, card, argv, env))
    texts = "\n".join(p.render() for p in problems)
    if case in BY_MODEL_INIT:
        assert "ok" in decided  # the engine config passes ...
        key, quoted = BY_MODEL_INIT[case]
        assert [p.key for p in problems] == [key], texts  # ... and the planner refuses as the model init would
        assert quoted in texts
    elif "ok" in decided:
        assert problems == [], texts
    else:
        assert problems, f"vLLM refused ({decided['message']}) but the plan passed"
        vllm_says = decided["message"].split(" [type=")[0].removeprefix("Value error, ")
        assert any(vllm_says[:60] in (p.upstream or "") for p in problems), (vllm_says, texts)


@pytest.mark.parametrize("case", sorted(c for c, d in DECISIONS.items() if "ok" in d))
def test_derived_facts_match_vllm(case: str, tiny_llama_card: None) -> None:
    """KV bytes per token and layer as vLLM's page holds them, PP stages as get_pp_indices cuts them, and the
    default max_model_len."""
    decided = DECISIONS[case]
    ok, argv = decided["ok"], decided["argv"]
    profile = get_profile(decided["model"])
    assert profile is not None
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    tp, pp = int(opts.get("-tp", 1)), int(opts.get("-pp", 1))
    if profile.mla_head is not None:
        assert ok["use_mla"] and ok["head_size"] == profile.mla_head
        assert mla_kv_bytes_per_layer(profile.mla_head, "auto") == ok["kv_bytes_per_token_per_layer"]
    else:
        assert ok["head_size"] == profile.head_dim
        assert gqa_kv_bytes_per_layer(profile.kv_heads, tp, profile.head_dim, "auto") == \
            ok["kv_bytes_per_token_per_layer"]
    assert [hi - lo for lo, hi in pp_partition(profile.layers, pp)] == ok["layers_per_pp_stage"]
    if "--max-model-len" not in argv:
        assert ok["max_model_len"] == profile.max_context


def test_fp8_block_experts_need_whole_blocks_per_rank(h20_values: dict[str, Any]) -> None:
    """DeepSeek-V3's 2048-column experts in 128-wide FP8 blocks: 32 ranks without expert parallelism leave 64
    columns each; vLLM refuses in the FP8 MoE method's create_weights (quantization/fp8.py:555,
    utils/fp8_utils.py:1361-1366; model init, after create_engine_config passed). With EP each rank holds whole
    experts."""
    problems = _outcome(_stack(h20_values, "deepseek-v3", ["-tp", "32"], {}))
    assert [p.key for p in problems] == ["parallelism.tensor"], [p.render() for p in problems]
    assert "The output_size of gate's and up's weight = 64 is not divisible by weight quantization block_n = 128." \
        in (problems[0].upstream or "")
    assert _outcome(_stack(h20_values, "deepseek-v3", ["-tp", "32", "--enable-expert-parallel"], {})) == []


def test_fp8_ds_mla_kv_is_a_fixed_row() -> None:
    assert mla_kv_bytes_per_layer(576, "fp8_ds_mla") == 656
    assert mla_kv_bytes_per_layer(576, "fp8") == 576


# ------------------------------------------------------------------------------------- memory in the plan


def test_plan_json_carries_memory_per_node(h20_values: dict[str, Any]) -> None:
    plan = plan_of(h20_values).to_json_dict()
    assert [m["node"] for m in plan["memory"]] == ["h20-1", "h20-2"]
    for row in plan["memory"]:
        assert set(row) >= {"node", "gpu_memory_gb", "usable_gb", "weights_gb", "weights_split_gb",
                            "kv_one_sequence_gb", "reserve_gb", "total_gb", "free_for_kv_gb"}
        assert row["total_gb"] == pytest.approx(row["weights_gb"] + row["kv_one_sequence_gb"] + row["reserve_gb"],
                                                abs=0.02)
        assert row["free_for_kv_gb"] == pytest.approx(row["usable_gb"] - row["total_gb"], abs=0.02)


def test_per_gpu_weights_follow_the_cards_split(h20_values: dict[str, Any]) -> None:
    """gpt-oss-20b on TP2: each GPU holds half of everything but the replicated router and norms, the MXFP4
    experts padded as vLLM's kernels want them (hidden 2880 -> 3072, each rank's FFN 1440 -> 1536)."""
    values = _stack(h20_values, "gpt-oss-20b", ["-tp", "2"], {})
    row = plan_of(values).to_json_dict()["memory"][0]
    card = json.loads((ROOT / "models" / "gpt-oss-20b.json").read_text())["weights"]
    replicated = card["replicated_bytes"] / 1e9
    pad = 3072 / 2880 * 1536 / 1440
    expect = (card["total_bytes"] / 1e9 - replicated + card["experts_bytes"] / 1e9 * (pad - 1)) / 2 + replicated
    assert row["weights_gb"] == pytest.approx(expect, rel=0.001)
    assert card["total_bytes"] == card["index_total_size"]  # the split is of the published bytes
    # KV: 12 full-attention layers x 2 x 4 KV heads x 64 x 2 B, 12 sliding layers holding 128 + 2048 tokens
    full = 12 * 2 * 4 * 64 * 2
    assert row["kv_bytes_per_token"] == pytest.approx(full + full * (128 + 2048) / 131072, abs=0.1)


def test_the_support_matrix_follows_the_cards() -> None:
    from review.model_card import support_matrix

    doc = (ROOT / "docs" / "your-model.md").read_text()
    table = doc.split("<!-- cards -->\n", 1)[1].split("<!-- /cards -->", 1)[0]
    assert table == support_matrix(ROOT / "models")


# ------------------------------------------------------------------------------------- config against the weights


MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
           "num_hidden_layers": 4, "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
MLA = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
       "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1,
       "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
       "kv_lora_rank": 32, "q_lora_rank": 48, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
       "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64, "head_dim": 16,
           "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 4096,
           "attention_bias": True, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "mxfp4"}}


@pytest.mark.parametrize(("config", "patch", "said"), [
    (MISTRAL, {"num_attention_heads": 16}, "config.json: num_attention_heads = 16 contradicts "
     "model.layers.0.self_attn.q_proj.weight [256, 256] in model-0000"),
    (MISTRAL, {"num_attention_heads": 16}, "16 heads x head_dim 32 = 512 output rows, the tensor has 256"),
    (MISTRAL, {"num_hidden_layers": 8}, "config.json: num_hidden_layers = 8 contradicts the weights: no tensor of "
     "decoder layers 4..7"),
    (MISTRAL, {"num_hidden_layers": 3}, "config.json: num_hidden_layers = 3 contradicts the weights: "),
    (MISTRAL, {"num_key_value_heads": 4}, "config.json: num_key_value_heads = 4 contradicts "
     "model.layers.0.self_attn.k_proj.weight [64, 256]"),
    (MISTRAL, {"hidden_size": 512}, "config.json: hidden_size = 512 contradicts model.embed_tokens.weight "
     "[1000, 256]"),
    (TINY, {"num_experts": 8}, "config.json: num_experts = 8 contradicts the weights: decoder layer 0 holds 4 "
     "experts (0..3;"),
    (MLA, {"num_attention_heads": 8}, "config.json: num_attention_heads = 8 contradicts "
     "model.layers.0.self_attn.kv_b_proj.weight [128, 32]"),
    (MLA, {"kv_lora_rank": 16}, "config.json: kv_lora_rank = 16 contradicts "
     "model.layers.0.self_attn.kv_a_proj_with_mqa.weight [40, 64]"),
    (GPT_OSS, {"num_local_experts": 8}, "config.json: num_local_experts = 8 contradicts "
     "model.layers.0.mlp.experts.down_proj_blocks [4, 64, 2, 16]"),
])
def test_a_config_that_contradicts_its_shard_headers_is_refused(tmp_path: Path, config: dict[str, Any],
                                                                patch: dict[str, Any], said: str) -> None:
    """The shard headers are the checkpoint vLLM loads: a config.json that disagrees with them (more heads than
    the q_proj rows hold, layers the shards lack) would plan a TP or PP vLLM fails on. Exit 2 naming the key,
    its value, and the tensor and shape that contradict it; the consistent config writes a card."""
    model = _tiny_model(tmp_path, config)
    _write_shards(model, synthesize(model_facts(config, config)[0]))
    good = build_card(LocalSource(model), "t", synthesize_weights=False, facts_given={}, why=None, command=[])
    assert good["layers"] == config["num_hidden_layers"]
    (model / "config.json").write_text(json.dumps({**config, **patch}))
    code, out = _card_exit(str(model), "--name", "bad", root=tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert said in out, out
    assert not (tmp_path / "models" / "bad.json").exists()


def test_an_index_without_headers_is_checked_for_layers_and_experts(tmp_path: Path) -> None:
    """--synthesize-weights beside an index: the index's names alone show the decoder layers and the experts, and
    a config that disagrees is named by its key (not only as a name-set difference)."""
    model = _tiny_model(tmp_path)
    _write_shards(model, synthesize({**TINY, **_facts(model)}))
    for shard in model.glob("*.safetensors"):
        shard.unlink()
    (model / "config.json").write_text(json.dumps({**TINY, "num_hidden_layers": 3}))
    with pytest.raises(CardError, match=r"config.json: num_hidden_layers = 3 contradicts the weights: no tensor of "
                                        r"decoder layers 2 in model.safetensors.index.json"):
        build_card(LocalSource(model), "t", synthesize_weights=True, facts_given={}, why=None, command=[])
    (model / "config.json").write_text(json.dumps({**TINY, "num_experts": 6}))
    with pytest.raises(CardError, match=r"config.json: num_experts = 6 contradicts the weights: decoder layer 0 "
                                        r"holds 4 experts \(0..3"):
        build_card(LocalSource(model), "t", synthesize_weights=True, facts_given={}, why=None, command=[])


def test_model_card_refuses_what_plan_would_refuse(tmp_path: Path) -> None:
    """A card under the planner's 10 MB floor is refused by `model-card` itself (the same rule), not written for
    `plan` to trip over."""
    model = _tiny_model(tmp_path)
    _write_shards(model, synthesize(_facts(model)))
    code, out = _card_exit(str(model), "--name", "tiny", root=tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert f"model-card: {model}: weights add up to" in out and "below the 10 MB" in out, out
    assert "nothing was written (the planner would refuse this card)" in out
    assert not (tmp_path / "models" / "tiny.json").exists()


@pytest.mark.parametrize("broken", ["small", "{", "[]", "weights"])
def test_a_broken_card_is_a_config_problem(tmp_path: Path, h20_values: dict[str, Any],
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                           broken: str) -> None:
    """A card `plan` cannot use (too small, not JSON, not an object, a field of the wrong type) is exit 2 naming
    models/<name>.json, what is wrong and how to regenerate it; never an internal error."""
    from review.cli import main as cli_main
    from review.model_card import write_card

    model = _tiny_model(tmp_path)
    _write_shards(model, synthesize(_facts(model)))
    card = build_card(LocalSource(model), "tiny", synthesize_weights=False, facts_given={}, why=None,
                      command=["python", "-m", "stacks", "model-card", str(model), "--name", "tiny"])
    path = write_card(card, tmp_path)
    if broken == "weights":
        path.write_text(json.dumps({**card, "weights": [1, 2]}))
    elif broken != "small":
        path.write_text(broken)
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        plan_of({**h20_values, "model": {**h20_values["model"], "profile": "tiny"}})
    problem = next(p for p in caught.value.problems if p.key == "model.profile")
    assert problem.message.startswith(f"the card {path}: "), problem.message
    assert problem.fix and "regenerate it from the model's files: python -m stacks model-card " in problem.fix
    if broken == "small":
        assert "weights add up to" in problem.message
        assert f"python -m stacks model-card {model} --name tiny (the command the card records)" in problem.fix
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.h20.yaml").write_text((ROOT / "Pulumi.h20.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli_main(["plan", "h20", "--set", "model.profile=tiny"]) == 2
    assert f"vllm-cluster:model.profile = 'tiny': the card {path}: " in capsys.readouterr().err


def test_synthesize_refuses_an_architecture_it_has_no_names_for(tmp_path: Path) -> None:
    """--synthesize-weights writes the tensor names of the architectures it was checked against; another one
    (here a Phi-3 config) is refused with the list, not given Qwen3's names."""
    model = _tiny_model(tmp_path, {**MISTRAL, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3"})
    code, out = _card_exit(str(model), "--name", "phi", "--synthesize-weights", root=tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert ("config.json: architectures[0] = Phi3ForCausalLM: --synthesize-weights knows the tensor names of "
            "DeepseekV3ForCausalLM, GptOssForCausalLM, LlamaForCausalLM") in out
