"""A user's own project (issue 35): found from the working directory, its cards beside the shipped ones, `init`,
the policy pack's path, units naming the project, and no command writing into this checkout's docs from there.

These run the checkout's code; tests/test_wheel.py runs the same from a built wheel in a fresh venv.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.model.project import CODE_ROOT, project_root
from tests.conftest import ROOT, plan_of

SHIPPED_IMAGE = "vllm_vllm-openai_v0.33.0.json"


def _run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The tool as a user runs it: `python -m vllm_cluster …` in `cwd`, this checkout on the path only."""
    clean = {k: v for k, v in os.environ.items() if k != "VLLM_CLUSTER_ROOT"}
    return subprocess.run([sys.executable, "-m", "vllm_cluster", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**clean, "PYTHONPATH": str(ROOT), **(env or {})})


def test_the_project_is_the_variable_else_the_nearest_pulumi_yaml_up_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.delenv("VLLM_CLUSTER_ROOT", raising=False)
    assert project_root(tmp_path / "a" / "b") == tmp_path.resolve()
    assert project_root(Path("/")) == CODE_ROOT  # nowhere in a project: this checkout, as before
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path / "a"))
    assert project_root(tmp_path / "a" / "b") == tmp_path / "a"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("own") / "clusters"
    done = _run("init", str(folder), cwd=folder.parent)
    assert done.returncode == 0, done.stderr
    return folder


def test_init_writes_a_project_of_the_users_own(project: Path) -> None:
    names = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert names == [".gitignore", "Pulumi.two-node.yaml", "Pulumi.yaml", "README.md", "__main__.py",
                     "images/.gitkeep", "models/.gitkeep", "requirements.txt"]
    assert "name: vllm-cluster" in (project / "Pulumi.yaml").read_text()
    assert "virtualenv: venv" in (project / "Pulumi.yaml").read_text()
    assert "from vllm_cluster.program import run" in (project / "__main__.py").read_text()
    assert "vllm-cluster[deploy]==0.1.0" in (project / "requirements.txt").read_text()
    import yaml

    mine = (project / "Pulumi.two-node.yaml").read_text()
    shipped = (ROOT / "examples" / "Pulumi.two-node.yaml").read_text()
    assert yaml.safe_load(mine) == yaml.safe_load(shipped)  # the same stack; only its comments speak to the project
    assert "make plan" not in mine and "cp examples/" not in mine and "--policy-pack policy`" not in mine
    assert "#   vllm-cluster plan two-node" in mine


def test_a_plan_in_the_project_reads_its_stack_without_the_variable(project: Path) -> None:
    done = _run("plan", "two-node", "--summary", cwd=project / "models")  # a folder below the project
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stack two-node: DeepSeek-V4.1-Flash")


@pytest.mark.parametrize(("argv", "said"), [
    (["DIR_NONEMPTY"], "init: DIR '{dir}': is not empty (init never overwrites files); give a new or empty "
                       "directory"),
    (["new", "--example", "nope"], "init: --example 'nope': is not a shipped example; one of: lab, pd, three-node, "
                                   "two-node, wide-ep"),
    (["../up"], "init: DIR '../up': contains '..'; give a new or empty directory"),
    (["bad\nname"], "init: DIR 'bad\\nname': has control characters or is empty; give a new or empty directory"),
])
def test_init_refuses_bad_input_with_exit_2_naming_it(project: Path, tmp_path: Path, argv: list[str],
                                                      said: str) -> None:
    argv = [str(project) if a == "DIR_NONEMPTY" else a for a in argv]
    done = _run("init", *argv, cwd=tmp_path)
    assert done.returncode == 2, done
    assert done.stderr.startswith(said.format(dir=project)), done.stderr
    assert list(tmp_path.iterdir()) == []


def _image_values(h20: dict[str, Any]) -> dict[str, Any]:
    values = copy.deepcopy(h20)
    values["image"] = {"repository": "example.org/team/vllm", "tag": "0.33.0-custom"}
    return values


def test_a_project_image_card_is_read_beside_the_shipped_ones(tmp_path: Path, h20_values: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    values = _image_values(h20_values)
    assert plan_of(copy.deepcopy(values)).image["card"] is None  # no card: the image is unknown
    card = json.loads((ROOT / "images" / SHIPPED_IMAGE).read_text())
    card["image"] = {**card["image"], "refs": ["example.org/team/vllm:0.33.0-custom"], "digests": []}
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "team_vllm.json").write_text(json.dumps(card))
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path))
    plan = plan_of(values)
    assert plan.image["card"] == "images/team_vllm.json"
    assert not [w for w in plan.warnings if "hides the shipped card" in w]


def test_a_project_image_card_of_a_shipped_name_is_named_in_every_plan(tmp_path: Path, h20_values: dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / SHIPPED_IMAGE).write_text((ROOT / "images" / SHIPPED_IMAGE).read_text())
    monkeypatch.setenv("VLLM_CLUSTER_ROOT", str(tmp_path))
    warning = next(w for w in plan_of(h20_values).warnings if "hides the shipped card" in w)
    assert warning.startswith(f"image card {tmp_path / 'images' / SHIPPED_IMAGE} is used, and it hides the shipped "
                              f"card {ROOT / 'images' / SHIPPED_IMAGE}")


def test_image_card_refuses_a_shipped_name_in_a_project_unless_overriding(project: Path) -> None:
    done = _run("image-card", "vllm/vllm-openai:v0.33.0", "--python", "/nonexistent/python", cwd=project)
    assert done.returncode == 2
    assert done.stderr.startswith("image-card vllm/vllm-openai:v0.33.0: a card of that name ships with vllm-cluster "
                                  f"({ROOT / 'images' / SHIPPED_IMAGE})"), done.stderr
    assert "--override-shipped" in done.stderr and list((project / "images").glob("*.json")) == []
    forced = _run("image-card", "vllm/vllm-openai:v0.33.0", "--python", "/nonexistent/python",
                  "--override-shipped", cwd=project)
    assert forced.returncode == 2 and "a card of that name ships" not in forced.stderr  # on to the probe, which fails


def test_model_card_over_a_shipped_name_with_override_is_used_and_warned(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    done = _run("model-card", str(ROOT / "tests/fixtures/models/qwen3-8b"), "--name", "qwen3-8b",
                "--synthesize-weights", "--override-shipped", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {tmp_path / 'models' / 'qwen3-8b.json'}: ")
    assert "support" not in done.stdout  # a project's card rewrites no table of this checkout


def test_init_refuses_a_folder_inside_the_code_or_inside_a_project(tmp_path: Path) -> None:
    """Into this checkout (site-packages when installed: the same check) or below another Pulumi.yaml: exit 2
    naming the folder, nothing created (both were accepted)."""
    (tmp_path / "outer").mkdir()
    (tmp_path / "outer" / "Pulumi.yaml").write_text("name: theirs\n")
    for target, why in ((ROOT / "my-clusters-probe", "inside vllm-cluster's own code"),
                        (tmp_path / "outer" / "sub", f"inside the Pulumi project {tmp_path / 'outer'}")):
        done = _run("init", str(target), cwd=tmp_path)
        assert done.returncode == 2 and why in done.stdout + done.stderr, done.stdout + done.stderr
        assert not target.exists()


@pytest.mark.parametrize("where", ["no-project", "missing", "a-file"])
def test_model_card_writes_only_into_a_project(tmp_path: Path, where: str) -> None:
    """Outside a project (no Pulumi.yaml), or VLLM_CLUSTER_ROOT naming a missing folder or a file: exit 2 naming
    it, nothing written (it wrote models/ wherever it ran, the installed package's shipped cards included)."""
    root = {"no-project": tmp_path, "missing": tmp_path / "nope", "a-file": tmp_path / "f"}[where]
    if where == "a-file":
        root.write_text("x")
    before = sorted(tmp_path.rglob("*"))
    for extra in ([], ["--override-shipped"]):
        done = _run("model-card", str(ROOT / "tests/fixtures/models/qwen3-8b"), "--name", "mine",
                    "--synthesize-weights", *extra, cwd=tmp_path, env={"VLLM_CLUSTER_ROOT": str(root)})
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{root} (from VLLM_CLUSTER_ROOT)" in done.stdout + done.stderr
        assert "vllm-cluster init DIR" in done.stdout + done.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_matrix_update_docs_from_a_project_writes_no_docs(project: Path) -> None:
    page = (ROOT / "docs" / "what-a-change-costs.md").stat().st_mtime_ns
    done = _run("matrix", "--update-docs", cwd=project)
    assert done.returncode == 2
    assert done.stderr.startswith(f"matrix --update-docs: {project} is not the vllm-cluster checkout")
    assert not (project / "docs").exists() and (ROOT / "docs" / "what-a-change-costs.md").stat().st_mtime_ns == page


def test_the_units_name_the_project_and_its_interpreter(project: Path) -> None:
    done = _run("watch-unit", "two-node", "--assume-secret", "api_key", cwd=project)
    assert done.returncode == 0, done.stderr
    assert f"WorkingDirectory={project}" in done.stdout
    assert f"ExecStart={sys.executable} -m checks.api" in done.stdout
    unit = _run("supervisor-unit", "two-node", "--assume-secret", "api_key", "--user", "ops", cwd=project)
    assert unit.returncode == 0, unit.stderr
    assert f"WorkingDirectory={project}" in unit.stdout
    assert f"ExecStart={sys.executable} -m stacks supervise two-node" in unit.stdout


def test_the_policy_pack_path_names_this_venv_and_the_installed_rules(project: Path) -> None:
    done = _run("policy-pack", cwd=project)
    assert done.returncode == 0, done.stderr
    pack = Path(done.stdout.strip())
    assert pack == project / ".vllm-cluster" / "policy-pack"
    assert f"virtualenv: {json.dumps(sys.prefix)}" in (pack / "PulumiPolicy.yaml").read_text()
    assert "from policy.rules import POLICIES" in (pack / "__main__.py").read_text()
    here = _run("policy-pack", cwd=ROOT)
    assert here.returncode == 0 and here.stdout.strip() == str(ROOT / "policy")  # the checkout's own pack


def test_outside_any_project_plan_and_policy_pack_say_how_to_reach_one(tmp_path: Path) -> None:
    """No Pulumi.yaml up from the working directory (installed, the working directory is the project): the
    answer names the way to a project, and the policy pack is not written there."""
    env = {"VLLM_CLUSTER_ROOT": str(tmp_path)}
    plan = _run("plan", "two-node", cwd=tmp_path, env=env)
    assert plan.returncode == 2
    assert f"no Pulumi.two-node.yaml in {tmp_path}" in plan.stderr and "vllm-cluster init DIR" in plan.stderr
    pack = _run("policy-pack", cwd=tmp_path, env=env)
    assert pack.returncode == 2
    assert pack.stderr.startswith(f"policy-pack: {tmp_path} (from VLLM_CLUSTER_ROOT) holds no Pulumi.yaml: run it "
                                  "in your project")
    assert list(tmp_path.iterdir()) == []


def test_another_pulumi_projects_yaml_is_passed_over_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Pulumi.yaml of another project (name: theirs) is no vllm-cluster project: the search goes on up past it,
    and a plan that finds no stack names it (it was taken as the project, whatever it held)."""
    monkeypatch.delenv("VLLM_CLUSTER_ROOT", raising=False)
    (tmp_path / "Pulumi.yaml").write_text("# mine\nname: vllm-cluster\nruntime: python\n")
    (tmp_path / "theirs" / "sub").mkdir(parents=True)
    (tmp_path / "theirs" / "Pulumi.yaml").write_text("name: theirs\nruntime: nodejs\n")
    assert project_root(tmp_path / "theirs" / "sub") == tmp_path.resolve()
    alone = tmp_path / "alone"
    (alone / "sub").mkdir(parents=True)
    (alone / "Pulumi.yaml").write_text("name: 'theirs'  # another team's\n")
    done = _run("plan", "two-node", cwd=alone / "sub")
    assert done.returncode == 2, done.stdout
    assert f"{alone / 'Pulumi.yaml'} is the Pulumi project 'theirs', not a vllm-cluster project" in done.stderr


def test_a_root_that_is_another_pulumi_project_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: theirs\n")
    (tmp_path / "Pulumi.two-node.yaml").write_text((ROOT / "examples" / "Pulumi.two-node.yaml").read_text())
    env = {"VLLM_CLUSTER_ROOT": str(tmp_path)}
    plan = _run("plan", "two-node", cwd=tmp_path, env=env)
    assert plan.returncode == 2, plan.stdout
    assert (f"{tmp_path} (from VLLM_CLUSTER_ROOT) holds the Pulumi project 'theirs', not a vllm-cluster project"
            in plan.stderr), plan.stderr
    pack = _run("policy-pack", cwd=tmp_path, env=env)
    assert pack.returncode == 2 and "holds the Pulumi project 'theirs'" in pack.stderr
    assert not (tmp_path / ".vllm-cluster").exists()


@pytest.mark.parametrize("where", ["missing", "a-file"])
def test_a_root_variable_naming_no_folder_is_named_in_the_plans_refusal(tmp_path: Path, where: str) -> None:
    root = tmp_path / where
    if where == "a-file":
        root.write_text("x")
    done = _run("plan", "two-node", cwd=tmp_path, env={"VLLM_CLUSTER_ROOT": str(root)})
    assert done.returncode == 2
    why = "does not exist" if where == "missing" else "is not a folder"
    assert f"no Pulumi.two-node.yaml in {root} (from VLLM_CLUSTER_ROOT), which {why}" in done.stderr, done.stderr


def test_every_plan_names_its_project_on_stderr(project: Path) -> None:
    done = _run("plan", "two-node", "--summary", cwd=project / "models")
    assert done.returncode == 0 and done.stderr.startswith(f"# project: {project}, stack file "
                                                           "Pulumi.two-node.yaml"), done.stderr
    refused = _run("plan", "two-node", "--set", "parallelism.tensor=0", cwd=project)
    assert refused.returncode == 2 and refused.stderr.startswith(f"# project: {project},"), refused.stderr
    via = _run("plan", "two-node", "--json", cwd=ROOT, env={"VLLM_CLUSTER_ROOT": str(project)})
    assert via.returncode == 0 and f"# project: {project} (from VLLM_CLUSTER_ROOT)" in via.stderr
    json.loads(via.stdout)


def test_a_card_hiding_a_shipped_one_is_warned_on_a_refused_plan_too(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    (tmp_path / "Pulumi.two-node.yaml").write_text((ROOT / "examples" / "Pulumi.two-node.yaml").read_text())
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / SHIPPED_IMAGE).write_text((ROOT / "images" / SHIPPED_IMAGE).read_text())
    profile = str(read_profile(tmp_path / "Pulumi.two-node.yaml"))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{profile}.json").write_text((ROOT / "models" / f"{profile}.json").read_text())
    for flags in ([], ["--json"]):
        done = _run("plan", "two-node", "--set", "parallelism.tensor=0", *flags, cwd=tmp_path)
        assert done.returncode == 2
        said = done.stderr if not flags else "\n".join(json.loads(done.stdout)["warnings"])
        assert f"image card {tmp_path / 'images' / SHIPPED_IMAGE} is used, and it hides the shipped card" in said
        assert f"model.profile {profile!r}: {tmp_path / 'models' / profile}.json is used" in said, said


def read_profile(stack_file: Path) -> object:
    import yaml

    return yaml.safe_load(stack_file.read_text())["config"]["vllm-cluster:model"]["profile"]


LONG = "a" * 300
"""Over NAME_MAX (255 bytes) on every Linux file system."""


@pytest.mark.parametrize(("name", "said"), [
    (LONG, "cannot be used (File name too long: a folder name of 300 bytes, at most 255)"),
    (f"clusters/{LONG}/x", "cannot be used (File name too long: a folder name of 300 bytes"),
    ("my\u200fclusters", "has invisible or right-to-left formatting characters (U+200F)"),
    ("my\u202eclusters", "has invisible or right-to-left formatting characters (U+202E)"),
    ("my\udcffclusters", "is not valid UTF-8"),  # the byte 0xff, as Python holds a name that is not UTF-8
])
def test_init_refuses_names_too_long_or_that_read_as_another_with_exit_2(tmp_path: Path, name: str, said: str) -> None:
    done = _run("init", name, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("init: DIR ") and said in done.stderr, done.stderr
    assert "internal error" not in done.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("root", "said"), [
    (f"/tmp/{LONG}", "cannot be used (File name too long, 305 characters)"),
    ("/tmp/my\u200fclusters", "has invisible or right-to-left formatting characters (U+200F)"),
    ("/tmp/my\udcffclusters", "is not valid UTF-8"),
])
@pytest.mark.parametrize("command", [["plan", "two-node"], ["drift", "two-node", "--json"], ["matrix"],
                                     ["watch-unit", "two-node"]])
def test_a_root_variable_that_cannot_name_a_folder_is_exit_2_naming_it(tmp_path: Path, root: str, said: str,
                                                                      command: list[str]) -> None:
    done = _run(*command, cwd=tmp_path, env={"VLLM_CLUSTER_ROOT": root})
    assert done.returncode == 2, done.stderr
    assert f"{' '.join(command[:1])}: VLLM_CLUSTER_ROOT " in done.stderr and said in done.stderr, done.stderr
    if "--json" in command:
        assert said in json.loads(done.stdout)["error"]


def test_a_path_too_long_met_by_any_command_is_exit_2_not_an_internal_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    from review import cli

    def too_long(args: object) -> int:
        raise OSError(errno.ENAMETOOLONG, "File name too long", "/srv/" + LONG)

    monkeypatch.setattr(cli, "_reference", too_long)
    assert cli.main(["reference"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m stacks reference: File name too long: '/srv/aaa") and "305 characters" in err
    assert "internal error" not in err


def test_init_takes_a_fresh_clone_of_an_empty_repository(tmp_path: Path) -> None:
    """A folder holding only `.git` (`git clone` of an empty repository) is where a user starts: init writes
    into it, keeps `.git`, and its hint does not `git init` again."""
    clone = tmp_path / "clusters"
    subprocess.run(["git", "init", "-q", str(clone)], check=True, timeout=60)
    done = _run("init", str(clone), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (clone / "Pulumi.yaml").is_file() and (clone / ".git" / "HEAD").is_file()
    assert f"cd {clone} && git add -A && git commit" in done.stdout and "git init" not in done.stdout
    used = tmp_path / "used"
    subprocess.run(["git", "init", "-q", str(used)], check=True, timeout=60)
    (used / "notes.txt").write_text("mine")
    again = _run("init", str(used), cwd=tmp_path)
    assert again.returncode == 2 and "is not empty" in again.stderr and not (used / "Pulumi.yaml").exists()


@pytest.mark.parametrize("name", ["my clusters", "a;b", "it's"])
def test_the_next_steps_init_prints_are_shell_quoted(tmp_path: Path, name: str) -> None:
    import shlex

    done = _run("init", name, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cd = next(line for line in done.stdout.splitlines() if line.strip().startswith("cd "))
    lexer = shlex.shlex(cd, posix=True, punctuation_chars=True)  # `;` and `&&` split as a shell splits them
    lexer.whitespace_split = True
    words = list(lexer)
    assert words[:2] == ["cd", str(tmp_path / name)] or words[:2] == ["cd", name], words
    assert words[2:4] == ["&&", "git"]


def test_init_dot_makes_the_working_directory_the_project(tmp_path: Path) -> None:
    """`git clone <empty repo> && cd it && vllm-cluster init .`: the working directory itself (it was exit 3)."""
    here = tmp_path / "clone"
    here.mkdir()
    done = _run("init", ".", cwd=here)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (here / "Pulumi.yaml").is_file()
    again = _run("init", ".", cwd=here)
    assert again.returncode == 2 and "is not empty" in again.stdout + again.stderr


def test_the_projects_readme_upgrades_from_a_wheel_file_never_by_name(project: Path) -> None:
    readme = (project / "README.md").read_text()
    assert "pip install -U vllm-cluster`" not in readme and "pip install -U /path/to/vllm_cluster-" in readme


def test_no_write_follows_a_link_out_of_the_project(project: Path, tmp_path: Path) -> None:
    """models/ or .vllm-cluster/ as links out of the project, and observability --out into vllm-cluster's own code:
    exit 2, nothing written there (the card landed in the installed package while the command said the project)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    shutil.copytree(project, linked)
    shutil.rmtree(linked / "models")
    (linked / "models").symlink_to(elsewhere)
    card = _run("model-card", str(ROOT / "tests/fixtures/models/qwen3-8b"), "--name", "mine", "--synthesize-weights",
                cwd=linked)
    assert card.returncode == 2 and "leads out of the project" in card.stdout + card.stderr, card.stdout + card.stderr
    assert list(elsewhere.iterdir()) == []
    shutil.rmtree(linked / ".vllm-cluster", ignore_errors=True)
    (linked / ".vllm-cluster").symlink_to(elsewhere)
    pack = _run("policy-pack", cwd=linked)
    assert pack.returncode == 2 and "leads out of the project" in pack.stderr, pack.stdout + pack.stderr
    assert list(elsewhere.iterdir()) == []
    out = ROOT / "docs" / "obs-probe"
    obs = _run("observability", "two-node", "--out", str(out), "--set", "observability.enabled=true",
               "--assume-secret", "grafana_admin_password", cwd=project)
    assert obs.returncode == 2 and "whose files no command writes" in obs.stderr, obs.stdout + obs.stderr
    assert not out.exists()


def test_an_unknown_stack_lists_only_stack_names_a_command_takes(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    for name in ("prod.eu-1", ".hidden", "", "日本", "a b"):
        (tmp_path / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    done = _run("plan", "nope", cwd=tmp_path, env={"VLLM_CLUSTER_ROOT": str(tmp_path)})
    assert done.returncode == 2 and "one of ['.hidden', 'prod.eu-1']" in done.stderr, done.stderr


@pytest.mark.parametrize("unit", ["watch-unit", "supervisor-unit"])
def test_a_units_workdir_must_be_a_project(project: Path, tmp_path: Path, unit: str) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "Pulumi.yaml").write_text("name: infra\n")
    user = ["--user", "ops"] if unit == "supervisor-unit" else []
    for workdir, said in ((tmp_path / "missing", "not a directory"), (other, "infra")):
        done = _run(unit, "two-node", "--assume-secret", "api_key", *user, "--workdir", str(workdir), cwd=project)
        assert done.returncode == 2 and said in done.stderr, done.stdout + done.stderr
    ok = _run(unit, "two-node", "--assume-secret", "api_key", *user, "--workdir", str(project), cwd=project)
    assert ok.returncode == 0 and f"WorkingDirectory={project}" in ok.stdout, ok.stderr


def test_a_project_folder_named_like_a_package_of_the_tool_is_refused(project: Path, tmp_path: Path) -> None:
    """A project's own `components/` came first on the import path and broke `pulumi up` (fresh-install review)."""
    shadowed = tmp_path / "shadowed"
    shutil.copytree(project, shadowed)
    (shadowed / "components").mkdir()
    done = _run("plan", "two-node", cwd=shadowed)
    assert done.returncode == 2 and "has components of its own" in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("module", ["checks.api", "checks.pd"])
def test_a_check_program_without_its_extra_says_which_to_install(module: str) -> None:
    code = ("import sys, runpy; sys.modules['httpx'] = None; sys.argv = ['x', '--help']; "
            f"runpy.run_module({module!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "pip install 'vllm-cluster[checks]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
