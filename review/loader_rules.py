"""What the loaders behind vLLM would refuse or read, applied by `python -m stacks model-card` before a card is
written: the safetensors header rules (a checkpoint the loader refuses must not get a card that plans), vLLM's
lookup of the quantization config (the card must record what vLLM will run), and which symbolic links a model
folder may hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SAFETENSORS_DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
                          "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
                          "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64}
"""The dtypes the safetensors format defines (safetensors 0.6, `Dtype`) and their bits per element: a header
naming another does not deserialize."""


class LoaderRefusal(ValueError):
    """What the loader would refuse, in its words; model-card prefixes the shard."""


def check_header(tensors: dict[str, tuple[int, int, str, list[int]]], data_bytes: int | None) -> None:
    """safetensors' own checks of a header (`Metadata::validate` and `read_metadata`): every dtype known, every
    shape of non-negative sizes, the tensors' byte ranges back to back from 0 with no gap or overlap, each exactly
    as long as its dtype and shape, and the last ending where the file does (`data_bytes`, when known)."""
    for name, (start, end, dtype, shape) in tensors.items():
        if dtype not in SAFETENSORS_DTYPE_BITS:
            raise LoaderRefusal(f"tensor {name}: dtype {dtype!r} is not a safetensors dtype (one of "
                                f"{', '.join(SAFETENSORS_DTYPE_BITS)})")
        if any(size < 0 for size in shape):
            raise LoaderRefusal(f"tensor {name}: shape {shape} has a negative size")
        if start < 0 or end < start:
            raise LoaderRefusal(f"tensor {name}: data_offsets [{start}, {end}] are not a byte range")
        bits = SAFETENSORS_DTYPE_BITS[dtype]
        elements = 1
        for size in shape:
            elements *= size
        if (elements * bits) % 8 or end - start != elements * bits // 8:
            raise LoaderRefusal(f"tensor {name}: data_offsets span {end - start} bytes, {dtype} {shape} is "
                                f"{elements * bits // 8 if (elements * bits) % 8 == 0 else elements * bits / 8}")
    position = 0
    for name, (start, end, _, _) in sorted(tensors.items(), key=lambda item: (item[1][0], item[1][1])):
        if start != position:
            raise LoaderRefusal(f"tensor {name}: data_offsets start at byte {start}, the tensor before it ends at "
                                f"{position}: {'overlapping' if start < position else 'a gap between'} tensors")
        position = end
    if data_bytes is not None and position != data_bytes:
        raise LoaderRefusal(f"the tensors end at byte {position} of the data, the file holds {data_bytes} bytes "
                            f"after its header: {'truncated' if data_bytes < position else 'bytes no tensor owns'}")


def quantization_config(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The quantization config vLLM 0.33.0 reads from config.json, and where it was found: `quantization_config`,
    else `compression_config` (compressed-tensors), at the top level first and then in `text_config`
    (vllm/transformers_utils/model_arch_config_convertor.py:241-292)."""
    for holder, where in ((raw, "config.json"), (raw.get("text_config"), "config.json: text_config")):
        if not isinstance(holder, dict):
            continue
        for key in ("quantization_config", "compression_config"):
            if holder.get(key) is not None:
                return holder[key], f"{where}: {key}"
    return None, "config.json has no quantization_config or compression_config"


MODELOPT_METHODS = {"FP8": "modelopt", "FP8_PER_CHANNEL_PER_TOKEN": "modelopt", "FP8_PB_WO": "modelopt",
                    "NVFP4": "modelopt_fp4", "MIXED_PRECISION": "modelopt_mixed"}
"""ModelOpt's quant_algo -> the method vLLM sets (model_arch_config_convertor.py:248-269)."""


def quantization_method(config: dict[str, Any]) -> str:
    """`quant_method` as vLLM normalizes it: ModelOpt's algorithm mapped, lower case, `compressed_tensors` spelt
    `compressed-tensors` (model_arch_config_convertor.py:246-282). ValueError where vLLM raises or finds none."""
    producer = config.get("producer")
    modelopt = config.get("quantization")
    legacy = isinstance(modelopt, dict) and "modelopt_quant_config" in modelopt
    if (isinstance(producer, dict) and producer.get("name") == "modelopt") or legacy:
        algo = modelopt.get("quant_algo") if isinstance(modelopt, dict) else None
        if algo is not None:
            if str(algo).upper() not in MODELOPT_METHODS:
                raise ValueError(f"Unknown ModelOpt quant algo: {algo} (vLLM raises this)")
            return MODELOPT_METHODS[str(algo).upper()]
    method = config.get("quant_method")
    if not isinstance(method, str) or not method.strip():
        raise ValueError("quant_method is missing")
    return method.lower().replace("compressed_tensors", "compressed-tensors")


def link_problem(root: Path, name: str) -> str | None:
    """Why the file `name` of the model folder `root` is refused as a link, or None. A link that stays inside the
    folder is what `hf download --local-dir` and shared blob stores leave, and is accepted; one that leaves the
    folder (or dangles) describes files the folder does not hold: the weight sync and the node preflight see the
    folder, not the link's target."""
    path = root / name
    linked = False
    for part in (path, *path.parents):
        if part == root:
            break
        linked = linked or part.is_symlink()
    if not linked:
        return None
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return f"{path} is a symbolic link that leads nowhere (dangling, or a loop)"
    inside = root.resolve()
    if target != inside and inside not in target.parents:
        return (f"{path} is a symbolic link to {target}, outside the model folder {inside}: links are accepted "
                "only when they stay inside it (the nodes get the folder's files, not the link's target); copy "
                "the file in, or point model-card at the folder that holds it")
    return None
