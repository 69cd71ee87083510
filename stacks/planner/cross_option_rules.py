"""vLLM 0.33.0's rules between options, and between options and the model, that the plan decides without the
image: expert parallelism and EPLB against the model's class, LoRA (against the model's class, by the image's
card) and the OpenAI frontend
(`validate_parsed_serve_args`); the scheduler's are in `managed_options.scheduler_problems`. Each refusal
quotes the error vLLM raises and its file:line in the 0.33.0 wheel, and says when vLLM checks it (argument
parsing, engine start-up, or model load, after the weights are read). Called from `managed_options.argv_problems`
with the extra_args read as the image's vLLM reads them."""

from __future__ import annotations

import itertools
import json
import math
import re

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.planner.image_cards import ImageCard
from stacks.planner.model_cards import ModelProfile
from stacks.planner.option_values import fits_float
from stacks.planner.serve_options import ArgvItem

NO_EPLB_CLASSES = {
    "GptOssForCausalLM": "vllm/model_executor/models/gpt_oss.py:1369-1371",
}
"""MoE model classes of vLLM 0.33.0 that do not implement `MixtureOfExperts` (where the class is declared): the
model runner registers only a MixtureOfExperts model with EPLB (vllm/v1/worker/gpu_model_runner.py:5061-5073), so
EPLB on them rebalances nothing. (DeepseekV2/V3 and Qwen3-MoE implement it: deepseek_v2.py:1872-1876,
qwen3_moe.py:543-549.)"""
BUCKET_FAMILIES = ("request_latency", "time_to_first_token", "inter_token_latency", "iteration_tokens",
                   "request_params_n", "request_num_preemptions", "request_tokens", "kv_cache_residency")
"""`--custom-histogram-buckets` families vLLM 0.33.0 knows (vllm/v1/metrics/buckets.py:13-22, BucketFamilyKey)."""
LORA_DEFAULT_MAX_LORAS = 1
"""`LoRAConfig.max_loras` when `--max-loras` is not given (vllm/config/lora.py:36)."""


def _last(items: list[ArgvItem], dest: str) -> ArgvItem | None:
    return next((i for i in reversed(items) if i.dest == dest), None)


def _on(items: list[ArgvItem], dest: str) -> ArgvItem | None:
    """The last occurrence of a boolean flag when it turns the option on (`--x`, not `--no-x` / `--x false`)."""
    item = _last(items, dest)
    if item is None or ((item.option or "").startswith(("--no-", "--disable-")) and not dest.startswith("disable")):
        return None
    if item.values and item.values[-1].lower() in ("false", "0", "no", "off"):
        return None
    return item


def integer(item: ArgvItem | None) -> int | None:
    if item is None or not item.values or not re.fullmatch(r"-?\d+", item.values[-1].strip()):
        return None  # not an int: the option-value check refuses it by the image's card
    return int(item.values[-1])


def _at(item: ArgvItem) -> str:
    return f"serving.extra_args.{item.index}"


def _shown(item: ArgvItem) -> str:
    return " ".join([item.word, *item.values]) if "=" not in item.word else item.word


def expert_model_rules(config: StackConfig, profile: ModelProfile) -> list[Problem]:
    """Expert parallelism on a dense model (vLLM refuses it when the engine config is built) and EPLB on a model
    class that does not implement it (vLLM would start and balance nothing, with the redundant experts' memory
    spent): both refused."""
    par, problems = config.parallelism, []
    if par.expert and not profile.moe:
        problems.append(Problem(
            "parallelism.expert", True, f"{profile.key} is a dense model (no routed experts in its config.json): "
            "there is nothing to spread over expert-parallel ranks",
            upstream="ValueError (engine start-up, before the weights load): Number of experts in the model must be "
                     "greater than 0 when expert parallelism is enabled. (vllm/config/model.py:1498-1503, called at "
                     "model.py:1566-1567)",
            fix="parallelism.expert: false"))
    where = NO_EPLB_CLASSES.get(profile.architecture)
    if par.expert and par.eplb.enabled and where is not None:
        problems.append(Problem(
            "parallelism.eplb.enabled", True,
            f"{profile.key}'s vLLM class {profile.architecture} does not implement MixtureOfExperts ({where}), "
            "and vLLM balances only a model that does (vllm/v1/worker/gpu_model_runner.py:5061-5073): EPLB would "
            "move no expert, and its redundant experts would only take memory. vLLM raises no error; this shows "
            "only at model load, in the missing \"EPLB is enabled for MoE part of model\" log line",
            fix="parallelism.eplb.enabled: false (and num_redundant_experts: 0)"))
    return problems


def lora_rules(items: list[ArgvItem]) -> list[Problem]:
    """`--max-cpu-loras` below `--max-loras` (default 1): LoRAConfig refuses it when the engine config is built."""
    cpu = _last(items, "max_cpu_loras")
    cpu_value = integer(cpu)
    if cpu is None or cpu_value is None:
        return []
    gpu = _last(items, "max_loras")
    gpu_value = integer(gpu) if gpu is not None else LORA_DEFAULT_MAX_LORAS
    if gpu_value is None or cpu_value >= gpu_value:
        return []
    return [Problem(_at(cpu), _shown(cpu),
                    f"max_cpu_loras {cpu_value} is below max_loras {gpu_value}"
                    f"{'' if gpu is not None else ' (its default)'}: the CPU cache must hold every adapter on the GPU",
                    upstream=f"ValueError (engine start-up): max_cpu_loras ({cpu_value}) must be >= max_loras "
                    f"({gpu_value}). (vllm/config/lora.py:123-127)",
                    fix=f"--max-cpu-loras {gpu_value} or more, or leave it out (it then equals max_loras)")]


def lora_model_rules(profile: ModelProfile, card: ImageCard | None, items: list[ArgvItem]
                     ) -> tuple[list[Problem], list[str]]:
    """`--enable-lora` for a model whose class (the one vLLM imports on CUDA, from the image's card:
    `lora_architectures`, read by checks/model_classes.py) does not support LoRA: refused. A card without the
    field, or an architecture it could not resolve, is a warning that the rule was not checked."""
    on = _on(items, "enable_lora")
    impl = _last(items, "model_impl")
    if on is None or (impl is not None and impl.values and impl.values[-1] not in ("auto", "vllm")):
        return [], []  # another --model-impl (transformers, terratorch) serves another class
    arch = profile.architecture
    table = card.raw.get("lora_architectures") if card is not None else None
    unsupported = table.get("unsupported") if isinstance(table, dict) else None
    supported = table.get("supported") if isinstance(table, dict) else None
    if not isinstance(unsupported, dict) or not isinstance(supported, dict):
        where = (f"{card.path} has no lora_architectures (a card taken before probe 4: take it again with "
                 f"`image-card`)" if card is not None else "the image has no card")
        return [], [f"serving.extra_args {_shown(on)}: whether {profile.key}'s architecture {arch} supports LoRA "
                    f"was not checked: {where}; vLLM refuses LoRA for a model class without SupportsLoRA when the "
                    "engine starts"]
    assert card is not None and isinstance(table, dict)  # the field came from it
    if arch in supported:
        return [], []
    if arch not in unsupported:
        unresolved = table.get("unresolved")
        why = unresolved.get(arch, "not listed") if isinstance(unresolved, dict) else "not listed"
        return [], [f"serving.extra_args {_shown(on)}: whether {arch} supports LoRA was not checked: {card.path} "
                    f"could not resolve its class from the image's source ({str(why)[:200]})"]
    where = str(unsupported[arch])[:200]
    cls = where.rsplit(" ", 1)[-1]
    return [Problem(
        _at(on), _shown(on),
        f"{profile.key}'s architecture {arch} is served on CUDA by {where} ({card.path}: "
        "lora_architectures), a class that does not implement SupportsLoRA",
        upstream=f"ValueError (engine start-up, when the engine config is built, before the weights load): LoRA is "
                 f"not supported for {arch} (<model>). Supported models implement the `SupportsLoRA` interface. Run "
                 "this model without `enable_lora`. (vllm/config/lora.py:147-155, called at vllm/config/vllm.py:"
                 f"1592-1593); the model load would refuse it too: {cls} does not support LoRA yet. "
                 "(vllm/v1/worker/lora_model_runner_mixin.py:49-50)",
        fix="drop --enable-lora (and the --lora-modules / --max-lora* flags), or serve a model whose architecture "
            "supports LoRA")], []


def frontend_rules(items: list[ArgvItem]) -> list[Problem]:
    """The OpenAI server's own cross-option checks (`validate_parsed_serve_args`), run right after the arguments
    are parsed, before the engine starts (vllm/entrypoints/common/cli_args.py:531-571)."""
    problems: list[Problem] = []
    outputs = _on(items, "enable_log_outputs")
    if outputs is not None and _on(items, "enable_log_requests") is None:
        problems.append(Problem(
            _at(outputs), _shown(outputs), "logs request outputs, and request logging is off",
            upstream="TypeError (argument check): Error: --enable-log-outputs requires --enable-log-requests "
                     "(vllm/entrypoints/common/cli_args.py:555-556)",
            fix="add --enable-log-requests, or drop --enable-log-outputs"))
    keep_alive = _last(items, "sse_keep_alive_interval")
    interval = integer(keep_alive)
    if keep_alive is not None and interval is not None and interval < 0:
        problems.append(Problem(
            _at(keep_alive), _shown(keep_alive), "is a negative keep-alive interval",
            upstream="ValueError (argument check): Error: --sse-keep-alive-interval must be a non-negative integer "
                     "(0 disables keep-alive comments). (vllm/entrypoints/common/cli_args.py:558-563)",
            fix="0 (off) or a number of seconds, e.g. 15"))
    per_request = _on(items, "enable_per_request_metrics")
    if per_request is not None and _on(items, "disable_log_stats") is not None:
        problems.append(Problem(
            _at(per_request), _shown(per_request), "needs the engine statistics that --disable-log-stats turns off",
            upstream="ValueError (argument check): Error: --enable-per-request-metrics requires engine statistics "
                     "logging; remove --disable-log-stats to enable per-request metrics. "
                     "(vllm/entrypoints/common/cli_args.py:565-571)",
            fix="remove --disable-log-stats, or drop --enable-per-request-metrics"))
    return problems


def _bucket_problem(text: str) -> str | None:
    """Why ObservabilityConfig refuses this `--custom-histogram-buckets` JSON (vllm/config/observability.py:167-214),
    or None."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None  # not JSON: the option-value check refuses it by the image's card
    if not isinstance(value, dict):
        return None
    for family, buckets in value.items():  # pydantic's type check runs before the field's validators
        bounds = buckets if isinstance(buckets, list) else []
        huge = next((i for i, b in enumerate(bounds) if not fits_float(b)), None)
        if huge is not None:
            return (f"1 validation error for ObservabilityConfig: custom_histogram_buckets.{family}.{huge}: Input "
                    "should be a valid number (pydantic's float check of the field type dict[str, list[float]]: an "
                    "integer beyond a float's range; vllm/config/observability.py:70, built at "
                    "vllm/engine/arg_utils.py:2217-2226)")
    for family, buckets in value.items():
        if family not in BUCKET_FAMILIES:
            return (f"custom_histogram_buckets: unknown bucket family {family!r}; known families: "
                    f"{sorted(BUCKET_FAMILIES)}")
        if not isinstance(buckets, list) or not buckets:
            return f"custom_histogram_buckets[{family!r}]: bucket list must not be empty"
        for bound in buckets:
            if isinstance(bound, bool) or not isinstance(bound, int | float):
                return f"custom_histogram_buckets[{family!r}]: bound {bound!r} must be a number, not a boolean"
            if not math.isfinite(bound) or bound <= 0:
                return f"custom_histogram_buckets[{family!r}]: bound {bound!r} must be finite and greater than 0"
        if any(a >= b for a, b in itertools.pairwise(buckets)):
            return f"custom_histogram_buckets[{family!r}]: bounds {buckets} must be strictly increasing"
    return None


def observability_rules(items: list[ArgvItem]) -> list[Problem]:
    """ObservabilityConfig's validators, run when the engine config is built: histogram buckets and detailed
    traces without an OTLP endpoint."""
    problems: list[Problem] = []
    buckets = _last(items, "custom_histogram_buckets")
    why = _bucket_problem(buckets.values[-1]) if buckets is not None and buckets.values else None
    if buckets is not None and why is not None:
        problems.append(Problem(
            _at(buckets), _shown(buckets)[:200], "is not a set of histogram buckets vLLM accepts",
            upstream=f"ValueError (engine start-up): {why}" + ("" if ".py:" in why else
                                                                " (vllm/config/observability.py:167-214)"),
            fix=f"a JSON object of {', '.join(BUCKET_FAMILIES[:3])}, … -> strictly increasing positive bounds, "
                "e.g. '{\"time_to_first_token\": [0.1, 0.5, 1, 5]}'"))
    traces = _last(items, "collect_detailed_traces")
    if traces is not None and traces.values and _last(items, "otlp_traces_endpoint") is None:
        problems.append(Problem(
            _at(traces), _shown(traces), "collects detailed traces, and no --otlp-traces-endpoint receives them",
            upstream="ValueError (engine start-up): collect_detailed_traces requires `--otlp-traces-endpoint` to be "
                     "set. (vllm/config/observability.py:216-221)",
            fix="add --otlp-traces-endpoint http://COLLECTOR:4317, or drop --collect-detailed-traces"))
    return problems


def cross_option_problems(items: list[ArgvItem]) -> list[Problem]:
    """Every rule of this module for the extra_args `items` (read by `serve_options.read_argv`)."""
    return [*lora_rules(items), *frontend_rules(items), *observability_rules(items)]
