"""The lab cluster for `make lab`: nodes, images, weights and a Pulumi project with its stack, made once per run.

What it builds (docs/rehearse.md): the toolchain (`make toolchain`, a cache hit after the first time); a lab of
`LAB_NODES` nodes (lab/hosts.py); three engine images in the lab registry (`lab-1` and `lab-2`, two builds of the
same substitute engine, and `lab-bad`, whose engine answers the golden prompt wrongly); a small model shaped like
the qwen3-8b card in the lab's S3; a copy of this project whose `Pulumi.lab.yaml` is examples/Pulumi.lab.yaml with
the nodes' real host keys; a local backend with the stack `lab` and its secrets set by `pulumi config set --secret`.
Everything is torn down at the end, the lab's nodes included, unless LAB_KEEP=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import hosts
from tests.conftest import ROOT
from tests.lab import engine_image, proxy_image
from tests.lab.pulumi_cli import PulumiCli, copy_project, ssh_agent, toolchain_bin
from tests.weights_harness import checkpoint

STACK = "lab"
FIGURES: list[str] = []


def skew_note() -> str:
    """The distributions the router takes from the base image in another version than its pin, if any."""
    skew = engine_image.SKEW
    return f"; the router shares the base's {', '.join(f'{n} {a} (pin {b})' for n, (a, b) in skew.items())}" \
        if skew else ""
"""Measured figures a workflow reports (docs quote them), printed at the end of the run."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in FIGURES:
        terminalreporter.write_line(f"lab figure: {line}")
IMAGES = {"lab-1": None, "lab-2": None, "lab-bad": "I do not know"}
"""Tag -> what its engine answers to the golden prompt (None: the right answer)."""
SECRETS = {
    "api_key": "sk-lab-8c1f0e5a9d7b4e2f",
    "s3_access_key_id": hosts.S3_KEY_ID,
    "s3_secret_access_key": hosts.S3_SECRET,
}
"""Set with `pulumi config set --secret` (the value on stdin, never in an argv); the secret scan looks for every
one (and the SSH key) in every output."""
QWEN3_CONFIG = ROOT / "tests" / "fixtures" / "models" / "qwen3-8b" / "config.json"


@dataclass
class LabDeployment:
    lab: hosts.Lab
    cli: PulumiCli
    images: dict[str, str]
    """tag -> the reference nodes pull (`nginx`: the front door's)"""
    secrets: dict[str, str]

    @property
    def stack_file(self) -> Path:
        return self.cli.project / f"Pulumi.{STACK}.yaml"

    def set_image(self, tag: str) -> None:
        """Point the stack at another image, as a user edits the stack file."""
        text = self.stack_file.read_text()
        self.stack_file.write_text(re.sub(r"(vllm-cluster:image: ).*", rf"\g<1>{self.images[tag]}", text, count=1))

    def lab_registry_pulls(self, tag: str) -> int:
        """Requests for the manifest of `vllm-standin:<tag>` in the lab registry's access log: a pull asks for it."""
        log = Path(self.lab.state_dir) / "registry" / "registry.log"
        wanted = f"/v2/vllm-standin/manifests/{tag} "
        return sum(1 for line in log.read_text(errors="replace").splitlines() if wanted in line)

    def node_sh(self, node: str, command: str) -> str:
        done = self.lab.ssh(self.lab.node(node), command)
        if done.returncode != 0:
            raise AssertionError(f"{node}: {command}: exit {done.returncode}: {done.stderr[-500:]}")
        return done.stdout


def _model(target: Path) -> Path:
    """Two small shards with real safetensors headers, an index, a tokenizer, and qwen3-8b's own config.json."""
    files = checkpoint([1.0, 1.0], tokenizer_mb=0.1)
    files["config.json"] = QWEN3_CONFIG.read_bytes()
    for name, data in files.items():
        (target / name).write_bytes(data)
    return target


def _stack_file(project: Path, lab: hosts.Lab) -> None:
    text = (ROOT / "examples" / "Pulumi.lab.yaml").read_text()
    placeholders = re.findall(r'host_key: "(ssh-ed25519 [A-Za-z0-9+/=]+)"', text)
    if len(placeholders) != len(lab.nodes):
        raise AssertionError(f"examples/Pulumi.lab.yaml has {len(placeholders)} host keys for {len(lab.nodes)} nodes")
    for placeholder, node in zip(placeholders, lab.nodes, strict=True):
        text = text.replace(placeholder, node.host_key)
    (project / f"Pulumi.{STACK}.yaml").write_text(text)


def _keep_node_logs(lab_state: Path, work: Path) -> None:
    """Each node's sshd, dockerd and boot logs and the registry's, out of the lab's state dir before `down`
    deletes it: a failed run keeps its evidence."""
    for log in [*lab_state.glob("nodes/*/log/*.log"), *lab_state.glob("registry/*.log"), *lab_state.glob("*.log")]:
        target = work / "logs" / "lab" / log.relative_to(lab_state)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, target)


@pytest.fixture(scope="session")
def deployment(request: pytest.FixtureRequest) -> Iterator[LabDeployment]:
    keep = os.environ.get("LAB_KEEP") == "1"
    work = Path(tempfile.mkdtemp(prefix="vllm-lab-run-"))
    print(f"\nlab run: {work} (logs in {work / 'logs'})")
    bin_dir = toolchain_bin()
    lab = hosts.up(2, state_dir=work / "lab")
    agent_pid = None
    try:
        images = {}
        run = work.name[-8:].lower()
        base = engine_image.build_base(f"vllm-lab-base:{run}", work)
        FIGURES.append(f"engine base image: {engine_image.image_bytes(base) / 1e6:.0f} MB, of which the router "
                       f"launcher's packages {engine_image.router_bytes() / 1e6:.1f} MB" + skew_note())
        for tag, answer in IMAGES.items():
            local = engine_image.build(base, f"vllm-lab-engine:{tag}-{run}", work, answer=answer)
            images[tag] = hosts.push_image(lab, local, f"vllm-standin:{tag}")
            engine_image.remove(local)
        engine_image.remove(base)
        images["nginx"] = hosts.push_image(lab, proxy_image.build(f"vllm-lab-nginx:{run}", work), "lab-nginx:1")
        engine_image.remove(f"vllm-lab-nginx:{run}")
        model = _model(Path(tempfile.mkdtemp(dir=work, prefix="model-")))
        hosts.s3_upload(lab, model, "lab-models", "qwen3-8b")
        project = copy_project(work / "project")
        _stack_file(project, lab)
        agent_env, agent_pid = ssh_agent(Path(lab.key_path), work)
        cli = PulumiCli(project, bin_dir, work, extra_env=agent_env)
        cli.run("stack", "init", STACK, what="stack-init")
        secrets = dict(SECRETS)
        for key, value in secrets.items():
            cli.run("config", "set", "--secret", f"vllm-cluster:{key}", what=f"secret-{key}", stdin=value)
        ssh_key = Path(lab.key_path).read_text()
        cli.run("config", "set", "--secret", "vllm-cluster:ssh_private_key", what="secret-ssh", stdin=ssh_key)
        secrets["ssh_private_key"] = ssh_key
        yield LabDeployment(lab, cli, images, secrets)
    finally:
        if agent_pid:
            subprocess.run(["kill", str(agent_pid)], capture_output=True)
        failed = request.session.testsfailed > 0
        if keep:  # past pytest's capture: the user asked for it
            print(f"\nlab kept (LAB_KEEP=1): {work}; python -m lab down --state-dir {work / 'lab'}",
                  file=sys.__stderr__)
        else:
            if (work / "lab").exists():
                _keep_node_logs(work / "lab", work)
            hosts.down(work / "lab", log=lambda _: None)
            if failed:
                print(f"\nlab run failed: its logs are in {work / 'logs'}", file=sys.__stderr__)
            else:
                shutil.rmtree(work, ignore_errors=True)


def stack_resources(deployment: LabDeployment) -> list[dict[str, object]]:
    """The resources `pulumi stack export` says exist."""
    exported = json.loads(deployment.cli.run("stack", "export", what="export").out)
    return list(exported.get("deployment", {}).get("resources") or [])
