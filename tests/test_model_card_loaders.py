"""`python -m stacks model-card` refuses what the loaders behind vLLM refuse (review/loader_rules.py): a
safetensors header the safetensors library would not open, a name that is not one clean line, a folder it cannot
write to, links that leave the model folder; and it records the quantization vLLM reads."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from review.loader_rules import quantization_config, quantization_method
from review.model_card import CardError, LocalSource, model_facts, parse_header
from tests.conftest import ROOT

QWEN = "tests/fixtures/models/qwen3-8b"


def _header(tensors: dict[str, Any]) -> bytes:
    return json.dumps(tensors).encode()


GOOD = {"a": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}
REFUSED = [
    ({**GOOD, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, None, "overlapping tensors"),
    ({**GOOD, "b": {"dtype": "F32", "shape": [4], "data_offsets": [20, 36]}}, None, "a gap between tensors"),
    (GOOD, 24, "the tensors end at byte 32 of the data, the file holds 24 bytes after its header: truncated"),
    (GOOD, 40, "bytes no tensor owns"),
    ({**GOOD, "b": {"dtype": "F32", "shape": [-4], "data_offsets": [16, 32]}}, None, "has a negative size"),
    ({**GOOD, "b": {"dtype": "Q4_K", "shape": [4], "data_offsets": [16, 32]}}, None,
     "dtype 'Q4_K' is not a safetensors dtype"),
    ({**GOOD, "b": {"dtype": "F32", "shape": [4], "data_offsets": [32, 16]}}, None, "are not a byte range"),
    ({**GOOD, "b": {"dtype": "F32", "shape": [5], "data_offsets": [16, 32]}}, None,
     "data_offsets span 16 bytes, F32 [5] is 20"),
]


@pytest.mark.parametrize(("tensors", "data_bytes", "said"), REFUSED, ids=[r[2][:40] for r in REFUSED])
def test_a_header_the_safetensors_loader_refuses_is_refused(tensors: dict[str, Any], data_bytes: int | None,
                                                            said: str) -> None:
    data = _header(tensors)
    size = None if data_bytes is None else 8 + len(data) + data_bytes
    with pytest.raises(CardError) as caught:
        parse_header(data, "model-00001.safetensors", size)
    assert said in str(caught.value) and "the safetensors loader refuses this file" in str(caught.value)
    assert str(caught.value).startswith("model-00001.safetensors: ")


def test_a_header_the_loader_opens_is_read() -> None:
    data = _header({"__metadata__": {"format": "pt"}, **GOOD})
    sizes, dtypes, shapes = parse_header(data, "x", 8 + len(data) + 32)
    assert sizes == {"a": 16, "b": 16} and dtypes == {"a": "BF16", "b": "F32"} and shapes["a"] == [2, 4]


def test_the_real_safetensors_library_agrees_on_a_file_it_wrote(tmp_path: Path) -> None:
    import ctypes

    import safetensors

    buffers = {name: ctypes.create_string_buffer(size) for name, size in (("w", 30), ("u", 14))}
    spec = {"w": safetensors.TensorSpec(dtype="bfloat16", shape=[3, 5], data_ptr=ctypes.addressof(buffers["w"]),
                                        data_len=30),
            "u": safetensors.TensorSpec(dtype="uint16", shape=[7], data_ptr=ctypes.addressof(buffers["u"]),
                                        data_len=14)}
    safetensors.serialize_file(spec, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    raw = (tmp_path / "m.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    sizes, dtypes, _ = parse_header(raw[8:8 + length], "m.safetensors", len(raw))
    assert sizes == {"w": 30, "u": 14} and dtypes == {"w": "BF16", "u": "U16"}


@pytest.mark.parametrize(("config", "method", "where"), [
    ({"quantization_config": {"quant_method": "FP8"}}, "fp8", "config.json: quantization_config"),
    ({"compression_config": {"quant_method": "compressed_tensors"}}, "compressed-tensors",
     "config.json: compression_config"),
    ({"text_config": {"quantization_config": {"quant_method": "mxfp4"}}}, "mxfp4",
     "config.json: text_config: quantization_config"),
    ({"quantization_config": {"quant_method": "fp8"}, "text_config": {"quantization_config": {"quant_method": "awq"}}},
     "fp8", "config.json: quantization_config"),
    ({"quantization_config": {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}},
     "modelopt_fp4", "config.json: quantization_config"),
])
def test_quantization_is_read_where_and_as_vllm_reads_it(config: dict[str, Any], method: str, where: str) -> None:
    """vllm/transformers_utils/model_arch_config_convertor.py:241-292: the top level before text_config,
    compression_config after quantization_config, the method normalized. The card's merge of text_config over
    the top level once let a text_config's config win."""
    found, said = quantization_config(config)
    assert found is not None and quantization_method(found) == method and said == where


def test_a_card_records_the_quantization_of_compression_config() -> None:
    raw = {**json.loads((ROOT / QWEN / "config.json").read_text()),
           "compression_config": {"quant_method": "compressed_tensors"}}
    facts, sources = model_facts(raw, raw)
    assert facts["quantization"]["method"] == "compressed-tensors"
    assert sources["quantization"] == "config.json: compression_config"


def _card(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    """`model-card` as a user runs it, in a project `root` (it writes only into a project)."""
    if root.is_dir() and not (root / "Pulumi.yaml").exists():
        (root / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    return subprocess.run([sys.executable, "-m", "stacks", "model-card", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "VLLM_CLUSTER_ROOT": str(root)})


def test_a_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """`^…$` lets `q\\n` through; the name would become the file models/q\\n.json."""
    done = _card(QWEN, "--name", "q\n", "--synthesize-weights", root=tmp_path)
    assert done.returncode == 2 and "--name 'q\\n'" in done.stdout + done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("in_the_way", ["file", "folder"])
def test_something_in_the_way_of_the_card_is_exit_2(tmp_path: Path, in_the_way: str) -> None:
    if in_the_way == "file":
        (tmp_path / "models").write_text("not a folder")
    else:
        (tmp_path / "models" / "q.json").mkdir(parents=True)
    done = _card(QWEN, "--name", "q", "--synthesize-weights", root=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and f"cannot write {tmp_path}/models/q.json" in out, out
    assert "internal error" not in out and "Traceback" not in out


def test_links_inside_the_model_folder_are_followed_and_links_out_of_it_refused(tmp_path: Path) -> None:
    model, blobs, outside = tmp_path / "model", tmp_path / "model" / "blobs", tmp_path / "elsewhere"
    blobs.mkdir(parents=True)
    outside.mkdir()
    (blobs / "cfg").write_text("{}")
    (outside / "cfg").write_text("{}")
    (model / "config.json").symlink_to(blobs / "cfg")
    (model / "other.json").symlink_to(outside / "cfg")
    (model / "gone.json").symlink_to(tmp_path / "missing")
    source = LocalSource(model)
    assert source.exists("config.json") and source.read("config.json") == b"{}"
    with pytest.raises(CardError) as outward:
        source.read("other.json")
    assert f"a symbolic link to {outside / 'cfg'}, outside the model folder" in str(outward.value)
    with pytest.raises(CardError) as dangling:
        source.exists("gone.json")
    assert "leads nowhere" in str(dangling.value)


@pytest.mark.parametrize(("edit", "said"), [
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}},
     "quantization_config.weight_block_size = [0, 128]: not an FP8 block"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, "x"]}},
     "quantization_config.weight_block_size = [128, 'x']"),
    ({"use_sliding_window": True, "sliding_window": -5}, "sliding_window = -5: not a window"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0.0}}, "rope_scaling.factor = 0.0"),
], ids=["block 0", "block text", "negative window", "zero rope factor"])
def test_a_config_vllm_cannot_size_is_refused_before_any_card(tmp_path: Path, edit: dict[str, Any],
                                                              said: str) -> None:
    """A block size of 0 was a ZeroDivisionError (exit 3), a negative window a card."""
    model = tmp_path / "m"
    model.mkdir()
    config = json.loads((ROOT / QWEN / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **edit}))
    done = _card(str(model), "--name", "q", "--synthesize-weights", root=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and f"model-card: config.json: {said}" in out, out
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_a_checkpoint_file_that_is_not_a_file_is_named(tmp_path: Path, kind: str) -> None:
    """model.safetensors as a FIFO (a read would block) or a directory: the card says what is in the way, not that
    the folder has no weights."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((ROOT / QWEN / "config.json").read_text())
    if kind == "FIFO":
        os.mkfifo(model / "model.safetensors")
    else:
        (model / "model.safetensors").mkdir()
    (tmp_path / "project").mkdir()
    done = _card(str(model), "--name", "q", root=tmp_path / "project")
    out = done.stdout + done.stderr
    assert done.returncode == 2 and f"model.safetensors: is a {kind}, not a file" in out, out
    assert "neither" not in out


def test_a_huge_or_fractional_shape_is_refused_without_printing_it_whole() -> None:
    for shape in ([10 ** 400], [2.5]):
        with pytest.raises(CardError) as caught:
            parse_header(_header({**GOOD, "b": {"dtype": "F32", "shape": shape, "data_offsets": [16, 32]}}), "x",
                         None)
        assert "shape is not a list of 64-bit integers" in str(caught.value) and len(str(caught.value)) < 300
