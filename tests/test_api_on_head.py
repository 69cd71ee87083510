"""vLLM on loopback without the proxy: the API checks run on the head, inside the engine container.

Issue 12 item 5: with `serving.host: 127.0.0.1` and no proxy the checks used to call the head's management
address from the deployer and wait 70 minutes for a port nobody can reach. Now the plan runs them with
`docker exec -i <engine> python3 -` on the head (over the remote command's SSH), against the bind address, with
the container's own VLLM_API_KEY. Here, with a real Docker engine: an image with python3, httpx and pydantic (as
the vLLM image has) runs the OpenAI stand-in as the "engine" on host networking, and the exact command strings
the program registers are run by a shell (what SSH hands them to).
"""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic_core
import pytest

from components.check_commands import api_command
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config
from stacks.planner.plan import api_sections, build_plan
from tests.conftest import ROOT
from tests.docker_harness import build_image, docker_ready
from tests.nginx_harness import free_port

KEY = "sk-fdtest-head-0123456789abcdef"
MODULES = ("httpx", "httpcore", "h11", "anyio", "idna", "certifi", "pydantic", "pydantic_core",
           "typing_extensions", "annotated_types", "typing_inspection")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    problem = docker_ready()
    if problem:
        pytest.fail(f"a Docker engine is needed ({problem}); `make services` starts dockerd")
    tag = build_image(f"fdtest-api-head:{os.getpid()}", tmp_path_factory.mktemp("fdimg"), with_vllm=False,
                       modules=MODULES, files={ROOT / "checks" / "standin.py": "/standin.py"},
                       libraries_of=(*Path("/usr/lib/python3.11/lib-dynload").glob("_ssl.*.so"),
                                     *Path(pydantic_core.__file__).parent.glob("_pydantic_core*.so")))
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.fixture
def engine(image: str, prod_values: dict[str, Any]) -> Iterator[tuple[Any, Any, str]]:
    port = free_port()
    name = f"fdtest-engine-{os.getpid()}-{port}"
    values = copy.deepcopy(prod_values)
    values["serving"] |= {"host": "127.0.0.1", "port": port}
    values["container"]["name"] = name
    values["api_key"] = SECRET
    config = parse_config("prod", values)
    plan = build_plan("prod", config)
    subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", "-e", f"VLLM_API_KEY={KEY}", image,
                    "python3", "/standin.py", "--host", "127.0.0.1", "--port", str(port), "--api-key-env",
                    "VLLM_API_KEY", "--start-delay-s", "2", "--dp-size", str(config.parallelism.data)],
                   check=True, capture_output=True)
    try:
        yield config, plan, name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def _run(command: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ["PATH"]})  # no key in the deployer's environment


def test_the_planned_checks_pass_inside_the_engine_container(engine: tuple[Any, Any, str]) -> None:
    config, plan, name = engine
    smoke = [s for s in api_sections(plan) if s != "health"]
    assert smoke == ["models", "chat", "thinking", "stream", "auth"]
    health = api_command(config, plan, ["health"], "api-health")
    assert shlex.split(health.split(" <<'", 1)[0])[2:6] == ["docker", "exec", "-i", name]
    out = _run(health)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("PASS api-health")
    out = _run(api_command(config, plan, smoke, "api-smoke"))
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("PASS api-smoke") and KEY not in out.stdout + out.stderr


def test_a_stopped_engine_fails_in_seconds_not_after_the_deadline(engine: tuple[Any, Any, str]) -> None:
    config, plan, name = engine
    subprocess.run(["docker", "stop", "-t", "1", name], check=True, capture_output=True)
    out = _run(api_command(config, plan, ["health"], "api-health"))  # waiting for the deadline: _run's 120 s
    assert out.returncode != 0
    assert "is not running" in out.stderr
    # the health deadline + (1 + 3 requests per section) x DP ranks x golden pairs + 2, each within --timeout-s
    ranks = len([c for c in plan.checks if c.name.startswith("api-golden")])
    requests = (1 + 3) * ranks * len(config.api.smoke.golden) + 2
    assert f"timeout {3600 + 600 + requests * 300 + 120} " in api_command(config, plan, ["health"], "api-health")
