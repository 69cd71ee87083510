"""The group supervisor's systemd service (pure: text in, text out), rendered like the watch unit.

It runs `python -m stacks supervise STACK` on the deploying host, which holds the stack's pinned known_hosts and
SSH key. With observability on it serves its metrics on the stack's `observability.supervisor_address:
ports.supervisor` (`--metrics-listen`), and after a give-up stays up, restarting nothing, so Prometheus reads
`vllm_cluster_group_gave_up 1`. Exit 2 (a configuration error) and 3 (gave up after alerting, without a metrics
listener) stop it for good (`RestartPreventExitStatus=2 3`): after a give-up a person fixes the cause and runs
`systemctl restart`. The alert webhook and the API key come from `EnvironmentFile=`, never from the unit text.
`ReadWritePaths` opens the deploy lock's directory and the metrics file's directory; OpenSSH's shared connection
socket goes to the unit's `RuntimeDirectory=` (/run/vllm-cluster-supervisor-STACK, created for `User=` by systemd,
named to ssh by $RUNTIME_DIRECTORY: heal/node_access.py `control_path`), not ~/.ssh: `%h` in a system unit is
root's home whatever `User=` says (systemd.unit(5)), so the user's own ~/.ssh would stay read-only.
"""

from __future__ import annotations

import re

from heal.watch_unit import check_unit_inputs, stack_unit_name, systemd_quote, unit_file


def supervisor_unit_name(stack: str) -> str:
    return stack_unit_name(stack, "supervisor")


def render_supervisor_unit(*, stack: str, python: str, workdir: str, env_file: str, user: str | None = None,
                           metrics_file: str | None = None, ca_file: str | None = None,
                           golden_metrics_url: str | None = None, metrics_listen: str | None = None,
                           timing: dict[str, float | None] | None = None) -> str:
    check_unit_inputs({"--python": python, "--workdir": workdir, "--env-file": env_file,
                       "--metrics-file": metrics_file, "--ca-file": ca_file}, user)
    if metrics_listen is not None and not re.fullmatch(r"[0-9A-Fa-f.:\[\]]{3,60}", metrics_listen):
        raise ValueError(f"--metrics-listen {metrics_listen[:80]!r}: ADDRESS:PORT, e.g. 10.30.8.1:9465 or "
                         "[fd00::1]:9465 (nothing else goes into the unit)")
    name = supervisor_unit_name(stack)
    argv = [python, "-m", "stacks", "supervise", stack]
    if metrics_file:
        argv += ["--metrics-file", metrics_file]
    if ca_file:
        argv += ["--ca-file", ca_file]
    if golden_metrics_url is not None:
        argv += ["--golden-metrics-url", golden_metrics_url]
    if metrics_listen:  # checked by the caller as supervise checks it; from the plan, so the unit says it
        argv += ["--metrics-listen", metrics_listen]
    for flag, value in (timing or {}).items():  # checked by the caller as supervise checks them
        if value is not None:
            argv += [flag, f"{value:.15g}"]
    writable = ["/run/lock"]
    if metrics_file:
        writable.append(metrics_file.rsplit("/", 1)[0] or "/")
    service = [f"WorkingDirectory={workdir}", f"EnvironmentFile={env_file}"]  # one path each: no quotes
    if user:
        service.append(f"User={user}")
    service += [
        "Environment=PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1",
        "ExecStart=" + " ".join(systemd_quote(word) for word in argv),
        "Restart=on-failure",
        "RestartSec=60",
        "RestartPreventExitStatus=2 3",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=" + " ".join(systemd_quote(path) for path in writable),
        f"RuntimeDirectory=vllm-cluster-supervisor-{stack}",
        "RuntimeDirectoryMode=0700",
        "ProtectKernelTunables=yes",
        "ProtectControlGroups=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        f"SyslogIdentifier=vllm-cluster-supervisor-{stack}",
    ]
    return unit_file(
        name=name, renderer="heal/supervisor_unit.py", stack=stack,
        comments=[f"# Read:    journalctl -u {name}   (one line per action, with its reason)",
                  *([f"# Metrics: http://{metrics_listen}/metrics   (the stack's Prometheus scrapes it: job "
                       "supervisor)"] if metrics_listen else [])],
        description="restart the whole engine group in start order when a rank dies", service=service)
