"""A rehearsal (`rehearsal: true`, docs/rehearsal.md): a stack that declares no GPUs plans as its GPU plan with a
REHEARSAL line, registers no GPU on any container, refuses whatever would still hand one to a container, and every
GPU-only check says NOT RUN in its own output while the rest really runs (the collective check with gloo on CPU)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks import deepep_host, preflight
from checks.bundle import heredoc_command
from checks.collective import DEFAULT_MASTER_PORT
from checks.verdict import REHEARSAL
from components.check_commands import dry_run_command, nccl_command, preflight_command
from components.collective_check import REHEARSAL_SIZES, collective_runs
from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan, min_busbw_gbps
from stacks.planner.rehearsal import DEEPEP_NOT_RUN, MIN_BUSBW_GBPS, PREFLIGHT_NOT_RUN
from stacks.planner.render import REHEARSAL_LINE, render_plan
from tests.conftest import ROOT, plan_of
from tests.netns_ranks import Host, star
from tests.pulumi_harness import run_program
from tests.test_policy import violations

EXAMPLES = ROOT / "examples"
PYTHON = str(Path(sys.executable))
SHELL_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(Path.home())}


def lab_values() -> dict[str, Any]:
    return read_stack_values("lab", EXAMPLES)


def stacks_cli(*args: str, root: Path = EXAMPLES) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "VLLM_CLUSTER_ROOT": str(root)})


def problems(values: dict[str, Any]) -> list[Any]:
    try:
        build_plan("lab", parse_config("lab", values))
    except ConfigError as exc:
        return exc.problems
    return []


def shell(command: str, timeout_s: int = 120) -> subprocess.CompletedProcess[str]:
    """A registered command as pulumi-command runs it over SSH: one bash command line."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout_s, env=SHELL_ENV)


# --- the plan ---------------------------------------------------------------------------------------------------

def test_the_lab_example_plans_as_a_rehearsal_with_the_line_first() -> None:
    out = stacks_cli("plan", "lab")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == REHEARSAL_LINE
    assert lines[2] == ("   no container gets a GPU; these print NOT RUN and why: pre-pull, preflight, collective, "
                        "dp-engines")
    assert out.stdout.count(REHEARSAL_LINE) == 2  # the summary's first lines, and the full plan's own section
    assert "   - pre-pull x2: NOT RUN gpu, ownership's GPU processes (nvidia-smi)" in lines
    assert "   - dp-engines x2: NOT RUN the whole check" in lines
    assert out.stdout.count("gpus=None") == 2 and "env CUDA_VISIBLE_DEVICES" not in out.stdout
    assert "GPU model" not in out.stdout  # no "not in the table of known GPUs ... nvidia-smi" warning on pretended GPUs
    plan = json.loads(stacks_cli("plan", "lab", "--json").stdout)
    assert plan["rehearsal"]["pretended_gpus"] == {"lab1": 1, "lab2": 1}
    assert plan["topology"]["label"] == "mp-dp2-tp1-pp1" and plan["start_order"] == ["lab2", "lab1"]
    assert [c["gpus"] for n in plan["nodes"] for c in n["containers"]] == [None, None]
    collective = next(c for c in plan["checks"] if c["name"] == "collective-lab1")
    assert "0.01 Gb/s" in collective["proves"] and "gloo on CPU" in collective["proves"]
    assert "NCCL on GPUs is NOT RUN" in collective["proves"]


def test_a_gpu_stack_has_no_rehearsal_in_its_plan_and_false_changes_nothing(prod_values: dict[str, Any],
                                                                           h20_values: dict[str, Any]) -> None:
    """The GPU stacks plan as before: no `rehearsal` key, no REHEARSAL line, `gpus: all` and CUDA_VISIBLE_DEVICES
    where they were; `rehearsal: false` written out is the same plan as the key left out."""
    for stack, values in (("prod", prod_values), ("h20", h20_values)):
        plan = plan_of(values, stack)
        as_json = plan.to_json_dict()
        assert "rehearsal" not in as_json and "REHEARSAL" not in render_plan(plan)
        assert {c.gpus for n in plan.nodes for c in n.containers} == {"all"}
        assert plan_of({**values, "rehearsal": False}, stack).to_json_dict() == as_json
    assert all("CUDA_VISIBLE_DEVICES" in c.env for n in plan_of(prod_values, "prod").nodes for c in n.containers)


def test_a_review_says_when_a_change_starts_or_ends_a_rehearsal() -> None:
    from review.plan_diff import diff_plans, to_markdown

    gpu = plan_of({**lab_values(), "rehearsal": False}, "lab").to_json_dict()
    rehearsal = plan_of(lab_values(), "lab").to_json_dict()
    assert "- **Rehearsal:** this change makes the stack a rehearsal (rehearsal: true): no node has a GPU" in \
        to_markdown(diff_plans("lab", "base", gpu, rehearsal))
    assert "- **Rehearsal:** this change ends the rehearsal (rehearsal: false)" in \
        to_markdown(diff_plans("lab", "base", rehearsal, gpu))
    assert "rehearsal" not in diff_plans("lab", "base", gpu, gpu) and "Rehearsal" not in to_markdown(
        diff_plans("lab", "base", rehearsal, rehearsal))


def test_the_planner_lists_the_sections_the_checks_skip() -> None:
    assert tuple(preflight.REHEARSAL_NOT_RUN) == PREFLIGHT_NOT_RUN
    assert tuple(deepep_host.REHEARSAL_NOT_RUN) == DEEPEP_NOT_RUN


# --- all or nothing ---------------------------------------------------------------------------------------------

def test_a_mixed_stack_is_refused_with_key_value_and_fix(tmp_path: Path) -> None:
    """A rehearsal that still hands a GPU device to its engine: exit 2, nothing planned, the key, the value (with the
    file position) and what works."""
    text = (EXAMPLES / "Pulumi.lab.yaml").read_text().replace(
        "    name: lab-engine\n", "    name: lab-engine\n    devices: [/dev/nvidia0, /dev/shm]\n")
    assert "/dev/nvidia0" in text
    (tmp_path / "Pulumi.mixed.yaml").write_text(text)
    out = stacks_cli("plan", "mixed", root=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    report = out.stderr
    assert "stack 'mixed': 1 config problem(s), nothing was created" in report
    assert "vllm-cluster:container.devices.0 = '/dev/nvidia0': hands a GPU or RDMA device to the engine container " \
           "on a rehearsal (vllm-cluster:rehearsal: true: no node has a GPU)" in report
    assert "at: Pulumi.mixed.yaml:" in report
    assert "what works: remove it from container.devices for the rehearsal, or rehearsal: false on nodes that " \
           "have the GPUs" in report
    as_json = json.loads(stacks_cli("plan", "mixed", "--json", root=tmp_path).stdout)
    assert as_json["valid"] is False and [e["key"] for e in as_json["errors"]] == ["vllm-cluster:container.devices.0"]


@pytest.mark.parametrize(("change", "key", "value"), [
    ({"image": "vllm/vllm-openai:v0.33.0"}, "image", "vllm/vllm-openai:v0.33.0"),
    ({"parallelism": {"tensor": 1, "data": 2, "backend": "ray"}}, "parallelism.backend", "ray"),
    ({"observability": {"enabled": True}, "grafana_admin_password": "[secret]"}, "observability.enabled", True),
    ({"container": {"name": "lab-engine", "devices": ["/dev/shm", "/dev/infiniband/uverbs0"]}},
     "container.devices.1", "/dev/infiniband/uverbs0"),
], ids=["gpu-image", "ray", "dcgm", "rdma-device"])
def test_what_would_still_need_a_gpu_is_refused(change: dict[str, Any], key: str, value: Any) -> None:
    from stacks.model.field_types import SECRET

    values = {**lab_values(), **{k: (SECRET if v == "[secret]" else v) for k, v in change.items()}}
    found = [p for p in problems(values) if p.key == key]
    assert len(found) == 1, problems(values)
    assert found[0].value == value and "rehearsal" in found[0].message and found[0].fix
    assert "rehearsal: false on nodes that have the GPUs" in found[0].fix
    assert key not in [p.key for p in problems({**values, "rehearsal": False})]  # the rehearsal's rule, not another


def test_unlimited_memlock_on_a_rehearsal_is_warned_of() -> None:
    """The default ulimits ask for unlimited memlock (NCCL's RDMA); a rehearsal runs none, and a Docker engine without
    CAP_SYS_RESOURCE refuses such a container: the example leaves it out, the default gets a warning."""
    assert not [w for w in plan_of(lab_values(), "lab").warnings if "memlock" in w]
    values = {**lab_values(), "container": {"name": "lab-engine"}}
    (warning,) = [w for w in plan_of(values, "lab").warnings if "memlock" in w]
    assert warning.startswith("container.ulimits.memlock [-1, -1] on a rehearsal (rehearsal: true): ")
    assert "leave memlock out of container.ulimits for the rehearsal" in warning


def test_a_node_with_zero_gpus_is_pointed_to_the_rehearsal(prod_values: dict[str, Any]) -> None:
    values = copy.deepcopy(prod_values)
    values["nodes"][1]["gpus"]["count"] = 0
    with pytest.raises(ConfigError) as caught:
        parse_config("prod", values)
    (problem,) = caught.value.problems
    assert (problem.key, problem.value) == ("nodes.1.gpus.count", 0)
    assert problem.fix is not None and "vllm-cluster:rehearsal: true" in problem.fix


# --- the checks themselves, with --rehearsal ----------------------------------------------------------------------

def check(module: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", f"checks.{module}", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, **(env or {})})
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout.strip()


def test_gpu_and_rdma_sections_print_not_run_and_exit_0() -> None:
    code, line = check("preflight", "--name", "preflight-lab1", "--rehearsal", "--sections",
                       "gpu,toolkit,memlock,infiniband,hca,gid")
    assert code == 0 and line.startswith("NOT RUN preflight-lab1: no section ran; ")
    for section in ("gpu", "toolkit", "memlock", "infiniband", "hca", "gid"):
        assert f"NOT RUN {section}: {REHEARSAL}: " in line, section
    code, line = check("deepep_host", "--name", "deepep-host-lab1", "--rehearsal", "--sections", "ibgda,peermem")
    assert code == 0 and line.splitlines()[0].startswith("NOT RUN deepep-host-lab1: no section ran; NOT RUN ibgda: ")
    assert f"NOT RUN peermem: {REHEARSAL}" in line


def test_sections_that_run_on_cpu_still_run_beside_the_not_run_ones(tmp_path: Path) -> None:
    """Ownership runs (docker) without asking nvidia-smi, which is not even called; disk runs; gpu says NOT RUN."""
    called = tmp_path / "nvidia-smi-was-called"
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {called}\necho '0, NVIDIA H100 80GB HBM3, GPU-x, 81559 MiB, "
                                      "550.54, 00000000:00:00.0'\n")
    (tools / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{tools}:{os.environ['PATH']}"}
    args = ["--name", "pre-pull-lab1", "--json", "--sections", "ownership,disk,gpu", "--container-names",
            "lab-engine", "--ports", "8000", "--docker-root", str(tmp_path), "--disk-headroom-gb", "0"]
    code, out = check("preflight", *args, "--rehearsal", env=env)
    verdict = json.loads(out)
    assert not called.exists()
    assert verdict["details"]["gpu"] == {"ok": None, "not_run": f"{REHEARSAL}: {preflight.REHEARSAL_NOT_RUN['gpu']}"}
    assert verdict["details"]["disk"]["ok"] is True
    ownership = verdict["details"]["ownership"]
    assert ownership["ok"] in (True, None), ownership  # None only where this machine's docker does not answer
    if ownership["ok"]:
        assert f"NOT RUN GPU processes: {REHEARSAL}: nvidia-smi is not asked who holds a GPU" in ownership["evidence"]
        assert code == 0 and verdict["status"] == "pass"
    assert verdict["summary"].endswith(f"; NOT RUN gpu: {REHEARSAL}: {preflight.REHEARSAL_NOT_RUN['gpu']}")
    # the same sections on a GPU stack: nvidia-smi answers for the gpu section
    code, out = check("preflight", *args, "--gpus", "1", "--gpu-model", "H100", "--gpu-memory-gb", "80", env=env)
    assert called.exists() and json.loads(out)["details"]["gpu"]["ok"] is True and "NOT RUN" not in out


def test_the_log_checks_print_not_run_and_read_no_log(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-log")  # without --rehearsal: cannot-run, the log is unreadable
    code, line = check("nccl_transport", "--name", "nccl-transport-lab1", "--log-file", missing, "--rehearsal")
    assert code == 0 and line.startswith(f"NOT RUN nccl-transport-lab1: {REHEARSAL}: no engine runs NCCL on GPUs")
    assert check("nccl_transport", "--log-file", missing)[0] == 2
    code, line = check("engines", "--name", "dp-engines-lab2", "--ranks", "1", "--log-file", missing, "--rehearsal")
    assert code == 0 and line.startswith(f"NOT RUN dp-engines-lab2: {REHEARSAL}: no vLLM engine core loads weights")
    assert check("engines", "--ranks", "1", "--log-file", missing)[0] == 2


def test_the_collective_check_refuses_nccl_on_a_rehearsal() -> None:
    code, line = check("collective", "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1",
                       "--rehearsal", "--backend", "nccl")
    assert code == 2 and "--rehearsal with --backend nccl: a stack without GPUs runs --backend gloo" in line


# --- the commands the program builds ----------------------------------------------------------------------------

def roce_rehearsal() -> dict[str, Any]:
    """The lab stack on a RoCE fabric: the fabric preflight and the NCCL transport check are planned; both say NOT
    RUN for what needs RDMA."""
    values = lab_values()
    values["fabric"] = {**values["fabric"], "transport": "roce"}
    for node in values["nodes"]:
        node["hcas"] = ["mlx5_0:1"]
    return values


def test_fabric_and_nccl_commands_print_not_run_when_they_run(tmp_path: Path) -> None:
    values = roce_rehearsal()
    config = parse_config("lab", values)
    plan = build_plan("lab", config)
    checks = {c.name: c for c in plan.checks}
    assert checks["fabric-lab1"].sections == ["infiniband", "hca", "sysctl"]
    assert "nccl-transport-lab1" in checks and "(rehearsal: NOT RUN infiniband, hca)" in checks["fabric-lab1"].proves
    fabric = shell(preflight_command(config, plan, checks["fabric-lab1"]))
    assert f"NOT RUN infiniband: {REHEARSAL}" in fabric.stdout and f"NOT RUN hca: {REHEARSAL}" in fabric.stdout
    # sysctl really ran (this machine has no lab0): the verdict fails on it, not on the sections that did not run
    assert fabric.returncode == 1 and fabric.stdout.startswith("FAIL fabric-lab1: 1 failed: sysctl; NOT RUN ")
    assert "sysctl: lab0: no such interface (/proc/sys/net/ipv4/conf/lab0)" in fabric.stdout
    nccl = shell(nccl_command(config, plan, checks["nccl-transport-lab1"]))
    assert nccl.returncode == 0 and nccl.stdout.startswith(f"NOT RUN nccl-transport-lab1: {REHEARSAL}")


def test_the_program_registers_no_gpu_and_ships_the_rehearsal_flag(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Pulumi's mocks: no container asks for a GPU or gets CUDA_VISIBLE_DEVICES; every command of a check
    with a GPU part carries --rehearsal, and the engine-log checks, run as registered, print their NOT RUN line."""
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    run = run_program("lab", lab_values(), secrets={})
    assert run.error is None, run.error
    containers = run.mocks.of_type("docker:index/container:Container")
    assert [c.name for c in containers] == ["engine-lab2-lab-engine", "engine-lab1-lab-engine"]
    for container in containers:
        assert container.inputs.get("gpus") is None and not container.inputs.get("devices")
        assert not [e for e in container.inputs["envs"] if e.startswith(("CUDA_VISIBLE_DEVICES=", "NVIDIA_"))]
    commands = {r.name: r.inputs["create"] for r in run.mocks.resources if r.typ == "command:remote:Command"}

    def flagged(name: str) -> bool:
        return "--rehearsal" in commands[name].split("<<", 1)[0]

    for node in ("lab1", "lab2"):
        assert all(flagged(n) for n in (f"{node}-pre-pull", f"{node}-preflight", f"collective-{node}",
                                        f"engine-{node}-dp-engines"))
        assert not any(flagged(n) for n in (f"{node}-weights", f"engine-{node}-args-dry-run", f"{node}-firewall"))
        assert "--gpus" not in commands[f"collective-{node}"].split("<<", 1)[0]
        done = shell(commands[f"engine-{node}-dp-engines"])
        assert done.returncode == 0 and done.stdout.startswith(f"NOT RUN dp-engines-{node}: {REHEARSAL}")


def test_the_production_policy_refuses_a_rehearsal_for_its_image(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Held to the production rules, the lab example (with an API key) is refused for its substitute image only: no
    digest, and no image card, which a rehearsal's image cannot have (the planner refuses a carded GPU image)."""
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    run = run_program("lab", lab_values(), secrets={"api_key": "sk-mock-key-123"})
    assert run.error is None, run.error
    found = {n: v for n, v in violations(run, "lab", {"stacks": ["lab"]}).items() if v}
    assert sorted(found) == ["image-has-card", "image-pinned-by-digest", "prod-image-has-card",
                             "prod-image-pinned-by-digest"]


# --- the steps that run in the engine image really run on CPU (a real Docker engine) -----------------------------

def tiny_checkpoint(directory: Path) -> None:
    """A directory shaped like Qwen3-8B for the preflight's model section: its config.json, a tokenizer file and one
    small shard whose header describes its own bytes (what the lab's S3 holds; nothing loads it)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text((ROOT / "tests/fixtures/models/qwen3-8b/config.json").read_text())
    (directory / "tokenizer.json").write_text("{}")
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}})
    header += " " * (-len(header) % 8)
    (directory / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(32))


def test_the_dry_run_and_the_image_sections_run_in_a_cpu_image(tmp_path: Path) -> None:
    """In an image like the lab's (python3 and the `vllm` package with vLLM 0.33.0's flag table; no GPU anywhere):
    the argument dry run passes for both nodes, and the preflight after the pull runs model for real (the files, and
    per-GPU memory from their headers) while toolkit and memlock say NOT RUN."""
    from tests.docker_harness import RUN, build_image, docker_ready, remove_image

    assert docker_ready() is None, f"this test needs a Docker engine (`make services` starts dockerd): {docker_ready()}"
    image = build_image(f"vllm-cluster-test/rehearsal:{RUN}", tmp_path)
    try:
        values = lab_values()
        values["image"] = image
        values["model"] = {**values["model"], "host_dir": str(tmp_path / "models")}
        tiny_checkpoint(tmp_path / "models" / "qwen3-8b")
        config = parse_config("lab", values)
        plan = build_plan("lab", config)
        for node in ("lab1", "lab2"):
            check = next(c for c in plan.checks if c.name == f"args-dry-run-{node}")
            done = shell(dry_run_command(config, plan, check), timeout_s=600)
            line = done.stdout.strip().splitlines()[-1]
            assert done.returncode == 0 and line.startswith(f"PASS args-dry-run-{node}: vLLM 0.33.0 in {image}"), line
        check = next(c for c in plan.checks if c.name == "preflight-lab1")
        assert check.sections == ["model", "toolkit", "memlock"]
        done = shell(preflight_command(config, plan, check), timeout_s=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("PASS preflight-lab1: all 1 section(s) passed: model; NOT RUN toolkit: "
                                      f"{REHEARSAL}: no `docker run --gpus all`"), done.stdout
        assert f"; NOT RUN memlock: {REHEARSAL}: unlimited memlock serves NCCL's RDMA" in done.stdout
        assert "model: 1 shard(s), tokenizer: tokenizer.json" in done.stdout
    finally:
        remove_image(image)


# --- the collective check on CPU really runs (network namespaces, as tests/test_collective.py) -----------------

def namespace_rehearsal(hosts: list[Host]) -> dict[str, Any]:
    """The lab stack whose nodes are the namespaces: their veth as lab0's substitute, their address as both IPs."""
    values = lab_values()
    template = values["nodes"][0]
    values["nodes"] = []
    for i, host in enumerate(hosts):
        node = copy.deepcopy(template)
        node.update(name=f"lab{i + 1}", management_ip=host.address, data_ips=[host.address], nics=[host.ifname])
        node["ssh"] = {"host": host.address}
        values["nodes"].append(node)
    values["fabric"] = {**values["fabric"], "private_networks": ["10.213.0.0/16"]}
    return values


def test_the_collective_check_runs_gloo_on_cpu_between_the_nodes() -> None:
    with star(2) as hosts:
        values = namespace_rehearsal(hosts)
        config = parse_config("lab", values)
        port = DEFAULT_MASTER_PORT + 600 + os.getpid() % 200
        floor, _ = min_busbw_gbps(config)  # as components/program.py builds the commands
        runs = collective_runs(config, plan_of(values, "lab"), min_busbw_gbps=floor, master_port=port)
        assert all("--gpus" not in r.docker and "CUDA_VISIBLE_DEVICES" not in r.env for r in runs)
        procs = []
        for run, host in zip(runs, hosts, strict=True):
            # as the program's command, minus docker: the bundled script on stdin, the node's env, in its namespace
            command = heredoc_command("collective", [*run.args, "--warmup", "1", "--iters", "3", "--json"],
                                      interpreter=f"{PYTHON} ")
            env = ["env", "-i", "PATH=/usr/bin:/bin", *(f"{k}={v}" for k, v in run.env.items())]
            procs.append(subprocess.Popen(["ip", "netns", "exec", host.ns, *env, "sh", "-c", command],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=240)
            assert "Traceback" not in stderr, stderr
            results.append((proc.returncode, json.loads(stdout.strip().splitlines()[-1])))
    for (code, verdict), host in zip(results, hosts, strict=True):
        assert code == 0 and verdict["status"] == "pass", verdict
        assert verdict["summary"].startswith("all-reduce over 2 node(s) x 1 process(es) = 2 ranks, gloo: peak busbw ")
        assert f">= minimum {MIN_BUSBW_GBPS:g} Gb/s" in verdict["summary"]
        assert verdict["summary"].endswith(f"; NOT RUN nccl: {REHEARSAL}: the all-reduce ran with gloo on CPU, not "
                                           "with NCCL on GPUs over fabric.transport socket, so the bandwidth is the "
                                           "CPUs' and the network's, not the fabric's")
        assert [r["bytes"] for r in verdict["details"]["sizes"]] == [1 << 20, 4 << 20, 16 << 20]
        assert REHEARSAL_SIZES == "1M,4M,16M" and all(r["correct"] for r in verdict["details"]["sizes"])
        assert verdict["details"]["transport"]["used"] == f"gloo TCP over GLOO_SOCKET_IFNAME={host.ifname}"
