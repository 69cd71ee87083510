"""How long a node needs to load its share of the weights: the floor for the engine-ready timeout.

The default rate is what the field report implies: 511 GB over two nodes in about forty minutes (seed 000),
about 0.1 GB/s per node including safetensors parsing and sharding. `model.load_gb_per_s` overrides it.
"""

from __future__ import annotations

import math

from stacks.config import StackConfig
from stacks.profiles import ModelProfile
from stacks.topology import Topology

STARTUP_S = 300
"""Process start, NCCL init, CUDA graph capture and warm-up on top of reading the weights."""


def weight_shards(config: StackConfig) -> int:
    """Experts spread over EP = DP x TP; without EP every DP replica holds the whole model on TP x PP GPUs."""
    par = config.parallelism
    return par.tensor * par.pipeline * (par.data if par.expert else 1)


def weights_per_gpu_gb(config: StackConfig, profile: ModelProfile) -> float:
    return (config.model.weights_gb or profile.weights_gb) / weight_shards(config)


def estimated_load_s(config: StackConfig, profile: ModelProfile, topo: Topology) -> int:
    """The slowest node: its GPUs' share of the weights at the load rate, plus start-up."""
    per_node = max(n.gpus_used for n in topo.nodes) * weights_per_gpu_gb(config, profile)
    return math.ceil(per_node / config.model.load_gb_per_s) + STARTUP_S
