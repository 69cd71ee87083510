"""Every input the program sends exists in the provider plugins built here (toolchain/), for every committed stack
and example: the Python SDKs are pinned to those providers (requirements.txt), and this shows the program uses no
input the built docker 5.1.0 and command 1.2.1 plugins lack, on the paths the lab does not deploy too (the front
door's nginx, the monitoring, Ray, wide EP). The schemas come from the plugins themselves
(`pulumi package get-schema <plugin>`), not from a copy."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from review.config_mutations import canonical
from review.registrations import register
from stacks.model.loader import read_stack_values
from tests.conftest import ROOT
from tests.lab.pulumi_cli import toolchain_bin
from tests.test_program_proxy import SECRETS

STACKS = [("prod", ROOT), ("h20", ROOT), *((p.name[len("Pulumi."):-len(".yaml")], ROOT / "examples")
                                            for p in sorted((ROOT / "examples").glob("Pulumi.*.yaml")))]


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict[str, Any]]:
    bin_dir = toolchain_bin()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PULUMI_SKIP_UPDATE_CHECK": "true",
           "PULUMI_HOME": str(Path(os.environ.get("TMPDIR", "/tmp")) / "vllm-cluster-schema-home")}
    out = {}
    for plugin in ("docker", "command"):
        done = subprocess.run(["pulumi", "package", "get-schema", str(bin_dir / f"pulumi-resource-{plugin}")],
                              capture_output=True, text=True, env=env, timeout=300, check=True)
        out[plugin] = json.loads(done.stdout)
    return out


def _inputs(schema: dict[str, Any], type_: str) -> set[str]:
    """The inputs a resource type takes; a provider's own (`pulumi:providers:docker`) are the schema's `provider`."""
    if type_.startswith("pulumi:providers:"):
        return set(schema.get("provider", {}).get("inputProperties", {}))
    return set((schema["resources"].get(type_) or {}).get("inputProperties", {}))


def _plugin(type_: str) -> str:
    return type_.rsplit(":", 1)[-1] if type_.startswith("pulumi:providers:") else type_.split(":", 1)[0]


@pytest.mark.parametrize(("stack", "root"), STACKS, ids=[s for s, _ in STACKS])
def test_every_input_the_program_sends_is_in_the_built_providers(schemas: dict[str, dict[str, Any]], stack: str,
                                                                 root: Path) -> None:
    values, secrets = canonical(read_stack_values(stack, root))
    seen: dict[str, set[str]] = {}
    for reg in register(stack, values, {**SECRETS, **secrets}):
        if _plugin(reg.type) in schemas:
            seen.setdefault(reg.type, set()).update(reg.inputs)
    assert {"docker:index/container:Container", "command:remote:Command", "pulumi:providers:docker"} <= set(seen), \
        f"{stack}: the program registered {sorted(seen)}"
    missing = {t: sorted(keys - _inputs(schemas[_plugin(t)], t)) for t, keys in seen.items()}
    missing = {t: keys for t, keys in missing.items() if keys}
    assert not missing, f"{stack}: inputs the built providers do not know: {missing}"
