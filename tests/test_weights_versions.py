"""Version directories: a new revision of the source is synced beside the old one (unchanged files hard-linked, the
old directory never written), and old versions are removed only where no container mounts them. The sync runs as
its own process against moto in server mode on loopback, as in tests/test_weights.py."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks import weights
from checks.weights_node import node_prune_command, node_sync_command, weights_version_dir
from checks.weights_verify import LOCK_NAME, MANIFEST_NAME, manifest_hash
from checks.weights_versions import prune, prune_plan, reuse_unchanged, version_dir, versions_beside
from tests.conftest import ROOT
from tests.waiting import wait_for
from tests.weights_harness import Moto, checkpoint, moto_server, tree, upload

BUCKET = "ckpt"
FILES = checkpoint([2.0, 1.2, 0.8], tokenizer_mb=0.2)
SHARDS = sorted(k for k in FILES if k.endswith(".safetensors"))
NEXT = {**FILES, SHARDS[1]: FILES[SHARDS[1]][:-4] + b"\x01\x02\x03\x04", "config.json": FILES["config.json"] + b"\n"}
"""The next revision: one shard's last bytes and config.json changed; every other file the same object."""


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    with moto_server() as server:
        yield server


@pytest.fixture
def wdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="weights-versions-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(),
            "AWS_ACCESS_KEY_ID": "AKIAWEIGHTSTEST00000", "AWS_SECRET_ACCESS_KEY": "weights-test-secret-key",
            "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true"}


def _cli(*args: str, environ: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-m", "checks.weights", *args, "--json"], cwd=ROOT, text=True,
                          capture_output=True, env=environ or _env(), timeout=240)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line, got: {done.stdout!r} / {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(lines[0]), done.stdout


def _sync(moto: Moto, prefix: str, dest: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    return _cli("sync", "--source", f"s3://{BUCKET}/{prefix}", "--dest", str(dest), "--endpoint-url",
                moto.endpoint, "--part-size-mb", "1", "--workers", "4", "--progress-s", "0", "--content", *extra)


def _state(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every file under root: (inode, size, mtime_ns, sha256): what 'untouched' means."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            info = path.stat()
            out[str(path.relative_to(root))] = (info.st_ino, info.st_size, info.st_mtime_ns,
                                                hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def _prefix(name: str, files: dict[str, bytes], moto: Moto) -> str:
    upload(moto.client(), BUCKET, name, files, multipart_mb=5)
    return name


def test_a_new_revision_lands_beside_the_old_one_and_links_what_did_not_change(moto: Moto, wdir: Path) -> None:
    prefix = _prefix("models/rev", FILES, moto)
    base = wdir / "DeepSeek"
    code, first, stdout = _sync(moto, prefix, base, "--versions")
    assert code == 0, first
    v1 = Path(first["details"]["version_dir"])
    assert v1.parent == wdir and v1.name.startswith("DeepSeek@") and len(v1.name) == len("DeepSeek@") + 16
    assert weights_version_dir(stdout) == str(v1) and first["summary"].endswith(f"; version-dir={v1}")
    assert not base.exists(), "--dest itself is never written with --versions"
    assert tree(str(v1)) == FILES
    listing = moto.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]
    assert v1.name.endswith(manifest_hash(weights.Entry(o["Key"][len(prefix) + 1:], o["Size"], o["ETag"].strip('"'))
                                          for o in listing)[:16]), "the name is the listing's manifest hash"
    before = _state(v1)

    upload(moto.client(), BUCKET, prefix, NEXT, multipart_mb=5)  # the same prefix, a new revision
    code, second, stdout = _sync(moto, prefix, base, "--versions")
    assert code == 0, second
    v2 = Path(second["details"]["version_dir"])
    assert v2 != v1 and v2.parent == wdir and weights_version_dir(stdout) == str(v2)
    assert tree(str(v2)) == NEXT
    assert _state(v1) == before, "the old version's files are untouched (inode, size, mtime, bytes)"
    changed = {SHARDS[1], "config.json"}
    assert sorted(second["details"]["fetch_files"]) == sorted(changed)
    assert sorted(second["details"]["linked_files"]) == sorted(set(FILES) - changed)
    assert second["details"]["linked_from"] == [str(v1)]
    for key in set(FILES) - changed:
        assert (v2 / key).stat().st_ino == (v1 / key).stat().st_ino, f"{key} is a hard link, not a copy"
    for key in changed:
        assert (v2 / key).stat().st_ino != (v1 / key).stat().st_ino
    # the same revision again: its directory is complete, nothing fetched or linked
    code, again, _ = _sync(moto, prefix, base, "--versions")
    assert code == 0 and again["details"]["version_dir"] == str(v2)
    assert again["details"]["fetch_files"] == [] and again["details"]["linked_files"] == []
    # back to the first revision (a rollback): its directory is still there, nothing fetched
    upload(moto.client(), BUCKET, prefix, FILES, multipart_mb=5)
    code, back, _ = _sync(moto, prefix, base, "--versions")
    assert code == 0 and back["details"]["version_dir"] == str(v1), "the same objects, the same version"
    assert back["details"]["fetch_files"] == [] and _state(v1) == before


def test_a_directory_synced_before_versions_seeds_the_first_version(moto: Moto, wdir: Path) -> None:
    prefix = _prefix("models/legacy", FILES, moto)
    base = wdir / "m"
    assert _sync(moto, prefix, base)[0] == 0  # the old way: into --dest itself
    before = _state(base)
    code, verdict, _ = _sync(moto, prefix, base, "--versions")
    assert code == 0, verdict
    assert verdict["details"]["fetch_files"] == [], "every file came from the old directory"
    assert sorted(verdict["details"]["linked_files"]) == sorted(FILES)
    assert verdict["details"]["linked_from"] == [str(base)]
    assert _state(base) == before


def test_where_a_link_cannot_be_made_the_file_is_fetched(moto: Moto, wdir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = _prefix("models/nolink", FILES, moto)
    base = wdir / "m"
    assert _sync(moto, prefix, base)[0] == 0

    def no_links(*_: Any, **__: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", _env()["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", _env()["AWS_SECRET_ACCESS_KEY"])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    args = weights.build_parser().parse_args([
        "sync", "--source", f"s3://{BUCKET}/{prefix}", "--dest", str(base), "--endpoint-url", moto.endpoint,
        "--part-size-mb", "1", "--progress-s", "0", "--versions"])
    verdict = weights.sync(weights.options_from(args))
    assert verdict.status == "pass", verdict
    assert verdict.details["linked_files"] == [] and sorted(verdict.details["fetch_files"]) == sorted(FILES)
    assert set(verdict.details["link_failed"]) == set(FILES)
    assert "could not be hard-linked and were fetched" in verdict.evidence[0]
    assert tree(verdict.details["version_dir"]) == FILES


def test_a_failed_sync_leaves_the_old_version_untouched_and_names_no_version(moto: Moto, wdir: Path) -> None:
    prefix = _prefix("models/broken", FILES, moto)
    base = wdir / "m"
    code, first, _ = _sync(moto, prefix, base, "--versions")
    assert code == 0
    v1 = Path(first["details"]["version_dir"])
    before = _state(v1)
    # a revision without a tokenizer: fetched, but not a complete model
    broken = {k: v for k, v in NEXT.items() if k != "tokenizer.json"}
    moto.client().delete_object(Bucket=BUCKET, Key=f"{prefix}/tokenizer.json")
    upload(moto.client(), BUCKET, prefix, broken, multipart_mb=5)
    code, verdict, stdout = _sync(moto, prefix, base, "--versions")
    assert code == 1 and verdict["status"] == "fail", verdict
    assert weights_version_dir(stdout) is None, "a failed sync names no directory for the engines to mount"
    assert "version-dir=" not in verdict["summary"]
    assert _state(v1) == before


def test_an_interrupted_sync_of_a_new_revision_leaves_the_old_one_untouched(moto: Moto, wdir: Path) -> None:
    prefix = _prefix("models/cut", FILES, moto)
    base = wdir / "m"
    code, first, _ = _sync(moto, prefix, base, "--versions")
    v1 = Path(first["details"]["version_dir"])
    before = _state(v1)
    bigger = {**NEXT, SHARDS[0]: checkpoint([7.0])["model-00001-of-00001.safetensors"]}
    upload(moto.client(), BUCKET, prefix, bigger, multipart_mb=5)
    argv = [sys.executable, "-m", "checks.weights", "sync", "--source", f"s3://{BUCKET}/{prefix}", "--dest",
            str(base), "--endpoint-url", moto.endpoint, "--part-size-mb", "1", "--workers", "1", "--limit-mb-s", "1",
            "--progress-s", "0", "--versions", "--json"]
    process = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(p.name.endswith(".weights-partial") for p in wdir.rglob("*")),
                 "the sync never started a shard", 120)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert weights_version_dir(out) is None
    assert _state(v1) == before
    code, done, _ = _sync(moto, prefix, base, "--versions")  # the re-run resumes into the same new directory
    assert code == 0 and done["details"]["version_dir"] != str(v1)
    assert tree(done["details"]["version_dir"]) == bigger


# ---- cleanup ----


def _version(base: Path, n: int, mtime: float) -> Path:
    path = Path(version_dir(str(base), f"{n:x}" * 64))
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / MANIFEST_NAME).write_text("{}")
    os.utime(path / MANIFEST_NAME, (mtime, mtime))
    return path


def test_prune_plan_keeps_the_one_in_use_the_mounted_and_the_newest() -> None:
    versions = [("/m/x@1", 1.0), ("/m/x@2", 2.0), ("/m/x@3", 3.0), ("/m/x@4", 4.0)]
    plan = prune_plan(versions, keep="/m/x@2", mounted=["/m/x@1"], keep_last=2)
    assert plan["/m/x@2"].startswith("kept: the version the engines mount")
    assert plan["/m/x@1"].startswith("kept: mounted")
    assert plan["/m/x@4"].startswith("kept: one of the newest")
    assert plan["/m/x@3"] == "remove"
    # a container that mounts the parent (host_dir, as before versions) holds every version
    assert set(prune_plan(versions, keep="/m/x@4", mounted=["/m"], keep_last=1).values()) != {"remove"}
    assert "remove" not in prune_plan(versions, keep="/m/x@4", mounted=["/m/"], keep_last=1).values()
    with pytest.raises(ValueError):
        prune_plan(versions, keep=None, mounted=[], keep_last=0)


def test_prune_never_removes_a_mounted_or_locked_directory_nor_the_model_dir(wdir: Path) -> None:
    base = wdir / "m"
    base.mkdir()
    (base / "config.json").write_text("{}")
    old, mounted, locked, prev, current = (_version(base, i, 100.0 + i) for i in range(1, 6))
    (wdir / "m@notaversion").mkdir()
    fd = os.open(locked / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        verdict = prune(str(base), str(current), 2, [str(mounted / "sub")])
    finally:
        os.close(fd)
    assert verdict.status == "pass"
    assert verdict.details["removed"] == [old.name]
    left = {p.name for p in versions_beside(str(base))}
    assert left == {mounted.name, locked.name, prev.name, current.name}
    assert base.is_dir() and (wdir / "m@notaversion").is_dir()
    assert any("a sync is writing it" in line for line in verdict.evidence)


def _fake_docker(bindir: Path, mounts: list[str] | None) -> dict[str, str]:
    """A `docker` on PATH that lists one container mounting `mounts` (None: the daemon does not answer)."""
    bindir.mkdir(exist_ok=True)
    script = bindir / "docker"
    if mounts is None:
        script.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    else:
        body = json.dumps([{"Type": "bind", "Source": m, "Destination": "/models/m"} for m in mounts])
        script.write_text(f"#!/bin/sh\ncase \"$1\" in ps) echo c0ffee;; inspect) echo '{body}';; esac\n")
    script.chmod(0o755)
    return {**_env(), "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def test_prune_cli_asks_docker_and_removes_nothing_when_it_cannot(wdir: Path) -> None:
    base = wdir / "models" / "m"
    base.parent.mkdir()
    a, b, c = (_version(base, i, 100.0 + i) for i in range(1, 4))
    code, verdict, _ = _cli("prune", "--dest", str(base), "--keep", str(c), "--keep-last", "1",
                            environ=_fake_docker(wdir / "bin", None))
    assert code == 2 and verdict["status"] == "cannot-run" and "nothing removed" in verdict["summary"]
    assert {p.name for p in versions_beside(str(base))} == {a.name, b.name, c.name}
    code, verdict, _ = _cli("prune", "--dest", str(base), "--keep", str(c), "--keep-last", "1",
                            environ=_fake_docker(wdir / "bin", [str(a)]))
    assert code == 0, verdict
    assert verdict["details"]["removed"] == [b.name]
    assert {p.name for p in versions_beside(str(base))} == {a.name, c.name}
    code, verdict, _ = _cli("prune", "--dest", str(base), "--keep", "/etc/passwd", environ=_fake_docker(
        wdir / "bin", []))
    assert code == 2 and "is not a version directory" in verdict["summary"]


def test_reuse_skips_files_whose_record_differs(wdir: Path) -> None:
    """Only a file recorded with the same (key, size, ETag) and a digest is linked; nothing else is."""
    from checks.weights_verify import Entry, Manifest
    from checks.weights_versions import link_candidates

    base = wdir / "m"
    old = Path(version_dir(str(base), "a" * 64))
    old.mkdir(parents=True)
    (old / "a.bin").write_bytes(b"aa")
    (old / "b.bin").write_bytes(b"bb")
    digest = hashlib.sha256(b"aa").hexdigest()
    manifest = Manifest("s3://b/p/", None, (Entry("a.bin", 2, "e1", digest),
                                            Entry("b.bin", 2, "e2", hashlib.sha256(b"bb").hexdigest())))
    (old / MANIFEST_NAME).write_text(manifest.to_json())
    assert [p for p, _ in link_candidates(str(base), wdir / "new")] == [old]
    new = Path(version_dir(str(base), "b" * 64))
    new.mkdir()
    found = reuse_unchanged(str(base), new, [Entry("a.bin", 2, "e1"), Entry("b.bin", 2, "e2-changed")])
    assert [e.key for e in found.linked] == ["a.bin"] and found.linked[0].sha256 == digest
    assert not (new / "b.bin").exists()


# ---- the commands the program sends ----


def test_the_node_commands_sync_beside_and_prune_on_the_host() -> None:
    cmd = node_sync_command("s3://bkt/models/m", "/data/models/m", "img:1", versions=True).split("<<'")[0]
    assert " --versions " in cmd and "-v /data/models:/data/models " in cmd
    plain = node_sync_command("s3://bkt/models/m", "/data/models/m", "img:1").split("<<'")[0]
    assert "--versions" not in plain and "-v /data/models/m:/data/models/m " in plain
    prune_cmd = node_prune_command("/data/models/m", "/data/models/m@0123456789abcdef", 3, sudo=True)
    assert prune_cmd.startswith("timeout 600 sudo -n python3 - prune --dest /data/models/m --keep "
                                "/data/models/m@0123456789abcdef --keep-last 3 ")
    with pytest.raises(ValueError):
        node_prune_command("/etc", "/etc@0123456789abcdef", 2)
    assert weights_version_dir('{"status": "fail", "details": {"version_dir": "/x@1"}}') is None
    assert weights_version_dir("PASS weights-sync: 3 file(s); content-sha256=" + "a" * 64 +
                               "; version-dir=/d/m@0123456789abcdef") == "/d/m@0123456789abcdef"
