"""The group supervisor: watches every rank, and on any death restarts the whole group in start order.

One loop, one log line per action with its reason (journald keeps them). A rank is dead when Docker reports its
container not running, or when it makes no progress: the head's `/health` (or a rank's Docker health check, or
the watch unit's golden result for one of its DP ranks) failing for `hang_s` in a row while Docker reports every
rank running. Unreachable is not dead: when a node's Docker cannot be asked (SSH fails), the supervisor is
"blind" (one log line with the reason), nothing counts toward a hang, and a restart waits for fresh evidence
(it looks again right before each restart). Until the group has been seen serving since the supervisor started,
failing health alone restarts nothing (this host may just not reach the endpoint: firewall, TLS); only a
container Docker reports exited does. The watch unit's results are read from its `/metrics`
(`vllm_cluster_golden_ok` and `vllm_cluster_golden_last_round_timestamp_seconds` per DP rank); a result older
than `golden_max_age_s`, or from before the supervisor's last restart, is not used (a stuck or dead watcher says
nothing about the ranks).

Then, with the deploy lock held (`DeployLock`: `pulumi up` run through `flock` takes the same file, so neither
runs while the other does), and only when `drift` finds nothing that would bring back a container the plan did
not create, it runs the group restart of heal/group.py: stop every rank, clean, start in order, wait within
the plan's load estimate, golden check.

Attempts back off (`backoff_first_s` doubling to `backoff_max_s`; the count resets after the group has served for
`backoff_max_s`), at most `max_per_hour` in any hour; then it gives up: one alert to the webhook and the metric
`vllm_cluster_group_gave_up` set to 1. It never restarts a lone rank, never creates or removes a container, and
never changes the topology.

Its metrics (`render`) are served over HTTP by the process itself when `supervise --metrics-listen` is given (the
unit passes the stack's `observability.supervisor_address:ports.supervisor`), which the planned Prometheus scrapes,
and/or written to a node exporter textfile (`--metrics-file`). Served, a give-up keeps the process up, restarting
nothing, so the scrape goes on reading `vllm_cluster_group_gave_up 1` until a person restarts it; a dead
supervisor is a failed scrape (`up` 0, its own alert) instead of a textfile that keeps its last value. Without a
listener it exits 3 after giving up (the unit does not restart it).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from components.deploy_lock import DeployLock, lock_path
from heal.group import CLEAN_SCRIPT, START_RUNNING_S, STOP_TIMEOUT_S, Group
from heal.node_access import AccessError, NodeAccess
from stacks.model.masking import mask_secrets

GAVE_UP = 3
WEBHOOK_ENV = "VLLM_CLUSTER_ALERT_WEBHOOK"
__all__ = ["GAVE_UP", "METRICS", "WEBHOOK_ENV", "DeployLock", "Log", "Settings", "Supervisor", "lock_path",
           "read_golden", "restart_group"]

METRICS = {
    "vllm_cluster_group_restarts_total": ("counter", "Whole-group restarts the supervisor ran."),
    "vllm_cluster_group_gave_up": ("gauge", "1 when the supervisor stopped restarting and alerted."),
    "vllm_cluster_group_restarts_last_hour": (
        "gauge", "Whole-group restarts in the last hour (rolling), the count --max-per-hour limits."),
    "vllm_cluster_group_max_restarts_per_hour": (
        "gauge", "--max-per-hour: the restarts in any hour after which the supervisor gives up."),
    "vllm_cluster_group_backoff_seconds": (
        "gauge", "The wait before the next restart if the group died now (0: at once)."),
    "vllm_cluster_group_next_restart_in_seconds": (
        "gauge", "Seconds until the back-off running now ends and the next restart may start (0: none running)."),
    "vllm_cluster_group_last_restart_timestamp_seconds": ("gauge", "Unix time the last whole-group restart ended."),
    "vllm_cluster_group_last_restart_success": (
        "gauge", "1 when the last whole-group restart served again and passed its golden check, else 0."),
}
"""The series the supervisor serves and writes (stacks/planner/observability.py SUPERVISOR_METRICS names them for
the rules; a test holds the two equal). The textfile's first line is the first one's HELP."""


class LockRefused(Exception):
    """The deploy lock file cannot be opened by this user (exit 2: no restart may run without it)."""


@dataclass
class Settings:
    interval_s: float = 30
    hang_s: float = 600
    """Health failing this long in a row, the process alive or not, is a death ("no progress")."""
    backoff_first_s: float = 60
    backoff_max_s: float = 1800
    max_per_hour: int = 4
    health_timeout_s: float = 10
    ca_file: str | None = None
    webhook: str | None = None
    metrics_file: Path | None = None
    metrics_url: str | None = None
    """Where `supervise --metrics-listen` serves `render()`, for the log; set, a give-up keeps the process up."""
    golden_url: str | None = None
    """The watch unit's `/metrics` (its per-rank golden results); None: that signal is off."""
    golden_max_age_s: float = 600
    """A golden result older than this is stale: not used."""
    golden_ranks: dict[str, str] | None = None
    """The stack's DP ranks and each one's node ('' when the plan names none); a result for any other rank or node
    (another stack's watch unit, an old topology) is ignored. None: every rank counts."""


GOLDEN_SKEW_S = 60.0
"""A golden round time this far ahead of the supervisor's clock is not used: a clock that is wrong would make the
result look fresh for ever."""


@dataclass
class Log:
    out: TextIO
    stack: str
    lines: list[str] = field(default_factory=list)

    def __call__(self, action: str, detail: str, reason: str = "") -> None:
        # masked: detail and reason carry exception text (a node's ssh or docker stderr may echo a credential)
        line = mask_secrets(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} group-supervisor {self.stack} {action}: "
                            f"{one_line(detail)}" + (f" (reason: {one_line(reason)})" if reason else ""))
        self.lines.append(line)
        print(line, file=self.out, flush=True)


FETCH_ERRORS = (OSError, ValueError, http.client.HTTPException)
"""What a GET of a probe URL may raise: a refused or cut connection, a reply that is not HTTP (an SSH banner:
BadStatusLine), a header line over 64 KiB (LineTooLong), a malformed URL. Each is a failed signal, never a crash."""


def fetch(url: str, timeout_s: float, ca_file: str | None = None, limit: int = 4 << 20,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET `url`: (status, at most `limit` bytes of body). The connection gets `timeout_s`, then the whole reply
    (headers and body) `timeout_s` more in total: a server that trickles a byte a second cannot hold the
    supervisor, since a socket timeout alone bounds each receive, not the reply. FETCH_ERRORS when it fails."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    conn = (http.client.HTTPSConnection(host, port, timeout=timeout_s,
                                        context=ssl.create_default_context(cafile=ca_file))
            if parts.scheme == "https" else http.client.HTTPConnection(host, port, timeout=timeout_s))
    cut = threading.Event()
    held: list[socket.socket] = []  # the connection drops its socket once the reply's header says "close"

    def cut_off() -> None:
        cut.set()
        for sock in held:
            with contextlib.suppress(OSError):  # wakes the blocked receive with an end of file
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    timer = threading.Timer(timeout_s, cut_off)
    timer.daemon = True
    try:
        conn.connect()
        if conn.sock is not None:
            held.append(conn.sock)
        timer.start()
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                     headers={"User-Agent": "vllm-cluster-group-supervisor", **(headers or {})})
        response = conn.getresponse()
        body = response.read(limit)
    except FETCH_ERRORS:
        if cut.is_set():
            raise TimeoutError(f"no complete reply within {timeout_s:g}s") from None
        raise
    finally:
        timer.cancel()
        conn.close()
    if cut.is_set():
        raise TimeoutError(f"no complete reply within {timeout_s:g}s (a partial one came)")
    return response.status, body


def http_ok(url: str, timeout_s: float, ca_file: str | None = None) -> tuple[bool, str]:
    try:
        status, _ = fetch(url, timeout_s, ca_file, limit=64 << 10)
    except FETCH_ERRORS as exc:
        return False, failure(exc)
    return status == 200, f"HTTP {status}"


def masked_url(url: str, keep_path: bool = True) -> str:
    """`url` fit for a log or an error: no user, password, query or fragment (tokens live there), and with
    `keep_path=False` no path either. A URL that does not parse (an unclosed IPv6 bracket) shows its scheme only."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{url.partition(':')[0][:20]}://(not a valid URL: host not shown)"
    netloc = parts.netloc.rpartition("@")[2]
    user = "(credentials not shown)@" if "@" in parts.netloc else ""
    path = parts.path if keep_path else ("/…" if parts.path.strip("/") else "")
    query = "?(query not shown)" if parts.query or parts.fragment else ""
    return f"{parts.scheme}://{user}{netloc}{path}{query}"


def failure(exc: BaseException) -> str:
    """One line for a failed fetch: its type and reason."""
    return one_line(f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}")[:300]


def one_line(text: str) -> str:
    """Text as one log line: SSH and Docker errors span lines, and journald keeps one entry per line."""
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())


@dataclass(frozen=True)
class GoldenResult:
    """One DP rank's last golden round, as the watch unit serves it."""

    dp_rank: str
    node: str
    ok: bool
    failures: int
    ended_at: float | None
    """Unix time the round ended; None when the watch unit does not say (then the result is never used)."""


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """`name{a="x",b="y"} 1.5` (Prometheus text format) -> (name, labels, value); None for anything else."""
    name, brace, rest = line.partition("{")
    body, close, value = rest.rpartition("}") if brace else ("", "}", line.partition(" ")[2])
    if not close:
        return None
    labels = {key: re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], text)
              for key, text in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', body)}
    try:
        return name.split()[0], labels, float(value.split()[0])
    except (IndexError, ValueError):
        return None


def read_golden(url: str, timeout_s: float, ca_file: str | None = None) -> dict[str, GoldenResult]:
    """The watch unit's golden results by DP rank. FETCH_ERRORS when it cannot be read."""
    status, body = fetch(url, timeout_s, ca_file)
    if status != 200:
        raise ValueError(f"HTTP {status}")
    text = body.decode("utf-8", "replace")
    ok: dict[str, tuple[str, float]] = {}
    failures: dict[str, float] = {}
    ended: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm_cluster_golden_"):
            continue
        sample = _sample(line)
        if sample is None:
            continue
        name, labels, value = sample
        rank = labels.get("dp_rank", "0")
        if name == "vllm_cluster_golden_ok":
            ok[rank] = (labels.get("node", ""), value)
        elif name == "vllm_cluster_golden_consecutive_failures":
            failures[rank] = value
        elif name == "vllm_cluster_golden_last_round_timestamp_seconds":
            ended[rank] = value
    if not ok and "vllm_cluster_golden" not in text:
        raise ValueError("no vllm_cluster_golden_* series (is this the watch unit's --metrics-listen?)")
    return {rank: GoldenResult(rank, node, value == 1, int(failures.get(rank, 0)), ended.get(rank))
            for rank, (node, value) in ok.items()}


def _state(access: NodeAccess, node: str, container: str) -> tuple[bool, str]:
    """(running, description) from `docker inspect`; AccessError when the node does not answer."""
    done = access.docker(node, ["inspect", "-f", "{{json .State}}", container], timeout_s=60)
    if done.returncode != 0:
        if "No such" in done.stderr:
            return False, "container missing"
        raise AccessError(f"docker inspect failed on {node}: {done.stderr.strip()[:200]}")
    state = json.loads(done.stdout)
    health = (state.get("Health") or {}).get("Status")
    if not state.get("Running"):
        return False, f"{state.get('Status')} (exit code {state.get('ExitCode')}, {state.get('Error') or 'no error'})"
    return True, f"running{', health ' + health if health else ''}"


def restart_group(group: Group, access: NodeAccess, log: Log, reason: str, settings: Settings,
                  sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    """The whole group, in order. (True, '') when the golden check passes, else (False, why)."""
    for rank in reversed(group.ranks):
        name = access.container(rank.node, rank.container)
        done = access.docker(rank.node, ["stop", "-t", str(STOP_TIMEOUT_S), name], timeout_s=STOP_TIMEOUT_S + 60)
        running = _state(access, rank.node, name)[0] if done.returncode == 0 else True
        if running:
            access.docker(rank.node, ["kill", name], timeout_s=60)
        log("stop", f"{rank.node} {name}: {'stopped' if done.returncode == 0 else done.stderr.strip()[:200]}"
            + (" (killed)" if running else ""), reason)
    for rank in group.ranks:
        name = access.container(rank.node, rank.container)
        done = access.shell(rank.node, CLEAN_SCRIPT, [name, rank.shm_dir, *map(str, rank.ports)], timeout_s=120)
        evidence = " ".join(done.stdout.split())[:400]
        log("clean", f"{rank.node}: {evidence or done.stderr.strip()[:300]}", reason)
        if done.returncode != 0:
            return False, f"clean failed on {rank.node}: {evidence or done.stderr.strip()[:300]}"
    for rank in group.ranks:
        name = access.container(rank.node, rank.container)
        done = access.docker(rank.node, ["start", name], timeout_s=START_RUNNING_S)
        if done.returncode != 0:
            log("start", f"{rank.node} {name}: failed: {done.stderr.strip()[:300]}", reason)
            return False, f"docker start {name} failed on {rank.node}"
        deadline = time.monotonic() + START_RUNNING_S
        running, what = _state(access, rank.node, name)
        while not running and time.monotonic() < deadline:
            sleep(1)
            running, what = _state(access, rank.node, name)
        log("start", f"{rank.node} {name}: {what}", reason)
        if not running:
            return False, f"{rank.node} {name} did not stay running: {what}"
    deadline = time.monotonic() + group.ready_timeout_s
    started = time.monotonic()
    while True:
        down = [f"{r.node}: {w}" for r in group.ranks
                for ok, w in [_state(access, r.node, access.container(r.node, r.container))] if not ok]
        if down:  # a rank that exits while the group loads does not come back by itself (restart: no)
            why = f"a rank stopped while the group was loading: {'; '.join(down)}"
            log("wait", why, reason)
            return False, why
        ok, what = http_ok(group.health_url, settings.health_timeout_s, settings.ca_file)
        if ok:
            log("wait", f"ready after {time.monotonic() - started:.0f}s: every rank running, {group.health_url} {what}",
                reason)
            break
        if time.monotonic() > deadline:
            why = f"not ready within {group.ready_timeout_s}s: {group.health_url} {what}"
            log("wait", why, reason)
            return False, why
        sleep(min(5.0, max(0.2, settings.interval_s)))
    if group.golden_argv:
        done = subprocess.run(list(group.golden_argv), capture_output=True, text=True, timeout=900)
        verdict = (done.stdout.strip().splitlines() or [done.stderr.strip()[:300]])[-1][:300]
        log("check", f"golden check exit {done.returncode}: {verdict}", reason)
        if done.returncode != 0:
            return False, f"golden check failed: {verdict}"
    return True, ""


class Supervisor:
    def __init__(self, group: Group, access: NodeAccess, log: Log, settings: Settings, lock: DeployLock,
                 drift_check: Callable[[], list[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time) -> None:
        self.group, self.access, self.log, self.settings, self.lock = group, access, log, settings, lock
        self.drift_check = drift_check
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.restarted_at = 0.0
        """Unix time the last restart ended: golden results from before it describe the old group."""
        self.golden_note = ""
        self.golden_ignored = ""
        """The results for ranks the stack does not have, last logged (logged again only when they change)."""
        """Why the golden signal is not used now, as a key (logged when it changes), or '' while it is used."""
        self.attempts: list[float] = []
        self.failures = 0
        """Attempts since the group last served for backoff_max_s in a row: the back-off's exponent."""
        self.failing_since: float | None = None
        self.healthy_since: float | None = None
        self.restarts = 0
        self.stopped = False
        self.gave_up = False
        self.next_attempt_at: float | None = None
        """When (self.clock) the back-off running now ends; None when none runs."""
        self.last_restart: tuple[float, bool] | None = None
        """(Unix time it ended, whether it served again) of the last whole-group restart."""
        self.seen_healthy = False
        """Seen every rank running with the health probe passing since this process started: until then only a
        container Docker reports exited is a death, since health may fail for this host alone (firewall, TLS)."""
        self.unproven = ""
        """The health failure last logged while never seen healthy (logged again only when it changes)."""
        self.blind = ""
        """Why the group cannot be observed now, as last logged; '' while every node answers."""
        self.unseen = ""
        """The nodes the last observation could not ask ('' when every node answered), whatever else it found: a
        rank seen dead on one node says nothing about another node that did not answer."""
        self.last_state = ""
        """What the last observation found: ok, failing, dead or blind."""

    def observe(self) -> tuple[str, str]:
        """What can be seen now: ("dead", why) when Docker says a rank's container is not running (positive
        evidence); ("blind", why) when a node's Docker cannot be asked (SSH or Docker failing: unreachable is not
        dead, and health failures then prove nothing either); ("failing", why) when every rank runs but health, a
        Docker health check or a golden result fails; ("ok", "")."""
        state, why = self._observe()
        self.last_state = state
        return state, why

    def _observe(self) -> tuple[str, str]:
        soft: list[str] = []
        blind: list[str] = []
        dead = ""
        for rank in self.group.ranks:  # every node is asked, so a dead rank does not hide a node gone blind
            name = self.access.container(rank.node, rank.container)
            try:
                running, what = _state(self.access, rank.node, name)
            except AccessError as exc:
                blind.append(str(exc))
                continue
            if not running and not dead:
                dead = f"rank {rank.node} container {name} {what}"
            if "unhealthy" in what:
                soft.append(f"{rank.node} {name} {what}")
        self.unseen = "; ".join(blind)
        if dead:
            return "dead", dead
        if blind:
            return "blind", self.unseen
        ok, what = http_ok(self.group.health_url, self.settings.health_timeout_s, self.settings.ca_file)
        if not ok:
            soft.append(f"GET {self.group.health_url}: {what}")
        elif not self.seen_healthy:  # this host reaches the endpoint: from now on its failing is evidence
            self.seen_healthy = True
            self.log("healthy", f"every rank running and {self.group.health_url} {what}: from now on failing health "
                     f"or golden results for {self.settings.hang_s:g}s are a death")
        soft += self.golden_failures()
        return ("failing", "; ".join(soft)) if soft else ("ok", "")

    def _sight(self, blind: str) -> None:
        """One `blind` line when the supervisor loses sight of a node (or the reason changes), one when it is back."""
        if blind and blind != self.blind:
            self.log("blind", f"cannot observe the group: {blind}", "unreachable is not dead: nothing counts toward "
                     "a hang or a death until every node answers again")
        elif not blind and self.blind:
            self.log("sight", "every node answers again")
        self.blind = blind

    def probe(self) -> str | None:
        """Why the group is dead now, or None while it serves (or has not failed for hang_s yet, or cannot be
        observed, or has never been seen serving and no container has exited)."""
        state, why = self.observe()
        if state == "dead":
            self._sight(self.unseen)  # another node may still not answer: not "every node answers again"
            return why
        if state == "blind":
            self._sight(why)
            self.failing_since = None  # a hang is health failing while Docker is seen running, without a gap
            return None
        self._sight("")
        now = self.clock()
        if state == "ok":
            self.failing_since = None
            self.unproven = ""
            return None
        if not self.seen_healthy:
            if why.split(": ")[0] != self.unproven.split(": ")[0]:
                self.log("unproven", why, "not seen healthy since the supervisor started, so failing health alone "
                         "restarts nothing (only a container Docker reports exited does): is this host in "
                         "firewall.api_sources, and --ca-file given when the endpoint is TLS?")
            self.unproven = why
            return None
        soft = [why]
        if self.failing_since is None:
            self.failing_since = now
            self.log("degraded", "; ".join(soft), f"death if it lasts {self.settings.hang_s:g}s")
        if now - self.failing_since >= self.settings.hang_s:
            return f"no progress for {now - self.failing_since:.0f}s: {'; '.join(soft)}"
        return None

    def golden_failures(self) -> list[str]:
        """The DP ranks whose fresh golden result (from the watch unit) is a failure; [] when the signal is off,
        unreadable or stale (then one log line says so, and one when it is back)."""
        url = self.settings.golden_url
        if not url:
            return []
        try:
            results = read_golden(url, self.settings.health_timeout_s, self.settings.ca_file)
        except FETCH_ERRORS as exc:
            self._golden_note("unreadable", f"cannot read {url}: {failure(exc)}")
            return []
        now = self.wall()
        fresh, stale, foreign = [], [], []
        expected = self.settings.golden_ranks
        for result in results.values():
            if expected is not None and (result.dp_rank not in expected or (
                    expected[result.dp_rank] and result.node and result.node != expected[result.dp_rank])):
                foreign.append(f"DP rank {result.dp_rank} on {result.node or '?'}")
                continue
            ended = result.ended_at
            if ended is None or not math.isfinite(ended):
                stale.append(f"DP rank {result.dp_rank} ({'no' if ended is None else f'{ended} as'} round time)")
            elif ended - now > GOLDEN_SKEW_S:
                stale.append(f"DP rank {result.dp_rank} (last round {ended - now:.0f}s in the future: a clock "
                             "ahead?)")
            elif now - ended > self.settings.golden_max_age_s:
                stale.append(f"DP rank {result.dp_rank} (last round {now - ended:.0f}s ago)")
            elif ended >= self.restarted_at:
                fresh.append(result)
        if foreign and " ".join(foreign) != self.golden_ignored:
            have = ", ".join(f"{rank} on {node or 'any node'}" for rank, node in sorted((expected or {}).items()))
            self.log("golden", f"ignoring results for DP ranks the stack does not have: {', '.join(foreign)} (it "
                     f"has DP rank {have}): is {url} this stack's watch unit?")
        self.golden_ignored = " ".join(foreign)
        if stale:
            self._golden_note("stale " + " ".join(sorted(s.split(" (")[0] for s in stale)), f"stale results from "
                              f"{url}: {', '.join(stale)}; a result older than {self.settings.golden_max_age_s:g}s, "
                              f"more than {GOLDEN_SKEW_S:g}s ahead of this host's clock, or without a valid round "
                              "time is not used")
        elif len(foreign) == len(results):  # none at all, or none for this stack
            self._golden_note("empty", f"{url} has no result for this stack's DP ranks yet")
        else:
            self._golden_note("", "")
        return [f"watch unit: DP rank {r.dp_rank} on {r.node or '?'} failed its golden set ({r.failures} round(s) "
                f"in a row, last round {max(0.0, now - (r.ended_at or now)):.0f}s ago)" for r in fresh if not r.ok]

    def _golden_note(self, key: str, note: str) -> None:
        """One log line when the signal's state changes (`key`: '' while it is used), not one per probe."""
        if key != self.golden_note:
            if key:
                self.log("golden", f"signal not used: {note}")
            else:
                self.log("golden", f"signal back: reading the watch unit's results from {self.settings.golden_url}")
            self.golden_note = key

    def backoff_s(self) -> float:
        if self.failures == 0:
            return 0.0
        return float(min(self.settings.backoff_first_s * 2.0 ** (self.failures - 1), self.settings.backoff_max_s))

    def render(self) -> str:
        """The supervisor's series now (Prometheus text format 0.0.4): what `--metrics-listen` serves at each scrape
        (from its own thread: it only reads) and `--metrics-file` holds."""
        label = {"stack": self.group.stack}
        waiting = self.next_attempt_at
        values: dict[str, list[tuple[dict[str, str], float]]] = {
            "vllm_cluster_group_restarts_total": [(label, self.restarts)],
            "vllm_cluster_group_gave_up": [(label, 1 if self.gave_up else 0)],
            "vllm_cluster_group_restarts_last_hour": [(label, len(self.recent()))],
            "vllm_cluster_group_max_restarts_per_hour": [(label, self.settings.max_per_hour)],
            "vllm_cluster_group_backoff_seconds": [(label, self.backoff_s())],
            "vllm_cluster_group_next_restart_in_seconds": [
                (label, round(max(0.0, waiting - self.clock()), 3) if waiting is not None else 0)],
            "vllm_cluster_group_last_restart_timestamp_seconds": [],
            "vllm_cluster_group_last_restart_success": [],
        }
        last = self.last_restart
        if last is not None:  # no series before the first restart: 0 would read as "failed at 1970"
            values["vllm_cluster_group_last_restart_timestamp_seconds"] = [(label, round(last[0], 3))]
            values["vllm_cluster_group_last_restart_success"] = [(label, 1 if last[1] else 0)]
        from checks.api import metric_family  # here: `python -m stacks plan` loads this module without httpx

        return "\n".join(line for name, samples in values.items()
                         for line in metric_family(name, *METRICS[name], samples)) + "\n"

    def write_metrics(self) -> None:
        """The textfile (`--metrics-file`), replaced whole: node_exporter never reads half of it."""
        path = self.settings.metrics_file
        if path is None:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(self.render())
        tmp.replace(path)

    def alert(self, reason: str) -> None:
        url = self.settings.webhook
        if not url:
            self.log("alert", "no webhook configured: only the metric and this log", reason)
            return
        body = json.dumps({"stack": self.group.stack, "event": "group-supervisor-gave-up",
                           "reason": mask_secrets(reason), "attempts_last_hour": len(self.recent())}).encode()
        where = urlsplit(url).netloc.rpartition("@")[2]  # no token: not its user part, path or query
        try:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=15) as response:
                self.log("alert", f"webhook {where} answered HTTP {response.status}", reason)
        except Exception as exc:  # the give-up must finish: log this, set the metric, exit 3
            what = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else type(exc).__name__
            self.log("alert", f"webhook {where} failed: {what} (the alert was not sent)", reason)

    def give_up(self, reason: str) -> int:
        self.gave_up = True
        served = self.settings.metrics_url
        self.log("give-up", "no more restarts until a person acts (systemctl restart the supervisor after the fix)"
                 + (f"; staying up to serve vllm_cluster_group_gave_up 1 on {served}" if served else ""), reason)
        self.write_metrics()
        self.alert(reason)
        return GAVE_UP

    def recent(self) -> list[float]:
        now = self.clock()
        return [t for t in list(self.attempts) if now - t < 3600]  # a copy: the metrics thread reads it too

    def _take_lock(self) -> bool:
        """The deploy lock, without waiting; LockRefused when this user cannot open it at all."""
        try:
            return self.lock.try_acquire()
        except OSError as exc:
            raise LockRefused(f"deploy lock {self.lock.path}: cannot be opened ({exc.strerror}): give --lock a file "
                              "this user may read, or make it readable (chmod 0666; `make up` and the program "
                              "create it so)") from None

    def heal(self, reason: str) -> int | None:
        """Restart attempts until one serves (None) or the supervisor gives up (its exit code)."""
        drift_error = ""  # why drift could not run on the last try: wait and try again, no back-off
        blind = False  # the nodes could not be observed on the last try: the same
        while not self.stopped:
            if len(self.recent()) >= self.settings.max_per_hour:
                return self.give_up(f"{len(self.recent())} restarts in the last hour (limit "
                                    f"{self.settings.max_per_hour}); last: {reason}")
            wait = self.backoff_s()  # from the death seen, not the last attempt: a restart can take the load time
            if wait > 0 and not drift_error and not blind:
                self.log("backoff", f"next restart in {wait:.0f}s (attempt {len(self.recent()) + 1} this hour)",
                         reason)
                self.next_attempt_at = self.clock() + wait
                try:
                    self.sleep(wait)
                finally:
                    self.next_attempt_at = None
            waited = False
            while not self._take_lock():
                if not waited:
                    self.log("wait", f"deploy lock {self.lock.path} is held (a pulumi up is running): no restart "
                             "until it is released", reason)
                    waited = True
                self.sleep(max(0.2, self.settings.interval_s))
                if self.stopped:
                    return None
            try:
                if waited:
                    self.log("lock", f"deploy lock {self.lock.path} released: re-checking the group", reason)
                    self.failing_since = None
                    if self.probe() is None:
                        if self.last_state == "ok":
                            self.log("recovered", "serving again after the deploy lock was released: no restart",
                                     reason)
                            self.healthy_since, self.seen_healthy = self.clock(), True
                        else:
                            self.log("watch", f"after the deploy lock was released the group is {self.last_state}, "
                                     "not dead: no restart, watching again", reason)
                        return None
                if self.drift_check is not None:
                    try:
                        drift = self.drift_check()
                    except AccessError as exc:  # a node that does not answer says nothing about drift: retry
                        if str(exc) != drift_error:
                            self.log("wait", f"drift cannot run: {exc}: no restart until it runs (trying again "
                                     f"every {self.settings.interval_s:g}s)", reason)
                        drift_error = str(exc)
                        continue
                    if drift_error:
                        self.log("drift", "runs again: no drift found" if not drift else "runs again", reason)
                        drift_error = ""
                    if drift:
                        return self.give_up("refusing to restart into a drifted state: " + "; ".join(drift[:5]))
                state, seen = self.observe()  # fresh evidence: what was seen before the wait may be over
                blind = state == "blind"
                if blind:  # no restart without fresh evidence: released, then an interval, then look again
                    self._sight(seen)
                    continue
                self._sight(self.unseen)
                if state == "ok":
                    self.log("recovered", "every rank running and the health probe passes: no restart", reason)
                    self.failing_since, self.healthy_since, self.seen_healthy = None, self.clock(), True
                    return None
                if state == "failing" and not self.seen_healthy:
                    self.log("no-restart", f"every rank is running; {seen}", "not seen healthy since the "
                             "supervisor started: failing health alone restarts nothing (only a container Docker "
                             "reports exited does)")
                    self.failing_since = None
                    return None
                self.log("evidence", seen, reason)
                self.attempts.append(self.clock())
                self.failures += 1
                self.restarts += 1
                self.log("restart", f"whole group, start order {' -> '.join(r.node for r in self.group.ranks)} "
                         f"(attempt {len(self.recent())} this hour)", reason)
                try:
                    ok, why = restart_group(self.group, self.access, self.log, reason, self.settings, self.sleep)
                except AccessError as exc:  # a node stopped answering mid-restart: a failed attempt, not a crash
                    self.log("restart", f"failed: {exc}", reason)
                    ok, why = False, f"a node did not answer: {exc}"
            finally:
                self.lock.release()
                if drift_error or blind:
                    self.sleep(max(0.2, self.settings.interval_s))
            self.last_restart = (self.wall(), ok)
            self.write_metrics()
            if ok:
                self.log("healed", "the golden check passes again", reason)
                self.failing_since, self.healthy_since, self.seen_healthy = None, self.clock(), True
                self.restarted_at = self.wall()
                return None
            reason = why
        return None

    def run(self) -> int:
        golden = (f"; golden results {self.settings.golden_url} (used while younger than "
                  f"{self.settings.golden_max_age_s:g}s)" if self.settings.golden_url else "; golden results: off")
        served = f"; metrics on {self.settings.metrics_url}" if self.settings.metrics_url else ""
        self.log("start", f"watching {len(self.group.ranks)} rank(s): "
                 + ", ".join(f"{r.node}/{r.container}" for r in self.group.ranks)
                 + f"; health {self.group.health_url}{golden}; no progress after {self.settings.hang_s:g}s{served}")
        self.write_metrics()
        while not self.stopped:
            reason = self.probe()
            if reason is None:
                if self.healthy_since is None:
                    self.healthy_since = self.clock()
                if self.failures and self.clock() - self.healthy_since >= self.settings.backoff_max_s:
                    self.log("stable", f"served {self.settings.backoff_max_s:g}s in a row: back-off reset")
                    self.failures = 0
            else:
                self.healthy_since = None
                self.log("death", reason)
                try:
                    code = self.heal(reason)
                except LockRefused as exc:  # a configuration error: nothing was stopped; the unit stays down
                    self.log("stop", str(exc), "exit 2: a restart cannot run without the deploy lock")
                    return 2
                if code is not None:
                    while self.settings.metrics_url and not self.stopped:  # restarting nothing: gave_up 1 is read
                        self.sleep(max(0.2, self.settings.interval_s))
                    return code
            self.sleep(self.settings.interval_s)
        return 0
