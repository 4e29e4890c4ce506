"""Text that is safe to put on a terminal: control characters escaped, file names reversible.

A staging file's name is bytes (SPEC 6), and both names and contents come from whoever writes to
``staging/``. Printed raw, an ESC in a name clears the screen or sets the window title, a newline
fakes a second log line, and a right-to-left override turns ``exe.json`` around. So everything
memstaged prints for a person goes through one of two functions:

* :func:`name` for file names and paths, which must stay exact: a name that needs no escaping is
  printed as it is; any other is quoted git-style (``"caf\\xe9.json"``), with ``\\`` and ``"``
  escaped inside the quotes, so that the shown text gives the bytes back and a quoted name cannot
  be mistaken for a plain one (a plain name never starts with ``"``: one that does is quoted).
* :func:`text` for free text (reasons, summaries, a candidate's content): the same escapes, no
  quotes; it is read, not copied back.

A byte that is not UTF-8 reaches Python as a lone surrogate U+DC80..U+DCFF (``surrogateescape``):
it is shown as ``\\xNN``, the byte it stands for. The JSON sinks need none of this: JSON escapes
control characters itself, and keeps such a name as a ``\\udcNN`` escape that reads back to the
same string (see :mod:`memstaged.log.reader`).
JSON escapes only the controls below U+0020, though: what ``--json`` prints (it reaches terminals
too) goes through :func:`json_line`, which writes DEL, the C1 controls, bidi controls and
U+2028/U+2029 as ``\\uXXXX`` too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import IO, Final

_SHORT: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", '"': '\\"'}
#: Format characters that reorder or hide text: bidi embeddings, overrides and isolates.
_BIDI: Final = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape_char(char: str, quoted: bool) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if char in _SHORT and (quoted or char not in '\\"'):
        return _SHORT[char]
    if code < 0x20 or code == 0x7F:  # \xNN below 0x80 is a character, above it a raw byte
        return f"\\x{code:02x}"
    # Imported here: its tables are 0.9 MB of a daemon's RSS, for a character that is rare.
    import unicodedata

    if char in _BIDI or unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp", "Cf", "Co", "Cn"):
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return char


def _escaped(value: str, quoted: bool) -> str:
    return "".join(
        c if (c.isprintable() and (not quoted or c not in '\\"')) else _escape_char(c, quoted)
        for c in value
    )


def text(value: object) -> str:
    """``value`` as text with every control, format or undecodable character escaped."""
    string = value if isinstance(value, str) else str(value)
    if string.isprintable():  # C speed: true exactly when nothing needs escaping
        return string
    return _escaped(string, quoted=False)


def name(value: object) -> str:
    """A file name or path as it can be shown and copied back: as it is, or quoted git-style."""
    string = value if isinstance(value, str) else str(value)
    if string.isprintable() and not string.startswith('"'):
        return string
    return '"' + _escaped(string, quoted=True) + '"'


#: What JSON may hold raw in a string but a terminal may act on: DEL, the C1 controls (U+009B is
#: a one-character CSI to some terminals), bidi controls, and the line and paragraph separators.
_JSON_UNSAFE: Final = re.compile(
    "[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]"
)


#: What a file that is not a regular one is, in words (``stat.S_IFMT`` of its mode).
_KINDS: Final = {
    0o010000: "a FIFO",
    0o140000: "a socket",
    0o020000: "a character device",
    0o060000: "a block device",
    0o040000: "a directory",
    0o120000: "a symbolic link",
}


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a directory`` ...: what a mode that is not a regular file's names."""
    return _KINDS.get(mode & 0o170000, "not a regular file")


def json_line(encoded: str) -> str:
    """A JSON text with those characters written as ``\\uXXXX`` escapes: the same JSON value,
    and nothing a terminal would act on when ``--json`` goes to one (SPEC 6). They can only be
    inside strings (JSON outside strings is ASCII), so the escape is always valid there."""
    if encoded.isascii() and "\x7f" not in encoded:
        return encoded
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m[0]):04x}", encoded)


#: R5 adds a category that was absent: the least telling repair, so it is named last.
_QUIET_RULES: Final = frozenset({"R5"})


def repairs(items: Sequence[Mapping[str, object]], shown: int = 3) -> str:
    """The repairs of a decision on one line, by rule: ``R1 at candidates.lessons[0].triggers;
    R5 at candidates.preferences, candidates.domain``.

    Each rule is named with at most ``shown`` places (``(+N more)``), and R5 last: a file that
    lacked three categories and a lesson's triggers says R1 first, instead of hiding it behind
    the three R5s ("repaired lines on a TTY don't say which repair"). Escaped.
    """
    try:
        key = tuple((item.get("rule"), item.get("where")) for item in items)
        return _repairs_of(key, shown)  # the same repairs recur from file to file: a cache
    except TypeError:  # a hand-edited log with a list where a rule was: not hashable
        return _repairs_of_items(items, shown)


@functools.lru_cache(maxsize=1024)
def _repairs_of(key: tuple[tuple[object, object], ...], shown: int) -> str:
    return _repairs_of_items([{"rule": rule, "where": where} for rule, where in key], shown)


def _repairs_of_items(items: Sequence[Mapping[str, object]], shown: int) -> str:
    places: dict[str, list[str]] = {}
    for item in items:
        places.setdefault(str(item.get("rule")), []).append(str(item.get("where")))
    parts = []
    for rule in sorted(places, key=lambda r: r in _QUIET_RULES):  # stable: first seen first
        where = places[rule]
        more = f" (+{len(where) - shown} more)" if len(where) > shown else ""
        parts.append(f"{rule} at {', '.join(where[:shown])}{more}")
    return text("; ".join(parts))


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal; a closed or detached one is not (``isatty`` raises)."""
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False
