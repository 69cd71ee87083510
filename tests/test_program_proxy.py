"""The program with the nginx front door on, under Pulumi's mocks: what is registered, where, and as secrets."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stacks.model.field_types import SECRET
from stacks.model.loader import read_stack_values
from stacks.planner.proxy import CONF_PATH, TLS_CERT_PATH, TLS_KEY_PATH
from tests.nginx_harness import CLIENT_KEYS, UPSTREAM_KEY
from tests.pulumi_harness import Run, run_program
from tests.test_program import CONTAINER, IMAGE, SECRET_SIG, SECRET_VALUE
from tests.test_proxy_nginx import with_proxy

CERT = "-----BEGIN CERTIFICATE-----\nMIImock\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIImockkey\n-----END PRIVATE KEY-----\n"
SECRETS: dict[str, Any] = {"api_key": UPSTREAM_KEY, "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----mock",
                           "tls_certificate": CERT, "tls_private_key": KEY, "proxy_keys": CLIENT_KEYS}


def proxied_values(stack: str, **proxy: Any) -> dict[str, Any]:
    values = with_proxy(read_stack_values(stack), **proxy)
    return {k: v for k, v in values.items() if k not in SECRETS}


@pytest.fixture(scope="module", params=["prod", "h20"])
def run(request: pytest.FixtureRequest) -> Run:
    result = run_program(request.param, proxied_values(request.param), secrets=SECRETS)
    assert result.error is None, result.error
    return result


def unwrap(value: Any) -> Any:
    return value["value"] if isinstance(value, dict) and SECRET_SIG in value else value


def test_nginx_container_on_the_head_with_secret_uploads(run: Run) -> None:
    head = run.result["nodes"][next(iter(run.result["nodes"]))]
    proxy = run.mocks.named("api-proxy")
    assert proxy.typ == CONTAINER and proxy.provider and head.provider._name in proxy.provider
    assert proxy.inputs["name"] == "vllm-proxy" and proxy.inputs["networkMode"] == "host"
    assert proxy.inputs["entrypoints"] == ["/bin/sh", "-c"]
    assert proxy.inputs["command"] == ["rm -f /var/run/nginx-vllm-front.sock && exec nginx -g 'daemon off;'"]
    assert proxy.inputs["healthcheck"]["tests"] == ["CMD", "nginx", "-t", "-q"] and proxy.inputs["wait"] is True
    image = run.mocks.named("api-proxy-image")
    assert image.typ == IMAGE and image.inputs == {"name": "nginx:1.27-alpine", "keepLocally": True}
    uploads = proxy.inputs["uploads"]
    assert uploads[SECRET_SIG] == SECRET_VALUE  # the whole list travels as a secret
    files = {u["file"]: u for u in unwrap(uploads)}
    assert set(files) == {CONF_PATH, TLS_CERT_PATH, TLS_KEY_PATH}
    assert files[TLS_KEY_PATH]["permissions"] == "0600" and files[TLS_CERT_PATH]["content"] == CERT
    conf = files[CONF_PATH]["content"]
    assert f'"~^Bearer {CLIENT_KEYS["team-a"]}$" "team-a";' in conf
    assert f'proxy_set_header Authorization "Bearer {UPSTREAM_KEY}";' in conf
    options = run.options["api-proxy"]
    assert options.delete_before_replace is True and "uploads" in (options.replace_on_changes or [])


def test_vllm_binds_loopback_and_the_checks_go_through_the_proxy(run: Run) -> None:
    head_name = next(iter(run.result["nodes"]))
    head = next(r for r in run.mocks.of_type(CONTAINER) if r.name.startswith(f"engine-{head_name}-"))
    command = " ".join(unwrap(head.inputs["command"]))  # mp: vllm serve argv; ray: the head script
    assert "--host 127.0.0.1 " in command and "0.0.0.0" not in command
    health = run.mocks.named("api-health")
    assert " --url https://" in health.inputs["create"] and ":443 " in health.inputs["create"]
    assert "--ca-env VLLM_TLS_CA" in health.inputs["create"]
    smoke = run.mocks.named("api-smoke").inputs["create"]
    assert "--sections models,chat,thinking,stream,auth,deny" in smoke
    deny = smoke.split("--deny-paths ", 1)[1].split(" ", 1)[0].split(",")
    assert {"/collective_rpc", "/tokenize", "/invocations", "/pause"} <= set(deny)
    assert not {"/v1/chat/completions", "/v1/models", "/health"} & set(deny)
    env = run.mocks.named("api-smoke").inputs["environment"]
    assert env[SECRET_SIG] == SECRET_VALUE
    assert env["value"] == {"VLLM_API_KEY": CLIENT_KEYS["team-a"], "VLLM_TLS_CA": CERT}  # a client key, not vLLM's
    assert run.outputs["endpoint"].startswith("https://") and run.outputs["endpoint"].endswith(":443")


def test_health_waits_for_the_proxy_and_every_engine(run: Run) -> None:
    api, engine = run.result["api"], run.result["engine"]
    deps = run.all_options["api-health"].depends_on
    assert api.proxy in deps and all(c in deps for c in engine.containers.values())
    assert run.mocks.named("api-proxy").inputs["image"] == "sha256:mock-api-proxy-image"  # the pulled image's id


def test_no_secret_in_argv_outputs_or_plain_inputs(run: Run) -> None:
    secrets = [UPSTREAM_KEY, *CLIENT_KEYS.values(), "MIImockkey"]
    for r in run.mocks.resources:
        for name, value in r.inputs.items():
            if isinstance(value, dict) and SECRET_SIG in value:
                continue
            for secret in secrets:
                assert secret not in str(value), (r.name, name)
    for secret in secrets:
        assert secret not in str(run.outputs)


def test_proxy_off_registers_no_proxy() -> None:
    run = run_program("prod")
    assert not [r for r in run.mocks.resources if "proxy" in r.name]
    assert run.outputs["endpoint"] == "http://10.30.8.1:8030"


def test_a_short_client_key_fails_the_preview_without_showing_it() -> None:
    secrets = copy.deepcopy(SECRETS)
    secrets["proxy_keys"] = {"team-a": "short"}
    values = proxied_values("prod")
    values["proxy_keys"] = {"team-a": SECRET}
    run = run_program("prod", values, preview=True, secrets=secrets)
    assert run.error is not None
    assert "proxy_keys.team-a" in str(run.error) and "at least 16" in str(run.error)
    assert "short" not in str(run.error).replace("shorter", "")
