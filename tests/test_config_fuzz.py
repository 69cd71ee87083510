"""Property: whatever happens to a committed stack file, `plan` answers with a plan or with problems that name
real config keys — never a traceback, never a hang.

Hypothesis mutates both stacks thousands of times: values replaced by hostile ones (wrong types, NaN, huge,
negative, empty, unicode, `..`, `;`, `$()`, newlines, quotes, IPv6, secrets in plain text), keys deleted,
renamed or added, list items duplicated, and the YAML text itself cut, spliced, re-indented and aliased.
Each mutated file goes through the same path as `python -m stacks plan` (read as Pulumi reads it, validate,
plan); a run must end in a plan (exit 0) or a ConfigError (exit 2) within a second.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from review.cli import main as cli_main
from stacks.model.errors import ConfigError
from stacks.model.loader import field_at, parse_config
from stacks.model.stack_file import parse_stack_text
from stacks.planner.plan import build_plan

ROOT = Path(__file__).resolve().parent.parent
TEXTS = {s: (ROOT / f"Pulumi.{s}.yaml").read_text() for s in ("prod", "h20")}
DOCS = {s: yaml.safe_load(t) for s, t in TEXTS.items()}

HOSTILE: list[Any] = [
    "", " ", "0", "-1", "1e400", ".inf", "NaN", "yes", "off", "null", "~", "[secret]", "..", "../../etc/passwd",
    "/", "//x", "a;rm -rf /", "$(reboot)", "`id`", "a\nb", "a\rb", "\x00", "'\"", "{", "[", "*", "&a",
    "ünïcödé", "名前", "\u202e", "x" * 5000, "fd00::1", "[fd00::1]", "fe80::1%eth0", "0.0.0.0", "::", "127.0.0.1",
    "10.0.0.0/8", "0.0.0.0/0", "sk-live-0123456789", "hf_abc", "--tensor-parallel-size=16", "-tp", "--config",
    "http://x", "vllm/vllm-openai:v0.33.0", "sha256:" + "a" * 64,
    0, -1, 1, 8, 2**31, 2**63, -(2**63), 10**30, 0.5, -0.0, 1e-320, 1e308, math.inf, -math.inf, math.nan,
    True, False, None, [], {}, [1, 2], ["a", "a"], {"a": 1}, {"secure": "AAAB"}, [[[]]], {"": ""},
]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


@st.composite
def mutated_documents(draw: st.DrawFn) -> tuple[str, str]:
    stack = draw(st.sampled_from(sorted(DOCS)))
    doc = copy.deepcopy(DOCS[stack])
    for _ in range(draw(st.integers(1, 4))):
        if not isinstance(doc.get("config"), dict) or not doc["config"]:
            break
        paths = _paths(doc["config"], ("config",))
        path = draw(st.sampled_from(paths))
        parent, last = _parent(doc, path), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "rename", "add", "dup"]))
        if action == "replace":
            parent[last] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))  # never the shared list or dict itself
        elif action == "delete":
            del parent[last]
        elif action == "rename" and isinstance(parent, dict):
            new = draw(st.sampled_from([str(last).upper(), f"{last}_", str(last)[:-1] or "x", "vllm_cluster:x",
                                        f"vllm-cluster:config:{last}", "<<", "1"]))
            parent[new] = parent.pop(last)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "tensor", "host", "api_key", "env"]))] = copy.deepcopy(draw(
                st.sampled_from(HOSTILE)))
        elif action == "dup" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
    return stack, yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


@st.composite
def mangled_texts(draw: st.DrawFn) -> tuple[str, str]:
    stack = draw(st.sampled_from(sorted(TEXTS)))
    lines = TEXTS[stack].splitlines()
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["cut", "dup", "indent", "dedent", "splice", "alias", "anchor", "truncate"]))
        if action == "cut":
            del lines[i]
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "indent":
            lines[i] = "  " + lines[i]
        elif action == "dedent":
            lines[i] = lines[i][2:]
        elif action == "splice":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.sampled_from(["'", '"', ":", "- ", "{", "]", "&x ", "*x", "!!int ",
                                                              "!!binary ", "#", "\t", "? ", "|", ">"])) + lines[i][at:]
        elif action == "alias":
            lines[i] = lines[i] + " *anchor"
        elif action == "anchor":
            lines[i] = lines[i].replace(": ", ": &anchor ", 1)
        elif action == "truncate":
            lines = lines[:i]
    return stack, "\n".join(lines) + "\n"


def _plan_text(stack: str, text: str) -> tuple[int, list[str]]:
    """What `plan` does with a stack file's text: (exit code, problem keys). Its speed: bench/plan_scale.py."""
    try:
        document = parse_stack_text(text, f"Pulumi.{stack}.yaml")
        build_plan(stack, parse_config(stack, document.values, document.positions))
        code, keys = 0, []
    except ConfigError as exc:
        code, keys = 2, [p.key for p in exc.problems]
        assert all(p.message for p in exc.problems)
    return code, keys


def _is_config_key(key: str, text: str) -> bool:
    """A key a problem may name: the file itself, a raw key written in the file, or a path of the schema."""
    if key.startswith("<") or ":" in key or key in ("config", "nodes") or f"\n{key}:" in f"\n{text}":
        return True
    parts = [int(p) if p.isdigit() else p for p in key.split(".")]
    known = field_at(tuple(parts))[0] is not None
    unknown_under_known = len(parts) == 1 or field_at(tuple(parts[:-1]))[0] is not None
    return known or unknown_under_known


FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)


@FUZZ
@given(mutated_documents())
def test_mutated_values_give_a_plan_or_named_problems(case: tuple[str, str]) -> None:
    stack, text = case
    code, keys = _plan_text(stack, text)
    assert code in (0, 2)
    assert all(_is_config_key(k, text) for k in keys), keys


@FUZZ
@given(mangled_texts())
def test_mangled_yaml_gives_a_plan_or_named_problems(case: tuple[str, str]) -> None:
    stack, text = case
    code, keys = _plan_text(stack, text)
    assert code in (0, 2)
    assert all(_is_config_key(k, text) for k in keys), keys


@settings(max_examples=300, deadline=None, derandomize=True)
@given(key=st.sampled_from(["serving.port", "parallelism.tensor", "nodes.0.ssh.host", "vision", "image",
                            "serving.extra_args", "container.env.X", "nodes.5.name", "a..b", "", "fabric"]),
       raw=st.text(max_size=40))
def test_any_set_override_exits_0_or_2(key: str, raw: str) -> None:
    """`--set KEY=VALUE` through the real CLI entry point: any text is a value or a clear error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["plan", "prod", "--json", "--set", f"{key}={raw}"])
    assert code in (0, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
