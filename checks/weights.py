"""Stage a checkpoint from S3 (or MinIO / Ceph RGW) into a node's model directory, then prove it complete.

    python -m checks.weights sync --source s3://BUCKET/PREFIX --dest DIR [--endpoint-url URL] [--region R]
                                  [--workers N] [--part-size-mb N] [--delete] [--adopt-existing] [--dry-run]
                                  [--limit-mb-s N] [--progress-s N] [--content] [--json]
    python -m checks.weights verify --dest DIR [--content] [--expect-hash HEX] [--json]

Credentials come from the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
AWS_CA_BUNDLE for a private CA), never from argv. The S3 client is boto3 (botocore signs, retries and
validates; nothing here speaks the protocol by hand). `bench/sync_throughput.py` measured it against
`aws s3 sync` and s5cmd on the same moto bucket (docs/weights.md). What `--source`, `--endpoint-url`, `--region`,
`--workers` and `--part-size-mb` accept is `stacks/model/s3_source.py`, the rule the stack file's `model.source` is
validated by too (`checks.weights_node` pastes that module into the script it sends to a node).

How a sync stays correct when interrupted: each object is written to `<name>.weights-partial` in parts
(`--part-size-mb`, a ranged GET with `If-Match: <ETag>` each, so a part never mixes two versions of an object);
a part counts only after its bytes are `fdatasync`ed and recorded in `<name>.weights-partial.json`; the file is
renamed to its name when complete and recorded in `.weights-sync.journal`. A re-run resumes from those records,
and a half file never has the final name. When everything is present the manifest (`.weights-manifest.json`:
source, every key with size, ETag and sha256) and its hash (`.weights-manifest.sha256`) are written and the
directory is verified (`checks.weights_verify`). Exit 0 pass, 1 fail, 2 cannot run (one line naming bucket, key or
flag).

Content digests: a complete file is read back once (from the page cache when it fits) and its sha256 recorded
before it takes its name; parts arrive out of order, and a sha256 cannot be resumed across runs, so it is not
computed on the stream. Where the store holds a full-object SHA256 checksum (S3 `ChecksumType` FULL_OBJECT, or a
single-part object), the digest must equal it or the file fails and is fetched again by the next run. A composite
checksum (multipart uploads: a digest of the parts' digests) is not a digest of the whole file, and CRC32C /
CRC64NVME have no implementation in Python's standard library (botocore's optional `awscrt` may be missing from
the image): neither is used. `--content` also re-hashes
the files already present, fetches again those whose bytes no longer match, and reports the `content-sha256`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from checks.verdict import Verdict, check_name, emit, path, printable_line
from checks.weights_verify import (
    HASH_NAME,
    JOURNAL_NAME,
    LOCK_NAME,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    SIDECAR_SUFFIX,
    Entry,
    Manifest,
    ManifestError,
    _Parser,
    add_verify_args,
    file_sha256,
    hash_files,
    is_own_file,
    read_manifest,
    unsafe_reason,
    verify_dir,
)
from checks.weights_versions import (
    DEFAULT_KEEP_LAST,
    Reuse,
    docker_mount_sources,
    prune,
    record_links,
    reuse_unchanged,
    version_dir,
)
from stacks.model.s3_source import (
    DEFAULT_PART_MB,
    DEFAULT_WORKERS,
    MAX_PART_MB,
    MAX_WORKERS,
    MIN_PART_MB,
    REGION_RE,
    CannotRun,
    check_endpoint,
    parse_source,
    system_dir_reason,
)

DESCRIPTION = "Stage a checkpoint from S3 (or MinIO / Ceph RGW) into a model directory, then verify it."
CHUNK = 8 * 1024 * 1024
"""Bytes per read from the response stream: large enough that Python overhead per byte is negligible."""
READ_ATTEMPTS = 5
"""A part whose stream breaks is re-requested from the byte it reached, this many times (botocore already
retries failed requests; a stream that breaks after the headers is ours to retry)."""
DEFAULT_PROGRESS_S = 10.0
CREDENTIAL_ERRORS = {
    "InvalidAccessKeyId": "the access key is unknown to the store",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "InvalidToken": "the session token is malformed",
    "ExpiredToken": "the session token has expired",
    "TokenRefreshRequired": "the session token has expired",
    "InvalidClientTokenId": "the access key is unknown to the store",
}
DENIED = {"AccessDenied", "AllAccessDisabled", "Forbidden", "403"}
REGION_ERRORS = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}


class FileFailed(Exception):
    """One object could not be fetched; the others go on."""


class Fatal(Exception):
    """Stops the whole transfer (disk full, credentials revoked mid-way)."""

    def __init__(self, message: str, status: str = "fail") -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Options:
    source: str
    bucket: str
    prefix: str
    dest: str
    endpoint_url: str | None
    region: str
    addressing_style: str
    workers: int
    part_size: int
    delete: bool
    adopt_existing: bool
    dry_run: bool
    limit_bps: float | None
    progress_s: float
    name: str
    content: bool = False
    versions: bool = False
    """Sync into `<dest>@<version>` beside --dest (checks/weights_versions.py), linking unchanged files."""


# ---------------------------------------------------------------------------------------------- arguments


def check_dest(dest: str) -> str:
    if not dest.startswith("/"):
        raise CannotRun(f"--dest {dest!r} is not an absolute path: pass the model directory as /PATH")
    normal = os.path.normpath(dest)
    if normal == "/" or ".." in dest.split("/"):
        raise CannotRun(f"--dest {dest!r}: must be a model directory below /, without '..'")
    return normal


def check_sync_dest(dest: str) -> str:
    """check_dest, and not a system directory (a sync writes there, and --delete would clear what else it holds)."""
    normal = check_dest(dest)
    reason = system_dir_reason(normal)
    if reason:
        raise CannotRun(f"--dest {dest!r}: {reason}: the sync writes a checkpoint there (and --delete would clear "
                        "everything else in it); pass a model directory of its own, e.g. /data/models/NAME")
    return normal


def check_dest_on_disk(dest: str, write: bool) -> None:
    """CannotRun naming --dest unless this process can use it: an existing directory it may list (and write, unless
    `write` is false), or a path whose nearest existing ancestor is a directory it may create it in. Run before any
    request to the store, so a bad --dest costs no listing."""
    path = dest
    while True:
        try:
            info = os.stat(path)
            break
        except (FileNotFoundError, NotADirectoryError):
            parent = os.path.dirname(path)
            if parent == path:
                raise CannotRun(f"--dest {dest!r}: no ancestor of it exists") from None
            path = parent
        except OSError as exc:
            raise CannotRun(f"--dest {dest!r}: cannot look at {path}: {exc.strerror or exc}: pass a directory this "
                            f"user (uid {os.geteuid()}) may reach") from None
    if not stat.S_ISDIR(info.st_mode):
        if path == dest:
            raise CannotRun(f"--dest {dest!r} exists and is not a directory: pass the model directory (created when "
                            "missing)")
        raise CannotRun(f"--dest {dest!r}: {path} is a file, not a directory, so --dest cannot be created below it: "
                        "pass a path whose existing parts are directories")
    real = os.path.realpath(dest)
    reason = system_dir_reason(real) if real != os.path.normpath(dest) else None
    if reason:
        raise CannotRun(f"--dest {dest!r} resolves to {real} (through a symlink) and {reason}: pass a model "
                        "directory of its own, e.g. /data/models/NAME")
    existing = path == dest
    need = (os.R_OK | os.X_OK if existing else os.X_OK) | (os.W_OK if write else 0)
    if not os.access(path, need):
        why = "permission denied"
        with contextlib.suppress(OSError):
            if os.statvfs(path).f_flag & os.ST_RDONLY:
                why = "read-only file system"
        doing = ("list and write" if write else "list") if existing else "create --dest in"
        raise CannotRun(f"--dest {dest!r}: this user (uid {os.geteuid()}) may not {doing} {path} ({why}): pass a "
                        "directory it may write, or fix the owner, mode or mount")


def recorded_source(root: Path) -> tuple[str, str | None] | None:
    """(source, endpoint_url) a sync of this tool recorded in `root`: the header of an interrupted run's journal (the
    newer record), else the manifest; None when there is neither. ManifestError when the manifest is untrustworthy."""
    with contextlib.suppress(OSError, UnicodeDecodeError, ValueError, AttributeError):
        with open(root / JOURNAL_NAME, encoding="utf-8") as journal:
            head = json.loads(journal.readline())
        if isinstance(head.get("source"), str) and "key" not in head:
            endpoint = head.get("endpoint_url")
            return head["source"], endpoint if isinstance(endpoint, str) else None
    manifest = read_manifest(root)
    return (manifest.source, manifest.endpoint_url) if manifest else None


def check_delete(opts: Options) -> None:
    """--delete removes every file the listing lacks, so it runs only where it can only remove what a sync of the
    same source left: a --dest that is missing or holds nothing but the sync's own files, or whose manifest (or an
    interrupted run's journal) records this very source and endpoint. CannotRun otherwise, before any request."""
    if not opts.delete:
        return
    root = Path(opts.dest)
    try:
        held = sorted(e.name for e in os.scandir(root) if not is_own_file(e.name))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CannotRun(f"--dest {opts.dest!r}: cannot list it: {exc.strerror or exc}") from None
    if not held:
        return
    source = f"s3://{opts.bucket}/{opts.prefix}"

    def at(endpoint: str | None) -> str:
        return f" at {endpoint}" if endpoint else " (AWS)"

    after = "sync into a directory of its own, or run without --delete (files the listing lacks are kept and named)"
    try:
        recorded = recorded_source(root)
    except ManifestError as exc:
        raise CannotRun(f"--delete refused: --dest {opts.dest!r} holds a manifest that cannot be trusted ({exc}), "
                        f"so nothing says which files a sync of {source} left there: {after}") from None
    if recorded is None:
        raise CannotRun(f"--delete refused: --dest {opts.dest!r} holds {_list(held, 3)} but no manifest of a sync: "
                        f"--delete would remove everything {source} lacks from a directory this tool never synced; "
                        f"{after}")
    if recorded != (source, opts.endpoint_url):
        raise CannotRun(f"--delete refused: --dest {opts.dest!r} was synced from {recorded[0]}{at(recorded[1])}, "
                        f"not {source}{at(opts.endpoint_url)}: --delete only clears a directory synced from the same "
                        f"source; {after}: its manifest then records this source and a later --delete works")


def options_from(args: argparse.Namespace) -> Options:
    bucket, prefix = parse_source(args.source)
    dest = check_sync_dest(args.dest)
    endpoint = check_endpoint(args.endpoint_url) if args.endpoint_url else None
    region = args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    if not REGION_RE.match(region):
        raise CannotRun(f"--region {region!r} is not a region name (e.g. us-east-1)")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise CannotRun(f"--workers {args.workers}: must be 1..{MAX_WORKERS} (parallel GETs; default "
                        f"{DEFAULT_WORKERS})")
    if not MIN_PART_MB <= args.part_size_mb <= MAX_PART_MB:
        raise CannotRun(f"--part-size-mb {args.part_size_mb}: must be {MIN_PART_MB}..{MAX_PART_MB}")
    if args.limit_mb_s is not None and not args.limit_mb_s > 0:
        raise CannotRun(f"--limit-mb-s {args.limit_mb_s}: must be > 0 (leave it out for no limit)")
    if not args.progress_s >= 0:
        raise CannotRun(f"--progress-s {args.progress_s}: must be >= 0 (0: no progress lines)")
    style = args.addressing_style or ("path" if endpoint else "virtual")
    return Options(args.source, bucket, prefix, dest, endpoint, region, style, args.workers,
                   args.part_size_mb * 1024 * 1024, args.delete, args.adopt_existing, args.dry_run,
                   args.limit_mb_s * 1e6 if args.limit_mb_s else None, args.progress_s, args.name, args.content,
                   args.versions)


# ---------------------------------------------------------------------------------------------- S3


def make_client(opts: Options) -> Any:
    try:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
    except ImportError as exc:
        raise CannotRun(f"boto3 is not importable by {sys.executable} ({exc}): run the sync inside the vLLM "
                        "image (it ships boto3) or pip install boto3") from exc
    config = Config(region_name=opts.region, max_pool_connections=opts.workers + 2,
                    retries={"max_attempts": 8, "mode": "standard"}, connect_timeout=15, read_timeout=120,
                    s3={"addressing_style": opts.addressing_style}, user_agent_extra="vllm-cluster-weights")
    return boto3.session.Session().client("s3", endpoint_url=opts.endpoint_url, config=config)


def _where(opts: Options, client: Any) -> str:
    return opts.endpoint_url or str(getattr(client.meta, "endpoint_url", "S3"))


def explain(exc: BaseException, opts: Options, client: Any, key: str | None = None) -> str:
    """One line for a botocore error: which bucket or key, what the store said, and the fix."""
    from botocore.exceptions import (  # type: ignore[import-untyped]
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        SSLError,
    )

    where = _where(opts, client)
    target = f"s3://{opts.bucket}/{opts.prefix}{key or ''}"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return (f"no usable credentials for {target}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
                "AWS_SESSION_TOKEN for temporary keys) in the environment")
    if isinstance(exc, SSLError):
        return f"TLS to {where} failed ({exc}): for a private CA set AWS_CA_BUNDLE to its PEM file"
    if isinstance(exc, EndpointConnectionError):
        return f"cannot connect to {where} for bucket {opts.bucket!r}: {exc}; check --endpoint-url and the network"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "?"))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = str(error.get("Message", "")).strip()
        if code in ("NoSuchBucket",):
            return f"bucket {opts.bucket!r} does not exist at {where} (NoSuchBucket): check --source and --endpoint-url"
        if code in CREDENTIAL_ERRORS:
            return (f"credentials refused by {where} for bucket {opts.bucket!r} ({code}: "
                    f"{CREDENTIAL_ERRORS[code]}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
                    "AWS_SESSION_TOKEN, and the clock")
        if code in DENIED or status == 403:
            return (f"access to {target} denied by {where} ({code}: {message}): the key needs s3:ListBucket on "
                    f"bucket {opts.bucket!r} and s3:GetObject on its objects")
        if code in REGION_ERRORS or status == 301:
            region = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
            hint = f" (the store says {region})" if region else ""
            return f"bucket {opts.bucket!r} is not in region {opts.region}{hint} ({code}): pass --region"
        if code in ("NoSuchKey", "404"):
            return f"{target} does not exist ({code}): the object was deleted during the sync; re-run"
        if code in ("PreconditionFailed", "412"):
            return f"{target} changed during the sync (ETag differs, {code}): re-run to fetch the new version"
        return f"{where} refused a request for {target}: {code} (HTTP {status}) {message}"
    return f"{type(exc).__name__} talking to {where} about {target}: {exc}"


SHA256_LISTED: set[tuple[str, str]] = set()
"""(bucket, key) of objects the listing said carry a SHA256 checksum (`ChecksumAlgorithm`): only those get a
HeadObject for its value, so a store without checksums costs no extra request."""


def full_object_sha256(head: dict[str, Any], etag: str) -> str | None:
    """The store's SHA256 of the whole object (hex) from a HeadObject/GetObject answer made with
    ChecksumMode=ENABLED, or None when it has none or it is composite: `ChecksumType` COMPOSITE, a value ending in
    `-N`, or (a store that sends no `ChecksumType`) a multipart ETag, whose checksum is a digest of the parts."""
    value = head.get("ChecksumSHA256")
    kind = head.get("ChecksumType")
    if not isinstance(value, str) or "-" in value:
        return None
    if kind != "FULL_OBJECT" and (kind is not None or "-" in etag):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def list_prefix(client: Any, opts: Options) -> list[Entry]:
    """Every object under the prefix as (path relative to the prefix, size, ETag). Directory markers (keys
    ending in '/', size 0) are skipped; a key that could land outside --dest stops the sync."""
    from botocore.exceptions import BotoCoreError, ClientError

    entries: list[Entry] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=opts.bucket, Prefix=opts.prefix):
            for obj in page.get("Contents", []):
                key = str(obj["Key"])
                if key.endswith("/") and int(obj.get("Size", 0)) == 0:
                    continue
                rel = key[len(opts.prefix):]
                reason = unsafe_reason(rel)
                if reason:
                    raise CannotRun(f"bucket {opts.bucket!r} lists key {key!r}: {reason}; refusing to write it "
                                    f"under {opts.dest} (rename the object or narrow --source)")
                entries.append(Entry(rel, int(obj["Size"]), str(obj.get("ETag", "")).strip('"')))
                if "SHA256" in (obj.get("ChecksumAlgorithm") or []):
                    SHA256_LISTED.add((opts.bucket, key))
    except (ClientError, BotoCoreError) as exc:
        raise CannotRun(explain(exc, opts, client)) from exc
    if not entries:
        raise CannotRun(f"s3://{opts.bucket}/{opts.prefix} lists no objects at {_where(opts, client)}: check the "
                        "prefix (keys are case-sensitive) and that the upload finished")
    keys = {e.key for e in entries}
    for entry in entries:
        parts = entry.key.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in keys:
                raise CannotRun(f"bucket {opts.bucket!r} has both {opts.prefix}{parent} and {opts.prefix}"
                                f"{entry.key}: a file cannot also be a directory")
    return sorted(entries, key=lambda e: e.key)


# ---------------------------------------------------------------------------------------------- local records


def read_journal(root: Path) -> dict[str, Entry]:
    """Files an earlier (interrupted) run completed; a torn last line is ignored."""
    records: dict[str, Entry] = {}
    try:
        lines = (root / JOURNAL_NAME).read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return records
    except OSError as exc:
        raise CannotRun(f"--dest {str(root)!r}: cannot read the sync's journal {root / JOURNAL_NAME}: "
                        f"{exc.strerror or exc}: remove it (a re-run fetches what it cannot prove present)") from None
    for line in lines:
        try:
            raw = json.loads(line)
            digest = raw.get("sha256")
            entry = Entry(str(raw["key"]), int(raw["size"]), str(raw["etag"]),
                          digest if isinstance(digest, str) and len(digest) == 64 else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        records[entry.key] = entry
    return records


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _regular_size(path: Path) -> int | None:
    """Size of a regular file (not following a symlink), or None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _inside(root: Path, rel: str, create: bool) -> Path:
    """The directory that will hold `rel` (created unless `create` is false); CannotRun when a symlink would
    lead it out of root."""
    parent = root.joinpath(*rel.split("/")[:-1])
    if create:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CannotRun(f"cannot create {parent}: {exc}") from exc
    real_root = os.path.realpath(root)
    if os.path.realpath(parent) != os.path.normpath(os.path.join(real_root, *rel.split("/")[:-1])):
        raise CannotRun(f"{parent} resolves outside {root} (a symlink): refusing to write {rel} there")
    return parent


# ---------------------------------------------------------------------------------------------- transfer


_SYNC_FILE_RANGE: Any = None


def start_writeback(fd: int, offset: int, count: int) -> None:
    """Ask the kernel to start writing this range to disk now (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`,
    asynchronous, page cache kept), so the `fdatasync` that makes a part count finds little left to write and the
    disk works while the network does. Where libc has no such call this does nothing."""
    global _SYNC_FILE_RANGE
    if _SYNC_FILE_RANGE is None:
        try:
            import ctypes

            call = ctypes.CDLL(None, use_errno=True).sync_file_range
            call.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
            _SYNC_FILE_RANGE = call
        except (OSError, AttributeError, ImportError):
            _SYNC_FILE_RANGE = False
    if _SYNC_FILE_RANGE:
        _SYNC_FILE_RANGE(fd, offset, count, 2)  # SYNC_FILE_RANGE_WRITE


class Limiter:
    """A shared byte-rate ceiling (--limit-mb-s): each caller reserves its slot in time, then sleeps to it."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, count: int) -> None:
        if self.rate is None:
            return
        with self.lock:
            now = time.monotonic()
            start = max(self.next, now)
            self.next = start + count / self.rate
        if start > now:
            time.sleep(start - now)


@dataclass
class Job:
    entry: Entry
    final: Path
    partial: Path
    sidecar: Path
    parts: list[tuple[int, int]]
    done: set[int] = field(default_factory=set)
    fd: int = -1
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def resumed_bytes(self) -> int:
        return sum(self.parts[i][1] - self.parts[i][0] for i in self.done)


@dataclass
class Progress:
    total_files: int
    total_bytes: int
    files: int = 0
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: float = field(default_factory=time.monotonic)

    def add(self, count: int, files: int = 0) -> None:
        with self.lock:
            self.bytes += count
            self.files += files

    def line(self, name: str) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.bytes / elapsed
        left = self.total_bytes - self.bytes
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        pct = 100.0 * self.bytes / self.total_bytes if self.total_bytes else 100.0
        return (f"{name}: {self.files}/{self.total_files} file(s), {self.bytes / 1e6:.0f}/"
                f"{self.total_bytes / 1e6:.0f} MB ({pct:.0f}%), {rate / 1e6:.1f} MB/s, ETA {eta}")


class Transfer:
    """Fetches the planned jobs with a pool of workers, part by part (see the module docstring)."""

    def __init__(self, client: Any, opts: Options, root: Path, jobs: list[Job], progress: Progress) -> None:
        self.client, self.opts, self.root, self.jobs, self.progress = client, opts, root, jobs, progress
        self.limiter = Limiter(opts.limit_bps)
        self.abort = threading.Event()
        self.fatal: Fatal | None = None
        self.failed: dict[str, str] = {}
        self.journal_lock = threading.Lock()
        self.retries = 0
        self.digests: dict[str, str] = {}
        self.chunk = CHUNK if opts.limit_bps is None else max(64 * 1024, min(CHUNK, int(opts.limit_bps / 4)))

    def run(self) -> None:
        ready = [job for job in self.jobs if len(job.done) == len(job.parts)]  # empty objects, resumed ones
        with ThreadPoolExecutor(self.opts.workers, thread_name_prefix="weights") as pool:
            futures = [pool.submit(self._part, job, index) for job in self.jobs
                       for index in range(len(job.parts)) if index not in job.done]
            for job in ready:
                self._finish_safely(job)
            for future in futures:
                future.result()
        for job in self.jobs:
            if job.fd >= 0:
                os.close(job.fd)
                job.fd = -1

    def _open(self, job: Job) -> int:
        with job.lock:
            if job.finished:
                raise FileFailed(f"{job.final} was already complete when a part reopened it")
            if job.fd < 0:
                flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                job.fd = os.open(job.partial, flags, 0o644)
                if os.fstat(job.fd).st_size != job.entry.size:
                    os.ftruncate(job.fd, job.entry.size)
            return job.fd

    def _part(self, job: Job, index: int) -> None:
        if self.abort.is_set() or job.entry.key in self.failed:
            return
        try:
            self._fetch(job, index)
        except FileFailed as exc:
            self.failed[job.entry.key] = str(exc)
        except Fatal as exc:
            if self.fatal is None:
                self.fatal = exc
            self.abort.set()
        except OSError as exc:
            self._disk_error(exc, job)
        except Exception as exc:  # a bug or an unforeseen library error: name it, never a traceback
            self.failed[job.entry.key] = f"{type(exc).__name__}: {exc}"

    def _disk_error(self, exc: OSError, job: Job) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
            if self.fatal is None:
                self.fatal = Fatal(f"writing {job.partial} failed: {exc.strerror} ({exc.errno}); free space on "
                                   f"{self.opts.dest} and re-run (finished parts are kept)")
            self.abort.set()
        else:
            self.failed[job.entry.key] = f"writing {job.partial}: {exc}"

    def _fetch(self, job: Job, index: int) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        start, end = job.parts[index]
        fd = self._open(job)
        offset, attempts = start, 0
        while offset < end:
            if self.abort.is_set():
                return
            request: dict[str, Any] = {"Bucket": self.opts.bucket, "Key": self.opts.prefix + job.entry.key}
            if job.entry.etag:
                request["IfMatch"] = f'"{job.entry.etag}"'
            if (offset, end) != (0, job.entry.size):
                request["Range"] = f"bytes={offset}-{end - 1}"
            try:
                body = self.client.get_object(**request)["Body"]
                try:
                    while offset < end:
                        data = body.read(min(self.chunk, end - offset))
                        if not data:
                            break
                        self.limiter.take(len(data))
                        try:
                            os.pwrite(fd, data, offset)
                            start_writeback(fd, offset, len(data))
                        except OSError as exc:
                            raise _WriteError(exc) from exc
                        offset += len(data)
                        self.progress.add(len(data))
                finally:
                    body.close()
                if offset < end:
                    raise _ShortRead(f"stream ended at byte {offset}, part ends at {end}")
            except _WriteError as exc:
                raise exc.error from None
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                line = explain(exc, self.opts, self.client, job.entry.key)
                if code in CREDENTIAL_ERRORS or code in DENIED or status == 403:
                    raise Fatal(line, "cannot-run") from exc
                if code in ("NoSuchKey", "PreconditionFailed", "404", "412") or (status or 500) < 500:
                    raise FileFailed(line) from exc
                attempts = self._again(attempts, line)
            except (BotoCoreError, _ShortRead, OSError) as exc:  # the network (writes are _WriteError above)
                attempts = self._again(attempts, f"s3://{self.opts.bucket}/{self.opts.prefix}{job.entry.key} "
                                                 f"bytes {offset}-{end - 1}: {exc}")
        os.fdatasync(fd)
        with job.lock:
            job.done.add(index)
            finished = len(job.done) == len(job.parts)
            if not finished:
                _write_atomic(job.sidecar, json.dumps({"etag": job.entry.etag, "size": job.entry.size,
                                                       "part_size": self.opts.part_size,
                                                       "done": sorted(job.done)}))
        if finished:
            self._finish(job)

    def _again(self, attempts: int, line: str) -> int:
        """Count a broken request or stream; the caller re-requests from the byte it reached."""
        attempts += 1
        if attempts >= READ_ATTEMPTS:
            raise FileFailed(f"{line} (gave up after {attempts} attempts)")
        with self.journal_lock:
            self.retries += 1
        print(f"{self.opts.name}: retrying after {line} (attempt {attempts + 1} of {READ_ATTEMPTS})",
              file=sys.stderr, flush=True)
        time.sleep(min(30.0, 0.5 * 2 ** attempts))
        return attempts

    def _finish_safely(self, job: Job) -> None:
        try:
            self._finish(job)
        except FileFailed as exc:
            self.failed[job.entry.key] = str(exc)
        except OSError as exc:
            self._disk_error(exc, job)

    def _store_sha256(self, job: Job) -> str | None:
        """The store's full-object SHA256 of this object version (hex), asked only when the listing said it has
        one; None otherwise or when it is composite (`full_object_sha256`)."""
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.opts.prefix + job.entry.key
        if (self.opts.bucket, key) not in SHA256_LISTED:
            return None
        request: dict[str, Any] = {"Bucket": self.opts.bucket, "Key": key, "ChecksumMode": "ENABLED"}
        if job.entry.etag:
            request["IfMatch"] = f'"{job.entry.etag}"'
        try:
            head = self.client.head_object(**request)
        except (ClientError, BotoCoreError) as exc:
            raise FileFailed(explain(exc, self.opts, self.client, job.entry.key)) from exc
        return full_object_sha256(head, job.entry.etag)

    def _finish(self, job: Job) -> None:
        """The complete file takes its name; the journal records it (what a re-run trusts). Once per job."""
        with job.lock:
            if job.finished:
                return
        fd = self._open(job)
        with job.lock:
            if job.finished:
                return
            job.finished = True
        os.fsync(fd)
        with job.lock:
            os.close(fd)
            job.fd = -1
        digest = file_sha256(job.partial)
        expected = self._store_sha256(job)
        if expected is not None and expected != digest:
            for leftover in (job.partial, job.sidecar):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
            raise FileFailed(f"the bytes written hash to sha256 {digest}, the store's full-object SHA256 is "
                             f"{expected}: corrupted in transit or on this disk (re-run to fetch it again)")
        os.replace(job.partial, job.final)
        with contextlib.suppress(FileNotFoundError):
            job.sidecar.unlink()
        line = _journal_line(job.entry, digest)
        with self.journal_lock:
            self.digests[job.entry.key] = digest
        with self.journal_lock, open(self.root / JOURNAL_NAME, "a", encoding="utf-8") as journal:
            journal.write(line)
            journal.flush()
            os.fsync(journal.fileno())
        self.progress.add(0, files=1)


def _journal_line(entry: Entry, digest: str | None) -> str:
    return json.dumps({"key": entry.key, "size": entry.size, "etag": entry.etag,
                       **({"sha256": digest} if digest else {})}) + "\n"


class _ShortRead(Exception):
    pass


class _WriteError(Exception):
    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _reporter(progress: Progress, name: str, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        print(progress.line(name), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- the sync


@dataclass
class Plan:
    jobs: list[Job]
    present: list[str]
    adopted: list[str]
    digests: dict[str, str]
    """sha256 of present files: recorded by an earlier sync, or (with --content) hashed now."""
    hashed: set[str]
    """Present files hashed by this run (--content): verify need not read them again."""
    changed: list[str]
    """Present files whose bytes no longer match the recorded digest (--content): fetched again."""


def _plan(opts: Options, root: Path, entries: list[Entry]) -> Plan:
    """Jobs to fetch, keys already present (and adopted by size), their digests, from the listing and the local
    records; with --content the present files are hashed and those whose bytes changed are fetched again."""
    records: dict[str, Entry] = {}
    try:
        manifest = read_manifest(root)
    except ManifestError:
        manifest = None
    if manifest is not None:
        records.update({e.key: e for e in manifest.files})
    records.update(read_journal(root))
    present: list[str] = []
    adopted: list[str] = []
    due: list[Entry] = []
    for entry in entries:
        have = _regular_size(_inside(root, entry.key, create=not opts.dry_run) / entry.key.rsplit("/", 1)[-1])
        if have == entry.size and records.get(entry.key) == entry:
            present.append(entry.key)
        elif have == entry.size and opts.adopt_existing and entry.key not in records:
            present.append(entry.key)
            adopted.append(entry.key)
        else:
            due.append(entry)
    digests = {k: str(records[k].sha256) for k in present if k in records and records[k].sha256}
    hashed: set[str] = set()
    changed: list[str] = []
    if opts.content and present:
        fresh, unreadable = hash_files(root, present)
        hashed = set(fresh)
        changed = sorted(k for k in present if k in unreadable or (k in digests and fresh.get(k) != digests[k]))
        digests.update({k: v for k, v in fresh.items() if k not in changed})
        by_key = {e.key: e for e in entries}
        due += [by_key[k] for k in changed]
        present = [k for k in present if k not in changed]
        adopted = [k for k in adopted if k not in changed]
    jobs: list[Job] = []
    for entry in sorted(due, key=lambda e: e.key):
        parent = _inside(root, entry.key, create=not opts.dry_run)
        name = entry.key.rsplit("/", 1)[-1]
        parts = [(s, min(s + opts.part_size, entry.size)) for s in range(0, entry.size, opts.part_size)]
        job = Job(entry, parent / name, parent / (name + PARTIAL_SUFFIX), parent / (name + SIDECAR_SUFFIX), parts)
        job.done = _resumable(job, opts.part_size, clean=not opts.dry_run)
        jobs.append(job)
    return Plan(jobs, present, adopted, digests, hashed, changed)


def _resumable(job: Job, part_size: int, clean: bool) -> set[int]:
    """Parts an interrupted run finished for this very object version, or nothing (and its leftovers go)."""
    try:
        raw = json.loads(job.sidecar.read_text(encoding="utf-8"))
        same = (raw.get("etag"), raw.get("size"), raw.get("part_size")) == (job.entry.etag, job.entry.size,
                                                                             part_size)
        done = {int(i) for i in raw.get("done", [])} if same else set()
    except (OSError, ValueError, TypeError, AttributeError):
        done = set()
    if done and _regular_size(job.partial) == job.entry.size and done <= set(range(len(job.parts))):
        return done
    for leftover in (job.partial, job.sidecar) if clean else ():
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    return set()


def _stale_partials(root: Path, jobs: list[Job]) -> list[str]:
    """Leftover partials of objects no longer in the listing: the sync's own files, always removed."""
    keep = {str(p) for job in jobs for p in (job.partial, job.sidecar)}
    removed = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if name.endswith((PARTIAL_SUFFIX, SIDECAR_SUFFIX)) and path not in keep:
                os.unlink(path)
                removed.append(os.path.relpath(path, root))
    return removed


def _extras(root: Path, keys: set[str]) -> list[str]:
    """Files under root that are neither in the listing nor the sync's own."""
    extra = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if rel not in keys and not is_own_file(name):
                extra.append(rel)
    return extra


def _delete(root: Path, extras: list[str]) -> None:
    for rel in extras:
        os.unlink(root / rel)
    for dirpath, _, _ in sorted(os.walk(root), key=lambda item: -len(item[0])):
        if Path(dirpath) != root:
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def _lock(root: Path) -> int:
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise CannotRun(f"--dest {str(root)!r}: cannot open the sync's lock {root / LOCK_NAME}: "
                        f"{exc.strerror or exc}: remove it if it is not a file, or fix the directory's mode") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise CannotRun(f"another sync is writing {root} (it holds {root / LOCK_NAME}): wait for it to end") from exc
    return fd


def _list(items: Sequence[str], show: int = 5) -> str:
    return ", ".join(items[:show]) + (f" … and {len(items) - show} more" if len(items) > show else "")


def sync(opts: Options) -> Verdict:
    """List, plan, fetch what is missing or wrong, write the manifest, verify. CannotRun propagates."""
    started = time.monotonic()
    check_dest_on_disk(opts.dest, write=not opts.dry_run and not opts.versions)
    if opts.versions:
        _check_beside(opts)
    else:
        check_delete(opts)
    client = make_client(opts)
    entries = list_prefix(client, opts)
    manifest = Manifest(f"s3://{opts.bucket}/{opts.prefix}", opts.endpoint_url, tuple(entries))
    if opts.versions:
        return _sync_version(opts, client, manifest, started)
    return _sync_into(opts, client, manifest, started)


def _check_beside(opts: Options) -> None:
    """--versions writes `<dest>@<version>` beside --dest: its parent must be a directory this user may write (or
    create). Checked before any request, like --dest itself."""
    parent = os.path.dirname(opts.dest)
    if os.path.isdir(parent) and not opts.dry_run and not os.access(parent, os.W_OK | os.X_OK):
        raise CannotRun(f"--dest {opts.dest!r} with --versions: this user (uid {os.geteuid()}) may not write {parent}, "
                        "where the version directories go beside --dest: fix its owner or mode")


def _sync_version(opts: Options, client: Any, manifest: Manifest, started: float) -> Verdict:
    """The listing's version directory: unchanged files linked from earlier versions (never written), the rest
    fetched into it by the ordinary sync. A failure leaves the earlier versions as they were."""
    base = opts.dest
    target = version_dir(base, manifest.sha256)
    vopts = replace(opts, dest=target)
    root = Path(target)
    if not opts.dry_run and not root.is_dir():
        check_dest_on_disk(target, write=True)
    reuse = Reuse()

    def link_first() -> None:  # under the version directory's lock, before the sync plans
        check_delete(vopts)
        found = reuse_unchanged(base, root, manifest.files)
        record_links(root, manifest.source, opts.endpoint_url, found.linked)
        reuse.linked, reuse.failed, reuse.sources = found.linked, found.failed, found.sources

    verdict = _sync_into(vopts, client, manifest, started, None if opts.dry_run else link_first)
    verdict.details["version_dir"] = target
    verdict.details.update(linked_files=[e.key for e in reuse.linked], linked_from=reuse.sources,
                           link_failed=reuse.failed)
    if reuse.linked:
        verdict.evidence.insert(0, f"hard-linked {len(reuse.linked)} unchanged file(s) from "
                                   f"{', '.join(reuse.sources)} (nothing copied, the old directory untouched)")
    if reuse.failed:
        verdict.evidence.insert(0, f"{len(reuse.failed)} unchanged file(s) could not be hard-linked and were fetched: "
                                   f"{_list([f'{k} ({v})' for k, v in sorted(reuse.failed.items())], 3)}")
    if verdict.status == "pass":
        verdict.summary += f"; version-dir={target}"
    return verdict


def _sync_into(opts: Options, client: Any, manifest: Manifest, started: float,
               prepare: Callable[[], None] | None = None) -> Verdict:
    """The sync proper into opts.dest, under its lock (none for a dry run); `prepare` runs first under the lock."""
    root = Path(opts.dest)
    try:
        if opts.dry_run:
            return _sync_locked(opts, client, root, manifest, started)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CannotRun(f"cannot create --dest {opts.dest}: {exc}") from exc
        lock_fd = _lock(root)
        try:
            if prepare is not None:
                prepare()
            return _sync_locked(opts, client, root, manifest, started)
        finally:
            os.close(lock_fd)
    except OSError as exc:  # the transfer reports its own; this is the directory's bookkeeping, never a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        raise CannotRun(f"--dest {opts.dest!r}: {exc.strerror or exc}{where}: fix the directory (mode, space, a "
                        "file where a directory belongs) and re-run: finished files and parts are kept") from exc


def _sync_locked(opts: Options, client: Any, root: Path, manifest: Manifest, started: float) -> Verdict:
    entries = list(manifest.files)
    plan = _plan(opts, root, entries)
    jobs, present, adopted = plan.jobs, plan.present, plan.adopted
    total = sum(e.size for e in entries)
    fetch_bytes = sum(job.entry.size for job in jobs)
    resumed = sum(job.resumed_bytes for job in jobs)
    extras = _extras(root, {e.key for e in entries}) if root.is_dir() else []
    details: dict[str, Any] = {
        "source": manifest.source, "endpoint_url": opts.endpoint_url, "dest": opts.dest, "files": len(entries),
        "bytes": total, "manifest_sha256": manifest.sha256, "hash_kind": "manifest-sha256", "hash": manifest.sha256,
        "present_files": len(present),
        "adopted_files": adopted, "fetch_files": [job.entry.key for job in jobs], "fetch_bytes": fetch_bytes,
        "resumed_parts": sum(len(job.done) for job in jobs), "resumed_bytes": resumed,
        "extra_files": extras, "deleted": [], "seconds": 0.0, "mb_per_s": 0.0, "content_changed": plan.changed,
    }
    if opts.dry_run:
        status = "pass" if not jobs and not (opts.delete and extras) else "fail"
        summary = (f"in sync with {manifest.source}" if status == "pass" else
                   f"{len(jobs)} of {len(entries)} file(s) to fetch ({(fetch_bytes - resumed) / 1e9:.2f} GB)"
                   + (f", {len(extras)} to delete" if opts.delete and extras else ""))
        changed = [f"content changed in place: {_list(plan.changed)}"] if plan.changed else []
        return Verdict(opts.name, status, f"{summary}; manifest-sha256={manifest.sha256}",
                       [f"{len(present)} present", f"to fetch: {_list(details['fetch_files']) or 'none'}", *changed],
                       "run the same command without --dry-run", details)
    free = shutil.disk_usage(root).free
    need = fetch_bytes - resumed
    if need > free:
        raise CannotRun(f"{opts.dest} has {free / 1e9:.1f} GB free, the sync needs {need / 1e9:.1f} GB more for "
                        f"{len(jobs)} file(s): free space or choose another --dest")
    stale = _stale_partials(root, jobs)
    if jobs:
        # From here the journal, not the manifest, says what is present: a crash leaves no stale manifest.
        keep = [e for e in entries if e.key in set(present)]
        header = json.dumps({"source": manifest.source, "endpoint_url": opts.endpoint_url}) + "\n"
        _write_atomic(root / JOURNAL_NAME, header + "".join(_journal_line(e, plan.digests.get(e.key)) for e in keep))
        for name in (MANIFEST_NAME, HASH_NAME):
            with contextlib.suppress(FileNotFoundError):
                (root / name).unlink()
    progress = Progress(len(jobs), fetch_bytes, 0, resumed)
    transfer = Transfer(client, opts, root, jobs, progress)
    stop = threading.Event()
    reporter = None
    if jobs and opts.progress_s > 0:
        reporter = threading.Thread(target=_reporter, args=(progress, opts.name, opts.progress_s, stop), daemon=True)
        reporter.start()
    t0 = time.monotonic()
    try:
        transfer.run()
    finally:
        stop.set()
        if reporter is not None:  # joined: a thread still alive at interpreter exit can crash a minimal image
            reporter.join(timeout=10)
    seconds = time.monotonic() - t0
    fetched = progress.bytes - resumed
    details.update(seconds=round(seconds, 3), mb_per_s=round(fetched / seconds / 1e6, 1) if seconds else 0.0,
                   stale_partials_removed=stale, failed=transfer.failed, retries=transfer.retries)
    rate = f"{fetched / 1e9:.2f} GB in {seconds:.1f} s, {details['mb_per_s']} MB/s" if jobs else "nothing to fetch"
    if transfer.fatal is not None:
        return Verdict(opts.name, transfer.fatal.status, f"stopped: {transfer.fatal}",
                       [f"{progress.files} of {len(jobs)} file(s) fetched before it stopped ({rate})"],
                       "fix the cause and re-run the same command: finished files and parts are kept", details)
    if transfer.failed:
        failed = [f"{k}: {v}" for k, v in sorted(transfer.failed.items())]
        return Verdict(opts.name, "fail", f"{len(failed)} of {len(entries)} file(s) not fetched: {_list(failed, 3)}",
                       [f"{progress.files} file(s) fetched ({rate})"],
                       "re-run the same command: finished files and parts are kept", details)
    digests = {**plan.digests, **transfer.digests}
    unknown = [e.key for e in entries if e.key not in digests]
    if unknown:  # a manifest of an older version, or files adopted by size: hashed once, then recorded
        more, unreadable = hash_files(root, unknown)
        if unreadable:
            failed = [f"{k}: {v}" for k, v in sorted(unreadable.items())]
            return Verdict(opts.name, "fail", f"{len(failed)} file(s) present but unreadable: {_list(failed, 3)}",
                           [f"{progress.files} file(s) fetched ({rate})"],
                           "fix or remove the named files and re-run the same command", details)
        digests.update(more)
    details["hashed_after_transfer"] = unknown
    manifest = Manifest(manifest.source, manifest.endpoint_url,
                        tuple(Entry(e.key, e.size, e.etag, digests[e.key]) for e in entries))
    try:
        current = read_manifest(root)
    except ManifestError:
        current = None
    if current is None or current.to_json() != manifest.to_json():
        _write_atomic(root / MANIFEST_NAME, manifest.to_json())
        _write_atomic(root / HASH_NAME, f"{manifest.sha256}  {MANIFEST_NAME}\n")
    with contextlib.suppress(FileNotFoundError):
        (root / JOURNAL_NAME).unlink()
    if opts.delete and extras:
        _delete(root, extras)
        details["deleted"] = extras
    fresh = {k: digests[k] for k in {*transfer.digests, *plan.hashed, *unknown}}
    check = verify_dir(opts.dest, manifest.sha256, opts.name, content=opts.content, known=fresh)
    if opts.content:
        details.update(hash_kind="content-sha256", hash=check.details["hash"])
    details["verify"] = check.details
    details["seconds_total"] = round(time.monotonic() - started, 3)
    evidence = [f"fetched {len(jobs)} file(s), {rate}" + (f"; resumed {details['resumed_parts']} part(s) an "
                "interrupted run had finished" if details["resumed_parts"] else ""),
                f"{len(present)} already present" + (f" ({len(adopted)} adopted by size)" if adopted else "")]
    if plan.changed:
        evidence.append(f"fetched again {len(plan.changed)} file(s) whose content no longer matched their recorded "
                        f"sha256: {_list(plan.changed)}")
    if extras:
        evidence.append(f"{'deleted' if opts.delete else 'kept'} {len(extras)} file(s) not in the manifest: "
                        f"{_list(extras)}")
    evidence += check.evidence
    if check.status != "pass":
        return Verdict(opts.name, check.status, f"synced, but the directory is not a complete model: {check.summary}",
                       evidence, check.next_step, details)
    return Verdict(opts.name, "pass", f"{len(entries)} file(s), {total / 1e9:.2f} GB from {manifest.source} "
                   f"in {opts.dest}; {details['hash_kind']}={details['hash']}", evidence, None, details)


# ---------------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m checks.weights", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("sync", help="fetch missing or wrong files from S3, then verify")
    run.add_argument("--source", required=True, type=printable_line, help="s3://BUCKET/PREFIX")
    run.add_argument("--dest", required=True, type=path, help="the model directory (absolute; created when missing)")
    run.add_argument("--endpoint-url", type=printable_line, help="S3-compatible store (MinIO, Ceph RGW): http(s)://HOST[:PORT]")
    run.add_argument("--region", type=printable_line, help="signing region [AWS_REGION, AWS_DEFAULT_REGION, us-east-1]")
    run.add_argument("--addressing-style", choices=("path", "virtual", "auto"),
                     help="[path with --endpoint-url, else virtual]")
    run.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help=f"parallel GETs [{DEFAULT_WORKERS}]")
    run.add_argument("--part-size-mb", type=int, default=DEFAULT_PART_MB,
                     help=f"bytes per ranged GET, in MiB; the unit of resume [{DEFAULT_PART_MB}]")
    run.add_argument("--delete", action="store_true", help="delete files under --dest that are not in the listing")
    run.add_argument("--adopt-existing", action="store_true",
                     help="count a file with the listed size as present even without a record of its ETag "
                          "(a directory copied by hand); without it such files are fetched again")
    run.add_argument("--dry-run", action="store_true", help="list and compare only; exit 1 when a fetch is due")
    run.add_argument("--limit-mb-s", type=float, help="total download rate ceiling in MB/s")
    run.add_argument("--progress-s", type=float, default=DEFAULT_PROGRESS_S,
                     help=f"seconds between progress lines on stderr; 0 for none [{DEFAULT_PROGRESS_S:g}]")
    run.add_argument("--content", action="store_true",
                     help="also re-hash the files already present, fetch again those whose bytes changed, and report "
                          "the content-sha256 (reads every file once)")
    run.add_argument("--versions", action="store_true",
                     help="sync into DEST@<version> beside --dest (the listing's hash), hard-linking files an earlier "
                          "version holds unchanged; --dest itself is never written")
    run.add_argument("--name", default="weights-sync", type=check_name, help="check name in the verdict")
    run.add_argument("--json", action="store_true", help="print one JSON verdict on stdout")
    check = sub.add_parser("verify", help="is the model directory complete? (no network)")
    add_verify_args(check)
    clean = sub.add_parser("prune", help="remove old version directories beside --dest that no container mounts")
    clean.add_argument("--dest", required=True, type=path, help="the model directory the versions sit beside")
    clean.add_argument("--keep", type=path, help="the version directory the engines mount now (never removed)")
    clean.add_argument("--keep-last", type=int, default=DEFAULT_KEEP_LAST,
                       help=f"versions kept, newest first, counting --keep [{DEFAULT_KEEP_LAST}]")
    clean.add_argument("--name", default="weights-prune", type=check_name, help="check name in the verdict")
    clean.add_argument("--json", action="store_true", help="print one JSON verdict on stdout")
    return parser


def _on_signal(name: str, as_json: bool) -> Callable[[int, Any], None]:
    def handler(signum: int, _frame: Any) -> None:
        emit(Verdict(name, "fail", f"interrupted by signal {signum}: finished files and parts are kept",
                     next_step="re-run the same command to resume"), as_json)
        os._exit(1)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return emit(verify_dir(args.dest, args.expect_hash, args.name, args.content), args.json)
    if args.command == "prune":
        try:
            if args.keep_last < 1:
                raise CannotRun(f"--keep-last {args.keep_last}: at least 1 (the version the engines mount)")
            base = check_sync_dest(args.dest)
            verdict = prune(base, os.path.normpath(args.keep) if args.keep else None, args.keep_last,
                            docker_mount_sources(), args.name)
        except CannotRun as exc:
            verdict = Verdict(args.name, "cannot-run", str(exc), next_step="nothing was removed; fix the named "
                              "argument or Docker and re-run")
        return emit(verdict, args.json)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal(args.name, args.json))
    try:
        opts = options_from(args)
        verdict = sync(opts)
    except CannotRun as exc:
        verdict = Verdict(args.name, "cannot-run", str(exc), next_step="fix the named argument, bucket or "
                          "credentials and re-run")
    return emit(verdict, args.json)


if __name__ == "__main__":
    sys.exit(main())
