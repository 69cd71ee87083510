"""Rollback to a prior image: read `pulumi stack history --json`, pick the image, rewrite the stack file.

Rollback in Pulumi is "put the old config back and `pulumi up`": the image lives in `Pulumi.<stack>.yaml`,
so this rewrites only that value (ruamel round-trip: comments, order and quoting stay) and prints the
commands to run. It never runs `pulumi up` itself: the preview is the review step.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from stacks.config import ImageConfig

IMAGE_KEY = "vllm-cluster:image"


class RollbackError(Exception):
    """What went wrong and what to do instead; the CLI prints it and exits 2."""


@dataclass(frozen=True)
class PastImage:
    """An image a successful `pulumi up` of this stack ran."""

    version: int | None
    started: str
    message: str
    commit: str | None
    image: ImageConfig

    def describe(self) -> str:
        where = f"update {self.version}" if self.version is not None else "an update"
        commit = f", commit {self.commit[:12]}" if self.commit else ""
        message = f": {self.message.strip().splitlines()[0]!r}" if self.message.strip() else ""
        return f"{where} of {self.started}{commit}{message}"


def image_from_history_value(entry: dict[str, Any]) -> ImageConfig | None:
    """A history config value: `{"value": "<json or string>", "secret": false, "object": true|false}`."""
    if entry.get("secret") or "value" not in entry:
        return None
    raw = entry["value"]
    try:
        value = json.loads(raw) if isinstance(raw, str) and (entry.get("object") or raw.startswith("{")) else raw
        return ImageConfig.model_validate(value)
    except (ValueError, ValidationError):
        return None


def past_images(history: list[dict[str, Any]]) -> list[PastImage]:
    """Successful updates that recorded an image, newest first (the CLI prints newest first; sort anyway)."""
    found = []
    for update in history:
        if update.get("kind") != "update" or update.get("result") != "succeeded":
            continue
        image = image_from_history_value((update.get("config") or {}).get(IMAGE_KEY) or {})
        if image is None:
            continue
        environment = update.get("environment") or {}
        found.append(PastImage(update.get("version"), str(update.get("startTime", "?")),
                               str(update.get("message") or ""), environment.get("git.head"), image))
    return sorted(found, key=lambda p: (p.version is not None, p.version or 0, p.started), reverse=True)


def choose(history: list[PastImage], current: ImageConfig, to: str = "previous") -> PastImage:
    """`previous`: the newest successful update that ran another image; a tag or `sha256:` digest: the newest
    successful update that ran it."""
    if to == "previous":
        candidates = [p for p in history if p.image.pull_ref != current.pull_ref]
        wanted = f"an image other than {current.pull_ref}"
    elif to.startswith("sha256:"):
        candidates = [p for p in history if p.image.digest == to]
        wanted = f"digest {to}"
    else:
        candidates = [p for p in history if p.image.tag == to or p.image.pull_ref == to or p.image.ref == to]
        wanted = f"tag {to}"
    if not candidates:
        seen = list(dict.fromkeys(p.image.pull_ref for p in history))
        raise RollbackError(
            f"no successful update in the stack's history ran {wanted}; images it ran, newest first: "
            + (", ".join(seen[:8]) if seen else "none (no successful update recorded an image)")
            + ". Rollback only goes to an image this stack has served; for a new one edit image in the stack file")
    target = candidates[0]
    if target.image.pull_ref == current.pull_ref:
        raise RollbackError(f"the stack file already has {current.pull_ref}; nothing to roll back")
    return target


def read_history(stack: str, history_file: str | None, cwd: Path) -> list[dict[str, Any]]:
    """From a file (`pulumi stack history --json > f`), or from the Pulumi CLI itself."""
    if history_file:
        try:
            text = Path(history_file).read_text() if history_file != "-" else sys.stdin.read()
        except OSError as exc:
            raise RollbackError(f"cannot read the history file: {exc}") from None
    else:
        pulumi = shutil.which("pulumi")
        if pulumi is None:
            raise RollbackError("the pulumi CLI is not on PATH: run `pulumi stack history --json -s "
                                f"{stack} > history.json` where it is, then pass --history history.json")
        done = subprocess.run([pulumi, "stack", "history", "--json", "-s", stack], cwd=cwd, capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise RollbackError(f"`pulumi stack history --json -s {stack}` failed: {done.stderr.strip()[:400]}")
        text = done.stdout
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RollbackError(f"the history is not JSON ({exc}); expected `pulumi stack history --json`") from None
    if not isinstance(data, list):
        raise RollbackError("the history must be a JSON list of updates, as `pulumi stack history --json` prints")
    return data


def current_image(document_text: str) -> ImageConfig:
    value = YAML(typ="safe").load(document_text)["config"][IMAGE_KEY]
    return ImageConfig.model_validate(value)


def rewrite_image(document_text: str, image: ImageConfig) -> str:
    """The stack file with only the image changed; comments, key order and the file's layout stay."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = yaml.load(document_text)
    config = doc["config"]
    node = config[IMAGE_KEY]
    if isinstance(node, CommentedMap):
        node["repository"] = image.repository
        node["tag"] = image.tag
        if image.digest:
            if "digest" in node:
                node["digest"] = image.digest
            else:
                node.insert(list(node).index("tag") + 1, "digest", image.digest)
        elif "digest" in node:
            del node["digest"]
    else:
        config[IMAGE_KEY] = image.pull_ref
    out = StringIO()
    yaml.dump(doc, out)
    return out.getvalue()
