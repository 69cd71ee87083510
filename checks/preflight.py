"""Host preflight: prove a GPU host can run the engine before 511 GB of weights start loading.

Runs on the host over SSH with Python 3's standard library only (shipped by `checks.bundle`, with
`stacks.planner.memory` pasted in). Sections, in the order a deploy needs them:
- before the image pull (nothing here needs the image): ownership (containers this stack does not own holding
  the engine's container name, ports or GPUs: the seed's docker-compose deployment), disk (free space on Docker's
  storage for the pull), gpu, model (files, config.json, and per-GPU memory from the real safetensors headers);
- after the pull: toolkit, memlock (both run the image, `--pull never`);
- fabric (RdmaFabric): infiniband, hca, gid, sysctl;
- firewall: nft is there and answers, and the kernel's ephemeral range lies inside the one the host firewall
  guards (before the project's nftables table is applied).

On a rehearsal stack (`--rehearsal`: the stack declares no GPUs, docs/rehearsal.md) gpu, toolkit, memlock,
infiniband, hca and gid print `NOT RUN <section>: <why>` instead of running, and ownership leaves nvidia-smi out; the
rest run.

Every external call has its own timeout inside its section's budget (`SECTION_BUDGET_S`); the shell's outer
`timeout` is the sum plus start-up (`outer_timeout_s`), so a hung `docker` still ends in a verdict that names the
sections that did not run, never in exit 124.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import platform
import re
import shlex
import shutil
import signal
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.verdict import (
    REHEARSAL,
    CheckParser,
    Section,
    abs_path,
    check_name,
    combine,
    container_name,
    count,
    emit,
    image_ref,
    integer,
    listed,
    number,
    option_word,
    optional_abs_path,
    optional_label,
    port,
    port_range,
    printable_line,
    rehearsal_section,
    seconds,
    shown,
)
from stacks.planner.memory import (
    GB,
    HOST_GB_PER_RANK,
    RUNTIME_RESERVE_GB,
    gpu_memory,
    kv_bytes_per_token,
    kv_ratios,
    pp_partition,
    stage_splits,
    text_config,
)

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id",
             "--format=csv,noheader"]
COMPUTE_APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,gpu_uuid,used_memory",
                      "--format=csv,noheader"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")

SECTION_BUDGET_S = {
    "ownership": 90, "disk": 75, "gpu": 45, "model": 150, "toolkit": 330, "memlock": 130,
    "infiniband": 15, "hca": 15, "gid": 15, "sysctl": 15, "firewall": 30,
}
"""Seconds each section may take; its calls' timeouts are cut to what is left of it."""
STARTUP_S = 30
"""Interpreter start and reading the heredoc, on top of the sections."""
BEFORE_PULL = ("ownership", "disk", "gpu", "model")
"""Sections that need no image: run them before `RemoteImage` pulls ~20 GB."""
AFTER_PULL = ("toolkit", "memlock")
FABRIC = ("infiniband", "hca", "gid", "sysctl")

DEFAULT_PULL_GB = 20.0
"""Assumed compressed size of a vllm/vllm-openai image when the registry cannot be asked (issue 12: ~20 GB pull)."""
EXTRACT_RATIO = 2.0
"""Assumed unpacked/compressed ratio of image layers (gzip on CUDA and Python libraries); Docker holds the
downloaded layers and the unpacked ones at once while pulling, and the containerd image store keeps both."""
DISK_HEADROOM_GB = 10.0
"""Logs, the container's writable layer and /root/.cache on the same disk."""

OWNED_LABEL = "vllm-cluster.stack"
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_DIR = "com.docker.compose.project.working_dir"
COMPOSE_FILES = "com.docker.compose.project.config_files"


def outer_timeout_s(sections: Sequence[str]) -> int:
    """The shell `timeout` for one preflight run: every section's budget plus start-up, never less."""
    return STARTUP_S + sum(SECTION_BUDGET_S[s] for s in sections)


class Budget:
    """What is left of one section's time; every call takes min(its own timeout, what is left)."""

    def __init__(self, seconds: float, cap: float | None = None) -> None:
        self.end = time.monotonic() + seconds
        self.cap = cap

    def left(self, want: float) -> float:
        left = min(want, self.end - time.monotonic())
        return min(left, self.cap) if self.cap is not None else left


@dataclass
class Context:
    args: argparse.Namespace
    budget: Budget = field(default_factory=lambda: Budget(60))
    docker_down: str | None = None
    """Why docker is not usable (missing, or it did not answer): later docker sections do not run."""


def _run(ctx: Context, argv: list[str], timeout: float = 60) -> tuple[int | None, str]:
    """Run a command; (None, reason) when it cannot start or runs out of time. The whole process group is killed
    on timeout, so a child that keeps the pipes open cannot hang the check."""
    limit = ctx.budget.left(timeout)
    if limit <= 0.5:
        return None, f"{' '.join(argv[:2])}: no time left in this section"
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except FileNotFoundError:
        return None, f"{argv[0]} not found on PATH"
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"`{shlex.join(argv[:4])}` did not answer within {limit:.0f}s"
    return proc.returncode, (out + err).strip()


def _docker(ctx: Context, argv: list[str], timeout: float) -> tuple[int | None, str]:
    code, out = _run(ctx, ["docker", *argv], timeout)
    if code is None:
        ctx.docker_down = out
    return code, out


# ---------------------------------------------------------------------------------------------------- gpu


def parse_gpu_csv(text: str) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id`."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            rows.append({"index": parts[0], "name": parts[1], "uuid": parts[2], "memory": parts[3],
                         "driver": parts[4]})
    return rows


def _mib(memory: str) -> float:
    return float(memory.split()[0])


def check_gpu(ctx: Context) -> Section:
    a = ctx.args
    count, model, memory_gb = a.gpus, a.gpu_model, a.gpu_memory_gb
    code, out = _run(ctx, GPU_QUERY, 30)
    if code is None:
        return Section("gpu", None, [out], "install the NVIDIA driver (nvidia-smi) on the host")
    if code != 0:
        return Section("gpu", False, [f"nvidia-smi exit {code}: {out[-300:]}"], "fix the NVIDIA driver")
    rows = parse_gpu_csv(out)
    names = sorted({r["name"] for r in rows})
    evidence = [f"{len(rows)} GPU(s): {', '.join(names)}; driver {rows[0]['driver'] if rows else '?'}"]
    problems = []
    if len(rows) != count:
        problems.append(f"expected {count} GPUs, nvidia-smi shows {len(rows)}")
    wrong = [r for r in rows if model.lower() not in r["name"].lower()]
    if wrong:
        problems.append(f"GPU {wrong[0]['index']} is {wrong[0]['name']!r}, expected {model!r}")
    small = [r for r in rows if _mib(r["memory"]) * 1.048576 / 1000 < memory_gb * 0.95]
    if small:
        problems.append(f"GPU {small[0]['index']} has {small[0]['memory']}, expected ~{memory_gb:g} GB")
    if problems:
        return Section("gpu", False, evidence + problems,
                       "check `nvidia-smi -L` (a GPU fallen off the bus needs a reboot or RMA), or fix "
                       "nodes[].gpus in the stack config")
    return Section("gpu", True, evidence)


# ------------------------------------------------------------------------------------------ toolkit, memlock


def _image_missing(out: str) -> bool:
    return "No such image" in out or "pull access denied" in out or ("not found" in out.lower() and "image" in out)


def check_toolkit(ctx: Context) -> Section:
    a = ctx.args
    if ctx.docker_down:
        return Section("toolkit", None, [f"skipped: {ctx.docker_down}"], "make `docker info` answer on the host")
    code, out = _docker(ctx, ["run", "--rm", "--pull", "never", "--gpus", "all", "--entrypoint", "nvidia-smi",
                              a.image, "-L"], 300)
    if code is None:
        return Section("toolkit", None, [out], "install Docker on the host / make `docker info` answer")
    if code != 0 and _image_missing(out):
        return Section("toolkit", None, [f"image {a.image} is not on this node yet: {out[-200:]}"],
                       "run this section after the image pull")
    seen = [line for line in out.splitlines() if line.startswith("GPU ")]
    if code != 0 or len(seen) != a.gpus:
        return Section("toolkit", False, [f"docker run --gpus all exit {code}, {len(seen)} GPU(s): {out[-300:]}"],
                       "install/configure the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker"
                       " && systemctl restart docker)")
    return Section("toolkit", True, [f"a container with --gpus all sees {len(seen)} GPU(s)"])


def check_memlock(ctx: Context) -> Section:
    if ctx.docker_down:
        return Section("memlock", None, [f"skipped: {ctx.docker_down}"], "make `docker info` answer on the host")
    code, out = _docker(ctx, ["run", "--rm", "--pull", "never", "--ulimit", "memlock=-1:-1", "--entrypoint",
                              "/bin/sh", ctx.args.image, "-c", "ulimit -l"], 120)
    if code is None:
        return Section("memlock", None, [out], "install Docker on the host / make `docker info` answer")
    if code != 0 and _image_missing(out):
        return Section("memlock", None, [f"image {ctx.args.image} is not on this node yet: {out[-200:]}"],
                       "run this section after the image pull")
    value = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0 or value != "unlimited":
        shown_out = value if code == 0 else " ".join(out.split())[-300:]
        return Section("memlock", False, [f"ulimit -l in the container: {shown_out!r}"],
                       "allow unlimited memlock for containers (dockerd default-ulimits or LimitMEMLOCK=infinity)")
    return Section("memlock", True, ["ulimit -l inside the container: unlimited"])


# ------------------------------------------------------------------------------------------------- model


SYNC_FILES_PREFIX = ".weights-"
"""The weight sync's own files in the model directory (checks/weights_verify.py: its manifest, journal and the empty
lock file it holds while it writes): never an interrupted copy."""


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: 8-byte little-endian length, then that many bytes of JSON."""
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError("shorter than the 8-byte header length")
        (size,) = struct.unpack("<Q", head)
        if size > 100_000_000:
            raise ValueError(f"header length {size} is not plausible")
        data = handle.read(size)
    header = json.loads(data)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


class OutOfTime(Exception):
    """A section's budget ran out between two file reads (a slow or hung network filesystem)."""


def tensor_bytes(root: Path, shards: Sequence[str], budget: Budget | None = None) -> tuple[dict[str, int], list[str]]:
    """Exact bytes of every tensor (`data_offsets`) from the shards' headers, and the shards that could not be read."""
    sizes: dict[str, int] = {}
    bad: list[str] = []
    for done, shard in enumerate(shards):
        if budget is not None and budget.left(1) <= 0:
            raise OutOfTime(f"read {done} of {len(shards)} shard headers before the section's time ran out")
        try:
            header = read_safetensors_header(root / shard)
            for name, info in header.items():
                if name != "__metadata__" and isinstance(info, dict):
                    start, end = info["data_offsets"]
                    sizes[name] = int(end) - int(start)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            bad.append(f"{shard}: {exc}")
    return sizes, bad


def _meminfo_gb(procfs: str, key: str) -> float | None:
    try:
        for line in (Path(procfs) / "meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0]) * 1024 / GB
    except (OSError, ValueError, IndexError):
        return None
    return None


def model_memory(root: Path, cfg: dict[str, object], shards: list[str], a: argparse.Namespace,
                 clock: Budget | None = None) -> tuple[list[str], list[str], str | None]:
    """(evidence, problems, next step) of the per-GPU memory recomputed from the real files."""
    sizes, bad = tensor_bytes(root, shards, clock)
    if bad:
        return [], [f"{len(bad)} shard header(s) unreadable, e.g. {bad[0]}"], None
    layers = cfg.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        return [], ["config.json has no num_hidden_layers: cannot place weights on PP stages"], None
    pp, dtype = a.pp, a.kv_cache_dtype
    ratios = kv_ratios(cfg)
    bounds = pp_partition(layers, pp)
    if ratios is not None:
        kv = [kv_bytes_per_token(ratios[lo:hi], dtype, int(str(cfg.get("head_dim", 512)))) for lo, hi in bounds]
        kv_source = "layer_types/compress_rates of config.json"
    else:
        kv = [a.kv_fallback_bytes] * pp
        kv_source = "the profile (config.json has no layer_types/compress_rates)"
    engram_on_gpu = a.engram == "gpu"
    stages = stage_splits(sizes, layers, pp)
    per_routed = a.redundant_experts / a.routed_experts if a.routed_experts else 0.0
    per_stage = [gpu_memory(stage, tensor=a.tp, data=a.dp, engram_on_gpu=engram_on_gpu, engram_shards=a.engram_shards,
                            engram_copies_per_node=0, kv_per_token=kv[i], max_model_len=a.max_model_len,
                            reserve_gb=a.reserve_gb, redundant_per_routed=per_routed)
                 for i, stage in enumerate(stages)]
    worst = max(range(pp), key=lambda i: per_stage[i].total)
    gpu = per_stage[worst]
    budget = a.gpu_memory_gb * a.gpu_memory_utilization
    total_gb = sum(sizes.values()) / GB
    stage = f" (PP stage {worst} of {pp})" if pp > 1 else ""
    evidence = [f"{len(sizes)} tensors, {total_gb:.1f} GB in the safetensors headers; per GPU{stage}: {gpu.text()} "
                f"(KV from {kv_source}) of {a.gpu_memory_gb:g} GB x {a.gpu_memory_utilization:g} = {budget:.1f} GB"]
    if a.planned_gb is not None:
        evidence.append(f"the plan assumed {a.planned_gb:.1f} GB per GPU from the profile; the files give "
                        f"{gpu.total:.1f} GB")
    problems: list[str] = []
    step = None
    if gpu.weights > budget:
        problems.append(f"weights do not fit: {gpu.weights_text()} per GPU > {budget:.1f} GB")
        step = ("more GPUs per copy (DP ranks spread the experts), larger GPUs, or Engram in host memory "
                "(--engram-config '{\"cpu_offload\": true}')")
    elif gpu.total > budget:
        problems.append(f"the KV cache of one {a.max_model_len}-token sequence does not fit: {gpu.total:.1f} GB per "
                        f"GPU > {budget:.1f} GB; max_model_len <= {gpu.max_len_that_fits(budget)} fits")
        step = ("lower serving.max_model_len (the plan's figures came from the profile: "
                "fix stacks/planner/model_cards.py too)")
    host_need = 0.0 if engram_on_gpu else sum(s.engram_gb for s in stages) * a.engram_copies
    if host_need:
        need = host_need + HOST_GB_PER_RANK * a.ranks_on_node
        total = _meminfo_gb(a.procfs_root, "MemTotal")
        if total is None:
            evidence.append(f"Engram tables need ~{host_need:.0f} GB of pinned host memory; MemTotal unreadable")
        elif total < need:
            problems.append(f"host memory {total:.0f} GB < {need:.0f} GB: {host_need:.0f} GB of Engram tables "
                            f"pinned in RAM + {HOST_GB_PER_RANK:g} GB x {a.ranks_on_node} worker processes")
            step = step or "more RAM, or Engram on the GPUs (--engram-config '{\"cpu_offload\": false}') if they fit"
        else:
            evidence.append(f"host memory {total:.0f} GB >= {need:.0f} GB (Engram tables {host_need:.0f} GB pinned)")
    return evidence, problems, step


def check_model(ctx: Context) -> Section:
    a = ctx.args
    root = Path(a.model_dir)
    if not root.is_dir():
        return Section("model", False, [f"{a.model_dir} is not a directory"],
                       "copy the model to the same path on every node (model.host_dir/model.path)")
    problems: list[str] = []
    evidence: list[str] = []
    config_path = root / "config.json"
    raw: dict[str, object] = {}
    try:
        loaded = json.loads(config_path.read_text())
        raw = loaded if isinstance(loaded, dict) else {}
    except FileNotFoundError:
        problems.append("config.json missing")
    except ValueError as exc:
        problems.append(f"config.json is not JSON: {exc}")
    cfg = text_config(raw)
    tokenizers = [name for name in TOKENIZER_FILES if (root / name).is_file()]
    if not tokenizers:
        problems.append(f"no tokenizer file ({', '.join(TOKENIZER_FILES)})")
    index_path = root / "model.safetensors.index.json"
    shards: list[str] = []
    if index_path.is_file():
        try:
            shards = sorted(set(json.loads(index_path.read_text()).get("weight_map", {}).values()))
        except ValueError as exc:
            problems.append(f"model.safetensors.index.json is not JSON: {exc}")
        missing = [s for s in shards if not (root / s).is_file()]
        if missing:
            problems.append(f"{len(missing)} of {len(shards)} shard(s) missing, e.g. {missing[0]}")
    else:
        shards = sorted(p.name for p in root.glob("*.safetensors"))
        if not shards:
            problems.append("no model.safetensors.index.json and no *.safetensors")
    empty = sorted(p.name for p in root.iterdir()
                   if p.is_file() and p.stat().st_size == 0 and not p.name.startswith(SYNC_FILES_PREFIX))
    if empty:
        problems.append(f"{len(empty)} empty file(s), e.g. {empty[0]} (interrupted copy?)")
    for key, expected in (("num_attention_heads", a.heads), ("o_groups", a.o_groups)):
        if expected is None:
            continue
        actual = cfg.get(key)
        if actual is None:
            evidence.append(f"config.json has no {key}; profile value {expected} unverified")
        elif actual != expected:
            problems.append(f"config.json {key}={actual}, the stack's model card says {expected}")
    evidence.insert(0, f"{len(shards)} shard(s), tokenizer: {', '.join(tokenizers) or 'none'}")
    step = ("re-copy the model directory (compare `sha256sum` with a good node), or regenerate the model card "
            "(python -m stacks model-card <model dir> --name <model.profile>) when config.json is right")
    if a.tp and not problems:
        try:
            more, memory_problems, memory_step = model_memory(root, cfg, shards, a, ctx.budget)
        except OutOfTime as exc:
            return Section("model", None, [str(exc), *evidence],
                           "check the model filesystem's speed (a network mount?); the files themselves were found")
        evidence += more
        problems += memory_problems
        step = memory_step or step
    if problems:
        return Section("model", False, evidence + problems, step)
    return Section("model", True, evidence)


# -------------------------------------------------------------------------------------------------- disk


def split_image_ref(ref: str) -> tuple[str, str, str]:
    """(registry host, repository, tag or digest) the way Docker resolves a reference."""
    name, _, digest = ref.partition("@")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = "registry-1.docker.io", name
        if "/" not in path:
            path = f"library/{path}"
    last = path.rsplit("/", 1)[-1]
    tag = ""
    if ":" in last:
        path, tag = path.rsplit(":", 1)
    return host, path, digest or tag or "latest"


_MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"))


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def insecure_registry(ctx: Context, host: str) -> bool:
    """Does this node's Docker pull from `host` over plain HTTP? Loopback registries, and those its daemon lists as
    insecure (`insecure-registries` in daemon.json: by name in RegistryConfig.IndexConfigs, or by CIDR); Docker then
    speaks HTTP to them, so asking them over HTTPS would only fail (moby registry/config.go `isSecureIndex`)."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name.strip("[]") in ("localhost", "127.0.0.1", "::1"):
        return True
    if ctx.docker_down:
        return False
    code, out = _docker(ctx, ["info", "--format", "{{json .RegistryConfig}}"], 20)
    try:
        config = json.loads(out) if code == 0 else {}
    except ValueError:
        return False
    entry = (config.get("IndexConfigs") or {}).get(host)
    if isinstance(entry, dict) and entry.get("Secure") is False:
        return True
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    for cidr in config.get("InsecureRegistryCIDRs") or []:
        with contextlib.suppress(ValueError, TypeError):
            if address in ipaddress.ip_network(str(cidr), strict=False):
                return True
    return False


def registry_image_gb(ctx: Context, ref: str, timeout: float = 10) -> tuple[float | None, str]:
    """Compressed size of the image for this host's platform, from the registry's manifests (Bearer token flow of
    the registry v2 API; Docker Hub included); (None, why) when it cannot be asked."""
    host, repo, reference = split_image_ref(ref)
    scheme = "http" if insecure_registry(ctx, host) else "https"
    token: str | None = None

    def get(url: str) -> dict[str, Any]:
        nonlocal token
        for _ in range(2):
            headers = {"Accept": _MANIFEST_TYPES}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                            timeout=max(1.0, ctx.budget.left(timeout))) as response:
                    body = json.loads(response.read())
                    return body if isinstance(body, dict) else {}
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "")
                if exc.code != 401 or token or not challenge.lower().startswith("bearer "):
                    raise
                params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
                query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
                with urllib.request.urlopen(f"{params['realm']}?{query}",
                                            timeout=max(1.0, ctx.budget.left(timeout))) as response:
                    answer = json.loads(response.read())
                token = answer.get("token") or answer.get("access_token")
        raise ValueError("the registry refused the token")

    base = f"{scheme}://{host}/v2/{repo}/manifests/"
    try:
        manifest = get(base + reference)
        if "manifests" in manifest:
            arch = _arch()
            match = [m for m in manifest["manifests"]
                     if (m.get("platform") or {}).get("os") == "linux"
                     and (m.get("platform") or {}).get("architecture") == arch]
            if not match:
                return None, f"{ref} has no linux/{arch} image in its index"
            manifest = get(base + match[0]["digest"])
        layers = manifest.get("layers", [])
        size = sum(int(layer.get("size", 0)) for layer in layers) + int(manifest.get("config", {}).get("size", 0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"registry {host} not reachable or refused ({str(exc)[:120]})"
    return size / GB, f"{len(layers)} layers in the {host} manifest"


def _docker_storage(ctx: Context) -> tuple[str, str]:
    """Where pulled layers land: the containerd snapshotter's root, or Docker's root dir."""
    code, out = _docker(ctx, ["info", "--format", "{{.DockerRootDir}}|{{json .DriverStatus}}"], 20)
    if code != 0 or "|" not in out:
        return ctx.args.docker_root, f"docker info unavailable ({out[-120:]}); assumed {ctx.args.docker_root}"
    root, _, status = out.strip().partition("|")
    if "io.containerd.snapshotter" in status:
        return ctx.args.containerd_root, "containerd image store"
    return root, "docker root dir"


def check_disk(ctx: Context) -> Section:
    a = ctx.args
    path, where = _docker_storage(ctx) if not ctx.docker_down else (a.docker_root, "docker unavailable")
    evidence: list[str] = []
    pull_gb = 0.0
    if a.image and not ctx.docker_down:
        code, _ = _docker(ctx, ["image", "inspect", "--format", "{{.Id}}", a.image], 20)
        if code == 0:
            evidence.append(f"image {a.image} is already on this node: nothing to pull")
        else:
            compressed, how = ((a.image_size_gb, "--image-size-gb") if a.image_size_gb
                               else registry_image_gb(ctx, a.image))
            if compressed is None:
                evidence.append(f"image size unknown: {how}; assumed {DEFAULT_PULL_GB:g} GB compressed")
                compressed = DEFAULT_PULL_GB
            else:
                evidence.append(f"image {compressed:.1f} GB compressed ({how})")
            pull_gb = compressed * (1 + EXTRACT_RATIO)
    need = pull_gb + a.disk_headroom_gb
    target = Path(path)
    while not target.exists() and target != target.parent:
        target = target.parent
    free_gb = shutil.disk_usage(target).free / GB
    evidence.insert(0, f"{free_gb:.1f} GB free at {target} ({where}), need {need:.1f} GB")
    if free_gb < need:
        detail = (f"pulling needs {pull_gb:.1f} GB (compressed + unpacked at {EXTRACT_RATIO:g}x) + "
                  f"{a.disk_headroom_gb:g} GB headroom" if pull_gb else f"{a.disk_headroom_gb:g} GB headroom")
        return Section("disk", False, [*evidence, detail],
                       "free space before pulling (docker image prune; old engine images that no rollback needs), "
                       "or move Docker's data-root to a larger disk")
    return Section("disk", True, evidence)


# --------------------------------------------------------------------------------------------- ownership


@dataclass
class Holder:
    """Something this stack does not own that holds what the engine needs."""

    ident: str
    description: str
    holds: list[str] = field(default_factory=list)
    remedy: str = ""


def parse_listeners(text: str) -> dict[int, list[int]]:
    """LISTEN sockets of /proc/net/tcp or tcp6: port -> socket inodes."""
    out: dict[int, list[int]] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 9 and parts[3] == "0A":
            port = int(parts[1].rsplit(":", 1)[1], 16)
            out.setdefault(port, []).append(int(parts[9]))
    return out


def socket_pids(procfs: str, inodes: set[int]) -> dict[int, int]:
    """inode -> pid of a process holding that socket (reading /proc/*/fd needs root for other users' processes)."""
    found: dict[int, int] = {}
    wanted = {f"socket:[{i}]": i for i in inodes}
    for proc in Path(procfs).iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target in wanted:
                    found[wanted[target]] = int(proc.name)
        except OSError:
            continue
        if len(found) == len(wanted):
            break
    return found


_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


def container_of(procfs: str, pid: int) -> str | None:
    """The Docker container id a process runs in, from /proc/<pid>/cgroup: the 64-hex-digit segment of its cgroup
    path, wherever dockerd put it (cgroup v1 `/docker/<id>`, v2 with systemd `docker-<id>.scope`, and under a
    daemon's `cgroup-parent`, `/<parent>/<id>`: the lab's nodes, where this stack's own engine was taken for a
    foreign process); callers only trust an id that `docker ps` lists."""
    try:
        match = _CONTAINER_ID.search((Path(procfs) / str(pid) / "cgroup").read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def _comm(procfs: str, pid: int) -> str:
    try:
        return (Path(procfs) / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "?"


def parse_compute_apps(text: str) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv,noheader`."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            rows.append({"pid": parts[0], "name": parts[1], "gpu": parts[2], "memory": parts[3]})
    return rows


def requests_gpus(info: dict[str, Any]) -> bool:
    """A container created with `--gpus` / compose `gpus:` (DeviceRequests), the nvidia runtime or /dev/nvidia*."""
    host = info.get("HostConfig") or {}
    for request in host.get("DeviceRequests") or []:
        caps = [c for group in request.get("Capabilities") or [] for c in group]
        if request.get("Driver") == "nvidia" or "gpu" in caps:
            return True
    if host.get("Runtime") == "nvidia":
        return True
    return any(str(d.get("PathOnHost", "")).startswith("/dev/nvidia") for d in host.get("Devices") or [])


def published_ports(info: dict[str, Any]) -> set[int]:
    ports = (info.get("NetworkSettings") or {}).get("Ports") or {}
    return {int(b["HostPort"]) for bindings in ports.values() for b in bindings or [] if b.get("HostPort")}


def describe(info: dict[str, Any]) -> tuple[str, str]:
    """(description, the command that removes it) for a container this stack does not own."""
    labels = (info.get("Config") or {}).get("Labels") or {}
    name = str(info.get("Name", "")).lstrip("/")
    state = (info.get("State") or {}).get("Status", "?")
    image = (info.get("Config") or {}).get("Image", "?")
    project = labels.get(COMPOSE_PROJECT)
    if labels.get(OWNED_LABEL):
        # Another stack of this program: its own `pulumi destroy` is the clean way; the name alone also works.
        return (f"container {name} ({state}, image {image}, of vllm-cluster stack {labels[OWNED_LABEL]})",
                f"docker rm -f {shlex.quote(name)}")
    if project:
        files = labels.get(COMPOSE_FILES) or "?"
        where = f", service {labels.get(COMPOSE_SERVICE, '?')} of compose project {project} ({files})"
        # Compose v2 takes a project by name alone (cmd/compose/compose.go, projectOrName): no file needed.
        return f"container {name} ({state}, image {image}{where})", f"docker compose -p {shlex.quote(project)} down"
    return f"container {name} ({state}, image {image})", f"docker rm -f {shlex.quote(name)}"


def ownership_holders(containers: list[dict[str, Any]], owned: list[tuple[str, str]], names: list[str],
                      ports: list[int], listeners: dict[int, list[tuple[int | None, str | None]]],
                      gpu_apps: list[tuple[dict[str, str], str | None]], procfs: str) -> list[Holder]:
    """Who, not owned by this stack, holds a container name, a port or a GPU.

    `listeners`: port -> (pid, container id) of each LISTEN socket; `gpu_apps`: nvidia-smi rows with the
    container id of their pid."""
    def is_owned(info: dict[str, Any]) -> bool:
        labels = (info.get("Config") or {}).get("Labels") or {}
        return any(labels.get(k) == v for k, v in owned)

    by_id = {str(c.get("Id")): c for c in containers}
    holders: dict[str, Holder] = {}

    def hold(key: str, description: str, remedy: str, what: str) -> None:
        holder = holders.setdefault(key, Holder(key, description, [], remedy))
        if what not in holder.holds:
            holder.holds.append(what)

    def container_holds(info: dict[str, Any], what: str) -> None:
        if not is_owned(info):
            description, remedy = describe(info)
            hold(str(info.get("Id")), description, remedy, what)

    for info in containers:
        name = str(info.get("Name", "")).lstrip("/")
        running = bool((info.get("State") or {}).get("Running"))
        if name in names:
            container_holds(info, f"the container name {name}")
        if running:
            for port in sorted(published_ports(info) & set(ports)):
                container_holds(info, f"port {port} (published)")
            if requests_gpus(info):
                container_holds(info, "the GPUs (--gpus / DeviceRequests)")
    published = {p for c in containers if (c.get("State") or {}).get("Running") for p in published_ports(c)}
    for port in ports:
        if port in published:
            continue  # docker-proxy listens for the publishing container, attributed above
        for pid, cid in listeners.get(port, []):
            if cid is not None and cid in by_id:
                container_holds(by_id[cid], f"port {port} (listening, host network)")
            elif pid is None:
                hold(f"port-{port}", f"a process this check cannot see (run it as root; `ss -ltnp 'sport = :{port}'`)",
                     f"ss -ltnp 'sport = :{port}'", f"port {port}")
            else:
                hold(f"pid-{pid}", f"process {pid} ({_comm(procfs, pid)})", f"kill {pid}", f"port {port}")
    for row, cid in gpu_apps:
        what = f"GPU {row['gpu']} ({row['memory']}, {row['name']})"
        if cid is not None and cid in by_id:
            container_holds(by_id[cid], what)
        elif cid is None:
            pid = int(row["pid"])
            hold(f"pid-{pid}", f"process {pid} ({_comm(procfs, pid)})", f"kill {pid}", what)
    return sorted(holders.values(), key=lambda h: (not h.description.startswith("container "), h.description))


ORPHAN_RETRIES = 5
"""Looks again, a second apart, while a LISTEN socket on a wanted port has no process: one seen between its
process's exit and the socket's close (a lab run's front door, once) is gone by then; one that stays is reported."""


def port_listeners(procfs: str, ports: list[int]) -> dict[int, list[tuple[int | None, str | None]]]:
    """port -> (pid, container id) of each LISTEN socket on it (tcp and tcp6), from /proc: pid None when no
    process holds the socket's inode."""
    sockets: dict[int, list[int]] = {}
    for proto in ("tcp", "tcp6"):
        try:
            for port, inodes in parse_listeners((Path(procfs) / "net" / proto).read_text()).items():
                sockets.setdefault(port, []).extend(inodes)
        except OSError:
            pass
    wanted = {i for p in ports for i in sockets.get(p, [])}
    pids = socket_pids(procfs, wanted) if wanted else {}
    return {p: [(pids.get(i), container_of(procfs, pids[i]) if i in pids else None) for i in sockets.get(p, [])]
            for p in ports}


def settled_listeners(procfs: str, ports: list[int], sleep: Callable[[float], None] = time.sleep
                      ) -> dict[int, list[tuple[int | None, str | None]]]:
    """`port_listeners`, read again (ORPHAN_RETRIES times, a second apart) while a socket has no process: a socket
    whose process is exiting has none for a moment."""
    listeners = port_listeners(procfs, ports)
    for _ in range(ORPHAN_RETRIES):
        if not any(pid is None for held in listeners.values() for pid, _ in held):
            break
        sleep(1.0)
        listeners = port_listeners(procfs, ports)
    return listeners


def _list_containers(ctx: Context) -> tuple[list[dict[str, Any]], Section | None]:
    """Every container on the host, inspected; or the ownership section that says why they could not be listed."""
    code, out = _docker(ctx, ["ps", "-a", "-q", "--no-trunc"], 20)
    if code is None or code != 0:
        return [], Section("ownership", None, [out[-200:] if code is None else f"docker ps exit {code}: {out[-200:]}"],
                           "make `docker info` answer on the host")
    ids = out.split()
    if not ids:
        return [], None
    code, out = _docker(ctx, ["inspect", *ids], 30)
    try:
        # A container removed since `ps` makes inspect exit 1 ("No such object") after it printed the others
        # (stdout, read first): those are still checked, not dropped with it.
        containers = json.JSONDecoder().raw_decode(out)[0] if code == 0 or "No such" in out else []
    except ValueError:
        containers = []
    if code != 0 and "No such" not in out:
        return [], Section("ownership", None, [f"docker inspect: {out[-200:]}"], "make `docker info` answer")
    return containers, None


def check_ownership(ctx: Context) -> Section:
    a = ctx.args
    owned = [a.owned_label] if a.owned_label else []
    names, ports = a.container_names, a.ports
    if not names and not ports:
        return Section("ownership", None, ["nothing to check: no --container-names and no --ports given"],
                       "pass the engine's container names and ports (the plan's preflight command does)")
    containers, failed = _list_containers(ctx)
    if failed is not None:
        return failed
    listeners = settled_listeners(a.procfs_root, ports)
    for _ in range(ORPHAN_RETRIES):
        # A process in no container listed: a container started after the listing (another resource of the same
        # update, e.g. the front door replaced while this runs: seen on the lab), or one exiting. Look again.
        known = {str(c.get("Id")) for c in containers}
        if not any(pid is not None and (cid is None or cid not in known)
                   for held in listeners.values() for pid, cid in held):
            break
        time.sleep(1.0)
        containers, failed = _list_containers(ctx)
        if failed is not None:
            return failed
        listeners = settled_listeners(a.procfs_root, ports)
    evidence: list[str] = []
    gpu_apps: list[tuple[dict[str, str], str | None]] = []
    if a.rehearsal:
        evidence.append(f"NOT RUN GPU processes: {REHEARSAL}: nvidia-smi is not asked who holds a GPU")
    else:
        code, apps = _run(ctx, COMPUTE_APPS_QUERY, 20)
        if code == 0:
            gpu_apps = [(row, container_of(a.procfs_root, int(row["pid"]))) for row in parse_compute_apps(apps)]
        else:
            evidence.append(f"GPU processes not checked: {apps[-120:]}")
    holders = ownership_holders(containers, owned, names, ports, listeners, gpu_apps, a.procfs_root)
    seen = (f"{len(containers)} container(s), ports {', '.join(map(str, ports)) or 'none'}, "
            f"{len(gpu_apps)} GPU process(es)")
    if not holders:
        return Section("ownership", True, [f"nothing this stack does not own holds {', '.join(names)}; {seen}",
                                           *evidence])
    remedies = list(dict.fromkeys(h.remedy for h in holders))
    lines = [f"{h.description} holds {', '.join(h.holds)}" for h in holders]
    return Section("ownership", False, [*lines, seen, *evidence],
                   "these are not this stack's (an earlier docker-compose or manual deployment?): stop them on this "
                   f"node with `{'; '.join(remedies)}`, then run the deploy again "
                   "(docs/deploy.md: From docker-compose)")


# ------------------------------------------------------------------------------------------------ fabric


def check_infiniband(ctx: Context) -> Section:
    ib = Path(ctx.args.dev_root) / "infiniband"
    if not ib.is_dir():
        return Section("infiniband", False, [f"{ib} does not exist"],
                       "load the RDMA drivers (mlx5_ib, ib_uverbs) and install rdma-core")
    uverbs = sorted(p.name for p in ib.iterdir() if p.name.startswith("uverbs"))
    if not uverbs:
        return Section("infiniband", False, [f"{ib} has no uverbs device"], "modprobe ib_uverbs")
    return Section("infiniband", True, [f"{ib}: {', '.join(uverbs)}"])


def _port_dir(sysfs: str, hca: str) -> Path:
    dev, _, port = hca.partition(":")
    return Path(sysfs) / "class" / "infiniband" / dev / "ports" / (port or "1")


def check_hca(ctx: Context) -> Section:
    sysfs, hcas, link_layer = ctx.args.sysfs_root, ctx.args.hcas, ctx.args.link_layer
    if not hcas:
        return Section("hca", None, ["nothing to check: no --hcas given"],
                       "list the node's HCAs (nodes[].hcas), or leave the hca section out")
    evidence, problems = [], []
    for hca in hcas:
        port = _port_dir(sysfs, hca)
        try:
            state = (port / "state").read_text().strip()
            layer = (port / "link_layer").read_text().strip()
        except FileNotFoundError:
            problems.append(f"{hca}: no such HCA port under {port.parent.parent.parent}")
            continue
        evidence.append(f"{hca} {state} {layer}")
        if "ACTIVE" not in state:
            problems.append(f"{hca} port state {state!r}, expected 4: ACTIVE")
        if layer != link_layer:
            problems.append(f"{hca} link layer {layer}, expected {link_layer}")
    if problems:
        return Section("hca", False, evidence + problems,
                       "check cabling and switch port (ibv_devinfo), or fix nodes[].hcas in the stack config")
    return Section("hca", True, evidence)


def check_gid(ctx: Context) -> Section:
    sysfs, hcas, gid_index = ctx.args.sysfs_root, ctx.args.hcas, ctx.args.gid_index
    if gid_index is None or not hcas:
        return Section("gid", None, ["nothing to check: " + ("no --gid-index given (NCCL picks the GID)"
                                                             if gid_index is None else "no --hcas given")],
                       "set nodes[].gid_index and nodes[].hcas, or leave the gid section out")
    evidence, problems = [], []
    for hca in hcas:
        path = _port_dir(sysfs, hca) / "gid_attrs" / "types" / str(gid_index)
        try:
            kind = path.read_text().strip()
        except (FileNotFoundError, OSError):
            problems.append(f"{hca}: GID index {gid_index} has no type ({path})")
            continue
        evidence.append(f"{hca} GID[{gid_index}] {kind}")
        if kind.lower() != "roce v2":
            problems.append(f"{hca} GID[{gid_index}] is {kind!r}, expected 'RoCE v2'")
    if problems:
        return Section("gid", False, evidence + problems,
                       "run `show_gids` and set nodes[].gid_index to the RoCE v2 entry of the data IP")
    return Section("gid", True, evidence)


def check_sysctl(ctx: Context) -> Section:
    evidence, problems, warnings = [], [], []
    nics = ctx.args.nics
    if not nics:
        return Section("sysctl", None, ["nothing to check: no --nics given"],
                       "list the node's data-plane NICs (nodes[].nics), or leave the sysctl section out")
    conf = Path(ctx.args.procfs_root) / "sys" / "net" / "ipv4" / "conf"
    for nic in nics:
        values = {}
        for key in ("rp_filter", "arp_ignore", "arp_announce"):
            try:
                values[key] = int((conf / nic / key).read_text().strip())
            except (FileNotFoundError, ValueError):
                values[key] = -1
        if values["rp_filter"] == -1:
            problems.append(f"{nic}: no such interface ({conf / nic})")
            continue
        evidence.append(f"{nic} rp_filter={values['rp_filter']} arp_ignore={values['arp_ignore']} "
                        f"arp_announce={values['arp_announce']}")
        if values["rp_filter"] == 1:
            problems.append(f"{nic} rp_filter=1 (strict) drops RoCE v2 replies on multi-NIC hosts")
        if len(nics) > 1 and (values["arp_ignore"] != 1 or values["arp_announce"] != 2):
            warnings.append(f"{nic}: arp_ignore=1/arp_announce=2 recommended with several NICs")
    if problems:
        return Section("sysctl", False, evidence + problems + warnings,
                       "sysctl -w net.ipv4.conf.<nic>.rp_filter=2 (loose) and persist it in /etc/sysctl.d")
    return Section("sysctl", True, evidence + warnings)


def check_firewall(ctx: Context) -> Section:
    """nft must exist and answer (root), and the kernel's ephemeral port range must lie inside the range the
    firewall guards: an OS-picked listener port outside it would be left open to every source."""
    procfs, (want_low, want_high) = ctx.args.procfs_root, ctx.args.ephemeral_ports
    code, out = _run(ctx, ["nft", "--version"], 30)
    if code is None:
        return Section("firewall", False, [out], "apt-get install nftables (or dnf install nftables), or set "
                       "firewall.enabled: false in the stack (the plan then warns that nothing filters the ports)")
    evidence = [out.splitlines()[0] if out else "nft"]
    code, listing = _run(ctx, ["nft", "list", "tables"], 30)
    if code != 0:
        return Section("firewall", False, [*evidence, f"nft list tables exit {code}: {listing[-200:]}"],
                       "run the firewall command as root (or with sudo -n): nft needs CAP_NET_ADMIN")
    tables = [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("table ")]
    evidence.append(f"tables: {', '.join(tables) or 'none'}")
    try:
        low, high = (int(v) for v in (Path(procfs) / "sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError) as exc:
        return Section("firewall", None, [*evidence, f"cannot read the ephemeral port range: {exc}"],
                       "check /proc/sys/net/ipv4/ip_local_port_range and --ephemeral-ports LOW-HIGH")
    evidence.append(f"net.ipv4.ip_local_port_range {low}-{high}, guarded {want_low}-{want_high}")
    if low < want_low or high > want_high:
        return Section("firewall", False, evidence,
                       f"set firewall.ephemeral_ports: [{min(low, want_low)}, {max(high, want_high)}] in the stack "
                       "(OS-picked ports of NCCL, Gloo, ZMQ and TCPStore come from the kernel's range)")
    return Section("firewall", True, evidence)


GB_AMOUNT = number(0, 1e5, " GB", low_open=False)
"""A size in GB: finite, not negative."""
_HCA = re.compile(r"[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3})?")
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


def _hca(value: str) -> str:
    if not _HCA.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{shown(value)}: not an HCA port DEV[:PORT], e.g. mlx5_0:1")
    return value


def _ifname(value: str) -> str:
    if not _IFNAME.fullmatch(value) or value in (".", ".."):
        raise argparse.ArgumentTypeError(f"{shown(value)}: not a network interface name (at most 15 characters)")
    return value


REHEARSAL_NOT_RUN = {
    "gpu": "nvidia-smi is not asked for the node's GPUs (nodes[].gpus are what the substitute engine pretends)",
    "toolkit": "no `docker run --gpus all` (the NVIDIA Container Toolkit): no container of this stack gets a GPU",
    "memlock": "unlimited memlock serves NCCL's RDMA memory registration, which no engine of this stack does",
    "infiniband": "no engine of this stack runs NCCL over RDMA, so /dev/infiniband is not looked for",
    "hca": "no engine of this stack runs NCCL over RDMA, so the HCA ports are not read",
    "gid": "no engine of this stack runs NCCL over RDMA, so the RoCE GID is not read",
}
"""With --rehearsal (a stack that declares no GPUs, docs/rehearsal.md): the sections that need a GPU or serve RDMA,
each printed as `NOT RUN <section>: <why>`. The others run as on a GPU node; ownership leaves out nvidia-smi's list
of GPU processes and says so."""

SECTIONS: dict[str, Callable[[Context], Section]] = {
    "ownership": check_ownership,
    "disk": check_disk,
    "gpu": check_gpu,
    "model": check_model,
    "toolkit": check_toolkit,
    "memlock": check_memlock,
    "infiniband": check_infiniband,
    "hca": check_hca,
    "gid": check_gid,
    "sysctl": check_sysctl,
    "firewall": check_firewall,
}


def build_parser() -> argparse.ArgumentParser:
    p = CheckParser(prog="preflight", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="preflight", type=check_name)
    p.add_argument("--sections", default=list(SECTIONS), type=listed(str, tuple(SECTIONS), empty_ok=False),
                   help="comma list of " + ",".join(SECTIONS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--call-timeout-s", type=seconds(3_600), help="cap every external call (tests, slow hosts)")
    g = p.add_argument_group("gpu / toolkit / memlock")
    g.add_argument("--gpus", type=count(64), default=8)
    g.add_argument("--gpu-model", default="", type=printable_line)
    g.add_argument("--gpu-memory-gb", type=GB_AMOUNT, default=0.0)
    g.add_argument("--image", default="", type=image_ref)
    g.add_argument("--rehearsal", action="store_true", help="the stack declares no GPUs (vllm-cluster:rehearsal): "
                   "gpu, toolkit, memlock, infiniband, hca and gid print NOT RUN, ownership skips nvidia-smi")
    m = p.add_argument_group("model (files; per-GPU memory when --tp is given)")
    m.add_argument("--model-dir", default="", type=optional_abs_path)
    m.add_argument("--heads", type=count(1 << 16))
    m.add_argument("--o-groups", type=count(1 << 16))
    m.add_argument("--tp", type=integer(0, 1024), default=0, help="0: skip the per-GPU memory estimate")
    m.add_argument("--pp", type=count(1024), default=1)
    m.add_argument("--dp", type=count(1024), default=1, help="DP ranks the experts spread over (1 with ray)")
    m.add_argument("--engram", choices=["gpu", "host"], default="gpu")
    m.add_argument("--engram-shards", type=count(1 << 16), default=1, help="TP x the node-local Engram DP group")
    m.add_argument("--engram-copies", type=number(0, 1024), default=1.0,
                   help="copies of the whole model's Engram tables in this node's RAM (with --engram host)")
    m.add_argument("--redundant-experts", type=integer(0, 1023), default=0,
                   help="EPLB's redundant experts (each GPU holds (routed + redundant) / EP experts)")
    m.add_argument("--routed-experts", type=integer(0, 1 << 16), default=0,
                   help="routed experts per MoE layer (the model card's), to size --redundant-experts")
    m.add_argument("--ranks-on-node", type=count(64), default=8, help="vLLM worker processes on this node")
    m.add_argument("--gpu-memory-utilization", type=number(0, 1), default=0.9)
    m.add_argument("--max-model-len", type=integer(0, 1 << 24), default=0)
    m.add_argument("--kv-cache-dtype", default="auto", type=option_word)
    m.add_argument("--kv-fallback-bytes", type=number(0, 1e12, low_open=False), default=0.0,
                   help="KV bytes/token/GPU when config.json lacks layer_types/compress_rates (the profile's figure)")
    m.add_argument("--reserve-gb", type=number(0, 1e4, " GB", low_open=False), default=RUNTIME_RESERVE_GB)
    m.add_argument("--planned-gb", type=GB_AMOUNT, help="the plan's per-GPU total, for the evidence")
    d = p.add_argument_group("disk")
    d.add_argument("--docker-root", default="/var/lib/docker", type=abs_path)
    d.add_argument("--containerd-root", default="/var/lib/containerd", type=abs_path)
    d.add_argument("--image-size-gb", type=number(0, 1e4, " GB"),
                   help="compressed image size, when the registry cannot be asked")
    d.add_argument("--disk-headroom-gb", type=GB_AMOUNT, default=DISK_HEADROOM_GB)
    o = p.add_argument_group("ownership")
    o.add_argument("--owned-label", default=None, type=optional_label,
                   help="KEY=VALUE marking this stack's containers: every container the program creates "
                   "carries vllm-cluster.stack=<stack>, the proxy included")
    o.add_argument("--container-names", default=[], type=listed(container_name),
                   help="names the engine containers will take")
    o.add_argument("--ports", default=[], type=listed(port), help="ports the engine will listen on (host network)")
    f = p.add_argument_group("fabric")
    f.add_argument("--hcas", default=[], type=listed(_hca), help="HCA ports as DEV[:PORT], e.g. mlx5_0:1")
    f.add_argument("--link-layer", default="Ethernet", choices=["Ethernet", "InfiniBand"])
    f.add_argument("--gid-index", type=integer(0, 255))
    f.add_argument("--nics", default=[], type=listed(_ifname))
    f.add_argument("--sysfs-root", default="/sys", type=abs_path)
    f.add_argument("--procfs-root", default="/proc", type=abs_path)
    f.add_argument("--dev-root", default="/dev", type=abs_path)
    f.add_argument("--ephemeral-ports", default=(32768, 60999), type=port_range, help="LOW-HIGH the firewall guards")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = args.sections
    ctx = Context(args)
    sections = []
    for name in names:
        ctx.budget = Budget(SECTION_BUDGET_S[name], args.call_timeout_s)
        if args.rehearsal and name in REHEARSAL_NOT_RUN:
            sections.append(rehearsal_section(name, REHEARSAL_NOT_RUN[name]))
            continue
        try:
            sections.append(SECTIONS[name](ctx))
        except Exception as exc:  # a bug or an unexpected host must still end in a verdict
            sections.append(Section(name, None, [f"crashed: {type(exc).__name__}: {exc}"],
                                    "report this preflight failure with its evidence"))
    return emit(combine(args.name, sections), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
