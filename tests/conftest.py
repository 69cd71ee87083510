"""Shared helpers: stack values read from the committed stack files, plus argv parsing for golden tests."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from stacks.model.errors import ConfigError, Problem  # noqa: E402
from stacks.model.loader import parse_config, read_stack_values  # noqa: E402
from stacks.planner.plan import Plan, build_plan  # noqa: E402

# Property tests judge results, never speed: no per-example deadline and no "too slow" health check, so a loaded
# machine (or a second test run on the same cores) cannot fail them. Tests that set their own settings keep them.
settings.register_profile("unhurried", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("unhurried")


@pytest.fixture
def prod_values() -> dict[str, Any]:
    return copy.deepcopy(read_stack_values("prod"))


@pytest.fixture
def h20_values() -> dict[str, Any]:
    return copy.deepcopy(read_stack_values("h20"))


def plan_of(values: dict[str, Any], stack: str = "test") -> Plan:
    return build_plan(stack, parse_config(stack, values))


def problems_of(values: dict[str, Any]) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        plan_of(values)
    return info.value.problems


def flag_pairs(args: list[str]) -> list[tuple[str, str | None]]:
    """`['--a', '1', '--b']` -> `[('--a', '1'), ('--b', None)]`, keeping order and repeats."""
    pairs: list[tuple[str, str | None]] = []
    for arg in args:
        if arg.startswith("--"):
            pairs.append((arg, None))
        elif pairs and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], arg)
        else:
            raise AssertionError(f"stray positional {arg!r}")
    return pairs


def clone_node(node: dict[str, Any], index: int) -> dict[str, Any]:
    """A copy of a node config with unique name, host and addresses (for N-node variants)."""
    new = copy.deepcopy(node)
    new["name"] = f"node{index + 1}"
    new["ssh"]["host"] = f"10.30.8.{index + 1}"
    new["management_ip"] = f"10.30.8.{index + 1}"
    new["data_ips"] = [f"1.1.{k + 1}.{100 + index}" for k in range(len(node.get("data_ips", [])))]
    return new


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs `-n N --dist loadgroup`), a test that uses a module-scoped fixture (an
    imported Docker image, a running nginx, a Ray head, the replacement matrix) runs on the worker that holds its
    module's other such tests, so each expensive fixture is built once per run, not once per worker. Everything
    else is spread test by test. Resource names (network namespaces, containers, images, ports) are unique per
    process, so workers and a second run on the same machine never collide."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = getattr(info, "name2fixturedefs", {})
        if any(d and d[-1].scope in ("module", "package") for d in defs.values()):
            module = getattr(item, "module", None)
            item.add_marker(pytest.mark.xdist_group(module.__name__ if module else item.nodeid))


@pytest.fixture
def textfile_dir() -> Any:
    """A folder for a supervisor unit's --metrics-file: not under /tmp (pytest's tmp_path), which the unit's
    PrivateTmp=yes hides from node_exporter and `supervisor-unit` therefore refuses."""
    import shutil
    import tempfile

    hidden = (Path("/tmp"), Path("/var/tmp"))
    base = Path.home() if any(h == ROOT or h in ROOT.parents for h in hidden) else ROOT  # a checkout under /tmp
    folder = Path(tempfile.mkdtemp(prefix=".vllm-cluster-textfile-", dir=base))
    yield folder
    shutil.rmtree(folder)
