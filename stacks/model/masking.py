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

_USER = r"[^\s@/\\?#:'\"<>]*"
_PASSWORD = r":[^\s@'\"<>]*"
_USERINFO_URL = re.compile(rf"(?i)\b([a-z][a-z0-9+.-]*:(?://|\\\\|/\\|\\/))"
                           rf"(?:(?<!hf:[/\\][/\\]){_USER}(?:{_PASSWORD})?|{_USER}{_PASSWORD})@")
"""`scheme://user[:password]@`, a password with `/` whole (a URL parser reads `user:pa` as host:port); no `/` in
the user (`s3://b/p@x` is a path), and in `hf://` a password (`hf://gpt2@main` is a revision)."""
_BARE_USERINFO = re.compile(r"(?<![\w.:/@%+~=-])[\w.%+~-]+:(?![/\\])[^\s@'\"<>]+@(?!sha256:)(?=[\w\[])")
"""`user:password@registry/repo:tag`: a Docker image reference or host spec with credentials and no scheme."""
_SECRET_OPTION = re.compile(r"(?i)(--(?!assume-secret\b)(?:[\w-]*-)?(?:api-key|access-key|secret-key|private-key|"
                            r"token|secret|password|passwd|credentials?))(=|\s+)(?!--)(?!vllm-cluster:)"
                            r"(?:'[^']*'|\"[^\"]*\"|[^\s'\"]+)")
"""`--api-key=VALUE`, `--hf-token VALUE`, a value starting with one dash too: an option whose value is a secret
(up to a quote, so a message's own `'…':` stays; not `--assume-secret KEY`, which
names a key, nor `--api-key-env NAME`, which names a variable, nor `pulumi config set --secret vllm-cluster:KEY`,
whose next word is the config key the advice names)."""
_SECRET_ASSIGNMENT = re.compile(r"(?i)\b((?:[a-z0-9]+[_-])+(?:key|token|secret|password|passwd|credentials?)|"
                                r"token|secret|password|passwd)=(?:'[^']*'|\"[^\"]*\"|[^\s'\",&]+)")
"""`ORG_TOKEN=…`, `?X-Amz-Credential=…`-like pairs (not `KEY=VALUE`, a metavar)."""
_SECRET_QUERY = re.compile(r"(?i)([?&][\w.-]*(?:signature|token|key|secret|password|credential|sig)[\w.-]*=)"
                           r"[^&\s'\"#]*")
_TOKEN = re.compile(r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{8,}|"
                    r"github_pat_[A-Za-z0-9_]{8,}|glpat-[A-Za-z0-9_-]{8,}|xox[abpr]-[A-Za-z0-9-]{8,}|"
                    r"(?:AKIA|ASIA)[0-9A-Z]{16})(?![A-Za-z0-9])")
"""Token shapes anywhere (`--x=sk-…`); `hf_` at a real token's length: /data/hf_downloads is a path."""
_SECRET_NAME = re.compile(r"(?i)(?:^|[_.-])(?:key|token|secret|password|passwd|credentials?|auth|signature)$")
"""A name whose value is a secret: `ORG_TOKEN`, `api_key`."""


def secret_name(name: object) -> bool:
    """Whether a variable or key of this name holds a secret by its name."""
    return isinstance(name, str) and bool(_SECRET_NAME.search(name.strip()))


def mask_secrets(text: str) -> str:
    """`text` with every credential this module knows replaced by `***`: URL userinfo, `user:password@host`,
    secret-valued options and `NAME=value` pairs, token shapes, signed queries."""
    text = _USERINFO_URL.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _BARE_USERINFO.sub(f"{MASK}@", text)
    text = _SECRET_OPTION.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={MASK}", text)
    text = _TOKEN.sub(MASK, text)
    text = _JSON_SECRET_PAIR.sub(lambda m: f'{m.group(1)}{m.group(2)}"{MASK}"', text)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}{MASK}", text)


def mask_userinfo(text: str) -> str:
    """Only the userinfo masked (`s3://***@b/p`), before a bucket or port is read."""
    return _BARE_USERINFO.sub(f"{MASK}@", _USERINFO_URL.sub(lambda m: f"{m.group(1)}{MASK}@", text))


def has_userinfo(text: str) -> bool:
    """URL userinfo or `user:password@host` (masked or not): a URL field refuses it before parsing."""
    return bool(_USERINFO_URL.search(text) or _BARE_USERINFO.search(text))


def holds_secret(text: str) -> bool:
    """Whether mask_secrets masks anything of `text`."""
    return mask_secrets(text) != text


_JSON_SECRET_PAIR = re.compile(r'(?i)("[\w.-]*(?:key|token|secret|password|passwd|credentials?|auth|signature)")'
                               r'(\s*:\s*)"[^"]*"')
"""`"auth": "…"` inside a JSON value (an argv word holding a JSON object): the value of a secret-named key."""


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
