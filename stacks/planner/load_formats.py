"""`serving.load_format`, `serving.safetensors_load_strategy` and `serving.model_loader_extra_config` against the
image's card and the rules of vLLM 0.33.0's model loaders.

vLLM reads each of them only when a worker loads the weights, after the engines started, the image was pulled and
every node waited for its peers: a format the image does not register, a loader package it lacks, an extra-config
key the loader refuses, or a model directory without the files the format reads fails there, on every node at
once. The image card says which formats the image registers and whether it has the packages their loaders import
(`load_formats`, checks/image_card_probe.py); the model card says which weight files the checkpoint has
(`weights.shards`); the rest is vLLM's code, cited per rule.
"""

from __future__ import annotations

import fnmatch
import json
import re
import string
from dataclasses import dataclass, field
from typing import Any

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.planner.image_cards import ImageCard
from stacks.planner.model_cards import ModelProfile

ML = "vllm/model_executor/model_loader"
DEFAULT_FORMAT = "auto"


@dataclass(frozen=True)
class Option:
    """One `model_loader_extra_config` key a loader reads: its type, bounds and where vLLM reads it."""

    kind: type
    where: str
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class Loader:
    """What one load format needs: the keys its loader reads, the files it globs in the model directory, whether
    it reads the safetensors load strategy, or why this tool refuses it."""

    loader: str
    options: dict[str, Option] = field(default_factory=dict)
    options_where: str = ""
    files: tuple[str, ...] = ()
    files_where: str = ""
    strategy: bool = False
    refused: tuple[str, str] | None = None
    multithread: bool = False
    """`enable_multithread_load` changes what it reads (the default loader's safetensors and .pt paths)."""


_DEFAULT_OPTIONS = {
    "enable_multithread_load": Option(bool, f"{ML}/default_loader.py:117-122"),
    "num_threads": Option(int, f"{ML}/default_loader.py:123-129", 1, 1024),
    "enable_weights_track": Option(bool, f"{ML}/default_loader.py:131-133"),
}
_DEFAULT_KEYS = f"{ML}/default_loader.py:103-115"
_SHARDED = {"pattern": Option(str, f"{ML}/sharded_state_loader.py:49-57")}
_SHARDED_FILES = f"{ML}/sharded_state_loader.py:38-39, 196-216"


def _default(files: tuple[str, ...], where: str, *, strategy: bool, multithread: bool = True) -> Loader:
    return Loader("DefaultModelLoader", _DEFAULT_OPTIONS, _DEFAULT_KEYS, files, where, strategy, None, multithread)


LOADERS: dict[str, Loader] = {
    "auto": _default(("*.safetensors", "*.bin", "*.pt"), f"{ML}/default_loader.py:170-186, 207-208", strategy=True),
    "hf": _default(("*.safetensors", "*.bin", "*.pt"), f"{ML}/default_loader.py:185-186, 207-208", strategy=True),
    "safetensors": _default(("*.safetensors",), f"{ML}/default_loader.py:187-193", strategy=True),
    "fastsafetensors": _default(("*.safetensors",), f"{ML}/default_loader.py:187-193, 312-316", strategy=False,
                                multithread=False),
    "instanttensor": _default(("*.safetensors",), f"{ML}/default_loader.py:187-193, 317-327", strategy=False,
                              multithread=False),
    "mistral": _default(("consolidated*.safetensors",), f"{ML}/default_loader.py:194-197", strategy=True),
    "pt": _default(("*.pt",), f"{ML}/default_loader.py:198-199", strategy=False),
    "npcache": _default(("*.bin",), f"{ML}/default_loader.py:200-201, 301-310", strategy=False, multithread=False),
    "runai_streamer": Loader(
        "RunaiModelStreamerLoader",
        {"distributed": Option(bool, f"{ML}/runai_streamer_loader.py:142-146"),
         "concurrency": Option(int, f"{ML}/runai_streamer_loader.py:151-161", 1, 4096),
         "memory_limit": Option(int, f"{ML}/runai_streamer_loader.py:163-173", -1, 2**53)},
        f"{ML}/runai_streamer_loader.py:135-140", ("*.safetensors",), f"{ML}/runai_streamer_loader.py:189, 208"),
    "sharded_state": Loader("ShardedStateLoader", _SHARDED, f"{ML}/sharded_state_loader.py:52-57",
                            ("<pattern>",), _SHARDED_FILES),
    "runai_streamer_sharded": Loader("ShardedStateLoader", _SHARDED, f"{ML}/sharded_state_loader.py:52-57",
                                     ("<pattern>",), _SHARDED_FILES),
    "tensorizer": Loader(
        "TensorizerLoader",
        {"tensorizer_uri": Option(str, f"{ML}/tensorizer.py:160, 219-240"),
         "verify_hash": Option(bool, f"{ML}/tensorizer.py:163"),
         "num_readers": Option(int, f"{ML}/tensorizer.py:164", 1, 1024),
         "encryption_keyfile": Option(str, f"{ML}/tensorizer.py:165"),
         "s3_endpoint": Option(str, f"{ML}/tensorizer.py:168")},
        "vllm/engine/arg_utils.py:2067-2086 (only TensorizerConfig's fields are copied in; other keys are dropped)",
        ("model.tensors",), f"{ML}/tensorizer.py:233-240 with vllm/engine/arg_utils.py:2082-2086"),
    "modelexpress": Loader("ModelExpressModelLoader", {}, f"{ML}/modelexpress_loader.py:41-50 (the ModelExpress "
                           "package reads them, not vLLM: not checked here)"),
    "dummy": Loader("DummyModelLoader", refused=(
        f"fills every weight with random values ({ML}/dummy_loader.py:35-48): every answer is noise and the golden "
        "check fails", "auto (or another format that reads the checkpoint)")),
    "ipc_cache": Loader("IpcModelLoader", refused=(
        "maps the weights from a weight cache daemon per GPU that `vllm preload` must start first "
        f"(vllm/config/load.py:41-43, {ML}/weight_cache/ipc_loader.py:71-98); this tool starts no such daemon",
        "auto (or fastsafetensors / safetensors with serving.safetensors_load_strategy for a faster start)")),
}
"""vLLM 0.33.0's registry (vllm/model_executor/model_loader/__init__.py:50-66) and what each loader reads."""

UNKNOWN_KEY_ERRORS = {
    "DefaultModelLoader": "Unexpected extra config keys for load format {fmt}: {{'{key}'}}",
    "RunaiModelStreamerLoader": "Unexpected extra config keys for runai_streamer: {{'{key}'}}",
    "ShardedStateLoader": "Unexpected extra config keys for load format {fmt}: dict_keys(['{key}'])",
}
"""What each loader raises on a key it does not read (tensorizer drops them silently; modelexpress's are its own)."""
EP_FILTERED = ("auto", "hf", "safetensors", "mistral", "instanttensor")
"""The formats whose reader gets the rank's expert ids (default_loader.py:317-327, 338-349)."""
SECRET_KEYS = {"s3_access_key_id": "S3_ACCESS_KEY_ID", "s3_secret_access_key": "S3_SECRET_ACCESS_KEY"}
"""Tensorizer's credentials (vllm/model_executor/model_loader/tensorizer.py:211-214 names their variables)."""
TORCHAO_MIN = (0, 15, 0)
"""weight_utils.py:1216-1221: the torchao strategy refuses an older torchao."""
_RANK_TEMPLATE = re.compile(r"%0\dd")
"""What makes a tensorizer URI per rank (vllm/model_executor/model_loader/tensorizer.py:221-224)."""


def load_flags(config: StackConfig) -> list[str]:
    """The argv words of the three settings; nothing for vLLM's defaults, so existing stacks' argv is unchanged."""
    serving, args = config.serving, []
    if serving.load_format != DEFAULT_FORMAT:
        args += ["--load-format", serving.load_format]
    if serving.safetensors_load_strategy is not None:
        args += ["--safetensors-load-strategy", serving.safetensors_load_strategy]
    if serving.model_loader_extra_config:
        args += ["--model-loader-extra-config",
                 json.dumps(serving.model_loader_extra_config, separators=(",", ":"), sort_keys=True)]
    return args


def load_rules(config: StackConfig, profile: ModelProfile | None, card: ImageCard | None
               ) -> tuple[list[Problem], list[str]]:
    """Refusals and warnings of the three settings (all at once)."""
    serving = config.serving
    problems: list[Problem] = []
    warnings: list[str] = []
    fmt = serving.load_format
    loader = LOADERS.get(fmt)
    problems += _image_problems(config, card, loader)
    if loader is None:
        return problems, warnings
    if loader.refused is not None:
        why, fix = loader.refused
        problems.append(Problem("serving.load_format", fmt, f"{fmt} {why}", fix=fix))
        return problems, warnings
    problems += _option_problems(config, loader)
    problems += _strategy_problems(config, profile, card, loader)
    layout_problems, layout_warnings = _layout(config, profile, loader)
    return problems + layout_problems, warnings + layout_warnings


def _image_problems(config: StackConfig, card: ImageCard | None, loader: Loader | None) -> list[Problem]:
    """The format against the image's card: registered, its packages there; and against this tool's table."""
    fmt = config.serving.load_format
    if fmt == DEFAULT_FORMAT:
        return []
    formats = card.raw.get("load_formats") if card is not None else None
    if card is not None and not isinstance(formats, dict):
        return [Problem("serving.load_format", fmt, f"the image card {card.path} records no load formats (taken "
                        "with image card probe 2 or older), so only the default is known to work",
                        fix=f"auto, or take the card again: python -m stacks image-card {config.image.ref}")]
    if isinstance(formats, dict) and fmt not in formats:
        return [Problem("serving.load_format", fmt, f"vLLM {card.vllm_version if card else ''} in "
                        f"{config.image.ref} registers no such load format ({card.path if card else ''}: "
                        "load_formats)", upstream=f"ValueError: Load format `{fmt}` is not supported "
                        "(vllm/model_executor/model_loader/__init__.py:126-127)",
                        fix=f"one of {', '.join(sorted(f for f in formats if f in LOADERS))}")]
    if loader is None:
        return [Problem("serving.load_format", fmt, "no loader rules are known here for this format (a plugin's "
                        "loader, or a vLLM newer than 0.33.0): its files, packages and extra config cannot be "
                        "checked", fix=f"one of {', '.join(sorted(LOADERS))} with a loader this tool checks")]
    problems = []
    entry = formats.get(fmt) if isinstance(formats, dict) else None
    packages = entry.get("packages") if isinstance(entry, dict) else None
    for dist, found in (packages or {}).items():
        if not (isinstance(found, dict) and found.get("found") is True):
            problems.append(Problem(
                "serving.load_format", fmt, f"its loader imports {dist} (module "
                f"{(found or {}).get('module', dist) if isinstance(found, dict) else dist}), which "
                f"{config.image.ref} does not have ({card.path if card else ''}: load_formats.{fmt}.packages)",
                upstream="ImportError when the loader first uses it (vllm/utils/import_utils.py:312-323, "
                         "PlaceholderModule)",
                fix=f"an image with {dist} installed (take its card: python -m stacks image-card IMAGE), or auto"))
    if config.rehearsal and fmt == "instanttensor":
        problems.append(Problem("serving.load_format", fmt, "InstantTensor reads the weights onto NVIDIA GPUs only "
                                "and a rehearsal has none", upstream="ValueError: InstantTensor requires NVIDIA GPUs "
                                f"({ML}/weight_utils.py:1409-1410)", fix="auto"))
    return problems


def _option_problems(config: StackConfig, loader: Loader) -> list[Problem]:
    """Each extra-config key: one the loader reads, of its type and range; the cross-key rules."""
    serving = config.serving
    fmt, extra = serving.load_format, serving.model_loader_extra_config
    problems: list[Problem] = []
    for key, value in extra.items():
        where = f"serving.model_loader_extra_config.{key}"
        option = loader.options.get(key)
        if key in SECRET_KEYS and fmt == "tensorizer":
            problems.append(Problem(where, "…", "puts a credential in argv, visible in `ps`, `docker inspect` and "
                                    "Pulumi state", fix=f"env_secrets.{SECRET_KEYS[key]} (tensorizer reads "
                                    f"{SECRET_KEYS[key]}: {ML}/tensorizer.py:211-214)"))
            continue
        if option is None:
            known = ", ".join(loader.options) or "none"
            said = UNKNOWN_KEY_ERRORS.get(loader.loader)
            problems.append(Problem(where, value, f"is not a key the {loader.loader} of load format {fmt} reads "
                                    f"({loader.options_where})",
                                    upstream=f"ValueError: {said.format(fmt=fmt, key=key)} ({loader.options_where})"
                                    if said else None, fix=f"one of: {known}"))
            continue
        kind_ok = isinstance(value, option.kind) and not (option.kind is int and isinstance(value, bool))
        if not kind_ok:
            kind = {bool: "a boolean", int: "an integer", str: "a string"}[option.kind]
            problems.append(Problem(where, value, f"must be {kind} ({option.where})", fix=kind))
            continue
        if isinstance(value, int) and not ((option.low is None or value >= option.low)
                                           and (option.high is None or value <= option.high)):
            problems.append(Problem(where, value, f"is outside {option.low}..{option.high} ({option.where})",
                                    fix=f"an integer from {option.low} to {option.high}"))
    multithread = extra.get("enable_multithread_load") is True
    strategy = serving.safetensors_load_strategy
    if "num_threads" in extra and not multithread and loader.loader == "DefaultModelLoader":
        problems.append(Problem("serving.model_loader_extra_config.num_threads", extra["num_threads"],
                                f"does nothing without enable_multithread_load: true ({ML}/default_loader.py:329-336, "
                                "351-358 read it only there)", fix="enable_multithread_load: true, or remove it"))
    if multithread and not loader.multithread:
        problems.append(Problem("serving.model_loader_extra_config.enable_multithread_load", True,
                                f"does nothing with load format {fmt}: its reader takes no threads "
                                f"({ML}/default_loader.py:301-327)", fix="remove it, or load format safetensors"))
    if multithread and strategy not in (None, "lazy"):
        problems.append(Problem(
            "serving.model_loader_extra_config.enable_multithread_load", True,
            f"cannot go with serving.safetensors_load_strategy {strategy}: the multi-thread loader reads lazily only",
            upstream=f"ValueError: enable_multithread_load does not support safetensors_load_strategy='{strategy}'; "
                     f"the multi-thread loader only implements the default lazy strategy. "
                     f"({ML}/default_loader.py:135-145)",
            fix="one of the two"))
    if config.parallelism.ep_weight_filter and (fmt not in EP_FILTERED or multithread):
        problems.append(Problem(
            "parallelism.ep_weight_filter", True, f"does nothing with load format {fmt}"
            + (" and enable_multithread_load" if multithread and fmt in EP_FILTERED else "")
            + f": only the default loader's own safetensors reader and InstantTensor skip other ranks' experts "
            f"({ML}/default_loader.py:312-349)", fix=f"load format {' or '.join(EP_FILTERED)} without "
            "enable_multithread_load, or ep_weight_filter: false"))
    if fmt in ("sharded_state", "runai_streamer_sharded"):
        problems += _pattern_problems(config)
    if fmt == "tensorizer":
        problems += _tensorizer_problems(config)
    return problems


def _fields(pattern: str) -> set[str] | None:
    """The format fields of a shard pattern as vLLM parses them (sharded_state_loader.py:87-91); None if malformed."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(pattern) if name is not None}
    except ValueError:
        return None


def shard_glob(pattern: str | None, tp_rank: int, pp_rank: int, pp: int) -> str:
    """The file glob one rank loads (sharded_state_loader.py:59-67, 122-135, with part="*": line 196-198)."""
    pattern = pattern or ("model-pp-{pp_rank}-tp-{tp_rank}-part-{part}.safetensors" if pp > 1
                          else "model-rank-{rank}-part-{part}.safetensors")
    return pattern.format(pp_rank=pp_rank, tp_rank=tp_rank, rank=tp_rank, part="*")


def _pattern_problems(config: StackConfig) -> list[Problem]:
    """vLLM's own checks of a shard pattern against TP and PP (sharded_state_loader.py:84-135), offline."""
    pattern = config.serving.model_loader_extra_config.get("pattern")
    if not isinstance(pattern, str):
        return []
    where, tp, pp = "serving.model_loader_extra_config.pattern", config.parallelism.tensor, config.parallelism.pipeline
    fields = _fields(pattern)
    rules = f"{ML}/sharded_state_loader.py:84-135"
    if "/" in pattern or ".." in pattern:
        return [Problem(where, pattern, "names a file outside the model directory; vLLM joins it to the model path "
                        f"({ML}/sharded_state_loader.py:204-209)", fix="a file name, e.g. "
                        "model-rank-{rank}-part-{part}.safetensors")]
    if fields is None or fields - {"pp_rank", "tp_rank", "rank", "part"}:
        return [Problem(where, pattern, f"uses placeholders other than pp_rank, tp_rank, rank and part ({rules})",
                        upstream=f"ValueError: Pattern '{pattern}' uses unsupported placeholder(s) ... "
                                 f"({ML}/sharded_state_loader.py:92-98, when each worker renders its file name)",
                        fix="model-rank-{rank}-part-{part}.safetensors (TP only) or "
                            "model-pp-{pp_rank}-tp-{tp_rank}-part-{part}.safetensors (with PP)")]
    has_tp = bool(fields & {"tp_rank", "rank"})
    why = said = None
    if pp > 1 and "pp_rank" not in fields:
        why = f"has no {{pp_rank}} while parallelism.pipeline is {pp}: every stage would read the same files"
        said = f"does not embed the pipeline parallel rank; ... ({ML}/sharded_state_loader.py:108-115)"
    elif pp == 1 and "pp_rank" in fields:
        why = "has {pp_rank} while parallelism.pipeline is 1"
        said = (f"requires pipeline parallelism, but the pipeline parallel size is 1 ({ML}/sharded_state_loader.py:"
                "125-129)")
    elif tp > 1 and not has_tp:
        why = f"has no {{tp_rank}} or {{rank}} while parallelism.tensor is {tp}: the TP ranks would read one shard"
        lines = "116-120" if pp > 1 else "130-134"
        said = f"does not embed the tensor parallel rank; ... ({ML}/sharded_state_loader.py:{lines})"
    if why is None:
        return []
    return [Problem(where, pattern, f"{why} ({rules})", upstream=f"ValueError: Pattern '{pattern}' {said}, when "
                    "each worker renders its file name", fix="model-pp-{pp_rank}-tp-{tp_rank}-part-{part}.safetensors"
                    if pp > 1 else "model-rank-{rank}-part-{part}.safetensors")]


def _container_dirs(config: StackConfig) -> list[str]:
    return [config.model.container_dir.rstrip("/"), *(v.container.rstrip("/") for v in config.container.volumes)]


def _tensorizer_problems(config: StackConfig) -> list[Problem]:
    """Tensorizer's URI per TP rank, and local paths inside a mounted directory."""
    extra, tp = config.serving.model_loader_extra_config, config.parallelism.tensor
    problems = []
    uri = extra.get("tensorizer_uri")
    where = "serving.model_loader_extra_config.tensorizer_uri"
    if isinstance(uri, str):
        if not (uri.startswith(("s3://", "https://", "http://", "/"))):
            problems.append(Problem(where, uri, "is neither an absolute path in the container nor an s3:// or "
                                    "http(s):// URL", fix="e.g. s3://bucket/model-%03d.tensors"))
        sharded = _RANK_TEMPLATE.search(uri) is not None
        if tp > 1 and not sharded:
            problems.append(Problem(
                where, uri, f"has no per-rank template (%0Nd) while parallelism.tensor is {tp}",
                upstream="ValueError: For a sharded model, tensorizer_uri should include a string format template "
                         f"like '%04d' to be formatted with the rank of the shard ({ML}/tensorizer.py:286-295)",
                fix="a URI with %03d where the rank goes, e.g. s3://bucket/model-rank-%03d.tensors"))
        if tp == 1 and sharded:
            problems.append(Problem(where, uri, f"has a per-rank template but parallelism.tensor is 1: vLLM fills "
                                    f"it in only with TP > 1 ({ML}/tensorizer_loader.py:123-129)",
                                    fix="the one file's URI"))
    elif tp > 1:
        problems.append(Problem(
            "serving.load_format", "tensorizer", f"without model_loader_extra_config.tensorizer_uri vLLM reads "
            f"<model>/model.tensors, which has no per-rank template, while parallelism.tensor is {tp}",
            upstream=f"ValueError: For a sharded model, tensorizer_uri should include a string format template "
                     f"({ML}/tensorizer.py:233-240, 286-295)",
            fix="serving.model_loader_extra_config.tensorizer_uri with %03d, e.g. /models/m/model-rank-%03d.tensors"))
    for key in ("tensorizer_uri", "encryption_keyfile"):
        path = extra.get(key)
        if isinstance(path, str) and path.startswith("/") and not any(
                path == d or path.startswith(d + "/") for d in _container_dirs(config)):
            problems.append(Problem(f"serving.model_loader_extra_config.{key}", path, "is not inside a directory "
                                    "the engine container mounts", fix=f"a path under one of "
                                    f"{', '.join(_container_dirs(config))} (model.container_dir, container.volumes)"))
    endpoint = extra.get("s3_endpoint")
    if isinstance(endpoint, str) and not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:\d{1,5})?/?", endpoint):
        problems.append(Problem("serving.model_loader_extra_config.s3_endpoint", endpoint, "is not an endpoint URL",
                                fix="https://host[:port]"))
    return problems


def _version(text: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(text).split("+")[0])[:3])


def _strategy_problems(config: StackConfig, profile: ModelProfile | None, card: ImageCard | None,
                       loader: Loader) -> list[Problem]:
    strategy, fmt = config.serving.safetensors_load_strategy, config.serving.load_format
    key = "serving.safetensors_load_strategy"
    if strategy is None:
        return []
    if not loader.strategy:
        return [Problem(key, strategy, f"does nothing with load format {fmt}: only the default loader's safetensors "
                        f"reader uses it ({ML}/default_loader.py:311-349)", fix="remove it, or load format auto, hf, "
                        "safetensors or mistral")]
    if strategy != "torchao":
        return []
    problems = []
    if profile is not None and profile.quantization != "torchao":
        problems.append(Problem(key, strategy, f"rebuilds torchao tensor subclasses (vllm/config/load.py:82-85); "
                                f"models/{profile.key}.json records quantization "
                                f"{profile.quantization or 'none'}, not torchao",
                                fix="lazy, eager or prefetch (or unset)"))
    strategies = card.raw.get("safetensors_load_strategies") if card is not None else None
    if card is None:
        return problems
    torchao = ((strategies or {}).get("torchao") or {}).get("packages", {}).get("torchao") \
        if isinstance(strategies, dict) else None
    if not (isinstance(torchao, dict) and torchao.get("found") is True
            and _version(torchao.get("version")) >= TORCHAO_MIN):
        have = torchao.get("version") if isinstance(torchao, dict) and torchao.get("found") else None
        problems.append(Problem(
            key, strategy, f"needs torchao >= 0.15.0 in the image; {card.path} records "
            + (f"torchao {have}" if have else "no torchao" if isinstance(strategies, dict)
               else "no packages for the strategies (image card probe 2 or older)"),
            upstream=f"ValueError: Please use torchao version >= 0.15.0 to load torchao safetensors checkpoint "
                     f"({ML}/weight_utils.py:1216-1221)", fix="an image with torchao >= 0.15.0, or lazy"))
    return problems


def _layout(config: StackConfig, profile: ModelProfile | None, loader: Loader) -> tuple[list[Problem], list[str]]:
    """The files the format reads against the weight files the model card lists (top level only: vLLM globs
    the model directory itself)."""
    serving = config.serving
    fmt, extra = serving.load_format, serving.model_loader_extra_config
    if profile is None or not loader.files or (fmt == "tensorizer" and "tensorizer_uri" in extra):
        return [], []
    par = config.parallelism
    if loader.files == ("<pattern>",):
        given = extra.get("pattern")
        pattern = given if isinstance(given, str) else None
        if pattern is not None and _pattern_problems(config):
            return [], []
        globs = tuple(shard_glob(pattern, t, p, par.pipeline) for p in range(par.pipeline) for t in range(par.tensor))
    else:
        globs = loader.files
    needed = " and ".join(globs[:4]) + (f" (and {len(globs) - 4} more)" if len(globs) > 4 else "")
    if not profile.weight_files:
        if fmt in ("auto", "hf", "safetensors", "fastsafetensors", "instanttensor", "runai_streamer"):
            return [], []
        return [], [f"serving.load_format {fmt}: models/{profile.key}.json lists no weight files "
                    f"({profile.weights_source}), so the plan cannot check that {config.model.host_path} holds "
                    f"{needed} ({loader.files_where}); the engines fail at load time on every node if it does not"]
    top = [f for f in profile.weight_files if "/" not in f]
    group = any if loader.files != ("<pattern>",) else all
    if group(any(fnmatch.fnmatchcase(f, g) for f in top) for g in globs):
        return [], []
    shown = ", ".join(profile.weight_files[:3]) + (" …" if len(profile.weight_files) > 3 else "")
    return [Problem(
        "serving.load_format", fmt, f"reads {needed} from the model directory ({loader.files_where}); "
        f"models/{profile.key}.json lists its weight files as {shown}",
        upstream=f"no weight files found for load format {fmt} (vLLM raises at load time: {loader.files_where})",
        fix="auto (or safetensors / fastsafetensors for these files), or a model card made from a directory of "
            "the files this format reads")], []
