"""The lab's front-door image: this machine's nginx (Debian's, from `make services`) as an image, by `docker import`.

Production runs `api.proxy.image` (the official nginx image by default), which the lab cannot pull. Debian's nginx
differs in one way that matters to the generated config: its stream module (the connection limit in front of TLS)
is a dynamic module, which the official image builds in. The image's `nginx` is therefore a two-line wrapper that
loads the module through `-g` (read before the config file) and runs the real binary: the config the program
uploads, the container's command and its `nginx -t` health check stay exactly as a real deployment's.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from tests.docker_harness import shared_libraries
from tests.nginx_harness import NGINX, STREAM_MODULE

SH = Path("/bin/dash")
RM = Path("/bin/rm")
WRAPPER = f"""#!/bin/sh
# Debian's stream module is a dynamic one (the official nginx image builds it in): load it, then the real nginx.
load='load_module {STREAM_MODULE};'
if [ "$1" = -g ]; then shift; g="$1"; shift; exec /usr/sbin/nginx.debian -g "$load $g" "$@"; fi
case " $* " in *" -g "*) echo "lab nginx wrapper: put -g first" >&2; exit 2;; esac
exec /usr/sbin/nginx.debian -g "$load" "$@"
"""
"""`nginx -g 'daemon off;'` (the container's command) and `nginx -t -q` (its health check) both pass through."""
ETC = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
"""nginx's workers run as its built-in user and group (nobody, nogroup on Debian) when the config names none."""
DIRECTORIES = ("tmp", "proc", "sys", "dev", "etc/nginx", "var/run", "var/cache/nginx", "var/log/nginx",
               "var/lib/nginx", "bin", "usr/sbin")


def _add_text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def build(tag: str, workdir: Path) -> str:
    """The image `tag` in this machine's Docker engine: nginx, its stream module, /bin/sh and rm, their libraries."""
    nginx = Path(NGINX).resolve()
    module = Path(STREAM_MODULE)
    if not module.exists():
        raise RuntimeError(f"{module} is missing: `make services` installs Debian's nginx with libnginx-mod-stream")
    archive = workdir / "lab-nginx.tar"
    with tarfile.open(archive, "w") as tar:
        for directory in DIRECTORIES:
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        libraries = [lib for binary in (nginx, module, SH, RM) for lib in shared_libraries(binary)]
        for lib in dict.fromkeys(libraries):
            tar.add(lib.resolve(), arcname=str(lib).lstrip("/"))
        tar.add(nginx, arcname="usr/sbin/nginx.debian")
        tar.add(module, arcname=str(module).lstrip("/"))
        tar.add(SH, arcname="bin/sh")
        tar.add(RM, arcname="bin/rm")
        _add_text(tar, "usr/sbin/nginx", WRAPPER, mode=0o755)
        for name, text in ETC.items():
            _add_text(tar, name, text)
    try:
        subprocess.run(["docker", "import", str(archive), tag], check=True, capture_output=True)
    finally:
        archive.unlink(missing_ok=True)
    return tag
