"""Preflight against real captures (nvidia-smi on an H200) and trees built in temp dirs.

`nvidia-smi` and `docker` are small executables on PATH that print a captured output, so the check runs
exactly as on a host: a subprocess parsing real text. The shipped form (`checks.bundle`) is run too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from checks import preflight
from checks.bundle import heredoc_command, remote_script
from checks.preflight import split_image_ref
from tests.conftest import ROOT

FIX = ROOT / "tests" / "fixtures"


def fake_bin(tmp: Path, name: str, output: str, code: int = 0) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / f"{name}.out").write_text(output)
    script = tmp / name
    script.write_text(f"#!/bin/sh\ncat '{tmp / (name + '.out')}'\nexit {code}\n")
    script.chmod(0o755)


def run(tmp: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-m", "checks.preflight", "--json", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    return out.returncode, json.loads(out.stdout)


GPU_ARGS = ["--sections", "gpu", "--gpus", "8", "--gpu-model", "H200", "--gpu-memory-gb", "141"]


def test_real_h200_capture_passes_for_one_gpu(tmp_path: Path) -> None:
    fake_bin(tmp_path / "bin", "nvidia-smi", (FIX / "nvidia_smi/h200_query.csv").read_text())
    code, v = run(tmp_path, "--sections", "gpu", "--gpus", "1", "--gpu-model", "H200", "--gpu-memory-gb", "141")
    assert code == 0, v
    assert "1 GPU(s): NVIDIA H200; driver 580.159.04" in v["evidence"][0]


def test_eight_gpus_pass_seven_fail(tmp_path: Path) -> None:
    fake_bin(tmp_path / "bin", "nvidia-smi", (FIX / "nvidia_smi/h200x8_edited.csv").read_text())
    assert run(tmp_path, *GPU_ARGS)[0] == 0
    fake_bin(tmp_path / "bin", "nvidia-smi", (FIX / "nvidia_smi/h200x7_edited.csv").read_text())
    code, v = run(tmp_path, *GPU_ARGS)
    assert code == 1 and "expected 8 GPUs, nvidia-smi shows 7" in " ".join(v["evidence"])
    assert "nvidia-smi -L" in v["next_step"]


def test_wrong_model_fails(tmp_path: Path) -> None:
    fake_bin(tmp_path / "bin", "nvidia-smi", (FIX / "nvidia_smi/h100x8_edited.csv").read_text())
    code, v = run(tmp_path, *GPU_ARGS)
    assert code == 1 and "'NVIDIA H100 80GB HBM3', expected 'H200'" in " ".join(v["evidence"])


def test_no_driver_cannot_run(tmp_path: Path) -> None:
    env_path = f"{tmp_path}/empty"
    out = subprocess.run([sys.executable, "-m", "checks.preflight", "--json", *GPU_ARGS], cwd=ROOT,
                         env={"PATH": env_path}, capture_output=True, text=True)
    assert out.returncode == 2 and json.loads(out.stdout)["status"] == "cannot-run"


def test_toolkit_and_memlock(tmp_path: Path) -> None:
    fake_bin(tmp_path / "bin", "docker", (FIX / "h200/list.txt").read_text())
    code, v = run(tmp_path, "--sections", "toolkit", "--gpus", "1", "--image", "img")
    assert code == 0, v
    fake_bin(tmp_path / "bin", "docker", "docker: Error response from daemon: could not select device driver "
             '"" with capabilities: [[gpu]].\n', code=125)
    code, v = run(tmp_path, "--sections", "toolkit", "--gpus", "1", "--image", "img")
    assert code == 1 and "could not select device driver" in v["evidence"][0]
    assert "nvidia-ctk" in v["next_step"]
    fake_bin(tmp_path / "bin", "docker", "65536\n")
    code, v = run(tmp_path, "--sections", "memlock", "--image", "img")
    assert code == 1 and "'65536'" in v["evidence"][0]


def make_model(root: Path, heads: int = 64) -> Path:
    model = root / "DeepSeek-V4.1-Flash"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_attention_heads": heads, "o_groups": 8}))
    (model / "tokenizer.json").write_text("{}")
    shards = [f"model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"layer.{i}": s for i, s in enumerate(shards)}}))
    for shard in shards:
        (model / shard).write_bytes(b"x" * 16)
    return model


def test_model_dir_good_and_broken(tmp_path: Path) -> None:
    model = make_model(tmp_path)
    args = ["--sections", "model", "--model-dir", str(model), "--heads", "64", "--o-groups", "8"]
    assert run(tmp_path, *args)[0] == 0
    (model / "model-00002-of-00003.safetensors").unlink()
    (model / "model-00003-of-00003.safetensors").write_bytes(b"")
    code, v = run(tmp_path, *args)
    text = " ".join(v["evidence"])
    assert code == 1 and "1 of 3 shard(s) missing" in text and "1 empty file(s)" in text


def test_model_config_disagrees_with_profile(tmp_path: Path) -> None:
    model = make_model(tmp_path, heads=128)
    code, v = run(tmp_path, "--sections", "model", "--model-dir", str(model), "--heads", "64")
    assert code == 1 and "num_attention_heads=128, the stack's model card says 64" in " ".join(v["evidence"])


def make_sysfs(root: Path, hcas: dict[str, tuple[str, str, str]]) -> None:
    for hca, (state, layer, gid_type) in hcas.items():
        dev, port = hca.split(":")
        p = root / "sys/class/infiniband" / dev / "ports" / port
        (p / "gid_attrs/types").mkdir(parents=True)
        (p / "state").write_text(state + "\n")
        (p / "link_layer").write_text(layer + "\n")
        (p / "gid_attrs/types/3").write_text(gid_type + "\n")
    (root / "dev/infiniband").mkdir(parents=True)
    (root / "dev/infiniband/uverbs0").write_text("")
    for nic, rp in (("ens11np0", 2), ("ens13np0", 2)):
        conf = root / "proc/sys/net/ipv4/conf" / nic
        conf.mkdir(parents=True)
        for key, value in (("rp_filter", rp), ("arp_ignore", 1), ("arp_announce", 2)):
            (conf / key).write_text(f"{value}\n")


FABRIC = ["--sections", "infiniband,hca,gid,sysctl", "--hcas", "mlx5_0:1,mlx5_2:1", "--gid-index", "3",
          "--nics", "ens11np0,ens13np0"]


def _roots(root: Path) -> list[str]:
    return ["--sysfs-root", str(root / "sys"), "--procfs-root", str(root / "proc"), "--dev-root", str(root / "dev")]


def test_fabric_good(tmp_path: Path) -> None:
    make_sysfs(tmp_path, {"mlx5_0:1": ("4: ACTIVE", "Ethernet", "RoCE v2"),
                          "mlx5_2:1": ("4: ACTIVE", "Ethernet", "RoCE v2")})
    code, v = run(tmp_path, *FABRIC, *_roots(tmp_path))
    assert code == 0, v
    assert "hca: mlx5_0:1 4: ACTIVE Ethernet" in v["evidence"]


@pytest.mark.parametrize(("hca", "expect"), [
    (("1: DOWN", "Ethernet", "RoCE v2"), "port state '1: DOWN'"),
    (("4: ACTIVE", "Ethernet", "IB/RoCE v1"), "GID[3] is 'IB/RoCE v1', expected 'RoCE v2'"),
    (("4: ACTIVE", "InfiniBand", "RoCE v2"), "link layer InfiniBand, expected Ethernet"),
])
def test_fabric_failures(tmp_path: Path, hca: tuple[str, str, str], expect: str) -> None:
    make_sysfs(tmp_path, {"mlx5_0:1": ("4: ACTIVE", "Ethernet", "RoCE v2"), "mlx5_2:1": hca})
    code, v = run(tmp_path, *FABRIC, *_roots(tmp_path))
    assert code == 1 and expect in " ".join(v["evidence"])


def test_strict_rp_filter_and_missing_devices(tmp_path: Path) -> None:
    make_sysfs(tmp_path, {"mlx5_0:1": ("4: ACTIVE", "Ethernet", "RoCE v2")})
    (tmp_path / "proc/sys/net/ipv4/conf/ens13np0/rp_filter").write_text("1\n")
    (tmp_path / "dev/infiniband/uverbs0").unlink()
    code, v = run(tmp_path, *FABRIC, *_roots(tmp_path))
    text = " ".join(v["evidence"])
    assert code == 1
    assert "rp_filter=1 (strict)" in text and "no uverbs device" in text and "mlx5_2:1: no such HCA port" in text
    assert "rp_filter=2" in v["next_step"]


def fake_docker(tmp: Path, root: Path, image_present: bool, registry_config: dict[str, Any] | None = None) -> None:
    """`docker info` names `root` as Docker's data root (and answers `registry_config` for its RegistryConfig);
    `docker image inspect` finds the image or not."""
    script = tmp / "docker"
    tmp.mkdir(parents=True, exist_ok=True)
    config = json.dumps(registry_config or {"IndexConfigs": {}, "InsecureRegistryCIDRs": []})
    script.write_text(f"""#!/bin/sh
case "$1" in
  info) case "$3" in *RegistryConfig*) echo '{config}' ;; *) echo '{root}|[["Backing Filesystem","extfs"]]' ;; esac ;;
  image) {'echo sha256:abc' if image_present else 'echo "Error: No such image: $4" >&2; exit 1'} ;;
  *) echo "unexpected: $*" >&2; exit 3 ;;
esac
""")
    script.chmod(0o755)


@pytest.fixture
def docker_root(tmp_path: Path) -> Iterator[Path]:
    """Docker's data root on an empty 100 GiB tmpfs: the free space the disk section reads is the same on every
    machine (an empty tmpfs has its whole size free, and a size beyond RAM costs nothing while unused)."""
    path = tmp_path / "docker-root"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100g", "preflight-test-root", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"mounting a tmpfs needs root (make test runs as root): {done.stderr}"
    try:
        assert shutil.disk_usage(path).free == 100 * 2**30
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


FREE_GB = 100 * 2**30 / 1e9
"""What the disk section sees free at `docker_root`: 107.4 GB."""


def test_disk_image_already_pulled(tmp_path: Path, docker_root: Path) -> None:
    fake_docker(tmp_path / "bin", docker_root, image_present=True)
    code, v = run(tmp_path, "--sections", "disk", "--image", "vllm/vllm-openai:x", "--disk-headroom-gb", "1")
    assert code == 0, v
    assert f"{FREE_GB:.1f} GB free at {docker_root} (docker root dir), need 1.0 GB" in v["evidence"][0]
    assert "already on this node: nothing to pull" in v["evidence"][1]


def test_disk_size_from_option_fails_with_numbers(tmp_path: Path, docker_root: Path) -> None:
    fake_docker(tmp_path / "bin", docker_root, image_present=False)
    headroom = FREE_GB - 30 + 5  # the pull needs 10 x 3 = 30 GB: 5 GB short
    code, v = run(tmp_path, "--sections", "disk", "--image", "vllm/vllm-openai:x", "--image-size-gb", "10",
                  "--disk-headroom-gb", f"{headroom:.3f}")
    text = " ".join(v["evidence"])
    assert code == 1, v
    assert "image 10.0 GB compressed (--image-size-gb)" in text
    assert "pulling needs 30.0 GB (compressed + unpacked at 2x)" in text
    assert "docker image prune" in v["next_step"]


class FakeRegistry(BaseHTTPRequestHandler):
    """The registry v2 manifest API with Docker Hub's Bearer-token challenge, as a real HTTP server."""

    port = 0
    host = "127.0.0.1"
    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        FakeRegistry.requests.append(self.path)
        if self.path.startswith("/token"):
            return self._json({"token": "t0k"})
        if self.headers.get("Authorization") != "Bearer t0k":
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{self.host}:{self.port}/token",'
                             'service="fake-registry",scope="repository:vllm/vllm-openai:pull"')
            self.end_headers()
            return None
        if self.path == "/v2/vllm/vllm-openai/manifests/nightly-x":
            return self._json({"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
                {"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
                {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}}]})
        if self.path == "/v2/vllm/vllm-openai/manifests/sha256:amd":
            return self._json({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"size": 20_000},
                               "layers": [{"size": 7_000_000_000}, {"size": 5_499_980_000}]})
        self.send_response(404)
        self.end_headers()
        return None

    def _json(self, body: dict) -> None:  # type: ignore[type-arg]
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_disk_size_from_the_registry(tmp_path: Path, docker_root: Path) -> None:
    """Bearer challenge, token, OCI index, this host's platform, layer sizes: over real HTTP on loopback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    FakeRegistry.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fake_docker(tmp_path / "bin", docker_root, image_present=False)
        image = f"127.0.0.1:{FakeRegistry.port}/vllm/vllm-openai:nightly-x"
        pull = 12.5 * 3
        code, v = run(tmp_path, "--sections", "disk", "--image", image,
                      "--disk-headroom-gb", f"{FREE_GB - pull - 5:.3f}")
        assert code == 0, v
        assert "image 12.5 GB compressed (2 layers in the 127.0.0.1" in v["evidence"][1]
        assert FakeRegistry.requests == ["/v2/vllm/vllm-openai/manifests/nightly-x",
                                         "/token?service=fake-registry&scope=repository%3Avllm%2Fvllm-openai%3Apull",
                                         "/v2/vllm/vllm-openai/manifests/nightly-x",
                                         "/v2/vllm/vllm-openai/manifests/sha256:amd"]
        code, v = run(tmp_path, "--sections", "disk", "--image", image,
                      "--disk-headroom-gb", f"{FREE_GB - pull + 5:.3f}")
        assert code == 1 and "pulling needs 37.5 GB" in " ".join(v["evidence"])
    finally:
        server.shutdown()


@pytest.mark.parametrize("config", [
    {"IndexConfigs": {"127.0.0.2:PORT": {"Name": "127.0.0.2:PORT", "Secure": False}}, "InsecureRegistryCIDRs": []},
    {"IndexConfigs": {}, "InsecureRegistryCIDRs": ["127.0.0.0/8"]},
    None,
], ids=["insecure-by-name", "insecure-by-cidr", "secure"])
def test_disk_asks_an_insecure_registry_over_http(tmp_path: Path, docker_root: Path,
                                                  config: dict[str, Any] | None) -> None:
    """A registry the node's Docker lists as insecure (daemon.json `insecure-registries`, by name or CIDR) is pulled
    from over plain HTTP, so its size is asked over HTTP too; any other is asked over HTTPS (found on the lab:
    the size of an image in a plain-HTTP registry was 'unknown', and 20 GB assumed)."""
    server = ThreadingHTTPServer(("127.0.0.2", 0), FakeRegistry)
    FakeRegistry.port, FakeRegistry.host = server.server_address[1], "127.0.0.2"
    FakeRegistry.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        text = json.dumps(config).replace("PORT", str(FakeRegistry.port)) if config else None
        fake_docker(tmp_path / "bin", docker_root, image_present=False,
                    registry_config=json.loads(text) if text else None)
        image = f"127.0.0.2:{FakeRegistry.port}/vllm/vllm-openai:nightly-x"
        code, v = run(tmp_path, "--sections", "disk", "--image", image, "--disk-headroom-gb", "1")
        evidence = " ".join(v["evidence"])
        if config is None:
            assert "not reachable or refused" in evidence and "assumed 20 GB" in evidence, v
            assert FakeRegistry.requests == [], "a secure registry is asked over HTTPS, which this one does not speak"
        else:
            assert code == 0 and "image 12.5 GB compressed" in evidence, v
    finally:
        server.shutdown()
        FakeRegistry.host = "127.0.0.1"


def test_model_ignores_the_syncs_own_lock_file(tmp_path: Path) -> None:
    """The weight sync leaves its (empty) lock file in the model directory: not an interrupted copy (found on the
    lab: every synced node failed the model section on `.weights-sync.lock`)."""
    model = make_model(tmp_path)
    (model / ".weights-sync.lock").write_bytes(b"")
    args = ["--sections", "model", "--model-dir", str(model), "--heads", "64", "--o-groups", "8"]
    code, v = run(tmp_path, *args)
    assert code == 0, v
    (model / "model-00003-of-00003.safetensors.weights-partial").write_bytes(b"")
    code, v = run(tmp_path, *args)
    assert code == 1 and "empty file(s)" in " ".join(v["evidence"]), "an empty partial file is still caught"


def test_disk_unknown_size_is_assumed_and_said(tmp_path: Path, docker_root: Path) -> None:
    fake_docker(tmp_path / "bin", docker_root, image_present=False)  # 60 GB to pull, 107 GB free
    with socket.socket() as probe:  # a port nothing listens on: the registry cannot be asked
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, v = run(tmp_path, "--sections", "disk", "--image", f"127.0.0.1:{port}/x/y:1", "--disk-headroom-gb", "0")
    assert code == 0, v
    assert "image size unknown: registry 127.0.0.1" in v["evidence"][1]
    assert "assumed 20 GB compressed" in v["evidence"][1]


def test_split_image_ref() -> None:
    assert split_image_ref("vllm/vllm-openai:nightly-1") == ("registry-1.docker.io", "vllm/vllm-openai", "nightly-1")
    assert split_image_ref("nginx") == ("registry-1.docker.io", "library/nginx", "latest")
    assert split_image_ref("reg.local:5000/a/b:t@sha256:" + "f" * 64) == ("reg.local:5000", "a/b", "sha256:" + "f" * 64)


def test_verdict_lists_passed_failed_and_not_run(tmp_path: Path) -> None:
    """One line names every section by outcome: a fail does not hide a section that could not run."""
    make_sysfs(tmp_path, {"mlx5_0:1": ("4: ACTIVE", "Ethernet", "RoCE v2")})
    code, v = run(tmp_path, *FABRIC, "--sections", "infiniband,hca,toolkit,sysctl", *_roots(tmp_path),
                  "--image", "img")
    assert code == 1, v
    summary = v["summary"]
    assert summary.startswith("1 failed: hca; 1 not run: toolkit (")
    assert summary.endswith("2 passed: infiniband, sysctl")
    assert "toolkit: " in " ".join(v["evidence"])  # the reason it did not run travels with the failure


def hanging(tmp: Path, name: str) -> None:
    """A tool that never answers, through a child process that keeps the pipes open (the hard case)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / name).write_text("#!/bin/sh\nsleep 600\necho never\n")
    (tmp / name).chmod(0o755)


def test_hung_docker_ends_in_a_verdict_within_the_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    hanging(tmp_path / "bin", "docker")
    hanging(tmp_path / "bin", "nvidia-smi")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    sections = ["ownership", "disk", "gpu", "toolkit", "memlock"]
    for name in sections:
        monkeypatch.setitem(preflight.SECTION_BUDGET_S, name, 2)
    started = time.monotonic()
    code = preflight.main(["--json", "--sections", ",".join(sections), "--docker-root", str(tmp_path),
                           "--image", "img", "--disk-headroom-gb", "0", "--container-names", "engine"])
    took = time.monotonic() - started
    v = json.loads(capsys.readouterr().out)
    # Each hung call's own timeout is 20 s or more: the 2 s budget cut it (the time left of it, whole seconds).
    hung = re.compile(r"(\w+): `[^`]+` did not answer within (\d+)s")
    cut = {m[1]: int(m[2]) for e in v["evidence"] if (m := hung.fullmatch(e))}
    assert set(cut) == {"ownership", "gpu"} and all(limit <= 2 for limit in cut.values()), v["evidence"]
    # The hung tools' children hold the pipes for 600 s: the run ending long before shows they were killed too (a
    # bound far from the ~4 s it takes, so a loaded machine cannot fail it).
    assert took < 120, took
    assert code == 2 and v["status"] == "cannot-run"
    assert "ownership (`docker ps -a -q` did not answer within 2s)" in v["summary"]
    assert "toolkit (skipped: `docker ps" in v["summary"] and "memlock (skipped: `docker ps" in v["summary"]
    assert "gpu (`nvidia-smi --query-gpu" in v["summary"]
    assert v["summary"].endswith("1 passed: disk")  # disk still checked the assumed root, without docker


def test_outer_timeout_covers_every_section() -> None:
    """The shell's `timeout` is the sum of the sections' budgets plus start-up: a section can never be cut off by it."""
    for sections in (preflight.BEFORE_PULL, preflight.AFTER_PULL, preflight.FABRIC, tuple(preflight.SECTIONS)):
        assert preflight.outer_timeout_s(sections) == preflight.STARTUP_S + sum(
            preflight.SECTION_BUDGET_S[s] for s in sections)
    # every call's own timeout fits its section (the section cuts longer ones to what is left)
    assert preflight.SECTION_BUDGET_S["toolkit"] > 300 and preflight.SECTION_BUDGET_S["memlock"] > 120
    assert preflight.SECTION_BUDGET_S["ownership"] > 20 + 30 + 20  # docker ps, docker inspect, nvidia-smi
    assert preflight.SECTION_BUDGET_S["disk"] > 20 + 20 + 2 * 10  # docker info, image inspect, 2 registry calls
    assert preflight.SECTION_BUDGET_S["gpu"] > 30


def test_every_planned_command_outlasts_its_inner_timeouts() -> None:
    """Each `timeout N` the program puts around a host check is longer than everything inside it."""
    from checks.verdict import LOG_TIMEOUT_S
    from components import check_commands as cc
    from stacks.model.loader import parse_config, read_stack_values
    from stacks.planner.plan import build_plan

    seen = set()
    for stack in ("prod", "h20"):
        config = parse_config(stack, read_stack_values(stack))
        plan = build_plan(stack, config)
        for check in plan.checks:
            if check.module == "checks.preflight":
                command, inner = cc.preflight_command(config, plan, check), preflight.outer_timeout_s(check.sections)
                assert int(command.split()[1]) == inner
                assert inner - preflight.STARTUP_S == sum(preflight.SECTION_BUDGET_S[s] for s in check.sections)
            elif check.module in ("checks.nccl_transport", "checks.engines"):
                command = (cc.nccl_command(config, plan, check) if check.module == "checks.nccl_transport"
                           else cc.engines_command(plan, check))
                assert int(command.split()[1]) >= LOG_TIMEOUT_S + preflight.STARTUP_S
            elif check.module == "checks.ray_cluster":
                command = cc.ray_ready_command(config, plan)
                assert int(command.split()[1]) > config.ray.cluster_ready_timeout_s + 60
            else:
                continue
            assert command.startswith("timeout "), command[:80]
            # sshd runs it as one `sh -c` argument: Linux caps a single argument at MAX_ARG_STRLEN = 128 KiB
            assert len(command.encode()) < 100 * 1024, (check.name, len(command.encode()))
            seen.add(check.module)
    assert seen == {"checks.preflight", "checks.nccl_transport", "checks.engines", "checks.ray_cluster"}


def test_shipped_script_with_a_hung_docker_is_not_exit_124(tmp_path: Path) -> None:
    """The exact shape of the remote command: `timeout N python3 - … <<EOF`, N from the sections."""
    hanging(tmp_path / "bin", "docker")
    sections = ["ownership", "toolkit"]
    command = heredoc_command("preflight", ["--json", "--sections", ",".join(sections), "--image", "img",
                                            "--call-timeout-s", "2", "--container-names", "engine"],
                              timeout_s=preflight.outer_timeout_s(sections))
    out = subprocess.run(["/bin/bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    v = json.loads(out.stdout)
    assert v["summary"].startswith("2 not run: ownership (`docker ps -a -q` did not answer within 2s), toolkit")


def test_bundled_script_runs_with_stdlib_only(tmp_path: Path) -> None:
    """What GpuNode ships over SSH: one script, no project on sys.path, plain `python3 -`."""
    script = remote_script("preflight")
    assert "from checks" not in script
    fake_bin(tmp_path / "bin", "nvidia-smi", (FIX / "nvidia_smi/h200x7_edited.csv").read_text())
    command = heredoc_command("preflight", ["--json", *GPU_ARGS], timeout_s=60)
    out = subprocess.run(["/bin/sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin",
                              "PYTHONPATH": ""})
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["status"] == "fail"
    assert command.startswith("timeout 60 python3 - --json")


@pytest.mark.parametrize(("sections", "message"), [("", "--sections '': empty; at least one of ownership"),
                                                   ("gpu,nope", "--sections 'gpu,nope': unknown nope")])
def test_no_or_unknown_sections_cannot_read_as_a_pass(sections: str, message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--sections ''` once printed `PASS … all 0 section(s) passed`: a preflight that checked nothing."""
    with pytest.raises(SystemExit) as exited:
        preflight.main(["--sections", sections])
    assert exited.value.code == 2
    assert message in capsys.readouterr().out


@pytest.mark.parametrize(("cgroup", "found"), [
    ("0::/system.slice/docker-{id}.scope\n", True),
    ("12:pids:/docker/{id}\n1:name=systemd:/docker/{id}\n", True),
    ("0::/vlab-lab1/{id}\n", True),  # dockerd's cgroup-parent: found on the lab, was "not this stack's"
    ("0::/kubepods/burstable/pod1234/{id}\n", True),
    ("0::/user.slice/user-0.slice/session-3.scope\n", False),
    ("0::/vlab-lab1/{id}0\n", False),  # 65 hex digits: no container id
])
def test_container_of_reads_the_id_wherever_docker_put_the_cgroup(tmp_path: Path, cgroup: str, found: bool) -> None:
    from checks.preflight import container_of

    cid = "0123456789abcdef" * 4
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(cgroup.format(id=cid))
    assert container_of(str(tmp_path), 42) == (cid if found else None)


def test_a_listen_socket_without_a_process_is_looked_at_again_before_it_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab run's update failed its ownership check on port 443: the front door's socket was seen between its
    process's exit and its close. Such a socket is read again; one that stays without a process is still reported."""
    from checks import preflight

    reads = iter([{443: [(None, None)]}, {443: [(None, None)]}, {443: []}])
    monkeypatch.setattr(preflight, "port_listeners", lambda procfs, ports: next(reads))
    slept: list[float] = []
    assert preflight.settled_listeners("/proc", [443], sleep=slept.append) == {443: []}
    assert slept == [1.0, 1.0]
    monkeypatch.setattr(preflight, "port_listeners", lambda procfs, ports: {443: [(None, None)]})
    slept.clear()
    assert preflight.settled_listeners("/proc", [443], sleep=slept.append) == {443: [(None, None)]}
    assert len(slept) == preflight.ORPHAN_RETRIES


def test_a_container_started_after_the_listing_is_looked_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab run's prefill/decode update failed its ownership check: the front door, replaced by the same update
    while the check ran, held port 443 from a container the check had not listed, so its nginx read as a foreign
    process. The containers are listed again while a listener's container is unknown; a process in no container
    at all is still reported, after those looks."""
    from types import SimpleNamespace

    ours = {"Id": "c" * 64, "Name": "/api-proxy", "State": {"Running": True},
            "Config": {"Labels": {"vllm-cluster.stack": "lab"}}, "HostConfig": {}, "NetworkSettings": {}}
    listings = iter([[], [ours]])
    monkeypatch.setattr(preflight, "_list_containers", lambda ctx: (next(listings), None))
    monkeypatch.setattr(preflight, "settled_listeners", lambda procfs, ports: {443: [(4242, "c" * 64)]})
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    args = SimpleNamespace(owned_label=("vllm-cluster.stack", "lab"), container_names=["engine"], ports=[443],
                           procfs_root="/proc", rehearsal=True)
    section = preflight.check_ownership(SimpleNamespace(args=args))  # type: ignore[arg-type]
    assert section.ok is True and slept == [1.0], section
    monkeypatch.setattr(preflight, "_list_containers", lambda ctx: ([ours], None))
    monkeypatch.setattr(preflight, "settled_listeners", lambda procfs, ports: {443: [(4242, None)]})
    slept.clear()
    section = preflight.check_ownership(SimpleNamespace(args=args))  # type: ignore[arg-type]
    assert section.ok is False and any("process 4242" in line for line in section.evidence), section
    assert len(slept) == preflight.ORPHAN_RETRIES
