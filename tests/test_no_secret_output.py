"""No output of any `python -m stacks` subcommand or check program holds a secret: a unique value is planted in
every secret-capable stack key and in every URL-valued input, and every stdout and stderr is searched for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.model.config import SECRET_KEYS, SECRET_OBJECT_KEYS

ROOT = Path(__file__).resolve().parent.parent
PLANT = "PLANTED7f3a9c"
"""Every planted value contains this; none of the project's own text does."""


def planted(where: str) -> str:
    return f"{PLANT}-{where}"


def _secret_lines() -> str:
    """The stack's secret keys holding plaintext (which the plan must refuse without echoing)."""
    lines = [f"  vllm-cluster:{key}: {planted(key)}" for key in SECRET_KEYS]
    for key in SECRET_OBJECT_KEYS:
        lines.append(f"  vllm-cluster:{key}:\n    TEAM_TOKEN: {planted(key)}")
    return "\n".join(lines) + "\n"



def _stack(tmp_path: Path, extra: str, model_source: bool = False) -> Path:
    """A copy of the project root holding Pulumi.yaml and a Pulumi.leak.yaml: prod plus `extra` lines."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    text = (ROOT / "Pulumi.prod.yaml").read_text()
    if model_source:
        text = text.replace("    path: deepseek-ai/DeepSeek-V4.1-Flash\n",
                            "    path: deepseek-ai/DeepSeek-V4.1-Flash\n"
                            f"    source:\n      url: s3://bucket/prefix?X-Amz-Signature={planted('s3-query')}\n"
                            f"      endpoint_url: http://minio:{planted('endpoint-password')}@10.0.0.9:9000\n", 1)
    (tmp_path / "Pulumi.leak.yaml").write_text(text.rstrip("\n") + "\n" + extra)
    return tmp_path


def _run(argv: list[str], root: Path | None = None, env: dict[str, str] | None = None,
         stdin: str = "") -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **(env or {})}
    if root is not None:
        environ["VLLM_CLUSTER_ROOT"] = str(root)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=environ, input=stdin)


def _clean(done: subprocess.CompletedProcess[str]) -> None:
    output = done.stdout + done.stderr
    assert PLANT not in output, output[max(0, output.find(PLANT) - 300):output.find(PLANT) + 100]
    assert "Traceback" not in output, output[-2000:]


ASSUME = [part for key in (*SECRET_KEYS, *(f"{k}.TEAM_TOKEN" for k in SECRET_OBJECT_KEYS))
          for part in ("--assume-secret", key)]
SUBCOMMANDS = [["plan", "leak"], ["plan", "leak", "--json"], ["nginx-conf", "leak"], ["watch-unit", "leak"]]


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=lambda a: " ".join(a))
def test_plaintext_secrets_in_the_stack_file_are_refused_unechoed_whatever_the_flags(
        tmp_path: Path, argv: list[str]) -> None:
    """`--assume-secret KEY` stands in for a secret the file does not hold; it cannot make a plaintext one
    acceptable (it once replaced the plaintext and the plan passed)."""
    root = _stack(tmp_path, _secret_lines())
    for flags in ([], ASSUME, ["--set", "api.proxy.enabled=true", *ASSUME]):
        done = _run(["-m", "stacks", *argv, *flags], root)
        _clean(done)
        assert done.returncode == 2, (flags, done.stdout[-500:], done.stderr[-1500:])
        assert "holds a secret in plain config" in done.stdout + done.stderr


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=lambda a: " ".join(a))
def test_credentials_in_the_weights_urls_are_refused_unechoed(tmp_path: Path, argv: list[str]) -> None:
    root = _stack(tmp_path, "", model_source=True)
    done = _run(["-m", "stacks", *argv, *ASSUME], root)
    _clean(done)
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-1500:]


@pytest.mark.parametrize("key", [*SECRET_KEYS, "proxy_keys.TEAM_TOKEN", "env_secrets.TEAM_TOKEN"])
def test_a_secret_given_with_set_is_refused_unechoed(tmp_path: Path, key: str) -> None:
    root = _stack(tmp_path, "")
    done = _run(["-m", "stacks", "plan", "leak", "--set", f"{key}={planted(key)}"], root)
    _clean(done)
    assert done.returncode == 2
    # --assume-secret for the same key does not make the plaintext acceptable
    both = _run(["-m", "stacks", "plan", "leak", "--assume-secret", key, "--set", f"{key}={planted(key)}"], root)
    _clean(both)
    assert both.returncode == 2 and "--set cannot give a secret" in both.stderr + both.stdout


def test_a_secret_set_in_a_url_valued_key_is_refused_unechoed(tmp_path: Path) -> None:
    root = _stack(tmp_path, "")
    for value in (f"s3://bucket/p?X-Amz-Signature={planted('q')}", f"s3://AKIA:{planted('u')}@bucket/p"):
        done = _run(["-m", "stacks", "plan", "leak", "--set", f"model.source={value}"], root)
        _clean(done)
        assert done.returncode == 2
    done = _run(["-m", "stacks", "plan", "leak", "--set", "model.source.url=s3://bucket/p", "--set",
                 f"model.source.endpoint_url=https://u:{planted('p')}@minio:9000"], root)
    _clean(done)
    assert done.returncode == 2


SECRET_URL = f"http://admin:{planted('url-password')}@10.0.0.1:8000"
CHECK_RUNS = [
    ["-m", "checks.api", "--url", SECRET_URL, "--served-name", "m"],
    ["-m", "checks.api", "--url", SECRET_URL, "--served-name", "m", "--json"],
    ["-m", "checks.api", "--url", f"http://10.0.0.1:8000/?key={planted('q')}", "--served-name", "m"],
    ["-m", "checks.weights", "sync", "--source", "s3://b/p", "--dest", "/tmp/x", "--endpoint-url", SECRET_URL],
    ["-m", "checks.weights", "sync", "--source", f"s3://b/p?X-Amz-Signature={planted('sig')}", "--dest", "/tmp/x"],
    ["-m", "checks.weights", "sync", "--source", f"s3://AKIA:{planted('s3-userinfo')}@b/p", "--dest", "/tmp/x"],
    ["-m", "checks.collective", "--nnodes", "2", "--node-rank", "0", "--master-addr", f"u:{planted('a')}@10.0.0.1"],
    ["-m", "checks.ray_cluster", "--nodes", "1", "--gpus", "1", "--address", SECRET_URL],
    ["-m", "checks.preflight", "--sections", "disk", "--image", f"u:{planted('i')}@registry/x:1",
     "--disk-headroom-gb", f"http://u:{planted('d')}@x"],
    ["-m", "checks.vllm_args", "--image", SECRET_URL, "--expect", SECRET_URL],
    ["-m", "checks.engines", "--ranks", "0", "--container", SECRET_URL],
    ["-m", "checks.nccl_transport", "--container", SECRET_URL],
    ["-m", "checks.weights_match", f"node1={SECRET_URL}"],
    ["-m", "checks.weights_verify", "--dest", "/nonexistent", "--expect-hash", SECRET_URL],
]


@pytest.mark.parametrize("argv", CHECK_RUNS, ids=lambda a: a[1] + " " + a[2])
def test_check_programs_never_print_a_credential_from_a_url(argv: list[str]) -> None:
    done = _run(argv)
    _clean(done)
    assert done.returncode == 2, done.stdout + done.stderr


def test_the_bearer_key_is_never_printed_by_the_api_check() -> None:
    """The key travels in an environment variable; a refusal or a failed probe does not show it."""
    env = {"VLLM_API_KEY": planted("bearer")}
    for argv in (["--url", "http://127.0.0.1:9", "--served-name", "m", "--sections", "models", "--timeout-s", "2"],
                 ["--url", "http://127.0.0.1:9", "--served-name", "m", "--deny-paths", "@evil/x"]):
        done = _run(["-m", "checks.api", *argv, "--json"], env=env)
        _clean(done)
        assert done.returncode in (1, 2)
        json.loads(done.stdout.strip().splitlines()[-1])


def _replaced(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the project root whose Pulumi.leak.yaml is prod with `old` replaced by `new` once."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    text = (ROOT / "Pulumi.prod.yaml").read_text()
    assert old in text
    (tmp_path / "Pulumi.leak.yaml").write_text(text.replace(old, new, 1))
    return tmp_path


REPOSITORY = "    repository: vllm/vllm-openai\n"
FABRIC = "    transport: roce\n"
HOSTILE_STACKS = {
    "image reference with registry credentials":
        (REPOSITORY, f"    repository: deployer:{planted('registry')}@registry.example.com/vllm/vllm-openai\n",
         "image.repository"),
    "image URL whose password holds a slash":
        (REPOSITORY, f"    repository: https://deployer:pa/{planted('slash')}@registry.example.com/vllm\n",
         "image.repository"),
    "a token in fabric.env":
        (FABRIC, f"{FABRIC}    env:\n      HF_TOKEN: {planted('fabric-env')}\n", "fabric.env"),
    "a URL with a slash in its password in fabric.env":
        (FABRIC, f"{FABRIC}    env:\n      UCX_REMOTE_URL: http://u:pa/{planted('fabric-url')}@10.0.0.9:1/x\n",
         "fabric.env"),
}


@pytest.mark.parametrize("case", HOSTILE_STACKS, ids=list(HOSTILE_STACKS))
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_a_credential_in_a_refused_value_is_masked(tmp_path: Path, case: str, json_out: bool) -> None:
    """The refusal still names the key and shows the value, with the credential replaced by ***."""
    old, new, key = HOSTILE_STACKS[case]
    done = _run(["-m", "stacks", "plan", "leak", "--assume-secret", "api_key", *(["--json"] if json_out else [])],
                _replaced(tmp_path, old, new))
    _clean(done)
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-1500:]
    assert key in done.stdout + done.stderr and "***" in done.stdout + done.stderr


SECRET_OPTIONS = [f"--api-key={planted('eq')}", f"--hf-token={planted('eq')}", "--api-key", planted("space")]


@pytest.mark.parametrize("program", [["-m", "stacks", "plan", "prod"], ["-m", "stacks", "drift", "prod"],
                                     ["-m", "checks.api", "--url", "http://127.0.0.1:9", "--served-name", "m"],
                                     ["-m", "checks.weights_verify", "--dest", "/nonexistent"],
                                     ["-m", "checks.weights", "verify", "--dest", "/nonexistent"],
                                     ["-m", "lab", "status"]],
                         ids=lambda a: " ".join(a[1:3]))
def test_an_unknown_option_carrying_a_secret_is_refused_masked(program: list[str]) -> None:
    """argparse repeats unrecognized arguments whole; every program's refusal goes through the one masking rule."""
    done = _run([*program, *SECRET_OPTIONS])
    _clean(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--api-key=***" in done.stdout + done.stderr and "--hf-token=***" in done.stdout + done.stderr


def test_advice_that_names_a_config_key_after_secret_keeps_the_key_and_a_value_after_it_is_still_masked() -> None:
    """`pulumi config set --secret vllm-cluster:api_key …` is advice whose next word is the key to set (it printed
    as `--secret ***`, a command nobody could run); a value after `--secret` is still masked."""
    from stacks.model.masking import mask_secrets

    advice = 'pulumi config set --secret vllm-cluster:api_key "$(openssl rand -hex 32)"'
    assert mask_secrets(advice) == advice
    assert mask_secrets("tool --secret sk-live-0123 --token=abc") == "tool --secret *** --token=***"
    assert mask_secrets("tool --secret=vllm-clusterX") == "tool --secret=***"


CARD_COMMANDS = [
    ["image-card", f"deployer:{planted('image')}@registry.example.com/vllm:v1"],
    ["image-card", "--python", sys.executable, f"deployer:{planted('image-python')}@registry.example.com/vllm:v1"],
    ["image-card", f"https://deployer:{planted('image-url')}/PW@registry.example.com/vllm:v1"],
    ["model-card", "--name", "t1", f"s3://AKIA:{planted('s3')}/cr/et@bucket/p"],
    ["model-card", "--name", "t1", f"hf://u:{planted('hf')}/ss@org/name"],
    ["model-card", "--name", "t1", f"https://u:{planted('https')}/ss@huggingface.co/org/name"],
]


@pytest.mark.parametrize("argv", CARD_COMMANDS, ids=lambda a: a[-1].split(":")[0])
def test_a_card_source_with_credentials_is_refused_masked_before_it_is_used(tmp_path: Path, argv: list[str]) -> None:
    """An image reference or model SRC with `user:password@` (a password with `/` included) is refused with exit 2
    before docker, the Hub or S3 see it, and no message shows the password: it once printed the reference whole
    (and handed it to `docker run`), or showed the part before the `/` as a bucket name."""
    done = _run(["-m", "stacks", *argv, *(["--out", str(tmp_path)] if argv[0] == "image-card" else [])],
                _stack(tmp_path, ""))
    _clean(done)
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stderr.splitlines()[-1]
    assert "***@" in said and ("carries credentials" in said or "https: URL" in said), said


URL_SETS = [
    f"model.source.url=s3://AKIA:{planted('url')}/cr/et@bucket/prefix",
    f"model.source.endpoint_url=http://minio:{planted('endpoint')}/ss@10.0.0.1:9000",
]


@pytest.mark.parametrize("setting", URL_SETS, ids=["url", "endpoint_url"])
def test_a_weights_url_whose_password_holds_a_slash_is_refused_as_credentials(tmp_path: Path, setting: str) -> None:
    """`s3://KEY:SE/CRET@bucket`: a URL parser cuts the authority at the `/`, so `KEY:SE` became a bucket name and
    `SE` a port that 'could not be cast to integer'; the userinfo is refused before the URL is parsed."""
    done = _run(["-m", "stacks", "plan", "leak", "--set", "model.source.url=s3://bucket/prefix", "--set", setting],
                _stack(tmp_path, ""))
    _clean(done)
    assert done.returncode == 2 and "carries credentials" in done.stderr, done.stderr[-1500:]


EXTRA_ARGS = {
    "unknown option with a token": [f"--bogus-opt=sk-{planted('opt')}"],
    "a bare token": [f"sk-{planted('bare')}"],
    "an OTLP endpoint with userinfo": ["--otlp-traces-endpoint", f"http://user:{planted('otlp')}/ss@x:4317"],
}


@pytest.mark.parametrize("carded", [True, False], ids=["v0.33.0 card", "no card"])
@pytest.mark.parametrize("case", EXTRA_ARGS, ids=list(EXTRA_ARGS))
def test_a_credential_in_extra_args_is_refused_first_and_never_shown(tmp_path: Path, case: str, carded: bool) -> None:
    """Whatever else is wrong with the word (an option vLLM lacks, a value without a flag), the credential rule
    answers first, with `<plain text>` for the value; without a card the word was once accepted (exit 0) and
    printed three times in the plan."""
    image = ["--set", "image.tag=v0.33.0"] if carded else []
    words = json.dumps(EXTRA_ARGS[case])
    done = _run(["-m", "stacks", "plan", "leak", "--assume-secret", "api_key", *image, "--set",
                 f"serving.extra_args={words}"], _stack(tmp_path, ""))
    _clean(done)
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-1500:]
    assert "serving.extra_args.0 = '<plain text>': looks like a credential in argv" in done.stderr, done.stderr


@pytest.mark.parametrize("words", [["--api-key", "sk-0123456789abcdef"], ["--hf-token=hf_" + "a" * 34]],
                         ids=["api-key", "hf-token"])
def test_a_secret_option_in_extra_args_reads_as_one_sentence(prod_values: dict[str, Any], words: list[str]) -> None:
    """`'--api-key …': --api-key puts …` went through the masking rule as `--api-key *** --api-key *** a secret`
    (the rule masks the word after a secret option): the value is the option alone, and the sentence names it
    where no word follows it."""
    from stacks.model.errors import ConfigError
    from tests.conftest import plan_of

    prod_values["image"] = {"repository": "vllm/vllm-openai", "tag": "v0.33.0"}
    prod_values["serving"]["extra_args"] = words
    with pytest.raises(ConfigError) as info:
        plan_of(prod_values)
    option = words[0].split("=")[0]
    assert f"vllm-cluster:serving.extra_args.0 = '{option}': puts a secret in argv (the value of {option}), " \
           "visible in `ps`" in info.value.report(), info.value.report()


def test_the_one_rule_masks_token_shapes_and_userinfo_up_to_the_at() -> None:
    from stacks.model.masking import has_userinfo, mask_secrets

    assert mask_secrets("--bogus-opt=sk-SECRETVALUE123 and AKIAIOSFODNN7EXAMPLE") == "--bogus-opt=*** and ***"
    assert mask_secrets("s3://AKIA:se/cr/et@bucket/p") == "s3://***@bucket/p"
    for fine in ("hf://org/name@main", "hf://gpt2@refs/pr/1", "s3://bucket/models@v2/x", "/data/hf_downloads",
                 "vllm/vllm-openai:v0.33.0@sha256:" + "0" * 64, "--max-num-batched-tokens=8192"):
        assert mask_secrets(fine) == fine and not has_userinfo(fine), fine
    assert has_userinfo("s3://***@bucket/p"), "a value masked already still holds userinfo (it is refused)"


@pytest.mark.parametrize("setting", [
    'speculative={"method":"dspark","num_speculative_tokens":1,"options":{"model":"https://u:hunter2pw@x/y"}}',
    'speculative={"method":"dspark","num_speculative_tokens":1,"options":{"revision":"sk-hunter2pwabcdef"}}',
    'serving.extra_args=["--ssl-keyfile-password","hunter2pw"]',
    'serving.model_loader_extra_config={"token":"hunter2pw"}',
    'serving.extra_args=["--api-key","-hunter2pw"]',
    'serving.extra_args=["--kv-transfer-config","{\\"kv_connector\\":\\"NixlConnector\\",'
    '\\"kv_connector_extra_config\\":{\\"auth\\":\\"hunter2pw\\"}}"]',
], ids=["draft model url", "draft revision token", "ssl keyfile password", "loader config token",
        "api key starting with a dash", "json auth in a flag value"])
def test_a_secret_in_the_last_corners_is_refused_unechoed(tmp_path: Path, setting: str) -> None:
    """A second hostile review's variants: every one planned (or printed the value) before; each is exit 2 now,
    and the value appears nowhere in what the plan prints, with the committed image and with the carded one."""
    from tests.conftest import ROOT

    for image in ([], ["--set", "image.tag=v0.33.0"]):
        shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path / "Pulumi.prod.yaml")
        shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
        done = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", *image, "--set", setting], cwd=ROOT,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "VLLM_CLUSTER_ROOT": str(tmp_path)})
        out = done.stdout + done.stderr
        assert done.returncode == 2, out[-1500:]
        assert "hunter2pw" not in out, out[-1500:]


def test_a_number_of_hundreds_of_digits_is_cut_in_every_line_of_a_refusal() -> None:
    from stacks.model.errors import Problem

    huge = "9" * 401
    problem = Problem("speculative.options.x", int(huge), "must be 1", upstream=f"ValueError: x={huge} is bad")
    text = problem.render()
    assert huge not in text and "…(401 digits)" in text and len(text) < 600, text
    assert huge not in str(problem.as_dict()["upstream"])  # the value itself stays a JSON number there
