"""Host preflight: prove a GPU host can run the engine before 511 GB of weights start loading.

Runs on the host over SSH with Python 3's standard library only (shipped by `checks.bundle`). Sections:
gpu, toolkit, memlock, model, disk (GpuNode), infiniband, hca, gid, sysctl (RdmaFabric) and firewall (before the
host firewall's nftables table is applied).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from checks.verdict import Section, combine, emit

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id",
             "--format=csv,noheader"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def _run(argv: list[str], timeout: int = 120) -> tuple[int | None, str]:
    """Run a command; (None, reason) when it cannot start or times out."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None, f"{argv[0]} not found on PATH"
    except subprocess.TimeoutExpired:
        return None, f"{' '.join(argv[:3])}… timed out after {timeout}s"
    return done.returncode, (done.stdout + done.stderr).strip()


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


def check_gpu(count: int, model: str, memory_gb: float) -> Section:
    code, out = _run(GPU_QUERY)
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


def check_toolkit(image: str, count: int) -> Section:
    code, out = _run(["docker", "run", "--rm", "--gpus", "all", "--entrypoint", "nvidia-smi", image, "-L"], 600)
    if code is None:
        return Section("toolkit", None, [out], "install Docker on the host")
    seen = [line for line in out.splitlines() if line.startswith("GPU ")]
    if code != 0 or len(seen) != count:
        return Section("toolkit", False, [f"docker run --gpus all exit {code}, {len(seen)} GPU(s): {out[-300:]}"],
                       "install/configure the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker"
                       " && systemctl restart docker)")
    return Section("toolkit", True, [f"a container with --gpus all sees {len(seen)} GPU(s)"])


def check_memlock(image: str) -> Section:
    code, out = _run(["docker", "run", "--rm", "--ulimit", "memlock=-1:-1", "--entrypoint", "/bin/sh", image,
                      "-c", "ulimit -l"], 300)
    if code is None:
        return Section("memlock", None, [out], "install Docker on the host")
    value = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0 or value != "unlimited":
        return Section("memlock", False, [f"ulimit -l in the container: {value or out[-200:]!r}"],
                       "allow unlimited memlock for containers (dockerd default-ulimits or LimitMEMLOCK=infinity)")
    return Section("memlock", True, ["ulimit -l inside the container: unlimited"])


def check_model(model_dir: str, heads: int | None, o_groups: int | None) -> Section:
    root = Path(model_dir)
    if not root.is_dir():
        return Section("model", False, [f"{model_dir} is not a directory"],
                       "copy the model to the same path on every node (model.host_dir/model.path)")
    problems: list[str] = []
    evidence: list[str] = []
    config_path = root / "config.json"
    config: dict[str, object] = {}
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        problems.append("config.json missing")
    except ValueError as exc:
        problems.append(f"config.json is not JSON: {exc}")
    tokenizers = [name for name in TOKENIZER_FILES if (root / name).is_file()]
    if not tokenizers:
        problems.append(f"no tokenizer file ({', '.join(TOKENIZER_FILES)})")
    index_path = root / "model.safetensors.index.json"
    shards: set[str] = set()
    if index_path.is_file():
        try:
            shards = set(json.loads(index_path.read_text()).get("weight_map", {}).values())
        except ValueError as exc:
            problems.append(f"model.safetensors.index.json is not JSON: {exc}")
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            problems.append(f"{len(missing)} of {len(shards)} shard(s) missing, e.g. {missing[0]}")
    elif not list(root.glob("*.safetensors")):
        problems.append("no model.safetensors.index.json and no *.safetensors")
    empty = sorted(p.name for p in root.iterdir() if p.is_file() and p.stat().st_size == 0)
    if empty:
        problems.append(f"{len(empty)} empty file(s), e.g. {empty[0]} (interrupted copy?)")
    for key, expected in (("num_attention_heads", heads), ("o_groups", o_groups)):
        if expected is None:
            continue
        actual = config.get(key)
        if actual is None:
            evidence.append(f"config.json has no {key}; profile value {expected} unverified")
        elif actual != expected:
            problems.append(f"config.json {key}={actual}, the stack's profile assumes {expected}")
    evidence.insert(0, f"{len(shards)} shard(s) indexed, tokenizer: {', '.join(tokenizers) or 'none'}")
    if problems:
        return Section("model", False, evidence + problems,
                       "re-copy the model directory (compare `sha256sum` with a good node), or fix the profile in "
                       "stacks/profiles.py when config.json is right")
    return Section("model", True, evidence)


def check_disk(path: str, min_free_gb: float) -> Section:
    target = Path(path)
    while not target.exists() and target != target.parent:
        target = target.parent
    free_gb = shutil.disk_usage(target).free / 1e9
    evidence = [f"{free_gb:.1f} GB free at {target}"]
    if free_gb < min_free_gb:
        return Section("disk", False, [*evidence, f"need {min_free_gb:g} GB for the image"],
                       "free space (docker image prune) before pulling; rollback keeps the old image")
    return Section("disk", True, evidence)


def check_infiniband(dev_root: str) -> Section:
    ib = Path(dev_root) / "infiniband"
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


def check_hca(sysfs: str, hcas: list[str], link_layer: str) -> Section:
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


def check_gid(sysfs: str, hcas: list[str], gid_index: int | None) -> Section:
    if gid_index is None:
        return Section("gid", True, ["no gid_index configured: NCCL picks the GID (set one for RoCE v2)"])
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


def check_sysctl(procfs: str, nics: list[str]) -> Section:
    evidence, problems, warnings = [], [], []
    conf = Path(procfs) / "sys" / "net" / "ipv4" / "conf"
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


def check_firewall(procfs: str, ephemeral: str) -> Section:
    """nft must exist and answer (root), and the kernel's ephemeral port range must lie inside the range the
    firewall guards: an OS-picked listener port outside it would be left open to every source."""
    code, out = _run(["nft", "--version"], 30)
    if code is None:
        return Section("firewall", False, [out], "apt-get install nftables (or dnf install nftables), or set "
                       "firewall.enabled: false in the stack (the plan then warns that nothing filters the ports)")
    evidence = [out.splitlines()[0] if out else "nft"]
    code, listing = _run(["nft", "list", "tables"], 30)
    if code != 0:
        return Section("firewall", False, [*evidence, f"nft list tables exit {code}: {listing[-200:]}"],
                       "run the firewall command as root (or with sudo -n): nft needs CAP_NET_ADMIN")
    tables = [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("table ")]
    evidence.append(f"tables: {', '.join(tables) or 'none'}")
    try:
        low, high = (int(v) for v in (Path(procfs) / "sys/net/ipv4/ip_local_port_range").read_text().split())
        want_low, want_high = (int(v) for v in ephemeral.split("-"))
    except (OSError, ValueError) as exc:
        return Section("firewall", None, [*evidence, f"cannot read the ephemeral port range: {exc}"],
                       "check /proc/sys/net/ipv4/ip_local_port_range and --ephemeral-ports LOW-HIGH")
    evidence.append(f"net.ipv4.ip_local_port_range {low}-{high}, guarded {want_low}-{want_high}")
    if low < want_low or high > want_high:
        return Section("firewall", False, evidence,
                       f"set firewall.ephemeral_ports: [{min(low, want_low)}, {max(high, want_high)}] in the stack "
                       "(OS-picked ports of NCCL, Gloo, ZMQ and TCPStore come from the kernel's range)")
    return Section("firewall", True, evidence)


def _split(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


SECTIONS: dict[str, Callable[[argparse.Namespace], Section]] = {
    "gpu": lambda a: check_gpu(a.gpus, a.gpu_model, a.gpu_memory_gb),
    "toolkit": lambda a: check_toolkit(a.image, a.gpus),
    "memlock": lambda a: check_memlock(a.image),
    "model": lambda a: check_model(a.model_dir, a.heads, a.o_groups),
    "disk": lambda a: check_disk(a.docker_root, a.min_free_gb),
    "infiniband": lambda a: check_infiniband(a.dev_root),
    "hca": lambda a: check_hca(a.sysfs_root, _split(a.hcas), a.link_layer),
    "gid": lambda a: check_gid(a.sysfs_root, _split(a.hcas), a.gid_index),
    "sysctl": lambda a: check_sysctl(a.procfs_root, _split(a.nics)),
    "firewall": lambda a: check_firewall(a.procfs_root, a.ephemeral_ports),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="preflight", description=__doc__)
    p.add_argument("--name", default="preflight")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma list of " + ",".join(SECTIONS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--gpu-model", default="")
    p.add_argument("--gpu-memory-gb", type=float, default=0)
    p.add_argument("--image", default="")
    p.add_argument("--model-dir", default="")
    p.add_argument("--heads", type=int)
    p.add_argument("--o-groups", type=int)
    p.add_argument("--docker-root", default="/var/lib/docker")
    p.add_argument("--min-free-gb", type=float, default=40)
    p.add_argument("--hcas", default="")
    p.add_argument("--link-layer", default="Ethernet", choices=["Ethernet", "InfiniBand"])
    p.add_argument("--gid-index", type=int)
    p.add_argument("--nics", default="")
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument("--procfs-root", default="/proc")
    p.add_argument("--dev-root", default="/dev")
    p.add_argument("--ephemeral-ports", default="32768-60999", help="LOW-HIGH the firewall guards")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = _split(args.sections)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
        return 2
    sections = [SECTIONS[name](args) for name in names]
    return emit(combine(args.name, sections), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
