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
from stacks.model.masking import has_userinfo, mask_secrets
from stacks.planner.image_capabilities import canonical_ref
from stacks.planner.image_cards import CARDS, MODEL_CLASSES, PROBE, card_file_name, parse_card


class CardError(Exception):
    """The card could not be taken; the message says why and what to do."""


@dataclass(frozen=True)
class Taken:
    path: Path
    card: dict[str, Any]


def _run(command: list[str], probe: str, timeout_s: int, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    try:  # bytes a program prints that are not UTF-8 are replaced: garbage is refused below, never a crash
        return subprocess.run(command, input=probe, capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=timeout_s, env=env)
    except FileNotFoundError as exc:
        raise CardError(f"{command[0]} is not installed or not executable here ({exc.strerror})") from None
    except OSError as exc:  # a directory, a file without the execute bit, a file that is no program (ENOEXEC)
        raise CardError(f"{command[0]} cannot be run ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise CardError(f"the probe did not finish in {timeout_s}s: {' '.join(command[:6])} …; raise --timeout") \
            from None


def _interpreter(python: str) -> str:
    """`--python PATH` as a program to run, or CardError naming it: a directory or a file without the execute bit
    would fail inside subprocess with a bare errno."""
    where = Path(python)
    if where.is_dir():
        raise CardError(f"--python {python!r} is a directory; give the interpreter in it, e.g. "
                        f"{where / 'bin' / 'python'}")
    if not where.exists():
        raise CardError(f"--python {python!r} is not installed here (no such file); give the path of a "
                        "python that can `import vllm`, e.g. /opt/vllm/venv/bin/python")
    if not os.access(where, os.X_OK):
        raise CardError(f"--python {python!r} is not executable; give the path of a python that can "
                        "`import vllm`")
    return python


def _no_card(done: subprocess.CompletedProcess[str], python: str | None, why: str) -> CardError:
    """The probe's output is no card: who ran it (the path of --python), how it ended and its last lines."""
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[:600]
    ended = (f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}")
    who = (f"--python {python!r} ({ended}) is not a python that runs the probe" if python is not None
           else f"the probe ({ended})")
    return CardError(f"{who}: {why}{': ' + tail if tail else ''}; is vLLM importable there? "
                     f"(`{python or 'python3'} -c 'import vllm'`{'' if python else ' in the image'})")


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
    if has_userinfo(image):  # never handed to docker, never echoed: Docker's reference grammar has no userinfo
        raise CardError(f"the reference {mask_secrets(image)!r} carries credentials (user:password@), which no "
                        "image reference holds (docker: invalid reference format); remove them and log in to the "
                        "registry first: docker login REGISTRY")
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
    probe = MODEL_CLASSES.read_text() + "\n" + PROBE.read_text()  # the probe calls model_classes' reader
    if python is not None:
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        done = _run([_interpreter(python), "-"], probe, timeout_s, env)
        taken_with = f"python -m stacks image-card {image} --python {python} (VLLM_TARGET_DEVICE=cpu)"
        digests = pinned
    else:
        done = _run(["docker", "run", "--rm", "-i", "--network", "none", "-e", "VLLM_TARGET_DEVICE=cpu",
                     "--entrypoint", "python3", image, "-"], probe, timeout_s)
        taken_with = f"python -m stacks image-card {image} (docker run --network none, VLLM_TARGET_DEVICE=cpu)"
        digests = sorted({*_digests(image, 60), *pinned})
    try:
        card = json.loads(done.stdout)
    except (json.JSONDecodeError, RecursionError):
        raise _no_card(done, python, "it printed no card") from None
    if not isinstance(card, dict):
        raise _no_card(done, python, f"it printed JSON that is not a card (a {type(card).__name__})")
    if done.returncode != 0:
        raise _no_card(done, python, "it printed a card but did not finish")
    if not card.get("options"):
        errors = card.get("errors")
        raise CardError(f"the probe found no `vllm serve` options{' with --python ' + repr(python) if python else ''}"
                        f": {json.dumps(errors)[:600] if errors else 'no vLLM'}")
    try:
        _check_shape(card)
    except ValueError as exc:
        raise _no_card(done, python, str(exc)) from None
    card.pop("vllm_path", None)  # where the interpreter keeps vLLM: says nothing about the image
    card.pop("tracebacks", None)
    document = {"image": {"refs": [repo_tag], "digests": digests, "taken_with": taken_with}, **card}
    name = card_file_name(repo_tag)
    try:
        parse_card(name, document)  # what the planner will read back
    except ValueError as exc:
        raise _no_card(done, python, str(exc)) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return Taken(path, document)


def _check_shape(card: dict[str, Any]) -> None:
    """ValueError unless the card has the shape the planner reads: a list of option objects with their option
    strings, a version string, mappings where mappings go."""
    options = card.get("options")
    if not isinstance(options, list) or not all(
            isinstance(o, dict) and isinstance(o.get("all_option_strings"), list)
            and all(isinstance(s, str) for s in o["all_option_strings"]) for o in options):
        raise ValueError("its `options` is not a list of options with `all_option_strings`")
    if not isinstance(card.get("vllm_version"), str) or not card["vllm_version"].strip():
        raise ValueError("it names no vLLM version")
    for key in ("errors", "config_classes"):
        if card.get(key) is not None and not isinstance(card[key], dict):
            raise ValueError(f"its `{key}` is not a mapping")
    if card.get("routes") is not None and not isinstance(card["routes"], list):
        raise ValueError("its `routes` is not a list")


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
