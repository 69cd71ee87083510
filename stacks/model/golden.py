"""Golden prompts: prompt / expected-answer pairs every DP rank must answer, validated once, matched safely.

Matching rule (documented in docs/checks-by-hand.md): the answer's content is stripped of surrounding whitespace and
of one trailing full stop (`。` or `.`), then the whole of it must match the pattern (`re.fullmatch`). A
search would let `1323` or `323? No, 324` pass for `323`; whoever wants a looser check writes `.*323.*`.

Patterns come from a stack file, so they are bounded: at most 256 characters, no backreference, no
repetition of a group that itself repeats or alternates (`(a+)+`, `(a|b)*`: exponential backtracking), at
most two unbounded quantifiers (`.*323.*` is quadratic at worst), and the answer matched is cut to
`MAX_ANSWER_CHARS` (the checks ask for 64 tokens). Python's `re` has no timeout, so these limits are
what keeps one golden pattern from hanging a check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticCustomError


def refuse(message: str, fix: str) -> PydanticCustomError:
    """`stacks.model.field_types.refuse`, restated: this module travels alone inside the API check's heredoc (it runs in
    the engine image, where the rest of `stacks` is not), so it imports nothing of the project."""
    return PydanticCustomError("vllm_cluster", message, {"fix": fix})

DEFAULT_PROMPT = "17*19等于多少？只返回数字。"
DEFAULT_EXPECT = "323"
MAX_PATTERN_CHARS = 256
MAX_PROMPT_CHARS = 4000
MAX_PAIRS = 16
MAX_ANSWER_CHARS = 2000
MAX_UNBOUNDED = 2

_BRACE = re.compile(r"\{(\d*)(,?)(\d*)\}")


def _quantifier_at(pattern: str, i: int) -> tuple[int, int | None] | None:
    """(length, max repeats: None for unbounded, 1 for exact counts) of a quantifier at `i`, else None.
    An exact count (`{3}`) matches one way only, so it is no repetition that could backtrack."""
    char = pattern[i]
    if char in "*+":
        length, most = 1, None
    elif char == "?":
        length, most = 1, 1
    elif char == "{" and (m := _BRACE.match(pattern, i)) and (m.group(1) or m.group(3)):
        length = m.end() - i
        exact_or_max = 1 if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
        most = exact_or_max
    else:
        return None
    if i + length < len(pattern) and pattern[i + length] in "?+":  # lazy or possessive suffix
        length += 1
    return length, most


def _class_end(pattern: str, i: int) -> int:
    """Index just past the `]` closing the character class that opens at `i`."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "]":
            return j + 1
        j += 1
    return len(pattern)


_FLAGS = re.compile(r"\(\?[aiLmsux]*(?:-[imsx]+)?(:|\))")


def _group_open(pattern: str, i: int) -> int | None:
    """Index just past a group's opening syntax at `i`, or None for `(?#…)` and `(?flags)`, which open none."""
    if not pattern.startswith("(?", i):
        return i + 1
    for prefix in ("(?:", "(?=", "(?!", "(?>", "(?<=", "(?<!"):
        if pattern.startswith(prefix, i):
            return i + len(prefix)
    if pattern.startswith("(?P<", i):
        end = pattern.find(">", i)
        return end + 1 if end > 0 else len(pattern)
    if pattern.startswith("(?#", i):
        return None
    flags = _FLAGS.match(pattern, i)
    if flags and flags.group(1) == ":":
        return flags.end()
    return None


def _shape_problem(pattern: str) -> str | None:
    """Why the pattern could backtrack for long (nested or too many unbounded repeats), or None."""
    frames: list[dict[str, bool]] = [{"repeats": False, "alternates": False}]
    last: dict[str, bool] | None = None  # the group that just closed, if the previous atom was a group
    unbounded = 0
    i = 0
    while i < len(pattern):
        char = pattern[i]
        atom_group: dict[str, bool] | None = None
        if char == "\\":
            if i + 1 < len(pattern) and pattern[i + 1] in "123456789":
                return "backreferences (\\1) are not allowed"
            i += 2
        elif char == "[":
            i = _class_end(pattern, i)
        elif char == "(":
            if pattern.startswith("(?P=", i):
                return "backreferences ((?P=name)) are not allowed"
            if (opened := _group_open(pattern, i)) is None:  # (?#comment) or (?flags): not a group
                i = pattern.find(")", i) + 1 or len(pattern)
                last = None
                continue
            frames.append({"repeats": False, "alternates": False})
            i = opened
            last = None
            continue
        elif char == ")":
            if len(frames) > 1:
                atom_group = frames.pop()
                frames[-1]["repeats"] |= atom_group["repeats"]
                frames[-1]["alternates"] |= atom_group["alternates"]
            i += 1
        elif char == "|":
            frames[-1]["alternates"] = True
            i += 1
        elif (quantifier := _quantifier_at(pattern, i)) is not None:
            length, most = quantifier
            if most is None:
                unbounded += 1
            if most is None or most > 1:
                if last is not None and (last["repeats"] or last["alternates"]):
                    return (f"a repeated group that itself repeats or alternates at offset {i} "
                            "(like (a+)+ or (a|b)*) can take exponential time")
                frames[-1]["repeats"] = True
            i += length
            last = None
            continue
        else:
            i += 1
        last = atom_group
    if unbounded > MAX_UNBOUNDED:
        return f"{unbounded} unbounded quantifiers (* + {{n,}}); at most {MAX_UNBOUNDED}"
    return None


def compile_expect(pattern: str) -> re.Pattern[str]:
    """The compiled pattern, or ValueError saying what is wrong and what works."""
    if not pattern:
        raise ValueError("the expected pattern is empty; e.g. '323'")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"the expected pattern has {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    problem = _shape_problem(pattern)
    if problem:
        raise ValueError(f"{pattern!r}: {problem}; write the answer out (e.g. '323' or '3\\d\\d')")
    if pattern.endswith(("\\.", "。", "\\。")):
        raise ValueError(f"{pattern!r} ends in a full stop, which the answer loses before matching (one trailing "
                         "'.' or '。' is stripped): it could never match; leave the full stop out")
    wrong = next((text for text in UNRELATED_ANSWERS if compiled.fullmatch(text)), None)
    if wrong is not None:
        raise ValueError(f"{pattern!r} also matches {wrong!r}: a check that accepts an empty or unrelated answer "
                         "cannot fail; write the expected answer out (e.g. '323' or '3\\d\\d')")
    return compiled


UNRELATED_ANSWERS: tuple[str, ...] = (
    "", "zz", "zzzz", "I dont know", "I cannot help with that", "抱歉，我无法回答这个问题", "抱歉无法回答",
    "zzzz qqqq 9999 ????", "Error: the model returned nothing",
)
"""Answers no golden pattern may accept: a pattern matching one of them (`.*`, `\\d*`, `323|.*`) passes a
broken rank."""


def normalise_answer(content: str) -> str:
    """What the pattern is matched against: stripped, one trailing `。`/`.` dropped, cut to the bound."""
    text = content.strip()
    if text.endswith(("。", ".")):
        text = text[:-1].rstrip()
    return text[:MAX_ANSWER_CHARS]


_PROMPT_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class GoldenPair(BaseModel):
    """One golden prompt and the regular expression the whole normalised answer must match (`re.fullmatch`
    of the answer stripped of whitespace and one trailing full stop). At temperature 0 with thinking off."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS,
                        description="the prompt sent to every DP rank (newlines and tabs allowed)")
    expect: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS,
                        description="regular expression the whole stripped answer must match, e.g. 323")

    def __repr__(self) -> str:  # how the config reference and messages show a pair
        return json.dumps(self.model_dump(), ensure_ascii=False)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if _PROMPT_CONTROL.search(value):
            raise refuse("contains a control character other than newline or tab",
                         "printable text; newlines and tabs are kept")
        if not value.strip():
            raise refuse("is only whitespace", "a question with one short, certain answer, e.g. " + DEFAULT_PROMPT)
        return value

    @field_validator("expect")
    @classmethod
    def _pattern(cls, value: str) -> str:
        if re.search(r"[\x00-\x1f\x7f]", value):
            raise refuse("contains a control character", "write \\n for a newline in the pattern")
        try:
            compile_expect(value)
        except ValueError as exc:
            raise refuse(str(exc), "a short pattern such as 323 or 3\\d\\d; no backreferences, no nested "
                         "repetition, at most two unbounded quantifiers") from None
        return value


GOLDEN_SET = TypeAdapter(list[GoldenPair])
DEFAULT_GOLDEN: tuple[GoldenPair, ...] = (GoldenPair(prompt=DEFAULT_PROMPT, expect=DEFAULT_EXPECT),)


@dataclass(frozen=True)
class Golden:
    """A validated pair with its pattern compiled once."""

    prompt: str
    expect: str
    pattern: re.Pattern[str]

    def matches(self, content: str) -> bool:
        return self.pattern.fullmatch(normalise_answer(content)) is not None

    @property
    def short_prompt(self) -> str:
        return self.prompt if len(self.prompt) <= 8 else self.prompt[:5] + "…"


def parse_golden(value: Any) -> list[Golden]:
    """A golden set from JSON text or a list of {prompt, expect}: 1 to MAX_PAIRS pairs; ValueError naming
    the pair and field otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_PAIRS:
        raise ValueError(f"must be a list of 1 to {MAX_PAIRS} objects {{prompt, expect}}")
    try:
        pairs = GOLDEN_SET.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"[{where}]: {first['msg']}") from None
    return [Golden(p.prompt, p.expect, compile_expect(p.expect)) for p in pairs]


def golden_json(pairs: list[GoldenPair] | tuple[GoldenPair, ...]) -> str:
    """The `--golden-json` argument for checks.api: compact, non-ASCII kept readable."""
    return json.dumps([p.model_dump() for p in pairs], ensure_ascii=False, separators=(",", ":"))
