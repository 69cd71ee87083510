"""nginx.conf is safe by construction: no value, hostile or odd, changes the file's structure.

The rendered file is parsed the way nginx parses it (`tests/nginx_conf.py`, a port of `ngx_conf_read_token`) and
its shape (every block, every directive and its number of arguments) is compared with the baseline's. Every
string field that reaches the file gets every hostile string: the renderer must either refuse the value
(`ProxyConfigError` / `ProxyKeyError`) or keep the shape and carry the value intact as one argument. The
negative control shows the test catches the injection the issue reported, with a real nginx.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter, ValidationError

from stacks.model.config import ProxyConfig
from stacks.model.errors import ConfigError
from stacks.model.field_types import ClientName, IpAddress, ServerName, UrlPath
from stacks.model.loader import parse_config
from stacks.planner.plan import build_plan
from stacks.planner.proxy import (
    FrontDoor,
    NginxRuntime,
    ProxyConfigError,
    ProxyKeyError,
    Routes,
    front_door,
    render_nginx_conf,
)
from tests.nginx_conf import Directive, parse, walk
from tests.nginx_harness import CLIENT_KEYS, UPSTREAM_KEY, free_port, nginx_test, running_nginx, runtime
from tests.test_bad_configs import VALUE_CASES
from tests.test_check_api import standin
from tests.test_proxy_nginx import with_proxy

INJECTION = "llm.example; location ~ ^/(collective_rpc|tokenize)$ { proxy_pass http://vllm; } set $x 1"
"""The issue's example: it passed plan, nginx -t and the deny check, and opened /collective_rpc without a key."""
EXTRA_HOSTILE = [
    INJECTION, 'a" ; location / { return 200; } "', "a' ; }", "a\\\"; }", "${x}", "$host", "#comment", "a#b",
    "~.*", "~^(?<x>.+)$", "x\ny", "x\r\n}", "x\ty", "a b", "a;b", "a{b", "a}b", "é.example", "llm.example\u2028",
    "*.*", "*", "", " ", "/v1/models; return 200", "/v1/models/../../metrics", "/v1/%2e%2e/metrics", "//metrics",
    "/v1/models/", "/v1/(chat|x)", "/v1/.*", "/\\.", "http://evil/", "127.0.0.1:1; server 8.8.8.8", "[::1]:1",
    "::1]:1 ; x", "1.2.3.4 5.6.7.8", "0.0.0.0:443 ssl; listen 80", "\x00", "a\x00b",
]
HOSTILE = sorted({v for _, _, changes, _ in VALUE_CASES for v in changes.values() if isinstance(v, str)}
                 | set(EXTRA_HOSTILE))


def door(**proxy: Any) -> FrontDoor:
    return FrontDoor.of(ProxyConfig(enabled=True, **proxy), 8030)


def render(d: FrontDoor, keys: dict[str, str] | None = None, rt: NginxRuntime | None = None) -> str:
    return render_nginx_conf(d, keys or CLIENT_KEYS, UPSTREAM_KEY, rt)


def shape(text: str) -> tuple[object, ...]:
    return tuple(d.shape() for d in parse(text))


def find(tree: list[Directive], name: str, where: str | None = None) -> list[Directive]:
    return [d for path, d in walk(tree) if d.name == name and (where is None or (path and path[-1] == where))]


# --- every string field, every hostile value -----------------------------------------------------------------

def _proxy(**changes: Any) -> Callable[[FrontDoor], FrontDoor]:
    """A ProxyConfig built WITHOUT validation (model_construct): the renderer is the last line of defence."""
    def apply(d: FrontDoor) -> FrontDoor:
        return dataclasses.replace(d, proxy=ProxyConfig.model_construct(**{**dict(d.proxy), **changes}))
    return apply


FIELDS: dict[str, Callable[[str], Callable[[FrontDoor], FrontDoor]]] = {
    "api.proxy.server_name": lambda v: _proxy(server_name=v),
    "api.proxy.bind": lambda v: _proxy(bind=v),
    "serving.host (upstream)": lambda v: lambda d: dataclasses.replace(d, upstream_host=v),
    "api.proxy.allowed_paths": lambda v: lambda d: dataclasses.replace(
        d, routes=dataclasses.replace(d.routes, allowed=(*d.routes.allowed[:2], v, *d.routes.allowed[3:]))),
    "denied paths": lambda v: lambda d: dataclasses.replace(
        d, routes=dataclasses.replace(d.routes, denied=(*d.routes.denied, v))),
}
RUNTIME_FIELDS = ("pid", "access_log", "error_log", "temp_dir", "cert", "key", "user", "worker_processes")


def _same_or_refused(baseline: tuple[object, ...], make: Callable[[], str], value: str,
                     needle: str | None = None) -> str:
    """"refused", or "kept" after checking the shape and that the value (`needle`: as written, e.g. inside the
    deny regex) sits inside one argument."""
    try:
        text = make()
    except (ProxyConfigError, ProxyKeyError):
        return "refused"
    assert shape(text) == baseline, f"{value!r} changed the structure"
    needle = value if needle is None else needle
    assert any(needle in a for _, d in walk(parse(text)) for a in (d.name, *d.args)), value
    return "kept"


FIELD_TYPES: dict[str, Any] = {"api.proxy.server_name": ServerName, "api.proxy.bind": IpAddress,
                               "serving.host (upstream)": IpAddress, "api.proxy.allowed_paths": UrlPath,
                               "denied paths": UrlPath}


def _valid(kind: Any, value: str) -> str | None:
    try:
        return str(TypeAdapter(kind).validate_python(value))
    except ValidationError:
        return None


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_no_hostile_value_of_a_proxy_field_changes_the_structure(field: str) -> None:
    """Each value either keeps the structure (arriving as one argument) or is refused; the renderer refuses at
    least what the field's config type refuses, and renders what it accepts."""
    base = door(server_name="llm.example.com")
    baseline = shape(render(base))
    outcomes = {v: _same_or_refused(baseline, lambda v=v: render(FIELDS[field](v)(base)), v,
                                    v.lstrip("/").replace(".", "\\.") if field == "denied paths" else v)
                for v in HOSTILE}
    assert outcomes[INJECTION] == "refused"
    for value, outcome in outcomes.items():
        valid = _valid(FIELD_TYPES[field], value)
        if valid is None:
            assert outcome == "refused", (field, value)
        elif valid == value:
            assert outcome == "kept", (field, value)
    assert list(outcomes.values()).count("refused") > len(HOSTILE) // 2


@pytest.mark.parametrize("field", RUNTIME_FIELDS)
def test_no_hostile_runtime_path_changes_the_structure(field: str) -> None:
    base = door()
    rt = NginxRuntime(user="nginx")
    baseline = shape(render(base, rt=rt))
    for value in HOSTILE:
        _same_or_refused(baseline, lambda v=value: render(base, rt=dataclasses.replace(rt, **{field: v})), value)


def test_no_hostile_client_name_or_key_changes_the_structure() -> None:
    base = door()
    baseline = shape(render(base))
    for value in HOSTILE:
        named = _same_or_refused(baseline, lambda v=value: render(base, {v: CLIENT_KEYS["ops"], "team-a": "x" * 20}),
                                 value)
        assert (named == "kept") == (_valid(ClientName, value) == value), value
        keyed = _same_or_refused(baseline, lambda v=value: render(base, {"ops": v, "team-a": "x" * 20}),
                                 value, re.sub(r"([.+])", r"\\\1", value))
        assert (keyed == "kept") == bool(len(value) >= 16 and re.fullmatch(r"[A-Za-z0-9._~+/=-]+", value)), value


def test_numbers_out_of_range_or_of_another_type_are_refused() -> None:
    for changes in ({"port": 0}, {"port": "443; listen 80"}, {"max_body_mb": "8m; x"}, {"read_timeout_s": True},
                    {"read_timeout_s": -1}, {"port": 70000}):
        with pytest.raises(ProxyConfigError):
            render(_proxy(**changes)(door()))


# --- values validation accepts, with characters nginx reads specially ------------------------------------------

ODD_BUT_VALID: list[tuple[dict[str, Any], str | None, tuple[str, ...]]] = [
    ({"server_name": "*.llm.example.com"}, None, ()),
    ({"server_name": "xn--nde1-lra.example"}, None, ()),
    ({"server_name": "LLM.Example.COM"}, None, ()),
    ({"bind": "::"}, "::1", ()),
    ({"bind": "fd00::10", "tls": False}, "::1", ()),
    ({"allowed_paths": ["/v1/chat/completions", "/v1/a.b~c-d_e", "/health"]}, None, ()),
    ({}, None, ("/v1/x.y", "/v1/~tilde", "/-dash")),
]


@pytest.mark.parametrize("case", range(len(ODD_BUT_VALID)))
def test_odd_but_valid_values_keep_the_structure_and_arrive_as_one_argument(case: int) -> None:
    proxy, upstream, denied = ODD_BUT_VALID[case]
    d = FrontDoor.of(ProxyConfig(enabled=True, **proxy), 8030, upstream or "127.0.0.1")
    d = dataclasses.replace(d, routes=dataclasses.replace(d.routes, denied=(*d.routes.denied, *denied)))
    tree = parse(render(d))
    reference = FrontDoor.of(ProxyConfig(enabled=True, tls=d.proxy.tls, server_name="llm.example.com",
                                         allowed_paths=list(d.proxy.allowed_paths)), 8030)
    assert shape(render(d)) == shape(render(reference))
    server_name = find(tree, "server_name", "server")[0].args
    assert server_name == [d.proxy.server_name or "_"]
    assert find(tree, "server", "upstream")[0].args == [d.upstream]
    listen = find(tree, "listen", "server")[0].args
    assert listen[0] == (f"[{d.proxy.bind}]:{d.proxy.port}" if ":" in d.proxy.bind else f"{d.proxy.bind}:443")
    exact = [loc.args[1] for loc in find(tree, "location", "server") if loc.args[0] == "="]
    assert exact == [*d.routes.allowed, "/_vllm_auth"]
    regex = next(loc.args[1] for loc in find(tree, "location", "server") if loc.args[0] == "~")
    assert all(p.lstrip("/").replace(".", "\\.") in regex for p in denied)


def test_every_stack_variant_has_the_same_shape_as_the_default() -> None:
    """Routes change the number of locations, nothing else: the per-location body is the same everywhere."""
    tree = parse(render(door()))
    server = find(tree, "server", "http")[0]
    assert server.block is not None
    bodies = {tuple(d.shape() for d in loc.block or []) for loc in server.block
              if loc.name == "location" and loc.args[0] == "=" and loc.args[1] not in ("/health", "/_vllm_auth")}
    assert len(bodies) == 1
    top = [d.name for d in tree]
    assert top == ["worker_processes", "worker_rlimit_nofile", "pid", "error_log", "events", "stream", "http"]
    # The public port is the stream server's, limited per address before a byte is read; http only on the socket.
    front = find(tree, "server", "stream")
    assert len(front) == 1 and front[0].block is not None
    inner = {d.name: d.args for d in front[0].block}
    config = door().proxy
    assert inner["listen"] == [f"{config.bind}:{config.port}"]
    assert inner["limit_conn"][0] == "tcp_per_address" and inner["proxy_protocol"] == ["on"]
    assert inner["proxy_pass"][0].startswith("unix:")
    listens = [d.args for d in server.block if d.name == "listen"]
    assert listens == [[inner["proxy_pass"][0], "ssl", "proxy_protocol"]], listens
    http = {d.name: d.args for d in find(tree, "http")[0].block or []}
    assert http["client_header_timeout"] == ["10s"] and http["client_body_timeout"] == ["10s"]
    assert [d.name for d in server.block if d.name == "server_name"] == ["server_name"]


# --- the validated path: the stack config refuses, the renderer would too ------------------------------------

def test_the_issue_injection_is_refused_at_plan_time_and_by_the_renderer(prod_values: dict[str, Any]) -> None:
    values = with_proxy(prod_values, server_name=INJECTION)
    with pytest.raises(ConfigError) as info:
        build_plan("prod", parse_config("prod", values))
    assert [p.key for p in info.value.problems] == ["api.proxy.server_name"]
    with pytest.raises(ProxyConfigError, match="server_name"):
        render(_proxy(server_name=INJECTION)(door()))


def test_a_stack_allowlist_is_checked_against_the_images_routes(h20_values: dict[str, Any]) -> None:
    values = with_proxy(h20_values, allowed_paths=["/v1/chat/completions", "/v1/embeddings", "/v1/responses",
                                                   "/v1/models", "/health"])
    config = parse_config("h20", values)
    plan = build_plan("h20", config)
    assert plan.proxy is not None and "vLLM 0.33.0 routes" in plan.proxy.denied_from
    assert {"/v1/embeddings", "/v1/responses"} <= set(plan.proxy.allowed_paths)
    assert "/v1/embeddings" not in plan.proxy.denied_paths and "/v1/responses/render" in plan.proxy.denied_paths
    assert "/collective_rpc" in plan.proxy.denied_paths and plan.proxy.open_paths == ["/health"]
    bad = with_proxy(h20_values, allowed_paths=["/v1/chat/completions", "/v1/embedding"])
    with pytest.raises(ConfigError) as info:
        build_plan("h20", parse_config("h20", bad))
    problem = next(p for p in info.value.problems if p.key == "api.proxy.allowed_paths.1")
    assert "serves no such path" in problem.message and "/v1/embeddings" in (problem.fix or "")
    for path in ("/v1/responses/{response_id}", "/v1/.*", "v1/models", "/v1/models/", "/v1/../metrics",
                 "/v1/mod%65ls"):
        with pytest.raises(ConfigError) as info:
            parse_config("h20", with_proxy(h20_values, allowed_paths=[path]))
        assert "api.proxy.allowed_paths.0" in info.value.report(), path


def test_an_image_without_a_routes_table_keeps_the_builtin_list_with_a_warning(prod_values: dict[str, Any]) -> None:
    plan = build_plan("prod", parse_config("prod", with_proxy(prod_values)))
    assert plan.proxy is not None and plan.proxy.denied_from.startswith("built-in")
    assert any("has no routes table" in w for w in plan.warnings)
    routes = front_door(parse_config("prod", with_proxy(prod_values))).routes
    assert isinstance(routes, Routes) and "/collective_rpc" in routes.denied


# --- negative control: the old, unquoted server_name, with a real nginx ---------------------------------------

def test_the_structure_check_catches_the_old_injection_and_real_nginx_would_serve_it(tmp_path: Path) -> None:
    """Before this change server_name went into the file as is. That file passes `nginx -t`, has one more
    location than the baseline, and a keyless POST /collective_rpc reaches vLLM (the stand-in answers 200)."""
    with standin() as upstream:
        port = free_port()
        d = FrontDoor.of(ProxyConfig(enabled=True, bind="127.0.0.1", port=port, tls=False,
                                     server_name="llm.example"), int(upstream.rsplit(":", 1)[1]))
        good = render(d, rt=runtime(tmp_path, None))
        old = good.replace('server_name "llm.example";', f"server_name {INJECTION};")
        assert old != good and shape(old) != shape(good)
        assert len(find(parse(old), "location", "server")) == len(find(parse(good), "location", "server")) + 1
        for text, expected in ((good, 403), (old, 200)):
            conf = tmp_path / "nginx.conf"
            conf.write_text(text)
            checked = nginx_test(conf)
            assert checked.returncode == 0, checked.stderr
            with running_nginx(conf, port):
                status = httpx.post(f"http://127.0.0.1:{port}/collective_rpc", json={}).status_code
            assert status == expected, (expected, status)


def test_the_tokenizer_agrees_with_nginx_on_what_is_a_syntax_error(tmp_path: Path) -> None:
    """The port reads what nginx reads: a quote not followed by a separator and an unbalanced block are errors
    for both; a `}` inside a word is not a block end for either."""
    base = render(door(tls=False), rt=runtime(tmp_path, None))
    cases = {
        'server_name "a"b;': False,
        "server_name a}b;": True,
        "server_name a b c;": True,
        "server_name {;": False,
    }
    for line, ok in cases.items():
        text = base.replace('server_name "_";', line)
        conf = tmp_path / "nginx.conf"
        conf.write_text(text)
        real = subprocess.run(["nginx", "-t", "-e", "stderr", "-c", str(conf)], capture_output=True, text=True)
        try:
            parse(text)
            ours = True
        except ValueError:
            ours = False
        assert (real.returncode == 0) == ok == ours, (line, real.stderr)
