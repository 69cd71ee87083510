"""A local S3 with a tiny model in it, for trying `python -m checks.weights sync` without a cloud account.

    python -m checks.local_s3 --port 9000

starts moto's S3 server on 127.0.0.1, creates a bucket, uploads a small but valid Hugging Face style checkpoint
(config.json, a tokenizer, `model.safetensors.index.json` and two safetensors shards with real headers), prints
the environment and the exact sync and verify commands to run against it, and serves until Ctrl-C. Needs
`moto[server]` and boto3 (requirements-dev.txt); nothing here runs on a GPU node. The credentials are dummies: this
server accepts any key.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
import signal
import struct
import sys
import threading
from types import FrameType
from typing import Any

from stacks.model.s3_source import CannotRun, parse_source

ACCESS_KEY_ID = "AKIALOCALS3TRYIT0000"
SECRET_ACCESS_KEY = "local-s3-dummy-secret"
"""Dummy credentials: moto's server accepts any signature; boto3 only needs some key to sign with."""
REGION = "us-east-1"
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
"""S3's bucket name rule (3-63 of lower-case letters, digits, dots and hyphens)."""
PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


def safetensors_file(tensors: dict[str, list[int]], seed: int) -> bytes:
    """A valid safetensors file: 8-byte little-endian header length, JSON header (tensor name -> dtype, shape,
    data_offsets; padded with spaces to 8 bytes as the format allows), then the F16 data."""
    table: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 2
        for dim in shape:
            size *= dim
        table[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(table, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    data = bytes((seed * 31 + i * 7) % 251 for i in range(offset))
    return struct.pack("<Q", len(header)) + header + data


def tiny_model() -> dict[str, bytes]:
    """A two-layer checkpoint in the layout vLLM loads: every file `checks.weights verify` looks for."""
    hidden, vocab = 64, 128
    shards = {
        "model-00001-of-00002.safetensors": {"model.embed_tokens.weight": [vocab, hidden],
                                             "model.layers.0.mlp.weight": [hidden, hidden]},
        "model-00002-of-00002.safetensors": {"model.layers.1.mlp.weight": [hidden, hidden],
                                             "lm_head.weight": [vocab, hidden]},
    }
    files = {name: safetensors_file(tensors, seed) for seed, (name, tensors) in enumerate(shards.items())}
    weight_map = {tensor: name for name, tensors in shards.items() for tensor in tensors}
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": sum(len(b) for b in files.values())}, "weight_map": weight_map},
        indent=2).encode()
    files["config.json"] = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                       "hidden_size": hidden, "num_hidden_layers": 2, "vocab_size": vocab,
                                       "torch_dtype": "float16"}, indent=2).encode()
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}
                                         ).encode()
    files["tokenizer_config.json"] = b'{"model_max_length": 4096}\n'
    files["generation_config.json"] = b'{"do_sample": false}\n'
    return files


def instructions(endpoint: str, bucket: str, prefix: str, dest: str) -> list[str]:
    """The lines a user copies (from this checkout): the dummy credentials, then sync and verify into `dest` with
    the interpreter this runs on."""
    python = shlex.quote(sys.executable)
    return [
        f"export AWS_ACCESS_KEY_ID={ACCESS_KEY_ID} AWS_SECRET_ACCESS_KEY={SECRET_ACCESS_KEY}",
        f"{python} -m checks.weights sync --source s3://{bucket}/{prefix} --dest {dest} --endpoint-url {endpoint}",
        f"{python} -m checks.weights verify --dest {dest}",
    ]


def _problem(args: argparse.Namespace) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: must be 0-65535 (0 picks a free port)"
    if not BUCKET_RE.fullmatch(args.bucket) or ".." in args.bucket:
        return f"--bucket {args.bucket!r}: 3-63 lower-case letters, digits, dots and hyphens, e.g. models"
    if not PREFIX_RE.fullmatch(args.prefix):
        return f"--prefix {args.prefix!r}: path segments of letters, digits, '.', '_' and '-', e.g. tiny-model"
    try:  # the sync's own source rule: the command printed below must run ('..' segments, reserved names)
        parse_source(f"s3://{args.bucket}/{args.prefix}")
    except CannotRun as exc:
        why = str(exc).split(": ", 1)[-1]
        return f"--prefix {args.prefix!r}: the sync it prints would refuse it ({why}); e.g. tiny-model"
    if not args.dest.startswith("/") or any(c.isspace() for c in args.dest):
        return f"--dest {args.dest!r}: an absolute path without spaces, e.g. /tmp/tiny-model"
    return None


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.local_s3", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9000, help="port on 127.0.0.1, 0 for any free one [9000]")
    parser.add_argument("--bucket", default="models", help="bucket to create [models]")
    parser.add_argument("--prefix", default="tiny-model", help="key prefix the model goes under [tiny-model]")
    parser.add_argument("--dest", default="/tmp/tiny-model",
                        help="the model directory the printed sync command writes [/tmp/tiny-model]")
    args = parser.parse_args(argv)
    problem = _problem(args)
    if problem:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    try:
        import boto3  # type: ignore[import-untyped]
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        print(f"{parser.prog}: error: {exc.name or exc} is missing: pip install 'moto[server]' boto3 "
              "(requirements-dev.txt)", file=sys.stderr)
        return 2
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer("127.0.0.1", args.port, verbose=False)
    try:
        server.start()
    except OSError as exc:
        print(f"{parser.prog}: error: --port {args.port}: cannot listen on 127.0.0.1 ({exc}); pick another port "
              "(0 for any free one)", file=sys.stderr)
        return 2
    stopped = threading.Event()
    try:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops it, even started from a script
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=REGION,
                                                aws_access_key_id=ACCESS_KEY_ID,
                                                aws_secret_access_key=SECRET_ACCESS_KEY)
        client.create_bucket(Bucket=args.bucket)
        files = tiny_model()
        for name, blob in files.items():
            client.put_object(Bucket=args.bucket, Key=f"{args.prefix}/{name}", Body=blob)
        total = sum(len(b) for b in files.values())
        print(f"S3 on {endpoint}: s3://{args.bucket}/{args.prefix}/ holds a tiny model ({len(files)} files, "
              f"{total} bytes). In another shell (dummy credentials; any key works here):", flush=True)
        for line in instructions(endpoint, args.bucket, args.prefix, args.dest):
            print(f"   {line}", flush=True)
        print("Ctrl-C stops the server (its data lives in memory only).", flush=True)
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
