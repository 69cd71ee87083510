"""`model-card hf://ORG/NAME[@REVISION]`: a model's config, index and shard headers read from the Hugging Face Hub
with ranged GETs, never its weights (a few MB for a 700 GB checkpoint).

The Hub's file layout, as huggingface_hub builds it (constants.py:67-70, file_download.py `hf_hub_url`):
`{HF_ENDPOINT or https://huggingface.co}/{repo_id}/resolve/{quote(revision, safe="")}/{quote(filename)}`; large
files answer with a redirect to a CDN (an absolute or a relative `Location`), a ranged GET with 206 and
`Content-Range: bytes A-B/SIZE`, and every answer from the Hub itself carries `X-Repo-Commit`, the commit the
revision resolved to (constants.py:94). Errors name their kind in `X-Error-Code` (utils/_http.py:803-824:
`RevisionNotFound`, `EntryNotFound`, `GatedRepo`, `RepoNotFound`). A token is sent as `Authorization: Bearer`,
only to the endpoint's own origin (a CDN gets none, as an HTTP client drops it on a cross-origin redirect).

Everything is bounded, because the answers come from the network: redirects per request, seconds per request and
per run, bytes read in all, files touched, the size of config.json and the index. After the first answer the
revision is pinned to `X-Repo-Commit`, so every file comes from one commit and the card names it. The token comes
from `HF_TOKEN` only and is never printed: every message passes through `_masked`.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

from review.card_sources import CardError, Source
from stacks.model.masking import has_userinfo, mask_secrets

SCHEME = "hf://"
DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_REDIRECTS = 5
REQUEST_TIMEOUT_S = 30.0
RUN_DEADLINE_S = 1800.0
"""DeepSeek-V3's 163 shards are ~330 requests; at a slow 1 s each that is well inside half an hour."""
MAX_BYTES = 256 * 2**20
"""All bytes read in one run: DeepSeek-V3's index (~9 MB) and 163 headers (~12 MB) take a tenth of it."""
MAX_WHOLE_FILE = 64 * 2**20
"""config.json or the index read whole: a 92,000-tensor index is ~9 MB."""
MAX_FILES = 4096
"""Distinct files touched: the largest public checkpoints have a few hundred shards."""
_REPO_PART = r"(?!.*(--|\.\.))[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_RE = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}", re.ASCII)
"""huggingface_hub's repo id rule (utils/_validators.py:28-37, 137-148): an optional namespace and a name of
letters, digits, `_`, `-`, `.` (up to 96), not starting or ending with `-`/`.`, without `--` or `..`."""
REVISION_RE = re.compile(r"(?!.*\.\.)(?!.*//)[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}(?<!/)", re.ASCII)
"""A branch, tag, commit or `refs/pr/N`: what git allows in a ref, less `..`, `//` and anything that is not a
plain ASCII name character (no `;`, spaces, controls or `@`)."""
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_TOKEN_RE = re.compile(r"[\x21-\x7e]{1,1024}")


def parse_hf(src: str) -> tuple[str, str]:
    """(repo_id, revision) of `hf://ORG/NAME[@REVISION]`; CardError naming SRC, the value and what works."""
    masked = mask_secrets(src)
    shown = ascii(masked) if len(masked) <= 300 else f"{masked[:60]!a}… ({len(src)} characters)"
    if has_userinfo(src):  # hf://user:password@org/name: refused before `@` is read as the revision
        raise CardError(f"SRC {shown}: carries credentials (user:password@): remove them; the Hub is read with the "
                        "token in HF_TOKEN")
    rest = src[len(SCHEME):]
    repo, sep, revision = rest.partition("@")
    if not REPO_RE.fullmatch(repo) or repo.endswith(".git"):
        raise CardError(f"SRC {shown}: not a Hugging Face repository: write hf://ORG/NAME[@REVISION], ORG and NAME of "
                        "letters, digits, '_', '-', '.' (no '..' or '--'), e.g. hf://Qwen/Qwen2.5-7B-Instruct")
    if sep and not REVISION_RE.fullmatch(revision):
        raise CardError(f"SRC {shown}: @{ascii(revision)[1:-1]} is not a revision: a branch, tag or commit of letters, "
                        "digits, '_', '-', '.', '/' (no '..'), e.g. @main or @0123abc… (40 hex digits)")
    return repo, revision if sep else "main"


def hub_endpoint() -> str:
    """`HF_ENDPOINT` (huggingface_hub's override, constants.py:69) or the public Hub; CardError for anything that is
    not a plain http(s) address."""
    raw = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    try:
        parts = urlsplit(raw)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc \
            or parts.query or parts.fragment or not raw.isprintable() or " " in raw:
        shown = "*** (it holds credentials)" if "@" in raw.split("/", 3)[2 if "//" in raw else 0] else \
            ascii(raw[:200])
        raise CardError(f"HF_ENDPOINT = {shown}: not an http(s) address without credentials, query or spaces "
                        f"(e.g. {DEFAULT_ENDPOINT} or http://hub-mirror.internal:8080); unset it for the public Hub")
    return raw.rstrip("/")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects come back as answers: HubSource follows them itself, counted and checked."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class HubSource(Source):
    """A Hugging Face Hub repository at one revision, read file by file with ranged GETs."""

    def __init__(self, src: str, *, max_bytes: int = MAX_BYTES, deadline_s: float = RUN_DEADLINE_S) -> None:
        self.repo, self.revision = parse_hf(src)
        self.endpoint = hub_endpoint()
        token = os.environ.get("HF_TOKEN") or None
        if token is not None and not _TOKEN_RE.fullmatch(token):
            raise CardError("HF_TOKEN is set but is not a token (1 to 1024 printable ASCII characters, no spaces or "
                            "line breaks); set it to a read token from https://huggingface.co/settings/tokens")
        self._token = token
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._max_bytes, self._read = max_bytes, 0
        self._deadline = time.monotonic() + deadline_s
        self._files: set[str] = set()
        self._sizes: dict[str, int] = {}
        self._heads: dict[str, bytes] = {}
        self._missing: set[str] = set()
        self.commit: str | None = None
        self.label = f"hf://{self.repo}@{self.revision}"

    # ------------------------------------------------------------------------------------------ the Source API

    def exists(self, name: str) -> bool:
        """One ranged GET of the first 8 bytes (a shard's header length, kept for read_range), or False on 404."""
        if name in self._heads:
            return True
        if name in self._missing:
            return False
        got = self._get(name, (0, 8), missing_ok=True)
        if got is None:
            self._missing.add(name)
            return False
        self._heads[name] = got
        return True

    def read(self, name: str) -> bytes:
        got = self._get(name, None)
        assert got is not None
        return got

    def read_range(self, name: str, start: int, length: int) -> bytes:
        if start == 0 and length <= len(self._heads.get(name, b"")):
            return self._heads[name][:length]
        if start >= self._sizes.get(name, start + 1):
            return b""
        got = self._get(name, (start, length))
        assert got is not None
        return got

    def size(self, name: str) -> int | None:
        return self._sizes.get(name)

    # ------------------------------------------------------------------------------------------ HTTP

    def _masked(self, text: str) -> str:
        """The text with the token, should any answer have echoed it, replaced: no message ever shows it."""
        return text.replace(self._token, "***") if self._token else text

    def _fail(self, text: str) -> CardError:
        return CardError(self._masked(text))

    def _url(self, name: str) -> str:
        return f"{self.endpoint}/{self.repo}/resolve/{quote(self.revision, safe='')}/{quote(name)}"

    def _get(self, name: str, rng: tuple[int, int] | None, missing_ok: bool = False) -> bytes | None:
        """The file, or `rng` = (start, length) of it; None for a missing file when `missing_ok`."""
        self._files.add(name)
        if len(self._files) > MAX_FILES:
            raise self._fail(f"{self.label}: more than {MAX_FILES} files to read; no checkpoint has that many shards")
        url = self._url(name)
        home = _origin(url)
        for _hop in range(MAX_REDIRECTS + 1):
            if time.monotonic() > self._deadline:
                raise self._fail(f"{self.label}: reading the headers took longer than {RUN_DEADLINE_S:.0f} s; "
                                 "try again, or use a mirror closer to you (HF_ENDPOINT)")
            headers = {"User-Agent": "vllm-cluster-model-card", "Accept-Encoding": "identity"}
            if rng is not None:
                headers["Range"] = f"bytes={rng[0]}-{rng[0] + rng[1] - 1}"
            if self._token and _origin(url) == home:
                headers["Authorization"] = f"Bearer {self._token}"
            answer = self._open(urllib.request.Request(url, headers=headers), name)
            try:
                status = int(answer.status)
                if _origin(url) == home and status < 400:
                    self._pin(answer.headers.get("X-Repo-Commit"))
                if status in (301, 302, 303, 307, 308):
                    url = self._next(url, answer.headers.get("Location"), name)
                    continue
                if status == 416 and rng is not None:  # the range starts past the end: the file is shorter
                    self._sizes[name] = _total(answer.headers.get("Content-Range")) or rng[0]
                    return b""
                if status in (200, 206):
                    return self._body(answer, name, rng, status)
                if status == 404 and missing_ok and answer.headers.get("X-Error-Code") in (None, "EntryNotFound"):
                    return None
                raise self._refusal(status, answer.headers.get("X-Error-Code"), name)
            finally:
                answer.close()
        raise self._fail(f"{self.label}: {name}: more than {MAX_REDIRECTS} redirects (a redirect loop?)")

    def _open(self, request: urllib.request.Request, name: str) -> Any:
        try:
            return self._opener.open(request, timeout=REQUEST_TIMEOUT_S)
        except urllib.error.HTTPError as exc:  # an answer with an error status: handled by the caller
            return exc
        except (urllib.error.URLError, OSError, ssl.SSLError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, socket.timeout | TimeoutError):
                reason = f"no answer in {REQUEST_TIMEOUT_S:.0f} s"
            raise self._fail(f"{self.label}: {name}: cannot reach {self.endpoint} ({reason}); check the address "
                             "(HF_ENDPOINT), the network or proxy (HTTPS_PROXY)") from None

    def _pin(self, commit: str | None) -> None:
        """From the first answer on, read every file at the commit the revision resolved to."""
        if self.commit is None and commit and COMMIT_RE.fullmatch(commit):
            self.commit = self.revision = commit
            self.label = f"hf://{self.repo}@{commit}"

    def _next(self, url: str, location: str | None, name: str) -> str:
        if not location:
            raise self._fail(f"{self.label}: {name}: a redirect without a Location")
        target = urljoin(url, location)
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise self._fail(f"{self.label}: {name}: redirected to a {parts.scheme or 'schemeless'}: address, not "
                             "http(s); not followed")
        return target

    def _body(self, answer: Any, name: str, rng: tuple[int, int] | None, status: int) -> bytes:
        if rng is not None and status == 206:
            start = _start(answer.headers.get("Content-Range"))
            if start != rng[0]:
                raise self._fail(f"{self.label}: {name}: asked for bytes from {rng[0]}, the answer's Content-Range "
                                 f"starts at {start}")
            total = _total(answer.headers.get("Content-Range"))
        elif rng is not None and rng[0] > 0:  # the whole file instead of the range asked for: not read
            raise self._fail(f"{self.label}: {name}: the server ignored the byte range asked for (answered "
                             f"{status}, not 206); it must serve ranged GETs as the Hub does")
        else:  # the whole file, or a server that ignored Range at offset 0: its first bytes are the ones asked for
            length = answer.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if total is not None:
            self._sizes[name] = total
        if rng is None and total is not None and total > MAX_WHOLE_FILE:
            raise self._fail(f"{self.label}: {name} is {total} bytes, more than {MAX_WHOLE_FILE // 2**20} MiB: not a "
                             "model config or safetensors index")
        expected = rng[1] if rng is not None else total if total is not None else 0
        room = self._max_bytes - self._read
        if expected > room:
            raise self._fail(f"{self.label}: {name}: reading {expected} bytes would pass {self._max_bytes} bytes read "
                             "in all; a model's config, index and headers take a few MB (a corrupt or hostile header?)")
        limit = rng[1] if rng is not None else min(MAX_WHOLE_FILE, room) + 1
        try:
            data = bytes(answer.read(limit))
        except (OSError, ValueError) as exc:
            raise self._fail(f"{self.label}: {name}: the answer broke off ({exc})") from None
        self._read += len(data)
        if rng is None and len(data) >= limit:
            raise self._fail(f"{self.label}: {name} is larger than {limit - 1} bytes (the most read whole): not a "
                             "model config or safetensors index")
        return data

    def _refusal(self, status: int, code: str | None, name: str) -> CardError:
        where = f"{self.label}: {name}"
        if code == "RevisionNotFound":
            return self._fail(f"{where}: the Hub has no revision {self.revision!r} of {self.repo} (a branch, tag or "
                              "commit of the repository; @main when none is given)")
        if code == "GatedRepo" or status == 403:
            return self._fail(f"{where}: {status}: access to {self.repo} is gated or forbidden for this token: accept "
                              f"the model's terms on its page ({DEFAULT_ENDPOINT}/{self.repo}) with the account whose "
                              "read token is in HF_TOKEN")
        if status == 401 or code in ("RepoNotFound", "RepositoryNotFound"):
            if self._token:
                return self._fail(f"{where}: {status}: the Hub refused HF_TOKEN for {self.repo}, or there is no such "
                                  "repository: check the name and that the token can read it")
            return self._fail(f"{where}: {status}: {self.repo} does not exist or is private or gated: check the name, "
                              "or set HF_TOKEN to a read token of an account that may read it")
        if status == 404:
            return self._fail(f"{where}: 404: not in the repository at this revision (an incomplete upload?)")
        if status == 429 or status >= 500:
            return self._fail(f"{where}: the Hub answered {status} (busy or down); try again later")
        return self._fail(f"{where}: the Hub answered {status}")


def _start(content_range: str | None) -> int | None:
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", content_range or "")
    return int(match.group(1)) if match else None


def _total(content_range: str | None) -> int | None:
    match = re.fullmatch(r"bytes (?:\d+-\d+|\*)/(\d+)", content_range or "")
    return int(match.group(1)) if match else None
