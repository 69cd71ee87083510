"""The node-side commands, run as a node would: bash (and dash) runs the produced command, the sync runs inside a
Docker image that has Debian's python3 and boto3 (made with `docker import`, no registry), with host networking
to moto on loopback, credentials arriving on stdin the way `pulumi_command`'s `stdin` input sends them."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.python_ast import parse
from checks.weights_node import (
    CREDENTIAL_NAMES,
    MODULES,
    credentials_stdin,
    module_path,
    node_sync_command,
    node_verify_command,
    remote_script,
    weights_hash,
)
from checks.weights_verify import MANIFEST_NAME
from tests.docker_harness import PYTHON, SITE, STDLIB, build_image, docker_ready, remove_image, shared_libraries
from tests.weights_harness import Moto, checkpoint, moto_server, tree, upload

FILES = checkpoint([2.5, 1.5], tokenizer_mb=0.2)
BOTO_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")
_SKIP = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "__pycache__", "turtledemo"}


def _package_path(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def build_boto_image(tag: str, workdir: Path) -> str:
    """Debian's python3 (with the OpenSSL libraries its ssl module loads: urllib3 imports it) and boto3 with its
    dependencies (pure Python, copied from this venv): like vllm/vllm-openai, python3 and boto3."""
    archive = workdir / "weights-boto.tar"

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if _SKIP & set(Path(info.name).parts) else info

    with tarfile.open(archive, "w") as tar:
        ssl_modules = [STDLIB / "lib-dynload" / f"{m}.cpython-311-x86_64-linux-gnu.so" for m in ("_ssl", "_hashlib")]
        libraries = {lib for binary in [PYTHON, *ssl_modules] if binary.exists() for lib in shared_libraries(binary)}
        for lib in [PYTHON, *sorted(libraries)]:
            tar.add(lib.resolve(), arcname=str(lib).lstrip("/"))
        link = tarfile.TarInfo("usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        tar.addfile(link)
        for directory in ("tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(STDLIB, arcname=str(STDLIB).lstrip("/"), filter=keep)
        for package in BOTO_PACKAGES:
            path = _package_path(package)
            tar.add(path, arcname=f"{SITE}/{path.name}", filter=keep)
    subprocess.run(["docker", "import", str(archive), tag], check=True, capture_output=True)
    return tag


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    reason = docker_ready()
    assert reason is None, f"these tests need a Docker engine (`make services` starts dockerd): {reason}"
    suffix = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix="weights-images-"))
    tags = {"boto": f"weights-test-boto:{suffix}", "bare": f"weights-test-bare:{suffix}"}
    try:
        build_boto_image(tags["boto"], work)
        build_image(tags["bare"], work, with_vllm=False)
        yield tags
    finally:
        for tag in tags.values():
            remove_image(tag)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[Moto, str, str]]:
    """moto checking signatures: a sync only passes when the credentials really reached the container."""
    with moto_server() as server:
        upload(server.client(), "node-weights", "ds", FILES, multipart_mb=5)
        key_id, secret = server.enforce_auth()
        yield server, key_id, secret


@pytest.fixture
def wdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="weights-node-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def shell(command: str, stdin: str = "", sh: str = "bash", timeout_s: int = 300) -> subprocess.CompletedProcess[str]:
    """What `remote.Command` does over SSH: the login shell runs the command text, `stdin` on its standard input."""
    return subprocess.run([sh, "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout_s,
                          env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                               "HOME": tempfile.gettempdir()})


def verdict_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = done.stdout.strip().splitlines()
    assert lines, f"no verdict: rc={done.returncode} stderr={done.stderr[-1500:]}"
    assert "Traceback" not in done.stderr, done.stderr
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def test_remote_script_is_one_program_without_local_imports_or_name_clashes() -> None:
    script = remote_script()
    tree_ = parse(script)
    assert not [line for line in script.splitlines() if line.startswith(("from checks", "import checks",
                                                                          "from stacks", "import stacks"))]
    guards = [n for n in tree_.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(guards) == 1
    seen: dict[str, str] = {}
    clashes = []
    for module in MODULES:
        body = parse(module_path(module).read_text()).body
        for node in body:
            names = [node.name] if isinstance(node, ast.FunctionDef | ast.ClassDef) else [
                t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for name in names:
                if name in seen and name != "main":
                    clashes.append(f"{name} in {seen[name]} and {module}")
                seen[name] = module
    assert clashes == []


def test_commands_carry_no_credentials_and_refuse_bad_arguments() -> None:
    command = node_sync_command("s3://bucket/models/ds", "/data/models/ds", "vllm/vllm-openai:v0.33.0",
                                endpoint_url="https://minio.internal:9000", region="eu-west-1")
    first_line = command.splitlines()[0]
    for name in CREDENTIAL_NAMES:
        assert f"-e {name} " in command and f"{name}=" not in command.replace(f'{name}=*', "")
    assert "docker run --rm -i --network host --pull missing" in command
    assert "-v /data/models/ds:/data/models/ds --entrypoint python3 vllm/vllm-openai:v0.33.0 - sync" in command
    assert "--endpoint-url https://minio.internal:9000 --region eu-west-1" in command
    assert first_line.startswith("while IFS= read -r line")
    with pytest.raises(ValueError, match="is not an s3:// URL"):
        node_sync_command("https://bucket/x", "/data", "img")
    with pytest.raises(ValueError, match="is not an absolute path"):
        node_sync_command("s3://bucket/x", "data", "img")
    with pytest.raises(ValueError, match="carries credentials"):
        node_sync_command("s3://bucket/x", "/data", "img", endpoint_url="http://ak:sk@minio:9000")
    with pytest.raises(ValueError, match="/var is a system directory"):
        node_sync_command("s3://bucket/x", "/var", "img")
    with pytest.raises(ValueError, match="names a bucket without a prefix"):
        node_sync_command("s3://bucket", "/data/models/ds", "img")
    assert node_verify_command("/var").startswith("timeout 3600 python3 - verify --dest /var"), "verify only reads"
    with pytest.raises(ValueError, match="line break"):
        credentials_stdin("AKIA", "secret\nAWS_SESSION_TOKEN=x")
    verify = node_verify_command("/data/models/ds", image="vllm/vllm-openai:v0.33.0")
    assert "--network none" in verify and "-v /data/models/ds:/data/models/ds:ro" in verify
    assert node_verify_command("/data/models/ds").startswith("timeout 3600 python3 - verify --dest /data/models/ds")


@pytest.mark.parametrize("sh", ["bash", "dash"])
def test_sync_runs_in_the_image_with_credentials_from_stdin(images: dict[str, str], store: tuple[Moto, str, str],
                                                            wdir: Path, sh: str) -> None:
    if shutil.which(sh) is None:
        pytest.fail(f"{sh} is not installed (Debian's dash is part of the base system)")
    server, key_id, secret = store
    dest = wdir / "data" / "models" / "DeepSeek-V4-Flash"
    command = node_sync_command("s3://node-weights/ds", str(dest), images["boto"], endpoint_url=server.endpoint,
                                workers=4, part_size_mb=1, pull="never", name="weights-node1")
    assert secret not in command and key_id not in command
    done = shell(command, credentials_stdin(key_id, secret), sh=sh)
    verdict = verdict_of(done)
    assert done.returncode == 0 and verdict["status"] == "pass", verdict
    assert verdict["check"] == "weights-node1"
    assert tree(str(dest)) == FILES and (dest / MANIFEST_NAME).exists()
    assert secret not in done.stdout + done.stderr
    digest = verdict["details"]["hash"]
    assert verdict["details"]["hash_kind"] == "content-sha256" and "--content" in command
    assert weights_hash(done.stdout) == digest
    # the completeness check, in the image without network and on the node's own python3, agrees on the hash
    for image in (images["boto"], None):
        check = shell(node_verify_command(str(dest), image=image, expect_hash=digest, pull="never"))
        result = verdict_of(check)
        assert check.returncode == 0 and result["details"]["hash"] == digest, result
        assert weights_hash(check.stdout) == digest
    plain = shell(node_verify_command(str(dest), pull="never", as_json=False))
    assert plain.stdout.startswith("PASS weights:") and weights_hash(plain.stdout) == digest
    (dest / "model-00002-of-00002.safetensors").unlink()
    check = shell(node_verify_command(str(dest), image=images["boto"], pull="never"))
    result = verdict_of(check)
    assert check.returncode == 1 and "model-00002-of-00002.safetensors" in result["summary"]
    assert result["details"]["hash"] and weights_hash(check.stdout) is None, "a failing node exports no hash"
    text = shell(node_verify_command(str(dest), image=images["boto"], pull="never", as_json=False))
    assert text.returncode == 1 and text.stdout.startswith("FAIL weights:") and weights_hash(text.stdout) is None


def test_sync_without_credentials_on_stdin_cannot_run(images: dict[str, str], store: tuple[Moto, str, str],
                                                      wdir: Path) -> None:
    server, _, _ = store
    command = node_sync_command("s3://node-weights/ds", str(wdir / "m"), images["boto"],
                                endpoint_url=server.endpoint, pull="never")
    done = shell(command, "")
    verdict = verdict_of(done)
    assert done.returncode == 2 and "no usable credentials" in verdict["summary"]


def test_an_image_without_boto3_cannot_run_and_says_so(images: dict[str, str], store: tuple[Moto, str, str],
                                                       wdir: Path) -> None:
    server, key_id, secret = store
    command = node_sync_command("s3://node-weights/ds", str(wdir / "m"), images["bare"],
                                endpoint_url=server.endpoint, pull="never")
    done = shell(command, credentials_stdin(key_id, secret))
    verdict = verdict_of(done)
    assert done.returncode == 2 and "boto3 is not importable" in verdict["summary"]


def test_the_node_command_fits_one_argv_string() -> None:
    """The sync runs as one `sh -c` string (over SSH, and in the tests' shell): Linux refuses a single argument over
    MAX_ARG_STRLEN (131072 bytes, E2BIG 'Argument list too long'). The pasted modules (masking, s3_source, verdict,
    weights_*) grow with every rule: this says so here, without Docker, before a node does."""
    from checks.weights_node import node_sync_command

    longest = node_sync_command("s3://node-weights/" + "p" * 200, "/data/models/" + "d" * 200, "r" * 200 + ":t",
                                endpoint_url="https://minio.internal:9000", region="us-east-1", delete=True,
                                versions=True)
    assert len(longest.encode()) < 131072 - 512, len(longest.encode())
