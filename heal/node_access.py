"""How the group supervisor and `drift` reach each node's Docker engine and shell.

In production: OpenSSH with the stack's pinned host keys, the same options the Docker provider uses
(components/ssh_trust.py `docker_ssh_opts`: `StrictHostKeyChecking=yes`, the stack's own known_hosts,
`HostKeyAlias`), `ssh … -- docker …` for Docker and `ssh … -- bash -s` for the clean script.

For tests only: `VLLM_CLUSTER_NODE_MAP` (JSON) maps node names to a local Docker engine and a local container
name, `{"node1": {"docker_host": "unix:///var/run/docker.sock", "container": "rank-node1"}}`, so a 2- or 3-node
group runs as containers of local engines; shell steps then run with local bash, and an optional `shm_dir` is
the directory the clean step looks at instead of /dev/shm. It is a test seam, not a deployment mode: a node that
is not in the map is refused.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

from components.ssh_trust import docker_ssh_opts
from stacks.model.config import StackConfig

NODE_MAP_ENV = "VLLM_CLUSTER_NODE_MAP"


class AccessError(Exception):
    """A node cannot be reached or the map is malformed (exit 2 in the CLIs)."""


class NodeAccess(Protocol):
    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]: ...

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]: ...

    def container(self, node: str, planned: str) -> str:
        """The container's name on that node (the planned one, except under the test map)."""
        ...


def _run(argv: list[str], timeout_s: float, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout_s:g}s: {shlex.join(argv[:6])}…")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"cannot run {argv[0]}: {exc}")


RUNTIME_DIR_ENV = "RUNTIME_DIRECTORY"
"""Set by systemd to the unit's `RuntimeDirectory=` (systemd.exec(5)): the supervisor unit's own writable folder."""


def control_path(opts: list[str]) -> list[str]:
    """The ssh options with OpenSSH's shared-connection socket in the unit's runtime folder when systemd gives one.
    Under the unit's `ProtectSystem=strict` the user's ~/.ssh is read-only (and `%h` in a system unit is root's
    home whatever `User=` says), so the socket of `ControlPath=~/.ssh/…` could not be created there. `%C` (a hash of
    the connection) keeps the path short of the 108-byte socket limit. Outside a unit: unchanged."""
    folder = os.environ.get(RUNTIME_DIR_ENV, "").split(":")[0]
    if not folder:
        return opts
    return [f"ControlPath={folder}/%C" if o.startswith("ControlPath=") else o for o in opts]


@dataclass(frozen=True)
class SshAccess:
    """Each node over SSH, host key pinned when the stack has one."""

    stack: str
    config: StackConfig

    def _ssh(self, node: str) -> list[str]:
        for n in self.config.nodes:
            if n.name == node:
                return ["ssh", *control_path(docker_ssh_opts(self.stack, n)), "-o", "BatchMode=yes", "-p",
                        str(n.ssh.port),
                        "-l", n.ssh.user, "-T", n.ssh.host, "--"]
        raise AccessError(f"node {node!r} is not in stack {self.stack!r}")

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([*self._ssh(node), shlex.join(["docker", *args])], timeout_s)

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([*self._ssh(node), shlex.join(["bash", "-s", "--", *args])], timeout_s, stdin=script)

    def container(self, node: str, planned: str) -> str:
        return planned


@dataclass(frozen=True)
class MappedAccess:
    """Tests only: nodes are containers of local Docker engines (VLLM_CLUSTER_NODE_MAP)."""

    nodes: dict[str, dict[str, str]]

    def _node(self, node: str) -> dict[str, str]:
        if node not in self.nodes:
            raise AccessError(f"node {node!r} is not in {NODE_MAP_ENV}")
        return self.nodes[node]

    def docker(self, node: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return _run(["docker", "-H", self._node(node)["docker_host"], *args], timeout_s)

    def shell(self, node: str, script: str, args: list[str],
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        host = self._node(node)["docker_host"]
        env = {**os.environ, "DOCKER_HOST": host}
        try:
            return subprocess.run(["bash", "-s", "--", *args], input=script, capture_output=True, text=True,
                                  timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(["bash"], 124, "", f"timed out after {timeout_s:g}s")

    def container(self, node: str, planned: str) -> str:
        return self._node(node).get("container", planned)


def access_for(stack: str, config: StackConfig) -> NodeAccess:
    """SSH, unless the test map is set."""
    raw = os.environ.get(NODE_MAP_ENV)
    if not raw:
        return SshAccess(stack, config)
    try:
        nodes = json.loads(raw)
        if not isinstance(nodes, dict) or not all(isinstance(v, dict) and "docker_host" in v for v in nodes.values()):
            raise ValueError("want {node: {docker_host: …, container: …}}")
    except ValueError as exc:
        raise AccessError(f"{NODE_MAP_ENV}: {exc}") from None
    return MappedAccess(nodes)


def inspect(access: NodeAccess, node: str, *refs: str, kind: str = "container") -> list[dict[str, Any]] | None:
    """`docker inspect` as JSON: the `refs` that exist; None when none does. AccessError when the node does not
    answer."""
    done = access.docker(node, [kind, "inspect", *refs])
    if done.returncode == 0:
        return list(json.loads(done.stdout))
    if "No such" in done.stderr or "no such" in done.stderr:
        # exit 1 for a ref that is gone (a container removed since `docker ps` listed it), after printing the rest
        try:
            found = list(json.loads(done.stdout or "[]"))
        except ValueError:
            found = []
        return found or None
    raise AccessError(f"node {node}: docker {kind} inspect failed (exit {done.returncode}): "
                      f"{done.stderr.strip()[:300]}")
