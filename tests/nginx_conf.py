"""nginx's own config tokenizer, ported for the tests: what directives, arguments and blocks nginx would read.

A line-by-line port of `ngx_conf_read_token` (nginx src/core/ngx_conf_file.c): whitespace separates words; `;`
ends a directive and `{` opens a block, both also right after a word; `}` closes a block only where a word may
start; `#` starts a comment only where a word may start; `"…"` and `'…'` are one word, after which a space, `;`,
`{` or `)` must follow; a backslash takes the next character with it (and `\\"`, `\\'`, `\\\\`, `\\t`, `\\r`,
`\\n` are unescaped in the word); `${` inside a word is part of a variable, not a block.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class NginxSyntaxError(ValueError):
    pass


@dataclass
class Directive:
    name: str
    args: list[str]
    block: list[Directive] | None = None
    line: int = 0

    def shape(self, in_map: bool = False) -> tuple[object, ...]:
        """Name, number of arguments and the shape of the block: the structure, without the values. Inside a
        `map` block the first word of an entry is a value (the string matched), not a directive name."""
        name = "<map entry>" if in_map else self.name
        inner = None if self.block is None else tuple(d.shape(self.name == "map") for d in self.block)
        return (name, len(self.args), inner)


@dataclass
class _State:
    text: str
    pos: int = 0
    line: int = 1
    stack: list[list[Directive]] = field(default_factory=list)


_SPACE = " \t\r\n"


def _unescape(raw: str) -> str:
    out, i = [], 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw):
            nxt = raw[i + 1]
            if nxt in "\"'\\":
                out.append(nxt)
                i += 2
                continue
            if nxt in "trn":
                out.append({"t": "\t", "r": "\r", "n": "\n"}[nxt])
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _read_directive(st: _State) -> tuple[str, list[str], int]:
    """Words up to the end of one directive: ("ok" | "block" | "done" | "eof", words, line)."""
    words: list[str] = []
    need_space = False
    last_space = True
    sharp_comment = False
    variable = False
    quoted = False
    s_quoted = d_quoted = False
    start = st.pos
    start_line = st.line
    text = st.text
    while True:
        if st.pos >= len(text):
            if words or not last_space:
                raise NginxSyntaxError(f"unexpected end of file, expecting \";\" or \"}}\" (line {st.line})")
            return "eof", words, start_line
        ch = text[st.pos]
        st.pos += 1
        if ch == "\n":
            st.line += 1
            sharp_comment = False
        if sharp_comment:
            continue
        if quoted:
            quoted = False
            continue
        if need_space:
            if ch in _SPACE:
                last_space, need_space = True, False
                continue
            if ch == ";":
                return "ok", words, start_line
            if ch == "{":
                return "block", words, start_line
            if ch == ")":
                last_space, need_space = True, False
            else:
                raise NginxSyntaxError(f"unexpected {ch!r} (line {st.line})")
        if last_space:
            start = st.pos - 1
            start_line = st.line
            if ch in _SPACE:
                continue
            if ch in ";{":
                if not words:
                    raise NginxSyntaxError(f"unexpected {ch!r} (line {st.line})")
                return ("block" if ch == "{" else "ok"), words, start_line
            if ch == "}":
                if words:
                    raise NginxSyntaxError(f"unexpected \"}}\" (line {st.line})")
                return "done", words, start_line
            if ch == "#":
                sharp_comment = True
                continue
            if ch == "\\":
                quoted, last_space = True, False
                continue
            if ch == '"':
                start += 1
                d_quoted, last_space = True, False
                continue
            if ch == "'":
                start += 1
                s_quoted, last_space = True, False
                continue
            if ch == "$":
                variable, last_space = True, False
                continue
            last_space = False
        else:
            if ch == "{" and variable:
                continue
            variable = False
            if ch == "\\":
                quoted = True
                continue
            if ch == "$":
                variable = True
                continue
            found = False
            if d_quoted:
                if ch == '"':
                    d_quoted, need_space, found = False, True, True
            elif s_quoted:
                if ch == "'":
                    s_quoted, need_space, found = False, True, True
            elif ch in _SPACE or ch in ";{":
                last_space, found = True, True
            if found:
                words.append(_unescape(text[start:st.pos - 1]))
                if ch == ";":
                    return "ok", words, start_line
                if ch == "{":
                    return "block", words, start_line
                found = False


def parse(text: str) -> list[Directive]:
    """The directive tree nginx would build (before any module looks at the values)."""
    st = _State(text)
    root: list[Directive] = []
    stack = [root]
    while True:
        kind, words, line = _read_directive(st)
        if kind == "eof":
            if len(stack) != 1:
                raise NginxSyntaxError("unexpected end of file, expecting \"}\"")
            return root
        if kind == "done":
            if len(stack) == 1:
                raise NginxSyntaxError(f"unexpected \"}}\" (line {line})")
            stack.pop()
            continue
        directive = Directive(words[0], words[1:], [] if kind == "block" else None, line)
        stack[-1].append(directive)
        if kind == "block":
            assert directive.block is not None
            stack.append(directive.block)


def walk(tree: list[Directive], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Directive]]:
    """Every directive with the names of the blocks around it."""
    out = []
    for d in tree:
        out.append((path, d))
        if d.block is not None:
            out += walk(d.block, (*path, d.name))
    return out
