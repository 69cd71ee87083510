"""Preflight against real captures (nvidia-smi on an H200) and trees built in temp dirs.

`nvidia-smi` and `docker` are small executables on PATH that print a captured output, so the check runs
exactly as on a host: a subprocess parsing real text. The shipped form (`checks.bundle`) is run too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks.bundle import heredoc_command, remote_script
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
    assert code == 1 and "num_attention_heads=128, the stack's profile assumes 64" in " ".join(v["evidence"])


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


def test_disk(tmp_path: Path) -> None:
    assert run(tmp_path, "--sections", "disk", "--docker-root", str(tmp_path), "--min-free-gb", "0.001")[0] == 0
    code, v = run(tmp_path, "--sections", "disk", "--docker-root", str(tmp_path), "--min-free-gb", "1e9")
    assert code == 1 and "need 1e+09 GB" in " ".join(v["evidence"])


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
