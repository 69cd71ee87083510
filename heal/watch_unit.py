"""A systemd service that runs `python -m checks.api --watch` on the deploying host (pure: text in, text out).

One long-running service, no timer: the watch loop sleeps between rounds itself and prints one line per
rank going down or coming back, which journald keeps (`journalctl -u vllm-cluster-watch-<stack>`). It exits
only for a configuration error (exit 2): `RestartPreventExitStatus=2` keeps systemd from restarting a unit
that cannot work, any other exit restarts it.

The bearer key comes from `EnvironmentFile=` (`VLLM_API_KEY=…`, mode 0600), never from the unit text; the
proxy's certificate from `--ca-file`. Arguments are quoted as systemd.service(5) "Command lines" says:
double quotes around a word, C escapes inside (`\\\\`, `\\"`, `\\n`), `$$` for a literal `$` (else it is a
variable) and `%%` for a literal `%` (else it is a specifier).
"""

from __future__ import annotations

import re

from stacks.model.golden import DEFAULT_GOLDEN, GoldenPair, golden_json

_PLAIN = re.compile(r"^[A-Za-z0-9_./:,=@+-]+$")
_STACK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def stack_unit_name(stack: str, purpose: str) -> str:
    """`vllm-cluster-<purpose>-<stack>.service`, for any of the project's units."""
    if not _STACK.match(stack):
        raise ValueError(f"stack name {stack!r} cannot name a unit: letters, digits, '_', '.', '-'")
    return f"vllm-cluster-{purpose}-{stack}.service"


def unit_name(stack: str) -> str:
    return stack_unit_name(stack, "watch")


SPACED = ("python", "--python", "workdir", "--workdir", "ca_file", "--ca-file", "--metrics-file")
"""The paths a unit may hold with spaces inside (a project in `~/My Clusters`, its venv's python): each is written
where systemd reads a space as part of it: ExecStart's words in double quotes (`systemd_quote`), WorkingDirectory=
as it is (the rest of the line is one path; quoted, systemd 252 refuses it as "not absolute"), ReadWritePaths=
quoted. EnvironmentFile= is not among them: the variables' file is named by the operator (`--env-file`)."""


def check_unit_inputs(paths: dict[str, str | None], user: str | None) -> None:
    """What a unit file interpolates: absolute paths that cannot add a line or a specifier (spaces inside only where
    SPACED says they are quoted), a POSIX user name."""
    for label, path in paths.items():
        if path is not None and not path.startswith("/"):
            raise ValueError(f"{label} {path!r} must be an absolute path (systemd resolves nothing else)")
        spaced = label in SPACED and path is not None and path == path.strip()
        if path is not None and re.search(r"[\t\n\r\f\v\x00-\x1f\x7f\\%$\"']" + ("" if spaced else "| "), path):
            raise ValueError(f"{label} {path!r}: no {'' if spaced else 'space, '}tab, control character, quote, "
                             "`\\`, `%` or `$` (a newline would add a line to the unit; `%` and `$` are systemd's "
                             "specifiers and variables)" + ("" if spaced else "; spaces only inside the project's "
                                                           "paths (--python, --workdir, --ca-file, --metrics-file)"))
    if user is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user):
        raise ValueError(f"--user {user!r}: a POSIX user name ([a-z_][a-z0-9_-], at most 32 characters)")


def systemd_quote(word: str) -> str:
    """One ExecStart word that systemd splits back into exactly `word`."""
    if _PLAIN.match(word):
        return word
    escaped = (word.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
               .replace("$", "$$").replace("%", "%%"))
    return f'"{escaped}"'


def watch_argv(*, python: str, url: str, served_name: str, dp_size: int, rank_nodes: list[str],
               golden: list[GoldenPair] | tuple[GoldenPair, ...] = DEFAULT_GOLDEN, interval_s: float = 60,
               timeout_s: float = 120, ca_file: str | None = None, name: str = "api-watch",
               metrics_listen: str | None = None, info_json: str | None = None,
               thinking_kwarg: str | None = None) -> list[str]:
    """The watch command: every DP rank, the stack's golden set, the key from VLLM_API_KEY; `thinking_kwarg` is
    how the card turns reasoning off (the golden set runs with thinking off), when it is not the default."""
    if dp_size < 1 or (rank_nodes and len(rank_nodes) != dp_size):
        raise ValueError(f"{len(rank_nodes)} rank node(s) for DP size {dp_size}: one node name per rank")
    argv = [python, "-m", "checks.api", "--watch", "--name", name, "--url", url, "--served-name", served_name,
            "--dp-size", str(dp_size), "--interval-s", f"{interval_s:g}", "--timeout-s", f"{timeout_s:g}",
            "--golden-json", golden_json(golden), "--api-key-env", "VLLM_API_KEY"]
    if rank_nodes:
        argv += ["--rank-nodes", ",".join(rank_nodes)]
    if thinking_kwarg and thinking_kwarg != "thinking":
        argv += ["--thinking-kwarg", thinking_kwarg]
    if ca_file:
        argv += ["--ca-file", ca_file]
    if metrics_listen:  # observability: the golden results and the info series for Prometheus
        argv += ["--metrics-listen", metrics_listen]
        if info_json:
            argv += ["--info-json", info_json]
    return argv


def render_watch_unit(*, stack: str, python: str, workdir: str, url: str, served_name: str, dp_size: int,
                      rank_nodes: list[str], golden: list[GoldenPair] | tuple[GoldenPair, ...] = DEFAULT_GOLDEN,
                      interval_s: float = 60, timeout_s: float = 120, env_file: str | None = None,
                      ca_file: str | None = None, user: str | None = None, metrics_listen: str | None = None,
                      info_json: str | None = None, thinking_kwarg: str | None = None) -> str:
    """The unit file text. `python` is the deployer's venv interpreter and `workdir` the checkout holding
    `checks/` and `stacks/`; `env_file` holds `VLLM_API_KEY=…` (the proxy's check client key when it is on)."""
    check_unit_inputs({"python": python, "workdir": workdir, "env_file": env_file, "ca_file": ca_file}, user)
    name = unit_name(stack)
    argv = watch_argv(python=python, url=url, served_name=served_name, dp_size=dp_size, rank_nodes=rank_nodes,
                      golden=golden, interval_s=interval_s, timeout_s=timeout_s, ca_file=ca_file,
                      name=f"api-watch-{stack}", metrics_listen=metrics_listen, info_json=info_json,
                      thinking_kwarg=thinking_kwarg)
    service = [f"WorkingDirectory={workdir}"]  # one path to the end of the line: no quotes (check_unit_inputs)
    if env_file:
        service.append(f"EnvironmentFile={env_file}")
    if user:
        service.append(f"User={user}")
    service += [
        "Environment=PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1",
        "ExecStart=" + " ".join(systemd_quote(word) for word in argv),
        "Restart=on-failure",
        "RestartSec=30",
        "RestartPreventExitStatus=2",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "ProtectKernelTunables=yes",
        "ProtectControlGroups=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        f"SyslogIdentifier=vllm-cluster-watch-{stack}",
    ]
    return unit_file(name=name, renderer="heal/watch_unit.py", stack=stack,
                     comments=[f"# Read:    journalctl -u {name}   (one line per DP rank going down or coming back)"],
                     description=f"golden prompt on every DP rank ({dp_size}), one line per transition",
                     service=service)


def unit_file(*, name: str, renderer: str, stack: str, comments: list[str], description: str,
              service: list[str]) -> str:
    """A systemd service of this project: the same header (who rendered it, how to install it), [Unit] and
    [Install] for the watch unit and the group supervisor; `service` is the [Service] section after Type."""
    lines = [
        f"# {name}: rendered by vllm-cluster ({renderer}) for stack {stack!r}.",
        f"# Install: cp {name} /etc/systemd/system/ && systemctl daemon-reload && systemctl enable --now {name}",
        *comments,
        "[Unit]",
        f"Description=vllm-cluster {stack}: {description}",
        "Wants=network-online.target",
        "After=network-online.target",
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=simple",
        *service,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"

