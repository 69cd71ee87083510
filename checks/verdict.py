"""The result every check prints: one human line with the evidence, or JSON, and a fixed exit code."""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from stacks.model.masking import has_userinfo, mask_secrets, mask_userinfo

EXIT = {"pass": 0, "fail": 1, "cannot-run": 2, "inconclusive": 2, "not-run": 0}
"""`not-run`: a check a rehearsal stack does not run by design (it needs a GPU); its line starts `NOT RUN` and says
why, and it exits 0 so the deploy goes on."""
REHEARSAL = "the stack declares no GPUs (vllm-cluster:rehearsal: true)"
"""Why a GPU-only check or section prints NOT RUN on a rehearsal stack (docs/rehearsal.md)."""
LOG_TIMEOUT_S = 120
"""`docker logs` of an engine container; the evidence checks' outer timeout is longer (components/check_commands)."""
THINKING_KWARGS = ("thinking", "enable_thinking", "reasoning_effort")
"""How a request turns reasoning on and off, as the model card says (stacks/planner/model_cards.py
THINKING_KWARG_BY_PARSER): a chat template kwarg, or gpt-oss's reasoning effort (it always reasons). The API and
prefill/decode checks both send it."""


@dataclass
class Verdict:
    check: str
    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    next_step: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT[self.status]

    @property
    def label(self) -> str:
        """What the line starts with: PASS, FAIL, CANNOT-RUN, INCONCLUSIVE or NOT RUN."""
        return "NOT RUN" if self.status == "not-run" else self.status.upper()

    def line(self) -> str:
        text = f"{self.label} {self.check}: {self.summary}"
        if self.evidence:
            text += " | evidence: " + "; ".join(self.evidence)
        if self.next_step and self.status != "pass":
            text += f" | next step: {self.next_step}"
        return text


@dataclass
class Section:
    """One part of a multi-part check (preflight's gpu, hca, …)."""

    name: str
    ok: bool | None
    evidence: list[str]
    next_step: str | None = None
    not_run: str | None = None
    """Why the section was not run by design (a GPU-only section on a rehearsal stack); it neither passes nor fails,
    and the verdict line says `NOT RUN <section>: <why>`."""


def rehearsal_section(name: str, why: str) -> Section:
    """A section a rehearsal stack does not run: `why` says what it would have done."""
    return Section(name, None, [], None, f"{REHEARSAL}: {why}")


def combine(check: str, sections: list[Section]) -> Verdict:
    """Fail if any section failed, cannot-run if none failed but one did not run, else pass. The summary names
    every section by outcome (failed, not run with the reason, passed), so a short line hides nothing. Sections
    not run by design (`Section.not_run`) follow as `NOT RUN <section>: <why>`; when no other section ran, the
    verdict is not-run (exit 0)."""
    declined = [s for s in sections if s.not_run]
    if declined:
        tail = "; ".join(f"NOT RUN {s.name}: {s.not_run}" for s in declined)
        ran = [s for s in sections if not s.not_run]
        if not ran:
            return Verdict(check, "not-run", f"no section ran; {tail}",
                           details={s.name: {"ok": None, "not_run": s.not_run} for s in declined})
        verdict = combine(check, ran)
        verdict.summary += f"; {tail}"
        verdict.details.update({s.name: {"ok": None, "not_run": s.not_run} for s in declined})
        return verdict
    failed = [s for s in sections if s.ok is False]
    not_run = [s for s in sections if s.ok is None]
    passed = [s for s in sections if s.ok is True]
    details = {s.name: {"ok": s.ok, "evidence": s.evidence, "next_step": s.next_step} for s in sections}
    groups = [(failed, "failed", False), (not_run, "not run", True), (passed, "passed", False)]
    summary = "; ".join(f"{len(group)} {label}: " + ", ".join(f"{s.name} ({_reason(s)})" if why else s.name
                                                             for s in group)
                        for group, label, why in groups if group)
    shown = failed + not_run if failed else sections
    evidence = [f"{s.name}: {e}" for s in shown for e in s.evidence]
    steps = "; ".join(s.next_step for s in failed + not_run if s.next_step) or None
    if failed:
        return Verdict(check, "fail", summary, evidence, steps, details)
    if not_run:
        return Verdict(check, "cannot-run", summary, evidence, steps, details)
    return Verdict(check, "pass", f"all {len(sections)} section(s) passed: " + ", ".join(s.name for s in sections),
                   evidence, None, details)


def _reason(section: Section) -> str:
    text = section.evidence[0] if section.evidence else "no reason recorded"
    return text if len(text) <= 100 else text[:97] + "..."


mask_credentials = mask_secrets
"""The last guard on what a check prints: the one masking rule of every program (stacks/model/masking.py)."""


def missing_extra(missing: ModuleNotFoundError, name: str, program: str) -> None:
    """A check program started without its `[checks]` extra (httpx, pydantic): one line naming the package and the
    interpreter, exit 2, no traceback. Imported instead of run (`name` is not `__main__`: a heal tool's probe of
    what this venv can run), the ImportError is raised as it was."""
    if name != "__main__":
        raise missing
    print(f"{program}: cannot run: needs {missing.name}, which {sys.executable} cannot import: pip install "
          "'vllm-cluster[checks]' into this venv", file=sys.stderr)
    sys.exit(2)


def one_line(text: str) -> str:
    """`text` with its control characters escaped (`\\n`, `\\x1b`): a value holding a newline cannot print a second,
    forged verdict line, nor a terminal escape."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def emit(verdict: Verdict, as_json: bool) -> int:
    """Print the verdict (credentials masked, one line) and return its exit code."""
    if as_json:
        print(mask_credentials(json.dumps(asdict(verdict) | {"exit_code": verdict.exit_code}, ensure_ascii=False)))
    else:
        print(mask_credentials(one_line(verdict.line())))
    sys.stdout.flush()
    return verdict.exit_code


def read_log(container: str | None, log_file: str) -> str:
    """A container's `docker logs` (stdout and stderr), a log file, or stdin for '-'; OSError when unreadable."""
    if container:
        try:
            done = subprocess.run(["docker", "logs", container], capture_output=True, text=True,
                                  timeout=LOG_TIMEOUT_S)
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise OSError(f"docker logs failed: {exc}") from exc
        return done.stdout + done.stderr
    if log_file == "-":
        return sys.stdin.read()
    with open(log_file, encoding="utf-8", errors="replace") as handle:
        return handle.read()


# --- arguments --------------------------------------------------------------------------------------------------
# One set of argument types for every check program and `python -m stacks` subcommand: a bad value exits 2 with
# one line naming the flag, the value (a URL's credentials masked) and what works; never a traceback or a verdict
# on a nonsensical argument. Standard library only: this module is pasted into the scripts the nodes run.

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Docker's container name rule (`[a-zA-Z0-9][a-zA-Z0-9_.-]+`, daemon/names), at most 128 characters."""
_CHECK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
"""The stack's `model.served_name` rule (stacks/model/field_types.py ServedModelName), which the program passes."""
_OPTION_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A vLLM option value that is a name (stacks/model/field_types.py ParserName): fp8_e4m3, deepseek_v41."""
_IMAGE_REF = re.compile(r"(?:[A-Za-z0-9.-]+(?::[0-9]{1,5})?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                        r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                        r"(?:@sha256:[0-9a-f]{64})?")
"""Docker's reference grammar (distribution/reference): [host[:port]/]path[:tag][@sha256:digest]."""
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
"""A node's name in the stack (`nodes[].name`) or a host name label."""
MAX_ARG_CHARS = 4096


class ArgumentProblem(argparse.ArgumentTypeError):
    """A value an argument type refuses: the message says what works."""


def shown(value: str, limit: int = 80) -> str:
    """`value` as a message may print it: credentials and queries of a URL masked, control characters escaped,
    long values cut."""
    text = mask_secrets(mask_url(value))
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return repr(text)


def mask_url(value: str) -> str:
    """A URL's userinfo and query masked (`https://***@host/path?***`); anything else as it is."""
    text = mask_userinfo(value)
    if "://" in text and "?" in text:
        text = text.split("?", 1)[0] + "?***"
    return text


def _refuse(value: str, what: str) -> ArgumentProblem:
    return ArgumentProblem(f"{shown(value)}: {what}")


def _text(value: str) -> str:
    if len(value) > MAX_ARG_CHARS:
        raise _refuse(value, f"longer than {MAX_ARG_CHARS} characters")
    return value


def printable_line(value: str) -> str:
    """Free text that lands in a command or an evidence line: one printable line."""
    if len(value) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise argparse.ArgumentTypeError(f"{shown(value)}: one printable line of at most 1024 characters")
    return value


def integer(low: int, high: int, what: str = "") -> Callable[[str], int]:
    """An int in [low, high]."""
    def parse(value: str) -> int:
        try:
            number = int(_text(value).strip(), 10)
        except ValueError:
            raise _refuse(value, f"not a whole number; {low} to {high}{what}") from None
        if not low <= number <= high:
            raise _refuse(value, f"out of range; {low} to {high}{what}")
        return number
    parse.__name__ = "integer"
    return parse


def count(high: int = 1_000_000) -> Callable[[str], int]:
    """A count of things that must exist: at least 1."""
    return integer(1, high)


def port(value: str) -> int:
    """A TCP/UDP port: 1 to 65535."""
    return integer(1, 65535, " (a TCP port)")(value)


def url_port(url: str, port_number: int | None) -> None:
    """The port of a URL in 1-65535 (a URL parser may keep 99999 or 0); the refusal names the URL, masked."""
    if port_number is not None and not 1 <= port_number <= 65535:
        raise _refuse(url, f"port {port_number} out of range; a TCP port 1 to 65535, e.g. http://10.30.8.1:8030")


def number(low: float, high: float, unit: str = "", low_open: bool = True) -> Callable[[str], float]:
    """A finite float above `low` (or at it with low_open=False) and at most `high`: NaN and inf refused."""
    def parse(value: str) -> float:
        try:
            got = float(_text(value).strip())
        except ValueError:
            got = math.nan
        ok = math.isfinite(got) and (got > low if low_open else got >= low) and got <= high
        if not ok:
            above = "more than" if low_open else "at least"
            raise _refuse(value, f"a finite number {above} {low:g} and at most {high:g}{unit}")
        return got
    parse.__name__ = "number"
    return parse


def seconds(high: float, low: float = 0.0, low_open: bool = True) -> Callable[[str], float]:
    """A duration: finite, positive (or >= low), bounded, so no wait is endless or a busy loop."""
    return number(low, high, " seconds", low_open)


def port_range(value: str) -> tuple[int, int]:
    """LOW-HIGH, both ports, LOW <= HIGH."""
    low, sep, high = _text(value).partition("-")
    try:
        if not sep:
            raise ValueError
        pair = (port(low), port(high))
    except (ValueError, argparse.ArgumentTypeError):
        raise _refuse(value, "not LOW-HIGH with two ports 1-65535, e.g. 32768-60999") from None
    if pair[0] > pair[1]:
        raise _refuse(value, f"inverted: LOW {pair[0]} is above HIGH {pair[1]}; e.g. {pair[1]}-{pair[0]}")
    return pair


def unicast_ip(value: str) -> str:
    """One host's IP address (v4 or v6): not unspecified, broadcast, multicast or a network with a prefix."""
    try:
        address = ipaddress.ip_address(_text(value).strip())
    except ValueError:
        raise _refuse(value, "not an IP address; one host's address, e.g. 10.0.0.1 or fd00::1") from None
    broadcast = address.version == 4 and address == ipaddress.IPv4Address("255.255.255.255")
    if address.is_unspecified or address.is_multicast or broadcast:
        raise _refuse(value, "not one host's address (unspecified, broadcast or multicast); e.g. 10.0.0.1")
    return str(address)


def label(value: str) -> tuple[str, str]:
    """A container label KEY=VALUE: a key of letters, digits and . _ / -, a value without control characters."""
    key, sep, rest = _text(value).partition("=")
    if not sep or not _LABEL_KEY.fullmatch(key) or _CONTROL.search(rest):
        raise _refuse(value, "not KEY=VALUE (a key of letters, digits, . _ / -; a printable value), e.g. "
                             "vllm-cluster.stack=prod")
    return key, rest


def optional_label(value: str) -> tuple[str, str] | None:
    """A label, or '' for none."""
    return label(value) if value else None


def container_name(value: str) -> str:
    """A Docker container name: letters, digits and _ . - , starting with a letter or digit."""
    if not _CONTAINER.fullmatch(_text(value)):
        raise _refuse(value, "not a container name (letters, digits, _ . -, starting with a letter or digit)")
    return value


def check_name(value: str) -> str:
    """The check's name in its verdict line."""
    if not _CHECK_NAME.fullmatch(_text(value)):
        raise _refuse(value, "not a check name (letters, digits, _ . : -, at most 64)")
    return value


def served_name(value: str) -> str:
    """The model name clients send (vLLM's --served-model-name): 1-128 of A-Z a-z 0-9 . _ : / @ + -."""
    if not _SERVED_NAME.fullmatch(_text(value)):
        raise _refuse(value, "not a served model name (1-128 of A-Z a-z 0-9 . _ : / @ + -, no spaces), e.g. "
                             "DeepSeek-V4.1-Flash")
    return value


def option_word(value: str) -> str:
    """A vLLM option value that is one name (a dtype, a parser): what goes into an argv or a memory table."""
    if not _OPTION_WORD.fullmatch(_text(value)):
        raise _refuse(value, "not a vLLM value name (1-64 of A-Z a-z 0-9 _ . -), e.g. fp8 or auto")
    return value


def image_ref(value: str) -> str:
    """A Docker image reference, '' for none: repository[:tag][@sha256:digest], nothing a shell would split."""
    if value and (len(value) > 512 or not _IMAGE_REF.fullmatch(value)):
        raise _refuse(value, "not an image reference (repository[:tag][@sha256:<64 hex>], lower-case repository, "
                             "no spaces), e.g. vllm/vllm-openai:v0.33.0")
    return value


def node_names(value: str) -> list[str]:
    """A comma list of node names in order, repeats allowed (one per DP rank: node1,node1,node2,node2)."""
    words = [w.strip() for w in _text(value).split(",")]
    if not all(_NODE_NAME.fullmatch(w) for w in words):
        raise _refuse(value, "not a comma list of node names (letters, digits, _ . -), e.g. node1,node2")
    return words


def env_name(value: str) -> str:
    """An environment variable's name ('' for none)."""
    if value and not _ENV_NAME.fullmatch(_text(value)):
        raise _refuse(value, "not an environment variable name (letters, digits, _), e.g. VLLM_API_KEY")
    return value


def path(value: str) -> str:
    """A file system path: not empty, no control characters (a newline would split a log line or a command)."""
    if not _text(value) or _CONTROL.search(value) or "\x00" in value:
        raise _refuse(value, "not a path: empty or holds control characters")
    return value


def optional_path(value: str) -> str:
    return path(value) if value else value


def abs_path(value: str) -> str:
    """An absolute path."""
    if not path(value).startswith("/"):
        raise _refuse(value, "must be an absolute path, e.g. /models/my-model")
    return value


def optional_abs_path(value: str) -> str:
    return abs_path(value) if value else value


def url_path(value: str) -> str:
    """An absolute URL path that cannot change where a request goes: starts with one '/', no '\\', '@' before
    the path, whitespace, control characters, query or fragment."""
    if (not _text(value).startswith("/") or value.startswith("//") or _CONTROL.search(value)
            or any(c in value for c in " \t\\#?") or len(value) > 1024):
        raise _refuse(value, "not an absolute URL path: one leading '/', then no whitespace, '\\', '?' or '#' "
                             "(e.g. /metrics)")
    return value


def listed(item: Callable[[str], Any], choices: Sequence[str] = (), empty_ok: bool = True
           ) -> Callable[[str], list[Any]]:
    """A comma list of `item` (or of `choices`); empty items dropped; no repeats."""
    def parse(value: str) -> list[Any]:
        words = [w.strip() for w in _text(value).split(",") if w.strip()]
        if choices:
            unknown = [w for w in words if w not in choices]
            if unknown:
                raise _refuse(value, f"unknown {', '.join(unknown[:3])}; a comma list of {', '.join(choices)}")
        if not words and not empty_ok:
            raise _refuse(value, "empty; at least one " + (f"of {', '.join(choices)}" if choices else "value"))
        if len(set(words)) != len(words):
            raise _refuse(value, "names an item twice")
        return [item(w) for w in words]
    parse.__name__ = "list"
    return parse


def http_origin(value: str) -> str:
    """http(s)://HOST[:PORT] with nothing after it and no credentials (the value is masked in the refusal)."""
    text = _text(value)
    authority = text.split("://", 1)[-1].split("/", 1)[0]
    if has_userinfo(text) or "@" in authority:
        raise _refuse(value, "carries credentials; give http(s)://HOST[:PORT] and the key through its "
                             "environment variable")
    try:
        parts = urllib.parse.urlsplit(text)
        port_number = parts.port
    except ValueError:
        parts, port_number = None, 0
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port_number == 0
            or parts.path not in ("", "/") or _CONTROL.search(text) or any(c in text for c in "?#\\ \t")):
        raise _refuse(value, "not http(s)://HOST[:PORT] (no path, query or credentials), e.g. "
                             "http://10.0.0.1:8000")
    return text.rstrip("/")


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word[len(flag) + 1:]
    return None


def argument_message(message: str) -> str:
    """argparse's `argument --flag: 'value': why` as `--flag 'value': why`."""
    return re.sub(r"^argument (\S+): (?=')", r"\1 ", message).removeprefix("argument ")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The words of `argv` that look like options and that no parser on the way (`parser`, then the chosen
    subcommand's) knows, without their values; a word after `--` or a negative number is not one."""
    known, unknown = set(parser._option_string_actions), []
    for word in argv:
        if word == "--":
            break
        subs = _subparsers(parser)
        if word in subs:
            parser = subs[word]
            known |= set(parser._option_string_actions)
        elif word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-\d[\d.]*", word):
            flag = word.split("=", 1)[0]
            if flag not in known:
                unknown.append(flag)
    return unknown


def with_unknown_options(parser: argparse.ArgumentParser, message: str, argv: Sequence[str]) -> str:
    """argparse stops at a missing required argument before it reports unknown options: name both."""
    if not message.startswith("the following arguments are required"):
        return message
    unknown = unknown_options(parser, argv)
    return message + (f"; unrecognized arguments: {' '.join(unknown)}" if unknown else "")


class CheckParser(argparse.ArgumentParser):
    """argparse for the check programs: a bad argument prints `CANNOT-RUN <name>: bad argument: …` once on stdout
    (with --json: one JSON verdict there, and the line on stderr for the person) and exits 2. `check` is the
    verdict's name when --name is not given or not a name."""

    def __init__(self, *args: Any, check: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--api-key=SECRET` must not be taken as `--api-key-env` and echoed
        super().__init__(*args, **kwargs)
        self.check = check or (self.prog.split()[-1].rsplit(".", 1)[-1] if self.prog else "check")
        self.argv: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        if not self.argv:
            self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:
        argv = self.argv or sys.argv[1:]
        name = _flag_value(argv, "--name") or ""
        name = name if _CHECK_NAME.fullmatch(name) else str(self.get_default("name") or self.check)
        message = argument_message(message)
        message = with_unknown_options(self, message, argv)
        emit(Verdict(name, "cannot-run", f"bad argument: {message}", next_step=f"{self.prog} --help"),
             "--json" in argv)
        if "--json" in argv:  # stdout is one JSON document for a program; the person gets the line on stderr
            print(mask_credentials(one_line(f"{self.prog}: bad argument: {message}")), file=sys.stderr)
        raise SystemExit(2)
