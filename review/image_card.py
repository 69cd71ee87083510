"""`python -m stacks image-card IMAGE`: read what an image's vLLM accepts into images/<name>.json.

The probe (checks/image_card_probe.py, standard library and the image's own vLLM) runs inside the image with
`docker run --rm -i --network none --entrypoint python3 IMAGE -` (no GPU: `VLLM_TARGET_DEVICE=cpu`), or with an
interpreter that has vLLM installed (`--python PATH`, a host or a venv). Its JSON gets an `image` section (the
reference and the digests it describes) and is written where the planner looks for cards.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacks.model.config import parse_image_ref
from stacks.planner.image_capabilities import canonical_ref
from stacks.planner.image_cards import CARDS, PROBE, card_file_name, parse_card


class CardError(Exception):
    """The card could not be taken; the message says why and what to do."""


@dataclass(frozen=True)
class Taken:
    path: Path
    card: dict[str, Any]


def _run(command: list[str], probe: str, timeout_s: int, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, input=probe, capture_output=True, text=True, timeout=timeout_s, env=env)
    except FileNotFoundError as exc:
        raise CardError(f"{command[0]} is not installed or not executable here ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise CardError(f"the probe did not finish in {timeout_s}s: {' '.join(command[:6])} …; raise --timeout") \
            from None


def _digests(image: str, timeout_s: int) -> list[str]:
    """The registry digests Docker knows for the image (none for an image built or imported locally)."""
    out = _run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image], "", timeout_s)
    if out.returncode != 0:
        return []
    try:
        found = json.loads(out.stdout or "[]") or []
    except json.JSONDecodeError:
        return []
    return sorted({str(d).split("@", 1)[1] for d in found if "@" in str(d)})


def take_card(image: str, python: str | None = None, out_dir: Path = CARDS, timeout_s: int = 600) -> Taken:
    """Run the probe for `image` (in it, or with `python`) and write its card; CardError on any failure."""
    try:
        parts = parse_image_ref(image)
    except Exception as exc:  # pydantic's PydanticCustomError: the stack file's own image rule
        raise CardError(f"{exc}; write it as repository:tag (optionally @sha256:<digest>), e.g. "
                        "vllm/vllm-openai:v0.33.0") from None
    if not parts.get("repository") or not parts.get("tag"):
        raise CardError(f"image {image!r}: write it as repository:tag (optionally @sha256:<digest>), e.g. "
                        "vllm/vllm-openai:v0.33.0")
    repo_tag = canonical_ref(f"{parts['repository']}:{parts['tag']}")
    pinned = [str(parts["digest"])] if parts.get("digest") else []
    probe = PROBE.read_text()
    if python is not None:
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        done = _run([python, "-"], probe, timeout_s, env)
        taken_with = f"python -m stacks image-card {image} --python {python} (VLLM_TARGET_DEVICE=cpu)"
        digests = pinned
    else:
        done = _run(["docker", "run", "--rm", "-i", "--network", "none", "-e", "VLLM_TARGET_DEVICE=cpu",
                     "--entrypoint", "python3", image, "-"], probe, timeout_s)
        taken_with = f"python -m stacks image-card {image} (docker run --network none, VLLM_TARGET_DEVICE=cpu)"
        digests = sorted({*_digests(image, 60), *pinned})
    try:
        card = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise CardError(f"the probe printed no card (exit {done.returncode}): {' | '.join(tail)[:600]}; is vLLM "
                        "importable there? (`python3 -c 'import vllm'` in the image)") from None
    if not isinstance(card, dict) or not card.get("options"):
        errors = card.get("errors") if isinstance(card, dict) else None
        raise CardError(f"the probe found no `vllm serve` options: {json.dumps(errors)[:600] if errors else 'no vLLM'}")
    card.pop("vllm_path", None)  # where the interpreter keeps vLLM: says nothing about the image
    card.pop("tracebacks", None)
    document = {"image": {"refs": [repo_tag], "digests": digests, "taken_with": taken_with}, **card}
    name = card_file_name(repo_tag)
    parse_card(name, document)  # what the planner will read back
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return Taken(path, document)


def summary(taken: Taken) -> str:
    card = taken.card
    errors = card.get("errors") or {}
    line = (f"wrote {taken.path}: vLLM {card.get('vllm_version')}, {len(card.get('options') or [])} serve options, "
            f"{len(card.get('config_classes') or {})} config classes, {len(card.get('routes') or [])} routes; "
            f"describes {', '.join(card['image']['refs'])}"
            f"{' at ' + ', '.join(card['image']['digests']) if card['image']['digests'] else ' (no digest)'}")
    if errors:
        line += "\nsections the probe could not read (left out of the card): " + "; ".join(
            f"{k}: {str(v)[:160]}" for k, v in sorted(errors.items()))
    return line
