"""The S3 source rule: which `s3://BUCKET/PREFIX`, endpoint, region, sync bounds and destination the weight sync
accepts, and how a source and an endpoint are masked before a message shows them.

One definition for both sides: the stack file's `model.source` (`stacks/model/weights_source.py`) and
`model.host_dir` (`stacks/planner/validation.py`) are checked by these functions, and the sync program
(`checks/weights.py`, `checks/weights_verify.py`) calls the same ones, so a value a node would refuse with exit 2
is refused at preview. Standard library only: `checks/weights_node.py` pastes this file into the script it sends to
a node, as `checks/bundle.py` pastes `stacks.planner.memory` into the preflight.
"""

from __future__ import annotations

import os
import re
import unicodedata
from urllib.parse import urlsplit

from stacks.model.masking import has_userinfo, mask_userinfo

DEFAULT_WORKERS = 16
MAX_WORKERS = 64
DEFAULT_PART_MB = 256
MIN_PART_MB, MAX_PART_MB = 1, 5120
SYNC_TIMEOUT_S = 6 * 3600
"""One node's sync, outer timeout: 511 GB at 30 MB/s (a slow store) is 4.7 h; a run cut by the timeout resumes
where it stopped."""
BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]$")
"""S3's rules (3-63 lower-case letters, digits, '.', '-') widened to what MinIO and Ceph RGW accept."""
REGION_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
INVISIBLE = {"Cc": "control character", "Cf": "format character", "Cs": "surrogate", "Zl": "line separator",
             "Zp": "paragraph separator"}
"""Unicode categories refused in a path besides ASCII controls: DEL and C1 controls, format characters (U+202E
right-to-left override, zero-width space and joiners, U+FEFF, soft hyphen), surrogates, U+2028/U+2029."""
BLANK_LOOKING = frozenset("\u115f\u1160\u3164\uffa0\u2800\u180e") | frozenset(chr(c) for c in range(0xFE00, 0xFE10))
"""Characters that render as nothing or as a space though they are letters or marks (Hangul fillers, the
Braille blank, variation selectors): refused like the non-ASCII spaces (category Zs). Homoglyphs of other
scripts (a Cyrillic `с` in `сonfig.json`) are not refused: the verify step names every file of the index."""
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt",
                         "/opt", "/root", "/run", "/sbin", "/srv", "/tmp", "/usr", "/usr/local", "/var", "/var/lib",
                         "/var/tmp"})
"""Directories that hold a system, users or other mounts: never a model directory themselves (a directory below one
is fine: /home/me/models/NAME, /tmp/NAME)."""
KERNEL_TREES = ("/proc", "/sys", "/dev")
"""Kernel file systems: nothing below them is a model directory."""


class CannotRun(Exception):
    """Why the sync cannot start (or must stop): one line, exit 2."""


_URL_TAIL = re.compile(r"[?#&=]|%(?:3f|23|26|3d)|x-amz-", re.I)
"""What marks a URL query, a fragment or a presigned URL (`?X-Amz-Signature=…&X-Amz-Credential=…`), encoded or
not: never part of a model's bucket prefix, and possibly a live signature, so never echoed past this point."""


def mask_source(text: str) -> str:
    """`text` as a message may show it: cut after the first query, fragment or presigned-URL marker (`s3://b/ds?***`);
    what remains still holds the marker, so the masked value is refused as the original is."""
    text = mask_userinfo(text)  # s3://KEY:SECRET@bucket
    found = _URL_TAIL.search(text)
    return f"{text[:found.end()]}***" if found else text


def mask_endpoint(url: str) -> str:
    """`url` as a message may show it: userinfo and everything after the authority masked (`https://***@host:9000/***`);
    a masked value is refused as the original is."""
    url = mask_userinfo(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return mask_source(url)
    cut = min([i for i in (rest.find(c) for c in "/?#") if i >= 0], default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    if tail not in ("", "/"):
        tail = tail[0] + "***"
    return f"{scheme}://{authority}{tail}"


def unsafe_path_reason(key: str) -> str | None:
    """Why a relative path (a bucket prefix, a key of a listing, a shard an index names) could leave the model
    directory or mislead whoever reads a listing, or None. `checks.weights_verify.unsafe_reason` adds the sync's
    own file names."""
    if not key:
        return "empty path"
    if "\x00" in key or any(ord(c) < 32 for c in key):
        return "control character in path"
    for char in key:
        kind = unicodedata.category(char)
        if char in BLANK_LOOKING or (kind == "Zs" and char != " "):
            name = unicodedata.name(char, "")
            return (f"blank-looking character U+{ord(char):04X}{f' ({name})' if name else ''} in path: two names "
                    "that print alike could both be loaded")
        if kind in INVISIBLE:
            name = unicodedata.name(char, "")
            return (f"{INVISIBLE[kind]} U+{ord(char):04X}{f' ({name})' if name else ''} in path: it hides or "
                    "reorders what a listing shows")
    if "\\" in key:
        return "backslash in path"
    if key.startswith("/"):
        return "absolute path"
    parts = key.split("/")
    if any(p == "" for p in parts):
        return "empty path component (// or trailing /)"
    if any(p in (".", "..") for p in parts):
        return "'.' or '..' component"
    if any(len(p.encode()) > 255 for p in parts):
        return "path component longer than 255 bytes"
    if len(key.encode()) > 4000:
        return "path longer than 4000 bytes"
    return None


def parse_source(text: str) -> tuple[str, str]:
    """(bucket, prefix ending in '/') of `s3://bucket/prefix`; CannotRun with the fix otherwise. The one rule for
    a source: the sync's `--source` and the stack's `model.source.url` (`stacks/model/weights_source.py`).
    Every message starts with `--source '<the value, masked>'`."""
    shown = mask_source(text)
    if not text.startswith("s3://"):
        raise CannotRun(f"--source {shown!r} is not an s3:// URL: write s3://BUCKET/PREFIX "
                        "(for MinIO or Ceph RGW add --endpoint-url http(s)://HOST:PORT)")
    if has_userinfo(text):
        raise CannotRun(f"--source {shown!r} carries credentials (user:password@): remove them; the sync signs its "
                        "requests with the AWS_* credentials")
    found = _URL_TAIL.search(text)
    if found:
        raise CannotRun(f"--source {shown!r} holds {found.group(0)!r}, which marks a URL query or a presigned URL, "
                        "not a bucket prefix: write the plain s3://BUCKET/PREFIX (the sync signs its own requests "
                        "with the AWS_* credentials; a presigned URL names one object)")
    bucket, _, prefix = text[len("s3://"):].partition("/")
    if not bucket:
        raise CannotRun(f"--source {shown!r} names no bucket: write s3://BUCKET/PREFIX")
    if not BUCKET_RE.match(bucket) or ".." in bucket:
        raise CannotRun(f"--source {shown!r}: bucket {bucket!r} is not a bucket name (3-255 of letters, digits, "
                        "'.', '_', '-', starting and ending with a letter or digit)")
    prefix = prefix.strip("/")
    if not prefix:
        raise CannotRun(f"--source {shown!r} names a bucket without a prefix: every object in the bucket would "
                        "land in the model directory; write s3://BUCKET/PREFIX, the prefix that holds config.json "
                        "and the shards")
    reason = unsafe_path_reason(prefix)
    if reason:
        raise CannotRun(f"--source {shown!r}: prefix {prefix!r}: {reason}")
    return bucket, prefix + "/"


def check_endpoint(url: str) -> str:
    """`url` without a trailing '/'; CannotRun unless it is http(s)://HOST[:PORT] (no userinfo, path, query or
    fragment). The stack's `model.source.endpoint_url` is validated by this function too. Every message starts with
    `--endpoint-url '<the value, masked>'`."""
    shown = mask_endpoint(url)
    if has_userinfo(url):  # a password with `/` would be read as host:port
        raise CannotRun(f"--endpoint-url {shown!r} carries credentials: remove them and set AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY in the environment")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CannotRun(f"--endpoint-url {shown!r} is not a URL ({exc}): write http(s)://HOST[:PORT]") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CannotRun(f"--endpoint-url {shown!r} is not an http(s)://HOST[:PORT] URL")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise CannotRun(f"--endpoint-url {shown!r} carries credentials: remove them and set AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY in the environment")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "?" in url or "#" in url:
        raise CannotRun(f"--endpoint-url {shown!r} has a path, query or fragment: pass only http(s)://HOST[:PORT] "
                        "(the bucket and prefix go in --source)")
    if port == 0:
        raise CannotRun(f"--endpoint-url {shown!r}: port 0")
    return url.rstrip("/")


def system_dir_reason(path: str) -> str | None:
    """Why `path` (absolute) must not be a sync's --dest (nor the stack's `model.host_dir` with a source), or None."""
    normal = os.path.normpath(path)
    if normal in SYSTEM_DIRS:
        return f"{normal} is a system directory"
    tree = next((t for t in KERNEL_TREES if normal == t or normal.startswith(t + "/")), None)
    return f"{normal} is in {tree}, a kernel file system" if tree else None
