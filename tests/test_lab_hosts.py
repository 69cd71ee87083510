"""The lab cluster (lab/hosts.py) is what Pulumi will deploy onto: three nodes, each reached over SSH with its
pinned host key, each with a Docker engine and a disk of its own, an image registry and an S3 they all reach,
and `down` that leaves nothing behind. Real sshd, dockerd, docker-registry and moto; needs root and
`make services`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from lab.hosts import Lab, LabError, down, lab_pids, load, push_image, s3_client, s3_upload, status, up
from stacks.model.field_types import SshHostKey
from tests.conftest import ROOT
from tests.docker_harness import RUN, build_image, docker_ready, remove_image

pytestmark = pytest.mark.xdist_group(__name__)  # one lab, built once, on one worker (conftest names it so too)
PREFIX = f"vt{os.getpid() % 100000}"
SUBNET = f"10.232.{os.getpid() % 250 + 1}"
"""Names and a /24 of this process's own: a user's lab (vlab, 10.231.0) or a second test run never collide."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, mounts, daemons)")
    state = tmp_path_factory.mktemp("lab")
    try:
        yield up(3, state, prefix=PREFIX, subnet=SUBNET, log=lambda _: None)
    finally:
        down(state, log=lambda _: None)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout[-800:]} {done.stderr[-800:]}"
    return done.stdout.strip()


def test_every_node_is_reached_over_ssh_at_its_own_engine(lab: Lab) -> None:
    assert [n.name for n in lab.nodes] == ["lab1", "lab2", "lab3"]
    ids = [ok(lab.ssh(n, "docker info --format '{{.ID}}'")) for n in lab.nodes]
    assert len(set(ids)) == 3, ids
    for node, engine in zip(lab.nodes, ids, strict=True):
        assert ok(lab.ssh(node, "hostname")) == node.name
        assert ok(lab.ssh(node, "ls /sys/class/net")).split() == ["docker0", "lab0", "lo"]  # its own links
        assert f"inet {node.address}/24" in ok(lab.ssh(node, "ip -4 -o addr show lab0"))
        # the docker CLI's SSH helper runs `docker system dial-stdio` on the node: the same engine answers
        over_ssh = subprocess.run(["docker", "info", "--format", "{{.ID}}"], env=lab.docker_env(node),
                                  capture_output=True, text=True, timeout=120)
        assert ok(over_ssh) == engine
    healthy, lines = status(lab.state_dir)
    assert healthy, lines


def test_a_container_exists_only_on_its_node(lab: Lab) -> None:
    node1, node2, _ = lab.nodes
    name = f"lab-probe-{RUN}"
    ok(lab.ssh(node1, f"tar cf - -T /dev/null | docker import - {name}:1 && docker create --name {name} {name}:1 /x"))
    listed = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], env=lab.docker_env(node1),
                            capture_output=True, text=True, timeout=120)
    assert name in ok(listed).split()
    assert name not in ok(lab.ssh(node2, "docker ps -a --format '{{.Names}}'")).split()
    assert ok(lab.ssh(node2, f"docker image inspect {name}:1 >/dev/null 2>&1 || echo absent")) == "absent"


def test_a_unit_is_enabled_and_disabled_on_its_node_only(lab: Lab) -> None:
    """No systemd runs on a node, but a script that checks for it (the firewall's) finds /run/systemd/system, and
    the real systemctl links and unlinks the unit offline; `daemon-reload` has nothing to reload."""
    node1, node2, _ = lab.nodes
    unit = f"lab-probe-{RUN}.service"
    wants = f"/etc/systemd/system/multi-user.target.wants/{unit}"
    ok(lab.ssh(node1, f"test -d /run/systemd/system && printf '[Service]\\nExecStart=/bin/true\\n[Install]\\n"
                      f"WantedBy=multi-user.target\\n' > /etc/systemd/system/{unit} && systemctl daemon-reload "
                      f"&& systemctl enable {unit} 2>&1"))
    assert ok(lab.ssh(node1, f"readlink {wants}")) == f"/etc/systemd/system/{unit}"
    assert ok(lab.ssh(node2, f"test -e {wants} && echo visible || echo absent")) == "absent"
    assert not Path(wants).exists(), "the node enabled a unit on this machine's own disk"
    ok(lab.ssh(node1, f"systemctl disable {unit} 2>&1 && rm /etc/systemd/system/{unit}"))
    assert ok(lab.ssh(node1, f"test -e {wants} && echo left || echo gone")) == "gone"


@pytest.mark.parametrize("path", ["/srv/lab-models/probe", "/etc/nftables.conf.probe", "/var/lib/vllm-cluster/probe",
                                  "/run/lock/probe", "/tmp/probe", "/root/probe"])
def test_what_a_node_writes_stays_on_that_node(lab: Lab, path: str) -> None:
    node1, node2, _ = lab.nodes
    target = f"{path}-{RUN}"
    ok(lab.ssh(node1, f"mkdir -p $(dirname {target}) && echo node1 > {target} && cat {target}"))
    assert ok(lab.ssh(node2, f"test -e {target} && echo visible || echo absent")) == "absent"
    assert not Path(target).exists(), "the node wrote onto this machine's own disk"
    if path.startswith("/srv/lab-models/"):
        assert (Path(lab.state_dir) / "nodes" / "lab1" / "models" / Path(target).name).read_text() == "node1\n"


def test_host_keys_are_pinned_in_the_stack_files_format(lab: Lab) -> None:
    known = Path(lab.known_hosts).read_text().splitlines()
    for node in lab.nodes:
        assert TypeAdapter(SshHostKey).validate_python(node.host_key) == node.host_key
        assert re.fullmatch(r"ssh-ed25519 AAAA\S+", node.host_key)
        assert f"{node.address} {node.host_key}" in known
        scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", node.address], capture_output=True, text=True,
                                 timeout=60)
        assert f"{node.address} {node.host_key}" in ok(scanned).splitlines()
    assert len({n.host_key for n in lab.nodes}) == 3


@pytest.fixture(scope="module")
def pushed(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A python3 image built in this machine's engine and pushed into the lab registry: what nodes pull."""
    problem = docker_ready()
    if problem:
        pytest.fail(f"this machine's Docker engine is needed (make services): {problem}")
    tag = build_image(f"lab-python:{RUN}", tmp_path_factory.mktemp("img"), with_vllm=False)
    try:
        return push_image(lab, tag, f"lab/python:{RUN}")
    finally:
        remove_image(tag)


def test_an_image_pushed_from_this_machine_is_pulled_by_a_node(lab: Lab, pushed: str) -> None:
    assert pushed == f"{lab.registry}/lab/python:{RUN}"
    node = lab.nodes[2]
    assert ok(lab.ssh(node, f"docker image inspect {pushed} >/dev/null 2>&1 || echo absent")) == "absent"
    out = ok(lab.ssh(node, f"docker pull -q {pushed} >/dev/null && docker run --rm {pushed} python3 -c 'print(6*7)'"))
    assert out == "42"


def test_a_model_folder_uploaded_to_s3_is_read_from_a_node(lab: Lab, tmp_path: Path) -> None:
    (tmp_path / "tiny" / "sub").mkdir(parents=True)
    (tmp_path / "tiny" / "config.json").write_text('{"model_type": "llama"}\n')
    (tmp_path / "tiny" / "sub" / "w.bin").write_bytes(b"\x00\x01" * 1000)
    assert s3_upload(lab, tmp_path / "tiny", "models", "tiny/") == "s3://models/tiny"
    client = s3_client(lab)
    assert client.get_object(Bucket="models", Key="tiny/sub/w.bin")["Body"].read() == b"\x00\x01" * 1000
    url = client.generate_presigned_url("get_object", Params={"Bucket": "models", "Key": "tiny/config.json"})
    read = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode(), end='')\""
    assert ok(lab.ssh(lab.nodes[1], read)) == '{"model_type": "llama"}'


def test_up_again_returns_the_lab_and_refuses_another_size(lab: Lab) -> None:
    assert up(3, lab.state_dir, prefix=PREFIX, subnet=SUBNET, log=lambda _: None) == lab
    with pytest.raises(LabError, match="its own --state-dir"):  # not silently the lab already there
        up(3, lab.state_dir, prefix="other", subnet=SUBNET, log=lambda _: None)
    with pytest.raises(LabError, match="a lab exists"):
        up(2, lab.state_dir, prefix=PREFIX, subnet=SUBNET, log=lambda _: None)


def _alive(pid: int, name: str) -> bool:
    """The process still runs (not gone, not a zombie waiting for init, not the pid reused by another program)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return comm == name and state != "Z"


def test_down_and_status_of_a_dir_without_a_lab_touch_no_other_lab(lab: Lab, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A state dir that holds no lab names no prefix: `down` and `status` must not guess one (they guessed `vlab`,
    so a test's `down` of its removed lab tore down a `make lab` running beside it)."""
    import lab.hosts as hosts

    def guessed(*_: object) -> dict[int, str]:
        raise AssertionError("down/status looked for a lab's processes in a dir that holds none")

    lines: list[str] = []
    monkeypatch.setattr(hosts, "lab_pids", guessed)
    down(tmp_path / "no-lab", log=lines.append)
    assert lines and "no lab in" in lines[0]
    healthy, report = status(tmp_path / "no-lab")
    assert not healthy and report == [f"state dir {tmp_path / 'no-lab'}: absent"]
    monkeypatch.undo()
    assert status(lab.state_dir)[0], "the running lab is untouched"


def test_down_leaves_no_namespace_process_mount_or_file(lab: Lab, pushed: str) -> None:
    """Last in the module: the fixture's own `down` then finds nothing, which is the idempotence check."""
    ok(lab.ssh(lab.nodes[0], f"docker run -d --name lab-sleeper-{RUN} {pushed} python3 -c 'import time; "
                             "time.sleep(3600)'"))
    before = lab_pids(lab.state_dir, lab.prefix)
    wanted = {"sshd", "dockerd", "containerd", "containerd-shim", "docker-registry", "moto_server", "python3"}
    assert wanted <= set(before.values()), before
    down(lab.state_dir, log=lambda _: None)
    assert lab_pids(lab.state_dir, lab.prefix) == {}
    assert [f"{pid} {name}" for pid, name in before.items() if _alive(pid, name)] == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"{PREFIX}-" not in listed
    assert not Path(f"/sys/class/net/{PREFIX}-host").exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert lab.state_dir not in mounts and f"/run/netns/{PREFIX}-" not in mounts
    assert not Path(lab.state_dir).exists()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{PREFIX}-*")) + list(Path("/sys/fs/cgroup").glob(f"{PREFIX}-*"))
    assert load(lab.state_dir) is None
    down(lab.state_dir, log=lambda _: None)
    assert status(lab.state_dir)[0] is False


def test_the_command_takes_its_options_after_the_subcommand_as_the_docs_write_it(tmp_path: Path) -> None:
    """`python -m lab upload --state-dir D FOLDER URL` (docs/rehearse.md): the state dir is read, not refused as
    unrecognized arguments."""
    done = subprocess.run([sys.executable, "-m", "lab", "upload", "--state-dir", str(tmp_path / "none"), "a",
                           "s3://b/c"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and f"no lab in {tmp_path / 'none'}" in done.stderr, done.stderr
