"""The example stacks in examples/ are real: each plans as it stands when copied into a project under any stack
name, and the production policy refuses each for exactly the two things only an operator can supply (an image
digest, the nodes' SSH host keys), explained in the file at the line where it happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.model.loader import read_stack_values
from tests.conftest import ROOT
from tests.pulumi_harness import run_program
from tests.test_policy import HOST_KEYS, violations
from tests.test_program_proxy import SECRETS as PROXY_SECRETS

REHEARSALS = ["lab"]
"""Examples that declare no GPUs (`rehearsal: true`, docs/rehearsal.md): tests/test_rehearsal.py holds them; the
production policy refuses each for its substitute image, which has no card and cannot have one."""
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("Pulumi.*.yaml") if p.name.split(".")[1] not in REHEARSALS)
FRONT_DOOR = ["api_key", "proxy_keys.team-a", "tls_certificate", "tls_private_key"]
ASSUMED = {"three-node": FRONT_DOOR, "two-node": [], "wide-ep": [], "pd": FRONT_DOOR}
"""The secrets each example needs before it plans (the front door's), as the README's tutorial assumes them."""
NODES = {"three-node": ["gpu1", "gpu2", "gpu3"], "two-node": ["gpu1", "gpu2"], "wide-ep": ["gpu1", "gpu2"],
         "pd": ["gpu1", "gpu2", "gpu3", "gpu4"]}


def name_of(path: Path) -> str:
    return path.name.split(".")[1]


def test_the_examples_are_the_ones_the_readme_names() -> None:
    assert [name_of(p) for p in EXAMPLES] == ["pd", "three-node", "two-node", "wide-ep"]
    everything = sorted(p.name for p in (ROOT / "examples").glob("Pulumi.*.yaml"))
    assert everything == sorted([*(p.name for p in EXAMPLES), *(f"Pulumi.{r}.yaml" for r in REHEARSALS)])
    assert all(f"examples/Pulumi.{r}.yaml" in (ROOT / "docs" / "rehearsal.md").read_text() for r in REHEARSALS)


def plan(path: Path, tmp_path: Path, stack: str = "mycluster") -> dict[str, Any]:
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(path.read_text())
    assumed = [w for key in ASSUMED[name_of(path)] for w in ("--assume-secret", key)]
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", stack, "--json", *assumed], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "VLLM_CLUSTER_ROOT": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    return dict(json.loads(out.stdout))


def test_the_three_node_example_plans(tmp_path: Path) -> None:
    """3 nodes, mp, DP3 x TP8 with EP24, the front door on, weights from S3: what the tutorial promises."""
    p = plan(ROOT / "examples" / "Pulumi.three-node.yaml", tmp_path)
    assert [n["role"] for n in p["nodes"]] == ["dp-head", "headless-engine", "headless-engine"]
    assert p["topology"]["label"] == "mp-dp3-tp8-pp1-ep24" and p["start_order"] == ["gpu2", "gpu3", "gpu1"]
    assert p["proxy"] is not None and p["endpoint"] == "https://llm.example.com:443"
    assert {c["name"] for c in p["checks"]} >= {"weights-gpu1", "weights-gpu2", "weights-gpu3", "weights-match"}


def test_the_two_node_example_plans(tmp_path: Path) -> None:
    p = plan(ROOT / "examples" / "Pulumi.two-node.yaml", tmp_path)
    assert [n["role"] for n in p["nodes"]] == ["dp-head", "headless-engine"]
    assert p["topology"]["label"] == "mp-dp2-tp8-pp1-ep16" and p["proxy"] is None


def test_the_wide_ep_example_plans(tmp_path: Path) -> None:
    """2 x 8 H100, DP16 x TP1 with EP16, DeepEP low-latency and EPLB with one redundant expert per GPU
    (docs/expert-parallel.md); vLLM 0.33.0's own config code accepted its argv (tests/test_expert_parallel.py)."""
    p = plan(ROOT / "examples" / "Pulumi.wide-ep.yaml", tmp_path)
    assert [n["role"] for n in p["nodes"]] == ["dp-head", "headless-engine"]
    assert p["topology"]["label"] == "mp-dp16-tp1-pp1-ep16"
    assert p["memory"][0]["weights_split_gb"]["redundant_experts"] > 0


def test_the_pd_example_plans(tmp_path: Path) -> None:
    """4 x 8 H100: a prefill group DP2 x TP8 (EP16) on two nodes, a decode group DP16 x TP1 (EP16, DeepEP
    low-latency) on the other two, each engine with its tier's --kv-transfer-config, the router on the head behind
    the front door with both groups' API servers (docs/disaggregation.md)."""
    p = plan(ROOT / "examples" / "Pulumi.pd.yaml", tmp_path)
    prefill, decode = (g["plan"] for g in p["groups"])
    assert [g["role"] for g in p["groups"]] == ["prefill", "decode"]
    assert prefill["topology"]["label"] == "mp-dp2-tp8-pp1-ep16"
    assert decode["topology"]["label"] == "mp-dp16-tp1-pp1-ep16"
    for group, role in ((prefill, "kv_producer"), (decode, "kv_consumer")):
        for node in group["nodes"]:
            args = node["containers"][0]["vllm_args"]
            assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_role"] == role
            assert node["containers"][0]["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"].startswith("10.41.0.")
    assert p["router"]["prefill"] == ["http://127.0.0.1:8000"] and p["router"]["decode"] == ["http://10.41.0.13:8000"]
    assert prefill["proxy"]["upstream"] == "127.0.0.1:8090" and decode["proxy"] is None
    assert p["rolling"]["can_roll"] is False


def _secrets(path: Path) -> dict[str, Any]:
    base = {"api_key": "sk-mock-key-123", "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----mock"}
    return dict(PROXY_SECRETS) if ASSUMED[name_of(path)] else base


def _values(path: Path, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "Pulumi.mycluster.yaml").write_text(path.read_text())
    return read_stack_values("mycluster", tmp_path)


@pytest.mark.parametrize("path", EXAMPLES, ids=name_of)
def test_the_production_policy_refuses_only_what_the_file_explains(path: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Held to the production rules (policy config `stacks: [mycluster]`), an example is refused for the digest
    and the host keys only; the file explains both on the lines that set them (the image, the nodes' ssh)."""
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    run = run_program("mycluster", _values(path, tmp_path), secrets=_secrets(path))
    assert run.error is None, run.error
    found = violations(run, "mycluster", {"stacks": ["mycluster"]})
    assert sorted(n for n, v in found.items() if v) == ["image-pinned-by-digest", "prod-image-pinned-by-digest",
                                                        "prod-ssh-host-key-pinned", "ssh-host-key-pinned"]
    lines = path.read_text().splitlines()
    image = next(i for i, line in enumerate(lines) if line.startswith("  vllm-cluster:image:"))
    assert "refuses an image without a digest" in " ".join(lines[image - 3:image])
    nodes = next(i for i, line in enumerate(lines) if line.startswith("  vllm-cluster:nodes:"))
    assert "refuses a node without its SSH host key" in " ".join(lines[nodes:nodes + 4])
    images = {r for r, _ in found["prod-image-pinned-by-digest"]}
    proxied = bool(ASSUMED[name_of(path)])
    assert images == {f"{n}-image" for n in NODES[name_of(path)]} | ({"api-proxy-image"} if proxied else set())
    if proxied:  # the front door's nginx image: explained on the line above it
        proxy = next(i for i, line in enumerate(lines) if line.strip().startswith("image: nginx:"))
        assert "refuses this image without a digest" in lines[proxy - 1]


@pytest.mark.parametrize("path", EXAMPLES, ids=name_of)
def test_with_a_digest_and_host_keys_the_examples_pass_every_policy(path: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What the comments tell the operator to add is all the production policy wants."""
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    values = _values(path, tmp_path)
    values["image"] = values["image"] + "@sha256:" + "ab" * 32
    if "proxy" in values.get("api", {}):
        values["api"]["proxy"]["image"] += "@sha256:" + "cd" * 32
    for i, node in enumerate(values["nodes"]):
        node["ssh"]["host_key"] = HOST_KEYS[i % len(HOST_KEYS)]
    run = run_program("mycluster", values, secrets=_secrets(path))
    assert run.error is None, run.error
    assert {n: v for n, v in violations(run, "mycluster", {"stacks": ["mycluster"]}).items() if v} == {}


def test_the_committed_prod_explains_its_two_refusals_where_they_happen() -> None:
    """`prod` is refused by the production policy for its digest and host keys (tests/test_policy.py): the comments
    say so right above the image and inside the nodes."""
    lines = (ROOT / "Pulumi.prod.yaml").read_text().splitlines()
    image = lines.index("  vllm-cluster:image:")
    assert "Refused by the production policy: no digest" in " ".join(lines[image - 3:image])
    nodes = lines.index("  vllm-cluster:nodes:")
    assert "Refused by the production policy: no `host_key`" in " ".join(lines[nodes:nodes + 4])


def test_the_readme_picture_is_the_three_node_example(tmp_path: Path) -> None:
    """docs/deployed-stack.dot draws this example: its nodes, the ports it names and the EP size are the plan's."""
    p = plan(ROOT / "examples" / "Pulumi.three-node.yaml", tmp_path)
    dot = (ROOT / "docs" / "deployed-stack.dot").read_text()
    assert all(n["name"] in dot for n in p["nodes"]) and "examples/Pulumi.three-node.yaml" in dot
    head = {(x["port"], x["bind"]) for x in p["listeners"] if x["node"] == "gpu1"}
    assert {(443, "0.0.0.0"), (8000, "127.0.0.1"), (29550, "10.41.0.11")} <= head
    assert "0.0.0.0:443" in dot and "127.0.0.1:8000" in dot and ":29550" in dot
    assert f"EP{p['topology']['expert']}" in dot and p["model"]["served_name"] in dot
