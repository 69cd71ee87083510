"""Model cards that are not what they claim (review of issue 36, item 7): something other than a file in a card's
place, a file where models/ belongs, a card whose name is not its file's, `"card": true`, an unknown dtype and a
negative total size are each refused with exit 2 naming the path and what to do; none is listed as a valid name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT

CARD = json.loads((ROOT / "models" / "qwen3-8b.json").read_text())


def _plan(root: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--set", "model.profile=hq"], cwd=ROOT,
                          env={**os.environ, "VLLM_CLUSTER_ROOT": str(root)}, capture_output=True, text=True,
                          timeout=120, check=False)
    return done.returncode, done.stdout + done.stderr


def _card(**changes: object) -> Callable[[Path], None]:
    def write(models: Path) -> None:
        card = json.loads(json.dumps(CARD)) | {"name": "hq"}
        for key, value in changes.items():
            *parents, last = key.split("__")
            node = card
            for part in parents:
                node = node[part]
            node[last] = value
        (models / "hq.json").write_text(json.dumps(card))
    return write


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("a directory", lambda m: (m / "hq.json").mkdir(), "hq.json: is a directory, not a model card file"),
    ("a dangling link", lambda m: (m / "hq.json").symlink_to("/nonexistent/hq.json"),
     "hq.json: is a link to nowhere, not a model card file"),
    ("a link to /dev/zero", lambda m: (m / "hq.json").symlink_to("/dev/zero"), "hq.json: is not a regular file"),
    ("another name inside", _card(name="other"), "field name 'other' is not the file's name 'hq'"),
    ("card: true", _card(card=True), "card version True, this planner reads 1"),
    ("dtype float7", _card(dtype="float7"), "field dtype = 'float7'"),
    ("total_bytes -1", _card(weights__total_bytes=-1), "field weights.total_bytes = -1"),
]


@pytest.mark.parametrize(("what", "make", "said"), CASES, ids=[c[0] for c in CASES])
def test_a_card_that_is_not_one_is_refused(tmp_path: Path, what: str, make: Callable[[Path], None],
                                           said: str) -> None:
    for name in ("Pulumi.yaml", "Pulumi.prod.yaml"):
        shutil.copy(ROOT / name, tmp_path)
    (tmp_path / "models").mkdir()
    make(tmp_path / "models")
    code, out = _plan(tmp_path)
    assert code == 2 and said in out, out
    assert "'hq'," not in out and "'hq']" not in out  # never offered as a valid name


def test_a_file_where_models_belongs_is_named(tmp_path: Path) -> None:
    for name in ("Pulumi.yaml", "Pulumi.prod.yaml"):
        shutil.copy(ROOT / name, tmp_path)
    (tmp_path / "models").write_text("not a directory")
    code, out = _plan(tmp_path)
    assert code == 2 and f"{tmp_path / 'models'}: is a file where the directory of model cards belongs" in out, out
    assert f"move {tmp_path / 'models'} away" in out, out
