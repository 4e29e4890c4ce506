"""The reconciler's JavaScript semantics that Python does not share (SPEC section 2).

The reconciler decides validity with ``String.prototype.trim``, ``typeof x === "number"`` and
``JSON.parse``; a file memstaged calls valid but the reconciler rejects is the bug memstaged exists
to end, so these rules are reproduced here exactly rather than approximated with Python built-ins
(``str.strip()`` strips U+001C..U+001F and U+0085, which JavaScript keeps; ``bool`` is an ``int``).
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, TypeGuard, TypeVar

import msgspec

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

_decoder: Final = msgspec.json.Decoder()

#: How deep a document may nest. ``JSON.parse`` has no small limit, and the interpreter's limit
#: depends on how deep the caller already is, which would let the daemon and ``--once`` disagree
#: about the same bytes; deep documents are therefore handled in a fresh thread with these fixed
#: limits, so the outcome depends on the bytes only.
DEEP_RECURSION_LIMIT: Final = 100_000
_DEEP_STACK_BYTES: Final = 1 << 30
_deep_lock = threading.Lock()
T = TypeVar("T")


def trim(text: str) -> str:
    """``String.prototype.trim``."""
    return text.strip(JS_WHITESPACE)


def collapse(text: str) -> str:
    """Collapse every run of JavaScript whitespace to one space, then trim (SPEC 3.1)."""
    return trim(_JS_WHITESPACE_RUN.sub(" ", text))


def split_words(text: str) -> list[str]:
    """``text.split(/\\s+/)`` without the empty strings at either end."""
    return [w for w in _JS_WHITESPACE_RUN.split(text) if w]


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
    """A decoded JSON value, and whether it holds values msgspec cannot encode back faithfully."""

    value: Any
    exotic: bool = False


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_int(literal: str) -> int | float:
    # JSON.parse reads every number as a double: a literal this long is +/-Infinity there.
    if len(literal) > _MAX_INT_DIGITS:
        return -math.inf if literal.startswith("-") else math.inf
    return int(literal)


def run_deep(func: Callable[..., T], *args: Any) -> T:
    """Run ``func(*args)`` in a fresh thread with a large stack and a fixed recursion limit.

    Used only after a :class:`RecursionError`: a fresh thread starts at the same depth whoever
    calls, so the same document always gets the same outcome. The limit is global to the
    interpreter, so it is raised only while the caller waits for this thread.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = func(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the caller, re-raised there
            outcome["error"] = err

    with _deep_lock:
        old_limit, old_stack = sys.getrecursionlimit(), threading.stack_size()
        threading.stack_size(_DEEP_STACK_BYTES)
        try:
            sys.setrecursionlimit(DEEP_RECURSION_LIMIT)
            worker = threading.Thread(target=target, name="memstaged-deep-json")
            worker.start()
            worker.join()
        finally:
            sys.setrecursionlimit(old_limit)
            threading.stack_size(old_stack)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def parse_json(data: bytes) -> Parsed:
    """Decode ``data`` as ``JSON.parse`` would; nesting is limited only by the bytes.

    See :func:`_parse`; a document too deep for the caller's stack is parsed again by
    :func:`run_deep`, and is :class:`NotJSON` only if it is too deep even there.
    """
    try:
        return _parse(data)
    except RecursionError:
        if threading.current_thread().name == "memstaged-deep-json":
            raise NotJSON("JSON nesting is too deep to parse") from None
        return run_deep(parse_json, data)


def _parse(data: bytes) -> Parsed:
    """Decode ``data`` as ``JSON.parse`` would after a strict UTF-8 decode.

    msgspec is the fast path. It refuses two things ``JSON.parse`` accepts: numbers beyond the
    double range (``1e400`` is Infinity in JavaScript) and lone surrogate escapes (``"\\ud800"``);
    only then the standard library parser is used, and the result is marked ``exotic`` so that
    :func:`encode_json` writes it back without loss. Raises :class:`NotJSON` with a reason.
    """
    try:
        return Parsed(_decoder.decode(data))
    except msgspec.DecodeError as fast_error:
        reason = str(fast_error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise NotJSON(f"not UTF-8 (invalid byte at offset {err.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except ValueError as err:
        # A ValueError from json carries the position; msgspec's message is kept when it is clearer.
        message = str(err) if isinstance(err, json.JSONDecodeError) else reason
        raise NotJSON(f"not JSON: {message}") from None
    return Parsed(value, exotic=True)


def _encode_exotic(value: Any, out: list[str]) -> None:
    if isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(json.dumps(key))
            out.append(":")
            _encode_exotic(item, out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode_exotic(item, out)
        out.append("]")
    elif isinstance(value, float) and not math.isfinite(value):
        out.append("1e400" if value > 0 else "-1e400")
    else:
        # json.dumps escapes lone surrogates as \\udXXX, which JSON.parse reads back unchanged.
        out.append(json.dumps(value))


def encode_json(value: Any, *, exotic: bool = False) -> bytes:
    """Encode a decoded value back to UTF-8 JSON that ``JSON.parse`` reads as the same value."""
    if not exotic:
        return msgspec.json.encode(value)
    out: list[str] = []
    _encode_exotic(value, out)
    return "".join(out).encode("utf-8")


def pretty(data: bytes) -> bytes:
    """Indent encoded JSON for people who open staging files; the reconciler does not mind."""
    return msgspec.json.format(data, indent=2) + b"\n"
