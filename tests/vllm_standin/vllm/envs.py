"""Stand-in for vllm/envs.py: only the two variables serve's launch logic reads.

Mirrors vLLM 0.33.0 vllm/envs.py `_resolve_rust_cli_path` (lines 584-616) and the VLLM_USE_RUST_FRONTEND
entry (lines 1456-1458); read at attribute access, as the real module's `__getattr__` does. The wheel ships
the `vllm-rs` binary beside the package; so does this stand-in (an executable placeholder).
"""

import os


def _resolve_rust_cli_path():
    use_rust = bool(int(os.environ.get("VLLM_USE_RUST_FRONTEND", "0"))) or bool(
        int(os.environ.get("VLLM_USE_RUST_BENCH", "0")))
    raw = os.environ.get("VLLM_RUST_FRONTEND_PATH", "auto")
    if not use_rust:
        return None
    if raw.lower() in ("auto", "1", "true"):
        candidate = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm-rs")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
        raise FileNotFoundError(
            "VLLM_RUST_FRONTEND_PATH=auto but the vllm-rs binary was "
            f"not found at {candidate}. "
            "Build with setuptools-rust or set the path explicitly.")
    return raw


def __getattr__(name):
    if name == "VLLM_USE_RUST_FRONTEND":
        return bool(int(os.getenv("VLLM_USE_RUST_FRONTEND", "0")))
    if name == "VLLM_RUST_FRONTEND_PATH":
        return _resolve_rust_cli_path()
    raise AttributeError(name)
