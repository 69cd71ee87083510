"""The Pulumi program under Pulumi's mocks, fed from the committed Pulumi.prod.yaml / Pulumi.h20.yaml."""

from __future__ import annotations

import copy
import subprocess
from collections import Counter
from typing import Any

import pytest

from checks.preflight import AFTER_PULL, BEFORE_PULL, outer_timeout_s
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan
from tests.pulumi_harness import SECRET_VALUES, Run, dependency_edges, run_program, waits_for

SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's wire marker for a secret value
SECRET_VALUE = "1b47061264138c4ac30d75fd1eb44270"
CONTAINER = "docker:index/container:Container"
IMAGE = "docker:index/remoteImage:RemoteImage"
PROVIDER = "pulumi:providers:docker"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"


@pytest.fixture(scope="module", params=[False, True], ids=["update", "preview"])
def prod(request: pytest.FixtureRequest) -> Run:
    return run_program("prod", preview=request.param)


@pytest.fixture(scope="module")
def h20() -> Run:
    return run_program("h20")


def test_resource_types_and_counts(prod: Run, h20: Run) -> None:
    assert prod.error is None and h20.error is None
    counts = Counter(r.typ for r in prod.mocks.resources)
    # per node: provider, image, container; weights, pre-pull and post-pull preflight, fabric preflight, firewall
    # preflight, firewall, args dry run, page-cache warming, collective, dp-engines, nccl-transport; on the deployer:
    # weights-match, api-health, api-smoke; the four rollout barriers (images pulled, dry runs, page caches
    # warmed, collectives) and the group's secrets holder (what every engine container is replaced with)
    assert counts[PROVIDER] == 2 and counts[IMAGE] == 2 and counts[CONTAINER] == 2
    assert counts[REMOTE] == 2 * 11 and counts[LOCAL] == 3 + 4 + 1
    h20_counts = Counter(r.typ for r in h20.mocks.resources)
    # ray: no dp-engines checks, one cluster-ready check, NCCL evidence from the head's log only
    assert h20_counts[CONTAINER] == 2 and h20_counts[REMOTE] == 2 * 9 + 1 + 1 and h20_counts[LOCAL] == 3 + 4 + 1
    assert [r.name for r in h20.mocks.of_type(REMOTE) if "nccl" in r.name] == ["fabric-h20-1-nccl-transport"]
    components = Counter(r.typ for r in prod.mocks.resources if r.typ.startswith("vllm-cluster:index:"))
    assert components == {"vllm-cluster:index:GpuNode": 2, "vllm-cluster:index:RdmaFabric": 1,
                          "vllm-cluster:index:VllmEngine": 1, "vllm-cluster:index:ApiEndpoint": 1,
                          "vllm-cluster:index:PolicyFacts": 1}


def test_component_type_tokens(prod: Run) -> None:
    result = prod.result
    tokens = {type(result["fabric"]).__name__: result["fabric"], type(result["engine"]).__name__: result["engine"],
              type(result["api"]).__name__: result["api"]}
    assert set(tokens) == {"RdmaFabric", "VllmEngine", "ApiEndpoint"}
    for name, comp in {**tokens, **result["nodes"]}.items():
        assert comp._type.startswith("vllm-cluster:index:"), name


def _wire_container(spec: dict[str, Any], image_id: str) -> dict[str, Any]:
    """The plan's container spec in pulumi-docker wire names (what the provider receives)."""
    wire: dict[str, Any] = {
        "name": spec["name"], "image": image_id, "command": spec["command"], "envs":
            [f"{k}={v}" for k, v in spec["env"].items()]
            + [f"{k}={SECRET_VALUES[ref]}" for k, ref in spec["secret_env"].items()],
        "networkMode": spec["network_mode"], "ipcMode": spec["ipc_mode"], "privileged": spec["privileged"],
        "gpus": spec["gpus"], "restart": spec["restart"],
        "ulimits": [{"name": k, "soft": v[0], "hard": v[1]} for k, v in spec["ulimits"].items()],
        "volumes": [{"hostPath": v["host"], "containerPath": v["container"], "readOnly": v["read_only"]}
                    for v in spec["volumes"]],
        "labels": [*({"label": k, "value": v} for k, v in spec["labels"].items()),
                   {"label": "vllm-cluster.secrets-generation", "value": "engine-secrets-id"}],  # the program's
    }
    if spec["entrypoint"] is not None:
        wire["entrypoints"] = spec["entrypoint"]
    if spec["shm_size_mb"] is not None:
        wire["shmSize"] = spec["shm_size_mb"]
    if spec["devices"]:
        wire["devices"] = [{"hostPath": d, "containerPath": d} for d in spec["devices"]]
    if spec["capabilities"]:
        wire["capabilities"] = {"adds": spec["capabilities"]}
    return wire


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_every_container_input_equals_the_plan(stack: str) -> None:
    run = run_program(stack)
    values = read_stack_values(stack) | {k: SECRET for k in SECRET_VALUES}  # as the program sees them
    plan = build_plan(stack, parse_config(stack, values)).to_json_dict()
    for node in plan["nodes"]:
        spec = node["containers"][0]
        registered = run.mocks.named(f"engine-{node['name']}-{spec['name']}")
        expected = _wire_container(spec, f"sha256:mock-{node['name']}-image")
        for key, value in expected.items():
            actual = registered.inputs[key]
            if isinstance(actual, dict) and SECRET_SIG in actual:
                actual = actual["value"]
            assert actual == value, (node["name"], key)
        assert ("healthcheck" in registered.inputs) == (spec["healthcheck"] is not None)
        assert registered.provider and f"{node['name']}-docker" in registered.provider
        image = run.mocks.named(f"{node['name']}-image")
        assert image.inputs == {"name": plan["image"]["pull_ref"], "keepLocally": True}


def test_providers_use_ssh_with_multiplexing(prod: Run) -> None:
    provider = prod.mocks.named("node1-docker")
    assert provider.inputs["host"] == "ssh://root@10.30.8.1:22"
    opts = provider.inputs["sshOpts"]
    for option in ("ControlMaster=auto", "ControlPersist=10m", "ConnectTimeout=15"):
        assert option in opts


def test_container_options_and_start_order(prod: Run, h20: Run) -> None:
    for run in (prod, h20):
        for opts in run.options.values():
            assert opts.delete_before_replace is True
            assert "healthcheck" in (opts.replace_on_changes or [])
            assert opts.custom_timeouts is not None and opts.custom_timeouts.create == "4200s"  # 3600 + 600
    engine = prod.result["engine"]
    head_deps = prod.options["engine-node1-deepseek-v41-flash"].depends_on
    assert engine.containers["node2"] in head_deps  # mp: headless first, head after
    assert engine.containers["node1"] not in prod.options["engine-node2-deepseek-v41-flash"].depends_on
    # Preflights gate the containers through the dry runs (dependencies are transitive).
    for name, node in prod.result["nodes"].items():
        assert node.preflight in prod.all_options[f"engine-{name}-args-dry-run"].depends_on
        assert prod.result["fabric"].preflights[name] in prod.all_options[f"engine-{name}-args-dry-run"].depends_on
    # ... and the collective checks, which come after every dry run, gate every container (through barriers).
    collectives = prod.result["collectives"]
    assert set(collectives) == {"node1", "node2"}
    for container in engine.containers.values():
        assert all(waits_for(prod, container, c) for c in collectives.values())
    for name in collectives:
        assert all(waits_for(prod, collectives[name], d) for d in engine.dry_runs.values())
    # The staged change's page-cache warming: after every dry run, before the collectives (which stop the old
    # engine) and so before any container; it re-runs whenever the group is replaced.
    for run in (prod, h20):
        staged = run.result["engine"]
        assert set(staged.page_cache) == set(run.result["nodes"])
        for name, warm in staged.page_cache.items():
            assert all(waits_for(run, warm, d) for d in staged.dry_runs.values())
            assert all(waits_for(run, c, warm) for c in staged.containers.values())
            assert all(waits_for(run, c, warm) for c in run.result["collectives"].values())
            create = run.mocks.named(f"engine-{name}-page-cache").inputs["create"]
            assert "python3 - --name page-cache-" + name in create and "--model-dir" in create
            assert run.mocks.named(f"engine-{name}-page-cache").inputs["triggers"] == \
                run.mocks.named(f"engine-{name}-args-dry-run").inputs["triggers"]
    ray = h20.result["engine"]
    assert ray.containers["h20-1"] in h20.options["engine-h20-2-vllm-ray"].depends_on  # ray: head first
    ready = h20.mocks.named("engine-ray-cluster-ready")
    assert ready.inputs["create"].startswith("timeout 720 docker exec -i vllm-ray python3 - --name ray-cluster")
    assert "--nodes 2 --gpus 16" in ready.inputs["create"]


def test_checks_are_wrapped_triggered_and_ordered(prod: Run) -> None:
    pre = prod.mocks.named("node1-pre-pull")
    assert pre.inputs["create"].startswith(f"timeout {outer_timeout_s(BEFORE_PULL)} python3 - --name "
                                           "pre-pull-node1 --sections ownership,disk,gpu,model ")
    assert pre.inputs["triggers"][0] == "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
    assert "def main(" in pre.inputs["create"]  # the script itself travels in the heredoc
    post = prod.mocks.named("node1-preflight")
    assert post.inputs["create"].startswith(f"timeout {outer_timeout_s(AFTER_PULL)} python3 - --name "
                                            "preflight-node1 --sections toolkit,memlock ")
    fabric = prod.mocks.named("fabric-node2-fabric-preflight")
    assert "--sections infiniband,hca,sysctl" in fabric.inputs["create"]  # prod sets no gid_index
    assert "--hcas mlx5_0:1,mlx5_2:1" in fabric.inputs["create"]
    nccl = prod.mocks.named("fabric-node1-nccl-transport")
    assert "--container deepseek-v41-flash --transport roce" in nccl.inputs["create"]
    health = prod.mocks.named("api-health")
    assert health.inputs["create"].startswith("venv/bin/python -m checks.api --name api-health --url "
                                              "http://10.30.8.1:8030")
    assert "--deadline-s 4200" in health.inputs["create"]
    smoke = prod.mocks.named("api-smoke")
    assert "--sections models,chat,thinking,stream" in smoke.inputs["create"]
    assert "--dp-size 2 --rank-nodes node1,node2 --golden-json" in smoke.inputs["create"]
    generation = prod.result["engine"].generation
    for name in ("api-health", "api-smoke", "fabric-node1-nccl-transport", "engine-node2-dp-engines"):
        triggers = prod.mocks.named(name).inputs["triggers"]
        # secret as a whole: the list also holds the digest of the group's secrets (a rotation re-runs the checks)
        assert triggers[SECRET_SIG] == SECRET_VALUE and triggers["value"][0] == generation


def test_every_command_is_a_script_sh_parses(prod: Run, h20: Run) -> None:
    """`create` runs through `/bin/sh -c` on the node or the deployer: a stray quote (an apostrophe in an echo) fails
    only under the real CLI, never under mocks. `sh -n` reads each one as the shell will."""
    for run in (prod, h20):
        for kind in (REMOTE, LOCAL):
            for r in run.mocks.of_type(kind):
                done = subprocess.run(["sh", "-n", "-c", r.inputs["create"]], capture_output=True, text=True)
                assert done.returncode == 0, (r.name, done.stderr)


def test_a_rotated_secret_replaces_every_engine_container(prod: Run, h20: Run) -> None:
    """Only the head's env holds `api_key`; every container carries the group's secrets holder's ID in a label,
    so all are replaced when the holder is (its triggers, the secrets' digest, changed: a new ID)."""
    for run in (prod, h20):
        engine = run.result["engine"]
        for name, container in engine.containers.items():
            labels = {x["label"]: x["value"] for x in run.mocks.named(container._name).inputs["labels"]}
            assert labels["vllm-cluster.secrets-generation"] == "engine-secrets-id", name
            assert run.options[container._name].replacement_trigger is None, name
        holder = run.mocks.named("engine-secrets")
        assert holder.inputs["triggers"][SECRET_SIG] == SECRET_VALUE


def test_secrets_never_in_argv_or_plain_inputs(prod: Run) -> None:
    for r in prod.mocks.resources:
        for key in ("create", "command", "entrypoints"):
            assert SECRET_VALUES["api_key"] not in str(r.inputs.get(key, ""))
    env = prod.mocks.named("api-health").inputs["environment"]
    assert env[SECRET_SIG] == SECRET_VALUE and env["value"] == {"VLLM_API_KEY": SECRET_VALUES["api_key"]}
    head = prod.mocks.named("engine-node1-deepseek-v41-flash")
    assert head.inputs["envs"][SECRET_SIG] == SECRET_VALUE  # the whole env list travels as a secret
    assert f"VLLM_API_KEY={SECRET_VALUES['api_key']}" in head.inputs["envs"]["value"]
    node2 = prod.mocks.named("engine-node2-deepseek-v41-flash")
    assert not any(e.startswith("VLLM_API_KEY") for e in node2.inputs["envs"])
    assert SECRET_VALUES["api_key"] not in str(prod.outputs)


def test_exports(prod: Run, h20: Run) -> None:
    assert prod.outputs["endpoint"] == "http://10.30.8.1:8030"
    assert prod.outputs["image"] == "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
    assert prod.outputs["topology"] == {"backend": "mp", "nodes": 2, "tensor": 8, "pipeline": 1, "data": 2,
                                        "expert": 16}
    assert prod.outputs["nodes"] == {"node1": "dp-head", "node2": "headless-engine"}
    assert h20.outputs["topology"]["backend"] == "ray" and h20.outputs["nodes"]["h20-2"] == "ray-worker"
    assert "PASS api-health" in prod.outputs["verification"]


def test_bad_config_registers_nothing() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["parallelism"] |= {"tensor": 16, "data": 1}
    run = run_program("prod", values)
    assert run.error is not None and "ZeroDivisionError" in str(run.error)
    assert "vllm-cluster:parallelism.tensor = 16" in str(run.error)
    assert run.mocks.resources == []


def _inputs(run: Run) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in run.mocks.resources}


def _changed(a: Run, b: Run) -> set[str]:
    ia, ib = _inputs(a), _inputs(b)
    assert set(ia) == set(ib)
    return {name for name in ia if ia[name] != ib[name]}


def test_image_change_touches_engines_and_images_only() -> None:
    """Infrastructure touched: every engine container and image. Checks re-run by design (their triggers
    carry the image or engine generation); providers and everything else stay as they are."""
    base = run_program("prod")
    values = copy.deepcopy(read_stack_values("prod"))
    values["image"]["tag"] = "nightly-0123456789abcdef0123456789abcdef01234567"
    changed = _changed(base, run_program("prod", values))
    engine_and_images = {"engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash",
                         "node1-image", "node2-image"}
    checks = {"node1-preflight", "node2-preflight", "api-health", "api-smoke", "engine-node1-dp-engines",
              "engine-node2-dp-engines", "fabric-node1-nccl-transport", "fabric-node2-nccl-transport",
              "engine-node1-args-dry-run", "engine-node2-args-dry-run", "node1-pre-pull", "node2-pre-pull",
              "node1-weights", "node2-weights", "collective-node1", "collective-node2",
              "fabric-node1-fabric-preflight", "fabric-node2-fabric-preflight",
              "engine-node1-page-cache", "engine-node2-page-cache"}  # every check: the group moves
    assert changed == engine_and_images | checks
    assert not any(n.endswith("-docker") for n in changed)


def test_one_node_change_replaces_the_whole_group() -> None:
    base = run_program("prod")
    values = copy.deepcopy(read_stack_values("prod"))
    values["nodes"][1]["hcas"] = ["mlx5_0:1", "mlx5_3:1"]
    changed = _changed(base, run_program("prod", values))
    assert {"engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"} <= changed
    label = [x for x in _inputs(base)["engine-node1-deepseek-v41-flash"]["labels"]
             if x["label"] == "vllm-cluster.generation"]
    assert label and label[0]["value"] == base.result["engine"].generation


def test_api_check_setting_touches_no_engine_container() -> None:
    base = run_program("prod")
    values = copy.deepcopy(read_stack_values("prod"))
    values["api"] = {"progress_interval_s": 10, "health_timeout_s": 5000}
    changed = _changed(base, run_program("prod", values))
    assert changed == {"api-health", "api-smoke"}


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_rollout_pulls_everywhere_then_dry_runs_then_replaces(stack: str) -> None:
    """No engine container moves before the image is on every node and every node's dry run passed."""
    run = run_program(stack)
    engine = run.result["engine"]
    images = [n.image for n in run.result["nodes"].values()]
    dry_runs = list(engine.dry_runs.values())
    assert len(dry_runs) == len(images) == len(run.result["nodes"])
    for dry in engine.dry_runs.values():
        assert all(waits_for(run, dry, image) for image in images)  # every node's image, not only its own
        assert dry.triggers is not None
    collectives = list(run.result["collectives"].values())
    assert len(collectives) == len(images)  # multi-node: every container waits for every collective check ...
    for name, container in engine.containers.items():
        assert all(waits_for(run, container, c) for c in collectives), name
        assert all(waits_for(run, container, image) for image in images), name
    for c in collectives:  # ... which waits for every dry run, and through them every image and preflight
        assert all(waits_for(run, c, d) for d in dry_runs)
        assert not any(waits_for(run, d, c) for d in dry_runs)  # and not the other way round
    command = run.mocks.named(f"engine-{next(iter(run.result['nodes']))}-args-dry-run").inputs["create"]
    assert "docker run --rm -i --network none --pull never --entrypoint python3" in command


def test_dependency_edges_grow_linearly_with_nodes() -> None:
    """Every-node steps fan in through one barrier each (components/barrier.py): no N x N `depends_on` edges. The
    edges per node stay the same from 8 to 32 nodes (within a handful per stack for the shared resources)."""
    from bench.plan_scale import scaled

    per_node = {}
    for nodes in (8, 32):
        run = run_program("prod", scaled(nodes))
        assert run.error is None, run.error
        per_node[nodes] = dependency_edges(run) / nodes
    assert per_node[32] <= per_node[8] * 1.1, per_node


def test_healthcheck_durations_are_written_as_the_docker_provider_reads_them_back() -> None:
    """terraform-provider-docker reads a container's healthcheck back with Go's `time.Duration.String()` and the
    healthcheck forces a replacement: anything else ("600s") replaced the head's engine on every `pulumi up` of the
    lab. These are the strings Go prints for these durations."""
    from components.vllm_engine import go_duration

    go_prints = {0: "0s", 2: "2s", 30: "30s", 59: "59s", 60: "1m0s", 61: "1m1s", 600: "10m0s", 3599: "59m59s",
                 3600: "1h0m0s", 5430: "1h30m30s", 86400: "24h0m0s"}
    assert {s: go_duration(s) for s in go_prints} == go_prints
