"""Image capability table: what a given engine image can and cannot do.

The rules that differ per image (a bug fixed in a nightly, a parser added) live here as data, keyed by
`repository:tag`. An image not in the table gets the general rules and a warning, never a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageCapabilities:
    vllm_version: str
    profiles: frozenset[str]
    parsers: frozenset[str]
    vision_with_pp: bool
    speculative_methods: frozenset[str]
    source: str
    engram_shards_across_dp: bool = False
    """True where the image spreads the Engram embedding over DP too (shards = TP x DP)."""
    option_table: str | None = None
    """The vLLM version of this image's card (images/), for the rules here that need its KV cache dtypes; the
    argv itself is read against the card matched by image reference (stacks/planner/image_cards.py)."""
    engram_cpu_offload: bool | None = None
    routes: str | None = None
    """The vLLM version whose HTTP routes (stacks/planner/data/vllm-<v>-routes.json, read from the wheel) this image
    serves;
    None where not known: the proxy then denies a built-in list and the plan warns (stacks/planner/proxy.py)."""
    """The image's default for Engram tables in pinned host memory (vLLM `EngramConfig.cpu_offload`); None where
    not known: the memory rule then counts them in GPU memory (stacks/planner/memory.py)."""


IMAGES: dict[str, ImageCapabilities] = {
    "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657": ImageCapabilities(
        vllm_version="nightly eed1f3d0",
        profiles=frozenset({"deepseek-v4.1-flash", "deepseek-v4-flash"}),
        parsers=frozenset({"deepseek_v41", "deepseek_v4"}),
        vision_with_pp=True,
        speculative_methods=frozenset({"dspark"}),
        source="seed 000: first nightly that runs V4.1-Flash on two nodes (2026-09-14)",
    ),
    "vllm/vllm-openai:deepseekv41-flash-0909": ImageCapabilities(
        vllm_version="0.1.dev20904+g179dd0fa9",
        profiles=frozenset({"deepseek-v4.1-flash"}),
        parsers=frozenset({"deepseek_v41"}),
        vision_with_pp=False,
        speculative_methods=frozenset({"dspark"}),
        source="seed 000: single-node TP8 only; PP2+vision fails in profile_run",
    ),
    "vllm/vllm-openai:v0.33.0": ImageCapabilities(
        vllm_version="0.33.0",
        profiles=frozenset({"deepseek-v4.1-flash", "deepseek-v4-flash"}),
        parsers=frozenset({"deepseek_v41", "deepseek_v4"}),
        vision_with_pp=True,
        speculative_methods=frozenset({"dspark"}),
        engram_cpu_offload=True,
        source="the vLLM 0.33.0 wheel from PyPI, read 2026-12-02: its model registry has DeepseekV4ForCausalLM "
               "and DeepseekV41ForCausalLM, tokenizers/tool_parsers/reasoning register deepseek_v4 and "
               "deepseek_v41, config/speculative.py knows dspark, config/engram.py defaults cpu_offload=True; "
               "seed 001 baseline (image name hidden there)",
        option_table="0.33.0",
        routes="0.33.0",
    ),
}


DOCKER_HUB = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")


def canonical_ref(image_ref: str) -> str:
    """`repo:tag` as Docker resolves it: Docker Hub's host and its `library/` namespace are implied, so
    `docker.io/vllm/vllm-openai:v0.33.0` is the same image as `vllm/vllm-openai:v0.33.0`
    (distribution/reference `normalize.go`)."""
    for host in DOCKER_HUB:
        if image_ref.startswith(host):
            image_ref = image_ref[len(host):]
            break
    return image_ref.removeprefix("library/")


def get_capabilities(image_ref: str) -> ImageCapabilities | None:
    return IMAGES.get(canonical_ref(image_ref))
