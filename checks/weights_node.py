"""The shell commands that run the weight sync and the completeness check on a node (pure: no Pulumi, no boto3).

A node is assumed to have Docker and the stack's images and nothing else, so the sync runs in the engine image:
vLLM's `docker/Dockerfile` (upstream commit 0000977e) installs boto3 into the `vllm-openai-base` stage
(`uv pip install … boto3 runai-model-streamer runai-model-streamer[s3]`); the 0.33.0 wheel's METADATA does not
require boto3, its S3 helpers (`vllm/transformers_utils/s3_utils.py`) import it optionally. An image without
boto3 gives exit 2 naming it.

The program travels as one heredoc on the container's stdin (`python3 - sync …`), like `checks.bundle`.
Credentials never appear in the command: `pulumi_command`'s remote `Command` sends its `stdin` input
(a secret Output) over the SSH channel; the command reads `NAME=VALUE` lines from it into its own environment
and `docker run -e NAME` (no value) copies them into the container. The remote `environment` input would need
`AcceptEnv` in every node's sshd, so it is not used.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
from pathlib import Path

from checks.python_ast import parse
from checks.weights import check_dest, check_sync_dest
from stacks.model.s3_source import (
    DEFAULT_PART_MB,
    DEFAULT_WORKERS,
    MAX_WORKERS,
    SYNC_TIMEOUT_S,
    CannotRun,
    check_endpoint,
    parse_source,
)

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("stacks.model.masking", "stacks.model.s3_source", "checks.verdict", "checks.weights_verify",
           "checks.weights_versions", "checks.weights")
"""Pasted in this order; each later one imports names from the earlier ones (`stacks.model.s3_source`: the source
rule the stack file is validated by too, standard library only; `stacks.model.masking`: what every verdict masks)."""
CREDENTIAL_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
PASS_THROUGH = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")
"""Proxy settings of the node's shell, passed by name when set (a node that reaches S3 through a proxy)."""
MARKER = "VLLM_CLUSTER_WEIGHTS_EOF"
VERIFY_TIMEOUT_S = 3600
"""`--content` reads every file: 511 GB in an hour needs 142 MB/s, far below one NVMe drive or a few cores of
sha256 (docs/weights.md, "Content digests")."""
_LOCAL_IMPORT = re.compile(rf"^from (?:{'|'.join(map(re.escape, MODULES))}) import (\([^)]*\)|.*)$\n", re.M)
"""An import of one of MODULES (pasted before the importer); any other project import stays and fails the test."""
_MAIN_GUARD = re.compile(r"^if __name__ == \"__main__\":\n    sys\.exit\(main\(\)\)\n", re.M)
_FUTURE = "from __future__ import annotations\n"
_HASH = re.compile(r"\b(?:manifest|listing|content)-sha256=([0-9a-f]{64})\b")


def module_path(module: str) -> Path:
    """The file of a module of MODULES (`checks.verdict` -> checks/verdict.py)."""
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


@functools.cache  # the same files for every node: read and pasted once per process
def remote_script() -> str:
    """s3_source + verdict + weights_verify + weights as one script: local imports removed, one `__main__` guard
    (the last)."""
    parts = []
    for i, module in enumerate(MODULES):
        path = module_path(module)
        source = path.read_text().replace(_FUTURE, "")
        source = _LOCAL_IMPORT.sub("", source)
        if i < len(MODULES) - 1:
            source = _MAIN_GUARD.sub("", source)
        parts.append(f"# ---- {path.relative_to(ROOT)}\n{compact(source)}")
    script = _FUTURE + "\n".join(parts)
    if MARKER in script:
        raise ValueError(f"the script contains the heredoc marker {MARKER}")
    return script


def compact(source: str) -> str:
    """The module without its docstrings and comments (`ast.unparse`): the script travels as one `sh -c` word,
    which Linux caps at 131072 bytes (MAX_ARG_STRLEN), and the docstrings are most of its size."""
    tree = parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def credentials_stdin(access_key_id: str, secret_access_key: str, session_token: str | None = None) -> str:
    """What the Command's `stdin` input carries (build it inside an apply over the secret Outputs)."""
    values = {"AWS_ACCESS_KEY_ID": access_key_id, "AWS_SECRET_ACCESS_KEY": secret_access_key}
    if session_token:
        values["AWS_SESSION_TOKEN"] = session_token
    for name, value in values.items():
        if not value or any(c in value for c in "\r\n\x00"):
            raise ValueError(f"{name} is empty or contains a line break")
    return "".join(f"{name}={value}\n" for name, value in values.items())


def _read_credentials() -> str:
    """POSIX sh: NAME=VALUE lines from stdin into the environment, only the three AWS names; the last line may
    lack its newline. Nothing is echoed."""
    names = "|".join(f"{n}=*" for n in CREDENTIAL_NAMES)
    return (f'while IFS= read -r line || [ -n "$line" ]; do case "$line" in {names}) export "$line";; esac; '
            'done; unset line\n')


def _docker(image: str, dest: str, network: str, read_only: bool, pull: str, env_names: tuple[str, ...]) -> str:
    env = [part for name in env_names for part in ("-e", name)]
    mount = f"{dest}:{dest}" + (":ro" if read_only else "")
    return shlex.join(["docker", "run", "--rm", "-i", "--network", network, "--pull", pull, *env, "-v", mount,
                       "--entrypoint", "python3", image])


def node_sync_command(source: str, dest: str, image: str, endpoint_url: str | None = None,
                      region: str | None = None, workers: int = DEFAULT_WORKERS, part_size_mb: int = DEFAULT_PART_MB,
                      delete: bool = False, name: str = "weights-sync", timeout_s: int = SYNC_TIMEOUT_S,
                      pull: str = "missing", as_json: bool = True, content: bool = True,
                      versions: bool = False) -> str:
    """`<read credentials from stdin>; timeout N docker run … IMAGE - sync ARGS <<'EOF' script EOF`.

    With `versions` the sync writes `DEST@<version>` beside `dest` (checks/weights_versions.py), so the parent of
    `dest` is mounted instead of `dest`; the verdict names the directory (`weights_version_dir`).

    With `content` (the default) the sync re-hashes what is already present and reports the `content-sha256`, the
    hash `weights-match` compares across nodes: a shard changed in place with its size kept makes it differ.

    Runs `python -m checks.weights sync` inside `image` with host networking (the node's route to the store) and
    `dest` mounted read-write at the same path. Exit code and verdict are the program's (0/1/2); 124 is the timeout,
    125 a docker error. ValueError for arguments the program would refuse, so a bad config fails at preview."""
    try:
        parse_source(source)
        dest = check_sync_dest(dest)
        if endpoint_url:
            check_endpoint(endpoint_url)
    except CannotRun as exc:
        raise ValueError(str(exc)) from exc
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers {workers}: must be 1..{MAX_WORKERS}")
    if pull not in ("missing", "never", "always"):
        raise ValueError(f"pull {pull!r}: one of missing, never, always")
    args = ["sync", "--source", source, "--dest", dest, "--workers", str(workers), "--part-size-mb",
            str(part_size_mb), "--name", name]
    if endpoint_url:
        args += ["--endpoint-url", endpoint_url]
    if region:
        args += ["--region", region]
    if delete:
        args.append("--delete")
    if content:
        args.append("--content")
    if versions:
        args.append("--versions")
    if as_json:
        args.append("--json")
    mount = os.path.dirname(dest) if versions else dest
    docker = _docker(image, mount, "host", False, pull, CREDENTIAL_NAMES + PASS_THROUGH)
    return (f"{_read_credentials()}timeout {int(timeout_s)} {docker} - {shlex.join(args)} <<'{MARKER}'\n"
            f"{remote_script()}\n{MARKER}")


def node_verify_command(dest: str, image: str | None = None, expect_hash: str | None = None,
                        name: str = "weights", timeout_s: int = VERIFY_TIMEOUT_S, pull: str = "missing",
                        as_json: bool = True, content: bool = True) -> str:
    """The completeness check, for synced and for hand-copied directories: in `image` with no network and `dest`
    mounted read-only, or with the node's own `python3` when `image` is None (the preflight's way). With `content`
    (the default) every file is hashed, so the hash it reports changes when any file's bytes do."""
    try:
        dest = check_dest(dest)
    except CannotRun as exc:
        raise ValueError(str(exc)) from exc
    args = ["verify", "--dest", dest, "--name", name]
    if expect_hash:
        args += ["--expect-hash", expect_hash]
    if content:
        args.append("--content")
    if as_json:
        args.append("--json")
    runner = f"{_docker(image, dest, 'none', True, pull, ())} " if image else "python3 "
    return f"timeout {int(timeout_s)} {runner}- {shlex.join(args)} <<'{MARKER}'\n{remote_script()}\n{MARKER}"


def weights_hash(stdout: str) -> str | None:
    """The hash a passing sync or verify run reported (JSON verdict's `details.hash`, else the `content-sha256=` /
    `manifest-sha256=` / `listing-sha256=` token of a `PASS` line): the value to export per node and compare across
    nodes. None when the run did not pass, so a broken node never exports a hash that could match."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            verdict = json.loads(line)
        except ValueError:
            found = _HASH.search(line)
            if line.startswith("PASS ") and found:
                return found.group(1)
            continue
        if not isinstance(verdict, dict) or verdict.get("status") != "pass":
            continue
        value = verdict.get("details", {}).get("hash")
        if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    return None


PRUNE_TIMEOUT_S = 600


def node_prune_command(dest: str, keep: str, keep_last: int, sudo: bool = False, name: str = "weights-prune",
                       timeout_s: int = PRUNE_TIMEOUT_S) -> str:
    """Old version directories beside `dest` removed on the node's own python3 (it asks the node's Docker which
    directories containers mount; `sudo -n` where the SSH user is not root: the sync wrote them as root in the
    image). `keep`: the version the engines now mount."""
    try:
        dest = check_sync_dest(dest)
    except CannotRun as exc:
        raise ValueError(str(exc)) from exc
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last}: at least 1")
    args = ["prune", "--dest", dest, "--keep", keep, "--keep-last", str(keep_last), "--name", name, "--json"]
    runner = "sudo -n python3 " if sudo else "python3 "
    return f"timeout {int(timeout_s)} {runner}- {shlex.join(args)} <<'{MARKER}'\n{remote_script()}\n{MARKER}"


def weights_version_dir(stdout: str) -> str | None:
    """The version directory a passing `sync --versions` reported (`details.version_dir` of its JSON verdict, else the
    `version-dir=` token of a PASS line); None otherwise (a failed sync, or one before versions)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            verdict = json.loads(line)
        except ValueError:
            found = re.search(r"; version-dir=(/\S+)$", line)
            if line.startswith("PASS ") and found:
                return found.group(1)
            continue
        if isinstance(verdict, dict) and verdict.get("status") == "pass":
            value = verdict.get("details", {}).get("version_dir")
            if isinstance(value, str) and value.startswith("/"):
                return value
    return None
