"""vLLM 0.33.0's own validation of three engine configs set through `serving.extra_args`, decided offline: the
structured-outputs backend (`--structured-outputs-config`), the compilation config's custom ops and backend
(`-cc` / `--compilation-config`) and prefetch weight offloading (`--offload-*`). The option-value check
(option_values.py) already refuses a field of the wrong type or an unknown choice; these are the rules between
fields that vLLM's validators add. Each refusal quotes vLLM's error, its file:line in the 0.33.0 wheel and when
it is raised: the two JSON options are validated while the arguments are parsed (`parse_dataclass`,
vllm/engine/arg_utils.py:369-374, runs the config's validators), the offload config when the engine config is
built (vllm/engine/arg_utils.py:2851)."""

from __future__ import annotations

import json
import re
from typing import Any

from stacks.model.errors import Problem
from stacks.planner.serve_options import ArgvItem

ARGS = "argument parsing, before the engine starts"
COMPILE_BACKENDS = ("", "eager", "inductor")
"""The backends piecewise (VLLM_COMPILE) compilation takes (vllm/config/compilation.py:1036-1046)."""
VLLM_COMPILE = 3
"""CompilationMode.VLLM_COMPILE (vllm/config/compilation.py:37-50); names are accepted in any case (853-871)."""


def _last(items: list[ArgvItem], dest: str) -> ArgvItem | None:
    return next((i for i in reversed(items) if i.dest == dest and i.values), None)


def config_fields(item: ArgvItem) -> dict[str, Any] | None:
    """The fields a JSON-valued option sets, as FlexibleArgumentParser builds them: the JSON object, or one dotted
    field (`--x.a.b v`: v as JSON, else text; `a+` a comma-separated list, utils/argparse_utils.py:462-490). None
    for what is not an object (the option-value check refuses that). Repeats are refused by argv_problems."""
    name = item.word.partition("=")[0]
    text = item.values[-1]
    if "." not in name:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None
    keys = name.split(".")[1:]
    if not keys:
        return None
    parsed: Any
    if keys[-1].endswith("+"):
        keys[-1], parsed = keys[-1][:-1], text.split(",")
    else:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
    for key in reversed(keys[1:]):
        parsed = {key: parsed}
    return {keys[0]: parsed}


def _at(item: ArgvItem) -> str:
    return f"serving.extra_args.{item.index}"


def _shown(item: ArgvItem) -> str:
    return (item.word if "=" in item.word else " ".join([item.word, *item.values]))[:200]


def structured_output_rules(items: list[ArgvItem]) -> tuple[list[Problem], list[str]]:
    """StructuredOutputsConfig's validator (vllm/config/structured_outputs.py:65-85) and a reasoning parser set
    behind serving.reasoning_parser."""
    item = _last(items, "structured_outputs_config")
    fields = config_fields(item) if item is not None else None
    if item is None or fields is None:
        return [], []
    backend = fields.get("backend", "auto")
    problems: list[Problem] = []
    where = "vllm/config/structured_outputs.py"
    if fields.get("disable_any_whitespace") is True and backend not in ("xgrammar", "guidance"):
        problems.append(Problem(
            _at(item), _shown(item), f"disable_any_whitespace with backend {backend!r}",
            upstream=f"ValueError ({ARGS}): disable_any_whitespace is only supported for xgrammar and guidance "
                     f"backends. ({where}:67-71)",
            fix='"backend": "xgrammar" (or "guidance") beside it, or drop disable_any_whitespace'))
    if fields.get("disable_additional_properties") is True and backend != "guidance":
        problems.append(Problem(
            _at(item), _shown(item), f"disable_additional_properties with backend {backend!r}",
            upstream=f"ValueError ({ARGS}): disable_additional_properties is only supported for the guidance "
                     f"backend. ({where}:72-76)",
            fix='"backend": "guidance" beside it, or drop disable_additional_properties'))
    if fields.get("reasoning_parser"):
        problems.append(Problem(
            _at(item), _shown(item), "sets the reasoning parser inside the structured-outputs config, which the "
            "config manages: vLLM takes it when --reasoning-parser is not given (vllm/engine/arg_utils.py:2198-2215)",
            fix="remove it; set serving.reasoning_parser instead"))
    warnings = [f"{_at(item)}: structured-outputs backend lm-format-enforcer is deprecated in vLLM 0.33.0 and "
                f"removed in v0.35.0 ({where}:77-84): use auto, xgrammar or guidance"] \
        if backend == "lm-format-enforcer" else []
    return problems, warnings


def _mode(value: Any) -> int | None:
    if isinstance(value, str):
        names = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
        return names.get(value.upper())
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _custom_ops_problem(ops: list[Any]) -> tuple[str, str] | None:
    """(vLLM's error, its lines) for the custom_ops list CompilationConfig.__post_init__ refuses, or None."""
    for op in ops:
        if not isinstance(op, str):
            return None  # a type error: the option-value check refuses it
        if op not in ("all", "none") and (len(op) < 2 or op[0] not in "+-"):
            return (f"Invalid syntax '{op}' for custom op, must be 'all', 'none', '+op' or '-op' (where 'op' is the "
                    "registered op name)", "1013-1019")
    if len([op for op in ops if op in ("all", "none")]) > 1:
        return "custom_ops can contain only one base mode: 'all' or 'none'", "1021-1025"
    both = sorted({op[1:] for op in ops if op.startswith("+")} & {op[1:] for op in ops if op.startswith("-")})
    if both:
        return (f"custom_ops cannot both enable and disable the same operation(s): {', '.join(both)}. Remove either "
                "the '+' or '-' directive", "1027-1034")
    return None


def compilation_rules(items: list[ArgvItem]) -> list[Problem]:
    """CompilationConfig.__post_init__'s custom_ops syntax and the piecewise backend (compilation.py:1013-1046)."""
    item = _last(items, "compilation_config")
    fields = config_fields(item) if item is not None else None
    if item is None or fields is None:
        return []
    problems: list[Problem] = []
    ops = fields.get("custom_ops")
    why = _custom_ops_problem(ops) if isinstance(ops, list) else None
    if why is not None:
        problems.append(Problem(
            _at(item), _shown(item), "is not a custom_ops list vLLM accepts",
            upstream=f"ValueError ({ARGS}): {why[0]} (vllm/config/compilation.py:{why[1]})",
            fix="'all' or 'none' at most once, then '+name' to enable or '-name' to disable each op, e.g. "
                '{"custom_ops": ["none", "+rms_norm"]}'))
    backend = fields.get("backend")
    if _mode(fields.get("mode")) == VLLM_COMPILE and isinstance(backend, str) and backend not in COMPILE_BACKENDS:
        problems.append(Problem(
            _at(item), _shown(item), f"mode VLLM_COMPILE (piecewise) with backend {backend!r}",
            upstream=f"ValueError ({ARGS}): Invalid backend for piecewise compilation: {backend} "
                     "(vllm/config/compilation.py:1036-1046)",
            fix='"backend": "inductor" or "eager" (or leave it out), or another mode'))
    sizes = fields.get("decoder_replay_cudagraph_capture_sizes")
    bad = [s for s in sizes if (n := _size(s)) is not None and n <= 0] if isinstance(sizes, list) else []
    if bad:
        problems.append(Problem(
            _at(item), _shown(item), f"decoder_replay_cudagraph_capture_sizes has {bad[0]!r}, not a positive size",
            upstream=f"ValueError ({ARGS}): All decoder_replay_cudagraph_capture_sizes must be positive "
                     "(vllm/config/compilation.py:1048-1051)",
            fix="positive batch sizes, e.g. [1, 2, 4, 8], or leave the field out"))
    return problems


def _size(value: Any) -> int | None:
    """A capture size as pydantic's lax `list[int]` reads it (an int, a whole float, an integer text, a bool);
    None when it is not one (the option-value check refuses that)."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    return None


def _int(item: ArgvItem | None, default: int) -> int | None:
    if item is None:
        return default
    text = item.values[-1].strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def offload_rules(items: list[ArgvItem]) -> tuple[list[Problem], list[str]]:
    """OffloadConfig's validator (vllm/config/offload.py:97-137): prefetch offloading's group sizes, and settings the
    chosen backend ignores. (--cpu-offload-gb, the UVA backend, is refused as not supported: managed_options.)"""
    backend_item = _last(items, "offload_backend")
    backend = backend_item.values[-1] if backend_item is not None else "auto"
    size_item, count_item = _last(items, "offload_group_size"), _last(items, "offload_num_in_group")
    step_item = _last(items, "offload_prefetch_step")
    size, count, step = _int(size_item, 0), _int(count_item, 1), _int(step_item, 1)
    if size is None or count is None or step is None or size < 0 or count < 1 or step < 0:
        return [], []  # not an int, or out of its Field bounds: the option-value check refuses it
    problems: list[Problem] = []
    warnings: list[str] = []
    where = "vllm/config/offload.py"
    when = "engine start-up, before the weights load"
    if backend == "prefetch" or size > 0:
        first = count_item or size_item or backend_item
        if count > size and first is not None:
            problems.append(Problem(
                _at(first), _shown(first), f"prefetch offloading of {count} layer(s) in groups of {size}"
                + ("" if size_item is not None else " (--offload-group-size left at 0)"),
                upstream=f"ValueError ({when}): offload_num_in_group ({count}) must be <= offload_group_size "
                         f"({size}) ({where}:100-106)",
                fix=f"--offload-group-size {max(count, 2)} or more with --offload-num-in-group {count}, or drop the "
                    "prefetch offload flags"))
        if step < 1 and step_item is not None:
            problems.append(Problem(
                _at(step_item), _shown(step_item), "prefetches no layer ahead while prefetch offloading is on",
                upstream=f"ValueError ({when}): offload_prefetch_step ({step}) must be >= 1 when prefetch offloading "
                         f"is enabled (offload_group_size > 0) ({where}:107-113)",
                fix="--offload-prefetch-step 1 or more"))
    if backend == "uva" and size > 0 and size_item is not None:
        warnings.append(f"{_at(size_item)}: {_shown(size_item)} does nothing with --offload-backend uva: \"Prefetch "
                        f"settings will be ignored\" ({where}:118-123)")
    if size > 0 and not problems and size_item is not None:
        warnings.append(f"{_at(size_item)}: prefetch weight offloading keeps some layers' weights in CPU memory; the "
                        "plan's GPU memory rule counts every weight on the GPU, so it errs on the safe side")
    return problems, warnings


def engine_config_problems(items: list[ArgvItem]) -> tuple[list[Problem], list[str]]:
    """Every rule of this module for the extra_args `items` (read by `serve_options.read_argv`)."""
    so_problems, so_warnings = structured_output_rules(items)
    off_problems, off_warnings = offload_rules(items)
    return [*so_problems, *compilation_rules(items), *off_problems], [*so_warnings, *off_warnings]
