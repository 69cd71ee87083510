"""Rollback to a prior image: read `pulumi stack history --json`, pick the image, rewrite the stack file.

Rollback in Pulumi is "put the old config back and `pulumi up`": the image lives in `Pulumi.<stack>.yaml`,
so this rewrites only that value (ruamel round-trip: comments, order and quoting stay) and prints the
commands to run. It never runs `pulumi up` itself: the preview is the review step.

What the history looks like comes from the Pulumi CLI (pulumi/pulumi `pkg/cmd/pulumi/stack/stack_history.go`):
`--page-size` defaults to 10 and `--page` to 1, so one call returns ten updates; the JSON is a list of
`updateInfoJSON` {version, kind, startTime, message, environment, config, result, endTime, resourceChanges},
and each config value is `configValueJSON` {value (string), objectValue (the parsed JSON of an object value),
secret} with `value` left out for secrets. Nothing in it names the stack (`environment` holds git, VCS and CLI
facts), so a history file is matched to the stack by the nodes its updates recorded (see `check_same_stack`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from stacks.model.config import ImageConfig
from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config
from stacks.model.project import STACKS
from stacks.model.stack_file import parse_stack_text
from stacks.planner.image_capabilities import canonical_ref, get_capabilities
from stacks.planner.managed_options import NO_CARD
from stacks.planner.plan import build_plan

PROJECT = "vllm-cluster"
IMAGE_KEY = f"{PROJECT}:image"
NODES_KEY = f"{PROJECT}:nodes"
PAGE_SIZE = 100
"""Updates asked for per `pulumi stack history` call; pages are read until one comes back empty."""
MAX_PAGES = 200
"""Bound on the calls (20 000 updates at the default page size): a CLI that ignored `--page` would loop."""


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
        where = f"update {self.version}" if self.version else "the update"
        commit = f", commit {self.commit[:12]}" if self.commit else ""
        message = f": {self.message.strip().splitlines()[0]!r}" if self.message.strip() else ""
        return f"{where} of {self.started}{commit}{message}"


@dataclass(frozen=True)
class History:
    """The updates, newest first, and where they came from (printed with the result)."""

    updates: list[dict[str, Any]]
    source: str
    from_cli: bool
    complete: bool = True


def config_value(entry: Any) -> Any:
    """A history config value as data: `objectValue` where the CLI gave one, else `value` (JSON when it parses
    as an object or list: older CLIs and hand-made files carry only the string). None for secrets."""
    if not isinstance(entry, dict) or entry.get("secret") or ("value" not in entry and "objectValue" not in entry):
        return None
    if entry.get("objectValue") is not None:
        return entry["objectValue"]
    raw = entry.get("value")
    if isinstance(raw, str) and raw[:1] in "{[":
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def image_from_history_value(entry: Any) -> ImageConfig | None:
    value = config_value(entry)
    if value is None:
        return None
    try:
        return ImageConfig.model_validate(value)
    except (ValueError, ValidationError):
        return None


def _config(update: dict[str, Any]) -> dict[str, Any]:
    config = update.get("config")
    return config if isinstance(config, dict) else {}


def _newest_first(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By start time, then version: the diy backend may leave `version` at 0; both backends list newest first."""
    return sorted(updates, key=lambda u: (str(u.get("startTime") or ""), int(u.get("version") or 0)), reverse=True)


def past_images(history: list[dict[str, Any]]) -> list[PastImage]:
    """Successful updates that recorded an image, newest first (failed updates, refreshes, destroys skipped)."""
    found = []
    for update in _newest_first([u for u in history if isinstance(u, dict)]):
        if update.get("kind") != "update" or update.get("result") != "succeeded":
            continue
        image = image_from_history_value(_config(update).get(IMAGE_KEY))
        if image is None:
            continue
        environment = update.get("environment") or {}
        found.append(PastImage(update.get("version"), str(update.get("startTime", "?")),
                               str(update.get("message") or ""), environment.get("git.head"), image))
    return found


# --- which stack a history belongs to ------------------------------------------------------------------------


def node_identity(nodes: Any) -> set[str]:
    """The addresses that make a stack's machines: every node's SSH host and management IP."""
    found: set[str] = set()
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict):
            continue
        ssh = node.get("ssh")
        if isinstance(ssh, dict) and ssh.get("host"):
            found.add(str(ssh["host"]))
        if node.get("management_ip"):
            found.add(str(node["management_ip"]))
    return found


def check_same_stack(history: History, stack: str, stack_values: dict[str, Any], file_name: str) -> str:
    """Refuse a history that is not this stack's; return the evidence line printed with the result.

    `pulumi stack history --json` does not name its stack, and the history of `staging` parses as well as
    that of `prod`. Every update records the stack's whole config, so the newest update that recorded
    `vllm-cluster:nodes` must share an SSH host or management IP with the stack file's nodes. Two stacks
    on the same machines cannot be told apart this way (docs/rollback.md).
    """
    if history.from_cli:
        return f"read from {history.source}"
    ours = node_identity(stack_values.get("nodes"))
    if not any(str(key).startswith(f"{PROJECT}:") for u in history.updates for key in _config(u)):
        raise RollbackError(f"{history.source} records no {PROJECT}:* config: it is not the history of a "
                            f"{PROJECT} stack. Run `pulumi stack history --json -s {stack}` in this project")
    for update in _newest_first(history.updates):
        theirs = node_identity(config_value(_config(update).get(NODES_KEY)))
        if not theirs:
            continue
        when = f"update {update.get('version')}" if update.get("version") else "the update"
        when += f" of {update.get('startTime', '?')}"
        if theirs & ours:
            return (f"read from {history.source}; matched to stack {stack} by its newest update with nodes "
                    f"({when}: {', '.join(sorted(theirs & ours))})")
        raise RollbackError(
            f"{history.source} is not the history of stack {stack}: its newest update with nodes ({when}) ran "
            f"on {', '.join(sorted(theirs))}, and {file_name} has {', '.join(sorted(ours)) or 'no nodes'}. "
            f"Pulumi's history JSON does not name its stack; write this stack's: `pulumi stack history --json "
            f"-s {stack} --page-size 10000 > history.json` (one page that holds every update), or run rollback "
            "where the pulumi CLI is and leave out --history")
    raise RollbackError(
        f"{history.source} has no update that recorded {NODES_KEY}, so nothing ties it to stack {stack}. "
        "Run rollback where the pulumi CLI is and leave out --history (it reads this stack's own history)")


# --- reading the history ------------------------------------------------------------------------------------


def read_pages(fetch: Callable[[int], str], page_size: int = PAGE_SIZE,
               max_pages: int = MAX_PAGES) -> tuple[list[dict[str, Any]], int, bool]:
    """Every page, from 1 until one comes back empty: (updates, pages that held updates, complete).

    A short page is not taken as the end (a service may cap the page size); a page equal to the one before
    means the CLI ignored `--page` (it would repeat forever), which is an error.
    """
    updates: list[dict[str, Any]] = []
    previous: list[Any] | None = None
    for page in range(1, max_pages + 1):
        items = _parse_list(fetch(page), f"page {page} of `pulumi stack history --json`")
        if not items:
            return updates, page - 1, True
        if items == previous:
            raise RollbackError(f"`pulumi stack history` returned the same updates for page {page - 1} and {page}: "
                                "this CLI ignores --page; upgrade the Pulumi CLI, or pass --history with the full "
                                "history")
        updates += items
        previous = items
    return updates, max_pages, False


def _parse_list(text: str, what: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise RollbackError(f"{what} is not JSON ({reason}); expected `pulumi stack history --json`") from None
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise RollbackError(f"{what} must be a JSON list of updates, as `pulumi stack history --json` prints")
    for index, update in enumerate(data):
        for key, kind, word in (("version", int, "a number"), ("kind", str, "a string"), ("result", str, "a string"),
                                ("startTime", str, "a string"), ("message", str, "a string"),
                                ("config", dict, "an object"), ("environment", dict, "an object")):
            if update.get(key) is not None and (not isinstance(update[key], kind) or isinstance(update[key], bool)):
                raise RollbackError(f"{what}: update {index} has `{key}` = {str(update[key])[:40]!r}, not {word}: "
                                    "not `pulumi stack history --json` output")
    return data


def read_history(stack: str, history_file: str | None, cwd: Path, page_size: int = PAGE_SIZE) -> History:
    """From a file (`pulumi stack history --json > f`, every page), or from the Pulumi CLI, page by page."""
    if history_file:
        try:
            text = Path(history_file).read_text() if history_file != "-" else sys.stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise RollbackError(f"cannot read the history file: {exc}") from None
        name = "stdin" if history_file == "-" else f"file {history_file}"
        return History(_parse_list(text, f"the history {name}"), name, from_cli=False)
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise RollbackError("the pulumi CLI is not on PATH: run rollback where it is, or there run `pulumi stack "
                            f"history --json -s {stack} --page-size 10000 > history.json` (one page that holds "
                            "every update: the default page is 10) and pass --history history.json")

    def fetch(page: int) -> str:
        argv = [pulumi, "stack", "history", "--json", "-s", stack, "--page-size", str(page_size), "--page",
                str(page)]
        try:
            done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise RollbackError(f"`{' '.join(argv[1:])}` did not answer in 120 s") from None
        if done.returncode != 0:
            raise RollbackError(f"`pulumi {' '.join(argv[1:])}` failed: {done.stderr.strip()[:400]}")
        return done.stdout

    updates, pages, complete = read_pages(fetch, page_size)
    source = f"`pulumi stack history --json -s {stack}` ({len(updates)} updates in {pages} page(s) of {page_size})"
    return History(updates, source, from_cli=True, complete=complete)


# --- choosing the target ------------------------------------------------------------------------------------


def _distinct(history: list[PastImage]) -> dict[str, PastImage]:
    """pull_ref -> the newest successful update that ran it."""
    newest: dict[str, PastImage] = {}
    for past in history:
        newest.setdefault(past.image.pull_ref, past)
    return newest


def _matches(images: dict[str, PastImage], to: str) -> tuple[list[str], str]:
    if to.startswith("sha256:"):
        return [ref for ref, p in images.items() if p.image.digest and p.image.digest.startswith(to)], f"digest {to}…"
    exact = [ref for ref, p in images.items() if to in (p.image.tag, p.image.ref, p.image.pull_ref)]
    if exact:
        return exact, f"tag {to}"
    return ([ref for ref, p in images.items()
             if p.image.tag.startswith(to) or p.image.ref.startswith(to) or ref.startswith(to)], f"tag {to}…")


def choose(history: list[PastImage], current: ImageConfig, to: str = "previous") -> PastImage:
    """`previous`: the newest successful update that ran another image. Otherwise a tag, `repo:tag`, or a unique
    prefix of one, or `sha256:` and a prefix of a digest: the newest successful update that ran the one image
    it names; several images matching is an error that lists them."""
    images = _distinct(history)
    if to == "previous":
        others = [ref for ref in images if ref != current.pull_ref]
        if not others:
            raise RollbackError(_none_found(images, f"an image other than {current.pull_ref}"))
        return images[others[0]]
    if not to.strip() or to == "sha256:":
        raise RollbackError(f"--to {to!r} names nothing: give previous, a tag (or its start), or sha256:<digest start>")
    matched, wanted = _matches(images, to)
    others = [ref for ref in matched if ref != current.pull_ref]
    if not others:
        if matched:
            raise RollbackError(f"the stack file already has {current.pull_ref}, the only image matching {wanted}; "
                                "nothing to roll back")
        raise RollbackError(_none_found(images, wanted))
    if len(others) > 1:
        listed = "; ".join(f"{ref} (last served by {images[ref].describe()})" for ref in others)
        raise RollbackError(f"--to {to} matches {len(others)} images this stack ran: {listed}. Give more of the "
                            "tag, or --to sha256:<digest start> for one of them")
    return images[others[0]]


def _none_found(images: dict[str, PastImage], wanted: str) -> str:
    seen = list(images)
    return (f"no successful update in the stack's history ran {wanted}; images it ran, newest first: "
            + (", ".join(seen[:8]) if seen else "none (no successful update recorded an image)")
            + ". Rollback only goes to an image this stack has served; for a new one edit image in the stack file")


# --- the whole decision, before anything is written ----------------------------------------------------------


@dataclass(frozen=True)
class RollbackPlan:
    current: ImageConfig
    target: PastImage
    provenance: str
    capability: str
    warnings: list[str]
    new_text: str
    complete: bool


def prepare(stack: str, text: str, file_name: str, history: History, to: str) -> RollbackPlan:
    """Match the history to the stack, choose the image, and validate the stack file's config with it.

    The validation is the whole plan (`build_plan`): the image's capability entry
    (stacks/planner/image_capabilities.py) against this topology, model and parsers, and every general rule. A
    refusal leaves the file alone.
    """
    try:
        values = parse_stack_text(text, file_name).values
        current = ImageConfig.model_validate(values["image"])
    except (ConfigError, KeyError, ValidationError) as exc:
        raise RollbackError(f"{file_name} has no valid {IMAGE_KEY} ({type(exc).__name__}: {str(exc)[:200]}); "
                            f"`{STACKS} plan {stack}` shows the problem") from None
    provenance = check_same_stack(history, stack, values, file_name)
    target = choose(past_images(history.updates), current, to)
    try:
        plan = build_plan(stack, parse_config(stack, {**values, "image": target.image.model_dump()}))
    except ConfigError as exc:
        raise RollbackError(f"the current config with {target.image.pull_ref} is refused, so {file_name} was not "
                            f"changed:\n{exc.report()}") from None
    caps = get_capabilities(target.image.ref)
    carded = plan.image.get("card")
    if caps is None and carded:
        capability = (f"image card {carded} accepts this topology ({plan.topology.get('label')}), model "
                      f"{plan.model.get('profile')} and the flags")
    elif caps is None:
        capability = (f"WARNING: {target.image.ref} is not a known image (no image card): only the "
                      "general rules were checked; the argument dry run in `pulumi up` is the next line of defence "
                      f"(a card: {STACKS} image-card {target.image.ref})")
    else:
        capability = (f"capability entry {target.image.ref} (vLLM {caps.vllm_version}) accepts this topology "
                      f"({plan.topology.get('label')}), model {plan.model.get('profile')} and parsers")
    try:
        before = set(build_plan(stack, parse_config(stack, values)).warnings)
    except ConfigError:
        before = set()
    warnings = [w for w in plan.warnings  # the no-card warnings say what `capability` already says, once
                if w not in before and "is not a known image" not in w and not w.startswith(NO_CARD)]
    if canonical_ref(target.image.repository) != canonical_ref(current.repository):
        warnings.insert(0, f"the repository changes: {current.repository} -> {target.image.repository} (this stack "
                           "ran it before, per the history); check that this is the registry you mean")
    return RollbackPlan(current, target, provenance, capability, warnings, rewrite_image(text, target.image),
                        history.complete)


# --- the stack file -----------------------------------------------------------------------------------------


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
