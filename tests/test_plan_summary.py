"""`python -m stacks plan` starts with a summary of at most 25 lines, whatever the node count; the full plan
follows after a separator; `--summary` prints the summary alone; `--json` carries the same figures."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from typing import Any

import pytest

from bench.plan_scale import scaled
from stacks.model.errors import ConfigError
from stacks.model.loader import load_stack, parse_config, read_stack_values
from stacks.planner.plan import Plan, build_plan
from stacks.planner.render import SEPARATOR, SUMMARY_MAX_LINES, render_plan, render_summary
from tests.conftest import ROOT

OFFLOAD = ["--engram-config", '{"cpu_offload": true}']


def _plan(stack: str, values: dict[str, Any] | None = None) -> Plan:
    return build_plan(stack, load_stack(stack) if values is None else parse_config(stack, values))


def _offloaded() -> dict[str, Any]:
    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"]["extra_args"] = [*values["serving"].get("extra_args", []), *OFFLOAD]
    return values


def _memory_note(plan: Plan) -> re.Match[str]:
    """The validation's own memory note (written independently of the summary)."""
    note = next(n for n in plan.notes if n.startswith("memory per GPU of "))
    found = re.search(r"= (?P<budget>[\d.]+) GB\): weights .*= (?P<weights>[\d.]+) GB; .*total (?P<total>[\d.]+) GB; "
                      r"(?P<left>[\d.]+) GB left", note)
    assert found, note
    return found


@pytest.mark.parametrize("stack,values", [("prod", None), ("h20", None), ("prod", "offload"), ("prod", 128)],
                         ids=["prod", "h20", "prod-engram-offload", "prod-128-nodes"])
def test_summary_fits_and_states_the_memory_model(stack: str, values: Any) -> None:
    given = scaled(128) if values == 128 else _offloaded() if values == "offload" else None
    plan = _plan(stack, given)
    summary = render_summary(plan)
    assert len(summary) <= SUMMARY_MAX_LINES, "\n".join(summary)
    text = "\n".join(summary)
    note = _memory_note(plan)
    assert f"memory per GPU: {note['total']} of {note['budget']} GB" in text
    assert f"{note['left']} GB left" in text and f"weights {note['weights']} " in text
    assert f"warnings ({len(plan.warnings)})" in text and f"checks ({len(plan.checks)})" in text
    kinds = sum(int(m.group(1) or 1) for m in re.finditer(r"[a-z-]+(?: x(\d+))?(?:,|$)", text.split("checks (")[1]
                                                         .split("): ", 1)[1].replace("\n   ", " ")))
    assert kinds == len(plan.checks), "every check counted once under its kind"
    full = render_plan(plan)
    assert full.startswith(text + "\n\n" + SEPARATOR)


def test_128_nodes_collapse_to_runs_of_one_role() -> None:
    plan = _plan("prod", scaled(128))
    text = "\n".join(render_summary(plan))
    assert re.search(r"node1 \(10\.30\.0\.1\)\s+dp-head\s+8 GPUs  DP rank 0$", text, re.M), text
    assert re.search(r"node2\.\.node128 \(127 nodes\)\s+headless-engine\s+1016 GPUs  DP ranks 1-127$", text, re.M), text
    assert "on 128 node(s), 1024 GPUs" in text


def test_engram_offload_shows_pinned_host_ram_per_node() -> None:
    plan = _plan("prod", _offloaded())
    note = next(n for n in plan.notes if n.startswith("Engram tables: "))
    gb = re.match(r"Engram tables: (\d+) GB of pinned host memory per node", note)
    assert gb, note
    text = "\n".join(render_summary(plan))
    assert f"host RAM: {gb[1]} GB pinned per node for Engram tables" in text
    assert "host RAM: no pinned tables (Engram tables in GPU memory)" in "\n".join(render_summary(_plan("prod")))


def test_cli_prints_summary_first_and_json_carries_it() -> None:
    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", *args], cwd=ROOT, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    whole, alone = run(), run("--summary")
    assert whole.startswith(alone.split("   (+")[0])
    assert "without --summary" in alone and SEPARATOR in whole
    assert len(alone.splitlines()) <= SUMMARY_MAX_LINES
    assert "listening ports" in whole and "listening ports" not in alone
    data = json.loads(run("--json"))
    assert data["summary"]["memory"] == _plan("prod").summary.memory.model_dump()
    assert data["summary"]["roles"] == {"dp-head": ["node1"], "headless-engine": ["node2"]}
    assert sum(data["summary"]["checks_by_kind"].values()) == len(data["checks"])


def test_summary_warnings_are_cut_after_a_whole_word() -> None:
    """A warning too long for its line ends after a whole word and an ellipsis: a word cut in two reads as
    another word."""
    plan = build_plan("three-node", load_stack("three-node", root=EXAMPLES, assume_secret=EXAMPLE_SECRETS))
    shown = [line.removeprefix("   - ") for line in render_summary(plan) if line.startswith("   - ")]
    cut = [line for line in shown if line.endswith("…")]
    assert cut, shown
    for line in cut:
        full = next(" ".join(w.split()) for w in plan.warnings if " ".join(w.split()).startswith(line[:-1]))
        assert full[len(line) - 1:][:1] in (" ", ",", ";", ":", "("), (line, full[len(line) - 1:][:20])


EXAMPLES = ROOT / "examples"
EXAMPLE_SECRETS = ("api_key", "proxy_keys.team-a", "tls_certificate", "tls_private_key")


def test_the_missing_secrets_hint_names_keys_that_plan() -> None:
    """The hint under missing secrets names each one, in the flag form and in make's SECRETS= form, and the keys
    it names are accepted as written (the client key as proxy_keys.team-a, not bare proxy_keys)."""
    with pytest.raises(ConfigError) as refused:
        build_plan("three-node", load_stack("three-node", root=EXAMPLES))
    hint = refused.value.report().splitlines()[-1]
    secrets = re.search(r'SECRETS="([^"]+)"', hint)
    assert secrets and sorted(secrets[1].split()) == sorted(EXAMPLE_SECRETS), hint
    assert all(f"--assume-secret {k}" in hint for k in EXAMPLE_SECRETS)
    assert build_plan("three-node", load_stack("three-node", root=EXAMPLES, assume_secret=secrets[1].split())).nodes


def test_the_secrets_hint_offers_only_what_assume_secret_can_fill() -> None:
    """A secret held in plain text is no missing secret: no hint for it (--assume-secret would not cure it); the
    client key is offered by the check client's name when one is set."""
    values = read_stack_values("three-node", EXAMPLES)
    values["api"]["proxy"] = values["api"]["proxy"] | {"check_client": "ops"}
    with pytest.raises(ConfigError) as refused:
        build_plan("three-node", parse_config("three-node", values))
    hint = refused.value.report().splitlines()[-1]
    assert "proxy_keys.ops" in hint and "team-a" not in hint, hint
    secrets = re.search(r'SECRETS="([^"]+)"', hint)
    assert secrets
    assert build_plan("three-node", load_stack("three-node", root=EXAMPLES, overrides=["api.proxy.check_client=ops"],
                                               assume_secret=secrets[1].split())).nodes
    plain = read_stack_values("three-node", EXAMPLES) | {"api_key": "sk-" + "a" * 40}
    with pytest.raises(ConfigError) as refused:
        parse_config("three-node", plain)
    assert "--assume-secret api_key" not in refused.value.report()


def test_cut_lines_keep_an_ipv6_address_whole_and_only_nccl_names_get_the_exact_note() -> None:
    from stacks.planner.render import _cut

    assert _cut("bind to fd00:40:: and then more words here", 22) == "bind to fd00:40::…"
    values = read_stack_values("prod")
    values["container"] = values.get("container", {}) | {"env": {"MY_FLAG": "=on"}}
    text = render_plan(build_plan("prod", parse_config("prod", values)))
    assert "env MY_FLAG==on\n" in text
    assert all("not a prefix" in line for line in text.splitlines() if line.startswith("   env NCCL_IB_HCA=="))
