"""A stack of prefill/decode groups (groups[].role, disaggregation:): planned group by group with each tier's KV
transfer settings, the router in front, refusals with the stack file's keys, what a change of one tier replaces,
the program's router resources under Pulumi's mocks, and the script that puts the pinned wheel on the head."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from review.group_diff import diff_stacks, to_markdown_grouped
from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config
from stacks.planner.container_spec import GENERATION_LABEL
from stacks.planner.firewall import firewall_plan
from stacks.planner.router import ROUTER_WHEEL, ROUTER_WHEEL_SHA256, wheel_install_script, wheel_remove_script
from stacks.planner.stack_plan import StackPlan, build_stack
from tests.pulumi_harness import run_program, waits_for
from tests.test_groups import fronted, lab
from tests.test_program_groups import SECRETS


def pd(**disaggregation: Any) -> dict[str, Any]:
    """The lab example as a prefill group (lab1) and a decode group (lab2) behind the front door."""
    values = fronted(lab())
    values["groups"][0]["role"] = "prefill"
    values["groups"][1]["role"] = "decode"
    values["disaggregation"] = disaggregation
    return values


def stack(values: dict[str, Any]) -> StackPlan:
    return build_stack("t", parse_config("t", values))


def problems(values: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        stack(values)
    return {p.key: p.message for p in caught.value.problems}


def args_of(whole: StackPlan, group: int) -> list[str]:
    return whole.groups[group].plan.nodes[0].containers[0].vllm_args or []


def test_each_tier_gets_its_kv_role_side_channel_and_the_router_sits_behind_the_front_door() -> None:
    whole = stack(pd())
    prefill, decode = args_of(whole, 0), args_of(whole, 1)
    assert json.loads(prefill[prefill.index("--kv-transfer-config") + 1])["kv_role"] == "kv_producer"
    assert json.loads(decode[decode.index("--kv-transfer-config") + 1]) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "fail"}
    env = whole.groups[1].plan.nodes[0].containers[0].env
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.231.0.2" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert whole.router is not None
    assert whole.router.prefill_urls == ("http://127.0.0.1:8000",)
    assert whole.router.decode_urls == ("http://10.231.0.2:8000",)
    proxy = whole.groups[0].plan.proxy
    assert proxy is not None and proxy.upstream == "127.0.0.1:8090"
    listeners = {(x.node, x.port): x for x in whole.groups[0].plan.listeners}
    assert listeners[("lab1", 5600)].purpose.startswith("NIXL handshake (prefill tier")
    assert listeners[("lab1", 8090)].bind == "127.0.0.1" and listeners[("lab1", 29000)].bind == "127.0.0.1"
    assert not whole.rolling.can_roll and "router" in whole.rolling.why
    out = whole.to_json_dict()
    assert [g["role"] for g in out["groups"]] == ["prefill", "decode"]
    assert out["router"]["argv"][:3] == ["vllm-router", "--vllm-pd-disaggregation", "--kv-connector"]
    # what the deploy runs for the router is in the plan: its container (no key in it) and its two steps
    assert out["router"]["container"]["secret_env"] == {"OPENAI_API_KEY": "api_key"}
    assert [c["name"] for c in out["router"]["checks"]] == ["router-wheel", "check-pd"]


def test_the_other_tier_is_let_through_each_tiers_firewall_and_only_then() -> None:
    """Each group is planned as a stack of its own nodes, whose firewall admits only its own addresses (and the
    private networks) to internal ports: the decode's NIXL handshake to the prefill and UCX's transfers would be
    dropped. A tier's context carries the other tier's addresses, which its firewall admits too."""
    whole = stack(pd())
    assert [g.context.tier_sources for g in whole.groups if g.context] == [("10.231.0.2/32",), ("10.231.0.1/32",)]
    sub = whole.groups[0].config.model_copy(update={"fabric": whole.groups[0].config.fabric.model_copy(
        update={"private_networks": []})})
    alone = firewall_plan(sub, whole.groups[0].plan.listeners)
    paired = firewall_plan(sub, whole.groups[0].plan.listeners, ("10.231.0.2/32",))
    assert "10.231.0.2/32" not in alone.nodes[0].cluster_sources
    assert "10.231.0.2/32" in paired.nodes[0].cluster_sources
    replicas = stack(fronted(lab()))
    assert all(g.context is not None and not g.context.tier_sources for g in replicas.groups)


@pytest.mark.parametrize("change, key, words", [
    (lambda v: v["groups"][1].update(role="replica"), "groups.1.role", "a replica group would get none"),
    (lambda v: v["groups"][1].update(role="prefill"), "groups", "no decode group"),
    (lambda v: v.pop("disaggregation"), "disaggregation", "need the KV connector"),
    (lambda v: v["api"]["proxy"].update(enabled=False), "api.proxy.enabled", "checks no client key"),
])
def test_tiers_that_cannot_serve_are_refused_with_the_stack_files_key(change: Any, key: str, words: str) -> None:
    values = pd()
    change(values)
    found = problems(values)
    assert key in found and words in found[key], found


def test_disaggregation_without_prefill_or_decode_groups_is_refused() -> None:
    values = fronted(lab())
    values["disaggregation"] = {}
    assert "nothing uses it" in problems(values)["disaggregation"]
    values.pop("groups")
    assert "no prefill or decode group" in problems(values)["disaggregation"]


def test_a_prefill_tp_the_decode_cannot_read_names_the_prefill_groups_own_key() -> None:
    """Prefill TP 16 over a model of 8 KV heads replicates heads, which a decode of TP 1 cannot gather: vLLM's
    NIXL connector asserts at the first transfer (kv_connector/v1/nixl/base_worker.py:2724-2730)."""
    values = pd()
    values["nodes"][0]["gpus"] = {**values["nodes"][0]["gpus"], "count": 16}
    values["groups"][0]["parallelism"] = {"tensor": 16, "data": 1, "backend": "mp"}
    values["groups"][1]["parallelism"] = {"tensor": 1, "data": 1, "backend": "mp"}
    found = problems(values)
    assert "groups.0.parallelism.tensor" in found, found
    assert found["groups.0.parallelism.tensor"].startswith("prefill group a and decode group b: prefill tier TP 16")


@pytest.mark.parametrize("router, key, words", [
    ({"policy": "power_of_two"}, "disaggregation.router.policy", "get_load"),
    ({"wheel_url": "https://example.com/r.whl\nrm -rf /"}, "disaggregation.router.wheel_url", "one line"),
    ({"wheel_url": "ftp://example.com/r.whl"}, "disaggregation.router.wheel_url", "https, http or file"),
    ({"wheel_url": "https://u:p@example.com/r.whl"}, "disaggregation.router.wheel_url", "credentials"),
    ({"wheel_url": "https://example.com/r.tar.gz"}, "disaggregation.router.wheel_url", ".whl"),
    ({"wheel_url": "https://example.com/r.whl?token=s3cr3t"}, "disaggregation.router.wheel_url", "query"),
    ({"wheel_url": "https://example.com:99999/r.whl"}, "disaggregation.router.wheel_url", "1-65535"),
    ({"wheel_url": "file://otherhost/r.whl"}, "disaggregation.router.wheel_url", "absolute"),
    ({"wheel_url": "file:///srv/../r.whl"}, "disaggregation.router.wheel_url", "absolute"),
])
def test_router_settings_that_would_not_work_exit_2_with_key_and_fix(router: dict[str, Any], key: str,
                                                                   words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("t", pd(router=router))
    found = {p.key: p.message for p in caught.value.problems}
    assert key in found and words in found[key], found


@pytest.mark.parametrize("router, key, words", [
    ({"port": 29000}, "disaggregation.router.metrics_port", "the router's own port"),
    ({"port": 22}, "disaggregation.router.port", "sshd"),
    ({"metrics_port": 8000}, "disaggregation.router.metrics_port", "vLLM's API"),
    ({"port": 443}, "disaggregation.router.port", "the front door"),
])
def test_router_ports_taken_on_the_head_name_the_routers_key(router: dict[str, Any], key: str, words: str) -> None:
    found = problems(pd(router=router))
    assert key in found and words in found[key], found


def test_a_router_port_another_listener_of_the_head_holds_names_the_routers_key() -> None:
    found = problems(pd(router={"port": 5600}))
    assert "disaggregation.router.port" in found, found
    assert found["disaggregation.router.port"].startswith("group a: NIXL handshake (prefill tier")
    assert "where the router runs" in found["disaggregation.router.port"]


def test_a_side_channel_range_over_the_ssh_port_and_nixl_variables_by_hand_are_refused() -> None:
    found = problems(pd(side_channel_port=22))
    assert "sshd" in found["disaggregation.side_channel_port"], found
    values = pd()
    values["container"] = {**values["container"], "env": {"VLLM_NIXL_SIDE_CHANNEL_PORT": "7000", "UCX_TLS": "tcp"}}
    found = problems(values)
    assert "container.env.VLLM_NIXL_SIDE_CHANNEL_PORT" in found and "container.env.UCX_TLS" in found


def _generations(whole: StackPlan) -> dict[str, str]:
    return {str(g.name): g.plan.head.containers[0].labels[GENERATION_LABEL] for g in whole.groups}


def test_a_decode_only_change_replaces_only_the_decode_group_and_a_shared_key_replaces_both() -> None:
    values = pd()
    values["nodes"][1]["gpus"] = {**values["nodes"][1]["gpus"], "count": 2}
    base = stack(values)
    decode_only = copy.deepcopy(values)
    decode_only["groups"][1]["parallelism"] = {"tensor": 1, "data": 2, "backend": "mp"}
    head = stack(decode_only)
    before, after = _generations(base), _generations(head)
    assert before["a"] == after["a"] and before["b"] != after["b"]
    assert base.router == head.router  # the router is not restarted either
    shared = copy.deepcopy(values)
    shared["serving"] = {**shared["serving"], "max_model_len": 2048}
    both = _generations(stack(shared))
    assert both["a"] != before["a"] and both["b"] != before["b"]
    diff = diff_stacks("t", "main", base.to_json_dict(), head.to_json_dict(), [], [], {})
    text = to_markdown_grouped(diff)
    assert "### group b (decode tier" in text and "### group a (prefill tier)" in text
    assert "only the changed group(s) restart: group b" in diff["downtime"] and "unchanged: a" in diff["downtime"]
    assert diff["router"] == "unchanged (not restarted)"


def test_the_program_starts_the_router_after_every_group_and_checks_kv_through_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    values = {k: v for k, v in pd().items() if k not in SECRETS}
    run = run_program("lab", values, secrets=SECRETS)
    assert run.error is None, run.error
    router = run.result["router"]
    turns = run.result["turns"]
    assert waits_for(run, router.container, turns["a"]["check"])
    assert waits_for(run, router.container, turns["b"]["check"])
    assert waits_for(run, router.container, router.wheel)
    assert waits_for(run, router.check, router.container)
    assert waits_for(run, run.result["api"].health, router.check)
    assert not {"drain-a", "drain-b"} & {r.name for r in run.mocks.resources}  # no drain: the router has none
    inputs = run.mocks.named("router").inputs
    assert inputs["command"][:2] == ["--vllm-pd-disaggregation", "--kv-connector"]
    assert not any("sk-" in word for word in inputs["command"])  # the key arrives as OPENAI_API_KEY, never argv
    assert f"OPENAI_API_KEY={SECRETS['api_key']}" in inputs["envs"]["value"]  # a secret: the whole list is
    volumes = inputs["volumes"]
    assert any(v["hostPath"] == "/var/lib/vllm-cluster/vllm-router-0.1.17" and v["readOnly"] for v in volumes)
    check = run.mocks.named("check-pd").inputs["create"]
    assert check.startswith("timeout ") and "docker exec -i" in check and "--api-key-env OPENAI_API_KEY" in check
    assert "--prefill-urls http://127.0.0.1:8000 --decode-urls http://10.231.0.2:8000" in check
    assert "--ready-wait-s" in check
    # the lab's Qwen3 reasons unless told not to: the check turns it off with the card's key, as the API checks do
    assert "--thinking-kwarg enable_thinking" in check


def _wheel() -> Path:
    from tests.router_harness import cache_dir, router_runtime

    router_runtime()  # downloads and checks the pinned wheel once (cached)
    return next(cache_dir().glob(f"*/{ROUTER_WHEEL}"))


def test_the_wheel_script_unpacks_only_the_pinned_wheel_and_never_runs_its_url(tmp_path: Path) -> None:
    wheel = _wheel()
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == ROUTER_WHEEL_SHA256
    dest = tmp_path / "opt" / "router"
    done = subprocess.run(["sh", "-c", wheel_install_script(f"file://{wheel}", str(dest))], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (dest / "vllm_router" / "launch_router.py").is_file() and "unpacked into" in done.stdout
    again = subprocess.run(["sh", "-c", wheel_install_script(f"file://{wheel}", str(dest))], capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and "already unpacked" in again.stdout
    forged = tmp_path / "evil$(touch PWNED).whl"
    forged.write_bytes(wheel.read_bytes()[:-1] + b"x")
    bad_dest = tmp_path / "bad"
    refused = subprocess.run(["sh", "-c", wheel_install_script(f"file://{forged}", str(bad_dest))], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "not unpacked" in refused.stderr and ROUTER_WHEEL_SHA256 in refused.stderr
    assert not bad_dest.exists() and not (tmp_path / "PWNED").exists()


def test_destroy_removes_the_unpacked_wheel_unless_a_container_still_mounts_it(tmp_path: Path) -> None:
    """router-wheel's delete: `pulumi destroy` deletes the router container first (it depends on the wheel), so
    the files go; a replaced router-wheel (a new URL for the same pinned bytes) is deleted while the router still
    runs from them, so they stay. `docker` here is a stand-in that prints what `docker ps -aq` would."""
    dest = tmp_path / "router"
    (dest / "vllm_router").mkdir(parents=True)
    (tmp_path / "router.new").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    docker.write_text('#!/bin/sh\necho "$*" >> "$0.log"\necho 9c45fe4d8b83\n')
    docker.chmod(0o755)
    kept = subprocess.run(["sh", "-c", wheel_remove_script(str(dest))], capture_output=True, text=True, env=env,
                          timeout=60)
    assert kept.returncode == 0 and "kept, a container still mounts it" in kept.stdout and dest.is_dir()
    assert (bin_dir / "docker.log").read_text() == f"ps -aq --filter volume={dest}\n"
    docker.write_text("#!/bin/sh\n")
    gone = subprocess.run(["sh", "-c", wheel_remove_script(str(dest))], capture_output=True, text=True, env=env,
                          timeout=60)
    assert gone.returncode == 0 and "removed" in gone.stdout
    assert not dest.exists() and not (tmp_path / "router.new").exists()


def test_the_pd_check_ships_to_the_node_as_one_script() -> None:
    from checks.bundle import remote_script

    script = remote_script("pd")
    compile(script, "pd", "exec")
    assert "from checks." not in script and "def wait_ready" in script


def test_real_vllm_accepted_every_ranks_argv_of_the_example_as_planned_now() -> None:
    """tests/fixtures/vllm-0.33.0-pd-example.json (bench/pd_example_real_vllm.py): each of the example's four nodes'
    argv through vLLM 0.33.0's serve parser and create_engine_config on CPU. The capture must be of the argv the
    planner renders today, and vLLM derived the tier's role and the node's DP rank from it."""
    from bench.pd_example_real_vllm import FIXTURE, planned_argv

    capture = json.loads(FIXTURE.read_text())["planned"]
    assert {name: case["argv"] for name, case in capture.items()} == planned_argv()
    roles = {"prefill": "kv_producer", "decode": "kv_consumer"}
    ranks = {"prefill gpu1": 0, "prefill gpu2": 1, "decode gpu3": 0, "decode gpu4": 8}
    for name, case in capture.items():
        assert "ok" in case, (name, case)
        assert case["ok"]["kv_transfer_config"]["kv_role"] == roles[name.split()[0]]
        assert case["ok"]["kv_transfer_config"]["kv_load_failure_policy"] == "fail"
        assert case["ok"]["data_parallel_rank"] == ranks[name]
    assert capture["decode gpu3"]["ok"]["all2all_backend"] == "deepep_low_latency"
    assert capture["decode gpu3"]["ok"]["data_parallel_size"] == 16


def test_a_side_channel_port_in_the_ephemeral_range_is_warned_under_its_key() -> None:
    whole = stack(pd(side_channel_port=40000))
    warned = [w for w in whole.groups[0].plan.warnings if w.startswith("disaggregation.side_channel_port:")]
    assert warned and "40000" in warned[0] and "ephemeral range" in warned[0]


def test_nginx_conf_of_a_prefill_decode_stack_shows_the_router_as_the_upstream(tmp_path: Path) -> None:
    """`stacks nginx-conf` of a grouped stack prints the first group's front door (it refused grouped stacks)."""
    import sys

    import yaml

    from tests.conftest import ROOT

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    doc = yaml.safe_load((ROOT / "examples" / "Pulumi.pd.yaml").read_text())
    (tmp_path / "Pulumi.pd.yaml").write_text(yaml.safe_dump(doc))
    secrets = [w for k in ("api_key", "proxy_keys.team-a", "tls_certificate", "tls_private_key")
               for w in ("--assume-secret", k)]
    done = subprocess.run([sys.executable, "-m", "stacks", "nginx-conf", "pd", *secrets], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    upstream = done.stdout.split("upstream vllm {", 1)[1].split("}", 1)[0]
    assert 'server "127.0.0.1:8090"' in upstream and "8000" not in upstream


def test_every_groups_api_checks_are_planned_where_the_program_runs_them() -> None:
    """`pulumi up` checks each group on its own head against its own vLLM (`check-<group>`), the first group too: its
    plan said they ran on the deploying machine through the front door, which for prefill/decode is the router."""
    for group in stack(pd()).groups:
        api = [c for c in group.plan.checks if c.module == "checks.api"]
        head = group.plan.head.name
        assert api and all(c.runs_on == "node" and c.node == head for c in api), api
        assert not any("through https://" in c.proves for c in api)


def test_ucx_over_tcp_gets_the_nodes_interfaces_not_its_hca_ports() -> None:
    """fabric.env UCX_TLS=tcp on an RDMA fabric: UCX_NET_DEVICES must name network interfaces for its tcp
    transport; the HCA ports it gets for RDMA would leave UCX no device."""
    from stacks.model.kv_transfer_config import KvTransferConfig
    from stacks.planner.kv_transfer import node_env

    values = pd()
    values["fabric"] = {**values["fabric"], "transport": "roce"}
    for node in values["nodes"]:
        node |= {"hcas": ["mlx5_0:1"], "gid_index": 3}
    rdma = parse_config("t", values)
    assert node_env(rdma, rdma.nodes[0], KvTransferConfig())["UCX_NET_DEVICES"] == "mlx5_0:1"
    values["fabric"]["env"] = {"UCX_TLS": "tcp,self,cuda_copy"}
    tcp = parse_config("t", values)
    assert node_env(tcp, tcp.nodes[0], KvTransferConfig())["UCX_NET_DEVICES"] == "lab0"


@pytest.mark.parametrize("module", ["preflight", "nccl_transport", "engines", "ray_cluster", "vllm_args", "collective",
                                    "api", "deepep_host", "page_cache", "grafana_password", "pd"])
def test_every_host_side_check_fits_one_remote_shell_word_with_room_for_its_arguments(module: str) -> None:
    """sshd runs a command as one `sh -c` argument, which Linux caps at MAX_ARG_STRLEN (131072 bytes); the script
    travels inside it as a heredoc. 16 KiB are kept for the arguments (peer lists, golden sets)."""
    from checks.bundle import REMOTE_MODULES, remote_script

    assert module in REMOTE_MODULES
    assert len(remote_script(module).encode()) < 131072 - 16384
