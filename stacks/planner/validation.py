"""Topology rules: refuse at preview, in seconds, what vLLM would refuse after loading 511 GB of weights.

Each rule names the config key and value, quotes the upstream error it prevents and says what works. The
general rules come from the model profile; the rules that differ per image come from
`stacks.planner.image_capabilities`.
"""

from __future__ import annotations

import difflib
import math

from stacks.model.config import DboConfig, StackConfig
from stacks.model.errors import Problem
from stacks.model.project import STACKS
from stacks.model.s3_source import system_dir_reason
from stacks.planner.cross_option_rules import expert_model_rules, lora_model_rules
from stacks.planner.fabric import fabric_problems
from stacks.planner.findings import Validation
from stacks.planner.gpus import known_gpu
from stacks.planner.image_capabilities import ImageCapabilities, get_capabilities
from stacks.planner.image_cards import ImageCard
from stacks.planner.launch import restart_policy_warnings
from stacks.planner.load_balancing import load_balancing_rules
from stacks.planner.load_estimate import engine_memory, estimated_load_s
from stacks.planner.load_formats import load_rules
from stacks.planner.managed_options import argv_problems, env_problems, image_card, table_for
from stacks.planner.memory import GpuMemory
from stacks.planner.model_cards import (
    CardProblem,
    ModelProfile,
    card_names,
    get_profile,
    regenerate_hint,
    thinking_request,
)
from stacks.planner.network_rules import (
    address_rules,
    endpoint_rules,
    exposure_rules,
    host_key_rules,
    port_rules,
    proxy_rules,
    uniqueness_rules,
)
from stacks.planner.quantization_rules import effective_quantization, quantization_problems, unknown_method_problem
from stacks.planner.rehearsal import rehearsal_problems, rehearsal_warnings
from stacks.planner.serve_options import ArgvItem, engine_values, read_argv, speculative_fields
from stacks.planner.setting_rules import (
    backend_rules,
    endpoint_name_rules,
    gpu_rules,
    monitoring_port_rules,
    nccl_log_rules,
    numa_rules,
    timeout_rules,
)
from stacks.planner.topology import Topology, derive_topology

_PARSER_ERRORS = {
    # vLLM 0.33.0: argparse takes any string; these are raised after parsing (api server args) or at load.
    "tokenizer_mode": "ValueError: No tokenizer registered for tokenizer_mode='{value}'. "
                      "(vllm/tokenizers/registry.py:84)",
    "tool_call_parser": "KeyError: 'invalid tool call parser: {value} (chose from {{ … }})' "
                        "(vllm/entrypoints/common/cli_args.py:619-623)",
    "reasoning_parser": "KeyError: 'invalid reasoning parser: {value} (chose from {{ … }})' "
                        "(vllm/entrypoints/common/cli_args.py:625-633)",
}

DSPARK_PP_ERROR = ("NotImplementedError: Pipeline parallelism is not supported for this model. "
                   "Supported models implement the `SupportsPP` interface. (vllm/config/model.py:1570-1576)")


def validate(config: StackConfig) -> tuple[Topology, ModelProfile | None, Validation]:
    """Run every rule; never stops at the first problem."""
    result = Validation()
    topology, topo_problems = derive_topology(config)
    result.problems += topo_problems
    profile = None
    try:
        profile = get_profile(config.model.profile)
        if profile is None:
            result.problems.append(Problem(
                "model.profile", config.model.profile, "no model card models/<name>.json by this name",
                fix=f"one of {card_names()}, or write one from the model's files: {STACKS} model-card "
                    f"SRC --name {config.model.profile}"))
    except CardProblem as exc:
        path = str(exc).split(": ", 1)[0]
        result.problems.append(Problem("model.profile", config.model.profile, f"the card {exc}",
                                       fix=regenerate_hint(path)))
    image = get_capabilities(config.image.ref)
    carded, _ = image_card(config)
    if image is None and carded is None:  # a carded image's own record is its card; the uncarded gets this too
        result.warnings.append(
            f"image {config.image.ref} is not a known image: only the general rules were checked; take its card "
            f"({STACKS} image-card {config.image.ref}, docs/your-image.md) so its flags, model "
            "architectures and quantization methods are checked")
    if config.image.digest is None:
        result.warnings.append(
            f"image {config.image.ref} is not pinned by digest: the tag can be re-pushed, so two nodes (or a "
            "rollback) may run different builds; write image as repo:tag@sha256:<digest> (prod policy requires it)")
    if profile is not None:
        _model_rules(config, profile, image, result)
        lora_problems, lora_warnings = lora_model_rules(profile, carded, _extra_items(config))
        result.problems += lora_problems
        result.warnings += lora_warnings
        if carded is not None:
            _registry_rules(config, profile, carded, result)
        _memory_rules(config, profile, topology, result)
    load_s = estimated_load_s(config, profile, topology) if profile is not None and not topo_problems else None
    gpu_problems, gpu_warnings = gpu_rules(config)
    nccl_problems, nccl_warnings = nccl_log_rules(config, topology)
    result.problems += gpu_problems + nccl_problems + timeout_rules(config, load_s) + endpoint_name_rules(config)
    result.problems += monitoring_port_rules(config)
    numa_problems, numa_warnings = numa_rules(config, topology)
    result.problems += numa_problems
    result.warnings += numa_warnings
    result.warnings += gpu_warnings + nccl_warnings + backend_rules(config, topology)
    if load_s is not None and config.serving.engine_ready_timeout_s < load_s:
        result.warnings.append(
            f"serving.engine_ready_timeout_s {config.serving.engine_ready_timeout_s} is below the estimated "
            f"weight-load time of {load_s}s (model.load_gb_per_s {config.model.load_gb_per_s:g}): the API "
            "server would give up while the engines still load; the policy pack refuses this")
    low, high = config.firewall.ephemeral_ports
    if config.firewall.enabled and (low < 32768 or high > 60999):
        result.warnings.append(
            f"firewall.ephemeral_ports [{low}, {high}] reaches outside Linux's default ephemeral range "
            "[32768, 60999]: every other service on the nodes listening in it is closed to sources outside the "
            "cluster too; guard the range net.ipv4.ip_local_port_range really has")
    _parallelism_rules(config, topology, result, profile)
    lb_problems, lb_warnings = load_balancing_rules(config, topology, profile)
    result.problems += lb_problems
    result.warnings += lb_warnings
    _expert_parallel_rules(config, profile, result)
    uniqueness_rules(config, result)
    address_rules(config, result)
    _mount_rules(config, result)
    _container_name_rules(config, result)
    _engine_config_rules(config, image, result)
    port_rules(config, result)
    proxy_rules(config, result)
    exposure_rules(config, result)
    endpoint_rules(config, result)
    host_key_rules(config, result)
    _weights_source_rules(config, result)
    _observability_rules(config, result)
    _free_form_rules(config, image, result)
    loading_problems, loading_warnings = load_rules(config, profile, carded)
    result.problems += loading_problems
    result.warnings += loading_warnings
    result.problems += fabric_problems(config)
    result.problems += rehearsal_problems(config)
    result.warnings += restart_policy_warnings(config) + rehearsal_warnings(config)
    _notes(config, topology, result)
    return topology, profile, result


def _tp_fix(config: StackConfig, max_tp: int) -> str:
    """`tensor <= N`, and the data-parallel shape that uses this stack's GPUs at that TP."""
    gpus = sum(n.gpus.count for n in config.nodes)
    tp = max(d for d in (1, 2, 4, 8, 16, 32, 64) if d <= max_tp and (gpus % d == 0 or d == 1))
    dp = gpus // tp
    return (f"tensor <= {max_tp}; for {len(config.nodes)} node(s) with {gpus} GPUs: DP{dp} x TP{tp} with expert: "
            f"true (EP{dp * tp})")


def _registry_rules(config: StackConfig, profile: ModelProfile, card: ImageCard, result: Validation) -> None:
    """The model card's architecture and quantization method against what the image's vLLM registered (its card's
    `registries`): vLLM refuses a model it has no class for, or a quantization it does not know, at start."""
    registries = card.raw.get("registries") or {}
    where = f"models/{profile.key}.json"
    arches = registries.get("architectures")
    if isinstance(arches, list) and arches and profile.architecture not in arches:
        near = difflib.get_close_matches(profile.architecture, [str(a) for a in arches], n=3, cutoff=0.6)
        result.problems.append(Problem(
            "model.profile", config.model.profile,
            f"architecture {profile.architecture} ({where}) is not one of the {len(arches)} model architectures "
            f"vLLM {card.vllm_version} registers ({card.path}: registries.architectures)",
            upstream="ValueError (engine start-up, when the model config is built): Model architectures [...] are not "
                     "supported for now. (vllm/model_executor/models/registry.py:1249-1252)",
            fix=f"an image whose vLLM serves {profile.architecture}"
                + (f"; or the card's architecture is misspelt: {', '.join(near)}" if near else "")))
    methods = registries.get("quantization_methods")
    quant = profile.quantization
    if quant is not None and isinstance(methods, list) and methods and quant not in methods:
        result.problems.append(Problem(
            "model.profile", config.model.profile,
            f"quantization method {quant!r} ({where}: quantization.method, from the checkpoint's "
            f"quantization_config.quant_method) is not one of the {len(methods)} methods vLLM {card.vllm_version} "
            f"knows ({card.path}: registries.quantization_methods)",
            upstream="ValueError (engine start-up, when the model config is built): Unknown quantization method: "
                     "... Must be one of [...]. (vllm/config/model.py:1464-1469)",
            fix=f"an image whose vLLM knows {quant!r}, or a checkpoint quantized with one of "
                f"{', '.join(str(m) for m in methods[:12])}{' …' if len(methods) > 12 else ''}"))
    if isinstance(methods, list):
        flag = unknown_method_problem(profile, _extra_items(config), [str(m) for m in methods], card.path)
        result.problems += [flag] if flag is not None else []


def _model_rules(config: StackConfig, profile: ModelProfile, image: ImageCapabilities | None,
                 result: Validation) -> None:
    par = config.parallelism
    tp, pp, dp = par.tensor, par.pipeline, par.data
    add = result.problems.append
    smoke = config.api.smoke
    kwarg, why = thinking_request(profile, config.serving.reasoning_parser)
    if kwarg is None and smoke.thinking_check and "thinking_check" in smoke.model_fields_set:
        add(Problem("api.smoke.thinking_check", True, f"asks for a thinking check, but {why}: no answer would "
                    "carry reasoning, so the check would fail after every deploy",
                    fix="api.smoke.thinking_check: false, or serving.reasoning_parser set to the model's parser"))
    if profile.num_attention_heads % tp:
        good = [d for d in (1, 2, 4, 8, 16, 32) if profile.num_attention_heads % d == 0 and d <= _all_gpus(config)]
        add(Problem("parallelism.tensor", tp, f"{profile.num_attention_heads} attention heads do not split over "
                    f"TP{tp}", upstream=f"ValueError: Total number of attention heads ({profile.num_attention_heads}) "
                    f"must be divisible by tensor parallel size ({tp}). (vllm/config/model.py:1558-1564)",
                    fix=f"tensor in {good}"))
    if profile.o_groups is not None and profile.o_groups // tp == 0:
        add(Problem("parallelism.tensor", tp, f"FlashMLA gets n_local_groups = o_groups // tp = "
                    f"{profile.o_groups} // {tp} = 0 on {profile.key}",
                    upstream="ZeroDivisionError: integer division or modulo by zero "
                    "(heads_per_group=self.n_local_heads // self.n_local_groups, vllm/models/deepseek_v4/nvidia/"
                    "flashmla.py:69, with n_local_groups = o_groups // tp_size at deepseek_v4/attention.py:225-226; "
                    "at the profile run)",
                    fix=_tp_fix(config, profile.o_groups)))
    if profile.engram_hash_heads:
        heads = profile.engram_hash_heads
        across_dp = image.engram_shards_across_dp if image else False
        shards = tp * (dp if across_dp else 1)
        if shards > 1 and not (shards - 1) * math.ceil(heads / shards) < heads:
            add(Problem("parallelism.tensor", tp, f"Engram: {heads} hash heads over {shards} shards leaves "
                        "ranks without a head",
                        upstream=f"AssertionError: Engram sharding leaves ranks without hash heads: {heads} heads "
                        f"over TP={tp} x DP={dp if across_dp else 1} (vllm/models/deepseek_v41/common/engram.py:"
                        "1026-1031, at model init)",
                        fix="a TP that gives every shard a head (8 for 24 heads), and DP for the rest"))
    if pp > 1 and not profile.supports_pp:
        add(Problem("parallelism.pipeline", pp, f"{profile.key} does not support pipeline parallelism",
                    upstream=DSPARK_PP_ERROR, fix="pipeline: 1 and data > 1 (mp backend)"))
    spec = config.speculative
    if spec is not None:
        if pp > 1 and profile.draft_supports_pp.get(spec.method) is False:
            add(Problem("parallelism.pipeline", pp, f"the {spec.method} draft model does not support PP > 1",
                        upstream=DSPARK_PP_ERROR,
                        fix="pipeline: 1 with data parallelism (DP2 x TP8, EP16), or remove `speculative`"))
        if image is not None and spec.method not in image.speculative_methods:
            add(Problem("speculative.method", spec.method, f"image {config.image.ref} has no such method",
                        fix=f"one of {sorted(image.speculative_methods) or 'none: remove speculative'}"))
    if config.vision and not profile.vision:
        add(Problem("vision", True, f"{profile.key} has no vision tower", fix="vision: false"))
    if config.vision and profile.vision and pp > 1 and image is not None and not image.vision_with_pp:
        add(Problem("vision", True, f"vision with PP{pp} is broken on image {config.image.ref}",
                    upstream="ValueError: DeepSeek V4 vision MoE routing requires input_ids. (vllm/models/"
                    "deepseek_v4/nvidia/model.py:458-460, at the profile run)",
                    fix="vision: false (adds --language-model-only, drops images), pipeline: 1, or a newer image"))
    if image is not None:
        if profile.family == "deepseek-v4" and profile.key not in image.profiles:
            add(Problem("image.tag", config.image.tag, f"image {config.image.ref} cannot run {profile.key}",
                        upstream=f"ValueError: Model architectures ['{profile.architecture}'] are not supported "
                        "for now. "
                        "(vllm/model_executor/models/registry.py:1249-1252)",
                        fix=f"an image listed for {profile.key} in stacks/planner/image_capabilities.py"))
        serving = config.serving
        shipped = image_parsers(config, image)
        for key, own, default in (("tokenizer_mode", serving.tokenizer_mode, profile.tokenizer_mode),
                                  ("tool_call_parser", serving.tool_call_parser, profile.tool_call_parser),
                                  ("reasoning_parser", serving.reasoning_parser, profile.reasoning_parser)):
            value, names = own or default, shipped[key]
            if value is not None and value not in names and value not in ("auto", "hf", "slow"):
                whose = "" if own else f" (the default of model card {profile.key}; set serving.{key} to override)"
                add(Problem(f"serving.{key}", value, f"image {config.image.ref} does not ship it{whose}",
                            upstream=_PARSER_ERRORS[key].format(value=value), fix=f"one of {sorted(names)}"))
    if config.serving.max_model_len > profile.max_context and not _long_len_allowed(config):
        add(Problem("serving.max_model_len", config.serving.max_model_len,
                    f"above the model's context of {profile.max_context} ({profile.sources.get('max_model_len', '')})",
                    upstream=f"ValueError: User-specified max_model_len ({config.serving.max_model_len}) is greater "
                    f"than the derived max_model_len (max_position_embeddings={profile.max_context} or "
                    "model_max_length=None in model's config.json). (vllm/config/model.py:2663-2683)",
                    fix=f"at most {profile.max_context}, or VLLM_ALLOW_LONG_MAX_MODEL_LEN: '1' in container.env (RoPE "
                        "past the trained positions gives NaNs)"))
    _family_rules(config, profile, result)


def image_parsers(config: StackConfig, image: ImageCapabilities) -> dict[str, frozenset[str]]:
    """The tokenizer modes, tool-call and reasoning parsers the image ships: from its card's registries (what its
    vLLM registered, `images/`), else the capability table's list (`stacks/planner/image_capabilities.py`)."""
    card, _ = image_card(config)
    if card is None:
        return dict.fromkeys(("tokenizer_mode", "tool_call_parser", "reasoning_parser"), image.parsers)
    registries = card.raw.get("registries") or {}
    modes = next((o.get("metavar") or o.get("choices") or [] for o in card.raw.get("options", [])
                  if "--tokenizer-mode" in (o.get("option_strings") or [])), [])
    # The card lists tokenizer modes only as the option's metavar, which vLLM writes by hand and which misses
    # some registered modes (deepseek_v41 on 0.33.0): the capability table's names, read from the wheel, count too.
    return {"tokenizer_mode": frozenset(modes if isinstance(modes, list) else []) | image.parsers,
            "tool_call_parser": frozenset(registries.get("tool_parsers") or image.parsers),
            "reasoning_parser": frozenset(registries.get("reasoning_parsers") or image.parsers)}


def _long_len_allowed(config: StackConfig) -> bool:
    """vLLM's override of the derived max_model_len (envs.VLLM_ALLOW_LONG_MAX_MODEL_LEN: "1" or "true")."""
    value = config.container.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")
    return value.strip().lower() in ("1", "true")


def _all_gpus(config: StackConfig) -> int:
    """The most GPUs one TP group could have here: a suggested TP above it would be refused next."""
    return sum(n.gpus.count for n in config.nodes)


def _family_rules(config: StackConfig, profile: ModelProfile, result: Validation) -> None:
    """What vLLM 0.33.0 asserts at model init (after the engine config passed): KV heads against TP, PP against
    the layers, EP against the experts."""
    par = config.parallelism
    tp, pp = par.tensor, par.pipeline
    add = result.problems.append
    kv = profile.kv_heads
    if profile.mla_head is None and profile.family != "deepseek-v4":
        if profile.architecture == "GptOssForCausalLM" and tp > kv:
            # models/gpt_oss.py:156: num_local_key_value_heads = num_key_value_heads // tp_size, no replication
            add(Problem("parallelism.tensor", tp, f"{profile.key} has {kv} KV heads; gpt-oss gives each rank "
                        f"{kv} // {tp} = 0 of them (it does not replicate KV heads)",
                        upstream="no check: num_local_key_value_heads = config.num_key_value_heads // tp_size is 0 "
                        "(vllm/model_executor/models/gpt_oss.py:156), an attention layer with no KV head (gpt_oss.py:"
                        "176-180)",
                        fix=f"tensor <= {kv}, and data parallelism for more GPUs"))
        elif (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            # vLLM 0.33.0 models/llama.py:148-156, qwen3.py:91-99, qwen3_moe.py:268-276, layers/linear.py:1066-1071
            good = [d for d in range(1, min(64, _all_gpus(config)) + 1) if profile.num_attention_heads % d == 0 and (
                (kv >= d and kv % d == 0) or (kv < d and d % kv == 0))]
            add(Problem("parallelism.tensor", tp, f"{profile.key} has {kv} KV heads: TP{tp} neither divides them nor "
                        "is a multiple of them (vLLM splits KV heads over TP, or replicates whole ones when TP "
                        "exceeds them)",
                        upstream=f"AssertionError (model init): assert self.total_num_kv_heads % tp_size == 0 "
                        f"({kv} % {tp}) (vllm/model_executor/models/llama.py:148-151)" if kv >= tp else
                        "AssertionError (model "
                        f"init): assert tp_size % self.total_num_kv_heads == 0 ({tp} % {kv}) (vllm/model_executor/"
                        "models/llama.py:152-155)", fix=f"tensor in {good}"))
    layers = profile.layers or len(profile.kv_ratios)
    if layers and pp > layers:
        # distributed/utils.py:198-241 get_pp_indices: no check, stages past the layers get none
        add(Problem("parallelism.pipeline", pp, f"{profile.key} has {layers} decoder layers: PP{pp} leaves "
                    f"{pp - layers} stage(s) without a layer",
                    upstream="no error at start: get_pp_indices gives empty stages that hold GPUs and do nothing "
                    "(vllm/distributed/utils.py:225-241)",
                    fix=f"pipeline <= {layers}"))
    if profile.fp8_block_experts is not None:
        block, ffn = profile.fp8_block_experts
        shards = 1 if par.expert else tp * (par.data if par.backend == "mp" else 1)
        part = ffn // shards
        if ffn % shards or part % block:
            # quantization/fp8.py:555 -> utils/fp8_utils.py:1361-1366 (validate_fp8_block_shape_moe), at model init
            add(Problem("parallelism.tensor", tp, f"{profile.key}'s FP8 experts ({ffn} FFN columns, {block}-wide "
                        f"blocks) split over {shards} ranks leave {ffn / shards:g} columns per rank, not whole blocks",
                        upstream=f"ValueError: The output_size of gate's and up's weight = {part} is not divisible "
                        f"by weight quantization block_n = {block}. (vllm/model_executor/layers/quantization/utils/"
                        "fp8_utils.py:"
                        "1361-1366, at model init)",
                        fix=f"expert: true (whole experts per rank), or TP x DP <= {ffn // block}"))
    result.problems += expert_model_rules(config, profile)
    quant_problems, quant_warnings = quantization_problems(profile, _extra_items(config))
    result.problems += quant_problems
    result.warnings += quant_warnings
    ep = tp * (par.data if par.backend == "mp" else 1)
    if par.expert and profile.routed_experts and ep > profile.routed_experts:
        # fused_moe/expert_map_manager.py:67-69: experts // ep_size per rank, the rest one each from rank 0
        result.warnings.append(f"EP{ep} spreads {profile.routed_experts} routed experts of {profile.key}: "
                               f"{ep - profile.routed_experts} ranks hold none")


DBO_BACKENDS = ("deepep_low_latency", "deepep_high_throughput", "nixl_ep")
"""The all-to-all backends vLLM 0.33.0 micro-batches with on CUDA (vllm/config/vllm.py:2190-2196)."""
ROUND_ROBIN_BACKENDS = ("deepep_low_latency", "nixl_ep")
"""The backends that keep round-robin expert placement (fused_moe/config.py:1070-1071, needs_round_robin_routing_
tables); with another one vLLM falls back to linear (fused_moe/expert_map_manager.py:138-148)."""


def _expert_parallel_rules(config: StackConfig, profile: ModelProfile | None, result: Validation) -> None:
    """The expert-parallel keys (`parallelism.all2all_backend`, `eplb`, `dbo`, `expert_placement`,
    `ep_weight_filter`) against what vLLM 0.33.0 refuses, or silently ignores or replaces, each quoted with its
    file:line. EP is TP x DP (prefill context parallelism, the third factor in vLLM, is not modelled: PCP = 1)."""
    par = config.parallelism
    add = result.problems.append
    dp = par.data if par.backend == "mp" else 1
    ep = par.tensor * dp
    a2a = par.all2all_backend
    all2all_runs = par.expert and dp > 1  # fused_moe/config.py:1035-1038 use_all2all_kernels (PCP = 1)
    eplb, dbo = par.eplb, par.dbo
    if a2a != "allgather_reducescatter" and not all2all_runs:
        add(Problem("parallelism.all2all_backend", a2a,
                    "does nothing here: vLLM runs an all-to-all backend only with expert parallelism and more than "
                    f"one DP rank (expert {str(par.expert).lower()}, DP{dp}; use_all2all_kernels = use_ep and "
                    "dp_size > 1, fused_moe/config.py:1035-1038)",
                    fix="parallelism.expert: true with data > 1 (backend: mp), or remove all2all_backend"))
    _hardware_rules(config, all2all_runs, result)
    _moe_backend_rules(config, profile, result)
    if eplb.enabled and not par.expert:
        add(Problem("parallelism.eplb.enabled", True, "EPLB balances expert-parallel ranks, and expert "
                    "parallelism is off", upstream="ValueError: enable_expert_parallel must be True to use EPLB. "
                    "(vllm/config/parallel.py:569-570)", fix="parallelism.expert: true, or eplb.enabled: false"))
    if eplb.enabled and ep <= 1:
        add(Problem("parallelism.eplb.enabled", True, f"EP{ep}: one rank holds every expert, there is nothing to "
                    "balance", upstream=f"ValueError: EPLB requires tensor, prefill-context, or data parallelism, "
                    f"but got TP={par.tensor}, PCP=1, DP={dp}. (vllm/config/parallel.py:571-584)",
                    fix="tensor or data > 1 (backend: mp), or eplb.enabled: false"))
    redundant = eplb.num_redundant_experts
    if redundant and not eplb.enabled:
        add(Problem("parallelism.eplb.num_redundant_experts", redundant, "redundant experts are placed by EPLB, "
                    "which is off", upstream=f"ValueError: num_redundant_experts is set to {redundant} but EPLB is "
                    "not enabled. Either enable EPLB or unset num_redundant_experts. (vllm/config/parallel.py:585-"
                    "592)", fix="parallelism.eplb.enabled: true, or num_redundant_experts: 0"))
    routed = profile.routed_experts if profile is not None else None
    if eplb.enabled and par.expert and routed and ep > 1 and (routed + redundant) % ep:
        good = [r for r in range(redundant, redundant + 2 * ep) if (routed + r) % ep == 0][:2]
        add(Problem("parallelism.eplb.num_redundant_experts", redundant,
                    f"{routed} routed experts of {profile.key if profile else ''} + {redundant} redundant = "
                    f"{routed + redundant} do not divide over EP{ep} (EPLB gives every rank the same number)",
                    upstream=f"ValueError: EPLB currently only supports even distribution of experts across ranks. "
                    f"Got {routed + redundant} experts and {ep} EP ranks. (model_executor/layers/fused_moe/"
                    "layer.py:271-279)", fix=f"num_redundant_experts in {good} (a multiple of EP{ep} in all)"))
    if eplb.enabled and eplb.use_async and eplb.communicator in ("torch_nccl", "pynccl"):
        add(Problem("parallelism.eplb.communicator", eplb.communicator, "cannot move experts asynchronously",
                    upstream=f"ValueError: {eplb.communicator} communicator is incompatible with async EPLB due to "
                    "NCCL multi-stream conflicts. Use 'torch_gloo' or 'nixl' instead, or leave communicator unset "
                    "for automatic selection. (vllm/config/parallel.py:124-130)",
                    fix="torch_gloo or nixl, leave it unset, or eplb.use_async: false"))
    idle = sorted(set(eplb.changed()) - {"num_redundant_experts"})
    if not eplb.enabled and idle:
        result.warnings.append(f"parallelism.eplb sets {', '.join(idle)} but eplb.enabled is false: nothing is "
                               "rendered and vLLM balances nothing")
    if dbo.enabled:
        _dbo_rules(config, profile, result, dp)
    elif dbo != DboConfig():
        result.warnings.append("parallelism.dbo sets thresholds but dbo.enabled is false: nothing is rendered")
    if par.expert_placement == "round_robin" and a2a != "moonep":  # MoonEP's own rule below says why
        why = ("expert parallelism is off: placement applies to EP ranks only" if not par.expert else
               "EPLB is on: vLLM logs \"Round-robin expert placement is only supported for models with multiple "
               "expert groups and no redundant experts. Falling back to linear expert placement.\" "
               "(fused_moe/expert_map_manager.py:123-137)" if eplb.enabled else
               f"all2all_backend {a2a} does not keep it: vLLM logs \"Round-robin expert placement currently only "
               f"supports the DeepEP low-latency or NIXL EP backend, but '{a2a}' was configured. Falling back to "
               "linear expert placement.\" (fused_moe/expert_map_manager.py:138-148)"
               if all2all_runs and a2a not in ROUND_ROBIN_BACKENDS else None)
        if why:
            add(Problem("parallelism.expert_placement", "round_robin", f"vLLM would place experts linearly: {why}",
                        fix="linear" + ("" if not par.expert or eplb.enabled else
                                        ", or all2all_backend: deepep_low_latency or nixl_ep")))
        else:
            result.warnings.append(
                "parallelism.expert_placement round_robin: vLLM keeps it only for models with expert groups "
                "(n_group > 1 in config.json) and falls back to linear otherwise (fused_moe/expert_map_manager.py:"
                "123-137); the model card does not record n_group, so the plan cannot check it")
    if profile is not None and not profile.moe and (a2a != "allgather_reducescatter" or eplb.enabled or dbo.enabled):
        result.warnings.append(f"parallelism.all2all_backend, eplb and dbo act on routed experts, and {profile.key} "
                               "is a dense model: vLLM does nothing with them")
    if a2a == "moonep" and profile is not None:
        _moonep_rules(config, profile, result)
    if par.ep_weight_filter and (not par.expert or eplb.enabled):
        add(Problem("parallelism.ep_weight_filter", True,
                    "does nothing: " + ("expert parallelism is off" if not par.expert else
                                        "with EPLB every rank loads every expert, for its redundant slots") +
                    " (vllm/model_executor/model_loader/default_loader.py:438-450 returns before filtering)",
                    fix="ep_weight_filter: false" + (", or eplb.enabled: false" if par.expert else
                                                     ", or parallelism.expert: true")))


SELF_DISPATCHING_MOE_BACKENDS = ("flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm")
"""vLLM 0.33.0's MoE backends that dispatch and combine tokens themselves (vllm/config/kernel.py:149-158): with
them vLLM binds all2all_backend to passthrough (kernel.py:194-229)."""
DEEPSEEK_V4_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM")
"""The architectures flashinfer_moe_ep_mega_deep_gemm runs (vllm/config/kernel.py:183-191, 231-243)."""


def _moe_backend_rules(config: StackConfig, profile: ModelProfile | None, result: Validation) -> None:
    """`--moe-backend` in serving.extra_args (not a typed key: it picks expert kernels) against the all-to-all
    backend and the model, where vLLM 0.33.0 refuses the pair in KernelConfig.set_platform_defaults."""
    table, _ = table_for(config)
    items = [i for i in read_argv(list(config.serving.extra_args), table) if i.dest == "moe_backend" and i.values]
    if not items:
        return
    item = items[-1]
    moe = item.values[-1].lower().replace("-", "_")  # its argparse type (vllm/engine/arg_utils.py:1843-1845)
    key, a2a = f"serving.extra_args.{item.index}", config.parallelism.all2all_backend
    if moe not in SELF_DISPATCHING_MOE_BACKENDS:
        return
    if a2a != "allgather_reducescatter":
        result.problems.append(Problem(
            key, f"{item.word} {moe}" if "=" not in item.word else item.word,
            f"--moe-backend {moe} dispatches and combines tokens itself, and parallelism.all2all_backend is {a2a}",
            upstream=f"ValueError: moe_backend='{moe}' dispatches and combines itself and cannot be paired with "
            f"all2all_backend='{a2a}'; leave --all2all-backend unset. (vllm/config/kernel.py:207-215)",
            fix="parallelism.all2all_backend: allgather_reducescatter (the default; vLLM then runs passthrough), "
            "or another --moe-backend"))
    else:
        result.warnings.append(f"{key}: --moe-backend {moe} dispatches and combines tokens itself: vLLM runs "
                               "all2all_backend passthrough instead of allgather_reducescatter (vllm/config/kernel.py:"
                               "216-222)")
    if moe == "flashinfer_moe_ep_mega_deep_gemm" and profile is not None and profile.architecture and \
            profile.architecture not in DEEPSEEK_V4_ARCHITECTURES:
        result.problems.append(Problem(
            key, f"{item.word} {moe}" if "=" not in item.word else item.word,
            f"--moe-backend {moe} runs DeepSeek-V4 models only, and {profile.key} is {profile.architecture}",
            upstream=f"ValueError: moe_backend='{moe}' is only supported for DeepSeek-V4 models "
            f"({sorted(DEEPSEEK_V4_ARCHITECTURES)}), but the model is ['{profile.architecture}']. "
            "(vllm/config/kernel.py:231-243)", fix="another --moe-backend, e.g. flashinfer_moe_ep_cutedsl"))


NVLINK_DOMAIN_FAMILIES = ("GB200", "GB300")
"""GPUs sold in racks whose NVLink spans nodes (NVL72): the only ones where FlashInfer's multi-node NVLink
all-to-all can reach a GPU of another node (stacks/planner/gpus.py names the family)."""


def _hardware_rules(config: StackConfig, all2all_runs: bool, result: Validation) -> None:
    """Backends vLLM 0.33.0 writes for other hardware (AMD MoRI, XPU's XCCL, multi-node NVLink) against the
    stack's GPUs: every node runs NVIDIA GPUs (`nodes[].gpus.model` as nvidia-smi prints it)."""
    par, add = config.parallelism, result.problems.append
    models = sorted({n.gpus.model for n in config.nodes})
    gpus = " and ".join(repr(m) for m in models)
    a2a = par.all2all_backend
    if all2all_runs and a2a.startswith("mori_"):
        add(Problem("parallelism.all2all_backend", a2a, f"MoRI is AMD's (ROCm) all-to-all, and the nodes run NVIDIA "
                    f"GPUs ({gpus}), and MoRI's kernels exist for AMD gfx942 and gfx950 only",
                    upstream="AssertionError: MoRI kernels not found. Please follow https://github.com/ROCm/mori/blob/"
                    "main/README.md to install MoRI kernels. (vllm/distributed/device_communicators/all2all.py:924-"
                    "927); with mori present: mori currently only support arch gfx942 and gfx950 (all2all.py:974-976)",
                    fix="deepep_low_latency or deepep_high_throughput (the NVIDIA counterparts), or "
                    "allgather_reducescatter"))
    if all2all_runs and a2a.startswith("flashinfer_nvlink_"):
        families = {gpu.family if (gpu := known_gpu(m)) is not None else None for m in models}
        domain = families <= set(NVLINK_DOMAIN_FAMILIES)
        why = (f"FlashInfer's {a2a.removeprefix('flashinfer_nvlink_').replace('_', '-')} NVLink all-to-all maps "
               "every EP rank's GPU memory over NVLink (an MNNVL workspace, vllm/distributed/device_communicators/"
               f"all2all.py:{'694-707' if a2a.endswith('two_sided') else '842-870'})")
        if len(config.nodes) > 1 and not domain:
            add(Problem("parallelism.all2all_backend", a2a, f"{why}, and the EP group spans {len(config.nodes)} "
                        f"nodes of {gpus}, which reach each other over the fabric (RoCE or InfiniBand), not NVLink: "
                        "vLLM does not check this, FlashInfer fails when it maps the workspace",
                        fix="deepep_low_latency or deepep_high_throughput (DeepEP over RDMA), or a GB200/GB300 "
                        "NVL72 rack"))
        else:
            result.warnings.append(
                f"parallelism.all2all_backend {a2a}: {why}; that needs CUDA fabric memory handles (the IMEX service "
                f"of an NVLink domain) on {gpus}, which the plan cannot see offline and vLLM does not check: "
                "without them FlashInfer fails when it maps the workspace")
    eplb = par.eplb
    if eplb.enabled and eplb.communicator == "torch_xccl":
        add(Problem("parallelism.eplb.communicator", "torch_xccl", f"XCCL is Intel XPU's P2P (vllm/config/"
                    f"parallel.py:102), and the nodes run NVIDIA GPUs ({gpus}): vLLM runs it as NCCL "
                    "batch_isend_irecv over the device group (vllm/distributed/eplb/eplb_communicator.py:739-743, "
                    "820-821, 245-300), torch_nccl under another name" + (
                        ", without the check that refuses NCCL with async EPLB (vllm/config/parallel.py:124-130)"
                        if eplb.use_async else ""),
                    fix="torch_gloo or nixl, or leave communicator unset (vLLM picks nixl, else torch_gloo)"
                    if eplb.use_async else "torch_nccl (what runs), torch_gloo or nixl"))


def _extra_items(config: StackConfig) -> list[ArgvItem]:
    """serving.extra_args as the image's vLLM reads them (its card's option table)."""
    return read_argv(list(config.serving.extra_args), table_for(config)[0])


def _moonep_rules(config: StackConfig, profile: ModelProfile, result: Validation) -> None:
    """MoonEP's own refusals in vLLM 0.33.0 (vllm/config/vllm.py:2106-2143), in that order. The quantization is
    the one vLLM resolves (the checkpoint's, or --quantization's on an unquantized one: quantization_rules.py)."""
    par = config.parallelism
    add = result.problems.append
    dtype = config.serving.dtype if config.serving.dtype not in (None, "auto") else profile.dtype
    quant = effective_quantization(profile, _extra_items(config))
    if quant is not None:
        where = (f"models/{profile.key}.json: quantization.method {profile.quantization}"
                 if profile.quantization is not None else "serving.extra_args: --quantization")
        add(Problem("parallelism.all2all_backend", "moonep", f"{profile.key} runs quantized ({quant}, {where})",
                    upstream="ValueError (engine start-up): The moonep all2all backend currently supports unquantized "
                    f"BF16 models only; got quantization='{quant}'. Use a different --all2all-backend for quantized "
                    "models. (vllm/config/vllm.py:2106-2116)", fix="deepep_low_latency or deepep_high_throughput"
                    + ("" if profile.quantization is not None else ", or drop --quantization")))
    elif dtype not in ("bfloat16", "bf16"):
        add(Problem("parallelism.all2all_backend", "moonep", f"the model runs in {dtype}, MoonEP in bfloat16 only",
                    upstream=f"ValueError: The moonep all2all backend currently supports BF16 models only; got "
                    f"dtype={dtype}. (vllm/config/vllm.py:2117-2125)",
                    fix="serving.dtype: bfloat16, or another all2all_backend"))
    if par.eplb.enabled:
        add(Problem("parallelism.eplb.enabled", True, "MoonEP keeps its own replicated expert layout",
                    upstream="ValueError: The moonep all2all backend does not support EPLB yet: EPLB rearranges "
                    "expert parameters in a layout MoonEP's replicated [E+B] weights do not follow. "
                    "(vllm/config/vllm.py:2126-2132)", fix="eplb.enabled: false, or another all2all_backend"))
    if par.expert_placement != "linear":
        add(Problem("parallelism.expert_placement", par.expert_placement, "MoonEP needs each rank's experts in "
                    "one contiguous range", upstream="ValueError: The moonep all2all backend requires linear expert "
                    "placement (vllm/config/vllm.py:2133-2140)", fix="linear"))


def _dbo_rules(config: StackConfig, profile: ModelProfile | None, result: Validation, dp: int) -> None:
    """Dual-batch overlap (`parallelism.dbo.enabled`): what vLLM 0.33.0 asserts, and where it does nothing."""
    par, dbo = config.parallelism, config.parallelism.dbo
    add = result.problems.append
    if not par.expert or dp <= 1:
        add(Problem("parallelism.dbo.enabled", True,
                    f"does nothing with expert {str(par.expert).lower()} and DP{dp}: vLLM micro-batches only when "
                    "its DP ranks agree to, and returns early with one DP rank (v1/worker/dp_utils.py:222-224, "
                    "v1/worker/gpu/ubatch_utils.py:559-560); the all-to-all it overlaps runs only with expert "
                    "parallelism (fused_moe/config.py:1035-1038)",
                    fix="parallelism.expert: true and data > 1 (backend: mp), or dbo.enabled: false"))
    if par.all2all_backend not in DBO_BACKENDS:
        add(Problem("parallelism.all2all_backend", par.all2all_backend, "dual-batch overlap needs a DeepEP or "
                    "nixl_ep all-to-all backend on CUDA",
                    upstream=f"AssertionError: Microbatching currently only supports the {', '.join(DBO_BACKENDS)} "
                    f"all2all backends on this platform. {par.all2all_backend} is not supported. "
                    "(vllm/config/vllm.py:2180-2204)",
                    fix=" or ".join(DBO_BACKENDS) + " (and their kernels in the image), or dbo.enabled: false"))
    for name in ("decode_token_threshold", "prefill_token_threshold"):
        value = getattr(dbo, name)
        if value < 2:
            add(Problem(f"parallelism.dbo.{name}", value, "below the 2 micro-batches DBO splits a batch into",
                        upstream="ValueError: dbo_decode_token_threshold and dbo_prefill_token_threshold must be at "
                        "least the number of microbatches (2). (vllm/config/parallel.py:1178-1187)", fix="2 or more"))
    if profile is not None and profile.architecture == "DeepseekV41ForCausalLM" and profile.engram_hash_heads:
        add(Problem("parallelism.dbo.enabled", True, f"{profile.key} has Engram layers, which vLLM does not "
                    "micro-batch", upstream="ValueError: DeepSeek V4.1 Engram does not support DBO or "
                    "microbatching. Disable --enable-dbo and set --ubatch-size to 0. (vllm/config/vllm.py:1473-1483)",
                    fix="dbo.enabled: false"))


def _redundant_that_fit(config: StackConfig, profile: ModelProfile, gpu: GpuMemory, budget: float) -> int | None:
    """The most EPLB redundant experts that fit per GPU (weights, KV and reserve) and keep routed + redundant
    dividing over EP (fused_moe/layer.py:271-279); None when none are set or even 0 does not fit."""
    redundant = config.parallelism.eplb.num_redundant_experts
    routed = profile.routed_experts
    if not redundant or not gpu.redundant_experts or not routed:
        return None
    par = config.parallelism
    ep = par.tensor * (par.data if par.backend == "mp" else 1)
    per_expert = gpu.redundant_experts / redundant
    room = budget - (gpu.total - gpu.redundant_experts)
    if room < 0:
        return None
    most = min(redundant - 1, int(room / per_expert))
    return next((r for r in range(most, -1, -1) if (routed + r) % ep == 0), None)


MAX_UTILIZATION = 0.95
"""The highest gpu_memory_utilization the advice offers: the rest of the GPU is the CUDA context's, NCCL's and
any other process's."""


def _weights_fix(config: StackConfig, profile: ModelProfile, share: float, need_gb: int) -> str:
    """What makes the weights fit: a higher gpu_memory_utilization where the GPU holds them (the utilisation is
    the cause, not the GPU), else bigger GPUs or more ranks to split them over: DP spreads only the experts of an
    MoE model; the weights of a dense one split only over TP and PP."""
    if share <= MAX_UTILIZATION:
        return (f"serving.gpu_memory_utilization: {math.ceil(share * 100) / 100:g} or more (<= {MAX_UTILIZATION}; "
                f"{config.serving.gpu_memory_utilization} leaves too little of the GPU for them)")
    spread = ("more DP ranks (the experts spread wider)" if profile.moe else
              "a larger parallelism.tensor or parallelism.pipeline (a dense model's weights split only over TP and "
              "PP; DP ranks each hold a whole copy)")
    return f"GPUs of at least {need_gb} GB, {spread}"


def _memory_rules(config: StackConfig, profile: ModelProfile, topo: Topology, result: Validation) -> None:
    """Per GPU (stacks/planner/memory.py):
    experts over DP x TP, dense and Engram weights in every DP rank (split over TP),
    the KV cache of one max_model_len sequence, and a runtime reserve, against GPU memory x utilisation."""
    serving = config.serving
    mem = engine_memory(config, profile, topo)
    gpu, budget, util = mem.gpu, mem.budget_gb, serving.gpu_memory_utilization
    node = config.nodes[mem.node_index]
    key = f"nodes.{mem.node_index}.gpus.memory_gb"
    data = config.parallelism.data if config.parallelism.backend == "mp" else 1
    tp = config.parallelism.tensor
    rest = "dense and Engram weights" if profile.engram_hash_heads else "dense weights" if profile.moe else "weights"
    layout = ((f"experts over DP{data} x TP{tp}, " if profile.moe else "") + f"{rest} in every DP rank over TP{tp}"
              + (f", PP{config.parallelism.pipeline} stages" if config.parallelism.pipeline > 1 else ""))
    engram = f"; Engram tables: {mem.engram_reason}" if mem.gpu.engram or mem.gpu.engram_host_per_node else ""
    need_gb = math.ceil(gpu.total / util)
    offload = (f"; Engram in pinned host memory (--engram-config '{{\"cpu_offload\": true}}' in serving.extra_args, "
               f"~{gpu.engram * mem.engram_shards * mem.engram_copies_per_node:.0f} GB of RAM per node)"
               if gpu.engram else "")
    if gpu.weights > budget:
        fewer = _redundant_that_fit(config, profile, gpu, budget)
        result.problems.append(Problem(
            key, node.gpus.memory_gb,
            f"weights do not fit per GPU of {node.name}: {gpu.weights_text()} > {mem.gpu_gb:g} GB x {util} = "
            f"{budget:.1f} GB ({layout}{engram})" + (
                f"; {config.parallelism.eplb.num_redundant_experts} redundant experts "
                "(parallelism.eplb.num_redundant_experts) add "
                f"{gpu.redundant_experts:.1f} GB" if gpu.redundant_experts else ""),
            upstream="torch.OutOfMemoryError: CUDA out of memory, raised by torch when vLLM builds the model on the "
                     "GPU (vllm/model_executor/model_loader/base_loader.py:72-80) and loads the weights into it",
            fix=(f"parallelism.eplb.num_redundant_experts: {fewer} or fewer (the most that fits; routed + redundant "
                 "must divide by the EP size), " if fewer is not None else "") + _weights_fix(
                config, profile, gpu.total / mem.gpu_gb, need_gb) + offload))
    elif gpu.total > budget:
        fits = gpu.max_len_that_fits(budget)
        gib = 1e9 / 2**30
        result.problems.append(Problem(
            "serving.max_model_len", serving.max_model_len,
            f"the KV cache of one {serving.max_model_len}-token sequence does not fit per GPU of {node.name}: "
            f"{gpu.text()} > {mem.gpu_gb:g} GB x {util} = {budget:.1f} GB",
            upstream=f"ValueError: To serve at least one request with the model's max seq len "
                     f"({serving.max_model_len}), ({gpu.kv * gib:.2f} GiB KV cache is needed, which is larger than "
                     f"the available KV cache memory ({max(0.0, budget - gpu.weights - gpu.reserve) * gib:.2f} GiB). "
                     "(vllm/v1/core/kv_cache_planning.py:67-89)",
            fix=f"max_model_len <= {fits}" + (", an fp8 kv_cache_dtype" if "fp8" not in (
                serving.kv_cache_dtype or profile.default_kv_cache_dtype) else "") + f", or GPUs of {need_gb} GB" + (
                f", or parallelism.eplb.num_redundant_experts: {fewer} or fewer" if (
                    fewer := _redundant_that_fit(config, profile, gpu, budget)) is not None else "")))
    elif gpu.total > 0.9 * budget:
        result.warnings.append(
            f"per GPU of {node.name}: {gpu.text()} of {budget:.1f} GB: room for only "
            f"{(budget - gpu.total) / max(gpu.kv, 1e-9):.1f} more full-length sequences of KV cache")
    result.notes.append(
        f"memory per GPU of {node.name} ({mem.gpu_gb:g} GB x {util} = {budget:.1f} GB): {gpu.text()}; "
        f"{max(0.0, budget - gpu.total):.1f} GB left for the KV cache of concurrent sequences ({layout}{engram})")
    if gpu.engram_host_per_node:
        result.notes.append(
            f"Engram tables: {gpu.engram_host_per_node:.0f} GB of pinned host memory per node "
            f"({mem.engram_reason}); the preflight checks MemTotal")
    if profile.min_vram_gb and topo.gpus_used > 0:
        # The recipe's minimum VRAM for one copy of the model; it scales with model.weights_gb.
        weights = config.model.weights_gb or profile.weights_gb
        need = profile.min_vram_gb * weights / profile.weights_gb
        total = topo.gpus_used * budget
        if total < need:
            result.problems.append(Problem(
                "nodes", len(config.nodes),
                f"{topo.gpus_used} GPUs x {budget:.1f} GB = {total:.0f} GB usable, {profile.key} needs "
                f"~{need:.0f} GB",
                upstream="ValueError: No available memory for the cache blocks. (vllm/v1/core/kv_cache_planning.py:"
                         "56-64)",
                fix=f"more nodes or GPUs, or a higher gpu_memory_utilization (<= {MAX_UTILIZATION})"))


def _parallelism_rules(config: StackConfig, topo: Topology, result: Validation,
                       profile: ModelProfile | None = None) -> None:
    par = config.parallelism
    add = result.problems.append
    total = sum(n.gpus.count for n in config.nodes)
    if par.backend == "ray":
        if par.data != 1:
            add(Problem("parallelism.data", par.data, "the ray backend here runs one replica across all nodes",
                        fix="data: 1 with ray, or backend: mp for vLLM internal DP"))
        if par.tensor * par.pipeline != total:
            add(Problem("parallelism.pipeline", par.pipeline,
                        f"TP{par.tensor} x PP{par.pipeline} = {par.tensor * par.pipeline} GPUs, the nodes have "
                        f"{total}: Ray's placement group would wait forever or leave GPUs idle",
                        fix=f"tensor x pipeline = {total}, e.g. tensor: {config.nodes[0].gpus.count}, "
                        f"pipeline: {max(1, total // config.nodes[0].gpus.count)}"))
        per_node = {n.gpus.count for n in config.nodes}
        if len(per_node) == 1 and par.tensor > next(iter(per_node)):
            result.warnings.append(f"TP{par.tensor} crosses nodes: every layer's all-reduce goes over the fabric; "
                                   "prefer TP = GPUs per node and PP = nodes")
    elif topo.spans_nodes:
        _spanning_rules(config, topo, result, profile)
    else:
        need = par.tensor * par.pipeline
        for i, node in enumerate(config.nodes):
            others = [n.gpus.count for n in config.nodes if n is not node]
            if need > node.gpus.count and others and min(others) >= need:  # the odd node out: its count?
                add(Problem(f"nodes.{i}.gpus.count", node.gpus.count,
                            f"{node.name} has {node.gpus.count} GPUs, the other nodes {min(others)} or more; each DP "
                            f"rank runs inside one node and needs TP{par.tensor} x PP{par.pipeline} = {need} GPUs",
                            fix=f"the GPUs {node.name} really has (nvidia-smi -L); with fewer than {need}, leave it "
                            "out of this stack"))
                break
            if need > node.gpus.count:
                add(Problem("parallelism.tensor", par.tensor,
                            f"with {len(config.nodes)} node(s) for {par.data} replica(s) each DP rank runs inside "
                            f"one node: TP{par.tensor} x PP{par.pipeline} > {node.gpus.count} GPUs on {node.name}",
                            fix=f"tensor x pipeline <= {node.gpus.count} with data parallelism, or more nodes than "
                            "replicas so that each replica spans nodes (mp --nnodes), or backend: ray"))
                break
    idle = topo.gpus_present - topo.gpus_used
    if idle > 0 and not result.problems:
        result.warnings.append(f"{idle} of {topo.gpus_present} GPUs stay idle with this topology")
    models = {n.gpus.model for n in config.nodes}
    if len(models) > 1:
        result.warnings.append(f"mixed GPU models {sorted(models)}: the slowest node paces every step")


def _spanning_rules(config: StackConfig, topo: Topology, result: Validation, profile: ModelProfile | None) -> None:
    """Replicas that span nodes (vLLM's `--nnodes`): what vLLM 0.33.0 itself refuses or makes slow.

    The node-count and world-size rules live in `stacks.planner.topology` (they decide the layout); the per-model
    rules (FlashMLA groups, Engram shards, DSpark without PP, memory per GPU) apply per replica unchanged.
    """
    par = config.parallelism
    share = par.tensor * par.pipeline // topo.replica_nodes
    if profile is not None and not profile.moe and par.data > 1:
        # Dense DP ranks are independent: each engine core re-forms a DP1 world of its own replica
        # (v1/engine/core.py:1545-1555, config/parallel.py:1191-1200), while a workers-only node runs the executor
        # with the DP config as given (entrypoints/cli/serve.py:218-233): the two disagree on world size and
        # ranks at --master-port.
        result.problems.append(Problem(
            "parallelism.data", par.data,
            f"{profile.key} is a dense model: vLLM 0.33.0 runs its DP ranks as independent replicas, and with "
            "replicas spanning nodes its engine cores and its workers-only nodes would join different worlds at "
            "--master-port, so start-up fails or hangs",
            fix="data: 1 (one replica over these nodes), and another stack per extra replica behind a load balancer"))
    # Ranks are laid out TP-fastest, node by node: a TP group stays in one node iff it tiles the node's share.
    if share and (par.tensor > share or share % par.tensor):
        result.warnings.append(
            f"TP{par.tensor} crosses nodes ({share} GPUs of each replica per node): every layer's all-reduce goes "
            f"over the fabric; prefer tensor = GPUs per node and pipeline = nodes per replica "
            f"({topo.replica_nodes})")


def _container_name_rules(config: StackConfig, result: Validation) -> None:
    proxy = config.api.proxy
    if proxy.enabled and proxy.container_name == config.container.name:
        result.problems.append(Problem("api.proxy.container_name", proxy.container_name, "is the engine container's "
                                       "name too: both run on the head, and Docker names are unique per host",
                                       fix="another name, e.g. vllm-proxy"))


SYSTEM_DIRS = frozenset({"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin",
                         "/sys", "/usr", "/var", "/tmp", "/root"})
"""Container directories a bind mount would shadow, breaking the image (or, for /dev and /proc, Docker itself)."""


def _mount_rules(config: StackConfig, result: Validation) -> None:
    """Every container mount point distinct (Docker refuses a duplicate) and none over a system directory."""
    targets = [("model.container_dir", config.model.container_dir)]
    if config.container.cache_dir:
        targets.append(("container.cache_dir", "/root/.cache"))
    targets += [(f"container.volumes.{i}.container", v.container) for i, v in enumerate(config.container.volumes)]
    seen: dict[str, str] = {}
    for key, path in targets:
        if path in seen:
            result.problems.append(Problem(key, path, f"is also the mount point of {seen[path]}: Docker refuses "
                                           "duplicate mount points", fix="a distinct container path"))
        elif path in SYSTEM_DIRS:
            result.problems.append(Problem(key, path, "would hide a system directory of the image",
                                           fix="a directory of its own, e.g. /models or /var/log/vllm"))
        seen.setdefault(path, key)


def _engine_config_rules(config: StackConfig, image: ImageCapabilities | None, result: Validation) -> None:
    """Checks vLLM makes inside `create_engine_config`, which the argument dry run stops before."""
    serving = config.serving
    if serving.max_num_batched_tokens is not None and serving.max_num_batched_tokens < serving.max_num_seqs:
        result.problems.append(Problem(
            "serving.max_num_batched_tokens", serving.max_num_batched_tokens, "is below serving.max_num_seqs",
            upstream=f"ValueError: max_num_batched_tokens ({serving.max_num_batched_tokens}) must be greater than or "
                     f"equal to max_num_seqs ({serving.max_num_seqs}). (vllm/config/scheduler.py:331-336)",
            fix=f"at least {serving.max_num_seqs}"))
    spec = config.speculative
    draft_tp = spec.options.get("draft_tensor_parallel_size") if spec is not None else None
    if draft_tp is not None and draft_tp not in (1, config.parallelism.tensor):
        result.problems.append(Problem(
            "speculative.options.draft_tensor_parallel_size", draft_tp, "must be 1 or the target's TP",
            upstream=f"ValueError: speculative_draft_tensor_parallel_size={draft_tp} cannot be other value than 1 "
                     "or target model tensor_parallel_size (vllm/config/speculative.py:1862-1868)",
            fix=f"1 or {config.parallelism.tensor}"))
    fabric = config.fabric
    if (fabric.transport == "socket" and fabric.nccl_net == "IB") or (fabric.transport != "socket" and \
            fabric.nccl_net == "Socket"):
        result.problems.append(Problem(
            "fabric.nccl_net", fabric.nccl_net, f"contradicts fabric.transport {fabric.transport!r} "
            f"(NCCL_IB_DISABLE={'1' if fabric.transport == 'socket' else '0'})",
            fix="IB with roce/ib, Socket with socket, or leave it unset"))
    if image is not None and image.option_table:
        dtypes = engine_values(image.option_table).get("kv_cache_dtype")
        try:
            profile = get_profile(config.model.profile)
        except CardProblem:  # validate() reports it
            profile = None
        dtype = serving.kv_cache_dtype or (profile.default_kv_cache_dtype if profile else None)
        if dtypes and dtype is not None and dtype not in dtypes:
            result.problems.append(Problem(
                "serving.kv_cache_dtype", dtype, f"vLLM {image.option_table} has no such KV cache dtype",
                upstream=f"pydantic ValidationError (CacheConfig.cache_dtype): Invalid kv_cache_dtype: {dtype!r}. "
                         "Valid "
                         "values are: [...] (vllm/config/cache.py:468-475)", fix=f"one of {', '.join(dtypes)}"))


def _weights_source_rules(config: StackConfig, result: Validation) -> None:
    """The S3 credentials come as a pair (a session token only with it), and only with a `model.source`.
    Neither key is fine: the node's own credentials (an instance role) are used then (plan note)."""
    key_id, secret, token = config.s3_access_key_id, config.s3_secret_access_key, config.s3_session_token
    fix = "pulumi config set --secret vllm-cluster:{key} <value>"
    if (key_id is None) != (secret is None):
        missing = "s3_secret_access_key" if secret is None else "s3_access_key_id"
        result.problems.append(Problem(missing, None, "is missing: the S3 access key id and secret access key "
                                       "are a pair", fix=fix.format(key=missing) + ", or remove the other one to "
                                       "use the nodes' own credentials (an instance role)"))
    if token is not None and key_id is None:
        result.problems.append(Problem("s3_session_token", token, "a session token needs s3_access_key_id and "
                                       "s3_secret_access_key (temporary credentials come as three values)",
                                       fix=fix.format(key="s3_access_key_id") + " and s3_secret_access_key"))
    if config.model.source is not None:
        reason = system_dir_reason(config.model.host_path)  # the sync refuses such a --dest with exit 2
        if reason:
            result.problems.append(Problem("model.path", config.model.path, f"model.host_dir/model.path is "
                                           f"{config.model.host_path}: {reason}, and model.source syncs a checkpoint "
                                           "into it (delete: true would clear everything else there)",
                                           fix="a model directory of its own, e.g. host_dir: /data/models, path: "
                                           "DeepSeek-V4-Flash"))
    if config.model.source is None and any(v is not None for v in (key_id, secret, token)):
        result.warnings.append("s3_* secrets are set but model.source is not: nothing uses them (the nodes' model "
                               "directories are only verified)")


def _observability_rules(config: StackConfig, result: Validation) -> None:
    """The monitoring node exists, can reach vLLM's port, and Grafana has an admin password."""
    obs = config.observability
    if not obs.enabled:
        return
    names = [n.name for n in config.nodes]
    if obs.node is not None and obs.node not in names:
        result.problems.append(Problem("observability.node", obs.node, "is not a node of this stack",
                                       fix=f"one of {', '.join(names)} (default: the head)"))
    elif config.serving.host in ("127.0.0.1", "::1") and (obs.node or config.head.name) != config.head.name:
        result.problems.append(Problem(
            "observability.node", obs.node, f"cannot scrape vLLM: it binds {config.serving.host} on the head",
            fix=f"{config.head.name} (the head), or leave it unset"))
    if config.grafana_admin_password is None:
        result.problems.append(Problem(
            "grafana_admin_password", None, "is required with observability.enabled (Grafana's admin login)",
            fix="pulumi config set --secret grafana_admin_password <password>"))
    if "/metrics" in config.api.proxy.allowed_paths and config.api.proxy.enabled:
        result.warnings.append("api.proxy.allowed_paths passes /metrics through the front door: Prometheus "
                               "scrapes vLLM on the private network; remove it from allowed_paths and admin_paths")


def _free_form_rules(config: StackConfig, image: ImageCapabilities | None, result: Validation) -> None:
    """extra_args and env through the managed-option guard; option values against the image's choices."""
    for problems, warnings in (argv_problems(config), env_problems(config)):
        result.problems += problems
        result.warnings += warnings
    table, own = table_for(config)
    if own and config.speculative is not None:
        known = speculative_fields(table.version)
        for name in config.speculative.options:
            if name not in known:
                near = difflib.get_close_matches(name, sorted(known), n=1)
                result.problems.append(Problem(
                    f"speculative.options.{name}", config.speculative.options[name],
                    f"vLLM {table.version}'s SpeculativeConfig has no field {name!r} (it forbids extra fields)",
                    upstream="pydantic ValidationError: Extra inputs are not permitted (SpeculativeConfig: "
                             "vllm/config/speculative.py:406-407 with extra='forbid' from vllm/config/utils.py:70-71)",
                    fix=f"did you mean {near[0]!r}?" if near else "a field of vllm/config/speculative.py"))
    if own and config.serving.dtype is not None:
        choices = table.options["--dtype"].choices if "--dtype" in table.options else None
        if choices and config.serving.dtype not in choices:
            result.problems.append(Problem("serving.dtype", config.serving.dtype,
                                           f"vLLM {table.version} has no such dtype",
                                           upstream=f"vllm serve: error: argument --dtype: invalid choice: "
                                           f"'{config.serving.dtype}' (argparse, with the choices vLLM gives "
                                           "it: ModelDType, "
                                           "vllm/config/model.py:100, added at vllm/engine/arg_utils.py:977)",
                                           fix=f"one of {', '.join(choices)}"))


def _notes(config: StackConfig, topo: Topology, result: Validation) -> None:
    serving = config.serving
    budget = serving.max_num_batched_tokens
    if budget and serving.max_model_len > budget:
        chunks = math.ceil(serving.max_model_len / budget)
        result.notes.append(
            f"max_num_batched_tokens {budget} is the per-iteration token budget, not the context limit: a "
            f"{serving.max_model_len}-token prompt is chunk-prefilled in {chunks} iterations")
    ranks = config.parallelism.data if config.parallelism.backend == "mp" else 1
    result.notes.append(f"max_num_seqs {serving.max_num_seqs} is per DP rank: up to "
                        f"{serving.max_num_seqs * ranks} active sequences, the rest queue")
    if topo.expert_size:
        result.notes.append(f"experts spread over EP{topo.expert_size} = DP{topo.data} x TP{topo.tensor}")
