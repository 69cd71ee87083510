"""Grafana's admin password made the stack's, on an existing database too.

Grafana reads `GF_SECURITY_ADMIN_PASSWORD__FILE` only when it creates its database: a container replaced because
`grafana_admin_password` changed keeps the old password in `/var/lib/grafana/grafana.db` (a host directory). So
after every new Grafana container this check, run on the monitoring node, reads the password file Pulumi
uploaded into the container (`docker exec NAME cat FILE`: the secret never appears on a command line), logs in
through Grafana's HTTP API (`GET /api/user` with basic auth) and, when the login is refused, sets it with
Grafana's own CLI (`grafana cli admin reset-admin-password --password-from-stdin`, inside the container, on its
database) and logs in again. PASS only when Grafana accepts the stack's password.
"""

from __future__ import annotations

import base64
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from checks.verdict import (
    CheckParser,
    Verdict,
    abs_path,
    check_name,
    container_name,
    emit,
    http_origin,
    path,
    seconds,
)

RESET = ["grafana", "cli", "--homepath", "/usr/share/grafana", "admin", "reset-admin-password",
         "--password-from-stdin"]
"""Grafana's CLI, in the official image (its working directory and GF_PATHS_* are the server's)."""


def _status(url: str, user: str | None = None, password: str | None = None, timeout_s: float = 10.0) -> int:
    """The HTTP status of GET url (0 when nothing answers)."""
    request = urllib.request.Request(url)
    if user is not None and password is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return 0


def _docker(docker: str, args: list[str], stdin: str | None = None, timeout_s: float = 120.0
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([docker, *args], input=stdin, capture_output=True, text=True, timeout=timeout_s,
                          check=False)


def check(name: str, container: str, url: str, user: str, password_file: str, wait_s: float, docker: str
          ) -> Verdict:
    try:
        read = _docker(docker, ["exec", container, "cat", password_file])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Verdict(name, "cannot-run", f"cannot run {docker}: {type(exc).__name__}", [],
                       "run it on the monitoring node, where docker reaches the Grafana container")
    password = read.stdout.rstrip("\r\n")
    if read.returncode != 0 or not password or "\n" in password:
        return Verdict(name, "cannot-run", f"cannot read the admin password file {password_file} in {container}",
                       [read.stderr.strip()[:200]] if read.stderr.strip() else [],
                       "pulumi up uploads it into the Grafana container (grafana_admin_password, one line)")
    deadline = time.monotonic() + wait_s
    while _status(f"{url}/api/health") != 200:
        if time.monotonic() >= deadline:
            return Verdict(name, "fail", f"Grafana does not answer at {url}/api/health", [f"waited {wait_s:g} s"],
                           f"docker logs {container}")
        time.sleep(1.0)
    if _status(f"{url}/api/user", user, password) == 200:
        return Verdict(name, "pass", f"Grafana accepts the stack's admin password for {user!r}",
                       ["GET /api/user 200"])
    reset = _docker(docker, ["exec", "-i", container, *RESET], stdin=password + "\n")
    after = _status(f"{url}/api/user", user, password)
    evidence = [f"grafana cli admin reset-admin-password exit {reset.returncode}", f"GET /api/user {after}"]
    if reset.returncode != 0 or after != 200:
        if reset.stderr.strip():
            evidence.append(reset.stderr.strip().splitlines()[-1][:200])
        return Verdict(name, "fail", f"Grafana still refuses the stack's admin password for {user!r}", evidence,
                       f"docker exec -it {container} grafana cli admin reset-admin-password (by hand), then "
                       "pulumi up again")
    return Verdict(name, "pass", f"Grafana's admin password for {user!r} set to the stack's (its database kept "
                   "the previous one)", evidence)


def main(argv: Sequence[str] | None = None) -> int:
    p = CheckParser(prog="grafana_password", description=__doc__)
    p.add_argument("--name", default="grafana-admin-password", type=check_name)
    p.add_argument("--container", required=True, type=container_name, help="the Grafana container")
    p.add_argument("--url", required=True, type=http_origin, help="where Grafana listens, http://HOST:PORT")
    p.add_argument("--user", default="admin", type=container_name, help="GF_SECURITY_ADMIN_USER")
    p.add_argument("--password-file", default="/etc/grafana/admin_password", type=abs_path,
                   help="inside the container (GF_SECURITY_ADMIN_PASSWORD__FILE)")
    p.add_argument("--wait-s", type=seconds(3_600, low_open=False), default=300.0)
    p.add_argument("--docker", default="docker", type=path, help="the docker client")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    return emit(check(args.name, args.container, args.url, args.user, args.password_file, args.wait_s, args.docker),
                args.json)


if __name__ == "__main__":
    raise SystemExit(main())
