"""The plan of a stack at another git revision, computed by that revision's own code.

A PR that edits `stacks/planner/launch.py` changes what gets deployed as much as one that edits the stack file,
so the base plan comes from `git archive <ref>` run with the base's `python -m stacks plan --json`. Where
the base has no plan command that prints JSON, the working tree's code plans the base's stack file instead
(and says so).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from stacks.model.errors import ConfigError
from stacks.model.loader import load_stack
from stacks.model.project import STACKS_VENV
from stacks.planner.plan import build_plan
from stacks.planner.stack_plan import build_stack

PREFIX = "vllm-cluster:"


class BaseError(Exception):
    pass


def _commit(root: Path, ref: str) -> str:
    """The commit `ref` names, resolved before any other git call: a value starting with `-` would be read as an
    option (`--output=FILE` truncates a file), so it is refused, and only a commit id reaches `git archive`."""
    if not ref or ref.startswith("-") or any(c.isspace() or ord(c) < 32 for c in ref):
        raise BaseError(f"--base {ref[:60]!r}: not a git revision; e.g. origin/main, HEAD~1 or a commit id")
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", "--end-of-options",
                           f"{ref}^{{commit}}"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise BaseError(f"--base {ref[:60]!r}: no such commit in {root}; e.g. origin/main, HEAD~1 or a commit id")
    return done.stdout.strip()


def _archive(root: Path, ref: str, into: Path) -> None:
    commit = _commit(root, ref)
    done = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit], capture_output=True)
    if done.returncode != 0:
        raise BaseError(f"git archive {ref} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(into, filter=_safe_or_skipped)


def _safe_or_skipped(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, but a member it refuses (an absolute symlink committed by mistake, a link out of the
    tree) is left out instead of failing the whole diff: planning the base reads none of them."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


def base_plan(stack: str, ref: str, root: Path, assume_secret: Sequence[str] = ()
              ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
    """(plan JSON or None when invalid, the base's problems, how it was computed); `assume_secret` plans both
    sides as if those secrets were set, as `plan --assume-secret` does."""
    with tempfile.TemporaryDirectory(prefix="vllm-cluster-base-") as tmp:
        checkout = Path(tmp)
        _archive(root, ref, checkout)
        if not (checkout / f"Pulumi.{stack}.yaml").exists():
            raise BaseError(f"{ref} has no Pulumi.{stack}.yaml: the stack is new in this change, so there is "
                            f"nothing to compare; review its whole plan: {STACKS_VENV} plan {stack} "
                            "(--json for a file)")
        try:
            assumed = [word for key in assume_secret for word in ("--assume-secret", key)]
            done = subprocess.run([sys.executable, "-m", "stacks", "plan", stack, "--json", *assumed], cwd=checkout,
                                  capture_output=True, text=True, timeout=120,
                                  env={"VLLM_CLUSTER_ROOT": str(checkout), "PATH": "/usr/bin:/bin"})
        except subprocess.TimeoutExpired:  # the base's own code hangs: plan its stack file with this code
            done = subprocess.CompletedProcess([], 3, "", "its planner did not answer within 120 s")
        how = f"planned by the code at {ref}"
        if not (checkout / "stacks" / "__main__.py").is_file():  # a user's project: the installed code plans it
            how = f"the project at {ref}, planned by the installed vllm-cluster (its own cards at {ref})"
        if done.returncode not in (0, 2) or not done.stdout.strip().startswith("{"):
            try:
                # build_stack: a stack with groups is planned group by group (build_plan refuses it)
                return (build_stack(stack, load_stack(stack, root=checkout, assume_secret=assume_secret)
                                    ).to_json_dict(), [],
                        f"the stack file at {ref}, planned by the working tree's code (the base cannot plan: "
                        f"{(done.stderr.strip().splitlines() or ['no JSON'])[-1][:160]})")
            except ConfigError as exc:
                return None, [p.as_dict() for p in exc.problems], "the working tree's code"
        data = json.loads(done.stdout)
        if done.returncode == 2 or data.get("valid") is False:
            return None, list(data.get("errors", [])), how
        if "summary" not in data:  # code older than the memory summary: this code's memory model, said so
            try:
                data["summary"] = build_plan(stack, load_stack(stack, root=checkout)).summary.model_dump(mode="json")
                how += "; its memory figures by the working tree's memory model"
            except ConfigError:
                pass
        return data, [], how


def secure_values(text: str) -> dict[str, str]:
    """Config key (`api_key`, `proxy_keys.team-a`) -> its encrypted value, for every `secure:` value of a stack
    file's `vllm-cluster:` config. The ciphertexts only: nothing here can decrypt them."""
    yaml = YAML(typ="safe")
    try:
        document = yaml.load(text) or {}
    except YAMLError:
        return {}
    found: dict[str, str] = {}

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict):
            if set(value) == {"secure"} and isinstance(value["secure"], str):
                found[path] = value["secure"]
                return
            for key, item in value.items():
                walk(f"{path}.{key}", item)

    config = document.get("config") if isinstance(document, dict) else None
    for key, value in (config or {}).items():
        if isinstance(key, str) and key.startswith(PREFIX):
            walk(key[len(PREFIX):], value)
    return found


def secret_changes(stack: str, ref: str, root: Path) -> dict[str, str]:
    """Secret key -> changed / set / removed between the stack file at `ref` and the working tree's, by their
    ciphertexts (a changed ciphertext is a new value, or the same value encrypted again)."""
    done = subprocess.run(["git", "-C", str(root), "show", f"{_commit(root, ref)}:Pulumi.{stack}.yaml"],
                          capture_output=True, text=True)
    base = secure_values(done.stdout) if done.returncode == 0 else {}
    path = root / f"Pulumi.{stack}.yaml"
    head = secure_values(path.read_text()) if path.exists() else {}
    out = {k: "changed" for k in base if k in head and base[k] != head[k]}
    out |= {k: "set" for k in head if k not in base} | {k: "removed" for k in base if k not in head}
    return out
