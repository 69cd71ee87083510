"""A real S3 API for the weight-sync tests and bench: moto's server in its own process on loopback, and
checkpoints that look like Hugging Face ones (config, tokenizer, index, safetensors shards with real headers)."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

KEY_ID, SECRET = "AKIAWEIGHTSTEST00000", "weights-test-secret-key"
"""What the no-auth server accepts (moto checks nothing until `enforce_auth`)."""
_LAUNCHER = """
import sys, time
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""


@dataclass
class Moto:
    endpoint: str
    process: subprocess.Popen[str]

    def client(self, service: str = "s3", key_id: str = KEY_ID, secret: str = SECRET) -> Any:
        import boto3  # type: ignore[import-untyped]

        return boto3.session.Session().client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                                              aws_access_key_id=key_id, aws_secret_access_key=secret)

    def enforce_auth(self) -> tuple[str, str]:
        """From now on the server checks signatures against its IAM users: returns the one key it knows (a user
        with s3:* on everything). moto's `/moto-api/reset-auth` sets INITIAL_NO_AUTH_ACTION_COUNT."""
        iam = self.client("iam")
        iam.create_user(UserName="weights")
        key = iam.create_access_key(UserName="weights")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="weights", PolicyName="s3", PolicyDocument=json.dumps(policy))
        request = urllib.request.Request(self.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
        return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


@contextmanager
def moto_server() -> Iterator[Moto]:
    """moto in server mode on 127.0.0.1, a free port chosen by the kernel; stopped on exit."""
    process = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"moto server did not start (printed {line!r}): pip install 'moto[server]'")
        yield Moto(f"http://127.0.0.1:{line}", process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def safetensors_blob(tensor_bytes: list[int], seed: int) -> bytes:
    """A valid safetensors file: 8-byte header length, JSON header (U8 tensors, 8-byte aligned), payload."""
    table: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for i, size in enumerate(tensor_bytes):
        table[f"layers.{i}.weight"] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(table).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + random.Random(seed).randbytes(offset)


def checkpoint(shard_mb: list[float], tokenizer_mb: float = 7.5) -> dict[str, bytes]:
    """A Hugging Face style checkpoint: shards of the given sizes (MB) named like real ones, an index naming them,
    config.json, generation_config.json, tokenizer.json and tokenizer_config.json."""
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    count = len(shard_mb)
    for i, mb in enumerate(shard_mb):
        name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        size = int(mb * 1e6)
        tensors = [size // 4] * 3 + [size - 3 * (size // 4)]
        files[name] = safetensors_blob(tensors, seed=i)
        for t in range(len(tensors)):
            weight_map[f"model.layers.{i}.{t}.weight"] = name
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": sum(len(b) for b in files.values())}, "weight_map": weight_map}, indent=2).encode()
    files["config.json"] = json.dumps({"architectures": ["DeepseekV4ForCausalLM"], "num_attention_heads": 64,
                                       "o_groups": 8, "torch_dtype": "bfloat16"}, indent=2).encode()
    files["generation_config.json"] = b'{"do_sample": true, "temperature": 0.6}\n'
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE"},
                                          "pad": "x" * int(tokenizer_mb * 1e6)}).encode()
    files["tokenizer_config.json"] = b'{"model_max_length": 1048576}\n'
    return files


def upload(client: Any, bucket: str, prefix: str, files: dict[str, bytes], multipart_mb: int = 64) -> None:
    """Objects above `multipart_mb` go up in parts (ETag `<md5-of-md5s>-N`, as `aws s3 cp` leaves them)."""
    from io import BytesIO

    from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]

    config = TransferConfig(multipart_threshold=multipart_mb * 1024 * 1024,
                            multipart_chunksize=multipart_mb * 1024 * 1024)
    with suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for name, blob in files.items():
        client.upload_fileobj(BytesIO(blob), bucket, f"{prefix.rstrip('/')}/{name}" if prefix else name,
                              Config=config)


def tree(root: str) -> dict[str, bytes]:
    """Every regular file under root (relative path → bytes), the sync's own files left out."""
    out: dict[str, bytes] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(".weights") or ".weights-partial" in name:
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out
