"""Compile and kernel caches kept across restarts of the same image and argv (stacks/planner/launch.py
`cache_key`): each engine container's /root/.cache is a subdirectory of `container.cache_dir` keyed by its image,
argv and plain env, so a restart of the same finds its caches and any other change never reads them."""

from __future__ import annotations

import copy
from typing import Any

from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan


def _cache_dirs(values: dict[str, Any]) -> dict[str, str]:
    plan = build_plan("prod", parse_config("prod", values))
    return {n.name: next(v.host for v in n.containers[0].volumes if v.container == "/root/.cache")
            for n in plan.nodes}


def test_the_same_image_and_argv_find_the_same_cache() -> None:
    values = read_stack_values("prod")
    first, again = _cache_dirs(copy.deepcopy(values)), _cache_dirs(copy.deepcopy(values))
    assert first == again
    root = values["container"]["cache_dir"]
    assert all(path.startswith(f"{root}/") and len(path) == len(root) + 17 for path in first.values())
    assert len(set(first.values())) == len(first)  # each node's argv differs (its DP rank): its own entry


def test_another_image_argv_or_env_never_reuses_an_entry() -> None:
    values = read_stack_values("prod")
    base = _cache_dirs(copy.deepcopy(values))
    image = copy.deepcopy(values)
    image["image"]["tag"] = "nightly-0123456789abcdef0123456789abcdef01234567"
    argv = copy.deepcopy(values)
    argv.setdefault("serving", {})["max_num_seqs"] = 64
    env = copy.deepcopy(values)
    env.setdefault("container", {}).setdefault("env", {})["VLLM_LOGGING_LEVEL"] = "DEBUG"
    for changed in (image, argv, env):
        moved = _cache_dirs(changed)
        assert all(moved[node] != base[node] for node in base)


def test_a_restart_epoch_keeps_the_cache() -> None:
    """A group restart of the same image and argv (container.restart_epoch) reads the caches it left."""
    values = read_stack_values("prod")
    bumped = copy.deepcopy(values)
    bumped["container"]["restart_epoch"] = values["container"].get("restart_epoch", 0) + 1
    assert _cache_dirs(bumped) == _cache_dirs(copy.deepcopy(values))
