"""SSH that only talks to the node it means: pinned host keys for the check commands and the Docker provider.

Two SSH clients reach the nodes, and neither checked host keys before:
- pulumi-command (every check and the firewall): `ConnectionArgs(host_key=…)` makes its Go client use
  `ssh.FixedHostKey` with the key's own type as the only host key algorithm (pulumi/pulumi-command
  provider/pkg/provider/remote/connection.go `SSHConfig`); without it, `InsecureIgnoreHostKey`.
- pulumi-docker runs the OpenSSH client: `ssh -l USER -p PORT <ssh_opts> -T -- HOST docker system dial-stdio`
  (docker/cli cli/connhelper `GetConnectionHelperWithSSHOpts`, connhelper/ssh `Spec.Command`). Its options here
  pin the key: `StrictHostKeyChecking=yes` (never add, never accept a changed key), `UserKnownHostsFile=` a file
  that holds only this stack's keys, `GlobalKnownHostsFile=/dev/null` (no other file can vouch for a host) and
  `HostKeyAlias=<node>.<stack>.vllm-cluster` (the entry is looked up by that name, so host, port and IPv6
  spelling do not matter).

The known_hosts file is written by the program on the deployer before any provider connects
(`write_known_hosts`), at `~/.ssh/vllm-cluster/known_hosts.<stack>`; the options name it with `~`, which OpenSSH
expands to the user's home from the password database (`ssh.c`: `tilde_expand_filename` on
UserKnownHostsFile), so the provider's inputs are the same on every deployer. Tested with a real sshd and the
exact argv in tests/test_ssh_host_keys.py.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from stacks.model.config import NodeConfig, StackConfig

KNOWN_HOSTS_DIR = ".ssh/vllm-cluster"
"""Below the deployer's home."""

BASE_SSH_OPTS = [
    "-o", "ControlMaster=auto", "-o", "ControlPath=~/.ssh/vllm-cluster-%r@%h:%p", "-o", "ControlPersist=10m",
    "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=30",
]
"""One multiplexed SSH connection per host: pulumi-docker opens many, and sshd's MaxStartups throttles them."""


def known_hosts_name(stack: str) -> str:
    return f"known_hosts.{stack}"


def known_hosts_option(stack: str) -> str:
    """The path as ssh reads it (`~` expanded by ssh itself)."""
    return f"~/{KNOWN_HOSTS_DIR}/{known_hosts_name(stack)}"


def host_alias(stack: str, node: NodeConfig) -> str:
    return f"{node.name}.{stack}.vllm-cluster"


def docker_ssh_opts(stack: str, node: NodeConfig) -> list[str]:
    """The Docker provider's ssh options for one node: pinned when its host key is known."""
    if node.ssh.host_key is None:
        return list(BASE_SSH_OPTS)
    return [*BASE_SSH_OPTS, "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts_option(stack)}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={host_alias(stack, node)}"]


def known_hosts_text(stack: str, config: StackConfig) -> str:
    """One `<alias> <type> <base64>` line per node with a key (the key type validated: no options, no comment)."""
    return "".join(f"{host_alias(stack, n)} {n.ssh.host_key}\n" for n in config.nodes if n.ssh.host_key)


def deployer_home() -> Path:
    """The home OpenSSH expands `~` to: the password database's, not $HOME."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def write_known_hosts(stack: str, config: StackConfig, home: Path | None = None) -> Path | None:
    """Write (atomically, mode 0600 in a 0700 directory) the stack's known_hosts; None when no node has a key."""
    text = known_hosts_text(stack, config)
    if not text:
        return None
    directory = (home or deployer_home()) / KNOWN_HOSTS_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = directory / known_hosts_name(stack)
    if target.is_file() and target.read_text() == text:
        return target
    tmp = directory / f".{known_hosts_name(stack)}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, target)
    return target
