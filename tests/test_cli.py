"""`python -m stacks plan`: real subprocesses, exit codes, JSON keys, overrides and secrets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stacks.model.field_types import SECRET
from stacks.model.loader import apply_overrides
from stacks.model.stack_file import parse_stack_text
from tests.conftest import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_plan_json_has_the_documented_keys() -> None:
    out = _run("plan", "prod", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    for key in ("stack", "image", "topology", "start_order", "nodes", "warnings"):
        assert key in plan
    assert set(plan["topology"]) >= {"backend", "nodes", "gpus_per_node", "tensor", "pipeline", "data", "expert"}
    node = plan["nodes"][0]
    assert set(node) >= {"name", "host", "role", "containers"}
    assert set(node["containers"][0]) >= {
        "name", "purpose", "image", "vllm_args", "command", "entrypoint", "env", "network_mode", "ipc_mode",
        "privileged", "gpus", "ulimits", "shm_size_mb", "volumes", "devices", "restart", "labels"}


def test_plan_text() -> None:  # its speed: bench/plan_scale.py
    out = _run("plan", "h20")
    assert out.returncode == 0
    assert "start order: h20-1 -> h20-2" in out.stdout and "ray-cluster" in out.stdout


def test_invalid_override_exits_2_with_all_errors() -> None:
    out = _run("plan", "prod", "--set", "parallelism.tensor=16", "--set", "parallelism.data=1")
    assert out.returncode == 2
    assert "vllm-cluster:parallelism.tensor = 16" in out.stderr
    assert "ZeroDivisionError" in out.stderr and "Engram sharding" in out.stderr
    assert "nothing was created" in out.stderr


def test_invalid_json_output() -> None:
    out = _run("plan", "prod", "--json", "--set", "serving.port=13399")
    assert out.returncode == 2
    errors = json.loads(out.stdout)["errors"]
    assert errors[0]["key"] == "vllm-cluster:parallelism.data_parallel_rpc_port"
    assert errors[0]["value"] == 13399 and "same port as serving.port" in errors[0]["message"]


def test_unknown_stack() -> None:
    out = _run("plan", "nope")
    assert out.returncode == 2 and "Pulumi.nope.yaml" in out.stderr


def test_overrides_parse_yaml_scalars_and_indexes() -> None:
    values = {"parallelism": {"tensor": 8, "expert": True}, "nodes": [{"ssh": {"host": "a"}}]}
    out = apply_overrides(values, ["parallelism.tensor=16", "parallelism.expert=false", "nodes.0.ssh.host=b"])
    assert out["parallelism"] == {"tensor": 16, "expert": False}
    assert out["nodes"][0]["ssh"]["host"] == "b"
    assert values["parallelism"]["tensor"] == 8


def test_secure_values_print_as_secret(tmp_path: Path) -> None:
    doc = ("config:\n  vllm-cluster:api_key: {secure: AAABAxyz}\n  other:thing: 1\n"
           "  vllm-cluster:nested: {a: {secure: v}, b: [{secure: x}]}\n")
    assert parse_stack_text(doc, "Pulumi.t.yaml").values == {"api_key": SECRET, "nested": {"a": SECRET, "b": [SECRET]}}
    src = (ROOT / "Pulumi.prod.yaml").read_text()
    (tmp_path / "Pulumi.prod.yaml").write_text(src + '  vllm-cluster:api_key:\n    secure: AAABAGhpZGRlbg==\n')
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--json"], cwd=ROOT, capture_output=True,
                         text=True, env={"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "AAABAGhpZGRlbg" not in out.stdout
    head = json.loads(out.stdout)["nodes"][0]["containers"][0]
    assert head["secret_env"] == {"VLLM_API_KEY": "api_key"} and "VLLM_API_KEY" not in head["env"]


def test_diff_base_cannot_be_read_as_a_git_option(tmp_path: Path) -> None:
    """`--base=--output=FILE` once reached `git archive` as an option and emptied FILE."""
    victim = tmp_path / "v.md"
    victim.write_text("keep me")
    for base in (f"--output={victim}", "--remote=/nonexistent", "HEAD\n--output=x", "no-such-ref"):
        out = _run("diff", "h20", f"--base={base}")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "not a git revision" in out.stderr or "no such commit" in out.stderr, out.stderr
    assert victim.read_text() == "keep me"


def test_a_project_key_outside_config_is_refused(tmp_path: Path) -> None:
    """Pulumi ignores unknown top-level keys of a stack file: `parallelism:` at column 0 would silently not apply."""
    text = (ROOT / "Pulumi.h20.yaml").read_text() + "parallelism:\n  tensor: 4\n"
    (tmp_path / "Pulumi.x.yaml").write_text(text)
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "x"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**__import__("os").environ, "VLLM_CLUSTER_ROOT": str(tmp_path)})
    assert out.returncode == 2 and "top-level key 'parallelism' is not a Pulumi stack file key" in out.stderr


def test_a_closed_stdout_ends_the_plan_with_one_line_on_stderr() -> None:
    """`python -m stacks plan prod --json | head -c 10`: the reader is gone before the plan is written. The broken
    pipe is an exception (SIGPIPE stays ignored: a probe that closed its stdin once killed the process silently);
    it ends the program with 141 and one line on stderr saying the output is cut, no traceback or internal-error
    line (it once ended 141 without a word, so a script could not tell a cut plan from a whole one)."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--json", "--assume-secret", "api_key"],
                              cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    said = [line for line in done.stderr.splitlines() if not line.startswith("# project: ")]  # every plan names it
    assert done.returncode == 141 and len(said) == 1, (done.returncode, done.stderr)
    assert said[0].startswith("python -m stacks plan: stdout was closed") and "cut" in said[0], said


def test_a_set_value_with_a_control_character_is_refused_not_stripped() -> None:
    """`--set $'model.profile=hq\\n'`: YAML dropped the newline and the value was accepted, while the same value in the
    stack file is refused; a control character anywhere in a --set is refused, naming the key and the value."""
    from stacks.model.errors import ConfigError

    for item in ("model.profile=hq\n", "model.profile=h\x1bq", "model.pro\tfile=hq"):
        try:
            apply_overrides({"model": {}}, [item])
        except ConfigError as exc:
            said = exc.report()
        else:
            raise AssertionError(f"{item!r} was accepted")
        assert "--set: holds the control character" in said and "model.pro" in said, said
    assert apply_overrides({"model": {}}, ["model.profile=hq"]) == {"model": {"profile": "hq"}}


def test_a_full_disk_under_stdout_is_said_in_one_line_not_an_internal_error() -> None:
    """`python -m stacks plan prod --json > /dev/full`: the write fails with ENOSPC. It was reported as an internal
    error (exit 3); it is the output that could not be written, said once, exit 1."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--json", "--assume-secret", "api_key"],
                              cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    said = [line for line in done.stderr.splitlines() if not line.startswith("# project: ")]
    assert done.returncode == 1 and len(said) == 1, (done.returncode, done.stderr)
    assert "could not write the output (No space left on device)" in said[0] and "internal error" not in said[0]
