"""Where `model-card` reads a model's files from: a local directory or an S3 prefix (and the Hub, review/hf_source.py),
file by file and by byte range, with the errors every source raises (exit 2)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from review.loader_rules import link_problem
from stacks.model.s3_source import CannotRun, check_endpoint, mask_source, parse_source


class CardError(Exception):
    """Bad input: the file, the key and what was wrong (exit 2)."""


# ------------------------------------------------------------------------------------------------ sources


class Source:
    """A local directory, an S3 prefix or a Hub repository, read file by file."""

    label: str

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        raise NotImplementedError

    def read_range(self, name: str, start: int, length: int) -> bytes:
        raise NotImplementedError

    def size(self, name: str) -> int | None:
        """The file's size in bytes when the source knows it (the card records each shard's)."""
        return None


class LocalSource(Source):
    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise CardError(f"{root}: not a directory (SRC is a local model directory, s3://bucket/prefix or "
                            "hf://ORG/NAME[@REVISION])")
        self.root = root
        self.label = str(root)

    def _file(self, name: str) -> Path:
        """The file, or CardError for a link that leaves the folder (review/loader_rules.py says which)."""
        problem = link_problem(self.root, name)
        if problem:
            raise CardError(problem)
        return self.root / name

    def exists(self, name: str) -> bool:
        """A regular file (through links inside the folder); something else of that name is refused by name:
        a FIFO would block the read, a directory is no checkpoint."""
        path = self._file(name)
        if path.exists() and not path.is_file():
            kind = "directory" if path.is_dir() else "FIFO" if stat.S_ISFIFO(path.stat().st_mode) else \
                "device or socket"
            raise CardError(f"{path}: is a {kind}, not a file; the model folder needs {name} as a regular file")
        return path.is_file()

    def read(self, name: str) -> bytes:
        try:
            return self._file(name).read_bytes()
        except OSError as exc:
            raise CardError(f"{self.root / name}: {exc.strerror or exc}") from exc

    def read_range(self, name: str, start: int, length: int) -> bytes:
        try:
            with self._file(name).open("rb") as handle:
                handle.seek(start)
                return handle.read(length)
        except OSError as exc:
            raise CardError(f"{self.root / name}: {exc.strerror or exc}") from exc

    def size(self, name: str) -> int | None:
        return self._file(name).stat().st_size


def _as_model_card(text: str) -> str:
    """The weights sync's texts name its `--source` option; model-card takes the URL as its SRC argument."""
    return text.replace("--source", "SRC")


class S3Source(Source):
    """The weights sync's source rule (stacks/model/s3_source.py), client and error texts (checks/weights.py)."""

    def __init__(self, url: str, endpoint_url: str | None, region: str | None) -> None:
        from checks import weights

        try:
            bucket, prefix = parse_source(url)
            endpoint = check_endpoint(endpoint_url) if endpoint_url else None
        except CannotRun as exc:
            raise CardError(_as_model_card(str(exc))) from exc
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.opts = weights.Options(url, bucket, prefix, "/nonexistent", endpoint, region,
                                    "path" if endpoint else "virtual", 2, 8 * 1024 * 1024, False, False, True,
                                    None, 0, "model-card")
        self._weights = weights
        try:
            self.client = weights.make_client(self.opts)
            self.keys = {e.key: e.size for e in weights.list_prefix(self.client, self.opts)}
        except CannotRun as exc:
            raise CardError(_as_model_card(str(exc))) from exc
        self.label = mask_source(url)

    def exists(self, name: str) -> bool:
        return name in self.keys

    def _get(self, name: str, extra: dict[str, str]) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

        try:
            reply = self.client.get_object(Bucket=self.opts.bucket, Key=self.opts.prefix + name, **extra)
            return bytes(reply["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise CardError(_as_model_card(self._weights.explain(exc, self.opts, self.client, name))) from exc

    def read(self, name: str) -> bytes:
        return self._get(name, {})

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self._get(name, {"Range": f"bytes={start}-{start + length - 1}"})

    def size(self, name: str) -> int | None:
        return self.keys.get(name)
