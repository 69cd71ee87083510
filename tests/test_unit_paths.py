"""Units for a project whose path holds spaces (`vllm-cluster init "My Clusters"` is accepted, so its units must
work): each path is written where systemd reads the space as part of it. Checked by splitting the unit as systemd
does, and with `systemd-analyze verify` where it is installed (it resolves ExecStart's program and refuses a
WorkingDirectory= that is not one absolute path)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from heal.supervisor_unit import render_supervisor_unit
from heal.watch_unit import render_watch_unit
from tests.conftest import ROOT


def directive(unit: str, key: str) -> str:
    [value] = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}=")]
    return value


def systemd_words(value: str) -> list[str]:
    """A command line or path list split as systemd.service(5) says: double-quoted words with C escapes, `$$` and
    `%%` for `$` and `%` (the units hold neither unescaped)."""
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(value, posix=True)]


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "VLLM_CLUSTER_ROOT"}
    return subprocess.run([sys.executable, "-m", "vllm_cluster", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**clean, "PYTHONPATH": str(ROOT)})


def test_a_project_with_a_space_in_its_path_gets_working_units(tmp_path: Path) -> None:
    project = tmp_path / "My Clusters"
    assert _run("init", str(project), cwd=tmp_path).returncode == 0
    for argv in (["watch-unit", "two-node", "--assume-secret", "api_key"],
                 ["supervisor-unit", "two-node", "--assume-secret", "api_key", "--user", "ops"]):
        done = _run(*argv, cwd=project)
        assert done.returncode == 0, done.stderr
        assert directive(done.stdout, "WorkingDirectory") == str(project)  # the rest of the line, unquoted
        assert systemd_words(directive(done.stdout, "ExecStart"))[:2] == [sys.executable, "-m"]


def test_spaced_paths_split_back_exactly_and_systemd_accepts_the_unit(tmp_path: Path) -> None:
    venv = tmp_path / "my venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    project = tmp_path / "My Clusters"
    project.mkdir()
    python, prom, ca = str(venv / "python"), str(project / "vllm.prom"), str(project / "ca.pem")
    unit = render_supervisor_unit(stack="two-node", python=python, workdir=str(project), env_file="/etc/x.env",
                                  user="ops", metrics_file=prom, ca_file=ca)
    assert systemd_words(directive(unit, "ExecStart")) == [python, "-m", "stacks", "supervise", "two-node",
                                                            "--metrics-file", prom, "--ca-file", ca]
    assert systemd_words(directive(unit, "ReadWritePaths")) == ["/run/lock", str(project)]
    assert directive(unit, "WorkingDirectory") == str(project)
    watch = render_watch_unit(stack="two-node", python=python, workdir=str(project), url="http://10.0.0.1:8000",
                              served_name="m", dp_size=1, rank_nodes=[], ca_file=ca)
    assert systemd_words(directive(watch, "ExecStart"))[0] == python and ca in systemd_words(directive(watch,
                                                                                                       "ExecStart"))
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the unit was checked by splitting only")
    for name, text in (("vllm-cluster-supervisor-two-node.service", unit), ("vllm-cluster-watch-two-node.service",
                                                                           watch)):
        (tmp_path / name).write_text(text)
        done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / name)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("field", "value", "said"), [
    ("env_file", "/etc/my env/x.env", "--env-file '/etc/my env/x.env': no space, tab"),
    ("workdir", "/srv/clusters ", "--workdir '/srv/clusters ': no space, tab"),
    ("workdir", "/srv/my\tclusters", "--workdir '/srv/my\\tclusters': no tab"),
])
def test_a_space_where_systemd_would_split_or_strip_it_is_refused(field: str, value: str, said: str) -> None:
    paths = {"python": "/usr/bin/python3", "workdir": "/srv/clusters", "env_file": "/etc/x.env"} | {field: value}
    with pytest.raises(ValueError) as refused:
        render_supervisor_unit(stack="two-node", user="ops", **paths)
    assert str(refused.value).startswith(said), refused.value
