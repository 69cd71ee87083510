"""Issue 35, done when: from a wheel built here, in a fresh venv outside this checkout, `vllm-cluster init` makes a
project whose example stack plans, a card made there is used by its stacks, `vllm-cluster diff` reviews a change,
the program runs under Pulumi's mocks from the project, the supervisor unit and the policy pack name the project
and the venv, and no file of the installed package or of this checkout is written.

Every command runs with the project (or a folder outside the checkout) as its working directory, PATH holding the
venv's bin/ and the system's, and no PYTHON* variable: nothing of this checkout is importable. The venv gets the
wheel with its `deploy` extra from PyPI (about 15 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.wheel_harness import SHIPPED_PACKAGES, build_wheel, fresh_venv, install

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main"]


@dataclass
class Installed:
    python: Path
    tool: Path
    site: Path
    project: Path
    home: Path
    init: subprocess.CompletedProcess[str] | None = None
    """`vllm-cluster init` of the project, committed as the user's first commit."""
    wheel: Path = Path()
    """the wheel it was installed from"""

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.python.parent}:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}

    def run(self, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.tool), *argv], cwd=cwd or self.project, capture_output=True, text=True,
                              env=self.env(), timeout=300)

    def python_run(self, code: str, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), "-c", code, *argv], cwd=cwd or self.project, capture_output=True,
                              text=True, env=self.env(), timeout=120)


def _snapshot(site: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(site)): (p.stat().st_size, p.stat().st_mtime_ns)
            for top in SHIPPED_PACKAGES for p in (site / top).rglob("*") if "__pycache__" not in p.parts}


def _checkout_state() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--ignored=no"], capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    work = tmp_path_factory.mktemp("wheel")
    before = _checkout_state()
    wheel = build_wheel(work)
    python = fresh_venv(work / "venv")
    done = install(python, f"{wheel}[deploy]")
    assert done.returncode == 0, f"pip install {wheel.name}[deploy] (from PyPI): {done.stderr[-2000:]}"
    site = next((work / "venv" / "lib").glob("python3*/site-packages"))
    (work / "home").mkdir()
    where = Installed(python, work / "venv" / "bin" / "vllm-cluster", site, work / "clusters", work / "home")
    where.wheel = wheel
    packages = _snapshot(site)
    where.init = where.run("init", str(where.project), cwd=where.home)
    assert where.init.returncode == 0, where.init.stderr
    for git in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*GIT, *git], cwd=where.project, check=True, capture_output=True)
    yield where
    assert _snapshot(site) == packages, "a command wrote into the installed package"
    assert _checkout_state() == before, "a command wrote into this checkout"


def test_every_module_comes_from_the_venv_and_nothing_from_this_checkout(installed: Installed) -> None:
    code = ("import importlib, json, sys\n"
            "names = sys.argv[1:]\n"
            "print(json.dumps({'files': [importlib.import_module(n).__file__ for n in names], 'path': sys.path}))")
    done = installed.python_run(code, *SHIPPED_PACKAGES, "stacks.planner.plan", "components.program",
                                cwd=installed.home)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert all(f.startswith(str(installed.site)) for f in seen["files"]), seen["files"]
    assert not [p for p in seen["path"] if p and Path(p).resolve().is_relative_to(ROOT)], seen["path"]


def test_init_then_the_example_plans_in_the_project(installed: Installed) -> None:
    assert installed.init is not None
    assert installed.init.stdout.startswith(f"created {installed.project}: .gitignore, Pulumi.two-node.yaml, ")
    plan = installed.run("plan", "two-node", "--summary")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("stack two-node: DeepSeek-V4.1-Flash (deepseek-v4.1-flash) on 2 node(s)")
    # what Pulumi installs into the project's venv: the wheel this tool came from, not a name PyPI does not have
    wanted = f"vllm-cluster[deploy] @ {installed.wheel.resolve().as_uri()}"
    assert wanted in (installed.project / "requirements.txt").read_text().splitlines()


def _set_in_stack(project: Path, old: str, new: str) -> None:
    path = project / "Pulumi.two-node.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_card_made_in_the_project_is_used_by_its_stack(installed: Installed) -> None:
    model = ROOT / "tests" / "fixtures" / "models" / "tiny-llama-48h-8kv"
    done = installed.run("model-card", str(model), "--name", "my-llama", "--synthesize-weights")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {installed.project / 'models' / 'my-llama.json'}: LlamaForCausalLM")
    _set_in_stack(installed.project, "profile: deepseek-v4.1-flash", "profile: my-llama")
    _set_in_stack(installed.project, "max_model_len: 131072", "max_model_len: 8192")  # the card's context
    _set_in_stack(installed.project, "expert: true", "expert: false")  # a dense model: vLLM refuses EP on it
    try:
        plan = installed.run("plan", "two-node", "--json")
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["model"]["profile"] == "my-llama"
    finally:
        subprocess.run(["git", "checkout", "-q", "Pulumi.two-node.yaml"], cwd=installed.project, check=True)


def test_diff_reviews_a_change_against_a_base_in_the_users_repository(installed: Installed) -> None:
    _set_in_stack(installed.project, "max_model_len: 131072", "max_model_len: 65536")
    try:
        done = installed.run("diff", "two-node", "--base", "HEAD")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("## `two-node`: plan at `HEAD` → working tree")
        assert "--max-model-len" in done.stdout and "65536" in done.stdout
        assert "base: the project at HEAD, planned by the installed vllm-cluster" in done.stdout
    finally:
        subprocess.run(["git", "checkout", "-q", "Pulumi.two-node.yaml"], cwd=installed.project, check=True)


MOCKED_PROGRAM = """\
import asyncio, json, runpy, sys
import pulumi, yaml

class Mocks(pulumi.runtime.Mocks):
    types = []
    def new_resource(self, args):
        Mocks.types.append(args.typ)
        state = dict(args.inputs)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            state["imageId"] = f"sha256:mock-{args.name}"
        if args.typ.startswith("command:"):
            state["stdout"] = f"PASS {args.name}: mocked"
        return f"{args.name}-id", state
    def call(self, args):
        return {}, None

asyncio.set_event_loop(asyncio.new_event_loop())
pulumi.runtime.set_mocks(Mocks(), project="vllm-cluster", stack="two-node", preview=True)
config = yaml.safe_load(open("Pulumi.two-node.yaml"))["config"]
pulumi.runtime.set_all_config({k: json.dumps(v) for k, v in config.items()}, secret_keys=[])

@pulumi.runtime.test
def program():
    runpy.run_path("__main__.py", run_name="__main__")
    return pulumi.Output.from_input(1)

program()
import components.program
print(json.dumps({"types": sorted(set(Mocks.types)), "count": len(Mocks.types),
                  "program": components.program.__file__}))
"""


def test_the_projects_main_runs_the_installed_program_under_mocks(installed: Installed) -> None:
    done = installed.python_run(MOCKED_PROGRAM)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["program"].startswith(str(installed.site))
    assert {"vllm-cluster:index:GpuNode", "docker:index/container:Container",
            "vllm-cluster:index:PolicyFacts"} <= set(seen["types"]), seen["types"]
    assert seen["count"] > 20


def test_the_supervisor_unit_names_the_project_and_the_venv(installed: Installed) -> None:
    done = installed.run("supervisor-unit", "two-node", "--assume-secret", "api_key", "--user", "ops")
    assert done.returncode == 0, done.stderr
    assert f"WorkingDirectory={installed.project}" in done.stdout
    assert f"ExecStart={installed.python} -m stacks supervise two-node" in done.stdout
    assert str(ROOT) not in done.stdout


PACK_INFO = """\
import json, subprocess, sys
import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import analyzer_pb2_grpc

pack = sys.argv[1]
proc = subprocess.Popen([sys.executable, "-u", "__main__.py"], cwd=pack, stdout=subprocess.PIPE, text=True)
try:
    port = int(proc.stdout.readline().strip())
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=60)
    info = analyzer_pb2_grpc.AnalyzerStub(channel).GetAnalyzerInfo(empty_pb2.Empty())
    print(json.dumps({"name": info.name, "policies": sorted(p.name for p in info.policies)}))
    channel.close()
finally:
    proc.kill()
    proc.wait()
"""


def test_the_policy_pack_serves_the_installed_rules_from_the_project(installed: Installed) -> None:
    done = installed.run("policy-pack")
    assert done.returncode == 0, done.stderr
    pack = Path(done.stdout.strip())
    assert pack == installed.project / ".vllm-cluster" / "policy-pack"
    assert f'virtualenv: "{installed.python.parent.parent}"' in (pack / "PulumiPolicy.yaml").read_text()
    served = installed.python_run(PACK_INFO, str(pack))
    assert served.returncode == 0, served.stderr[-3000:]
    info = json.loads(served.stdout)
    assert info["name"] == "vllm-cluster"
    assert {"vllm-api-auth-on-non-loopback", "prod-image-pinned-by-digest"} <= set(info["policies"])
    ignored = subprocess.run(["git", "status", "--porcelain"], cwd=installed.project, capture_output=True,
                             text=True, check=True).stdout
    assert ".vllm-cluster" not in ignored, ignored  # ignored by the project's .gitignore


def test_a_unit_interpreter_without_the_package_is_refused_naming_it(installed: Installed) -> None:
    """The unit's interpreter is asked as the unit runs it: without the venv's packages on its path, so one that
    lacks vllm-cluster is refused before systemd would restart a failing unit for ever."""
    base = getattr(sys, "_base_executable", sys.executable)
    done = installed.run("supervisor-unit", "two-node", "--assume-secret", "api_key", "--user", "ops",
                         "--python", base)
    assert done.returncode == 2, done.stdout
    assert f"needs vllm-cluster, which {base} cannot import" in done.stderr, done.stderr


def test_no_card_is_written_into_the_installed_package(installed: Installed) -> None:
    shipped = installed.site / "vllm_cluster" / "data" / "images"
    done = installed.run("image-card", "example.org/vllm:1", "--python", str(installed.python), "--out", str(shipped))
    assert done.returncode == 2
    assert done.stderr.startswith(f"image-card example.org/vllm:1: --out {str(shipped)!r} is the shipped cards' "
                                  "directory, which no command writes into"), done.stderr
    refused = installed.run("image-card", "vllm/vllm-openai:v0.33.0", "--python", str(installed.python))
    assert refused.returncode == 2 and "a card of that name ships with vllm-cluster" in refused.stderr
