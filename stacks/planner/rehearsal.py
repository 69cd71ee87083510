"""A rehearsal: a stack that declares no GPUs (`rehearsal: true`, docs/rehearsal.md), deployed onto CPU-only nodes.

The plan stays the GPU plan: `nodes[].gpus` are the GPUs the engine image pretends, so ranks, argv, ports, memory
and every check are planned as for real GPUs. What changes is what touches a GPU or RDMA: no container gets a GPU
(`gpus`, CUDA_VISIBLE_DEVICES), the collective check runs gloo on CPU, and every check or section that needs a GPU
or RDMA prints `NOT RUN <what>: <why>` when it runs (the check programs' `--rehearsal`). It is all or nothing: a
rehearsal stack that still hands a GPU or an RDMA device to a container, or needs one to run at all, is refused
with the key, the value and the fix (`rehearsal_problems`).
"""

from __future__ import annotations

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.planner.image_capabilities import get_capabilities
from stacks.planner.image_cards import card_for

KEY = "rehearsal"
MIN_BUSBW_GBPS = 0.01
"""The collective check's floor on a rehearsal, unless fabric.min_busbw_gbps is set: the range's minimum
(stacks.model.busbw), since gloo between CPUs measures no fabric; the check still proves the rendezvous, gloo over
each node's GLOO_SOCKET_IFNAME and the right sums."""
PREFLIGHT_NOT_RUN = ("gpu", "toolkit", "memlock", "infiniband", "hca", "gid")
"""= checks.preflight.REHEARSAL_NOT_RUN (a test keeps them equal): the preflight sections a rehearsal prints as NOT
RUN. Ownership runs without nvidia-smi's GPU processes; disk, model, sysctl and firewall run."""
DEEPEP_NOT_RUN = ("ibgda", "peermem")
"""= checks.deepep_host.REHEARSAL_NOT_RUN: reach (TCP between the data NICs) runs."""
GPU_DEVICES = ("/dev/infiniband", "/dev/gdrdrv", "/dev/dri")
"""Host devices (and the devices under them) that are a GPU or an RDMA NIC, besides every /dev/nvidia*: a rehearsal's
nodes have none, and Docker refuses to create a container whose device does not exist."""
IMAGE_NEEDS = (
    "an entrypoint that takes the planned `vllm serve` argv and serves vLLM's OpenAI API on its --host/--port without "
    "a GPU (a substitute engine, e.g. tests/vllm_standin's package with checks/standin.py's server)",
    "python3 with a `vllm` package whose CLI parses the argv (the argument dry run, vllm.entrypoints.cli.main)",
    "torch with its gloo backend, CPU build (the collective check)",
    "boto3, with model.source (the weight sync runs in the image)",
)
"""What the engine image of a rehearsal must hold, because the steps that run on CPU really run in it."""


def is_gpu_device(path: str) -> bool:
    """/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/infiniband(/uverbs0), /dev/gdrdrv, /dev/dri(/renderD128)."""
    return path.startswith("/dev/nvidia") or any(path == d or path.startswith(d + "/") for d in GPU_DEVICES)


def rehearsal_problems(config: StackConfig) -> list[Problem]:
    """A rehearsal is all or nothing: every setting that would still hand a GPU or an RDMA device to a container,
    or that cannot run without a GPU, refused with its key, its value and the fix. None on a GPU stack."""
    if not config.rehearsal:
        return []
    problems: list[Problem] = []
    what = "a rehearsal (vllm-cluster:rehearsal: true: no node has a GPU)"
    off = "or rehearsal: false on nodes that have the GPUs"
    image = config.image
    card, _ = card_for(image.ref, image.digest)
    if card is not None or get_capabilities(image.ref) is not None:
        where = f" (its card {card.path})" if card is not None else ""
        problems.append(Problem(
            "image", image.ref, f"is a vLLM GPU image{where}, whose engine cannot start without a GPU, on {what}",
            upstream="RuntimeError: Failed to infer device type, please set the environment variable "
                     "`VLLM_LOGGING_LEVEL=DEBUG` ... (vllm/config/device.py:53-59, vLLM without a GPU)",
            fix=f"an engine image that serves vLLM's OpenAI API without a GPU, a substitute engine "
                f"(docs/rehearsal.md), {off}"))
    if config.parallelism.backend == "ray":
        problems.append(Problem(
            "parallelism.backend", "ray", f"{what} runs backend mp only: Ray's containers run Ray itself (ray start, "
            "the cluster-ready wait for every GPU), which no substitute engine pretends",
            fix=f"backend: mp for the rehearsal, {off}"))
    if config.observability.enabled:
        problems.append(Problem(
            "observability.enabled", True, f"the monitoring runs NVIDIA's DCGM exporter on every node, which needs "
            f"the GPUs that {what} does not have", fix=f"observability.enabled: false for the rehearsal, {off}"))
    for i, device in enumerate(config.container.devices):
        if is_gpu_device(device):
            problems.append(Problem(
                f"container.devices.{i}", device, f"hands a GPU or RDMA device to the engine container on {what}, "
                "whose engine uses neither; Docker refuses to create a container whose device is missing",
                fix=f"remove it from container.devices for the rehearsal, {off}"))
    return problems


def rehearsal_warnings(config: StackConfig) -> list[str]:
    """Settings a rehearsal leaves without effect or that only RDMA needs, said once each."""
    container = config.container
    if not config.rehearsal:
        return []
    warnings = []
    if "set_cuda_visible_devices" in container.model_fields_set and container.set_cuda_visible_devices:
        warnings.append("container.set_cuda_visible_devices is true, but the stack is a rehearsal (rehearsal: true): "
                        "no engine gets CUDA_VISIBLE_DEVICES, the setting does nothing")
    memlock = container.ulimits.get("memlock")
    if memlock is not None and -1 in memlock:
        warnings.append(
            f"container.ulimits.memlock {list(memlock)} on a rehearsal (rehearsal: true): unlimited memlock serves "
            "NCCL's RDMA, which no engine here does (the preflight's memlock section prints NOT RUN), and a Docker "
            "engine that may not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE, e.g. one inside a container) refuses to "
            "create the engine and the collective check; leave memlock out of container.ulimits for the rehearsal "
            "(docs/rehearsal.md)")
    return warnings
