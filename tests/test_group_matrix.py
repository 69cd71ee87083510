"""The replacement matrix of a stack with groups (review/group_matrix.py), computed over the prefill/decode example:
every key changed alone, the real program under Pulumi's mocks before and after. What it must show: a decode-only
change replaces only the decode group (and a prefill-only one only the prefill group), a change to what both tiers
share replaces both, a router setting restarts the router alone, and `stacks diff` names the same groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from review.cli import GROUP_MATRIX_BEGIN, GROUP_MATRIX_END, MATRIX_PAGE, grouped_examples
from review.config_mutations import leaves
from review.group_matrix import _CELL, _STRENGTH, GroupRow, effect, group_markdown, group_rows, verdict
from review.matrix import RegisterError
from review.registrations import register
from review.replacement import CONTAINER, Registration
from stacks.model.config import SECRET_KEYS, SECRET_OBJECT_KEYS
from stacks.model.loader import parse_config
from stacks.model.stack_file import parse_stack_text
from stacks.planner.container_spec import GENERATION_LABEL
from stacks.planner.stack_plan import StackPlan, build_stack
from tests.conftest import ROOT
from tests.test_groups import fronted, lab

EXAMPLE = ROOT / "examples" / "Pulumi.pd.yaml"


@pytest.fixture(scope="module")
def rows() -> list[GroupRow]:
    return group_rows("pd", parse_stack_text(EXAMPLE.read_text(), EXAMPLE.name).values, register)


def row(rows: list[GroupRow], key: str) -> GroupRow:
    return next(r for r in rows if r.key == key)


def test_no_row_replaces_part_of_a_group(rows: list[GroupRow]) -> None:
    assert len([r for r in rows if r.refused is None]) > 100
    assert not [r.key for r in rows if "partial" in r.groups.values()]


def test_a_decode_only_change_replaces_only_the_decode_group_and_a_prefill_only_change_only_the_prefill(
        rows: list[GroupRow]) -> None:
    for key in ("groups[decode].parallelism.all2all_backend", "groups[decode].parallelism.expert_placement",
                "nodes[].nics (a node of decode)"):
        found = row(rows, key)
        assert found.groups == {"prefill": "", "decode": "replaced"}, (key, found)
        assert found.router == "" and found.front_door == "", (key, found)
        assert "every decode group restarts" in found.downtime and "prefill keeps running" in found.downtime
    # the stack's own parallelism is the prefill group's (the decode group declares its own)
    for key in ("parallelism.all2all_backend", "nodes[].nics (a node of prefill)"):
        found = row(rows, key)
        assert found.groups == {"prefill": "replaced", "decode": ""}, (key, found)
        assert found.router == "", (key, found)


def test_what_both_tiers_share_replaces_both(rows: list[GroupRow]) -> None:
    for key in ("model.served_name", "serving.max_model_len", "serving.kv_cache_dtype",
                "disaggregation.connector", "disaggregation.load_failure_policy"):
        found = row(rows, key)
        assert found.groups == {"prefill": "replaced", "decode": "replaced"}, (key, found)
        assert "every decode and every prefill group restarts" in found.downtime
    image = row(rows, "image.digest")  # the router runs on the vLLM image's Python: it restarts too
    assert image.groups == {"prefill": "replaced", "decode": "replaced"} and image.router == "replaced"


def test_router_settings_restart_the_router_alone(rows: list[GroupRow]) -> None:
    for key in ("disaggregation.router.policy", "disaggregation.router.request_timeout_s"):
        found = row(rows, key)
        assert found.groups == {"prefill": "", "decode": ""} and found.router == "replaced", (key, found)
        assert found.downtime.startswith("seconds: the router restarts")
    assert row(rows, "container.restart").groups == {"prefill": "updated", "decode": "updated"}


def test_stacks_diff_names_the_same_groups(rows: list[GroupRow]) -> None:
    """`stacks diff` reads the same restarts from the two plans (a secret's row excepted: no plan shows it)."""
    secret = set(SECRET_KEYS) | set(SECRET_OBJECT_KEYS)
    wrong = [(r.key, r.diff_groups, r.groups) for r in rows if r.refused is None and r.key not in secret
             and set(r.diff_groups) != {g for g, s in r.groups.items() if s == "replaced"}]
    assert not wrong


def test_the_docs_print_the_group_matrix(rows: list[GroupRow]) -> None:
    page = (ROOT / MATRIX_PAGE).read_text()
    start, end = page.index(GROUP_MATRIX_BEGIN) + len(GROUP_MATRIX_BEGIN), page.index(GROUP_MATRIX_END)
    assert page[start:end].strip() == group_markdown(rows).strip(), \
        "stale: run `python -m stacks matrix --update-docs`"
    assert list(grouped_examples(ROOT)) == ["pd"]


def _engine(name: str) -> Registration:
    return Registration(CONTAINER, name, {"image": "i", "labels": [{"label": GENERATION_LABEL, "value": "g"}]})


def test_part_of_a_group_replaced_is_a_lone_rank_restart() -> None:
    """The rule the first test relies on can fail: one of a group's two engines replaced is `partial`."""
    names = {"engine-decode-gpu3-x": "decode", "engine-decode-gpu4-x": "decode", "engine-prefill-gpu1-x": "prefill"}
    base = [_engine(n) for n in names]
    moved = Registration(CONTAINER, "engine-decode-gpu4-x",
                         {"image": "j", "labels": [{"label": GENERATION_LABEL, "value": "g"}]})
    found = effect(base, [*base[:1], moved, base[2]], names)
    assert found.groups == {"decode": "partial", "prefill": ""}
    row_ = GroupRow("pd", "k", "c", None, groups=found.groups, roles={"decode": "replica", "prefill": "replica"})
    # a partial group is said before anything of the stack's plan is read
    assert verdict(row_, cast(StackPlan, None), {})[0].startswith("LONE-RANK RESTART: part of group decode")


def test_a_rolling_change_still_says_what_happens_to_the_front_door() -> None:
    """Replica groups that roll: a change that also restarts the front door says so; one that removes it is no
    roll behind it (a review found both said "none for the endpoint")."""
    whole = build_stack("t", parse_config("t", fronted(lab())))
    assert whole.rolling.can_roll
    row_ = GroupRow("t", "k", "c", None, groups={"a": "replaced", "b": "replaced"},
                    roles={"a": "replica", "b": "replica"}, front_door="replaced")
    said, seconds = verdict(row_, whole, {"a": 100, "b": 90})
    assert said.startswith("none for the endpoint: a, b roll one at a time") and seconds == 100
    assert "the front door restarts (seconds of refused connections)" in said
    row_.front_door = "deleted"
    said, _ = verdict(row_, whole, {"a": 100, "b": 90})
    assert not said.startswith("none") and "the front door is removed: clients lose the endpoint" in said
    row_.downtime, row_.router = said, "created"  # every state effect() gives has a table cell
    assert "| created | **removed** |" in group_markdown([row_])
    assert set(_CELL) == set(_STRENGTH)


def test_one_of_two_decode_groups_restarting_fails_the_requests_sent_to_it() -> None:
    row_ = GroupRow("pd", "k", "c", None, groups={"p": "", "d1": "", "d2": "replaced"},
                    roles={"p": "prefill", "d1": "decode", "d2": "decode"})
    said, _ = verdict(row_, cast(StackPlan, None), {"d2": 60})
    assert said.startswith("d2 restarts (about 1 min 0 s): the requests the router sends to it fail meanwhile")


def test_a_change_the_program_refuses_is_a_row_not_an_abort() -> None:
    """The program refusing one mutated config makes that key's row say so; the rest of the matrix goes on."""
    values = parse_stack_text(EXAMPLE.read_text(), EXAMPLE.name).values
    calls = 0

    def flaky(stack: str, v: dict[str, Any], s: dict[str, Any]) -> list[Registration]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RegisterError("refused for this test")
        return register(stack, v, s)

    keys = [leaf for leaf in leaves() if leaf.key in ("serving.max_model_len", "disaggregation.router.policy")]
    found = group_rows("pd", values, flaky, keys)
    assert [r.refused for r in found] == ["the program refuses it: refused for this test"] * 2


def test_a_value_equal_in_effect_to_the_current_one_is_skipped() -> None:
    """Two replica groups of Qwen3-8B: `serving.kv_cache_dtype` unset and `auto` plan and register alike, so the
    row reports the first value that changes something, not a free change (a review found "none" rows that were
    only a default spelled out)."""
    keys = [leaf for leaf in leaves() if leaf.key == "serving.kv_cache_dtype"]
    (found,) = group_rows("t", fronted(lab()), register, keys)
    assert found.refused is None and not found.change.endswith("→ auto"), found
    assert found.groups == {"a": "replaced", "b": "replaced"}, found


def test_engine_names_of_no_planned_group_are_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="no planned group"):
        effect([_engine("engine-x")], [], {})


def test_only_example_files_with_groups_get_the_table(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "Pulumi.one.yaml").write_text("config:\n  vllm-cluster:image: a\n")
    (tmp_path / "examples" / "Pulumi.two.yaml").write_text(
        "config:\n  vllm-cluster:groups: [{name: a, nodes: [n]}]\n")
    assert list(grouped_examples(tmp_path)) == ["two"]
