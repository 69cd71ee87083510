"""Cut-over from seed 000's docker-compose deployment: the preflight's `ownership` section against a real Docker engine.

Containers come from an image made by `docker import` (tests/docker_harness.py) and carry the labels Docker
Compose puts on its containers; their processes listen on free ports with host networking or publish one through
Docker's bridge. What cannot be real here: GPUs (no GPU on this machine) and `docker compose` itself (no Compose v2
plugin: the printed `docker compose -p <project> down` is checked as text and the container is removed with
`docker rm -f` instead). GPU holders are tested with nvidia-smi's compute-apps format captured on a real H200
(tests/fixtures/nvidia_smi/compute_apps/), whose pids are the real pids of these containers' processes, and with the
real `docker inspect` of a container created with `--gpus all`.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.bundle import heredoc_command
from checks.preflight import BEFORE_PULL, describe, ownership_holders, parse_compute_apps, requests_gpus
from components.check_commands import preflight_command
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import CheckSpec, build_plan
from tests.conftest import ROOT
from tests.docker_harness import build_image, docker_ready, remove_image, run_shell
from tests.waiting import wait_for

CAPTURE = ROOT / "tests" / "fixtures" / "nvidia_smi" / "compute_apps"
LISTEN = ("import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('up', flush=True); time.sleep(900)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


class Host:
    """This machine's Docker with containers named `<prefix>-*`, removed afterwards."""

    def __init__(self, tmp: Path) -> None:
        self.prefix = f"memcut-{uuid.uuid4().hex[:8]}"
        self.image = build_image(f"{self.prefix}-py:1", tmp, with_vllm=False)
        self.processes: list[subprocess.Popen[str]] = []

    def container(self, name: str, port: int | None = None, labels: dict[str, str] | None = None,
                  network: str = "host", publish: str | None = None, start: bool = True) -> str:
        argv = ["run", "-d"] if start else ["create"]
        argv += ["--name", name, "--network", network]
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        if publish:
            argv += ["-p", publish]
        cid = docker(*argv, self.image, "python3", "-c", LISTEN, str(port or 0))
        if start:
            self.wait_up(name)
        return cid

    def wait_up(self, name: str) -> None:
        """Until the container's process listens (it prints `up`): 120 s, a loaded machine is slow to start one."""
        wait_for(lambda: "up" in docker("logs", name), lambda: f"{name} listening: {docker('logs', name)}", 120)

    def pid(self, name: str) -> int:
        return int(docker("inspect", "-f", "{{.State.Pid}}", name))

    def bare_process(self, port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        self.processes.append(proc)
        return proc

    def close(self) -> None:
        names = docker("ps", "-a", "--filter", f"name={self.prefix}", "--format", "{{.Names}}", check=False)
        for name in names.split():
            docker("rm", "-f", name, check=False)
        for proc in self.processes:
            proc.kill()
            proc.wait()
        remove_image(self.image)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    problem = docker_ready()
    if problem:
        pytest.fail(f"these tests need a Docker engine (`make services` starts dockerd): {problem}")
    h = Host(tmp_path)
    try:
        yield h
    finally:
        h.close()


def run_ownership(args: list[str], bin_dir: Path | None = None) -> tuple[int, dict[str, Any]]:
    """The shipped heredoc, run by bash as `remote.Command` runs it over SSH."""
    command = heredoc_command("preflight", ["--json", "--sections", "ownership", *args], timeout_s=120)
    path = f"{bin_dir}:" if bin_dir else ""
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=150,
                          env={"PATH": f"{path}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def commands(verdict: dict[str, Any]) -> list[str]:
    """The commands the next step tells the operator to run."""
    match = re.search(r"with `([^`]*)`", verdict["next_step"] or "")
    assert match, verdict
    return match.group(1).split("; ")


def test_compose_seed_blocks_and_the_printed_commands_clear_it(host: Host) -> None:
    """Seed 000 still running from compose next to this stack: name, port and a stray process are named with the
    exact command that removes each; this stack's own container is left alone; after the commands, it passes."""
    stack, engine = f"{host.prefix}stack", f"{host.prefix}-engine"
    project = f"{host.prefix}seed"
    api, rpc, stray, published = free_port(), free_port(), free_port(), free_port()
    host.container(engine, api, {
        "com.docker.compose.project": project, "com.docker.compose.service": "deepseek-v41-flash",
        "com.docker.compose.project.working_dir": "/root/dsv41",
        "com.docker.compose.project.config_files": "/root/dsv41/docker-compose.yml"})
    host.container(f"{host.prefix}-owned", rpc, {"vllm-cluster.stack": stack})
    host.container(f"{host.prefix}-proxy", start=False)
    host.container(f"{host.prefix}-pub", network="bridge", publish=f"127.0.0.1:{published}:8000")
    proc = host.bare_process(stray)
    args = ["--owned-label", f"vllm-cluster.stack={stack}", "--container-names",
            f"{engine},{host.prefix}-proxy", "--ports", f"{api},{rpc},{stray},{published}"]

    code, v = run_ownership(args)
    text = "\n".join(v["evidence"])
    assert code == 1 and v["status"] == "fail", v
    assert (f"container {engine} (running, image {host.image}, service deepseek-v41-flash of compose project "
            f"{project} (/root/dsv41/docker-compose.yml)) holds the container name {engine}, port {api} "
            "(listening, host network)") in text
    assert f"container {host.prefix}-proxy (created, image {host.image}) holds the container name" in text
    assert f"container {host.prefix}-pub (running, image {host.image}) holds port {published} (published)" in text
    assert re.search(rf"process {proc.pid} \(\S*python\S* -c import socket.*\) holds port {stray}", text), text
    assert f"{host.prefix}-owned" not in text and f"port {rpc}" not in text
    assert commands(v) == [f"docker compose -p {project} down", f"docker rm -f {host.prefix}-proxy",
                           f"docker rm -f {host.prefix}-pub", f"kill {proc.pid}"]
    assert "docs/deploy.md: From docker-compose" in v["next_step"]

    for command in commands(v):
        if command.startswith("docker compose"):
            docker("rm", "-f", engine)  # what `docker compose -p <project> down` does to this project here
        else:
            assert run_shell(command).returncode == 0, command
    proc.wait(timeout=10)
    code, v = run_ownership(args)
    assert code == 0, v
    assert v["evidence"][0].startswith(f"ownership: nothing this stack does not own holds {engine}")


def test_a_container_removed_during_the_check_does_not_hide_the_others(host: Host, tmp_path: Path) -> None:
    """Another container removed between `docker ps` and `docker inspect` (a busy node, or another test run on this
    machine) makes inspect exit 1 after printing the rest: the compose container is still named, not passed over."""
    engine = f"{host.prefix}-engine"
    host.container(engine, free_port(), {"com.docker.compose.project": f"{host.prefix}seed"})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gone = "0" * 64  # an id no container has: what a removed container's id is by the time inspect runs
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = inspect ] && exec {shutil.which("docker")} "$@" {gone}\n'
                                    f'exec {shutil.which("docker")} "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    code, v = run_ownership(["--owned-label", f"vllm-cluster.stack={host.prefix}stack", "--container-names", engine],
                            bin_dir)
    assert code == 1 and f"container {engine} (running, image {host.image}" in "\n".join(v["evidence"]), v


def test_gpu_holders_from_nvidia_smi_map_to_containers(host: Host, tmp_path: Path) -> None:
    """nvidia-smi's compute apps (the real H200 format) with the real pids of a compose container, this stack's own
    container and a bare process: each pid is mapped to its container through /proc/<pid>/cgroup."""
    stack, project = f"{host.prefix}stack", f"{host.prefix}seed"
    host.container(f"{host.prefix}-seed", labels={"com.docker.compose.project": project})
    host.container(f"{host.prefix}-owned", labels={"vllm-cluster.stack": stack})
    bare = host.bare_process(free_port())
    real = (CAPTURE / "compute_apps.csv").read_text().strip()
    _, name, uuid_, memory = (p.strip() for p in real.split(","))
    rows = [f"{pid}, {name}, {uuid_}, {memory}"
            for pid in (host.pid(f"{host.prefix}-seed"), host.pid(f"{host.prefix}-owned"), bare.pid)]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rows.csv").write_text("\n".join(rows) + "\n")
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat '{bin_dir / 'rows.csv'}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)

    code, v = run_ownership(["--owned-label", f"vllm-cluster.stack={stack}",
                             "--container-names", f"{host.prefix}-engine"], bin_dir)
    text = "\n".join(v["evidence"])
    assert code == 1, v
    assert (f"container {host.prefix}-seed (running, image {host.image}, service ? of compose project {project} (?)) "
            f"holds GPU {uuid_} (518 MiB, /opt/torch/.venv/bin/python3)") in text
    assert f"process {bare.pid} (" in text and f"{host.prefix}-owned" not in text
    assert commands(v) == [f"docker compose -p {project} down", f"kill {bare.pid}"]
    assert "3 GPU process(es)" in text


def test_compute_apps_capture_parses() -> None:
    rows = parse_compute_apps((CAPTURE / "compute_apps.csv").read_text())
    assert rows == [{"pid": "537", "name": "/opt/torch/.venv/bin/python3",
                     "gpu": "GPU-c600d2e3-6bce-ea4a-4015-42a04aa838c0", "memory": "518 MiB"}]
    assert parse_compute_apps((CAPTURE / "compute_apps_none.csv").read_text()) == []
    # the header form is skipped, not misread as a process
    assert len(parse_compute_apps((CAPTURE / "compute_apps_header.csv").read_text())) == 1


def test_gpu_request_of_a_real_container(host: Host) -> None:
    """`docker create --gpus all` records a DeviceRequest even without a GPU: the inspect JSON is Docker's own.
    Created, it holds nothing; the same JSON marked running (edited) holds the GPUs."""
    gpu = docker("create", "--name", f"{host.prefix}-gpu", "--gpus", "all",
                 "--label", "com.docker.compose.project=seedproj", host.image, "python3")
    plain = docker("create", "--name", f"{host.prefix}-plain", host.image, "python3")
    infos = json.loads(docker("inspect", gpu, plain))
    assert [requests_gpus(i) for i in infos] == [True, False]
    assert ownership_holders(infos, [], [], [], {}, [], "/proc") == []
    running = [{**i, "State": {**i["State"], "Running": True, "Status": "running"}} for i in infos]
    holders = ownership_holders(running, [], [], [], {}, [], "/proc")
    assert [(h.holds, h.remedy) for h in holders] == [(["the GPUs (--gpus / DeviceRequests)"],
                                                      "docker compose -p seedproj down")]


def test_planned_pre_pull_command_against_a_compose_container(host: Host) -> None:
    """The command the program will register before the pull (components/check_commands.py), for prod with its
    container name and port moved to this test's: a compose container of that name on that port fails it."""
    values = read_stack_values("prod")
    engine, port = f"{host.prefix}-dsv41", free_port()
    values["container"]["name"] = engine
    values["serving"]["port"] = port
    config = parse_config("prod", values)
    plan = build_plan("prod", config)
    check = CheckSpec(name="pre-pull-node1", node="node1", runs_on="node", module="checks.preflight",
                      sections=["ownership"], proves="nothing else holds the engine's name, ports or GPUs")
    command = preflight_command(config, plan, check)
    # 29700: the collective check's rendezvous port (fabric.collective_port) on the head
    assert command.startswith(f"timeout 120 python3 - --name pre-pull-node1 --sections ownership "
                              f"--owned-label vllm-cluster.stack=prod --container-names {engine} "
                              f"--ports {','.join(map(str, sorted({port, 13399, 28028, 29700})))} <<")
    assert set(BEFORE_PULL) == {"ownership", "disk", "gpu", "model"}
    host.container(engine, port, {"com.docker.compose.project": "dsv41"})
    done = run_shell(command)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stop them on this node with `docker compose -p dsv41 down`" in done.stdout
    docker("rm", "-f", engine)
    host.container(engine, port, {"vllm-cluster.stack": "prod"})  # a redeploy: its own engine holds both
    done = run_shell(command)
    assert done.returncode == 0, done.stdout + done.stderr


def test_another_stacks_container_is_named_as_such() -> None:
    info = {"Name": "/vllm-ray", "State": {"Status": "running"},
            "Config": {"Image": "vllm/vllm-openai:v0.33.0", "Labels": {"vllm-cluster.stack": "h20"}}}
    assert describe(info) == ("container vllm-ray (running, image vllm/vllm-openai:v0.33.0, of vllm-cluster stack h20)",
                              "docker rm -f vllm-ray")
