"""vllm-cluster installed as a tool: the `vllm-cluster` command, `init`, the Pulumi program's entry point.

The code itself stays in the packages `stacks`, `components`, `review`, `heal`, `checks` and `policy`, installed
beside this one (docs/install.md says why: one top-level package would rename every import of a project under
active change); this package holds what only the installed tool needs, and the shipped cards as package data.
"""

__version__ = "0.1.0"
