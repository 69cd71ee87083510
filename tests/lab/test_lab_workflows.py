"""The real Pulumi CLI and engine, with the providers built from Go modules, deploying onto the lab cluster.

One deployment, in the order a user meets it; each test leaves the stack as the next one expects (pytest runs them
in file order, `make lab` with one process). What each proves is in its docstring; every command's output is kept
under the run's logs/ directory.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from review.preview_summary import summarize, to_markdown
from review.registrations import register
from review.replacement import Registration, actions
from stacks.model.config import SECRET_KEYS as CONFIG_SECRET_KEYS
from stacks.model.config import SECRET_OBJECT_KEYS
from stacks.model.loader import read_stack_values
from tests.lab.conftest import FIGURES, STACK, LabDeployment, stack_resources
from tests.nginx_harness import make_certificate

MOCK_SECRETS = {"api_key": "sk-predict-0123456789", "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----predict",
                "s3_access_key_id": "AKIAPREDICT", "s3_secret_access_key": "predict"}
"""The replacement matrix runs the program under mocks with stand-in secrets: the same before and after a change,
so a secret never decides a predicted action."""
ALL_SECRET_KEYS = frozenset((*CONFIG_SECRET_KEYS, *SECRET_OBJECT_KEYS))
"""Keys whose stack-file values are `secure:` (every value of the objects among them): never written back."""


def name_of(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def custom(type_: str) -> bool:
    return not type_.startswith(("vllm-cluster:", "pulumi:pulumi:Stack"))


OPS = {"same": None, "read": None, "refresh": None, "create": "create", "update": "update", "delete": "delete",
       "replace": "replace", "create-replacement": "replace", "delete-replaced": "replace"}
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
"""How the CLI's JSON writes a value not known before the update runs (Pulumi's computed-value placeholder)."""


@dataclass
class Step:
    op: str | None
    pending: bool
    """Every changed input is unknown: it is another step's output, known only once that step has run (the
    weights' hashes in `weights-match`); the real update decides then, and a mock sees the resolved value."""


def preview_steps(d: LabDeployment, what: str) -> dict[str, Step]:
    """`pulumi preview --json`, as the CLI writes it: resource name -> its step, for every custom resource (a
    replacement's create-replacement, replace and delete-replaced steps are one `replace`)."""
    return steps_of(d.cli.run("preview", "-s", STACK, "--json", what=what).out)


def steps_of(out: str) -> dict[str, Step]:
    """`pulumi preview --json`'s text: resource name -> its step (preview_steps)."""
    steps: dict[str, Step] = {}
    for step in json.loads(out).get("steps") or []:
        state = step.get("newState") or step.get("oldState") or {}
        if not custom(str(state.get("type", ""))):
            continue
        name, op = name_of(str(step["urn"])), OPS.get(step["op"], step["op"])
        inputs = (step.get("newState") or {}).get("inputs") or {}
        keys = step.get("diffReasons") or []
        pending = bool(keys) and all(UNKNOWN in json.dumps(inputs.get(k)) for k in keys)
        if name not in steps or steps[name].op != "replace":
            steps[name] = Step(op, pending)
    return steps


def predicted(before: dict[str, Any], after: dict[str, Any], secrets_before: dict[str, Any] = MOCK_SECRETS,
              secrets_after: dict[str, Any] = MOCK_SECRETS) -> dict[str, str]:
    """What the replacement matrix's rules (review/replacement.py `actions`) say `pulumi up` does to each resource."""
    old: list[Registration] = register(STACK, before, secrets_before)
    new: list[Registration] = register(STACK, after, secrets_after)
    regs = {r.name: r for r in [*old, *new]}
    found = actions({r.name: r for r in old}, {r.name: r for r in new})
    return {n: a.kind for n, a in found.items() if a.kind != "state" and custom(regs[n].type)}


def plain_values(d: LabDeployment) -> dict[str, Any]:
    """The stack file's values less every secret (`secure:` entries stand for values only the CLI decrypts)."""
    values = read_stack_values(STACK, d.cli.project)
    return {k: v for k, v in values.items() if k not in ALL_SECRET_KEYS}


def assert_engine_agrees(d: LabDeployment, before: dict[str, Any], what: str,
                         secrets_before: dict[str, Any] = MOCK_SECRETS,
                         secrets_after: dict[str, Any] = MOCK_SECRETS) -> dict[str, str]:
    """The real engine's plan for the stack file's current change equals the matrix's prediction, resource by
    resource; any difference is a defect in one of them, printed side by side. A step whose only changes are
    `[unknown]` (pending on another step's output) is compared as 'no change or replace': the matrix sees the
    resolved value, which the real update only learns when it runs."""
    real = preview_steps(d, what)
    guess = predicted(before, plain_values(d), secrets_before, secrets_after)
    differ = {}
    for name in sorted(set(real) | set(guess)):
        step = real.get(name) or Step(None, False)
        if guess.get(name) != step.op and not (step.pending and guess.get(name) is None):
            differ[name] = (guess.get(name), step.op)
    assert not differ, f"{what}: matrix vs pulumi preview (resource: predicted, real):\n" + "\n".join(
        f"  {n}: {p} vs {r}" for n, (p, r) in differ.items())
    return {n: s.op for n, s in real.items() if s.op is not None}


def containers(d: LabDeployment, node: str) -> list[str]:
    """`NAME IMAGE-ID STATE` of every container on the node (the program creates them from the pulled image's ID)."""
    return d.node_sh(node, "docker ps -aq | xargs -r docker inspect --format "
                           "'{{.Name}} {{.Image}} {{.State.Status}}' | sed 's|^/||'").splitlines()


def image_id(d: LabDeployment, node: str, tag: str) -> str:
    return d.node_sh(node, f"docker image inspect --format '{{{{.Id}}}}' {d.images[tag]}").strip()


def engine_runs(d: LabDeployment, tag: str) -> None:
    """Every node's engine container runs the image `tag` names."""
    for node in d.lab.nodes:
        want = image_id(d, node.name, tag)
        running = [c for c in containers(d, node.name) if c.endswith(" running") and "lab-engine" in c]
        assert running and all(want in c for c in running), (node.name, tag, want, running)


def test_preview_then_up_deploys_and_checks_pass(deployment: LabDeployment) -> None:
    """`pulumi preview`, then `pulumi up`: every resource created; preflight, weights, dry run, collective (gloo on
    CPU) and the API checks run as command resources and pass; the outputs say where the endpoint is."""
    d = deployment
    preview = d.cli.run("preview", "-s", STACK, what="preview")
    assert "to create" in preview.out
    up = d.cli.run("up", "-s", STACK, "--yes", what="up")
    assert re.search(r"\+ \d+ created", up.out), up.out[-2000:]
    outputs = json.loads(d.cli.run("stack", "output", "-s", STACK, "--json", what="outputs").out)
    head = d.lab.nodes[0].address
    assert outputs["endpoint"] == f"http://{head}:8000", outputs
    passed = [f"PASS {check}-{n.name}:" for n in d.lab.nodes for check in
              ("pre-pull", "preflight", "firewall-preflight", "firewall", "args-dry-run", "collective")]
    passed += ["PASS weights-match:", "PASS api-health:", "PASS api-smoke:"]
    missing = [p for p in passed if p not in up.out]
    missing += [n.name for n in d.lab.nodes if f'"check": "weights-{n.name}", "status": "pass"' not in up.out]
    assert not missing, f"no PASS line for {missing} in {up.log}"
    assert "NOT RUN gpu" in up.out, "a rehearsal says which GPU checks it did not run"
    engine_runs(d, "lab-1")


def test_second_up_changes_nothing(deployment: LabDeployment) -> None:
    """A second `pulumi up` of the same stack: 0 changes (`--expect-no-changes` fails the command otherwise)."""
    deployment.cli.run("up", "-s", STACK, "--yes", "--expect-no-changes", what="up-again")


def test_image_bump_preview_is_the_image_and_the_group(deployment: LabDeployment) -> None:
    """`pulumi preview` after an image tag bump: each node's image is pulled and the engine group replaced,
    and the real engine's step for every resource equals the replacement matrix's prediction."""
    d = deployment
    before = plain_values(d)
    d.set_image("lab-2")
    real = assert_engine_agrees(d, before, "preview-image-bump")
    images = {n for n, op in real.items() if n.endswith("-image")}
    assert images == {f"{n.name}-image" for n in d.lab.nodes} and all(real[n] == "replace" for n in images), real
    engines = {n for n in real if n.startswith("engine-") and n.endswith(d.lab.nodes[0].name + "-lab-engine")}
    assert engines, f"the head's engine container is not in the preview: {real}"
    shown = d.cli.run("preview", "-s", STACK, "--diff", what="preview-image-bump-diff").out
    assert re.search(r'name\s*: "[^"]*:lab-1" => "[^"]*:lab-2"', shown), "the --diff text does not show the new image"


def test_up_to_the_new_image(deployment: LabDeployment) -> None:
    d = deployment
    d.cli.run("up", "-s", STACK, "--yes", what="up-image-2")
    engine_runs(d, "lab-2")


def write_values(d: LabDeployment, values: dict[str, Any]) -> None:
    """The stack file with these plain values, its secrets (`secure:` entries) and comments kept (ruamel)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    document = yaml.load(d.stack_file.read_text())
    config = document["config"]
    for key, value in values.items():
        if config.get(f"vllm-cluster:{key}") != value:
            config[f"vllm-cluster:{key}"] = value
    with d.stack_file.open("w") as out:
        yaml.dump(document, out)


def test_argv_change_preview_is_the_group_and_no_image(deployment: LabDeployment) -> None:
    """`pulumi preview` after argv-only changes: `serving.max_model_len`, and tensor parallelism 1 -> 2 on
    two pretended GPUs per node. The engine group and the checks that read argv change, no image is pulled, and
    the matrix predicts every resource's step. Preview only: the stack file is put back."""
    d = deployment
    original = d.stack_file.read_text()
    before = plain_values(d)
    tensor = copy.deepcopy(before)
    tensor["parallelism"]["tensor"] = 2
    for node in tensor["nodes"]:
        node["gpus"]["count"] = 2
    shorter = copy.deepcopy(before)
    shorter["serving"]["max_model_len"] = before["serving"]["max_model_len"] // 2
    try:
        for what, values in (("preview-max-model-len", shorter), ("preview-tensor-2", tensor)):
            write_values(d, values)
            real = assert_engine_agrees(d, before, what)
            assert not [n for n in real if n.endswith("-image")], (what, real)
            assert {f"engine-{n.name}-lab-engine" for n in d.lab.nodes} <= set(real), (what, real)
            d.stack_file.write_text(original)
    finally:
        d.stack_file.write_text(original)


MATRIX_KEYS = ("serving.max_num_seqs", "serving.gpu_memory_utilization", "container.shm_size_mb",
               "parallelism.master_port", "fabric.min_busbw_gbps", "model.served_name", "firewall.ephemeral_ports",
               "container.restart_epoch", "serving.engine_ready_timeout_s", "model.load_gb_per_s")
"""Replacement-matrix rows the lab can express, each previewed for real: engine argv, container settings, ports,
a check's threshold, the served name, the host firewall, a deliberate group restart, the ready timeout and
the load estimate (no process should move for the last)."""


def test_matrix_rows_agree_with_the_real_preview(deployment: LabDeployment) -> None:
    """For each key of MATRIX_KEYS, the matrix's own mutation (review/config_mutations.py `mutate`) written into the
    stack file, `pulumi preview --json`, and the real engine's step for every resource equals the prediction.
    Preview only: the stack file is put back after each key."""
    from review.config_mutations import leaves, mutate

    d = deployment
    original = d.stack_file.read_text()
    before = plain_values(d)
    by_key = {leaf.key: leaf for leaf in leaves()}
    tried = []
    try:
        for key in MATRIX_KEYS:
            outcome = mutate(by_key[key], STACK, before, MOCK_SECRETS, [])
            assert outcome.mutations, f"{key}: the matrix has no mutation for the lab stack ({outcome.refused})"
            mutation = outcome.mutations[0]
            write_values(d, {k: v for k, v in mutation.values.items() if k not in ALL_SECRET_KEYS})
            assert_engine_agrees(d, before, f"preview-matrix-{key}")
            tried.append(mutation.change)
            d.stack_file.write_text(original)
    finally:
        d.stack_file.write_text(original)
    assert len(tried) == len(MATRIX_KEYS), tried


def test_a_rotated_secret_moves_the_whole_group(deployment: LabDeployment) -> None:
    """`pulumi config set --secret api_key` with a new value: only the head's env holds the key, yet the preview
    replaces every node's engine container (each carries the group's secrets holder's ID in a label, new when
    the holder is replaced), as the matrix predicts. An update cut short after the holder and the head (here by
    `--target`) is finished by the next: the peer's own state still holds the old ID."""
    d = deployment
    before = plain_values(d)
    rotated = {**MOCK_SECRETS, "api_key": "sk-rotated-0123456789"}
    new_key = "sk-rotated-lab-7f3e9a1c"
    d.cli.run("config", "set", "--secret", "vllm-cluster:api_key", what="secret-rotate", stdin=new_key)
    d.secrets["api_key"] = new_key
    real = assert_engine_agrees(d, before, "preview-api-key-rotated", secrets_after=rotated)
    engines = {f"engine-{n.name}-lab-engine" for n in d.lab.nodes}
    assert engines <= {n for n, op in real.items() if op == "replace"}, real
    assert real.get("engine-secrets") == "replace", real
    head, peer = f"engine-{d.lab.nodes[0].name}-lab-engine", f"engine-{d.lab.nodes[-1].name}-lab-engine"
    urns = {name_of(str(r["urn"])): str(r["urn"]) for r in stack_resources(d)}
    d.cli.run("up", "-s", STACK, "--yes", "--target", urns["engine-secrets"], "--target", urns[head],
              what="up-rotation-cut-short")
    left = preview_steps(d, "preview-rotation-left")
    assert left.get(peer, Step(None, False)).op == "replace" and head not in left, left
    d.cli.run("up", "-s", STACK, "--yes", what="up-rotation-finished")
    d.cli.run("preview", "-s", STACK, "--expect-no-changes", what="preview-rotated")


PROXY_MOCK_SECRETS = {"tls_certificate": "mock-certificate", "tls_private_key": "mock-key",
                      "proxy_keys": {"lab": "mock-lab-client-key-0123"}}
"""The front door's secrets as the matrix's mocks see them (the names decide what registers, not the values)."""


def test_front_door_on_then_a_front_door_only_change(deployment: LabDeployment) -> None:
    """The nginx front door switched on (the matrix's own switch: vLLM moves to loopback, so the group restarts),
    its TLS pair and a client key set with `pulumi config set --secret`: `pulumi up` runs the proxy container on
    the head (this machine's nginx as an image) and the API checks pass through it, TLS pinned to the certificate.
    Then a front-door-only change (`api.proxy.limits.burst`, the matrix's mutation) previews as the proxy alone:
    no engine, no image; every step as the matrix predicts. The front door stays on for the tests after it."""
    from review.config_mutations import leaves, mutate
    from review.matrix import _proxy_on

    d = deployment
    before = plain_values(d)
    after, _ = _proxy_on(before, {})
    after["api"]["proxy"] |= {"image": {"repository": d.images["nginx"].rsplit(":", 1)[0],
                                        "tag": d.images["nginx"].rsplit(":", 1)[1]}, "check_client": "lab"}
    tls = make_certificate(d.cli.workdir, address=d.lab.nodes[0].address)  # the endpoint's host
    cert, key = tls.pem, tls.key.read_text()
    client_key = "sk-lab-client-5e0b7d2c9a41f836"
    for secret, value in (("tls_certificate", cert), ("tls_private_key", key)):
        d.cli.run("config", "set", "--secret", f"vllm-cluster:{secret}", what=f"secret-{secret}", stdin=value)
    d.cli.run("config", "set", "--secret", "--path", "vllm-cluster:proxy_keys.lab", what="secret-proxy-key",
              stdin=client_key)
    d.secrets |= {"tls_private_key": key, "proxy_keys.lab": client_key}
    write_values(d, after)
    with_proxy = {**MOCK_SECRETS, **PROXY_MOCK_SECRETS}
    real = assert_engine_agrees(d, before, "preview-front-door-on", secrets_after=with_proxy)
    assert [n for n, op in real.items() if "proxy" in n and op == "create"], real
    up = d.cli.run("up", "-s", STACK, "--yes", what="up-front-door")
    assert "PASS api-health:" in up.out and "PASS api-smoke:" in up.out, up.log
    outputs = json.loads(d.cli.run("stack", "output", "-s", STACK, "--json", what="outputs-front-door").out)
    assert outputs["endpoint"] == f"https://{d.lab.nodes[0].address}:443", outputs
    head = d.lab.nodes[0].name
    assert any(c.startswith("vllm-proxy ") and c.endswith(" running") for c in containers(d, head)), \
        containers(d, head)

    original = d.stack_file.read_text()
    proxied = plain_values(d)
    by_key = {leaf.key: leaf for leaf in leaves()}
    try:
        outcome = mutate(by_key["api.proxy.limits.burst"], STACK, proxied, with_proxy, [])
        assert outcome.mutations, outcome.refused
        write_values(d, {k: v for k, v in outcome.mutations[0].values.items() if k not in ALL_SECRET_KEYS})
        changed = assert_engine_agrees(d, proxied, "preview-front-door-only", secrets_before=with_proxy,
                                       secrets_after=with_proxy)
        proxy = {n for n in changed if "proxy" in n and not n.endswith("-image")}
        assert proxy and all(changed[n] in ("replace", "update") for n in proxy), changed
        assert not [n for n in changed if n.startswith("engine-") or n.endswith("-image")], changed
    finally:
        d.stack_file.write_text(original)


def test_rollback_reads_the_real_history_and_returns_without_a_pull(deployment: LabDeployment) -> None:
    """`python -m stacks rollback lab` reads `pulumi stack history --json` as the real CLI writes it and puts the
    prior image back in the stack file; the next `pulumi up` runs it again without pulling it (kept on the nodes)."""
    d = deployment
    kept = {n.name: image_id(d, n.name, "lab-1") for n in d.lab.nodes}
    pulls = d.lab_registry_pulls("lab-1")
    assert pulls >= len(d.lab.nodes), "the registry's access log shows no pull of lab-1 at all: it cannot tell"
    d.cli.python("-m", "stacks", "rollback", STACK, what="rollback")
    assert d.images["lab-1"] in d.stack_file.read_text()
    d.cli.run("up", "-s", STACK, "--yes", what="up-rollback")
    engine_runs(d, "lab-1")
    assert {n.name: image_id(d, n.name, "lab-1") for n in d.lab.nodes} == kept
    assert d.lab_registry_pulls("lab-1") == pulls, "a node asked the registry for the rollback image's layers again"


def test_a_failing_check_fails_up_with_its_evidence(deployment: LabDeployment) -> None:
    """An engine that answers the golden prompt wrongly: `pulumi up` fails at the API check, the output carries the
    check's FAIL line with the answer it got, and the state says what exists: the bad image pulled on every node
    (the replaced lab-1 images stay in the state marked for deletion until an update finishes). The stack is put
    back on lab-1 afterwards, whatever this test found."""
    d = deployment
    d.set_image("lab-bad")
    try:
        failed = d.cli.run("up", "-s", STACK, "--yes", what="up-bad-image", check=False)
        assert failed.code != 0
        assert re.search(r"FAIL api-smoke: [^\n]*answered 'I do not know'", failed.out), failed.log
        resources = stack_resources(d)
        pulled = {name_of(str(r.get("urn", ""))): (r.get("inputs") or {}).get("name") for r in resources
                  if str(r.get("type")) == "docker:index/remoteImage:RemoteImage" and not r.get("delete")
                  and not name_of(str(r.get("urn", ""))).startswith("api-")}  # the front door's image stays
        assert pulled == {f"{n.name}-image": d.images["lab-bad"] for n in d.lab.nodes}, \
            f"the state does not say the bad image was pulled on every node: {pulled}"
    finally:
        d.set_image("lab-1")
        d.cli.run("up", "-s", STACK, "--yes", what="up-after-bad")
    engine_runs(d, "lab-1")


def engine_mounts(d: LabDeployment, node: str) -> list[str]:
    """The host paths the node's engine container mounts (its weights version directory among them)."""
    return d.node_sh(node, "docker inspect --format '{{range .Mounts}}{{println .Source}}{{end}}' lab-engine").split()


def test_a_failed_staged_step_leaves_the_old_group_serving(deployment: LabDeployment) -> None:
    """An image change whose staging fails stops `pulumi up` before any engine stops: the bucket's second shard
    was replaced by a copy 4 KiB shorter than its header says (a broken upload), so the update's weights step
    syncs it into a version directory of its own beside the running one (unchanged files hard-linked, the old
    directory untouched) and fails: the shard disagrees with its header. Every engine container keeps its ID, its
    image and its own directory, and the endpoint still answers the golden prompt through the front door. The
    object and the image are put back afterwards, whatever this test found."""
    from lab.hosts import s3_client

    d = deployment
    outputs = json.loads(d.cli.run("stack", "output", "-s", STACK, "--json", what="outputs-before-staged").out)
    before = {n.name: container_ids(d, n.name) for n in d.lab.nodes}
    mounts = engine_mounts(d, d.lab.nodes[1].name)
    client = s3_client(d.lab)
    key = "qwen3-8b/model-00002-of-00002.safetensors"
    good = client.get_object(Bucket="lab-models", Key=key)["Body"].read()
    client.put_object(Bucket="lab-models", Key=key, Body=good[:-4096])
    d.set_image("lab-2")
    try:
        failed = d.cli.run("up", "-s", STACK, "--yes", what="up-staged-step-fails", check=False)
        assert failed.code != 0, "the short shard was staged without a failure"
        # the weights step itself refuses the new directory (before the page cache or any engine is reached)
        assert re.search(r'"check": "weights-lab\d", "status": "fail", "summary": "synced, but the directory is not a '
                         r'complete model: [^"]*model-00002-of-00002\.safetensors has \d+ bytes, its header says \d+ '
                         r'\(truncated\)', failed.out), failed.log
        assert "the old directory untouched" in failed.out, failed.log
        assert {n.name: container_ids(d, n.name) for n in d.lab.nodes} == before, "an engine moved"
        assert engine_mounts(d, d.lab.nodes[1].name) == mounts
        engine_runs(d, "lab-1")
        assert front_door_chat(d, outputs["endpoint"]) == "323"
    finally:
        client.put_object(Bucket="lab-models", Key=key, Body=good)
        d.set_image("lab-1")
        d.cli.run("up", "-s", STACK, "--yes", what="up-after-staged-failure")
    engine_runs(d, "lab-1")


def test_secrets_never_in_plain_text(deployment: LabDeployment) -> None:
    """The secrets set with `pulumi config set --secret` appear nowhere in plain text: not in `pulumi stack export`,
    the stack file, nor any command's output so far."""
    d = deployment
    exported = d.cli.run("stack", "export", what="export-secrets").out
    texts = {"stack export": exported, "stack file": d.stack_file.read_text(), "logs": d.cli.logs()}
    for key, value in d.secrets.items():
        needle = value.strip().splitlines()[1] if key == "ssh_private_key" else value
        for where, text in texts.items():
            assert needle not in text, f"secret {key} in plain text in {where}"


def test_policy_pack_runs_under_the_real_cli(deployment: LabDeployment) -> None:
    """`pulumi preview --policy-pack policy`: the pack runs in the real CLI. On the lab stack its production rules
    are advisory (they are mandatory for `prod`): the preview passes and names them; with the documented opt-in
    (`--policy-pack-config`, the lab listed in `prod-image-pinned-by-digest`'s stacks) the same preview is refused
    for the lab image's missing digest."""
    d = deployment
    advisory = d.cli.run("preview", "-s", STACK, "--policy-pack", "policy", what="preview-policy")
    assert re.search(r"\[advisory\] +image-pinned-by-digest", advisory.out), advisory.log
    assert "[mandatory]" not in advisory.out, advisory.log
    config = d.cli.workdir / "policy-config.json"
    config.write_text(json.dumps({"prod-image-pinned-by-digest": {"stacks": ["prod", STACK]}}))
    refused = d.cli.run("preview", "-s", STACK, "--policy-pack", "policy", "--policy-pack-config", str(config),
                        what="preview-policy-mandatory", check=False)
    assert refused.code != 0, f"the opted-in mandatory rule let an image without a digest through: {refused.log}"
    assert re.search(r"\[mandatory\] +prod-image-pinned-by-digest +\(docker:index:RemoteImage: lab1-image\)",
                     refused.out), refused.log


def test_refresh_sees_a_hand_change(deployment: LabDeployment) -> None:
    """A container removed by hand on a node: `pulumi refresh` records it gone, and `pulumi up` puts it back. Only
    that container: the rest of the group is not restarted with it (docs/limits.md; `restart-group` does that)."""
    d = deployment
    node = d.lab.nodes[-1].name
    engine = next(c.split()[0] for c in containers(d, node) if "lab-engine" in c)
    d.node_sh(node, f"docker rm -f {engine}")
    refreshed = d.cli.run("refresh", "-s", STACK, "--yes", what="refresh")
    assert re.search(rf"docker:index:Container engine-{node}-lab-engine\s+deleted", refreshed.out), refreshed.log
    d.cli.run("up", "-s", STACK, "--yes", what="up-after-refresh")
    assert any(c.startswith(engine) and "running" in c for c in containers(d, node))


def test_replica_groups_roll_an_image_change_without_a_failed_request(deployment: LabDeployment) -> None:
    """The stack split into two replica groups of one node each (`groups:`, docs/rolling.md), behind the front door
    left on above. Then an image change under a steady load of 4 clients through the front door (streamed and plain
    chat requests): the real engine runs each group's turn in order, drain -> replace -> the group's own check ->
    undrain (their lines appear in that order), both groups end on the new image, and not one request fails. The
    drain table is gone from the front door's node afterwards."""
    from tests.client_load import Load

    d = deployment
    first, second = (n.name for n in d.lab.nodes)
    grouped = plain_values(d)
    grouped["parallelism"] = {**grouped["parallelism"], "data": 1}
    grouped["groups"] = [{"name": "a", "nodes": [first]}, {"name": "b", "nodes": [second]}]
    # the clients below send as fast as the engines answer: limits that never answer them 429 (a rate-limited
    # request would count as failed, and it is not what this measures)
    grouped["api"]["proxy"]["limits"] = {"requests_per_minute_per_key": 1_000_000,
                                         "requests_per_minute_per_client": 1_000_000}
    write_values(d, grouped)
    up = d.cli.run("up", "-s", STACK, "--yes", what="up-groups")
    assert "PASS check-a:" in up.out and "PASS check-b:" in up.out and "PASS api-health:" in up.out, up.log
    outputs = json.loads(d.cli.run("stack", "output", "-s", STACK, "--json", what="outputs-groups").out)
    assert outputs["rolling"]["can_roll"] is True and set(outputs["groups"]) == {"a", "b"}, outputs
    current = "lab-2" if d.images["lab-2"] in d.stack_file.read_text() else "lab-1"
    target = "lab-1" if current == "lab-2" else "lab-2"
    pem = (d.cli.workdir / "server.crt").read_text()
    with Load(outputs["endpoint"], pem, d.secrets["proxy_keys.lab"], "Qwen3-8B", clients=4) as load:
        until(lambda: load.sent >= 20, "the clients' first 20 answers through the front door")
        d.set_image(target)
        began = time.monotonic()
        rolled = d.cli.run("up", "-s", STACK, "--yes", what="up-groups-roll")
        took = time.monotonic() - began
        after = load.sent
        until(lambda: load.sent >= after + 20, "20 more answers after the change")
    FIGURES.append(f"rolling image change of 2 groups under 4 clients: {load.sent} requests, "
                   f"{len(load.failed)} failed, the update took {took:.0f} s")
    assert not load.failed, f"{len(load.failed)} of {load.sent} requests failed: {sorted(set(load.failed))}"
    steps = ["drain a: out of the upstreams", "PASS check-a:", "undrain a: back in the upstreams",
             "drain b: out of the upstreams", "PASS check-b:", "undrain b: back in the upstreams"]
    at = [rolled.out.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), dict(zip(steps, at, strict=True))
    engine_runs(d, target)
    assert "vllm_cluster_drain" not in d.node_sh(first, "nft list tables")


KV_COUNTERS = ("vllm:external_prefix_cache_hits_total", "vllm:nixl_xfer_time_seconds_count",
               "vllm:nixl_num_failed_transfers_total")
"""The decode's evidence that a prompt's KV cache arrived from the prefill (checks/pd.py reads the same)."""


def node_get(d: LabDeployment, node: str, url: str) -> str:
    """GET `url` from inside the node (its loopback, its firewall's view), with the node's own python3."""
    fetch = ("import sys, urllib.request; "
             "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")
    return d.node_sh(node, f"python3 -c {shlex.quote(fetch)} {shlex.quote(url)}")


def kv_counters(d: LabDeployment, node: str, url: str) -> tuple[float, ...]:
    text = node_get(d, node, f"{url}/metrics")
    return tuple(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith((f"{name}{{", f"{name} "))) for name in KV_COUNTERS)


def container_ids(d: LabDeployment, node: str) -> dict[str, str]:
    """name -> ID of every running container on the node: a replaced container has a new ID."""
    out = d.node_sh(node, "docker ps -q --no-trunc | xargs -r docker inspect --format '{{.Name}} {{.Id}}'")
    return dict(line.lstrip("/").split() for line in out.splitlines())


def front_door_chat(d: LabDeployment, endpoint: str) -> str:
    """The golden prompt through the front door with the lab client's key, reasoning off: the answer's text."""
    import ssl

    import httpx

    tls = ssl.create_default_context(cadata=(d.cli.workdir / "server.crt").read_text())
    body = {"model": "Qwen3-8B", "max_tokens": 64, "messages": [{"role": "user", "content": "17*19?"}],
            "chat_template_kwargs": {"enable_thinking": False}}
    answer = httpx.post(f"{endpoint}/v1/chat/completions", json=body, verify=tls, timeout=60,
                        headers={"Authorization": f"Bearer {d.secrets['proxy_keys.lab']}"})
    assert answer.status_code == 200, answer.text[:500]
    return str(answer.json()["choices"][0]["message"]["content"])


def assert_kv_moved_for_one_request(d: LabDeployment, endpoint: str, decode_node: str, decode_url: str) -> None:
    """One request through nginx -> router -> prefill -> decode answers right, and on the decode the prompt's KV
    arrived from the prefill: its external prefix-cache hits and NIXL transfers grew, no transfer failed."""
    before = kv_counters(d, decode_node, decode_url)
    assert front_door_chat(d, endpoint) == "323"
    after = kv_counters(d, decode_node, decode_url)
    assert after[0] > before[0] and after[1] == before[1] + 1 and after[2] == before[2], (before, after)


def test_prefill_decode_groups_behind_the_router_and_a_decode_only_change(deployment: LabDeployment) -> None:
    """The two groups as a prefill tier (a, on the head) and a decode tier (b) with `disaggregation:`, the router's
    pinned wheel fetched from a `file://` URL on the head (an air-gapped head: the wheel copied there first):
    `pulumi up` runs `router-wheel` (sha256 checked, unpacked), the `router` container (the stack's image with the
    wheel mounted) and `check-pd` (the golden prompt through the router and every pair, the decode's counters as
    evidence) for real; then a request through the front door (nginx -> router -> prefill -> decode) answers, with
    the KV cache pulled from the prefill's side channel. Then a decode-only change (the decode tier's own tensor
    parallelism, 1 -> 2 on two pretended GPUs): the preview replaces the decode's engine and never the prefill's
    nor the router, and after `pulumi up` only the decode's container has a new ID; check-pd passes again."""
    from stacks.planner.router import ROUTER_HOST_DIR, ROUTER_WHEEL
    from tests.router_harness import cache_dir, router_runtime

    d = deployment
    first, second = (n.name for n in d.lab.nodes)
    router_runtime()  # the pinned wheel, downloaded and checked once into this machine's cache
    wheel = next(cache_dir().glob(f"*/{ROUTER_WHEEL}"))
    head_root = Path(d.lab.state_dir) / "nodes" / first / "root"  # the head's own /root (lab/hosts.py)
    shutil.copyfile(wheel, head_root / ROUTER_WHEEL)
    values = plain_values(d)
    values["groups"] = [{"name": "a", "role": "prefill", "nodes": [first]},
                        {"name": "b", "role": "decode", "nodes": [second]}]
    values["nodes"][1]["gpus"]["count"] = 2  # pretended (rehearsal): room for the decode's TP 2 below
    values["disaggregation"] = {"router": {"policy": "round_robin", "wheel_url": f"file:///root/{ROUTER_WHEEL}"}}
    write_values(d, values)
    began = time.monotonic()
    up = d.cli.run("up", "-s", STACK, "--yes", what="up-pd")
    took_up = time.monotonic() - began
    passed = [f"vllm-router 0.1.17: unpacked into {ROUTER_HOST_DIR}", "PASS check-a:", "PASS check-b:", "PASS pd:",
              "PASS api-health:", "PASS api-smoke:"]
    assert not [p for p in passed if p not in up.out], f"missing {[p for p in passed if p not in up.out]}: {up.log}"
    at = [up.out.find(p) for p in ("PASS check-b:", "PASS pd:", "PASS api-smoke:")]
    assert at == sorted(at), "the router's check runs after both tiers' and before the front door's"
    outputs = json.loads(d.cli.run("stack", "output", "-s", STACK, "--json", what="outputs-pd").out)
    assert outputs["router"] == "lab-engine-router" and outputs["rolling"]["can_roll"] is False, outputs
    decode = f"http://{d.lab.nodes[1].address}:8000"
    assert_kv_moved_for_one_request(d, outputs["endpoint"], second, decode)
    routed = node_get(d, first, "http://127.0.0.1:29000/metrics")
    assert re.search(rf'vllm_router_pd_decode_requests_total{{[^}}]*worker="{re.escape(decode)}(@\d+)?"[^}}]*}} [1-9]',
                     routed), routed[-2000:]

    ids = {n.name: container_ids(d, n.name) for n in d.lab.nodes}
    decode_only = copy.deepcopy(values)
    decode_only["groups"][1]["parallelism"] = {"tensor": 2, "data": 1, "backend": "mp"}
    write_values(d, decode_only)
    preview = d.cli.run("preview", "-s", STACK, "--json", what="preview-pd-decode-only").out
    steps = steps_of(preview)
    replaced = {n for n, step in steps.items() if step.op == "replace"}
    assert f"engine-b-{second}-lab-engine" in replaced, steps
    assert not {f"engine-a-{first}-lab-engine", "router", "router-wheel"} & {n for n, s in steps.items() if s.op}, \
        steps
    # the reviewer's summary of that real preview says the same per tier (review/preview_summary.py)
    summary = summarize(json.loads(preview))
    found = summary["engine_groups"]
    assert {g: v["verdict"] for g, v in found["groups"].items()} == {"a": "keeps running", "b": "restarts"}, found
    assert found["groups"]["b"]["replaced_on"] == [second] and found["router"] == "unchanged", found
    text = to_markdown(summary)
    assert "- group `b` (decode tier): **restarts**" in text and "- router: keeps running" in text, text
    began = time.monotonic()
    changed = d.cli.run("up", "-s", STACK, "--yes", what="up-pd-decode-only")
    took_change = time.monotonic() - began
    assert "PASS check-b:" in changed.out and "PASS pd:" in changed.out, changed.log
    assert "PASS check-a:" not in changed.out, "the prefill group's check ran again: it was not changed"
    now = {n.name: container_ids(d, n.name) for n in d.lab.nodes}
    assert now[first] == ids[first], (ids[first], now[first])  # prefill engine, router, front door: the same
    assert now[second]["lab-engine"] != ids[second]["lab-engine"], (ids[second], now[second])
    assert_kv_moved_for_one_request(d, outputs["endpoint"], second, decode)
    d.cli.run("preview", "-s", STACK, "--expect-no-changes", what="preview-pd-settled")
    FIGURES.append(f"prefill/decode: pulumi up from two replica groups (both tiers replaced, router wheel, router, "
                   f"check-pd) {took_up:.0f} s; the decode-only change (decode TP 1 -> 2) {took_change:.0f} s")


def until(condition: Any, what: str, deadline_s: float = 300) -> None:
    """Wait for `condition()` (polled), failing with `what` past a generous deadline."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"not within {deadline_s:.0f} s: {what}"
        time.sleep(0.5)


def test_destroy_leaves_nothing_on_the_nodes(deployment: LabDeployment) -> None:
    """`pulumi destroy`: no container, no firewall table and no firewall unit of the stack left on any node (the
    unit was written and enabled by the update: the lab's systemctl is the real one, offline, lab/hosts.py); the
    images stay (kept for a rollback, `keep_locally`)."""
    from stacks.planner.firewall import UNIT, UNIT_DIR
    from stacks.planner.router import ROUTER_HOST_DIR

    d = deployment
    unit = f"{UNIT_DIR}/{UNIT}"
    enabled = f"{UNIT_DIR}/multi-user.target.wants/{UNIT}"
    for node in d.lab.nodes:
        assert "table inet vllm_cluster" in d.node_sh(node.name, "nft list tables"), f"{node.name}: no table to remove"
        assert sorted(d.node_sh(node.name, f"ls {unit} {enabled}").split()) == sorted([unit, enabled]), node.name
    head = d.lab.nodes[0].name
    wheel = any(name_of(str(r.get("urn", ""))) == "router-wheel" for r in stack_resources(d))
    if wheel:  # the prefill/decode workflow left its router: its unpacked wheel goes with the stack
        assert d.node_sh(head, f"ls -d {ROUTER_HOST_DIR}").strip() == ROUTER_HOST_DIR
    d.cli.run("destroy", "-s", STACK, "--yes", what="destroy")
    assert not stack_resources(d)
    if wheel:
        assert d.node_sh(head, f"ls -d {ROUTER_HOST_DIR} 2>/dev/null || true").strip() == "", "the router wheel stays"
    for node in d.lab.nodes:
        assert containers(d, node.name) == [], f"{node.name} still has containers"
        tables = d.node_sh(node.name, "nft list tables")
        assert "vllm" not in tables, f"{node.name}: {tables}"
        left = d.node_sh(node.name, f"ls {UNIT_DIR} {UNIT_DIR}/multi-user.target.wants 2>/dev/null || true")
        assert UNIT not in left, f"{node.name}: the firewall unit is still there: {left}"
