"""The memory model (stacks/planner/memory.py): the plan's rule from the profile, and the node preflight's from
real files.

Model directories are built in temp dirs: safetensors shards whose headers declare real tensor sizes (data regions
sparse, so a "40 GB" expert file costs no disk), a `model.safetensors.index.json` and a V4.1-style `config.json`
(language model nested under `text_config`). The header reader is cross-checked against files written by the
`safetensors` library itself.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import safetensors

from checks.preflight import read_safetensors_header
from stacks.model.errors import Problem
from stacks.planner.memory import (
    WeightSplit,
    classify,
    engram_dp_shards,
    kv_bytes_per_token,
    pp_partition,
    stage_splits,
)
from stacks.planner.model_cards import get_profile
from tests.conftest import ROOT, plan_of, problems_of

V033 = {"repository": "vllm/vllm-openai", "tag": "v0.33.0"}


GPU_OF_SIZE = {48: "NVIDIA L40S", 64: "Lab GPU 64"}
"""A GPU model with that memory (the plan refuses a memory_gb that contradicts a known model); 64 GB: unknown."""


def _gpu_memory(values: dict[str, Any], gb: int) -> None:
    for node in values["nodes"]:
        node["gpus"] |= {"memory_gb": gb, "model": GPU_OF_SIZE[gb]}


def _only(problems: list[Problem], key: str) -> Problem:
    matching = [p for p in problems if p.key == key]
    assert len(matching) == 1, [p.render() for p in problems]
    return matching[0]


# ------------------------------------------------------------------------------------------ the plan's rule


def test_prod_on_48gb_gpus_is_refused_with_the_key_and_the_numbers(prod_values: dict[str, Any]) -> None:
    """Issue 12: weights taken as sharded over all 16 GPUs planned 511/16 = 32 GB per GPU, 'valid' on 48 GB. Dense
    and Engram weights live in every DP rank: 51 GB per GPU."""
    _gpu_memory(prod_values, 48)
    problem = _only(problems_of(prod_values), "nodes.0.gpus.memory_gb")
    assert problem.value == 48
    assert ("weights do not fit per GPU of node1: experts 17.2 + dense 3.5 + replicated 5.0 + Engram 25.3 = 51.0 GB > "
            "48 GB x 0.95 = 45.6 GB (experts over DP2 x TP8, dense and Engram weights in every DP rank over TP8")\
        in problem.message
    assert "counted in GPU memory" in problem.message  # the nightly's Engram placement is not known
    assert "CUDA out of memory" in (problem.upstream or "")
    assert "GPUs of at least 65 GB" in (problem.fix or "") and "cpu_offload" in (problem.fix or "")


def test_prod_on_80gb_is_valid_and_the_plan_shows_the_breakdown(prod_values: dict[str, Any]) -> None:
    plan = plan_of(prod_values)
    note = next(n for n in plan.notes if n.startswith("memory per GPU of node1"))
    assert "(80 GB x 0.95 = 76.0 GB)" in note
    assert "KV for one 1048576-token sequence 6.0 GB (5686 B/token)" in note and "total 61.0 GB" in note
    assert "15.0 GB left for the KV cache of concurrent sequences" in note


def test_h20_is_valid(h20_values: dict[str, Any]) -> None:
    note = next(n for n in plan_of(h20_values).notes if n.startswith("memory per GPU"))
    assert "experts 17.6 + dense 0.4 + replicated 0.6 = 18.7 GB" in note and "PP2 stages" in note


def test_engram_in_host_memory_where_the_image_offloads_it(prod_values: dict[str, Any]) -> None:
    """vLLM 0.33.0 keeps Engram tables in pinned host memory (EngramConfig.cpu_offload = True): 48 GB GPUs are
    enough there, and the plan says how much RAM each node then pins."""
    prod_values["image"] = V033
    _gpu_memory(prod_values, 48)
    plan = plan_of(prod_values)
    assert any(n == "Engram tables: 202 GB of pinned host memory per node (image vllm/vllm-openai:v0.33.0 keeps "
               "them in pinned host memory by default); the preflight checks MemTotal" for n in plan.notes)
    prod_values["serving"]["extra_args"] = ["--engram-config.cpu_offload=false"]
    problem = _only(problems_of(prod_values), "nodes.0.gpus.memory_gb")
    assert "--engram-config cpu_offload=false in serving.extra_args" in problem.message


def test_explicit_offload_makes_the_nightly_fit(prod_values: dict[str, Any]) -> None:
    _gpu_memory(prod_values, 48)
    prod_values["serving"]["extra_args"] = ["--engram-config", '{"cpu_offload": true}']
    note = next(n for n in plan_of(prod_values).notes if n.startswith("memory per GPU"))
    assert "Engram" not in note.split(";")[0] and "total 35.7 GB" in note


@pytest.mark.parametrize("args", [
    ["--engram_config", '{"cpu_offload": true}'],  # argparse reads `_` as `-` in vLLM's FlexibleArgumentParser
    ['--engram-config={"cpu_offload": true}'],
    ["--engram-config.cpu_offload=true"],
    ["--engram-con", '{"cpu_offload": true}'],  # a unique prefix, as argparse allows
])
def test_the_offload_is_read_in_every_spelling_vllm_accepts(prod_values: dict[str, Any], args: list[str]) -> None:
    """The memory model must read the option as vLLM does, or it plans a node as fitting (or not) wrongly."""
    _gpu_memory(prod_values, 48)
    prod_values["serving"]["extra_args"] = args
    note = next(n for n in plan_of(prod_values).notes if n.startswith("memory per GPU"))
    assert "total 35.7 GB" in note, note


def test_kv_of_one_full_sequence_must_fit(prod_values: dict[str, Any]) -> None:
    """Weights fit on 64 GB, one 1M-token sequence does not: vLLM refuses at start with its KV message."""
    _gpu_memory(prod_values, 64)
    problem = _only(problems_of(prod_values), "serving.max_model_len")
    assert "To serve at least one request with the model's max seq len (1048576), (5.55 GiB KV cache is needed"\
        in (problem.upstream or "")
    assert (problem.fix or "").startswith("max_model_len <= 1014575")
    prod_values["serving"]["max_model_len"] = 1_000_000
    plan_of(prod_values)


def test_experts_spread_over_dp_x_tp_with_or_without_ep(prod_values: dict[str, Any]) -> None:
    """FusedMoEParallelConfig.make flattens TP over DP: without EP the experts are sliced, not replicated."""
    with_ep = next(n for n in plan_of(prod_values).notes if n.startswith("memory per GPU"))
    prod_values["parallelism"]["expert"] = False
    without = next(n for n in plan_of(prod_values).notes if n.startswith("memory per GPU"))
    assert with_ep == without and "experts 17.2" in with_ep


def test_dense_is_per_dp_rank(prod_values: dict[str, Any]) -> None:
    """Four DP ranks of TP4 on the same 16 GPUs: experts stay at 1/16, dense and Engram double per GPU (TP4), Engram
    also spreads over the two DP ranks sharing a node (vLLM's node-local Engram DP group)."""
    prod_values["parallelism"] |= {"tensor": 4, "data": 4}
    note = next(n for n in plan_of(prod_values).notes if n.startswith("memory per GPU"))
    assert "experts 17.2 + dense 7.1 + replicated 5.0 + Engram 25.3" in note


def test_profile_split_sums_to_the_weights() -> None:
    for name in ("deepseek-v4.1-flash", "deepseek-v4-flash"):
        profile = get_profile(name)
        assert profile is not None
        assert profile.weight_split.total_gb == pytest.approx(profile.weights_gb, abs=0.05)
        assert profile.weights_source.startswith("assumed")
        assert profile.sources["kv_ratios"] == "config.json: layer_types x compress_rates"


# ---------------------------------------------------------------------------------------- stacks/planner/memory.py


def test_classify_checkpoint_names() -> None:
    assert classify("layers.3.ffn.experts.17.w1.weight") == "experts"
    assert classify("model.layers.3.mlp.experts.0.down_proj.weight_scale_inv") == "experts"
    assert classify("layers.3.ffn.shared_experts.w1.weight") == "dense"
    assert classify("layers.3.engram.embed.weight") == "engram"
    assert classify("layers.3.engram.wkv.weight") == "dense"
    for name in ("layers.3.attn.wq_a.weight", "layers.3.attn.wkv.scale", "layers.3.attn.compressor.wgate.weight",
                 "layers.3.attn.indexer.weights_proj.weight", "layers.3.ffn.gate.weight", "layers.3.attn_norm.weight",
                 "layers.3.hc_attn_fn", "norm.weight"):
        assert classify(name) == "replicated", name
    for name in ("layers.3.attn.wq_b.weight", "layers.3.attn.wo_a.weight", "embed.weight", "head.weight"):
        assert classify(name) == "dense", name


def test_pp_partition_is_vllms() -> None:
    """vllm/distributed/utils.py get_pp_indices: the remainder goes to the stages before the last."""
    assert pp_partition(61, 1) == [(0, 61)]
    assert pp_partition(61, 2) == [(0, 31), (31, 61)]
    assert pp_partition(43, 3) == [(0, 14), (14, 29), (29, 43)]
    assert pp_partition(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]


def test_kv_bytes_per_token() -> None:
    # fp8_ds_mla: 584 B per stored state; ratio-4 layers add a 132 B FP8 indexer state; ratio 1 = window only
    assert kv_bytes_per_token((4, 128, 1), "fp8_ds_mla") == 584 / 4 + 132 / 4 + 584 / 128
    assert kv_bytes_per_token((4,), "fp8") == 512 / 4 + 132 / 4
    assert kv_bytes_per_token((128,), "auto") == 1024 / 128


def test_engram_dp_group() -> None:
    assert engram_dp_shards(2, [1, 1]) == 1  # prod: one DP rank per node
    assert engram_dp_shards(4, [2, 2]) == 2
    assert engram_dp_shards(3, [2, 1]) == 1  # nodes differ: no node-local group


def test_stage_splits_place_layers_embedding_and_head() -> None:
    sizes = {"embed.weight": 1, "layers.0.ffn.experts.0.w1.weight": 10, "layers.1.ffn.experts.0.w1.weight": 20,
             "layers.1.engram.embed.weight": 5, "head.weight": 2, "norm.weight": 3, "layers.2.attn.wq_b.weight": 7}
    first, last = stage_splits({k: int(v * 1e9) for k, v in sizes.items()}, num_layers=2, pp=2)
    assert first == WeightSplit(10, 1, 0, 0)
    assert last == WeightSplit(20, 2 + 7, 3, 5)  # layer 2 is past num_hidden_layers: a draft layer, last stage


# --------------------------------------------------------------------------------- the node's real files

GB = 1_000_000_000


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file: 8-byte header length, JSON header padded with spaces, data (left sparse)."""
    sizes = {"F8_E4M3": 1, "BF16": 2, "F32": 4, "U8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as handle:
        handle.write(len(raw).to_bytes(8, "little") + raw)
        handle.truncate(8 + len(raw) + offset)


def make_model(root: Path, expert_gb: int) -> Path:
    """Two decoder layers (compress ratios 4 and 128), four experts of `expert_gb` each per layer, Engram on
    layer 1, embedding and head: a V4.1-shaped checkpoint in two shards."""
    model = root / f"model-{expert_gb}"
    model.mkdir()
    text = {"num_hidden_layers": 2, "num_attention_heads": 64, "o_groups": 8, "head_dim": 512,
            "layer_types": ["csa", "hca"], "compress_rates": {"csa": 4, "hca": 128}}
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV41ForCausalLM"],
                                                   "text_config": text, "vision_config": {}}))
    (model / "tokenizer.json").write_text("{}")
    shards: dict[str, dict[str, tuple[str, list[int]]]] = {"model-00001-of-00002.safetensors": {},
                                                            "model-00002-of-00002.safetensors": {}}
    for layer, shard in ((0, "model-00001-of-00002.safetensors"), (1, "model-00002-of-00002.safetensors")):
        for e in range(4):
            shards[shard][f"layers.{layer}.ffn.experts.{e}.w1.weight"] = ("F8_E4M3", [expert_gb, GB])
        shards[shard][f"layers.{layer}.ffn.shared_experts.w1.weight"] = ("F8_E4M3", [1, GB])
        shards[shard][f"layers.{layer}.attn.wq_a.weight"] = ("F8_E4M3", [1, GB // 2])
        shards[shard][f"layers.{layer}.attn.wo_b.weight"] = ("F8_E4M3", [1, GB])
        shards[shard][f"layers.{layer}.attn_norm.weight"] = ("BF16", [4096])
    shards["model-00002-of-00002.safetensors"]["layers.1.engram.embed.weight"] = ("F8_E4M3", [10, GB])
    shards["model-00001-of-00002.safetensors"]["embed.weight"] = ("BF16", [1, GB // 2])
    shards["model-00002-of-00002.safetensors"]["head.weight"] = ("BF16", [1, GB // 2])
    for shard, tensors in shards.items():
        write_shard(model / shard, tensors)
    weight_map = {name: shard for shard, tensors in shards.items() for name in tensors}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model


MEMORY = ["--sections", "model", "--heads", "64", "--o-groups", "8", "--tp", "2", "--dp", "2", "--engram", "gpu",
          "--engram-shards", "2", "--gpu-memory-gb", "24", "--gpu-memory-utilization", "1", "--max-model-len",
          "1000000", "--kv-cache-dtype", "fp8_ds_mla", "--kv-fallback-bytes", "0"]


def preflight(*args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "checks.preflight", "--json", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout)


def test_real_sizes_change_the_verdict(tmp_path: Path) -> None:
    """Same config, same arguments, same tensor names: 5 GB experts fit a 24 GB GPU, 6 GB experts do not."""
    small, large = make_model(tmp_path, 5), make_model(tmp_path, 6)
    code, v = preflight(*MEMORY, "--model-dir", str(small))
    assert code == 0, v
    # experts 40/(2x2) + dense (2 shared + 2 wo_b + 1 embed + 1 head)/2 + replicated 1 + Engram 10/2
    assert ("per GPU: weights experts 10.0 + dense 3.0 + replicated 1.0 + Engram 5.0 = 19.0 GB; KV for one "
            "1000000-token sequence 0.2 GB (184 B/token); runtime reserve 4 GB; total 23.2 GB (KV from "
            "layer_types/compress_rates of config.json) of 24 GB x 1 = 24.0 GB") in v["evidence"][1]
    code, v = preflight(*MEMORY, "--model-dir", str(large))
    assert code == 1, v
    assert "weights do not fit: experts 12.0 + dense 3.0 + replicated 1.0 + Engram 5.0 = 21.0 GB per GPU" not in \
        " ".join(v["evidence"])  # weights alone still fit ...
    assert ("the KV cache of one 1000000-token sequence does not fit: 25.2 GB per GPU > 24.0 GB; max_model_len <= "
            in " ".join(v["evidence"]))  # ... their KV does not
    code, v = preflight(*MEMORY, "--model-dir", str(make_model(tmp_path, 8)))
    assert code == 1 and ("weights do not fit: experts 16.0 + dense 3.0 + replicated 1.0 + Engram 5.0 = 25.0 GB per "
                          "GPU > 24.0 GB") in " ".join(v["evidence"])
    assert "Engram in host memory" in v["next_step"]


def test_pp_stages_and_host_memory_for_offloaded_engram(tmp_path: Path) -> None:
    model = make_model(tmp_path, 5)
    proc = tmp_path / "proc"
    proc.mkdir()
    args = [*MEMORY, "--model-dir", str(model), "--pp", "2", "--engram", "host", "--engram-copies", "1",
            "--ranks-on-node", "4", "--procfs-root", str(proc)]
    (proc / "meminfo").write_text("MemTotal:       19531250 kB\nMemFree:         1000 kB\n")  # 20 GB
    code, v = preflight(*args)
    text = " ".join(v["evidence"])
    assert code == 1, v
    # both stages hold 20 GB of experts and 3 GB of dense weights; stage 0's layer (ratio 4, with its indexer)
    # costs more KV per token than stage 1's (ratio 128), so stage 0 is the heavier; Engram lives in RAM
    assert ("per GPU (PP stage 0 of 2): weights experts 5.0 + dense 1.5 + replicated 0.5 = 7.0 GB; KV for one "
            "1000000-token sequence 0.2 GB (179 B/token)") in text
    assert "host memory 20 GB < 26 GB: 10 GB of Engram tables pinned in RAM + 4 GB x 4 worker processes" in text
    (proc / "meminfo").write_text("MemTotal:       62500000 kB\n")  # 64 GB
    code, v = preflight(*args)
    assert code == 0, v
    assert "host memory 64 GB >= 26 GB (Engram tables 10 GB pinned)" in " ".join(v["evidence"])


def test_unreadable_shard_header_fails(tmp_path: Path) -> None:
    model = make_model(tmp_path, 1)
    (model / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 64)
    code, v = preflight(*MEMORY, "--model-dir", str(model))
    assert code == 1 and "1 shard header(s) unreadable, e.g. model-00002-of-00002.safetensors" in " ".join(
        v["evidence"])


def test_header_reader_matches_the_safetensors_library(tmp_path: Path) -> None:
    """Files written by the safetensors library (0.8.0) read back with the preflight's stdlib reader."""
    data = ctypes.create_string_buffer(64)
    spec = {name: safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(data), data_len=n)
            for name, dtype, shape, n in (("layers.0.ffn.experts.0.w1.weight", "float8_e4m3fn", [4, 8], 32),
                                          ("layers.0.attn_norm.weight", "bfloat16", [3], 6),
                                          ("layers.0.ffn.experts.0.w2.weight", "float4_e2m1fn_x2", [4, 2], 8))}
    path = tmp_path / "lib.safetensors"
    safetensors.serialize_file(spec, str(path), metadata={"format": "pt"})
    header = read_safetensors_header(path)
    sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
    assert sizes == {"layers.0.ffn.experts.0.w1.weight": 32, "layers.0.attn_norm.weight": 6,
                     "layers.0.ffn.experts.0.w2.weight": 8}
    assert header["layers.0.ffn.experts.0.w2.weight"]["dtype"] == "F4"
    ours = tmp_path / "ours.safetensors"
    write_shard(ours, {"a": ("F8_E4M3", [4, 8])})
    assert read_safetensors_header(ours)["a"]["data_offsets"] == [0, 32]


def test_slow_filesystem_ends_in_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """File reads cannot be given a timeout; the section stops between two shard headers when its budget is spent."""
    from checks import preflight as pf

    model = make_model(tmp_path, 1)
    monkeypatch.setitem(pf.SECTION_BUDGET_S, "model", 0)
    code = pf.main(["--json", *MEMORY, "--model-dir", str(model)])
    v = json.loads(capsys.readouterr().out)
    assert code == 2 and v["summary"].startswith("1 not run: model (read 0 of 2 shard headers before the section")


def test_redundant_experts_are_counted_on_the_node_as_in_the_plan(tmp_path: Path) -> None:
    """EPLB's redundant experts from the real headers: 4 routed experts per layer (40 GB over both layers), and 4
    redundant ones over DP2 x TP2 add 40 x 4/4 / 4 = 10 GB per GPU: the 24 GB GPU that holds the model without
    them (test_real_sizes_change_the_verdict) no longer does."""
    model = make_model(tmp_path, 5)
    code, v = preflight(*MEMORY, "--model-dir", str(model), "--redundant-experts", "4", "--routed-experts", "4")
    assert code == 1, v
    assert ("weights do not fit: experts 10.0 + redundant experts 10.0 + dense 3.0 + replicated 1.0 + Engram 5.0 = "
            "29.0 GB per GPU > 24.0 GB") in " ".join(v["evidence"])


def _lab_values() -> dict[str, Any]:
    """The lab example: qwen3-8b, a dense model, one L40S (48 GB) per node, DP2."""
    from stacks.model.loader import read_stack_values

    return read_stack_values("lab", ROOT / "examples")


def test_weights_that_fit_at_a_higher_utilisation_name_the_utilisation_not_bigger_gpus() -> None:
    """gpu_memory_utilization=0.01 on a 48 GB GPU: the fix was 'GPUs of at least 2099 GB, more DP ranks (the experts
    spread wider)' for a dense model whose only cause is the utilisation."""
    values = _lab_values()
    values["serving"]["gpu_memory_utilization"] = 0.01
    problem = _only(problems_of(values), "nodes.0.gpus.memory_gb")
    assert (problem.fix or "").startswith("serving.gpu_memory_utilization: 0.") and "or more" in (problem.fix or "")
    assert "GB" not in (problem.fix or "") and "experts" not in (problem.fix or ""), problem.fix


def test_a_dense_model_too_big_for_its_gpus_is_told_tp_or_pp_not_more_dp_ranks() -> None:
    """DP ranks each hold a whole copy of a dense model: only TP and PP split its weights."""
    values = _lab_values()
    for node in values["nodes"]:
        node["gpus"] |= {"memory_gb": 8, "model": "Lab GPU 8"}
    problem = _only(problems_of(values), "nodes.0.gpus.memory_gb")
    assert "GPUs of at least" in (problem.fix or "") and "parallelism.tensor or parallelism.pipeline" in (
        problem.fix or ""), problem.fix
    assert "experts" not in (problem.fix or ""), problem.fix
