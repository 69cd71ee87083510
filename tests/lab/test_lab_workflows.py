"""The real Pulumi CLI and engine, with the providers built from Go modules, deploying onto the lab cluster.

One deployment, in the order a user meets it; each test leaves the stack as the next one expects (pytest runs them
in file order, `make lab` with one process). What each proves is in its docstring; every command's output is kept
under the run's logs/ directory.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from review.registrations import register
from review.replacement import Registration, action
from stacks.model.loader import read_stack_values
from tests.lab.conftest import STACK, LabDeployment, stack_resources

SECRET_KEYS = ("api_key", "ssh_private_key", "s3_access_key_id", "s3_secret_access_key")
MOCK_SECRETS = {"api_key": "sk-predict", "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----predict",
                "s3_access_key_id": "AKIAPREDICT", "s3_secret_access_key": "predict"}
"""The replacement matrix runs the program under mocks with stand-in secrets: the same before and after a change,
so a secret never decides a predicted action."""


def name_of(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def custom(type_: str) -> bool:
    return not type_.startswith(("vllm-cluster:", "pulumi:pulumi:Stack"))


HEAD = re.compile(r"^\s*[-+~=<>]*\s*(?P<type>[A-Za-z0-9_:/.$-]+): \((?P<op>[a-z-]+)\)\s*$")
"""A step's first line in `--diff` output: `    +-command:remote:Command: (replace)`, `    ~ …: (update)`."""
URN = re.compile(r"^\s*\[urn=(?P<urn>[^\]]+)\]")
OPS = {"same": None, "read": None, "refresh": None, "create": "create", "update": "update", "delete": "delete",
       "replace": "replace", "create-replacement": "replace", "delete-replaced": "replace"}


@dataclass
class Step:
    op: str | None
    pending: bool
    """Every changed value is `[unknown]`: an input is another step's output, known only once that step has run
    (the weights' hashes in `weights-match`); the real update decides then, and a mock sees the resolved value."""


def preview_steps(d: LabDeployment, what: str) -> dict[str, Step]:
    """`pulumi preview --diff`, as the CLI prints it: resource name -> its step, for every custom resource.

    Read from the text because `pulumi preview --json` panics on this program in Pulumi v3.277.0 ("attempt to
    encrypt value"): its JSON display serializes each step's `replacementTrigger` with a crypter that refuses
    secrets (pkg/backend/display/json.go, `stateForJSONOutput` masks only inputs and outputs), and the engine
    group's trigger is a secret digest (docs/limits.md)."""
    out = d.cli.run("preview", "-s", STACK, "--diff", what=what).out
    steps: dict[str, Step] = {}
    head: re.Match[str] | None = None
    name = ""
    body: list[str] = []

    def close() -> None:
        if head is not None and name and custom(head["type"]):
            changed = [line.strip() for line in body if line.strip()[:2] in ("~ ", "- ", "+ ")]
            pending = bool(changed) and all(c.startswith("~ ") and (c.endswith("=> [unknown]") or c.endswith("["))
                                            for c in changed)
            steps[name] = Step(OPS.get(head["op"], head["op"]), pending)

    for line in out.splitlines():
        if (match := HEAD.match(line)) is not None:
            close()
            head, name, body = match, "", []
        elif head is not None and not name and (urn := URN.match(line)) is not None:
            name = name_of(urn["urn"])
        elif head is not None:
            body.append(line)
    close()
    return steps


def predicted(d: LabDeployment, before: dict[str, Any], after: dict[str, Any]) -> dict[str, str]:
    """What the replacement matrix's rules (review/replacement.py `action`) say `pulumi up` does to each resource."""
    old: list[Registration] = register(STACK, before, MOCK_SECRETS)
    new: list[Registration] = register(STACK, after, MOCK_SECRETS)
    olds, news = {r.name: r for r in old}, {r.name: r for r in new}
    out = {}
    for name in sorted(set(olds) | set(news)):
        reg = news.get(name) or olds[name]
        act = action(olds.get(name), news.get(name))
        if act is not None and act.kind != "state" and custom(reg.type):
            out[name] = act.kind
    return out


def plain_values(d: LabDeployment) -> dict[str, Any]:
    values = read_stack_values(STACK, d.cli.project)
    return {k: v for k, v in values.items() if k not in SECRET_KEYS}


def assert_engine_agrees(d: LabDeployment, before: dict[str, Any], what: str) -> dict[str, str]:
    """The real engine's plan for the stack file's current change equals the matrix's prediction, resource by
    resource; any difference is a defect in one of them, printed side by side. A step whose only changes are
    `[unknown]` (pending on another step's output) is compared as 'no change or replace': the matrix sees the
    resolved value, which the real update only learns when it runs."""
    real = preview_steps(d, what)
    guess = predicted(d, before, plain_values(d))
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
    """`pulumi preview --diff` after an image tag bump: each node's image is pulled and the engine group replaced,
    and the real engine's step for every resource equals the replacement matrix's prediction."""
    d = deployment
    before = plain_values(d)
    d.set_image("lab-2")
    real = assert_engine_agrees(d, before, "preview-image-bump")
    images = {n for n, op in real.items() if n.endswith("-image")}
    assert images == {f"{n.name}-image" for n in d.lab.nodes} and all(real[n] == "replace" for n in images), real
    engines = {n for n in real if n.startswith("engine-") and n.endswith(d.lab.nodes[0].name + "-lab-engine")}
    assert engines, f"the head's engine container is not in the preview: {real}"


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
    """`pulumi preview --diff` after argv-only changes: `serving.max_model_len`, and tensor parallelism 1 -> 2 on
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
    stack file, `pulumi preview --diff`, and the real engine's step for every resource equals the prediction.
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
            write_values(d, {k: v for k, v in mutation.values.items() if k not in SECRET_KEYS})
            assert_engine_agrees(d, before, f"preview-matrix-{key}")
            tried.append(mutation.change)
            d.stack_file.write_text(original)
    finally:
        d.stack_file.write_text(original)
    assert len(tried) == len(MATRIX_KEYS), tried


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
                  if str(r.get("type")) == "docker:index/remoteImage:RemoteImage" and not r.get("delete")}
        assert pulled == {f"{n.name}-image": d.images["lab-bad"] for n in d.lab.nodes}, \
            f"the state does not say the bad image was pulled on every node: {pulled}"
    finally:
        d.set_image("lab-1")
        d.cli.run("up", "-s", STACK, "--yes", what="up-after-bad")
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


def test_destroy_leaves_nothing_on_the_nodes(deployment: LabDeployment) -> None:
    """`pulumi destroy`: no container and no firewall table of the stack left on any node; the images stay (kept
    for a rollback, `keep_locally`). The lab's nodes run no systemd, so the firewall's unit is never written
    there and its removal is not shown here."""
    d = deployment
    for node in d.lab.nodes:
        assert "table inet vllm_cluster" in d.node_sh(node.name, "nft list tables"), f"{node.name}: no table to remove"
    d.cli.run("destroy", "-s", STACK, "--yes", what="destroy")
    assert not stack_resources(d)
    for node in d.lab.nodes:
        assert containers(d, node.name) == [], f"{node.name} still has containers"
        tables = d.node_sh(node.name, "nft list tables")
        assert "vllm" not in tables, f"{node.name}: {tables}"
