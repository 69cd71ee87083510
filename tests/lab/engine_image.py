"""The lab's engine images: what a rehearsal stack's image must hold (stacks/planner/rehearsal.py IMAGE_NEEDS).

A base image, made once per run by `docker import` from files of this machine (no registry, no download):
- python3 with the vLLM stand-in package (its flag table and parser registries): the argument dry run parses the
  plan's argv with it, as it would with the real image's vLLM;
- torch for the collective check's gloo all-reduce: this venv's build, with the CUDA libraries it links (PyPI's
  Linux torch is a CUDA build; it runs gloo on a CPU-only node once its libraries load), ~4 GB;
- boto3 for the weight sync (the real vllm/vllm-openai ships it), /bin/sh for the preflight's sections that run
  the image, and checks/standin.py, the OpenAI-compatible server.

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


def _torch_system_libraries(already: set[str]) -> dict[Path, str]:
    """The system libraries torch's shared objects link (libstdc++, libgomp …), at their own paths, less those
    `already` in the image (a tar with a path twice is refused by `docker import`); its CUDA libraries are in the
    `nvidia` package, copied whole, so only what lies outside site-packages is added."""
    torch = _module_dir("torch")
    if torch is None:
        return {}
    found: dict[Path, str] = {}
    for shared in [*sorted(torch.glob("_C*.so")), *sorted((torch / "lib").glob("*.so*"))]:
        for lib in shared_libraries(shared):
            if "site-packages" not in str(lib) and str(lib) not in already:
                found[lib.resolve()] = str(lib)
    return found


def build_base(tag: str, workdir: Path) -> str:
    """The base image `tag` in this machine's Docker engine."""
    present = tuple(m for m in MODULES if _module_dir(m) is not None)
    binaries = (SH, *_native_libraries())
    already = {str(lib) for b in (PYTHON, *binaries) for lib in [b, *shared_libraries(b)]}
    files: dict[Path, str] = {SH: "/bin/sh", ROOT / "checks" / "standin.py": "/standin.py",
                              **_torch_system_libraries(already)}
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
