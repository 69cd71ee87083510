"""What the DeepEP all-to-all backends need from each host, and the NVSHMEM variables each node gets (pure).

vLLM 0.33.0 runs its `deepep_high_throughput` and `deepep_low_latency` backends on DeepEP's `Buffer`
(vllm/distributed/device_communicators/all2all.py:255-312 and 314-386), which starts NVSHMEM with GPU-initiated
RDMA (IBGDA) whenever its group has RDMA ranks or runs the low-latency kernels (DeepEP deep_ep/buffers/legacy.py:
`NVSHMEM_IB_ENABLE_IBGDA=1`). The high-throughput kernels use RDMA only when the EP group spans nodes
(all2all.py:267, `self.internode`); on one node both backends talk over NVLink, which vLLM's own install notes
say needs nothing on the host (tools/ep_kernels/README.md). So the host needs below apply to a stack whose
expert-parallel group spans nodes:

- IBGDA: either the NVIDIA driver loaded with `NVreg_EnableStreamMemOPs=1` and
  `NVreg_RegistryDwords="PeerMappingOverride=1;"` (GPU rings the NIC's doorbell), or the GDRCopy kernel module
  `gdrdrv` (CPU-assisted IBGDA) — DeepEP third-party/README.md, "Enable NVSHMEM IBGDA support";
- GPU memory registration with the NIC: dma-buf (the open kernel module) or `nvidia_peermem`
  (NVSHMEM src/modules/transport/common/transport_ib_common.cpp, `nvshmemt_ib_common_check_dmabuf_support`);
- every data NIC able to reach every peer node's data NICs.

The other backends (`deepep_v2` on NCCL GIN, `nixl_ep`, `mori_*`, `moonep`, `flashinfer_*`,
`allgather_reducescatter`) do not start NVSHMEM here.
"""

from __future__ import annotations

from dataclasses import dataclass

from stacks.model.config import FabricConfig, NodeConfig, StackConfig
from stacks.model.errors import Problem

NVSHMEM_BACKENDS: dict[str, str] = {
    "deepep_high_throughput": "DeepEP high-throughput kernels: NVLink inside a node, NVSHMEM/IBGDA between nodes",
    "deepep_low_latency": "DeepEP low-latency kernels: NVSHMEM/IBGDA for every dispatch and combine",
}
"""vLLM 0.33.0's all-to-all backends (vllm/config/parallel.py:45-59) whose kernels start NVSHMEM with IBGDA."""

HOST_SECTIONS = ("ibgda", "peermem", "reach")
"""The sections of `checks.deepep_host` (= its SECTIONS; a test keeps them equal)."""

NVSHMEM_ENV: dict[str, str] = {
    "NVSHMEM_ENABLE_NIC_PE_MAPPING": "nodes[].hcas (NVSHMEM reads NVSHMEM_HCA_LIST only with this set to 1)",
    "NVSHMEM_HCA_LIST": "nodes[].hcas",
    "NVSHMEM_IB_GID_INDEX": "nodes[].gid_index",
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "fabric.control_plane and nodes[].nics / management_ifname",
}
"""The NVSHMEM variables the plan renders with a DeepEP backend, and the key that sets each (managed.MANAGED_ENV
takes them, so container.env and fabric.env cannot replace them silently)."""


def needs_nvshmem(backend: str | None) -> bool:
    """Whether vLLM's all-to-all backend of this name starts NVSHMEM (IBGDA) when its group spans nodes."""
    return backend in NVSHMEM_BACKENDS


@dataclass(frozen=True)
class DeepEPHostRequirements:
    """What the host check (`checks.deepep_host`) must prove on every node before the image is pulled."""

    backend: str
    sections: tuple[str, ...]
    why: str


def deepep_host_requirements(backend: str | None, *, spans_nodes: bool = True) -> DeepEPHostRequirements | None:
    """The host needs of this all-to-all backend, or None where it has none (another backend, or one node: on one
    node DeepEP talks over NVLink only)."""
    if backend is None or not needs_nvshmem(backend) or not spans_nodes:
        return None
    return DeepEPHostRequirements(backend, HOST_SECTIONS, NVSHMEM_BACKENDS[backend])


def configured_backend(config: StackConfig) -> str | None:
    """The stack's all-to-all backend (`parallelism.all2all_backend`), None where vLLM's default runs. The one
    place the program reads it: the planner and the components ask this function."""
    backend = config.parallelism.all2all_backend
    return None if backend == "allgather_reducescatter" else backend


def control_ifname(fabric: FabricConfig, node: NodeConfig) -> str | None:
    """The interface of the node's control-plane address (= stacks.planner.fabric's choice for Gloo)."""
    if fabric.control_plane == "management":
        return node.management_ifname
    return node.nics[0] if node.nics else None


def nvshmem_env(node: NodeConfig, fabric: FabricConfig, backend: str | None) -> dict[str, str]:
    """The node's NVSHMEM variables for this backend ({} for a backend without NVSHMEM).

    - NVSHMEM_HCA_LIST from nodes[].hcas (`dev[:port]`, NVSHMEM's own form), with NVSHMEM_ENABLE_NIC_PE_MAPPING=1
      without which NVSHMEM ignores the list (NVSHMEM src/modules/transport/common/env_defs.h, HCA_LIST) and takes
      every active port, a management HCA included; with the mapping on NVSHMEM assigns the listed ports to the
      node's GPUs in turn instead of by PCIe distance (env_defs.h, ENABLE_NIC_PE_MAPPING), so nodes[].hcas lists
      them in the order of the GPUs they sit next to (`nvidia-smi topo -m`);
    - NVSHMEM_IB_GID_INDEX from nodes[].gid_index (unset, NVSHMEM picks a RoCE v2 IPv4 GID itself);
    - NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME: the control-plane interface, where DeepEP's unique-ID bootstrap connects
      (as GLOO_SOCKET_IFNAME).

    DeepEP sets the rest itself when it builds its buffer (NVSHMEM_IB_ENABLE_IBGDA, NVSHMEM_IBGDA_NUM_RC_PER_PE,
    NVSHMEM_QP_DEPTH, NVSHMEM_DISABLE_P2P, …), so the plan leaves them alone."""
    if not needs_nvshmem(backend) or fabric.transport == "socket":
        return {}
    env: dict[str, str] = {}
    if node.hcas:
        env["NVSHMEM_ENABLE_NIC_PE_MAPPING"] = "1"
        env["NVSHMEM_HCA_LIST"] = ",".join(node.hcas)
    if node.gid_index is not None:
        env["NVSHMEM_IB_GID_INDEX"] = str(node.gid_index)
    ifname = control_ifname(fabric, node)
    if ifname:
        env["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] = ifname
    return env


NIC_HANDLERS = ("auto", "gpu", "cpu")
"""NVSHMEM_IBGDA_NIC_HANDLER's values (NVSHMEM src/modules/transport/common/env_defs.h, IBGDA_NIC_HANDLER)."""


def nic_handler(config: StackConfig) -> str:
    """NVSHMEM_IBGDA_NIC_HANDLER as the engines run it (fabric.env or container.env; NVSHMEM's `auto` unset)."""
    return config.fabric.env.get("NVSHMEM_IBGDA_NIC_HANDLER") or \
        config.container.env.get("NVSHMEM_IBGDA_NIC_HANDLER") or "auto"


def nic_handler_problems(config: StackConfig) -> list[Problem]:
    """A handler NVSHMEM does not know would leave the host check guessing which IBGDA mode the engine runs."""
    for where, env in (("fabric.env", config.fabric.env), ("container.env", config.container.env)):
        value = env.get("NVSHMEM_IBGDA_NIC_HANDLER")
        if value is not None and value not in NIC_HANDLERS:
            return [Problem(f"{where}.NVSHMEM_IBGDA_NIC_HANDLER", value, "not a NIC handler NVSHMEM knows",
                            fix="auto (GPU, else CPU), gpu (needs the driver's PeerMappingOverride) or cpu (needs "
                            "GDRCopy's gdrdrv)")]
    return []


def reach_targets(config: StackConfig, node: NodeConfig) -> tuple[list[str], list[str]]:
    """(this node's `IFNAME=IP` data NICs, every other node's `NODE:IFNAME=IP`) for the reach section; empty where
    a node lists no data IPs (nothing to probe from or to)."""
    def pairs(n: NodeConfig) -> list[tuple[str, str]]:
        return list(zip(n.nics, n.data_ips, strict=False)) if len(n.nics) == len(n.data_ips) else []
    local = [f"{ifname}={ip}" for ifname, ip in pairs(node)]
    peers = [f"{other.name}:{ifname}={ip}" for other in config.nodes if other.name != node.name
             for ifname, ip in pairs(other)]
    return local, peers


def host_sections(config: StackConfig, node: NodeConfig, needs: DeepEPHostRequirements) -> list[str]:
    """The check's sections with something to check on this node: `reach` needs data IPs here and on a peer."""
    local, peers = reach_targets(config, node)
    return [s for s in needs.sections if s != "reach" or (local and peers)]
