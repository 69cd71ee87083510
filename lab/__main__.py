"""`python -m lab up|down|status`: the lab cluster on this machine (lab/hosts.py says what it is made of)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.hosts import DEFAULT_STATE, MODELS_DIR, S3_KEY_ID, S3_SECRET, Lab, LabError, down, status, up


def summary(lab: Lab) -> list[str]:
    """What a stack file and a shell need: each node's address and pinned host key, and how to reach it all."""
    state = Path(lab.state_dir)
    lines = ["nodes (name, address, nodes[].ssh.host_key):"]
    lines += [f"  {n.name} {n.address} {n.host_key}" for n in lab.nodes]
    first = lab.nodes[0]
    lines += [
        f"ssh key {lab.key_path} (user {lab.ssh_user}), known_hosts {lab.known_hosts}",
        f"  ssh -F {lab.ssh_config} {first.name} docker info",
        f"  PATH={state / 'bin'}:$PATH DOCKER_HOST=ssh://{lab.ssh_user}@{first.address} docker ps",
        f"pulumi: PATH={state / 'bin'}:$PATH pulumi up (its docker provider's ssh), and "
        f"pulumi config set --secret vllm-cluster:ssh_private_key < {lab.key_path}",
        f"model dir on every node: {MODELS_DIR} ({first.name}'s: {state / 'nodes' / first.name / 'models'})",
        f"registry {lab.registry} (plain HTTP; nodes pull {lab.registry}/<name>:<tag>)",
        f"S3 {lab.s3_endpoint} (any key, e.g. {S3_KEY_ID} / {S3_SECRET})",
        f"deployer address {lab.deployer_address}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--nodes", type=int, default=2, help="how many nodes `up` makes [2]")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help=f"[{DEFAULT_STATE}]")
    parser.add_argument("--prefix", default="vlab", help="namespace and link names begin with it [vlab]")
    parser.add_argument("--subnet", default="10.231.0", help="the lab's /24, three octets [10.231.0]")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            lab = up(args.nodes, args.state_dir, args.prefix, args.subnet, log=lambda m: print(m, flush=True))
            print("\n".join(summary(lab)))
            return 0
        if args.command == "down":
            down(args.state_dir, log=lambda m: print(m, flush=True))
            return 0
        healthy, lines = status(args.state_dir)
        print("\n".join(lines))
        return 0 if healthy else 1
    except LabError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
