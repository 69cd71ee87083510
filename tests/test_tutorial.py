"""The README's ten-minute tutorial, run verbatim on a fresh copy of the repository.

Every fenced ```sh block that follows a `<!-- tutorial -->` comment is run, in README order, with `bash -e` in
one shell per block (the environment a block exports is carried to the next, as in the user's terminal), in a
copy of the tracked and not-ignored files with a fresh git history. A block marked `<!-- tutorial: exit 2 -->`
must end with exit 2 (a refused config). The one thing that differs from a user's clone is `venv/`: the copy's
venv links to the interpreter running this test, with its `make venv-plan` and `make venv` stamps newer than the
requirements, so neither has anything to do (a fresh install would need the network and minutes). So that it is
no bigger than the plan-only venv the tutorial builds, every import outside requirements-plan.txt (and what its
packages need), the standard library and the project fails in every process the copy's venv/bin/python runs: its
site-packages carries the blocker (`plan_only_blocker`) in a .pth file, so it holds whatever environment a process
gets (`diff` plans the base with its own minimal one), as the missing packages would in a real plan-only venv.

Files the tutorial itself creates (`cp … Pulumi.mycluster.yaml`) are left out of the copy: a user who did the
tutorial in this checkout and then runs the tests has one already, committed or not."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import ROOT

MARKER = re.compile(r"<!-- tutorial(?P<exit>: exit 2)? -->\n```sh\n(?P<body>.*?)```", re.S)


def tutorial_blocks(readme: str) -> list[tuple[str, int]]:
    return [(m["body"], 2 if m["exit"] else 0) for m in MARKER.finditer(readme)]


def created_by_tutorial() -> set[str]:
    """The files the tutorial's `cp SRC DEST` lines create."""
    text = "".join(body for body, _ in tutorial_blocks((ROOT / "README.md").read_text()))
    return set(re.findall(r"^cp \S+ (\S+)$", text, re.M))


def fresh_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in set(filter(None, files)) - created_by_tutorial():
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not part of the copy
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    venv = dest / "venv"
    stamps = (".plan-installed", ".installed")
    assert (Path(sys.prefix) / "pyvenv.cfg").is_file(), f"run the tests from a venv, not {sys.prefix}"
    site = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)  # lib/pythonX.Y/site-packages
    mirror(Path(sys.prefix), venv, site.parts, skip=stamps)
    (venv / site / "_plan_only.py").write_text(plan_only_blocker())
    (venv / site / PTH).write_text("import _plan_only\n")
    newest = max((dest / r).stat().st_mtime
                 for r in ("requirements-plan.txt", "requirements.txt", "requirements-dev.txt"))
    for name in stamps:
        (venv / name).touch()
        os.utime(venv / name, (newest + 1, newest + 1))


BLOCKER = """
import importlib.abc, importlib.machinery, os, sys, sysconfig
ALLOWED = {allowed!r}
STDLIB = [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
          os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload")]
class PlanOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or (
                importlib.machinery.PathFinder.find_spec(top, STDLIB) is not None):
            return None
        raise ModuleNotFoundError(f"No module named {{name!r}} (not in requirements-plan.txt)", name=name)
sys.meta_path.insert(0, PlanOnly())
"""


PTH = "zz-plan-only.pth"
"""The venv copy's .pth that installs the blocker: named to come after every other .pth (site reads them sorted),
whose own imports (setuptools' `_distutils_hack`) it would refuse."""


def mirror(source: Path, target: Path, inside: tuple[str, ...], skip: tuple[str, ...] = ()) -> None:
    """`target` as a real folder of links to `source`'s entries, except the path `inside` (its first part a real
    folder again, and so on down): the copy's own site-packages, where the blocker goes. A relative link (a venv's
    `lib64 -> lib`) is copied as that link, so it points into the copy."""
    target.mkdir()
    for entry in source.iterdir():
        if entry.name in skip:
            continue
        if inside and entry.name == inside[0] and not entry.is_symlink():
            mirror(entry, target / entry.name, inside[1:])
        elif entry.is_symlink() and not os.readlink(entry).startswith("/"):
            (target / entry.name).symlink_to(os.readlink(entry))
        else:
            (target / entry.name).symlink_to(entry)


def plan_only_site(folder: Path) -> Path:
    """A folder with a `sitecustomize.py` (put it on PYTHONPATH) that refuses every import the plan-only venv could
    not satisfy (`plan_only_blocker`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(plan_only_blocker())
    return folder


def plan_only_blocker() -> str:
    """The text of a module that, imported at start-up, refuses every import the plan-only venv could not satisfy:
    allowed are the distributions in requirements-plan.txt and what they require (from their installed metadata),
    the standard library and the project's own packages."""
    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()
    wanted = [re.split(r"[=<>\[; ]", line.strip())[0] for line in
              (ROOT / "requirements-plan.txt").read_text().splitlines() if line.strip() and not line.startswith("#")]
    closure: set[str] = set()
    while wanted:
        name = norm(wanted.pop())
        if name in closure:
            continue
        closure.add(name)
        for req in importlib.metadata.requires(name) or []:
            if "extra ==" not in req:
                wanted.append(re.split(r"[=<>!~\[; (]", req.strip())[0])
    modules = {mod for mod, dists in importlib.metadata.packages_distributions().items()
               if any(norm(d) in closure for d in dists)}
    modules |= {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    return BLOCKER.format(allowed=sorted(modules))


GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "A User",
           "GIT_AUTHOR_EMAIL": "user@example.com", "GIT_COMMITTER_NAME": "A User",
           "GIT_COMMITTER_EMAIL": "user@example.com"}
"""A user's git with a name and e-mail set and nothing else configured."""


def test_the_tutorial_has_the_steps_the_readme_promises() -> None:
    blocks = tutorial_blocks((ROOT / "README.md").read_text())
    text = "".join(b for b, _ in blocks)
    assert "cp examples/Pulumi.three-node.yaml Pulumi.mycluster.yaml" in text
    assert "make plan STACK=mycluster" in text and "make diff STACK=mycluster" in text
    assert [code for _, code in blocks].count(2) == 1


def test_the_readme_tutorial_runs_verbatim_on_a_fresh_copy(tmp_path: Path) -> None:
    repo = tmp_path / "vllm-cluster"
    fresh_copy(repo)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VLLM_CLUSTER_", "GIT_", "PYTHON"))} | GIT_ENV
    blocked = subprocess.run([str(repo / "venv/bin/python"), "-c", "import httpx"], capture_output=True, text=True,
                             timeout=60, env={"PATH": "/usr/bin:/bin"})  # the environment diff's base plan gets
    assert blocked.returncode == 1 and "not in requirements-plan.txt" in blocked.stderr, blocked.stderr
    for argv in (["git", "init", "-q"], ["git", "add", "-A"],
                 ["git", "commit", "-qm", "clone"]):
        subprocess.run(argv, cwd=repo, env=env, check=True, timeout=120, capture_output=True)
    exported: dict[str, str] = {}
    outputs = []
    for body, expected in tutorial_blocks((ROOT / "README.md").read_text()):
        script = body + '\nexport -p > "$TUTORIAL_ENV"\n' if expected == 0 else body
        done = subprocess.run(["bash", "-e", "-c", script], cwd=repo, capture_output=True, text=True, timeout=300,
                              env=env | exported | {"TUTORIAL_ENV": str(tmp_path / "env")})
        assert done.returncode == expected, (body, done.stdout[-3000:], done.stderr[-3000:])
        outputs.append(done.stdout + done.stderr)
        if expected == 0:
            exported = read_exports((tmp_path / "env").read_text())
    plan, diff, refused = outputs[1], outputs[2], outputs[3]
    assert "topology mp-dp3-tp8-pp1-ep24" in plan and "start order: gpu2 -> gpu3 -> gpu1" in plan
    assert "argv `--max-model-len`: `131072` → `262144`" in diff and "the whole engine group" in diff
    # the base's own code planned the base, not this code its stack file (the fallback when the base cannot plan)
    assert "<sub>base: planned by the code at HEAD</sub>" in diff and "the base cannot plan" not in diff, diff
    assumed = [w for key in exported["SECRETS"].split() for w in ("--assume-secret", key)]
    done = subprocess.run(["venv/bin/python", "-m", "stacks", "plan", "mycluster", "--json", *assumed], cwd=repo,
                          capture_output=True, text=True, timeout=300, env=env | exported)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert data["stack"] == "mycluster" and data["topology"]["label"] == "mp-dp3-tp8-pp1-ep24", done.stdout[:500]
    assert "vllm-cluster:parallelism.tensor = 16" in refused and "nothing was created" in refused
    assert "Traceback" not in "".join(outputs)


def read_exports(text: str) -> dict[str, str]:
    """The variables a block exported (`export -p` output), for the next block's environment."""
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(r'declare -x ([A-Za-z_][A-Za-z0-9_]*)="(.*)"', line)
        if m and m[1] not in ("PWD", "OLDPWD", "SHLVL", "_", "TUTORIAL_ENV"):
            found[m[1]] = re.sub(r"\\(.)", r"\1", m[2])  # bash escapes \\ " $ and `
    return found
