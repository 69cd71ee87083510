"""The wired commands run for real: what the Pulumi program registers (read from Pulumi's mocks) is executed by
bash and dash as a node's shell would, against a real Docker engine and moto's S3 API on loopback.

- the weights sync in an image with python3 and boto3, credentials arriving only on stdin as the program's
  secret `stdin` input carries them, then the program's comparison command over the two nodes' real verdicts;
- the local-directory verify on the host's python3, two directories that differ, and the comparison naming them;
- the collective check's engine guard against real containers: skip a group this update does not replace, stop
  this stack's engine of another generation (and `docker start` brings it back), leave anything else alone.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.weights_match import main as match_main
from checks.weights_node import weights_hash, weights_version_dir
from stacks.model.loader import read_stack_values
from tests.conftest import ROOT
from tests.docker_harness import build_image, docker_ready, remove_image
from tests.pulumi_harness import SECRET_VALUES, run_program
from tests.test_program import SECRET_SIG
from tests.test_weights_node import build_boto_image
from tests.weights_harness import checkpoint, moto_server, tree, upload

PREFIX = f"wirechk-{uuid.uuid4().hex[:8]}"
PATH = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
FILES = checkpoint([1.5, 1.0], tokenizer_mb=0.1)


def shell(command: str, stdin: str = "", sh: str = "bash", timeout_s: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sh, "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout_s,
                          env=PATH | {"HOME": tempfile.gettempdir()})


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    reason = docker_ready()
    assert reason is None, f"these tests need a Docker engine (`make services` starts dockerd): {reason}"
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def values_for(image: str, host_dir: Path, **source: Any) -> dict[str, Any]:
    values = copy.deepcopy(read_stack_values("prod"))
    values["image"] = image
    values["model"] |= {"host_dir": str(host_dir), "path": "ds"}
    if source:
        values["model"]["source"] = source
    return values


def registered(run: Any, name: str) -> dict[str, Any]:
    inputs: dict[str, Any] = run.mocks.named(name).inputs
    return {k: (v["value"] if isinstance(v, dict) and SECRET_SIG in v else v) for k, v in inputs.items()}


def compare(run: Any) -> subprocess.CompletedProcess[str]:
    """The program's `weights-match` command, run where `pulumi up` runs it (the checkout, its interpreter)."""
    argv = shlex.split(registered(run, "weights-match")["create"])
    assert argv[:3] == ["venv/bin/python", "-m", "checks.weights_match"]
    return subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)


# --- weights ---------------------------------------------------------------------------------------------------------

def test_the_programs_sync_command_and_stdin_fetch_the_weights_and_the_nodes_match(work: Path) -> None:
    image = f"{PREFIX}-boto:1"
    build_boto_image(image, work)
    try:
        with moto_server() as server:
            upload(server.client(), "wire-weights", "deepseek/ds", FILES, multipart_mb=5)
            key_id, secret = server.enforce_auth()
            host_dir = work / "sync"
            values = values_for(image, host_dir, url="s3://wire-weights/deepseek/ds", endpoint_url=server.endpoint,
                                region="us-east-1")
            secrets = {**SECRET_VALUES, "s3_access_key_id": key_id, "s3_secret_access_key": secret}
            run = run_program("prod", values, secrets=secrets)
            assert run.error is None, run.error
            outs = {}
            for node, sh in (("node1", "bash"), ("node2", "dash")):  # node2 finds node1's files: nothing to fetch
                inputs = registered(run, f"{node}-weights")
                assert key_id not in inputs["create"] and secret not in inputs["create"]
                done = shell(inputs["create"], stdin=inputs["stdin"], sh=sh)
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
                assert secret not in done.stdout + done.stderr
                outs[f"{node}-weights"] = done.stdout
            versions = {weights_version_dir(o) for o in outs.values()}
            assert len(versions) == 1 and None not in versions, "both nodes name the same version directory"
            version = str(versions.pop())
            assert version.startswith(f"{host_dir / 'ds'}@") and tree(version) == FILES
            assert not (host_dir / "ds").exists(), "the model directory itself is never written"
            hashes = {n: weights_hash(o) for n, o in outs.items()}
            assert len(set(hashes.values())) == 1 and None not in hashes.values()
            second = json.loads(outs["node2-weights"].strip().splitlines()[-1])
            assert "0 file(s)" in " ".join(second["evidence"]) or "fetched 0" in " ".join(second["evidence"]), second
            wrong = shell(registered(run, "node1-weights")["create"], stdin="", sh="bash")  # no credentials at all
            assert wrong.returncode == 2, wrong.stdout[-1000:]
        fed = run_program("prod", values, secrets=secrets, stdout=outs)
        assert fed.outputs["weights"] == {"node1": hashes["node1-weights"], "node2": hashes["node2-weights"]}
        done = compare(fed)
        assert done.returncode == 0 and done.stdout.startswith("PASS weights-match: all 2 node(s) hold the same")
    finally:
        remove_image(image)


def test_local_directories_are_verified_on_the_host_and_a_difference_is_named(work: Path) -> None:
    outs = {}
    for node, variant in (("node1", b""), ("node2", b'{"model_max_length": 65536}\n')):
        host_dir = work / f"local-{node}"
        (host_dir / "ds").mkdir(parents=True)
        for name, blob in FILES.items():
            (host_dir / "ds" / name).write_bytes(variant if variant and name == "tokenizer_config.json" else blob)
        run = run_program("prod", values_for("vllm/vllm-openai:v0.33.0", host_dir))
        command = registered(run, f"{node}-weights")["create"]
        assert command.startswith("timeout 3600 python3 - verify --dest ")
        done = shell(command, sh="dash")
        assert done.returncode == 0, done.stdout[-2000:]
        outs[f"{node}-weights"] = done.stdout
    fed = run_program("prod", values_for("vllm/vllm-openai:v0.33.0", work / "local-node1"), stdout=outs)
    assert fed.outputs["weights"]["node1"] != fed.outputs["weights"]["node2"]
    done = compare(fed)
    assert done.returncode == 1 and "the nodes hold 2 different sets of weights" in done.stdout
    assert f"node1: {fed.outputs['weights']['node1']}" in done.stdout
    assert f"node2: {fed.outputs['weights']['node2']}" in done.stdout


def test_weights_match_names_the_odd_node_and_refuses_bad_arguments(capsys: Any) -> None:
    a, b = "1" * 64, "2" * 64
    assert match_main(["node1=" + a, "node2=" + a, "node3=" + b, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["details"]["differing"] == ["node3"] and out["summary"].startswith("node3 holds other weights")
    assert match_main(["node1=" + a, "node2=" + a]) == 0
    for bad in (["node1=xyz"], ["node1"], ["node1=" + a, "node1=" + a], [], ["Node1=" + a]):
        capsys.readouterr()
        assert match_main(bad) == 2, bad
        assert capsys.readouterr().out.startswith("CANNOT-RUN weights-match: bad argument")


# --- the collective check's engine guard -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine_image(work: Path) -> Iterator[str]:
    tag = f"{PREFIX}-py:1"
    build_image(tag, work, with_vllm=False)
    yield tag
    remove_image(tag)


def running(name: str) -> bool:
    done = docker("inspect", "--format", "{{.State.Running}}", name)
    return done.stdout.strip() == "true"


def start_engine(name: str, image: str, labels: dict[str, str], env: dict[str, str]) -> None:
    docker("rm", "-f", name)
    flags = [part for key, value in labels.items() for part in ("--label", f"{key}={value}")]
    flags += [part for key, value in env.items() for part in ("-e", f"{key}={value}")]
    # --init: a real engine stops on SIGTERM; a bare `python3 -c` as PID 1 would ignore it, and every
    # `docker stop --time 30` of the guard would wait the whole 30 s
    done = docker("run", "-d", "--init", "--name", name, *flags, "--entrypoint", "python3", image, "-c",
                  "import time; time.sleep(600)")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("sh", ["bash", "dash"])
def test_the_collective_guard_against_real_containers(engine_image: str, sh: str) -> None:
    engine = f"{PREFIX}-engine-{sh}"
    values = copy.deepcopy(read_stack_values("prod"))
    values["image"] = engine_image
    values["container"]["name"] = engine
    run = run_program("prod", values)
    assert run.error is None, run.error
    command = registered(run, "collective-node1")["create"]
    spec_env = run.mocks.named(f"engine-node1-{engine}").inputs["envs"]
    env = dict(e.split("=", 1) for e in (spec_env["value"] if isinstance(spec_env, dict) else spec_env))
    ours = {"vllm-cluster.stack": "prod", "vllm-cluster.generation": run.result["engine"].generation}
    other_image = f"{PREFIX}-other:1"
    try:
        # this stack's engine, this image, this fabric env: the update does not replace it; skip, touch nothing
        start_engine(engine, engine_image, ours, env)
        done = shell(command, sh=sh)
        assert done.returncode == 0 and done.stdout.startswith(f"SKIP collective-node1: engine {engine}"), done
        assert running(engine)
        # another image (committed from it: another ID), or another value of a fabric variable: the group is
        # replaced, so it is stopped (the downtime starts here), then the all-reduce container starts
        assert docker("commit", engine, other_image).returncode == 0
        for image, variant in ((other_image, env), (engine_image, env | {"NCCL_IB_HCA": "=mlx5_9:1"})):
            start_engine(engine, image, ours, variant)
            started = time.monotonic()
            done = shell(command, sh=sh)
            assert "stopping this stack's engine" in done.stderr and not running(engine), done
            assert time.monotonic() - started >= 5  # the pause for the GPUs to be released
            ran = docker("ps", "-a", "--filter", f"name={engine}-collective", "--format", "{{.Names}}")
            assert done.returncode != 0 and ran.stdout.strip() == ""  # here: no GPU, `docker run --gpus` fails (--rm)
            assert "gpu" in done.stderr.lower() or "device" in done.stderr.lower(), done.stderr[-800:]
            assert docker("start", engine).returncode == 0 and running(engine)  # the documented way back
        # not this stack's, or no label at all: left alone (the check itself then refuses: GPUs in use)
        for labels in ({"vllm-cluster.stack": "prod-other"}, {}):  # (other_image inherited the labels: commit)
            start_engine(engine, engine_image, labels, env | {"NCCL_IB_HCA": "=mlx5_9:1"})
            done = shell(command, sh=sh)
            assert "stopping" not in done.stderr and running(engine) and not done.stdout.startswith("SKIP")
        docker("rm", "-f", engine)  # none at all: straight to the check
        done = shell(command, sh=sh)
        assert "stopping" not in done.stderr and not done.stdout.startswith("SKIP") and done.returncode != 0
    finally:
        docker("rm", "-f", engine)
        remove_image(other_image)
