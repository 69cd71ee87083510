"""A stand-in for the vLLM package inside a test image: the real 0.33.0 `vllm serve` flag surface, no engine.

Flags come from stacks/data/vllm-0.33.0-serve-flags.json (dumped from the real parser; see that
fixtures README); `_flags.json` beside this file overrides them (a "newer vLLM" that renamed a flag).
"""

__version__ = "0.33.0"
