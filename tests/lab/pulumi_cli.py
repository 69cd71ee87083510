"""The real Pulumi CLI, run on a copy of this project against a local backend, as a user runs it.

Everything it prints goes to `<workdir>/logs/NN-<what>.log` too: a failed workflow leaves its evidence there, and
the secret scan reads every log afterwards. Nothing reaches outside: the toolchain's plugins are on PATH, plugin
downloads and update checks are off, and the backend is a directory (`file://`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

PASSPHRASE = "lab-passphrase-not-secret"
"""Encrypts the lab stack's secrets in the local backend; a lab-only value, printed nowhere else."""


def toolchain_bin() -> Path:
    """The directory `make toolchain` prints last (a cold build ~10 min on 2 cores; a cache hit after)."""
    done = subprocess.run(["bash", str(ROOT / "toolchain" / "build.sh")], capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"make toolchain failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def copy_project(target: Path) -> Path:
    """The tracked files of this checkout (and its venv, linked, for the program and the policy pack), so a run
    never writes into the checkout."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / "venv").symlink_to(ROOT / "venv")
    # The policy pack's runtime says `virtualenv: venv` (policy/PulumiPolicy.yaml): this venv has pulumi-policy.
    (target / "policy" / "venv").symlink_to(ROOT / "venv")
    return target


@dataclass
class Done:
    argv: list[str]
    code: int
    out: str
    log: Path

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class PulumiCli:
    project: Path
    bin_dir: Path
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    count: int = 0

    def env(self) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        backend = self.workdir / "backend"
        backend.mkdir(exist_ok=True)
        return {
            "PATH": f"{self.bin_dir}:{self.project / 'venv' / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "PULUMI_HOME": str(home / ".pulumi"),
            "PULUMI_BACKEND_URL": f"file://{backend}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "LANG": "C.UTF-8",
            **self.extra_env,
        }

    def run(self, *argv: str, what: str, stdin: str | None = None, timeout_s: float = 1800,
            check: bool = True) -> Done:
        """`pulumi ARGV` in the project; raises with the output's tail unless `check` is false."""
        full = ["pulumi", *argv, "--non-interactive"]
        return self._logged(full, " ".join(full), f"pulumi {' '.join(argv)}", what, stdin, timeout_s, check, 6000)

    def python(self, *argv: str, what: str, check: bool = True) -> Done:
        """`venv/bin/python ARGV` in the project with the CLI's environment (e.g. `-m stacks rollback`)."""
        done = self._logged([str(self.project / "venv" / "bin" / "python"), *argv], f"python {' '.join(argv)}",
                            f"python {' '.join(argv)}", what, None, 600, check, 4000)
        return Done(list(argv), done.code, done.out, done.log)

    def _logged(self, argv: list[str], shown: str, name: str, what: str, stdin: str | None, timeout_s: float,
                check: bool, tail: int) -> Done:
        """Run `argv` in the project with the CLI's environment; its output (stderr after stdout) goes to
        `logs/NN-<what>.log` under the `$ shown` line, and a failure raises with the last `tail` characters."""
        self.count += 1
        log = self.workdir / "logs" / f"{self.count:02d}-{what}.log"
        log.parent.mkdir(exist_ok=True)
        done = subprocess.run(argv, cwd=self.project, env=self.env(), input=stdin, capture_output=True, text=True,
                              timeout=timeout_s)
        out = done.stdout + (f"\n--- stderr ---\n{done.stderr}" if done.stderr else "")
        log.write_text(f"$ {shown}\n(exit {done.returncode})\n{out}")
        if check and done.returncode != 0:
            raise AssertionError(f"{name} exited {done.returncode} (log {log}):\n{out[-tail:]}")
        return Done(argv, done.returncode, done.stdout, log)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted((self.workdir / "logs").glob("*.log")))


def ssh_agent(key: Path, workdir: Path) -> tuple[dict[str, str], int]:
    """An ssh-agent holding the lab key: the Docker provider's `ssh` finds it as a user's agent (docs/deploy.md)."""
    sock = workdir / "agent.sock"
    out = subprocess.run(["ssh-agent", "-s", "-a", str(sock)], capture_output=True, text=True, check=True).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    env = {"SSH_AUTH_SOCK": str(sock), "SSH_AGENT_PID": str(pid)}
    subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, **env}, check=True, capture_output=True)
    return env, pid
