"""Monitoring generated from the plan: Prometheus' scrape config and alert rules, Alertmanager's config, Grafana's
provisioning and dashboards. Pure text in, text out (no Pulumi): `python -m stacks observability` writes exactly
these files, and `components/observability.py` uploads them into the containers.

Where vLLM 0.33.0 serves each DP rank's series: the API server's `/metrics` holds one series per engine it
manages, labelled `engine="<global DP rank>"` (`vllm/v1/metrics/loggers.py:499-505`). With internal DP
(`--headless` secondaries, one API server on the head), that API server manages every rank
(`vllm/v1/engine/core_client.py:742-747`: `num_ranks = dp_size` unless `local_engines_only`, which is hybrid or
external LB, `vllm/config/parallel.py:653-657`), and the headless nodes serve no HTTP at all
(`vllm/entrypoints/cli/serve.py:69-76`). So one target, the head's vLLM port, carries every rank; with hybrid LB
each node's API server carries its own ranks, with external LB each rank's own server its one engine, and
Prometheus scrapes each of them. `/metrics` needs no key (`vllm/entrypoints/serve/middleware/authenticate.py:11`
guards /v1, /v2, /inference, /cohere only), and the front door never passes it (it is a control path there), so
Prometheus scrapes vLLM's port directly.

Which series belongs to which node and release: the watch unit serves `vllm_cluster_engine_info{stack, node,
dp_rank, gpus, image, image_digest, generation, topology} 1`, one per rank (`checks/api.py` WatchMetrics), and
the scrape copies vLLM's `engine` label into `dp_rank`, so `… * on(stack, dp_rank) group_left(node, generation)
vllm_cluster_engine_info` joins any vLLM series to its node and release. What each node really runs comes from
its node exporter: `vllm_cluster_node_generation_info{generation, image}` is uploaded into that node's exporter
after its engine container was applied, so a half-applied update shows as nodes with different generations.

The group supervisor (heal/supervisor.py) serves its own series the same way, scraped as the job `supervisor`:
`vllm_cluster_group_gave_up` 1 fires VllmClusterGroupGaveUp, and its target down VllmClusterSupervisorDown.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from stacks.model.config import StackConfig
from stacks.model.field_types import bracket_host
from stacks.planner.addresses import api_bind, rank_port
from stacks.planner.container_spec import GENERATION_LABEL, LABEL_PREFIX, ContainerSpec, VolumeSpec
from stacks.planner.topology import NodeTopology, Topology

PROMETHEUS_DIR = "/etc/prometheus"
"""Where the Prometheus container reads prometheus.yml and rules/ (uploaded files)."""
ALERTMANAGER_CONFIG = "/etc/alertmanager/alertmanager.yml"
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
GRAFANA_DASHBOARDS = "/var/lib/grafana-dashboards"
GRAFANA_PASSWORD_FILE = "/etc/grafana/admin_password"
TEXTFILE_DIR = "/var/lib/node-exporter-textfile"
"""Inside the node exporter container: the textfile collector's directory (uploaded file)."""
TEXTFILE = f"{TEXTFILE_DIR}/vllm_cluster.prom"
RULES_FILE = "rules/vllm-cluster.rules.yml"
WEBHOOK_PLACEHOLDER = "https://alert-webhook.invalid/set-by-the-alert_webhook_url-secret"
"""What the offline files show where the webhook URL (a secret) goes; the program renders the real one."""
ENGINE_INFO = "vllm_cluster_engine_info"
NODE_GENERATION = "vllm_cluster_node_generation_info"
GOLDEN_OK = "vllm_cluster_golden_ok"
GOLDEN_FAILURES = "vllm_cluster_golden_consecutive_failures"
GOLDEN_LATENCY = "vllm_cluster_golden_latency_seconds"
GOLDEN_ROUNDS = "vllm_cluster_golden_rounds_total"
GOLDEN_LAST_ROUND = "vllm_cluster_golden_last_round_timestamp_seconds"
WATCH_METRICS = (ENGINE_INFO, GOLDEN_OK, GOLDEN_FAILURES, GOLDEN_LATENCY, GOLDEN_ROUNDS, GOLDEN_LAST_ROUND)
"""The series the watch unit serves (checks/api.py WatchMetrics serves exactly these; a test holds them equal)."""
GROUP_GAVE_UP = "vllm_cluster_group_gave_up"
SUPERVISOR_METRICS = ("vllm_cluster_group_restarts_total", GROUP_GAVE_UP, "vllm_cluster_group_restarts_last_hour",
                      "vllm_cluster_group_max_restarts_per_hour", "vllm_cluster_group_backoff_seconds",
                      "vllm_cluster_group_next_restart_in_seconds",
                      "vllm_cluster_group_last_restart_timestamp_seconds", "vllm_cluster_group_last_restart_success")
"""The series the group supervisor serves (heal/supervisor.py METRICS; a test holds them equal)."""
SUPERVISOR_JOB = "supervisor"
RUNBOOK = "docs/runbooks.md, \"An engine died\""

SRC_PROMETHEUS = "stacks/planner/observability.py (prometheus --web.listen-address=<management IP>:<port>)"
SRC_GRAFANA = "stacks/planner/observability.py (GF_SERVER_HTTP_ADDR=<management IP>)"
SRC_ALERTMANAGER = "stacks/planner/observability.py (alertmanager --web.listen-address=<management IP>:<port>)"
SRC_ALERTMANAGER_CLUSTER = "stacks/planner/observability.py (alertmanager --cluster.listen-address=127.0.0.1:<port>)"
SRC_NODE_EXPORTER = "stacks/planner/observability.py (node_exporter --web.listen-address=<management IP>:<port>)"
SRC_DCGM = "stacks/planner/observability.py (dcgm-exporter --address <management IP>:<port>)"
SRC_SUPERVISOR = "heal/supervisor_unit.py (python -m stacks supervise --metrics-listen <supervisor address>:<port>)"
SRC_WATCH = "checks/api.py --watch --metrics-listen"
PORT_KEYS = {SRC_PROMETHEUS: "observability.ports.prometheus", SRC_GRAFANA: "observability.ports.grafana",
             SRC_ALERTMANAGER: "observability.ports.alertmanager",
             SRC_ALERTMANAGER_CLUSTER: "observability.ports.alertmanager_cluster",
             SRC_NODE_EXPORTER: "observability.ports.node_exporter", SRC_DCGM: "observability.ports.dcgm_exporter",
             SRC_SUPERVISOR: "observability.ports.supervisor", SRC_WATCH: "observability.ports.watch"}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class MonitorContainer(_Frozen):
    """One monitoring container as the plan shows it. None of them touches an engine: changing one replaces it
    alone."""

    node: str
    name: str
    role: str
    image: str
    listen: str
    args: list[str]


class ObservabilityPlan(_Frozen):
    node: str
    prometheus: str
    grafana: str
    alertmanager: str | None
    """None without the alert_webhook_url secret: alerts show in Prometheus and Grafana only."""
    watch_target: str
    supervisor_target: str
    """Where the group supervisor serves its metrics (`python -m stacks supervisor-unit` renders it)."""
    containers: list[MonitorContainer]
    files: dict[str, str]
    """Generated file -> sha256[:16] (the full text: `python -m stacks observability STACK --out DIR`)."""
    unpinned_images: list[str]


@dataclass(frozen=True)
class RankInfo:
    dp_rank: int
    node: str
    gpus: int


def monitor_node(config: StackConfig) -> str:
    return config.observability.node or config.head.name


def management_ip(config: StackConfig, node: str) -> str:
    return next(n.management_ip for n in config.nodes if n.name == node)


def vllm_scrape_address(config: StackConfig) -> str:
    """host:port Prometheus scrapes vLLM on: loopback when vLLM binds it (then Prometheus must run on the head)."""
    host = config.serving.host
    if host in ("0.0.0.0", "::"):
        host = config.head.management_ip
    return f"{bracket_host(host)}:{config.serving.port}"


def _hybrid_scrape_address(config: StackConfig, node: NodeTopology, port: int | None = None) -> str:
    """With hybrid (or external) load balancing: where each node's API server (each rank's, on `port`) is
    scraped (its bind, or its management address when it binds all)."""
    if node.index == 0:
        address = vllm_scrape_address(config)
        return address if port is None else f"{address.rsplit(':', 1)[0]}:{port}"
    host = api_bind(config, node)
    if host in ("0.0.0.0", "::"):
        host = config.nodes[node.index].management_ip
    return f"{bracket_host(host)}:{port or config.serving.port}"


def watch_host(config: StackConfig) -> str:
    """The host the watch unit runs on: `observability.watch_address`, else the monitoring node's address ('' while
    `observability.node` names no node: validation refuses that, and its rules ask this first)."""
    mon = monitor_node(config)
    return config.observability.watch_address or next((n.management_ip for n in config.nodes if n.name == mon), "")


def watch_address(config: StackConfig) -> str:
    return f"{bracket_host(watch_host(config))}:{config.observability.ports.watch}"


def supervisor_host(config: StackConfig) -> str:
    """The host the group supervisor runs on: `observability.supervisor_address`, else the watch unit's host
    (both run where the stack's SSH key and pinned known_hosts are)."""
    return config.observability.supervisor_address or watch_host(config)


def supervisor_address(config: StackConfig) -> str:
    """host:port the supervisor serves its metrics on and Prometheus scrapes (an IPv6 host in brackets)."""
    return f"{bracket_host(supervisor_host(config))}:{config.observability.ports.supervisor}"


def rank_infos(topo: Topology) -> list[RankInfo]:
    return [RankInfo(r, n.name, n.gpus_used // max(1, len(n.dp_ranks))) for n in topo.nodes for r in n.dp_ranks]


def generation(containers: dict[str, list[ContainerSpec]], node: str) -> str:
    specs = containers.get(node, [])
    return next((c.labels[GENERATION_LABEL] for c in specs if GENERATION_LABEL in c.labels), "")


def engine_info(stack: str, config: StackConfig, topo: Topology, containers: dict[str, list[ContainerSpec]]
                ) -> dict[str, Any]:
    """What the watch unit serves as `vllm_cluster_engine_info` (its `--info-json`): the plan's ranks, nodes,
    image and generation when the unit was rendered."""
    return {"stack": stack, "image": config.image.ref, "image_digest": config.image.digest or "",
            "topology": topo.label,
            "ranks": [{"dp_rank": r.dp_rank, "node": r.node, "gpus": r.gpus,
                       "generation": generation(containers, r.node)} for r in rank_infos(topo)]}


# ---- Prometheus ---------------------------------------------------------------------------------------------

def _labels(stack: str, node: str, role: str, dp_ranks: list[int], gen: str) -> dict[str, str]:
    return {"stack": stack, "node": node, "role": role, "dp_ranks": ",".join(map(str, dp_ranks)),
            "generation": gen}


def prometheus_config(stack: str, config: StackConfig, topo: Topology,
                      containers: dict[str, list[ContainerSpec]]) -> dict[str, Any]:
    obs = config.observability
    head = topo.head
    all_ranks = [r for n in topo.nodes for r in n.dp_ranks]
    interval = f"{obs.scrape_interval_s}s"
    vllm_targets = [{"targets": [vllm_scrape_address(config)],
                     "labels": _labels(stack, head.name, head.role.value, all_ranks,
                                       generation(containers, head.name))}]
    if topo.hybrid:  # every node's API server reports only its own engines: scrape each
        vllm_targets = [{"targets": [_hybrid_scrape_address(config, t)],
                         "labels": _labels(stack, t.name, t.role.value, t.dp_ranks, generation(containers, t.name))}
                        for t in topo.nodes]
    if topo.external:  # every rank's own server reports only its own engine: scrape each
        vllm_targets = [{"targets": [_hybrid_scrape_address(config, t, rank_port(config, t, r))],
                         "labels": _labels(stack, t.name, t.role.value, [r], generation(containers, t.name))}
                        for t in topo.nodes for r in t.dp_ranks]
    jobs: list[dict[str, Any]] = [
        {"job_name": "vllm", "metrics_path": "/metrics", "scheme": "http", "static_configs": vllm_targets,
         # vLLM names the DP rank `engine`; the info series and the dashboards name it `dp_rank`.
         "metric_relabel_configs": [{"source_labels": ["engine"], "regex": "(.+)", "target_label": "dp_rank",
                                     "replacement": "$1", "action": "replace"}]},
    ]
    for job, port in (("node", obs.ports.node_exporter), ("dcgm", obs.ports.dcgm_exporter)):
        # node: the textfile's own `generation` (what pulumi up applied there) wins over the planned one
        jobs.append({"job_name": job, **({"honor_labels": True} if job == "node" else {}), "static_configs": [
            {"targets": [f"{bracket_host(n.management_ip)}:{port}"],
             "labels": _labels(stack, t.name, t.role.value, t.dp_ranks, generation(containers, t.name))}
            for n, t in zip(config.nodes, topo.nodes, strict=True)]})
    jobs.append({"job_name": "watch", "honor_labels": True, "static_configs": [
        {"targets": [watch_address(config)],
         "labels": _labels(stack, "watch-unit", "watch", all_ranks, generation(containers, head.name))}]})
    # the group supervisor serves its own metrics (a dead one is `up` 0, not a textfile that keeps its last value)
    jobs.append({"job_name": SUPERVISOR_JOB, "static_configs": [
        {"targets": [supervisor_address(config)],
         "labels": _labels(stack, "group-supervisor", "supervisor", all_ranks, generation(containers, head.name))}]})
    out: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "external_labels": {"vllm_cluster_stack": stack}},
        "rule_files": [RULES_FILE],
        "scrape_configs": jobs,
    }
    if alertmanager_enabled(config):
        ip = management_ip(config, monitor_node(config))
        out["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [f"{bracket_host(ip)}:{obs.ports.alertmanager}"]}]}]}
    return out


def alertmanager_enabled(config: StackConfig) -> bool:
    return config.alert_webhook_url is not None


def alertmanager_config(stack: str, webhook_url: str) -> dict[str, Any]:
    """Every alert of the stack to one webhook (Alertmanager's generic JSON payload)."""
    return {"route": {"receiver": "webhook", "group_by": ["alertname", "stack", "node"],
                      "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"},
            "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}]}


# ---- alert rules --------------------------------------------------------------------------------------------

ALERTS = ("VllmClusterTargetDown", "VllmClusterGoldenFailing", "VllmClusterKvCacheHigh", "VllmClusterTtftHigh",
          "VllmClusterGpuXidError", "VllmClusterGenerationSkew", "VllmClusterGroupGaveUp",
          "VllmClusterSupervisorDown")


def supervisor_unit(stack: str) -> str:
    """The supervisor's systemd unit, as heal/supervisor_unit.py names it (a test holds the two equal)."""
    return f"vllm-cluster-supervisor-{stack}.service"


def rules(stack: str, config: StackConfig, topo: Topology) -> dict[str, Any]:
    obs = config.observability
    s = f'stack="{stack}"'
    head = topo.head.name
    rec = [
        {"record": "dp_rank:vllm_time_to_first_token_seconds:p99_5m",
         "expr": f"histogram_quantile(0.99, sum by (stack, dp_rank, le) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket{{{s}}}[5m])))"},
    ]
    alerts = [
        # the supervisor's target has its own alert below, which says what a dead supervisor means
        {"alert": "VllmClusterTargetDown", "expr": f'up{{{s},job!="{SUPERVISOR_JOB}"}} == 0', "for": "2m",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "{{ $labels.job }} target {{ $labels.instance }} on {{ $labels.node }} is down",
                         "description": "Prometheus cannot scrape it: the process is stopped, the port is "
                                        "firewalled or the node is unreachable."}},
        {"alert": "VllmClusterGoldenFailing", "expr": f"{GOLDEN_FAILURES}{{{s}}} >= {obs.golden_failures}",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "DP rank {{ $labels.dp_rank }} on {{ $labels.node }} failed its golden check "
                                    "{{ $value }} times in a row",
                         "description": "journalctl -u vllm-cluster-watch-" + stack + " shows the wrong answer."}},
        {"alert": "VllmClusterKvCacheHigh", "expr": f"vllm:kv_cache_usage_perc{{{s}}} > {obs.kv_cache_usage:g}",
         "for": "5m", "labels": {"severity": "warning"},
         "annotations": {"summary": "KV cache of DP rank {{ $labels.dp_rank }} at {{ $value | humanizePercentage }}"
                                    " for 5 minutes"}},
        {"alert": "VllmClusterTtftHigh",
         "expr": f"dp_rank:vllm_time_to_first_token_seconds:p99_5m{{{s}}} > {obs.ttft_p99_s:g}", "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "TTFT p99 of DP rank {{ $labels.dp_rank }} is {{ $value | humanizeDuration }}"
                                    f" (limit {obs.ttft_p99_s:g}s)"}},
        {"alert": "VllmClusterGpuXidError", "expr": f"DCGM_FI_DEV_XID_ERRORS{{{s}}} > 0",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "XID {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.node }}",
                         "description": "See NVIDIA's XID table; the engine on that node may need a group restart."}},
        {"alert": "VllmClusterGenerationSkew",
         "expr": f"{NODE_GENERATION}{{{s}}} unless on(stack, generation) {NODE_GENERATION}{{{s},node=\"{head}\"}}",
         "for": "5m", "labels": {"severity": "critical"},
         "annotations": {"summary": "{{ $labels.node }} runs generation {{ $labels.generation }}, not the head's: "
                                    "a half-applied update",
                         "description": "Run pulumi up again, or python -m stacks rollback."}},
        {"alert": "VllmClusterGroupGaveUp", "expr": f"{GROUP_GAVE_UP}{{{s}}} == 1",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "The group supervisor of {{ $labels.stack }} gave up: it restarts the engine "
                                    "group no more",
                         "description": f"A crash loop (--max-per-hour restarts in an hour) or drift it refuses to "
                                        f"restart into. Read journalctl -u {supervisor_unit(stack)} on the host it "
                                        "runs on (the give-up line says why, the death lines which rank), then the "
                                        f"runbook ({RUNBOOK}); after the fix: systemctl restart "
                                        f"{supervisor_unit(stack)}."}},
        {"alert": "VllmClusterSupervisorDown", "expr": f'up{{{s},job="{SUPERVISOR_JOB}"}} == 0', "for": "2m",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "The group supervisor of {{ $labels.stack }} ({{ $labels.instance }}) cannot "
                                    "be scraped: a dead rank will not be restarted",
                         "description": f"systemctl status {supervisor_unit(stack)} and journalctl -u "
                                        f"{supervisor_unit(stack)} on that host; not installed: python -m stacks "
                                        f"supervisor-unit {stack} (docs/group-restart.md). Runbook: {RUNBOOK}."}},
    ]
    return {"groups": [{"name": "vllm-cluster.recording", "rules": rec},
                       {"name": "vllm-cluster.alerts", "rules": alerts}]}


# ---- Grafana ------------------------------------------------------------------------------------------------

DATASOURCE_UID = "vllm-cluster-prometheus"


@dataclass
class _Board:
    uid: str
    title: str
    panels: list[dict[str, Any]]
    variables: list[dict[str, Any]]
    _y: int = 0
    _x: int = 0

    def panel(self, title: str, kind: str, exprs: list[tuple[str, str]], unit: str = "short", w: int = 12,
              h: int = 8, instant: bool = False) -> None:
        if self._x + w > 24:
            self._x, self._y = 0, self._y + h
        targets = [{"refId": chr(65 + i), "expr": e, "legendFormat": legend, "datasource": _DS,
                    **({"instant": True, "format": "table"} if instant else {})}
                   for i, (e, legend) in enumerate(exprs)]
        self.panels.append({"id": len(self.panels) + 1, "type": kind, "title": title, "datasource": _DS,
                            "gridPos": {"x": self._x, "y": self._y, "w": w, "h": h}, "targets": targets,
                            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}})
        self._x += w

    def json(self, stack: str) -> dict[str, Any]:
        return {"uid": self.uid, "title": self.title, "tags": ["vllm-cluster", stack, "generated"],
                "schemaVersion": 39, "version": 1, "editable": False, "refresh": "30s",
                "time": {"from": "now-3h", "to": "now"}, "timezone": "utc",
                "templating": {"list": self.variables}, "panels": self.panels}


_DS = {"type": "prometheus", "uid": DATASOURCE_UID}


def _quantile(q: float, metric: str, sel: str, by: str = "dp_rank") -> str:
    return f"histogram_quantile({q:g}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[$__rate_interval])))"


def dashboards(stack: str, config: StackConfig, topo: Topology) -> dict[str, dict[str, Any]]:
    """Three boards: the overview, one engine (a DP rank variable), GPUs per node. Queries filter by stack."""
    s = f'stack="{stack}"'
    join = f"on(stack, dp_rank) group_left(node) {ENGINE_INFO}{{{s}}}"
    ov = _Board(f"vllm-{stack}-overview"[:40], f"vLLM {stack}: overview", [], [])
    ov.panel("Golden check per DP rank (1 = answers)", "stat",
             [(f"max by (dp_rank, node) ({GOLDEN_OK}{{{s}}})", "rank {{dp_rank}} ({{node}})")], w=12, h=5)
    ov.panel("Targets up", "stat", [(f"up{{{s}}}", "{{job}} {{node}}")], w=12, h=5)
    ov.panel("Requests running", "timeseries",
             [(f"vllm:num_requests_running{{{s}}} * {join}", "rank {{dp_rank}} ({{node}})")])
    ov.panel("Requests waiting", "timeseries",
             [(f"vllm:num_requests_waiting{{{s}}} * {join}", "rank {{dp_rank}} ({{node}})")])
    ov.panel("KV cache usage", "timeseries",
             [(f"vllm:kv_cache_usage_perc{{{s}}} * {join}", "rank {{dp_rank}} ({{node}})")], unit="percentunit")
    ov.panel("Time to first token p50 / p99", "timeseries",
             [(_quantile(0.5, "vllm:time_to_first_token_seconds", s), "p50 rank {{dp_rank}}"),
              (_quantile(0.99, "vllm:time_to_first_token_seconds", s), "p99 rank {{dp_rank}}")], unit="s")
    ov.panel("Inter-token latency p50 / p99", "timeseries",
             [(_quantile(0.5, "vllm:inter_token_latency_seconds", s), "p50 rank {{dp_rank}}"),
              (_quantile(0.99, "vllm:inter_token_latency_seconds", s), "p99 rank {{dp_rank}}")], unit="s")
    ov.panel("Generation and image per rank (planned, from the watch unit)", "table",
             [(f"{ENGINE_INFO}{{{s}}}", "")], instant=True)
    ov.panel("Generation and image per node (applied, from each node)", "table",
             [(f"{NODE_GENERATION}{{{s}}}", "")], instant=True, w=24)

    rank_var = {"name": "dp_rank", "type": "query", "label": "DP rank", "datasource": _DS, "refresh": 1,
                "query": {"query": f"label_values({ENGINE_INFO}{{{s}}}, dp_rank)", "refId": "ranks"},
                "definition": f"label_values({ENGINE_INFO}{{{s}}}, dp_rank)", "multi": False, "includeAll": False}
    r = f'{s},dp_rank="$dp_rank"'
    en = _Board(f"vllm-{stack}-engine"[:40], f"vLLM {stack}: engine (DP rank)", [], [rank_var])
    en.panel("Token throughput", "timeseries",
             [(f"rate(vllm:prompt_tokens_total{{{r}}}[$__rate_interval])", "prompt tokens/s"),
              (f"rate(vllm:generation_tokens_total{{{r}}}[$__rate_interval])", "generated tokens/s")])
    en.panel("Scheduler state", "timeseries",
             [(f"vllm:num_requests_running{{{r}}}", "running"), (f"vllm:num_requests_waiting{{{r}}}", "waiting")])
    en.panel("End-to-end request latency", "timeseries",
             [(_quantile(q, "vllm:e2e_request_latency_seconds", r), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)],
             unit="s")
    en.panel("Time to first token", "timeseries",
             [(_quantile(q, "vllm:time_to_first_token_seconds", r), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)],
             unit="s")
    en.panel("Inter-token latency", "timeseries",
             [(_quantile(q, "vllm:inter_token_latency_seconds", r), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)],
             unit="s")
    en.panel("Queue, prefill and decode time p99", "timeseries",
             [(_quantile(0.99, f"vllm:request_{p}_seconds", r), p) for p in ("queue_time", "prefill_time",
                                                                           "decode_time")], unit="s")
    en.panel("KV cache usage", "timeseries", [(f"vllm:kv_cache_usage_perc{{{r}}}", "usage")], unit="percentunit")
    en.panel("Prefix cache hit rate", "timeseries",
             [(f"rate(vllm:prefix_cache_hits_total{{{r}}}[$__rate_interval]) / "
               f"rate(vllm:prefix_cache_queries_total{{{r}}}[$__rate_interval])", "hit rate")], unit="percentunit")
    en.panel("Finished requests by reason", "timeseries",
             [(f"sum by (finished_reason) (rate(vllm:request_success_total{{{r}}}[$__rate_interval]))",
               "{{finished_reason}}")], unit="reqps")
    en.panel("Preemptions", "timeseries",
             [(f"rate(vllm:num_preemptions_total{{{r}}}[$__rate_interval])", "preemptions/s")])
    en.panel("Prompt and generation length p50", "timeseries",
             [(_quantile(0.5, "vllm:request_prompt_tokens", r), "prompt tokens"),
              (_quantile(0.5, "vllm:request_generation_tokens", r), "generated tokens")])
    en.panel("Golden check latency", "timeseries", [(f"{GOLDEN_LATENCY}{{{r}}}", "last probe")], unit="s")

    g = f'{s},node=~"$node"'
    node_var = {"name": "node", "type": "query", "label": "node", "datasource": _DS, "refresh": 1,
                "query": {"query": f'label_values(up{{{s},job="dcgm"}}, node)', "refId": "nodes"},
                "definition": f'label_values(up{{{s},job="dcgm"}}, node)', "multi": True, "includeAll": True}
    gp = _Board(f"vllm-{stack}-gpus"[:40], f"vLLM {stack}: GPUs per node", [], [node_var])
    legend = "{{node}} GPU {{gpu}}"
    gp.panel("GPU memory used", "timeseries", [(f"DCGM_FI_DEV_FB_USED{{{g}}}", legend)], unit="decmbytes")
    gp.panel("GPU memory free", "timeseries", [(f"DCGM_FI_DEV_FB_FREE{{{g}}}", legend)], unit="decmbytes")
    gp.panel("GPU utilisation", "timeseries", [(f"DCGM_FI_DEV_GPU_UTIL{{{g}}}", legend)], unit="percent")
    gp.panel("GPU temperature", "timeseries", [(f"DCGM_FI_DEV_GPU_TEMP{{{g}}}", legend)], unit="celsius")
    gp.panel("Power draw", "timeseries", [(f"DCGM_FI_DEV_POWER_USAGE{{{g}}}", legend)], unit="watt")
    gp.panel("Last XID error (0 = none)", "timeseries", [(f"DCGM_FI_DEV_XID_ERRORS{{{g}}}", legend)])
    return {f"{b.uid}.json": b.json(stack) for b in (ov, en, gp)}


def grafana_provisioning(config: StackConfig) -> dict[str, dict[str, Any]]:
    ip = management_ip(config, monitor_node(config))
    prom = f"http://{bracket_host(ip)}:{config.observability.ports.prometheus}"
    return {
        "provisioning/datasources/vllm-cluster.yml": {"apiVersion": 1, "datasources": [
            {"name": "Prometheus", "type": "prometheus", "uid": DATASOURCE_UID, "access": "proxy", "url": prom,
             "isDefault": True, "editable": False}]},
        "provisioning/dashboards/vllm-cluster.yml": {"apiVersion": 1, "providers": [
            {"name": "vllm-cluster", "type": "file", "disableDeletion": True, "allowUiUpdates": False,
             "options": {"path": GRAFANA_DASHBOARDS}}]},
    }


# ---- the files, the containers, the plan --------------------------------------------------------------------

def _yaml(data: dict[str, Any]) -> str:
    return "# Generated by vllm-cluster from the stack's plan; do not edit (python -m stacks observability).\n" + \
        yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)


def render_files(stack: str, config: StackConfig, topo: Topology, containers: dict[str, list[ContainerSpec]],
                 webhook_url: str = WEBHOOK_PLACEHOLDER) -> dict[str, str]:
    """Relative path -> text: prometheus.yml, its rule file, alertmanager.yml (with a webhook), Grafana's
    provisioning and dashboards, and each node's textfile for its node exporter (`textfile/<node>.prom`)."""
    files = {"prometheus.yml": _yaml(prometheus_config(stack, config, topo, containers)),
             RULES_FILE: _yaml(rules(stack, config, topo))}
    if alertmanager_enabled(config):
        files["alertmanager.yml"] = _yaml(alertmanager_config(stack, webhook_url))
    for path, data in grafana_provisioning(config).items():
        files[f"grafana/{path}"] = _yaml(data)
    for name, board in dashboards(stack, config, topo).items():
        files[f"grafana/dashboards/{name}"] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    for node in topo.nodes:
        files[f"textfile/{node.name}.prom"] = node_textfile(config, containers, node.name)
    return files


def node_textfile(config: StackConfig, containers: dict[str, list[ContainerSpec]], node: str) -> str:
    """What the node's exporter serves about the engine applied on it (uploaded after that engine)."""
    image = config.image
    labels = (f'generation="{generation(containers, node)}",image="{_esc(image.ref)}",'
              f'image_digest="{_esc(image.digest or "")}"')
    return (f"# HELP {NODE_GENERATION} The engine generation and image applied on this node by pulumi up.\n"
            f"# TYPE {NODE_GENERATION} gauge\n{NODE_GENERATION}{{{labels}}} 1\n")


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _listen(config: StackConfig, node: str, port: int) -> str:
    return f"{bracket_host(management_ip(config, node))}:{port}"


def containers(stack: str, config: StackConfig, topo: Topology) -> list[MonitorContainer]:
    obs = config.observability
    mon = monitor_node(config)
    p = obs.ports
    img = obs.images
    out: list[MonitorContainer] = []
    for node in topo.nodes:
        out.append(MonitorContainer(
            node=node.name, name=f"{stack}-node-exporter"[:63], role="node-exporter", image=img.node_exporter,
            listen=_listen(config, node.name, p.node_exporter),
            args=[f"--web.listen-address={_listen(config, node.name, p.node_exporter)}",
                  "--path.rootfs=/host", f"--collector.textfile.directory={TEXTFILE_DIR}"]))
        out.append(MonitorContainer(
            node=node.name, name=f"{stack}-dcgm-exporter"[:63], role="dcgm-exporter", image=img.dcgm_exporter,
            listen=_listen(config, node.name, p.dcgm_exporter),
            args=["--address", _listen(config, node.name, p.dcgm_exporter)]))
    retention = [f"--storage.tsdb.retention.time={obs.retention_days}d",
                 f"--storage.tsdb.retention.size={obs.retention_gb}GB"]
    out.append(MonitorContainer(
        node=mon, name=f"{stack}-prometheus"[:63], role="prometheus", image=img.prometheus,
        listen=_listen(config, mon, p.prometheus),
        args=[f"--config.file={PROMETHEUS_DIR}/prometheus.yml", "--storage.tsdb.path=/prometheus", *retention,
              f"--web.listen-address={_listen(config, mon, p.prometheus)}"]))
    out.append(MonitorContainer(
        node=mon, name=f"{stack}-grafana"[:63], role="grafana", image=img.grafana,
        listen=_listen(config, mon, p.grafana), args=[]))
    if alertmanager_enabled(config):
        out.append(MonitorContainer(
            node=mon, name=f"{stack}-alertmanager"[:63], role="alertmanager", image=img.alertmanager,
            listen=_listen(config, mon, p.alertmanager),
            args=[f"--config.file={ALERTMANAGER_CONFIG}", "--storage.path=/alertmanager",
                  f"--web.listen-address={_listen(config, mon, p.alertmanager)}",
                  f"--cluster.listen-address=127.0.0.1:{p.alertmanager_cluster}"]))
    return out


MONITOR_RESTART = "unless-stopped"
"""Unlike an engine rank (`restart: no`: a rank restarted alone hangs), a monitoring container stands alone."""


def monitor_spec(stack: str, mc: MonitorContainer, data_dir: str, env: dict[str, str]) -> ContainerSpec:
    """One monitoring container's full settings, the one source for what components/observability.py creates and
    what `drift` compares field by field: host network, no privilege; the DCGM exporter alone gets the GPUs and
    SYS_ADMIN (NVIDIA's documented `docker run`); Prometheus, Grafana and Alertmanager keep their data in a host
    folder under `observability.data_dir`. `env` is Grafana's (grafana_env), unused by the other roles."""
    data = data_dir.rstrip("/")
    volumes = {"node-exporter": [VolumeSpec(host="/", container="/host", read_only=True)],
               "prometheus": [VolumeSpec(host=f"{data}/prometheus", container="/prometheus", read_only=False)],
               "grafana": [VolumeSpec(host=f"{data}/grafana", container="/var/lib/grafana", read_only=False)],
               "alertmanager": [VolumeSpec(host=f"{data}/alertmanager", container="/alertmanager",
                                           read_only=False)]}.get(mc.role, [])
    dcgm = mc.role == "dcgm-exporter"
    return ContainerSpec(
        name=mc.name, purpose=mc.role, image=mc.image, vllm_args=None, command=list(mc.args), entrypoint=None,
        env=dict(env) if mc.role == "grafana" else {}, secret_env={}, network_mode="host", ipc_mode="private",
        privileged=False, gpus="all" if dcgm else None, ulimits={}, shm_size_mb=None, volumes=volumes, devices=[],
        capabilities=["SYS_ADMIN"] if dcgm else [], restart=MONITOR_RESTART,
        labels={f"{LABEL_PREFIX}.role": mc.role, f"{LABEL_PREFIX}.stack": stack}, healthcheck=None)


def grafana_env(config: StackConfig) -> dict[str, str]:
    """Plain settings; the admin password comes from a file (GF_..._FILE), never the environment."""
    mon = monitor_node(config)
    return {"GF_SERVER_HTTP_ADDR": management_ip(config, mon),
            "GF_SERVER_HTTP_PORT": str(config.observability.ports.grafana),
            "GF_SECURITY_ADMIN_USER": "admin", "GF_SECURITY_ADMIN_PASSWORD__FILE": GRAFANA_PASSWORD_FILE,
            "GF_PATHS_PROVISIONING": GRAFANA_PROVISIONING, "GF_USERS_ALLOW_SIGN_UP": "false",
            "GF_AUTH_ANONYMOUS_ENABLED": "false", "GF_ANALYTICS_REPORTING_ENABLED": "false",
            "GF_ANALYTICS_CHECK_FOR_UPDATES": "false"}


def unpinned(config: StackConfig) -> list[str]:
    imgs: dict[str, str] = dict(config.observability.images)
    used = {"prometheus", "grafana", "node_exporter", "dcgm_exporter"} | (
        {"alertmanager"} if alertmanager_enabled(config) else set())
    return [f"observability.images.{k}" for k, v in imgs.items() if k in used and "@sha256:" not in v]


def observability_plan(stack: str, config: StackConfig, topo: Topology,
                       engine: dict[str, list[ContainerSpec]]) -> ObservabilityPlan | None:
    if not config.observability.enabled:
        return None
    mon = monitor_node(config)
    p = config.observability.ports
    files = render_files(stack, config, topo, engine)
    return ObservabilityPlan(
        node=mon, prometheus=_listen(config, mon, p.prometheus), grafana=_listen(config, mon, p.grafana),
        alertmanager=_listen(config, mon, p.alertmanager) if alertmanager_enabled(config) else None,
        watch_target=watch_address(config), supervisor_target=supervisor_address(config),
        containers=containers(stack, config, topo),
        files={k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in files.items()},
        unpinned_images=unpinned(config))
