"""`vllm serve`'s option tables as data, and argv read the way vLLM's own parser reads it.

Why: `serving.extra_args` must never set, unset or override a flag the config manages. Matching words is not
enough: vLLM's `FlexibleArgumentParser` (vllm/utils/argparse_utils.py, 0.33.0) turns `--tensor_parallel_size`
into `--tensor-parallel-size`, splits `--flag=value`, merges dotted JSON arguments
(`--speculative-config.method x`), reads a whole YAML of arguments from `--config FILE`, and moves `--model` to
the positional model; argparse (Python 3.12, `allow_abbrev` left on) accepts unique prefixes (`--tensor-par`),
short options with an attached value (`-n4` is `--nnodes 4`); `EnableDisableAction` registers hidden
`--no-enable-X`/`--no-disable-X` next to `--enable-X`/`--disable-X`. `read_argv` follows all of that against
the real option table of the image's vLLM (its image card, `images/<name>.json`, read from the real parser by
`python -m stacks image-card`) and returns, for every word, the option's `dest` — so the guard compares
destinations, not spellings. `stacks.planner.option_values` then checks each value against the same card.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from stacks.planner.image_cards import ImageCard, card_of_version

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Option:
    dest: str
    takes_value: bool
    nargs: str | None
    choices: tuple[str, ...] | None
    value_type: dict[str, Any] | None = field(default=None, compare=False)
    """The card's description of argparse's `type=` callable (name, kind, what it wraps); None for flags."""
    bounds: dict[str, float] | None = field(default=None, compare=False)
    """gt/ge/lt/le of the config field behind the option (pydantic `Field` metadata)."""
    field_choices: tuple[str, ...] | None = None
    """Values the config field behind the option takes (a pure `Literal` type), checked after parsing."""
    field_name: str | None = None
    deprecated: bool = False
    json_class: str | None = None
    """The config class a JSON value is validated as (`--compilation-config` -> CompilationConfig)."""
    field_shape: dict[str, Any] | None = field(default=None, compare=False)
    """The config field's structured type when it is an enum (`--optimization-level` -> OptimizationLevel: the
    text argparse passes on is validated when vLLM builds its config)."""


@dataclass(frozen=True)
class OptionTable:
    """Every option string of one vLLM version's `vllm serve` parser -> its action."""

    version: str
    options: dict[str, Option]
    source: str
    card: ImageCard | None = field(default=None, compare=False)
    """The image card the table was read from (its config classes check JSON values); None for Ray's table."""

    @property
    def long_options(self) -> list[str]:
        return [o for o in self.options if o.startswith("--")]

    def dest_options(self, dest: str) -> list[str]:
        return [o for o, a in self.options.items() if a.dest == dest]


RAY_START_FLAGS = "ray-2.60.0-start-flags.json"
"""`ray start`'s options (bench/extract_ray_start_flags.py), for reading Ray argv in the policy pack."""


def option_table(version: str) -> OptionTable:
    """The `vllm serve` table of a vLLM release that has a card in images/, e.g. "0.33.0"."""
    return card_table(card_of_version(version))


def ray_start_table() -> OptionTable:
    return table_file(RAY_START_FLAGS)


@cache
def table_file(name: str) -> OptionTable:
    raw = json.loads((DATA / name).read_text())
    options: dict[str, Option] = {}
    for entry in raw["flags"]:
        if "options" not in entry:
            continue
        choices = tuple(str(c) for c in entry["choices"]) if entry.get("choices") else None
        action = Option(entry["dest"], bool(entry["takes_value"]), entry.get("nargs"), choices)
        for string in entry["options"]:
            options.setdefault(string, action)
    return OptionTable(raw["vllm_version"], options, raw.get("origin", ""))


CONFIG_FIELD_OF: dict[str, str] = {"kv_cache_dtype": "CacheConfig.cache_dtype"}
"""Options whose config field has another name (vllm/engine/arg_utils.py passes `cache_dtype=self.kv_cache_dtype`
to CacheConfig; 0.33.0 validates it there, `CacheConfig._validate_cache_dtype`, config/cache.py:468-475)."""

VALIDATED_FIELDS = frozenset({"CacheConfig.cache_dtype"})
"""Fields whose type is wider than their `Literal` (e.g. `CacheDType | str`) but a validator refuses the rest."""


def pure_literal(field_type: str) -> bool:
    """A field type that admits nothing but its Literal values (and None): the choices are the whole rule."""
    return bool(re.fullmatch(r"(Optional\[)?Literal\[[^\]]*\]\]?( \| None)?", field_type.strip()))


def _field(card: ImageCard, name: str | None) -> dict[str, Any] | None:
    if not name or "." not in name:
        return None
    cls, attr = name.split(".", 1)
    found = (card.config_class(cls) or {}).get("fields", {}).get(attr)
    return found if isinstance(found, dict) else None


@cache
def _card_table(card: ImageCard) -> OptionTable:
    options: dict[str, Option] = {}
    for entry in card.raw["options"]:
        strings = list(entry.get("all_option_strings") or entry.get("option_strings") or [])
        if not strings:
            continue  # the model positional
        name = CONFIG_FIELD_OF.get(entry["dest"]) or entry.get("config_field") or _nested_field(card, entry)
        spec = _field(card, name)
        field_choices = None
        if spec and spec.get("choices") and not entry.get("choices") and (
                name in VALIDATED_FIELDS or pure_literal(str(spec.get("type", "")))):
            field_choices = tuple(str(c) for c in spec["choices"])
        choices = tuple(str(c) for c in entry["choices"]) if entry.get("choices") else None
        shape = (spec or {}).get("shape")
        action = Option(entry["dest"], entry.get("nargs") != 0, None if entry.get("nargs") is None else
                        str(entry["nargs"]) if entry["nargs"] != 0 else "0", choices,
                        value_type=entry.get("type"), bounds=entry.get("bounds") or (spec or {}).get("bounds"),
                        field_choices=field_choices, field_name=name,
                        deprecated=bool(entry.get("deprecated")), json_class=_json_class(card, entry),
                        field_shape=shape if isinstance(shape, dict) and _has_enum(shape) else None)
        for string in strings:
            options.setdefault(string, action)
    for string in ("-h", "--help"):  # argparse's own, on every parser
        options.setdefault(string, Option("help", False, "0", None))
    # The probe builds the parser as `vllm serve --help` (for the help texts), and vLLM then leaves `--model` out
    # (engine/arg_utils.py:968-969, 0.33.0); every real `vllm serve` has it, FlexibleArgumentParser moves it to
    # the positional model.
    options.setdefault("--model", Option("model", True, None, None, value_type={"name": "str", "kind": "builtin"}))
    return OptionTable(card.vllm_version, options, f"{card.path} ({card.taken_with})", card)


def _nested_field(card: ImageCard, entry: dict[str, Any]) -> str | None:
    """`Class.field` of an option whose field lives in a config class nested in its group's: `--offload-group-size`
    sets PrefetchOffloadConfig.offload_group_size (Field(ge=0), vllm/config/offload.py:54; passed on at
    vllm/engine/arg_utils.py:2858), inside OffloadConfig.prefetch. Only where exactly one nested class has it."""
    group = card.config_class(str(entry.get("group") or ""))
    nested = {cls for spec in (group or {}).get("fields", {}).values() if isinstance(spec, dict)
              for cls in spec.get("dataclasses") or []}
    found = [cls for cls in sorted(nested) if entry["dest"] in (card.config_class(cls) or {}).get("fields", {})]
    return f"{found[0]}.{entry['dest']}" if len(found) == 1 else None


def _has_enum(shape: dict[str, Any]) -> bool:
    return shape.get("kind") == "enum" or any(_has_enum(o) for o in shape.get("options") or [])


def _json_class(card: ImageCard, entry: dict[str, Any]) -> str | None:
    """The config class behind a JSON-valued option: its parser's dataclass, or the class vLLM validates the dict
    as later (`--speculative-config` is parsed with json.loads and becomes a SpeculativeConfig)."""
    kind = entry.get("type") or {}
    named = [kind.get("dataclass"), (kind.get("wraps") or {}).get("dataclass"),
             *(entry.get("json_config_validated_as") or []), entry.get("json_config")]
    return next((n for n in named if isinstance(n, str) and card.config_class(n) is not None), None)


def card_table(card: ImageCard) -> OptionTable:
    """The option table of an image card: every string argparse accepts, hidden `--no-X` included."""
    return _card_table(card)


def speculative_fields(version: str) -> frozenset[str]:
    """The fields `--speculative-config` accepts in a vLLM version (SpeculativeConfig forbids others)."""
    return user_fields(card_of_version(version), "SpeculativeConfig")


INTERNAL_CLASSES = frozenset({"ModelConfig", "ParallelConfig", "LoadConfig"})
"""Config objects vLLM fills into a config itself (SpeculativeConfig's target/draft model, parallel and load
configs, vllm/config/speculative.py): fields a user's JSON has no business setting."""


def user_fields(card: ImageCard, cls: str) -> frozenset[str]:
    """The fields of a config class a user's JSON may set (init fields, not vLLM's own config objects)."""
    spec = card.config_class(cls) or {}
    return frozenset(n for n, f in spec.get("fields", {}).items()
                     if f.get("init", True) and not INTERNAL_CLASSES & set(f.get("dataclasses") or ()))


def engine_values(version: str) -> dict[str, tuple[str, ...]]:
    """Allowed values of engine settings vLLM checks after parsing (Literal types of its config classes)."""
    spec = _field(card_of_version(version), "CacheConfig.cache_dtype") or {}
    return {"kv_cache_dtype": tuple(spec["choices"])} if spec.get("choices") else {}


@dataclass
class ArgvItem:
    """One option (or stray word) of an argv, as vLLM would read it."""

    index: int
    word: str
    dest: str | None
    option: str | None
    values: list[str] = field(default_factory=list)
    problem: str | None = None
    fix: str | None = None


_NAME_PART = re.compile(r"(?<=--)[^.]*")


def _normalise(word: str) -> str:
    """FlexibleArgumentParser: `_` -> `-` in the name between `--` and the first `.` (before any `=`)."""
    if not word.startswith("--"):
        return word
    key, sep, value = word.partition("=")
    key = _NAME_PART.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
    return key + sep + value


def _lookup(word: str, table: OptionTable) -> tuple[str | None, str | None, str | None]:
    """(option string, attached value, problem) as argparse's `_parse_optional` resolves a word."""
    if word in table.options:
        return word, None, None
    head, sep, attached = word.partition("=")
    if sep and head in table.options:
        return head, attached, None
    if word.startswith("--"):
        prefix = head if sep else word
        matches = [o for o in table.long_options if o.startswith(prefix)]
        if len(matches) == 1:
            return matches[0], attached if sep else None, None
        if len(matches) > 1:
            return None, None, f"ambiguous abbreviation: could be {', '.join(sorted(matches)[:5])}"
        return None, None, None
    # a single dash: `-n4` is `-n 4` when `-n` exists; otherwise a unique prefix of a short option
    if len(word) > 2 and word[:2] in table.options:
        return word[:2], word[2:].removeprefix("="), None
    matches = [o for o in table.options if o.startswith(word) and not o.startswith("--")]
    if len(matches) == 1:
        return matches[0], None, None
    if len(matches) > 1:
        return None, None, f"ambiguous abbreviation: could be {', '.join(sorted(matches)[:5])}"
    return None, None, None


normalise = _normalise


def read_argv(words: list[str], table: OptionTable) -> list[ArgvItem]:
    """Each option of `words` with its destination and values; words vLLM would refuse or misread carry a
    `problem`. `words` are extra argv words after the planned ones (no model positional)."""
    items: list[ArgvItem] = []
    i = 0
    while i < len(words):
        raw = words[i]
        if re.search(r"[\x00-\x1f\x7f]", raw):
            items.append(ArgvItem(i, raw, None, None, problem="contains a newline or control character",
                                  fix="one printable argv word per item"))
            i += 1
            continue
        if not raw.startswith("-") or raw == "-" or re.fullmatch(r"-\d+(\.\d+)?", raw):
            items.append(ArgvItem(i, raw, None, None, problem="a value without a flag: vLLM would read it as a "
                                  "second model argument and refuse the command line",
                                  fix="put the flag before it, e.g. ['--max-lora-rank', '64']"))
            i += 1
            continue
        if raw == "--":
            items.append(ArgvItem(i, raw, None, None, problem="`--` ends option parsing",
                                  fix="remove it"))
            i += 1
            continue
        word = _normalise(raw)
        name = word.partition("=")[0]
        if re.search(r"\s", name):
            items.append(ArgvItem(i, raw, None, None, problem="a flag and its value in one item: argparse reads "
                                  "a word with a space as a positional, not as the flag",
                                  fix=f"two items: {name.split()[0]!r} and its value"))
            i += 1
            continue
        if raw == "-O" and i + 1 < len(words) and words[i + 1] in ("0", "1", "2", "3"):
            name, word = "--optimization-level", "--optimization-level"  # FlexibleArgumentParser: `-O <n>`
        elif raw == "-O":  # utils/argparse_utils.py:395-406 (0.33.0): argparse then refuses the bare -O
            items.append(ArgvItem(i, raw, None, None, problem="vLLM reads -O only as -O<level> (-O3) or as -O "
                                  "followed by 0, 1, 2 or 3; anything else is an unrecognized argument",
                                  fix="-O0, -O1, -O2 or -O3 (or --optimization-level 3)"))
            i += 1
            while i < len(words) and not words[i].startswith("-"):  # its values, whatever they are
                items[-1].values.append(words[i])
                i += 1
            continue
        elif name.startswith("-O"):
            name, word = "--optimization-level", "--optimization-level=" + (word[3:] if word[2:3] == "=" else word[2:])
        dotted = name.startswith("-") and "." in name  # FlexibleArgumentParser: `-cc.mode 3` too
        base = name.split(".", 1)[0] if dotted else word
        option, attached, problem = _lookup(base, table)
        if dotted:
            attached = word.partition("=")[2] if "=" in word else None
        if problem or option is None:
            nearest = difflib.get_close_matches(name.split(".", 1)[0], table.options, n=1, cutoff=0.6)
            items.append(ArgvItem(i, raw, None, None,
                                  problem=problem or f"vLLM {table.version} has no option {name.split('.', 1)[0]!r}",
                                  fix=f"did you mean {nearest[0]!r}?" if nearest else "see `vllm serve --help=all` "
                                  "of this image"))
            i += 1
            while i < len(words) and not words[i].startswith("-"):  # its values, whatever they are
                items[-1].values.append(words[i])
                i += 1
            continue
        action = table.options[option]
        item = ArgvItem(i, raw, action.dest, option)
        i += 1
        if dotted:
            if attached is not None:
                item.values.append(attached)
            elif i < len(words):
                item.values.append(words[i])
                i += 1
        elif attached is not None:
            if not action.takes_value:
                item.problem, item.fix = f"{option} takes no value", f"{option} alone"
            item.values.append(attached)
        elif action.takes_value:
            while i < len(words) and (not words[i].startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", words[i])):
                item.values.append(words[i])
                i += 1
                if action.nargs not in ("+", "*"):
                    break
            if not item.values and action.nargs != "?":
                item.problem, item.fix = f"{option} needs a value", f"[{option!r}, '<value>']"
        if action.choices and item.values and any(v not in action.choices for v in item.values):
            item.problem = f"{option} takes one of {', '.join(action.choices)}"
            item.fix = f"one of {', '.join(action.choices)}"
        items.append(item)
    return items


def read_serve_argv(words: list[str], table: OptionTable) -> list[ArgvItem]:
    """A whole `vllm serve` argv: the model positional first (when there is one), then `read_argv`."""
    return read_argv(words[1:] if words and not words[0].startswith("-") else words, table)


def last_values(items: list[ArgvItem]) -> dict[str, list[str]]:
    """dest -> the values of its last occurrence (argparse and click keep the last); a flag maps to []."""
    return {item.dest: item.values for item in items if item.dest is not None}
