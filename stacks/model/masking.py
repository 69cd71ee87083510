"""The one masking rule for everything a command-line program prints: `python -m stacks`, the heal tools, the
lab and every check program (pasted into the node scripts with `checks.verdict`, so standard library only).

A refusal repeats the value it refuses; when that value carries a credential (an image reference with registry
credentials, a URL whose password holds `/`, a token in `fabric.env`, `--api-key=…` in argparse's
"unrecognized arguments"), the credential is replaced by `***` and the rest stays readable.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
SHOWN = 8
"""Items of a list or mapping a message shows (errors.py cuts its repr at 6)."""

_USERINFO_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*:(?://|\\\\|/\\|\\/))[^\s@'\"<>]*@")
"""`scheme://userinfo@`: anything up to the `@` but whitespace and quotes, so a password with `/`, `?` or `#` in
it (which a URL parser would cut at the `/`) is masked whole."""
_BARE_USERINFO = re.compile(r"(?<![\w.:/@%+~=-])[\w.%+~-]+:(?![/\\])[^\s@'\"<>]+@(?!sha256:)(?=[\w\[])")
"""`user:password@registry/repo:tag`: a Docker image reference or host spec with credentials and no scheme."""
_SECRET_OPTION = re.compile(r"(?i)(--(?!assume-secret\b)(?:[\w-]*-)?(?:api-key|access-key|secret-key|private-key|"
                            r"token|secret|password|passwd|credentials?))(=|\s+)(?!-)(?!vllm-cluster:)"
                            r"(?:'[^']*'|\"[^\"]*\"|\S+)")
"""`--api-key=VALUE`, `--hf-token VALUE`: an option whose value is a secret (not `--assume-secret KEY`, which
names a key, nor `--api-key-env NAME`, which names a variable, nor `pulumi config set --secret vllm-cluster:KEY`,
whose next word is the config key the advice names)."""
_SECRET_ASSIGNMENT = re.compile(r"(?i)\b((?:[a-z0-9]+[_-])+(?:key|token|secret|password|passwd|credentials?)|"
                                r"token|secret|password|passwd)=(?:'[^']*'|\"[^\"]*\"|[^\s'\",&]+)")
"""`ORG_TOKEN=…`, `?X-Amz-Credential=…`-like pairs (not `KEY=VALUE`, a metavar)."""
_SECRET_QUERY = re.compile(r"(?i)([?&][\w.-]*(?:signature|token|key|secret|password|credential|sig)[\w.-]*=)"
                           r"[^&\s'\"#]*")
_SECRET_NAME = re.compile(r"(?i)(?:^|[_.-])(?:key|token|secret|password|passwd|credentials?|auth|signature)$")
"""A name whose value is a secret: `ORG_TOKEN`, `api_key`."""


def secret_name(name: object) -> bool:
    """Whether a variable or key of this name holds a secret by its name."""
    return isinstance(name, str) and bool(_SECRET_NAME.search(name.strip()))


def mask_secrets(text: str) -> str:
    """`text` with every credential this module knows replaced by `***`: URL userinfo (any characters up to the
    `@`), `user:password@host` without a scheme, secret-valued options and `NAME=value` pairs, signed queries."""
    text = _USERINFO_URL.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _BARE_USERINFO.sub(f"{MASK}@", text)
    text = _SECRET_OPTION.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={MASK}", text)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}{MASK}", text)


def masked(value: Any, depth: int = 0) -> Any:
    """A value as a message may show it: strings through mask_secrets, the value of a secret-named key of a
    mapping (`fabric.env: {ORG_TOKEN: …}`) replaced whole. Only what a message shows is copied (the first
    SHOWN items of each level, 4 levels), so an aliased value that is huge when expanded stays cheap."""
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict | list | tuple) and depth >= 4:
        return "…"
    if isinstance(value, dict):
        items = list(value.items())
        shown = {k: MASK if secret_name(k) and v is not None else masked(v, depth + 1) for k, v in items[:SHOWN]}
        return shown | ({"…": "…"} if len(items) > SHOWN else {})
    if isinstance(value, list | tuple):
        return [*(masked(v, depth + 1) for v in value[:SHOWN]), *(["…"] if len(value) > SHOWN else [])]
    return value
