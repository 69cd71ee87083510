"""The docs stay true: the pictures are renderings of their committed sources, every link and every repository
path the docs name exists, the README stays a front page, and no page speaks the project's internal jargon.

Which words are checked as paths (README.md and docs/*.md, outside fenced code blocks):
- every Markdown link `[text](target)` whose target is not a URL (`scheme:`) or an in-page `#anchor`: the target,
  without its `#fragment`, relative to the page, must exist;
- every backticked span that is one word of path characters `[A-Za-z0-9_./-]`, contains a `/` and starts with a
  top-level directory of this repository (`stacks/`, `checks/`, `tests/`, `docs/`, …), after dropping a trailing
  `:line` or `:line-line`: it must exist. Spans with placeholders (`<stack>`, `{,1}`, `*`) are not paths but
  patterns, and paths of other projects (vLLM's `config/parallel.py`) do not start with one of our directories,
  so neither is checked; commands are not one word, so they never are."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"[A-Za-z0-9_./-]+")
TOP_DIRS = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "venv"}


@pytest.mark.parametrize("name", ["architecture", "deployed-stack"])
def test_the_pictures_are_rendered_from_their_sources(name: str) -> None:
    if shutil.which("dot") is None:
        pytest.fail("Graphviz `dot` is needed (apt-get install graphviz; .ci/apt-packages.txt lists it)")
    rendered = subprocess.run(["dot", "-Tsvg", str(ROOT / "docs" / f"{name}.dot")], capture_output=True,
                              text=True, check=True, timeout=60).stdout
    committed = (ROOT / "docs" / f"{name}.svg").read_text()
    assert drawn(rendered) == drawn(committed), f"stale picture: dot -Tsvg docs/{name}.dot -o docs/{name}.svg"


def drawn(svg: str) -> list[str]:
    """What a picture shows, without where: every node and edge (`<title>`) and every label (`<text>`), so another
    Graphviz version, which places things a few points apart, still matches while a changed source does not."""
    return sorted(re.findall(r"<(?:title|text)\b[^>]*>([^<]*)</(?:title|text)>", svg))


def named_paths(page: Path) -> list[tuple[str, Path]]:
    """(what the page says, the file it means) for every link and repository path the page names."""
    prose = FENCE.sub("", page.read_text())
    found = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        found.append((target, (page.parent / target.split("#", 1)[0]).resolve()))
    for span in SPAN.findall(prose):
        path = re.sub(r":\d+(-\d+)?$", "", span)
        if PATHLIKE.fullmatch(path) and "/" in path and path.split("/", 1)[0] in TOP_DIRS:
            found.append((span, ROOT / path))
    return found


def test_the_path_rule_finds_links_and_paths_but_not_commands_or_patterns(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("See [deploy](docs/deploy.md#steps), [web](https://example.com), [top](#top).\n"
                    "`stacks/planner/launch.py:12-30`, `venv/bin/python -m stacks plan prod`, "
                    "`Pulumi.<stack>.yaml`, `config/parallel.py`, `stacks/planner/data/vllm-<v>-routes.json`\n"
                    "```sh\ncat `checks/nothing.py`\n```\n")
    assert [what for what, _ in named_paths(page)] == ["docs/deploy.md#steps", "stacks/planner/launch.py:12-30"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_path_a_page_names_exists(page: Path) -> None:
    missing = [what for what, path in named_paths(page) if not path.exists()]
    assert missing == [], f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = set(LINK.findall(readme))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"pages the README's index does not link: {sorted(pages - linked)}"


def test_every_task_page_starts_with_its_commands() -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = [line for line in page.read_text().splitlines()
                 if line.strip() and not line.startswith("<!--")]  # a test's note on the block below it
        assert lines[0].startswith("# ") and lines[1].startswith("```"), page.name


JARGON = re.compile(r"(?<!--)\bseed(s|.s)?\b|\bissues? \d+|\bbriefs? \d+|\bstand-in\b|\bthe seed\b", re.I)
"""Words of the project's own history that a user cannot decode."""


@pytest.mark.parametrize("path", [*PAGES, *sorted(ROOT.glob("Pulumi.*.yaml")), *sorted(ROOT.glob("examples/*"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_jargon_where_users_read(path: Path) -> None:
    hits = [f"{i}: {line.strip()[:120]}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if JARGON.search(line)]
    assert hits == [], f"{path.relative_to(ROOT)}: {hits}"


def test_the_support_table_follows_the_cards() -> None:
    """The README's "what it supports" table lists exactly the committed model and image cards."""
    from review.support import with_rows

    readme = (ROOT / "README.md").read_text()
    assert with_rows(readme, ROOT) == readme, "stale support table: venv/bin/python -m review.support"


def test_the_plan_json_keys_are_all_documented() -> None:
    """docs/plan-your-cluster.md names every top-level key of `plan --json` (a key added to the Plan and not to
    the page would leave a reader of `jq .memory` guessing)."""
    from stacks.planner.plan import Plan

    page = (ROOT / "docs" / "plan-your-cluster.md").read_text()
    documented = page[page.index("The JSON has "):page.index("A listener is `public`")]
    assert [k for k in Plan.model_fields if f"`{k}`" not in documented] == []
