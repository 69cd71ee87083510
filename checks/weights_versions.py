"""Version directories of a synced model: each revision of the source lands in a directory of its own beside the
old one, so the group that is still serving keeps its files until the new group has passed its checks.

    <model.host_dir>/<model.path>@<first 16 hex of the listing's manifest-sha256>

The name comes from the listing ([key, size, ETag] of every object), known right after the sync lists the prefix and
equal on every node synced from one store, so every node picks the same name before fetching a byte. Files that an
earlier version (or the directory `<model.path>` itself, as a sync before versions left it) recorded with the same
(key, size, ETag) are hard-linked into the new directory instead of fetched: no copy, no extra space, and the sync
never writes into an existing file (it writes `<name>.weights-partial` and renames), so the old directory's files stay
what they were. Where a link cannot be made (another file system, `fs.protected_hardlinks` for a file this user does
not own, a file system without hard links) the file is fetched from the store like any missing one.

Cleanup (`python -m checks.weights prune`): runs on the node after the new group passed its checks. It removes
version directories beyond the newest `--keep-last` (the one in use counts), never the one named by `--keep`, never
one that any container on the node mounts (running or stopped: a stopped container with a restart policy comes back
with its mounts), never one a sync is writing (its lock is held), and never `<model.path>` itself. When Docker cannot
be asked which directories are mounted, nothing is removed (exit 2).

Standard library only: pasted into the script `checks.weights_node` sends to a node (after `checks.weights_verify`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from checks.verdict import Verdict
from checks.weights_verify import JOURNAL_NAME, LOCK_NAME, MANIFEST_NAME, Entry, ManifestError, read_manifest
from stacks.model.s3_source import CannotRun

VERSION_SEP = "@"
VERSION_CHARS = 16
"""Hex digits of the manifest hash in a version directory's name: 64 bits, no collision among a model's revisions."""
DEFAULT_KEEP_LAST = 2
"""The version in use and the one before it: a rollback to the previous revision needs no fetch."""
DOCKER_TIMEOUT_S = 60


def version_dir(base: str, manifest_sha256: str) -> str:
    """`<base>@<16 hex>`: where the revision with this listing hash lives, beside `base` (the model directory)."""
    if not re.fullmatch(r"[0-9a-f]{64}", manifest_sha256):
        raise ValueError(f"not a sha256: {manifest_sha256!r}")
    return f"{base.rstrip('/')}{VERSION_SEP}{manifest_sha256[:VERSION_CHARS]}"


def version_pattern(base: str) -> re.Pattern[str]:
    """The names of `base`'s version directories (in its parent directory)."""
    name = os.path.basename(base.rstrip("/"))
    return re.compile(re.escape(name) + re.escape(VERSION_SEP) + f"[0-9a-f]{{{VERSION_CHARS}}}")


def versions_beside(base: str) -> list[Path]:
    """`base`'s version directories (real directories, not symlinks), by name."""
    parent = Path(base.rstrip("/")).parent
    pattern = version_pattern(base)
    try:
        names = sorted(e.name for e in os.scandir(parent)
                       if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
    return [parent / n for n in names]


def _version_time(path: Path) -> float:
    """When a version was completed (its manifest), else when it was last written (an incomplete one)."""
    for probe in (path / MANIFEST_NAME, path):
        with contextlib.suppress(OSError):
            return probe.stat().st_mtime
    return 0.0


# ---------------------------------------------------------------------------------------------- reuse by hard links


@dataclass
class Reuse:
    linked: list[Entry] = field(default_factory=list)
    """Listed objects now present in the new directory as hard links, with the digest their old manifest recorded."""
    failed: dict[str, str] = field(default_factory=dict)
    """Key -> why it could not be linked (it is fetched instead)."""
    sources: list[str] = field(default_factory=list)
    """The directories files were linked from."""


def link_candidates(base: str, target: Path) -> list[tuple[Path, dict[str, Entry]]]:
    """Directories a sync completed for this model, newest first, each with its manifest's entries: the other
    versions, then `base` itself (where a sync before versions wrote). A manifest that cannot be trusted is skipped."""
    dirs = sorted((p for p in versions_beside(base) if p != target), key=_version_time, reverse=True)
    dirs.append(Path(base.rstrip("/")))
    found = []
    for path in dirs:
        try:
            manifest = read_manifest(path)
        except ManifestError:
            continue
        if manifest is not None:
            found.append((path, {e.key: e for e in manifest.files if e.sha256}))
    return found


def _regular_file_inside(root: Path, rel: str) -> Path | None:
    """root/rel when it is a regular file reached without leaving root through a symlink, else None."""
    path = root / rel
    try:
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        real_root = os.path.realpath(root)
        if not os.path.realpath(path).startswith(real_root + os.sep):
            return None
    except OSError:
        return None
    return path


def reuse_unchanged(base: str, target: Path, entries: Iterable[Entry]) -> Reuse:
    """Hard-link into `target` every listed object an earlier version holds with the same (key, size, ETag) and a
    recorded digest; files already in `target` are left to the sync. Never writes into the old directories."""
    result = Reuse()
    candidates = link_candidates(base, target)
    if not candidates:
        return result
    real_target = os.path.realpath(target)
    for entry in entries:
        dst = target / entry.key
        if os.path.lexists(dst):
            continue
        for root, recorded in candidates:
            old = recorded.get(entry.key)
            src = _regular_file_inside(root, entry.key) if old == entry else None
            if old is None or src is None or src.stat().st_size != entry.size:
                continue
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                if not os.path.realpath(dst.parent).startswith(real_target):
                    raise OSError(f"{dst.parent} leads out of {target}")
                os.link(src, dst, follow_symlinks=False)
            except OSError as exc:
                result.failed[entry.key] = exc.strerror or str(exc)
                break
            result.linked.append(Entry(entry.key, entry.size, entry.etag, old.sha256))
            if str(root) not in result.sources:
                result.sources.append(str(root))
            break
    return result


def record_links(target: Path, source: str, endpoint_url: str | None, linked: Sequence[Entry]) -> None:
    """Append the linked files to `target`'s journal (created with the source header when missing), so the sync
    counts them present by the same rule as files it fetched itself; flushed to disk before it goes on."""
    if not linked:
        return
    path = target / JOURNAL_NAME
    header = "" if path.exists() else json.dumps({"source": source, "endpoint_url": endpoint_url}) + "\n"
    lines = "".join(json.dumps({"key": e.key, "size": e.size, "etag": e.etag, "sha256": e.sha256}) + "\n"
                    for e in linked)
    with open(path, "a", encoding="utf-8") as journal:
        journal.write(header + lines)
        journal.flush()
        os.fsync(journal.fileno())


# ---------------------------------------------------------------------------------------------- cleanup


def overlaps(a: str, b: str) -> bool:
    """Is one of the two paths the other or inside it? (A mount of host_dir holds every version below it.)"""
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def prune_plan(versions: Sequence[tuple[str, float]], keep: str | None, mounted: Sequence[str],
               keep_last: int) -> dict[str, str]:
    """Path -> "remove" or why it stays, for each version (path, completion time). The newest `keep_last` stay
    (counting `keep`, the one the group now mounts); `keep` and any directory a container mounts always stay."""
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last}: at least 1 (the version in use)")
    verdicts: dict[str, str] = {}
    kept = 0
    for path, _ in sorted(versions, key=lambda v: (v[0] != keep, -v[1], v[0])):
        mounts = [m for m in mounted if overlaps(path, m)]
        if path == keep:
            verdicts[path] = "kept: the version the engines mount now"
            kept += 1
        elif mounts:
            verdicts[path] = f"kept: mounted by a container ({mounts[0]})"
        elif kept < keep_last:
            verdicts[path] = f"kept: one of the newest {keep_last}"
            kept += 1
        else:
            verdicts[path] = "remove"
    return verdicts


def docker_mount_sources() -> list[str]:
    """The host paths every container on this node mounts (running or not); CannotRun when Docker does not answer,
    so nothing is removed blind."""
    def run(args: list[str]) -> str:
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CannotRun(f"cannot ask Docker which directories containers mount ({exc}): nothing removed") from None
        if done.returncode != 0:
            raise CannotRun(f"`{' '.join(args[:3])}` failed ({done.stderr.strip()[:200]}): nothing removed")
        return done.stdout

    ids = run(["docker", "ps", "-aq", "--no-trunc"]).split()
    if not ids:
        return []
    sources = []
    for line in run(["docker", "inspect", "--format", "{{json .Mounts}}", *ids]).splitlines():
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            sources += [str(m["Source"]) for m in json.loads(line) or [] if m.get("Source")]
    return sources


def prune(base: str, keep: str | None, keep_last: int, mounted: Sequence[str], name: str = "weights-prune"
          ) -> Verdict:
    """Remove the version directories prune_plan marks, each under its sync lock (one being written stays)."""
    if keep is not None and keep != base.rstrip("/") and not version_pattern(base).fullmatch(os.path.basename(keep)):
        raise CannotRun(f"--keep {keep!r} is not a version directory of {base} ({base}@<16 hex>)")
    real_mounts = [os.path.realpath(m) for m in mounted]
    versions = versions_beside(base)
    plan = prune_plan([(str(p), _version_time(p)) for p in versions], keep, real_mounts + list(mounted), keep_last)
    removed, kept = [], []
    for path_text, verdict in sorted(plan.items()):
        path = Path(path_text)
        if verdict != "remove" or any(overlaps(os.path.realpath(path), m) for m in real_mounts):
            kept.append(f"{path.name}: {verdict}")
            continue
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            kept.append(f"{path.name}: kept: cannot open its lock ({exc.strerror or exc})")
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                kept.append(f"{path.name}: kept: a sync is writing it")
                continue
            shutil.rmtree(path)
            removed.append(path.name)
        finally:
            os.close(fd)
    details = {"base": base, "keep": keep, "keep_last": keep_last, "removed": removed, "kept": kept,
               "mounted": sorted(set(mounted))}
    summary = (f"removed {len(removed)} old version(s) of {base}: {', '.join(removed)}" if removed
               else f"nothing to remove beside {base}")
    return Verdict(name, "pass", f"{summary}; {len(kept)} kept", kept, None, details)
