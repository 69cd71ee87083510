"""The lab's engine images: what a rehearsal stack's image must hold (stacks/planner/rehearsal.py IMAGE_NEEDS).

A base image, made once per run by `docker import` from files of this machine (no registry, no download):
- python3 with the vLLM stand-in package (its flag table and parser registries): the argument dry run parses the
  plan's argv with it, as it would with the real image's vLLM;
- torch for the collective check's gloo all-reduce: this venv's build, with the CUDA libraries it links (PyPI's
  Linux torch is a CUDA build; it runs gloo on a CPU-only node once its libraries load), ~4 GB;
- boto3 for the weight sync (the real vllm/vllm-openai ships it), /bin/sh for the preflight's sections that run
  the image, and checks/standin.py, the OpenAI-compatible server, with tests/pd_standin.py for prefill/decode groups;
- the packages vllm-router's launcher imports (fastapi, uvicorn, aiohttp, orjson, setproctitle, ... as vLLM's image
  has them, stacks/planner/router.py): tests/router_harness.py's venv for the pinned wheel, less those the list
  below copies already (the same versions: `build_base` refuses a difference). The router's container runs
  `python3 -m vllm_router.launch_router` in the stack's image with the wheel mounted from the head.

Each engine image is the base plus one small layer (`docker commit`): the entrypoint `python3 /lab_engine.py`
(tests/lab/lab_engine.py), a build id that makes two builds differ, and optionally the wrong answer. The images
share the base's layer in the registry and on the nodes, so an image bump pulls kilobytes, as a real one that
changes only the top layers.
"""

from __future__ import annotations

import importlib.util
import subprocess
import uuid
from pathlib import Path

from tests.conftest import ROOT
from tests.docker_harness import PYTHON, SITE, build_image, shared_libraries
from tests.router_harness import router_runtime

HERE = Path(__file__).resolve().parent
SH = Path("/bin/dash")
DYNLOAD = Path("/usr/lib/python3.11/lib-dynload")
MODULES = ("torch", "torchgen", "typing_extensions", "filelock", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
           "fsspec", "boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six",
           "httpx", "httpcore", "h11", "anyio", "sniffio", "certifi", "idna", "pydantic", "pydantic_core",
           "annotated_types", "typing_inspection", "click", "pygments")
"""torch and what `import torch` imports (the collective check); boto3 and what it imports (the weight sync);
httpx and pydantic and what they import (the API check run inside an engine container, as vLLM's image has them:
a replica group's own check)."""
NATIVE_MODULES = ("_ssl", "_hashlib", "_ctypes", "_bz2", "_lzma", "_uuid")
"""Extension modules of the stdlib whose system libraries the image needs too (boto3: ssl; torch: ctypes)."""
ENTRYPOINT = 'ENTRYPOINT ["python3", "/lab_engine.py"]'


def _module_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.origin is not None and spec.origin not in ("namespace", "built-in"):
        origin = Path(spec.origin)
        return origin.parent if origin.name == "__init__.py" else origin
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]) if locations else None


def _native_libraries() -> tuple[Path, ...]:
    """The stdlib's extension modules that link a system library: `build_image` adds those libraries (ldd)."""
    return tuple(p for m in NATIVE_MODULES for p in sorted(DYNLOAD.glob(f"{m}.*.so")))


def _system_libraries(objects: list[Path], already: set[str], inside: tuple[Path, ...] = ()) -> dict[Path, str]:
    """The system libraries these shared objects link (libstdc++, libgomp, libgcc_s …), at their own paths, less
    those `already` in the image (a tar with a path twice is refused by `docker import`) and those that ship
    inside a package (site-packages, `inside`), copied with it."""
    found: dict[Path, str] = {}
    for shared in objects:
        for lib in shared_libraries(shared):
            if "site-packages" in str(lib) or any(lib.is_relative_to(d) for d in inside) or str(lib) in already:
                continue
            found[lib.resolve()] = str(lib)
            already.add(str(lib))
    return found


def _torch_system_libraries(already: set[str]) -> dict[Path, str]:
    """torch's: its CUDA libraries are in the `nvidia` package, copied whole."""
    torch = _module_dir("torch")
    if torch is None:
        return {}
    return _system_libraries([*sorted(torch.glob("_C*.so")), *sorted((torch / "lib").glob("*.so*"))], already)


SKEW: dict[str, tuple[str, str]] = {}
"""Distributions the base copies in another version than the router's venv pins: name -> (base's, pin)."""
ROUTER_SKIP = {"pip", "setuptools"}
"""What venv puts in the router's venv itself: not the launcher's."""


def router_packages(present: tuple[str, ...]) -> tuple[dict[Path, str], list[Path]]:
    """(files for the image, shared objects whose system libraries it needs): every distribution of the router's
    venv whose top-level modules the base does not copy already, with its dist-info (opentelemetry finds its
    context by its entry points), into site-packages; one the base copies in another version is recorded in
    SKEW (the lab prints it as a figure)."""
    import importlib.metadata

    python, wheel_dir = router_runtime()
    site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    files: dict[Path, str] = {}
    for dist in sorted(site.glob("*.dist-info")):
        meta = importlib.metadata.PathDistribution(dist)
        name = meta.metadata["Name"]
        tops = sorted({Path(f).parts[0] for f in (meta.files or []) if not str(f).startswith("..")}
                      - {dist.name, "__pycache__"})
        if name in ROUTER_SKIP or not tops:
            continue
        if any(t.removesuffix(".py") in present for t in tops):
            # the base's copy serves the router too; its version may differ from the router venv's pin (a fresh
            # install of this venv takes the newest idna, the pin stays), which only the image's router sees: the
            # pinned set itself runs in tests/test_pd_router.py
            SKEW.update({name: (importlib.metadata.version(name), meta.version)} if
                        importlib.metadata.version(name) != meta.version else {})
            continue
        for top in [*tops, dist.name]:
            files[site / top] = f"/{SITE}/{top}"
    objects = [*sorted(wheel_dir.rglob("*.so")), *(p for f in files for p in sorted(f.rglob("*.so*")) if f.is_dir())]
    return files, objects


def router_bytes() -> int:
    """What `router_packages` adds to the base image, in bytes (files as copied, caches included)."""
    present = tuple(m for m in MODULES if _module_dir(m) is not None)
    files, _ = router_packages(present)
    roots = [p for p in files if p.is_file()] + [f for d in files if d.is_dir() for f in d.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in roots)


def image_bytes(tag: str) -> int:
    done = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True,
                          text=True, check=True)
    return int(done.stdout.strip())


def build_base(tag: str, workdir: Path) -> str:
    """The base image `tag` in this machine's Docker engine."""
    present = tuple(m for m in MODULES if _module_dir(m) is not None)
    binaries = (SH, *_native_libraries())
    already = {str(lib) for b in (PYTHON, *binaries) for lib in [b, *shared_libraries(b)]}
    router, router_objects = router_packages(present)
    files: dict[Path, str] = {SH: "/bin/sh", ROOT / "checks" / "standin.py": "/standin.py",
                              ROOT / "tests" / "pd_standin.py": "/pd_standin.py", **_torch_system_libraries(already),
                              **router}
    files |= _system_libraries(router_objects, already, inside=(router_runtime()[1],))
    nvidia = _module_dir("nvidia")
    if nvidia is not None:  # a namespace package: copied as a folder, where torch's RPATH looks for it
        files[nvidia] = f"/{SITE}/nvidia"
    try:
        return build_image(tag, workdir, modules=present, files=files, libraries_of=binaries, changes=(ENTRYPOINT,))
    finally:  # its ~4 GB archive (build_image's name for it): Docker holds the image now
        (workdir / f"{tag.replace('/', '_').replace(':', '_')}.tar").unlink(missing_ok=True)


def build(base: str, tag: str, workdir: Path, answer: str | None = None) -> str:
    """`tag`: the base plus the entrypoint and a build id; `answer`: what every rank answers to the golden prompt
    instead of the right answer (an engine that fails the post-deploy check)."""
    extra = workdir / f"layer-{uuid.uuid4().hex[:8]}"
    extra.mkdir()
    (extra / "lab-build").write_text(f"{tag} {uuid.uuid4().hex}\n")
    if answer is not None:
        (extra / "lab-answer").write_text(answer + "\n")
    container = subprocess.run(["docker", "create", base], capture_output=True, text=True, check=True).stdout.strip()
    try:
        copies = [(HERE / "lab_engine.py", "/lab_engine.py"), *((p, f"/{p.name}") for p in sorted(extra.iterdir()))]
        for source, target in copies:
            subprocess.run(["docker", "cp", str(source), f"{container}:{target}"], capture_output=True, check=True)
        subprocess.run(["docker", "commit", "--change", ENTRYPOINT, container, tag], capture_output=True,
                       check=True)
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)
    return tag


def remove(*tags: str) -> None:
    subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)
