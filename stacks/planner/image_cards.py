"""Image cards: what one engine image's vLLM accepts, read from the image itself, as data in `images/`.

A card is the JSON document `checks/image_card_probe.py` prints inside an image (or with an interpreter that has
vLLM installed), plus an `image` section that `python -m stacks image-card` adds: the image references
(`repo:tag`) and digests the card describes. Every `vllm serve` option (aliases, type, nargs, choices, default,
deprecation, bounds), the fields of the config classes behind JSON-valued options, the API routes and the parser
registries are in it. The planner reads argv against the card of the stack's image and checks every value
offline; an image without a card is named in a warning, never passed in silence.

Matching: a card matches a stack's image when the image's digest is one of the card's digests, or when its
`repo:tag` (Docker Hub's implied host and `library/` dropped) is one of the card's references and the card
either records no digest or records the one the stack pins. A tag card whose digest differs from the stack's
pinned digest does not match: the tag was re-pushed, and the card describes another build.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from stacks.model.project import STACKS, project_root, same_file, shipped
from stacks.planner.image_capabilities import canonical_ref

CARDS = shipped("images")
"""The shipped cards, one JSON file per image (`python -m stacks image-card IMAGE` writes them in this checkout)."""

PROBE = Path(__file__).resolve().parents[2] / "checks" / "image_card_probe.py"
MODEL_CLASSES = PROBE.with_name("model_classes.py")
"""Sent in front of the probe: it reads which class serves an architecture on CUDA from vLLM's source."""


@dataclass(frozen=True, eq=False)
class ImageCard:
    """One card; compared by identity (its JSON is large), so it can key a cache."""


    name: str
    """The file's stem, e.g. `vllm_vllm-openai_v0.33.0`."""
    refs: tuple[str, ...]
    digests: tuple[str, ...]
    vllm_version: str
    taken_with: str
    raw: dict[str, Any]

    @property
    def path(self) -> str:
        return f"images/{self.name}.json"

    def config_class(self, name: str) -> dict[str, Any] | None:
        found = self.raw.get("config_classes", {}).get(name)
        return found if isinstance(found, dict) else None


def card_file_name(ref: str) -> str:
    """`vllm/vllm-openai:v0.33.0` -> `vllm_vllm-openai_v0.33.0` (the digest is not part of the name)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref.split("@", 1)[0]).strip("_") or "image"


def _canonical(ref: str) -> str:
    """`repo:tag` as Docker resolves it, without a digest."""
    return canonical_ref(ref.split("@", 1)[0])


def parse_card(name: str, raw: dict[str, Any]) -> ImageCard:
    """A card from its JSON; ValueError naming what is missing when it is not one."""
    image = raw.get("image")
    if not isinstance(image, dict):
        raise ValueError(f"images/{name}.json has no `image` section (refs, digests): write it with "
                         f"`{STACKS} image-card`")
    if not isinstance(raw.get("options"), list) or not raw.get("vllm_version"):
        raise ValueError(f"images/{name}.json has no option list or vLLM version: not an image card")
    return ImageCard(name=name, refs=tuple(_canonical(r) for r in image.get("refs") or []),
                     digests=tuple(image.get("digests") or []), vllm_version=str(raw["vllm_version"]),
                     taken_with=str(image.get("taken_with", "")), raw=raw)


def user_cards() -> Path:
    """The project's own `images/` (stacks/project.py): cards the user took, beside the shipped ones."""
    return project_root() / "images"


@cache
def cards_in(shipped_dir: str, user_dir: str | None) -> tuple[ImageCard, ...]:
    """The shipped cards and the project's, by file name; a project card of a shipped card's name replaces it
    (`shadowed_cards` names it in every plan)."""
    files = {p.name: p for p in Path(shipped_dir).glob("*.json")} if Path(shipped_dir).is_dir() else {}
    if user_dir is not None and Path(user_dir).is_dir():
        files |= {p.name: p for p in Path(user_dir).glob("*.json")}
    return tuple(parse_card(p.stem, json.loads(p.read_text())) for _, p in sorted(files.items()))


def all_cards() -> tuple[ImageCard, ...]:
    """Every card a plan reads: the shipped ones and the project's `images/`."""
    return cards_in(str(CARDS), str(user_cards()))


def shadowed_cards() -> list[tuple[Path, Path]]:
    """(the project's card, the shipped card) for each project card that hides a shipped one of the same name."""
    mine = user_cards()
    if not mine.is_dir():
        return []
    return [(p, CARDS / p.name) for p in sorted(mine.glob("*.json"))
            if (CARDS / p.name).is_file() and not same_file(p, CARDS / p.name)]


def card_for(repo_tag: str, digest: str | None) -> tuple[ImageCard | None, str | None]:
    """The card of an image, or None and why none matched (a tag card of another digest is named)."""
    wanted = _canonical(repo_tag)
    other_digest: ImageCard | None = None
    for card in all_cards():
        if digest is not None and digest in card.digests:
            return card, None
    for card in all_cards():
        if wanted in card.refs:
            if digest is None or not card.digests:
                return card, None
            other_digest = card
    if other_digest is not None:
        return None, (f"{other_digest.path} describes {wanted} at {', '.join(other_digest.digests)}, not the "
                      f"pinned {digest}")
    return None, None


@cache
def card_of_version(version: str) -> ImageCard:
    """The card of a vLLM release (the first card with that version), e.g. "0.33.0": what the policy pack and
    the stand-in-free readers use when they read argv without a stack. The shipped cards come first: a project's
    card of the same release does not change what the tables say."""
    for card in (*cards_in(str(CARDS), None), *all_cards()):
        if card.vllm_version == version:
            return card
    raise KeyError(f"no image card in images/ for vLLM {version}")
