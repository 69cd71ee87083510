"""Is a model directory complete? The manifest a sync writes, its hash, and the check that reads both.

Standard library only (with `stacks.model.s3_source`'s path rule): it runs on a node's own `python3` or inside
any image (shipped as one heredoc by `checks.weights_node`), and `checks.weights` (the S3 sync, which needs boto3)
builds on it.

A directory passes when `config.json` parses, a tokenizer file is there, every shard that
`model.safetensors.index.json` names is present, no shard is shorter than its own safetensors header says
(8-byte length + JSON header + the largest `data_offsets` end: the format vLLM's loader reads, see
`vllm/model_executor/model_loader/weight_utils.py`), and, when the sync's manifest is there, every listed
file has the manifest's size. The hash printed in the verdict line is the same on every node that holds the
same weights: the manifest's `files_sha256` after a sync, or a hash of the (path, size) listing otherwise.

With `--content` every file is read and hashed (sha256, files in parallel: hashlib releases the GIL), each digest
is compared with the one the manifest records (a shard changed in place with its size kept fails, named), and the
verdict's hash is the `content-sha256`: sha256 of the sorted [path, size, sha256] list, computed the same way with
or without a manifest, so a synced node and a hand-copied one with the same bytes report the same value. A
manifest written before digests were recorded (version 1) still loads: `--content` then hashes every file and
has nothing to compare each digest with (the verdict says so); the next sync records them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.verdict import CheckParser, Verdict, check_name, emit, path, printable_line
from stacks.model.s3_source import unsafe_path_reason

VERIFY_DESCRIPTION = "Is a model directory complete (config, tokenizer, every indexed shard, manifest sizes)?"
MANIFEST_NAME = ".weights-manifest.json"
HASH_NAME = ".weights-manifest.sha256"
JOURNAL_NAME = ".weights-sync.journal"
LOCK_NAME = ".weights-sync.lock"
PARTIAL_SUFFIX = ".weights-partial"
SIDECAR_SUFFIX = ".weights-partial.json"
OWN_NAMES = frozenset({MANIFEST_NAME, HASH_NAME, JOURNAL_NAME, LOCK_NAME, MANIFEST_NAME + ".tmp",
                       HASH_NAME + ".tmp", JOURNAL_NAME + ".tmp"})
"""Files the sync keeps in the model directory; never part of the weights, never deleted by `--delete`."""
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
"""A tokenizer a transformers `AutoTokenizer` can build from (`tokenizer_config.json` alone is not one)."""
SAFETENSORS_MAX_HEADER = 100_000_000
"""The safetensors format refuses headers above 100 MB (safetensors `MAX_HEADER_SIZE`)."""
MANIFEST_VERSION = 2
"""Version 2 records each file's sha256; version 1 manifests (no digests) still load."""
READ_VERSIONS = (1, 2)
HASH_CHUNK = 8 * 1024 * 1024
SHOW = 5
"""How many names a verdict line lists before '… and N more'."""


class ManifestError(Exception):
    """The manifest or its hash file is there but cannot be trusted."""


@dataclass(frozen=True)
class Entry:
    """One object of the listing: its path relative to the model directory, size in bytes, ETag (no quotes), and
    the sha256 of its content (hex) once known. Equality is (key, size, ETag): the object's identity in the store;
    the digest is what the bytes on disk are checked against."""

    key: str
    size: int
    etag: str
    sha256: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Manifest:
    source: str
    endpoint_url: str | None
    files: tuple[Entry, ...]

    @property
    def sha256(self) -> str:
        return manifest_hash(self.files)

    @property
    def content_sha256(self) -> str | None:
        """content_hash of the recorded digests; None unless every file has one."""
        if any(e.sha256 is None for e in self.files):
            return None
        return content_hash((e.key, e.size, str(e.sha256)) for e in self.files)

    def to_json(self) -> str:
        files: list[dict[str, Any]] = []
        for e in self.files:
            files.append({"key": e.key, "size": e.size, "etag": e.etag, **({"sha256": e.sha256} if e.sha256 else {})})
        body = {"version": MANIFEST_VERSION, "source": self.source, "endpoint_url": self.endpoint_url,
                "files": files, "files_sha256": self.sha256, "content_sha256": self.content_sha256}
        return json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def manifest_hash(entries: Iterable[Entry]) -> str:
    """sha256 of the canonical (key, size, etag) list sorted by key: equal on every node with the same listing,
    whatever order the store listed it in and whatever else the manifest records."""
    rows = sorted([e.key, e.size, e.etag] for e in entries)
    return hashlib.sha256(json.dumps(rows, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def listing_hash(rows: Iterable[tuple[str, int]]) -> str:
    """sha256 of the sorted (path, size) list: what a directory without a manifest can offer for comparison."""
    canon = sorted([path, size] for path, size in rows)
    return hashlib.sha256(json.dumps(canon, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def content_hash(rows: Iterable[tuple[str, int, str]]) -> str:
    """sha256 of the sorted (path, size, sha256) list: equal wherever the same bytes sit under the same names."""
    canon = sorted([path, size, digest] for path, size, digest in rows)
    return hashlib.sha256(json.dumps(canon, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def file_sha256(path: Path | str) -> str:
    """sha256 (hex) of a file's content, read in 8 MiB chunks; OSError propagates."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(HASH_CHUNK)
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def hash_workers() -> int:
    """Files hashed at once: one per CPU (hashing is CPU-bound once the data is in memory), at most 64."""
    return max(1, min(64, os.cpu_count() or 1))


def hash_files(root: Path, rels: Sequence[str], workers: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """({path: sha256}, {path: why it could not be read}) for files under root, hashed in parallel threads."""

    def one(rel: str) -> tuple[str, str | None, str | None]:
        try:
            return rel, file_sha256(root / rel), None
        except OSError as exc:
            return rel, None, f"unreadable: {exc.strerror or exc}"

    digests: dict[str, str] = {}
    errors: dict[str, str] = {}
    if not rels:
        return digests, errors
    with ThreadPoolExecutor(min(workers or hash_workers(), len(rels)), thread_name_prefix="hash") as pool:
        for rel, digest, error in pool.map(one, rels):
            if digest is not None:
                digests[rel] = digest
            else:
                errors[rel] = str(error)
    return digests, errors


def unsafe_reason(key: str) -> str | None:
    """Why a relative path from a bucket listing or an index must not be written under the model directory, or
    None. Refuses anything that could leave the directory (`stacks.model.s3_source.unsafe_path_reason`, the rule a
    source's prefix obeys too) or collide with the sync's own files."""
    reason = unsafe_path_reason(key)
    if reason:
        return reason
    name = key.split("/")[-1]
    if is_own_file(name):
        return f"name collides with the sync's own files ({name})"
    return None


def is_own_file(name: str) -> bool:
    return name in OWN_NAMES or name.endswith((PARTIAL_SUFFIX, SIDECAR_SUFFIX))


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: not an object")
    key, size, etag, digest = raw.get("key"), raw.get("size"), raw.get("etag"), raw.get("sha256")
    if not isinstance(key, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0 \
            or not isinstance(etag, str):
        raise ManifestError(f"{where}: needs key (string), size (integer >= 0), etag (string)")
    if digest is not None and not (isinstance(digest, str) and _is_sha256(digest)):
        raise ManifestError(f"{where}: sha256 {digest!r} is not 64 lowercase hex digits")
    reason = unsafe_reason(key)
    if reason:
        raise ManifestError(f"{where}: key {key!r}: {reason}")
    return Entry(key, size, etag, digest)


def read_manifest(root: Path) -> Manifest | None:
    """The manifest of `root`, or None when there is none; ManifestError when it is unreadable or its hash (in
    the file and in the hash file beside it) does not match its content."""
    path = root / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable: {exc}") from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("version") not in READ_VERSIONS or not isinstance(raw.get("files"), list):
        raise ManifestError(f"{path}: not a version-{'/'.join(map(str, READ_VERSIONS))} manifest")
    files = tuple(_entry(item, f"{path} files[{i}]") for i, item in enumerate(raw["files"]))
    if len({e.key for e in files}) != len(files):
        raise ManifestError(f"{path}: a key is listed twice")
    endpoint = raw.get("endpoint_url")
    manifest = Manifest(str(raw.get("source", "")), endpoint if isinstance(endpoint, str) else None, files)
    if raw.get("files_sha256") != manifest.sha256:
        raise ManifestError(f"{path}: files_sha256 {raw.get('files_sha256')!r} does not match its files "
                            f"({manifest.sha256}): edited by hand or half written")
    if raw.get("version", 1) >= 2 and raw.get("content_sha256") != manifest.content_sha256:
        raise ManifestError(f"{path}: content_sha256 {raw.get('content_sha256')!r} does not match its files' digests "
                            f"({manifest.content_sha256}): edited by hand or half written")
    hash_path = root / HASH_NAME
    try:
        recorded = hash_path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        recorded = [manifest.sha256]
    except OSError as exc:
        raise ManifestError(f"{hash_path}: unreadable: {exc}") from exc
    if not recorded or recorded[0] != manifest.sha256:
        raise ManifestError(f"{hash_path} says {recorded[0] if recorded else '(empty)'}, the manifest hashes to "
                            f"{manifest.sha256}")
    return manifest


def safetensors_size(path: Path) -> tuple[int | None, str | None]:
    """(the size the file's own header implies, None) or (None, why the header is unusable)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return None, "shorter than the 8-byte safetensors header length"
            (length,) = struct.unpack("<Q", head)
            if length > SAFETENSORS_MAX_HEADER:
                return None, f"header length {length} is not a safetensors header"
            header = handle.read(length)
    except OSError as exc:
        return None, f"unreadable: {exc}"
    if len(header) < length:
        return None, f"truncated inside its {length}-byte header"
    try:
        table = json.loads(header)
    except ValueError:
        return None, "header is not JSON"
    if not isinstance(table, dict):
        return None, "header is not a JSON object"
    end = 0
    for name, info in table.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return None, f"tensor {name!r} has no data_offsets"
        end = max(end, offsets[1])
    return 8 + length + end, None


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:SHOW])
    return shown + (f" … and {len(items) - SHOW} more" if len(items) > SHOW else "")


def _walk(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(relative path, size) of every regular file under root except the sync's own files; and own partials."""
    files: list[tuple[str, int]] = []
    partials: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if name.endswith(PARTIAL_SUFFIX):
                partials.append(rel)
            if is_own_file(name) or full.is_symlink() or not full.is_file():
                continue
            files.append((rel, full.stat().st_size))
    return files, partials


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def verify_dir(dest: str, expect_hash: str | None = None, name: str = "weights", content: bool = False,
               known: Mapping[str, str] | None = None) -> Verdict:
    """The completeness check (see the module docstring); fail names every missing or wrong file. With `content`
    every file is hashed, except those in `known` ({path: sha256} a sync computed from the bytes it just wrote)."""
    if not dest.startswith("/"):
        return Verdict(name, "cannot-run", f"--dest {dest!r} is not an absolute path",
                       next_step="pass the model directory as an absolute path (model.host_dir/model.path)")
    if expect_hash is not None and not _is_sha256(expect_hash):
        return Verdict(name, "cannot-run", f"--expect-hash {expect_hash!r} is not 64 lowercase hex digits",
                       next_step="pass the manifest-sha256 / listing-sha256 a verdict line printed")
    root = Path(dest)
    if not root.is_dir():
        return Verdict(name, "fail", f"{dest} is not a directory", [f"{dest}: no such directory"],
                       "sync the weights (python -m checks.weights sync) or copy them to this path on every node")
    try:
        manifest = read_manifest(root)
    except ManifestError as exc:
        return Verdict(name, "fail", f"manifest cannot be trusted: {exc}", [str(exc)],
                       "re-run python -m checks.weights sync to rewrite it (only missing or wrong files are fetched)")
    files, partials = _walk(root)
    present = dict(files)
    problems: list[str] = []
    missing: list[str] = []
    wrong: list[str] = []
    listed = {e.key: e for e in manifest.files} if manifest else {}
    for entry in manifest.files if manifest else ():
        have = _size(root / entry.key)
        if have is None:
            missing.append(entry.key)
        elif have != entry.size:
            wrong.append(f"{entry.key} has {have} bytes, manifest says {entry.size}")

    def need(rel: str, what: str) -> int | None:
        """Size of a required file, or None after noting why it does not count."""
        have = present.get(rel)
        if manifest is not None and rel not in listed:
            problems.append(f"{what} {rel} is not in the manifest (the bucket prefix lacks it)")
        if have is None:
            if rel not in missing:
                missing.append(rel)
            return None
        return have

    config: Any = None
    if need(CONFIG_NAME, "config") is not None:
        try:
            config = json.loads((root / CONFIG_NAME).read_text(encoding="utf-8"))
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            problems.append(f"{CONFIG_NAME} is not JSON: {exc}")
        if config is not None and not isinstance(config, dict):
            problems.append(f"{CONFIG_NAME} is not a JSON object")
    tokenizers = [t for t in TOKENIZER_FILES if t in present]
    if not tokenizers:
        problems.append(f"no tokenizer: none of {', '.join(TOKENIZER_FILES)}")
    shards: list[str] = []
    if INDEX_NAME in present or (manifest is not None and INDEX_NAME in listed):
        if need(INDEX_NAME, "index") is not None:
            try:
                index = json.loads((root / INDEX_NAME).read_text(encoding="utf-8"))
                weight_map = index.get("weight_map") if isinstance(index, dict) else None
                if not isinstance(weight_map, dict) or not weight_map:
                    problems.append(f"{INDEX_NAME} has no weight_map")
                else:
                    shards = sorted({str(v) for v in weight_map.values()})
            except (ValueError, OSError, UnicodeDecodeError) as exc:
                problems.append(f"{INDEX_NAME} is not JSON: {exc}")
    elif SINGLE_NAME in present or SINGLE_NAME in listed:
        shards = [SINGLE_NAME]
    else:
        problems.append(f"no {INDEX_NAME} and no {SINGLE_NAME}")
    short: list[str] = []
    for shard in shards:
        reason = unsafe_reason(shard)
        if reason:
            problems.append(f"{INDEX_NAME} names {shard!r}: {reason}")
            continue
        have = need(shard, "shard")
        if have is None:
            continue
        implied, why = safetensors_size(root / shard)
        if why:
            short.append(f"{shard}: {why}")
        elif implied != have:
            short.append(f"{shard} has {have} bytes, its header says {implied}"
                         + (" (truncated)" if implied is not None and have < implied else ""))
    if manifest is None:
        empty = [rel for rel, size in files if size == 0]
        if empty:
            problems.append(f"{len(empty)} empty file(s): {_names(empty)} (interrupted copy?)")
    if missing:
        problems.insert(0, f"{len(missing)} missing: {_names(sorted(missing))}")
    if wrong:
        problems.insert(1 if missing else 0, f"{len(wrong)} with the wrong size: {_names(sorted(wrong))}")
    if short:
        problems.append(f"{len(short)} shard(s) disagree with their header: {_names(short)}")
    total = sum(size for _, size in files)
    if manifest is not None:
        digest_kind, digest = "manifest-sha256", manifest.sha256
    else:
        digest_kind, digest = "listing-sha256", listing_hash(files)
    content_notes: list[str] = []
    content_details: dict[str, Any] = {}
    if content:
        rows = [(e.key, e.size) for e in manifest.files] if manifest else files
        on_disk = [(rel, size) for rel, size in rows if present.get(rel) == size]
        todo = [rel for rel, _ in on_disk if not (known and rel in known)]
        started = time.monotonic()
        digests, unreadable = hash_files(root, todo)
        seconds = time.monotonic() - started
        digests.update({rel: known[rel] for rel, _ in on_disk if known and rel in known})
        corrupted = []
        for entry in manifest.files if manifest else ():
            got = digests.get(entry.key)
            if got is not None and entry.sha256 is not None and got != entry.sha256:
                corrupted.append(f"{entry.key} (sha256 on disk {got[:12]}…, manifest {entry.sha256[:12]}…)")
        if corrupted:
            problems.insert(0, f"{len(corrupted)} file(s) whose content differs from the manifest (changed in place, "
                               f"same size): {_names(sorted(corrupted))}")
        if unreadable:
            problems.append(f"{len(unreadable)} unreadable: {_names([f'{k}: {v}' for k, v in unreadable.items()])}")
        unrecorded = [e.key for e in manifest.files if e.sha256 is None] if manifest else []
        digest_kind = "content-sha256"
        digest = content_hash((rel, size, digests.get(rel, "")) for rel, size in rows)
        hashed = sum(size for rel, size in on_disk if rel in todo)
        content_notes.append(f"hashed {len(todo)} file(s), {hashed / 1e9:.2f} GB in {seconds:.1f} s"
                             + (f" ({hashed / seconds / 1e6:.0f} MB/s)" if seconds > 0 and hashed else "")
                             + (f"; {len(digests) - len(todo)} hashed by this sync as written" if known else ""))
        if manifest is not None and unrecorded:
            content_notes.append(f"the manifest records no digest for {len(unrecorded)} file(s) (written by an "
                                 "older version): their content was hashed but could not be compared; a sync "
                                 "records the digests")
        elif manifest is None:
            content_notes.append("no manifest: nothing to compare each digest with; compare content-sha256 across "
                                 "nodes")
        content_details = {"corrupted": sorted(corrupted), "unreadable": unreadable, "unrecorded": unrecorded,
                           "digests": digests, "hashed_bytes": hashed, "hash_seconds": round(seconds, 3),
                           "manifest_sha256": manifest.sha256 if manifest else None}
    accepted = {digest, manifest.sha256 if manifest else listing_hash(files)}
    if expect_hash and expect_hash not in accepted:
        problems.append(f"{digest_kind} is {digest}, expected {expect_hash}: this node holds other weights")
    evidence = [f"{len(files)} file(s), {total / 1e9:.2f} GB in {dest}",
                f"{len(shards)} shard(s) indexed, tokenizer: {', '.join(tokenizers) or 'none'}",
                f"{digest_kind}={digest}"]
    if manifest is not None:
        evidence.insert(1, f"manifest of {manifest.source}: {len(manifest.files)} file(s)")
    if partials:
        evidence.append(f"{len(partials)} interrupted download(s) left: {_names(partials)}")
    evidence += content_notes
    details: dict[str, Any] = {"dest": dest, "hash_kind": digest_kind, "hash": digest, "files": len(files),
                               "bytes": total, "shards": len(shards), "tokenizer": tokenizers,
                               "manifest": manifest is not None, "missing": sorted(missing),
                               "wrong_size": sorted(wrong), "short": short, "problems": problems,
                               **({"content": content_details} if content else {})}
    if problems:
        return Verdict(name, "fail", "; ".join(problems), evidence,
                       "re-run python -m checks.weights sync" + (" --content" if content else "")
                       + " (it fetches only missing or wrong files), or re-copy the named files", details)
    return Verdict(name, "pass", f"{len(shards)} shard(s), config, tokenizer complete; {digest_kind}={digest}",
                   evidence, None, details)


_Parser = CheckParser
"""Bad arguments are one line and exit 2, like every other refusal (checks.verdict)."""


def add_verify_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", required=True, type=path, help="the model directory (absolute)")
    parser.add_argument("--expect-hash", type=printable_line, help="fail unless the directory's hash is this (64 hex)")
    parser.add_argument("--content", action="store_true",
                        help="read and hash every file (sha256, in parallel); compare with the manifest's digests")
    parser.add_argument("--name", default="weights", type=check_name, help="check name in the verdict")
    parser.add_argument("--json", action="store_true", help="print one JSON verdict")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m checks.weights_verify", description=VERIFY_DESCRIPTION)
    add_verify_args(parser)
    args = parser.parse_args(argv)
    return emit(verify_dir(args.dest, args.expect_hash, args.name, args.content), args.json)


if __name__ == "__main__":
    sys.exit(main())
