"""The docs stay true: the architecture picture is the rendering of its committed source."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


def test_the_architecture_picture_is_rendered_from_its_source() -> None:
    if shutil.which("dot") is None:
        pytest.fail("Graphviz `dot` is needed (apt-get install graphviz; .ci/apt-packages.txt lists it)")
    rendered = subprocess.run(["dot", "-Tsvg", str(ROOT / "docs" / "architecture.dot")], capture_output=True,
                              text=True, check=True, timeout=60).stdout
    committed = (ROOT / "docs" / "architecture.svg").read_text()
    assert rendered == committed, "stale picture: dot -Tsvg docs/architecture.dot -o docs/architecture.svg"
