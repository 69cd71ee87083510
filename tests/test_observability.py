"""Monitoring generated from the plan, checked with real parts: Debian's promtool and Prometheus, its node exporter,
the watch process serving its series, and a stand-in serving vLLM 0.33.0's recorded exposition."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.api import WatchMetrics
from stacks.model.errors import ConfigError
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.observability import (
    ALERTS,
    ENGINE_INFO,
    NODE_GENERATION,
    RULES_FILE,
    SUPERVISOR_METRICS,
    WATCH_METRICS,
    engine_info,
    render_files,
    supervisor_unit,
)
from stacks.planner.plan import Plan, build_plan
from stacks.planner.topology import derive_topology
from tests.conftest import ROOT, clone_node
from tests.test_check_api import free_port
from tests.waiting import wait_for

FIXTURES = ROOT / "tests" / "fixtures" / "observability"
VLLM_EXPOSITION = FIXTURES / "vllm-0.33.0-metrics.txt"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"


def enabled(values: dict[str, Any], *, webhook: bool = True) -> dict[str, Any]:
    out = copy.deepcopy(values)
    out["observability"] = {**out.get("observability", {}), "enabled": True}
    out["grafana_admin_password"] = SECRET
    if webhook:
        out["alert_webhook_url"] = SECRET
    return out


def four_nodes() -> dict[str, Any]:
    values = copy.deepcopy(read_stack_values("prod"))
    values["nodes"] += [clone_node(values["nodes"][1], 2), clone_node(values["nodes"][1], 3)]
    values["parallelism"]["data"] = 4
    return values


STACKS = {"prod": lambda: read_stack_values("prod"), "h20": lambda: read_stack_values("h20"), "four": four_nodes}


def generated(stack: str, values: dict[str, Any]) -> tuple[Plan, dict[str, str]]:
    config = parse_config(stack, values)
    plan = build_plan(stack, config)
    topo, _ = derive_topology(config)
    return plan, render_files(stack, config, topo, {n.name: n.containers for n in plan.nodes})


def write(files: dict[str, str], out: Path) -> Path:
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    return out


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ---- static checks ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("webhook", [True, False])
@pytest.mark.parametrize("stack", sorted(STACKS))
def test_promtool_accepts_every_generated_file(stack: str, webhook: bool, tmp_path: Path) -> None:
    plan, files = generated(stack, enabled(STACKS[stack](), webhook=webhook))
    write(files, tmp_path)
    config = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert config.returncode == 0, config.stdout + config.stderr
    rules = promtool("check", "rules", RULES_FILE, cwd=tmp_path)
    # every alert and the one recording rule
    assert rules.returncode == 0 and f"SUCCESS: {len(ALERTS) + 1} rules found" in rules.stdout, \
        rules.stdout + rules.stderr
    assert ("alertmanager.yml" in files) is webhook
    prom = yaml.safe_load(files["prometheus.yml"])
    assert ("alerting" in prom) is webhook
    # every target carries stack, node, role, DP ranks and generation; every node has both exporters
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert set(jobs) == {"vllm", "node", "dcgm", "watch", "supervisor"}
    assert [g["targets"] for g in jobs["supervisor"]["static_configs"]] == [[plan.observability.supervisor_target]]
    for job in jobs.values():
        for group in job["static_configs"]:
            assert {"stack", "node", "role", "dp_ranks", "generation"} <= set(group["labels"]), job["job_name"]
            assert group["labels"]["stack"] == stack
    for job in ("node", "dcgm"):
        assert [g["labels"]["node"] for g in jobs[job]["static_configs"]] == [n.name for n in plan.nodes]
    # the only vLLM target is the head's own API server, never the front door
    head = plan.head
    assert jobs["vllm"]["static_configs"][0]["labels"]["node"] == head.name
    assert jobs["vllm"]["static_configs"][0]["labels"]["dp_ranks"] == ",".join(
        str(r) for n in plan.nodes for r in n.dp_ranks)


def test_alertmanager_config_is_accepted_by_amtool(tmp_path: Path) -> None:
    amtool = shutil.which("amtool") or "/usr/bin/amtool"
    _, files = generated("prod", enabled(read_stack_values("prod")))
    write(files, tmp_path)
    out = subprocess.run([amtool, "check-config", "alertmanager.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_alert_fires_and_stays_silent_in_promtool_unit_tests(tmp_path: Path) -> None:
    _, files = generated("prod", enabled(read_stack_values("prod")))
    write(files, tmp_path)
    shutil.copy(FIXTURES / "alerts_test.yml", tmp_path / "alerts_test.yml")
    tested = set(re.findall(r"alertname: (\w+)", (FIXTURES / "alerts_test.yml").read_text()))
    assert tested == set(ALERTS)
    out = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # the unit tests follow the configured thresholds: a stricter KV limit makes the firing case silent
    values = enabled(read_stack_values("prod"))
    values["observability"]["kv_cache_usage"] = 0.98
    _, stricter = generated("prod", values)
    (tmp_path / RULES_FILE).write_text(stricter[RULES_FILE])
    out = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode != 0 and "VllmClusterKvCacheHigh" in out.stdout + out.stderr


# ---- dashboards: every query on a series that exists ----------------------------------------------------------

def exposition_names(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", text, re.M)}


def served_names() -> set[str]:
    watch = WatchMetrics({"stack": "prod", "ranks": [{"dp_rank": 0, "node": "n", "gpus": 8}]})
    from checks.api import Target
    watch.record(Target(0, "n"), True, 0.1)
    dcgm = set((FIXTURES / "dcgm-exporter-default-counters.txt").read_text().split())
    return (exposition_names(VLLM_EXPOSITION.read_text()) | exposition_names(watch.render()) | dcgm
            | {NODE_GENERATION, "up"})


PROMQL_WORDS = {"sum", "by", "on", "rate", "histogram_quantile", "max", "group_left", "label_values", "le",
                "without", "ignoring", "unless", "and", "or", "min", "avg", "count", "increase", "offset"}


def metric_names(expr: str) -> set[str]:
    bare = re.sub(r"\{[^}]*\}", "", expr)                       # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)                      # ranges
    bare = re.sub(r"\b(by|on|group_left|without|ignoring)\s*\([^)]*\)", "", bare)
    bare = re.sub(r",\s*\w+\s*\)", ")", bare) if bare.startswith("label_values") else bare
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e]+", n)}


def dashboard_queries(files: dict[str, str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for rel, text in files.items():
        if rel.startswith("grafana/dashboards/"):
            board = json.loads(text)
            out += [(f"{board['uid']}: {p['title']}", t["expr"]) for p in board["panels"] for t in p["targets"]]
            out += [(f"{board['uid']}: ${v['name']}", v["query"]["query"]) for v in board["templating"]["list"]]
    return out


def test_every_panel_query_uses_metrics_that_exist_in_vllm_0_33_and_the_exporters() -> None:
    _, files = generated("prod", enabled(read_stack_values("prod")))
    queries = dashboard_queries(files)
    titles = {json.loads(t)["title"] for r, t in files.items() if r.startswith("grafana/dashboards/")}
    assert titles == {"vLLM prod: overview", "vLLM prod: engine (DP rank)", "vLLM prod: GPUs per node"}
    known = served_names()
    used: set[str] = set()
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= known, f"{where}: {sorted(names - known)} not served (vLLM 0.33.0, DCGM, watch unit)"
        used |= names
    # the overview and GPU boards cover what operators look at first
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
            "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
            ENGINE_INFO, "vllm_cluster_golden_ok"} <= used
    # a panel on a name vLLM 0.33.0 does not have would be caught
    assert not metric_names("vllm:gpu_cache_usage_perc{stack='x'}") <= known


def test_the_watch_series_are_the_ones_the_rules_and_dashboards_name() -> None:
    watch = WatchMetrics({"stack": "s", "ranks": []})
    assert {n for n in exposition_names("\n".join(
        line.split(" ")[2] + " 1" for line in watch.render().splitlines() if line.startswith("# TYPE")))} == set(
        WATCH_METRICS)


def test_the_supervisor_series_and_unit_are_the_ones_the_rules_name() -> None:
    from heal.group import Group
    from heal.supervisor import METRICS, Settings, Supervisor
    from heal.supervisor_unit import supervisor_unit_name

    assert tuple(METRICS) == SUPERVISOR_METRICS
    supervisor = Supervisor(Group("prod", (), 1, "http://127.0.0.1:9/health", ()), None,  # type: ignore[arg-type]
                            None, Settings(), None)  # type: ignore[arg-type]
    assert exposition_names(supervisor.render()) <= set(SUPERVISOR_METRICS)
    assert {line.split()[2] for line in supervisor.render().splitlines() if line.startswith("# TYPE")} == set(
        SUPERVISOR_METRICS)
    assert supervisor_unit("prod") == supervisor_unit_name("prod")
    _, files = generated("prod", enabled(read_stack_values("prod")))
    assert f"journalctl -u {supervisor_unit_name('prod')}" in files[RULES_FILE]


def test_an_ipv6_supervisor_address_is_bracketed_in_the_scrape_target_and_the_unit(tmp_path: Path) -> None:
    values = enabled(read_stack_values("prod"))
    values["observability"]["supervisor_address"] = "fd00:0::5"
    plan, files = generated("prod", values)
    assert plan.observability is not None and plan.observability.supervisor_target == "[fd00::5]:9465"
    jobs = {j["job_name"]: j for j in yaml.safe_load(files["prometheus.yml"])["scrape_configs"]}
    assert jobs["supervisor"]["static_configs"][0]["targets"] == ["[fd00::5]:9465"]
    write(files, tmp_path)
    assert promtool("check", "config", "prometheus.yml", cwd=tmp_path).returncode == 0
    # on no node of the stack: no node's listener table or firewall has it
    assert not [x for x in plan.listeners if x.port == 9465]
    out = stacks_cli("supervisor-unit", "prod", "--user", "deploy", "--python", sys.executable, *OBS_FLAGS,
                     "--set", "observability.supervisor_address=fd00::5")
    assert out.returncode == 0, out.stderr
    assert 'supervise prod --metrics-listen "[fd00::5]:9465"' in out.stdout


# ---- a real Prometheus joins a vLLM series to its node and generation -----------------------------------------

@contextmanager
def process(*argv: str, cwd: Path = ROOT) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def query(port: int, promql: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def wait_for_series(port: int, promql: str, want: int) -> list[dict[str, Any]]:
    """Until the query answers at least `want` series (Prometheus scrapes every few seconds; its HTTP API may not
    listen yet)."""
    last: list[Any] = [None]

    def answered() -> list[dict[str, Any]] | None:
        try:
            last[0] = query(port, promql)["data"]["result"]
        except OSError as exc:
            last[0] = exc
            return None
        return list(last[0]) if len(last[0]) >= want else None

    return wait_for(answered, lambda: f"{promql!r}: {last[0]!r}", 120)  # type: ignore[no-any-return]


def test_real_prometheus_joins_vllm_series_to_node_and_generation(tmp_path: Path) -> None:
    values = enabled(read_stack_values("prod"))
    config = parse_config("prod", values)
    plan, files = generated("prod", values)
    topo, _ = derive_topology(config)
    info = engine_info("prod", config, topo, {n.name: n.containers for n in plan.nodes})
    gen = info["ranks"][0]["generation"]
    assert gen and {r["node"] for r in info["ranks"]} == {"node1", "node2"}
    write(files, tmp_path)
    vllm_port, watch_port, node_port, prom_port = free_port(), free_port(), free_port(), free_port()
    # the generated config, its addresses moved to loopback (labels, relabelling and rules unchanged)
    prom = yaml.safe_load(files["prometheus.yml"])
    prom["global"]["scrape_interval"] = prom["global"]["evaluation_interval"] = "1s"
    prom.pop("alerting", None)
    loopback = {"vllm": [f"127.0.0.1:{vllm_port}"], "watch": [f"127.0.0.1:{watch_port}"],
                "node": [f"127.0.0.1:{node_port}"]}
    jobs = []
    for job in prom["scrape_configs"]:
        if job["job_name"] in loopback:
            job["static_configs"] = job["static_configs"][:1]
            job["static_configs"][0]["targets"] = loopback[job["job_name"]]
            jobs.append(job)
    prom["scrape_configs"] = jobs
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    textfiles = tmp_path / "textfile-node1"
    textfiles.mkdir()
    shutil.copy(tmp_path / "textfile" / "node1.prom", textfiles / "vllm_cluster.prom")
    with (process(sys.executable, "-m", "checks.standin", "--port", str(vllm_port), "--dp-size", "2",
                  "--metrics-file", str(VLLM_EXPOSITION)),
          process(sys.executable, "-m", "checks.api", "--watch", "--url", f"http://127.0.0.1:{vllm_port}",
                  "--served-name", "DeepSeek-V4.1-Flash", "--dp-size", "2", "--rank-nodes", "node1,node2",
                  "--interval-s", "1", "--timeout-s", "10", "--metrics-listen", f"127.0.0.1:{watch_port}",
                  "--info-json", json.dumps(info)),
          process(NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{node_port}",
                  f"--collector.textfile.directory={textfiles}", "--collector.disable-defaults",
                  "--collector.textfile"),
          process(PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                  f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                  cwd=tmp_path) as prometheus):
        wait_for_series(prom_port, "up == 1", 3)
        joined = wait_for_series(prom_port, "vllm:kv_cache_usage_perc * on(stack, dp_rank) group_left(node, "
                                 f"generation, image) {ENGINE_INFO}", 2)
        assert sorted((r["metric"]["dp_rank"], r["metric"]["node"], r["metric"]["generation"]) for r in joined) == [
            ("0", "node1", gen), ("1", "node2", gen)]
        assert {r["metric"]["image"] for r in joined} == {config.image.ref}
        golden = wait_for_series(prom_port, "vllm_cluster_golden_ok == 1", 2)
        assert sorted(r["metric"]["node"] for r in golden) == ["node1", "node2"]
        applied = wait_for_series(prom_port, NODE_GENERATION, 1)
        assert applied[0]["metric"]["generation"] == gen and applied[0]["metric"]["node"] == "node1"
        # every dashboard query is valid PromQL for this Prometheus; the vLLM and watch ones return data
        for where, expr in dashboard_queries(files):
            if expr.startswith("label_values"):
                continue
            promql = expr.replace("$__rate_interval", "1m").replace("$dp_rank", "1").replace("$node", ".*")
            result = query(prom_port, promql)
            assert result["status"] == "success", (where, result)
        assert prometheus.poll() is None


# ---- the program under Pulumi's mocks -----------------------------------------------------------------------

def test_program_creates_the_monitoring_containers_with_secrets_uploaded_not_in_env() -> None:
    from tests.pulumi_harness import SECRET_VALUES, run_program

    values = copy.deepcopy(read_stack_values("prod"))
    values["observability"] = {"enabled": True}
    password, webhook = "grafana-pw-0123456789", "https://hooks.example.com/T0/abcdef"
    run = run_program("prod", values, secrets={**SECRET_VALUES, "grafana_admin_password": password,
                                               "alert_webhook_url": webhook})
    assert run.error is None, run.error
    containers = {r.name: r for r in run.mocks.of_type("docker:index/container:Container")}
    expected = {f"observability-{n}-{role}" for n in ("node1", "node2") for role in ("node-exporter", "dcgm-exporter")}
    expected |= {f"observability-node1-{role}" for role in ("prometheus", "grafana", "alertmanager")}
    assert expected <= set(containers)
    grafana = containers["observability-node1-grafana"].inputs
    assert not any(password in e for e in json.dumps(grafana.get("envs")).split(","))
    uploads = json.dumps(grafana["uploads"])
    assert "/etc/grafana/admin_password" in uploads and "vllm-prod-overview.json" in uploads
    modes = {u["file"]: u.get("permissions") for u in grafana["uploads"]["value"]}  # a secret: wrapped
    assert modes["/etc/grafana/admin_password"] == "0400", modes  # not world-readable
    alertmanager = containers["observability-node1-alertmanager"].inputs
    modes = {u["file"]: u.get("permissions") for u in alertmanager["uploads"]["value"]}
    assert modes["/etc/alertmanager/alertmanager.yml"] == "0600", modes  # the webhook's token: owner only
    assert alertmanager.get("user") == "0"  # the owner that reads it
    prometheus = json.dumps(containers["observability-node1-prometheus"].inputs["uploads"])
    assert "prometheus.yml" in prometheus and "vllm-cluster.rules.yml" in prometheus
    assert webhook not in json.dumps([r.inputs for r in run.mocks.resources if r.name != "observability-node1-"
                                      "alertmanager"])
    # each node's exporter follows that node's engine container; no engine waits for a monitoring container
    exporter = run.options["observability-node2-node-exporter"]
    assert [d._name for d in exporter.depends_on] == ["engine-node2-deepseek-v41-flash"]  # type: ignore[union-attr]
    for name, opts in run.options.items():
        if not name.startswith("observability-"):
            deps = [getattr(d, "_name", "") for d in (opts.depends_on or [])]  # type: ignore[union-attr]
            assert not any(str(d).startswith("observability-") for d in deps), name
    assert run.outputs["monitoring"] == {"prometheus": "10.30.8.1:9090", "grafana": "10.30.8.1:3000"}


def test_every_new_grafana_container_gets_the_stacks_admin_password_through_grafanas_cli() -> None:
    """Grafana reads GF_SECURITY_ADMIN_PASSWORD__FILE only when it creates its database (kept on the host): the
    rotation command runs on the monitoring node after the container, again for every new container (its id is
    the trigger), and holds no secret (tests/test_grafana_password.py runs its script against stand-ins)."""
    from tests.pulumi_harness import SECRET_VALUES, run_program

    values = copy.deepcopy(read_stack_values("prod"))
    values["observability"] = {"enabled": True}
    password = "grafana-pw-0123456789"
    run = run_program("prod", values, secrets={**SECRET_VALUES, "grafana_admin_password": password})
    assert run.error is None, run.error
    commands = {r.name: r for r in run.mocks.of_type("command:remote:Command")}
    rotation = commands["observability-node1-grafana-admin-password"].inputs
    assert "python3 - --container prod-grafana --url http://10.30.8.1:3000" in rotation["create"]
    assert "reset-admin-password" in rotation["create"] and password not in json.dumps(rotation)
    assert rotation["connection"]["value"]["host"] == "10.30.8.1"  # the connection holds the SSH key: wrapped
    assert rotation["triggers"] == ["observability-node1-grafana-id"]
    deps = [d._name for d in run.all_options["observability-node1-grafana-admin-password"].depends_on]  # type: ignore
    assert deps == ["observability-node1-grafana"]


# ---- what a monitoring change costs: the diff and the replacement rules ------------------------------------

def _registered(values: dict[str, Any]) -> list[Any]:
    from review.registrations import register
    secrets = {"api_key": "k", "ssh_private_key": "s", "grafana_admin_password": "pw",
               "alert_webhook_url": "https://hooks.example.com/x"}
    return register("prod", values, secrets)


def test_a_dashboard_edit_or_a_threshold_change_restarts_no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from review.plan_diff import diff_plans, to_markdown
    from review.replacement import impact
    from stacks.planner import observability as obs

    values = copy.deepcopy(read_stack_values("prod"))
    values["observability"] = {"enabled": True}
    before = _registered(values)
    # a threshold: the rule file changes, so Prometheus (only) is replaced
    stricter = copy.deepcopy(values)
    stricter["observability"]["ttft_p99_s"] = 5
    found = impact(before, _registered(stricter))
    assert found.engines == "" and found.proxy == "" and found.checks == []
    assert found.other == ["observability-node1-prometheus (replace)"]
    base_plan, _ = generated("prod", enabled(values))
    head_plan, _ = generated("prod", enabled(stricter))
    diff = diff_plans("prod", "main", base_plan.to_json_dict(), head_plan.to_json_dict())
    assert diff["replaced"] == [] and diff["monitoring"]["replaced"] == ["node1-prometheus"]
    assert diff["monitoring"]["files"] == [RULES_FILE]
    assert "### Monitoring" in to_markdown(diff) and "no engine restarts" in to_markdown(diff)
    # a dashboard edit in the code: Grafana (only) is replaced
    original = obs.dashboards

    def edited(stack: str, config: Any, topo: Any) -> dict[str, dict[str, Any]]:
        boards = original(stack, config, topo)
        next(iter(boards.values()))["title"] += " (edited)"
        return boards

    monkeypatch.setattr(obs, "dashboards", edited)
    found = impact(before, _registered(values))
    assert found.engines == "" and found.proxy == "" and found.other == ["observability-node1-grafana (replace)"]
    edited_plan, _ = generated("prod", enabled(values))
    diff = diff_plans("prod", "main", base_plan.to_json_dict(), edited_plan.to_json_dict())
    assert diff["replaced"] == [] and diff["monitoring"]["replaced"] == ["node1-grafana"]


# ---- the review tools ---------------------------------------------------------------------------------------

OBS_FLAGS = ["--set", "observability.enabled=true", "--assume-secret", "grafana_admin_password"]


def stacks_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_observability_command_writes_exactly_the_deployed_files(tmp_path: Path) -> None:
    out = stacks_cli("observability", "h20", "--out", str(tmp_path), *OBS_FLAGS)
    assert out.returncode == 0, out.stderr
    _, files = generated("h20", enabled(read_stack_values("h20"), webhook=False))
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(files) and all((tmp_path / k).read_text() == v for k, v in files.items())
    off = stacks_cli("observability", "h20", "--out", str(tmp_path / "off"))
    assert off.returncode == 2 and "observability.enabled is false" in off.stderr and "Traceback" not in off.stderr
    missing = stacks_cli("observability", "h20", "--out", str(tmp_path / "x"), "--set", "observability.enabled=true")
    assert missing.returncode == 2 and "grafana_admin_password" in missing.stderr


def test_plan_lists_the_monitoring_containers_and_their_private_listeners() -> None:
    out = stacks_cli("plan", "prod", *OBS_FLAGS)
    assert out.returncode == 0, out.stderr
    assert "== monitoring on node1: Prometheus 10.30.8.1:9090, Grafana 10.30.8.1:3000" in out.stdout
    for line in ("node2: container prod-dcgm-exporter", "node1: container prod-prometheus"):
        assert line in out.stdout
    plan = json.loads(stacks_cli("plan", "prod", "--json", *OBS_FLAGS).stdout)
    monitoring = [x for x in plan["listeners"] if x["role"] == "monitoring"]
    assert {(x["node"], x["port"]) for x in monitoring} >= {("node1", 9090), ("node1", 3000), ("node2", 9100),
                                                             ("node2", 9400), ("node1", 9464), ("node1", 9465)}
    assert all(not x["public"] and x["bind"] not in ("0.0.0.0", "::") for x in monitoring)
    node2 = next(f for f in plan["firewall"]["nodes"] if f["node"] == "node2")
    assert "9100" in node2["internal_ports"] and "9400" in node2["internal_ports"]
    # the watch unit's and the supervisor's ports, on the node they run on (the monitoring node by default)
    node1 = next(f for f in plan["firewall"]["nodes"] if f["node"] == "node1")
    assert "9464-9465" in node1["internal_ports"], node1["internal_ports"]
    assert not any(x["port"] in (9464, 9465) for x in plan["listeners"] if x["node"] == "node2")
    assert "group supervisor at 10.30.8.1:9465" in out.stdout
    # the supervisor on node2 (its management address): its port moves there, the watch unit's stays
    moved = json.loads(stacks_cli("plan", "prod", "--json", *OBS_FLAGS, "--set",
                                  "observability.supervisor_address=10.30.8.2").stdout)
    assert {(x["node"], x["port"]) for x in moved["listeners"] if x["port"] in (9464, 9465)} == {
        ("node1", 9464), ("node2", 9465)}
    # off by default: the committed stack plans exactly as before
    assert json.loads(stacks_cli("plan", "prod", "--json").stdout)["observability"] is None


def test_the_watch_unit_serves_metrics_when_observability_is_on() -> None:
    out = stacks_cli("watch-unit", "prod", *OBS_FLAGS)
    assert out.returncode == 0, out.stderr
    exec_line = next(line for line in out.stdout.splitlines() if line.startswith("ExecStart="))
    assert "--metrics-listen 10.30.8.1:9464" in exec_line and "--info-json" in exec_line
    plain = stacks_cli("watch-unit", "prod")
    assert "--metrics-listen" not in plain.stdout


def test_the_supervisor_unit_serves_metrics_when_observability_is_on() -> None:
    out = stacks_cli("supervisor-unit", "prod", "--user", "deploy", "--python", sys.executable, *OBS_FLAGS)
    assert out.returncode == 0, out.stderr
    exec_line = next(line for line in out.stdout.splitlines() if line.startswith("ExecStart="))
    assert exec_line.endswith("supervise prod --metrics-listen 10.30.8.1:9465"), exec_line
    assert "# Metrics: http://10.30.8.1:9465/metrics" in out.stdout
    plain = stacks_cli("supervisor-unit", "prod", "--user", "deploy", "--python", sys.executable)
    assert plain.returncode == 0 and "--metrics-listen" not in plain.stdout


def test_the_watch_refuses_bad_metrics_arguments() -> None:
    base = [sys.executable, "-m", "checks.api", "--watch", "--url", "http://127.0.0.1:9", "--served-name", "m"]
    for extra, says in ((["--metrics-listen", "nowhere"], "--metrics-listen"),
                        (["--metrics-listen", "127.0.0.1:1", "--info-json", "{"], "--info-json"),
                        (["--info-json", '{"ranks": []}'], "without --metrics-listen")):
        out = subprocess.run([*base, *extra], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and says in out.stdout and "Traceback" not in out.stderr, out.stdout


@pytest.mark.parametrize(("port", "field", "key"), [
    (8030, "watch", "observability.ports.watch"),  # the watch unit on the monitoring node, on vLLM's API port
    (22, "watch", "observability.ports.watch"),  # the nodes' SSH port
    (22, "node_exporter", "observability.ports.node_exporter"),
    (9464, "supervisor", "observability.ports.supervisor"),  # the watch unit's port, on the same node
    (8030, "supervisor", "observability.ports.supervisor"),  # vLLM's API port on the head
    (9090, "supervisor", "observability.ports.supervisor"),  # Prometheus: the later row's key is named
    (22, "supervisor", "observability.ports.supervisor"),
])
def test_a_monitoring_port_that_another_listener_or_sshd_holds_is_refused(port: int, field: str, key: str) -> None:
    values = enabled(read_stack_values("prod"))
    values["observability"].setdefault("ports", {})[field] = port
    with pytest.raises(ConfigError) as caught:
        build_plan("prod", parse_config("prod", values))
    assert key in [p.key for p in caught.value.problems], caught.value.report()


def test_the_program_creates_each_monitoring_container_as_its_spec_says_which_drift_compares() -> None:
    """components/observability.py and `drift` read one spec (`monitor_spec`): network, restart policy, GPUs,
    capabilities, mounts, labels and environment of every monitoring container, created as compared."""
    from heal.cli import monitor_specs
    from stacks.model.loader import load_stack
    from stacks.planner.plan import build_plan
    from tests.pulumi_harness import SECRET_VALUES, run_program

    values = copy.deepcopy(read_stack_values("prod"))
    values["observability"] = {"enabled": True}
    run = run_program("prod", values, secrets={**SECRET_VALUES, "grafana_admin_password": "grafana-pw-0123456789",
                                               "alert_webhook_url": "https://hooks.example.com/T0/abcdef"})
    assert run.error is None, run.error
    created = {r.name: r.inputs for r in run.mocks.of_type("docker:index/container:Container")}
    config = load_stack("prod", ["observability.enabled=true"],
                        assume_secret=["grafana_admin_password", "alert_webhook_url", "api_key", "proxy_keys.team-a",
                                       "tls_certificate", "tls_private_key"])
    plan = build_plan("prod", config)
    specs = [(node.name, s) for node in plan.nodes for s in monitor_specs(plan, config, node.name)]
    assert {s.purpose for _, s in specs} == {"node-exporter", "dcgm-exporter", "prometheus", "grafana",
                                             "alertmanager"}
    for node, spec in specs:
        inputs = created[f"observability-{node}-{spec.purpose}"]
        assert inputs["name"] == spec.name
        assert inputs["networkMode"] == spec.network_mode and inputs["restart"] == spec.restart, spec.name
        assert inputs.get("gpus") == spec.gpus and inputs.get("command", []) == spec.command, spec.name
        assert (inputs.get("capabilities") or {}).get("adds", []) == spec.capabilities, spec.name
        assert {(v["hostPath"], v["containerPath"], bool(v.get("readOnly"))) for v in inputs["volumes"]} == {
            (v.host, v.container, v.read_only) for v in spec.volumes}, spec.name
        assert {x["label"]: x["value"] for x in inputs["labels"]} == spec.labels, spec.name
        assert inputs.get("envs", []) == [f"{k}={v}" for k, v in spec.env.items()], spec.name
        assert not inputs.get("privileged") and not inputs.get("devices") and not spec.privileged
