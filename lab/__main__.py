"""`python -m lab up|down|status`: the lab cluster on this machine (lab/hosts.py says what it is made of).

`python -m lab push IMAGE NAME` pushes an image of this machine's Docker engine into the lab registry (nodes pull
REGISTRY/NAME); `python -m lab upload DIR s3://BUCKET/PREFIX` puts a model folder into the lab's S3."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from lab import hosts
from stacks.model.masking import mask_secrets


def summary(lab: hosts.Lab) -> list[str]:
    """What a stack file and a shell need: each node's address and pinned host key, and how to reach it all."""
    bin_dir = Path(lab.state_dir) / "bin"
    first = lab.nodes[0]
    return [
        "nodes (name, address, nodes[].ssh.host_key):",
        *(f"  {n.name} {n.address} {n.host_key}" for n in lab.nodes),
        f"ssh key {lab.key_path} (user {lab.ssh_user}), known_hosts {lab.known_hosts}",
        f"  ssh -F {lab.ssh_config} {first.name} docker info",
        f"  PATH={bin_dir}:$PATH DOCKER_HOST=ssh://{lab.ssh_user}@{first.address} docker ps",
        f"pulumi: PATH={bin_dir}:$PATH pulumi up (its docker provider's ssh), and "
        f"pulumi config set --secret vllm-cluster:ssh_private_key < {lab.key_path}",
        f"model dir on every node: {hosts.MODELS_DIR} ({first.name}'s: {Path(lab.state_dir) / 'nodes' / first.name}"
        "/models)",
        f"registry {lab.registry} (plain HTTP; nodes pull {lab.registry}/<name>:<tag>)",
        f"S3 {lab.s3_endpoint} (any key, e.g. {hosts.S3_KEY_ID} / {hosts.S3_SECRET})",
        f"deployer address {lab.deployer_address}, node interface {hosts.IFNAME}",
    ]


class _Parser(argparse.ArgumentParser):
    """argparse whose refusal masks a credential it repeats (`--api-key=…` among unrecognized arguments)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, mask_secrets(f"{self.prog}: error: {message}\n"))


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "push", "upload"])
    parser.add_argument("operands", nargs="*", help="push: IMAGE NAME; upload: DIR s3://BUCKET/PREFIX")
    parser.add_argument("--nodes", type=int, default=2, help="how many nodes `up` makes [2]")
    parser.add_argument("--state-dir", type=Path, default=hosts.DEFAULT_STATE, help=f"[{hosts.DEFAULT_STATE}]")
    parser.add_argument("--prefix", default=None,
                        help="`up`: namespace and link names begin with it [vlab]; `down`: remove that lab's even "
                             "when --state-dir holds none (a lost state dir)")
    parser.add_argument("--subnet", default="10.231.0", help="`up`: the lab's /24, three octets [10.231.0]")
    args = parser.parse_intermixed_args(argv)  # `lab push --state-dir D IMAGE NAME` as the docs write it
    transfer = args.command in ("push", "upload")
    if len(args.operands) != 2 * transfer or (args.command == "upload" and not args.operands[1].startswith("s3://")):
        parser.error(f"{args.command}: wrong operands (push IMAGE NAME; upload DIR s3://BUCKET/PREFIX)")
    say = lambda line: print(line, flush=True)  # noqa: E731 (progress lines appear as they happen)
    try:
        if args.command == "up":
            print("\n".join(summary(hosts.up(args.nodes, args.state_dir, args.prefix or "vlab", args.subnet, log=say))))
        elif args.command == "down":
            hosts.down(args.state_dir, args.prefix, log=say)
        elif transfer:
            lab = hosts.load(args.state_dir)
            if lab is None:
                raise hosts.LabError(f"no lab in {args.state_dir}: python -m lab up")
            if args.command == "push":
                print(hosts.push_image(lab, *args.operands))
            else:
                bucket, _, prefix = args.operands[1].removeprefix("s3://").partition("/")
                print(hosts.s3_upload(lab, args.operands[0], bucket, prefix))
        else:
            healthy, lines = hosts.status(args.state_dir)
            print("\n".join(lines))
            return 0 if healthy else 1
    except hosts.LabError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
