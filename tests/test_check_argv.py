"""Every check program and `python -m stacks` subcommand answers every argument: exit 0, 1 or 2, one line naming
the flag and the value when it refuses, never a traceback, never a run that does not end, never a verdict on a
nonsensical argument. Values from the issue's list first, then hypothesis drives each program's argv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
RUN_LIMIT_S = 240
"""Generous: a check that ends runs in seconds here; one that hangs runs until killed."""


def run(module: str, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=RUN_LIMIT_S, input=stdin, env={**os.environ, "VLLM_API_KEY": ""})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{module} {argv!r} did not end within {RUN_LIMIT_S}s")


def answered(done: subprocess.CompletedProcess[str]) -> str:
    text = done.stdout + done.stderr
    assert done.returncode in (0, 1, 2), (done.returncode, text[-2000:])
    assert "Traceback" not in text, text[-3000:]
    return text


# --- the cases: each refused with exit 2, naming the flag and the value ----------------------------------

COLLECTIVE = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"]
API = ["--url", "http://127.0.0.1:9", "--served-name", "m"]
REFUSED = [
    ("checks.collective", [*COLLECTIVE, "--master-port", "0"], "--master-port '0'"),
    ("checks.collective", [*COLLECTIVE, "--master-port", "70000"], "--master-port '70000'"),
    ("checks.collective", [*COLLECTIVE[:4], "--master-addr", "0.0.0.0"], "--master-addr '0.0.0.0': not one host"),
    ("checks.collective", [*COLLECTIVE[:4], "--master-addr", "255.255.255.255"], "--master-addr '255.255.255.255'"),
    ("checks.collective", [*COLLECTIVE[:4], "--master-addr", "224.0.0.1"], "--master-addr '224.0.0.1'"),
    ("checks.collective", [*COLLECTIVE[:4], "--master-addr", "ff02::1"], "--master-addr 'ff02::1'"),
    ("checks.collective", [*COLLECTIVE, "--timeout-s", "inf"], "--timeout-s 'inf': a finite number"),
    ("checks.collective", [*COLLECTIVE, "--nnodes", "1000000000"], "--nnodes '1000000000': out of range"),
    ("checks.preflight", ["--sections", "firewall", "--ephemeral-ports", "60999-32768"],
     "--ephemeral-ports '60999-32768': inverted"),
    ("checks.preflight", ["--sections", "firewall", "--ephemeral-ports", "1-99999"], "--ephemeral-ports '1-99999'"),
    ("checks.preflight", ["--sections", "disk", "--disk-headroom-gb", "nan"], "--disk-headroom-gb 'nan'"),
    ("checks.preflight", ["--sections", "disk", "--disk-headroom-gb", "-5"], "--disk-headroom-gb '-5'"),
    ("checks.preflight", ["--sections", "gpu", "--gpu-memory-gb", "-80"], "--gpu-memory-gb '-80'"),
    ("checks.preflight", ["--sections", "ownership", "--owned-label", "novalue"], "--owned-label 'novalue': not KEY"),
    ("checks.preflight", ["--sections", "ownership", "--owned-label", "=x"], "--owned-label '=x'"),
    ("checks.preflight", ["--sections", "ownership", "--ports", "8000,0"], "--ports '0'"),
    ("checks.preflight", ["--sections", "ownership", "--container-names", "a b"], "--container-names 'a b'"),
    ("checks.preflight", ["--sections", "disk", "--docker-root", "/var/lib\n/docker"], "--docker-root '/var/lib\\n"),
    ("checks.preflight", ["--sections", "gpu", "--gpus", "0"], "--gpus '0'"),
    ("checks.preflight", ["--sections", "model", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization '1.5'"),
    ("checks.preflight", ["--sections", "model", "--kv-cache-dtype", "x;id"], "--kv-cache-dtype 'x;id': not a vLLM "
     "value name"),
    ("checks.preflight", ["--sections", "memlock", "--image", "a b"], "--image 'a b': not an image reference"),
    ("checks.api", [*API, "--deny-paths", "@evil.example/x"], "--deny-paths '@evil.example/x': not an absolute URL"),
    ("checks.api", [*API, "--deny-paths", "//evil.example/x"], "--deny-paths '//evil.example/x'"),
    ("checks.api", [*API, "--deny-paths", "/x\r\nHost: evil"], "--deny-paths '/x\\r\\nHost: evil'"),
    ("checks.api", [*API, "--max-iterations", "0"], "--max-iterations '0'"),
    ("checks.api", [*API, "--api-key-env", "A=B"], "--api-key-env 'A=B'"),
    ("checks.api", ["--url", "http://127.0.0.1:99999", "--served-name", "m"],
     "--url 'http://127.0.0.1:99999': port 99999 out of range; a TCP port 1 to 65535"),
    ("checks.api", ["--url", "http://127.0.0.1:9", "--served-name", ""], "--served-name '': not a served model name"),
    ("checks.api", [*API, "--rank-nodes", "x"], "--rank-nodes 'x': names the node of each DP rank, and --dp-size is 1"),
    ("checks.api", [*API, "--dp-size", "2", "--rank-nodes", "node1,a b"], "--rank-nodes 'node1,a b': not a comma "
     "list of node names"),
    ("checks.engines", ["--ranks", "0,x", "--log-file", "/dev/null"], "--ranks 'x': not a whole number"),
    ("checks.engines", ["--ranks", "", "--log-file", "/dev/null"], "nothing to check"),
    ("checks.engines", ["--ranks", "0", "--workers", "-1", "--log-file", "/dev/null"], "--workers '-1'"),
    ("checks.engines", ["--ranks", "0", "--container", "x;rm"], "--container 'x;rm'"),
    ("checks.nccl_transport", ["--log-file", "a\x01b"], "--log-file 'a\\x01b'"),
    ("checks.ray_cluster", ["--nodes", "0", "--gpus", "8"], "--nodes '0'"),
    ("checks.ray_cluster", ["--nodes", "2", "--gpus", "8", "--wait-s", "inf"], "--wait-s 'inf'"),
    ("checks.ray_cluster", ["--nodes", "2", "--gpus", "8", "--interval-s", "0"], "--interval-s '0'"),
    ("checks.ray_cluster", ["--nodes", "2", "--gpus", "8", "--address", "http://x"], "--address 'http://x'"),
    ("checks.vllm_args", ["--expect", "tensor_parallel_size"], "--expect 'tensor_parallel_size': not FIELD=VALUE"),
    ("checks.vllm_args", ["--import-only", "..x"], "--import-only '..x'"),
    ("checks.vllm_args", [], "nothing to check"),
    ("checks.weights_verify", ["--dest", "/models/x\nPASS weights: forged"], "--dest '/models/x\\nPASS weights"),
    ("checks.weights_verify", ["--dest", "/models/\x1b[2Jx"], "--dest '/models/\\x1b[2Jx'"),
    ("checks.weights_verify", ["--dest", "/models/x", "--name", "a b"], "--name 'a b'"),
    ("checks.weights_verify", ["--dest", "/models/x", "--expect-hash", "ab\ncd"], "--expect-hash 'ab\\ncd'"),
    ("checks.weights", ["verify", "--dest", "/models/x\rPASS"], "--dest '/models/x\\rPASS'"),
    ("checks.weights", ["sync", "--source", "s3://bucket/p", "--dest", "/models/x\ny"], "--dest '/models/x\\ny'"),
    ("checks.weights", ["sync", "--source", "s3://bucket/p\nq", "--dest", "/models/x"], "--source 's3://bucket/p\\nq'"),
    ("checks.weights", ["sync", "--source", "s3://bucket/p", "--dest", "/models/x", "--region", "eu\x01"],
     "--region 'eu\\x01'"),
    ("checks.weights", ["sync", "--source", "s3://bucket/p", "--dest", "/models/x", "--name", "x\ny"],
     "--name 'x\\ny'"),
    ("checks.api", [*API, "--expect", "32\n3"], "--expect '32\\n3'"),
]


@pytest.mark.parametrize(("module", "argv", "said"), REFUSED, ids=[f"{m} {' '.join(a)[-40:]}" for m, a, _ in REFUSED])
def test_a_nonsensical_argument_is_refused_by_name_and_value(module: str, argv: list[str], said: str) -> None:
    done = run(module, *argv, "--json")
    text = answered(done)
    assert done.returncode == 2, text
    assert said in text, text
    assert '"status": "cannot-run"' in done.stdout, done.stdout  # a verdict line a deploy can read, not a pass


def test_a_value_holding_a_newline_cannot_forge_a_second_verdict_line() -> None:
    """A refusal repeats the value; its control characters are escaped, so stdout stays one verdict line."""
    done = run("checks.api", *API, "--sections", "models\nPASS api: all 5 section(s) passed")
    assert done.returncode == 2 and done.stdout.count("\n") == 1, done.stdout
    assert done.stdout.startswith("CANNOT-RUN api: bad argument: --sections") and "\\nPASS" in done.stdout


# --- hypothesis: each program's argv with one flag given a hostile value --------------------------------------

HOSTILE = ["", " ", "0", "-1", "-0", "nan", "NaN", "inf", "-inf", "1e309", "1e-320", "0x10", "70000", "65536",
           "9-3", "1-99999", "-", "--", "0.0.0.0", "255.255.255.255", "224.0.0.1", "::", "novalue", "=x", "a=b=c",
           "a\nb", "\x7f", "/x\n", "@evil.example/x", "//evil.example", "\\\\evil\\x",
           "http://u:p@h:1", "s3://k:s@b/p?X-Amz-Signature=1", "🙂", "9" * 400, "x" * 5000, "..", "/", "a,,b,a"]
"""Values that break something somewhere; most are bad for every flag (no NUL: argv cannot carry one)."""
NEVER_VALID_WAIT = ["", "0", "-1", "nan", "inf", "-inf", "1e309", "x", "1e400", "9" * 30]
"""For flags whose valid values are legitimately long waits: only values that must be refused."""

PROGRAMS: dict[str, tuple[list[str], list[str], list[str]]] = {
    # module: (base argv that ends quickly here, flags drawn from HOSTILE, flags drawn from NEVER_VALID_WAIT)
    "checks.api": ([*API, "--sections", "models", "--timeout-s", "2"],
                   ["--name", "--url", "--served-name", "--api-key-env", "--timeout-s", "--prompt", "--expect",
                    "--golden-json", "--dp-size", "--rank-nodes", "--ca-env", "--ca-file", "--deny-paths",
                    "--max-iterations"],
                   ["--sections", "--deadline-s", "--interval-s"]),
    "checks.collective": (["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1", "--timeout-s", "5"],
                          ["--name", "--node-rank", "--master-addr", "--master-port", "--procs-per-node",
                           "--backend", "--transport", "--min-busbw-gbps", "--sizes", "--warmup", "--iters",
                           "--max-gpu-used-mib"],
                          ["--nnodes", "--timeout-s"]),
    "checks.engines": (["--ranks", "0", "--log-file", "/dev/null"],
                       ["--name", "--ranks", "--workers", "--container", "--log-file"], []),
    "checks.nccl_transport": (["--log-file", "/dev/null"], ["--name", "--container", "--log-file", "--transport"],
                              []),
    "checks.preflight": (["--sections", "firewall,hca,sysctl,gid,infiniband", "--procfs-root", "/nonexistent",
                          "--sysfs-root", "/nonexistent", "--dev-root", "/nonexistent", "--call-timeout-s", "5"],
                         ["--name", "--gpus", "--gpu-model", "--gpu-memory-gb", "--image", "--model-dir", "--heads",
                          "--o-groups", "--tp", "--pp", "--dp", "--engram", "--engram-shards", "--engram-copies",
                          "--redundant-experts", "--routed-experts", "--ranks-on-node", "--gpu-memory-utilization",
                          "--max-model-len", "--kv-cache-dtype",
                          "--kv-fallback-bytes", "--reserve-gb", "--planned-gb", "--docker-root",
                          "--containerd-root", "--image-size-gb", "--disk-headroom-gb", "--owned-label",
                          "--container-names", "--ports", "--hcas", "--link-layer", "--gid-index", "--nics",
                          "--sysfs-root", "--procfs-root", "--dev-root", "--ephemeral-ports"],
                         ["--sections", "--call-timeout-s"]),
    "checks.ray_cluster": (["--nodes", "1", "--gpus", "1", "--address", "http://not-ray"],
                           ["--name", "--nodes", "--gpus"], ["--wait-s", "--interval-s", "--address"]),
    "checks.vllm_args": (["--import-only", "json"], ["--name", "--image", "--expect", "--import-only"], []),
    "checks.weights_verify": (["--dest", "/nonexistent/model"], ["--dest", "--expect-hash", "--name"], []),
    "checks.weights": (["sync", "--source", "s3://bucket/prefix", "--dest", "/nonexistent/model", "--region", "no!"],
                       ["--source", "--dest", "--endpoint-url", "--addressing-style", "--workers", "--part-size-mb",
                        "--limit-mb-s", "--progress-s", "--name"], []),
    "checks.weights_match": (["node1=" + "a" * 64, "node2=" + "a" * 64], ["--name"], []),
}


@st.composite
def hostile_argv(draw: st.DrawFn, module: str) -> list[str]:
    base, free, waits = PROGRAMS[module]
    flag = draw(st.sampled_from(free + waits))
    pool = st.sampled_from(NEVER_VALID_WAIT) if flag in waits else st.one_of(
        st.sampled_from(HOSTILE), st.text(st.characters(exclude_characters="\x00"), max_size=40))
    value = draw(pool)
    joined = draw(st.booleans())
    words = [f"{flag}={value}"] if joined else [flag, value]
    extra = draw(st.sampled_from([[], ["--json"], ["--no-such-flag"], ["stray"]]))
    return [*base, *words, *extra]


@pytest.mark.parametrize("module", sorted(PROGRAMS))
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_argv_ends_in_an_exit_code_without_a_traceback(module: str, data: st.DataObject) -> None:
    argv = data.draw(hostile_argv(module))
    answered(run(module, *argv))


STACKS_FLAGS = {
    "watch-unit": ["--python", "--workdir", "--env-file", "--ca-file", "--user", "--set", "--assume-secret"],
    "plan": ["--set", "--assume-secret"],
    "rollback": ["--to", "--page-size", "--history"],
    "restart-group": ["--ca-file"],
}


@pytest.mark.parametrize("command", sorted(STACKS_FLAGS))
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_stacks_argv_ends_in_an_exit_code_without_a_traceback(command: str, data: st.DataObject) -> None:
    flag = data.draw(st.sampled_from(STACKS_FLAGS[command]))
    value = data.draw(st.one_of(st.sampled_from(HOSTILE),
                                st.text(st.characters(exclude_characters="\x00"), max_size=30)))
    extra = ["--dry-run", "--history", "/nonexistent"] if command == "rollback" and flag != "--history" else []
    done = run("stacks", command, "prod", *extra, f"{flag}={value}")
    text = answered(done)
    assert done.returncode != 3, text  # 3: the tool's own bug


FACTS = ["tokenizer_mode", "tool_call_parser", "reasoning_parser", "default_kv_cache_dtype", "vision", "supports_pp",
         "draft_supports_pp", "min_vram_gb", "engram_hash_heads", "weights_split_gb", "routed_experts", "nope"]


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(FACTS), value=st.one_of(st.sampled_from(HOSTILE), st.text(
    st.characters(exclude_characters="\x00"), max_size=30)))
def test_every_model_card_fact_ends_in_an_exit_code_without_a_traceback(tmp_path_factory: pytest.TempPathFactory,
                                                                        key: str, value: str) -> None:
    """`model-card --fact KEY=VALUE` with a hostile value: exit 0 or 2, never a traceback; a card is written only
    when the value passed its fact's type."""
    root = tmp_path_factory.mktemp("root")
    done = subprocess.run([sys.executable, "-m", "stacks", "model-card", "tests/fixtures/models/qwen3-8b", "--name",
                           "q", "--synthesize-weights", "--fact", f"{key}={value}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=RUN_LIMIT_S, env={**os.environ, "VLLM_CLUSTER_ROOT": str(root)})
    text = answered(done)
    assert done.returncode in (0, 2), text
    assert (done.returncode == 0) == (root / "models" / "q.json").is_file(), text
