"""Known data-centre GPUs and the memory of one GPU, so that `nodes[].gpus.memory_gb` cannot contradict
`nodes[].gpus.model` (the planner sizes every shard and the KV cache from memory_gb; the preflight compares both
with `nvidia-smi`, but only on the node and only after the plan was accepted).

Reviewed data: each row names the marketed per-GPU memory in GB as NVIDIA's product page or datasheet gives it.
`nvidia-smi` prints MiB (an 80 GB H100 shows 81559 MiB, about 85.5 decimal GB), so a stack may write either
figure: `TOLERANCE` accepts both. A model not in the table gets a warning, never a refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownGpu:
    family: str
    pattern: re.Pattern[str]
    memory_gb: tuple[float, ...]
    source: str


def _gpu(family: str, pattern: str, memory_gb: tuple[float, ...], source: str) -> KnownGpu:
    return KnownGpu(family, re.compile(pattern, re.I), memory_gb, source)


KNOWN_GPUS: tuple[KnownGpu, ...] = (
    _gpu("GH200", r"\bGH200\b", (96, 144), "nvidia.com/en-us/data-center/grace-hopper-superchip (96 GB HBM3 or "
         "144 GB HBM3e)"),
    _gpu("GB200", r"\bGB200\b", (186, 192), "nvidia.com/en-us/data-center/gb200-nvl72 (13.4 TB HBM3e over 72 GPUs)"),
    _gpu("GB300", r"\bGB300\b", (279, 288), "nvidia.com/en-us/data-center/gb300-nvl72 (up to 288 GB HBM3e)"),
    _gpu("B300", r"\bB300\b", (279, 288), "NVIDIA Blackwell Ultra datasheet (288 GB HBM3e)"),
    _gpu("B200", r"\bB200\b", (180, 192), "DGX B200 datasheet (1,440 GB over 8 GPUs = 180 GB; 192 GB HBM3e "
         "physical)"),
    _gpu("H200", r"\bH200\b", (141,), "nvidia.com/en-us/data-center/h200 (141 GB HBM3e)"),
    _gpu("H100", r"\bH100\b", (80, 94, 96), "nvidia.com/en-us/data-center/h100 (SXM and PCIe 80 GB, NVL 94 GB; "
         "the 96 GB H100 SXM5 variant)"),
    _gpu("H800", r"\bH800\b", (80,), "NVIDIA H800 product brief (80 GB HBM3)"),
    _gpu("H20", r"\bH20\b", (96, 141), "NVIDIA H20 product brief (96 GB HBM3; the later H20 has 141 GB HBM3e)"),
    _gpu("A100", r"\bA100\b", (40, 80), "nvidia.com/en-us/data-center/a100 (40 GB HBM2 or 80 GB HBM2e)"),
    _gpu("A800", r"\bA800\b", (40, 80), "NVIDIA A800 product brief (40 GB or 80 GB)"),
    _gpu("L40S", r"\bL40S\b", (48,), "nvidia.com/en-us/data-center/l40s (48 GB GDDR6)"),
    _gpu("L40", r"\bL40\b", (48,), "nvidia.com/en-us/data-center/l40 (48 GB GDDR6)"),
    _gpu("L20", r"\bL20\b", (48,), "NVIDIA L20 product brief (48 GB GDDR6)"),
    _gpu("L4", r"\bL4\b", (24,), "nvidia.com/en-us/data-center/l4 (24 GB GDDR6)"),
    _gpu("A10", r"\bA10\b", (24,), "nvidia.com/en-us/data-center/products/a10-gpu (24 GB GDDR6)"),
    _gpu("V100", r"\bV100\b", (16, 32), "nvidia.com/en-us/data-center/v100 (16 GB or 32 GB HBM2)"),
    _gpu("RTX PRO 6000", r"\bRTX PRO 6000\b", (96,), "NVIDIA RTX PRO 6000 Blackwell datasheet (96 GB GDDR7)"),
)
"""Most specific first (GH200 before H200, L40S before L40)."""

TOLERANCE = 0.10
"""memory_gb may be the marketed figure or nvidia-smi's MiB read as GB: within 10 % of a table value."""
_IN_NAME = re.compile(r"(\d{2,3})\s?GB\b", re.I)


def known_gpu(model: str) -> KnownGpu | None:
    return next((gpu for gpu in KNOWN_GPUS if gpu.pattern.search(model)), None)


def expected_memory_gb(model: str) -> tuple[KnownGpu, tuple[float, ...]] | None:
    """The memory sizes this model name allows (narrowed by a size in the name, e.g. 'A100-SXM4-40GB'), or None
    for a model the table does not know."""
    gpu = known_gpu(model)
    if gpu is None:
        return None
    named = [float(m) for m in _IN_NAME.findall(model) if float(m) in gpu.memory_gb]
    return gpu, tuple(named) or gpu.memory_gb


def memory_fits(memory_gb: float, allowed: tuple[float, ...]) -> bool:
    return any(abs(memory_gb - size) <= size * TOLERANCE for size in allowed)
