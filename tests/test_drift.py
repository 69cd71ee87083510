"""`drift`: the plan's container against Docker's own `docker inspect` JSON, one row per kind of hand change.

The recorded JSON (tests/fixtures/docker/) pins the comparison on Docker's real field layout; the rest creates
real containers on the local Docker engine, one per kind of change, and reads them back with `docker inspect`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heal.drift import DriftRow, compare_container, foreign_containers, gpus_of, table
from stacks.planner.container_spec import ContainerSpec, HealthcheckSpec, VolumeSpec
from tests.conftest import ROOT
from tests.docker_harness import build_image, docker_ready, parse_started_at, remove_image

FIXTURES = ROOT / "tests" / "fixtures" / "docker"
RANK = ROOT / "tests" / "group_rank.py"


def spec(**changes: Any) -> ContainerSpec:
    """The container the fixture was created as, as the plan states it."""
    base: dict[str, Any] = dict(
        name="heal-fixture", purpose="test", image="heal-probe:1", vllm_args=None, command=["python3", "/rank.py"],
        entrypoint=None, env={"VLLM_HOST_IP": "192.0.2.11"}, secret_env={"HF_TOKEN": "env_secrets.HF_TOKEN"},
        network_mode="bridge", ipc_mode="private", privileged=False, gpus="all", ulimits={}, shm_size_mb=None,
        volumes=[VolumeSpec(host="/tmp", container="/data", read_only=True)], devices=[], capabilities=[],
        restart="no", labels={"vllm-cluster.stack": "test"}, healthcheck=None)
    base.update(changes)
    return ContainerSpec(**base)


def recorded() -> tuple[dict[str, Any], dict[str, Any]]:
    container = json.loads((FIXTURES / "inspect-created.json").read_text())[0]
    image = json.loads((FIXTURES / "image-inspect.json").read_text())[0]
    return container, image


def test_recorded_container_matches_its_plan_and_each_change_is_one_row() -> None:
    container, image = recorded()
    assert compare_container("n1", spec(), container, image["Id"], image["Config"]) == []
    cases = {
        "image": spec(image="heal-probe:2"),
        "command": spec(command=["python3", "/other.py"]),
        "entrypoint": spec(entrypoint=["/bin/sh", "-c"]),
        "env": spec(env={"VLLM_HOST_IP": "192.0.2.12"}),
        "labels": spec(labels={"vllm-cluster.stack": "prod"}),
        "restart-policy": spec(restart="unless-stopped"),
        "mounts": spec(volumes=[VolumeSpec(host="/tmp", container="/data", read_only=False)]),
        "gpus": spec(gpus=None),
    }
    for kind, planned in cases.items():
        rows = compare_container("n1", planned, container, image["Id"], image["Config"])
        assert {r.kind for r in rows} == {kind}, (kind, rows)
    moved = compare_container("n1", spec(), container, "sha256:" + "0" * 64, image["Config"])
    assert [r.kind for r in moved] == ["image"] and "another build" in moved[0].found
    assert [r.kind for r in compare_container("n1", spec(), None, image["Id"], None)] == ["missing"]
    by_id = {**container, "Config": {**container["Config"], "Image": container["Image"]}}  # as VllmEngine creates it
    assert compare_container("n1", spec(), by_id, image["Id"], image["Config"]) == []
    hand = {**container, "Config": {**container["Config"], "Image": "heal-probe:latest"}}
    assert [(r.kind, r.found) for r in compare_container("n1", spec(), hand, image["Id"], image["Config"])] == \
        [("image", "created from heal-probe:latest")]


def test_the_secrets_generation_label_is_the_programs_not_drift() -> None:
    """VllmEngine adds the secrets holder's ID as a label the plan cannot know; any other extra label is drift."""
    container, image = recorded()
    labels = container["Config"]["Labels"] or {}
    ours = {**container, "Config": {**container["Config"],
                                    "Labels": {**labels, "vllm-cluster.secrets-generation": "engine-secrets-1f2e"}}}
    assert compare_container("n1", spec(), ours, image["Id"], image["Config"]) == []
    other = {**container, "Config": {**container["Config"], "Labels": {**labels, "vllm-cluster.other": "x"}}}
    assert [r.kind for r in compare_container("n1", spec(), other, image["Id"], image["Config"])] == ["labels"]


def test_secret_values_never_reach_a_row() -> None:
    container, image = recorded()
    rows = compare_container("n1", spec(secret_env={}), container, image["Id"], image["Config"])
    assert [(r.kind, r.found) for r in rows] == [("env", "HF_TOKEN set (value not shown)")]
    assert "dummy" not in table(rows)
    gone = compare_container("n1", spec(secret_env={"API_KEY": "api_key"}), container, image["Id"], image["Config"])
    assert {r.plan for r in gone} == {"API_KEY (secret, from api_key)", "HF_TOKEN not set by the plan"}


def test_gpus_spelled_as_docker_run_spells_them() -> None:
    assert gpus_of({"DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}]}) == "all"
    assert gpus_of({"DeviceRequests": [{"Count": 0, "DeviceIDs": ["0", "3"], "Capabilities": [["gpu"]]}]}) \
        == "device=0,3"
    assert gpus_of({"DeviceRequests": None}) == "none"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    why = docker_ready()
    if why:
        pytest.fail(why)
    tag = f"heal-drift-{uuid.uuid4().hex[:8]}:1"
    build_image(tag, tmp_path_factory.mktemp("img"), with_vllm=False, files={RANK: "/rank.py"})
    yield tag
    remove_image(tag)


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=120).stdout


def inspect(name: str) -> dict[str, Any]:
    return dict(json.loads(docker("inspect", name))[0])


def image_facts(ref: str) -> tuple[str, dict[str, Any]]:
    data = json.loads(docker("image", "inspect", ref))[0]
    return data["Id"], data["Config"]


def test_every_kind_of_hand_change_on_real_containers(image: str, tmp_path: Path) -> None:
    """One container as Pulumi would create it, then each hand change the issue lists, each named by drift."""
    tag = uuid.uuid4().hex[:8]
    names: list[str] = []
    extra_tags: list[str] = []

    def create(suffix: str, *flags: str, ref: str = image, cmd: tuple[str, ...] = ("python3", "/rank.py")) -> str:
        name = f"heal-drift-{tag}-{suffix}"
        names.append(name)
        docker("create", "--name", name, "--gpus", "all", "-v", f"{tmp_path}:/data:ro", "-e",
               "VLLM_HOST_IP=192.0.2.11", "-e", "HF_TOKEN=hunter2", "--label", "vllm-cluster.stack=test", "--restart",
               "no", *flags, ref, *cmd)
        return name

    planned = spec(image=image, volumes=[VolumeSpec(host=str(tmp_path), container="/data", read_only=True)])
    try:
        def kinds(name: str, ref: str = image, slack: float | None = None, gpus: str | None = "all") -> set[str]:
            image_id, config = image_facts(ref)
            rows = compare_container("n1", planned.model_copy(update={"gpus": gpus}), inspect(name), image_id, config,
                                     restart_slack_s=120 if slack is None else slack)
            assert "hunter2" not in table(rows)
            return {r.kind for r in rows}

        assert kinds(create("clean")) == set()
        assert kinds(create("cmd", cmd=("python3", "/rank.py", "--extra"))) == {"command"}
        assert kinds(create("env", "-e", "NCCL_DEBUG=TRACE")) == {"env"}
        assert kinds(create("envval", "-e", "VLLM_HOST_IP=192.0.2.99")) == {"env"}
        assert kinds(create("label", "--label", "com.docker.compose.project=handrun")) == {"labels"}
        assert kinds(create("mount", "-v", f"{tmp_path}:/extra")) == {"mounts"}
        # `docker update` changes the restart policy in place
        name = create("policy")
        docker("update", "--restart", "unless-stopped", name)
        assert kinds(name) == {"restart-policy"}
        name = f"heal-drift-{tag}-nogpu"
        names.append(name)
        docker("create", "--name", name, "-v", f"{tmp_path}:/data:ro", "-e", "VLLM_HOST_IP=192.0.2.11", "-e",
               "HF_TOKEN=x", "--label", "vllm-cluster.stack=test", image, "python3", "/rank.py")
        assert kinds(name) == {"gpus"}
        # the tag re-pointed at another build: the container still runs the old one
        name = create("retag")
        other = f"heal-drift-{tag}-other:1"
        build_image(other, tmp_path, with_vllm=False, files={RANK: "/rank.py", Path(__file__): "/marker.py"})
        extra_tags.append(other)
        moved = f"heal-drift-{tag}-moved:1"
        docker("tag", image, moved)
        extra_tags.append(moved)
        retagged = spec(image=moved, volumes=planned.volumes)
        clean_on_moved = f"heal-drift-{tag}-onmoved"
        names.append(clean_on_moved)
        docker("create", "--name", clean_on_moved, "--gpus", "all", "-v", f"{tmp_path}:/data:ro", "-e",
               "VLLM_HOST_IP=192.0.2.11", "-e", "HF_TOKEN=x", "--label", "vllm-cluster.stack=test", moved, "python3",
               "/rank.py")
        docker("tag", other, moved)
        image_id, config = image_facts(moved)
        rows = compare_container("n1", retagged, inspect(clean_on_moved), image_id, config)
        assert [r.kind for r in rows] == ["image"], rows
        # restarted by hand after creation: informative, never blocking (started without GPUs: none here)
        name = f"heal-drift-{tag}-restarted"
        names.append(name)
        docker("create", "--name", name, "-v", f"{tmp_path}:/data:ro", "-e", "VLLM_HOST_IP=192.0.2.11", "-e",
               "HF_TOKEN=x", "--label", "vllm-cluster.stack=test", image, "python3", "/rank.py")
        docker("start", name)
        state = inspect(name)
        gap = (parse_started_at(state["State"]["StartedAt"]) - parse_started_at(state["Created"])).total_seconds()
        assert gap > 0, state
        # started `gap` after its creation by Docker's own clock (no waiting for time to pass, however slow the
        # machine): a restart for a slack below the gap, none for one above it
        assert kinds(name, slack=gap / 2, gpus=None) == {"restarted"}
        assert kinds(name, slack=gap * 2, gpus=None) == set()
        assert kinds(name, gpus=None) == set()
        # a hand-run compose container on the node's GPUs and port
        foreign = f"heal-drift-{tag}-compose"
        names.append(foreign)
        docker("run", "-d", "--name", foreign, "--label", "com.docker.compose.project=handrun", "-p",
               "127.0.0.1::8000", image, "python3", "-c", "import time; time.sleep(600)")
        port = int(docker("port", foreign, "8000").split(":")[-1])
        rows = foreign_containers("n1", "test", {"heal-drift-clean"}, [inspect(foreign)], {port})
        assert len(rows) == 1 and rows[0].kind == "foreign" and f"publishes port {port}" in rows[0].found \
            and "compose project handrun" in rows[0].found
        assert foreign_containers("n1", "test", set(), [inspect(foreign)], {port + 1}) == []
    finally:
        for name in names:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        for ref in extra_tags:
            remove_image(ref)


def test_inspect_keeps_the_containers_that_exist_when_another_is_gone(image: str) -> None:
    """A container removed between `docker ps` and `docker inspect` (a busy node, another test run here) makes inspect
    exit 1 after printing the others: those still reach the foreign-container check, not None for all."""
    from heal.node_access import MappedAccess
    from heal.node_access import inspect as node_inspect

    name = f"heal-drift-{uuid.uuid4().hex[:8]}-kept"
    docker("create", "--name", name, image, "python3", "/rank.py")
    access = MappedAccess({"n1": {"docker_host": "unix:///var/run/docker.sock"}})
    try:
        found = node_inspect(access, "n1", name, "0" * 64)  # an id no container has: one removed since it was listed
        assert found is not None and [c["Name"] for c in found] == [f"/{name}"], found
        assert node_inspect(access, "n1", "0" * 64) is None
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


class NodesOf:
    """A fake NodeAccess: `docker ps` and `docker inspect` of the running containers given per node; the engine
    containers and images are absent (their rows are not what this test reads)."""

    def __init__(self, running: dict[str, list[dict[str, Any]]]) -> None:
        self.running = running

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        mine = {c["Id"]: c for c in self.running.get(node, [])}
        if args[0] == "ps":
            return subprocess.CompletedProcess(args, 0, "\n".join(mine), "")
        found = [mine[ref] for ref in args[2:] if ref in mine]
        if not found:
            return subprocess.CompletedProcess(args, 1, "", "Error: No such object")
        return subprocess.CompletedProcess(args, 0, json.dumps(found), "")

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        raise AssertionError("drift runs no script")

    def container(self, node: str, planned: str) -> str:
        return planned


def running(name: str, gpus: bool, stack: str | None) -> dict[str, Any]:
    return {"Id": uuid.uuid4().hex, "Name": "/" + name, "State": {"Running": True},
            "Config": {"Image": "sha256:x", "Labels": {"vllm-cluster.stack": stack} if stack else {}},
            "HostConfig": {"DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}] if gpus else None}}


def test_the_stacks_own_monitoring_containers_are_known_by_name_and_label_not_foreign() -> None:
    from heal.cli import drift_rows
    from stacks.model.loader import load_stack
    from stacks.planner.plan import build_plan

    plan = build_plan("h20", load_stack("h20", ["observability.enabled=true"],
                                        assume_secret=["grafana_admin_password"]))
    assert plan.observability is not None
    own = {(m.node, m.role): m.name for m in plan.observability.containers}
    head, other = plan.nodes[0].name, plan.nodes[-1].name
    access = NodesOf({
        head: [running(own[head, "dcgm-exporter"], gpus=True, stack="h20"),  # as components/observability.py makes it
               running(own[head, "node-exporter"], gpus=False, stack="h20"),
               running("dcgm-by-hand", gpus=True, stack="h20"),  # copies the label, not the name
               running(own[head, "prometheus"], gpus=False, stack=None)],  # recreated by hand without the label
        other: [running(own[other, "dcgm-exporter"], gpus=True, stack=None),  # the name without the label
                running(own[other, "node-exporter"], gpus=True, stack="h20")]})  # own, but given GPUs by hand
    rows = [r for r in drift_rows(plan, access) if r.kind in ("foreign", "monitoring")]
    found = {(r.node, r.container): r for r in rows}
    assert (head, own[head, "dcgm-exporter"]) not in found, rows
    assert (head, own[head, "node-exporter"]) not in found, rows
    assert found[head, "dcgm-by-hand"].kind == "foreign" and found[head, "dcgm-by-hand"].blocking
    info = found[head, own[head, "prometheus"]]
    assert info.kind == "monitoring" and not info.blocking and "without that label" in info.found
    unlabelled = found[other, own[other, "dcgm-exporter"]]
    assert unlabelled.blocking and "GPUs all" in unlabelled.found and "without label" in unlabelled.found
    given = found[other, own[other, "node-exporter"]]
    assert given.blocking and "planned without GPUs" in given.found
    assert len(rows) == 4, table(rows)


def test_every_host_setting_the_plan_makes_is_compared_and_each_change_is_one_row() -> None:
    """Network, IPC, privileged, capabilities, devices, ulimits, /dev/shm and the health check: each planned value
    Docker does not report is one row of its kind, and blocking (a restart into it would be no heal)."""
    container, image = recorded()
    health = HealthcheckSpec(test=["CMD", "true"], interval_s=30, timeout_s=10, retries=3, start_period_s=60)
    cases = {
        "network": spec(network_mode="host"),
        "ipc": spec(ipc_mode="host"),
        "privileged": spec(privileged=True),
        "capabilities": spec(capabilities=["IPC_LOCK"]),
        "devices": spec(devices=["/dev/infiniband"]),
        "ulimits": spec(ulimits={"memlock": [-1, -1]}),
        "shm-size": spec(shm_size_mb=16384),
        "healthcheck": spec(healthcheck=health),
    }
    for kind, planned in cases.items():
        rows = compare_container("n1", planned, container, image["Id"], image["Config"])
        assert [r.kind for r in rows] == [kind], (kind, rows)
        assert rows[0].blocking
    dropped = {**container, "HostConfig": {**container["HostConfig"], "CapAdd": ["CAP_IPC_LOCK"], "CapDrop": ["ALL"]}}
    rows = compare_container("n1", spec(capabilities=["IPC_LOCK"]), dropped, image["Id"], image["Config"])
    assert [(r.kind, r.found) for r in rows] == [("capabilities", "IPC_LOCK; dropped ALL")]
    # a container recreated with `--network none`, the plan's host network: not healed
    none = {**container, "HostConfig": {**container["HostConfig"], "NetworkMode": "none"}}
    rows = compare_container("n1", spec(network_mode="host"), none, image["Id"], image["Config"])
    assert [(r.kind, r.plan, r.found) for r in rows] == [("network", "host", "none")]


def test_a_long_command_is_compared_whole_and_the_difference_shown() -> None:
    container, image = recorded()
    long = ["vllm", "serve", "/models/m", *[f"--flag-{i}={i}" for i in range(40)], "--max-model-len", "65536"]
    changed = [*long[:-1], "1048576"]
    hand = {**container, "Config": {**container["Config"], "Cmd": changed}}
    rows = compare_container("n1", spec(command=long), hand, image["Id"], image["Config"])
    assert [r.kind for r in rows] == ["command"]
    assert "65536" in rows[0].plan and "1048576" in rows[0].found, rows[0]
    assert "from word 45" in rows[0].found and "…" not in rows[0].found[-3:]
    # words inserted in the middle: the inserted words are shown, not a cut prefix both sides share
    inserted = [*long[:20], "--enforce-eager", *long[20:]]
    rows = compare_container("n1", spec(command=long),
                             {**container, "Config": {**container["Config"], "Cmd": inserted}}, image["Id"],
                             image["Config"])
    assert "--enforce-eager" in rows[0].found and "--enforce-eager" not in rows[0].plan, rows[0]


def test_host_settings_as_real_docker_reports_them(image: str, tmp_path: Path) -> None:
    """A container created with every host setting as planned reads back clean from a real Docker engine; each
    setting changed by hand is one row of its kind."""
    tag = uuid.uuid4().hex[:8]
    names: list[str] = []
    health = HealthcheckSpec(test=["CMD-SHELL", "true"], interval_s=30, timeout_s=10, retries=3, start_period_s=60)
    planned = spec(image=image, volumes=[], gpus=None, network_mode="host", ipc_mode="host",
                   ulimits={"memlock": [-1, -1], "nofile": [1048576, 1048576]}, shm_size_mb=1024,
                   capabilities=["IPC_LOCK"], devices=["/dev/null"], healthcheck=health, secret_env={})
    as_planned = ["--network", "host", "--ipc", "host", "--ulimit", "memlock=-1:-1", "--ulimit",
                  "nofile=1048576:1048576", "--shm-size", "1024m", "--cap-add", "IPC_LOCK", "--device",
                  "/dev/null:/dev/null", "--health-cmd", "true", "--health-interval", "30s", "--health-timeout",
                  "10s", "--health-retries", "3", "--health-start-period", "60s"]

    def create(suffix: str, flags: list[str]) -> str:
        name = f"heal-drift-{tag}-{suffix}"
        names.append(name)
        docker("create", "--name", name, "-e", "VLLM_HOST_IP=192.0.2.11", "--label", "vllm-cluster.stack=test",
               "--restart", "no", *flags, image, "python3", "/rank.py")
        return name

    def replaced(flag: str, value: str | None) -> list[str]:
        i = as_planned.index(flag)
        rest = as_planned[:i] + as_planned[i + 2:]
        return rest + ([flag, value] if value is not None else [])

    image_id, config = image_facts(image)
    try:
        def kinds(name: str) -> list[str]:
            return [r.kind for r in compare_container("n1", planned, inspect(name), image_id, config)]

        assert kinds(create("clean", as_planned)) == []
        assert kinds(create("netnone", replaced("--network", "none"))) == ["network"]
        assert kinds(create("ipc", replaced("--ipc", None))) == ["ipc"]
        assert kinds(create("priv", [*as_planned, "--privileged"])) == ["privileged"]
        assert kinds(create("cap", replaced("--cap-add", "SYS_ADMIN"))) == ["capabilities"]
        assert kinds(create("dev", replaced("--device", None))) == ["devices"]
        assert kinds(create("ulimit", replaced("--ulimit", "memlock=65536:65536"))) == ["ulimits"]
        assert kinds(create("shm", replaced("--shm-size", "64m"))) == ["shm-size"]
        assert kinds(create("health", replaced("--health-cmd", "false"))) == ["healthcheck"]
    finally:
        for name in names:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def _drift_cli(monkeypatch: pytest.MonkeyPatch, rows: list[DriftRow], *flags: str) -> tuple[int, str]:
    """`python -m stacks drift h20` with the nodes' answer replaced by `rows` (the comparison is tested above)."""
    import contextlib
    import io

    from heal import cli
    from review.cli import main

    monkeypatch.setattr(cli, "drift_rows", lambda plan, access, config=None: rows)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["drift", "h20", *flags])
    return code, out.getvalue()


def test_informative_rows_alone_do_not_make_drift_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    restarted = DriftRow("h20-1", "engine", "restarted", "started once by Pulumi", "restarted 1 time(s)")
    code, out = _drift_cli(monkeypatch, [restarted])
    assert code == 0 and "only for information" in out and "restarted (info)" in out, out
    code, out = _drift_cli(monkeypatch, [restarted], "--json")
    assert code == 0 and json.loads(out)[0]["blocking"] is False
    network = DriftRow("h20-1", "engine", "network", "host", "none")
    code, out = _drift_cli(monkeypatch, [restarted, network])
    assert code == 1 and "1 difference(s)" in out and "1 for information" in out, out


def test_drift_json_prints_json_when_the_stack_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from review.cli import main

    code = main(["drift", "h20", "--json", "--set", "parallelism.tensor=0"])
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert code == 2 and answer["stack"] == "h20" and answer["error"] == "the stack is refused"
    assert "vllm-cluster:parallelism.tensor" in [e["key"] for e in answer["errors"]], answer
    assert "parallelism.tensor" in captured.err


def test_a_shell_form_health_check_with_the_planned_words_is_the_planned_check() -> None:
    """`docker run --health-cmd` writes CMD-SHELL only: the same words run the same check; other words do not."""
    container, image = recorded()
    probe = ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health')"]
    planned = spec(healthcheck=HealthcheckSpec(test=probe, interval_s=30, timeout_s=10, retries=3, start_period_s=60))

    def with_test(test: list[str]) -> dict[str, Any]:
        health = {"Test": test, "Interval": 30 * 10**9, "Timeout": 10 * 10**9, "Retries": 3, "StartPeriod": 60 * 10**9}
        return {**container, "Config": {**container["Config"], "Healthcheck": health}}

    assert compare_container("n1", planned, with_test(probe), image["Id"], image["Config"]) == []
    shell = ["CMD-SHELL", shlex.join(probe[1:])]
    assert compare_container("n1", planned, with_test(shell), image["Id"], image["Config"]) == []
    other = ["CMD-SHELL", shlex.join([*probe[1:], "--x"])]
    assert [r.kind for r in compare_container("n1", planned, with_test(other), image["Id"], image["Config"])] == \
        ["healthcheck"]


@pytest.mark.parametrize("argv", [["drift", "--json"], ["drift", "h20", "--json", "--bogus"],
                                  ["drift", "h20", "--json", "--set"],
                                  ["drift", "h20", "--json", "--api-key=Tok3nS3cretPw"]])
def test_drift_json_answers_json_when_an_argument_is_refused(argv: list[str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from review.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert exit_.value.code == 2 and "bad argument" in answer["error"] and answer["next"], answer
    assert answer["stack"] == (None if argv[1] == "--json" else "h20")
    assert "bad argument" in captured.err and "Tok3nS3cretPw" not in captured.out + captured.err


@pytest.mark.parametrize("flag", ["--json=1", "--json=true"])
def test_drift_json_with_a_value_is_refused_in_json(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`drift prod --json=1` asks for JSON too (argparse refuses the value of a switch): the refusal comes as JSON
    on stdout like any other, not as plain-text usage only."""
    from review.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["drift", "h20", flag])
    answer = json.loads(capsys.readouterr().out)
    assert exit_.value.code == 2 and answer["stack"] == "h20" and "--json" in answer["error"], answer


def test_drift_json_answers_json_when_it_crashes(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from heal import cli
    from review.cli import main

    def crash(plan: object, access: object, config: object = None) -> list[DriftRow]:
        raise RuntimeError("a bug")

    monkeypatch.delenv("VLLM_CLUSTER_DEBUG", raising=False)
    monkeypatch.setattr(cli, "drift_rows", crash)
    code = main(["drift", "h20", "--json"])
    captured = capsys.readouterr()
    assert code == 3 and "internal error" in json.loads(captured.out)["error"], captured
    assert "internal error" in captured.err


class Recorded:
    """A fake NodeAccess answering `docker ps` and `docker inspect` from recorded containers (by name) and images
    (by reference) per node."""

    def __init__(self, containers: dict[str, dict[str, dict[str, Any]]], images: dict[str, dict[str, Any]]) -> None:
        self.containers, self.images = containers, images

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        mine = self.containers.get(node, {})
        if args[0] == "ps":
            return subprocess.CompletedProcess(args, 0, "\n".join(mine), "")
        pool = self.images if args[0] == "image" else mine
        found = [pool[ref] for ref in args[2:] if ref in pool]
        if not found:
            return subprocess.CompletedProcess(args, 1, "", "Error: No such object")
        return subprocess.CompletedProcess(args, 0, json.dumps(found), "")

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        raise AssertionError("drift runs no script")

    def container(self, node: str, planned: str) -> str:
        return planned


IMAGE_HEALTH = {"Test": ["CMD-SHELL", "wget -q -O- localhost:3000/api/health"], "Interval": 30 * 10**9,
                "Timeout": 5 * 10**9, "Retries": 3}


def as_created(want: ContainerSpec) -> dict[str, Any]:
    """`docker inspect` of a monitoring container as components/observability.py creates it from its spec."""
    image_id = f"sha256:{want.purpose}"
    return {"Id": want.name, "Name": "/" + want.name, "Image": image_id, "Created": "2026-01-01T00:00:00Z",
            "RestartCount": 0, "State": {"Running": True, "StartedAt": "2026-01-01T00:00:05Z"},
            "Config": {"Image": image_id, "Cmd": want.command or None, "Entrypoint": None,
                       "Env": [f"{k}={v}" for k, v in want.env.items()], "Labels": dict(want.labels),
                       "Healthcheck": IMAGE_HEALTH if want.purpose == "grafana" else None},
            "HostConfig": {"NetworkMode": "host", "IpcMode": "private", "Privileged": False,
                           "CapAdd": list(want.capabilities) or None, "RestartPolicy": {"Name": want.restart},
                           "DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}] if want.gpus else None,
                           "ShmSize": 64 * 1024 * 1024},
            "Mounts": [{"Type": "bind", "Source": v.host, "Destination": v.container, "RW": not v.read_only}
                       for v in want.volumes]}


def test_monitoring_containers_are_compared_field_by_field_as_engines_are() -> None:
    from heal.cli import drift_rows, monitor_specs
    from stacks.model.loader import load_stack
    from stacks.planner.plan import build_plan

    config = load_stack("h20", ["observability.enabled=true"], assume_secret=["grafana_admin_password"])
    plan = build_plan("h20", config)
    head = plan.nodes[0].name
    specs = {s.purpose: s for s in monitor_specs(plan, config, head)}
    assert {"prometheus", "grafana", "node-exporter", "dcgm-exporter"} <= set(specs), specs
    assert specs["dcgm-exporter"].gpus == "all" and specs["dcgm-exporter"].capabilities == ["SYS_ADMIN"]
    containers = {s.name: as_created(s) for s in specs.values()}
    images = {s.image: {"Id": f"sha256:{s.purpose}",
                        "Config": {"Healthcheck": IMAGE_HEALTH} if s.purpose == "grafana" else {}}
              for s in specs.values()}
    access = Recorded({head: containers}, images)
    assert [r for r in drift_rows(plan, access, config) if r.kind == "monitoring" and r.node == head] == []
    changed = containers[specs["prometheus"].name]
    changed["HostConfig"] |= {"NetworkMode": "bridge", "IpcMode": "host", "CapAdd": ["NET_ADMIN"],
                              "ShmSize": 1 << 30, "Ulimits": [{"Name": "nofile", "Soft": 1, "Hard": 1},],
                              "Devices": [{"PathOnHost": "/dev/kmsg", "PathInContainer": "/dev/kmsg"}],
                              "RestartPolicy": {"Name": "no"}}
    changed["Config"]["Healthcheck"] = {"Test": ["CMD", "true"], "Interval": 10**9}
    changed["Config"]["Env"] = ["GF_SECURITY_ADMIN_PASSWORD=Tok3nS3cretPw"]
    containers[specs["grafana"].name]["Config"]["Healthcheck"] = None  # the image's health check dropped
    del containers[specs["node-exporter"].name]
    rows = [r for r in drift_rows(plan, access, config) if r.kind == "monitoring" and r.node == head]
    by_field = {(r.container, r.plan.partition(":")[0]) for r in rows}
    prometheus = specs["prometheus"].name
    for field in ("network", "ipc", "capabilities", "shm-size", "ulimits", "devices", "restart-policy",
                  "healthcheck", "env"):
        assert (prometheus, field) in by_field, table(rows)
    assert (specs["grafana"].name, "healthcheck") in by_field, table(rows)
    assert (specs["node-exporter"].name, "missing") in by_field, table(rows)
    assert not any(r.blocking for r in rows) and "Tok3nS3cretPw" not in table(rows)
