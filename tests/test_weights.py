"""The weight sync and the completeness check against a real S3 API: moto in server mode on loopback, boto3 on
the client side, the CLI run as its own process (exit codes and output as a node would see them)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks import weights
from checks.weights_verify import (
    HASH_NAME,
    JOURNAL_NAME,
    LOCK_NAME,
    MANIFEST_NAME,
    SIDECAR_SUFFIX,
    Entry,
    content_hash,
    manifest_hash,
    verify_dir,
)
from tests.conftest import ROOT
from tests.waiting import wait_for
from tests.weights_harness import KEY_ID, SECRET, Moto, checkpoint, moto_server, tree, upload

BUCKET, PREFIX = "ckpt", "models/ds-v4"
SOURCE = f"s3://{BUCKET}/{PREFIX}"
FILES = checkpoint([6.0, 2.6, 1.1], tokenizer_mb=0.3)
"""The first shard is above moto's 5 MiB part minimum, so it is a multipart object (ETag `<md5>-2`)."""
SHARDS = sorted(k for k in FILES if k.endswith(".safetensors"))


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    with moto_server() as server:
        upload(server.client(), BUCKET, PREFIX, FILES, multipart_mb=5)
        yield server


@pytest.fixture
def wdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="weights-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def env(key_id: str | None = KEY_ID, secret: str | None = SECRET) -> dict[str, str]:
    out = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(),
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
           "AWS_EC2_METADATA_DISABLED": "true"}
    if key_id is not None:
        out["AWS_ACCESS_KEY_ID"] = key_id
    if secret is not None:
        out["AWS_SECRET_ACCESS_KEY"] = secret
    return out


def cli(*args: str, environ: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """`python -m checks.weights ARGS --json` as its own process: (exit code, the JSON verdict, stderr)."""
    done = subprocess.run([sys.executable, "-m", "checks.weights", *args, "--json"], cwd=ROOT, text=True,
                          capture_output=True, env=environ or env(), timeout=240)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line, got: {done.stdout!r} / {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(lines[0]), done.stderr


def sync(moto: Moto, dest: Path, *extra: str, source: str = SOURCE,
         environ: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    return cli("sync", "--source", source, "--dest", str(dest), "--endpoint-url", moto.endpoint,
               "--part-size-mb", "1", "--workers", "4", *extra, environ=environ)


def test_fresh_sync_writes_every_file_the_manifest_and_its_hash(moto: Moto, wdir: Path) -> None:
    dest = wdir / "node1" / "DeepSeek-V4-Flash"
    code, verdict, _ = sync(moto, dest)
    assert code == 0, verdict
    assert tree(str(dest)) == FILES
    listing = moto.client().list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + "/")["Contents"]
    expected = manifest_hash(Entry(o["Key"][len(PREFIX) + 1:], o["Size"], o["ETag"].strip('"')) for o in listing)
    assert f"manifest-sha256={expected}" in verdict["summary"]
    assert verdict["details"]["manifest_sha256"] == expected
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert manifest["files_sha256"] == expected and manifest["source"] == SOURCE + "/"
    assert {f["key"] for f in manifest["files"]} == set(FILES)
    assert any("-" in f["etag"] for f in manifest["files"]), "multipart ETags (<md5>-N) are kept as listed"
    assert (dest / HASH_NAME).read_text().split()[0] == expected
    assert not (dest / JOURNAL_NAME).exists()
    assert not [p for p in dest.iterdir() if "weights-partial" in p.name]
    # a second node synced from the same source holds a byte-identical manifest
    code2, verdict2, _ = sync(moto, wdir / "node2")
    assert code2 == 0 and verdict2["details"]["manifest_sha256"] == expected
    assert (wdir / "node2" / MANIFEST_NAME).read_bytes() == (dest / MANIFEST_NAME).read_bytes()
    code3, check, _ = cli("verify", "--dest", str(dest), "--expect-hash", expected)
    assert code3 == 0 and check["details"]["hash"] == expected and check["details"]["hash_kind"] == "manifest-sha256"
    # nothing to do the second time
    code4, again, _ = sync(moto, dest)
    assert code4 == 0 and again["details"]["fetch_files"] == [] and again["details"]["present_files"] == len(FILES)


def test_progress_lines_show_bytes_files_rate_and_eta(moto: Moto, wdir: Path) -> None:
    code, verdict, stderr = sync(moto, wdir / "m", "--limit-mb-s", "5", "--progress-s", "0.25")
    assert code == 0, verdict
    lines = [line for line in stderr.splitlines() if line.startswith("weights-sync: ")]
    assert len(lines) >= 2, stderr
    assert all("file(s)" in line and "MB (" in line and "MB/s" in line and "ETA" in line for line in lines)
    seconds = verdict["details"]["seconds"]
    assert seconds >= 1.0, "--limit-mb-s 5 holds ~10 MB to well over a second"


def _journal_keys(dest: Path) -> list[str]:
    try:
        lines = [json.loads(line) for line in (dest / JOURNAL_NAME).read_text().splitlines() if line]
    except (FileNotFoundError, ValueError):
        return []
    return [line["key"] for line in lines if "key" in line]


def _sidecar_parts(dest: Path) -> int:
    total = 0
    for path in dest.glob("*" + SIDECAR_SUFFIX):
        with contextlib.suppress(ValueError, KeyError, FileNotFoundError):
            total += len(json.loads(path.read_text())["done"])
    return total


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_interrupted_sync_resumes_and_a_half_file_never_counts(moto: Moto, wdir: Path, how: signal.Signals) -> None:
    dest = wdir / "model"
    argv = [sys.executable, "-m", "checks.weights", "sync", "--source", SOURCE, "--dest", str(dest),
            "--endpoint-url", moto.endpoint, "--part-size-mb", "1", "--workers", "1", "--limit-mb-s", "1",
            "--progress-s", "0", "--json"]
    process = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # files are fetched in key order: config.json, generation_config.json, then the 6 MB first shard; at 1 MB/s
        # the signal has ~5 s to land in its middle (at 3 MB/s it was ~1.7 s, less than a loaded machine may take)
        wait_for(lambda: len(_journal_keys(dest)) >= 2 and _sidecar_parts(dest) >= 1,
                 "the sync never reached the middle of a shard", 120)
        process.send_signal(how)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if how == signal.SIGTERM:
        assert process.returncode == 1, err
        verdict = json.loads(out.strip().splitlines()[-1])
        assert "interrupted by signal" in verdict["summary"] and "resume" in verdict["next_step"]
    else:
        assert process.returncode == -signal.SIGKILL
    done = _journal_keys(dest)
    in_progress = SHARDS[0]
    assert in_progress not in done
    assert not (dest / in_progress).exists(), "a half file must never have its final name"
    assert (dest / (in_progress + ".weights-partial")).exists()
    assert not (dest / MANIFEST_NAME).exists()
    half = verify_dir(str(dest))
    assert half.status == "fail", "a directory a sync left half-way is never complete"
    header = json.loads((dest / JOURNAL_NAME).read_text().splitlines()[0])
    assert header == {"source": SOURCE + "/", "endpoint_url": moto.endpoint}, "the journal records its source"
    (dest / "stray.bin").write_bytes(b"s")
    # the manifest is gone until the run completes: the journal's source is what lets --delete resume
    code, verdict, _ = sync(moto, dest, "--delete")
    assert code == 0, verdict
    details = verdict["details"]
    assert details["resumed_parts"] >= 1
    assert not set(done) & set(details["fetch_files"]), "journaled files are not fetched again"
    assert in_progress in details["fetch_files"]
    assert details["deleted"] == ["stray.bin"]
    assert tree(str(dest)) == FILES


def test_truncated_and_missing_shards_are_named_then_fetched_again(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    assert sync(moto, dest)[0] == 0
    truncated, missing = SHARDS[0], SHARDS[1]
    with open(dest / truncated, "r+b") as handle:
        handle.truncate(len(FILES[truncated]) // 2)
    (dest / missing).unlink()
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1
    assert check["details"]["missing"] == [missing]
    assert any(item.startswith(truncated) for item in check["details"]["wrong_size"])
    assert missing in check["summary"] and truncated in check["summary"]
    code, verdict, _ = sync(moto, dest)
    assert code == 0, verdict
    assert sorted(verdict["details"]["fetch_files"]) == sorted([truncated, missing])
    assert tree(str(dest)) == FILES


def test_an_object_changed_in_the_bucket_is_fetched_again(wdir: Path) -> None:
    with moto_server() as server:
        upload(server.client(), BUCKET, PREFIX, FILES, multipart_mb=5)
        dest = wdir / "model"
        assert sync(server, dest)[0] == 0
        changed = dict(FILES)
        changed["config.json"] = FILES["config.json"].replace(b"bfloat16", b"float8_e")  # same size, new ETag
        assert len(changed["config.json"]) == len(FILES["config.json"])
        upload(server.client(), BUCKET, PREFIX, {"config.json": changed["config.json"]})
        code, verdict, _ = sync(server, dest)
        assert code == 0, verdict
        assert verdict["details"]["fetch_files"] == ["config.json"]
        assert tree(str(dest)) == changed


def test_files_outside_the_manifest_are_kept_unless_delete(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    (dest / "notes").mkdir(parents=True)
    (dest / "notes" / "README.md").write_text("ours")
    (dest / "extra.bin").write_bytes(b"x" * 10)
    code, verdict, _ = sync(moto, dest)
    assert code == 0, verdict
    assert sorted(verdict["details"]["extra_files"]) == ["extra.bin", "notes/README.md"]
    assert (dest / "extra.bin").exists() and (dest / "notes" / "README.md").read_text() == "ours"
    assert any("kept 2 file(s) not in the manifest" in e for e in verdict["evidence"])
    code, verdict, _ = sync(moto, dest, "--delete")
    assert code == 0, verdict
    assert sorted(verdict["details"]["deleted"]) == ["extra.bin", "notes/README.md"]
    assert not (dest / "extra.bin").exists() and not (dest / "notes").exists()
    assert tree(str(dest)) == FILES and (dest / MANIFEST_NAME).exists()


def _shared_models_dir(root: Path) -> dict[str, bytes]:
    """/data/models as a person keeps it: other models and notes, never synced by this tool."""
    held = {"other-model/config.json": b"{}", "other-model/model.safetensors": b"w" * 100, "notes.txt": b"mine"}
    for rel, blob in held.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(blob)
    return held


def test_delete_is_refused_where_no_sync_of_this_source_wrote(moto: Moto, wdir: Path) -> None:
    """`--dest /data/models --delete` would wipe every other model there: refused (exit 2, before any request)
    unless the directory's manifest records this very source and endpoint."""
    models = wdir / "models"
    held = _shared_models_dir(models)
    for extra in ([], ["--dry-run"]):
        for endpoint in (moto.endpoint, _dead_endpoint()):
            code, verdict, _ = cli("sync", "--source", SOURCE, "--dest", str(models), "--endpoint-url", endpoint,
                                   "--delete", *extra)
            assert code == 2 and verdict["status"] == "cannot-run", verdict
            assert verdict["summary"].startswith(f"--delete refused: --dest '{models}' holds notes.txt, other-model "
                                                 "but no manifest of a sync"), verdict["summary"]
            assert "sync into a directory of its own, or run without --delete" in verdict["summary"]
    assert tree(str(models)) == held
    # a manifest of another source (or the same source at another endpoint) does not count either
    dest = wdir / "model"
    assert sync(moto, dest)[0] == 0
    (dest / "stray.bin").write_bytes(b"s")
    upload(moto.client(), BUCKET, PREFIX + "-next", FILES)
    next_source = f"s3://{BUCKET}/{PREFIX}-next"
    code, verdict, _ = sync(moto, dest, "--delete", source=next_source)
    assert code == 2 and verdict["summary"].startswith(
        f"--delete refused: --dest '{dest}' was synced from {SOURCE}/ at {moto.endpoint}, not {next_source}/ at "
        f"{moto.endpoint}"), verdict["summary"]
    assert "a later --delete works" in verdict["summary"]
    alias = moto.endpoint.replace("127.0.0.1", "localhost")
    code, verdict, _ = sync(moto, dest, "--delete", "--endpoint-url", alias)
    assert code == 2 and f"not {SOURCE}/ at {alias}" in verdict["summary"], verdict["summary"]
    assert (dest / "stray.bin").exists()
    # what works: once without --delete from the new source, then --delete
    assert sync(moto, dest, source=next_source)[0] == 0
    code, verdict, _ = sync(moto, dest, "--delete", source=next_source)
    assert code == 0 and verdict["details"]["deleted"] == ["stray.bin"], verdict


def test_delete_runs_where_there_is_nothing_it_could_remove(moto: Moto, wdir: Path) -> None:
    """A first deploy with `model.source.delete: true`: the directory is missing, empty, or holds only the sync's
    own files (a lock left behind)."""
    empty, locked = wdir / "empty", wdir / "locked"
    empty.mkdir()
    locked.mkdir()
    (locked / LOCK_NAME).write_bytes(b"")
    for dest in (wdir / "missing" / "model", empty, locked):
        code, verdict, _ = sync(moto, dest, "--delete")
        assert code == 0 and verdict["details"]["deleted"] == [], verdict
        assert tree(str(dest)) == FILES


def test_a_dest_that_resolves_to_a_system_directory_is_refused(moto: Moto, wdir: Path) -> None:
    link = wdir / "models"
    link.symlink_to("/sys")
    for dest in (link, link / "model"):
        code, verdict, _ = sync(moto, dest)
        assert code == 2 and f"resolves to {os.path.realpath(dest)} (through a symlink)" in verdict["summary"], verdict
        assert "is in /sys, a kernel file system" in verdict["summary"]


def test_dry_run_lists_what_is_due_and_writes_nothing(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    code, verdict, _ = sync(moto, dest, "--dry-run")
    assert code == 1 and sorted(verdict["details"]["fetch_files"]) == sorted(FILES)
    assert not dest.exists()
    assert sync(moto, dest)[0] == 0
    code, verdict, _ = sync(moto, dest, "--dry-run")
    assert code == 0 and "in sync" in verdict["summary"]


def test_a_missing_bucket_is_one_line_naming_it(moto: Moto, wdir: Path) -> None:
    code, verdict, _ = sync(moto, wdir / "m", source="s3://no-such-bucket/models")
    assert code == 2 and verdict["status"] == "cannot-run"
    assert "'no-such-bucket' does not exist" in verdict["summary"] and "NoSuchBucket" in verdict["summary"]
    assert not (wdir / "m").exists()


def test_an_empty_prefix_cannot_run(moto: Moto, wdir: Path) -> None:
    code, verdict, _ = sync(moto, wdir / "m", source=f"s3://{BUCKET}/models/nothing-here")
    assert code == 2 and "lists no objects" in verdict["summary"] and "nothing-here" in verdict["summary"]


def test_refused_and_missing_credentials_are_clear(wdir: Path) -> None:
    with moto_server() as server:
        upload(server.client(), BUCKET, PREFIX, FILES, multipart_mb=5)
        key_id, secret = server.enforce_auth()
        code, verdict, _ = sync(server, wdir / "bad-secret", environ=env(key_id, "not-the-secret"))
        assert code == 2 and "credentials refused" in verdict["summary"]
        assert "SignatureDoesNotMatch" in verdict["summary"] and f"'{BUCKET}'" in verdict["summary"]
        code, verdict, _ = sync(server, wdir / "bad-key", environ=env("AKIAUNKNOWNKEY000000", "x"))
        assert code == 2 and "InvalidAccessKeyId" in verdict["summary"]
        code, verdict, _ = sync(server, wdir / "none", environ=env(None, None))
        assert code == 2 and "no usable credentials" in verdict["summary"]
        assert "AWS_ACCESS_KEY_ID" in verdict["summary"]
        code, verdict, stderr = sync(server, wdir / "good", environ=env(key_id, secret))
        assert code == 0, verdict
        assert secret not in json.dumps(verdict) + stderr


def test_hostile_keys_never_leave_dest(wdir: Path) -> None:
    outside = wdir / "outside"
    with moto_server() as server:
        client = server.client()
        for i, (key, reason) in enumerate([("m/../../outside/evil.txt", "'..' component"),
                                           ("m//outside/abs.txt", "absolute path"),
                                           ("m/x.weights-partial", "collides"), ("m/a\\b", "backslash")]):
            bucket = f"hostile-{i}"
            upload(client, bucket, "m", {"config.json": b"{}"})
            client.put_object(Bucket=bucket, Key=key, Body=b"pwned")
            code, verdict, _ = sync(server, wdir / "dest", source=f"s3://{bucket}/m")
            assert code == 2, verdict
            assert repr(key) in verdict["summary"] and reason in verdict["summary"]
        assert not outside.exists() and not (wdir / "dest").exists()
        upload(client, "clash", "m", {"a": b"1", "a/b": b"2"})
        code, verdict, _ = sync(server, wdir / "dest", source="s3://clash/m")
        assert code == 2 and "a file cannot also be a directory" in verdict["summary"]
        # a symlink inside dest that points out of it is not followed
        upload(client, "linked", "m", {"sub/evil.txt": b"pwned", "config.json": b"{}"})
        dest = wdir / "linked"
        dest.mkdir()
        outside.mkdir()
        (dest / "sub").symlink_to(outside)
        code, verdict, _ = sync(server, dest, source="s3://linked/m")
        assert code == 2 and "resolves outside" in verdict["summary"]
        assert list(outside.iterdir()) == []


@pytest.mark.parametrize(("char", "reason"), [
    ("\u202e", "format character U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("\u200b", "format character U+200B (ZERO WIDTH SPACE)"),
    ("\ufeff", "format character U+FEFF"),
    ("\u2028", "line separator U+2028"),
    ("\x85", "control character U+0085"),
], ids=["rlo", "zwsp", "bom", "line-separator", "c1-control"])
def test_keys_with_invisible_characters_are_refused_with_the_char_escaped(moto: Moto, wdir: Path, char: str,
                                                                          reason: str) -> None:
    """A key like `model<U+202E>gpj.safetensors` shows as another name in a listing: refused like a control
    character, before anything is written, the key named with the character escaped."""
    bucket = f"invisible-{ord(char):x}"
    upload(moto.client(), bucket, "m", {"config.json": b"{}", f"model{char}gpj.safetensors": b"x"})
    dest = wdir / "dest"
    code, verdict, _ = sync(moto, dest, source=f"s3://{bucket}/m")
    assert code == 2 and verdict["status"] == "cannot-run", verdict
    escaped = repr(f"m/model{char}gpj.safetensors")
    assert "\\" in escaped and escaped in verdict["summary"] and reason in verdict["summary"], verdict["summary"]
    assert char not in verdict["summary"]
    assert not dest.exists()


@pytest.mark.parametrize("char", ["\u3164", "\u115f", "\u2800", "\ufe0f", "\xa0", "\u2007"])
def test_blank_looking_characters_are_refused_in_keys(char: str) -> None:
    """`config.json<U+3164>` prints as `config.json`: two shards that look alike could both be loaded."""
    from checks.weights_verify import unsafe_reason

    reason = unsafe_reason(f"m/config.json{char}")
    assert reason is not None and f"U+{ord(char):04X}" in reason
    assert unsafe_reason("m/model-00001-of-00002.safetensors") is None


@pytest.mark.parametrize(("args", "needle"), [
    (["--source", "http://bucket/x"], "is not an s3:// URL"),
    (["--source", "s3:///models"], "names no bucket"),
    (["--source", "s3://b"], "is not a bucket name"),
    (["--source", "s3://bucket/models/../../etc"], "'.' or '..' component"),
    (["--source", "s3://bucket"], "names a bucket without a prefix"),
    (["--source", "s3://bucket//"], "names a bucket without a prefix"),
    (["--source", "s3://bucket/ds#part"], "holds '#', which marks a URL query or a presigned URL"),
    (["--source", "s3://bucket/ds&x"], "holds '&'"),
    (["--source", "s3://bucket/ds=x"], "holds '='"),
    (["--source", "s3://bucket/ds%3Fx"], "holds '%3F'"),
    (["--dest", "relative/dir"], "is not an absolute path"),
    (["--dest", "/"], "below /"),
    (["--dest", "/etc"], "--dest '/etc': /etc is a system directory: the sync writes a checkpoint there"),
    (["--dest", "/tmp/"], "/tmp is a system directory"),
    (["--dest", "/home"], "/home is a system directory"),
    (["--dest", "/proc/self/cwd"], "/proc/self/cwd is in /proc, a kernel file system"),
    (["--dest", "/sys"], "/sys is in /sys, a kernel file system"),
    (["--workers", "100000"], "--workers 100000: must be 1..64"),
    (["--workers", "0"], "--workers 0"),
    (["--workers", "many"], "invalid int value: 'many'"),
    (["--endpoint-url", "localhost:9000"], "is not an http(s)://HOST[:PORT] URL"),
    (["--endpoint-url", "http://host:99999"], "is not a URL"),
    (["--endpoint-url", "http://user:pw@host:9000"], "carries credentials"),
    (["--endpoint-url", "ftp://host"], "is not an http(s)://HOST[:PORT] URL"),
    (["--endpoint-url", "https://minio:9000/s3"], "--endpoint-url 'https://minio:9000/***' has a path, query or "
                                                  "fragment: pass only http(s)://HOST[:PORT]"),
    (["--endpoint-url", "https://minio:9000#x"], "has a path, query or fragment"),
    (["--region", "US East"], "is not a region name"),
    (["--part-size-mb", "0"], "--part-size-mb 0"),
    (["--limit-mb-s", "-1"], "--limit-mb-s -1.0"),
])
def test_bad_arguments_exit_2_with_one_line(args: list[str], needle: str, wdir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    argv = {"--source": "s3://bucket/models", "--dest": str(wdir / "m")}
    flags = dict(zip(args[::2], args[1::2], strict=True))
    argv.update(flags)
    line = ["sync", *[part for item in argv.items() for part in item]]
    with pytest.raises(SystemExit) as stop:
        raise SystemExit(weights.main(line))
    assert stop.value.code == 2
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and out.startswith("CANNOT-RUN ") and needle in out, out
    assert not (wdir / "m").exists()


def test_a_whole_bucket_is_refused_before_anything_is_listed(moto: Moto, wdir: Path) -> None:
    """`s3://bucket` would pour every object of the bucket into --dest: refused (exit 2) as `model.source.url`
    is, by the same rule (`parse_source`), before any request."""
    upload(moto.client(), "whole-bucket", "", {"config.json": b"{}", "other-team/notes.txt": b"x"})
    for source in ("s3://whole-bucket", "s3://whole-bucket/", "s3://whole-bucket//"):
        code, verdict, _ = sync(moto, wdir / "m", source=source)
        assert code == 2 and verdict["status"] == "cannot-run", verdict
        assert verdict["summary"].startswith(f"--source {source!r} names a bucket without a prefix"), verdict
        assert "s3://BUCKET/PREFIX" in verdict["summary"]
        assert not (wdir / "m").exists()


@pytest.mark.parametrize("source", [
    "s3://{bucket}/{prefix}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=hunter4",
    "s3://{bucket}/{prefix}#hunter4",
    "s3://{bucket}/{prefix}&X-Amz-Signature=hunter4",
    "s3://{bucket}/{prefix}/X-Amz-Signature=hunter4",
    "s3://{bucket}/{prefix}%3FX-Amz-Signature%3Dhunter4",
    "https://{bucket}.s3.amazonaws.com/{prefix}/config.json?X-Amz-Signature=hunter4",
], ids=["query", "fragment", "ampersand", "equals", "encoded", "presigned-https"])
def test_a_query_or_presigned_signature_in_the_source_is_refused_unechoed(moto: Moto, wdir: Path,
                                                                           source: str) -> None:
    code, verdict, stderr = sync(moto, wdir / "m", source=source.format(bucket=BUCKET, prefix=PREFIX))
    assert code == 2 and verdict["status"] == "cannot-run", verdict
    assert verdict["summary"].startswith("--source "), verdict["summary"]
    assert "***" in verdict["summary"] and "s3://BUCKET/PREFIX" in verdict["summary"]
    assert "hunter4" not in json.dumps(verdict) + stderr
    assert not (wdir / "m").exists()


@pytest.mark.parametrize("tail", ["/hunter6", "/hunter6/", "/?X-Amz-Signature=hunter6", "#hunter6", "?hunter6"])
def test_an_endpoint_with_a_path_query_or_fragment_is_refused_unechoed(moto: Moto, wdir: Path, tail: str) -> None:
    """README: `--endpoint-url` is http(s)://HOST[:PORT]. A path would be sent as a prefix of every request (and
    could be a token): refused, masked, before any request."""
    code, verdict, stderr = cli("sync", "--source", SOURCE, "--dest", str(wdir / "m"), "--endpoint-url",
                                moto.endpoint + tail)
    assert code == 2 and verdict["status"] == "cannot-run", verdict
    assert verdict["summary"].startswith(f"--endpoint-url '{moto.endpoint}{tail[0]}***' has a path, query or "
                                         "fragment: pass only http(s)://HOST[:PORT]"), verdict["summary"]
    assert "hunter6" not in json.dumps(verdict) + stderr
    code, verdict, _ = cli("sync", "--source", SOURCE, "--dest", str(wdir / "m"), "--endpoint-url",
                           moto.endpoint.replace("://", "://ak:hunter7@") + tail)
    assert code == 2 and "carries credentials" in verdict["summary"] and "hunter" not in json.dumps(verdict)
    assert not (wdir / "m").exists()
    assert sync(moto, wdir / "ok", "--dry-run", "--endpoint-url", moto.endpoint + "/")[0] == 1, \
        "a trailing '/' is no path"


def _dead_endpoint() -> str:
    """A loopback port nothing listens on: a sync that reaches the store with it says `cannot connect`."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("dry_run", [False, True], ids=["sync", "dry-run"])
def test_a_dest_that_cannot_be_a_directory_is_one_line_naming_it_before_any_request(moto: Moto, wdir: Path,
                                                                                    dry_run: bool) -> None:
    """`--dest` under a regular file (a dry run used to end in NotADirectoryError from the journal read) or a
    regular file itself: exit 2, one line naming --dest, decided before the store is asked anything (against a
    dead endpoint the line is still about --dest, not the connection)."""
    blocker = wdir / "file"
    blocker.write_bytes(b"x")
    cases = [(blocker / "m", f"{blocker} is a file, not a directory, so --dest cannot be created below it"),
             (blocker / "a" / "b", f"{blocker} is a file, not a directory"),
             (blocker, "exists and is not a directory")]
    for dest, needle in cases:
        for endpoint in (moto.endpoint, _dead_endpoint()):
            code, verdict, _ = cli("sync", "--source", SOURCE, "--dest", str(dest), "--endpoint-url", endpoint,
                                   *(["--dry-run"] if dry_run else []))
            assert code == 2 and verdict["status"] == "cannot-run", verdict
            assert verdict["summary"].startswith(f"--dest '{dest}'") and needle in verdict["summary"], verdict
    assert blocker.read_bytes() == b"x"


@pytest.mark.parametrize("own", [JOURNAL_NAME, LOCK_NAME])
def test_the_syncs_own_file_being_a_directory_is_one_line_naming_it(moto: Moto, wdir: Path, own: str) -> None:
    dest = wdir / "model"
    (dest / own).mkdir(parents=True)
    code, verdict, _ = sync(moto, dest)
    assert code == 2 and verdict["status"] == "cannot-run", verdict
    assert verdict["summary"].startswith(f"--dest '{dest}'") and f"{dest / own}: Is a directory" in verdict["summary"]


@pytest.fixture
def read_only(wdir: Path) -> Iterator[Path]:
    """A directory this process may not write: a read-only tmpfs when root (root ignores modes), mode 0555
    otherwise."""
    path = wdir / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "weights-test-ro", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"root without a read-only mount here ({done.stderr.strip()}): the mode-0555 case needs non-root")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("dry_run", [False, True], ids=["sync", "dry-run"])
def test_a_dest_this_user_may_not_write_is_one_line_naming_it_before_any_request(moto: Moto, read_only: Path,
                                                                                dry_run: bool) -> None:
    reason = "read-only file system" if os.geteuid() == 0 else "permission denied"
    for dest, doing in [(read_only, "list and write"), (read_only / "m", "create --dest in")]:
        code, verdict, _ = cli("sync", "--source", SOURCE, "--dest", str(dest), "--endpoint-url", _dead_endpoint(),
                               *(["--dry-run"] if dry_run else []))
        if dry_run:  # a dry run writes nothing: it only needs to read, and gets as far as the store
            assert code == 2 and "cannot connect" in verdict["summary"], verdict
            continue
        assert code == 2 and verdict["status"] == "cannot-run", verdict
        assert verdict["summary"].startswith(f"--dest '{dest}': this user (uid {os.geteuid()}) may not {doing} "
                                             f"{read_only} ({reason})"), verdict
    code, verdict, _ = sync(moto, read_only, "--dry-run")
    assert code == 1 and len(verdict["details"]["fetch_files"]) == len(FILES), verdict


def test_another_sync_holding_the_lock_cannot_run(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    dest.mkdir()
    with open(dest / LOCK_NAME, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        code, verdict, _ = sync(moto, dest)
    assert code == 2 and "another sync is writing" in verdict["summary"]


def test_not_enough_disk_cannot_run(moto: Moto, wdir: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 10**9 - 10, 10))
    code = weights.main(["sync", "--source", SOURCE, "--dest", str(wdir / "m"), "--endpoint-url", moto.endpoint])
    out = capsys.readouterr().out
    assert code == 2 and "GB free, the sync needs" in out and "0.0 GB free" in out


def test_an_object_replaced_during_the_sync_fails_naming_it(moto: Moto, wdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The listing says one ETag, the store serves another: If-Match refuses it (412), the file is not written."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    real = weights.list_prefix

    def stale(client: Any, opts: weights.Options) -> list[Entry]:
        return [Entry(e.key, e.size, "0" * 32) if e.key == SHARDS[0] else e for e in real(client, opts)]

    monkeypatch.setattr(weights, "list_prefix", stale)
    dest = wdir / "m"
    code = weights.main(["sync", "--source", SOURCE, "--dest", str(dest), "--endpoint-url", moto.endpoint,
                         "--progress-s", "0", "--json"])
    verdict = json.loads(capsys.readouterr().out)
    assert code == 1 and SHARDS[0] in verdict["summary"] and "changed during the sync" in verdict["summary"]
    assert not (dest / SHARDS[0]).exists() and not (dest / MANIFEST_NAME).exists()


class CuttingProxy:
    """A TCP proxy on loopback in front of moto that drops the first connection that carries more than `cut_after`
    bytes from the server, once: a stream that breaks in the middle of a response body, as a flaky network does."""

    def __init__(self, target: str, cut_after: int) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, cut: bool) -> None:
        sent, limit = 0, self.cut_after
        try:
            while data := source.recv(65536):
                if cut and self.cuts == 0 and sent + len(data) > limit:
                    sink.sendall(data[:limit - sent])
                    self.cuts += 1
                    break
                sink.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_stream_broken_mid_body_is_re_requested_from_where_it_stopped(moto: Moto, wdir: Path) -> None:
    proxy = CuttingProxy(moto.endpoint, cut_after=1_500_000)
    try:
        dest = wdir / "model"
        code, verdict, stderr = cli("sync", "--source", SOURCE, "--dest", str(dest), "--endpoint-url", proxy.endpoint,
                                    "--workers", "1", "--part-size-mb", "8")
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert code == 0, verdict
    assert tree(str(dest)) == FILES
    assert verdict["details"]["retries"] >= 1 and "retrying after" in stderr, stderr


def _local_copy(dest: Path) -> None:
    dest.mkdir(parents=True)
    for name, blob in FILES.items():
        (dest / name).write_bytes(blob)


def test_verify_a_local_directory_without_a_manifest(wdir: Path) -> None:
    dest = wdir / "seed"
    _local_copy(dest)
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 0 and check["details"]["hash_kind"] == "listing-sha256"
    first = check["details"]["hash"]
    other = wdir / "seed2"
    _local_copy(other)
    assert cli("verify", "--dest", str(other))[1]["details"]["hash"] == first, "same files, same hash on every node"
    (dest / SHARDS[2]).unlink()
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1 and check["details"]["missing"] == [SHARDS[2]] and SHARDS[2] in check["summary"]
    (dest / SHARDS[2]).write_bytes(FILES[SHARDS[2]][:-100])
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1 and "truncated" in check["summary"] and SHARDS[2] in check["summary"]
    (dest / SHARDS[2]).write_bytes(FILES[SHARDS[2]])
    (dest / "tokenizer.json").unlink()
    (dest / "added_tokens.json").write_bytes(b"")
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1 and "no tokenizer" in check["summary"] and "empty file(s): added_tokens.json" in check["summary"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--dest", "models/x"], "is not an absolute path"),
    (["--dest", "/tmp", "--expect-hash", "abc"], "is not 64 lowercase hex"),
    ([], "the following arguments are required: --dest"),
])
def test_verify_bad_arguments_exit_2(args: list[str], needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", "checks.weights", "verify", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 2 and len(done.stdout.strip().splitlines()) == 1 and needle in done.stdout
    assert "Traceback" not in done.stderr


def test_verify_with_a_manifest_checks_sizes_and_a_tampered_manifest(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    assert sync(moto, dest)[0] == 0
    with open(dest / "tokenizer_config.json", "ab") as handle:
        handle.write(b" ")
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1 and "tokenizer_config.json has" in check["summary"] and "manifest says" in check["summary"]
    raw = json.loads((dest / MANIFEST_NAME).read_text())
    raw["files"][0]["size"] += 1
    (dest / MANIFEST_NAME).write_text(json.dumps(raw))
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1 and "manifest cannot be trusted" in check["summary"]
    code, check, _ = cli("verify", "--dest", str(dest), "--expect-hash", "0" * 64)
    assert code == 1


def test_manifest_hash_is_order_free_and_content_bound() -> None:
    entries = [Entry("b.safetensors", 10, "e1"), Entry("a.json", 2, "e2")]
    assert manifest_hash(entries) == manifest_hash(list(reversed(entries)))
    assert manifest_hash(entries) != manifest_hash([Entry("b.safetensors", 10, "e9"), entries[1]])
    assert manifest_hash(entries) != manifest_hash([Entry("b.safetensors", 11, "e1"), entries[1]])


# ---- content digests: a shard changed in place with its size kept


def _corrupt_in_place(path: Path, offset: int = 4096) -> None:
    """Flip bytes inside the file, its size unchanged: what a preallocating copy tool or a bad disk leaves."""
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(min(offset, size - 16))
        chunk = handle.read(16)
        handle.seek(min(offset, size - 16))
        handle.write(bytes(b ^ 0xFF for b in chunk))
    assert path.stat().st_size == size


def test_the_manifest_records_each_files_sha256(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    code, verdict, _ = sync(moto, dest)
    assert code == 0, verdict
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert manifest["version"] == 2
    assert {f["key"]: f["sha256"] for f in manifest["files"]} == {k: hashlib.sha256(v).hexdigest()
                                                                  for k, v in FILES.items()}
    expected = content_hash((k, len(v), hashlib.sha256(v).hexdigest()) for k, v in FILES.items())
    assert manifest["content_sha256"] == expected
    code, check, _ = cli("verify", "--dest", str(dest), "--content")
    assert code == 0 and check["details"]["hash_kind"] == "content-sha256" and check["details"]["hash"] == expected
    assert f"content-sha256={expected}" in check["summary"]


def test_a_same_size_change_in_place_is_caught_by_verify_content_and_repaired_by_sync_content(
        moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    assert sync(moto, dest)[0] == 0
    _corrupt_in_place(dest / SHARDS[1])
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 0, "sizes and headers alone cannot see it: that is what --content is for"
    code, check, _ = cli("verify", "--dest", str(dest), "--content")
    assert code == 1, check
    assert SHARDS[1] in check["summary"] and "content differs from the manifest" in check["summary"]
    assert [c.split(" ")[0] for c in check["details"]["content"]["corrupted"]] == [SHARDS[1]]
    assert "sync --content" in check["next_step"]
    code, plain, _ = sync(moto, dest)
    assert code == 0 and plain["details"]["fetch_files"] == [], "a plain sync trusts size and ETag (documented)"
    code, repaired, _ = sync(moto, dest, "--content")
    assert code == 0, repaired
    assert repaired["details"]["content_changed"] == [SHARDS[1]] and repaired["details"]["fetch_files"] == [SHARDS[1]]
    assert tree(str(dest)) == FILES
    assert cli("verify", "--dest", str(dest), "--content")[0] == 0


def test_weights_match_compares_content_so_a_changed_shard_names_its_node(moto: Moto, wdir: Path) -> None:
    """Three nodes: two synced, one copied by hand. Same bytes, same content hash (manifest or not); one shard
    changed in place on a node makes that node's hash differ, and weights-match names it."""
    from checks.weights_match import compare
    from checks.weights_node import node_verify_command, weights_hash

    nodes = {"node1": wdir / "n1" / "m", "node2": wdir / "n2" / "m", "node3": wdir / "n3" / "m"}
    for node in ("node1", "node2"):
        assert sync(moto, nodes[node], "--content")[0] == 0
    _local_copy(nodes["node3"])

    def node_hashes() -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for node, dest in nodes.items():
            done = subprocess.run(["bash", "-c", node_verify_command(str(dest), name=f"weights-{node}")],
                                  capture_output=True, text=True, timeout=240)
            assert "Traceback" not in done.stderr, done.stderr
            out[node] = weights_hash(done.stdout)
        return out

    before = node_hashes()
    assert len(set(before.values())) == 1 and None not in before.values(), before
    assert compare("weights-match", before).status == "pass"
    twin = wdir / "n3-twin"
    _local_copy(twin)
    _corrupt_in_place(nodes["node3"] / SHARDS[0])
    listing = [cli("verify", "--dest", str(d))[1]["details"] for d in (nodes["node3"], twin)]
    assert listing[0]["hash_kind"] == "listing-sha256" and listing[0]["hash"] == listing[1]["hash"], \
        "the listing hash (path, size) cannot see the change: without --content weights-match would pass"
    after = node_hashes()
    assert after["node1"] == after["node2"] == before["node1"] and after["node3"] not in (None, before["node1"])
    verdict = compare("weights-match", after)
    assert verdict.status == "fail" and verdict.details["differing"] == ["node3"], verdict
    _corrupt_in_place(nodes["node2"] / SHARDS[2])
    verdict = compare("weights-match", node_hashes())
    assert verdict.status == "fail" and "node2" in verdict.details["differing"], "a node whose shard no longer " \
        "matches its manifest fails its own check and exports no hash"


def test_a_manifest_without_digests_still_loads_and_the_next_sync_records_them(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    assert sync(moto, dest)[0] == 0
    raw = json.loads((dest / MANIFEST_NAME).read_text())
    old = {"version": 1, "source": raw["source"], "endpoint_url": raw["endpoint_url"],
           "files": [{k: f[k] for k in ("key", "size", "etag")} for f in raw["files"]],
           "files_sha256": raw["files_sha256"]}
    (dest / MANIFEST_NAME).write_text(json.dumps(old))
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 0 and check["details"]["hash"] == raw["files_sha256"]
    code, check, _ = cli("verify", "--dest", str(dest), "--content")
    assert code == 0 and check["details"]["hash"] == raw["content_sha256"]
    assert sorted(check["details"]["content"]["unrecorded"]) == sorted(FILES)
    assert any("records no digest" in line for line in check["evidence"])
    code, verdict, _ = sync(moto, dest)
    assert code == 0 and verdict["details"]["fetch_files"] == []
    assert sorted(verdict["details"]["hashed_after_transfer"]) == sorted(FILES)
    assert json.loads((dest / MANIFEST_NAME).read_text()) == raw


def test_a_tampered_digest_in_the_manifest_is_refused(moto: Moto, wdir: Path) -> None:
    dest = wdir / "model"
    assert sync(moto, dest)[0] == 0
    raw = json.loads((dest / MANIFEST_NAME).read_text())
    raw["files"][0]["sha256"] = "0" * 64
    (dest / MANIFEST_NAME).write_text(json.dumps(raw))
    code, check, _ = cli("verify", "--dest", str(dest))
    assert code == 1 and "content_sha256" in check["summary"] and "manifest cannot be trusted" in check["summary"]


def test_the_stores_full_object_sha256_is_used_and_a_composite_one_is_not(wdir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """moto keeps what the upload sent: a single-part object uploaded with ChecksumAlgorithm=SHA256 has the full
    object's SHA256; a multipart one a digest of the parts' digests (moto sends no `ChecksumType` and no `-N`, so
    the multipart ETag is what tells them apart)."""
    from io import BytesIO

    from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]

    files = checkpoint([6.0, 1.0], tokenizer_mb=0.1)
    shards = sorted(k for k in files if k.endswith(".safetensors"))
    with moto_server() as server:
        client = server.client()
        client.create_bucket(Bucket="sums")
        config = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
        for name, blob in files.items():
            client.upload_fileobj(BytesIO(blob), "sums", f"m/{name}", Config=config,
                                  ExtraArgs={"ChecksumAlgorithm": "SHA256"})
        heads = {name: client.head_object(Bucket="sums", Key=f"m/{name}", ChecksumMode="ENABLED") for name in shards}
        big, small = shards
        assert "-" in heads[big]["ETag"] and heads[big].get("ChecksumSHA256"), "multipart, with a composite SHA256"
        assert weights.full_object_sha256(heads[big], heads[big]["ETag"].strip('"')) is None
        assert weights.full_object_sha256(heads[small], heads[small]["ETag"].strip('"')) == \
            hashlib.sha256(files[small]).hexdigest()
        assert weights.full_object_sha256({**heads[big], "ChecksumType": "COMPOSITE"}, "abc") is None
        assert weights.full_object_sha256({"ChecksumSHA256": heads[small]["ChecksumSHA256"] + "-3"}, "abc") is None
        code, verdict, _ = cli("sync", "--source", "s3://sums/m", "--dest", str(wdir / "ok"), "--endpoint-url",
                               server.endpoint, "--part-size-mb", "2")
        assert code == 0, verdict
        # bytes that do not hash to the store's SHA256 fail the file, which keeps no final name
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        real = weights.full_object_sha256
        monkeypatch.setattr(weights, "full_object_sha256",
                            lambda head, etag: None if real(head, etag) is None else "f" * 64)
        dest = wdir / "bad"
        code = weights.main(["sync", "--source", "s3://sums/m", "--dest", str(dest), "--endpoint-url",
                             server.endpoint, "--progress-s", "0", "--json"])
        bad = json.loads(capsys.readouterr().out)
        assert code == 1 and small in bad["summary"] and "full-object SHA256" in bad["summary"], bad
        assert big not in bad["details"]["failed"], "the composite checksum was not used"
        assert not (dest / small).exists() and (dest / big).exists()


def test_the_model_and_the_checks_mask_url_userinfo_with_the_one_rule() -> None:
    """stacks/model/s3_source.py and checks.verdict once kept copies of a userinfo pattern that stopped at the first
    `/`, so `s3://KEY:SE/CRET@bucket` showed `SE` as part of a bucket name; both now call stacks/model/masking.py."""
    from checks import verdict
    from stacks.model import masking, s3_source

    assert s3_source.mask_userinfo is masking.mask_userinfo is verdict.mask_userinfo
    assert s3_source.has_userinfo is masking.has_userinfo is verdict.has_userinfo
    for url in ("s3://AKIA:se/cr/et@bucket/p", "http://minio:pa/ss@10.0.0.1:9000"):
        for shown in (s3_source.mask_source(url), s3_source.mask_endpoint(url), verdict.shown(url)):
            assert "se/cr" not in shown and "pa/ss" not in shown and "***@" in shown, shown
