"""The quantization vLLM 0.33.0 runs a model with: the checkpoint's method (the model card's `quantization.method`,
read from config.json's `quantization_config` as vLLM normalizes it) resolved against `--quantization` in
`serving.extra_args` the way `ModelConfig._verify_quantization` does it (vllm/config/model.py:1383-1485), when
the engine config is built at start-up, before any weight is read.

Only what that function decides from the checkpoint's method, its `model_type` and the flag is modelled; the
methods whose choice depends on the GPU or on more of the checkpoint's config (GPTQ, AWQ, ModelOpt, auto-round,
compressed-tensors) are left to the argument dry run (None: undecided)."""

from __future__ import annotations

from dataclasses import dataclass

from stacks.model.errors import Problem
from stacks.planner.model_cards import ModelProfile
from stacks.planner.serve_options import ArgvItem

DEEPSEEK_V4_TYPES = ("deepseek_v4", "deepseek_v4_text", "deepseek_v41", "deepseek_v41_text")
"""model_type values whose `fp8` checkpoints vLLM 0.33.0 runs as `deepseek_v4_fp8` on CUDA (the V4.1 class is the
one registered there: model_executor/layers/quantization/__init__.py:120-128; its override:
vllm/models/deepseek_v41/quant_config.py:163-192)."""
DEPRECATED_METHODS = ("fbgemm_fp8", "fp_quant")
"""DEPRECATED_QUANTIZATION_METHODS (vllm/model_executor/layers/quantization/__init__.py:52-55)."""
DECIDED_CHECKPOINTS = (None, "fp8", "mxfp4", "fbgemm_fp8", "fp_quant", "experts_int8", "torchao", "quark")
"""Checkpoint methods no override of vLLM 0.33.0 claims except by model_type or by the flag itself (the rest:
GPTQ/AWQ by GPU capability, ModelOpt by quant_algo, auto-round as inc, compressed-tensors' schemes)."""
WHERE = "vllm/config/model.py"


@dataclass(frozen=True)
class Resolved:
    """What vLLM resolves: the method it runs (None: unquantized), a refusal, a warning."""

    method: str | None
    problem: Problem | None = None
    warning: str | None = None


def _override(checkpoint: str, model_type: str | None, flag: str | None) -> tuple[str | None, str]:
    """The override vLLM 0.33.0's loop (model.py:1396-1450) picks for this checkpoint, and where it is decided."""
    if flag == "humming":  # put first when asked (model.py:1417-1419); claims every checkpoint but gpt-oss MXFP4
        return "humming", "vllm/model_executor/layers/quantization/humming.py:179-191"
    if checkpoint == "mxfp4" and model_type == "gpt_oss":
        return "gpt_oss_mxfp4", "vllm/model_executor/layers/quantization/mxfp4.py:128-146"
    if checkpoint in ("fp8", "deepseek_v4_fp8") and (model_type in DEEPSEEK_V4_TYPES or flag == "deepseek_v4_fp8"):
        return "deepseek_v4_fp8", "vllm/models/deepseek_v41/quant_config.py:163-192"
    return None, ""


def resolve(profile: ModelProfile, items: list[ArgvItem]) -> Resolved | None:
    """The method vLLM runs `profile` with under the extra_args `items`; None where the plan cannot decide."""
    flag_item = next((i for i in reversed(items) if i.dest == "quantization" and i.values), None)
    flag = flag_item.values[-1] if flag_item is not None else None
    allowed = next((i for i in reversed(items) if i.dest == "allow_deprecated_quantization"), None)
    allow = allowed is not None and not (allowed.option or "").startswith("--no-") and not (
        allowed.values and allowed.values[-1].lower() in ("false", "0", "no", "off"))
    checkpoint = profile.quantization
    if checkpoint not in DECIDED_CHECKPOINTS:
        return None
    at = f"serving.extra_args.{flag_item.index}" if flag_item is not None else "model.profile"
    shown = " ".join([flag_item.word, *flag_item.values]) if flag_item is not None else profile.key
    if checkpoint is None:
        method = flag  # no quantization_config: the flag alone (model.py:1454-1455), online quantization
        result = Resolved(method)
    else:
        override, where = _override(checkpoint, profile.model_type, flag)
        if override == "humming" and profile.model_type == "gpt_oss" and checkpoint == "mxfp4":
            return Resolved(None, Problem(
                at, shown, f"asks for the humming kernels on {profile.key}, a gpt-oss MXFP4 checkpoint",
                upstream="ValueError (engine start-up, before the weights load): For gpt-oss model, use "
                         "'--moe-backend humming' instead of '--quantization humming'. "
                         "(vllm/model_executor/layers/quantization/humming.py:182-190)",
                fix="--moe-backend humming instead, or drop --quantization"))
        method = override or checkpoint
        if flag is not None and override is None and flag != checkpoint:
            return Resolved(None, Problem(
                at, shown, f"{profile.key}'s checkpoint is quantized with {checkpoint} (models/{profile.key}.json: "
                f"quantization.method, from its config.json quantization_config), and --quantization asks for {flag}",
                upstream=f"ValueError (engine start-up, before the weights load): Quantization method specified in "
                         f"the model config ({checkpoint}) does not match the quantization method specified in the "
                         f"`quantization` argument ({flag}). ({WHERE}:1452-1462)",
                fix=f"drop --quantization (vLLM reads {checkpoint} from the checkpoint), or --quantization "
                    f"{checkpoint}"))
        warning = None
        if flag is not None and override is not None and flag != override and flag not in (checkpoint, override):
            warning = (f"{at}: {shown} is replaced: vLLM 0.33.0 runs {profile.key}'s {checkpoint} checkpoint as "
                       f"{override} whatever --quantization says ({where}; {WHERE}:1428-1450); drop the flag")
        result = Resolved(method, warning=warning)
    if result.method in DEPRECATED_METHODS and not allow:
        source = "--quantization" if flag is not None else f"models/{profile.key}.json: quantization.method"
        return Resolved(None, Problem(
            at, shown, f"{result.method} ({source}) is a deprecated quantization method in vLLM 0.33.0",
            upstream=f"ValueError (engine start-up, before the weights load): The quantization method "
                     f"{result.method} is deprecated and will be removed in future versions of vLLM. To bypass, set "
                     f"`--allow-deprecated-quantization`. ({WHERE}:1472-1485)",
            fix="add --allow-deprecated-quantization to serving.extra_args (a later vLLM drops the method), or a "
                "checkpoint in a current method"))
    return result


def quantization_problems(profile: ModelProfile, items: list[ArgvItem]) -> tuple[list[Problem], list[str]]:
    """The refusal and the warning of `resolve`, for the plan."""
    resolved = resolve(profile, items)
    if resolved is None:
        return [], []
    return ([resolved.problem] if resolved.problem else []), ([resolved.warning] if resolved.warning else [])


def effective_quantization(profile: ModelProfile, items: list[ArgvItem]) -> str | None:
    """What `model_config.quantization` holds once vLLM resolved it: the card's method when undecided here."""
    resolved = resolve(profile, items)
    if resolved is None or resolved.problem is not None:
        return profile.quantization
    return resolved.method


def unknown_method_problem(profile: ModelProfile, items: list[ArgvItem], methods: list[str],
                           card: str) -> Problem | None:
    """`--quantization NAME` that the image's vLLM does not register (its card's registries.quantization_methods):
    `_verify_quantization` refuses it at start-up (model.py:1464-1469), after the override loop and the checkpoint
    match (a mismatch is refused first: `resolve`)."""
    flag_item = next((i for i in reversed(items) if i.dest == "quantization" and i.values), None)
    if flag_item is None or not methods:
        return None
    flag = flag_item.values[-1]
    resolved = resolve(profile, items)
    if flag in ("", "None") or flag in methods or (resolved is not None and resolved.problem is not None):
        return None
    return Problem(
        f"serving.extra_args.{flag_item.index}", " ".join([flag_item.word, *flag_item.values]),
        f"{flag!r} is not one of the {len(methods)} quantization methods this image's vLLM registers ({card}: "
        "registries.quantization_methods)",
        upstream=f"ValueError (engine start-up, before the weights load): Unknown quantization method: {flag}. "
                 f"Must be one of [...]. ({WHERE}:1464-1469)",
        fix=f"one of {', '.join(methods[:12])}{' …' if len(methods) > 12 else ''}, or drop --quantization")
