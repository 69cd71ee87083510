"""The systemd unit for `checks.api --watch`: systemd's own parser accepts it, and its command really runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from heal.watch_unit import render_watch_unit, systemd_quote, unit_name, watch_argv
from stacks.model.golden import GoldenPair
from stacks.planner.topology import dp_rank_nodes
from tests.conftest import ROOT, plan_of
from tests.test_check_api import standin

ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"  # Debian systemd, from `make services`
NASTY = [GoldenPair(prompt="17*19等于多少？只返回数字。", expect="323"),
         GoldenPair(prompt='say "100% $HOME" \\ back\nslash', expect=r"^3\d3$")]


def unquote_exec(line: str) -> list[str]:
    """ExecStart words as systemd.service(5) reads them: quotes, C escapes, then `%%` and `$$`."""
    words, word, quoted, i, started = [], "", False, 0, False
    escapes = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}
    while i < len(line):
        char = line[i]
        if quoted and char == "\\":
            word += escapes[line[i + 1]]
            i += 2
            continue
        if char == '"':
            quoted, started = not quoted, True
        elif char == " " and not quoted:
            if started:
                words.append(word)
            word, started = "", False
        else:
            word, started = word + char, True
        i += 1
    if started:
        words.append(word)
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def unit(tmp_path: Path, url: str = "https://llm.example:443", **kwargs: object) -> str:
    args: dict[str, object] = dict(stack="prod", python=sys.executable, workdir=str(ROOT), url=url,
                                   served_name="DeepSeek-V4.1-Flash", dp_size=2, rank_nodes=["node1", "node2"],
                                   golden=NASTY, env_file="/etc/vllm-cluster/prod-watch.env",
                                   ca_file="/etc/vllm-cluster/prod-ca.pem")
    args.update(kwargs)
    return render_watch_unit(**args)  # type: ignore[arg-type]


def test_systemd_analyze_verifies_the_unit_and_catches_a_broken_one(tmp_path: Path) -> None:
    path = tmp_path / unit_name("prod")
    path.write_text(unit(tmp_path))
    out = subprocess.run([str(ANALYZE), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "escape" not in out.stderr and "quot" not in out.stderr, out.stderr
    broken = tmp_path / "vllm-cluster-watch-broken.service"  # a raw `\d` and an unbalanced quote, unescaped
    broken.write_text(path.read_text().replace(r"\\d", r"\d").replace('\\"100', '"100'))
    out = subprocess.run([str(ANALYZE), "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and ("Unbalanced quoting" in out.stderr or "escape" in out.stderr), out.stderr


def test_the_units_command_is_the_watch_argv_and_runs(tmp_path: Path) -> None:
    with standin("--dp-size", "2") as url:
        text = unit(tmp_path, url=url, ca_file=None, golden=[NASTY[0]])
        exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
        argv = unquote_exec(exec_line.removeprefix("ExecStart="))
        assert argv == watch_argv(python=sys.executable, url=url, served_name="DeepSeek-V4.1-Flash", dp_size=2,
                                  rank_nodes=["node1", "node2"], golden=[NASTY[0]], name="api-watch-prod")
        out = subprocess.run([*argv, "--max-iterations", "1"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WATCH api-watch-prod: 2 target(s) (rank 0 (node1), rank 1 (node2))" in out.stdout
    assert "FIRST api-watch-prod: 2 of 2 target(s) answer the golden set" in out.stdout


def test_tricky_words_survive_quoting(tmp_path: Path) -> None:
    text = unit(tmp_path)
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    argv = unquote_exec(exec_line.removeprefix("ExecStart="))
    golden = argv[argv.index("--golden-json") + 1]
    assert '"say \\"100% $HOME\\" \\\\ back\\nslash"' in golden  # JSON text, restored exactly
    assert "$$HOME" in exec_line and "100%%" in exec_line
    assert "EnvironmentFile=/etc/vllm-cluster/prod-watch.env" in text and "RestartPreventExitStatus=2" in text
    assert "VLLM_API_KEY=" not in text  # the key lives in the environment file only
    assert systemd_quote("node1,node2") == "node1,node2" and systemd_quote("a b") == '"a b"'


def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one node name per rank"):
        unit(tmp_path, rank_nodes=["node1"])
    with pytest.raises(ValueError, match="must be an absolute path"):
        unit(tmp_path, workdir="repo")
    with pytest.raises(ValueError, match="cannot name a unit"):
        unit(tmp_path, stack="prod/../x")
    with pytest.raises(ValueError, match="a POSIX user name"):  # a newline would add a line to the unit
        unit(tmp_path, user="root\nExecStartPre=/bin/touch /tmp/pwned")
    with pytest.raises(ValueError, match="tab, control character"):
        unit(tmp_path, env_file="/etc/x\nExecStartPre=/bin/true")


def test_the_cli_refuses_a_user_that_adds_a_line() -> None:
    out = subprocess.run([sys.executable, "-m", "stacks", "watch-unit", "h20", "--user",
                          "root\nExecStartPre=/bin/touch /tmp/pwned"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "a POSIX user name" in out.stderr and out.stdout == ""


def test_rank_nodes_from_the_plan(prod_values: dict[str, Any], h20_values: dict[str, Any]) -> None:
    prod = plan_of(prod_values, "prod")
    assert dp_rank_nodes([(n.name, n.dp_ranks) for n in prod.nodes]) == (2, ["node1", "node2"])
    h20 = plan_of(h20_values, "h20")
    assert dp_rank_nodes([(n.name, n.dp_ranks) for n in h20.nodes]) == (1, [])
    assert dp_rank_nodes([("a", [0, 1]), ("b", [2, 3])]) == (4, ["a", "a", "b", "b"])
    with pytest.raises(ValueError, match=r"not 0\.\.2"):
        dp_rank_nodes([("a", [0, 1]), ("b", [3])])
