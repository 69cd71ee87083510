"""Every node holds the same weights: compare the hashes the nodes' `weights-<node>` commands reported.

    python -m checks.weights_match [--name weights-match] [--json] NODE=HASH [NODE=HASH ...]

Runs on the deploying machine (a `command.local.Command` every engine depends on), with the hashes that
`checks.weights_node.weights_hash` read from each node's verdict. The node commands run with `--content`, so each
hash is the node's `content-sha256`: sha256 of the sorted [path, size, sha256-of-the-bytes] list, read from its
disk, equal on every node holding the same bytes whether synced or copied by hand, different when one shard was
changed in place with its size kept. (Without `--content` a node reports the manifest hash, sorted [key, size,
ETag], or the listing hash, sorted [path, size], which such a change leaves equal.) A node whose run printed no
hash counts as differing.

Pass when all are equal. Otherwise fail naming the nodes that differ from the hash most nodes hold (with two
nodes and two hashes: both), with every node's hash as evidence. Exit 0 pass, 1 fail, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence

from checks.verdict import CheckParser, Verdict, check_name, emit

_HEX = re.compile(r"^[0-9a-f]{64}$")
_NODE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


def parse_pairs(pairs: Sequence[str]) -> dict[str, str | None]:
    """NODE=HASH words -> {node: hash or None (empty)}; ValueError naming the word otherwise."""
    out: dict[str, str | None] = {}
    for word in pairs:
        node, sep, value = word.partition("=")
        if not sep or not _NODE.match(node):
            raise ValueError(f"{word!r} is not NODE=HASH (a node name, '=', 64 hex digits or nothing)")
        if value and not _HEX.match(value):
            raise ValueError(f"{word!r}: the hash is not 64 lower-case hex digits")
        if node in out:
            raise ValueError(f"node {node!r} is given twice")
        out[node] = value or None
    if not out:
        raise ValueError("no NODE=HASH given")
    return out


def compare(name: str, hashes: dict[str, str | None]) -> Verdict:
    evidence = [f"{node}: {value or 'no hash (its weights run did not pass)'}" for node, value in hashes.items()]
    counts = Counter(v for v in hashes.values() if v)
    if len(counts) == 1 and all(hashes.values()):
        value = next(iter(counts))
        return Verdict(name, "pass", f"all {len(hashes)} node(s) hold the same weights: {value[:16]}…", evidence,
                       details={"hashes": hashes, "hash": value})
    top = counts.most_common(2)
    majority = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
    odd = [node for node, value in hashes.items() if value is None or value != majority]
    if majority is None:
        summary = f"the nodes hold {len(counts)} different sets of weights and none is held by most: " + ", ".join(
            f"{node} {(value or 'none')[:16]}" for node, value in hashes.items())
    else:
        summary = (f"{', '.join(odd)} hold{'s' if len(odd) == 1 else ''} other weights than the "
                   f"{top[0][1]} other node(s) ({majority[:16]}…): " + ", ".join(
                       f"{node} {(hashes[node] or 'none')[:16]}" for node in odd))
    return Verdict(name, "fail", summary, evidence,
                   "no engine was touched; look at the named nodes' weights-<node> output: re-run the sync there "
                   "(pulumi up runs it again when model.source or the image changes; by hand: python -m "
                   "checks.weights sync …), or re-copy the directory so every node holds the same files",
                   {"hashes": hashes, "differing": odd, "majority": majority})


def main(argv: Sequence[str] | None = None) -> int:
    parser = CheckParser(prog="python -m checks.weights_match", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="weights-match", type=check_name)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("pairs", nargs="*", metavar="NODE=HASH")
    args = parser.parse_args(argv)
    try:
        hashes = parse_pairs(args.pairs)
    except ValueError as exc:
        return emit(Verdict(args.name, "cannot-run", f"bad argument: {exc}",
                            next_step="pass one NODE=HASH per node"), args.json)
    return emit(compare(args.name, hashes), args.json)


if __name__ == "__main__":
    sys.exit(main())
