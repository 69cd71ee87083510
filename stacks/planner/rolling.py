"""Taking one replica group out of the front door and putting it back: the mechanism of a rolling change.

A rolling change replaces independent replica groups one at a time behind the nginx front door, so the endpoint
keeps serving with N-1 of N groups. For each group in turn: drain (its upstream servers marked `down`, nginx
reloaded, then a bounded wait until the nginx workers that held requests under the old configuration have exited,
i.e. until its in-flight requests are answered), replace its containers, check it through its own API, undrain.

nginx (open source) has no runtime API for upstreams, so the state lives in the configuration itself: each server of
a group is rendered with a trailing mark, `server "ip:port"; # vllm-cluster group:<name>`, which the scripts here
flip to `server "ip:port" down;` and back with `sed`, then `nginx -t` and `nginx -s reload`. A reload is graceful
(nginx docs, "Controlling nginx": old workers stop accepting and finish their requests), and a configuration that
fails `nginx -t` is put back unchanged, so a failed drain leaves every group serving. The scripts carry no secret:
the keys in nginx.conf are never read or printed, only the marked lines are edited.

These scripts are POSIX sh with `sed`, `grep` and `/proc` only (the nginx image has no procps), run where nginx
runs: inside the proxy container (`docker exec <proxy> sh -c …`) or, in the bench, beside a local nginx.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

GROUP_MARK = "# vllm-cluster group:"
"""What follows an upstream server line of a group; the drain and undrain scripts edit only lines ending in it."""
GROUP_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
DRAIN_BOUND_S = 600
"""How long a drain waits at most for the requests the group still serves: streamed answers of a long context
can run for minutes. Past it the change goes on and says how many nginx workers still held requests."""


def check_group_name(name: str) -> str:
    """A group name as it appears in nginx.conf, resource names and sed patterns: lowercase letters, digits, `-`."""
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
        raise ValueError(f"group name {str(name)[:40]!r}: use 1-32 lowercase letters, digits and '-', starting "
                         "with a letter, e.g. a or replica-1")
    return name


def server_suffix(group: str | None) -> str:
    """What render_nginx_conf writes after a server's `;`: the group's mark, or nothing outside groups."""
    return "" if group is None else f" {GROUP_MARK}{check_group_name(group)}"


@dataclass(frozen=True)
class NginxControl:
    """How a script reaches nginx: the configuration file it edits, the pid file of the master and the command
    words that run `nginx` there (the proxy container's `nginx`, or a local binary with `-e stderr`)."""

    conf: str
    pid: str
    nginx: tuple[str, ...] = ("nginx",)

    def words(self, *args: str, conf: str | None = None) -> str:
        return " ".join(shlex.quote(w) for w in (*self.nginx, "-c", conf or self.conf, *args))


def _sed(group: str, down: bool) -> str:
    mark = f" {GROUP_MARK}{check_group_name(group)}"  # letters, digits, ' ', '#', ':', '-': nothing BRE reads
    if down:
        return rf's/^\( *server "[^"]*"\);\({mark}\)$/\1 down;\2/'
    return rf's/^\( *server "[^"]*"\) down;\({mark}\)$/\1;\2/'


def _edit_and_reload(group: str, control: NginxControl, down: bool) -> list[str]:
    """Edit a copy, test it, then swap it in and reload; on a failed test the file is left as it was."""
    conf = shlex.quote(control.conf)
    verb = "drain" if down else "undrain"
    state = "up" if down else "down"
    before = '"' if down else '" down'
    pattern = f"{before}; {GROUP_MARK}{group}"  # the line as it is before the edit
    return [
        f"grep -q -- {shlex.quote(pattern)}\"\\$\" {conf} || "
        f"{{ echo {shlex.quote(f'{verb} {group}: no upstream server of group {group} is {state} in')} {conf}; "
        "exit 3; }",
        f"cp -p {conf} {conf}.rolling",
        f"sed -i {shlex.quote(_sed(group, down))} {conf}.rolling",
        f"if ! {control.words('-t', '-q', conf=control.conf + '.rolling')} 2>&1; then rm -f {conf}.rolling; "
        f"echo {shlex.quote(f'{verb} {group}: nginx -t refused the edited file; nothing changed')}; exit 1; fi",
        f"cat {conf}.rolling > {conf} && rm -f {conf}.rolling",
    ]


def _workers() -> str:
    """The master's worker PIDs now (children of the pid file's process), one line."""
    return ('workers() { for d in /proc/[0-9]*; do '
            '[ "$(cut -d" " -f4 "$d/stat" 2>/dev/null)" = "$master" ] && echo "${d#/proc/}"; done; }')


def drain_script(group: str, control: NginxControl, bound_s: int = DRAIN_BOUND_S) -> str:
    """Take `group` out of the upstreams and wait (at most `bound_s`) until the requests it held are answered."""
    if not 1 <= bound_s <= 86_400:
        raise ValueError(f"drain bound {bound_s}: 1-86400 seconds")
    pid = shlex.quote(control.pid)
    lines = [
        "set -u",
        f"master=$(cat {pid}) || {{ echo 'drain {group}: no nginx master (pid file {control.pid})'; exit 1; }}",
        _workers(),
        "old=$(workers)",
        *_edit_and_reload(group, control, down=True),
        control.words("-s", "reload"),
        f"deadline=$(( $(date +%s) + {bound_s} ))",
        # a reload replaces every worker: the old ones finish what they hold (in-flight requests), then exit
        'while :; do left=""; for p in $old; do [ -e "/proc/$p" ] && left="$left $p"; done',
        f'  [ -z "$left" ] && {{ echo "drain {group}: out of the upstreams, no request left in flight"; break; }}',
        f'  [ "$(date +%s)" -ge "$deadline" ] && {{ echo "drain {group}: workers$left still hold requests after '
        f'{bound_s} s; going on"; break; }}',
        "  sleep 0.2; done",
    ]
    return "\n".join(lines) + "\n"


def undrain_script(group: str, control: NginxControl, bound_s: int = 60) -> str:
    """Put `group` back into the upstreams (after its replacement passed its checks). Returns once every worker of
    the old configuration has stopped taking requests (it exited, or nginx titled it 'shutting down'): `-s reload`
    only signals the master, and until then new requests could still meet the old configuration."""
    pid = shlex.quote(control.pid)
    lines = [
        "set -u",
        f"master=$(cat {pid}) || {{ echo 'undrain {group}: no nginx master (pid file {control.pid})'; exit 1; }}",
        _workers(),
        "old=$(workers)",
        *_edit_and_reload(group, control, down=False),
        control.words("-s", "reload"),
        f"deadline=$(( $(date +%s) + {bound_s} ))",
        'while :; do left=""; for p in $old; do grep -q "shutting down" "/proc/$p/cmdline" 2>/dev/null || '
        '{ [ -e "/proc/$p" ] && left="$left $p"; }; done',
        f'  [ -z "$left" ] && {{ echo "undrain {group}: back in the upstreams"; break; }}',
        f'  [ "$(date +%s)" -ge "$deadline" ] && {{ echo "undrain {group}: nginx did not reload within {bound_s} s '
        f'(workers$left)"; exit 1; }}',
        "  sleep 0.2; done",
    ]
    return "\n".join(lines) + "\n"
