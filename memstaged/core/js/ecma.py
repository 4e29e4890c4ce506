"""The reconciler's JavaScript semantics that Python does not share (SPEC section 2).

The reconciler decides validity with ``String.prototype.trim``, ``typeof x === "number"`` and
``JSON.parse``; a file memstaged calls valid but the reconciler rejects is the bug memstaged exists
to end, so these rules are reproduced here exactly rather than approximated with Python built-ins
(``str.strip()`` strips U+001C..U+001F and U+0085, which JavaScript keeps; ``bool`` is an ``int``).
"""

from __future__ import annotations

import gc
import itertools
import json
import json.decoder
import math
import posixpath
import re
from typing import Any, Final, TypeGuard

import msgspec

from memstaged.core.ticks import tick
from memstaged.errors import NotJSON

#: Exactly the code points ECMAScript's WhiteSpace and LineTerminator productions name.
JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
#: For first-character checks: almost no string starts with whitespace, so most skip the trim.
JS_WHITESPACE_SET: Final = frozenset(JS_WHITESPACE)
_JS_WHITESPACE_RUN: Final = re.compile("[" + re.escape(JS_WHITESPACE) + "]+")

#: JavaScript turns an integer literal longer than this into Infinity; Python would refuse it.
_MAX_INT_DIGITS: Final = 4000
#: The integer literal ``-0`` (not ``-0.0``, ``-0e0``, ``-01``): ``JSON.parse`` reads minus zero,
#: msgspec and ``int()`` read zero. Searched only in text msgspec decoded, so valid JSON, where a
#: value ends at the text's end or before ``,``, ``]`` or ``}`` and starts at the text's start or
#: after ``[``, ``,`` or ``:`` (:func:`_has_negative_zero` looks back), with JSON's four
#: whitespace characters between: every integer ``-0`` is found. A string holding such text
#: (``"a: -0,"``) is found too, and only costs a slower parse; ``-0`` inside a UUID or a word
#: (``"…-0a61…"``, in a fifth of an agent's files) is not: the first form of this search sent
#: every such file, and every record of it, to the slow parser and encoder. The
#: pattern starts with its literal, so that the search skips ahead at C speed.
_NEGATIVE_ZERO: Final = re.compile(rb"-0(?=[ \t\n\r]*(?:[,\]}]|\Z))")
_JSON_SPACE_BYTES: Final = frozenset(b" \t\n\r")
_BEFORE_A_VALUE: Final = frozenset(b"[,:")

_decoder: Final = msgspec.json.Decoder()

#: ``String.prototype.toLowerCase`` of Node 20 (Unicode 17) where it differs from Python 3.11's
#: ``str.lower`` (Unicode 14): (first, last, shift) for letters added to Unicode since. Found by
#: comparing the two on every code point; ``tests/system/test_ecma_node.py`` keeps them compared.
_NEWER_LOWER: Final = (
    (0x1C89, 0x1C89, 1),
    (0xA7CB, 0xA7CB, -42343),
    (0xA7CC, 0xA7CC, 1),
    (0xA7CE, 0xA7CE, 1),
    (0xA7D2, 0xA7D2, 1),
    (0xA7D4, 0xA7D4, 1),
    (0xA7DA, 0xA7DA, 1),
    (0xA7DC, 0xA7DC, -42561),
    (0x10D50, 0x10D65, 32),
    (0x16EA0, 0x16EB8, 27),
)
_NEWER_LOWER_MAP: Final = {
    c: chr(c + shift) for first, last, shift in _NEWER_LOWER for c in range(first, last + 1)
}
_NEWER_UPPER: Final = re.compile("[" + "".join(chr(c) for c in _NEWER_LOWER_MAP) + "]")
#: Where Node's Unicode gives a character another casing type than Python's, for the Final_Sigma
#: rule of ``toLowerCase``: (first, last, type) with 0 neither, 1 cased, 2 case-ignorable. Found
#: by comparing ``/\p{Cased}/u`` and ``/\p{Case_Ignorable}/u`` in Node with Python's own rule.
_NEWER_CASING: Final = (
    (0x295, 0x295, 0), (0x897, 0x897, 2), (0xECE, 0xECE, 2), (0x1ACF, 0x1ADD, 2),
    (0x1AE0, 0x1AEB, 2), (0x1C89, 0x1C8A, 1), (0xA7CB, 0xA7CF, 1), (0xA7D2, 0xA7D2, 1),
    (0xA7D4, 0xA7D4, 1), (0xA7DA, 0xA7DC, 1), (0xA7F1, 0xA7F1, 2), (0x10D4E, 0x10D4E, 2),
    (0x10D50, 0x10D65, 1), (0x10D69, 0x10D6D, 2), (0x10D6F, 0x10D6F, 2), (0x10D70, 0x10D85, 1),
    (0x10EC5, 0x10EC5, 2), (0x10EFA, 0x10EFF, 2), (0x11241, 0x11241, 2), (0x113BB, 0x113C0, 2),
    (0x113CE, 0x113CE, 2), (0x113D0, 0x113D0, 2), (0x113D2, 0x113D2, 2), (0x113E1, 0x113E2, 2),
    (0x1171E, 0x1171E, 0), (0x11B60, 0x11B60, 2), (0x11B62, 0x11B64, 2), (0x11B66, 0x11B66, 2),
    (0x11DD9, 0x11DD9, 2), (0x11F00, 0x11F01, 2), (0x11F36, 0x11F3A, 2), (0x11F40, 0x11F40, 2),
    (0x11F42, 0x11F42, 2), (0x11F5A, 0x11F5A, 2), (0x13439, 0x13440, 2), (0x13447, 0x13455, 2),
    (0x1611E, 0x16129, 2), (0x1612D, 0x1612F, 2), (0x16D40, 0x16D42, 2), (0x16D6B, 0x16D6C, 2),
    (0x16EA0, 0x16EB8, 1), (0x16EBB, 0x16ED3, 1), (0x16FF2, 0x16FF3, 2), (0x1DF25, 0x1DF2A, 1),
    (0x1E030, 0x1E06D, 2), (0x1E08F, 0x1E08F, 2), (0x1E4EB, 0x1E4EF, 2), (0x1E5EE, 0x1E5EF, 2),
    (0x1E6E3, 0x1E6E3, 2), (0x1E6E6, 0x1E6E6, 2), (0x1E6EE, 0x1E6EF, 2), (0x1E6F5, 0x1E6F5, 2),
    (0x1E6FF, 0x1E6FF, 2),
)  # fmt: skip
_NEWER_CASING_MAP: Final = {
    c: kind for first, last, kind in _NEWER_CASING for c in range(first, last + 1)
}
_CAPITAL_SIGMA: Final = "\u03a3"


def trim(text: str) -> str:
    """``String.prototype.trim``."""
    return text.strip(JS_WHITESPACE)


def collapse(text: str) -> str:
    """Collapse every run of JavaScript whitespace to one space, then trim (SPEC 3.1)."""
    return trim(_JS_WHITESPACE_RUN.sub(" ", text))


def _casing(c: str) -> int:
    """0 neither, 1 cased, 2 case-ignorable, as Node's Unicode says (Final_Sigma's terms)."""
    kind = _NEWER_CASING_MAP.get(ord(c))
    if kind is not None:
        return kind
    # Python's own view, read off its Final_Sigma rule (which skips case-ignorables first).
    if (c + _CAPITAL_SIGMA).lower()[-1] == "\u03c2":
        return 1
    return 2 if ("A" + c + _CAPITAL_SIGMA).lower()[-1] == "\u03c2" else 0


def _final_sigma(text: str, at: int) -> bool:
    """Unicode's Final_Sigma: a cased letter before (case-ignorables skipped), none after."""
    i = at - 1
    while i >= 0 and _casing(text[i]) == 2:
        i -= 1
    if i < 0 or _casing(text[i]) != 1:
        return False
    i = at + 1
    while i < len(text) and _casing(text[i]) == 2:
        i += 1
    return i >= len(text) or _casing(text[i]) != 1


def to_lower(text: str) -> str:
    """``String.prototype.toLowerCase`` (full case mapping, final sigma included).

    Python's ``str.lower`` does this by an older Unicode: the letters added since are mapped here,
    and a capital sigma next to a character whose casing changed is decided by Node's tables.
    """
    if _CAPITAL_SIGMA in text and any(ord(c) in _NEWER_CASING_MAP for c in text):
        pieces = text.split(_CAPITAL_SIGMA)
        out = [pieces[0].lower()]
        at = len(pieces[0])
        for piece in pieces[1:]:
            out.append("\u03c2" if _final_sigma(text, at) else "\u03c3")
            out.append(piece.lower())
            at += 1 + len(piece)
        lowered = "".join(out)
    else:
        lowered = text.lower()
    if _NEWER_UPPER.search(lowered) is None:
        return lowered
    return _NEWER_UPPER.sub(lambda m: _NEWER_LOWER_MAP[ord(m[0])], lowered)


def utf16_length(text: str) -> int:
    """``text.length``: UTF-16 code units, two for a character outside the BMP."""
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def basename(path: str) -> str:
    """Node's ``path.posix.basename``: trailing slashes ignored, ``/`` has no last component."""
    return posixpath.basename(path.rstrip("/"))


def decode_utf8(data: bytes) -> str:
    """``fs.readFileSync(path, "utf-8")`` of these bytes: the WHATWG UTF-8 decoder.

    Each maximal subpart of an invalid sequence becomes one U+FFFD and a byte-order mark stays;
    CPython's ``"replace"`` handler replaces exactly those subparts
    (``tests/system/test_ecma_node.py`` holds it to Node on random bytes).
    """
    return data.decode("utf-8", "replace")


def is_nonempty_string(value: object) -> TypeGuard[str]:
    """A JSON string whose trimmed value is not empty.

    Checks the first character before trimming: almost every string starts with a
    non-space, and this is the engine's hottest function.
    """
    if not isinstance(value, str) or not value:
        return False
    return value[0] not in JS_WHITESPACE_SET or trim(value) != ""


def is_number(value: object) -> bool:
    """``typeof value === "number"``: JSON ``true``/``false`` decode to ``bool``, never numbers."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_finite_number(value: object) -> bool:
    """A number that is not Infinity once read as an IEEE double (``1e400``, 400-digit integers)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return False
        return True
    return False


class Parsed(msgspec.Struct, frozen=True):
    """A decoded JSON value, and whether it holds values msgspec cannot encode back faithfully.

    ``text`` is the text ``JSON.parse`` read when the bytes were not valid UTF-8 (their invalid
    sequences replaced by U+FFFD), else ``None``: the bytes are that text.
    """

    value: Any
    exotic: bool = False
    text: str | None = None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_int(literal: str) -> int | float:
    # JSON.parse reads every number as a double: a literal this long is +/-Infinity there.
    if len(literal) > _MAX_INT_DIGITS:
        return -math.inf if literal.startswith("-") else math.inf
    if literal == "-0":
        return -0.0  # minus zero, as JSON.parse reads it; a repair writes it back as -0.0
    return int(literal)


def _has_negative_zero(data: bytes) -> bool:
    """Whether valid JSON ``data`` may hold the integer ``-0`` (see :data:`_NEGATIVE_ZERO`)."""
    for found in _NEGATIVE_ZERO.finditer(data):
        at = found.start() - 1
        while at >= 0 and data[at] in _JSON_SPACE_BYTES:  # linear in all: the whitespace runs
            at -= 1  # looked back over end at each match's own "-0", so no two overlap
        if at < 0 or data[at] in _BEFORE_A_VALUE:
            return True
    return False


def parse_json(data: bytes, *, deep_array_as_text: bool = False) -> Parsed:
    """``JSON.parse(fs.readFileSync(path, "utf-8"))`` of ``data``; raises :class:`NotJSON`.

    The bytes are decoded as Node decodes them (:func:`decode_utf8`), and nesting is limited
    only by their size. msgspec is the fast path. It refuses what ``JSON.parse`` accepts in three
    cases: numbers beyond the double range (``1e400`` is Infinity in JavaScript), lone surrogate
    escapes (``"\\ud800"``) and deep nesting, and it reads the integer ``-0`` as zero where
    ``JSON.parse`` reads minus zero; then the standard library's parser is used, or for
    a document nested deeper than it can recurse, :func:`_parse_iterative`. Such a value is marked
    ``exotic`` so that :func:`encode_json` writes it back without loss.

    With ``deep_array_as_text`` (the engine's choice: such a file is no staging file), an array
    nested more than :data:`_DEEP` deep comes back as its text, a :class:`msgspec.Raw`
    (:func:`_is_deep_array`: decoded, it took 80 times its size).
    """
    try:
        value = _decoder.decode(data)
    except msgspec.DecodeError as fast_error:
        reason = str(fast_error)
    except RecursionError:
        reason = "nested too deep for msgspec"
    else:
        if b"-0" not in data or not _has_negative_zero(data):
            return Parsed(value)
        # msgspec read an integer -0 as 0: a repair would write 0 where JSON.parse reads -0
        # . The standard library's parser below keeps it (_parse_int).
        del value
        reason = "minus zero"
    text = decode_utf8(data)
    replaced = None if "\ufffd" not in text or text.encode("utf-8") == data else text
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        if deep_array_as_text and _is_deep_array(text):  # no rule accepts it: its text will do
            raw = msgspec.Raw(text.strip(" \t\n\r").encode("utf-8", "surrogatepass"))
            return Parsed(raw, exotic=True, text=replaced)
        value = _parse_iterative(text)
    except ValueError as err:
        if not isinstance(err, json.JSONDecodeError):
            raise NotJSON(f"not JSON: {reason}") from None
        # The reason is the iterative parser's, whichever parser failed first: json's depends on
        # how much stack the caller left it, and a record's errors must not (they are compared,
        # and a re-quarantine of the same bytes must give the same record).
        try:
            _parse_iterative(text)
        except NotJSON as same:
            raise same from None
        raise NotJSON(f"not JSON: {err}") from None
    return Parsed(value, exotic=True, text=replaced)


_JSON_SPACE: Final = re.compile(r"[ \t\n\r]*")
_JSON_SPACE_CHARS: Final = frozenset(" \t\n\r")
_JSON_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
#: Brackets and spaces: one character class, so that the regular expression engine keeps no
#: state per bracket (a repeated group kept about 120 bytes per level: 60 times a deep file).
_JSON_OPEN_ARRAYS: Final = re.compile(r"[\[ \t\n\r]+")
#: A key without escapes or control characters, with the colon and spaces around it.
_JSON_SIMPLE_KEY: Final = re.compile(r'[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*')
_LITERALS: Final = (("true", True), ("false", False), ("null", None))
#: The iterative parser reports progress (:func:`memstaged.core.ticks.tick`) every 4,096 values.
_TICK_MASK: Final = 4095


def _skip_space(text: str, pos: int) -> int:
    if pos < len(text) and text[pos] in _JSON_SPACE_CHARS:
        return _JSON_SPACE.match(text, pos).end()  # type: ignore[union-attr]
    return pos


def _fail(what: str, pos: int) -> NotJSON:
    return NotJSON(f"not JSON: {what} at char {pos}")


def _string(text: str, pos: int) -> tuple[str, int]:
    """The string whose opening quote is at ``pos``, and the position after it."""
    try:
        found: tuple[str, int] = json.decoder.scanstring(text, pos + 1, True)  # type: ignore[attr-defined]
        return found
    except ValueError as err:
        raise NotJSON(f"not JSON: {err}") from None


def _key(text: str, pos: int) -> tuple[str, int]:
    """``"key" :`` at ``pos`` (spaces skipped), and the position of the value after it."""
    simple = _JSON_SIMPLE_KEY.match(text, pos)
    if simple is not None:
        return simple[1], simple.end()
    pos = _skip_space(text, pos)
    if pos >= len(text) or text[pos] != '"':
        raise _fail("expected a key", pos)
    key, pos = _string(text, pos)
    pos = _skip_space(text, pos)
    if pos >= len(text) or text[pos] != ":":
        raise _fail("expected ':'", pos)
    return key, _skip_space(text, pos + 1)


def _scalar_at(text: str, pos: int) -> tuple[Any, int]:
    """A string, number or literal at ``pos``, and the position after it."""
    c = text[pos]
    if c == '"':
        return _string(text, pos)
    if c == "-" or "0" <= c <= "9":
        match = _JSON_NUMBER.match(text, pos)
        if match is None:
            raise _fail("bad number", pos)
        literal = match[0]
        value = float(literal) if match[1] or match[2] else _parse_int(literal)
        return value, match.end()
    for word, constant in _LITERALS:
        if text.startswith(word, pos):
            return constant, pos + len(word)
    raise _fail("unexpected character", pos)


#: A document that is an array nested deeper than this is kept as its text (:func:`_is_deep_array`).
_DEEP: Final = 100_000


def _is_deep_array(text: str) -> bool:
    """Whether ``text`` is JSON whose value is an array nested more than :data:`_DEEP` deep.

    Such a document is no staging file whatever it holds (SPEC 3: the file is an object), so
    the engine needs only to know that it is JSON, and the text to put in its record: decoded,
    it took 80 times its size (a Python list per level). So it is checked here with a byte per
    open container and nothing built; anything else (an object, a shallower array, not JSON at
    all) is left to :func:`_parse_iterative`, which answers as before. Whether a document is
    kept as text depends on its text only, never on the stack the caller left.
    """
    end = len(text)
    pos = _skip_space(text, 0)
    if pos >= end or text[pos] != "[":
        return False
    open_kinds = bytearray()  # b"[" or b"{" per open container
    deepest = 0
    steps = 0
    try:
        while True:
            steps += 1
            if not steps & _TICK_MASK:
                tick()
            if pos >= end:
                return False
            c = text[pos]
            if c == "[":
                run = _JSON_OPEN_ARRAYS.match(text, pos)
                assert run is not None
                open_kinds.extend(b"[" * text.count("[", pos, run.end()))
                deepest = max(deepest, len(open_kinds))
                pos = run.end()
                if pos < end and text[pos] == "]":
                    open_kinds.pop()
                    pos += 1
                else:
                    continue
            elif c == "{":
                pos = _skip_space(text, pos + 1)
                if pos < end and text[pos] == "}":
                    pos += 1
                else:
                    pos = _key(text, pos)[1]
                    open_kinds.append(ord("{"))
                    deepest = max(deepest, len(open_kinds))
                    continue
            else:
                pos = _scalar_at(text, pos)[1]
            while True:  # a value is complete: a comma, or containers closing
                pos = _skip_space(text, pos)
                if not open_kinds:
                    return pos == end and deepest > _DEEP
                kind = open_kinds[-1]
                c = text[pos] if pos < end else ""
                if c == ",":
                    pos = _skip_space(text, pos + 1) if kind == ord("[") else _key(text, pos + 1)[1]
                    break
                if c != ("]" if kind == ord("[") else "}"):
                    return False
                open_kinds.pop()
                pos += 1
    except NotJSON:
        return False


def _parse_iterative(text: str) -> Any:
    """``JSON.parse`` without recursion, for documents nested deeper than Python's stack allows.

    The cyclic garbage collector is paused meanwhile: a parse creates no cycles, and collections
    triggered by a million new containers would each walk all of them again.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_stack(text)
    finally:
        if enabled:
            gc.enable()


def _parse_stack(text: str) -> Any:
    """The work of :func:`_parse_iterative`.

    A stack of open containers, each with the key awaiting its value (``None`` in an array),
    replaces the call stack; strings are read by the standard library's own string scanner.
    Raises :class:`NotJSON` like :func:`parse_json`.
    """
    stack: list[tuple[Any, str | None]] = []
    end = len(text)
    pos = _skip_space(text, 0)
    for steps in itertools.count(1):
        if not steps & _TICK_MASK:
            tick()  # an 8 MiB document is millions of values: the watchdog hears from us
        # -- one value at pos; a container that opens here is pushed and its first value read
        if pos >= end:
            raise _fail("unexpected end of text", pos)
        value: Any
        if text[pos] == "[":
            run = _JSON_OPEN_ARRAYS.match(text, pos)
            assert run is not None
            depth, pos = text.count("[", pos, run.end()), run.end()
            stack.extend(([], None) for _ in range(depth))
            if pos >= end or text[pos] != "]":
                continue
            value, pos = stack.pop()[0], pos + 1
        elif text[pos] == "{":
            pos = _skip_space(text, pos + 1)
            if pos < end and text[pos] == "}":
                value, pos = {}, pos + 1
            else:
                key, pos = _key(text, pos)
                stack.append(({}, key))
                continue
        else:
            value, pos = _scalar_at(text, pos)
        # -- the value is complete: hand it to its container, closing those that end here
        while True:
            pos = _skip_space(text, pos)
            if not stack:
                if pos != end:
                    raise _fail("extra data", pos)
                return value
            container, awaiting = stack[-1]
            if awaiting is None:
                container.append(value)
            else:
                container[awaiting] = value
            c = text[pos] if pos < end else ""
            if c == ",":
                if awaiting is None:
                    pos = _skip_space(text, pos + 1)
                else:
                    key, pos = _key(text, pos + 1)
                    stack[-1] = (container, key)
                break
            if c != ("]" if awaiting is None else "}"):
                raise _fail("expected ',' or a closing bracket", pos)
            stack.pop()
            value, pos = container, pos + 1


def _scalar(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "1e400" if value > 0 else "-1e400"
    # json.dumps escapes lone surrogates as \\udXXX, which JSON.parse reads back unchanged.
    return json.dumps(value)


def _encode_iterative(value: Any) -> bytes:
    """UTF-8 JSON of any decoded value, at any depth, without recursion.

    Writes what msgspec cannot: Infinity (as ``1e400``), lone surrogates (as escapes), and values
    nested deeper than its recursion limit. A :class:`msgspec.Raw` is copied in as it is.
    """
    out: list[str] = []
    pieces: list[bytes] = []
    # Work items: a value to write, or a literal text (a separator or a closing bracket).
    todo: list[tuple[bool, Any]] = [(True, value)]
    while todo:
        is_value, item = todo.pop()
        if not is_value:
            out.append(item)
            continue
        if isinstance(item, dict):
            out.append("{")
            todo.append((False, "}"))
            entries = list(item.items())
            for i in range(len(entries) - 1, -1, -1):
                key, member = entries[i]
                todo.append((True, member))
                todo.append((False, ("," if i else "") + json.dumps(key) + ":"))
        elif isinstance(item, list):
            out.append("[")
            todo.append((False, "]"))
            for i in range(len(item) - 1, -1, -1):
                todo.append((True, item[i]))
                if i:
                    todo.append((False, ","))
        elif isinstance(item, msgspec.Raw):
            pieces.append("".join(out).encode("utf-8"))
            pieces.append(bytes(item))
            out.clear()
        else:
            out.append(_scalar(item))
    pieces.append("".join(out).encode("utf-8"))
    return b"".join(pieces)


def encode_json(value: Any, *, exotic: bool = False) -> bytes:
    """Encode a decoded value back to UTF-8 JSON that ``JSON.parse`` reads as the same value."""
    if not exotic:
        try:
            return msgspec.json.encode(value)
        except RecursionError:
            pass  # nested deeper than msgspec goes: written below, without recursion
    return _encode_iterative(value)


def pretty(data: bytes) -> bytes:
    """Indent encoded JSON for people who open staging files; the reconciler does not mind."""
    return msgspec.json.format(data, indent=2) + b"\n"
