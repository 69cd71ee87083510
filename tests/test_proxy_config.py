"""The proxy's config rules, its plan (listeners with bind and network), and the offline review commands."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from typing import Any

import pytest

from stacks.model.config import SECRET_MARKER
from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config
from stacks.planner.proxy import ProxyKeyError, check_keys
from tests.conftest import ROOT, plan_of, problems_of
from tests.test_proxy_nginx import with_proxy


def keys_of(problems: list[Any]) -> dict[str, Any]:
    return {p.key: p for p in problems}


def test_proxy_on_without_loopback_or_secrets_names_every_missing_piece(prod_values: dict[str, Any]) -> None:
    prod_values["api"] = {"proxy": {"enabled": True}}
    problems = keys_of(problems_of(prod_values))
    assert set(problems) == {"serving.host", "api_key", "proxy_keys", "tls_certificate", "tls_private_key"}
    assert problems["serving.host"].value == "0.0.0.0" and "127.0.0.1" in (problems["serving.host"].fix or "")
    assert "--secret --path 'vllm-cluster:proxy_keys.<client>'" in (problems["proxy_keys"].fix or "")
    assert "< server.key" in (problems["tls_private_key"].fix or "")


def test_plain_text_client_key_is_refused_without_echoing_it(prod_values: dict[str, Any]) -> None:
    values = with_proxy(prod_values)
    values["proxy_keys"] = {"team-a": SECRET_MARKER, "ops": "sk-plaintext-123456789"}
    with pytest.raises(ConfigError) as info:
        parse_config("prod", values)
    report = info.value.report()
    assert "vllm-cluster:proxy_keys.ops = '<plain text>'" in report and "sk-plaintext" not in report
    values["proxy_keys"] = SECRET_MARKER  # one encrypted blob: names would be unreviewable
    with pytest.raises(ConfigError, match="must be a mapping of name -> secret"):
        parse_config("prod", values)


def test_client_names_and_check_client_are_checked(prod_values: dict[str, Any]) -> None:
    values = with_proxy(prod_values, check_client="nobody")
    assert keys_of(problems_of(values))["api.proxy.check_client"].fix == "one of ['ops', 'team-a']"
    values = with_proxy(prod_values)
    values["proxy_keys"] = {"Team A": SECRET_MARKER}
    assert "appears in access logs" in problems_of(values)[0].message


def test_proxy_port_clash_and_plain_http_warning(prod_values: dict[str, Any]) -> None:
    problems = problems_of(with_proxy(prod_values, port=prod_values["serving"]["port"]))
    assert any(p.key == "api.proxy.port" and "Address already in use" in p.message for p in problems)
    plan = plan_of(with_proxy(prod_values, tls=False, port=8080))
    assert any("clear text" in w for w in plan.warnings)
    assert plan.endpoint == "http://10.30.8.1:8080"


def test_plain_http_without_a_port_listens_on_80_not_443(prod_values: dict[str, Any]) -> None:
    assert plan_of(with_proxy(prod_values, tls=False)).endpoint == "http://10.30.8.1:80"
    assert plan_of(with_proxy(prod_values)).endpoint == "https://10.30.8.1:443"
    assert plan_of(with_proxy(prod_values, tls=False, port=443)).endpoint == "http://10.30.8.1:443"  # as written


def test_a_server_name_without_tls_is_refused_with_fixes_that_plan(prod_values: dict[str, Any]) -> None:
    """server_name takes host names only, so the fix cannot be "one of the head's addresses" there: it says to leave
    it unset or to name the address the checks call in api.public_host; each of those plans."""
    values = with_proxy(prod_values, tls=False, server_name="llm.internal")
    [problem] = [p for p in problems_of(values) if p.key == "api.proxy.server_name"]
    assert "leave api.proxy.server_name unset" in (problem.fix or "") and "api.public_host" in (problem.fix or "")
    del values["api"]["proxy"]["server_name"]
    assert plan_of(values).endpoint == "http://10.30.8.1:80"
    values["api"]["proxy"]["server_name"] = "llm.internal"
    values["api"]["public_host"] = "10.30.8.1"
    assert plan_of(values).endpoint == "http://10.30.8.1:80"


def test_listeners_show_bind_and_network_and_nothing_internal_is_public(prod_values: dict[str, Any],
                                                                       h20_values: dict[str, Any]) -> None:
    for values in (prod_values, h20_values):
        plan = plan_of(with_proxy(values))
        public = [x for x in plan.listeners if x.public]
        assert [(x.port, x.bind) for x in public] == [(443, "0.0.0.0")]
        assert "nginx" in public[0].purpose and public[0].allowed_sources == ["0.0.0.0/0", "::/0"]
        api = next(x for x in plan.listeners if "vLLM" in x.purpose)
        assert (api.bind, api.network, api.public) == ("127.0.0.1", "loopback", False)
        internal = [x for x in plan.listeners if x.internal]
        assert internal and not any(x.public for x in internal)
    ray = {x.port: x for x in plan_of(with_proxy(h20_values)).listeners if x.reach != "local"}
    # Ray's GCS binds every address whatever --node-ip-address says; only the host firewall keeps it private.
    assert (ray[6379].bind, ray[6379].network, ray[6379].public) == ("::", "all", False)
    assert ray[6379].allowed_sources == ["192.0.2.0/24", "198.51.100.0/24"]
    assert ray[10001].network == "management"
    loopback = {x.port: x for x in plan_of(with_proxy(h20_values)).listeners if x.reach == "local"}
    assert loopback[8265].network == "loopback"
    rpc = next(x for x in plan_of(with_proxy(prod_values)).listeners if "DP handshake" in x.purpose)
    assert rpc.network == "data" and rpc.bind == "1.1.1.2"  # 1.1.1.0/24 is declared private by the stack
    off = with_proxy(h20_values)
    off["firewall"] = {"enabled": False}
    exposed = [x for x in plan_of(off).listeners if x.internal and x.public]
    assert {6379, 6380, 10002} <= {x.port for x in exposed}


def test_direct_mode_keeps_the_vllm_port_private_and_refuses_it_public_whatever_the_key(
        prod_values: dict[str, Any]) -> None:
    plan = plan_of(prod_values)
    api = next(x for x in plan.listeners if "vLLM" in x.purpose)
    # The host firewall admits only the declared private networks to the direct port by default.
    assert not api.public and api.allowed_sources == ["1.1.1.0/24", "1.1.2.0/24", "10.30.8.0/24"]
    assert any("exposes vLLM without a key" in w for w in plan.warnings)
    for firewall in ({"api_sources": ["0.0.0.0/0"]}, {"api_sources": ["10.30.8.0/24", "8.8.8.0/24"]},
                     {"enabled": False}):
        for key in (None, SECRET_MARKER):  # vLLM's key guards only /v1: it changes nothing here
            values = copy.deepcopy(prod_values) | {"firewall": firewall}
            if key is not None:
                values["api_key"] = key
            problems = keys_of(problems_of(values))
            assert set(problems) == {"serving.host"}, (firewall, key)
            assert "/collective_rpc" in problems["serving.host"].message and "api.proxy" in (
                problems["serving.host"].fix or "")
    # Bound to an address inside the private networks, the port is not reachable from outside even unfiltered.
    prod_values |= {"firewall": {"enabled": False}}
    prod_values["serving"]["host"] = "10.30.8.1"
    api = next(x for x in plan_of(prod_values).listeners if "vLLM" in x.purpose)
    assert not api.public and api.bind == "10.30.8.1"


def test_server_name_becomes_the_endpoint_and_checks_follow(prod_values: dict[str, Any]) -> None:
    plan = plan_of(with_proxy(prod_values, server_name="llm.example.internal"))
    assert plan.endpoint == "https://llm.example.internal:443"
    assert plan.proxy is not None and plan.proxy.check_client == "team-a" and plan.proxy.clients == ["ops", "team-a"]
    assert {c.name for c in plan.checks} >= {"api-auth", "api-deny"}


@pytest.mark.parametrize("keys,upstream,needle", [
    ({}, "sk-upstream-0123456789", "holds no client"),
    ({"a": "short"}, "sk-upstream-0123456789", "proxy_keys.a: a key must be at least 16"),
    ({"a": "sk-has space-0123456789"}, "sk-upstream-0123456789", "proxy_keys.a"),
    ({"a": 'sk-quote"-0123456789'}, "sk-upstream-0123456789", "proxy_keys.a"),
    ({"a": "sk-fine-0123456789ab"}, "tiny", "api_key: a key must be"),
    ({"a": "sk-same-0123456789ab"}, "sk-same-0123456789ab", "must differ"),
])
def test_keys_nginx_cannot_hold_safely_are_refused_by_name(keys: dict[str, str], upstream: str, needle: str) -> None:
    with pytest.raises(ProxyKeyError, match=needle) as info:
        check_keys(keys, upstream)
    for key in (*keys.values(), upstream):
        if len(key) > 6:
            assert key not in str(info.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


PROXY_ARGS = ["--set", "api.proxy.enabled=true", "--set", "serving.host=127.0.0.1", "--assume-secret", "api_key",
              "--assume-secret", "tls_certificate", "--assume-secret", "tls_private_key",
              "--assume-secret", "proxy_keys.team-a"]


def test_cli_plan_and_nginx_conf_with_assumed_secrets() -> None:
    out = _cli("plan", "h20", *PROXY_ARGS)
    assert out.returncode == 0, out.stderr
    assert "container vllm-proxy — nginx front door" in out.stdout
    assert re.search(r"h20-1 +proxy +443 +0\.0\.0\.0 +all +clients +anywhere +OpenAI API \(nginx.*PUBLIC",
                     out.stdout)
    assert re.search(r"h20-1 +ray-head +8000 +127\.0\.0\.1 +loopback +local +- \(this host\)", out.stdout)
    conf = _cli("nginx-conf", "h20", *PROXY_ARGS)
    assert conf.returncode == 0 and '"~^Bearer SECRET-KEY-OF-TEAM-A$" "team-a";' in conf.stdout
    assert 'proxy_pass "http://vllm/v1/chat/completions";' in conf.stdout
    assert "location ~ \"^/(abort_requests|classify|" in conf.stdout  # h20 runs v0.33.0: its own routes are denied
    off = _cli("nginx-conf", "prod")
    assert off.returncode == 2 and "api.proxy.enabled is false" in off.stderr
    missing = _cli("plan", "h20", "--set", "api.proxy.enabled=true")
    assert missing.returncode == 2 and "vllm-cluster:serving.host = '0.0.0.0'" in missing.stderr
