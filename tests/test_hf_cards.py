"""`model-card hf://ORG/NAME[@REVISION]` (review/hf_source.py) against a loopback stand-in for the Hub
(tests/hub_server.py: the same URL layout, redirects and range answers; nothing leaves the machine), the refusal of a
folder with only config.json and the index, and the Qwen2 / Mixtral tensor names of `--synthesize-weights` checked
against the published `total_size` of real checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from review.hf_source import HubSource, parse_hf
from review.model_card import CardError, LocalSource, build_card, main, model_facts, synthesize
from tests.conftest import ROOT
from tests.hub_server import COMMIT, Hub, Repo, hub_server
from tests.test_model_cards import TINY, _write_shards

TOKEN = "hf_PlantedSecretToken0123456789abcdefXYZ"
"""A made-up token: it must appear in no output, error or card."""
FIXTURES = ROOT / "tests" / "fixtures" / "models"


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy (it would take a request elsewhere), no real Hub address, no token from the environment."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: a test that forgets its server fails


def _model(tmp_path: Path, name: str = "tiny", shards: int = 2) -> Path:
    """A small MoE checkpoint (config, index, real safetensors shards) above the planner's 10 MB floor."""
    model = tmp_path / name
    model.mkdir()
    config = {**TINY, "vocab_size": 40_000}
    (model / "config.json").write_text(json.dumps(config))
    _write_shards(model, synthesize(model_facts(config, config)[0]), shards)
    return model


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir(parents=True, exist_ok=True)
    (root / "Pulumi.yaml").write_text("name: vllm-cluster\n")
    return root


def _card(src: str, root: Path, name: str = "tiny") -> tuple[int, str, dict[str, Any] | None]:
    lines: list[str] = []
    code = main(src, name, synthesize_weights=False, facts=[], why=None, endpoint_url=None, region=None, root=root,
                command=["python", "-m", "stacks", "model-card", src, "--name", name], echo=lines.append)
    path = root / "models" / f"{name}.json"
    return code, "\n".join(lines), json.loads(path.read_text()) if code == 0 else None


def _serve(monkeypatch: pytest.MonkeyPatch, hub: Hub, token: str | None = None) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    if token is not None:
        monkeypatch.setenv("HF_TOKEN", token)


# ------------------------------------------------------------------------------------- the same card as from disk


def test_cli_card_from_the_hub_equals_the_card_from_the_directory(tmp_path: Path) -> None:
    """`python -m stacks model-card hf://...` with HF_ENDPOINT at the stand-in writes the card the local directory
    gives, but for where it came from (the commit the revision resolved to) and the command; the token reaches the
    Hub and never the CDN, and no weight byte is read."""
    model = _model(tmp_path)
    local_root, hub_root = _project(tmp_path / "a"), _project(tmp_path / "b")
    code, out, local = _card(str(model), local_root)
    assert code == 0, out
    with hub_server({"org/tiny": Repo(model, token=TOKEN)}) as hub:
        env = {"VLLM_CLUSTER_ROOT": str(hub_root), "PATH": "/usr/bin:/bin", "HF_ENDPOINT": hub.endpoint,
               "HF_TOKEN": TOKEN}
        done = subprocess.run([sys.executable, "-m", "stacks", "model-card", "hf://org/tiny", "--name", "tiny"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    remote = json.loads((hub_root / "models" / "tiny.json").read_text())
    assert local is not None and remote["source"] == f"hf://org/tiny@{COMMIT}"
    assert remote["generated_by"] == "python -m stacks model-card hf://org/tiny --name tiny"
    for key in set(local) | set(remote):
        if key not in ("source", "generated_by"):
            assert remote.get(key) == local.get(key), key
    assert remote["weights"]["source"] == "model.safetensors.index.json and every shard's safetensors header"
    assert TOKEN not in done.stdout + done.stderr + json.dumps(remote)
    to_cdn = [r for r in hub.log if str(r["path"]).startswith("/cdn/")]
    to_hub = [r for r in hub.log if not str(r["path"]).startswith("/cdn/")]
    assert to_cdn and all(r["auth"] is None and str(r["host"]).startswith("localhost:") for r in to_cdn)
    assert to_hub and all(r["auth"] == f"Bearer {TOKEN}" for r in to_hub)
    assert all(r["range"] for r in to_cdn)  # shards are only ever read in ranges
    headers = sum(8 + int.from_bytes(p.read_bytes()[:8], "little") for p in model.glob("*.safetensors"))
    small = sum(p.stat().st_size for p in model.glob("*.json"))
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    assert hub.served <= headers + small + 8 * 2 < weights / 100, (hub.served, weights)


def test_the_revision_is_pinned_to_the_commit_the_hub_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first answer every file is read at X-Repo-Commit: a branch that moves mid-run cannot mix files."""
    model = _model(tmp_path)
    with hub_server({"org/tiny": Repo(model)}) as hub:
        _serve(monkeypatch, hub)
        code, out, card = _card("hf://org/tiny@main", _project(tmp_path))
    assert code == 0 and card is not None, out
    resolves = [str(r["path"]) for r in hub.log if "/resolve/" in str(r["path"])]
    assert resolves[0] == "/org/tiny/resolve/main/config.json"
    assert all(f"/resolve/{COMMIT}/" in p for p in resolves[1:]) and len(resolves) > 3
    assert card["source"] == f"hf://org/tiny@{COMMIT}"


def test_a_renamed_repository_follows_the_relative_redirect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative Location (the Hub's answer for a renamed repository) is followed on the same origin, token kept."""
    model = _model(tmp_path)
    with hub_server({"org/tiny": Repo(model, token=TOKEN, renamed_from="old/tiny")}) as hub:
        _serve(monkeypatch, hub, TOKEN)
        code, out, card = _card("hf://old/tiny", _project(tmp_path))
    assert code == 0 and card is not None, out
    assert any(str(r["path"]).startswith("/old/tiny/") and r["auth"] == f"Bearer {TOKEN}" for r in hub.log)


# ------------------------------------------------------------------------------------- refusals, exit 2


def test_a_private_repository_needs_the_token_and_never_prints_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """401 without a token: exit 2 naming HF_TOKEN; a wrong token (which a hostile server echoes back in its error
    answers): exit 2, and neither token appears; the right one: the card."""
    model = _model(tmp_path)
    root = _project(tmp_path)
    with hub_server({"org/tiny": Repo(model, token=TOKEN)}) as hub:
        hub.hostile = "reflect"
        _serve(monkeypatch, hub)
        code, out, _ = _card("hf://org/tiny", root)
        assert code == 2 and "401" in out and "set HF_TOKEN to a read token" in out, out
        wrong = "hf_WrongPlantedToken9876543210zyxwvu"
        monkeypatch.setenv("HF_TOKEN", wrong)
        code, out, _ = _card("hf://org/tiny", root)
        assert code == 2 and "refused HF_TOKEN" in out and wrong not in out, out
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        code, out, card = _card("hf://org/tiny", root)
    assert code == 0 and card is not None, out
    assert TOKEN not in out + json.dumps(card)


def test_a_token_echoed_into_a_redirect_is_not_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that redirects a shard to `file:` (with the token in the URL) is refused without following it, and
    the message shows no token."""
    model = _model(tmp_path)
    with hub_server({"org/tiny": Repo(model, token=TOKEN)}) as hub:
        hub.hostile = "reflect"
        _serve(monkeypatch, hub, TOKEN)
        hub.hostile = "file"
        code, out, _ = _card("hf://org/tiny", _project(tmp_path))
    assert code == 2 and "redirected to a file: address, not http(s); not followed" in out, out
    assert TOKEN not in out


@pytest.mark.parametrize(("mutate", "said"), [
    (lambda m: (m / "model-00002-of-00002.safetensors").unlink(),
     "model-00002-of-00002.safetensors, which hf://org/tiny@"),
    (lambda m: (m / "model-00001-of-00002.safetensors").write_bytes(
        (m / "model-00001-of-00002.safetensors").read_bytes()[:200]), "the header is cut short"),
    (lambda m: (m / "model-00001-of-00002.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}"),
     "header length 1099511627776 is not plausible"),
    (lambda m: (m / "model-00001-of-00002.safetensors").write_bytes(b"\x01\x02"),
     "shorter than the 8-byte safetensors header length"),
])
def test_a_bad_shard_on_the_hub_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutate: Any,
                                           said: str) -> None:
    """A shard the repository lacks (404), a header cut short, an absurd header length, a stub file: exit 2 naming
    the shard, as for a local directory, and nothing is written."""
    model = _model(tmp_path)
    mutate(model)
    root = _project(tmp_path)
    with hub_server({"org/tiny": Repo(model)}) as hub:
        _serve(monkeypatch, hub)
        code, out, _ = _card("hf://org/tiny", root)
    assert code == 2 and said in out and "Traceback" not in out, out
    assert not (root / "models" / "tiny.json").exists()


def test_reads_stop_at_the_byte_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A header length under the 100 MB the safetensors loader allows but over what this run may still read is
    refused before it is fetched: the bytes read in all are bounded."""
    model = _model(tmp_path)
    shard = model / "model-00001-of-00002.safetensors"
    shard.write_bytes((50 * 2**20).to_bytes(8, "little") + shard.read_bytes()[8:])
    with hub_server({"org/tiny": Repo(model)}) as hub:
        _serve(monkeypatch, hub)
        source = HubSource("hf://org/tiny", max_bytes=2**20)
        with pytest.raises(CardError, match=r"reading 52428800 bytes would pass 1048576 bytes read in all"):
            build_card(source, "tiny", synthesize_weights=False, facts_given={}, why=None, command=[])
    assert hub.served < 2**20


@pytest.mark.parametrize(("hostile", "said"), [
    ("loop", "more than 5 redirects"),
    ("ignore-range", "the server ignored the byte range asked for"),
])
def test_a_misbehaving_server_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: str,
                                         said: str) -> None:
    model = _model(tmp_path)
    with hub_server({"org/tiny": Repo(model)}) as hub:
        _serve(monkeypatch, hub)
        hub.hostile = hostile
        code, out, _ = _card("hf://org/tiny", _project(tmp_path))
    assert code == 2 and said in out, out


def test_unknown_repository_and_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path)
    with hub_server({"org/tiny": Repo(model)}) as hub:
        _serve(monkeypatch, hub)
        code, out, _ = _card("hf://org/nothing", _project(tmp_path))
        assert code == 2 and "org/nothing does not exist or is private or gated" in out, out
        code, out, _ = _card("hf://org/tiny@v9", _project(tmp_path))
        assert code == 2 and "the Hub has no revision 'v9' of org/tiny" in out, out


def test_nothing_listens(tmp_path: Path) -> None:
    code, out, _ = _card("hf://org/tiny", _project(tmp_path))  # HF_ENDPOINT: the discard port, closed
    assert code == 2 and "cannot reach http://127.0.0.1:9" in out and "HF_ENDPOINT" in out, out


@pytest.mark.parametrize("src", [
    "hf://org/../etc", "hf://org/na..me", "hf://org/name;rm -rf", "hf://org/name@main;id", "hf://org/na\x1bme",
    "hf://org/name@main\n", "hf://org/name@../x", "hf://a/b/c", "hf://org/name.git", "hf://", "hf://org/name@",
    "hf://-org/name", "hf://org/name@main@v2", "hf://org/n\u202eame", "hf://org/name@ma in",
])
def test_names_are_checked_before_any_request(src: str, tmp_path: Path) -> None:
    code, out, _ = _card(src, _project(tmp_path))
    assert code == 2 and "SRC " in out and ("hf://ORG/NAME[@REVISION]" in out or "is not a revision" in out), out
    assert "\x1b" not in out and "\n" not in out and "\u202e" not in out


def test_revisions_and_repos_that_are_fine() -> None:
    assert parse_hf("hf://Qwen/Qwen2.5-7B-Instruct") == ("Qwen/Qwen2.5-7B-Instruct", "main")
    assert parse_hf("hf://gpt2@refs/pr/1") == ("gpt2", "refs/pr/1")
    assert parse_hf(f"hf://mistralai/Mixtral-8x7B-v0.1@{COMMIT}") == ("mistralai/Mixtral-8x7B-v0.1", COMMIT)


@pytest.mark.parametrize(("endpoint", "said"), [
    ("ftp://mirror.example", "HF_ENDPOINT = 'ftp://mirror.example': not an http(s) address"),
    ("https://user:hunter2@mirror.example", "HF_ENDPOINT = *** (it holds credentials)"),
    ("https://hf_hunter2@mirror.example", "HF_ENDPOINT = *** (it holds credentials)"),
    ("https://mirror.example/?x=1", "not an http(s) address"),
    ("file:///etc", "not an http(s) address"),
])
def test_a_bad_endpoint_is_refused(endpoint: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    code, out, _ = _card("hf://org/tiny", _project(tmp_path))
    assert code == 2 and said in out and "hunter2" not in out, out


@pytest.mark.parametrize("token", ["hf_abc\r\nX-Evil: 1", "hf abc", "hf_\u00e9"])
def test_a_token_that_is_not_one_is_refused_unprinted(token: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", token)
    code, out, _ = _card("hf://org/tiny", _project(tmp_path))
    assert code == 2 and "HF_TOKEN is set but is not a token" in out and token not in out, out


def test_s3_flags_are_refused_with_a_hub_source(tmp_path: Path) -> None:
    lines: list[str] = []
    code = main("hf://org/tiny", "tiny", synthesize_weights=False, facts=[], why=None,
                endpoint_url="http://minio:9000", region=None, root=_project(tmp_path), command=[], echo=lines.append)
    assert code == 2 and "--endpoint-url is for s3:// sources" in lines[0] and "HF_ENDPOINT" in lines[0]


# ------------------------------------------------------------------------------------- config and index, no shards


def test_config_and_index_alone_name_both_ways_to_a_card(tmp_path: Path) -> None:
    """A folder with config.json and the index but none of its shards is not 'an incomplete upload': the message
    names --synthesize-weights and the hf:// way, and --synthesize-weights then writes the card."""
    model = _model(tmp_path)
    for shard in model.glob("*.safetensors"):
        shard.unlink()
    root = _project(tmp_path)
    code, out, _ = _card(str(model), root)
    assert code == 2, out
    assert "holds config.json and model.safetensors.index.json but none of the 2 shard files" in out
    assert "--synthesize-weights" in out and "model-card hf://ORG/NAME[@REVISION] --name tiny" in out
    assert "incomplete upload" not in out
    lines: list[str] = []
    assert main(str(model), "tiny", synthesize_weights=True, facts=[], why=None, endpoint_url=None, region=None,
                root=root, command=[], echo=lines.append) == 0, lines


def test_one_missing_shard_is_still_an_incomplete_copy(tmp_path: Path) -> None:
    model = _model(tmp_path)
    (model / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CardError, match="an incomplete upload or copy"):
        build_card(LocalSource(model), "tiny", synthesize_weights=False, facts_given={}, why=None, command=[])


# ------------------------------------------------------------------------------------- Qwen2 / Mixtral synthesis

PUBLISHED_TOTAL_SIZE = {
    "qwen2.5-7b-instruct": 15_231_233_024,
    "mixtral-8x7b-v0.1": 93_405_585_408,
}
"""`metadata.total_size` of the published model.safetensors.index.json (tensor bytes, headers excluded); where each
figure was found is in tests/fixtures/models/ORIGINS.md: Qwen/Qwen2.5-7B-Instruct's from two independent write-ups
quoting its index (one giving the URL of the index itself); mistralai/Mixtral-8x7B's from
fxmeng/mixtral_spliter select_experts.py (9f80b5d0), which writes it into an index derived from the 8x7B Instruct
checkpoint (same shapes), and a model dossier's 46,702,792,704 parameters x 2 bytes."""


@pytest.mark.parametrize(("name", "tensors"), [("qwen2.5-7b-instruct", 339), ("mixtral-8x7b-v0.1", 995)])
def test_synthesized_bytes_equal_the_published_total_size(name: str, tensors: int, tmp_path: Path) -> None:
    """`--synthesize-weights` for the fixture config.json: the card's bytes equal the published total_size to the
    byte (a missing bias vector, 3,584 x 2 bytes, or one router would break it)."""
    root = _project(tmp_path)
    lines: list[str] = []
    assert main(str(FIXTURES / name), name, synthesize_weights=True, facts=[], why=None, endpoint_url=None,
                region=None, root=root, command=[], echo=lines.append) == 0, lines
    card = json.loads((root / "models" / f"{name}.json").read_text())
    assert card["weights"]["total_bytes"] == PUBLISHED_TOTAL_SIZE[name]
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    assert len(synthesize(model_facts(raw, raw)[0])) == tensors


def test_qwen2_has_q_k_v_biases_and_no_o_bias() -> None:
    raw = json.loads((FIXTURES / "qwen2.5-7b-instruct" / "config.json").read_text())
    names = set(synthesize(model_facts(raw, raw)[0]))
    attn = "model.layers.0.self_attn"
    assert {f"{attn}.{p}_proj.bias" for p in "qkv"} <= names and f"{attn}.o_proj.bias" not in names


def test_mixtral_names_and_split() -> None:
    """Mixtral's checkpoint names (`block_sparse_moe.experts.N.w1/w2/w3`, the router `block_sparse_moe.gate`): the
    experts are counted as experts and the router as replicated (vLLM's GateLinear is a ReplicatedLinear)."""
    raw = json.loads((FIXTURES / "mixtral-8x7b-v0.1" / "config.json").read_text())
    facts, _sources = model_facts(raw, raw)
    tensors = synthesize(facts)
    assert tensors["model.layers.31.block_sparse_moe.experts.7.w1.weight"] == ("BF16", [14336, 4096])
    assert tensors["model.layers.31.block_sparse_moe.experts.7.w2.weight"] == ("BF16", [4096, 14336])
    assert tensors["model.layers.0.block_sparse_moe.gate.weight"] == ("BF16", [8, 4096])
    from stacks.planner.memory import classify

    assert classify("model.layers.0.block_sparse_moe.gate.weight") == "replicated"
    assert classify("model.layers.0.block_sparse_moe.experts.3.w2.weight") == "experts"


def test_real_mixtral_and_qwen2_headers_give_the_synthesized_card(tmp_path: Path) -> None:
    """Tiny Qwen2 and Mixtral checkpoints written by the safetensors library with the synthesized names: the card
    from their headers and the synthesized card agree on every byte, and the index check accepts the names."""
    for config in ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
                    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 4096,
                    "torch_dtype": "bfloat16", "tie_word_embeddings": True},
                   {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
                    "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
                    "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}):
        model = tmp_path / config["model_type"]
        model.mkdir()
        (model / "config.json").write_text(json.dumps(config))
        _write_shards(model, synthesize(model_facts(config, config)[0]))
        real = build_card(LocalSource(model), "t", synthesize_weights=False, facts_given={}, why=None, command=[])
        made = build_card(LocalSource(model), "t", synthesize_weights=True, facts_given={}, why=None, command=[])
        assert "every name matches" in made["weights"]["source"]
        for key in ("total_bytes", "experts_bytes", "dense_bytes", "replicated_bytes", "layer_bytes"):
            assert real["weights"][key] == made["weights"][key], (config["model_type"], key)
