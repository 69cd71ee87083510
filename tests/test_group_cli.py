"""`restart-group` (dry run), `drift`, `supervisor-unit`: the commands as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from heal.group import group_of, restart_steps
from heal.node_access import NODE_MAP_ENV, SshAccess
from stacks.model.loader import parse_config
from tests.conftest import ROOT, plan_of
from tests.docker_harness import build_image, docker_ready, remove_image
from tests.nginx_harness import make_certificate

ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def stacks(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def test_restart_group_dry_run_prints_the_steps_in_order_and_touches_nothing(h20_values: dict[str, Any]) -> None:
    plan = plan_of(h20_values, "h20")
    # a node map whose Docker engine does not exist: any attempt to reach a node would fail the command
    unreachable = json.dumps({n.name: {"docker_host": "unix:///nonexistent/docker.sock"} for n in plan.nodes})
    out = stacks("restart-group", "h20", env={NODE_MAP_ENV: unreachable})
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines() if line[:4].strip().rstrip(".").isdigit()]
    actions = [(words[1], words[2]) for words in lines]
    order = plan.start_order
    assert actions == ([("stop", n) for n in reversed(order)] + [("clean", n) for n in order]
                       + [("start", n) for n in order] + [("wait", "(group)"), ("check", "(group)")])
    assert "dry run: nothing was touched" in out.stdout
    group = group_of(plan)
    assert [s.action for s in restart_steps(group)] == [a for a, _ in actions]
    assert str(group.ready_timeout_s) in out.stdout and group.ready_timeout_s > plan.model["estimated_load_s"]


def test_ssh_access_uses_the_stacks_pinned_host_key(h20_values: dict[str, Any]) -> None:
    for node in h20_values["nodes"]:
        node["ssh"]["host_key"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHxlGNKWsmA3dJTlkDcQ4pIsvxpaAO6gG0Ri6L5D9KBo"
    config = parse_config("h20", h20_values)
    argv = SshAccess("h20", config)._ssh(config.nodes[1].name)
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=~/.ssh/vllm-cluster/known_hosts.h20" in argv
    assert f"HostKeyAlias={config.nodes[1].name}.h20.vllm-cluster" in argv and argv[-2:] == [config.nodes[1].ssh.host,
                                                                                              "--"]


def test_supervisor_unit_passes_systemd_analyze(tmp_path: Path, textfile_dir: Path) -> None:
    out = stacks("supervisor-unit", "h20", "--python", sys.executable, "--user", "root", "--metrics-file",
                 str(textfile_dir / "vllm-h20.prom"))
    assert out.returncode == 0, out.stderr
    path = tmp_path / "vllm-cluster-supervisor-h20.service"
    path.write_text(out.stdout)
    verified = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stderr
    assert f"ExecStart={sys.executable} -m stacks supervise h20 --metrics-file {textfile_dir}/vllm-h20.prom" \
        in out.stdout
    assert "RestartPreventExitStatus=2 3" in out.stdout
    broken = tmp_path / "vllm-cluster-supervisor-broken.service"
    broken.write_text(out.stdout.replace("ExecStart=" + sys.executable, "ExecStart=venv/bin/python"))
    verified = subprocess.run([ANALYZE, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert verified.returncode != 0 and "absolute" in verified.stderr, verified.stderr
    bad = stacks("supervisor-unit", "h20", "--python", "venv/bin/python")
    assert bad.returncode == 2 and "--python 'venv/bin/python' must be an absolute path" in bad.stderr


@pytest.mark.parametrize(("address", "flag"), [("10.30.8.7", "--metrics-listen 10.30.8.7:9465"),
                                             ("fd00::7", '--metrics-listen "[fd00::7]:9465"')])
def test_the_unit_with_its_metrics_listener_passes_systemd_analyze(address: str, flag: str, tmp_path: Path) -> None:
    out = stacks("supervisor-unit", "h20", "--python", sys.executable, "--user", "root", "--set",
                 "observability.enabled=true", "--assume-secret", "grafana_admin_password", "--set",
                 f"observability.supervisor_address={address}")
    assert out.returncode == 0, out.stderr
    assert f"ExecStart={sys.executable} -m stacks supervise h20 {flag}\n" in out.stdout
    path = tmp_path / "vllm-cluster-supervisor-h20.service"
    path.write_text(out.stdout)
    verified = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stderr


def test_drift_cannot_run_is_exit_2_with_the_node(h20_values: dict[str, Any]) -> None:
    plan = plan_of(h20_values, "h20")
    unreachable = json.dumps({n.name: {"docker_host": "unix:///nonexistent/docker.sock"} for n in plan.nodes})
    out = stacks("drift", "h20", env={NODE_MAP_ENV: unreachable})
    assert out.returncode == 2 and f"node {plan.start_order[0]}" in out.stderr and "cannot run" in out.stderr


def test_drift_over_the_node_map_names_the_differences(h20_values: dict[str, Any], tmp_path: Path) -> None:
    """Both nodes are local containers that are not what the plan created: exit 1 and a row per node."""
    why = docker_ready()
    if why:
        pytest.fail(why)
    plan = plan_of(h20_values, "h20")
    tag = uuid.uuid4().hex[:8]
    image = build_image(f"heal-cli-{tag}:1", tmp_path, with_vllm=False)
    names = {n.name: f"heal-cli-{tag}-{n.name}" for n in plan.nodes}
    try:
        for name in names.values():
            subprocess.run(["docker", "create", "--name", name, image, "python3", "-c", "pass"], check=True,
                           capture_output=True, timeout=120)
        mapping = {node: {"docker_host": "unix:///var/run/docker.sock", "container": name}
                   for node, name in names.items()}
        out = stacks("drift", "h20", "--json", env={NODE_MAP_ENV: json.dumps(mapping)})
        assert out.returncode == 1, out.stderr
        rows = json.loads(out.stdout)
        for node, name in names.items():
            kinds = {r["kind"] for r in rows if r["node"] == node and r["container"] == name}
            assert {"image", "command", "env", "labels", "mounts", "gpus"} <= kinds, (node, kinds)
    finally:
        for name in names.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        remove_image(image)


def test_bad_flags_and_a_bad_node_map_exit_2_before_anything_runs() -> None:
    out = stacks("supervise", "h20", "--hang-s", "0")
    assert out.returncode == 2 and "--hang-s 0.0: must be at least 0.1" in out.stderr and "Traceback" not in out.stderr
    out = stacks("drift", "h20", env={NODE_MAP_ENV: '{"h20-1": "not an object"}'})
    assert out.returncode == 2 and NODE_MAP_ENV in out.stderr and "Traceback" not in out.stderr
    out = stacks("restart-group", "nosuchstack")
    assert out.returncode == 2 and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["restart-group", "supervise"])
def test_a_ca_file_that_is_no_certificate_is_exit_2_before_anything_runs(command: str, tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    for path in (str(not_pem), str(tmp_path / "absent.pem")):
        # a node map whose engine does not exist: reaching a node would be a different error
        out = stacks(command, "h20", "--yes" if command == "restart-group" else "--hang-s=60", "--ca-file", path,
                     env={NODE_MAP_ENV: json.dumps({"h20-1": {"docker_host": "unix:///nonexistent/docker.sock"}})})
        assert out.returncode == 2 and f"--ca-file {path!r}: " in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "restart:" not in out.stdout


def test_supervise_refuses_a_bad_golden_metrics_url_or_age() -> None:
    out = stacks("supervise", "h20", "--golden-metrics-url", "http://user:pw@10.0.0.9:9464/metrics")
    assert out.returncode == 2 and "--golden-metrics-url" in out.stderr and "Traceback" not in out.stderr
    assert "pw" not in out.stderr and "user" not in out.stderr
    out = stacks("supervise", "h20", "--golden-max-age-s", "inf")
    assert out.returncode == 2 and "--golden-max-age-s inf: must be more than 0" in out.stderr


def test_restart_group_checks_its_ca_file_before_yes_acts(tmp_path: Path, h20_values: dict[str, Any]) -> None:
    """A wrong `--ca-file` would let the restart stop the old group and then fail every health probe: it is
    refused first (exit 2 naming the flag and the file), with or without `--yes`; a real PEM certificate passes."""
    plan = plan_of(h20_values, "h20")
    unreachable = json.dumps({n.name: {"docker_host": "unix:///nonexistent/docker.sock"} for n in plan.nodes})
    (tmp_path / "key.txt").write_text("not a certificate\n")
    cases = {str(tmp_path / "missing.pem"): "no such file", str(tmp_path): "a directory, not a file",
             str(tmp_path / "key.txt"): "not a PEM certificate"}
    for path, why in cases.items():
        for extra in ([], ["--yes"]):
            out = stacks("restart-group", "h20", "--ca-file", path, *extra, env={NODE_MAP_ENV: unreachable})
            assert out.returncode == 2, out.stdout + out.stderr
            assert f"--ca-file {path!r}: {why}" in out.stderr and "Traceback" not in out.stderr, out.stderr
            assert "stop" not in out.stdout  # not even the dry run's steps: nothing was read from the stack
    good = make_certificate(tmp_path)
    out = stacks("restart-group", "h20", "--ca-file", str(good.cert), env={NODE_MAP_ENV: unreachable})
    assert out.returncode == 0 and "dry run: nothing was touched" in out.stdout, out.stderr
