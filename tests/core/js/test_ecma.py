"""The reconciler's JavaScript semantics (SPEC section 2): trim, numbers and JSON.parse."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from memstaged.core.js.ecma import (
    _JS_WHITESPACE_RUN,
    collapse,
    encode_json,
    is_finite_number,
    is_nonempty_string,
    is_number,
    parse_json,
    pretty,
    trim,
)
from memstaged.errors import NotJSON

#: SPEC 2: exactly the code points String.prototype.trim strips.
ECMA_TRIM = frozenset(
    [
        *range(0x09, 0x0E),  # U+0009..U+000D
        *(0x20, 0xA0, 0x1680),
        *range(0x2000, 0x200B),  # U+2000..U+200A
        *(0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF),
    ]
)
#: Code points Python's str.strip() or a Unicode "space" test would strip but JavaScript keeps.
JS_KEEPS = [0x1C, 0x1D, 0x1E, 0x1F, 0x85, 0x180E, 0x200B, 0x200C, 0x200D, 0x2060]


@pytest.mark.parametrize("cp", sorted(ECMA_TRIM), ids=lambda cp: f"U+{cp:04X}")
def test_trim_strips_each_ecmascript_whitespace(cp: int) -> None:
    """Every code point of SPEC's trim set is stripped from both ends, and only from the ends."""
    ch = chr(cp)
    assert trim(f"{ch}{ch}a{ch}b{ch}") == f"a{ch}b"
    assert trim(ch * 3) == ""
    assert not is_nonempty_string(ch)


@pytest.mark.parametrize("cp", JS_KEEPS, ids=lambda cp: f"U+{cp:04X}")
def test_trim_keeps_what_javascript_keeps(cp: int) -> None:
    """U+001C..U+001F, U+0085, U+180E, U+200B.. are not JS whitespace: a lone one is non-empty."""
    ch = chr(cp)
    assert trim(f" {ch}a{ch} ") == f"{ch}a{ch}"
    assert trim(ch) == ch
    assert is_nonempty_string(ch)
    assert split_words(f"a{ch}b c") == [f"a{ch}b", "c"]
    assert collapse(f"  a{ch}  b ") == f"a{ch} b"


def test_trim_set_is_exactly_the_ecmascript_set() -> None:
    """Over every code point (surrogates included), trim strips exactly SPEC's set, nothing more."""
    stripped = {cp for cp in range(0x110000) if trim(chr(cp)) == ""}
    assert stripped == ECMA_TRIM


def test_collapse_and_split_use_javascript_whitespace() -> None:
    """Runs of JS whitespace collapse to one space; the JS split drops empty ends."""
    assert collapse("\u3000 a \t\n b\u2028") == "a b"
    assert collapse("\x1c") == "\x1c"
    assert split_words("  one\u00a0two\u2003three  ") == ["one", "two", "three"]
    assert split_words(" \t ") == []


@pytest.mark.parametrize(
    ("value", "number", "finite"),
    [
        pytest.param(True, False, False, id="true"),
        pytest.param(False, False, False, id="false"),
        pytest.param(1, True, True, id="int-1"),
        pytest.param(0, True, True, id="int-0"),
        pytest.param(1.0, True, True, id="float-1.0"),
        pytest.param(-2.5, True, True, id="float-negative"),
        pytest.param(math.inf, True, False, id="inf"),
        pytest.param(-math.inf, True, False, id="minus-inf"),
        pytest.param(10**308, True, True, id="int-1e308-finite"),
        pytest.param(10**309, True, False, id="int-1e309-overflows"),
        pytest.param(10**399, True, False, id="int-400-digits"),
        pytest.param(-(10**399), True, False, id="int-minus-400-digits"),
        pytest.param("1", False, False, id="string-1"),
        pytest.param(None, False, False, id="null"),
        pytest.param([1], False, False, id="array"),
        pytest.param({}, False, False, id="object"),
    ],
)
def test_number_and_finite_number(value: object, number: bool, finite: bool) -> None:
    """``typeof x === "number"`` (booleans never) and finiteness as an IEEE double."""
    assert is_number(value) is number
    assert is_finite_number(value) is finite


@pytest.mark.parametrize(
    ("text", "number", "finite"),
    [
        pytest.param(b"true", False, False, id="true"),
        pytest.param(b"1", True, True, id="1"),
        pytest.param(b"1.0", True, True, id="1.0"),
        pytest.param(b"1e0", True, True, id="1e0"),
        pytest.param(b"-0", True, True, id="minus-0"),
        pytest.param(b"1e400", True, False, id="1e400"),
        pytest.param(b"-1e400", True, False, id="minus-1e400"),
        pytest.param(b"1.8e308", True, False, id="1.8e308"),
        pytest.param(b"1.7976931348623157e308", True, True, id="max-double"),
        pytest.param(b"1" + b"0" * 399, True, False, id="400-digit-integer"),
        pytest.param(b"1" + b"0" * 4999, True, False, id="5000-digit-integer"),
        pytest.param(b"1e-400", True, True, id="underflow-to-0"),
    ],
)
def test_parsed_numbers(text: bytes, number: bool, finite: bool) -> None:
    """Numbers as parsed: 1e400 and a 400-digit integer are numbers, but not finite ones."""
    value = parse_json(text).value
    assert is_number(value) is number
    assert is_finite_number(value) is finite


def test_one_forms_are_equal_to_one() -> None:
    """``1``, ``1.0`` and ``1e0`` all parse to a number equal to 1; ``true`` is not a number."""
    for text in (b"1", b"1.0", b"1e0", b"10e-1"):
        value = parse_json(text).value
        assert is_number(value)
        assert value == 1
    assert not is_number(parse_json(b"true").value)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xef\xbb\xbf{}", id="bom"),
        pytest.param(b"NaN", id="nan"),
        pytest.param(b"[NaN]", id="nan-in-array"),
        pytest.param(b"Infinity", id="infinity"),
        pytest.param(b"-Infinity", id="minus-infinity"),
        pytest.param(b'{"a": Infinity}', id="infinity-value"),
        pytest.param(b"// c\n{}", id="line-comment"),
        pytest.param(b"{} // c", id="trailing-comment"),
        pytest.param(b"/* c */ {}", id="block-comment"),
        pytest.param(b"[1,]", id="trailing-comma-array"),
        pytest.param(b'{"a":1,}', id="trailing-comma-object"),
        pytest.param(b"{'a':1}", id="single-quotes"),
        pytest.param(b"{a:1}", id="bare-key"),
        pytest.param(b"01", id="leading-zero"),
        pytest.param(b"+1", id="plus-sign"),
        pytest.param(b".5", id="leading-dot"),
        pytest.param(b"5.", id="trailing-dot"),
        pytest.param(b"0x10", id="hex"),
        pytest.param(b'"\x01"', id="raw-control-char"),
        pytest.param(b'"\\x41"', id="bad-escape"),
        pytest.param(b'"\\u12"', id="short-unicode-escape"),
        pytest.param(b"tRue", id="wrong-case-literal"),
        pytest.param(b"", id="empty"),
        pytest.param(b"   ", id="only-whitespace"),
        pytest.param(b"\x0b{}", id="vertical-tab-is-not-json-whitespace"),
        pytest.param(b"\xc2\xa0{}", id="nbsp-is-not-json-whitespace"),
        pytest.param(b"{}\x00", id="trailing-nul"),
        pytest.param(b"{} {}", id="two-values"),
        pytest.param(b"[1 2]", id="missing-comma"),
    ],
)
def test_parse_rejects_what_json_parse_rejects(data: bytes) -> None:
    """BOM, NaN, Infinity, comments, trailing commas and other non-RFC-8259 text are NotJSON."""
    with pytest.raises(NotJSON):
        parse_json(data)


@pytest.mark.parametrize(
    ("data", "value"),
    [
        pytest.param(b' \t\r\n{"a": [1, "x", null]} \n', {"a": [1, "x", None]}, id="ws"),
        pytest.param(b'"\\u2028\xe2\x80\xa9"', "\u2028\u2029", id="line-separators"),
        pytest.param(b'"\\/"', "/", id="escaped-slash"),
        pytest.param(b'"\\u0000"', "\x00", id="escaped-nul"),
        pytest.param(b'{"__proto__": 1}', {"__proto__": 1}, id="proto-key"),
        pytest.param(b'"\\ud834\\udd1e"', "\U0001d11e", id="surrogate-pair"),
        pytest.param('"caf\u00e9 \U0001f600"'.encode(), "caf\u00e9 \U0001f600", id="utf8"),
    ],
)
def test_parse_accepts_rfc_8259(data: bytes, value: Any) -> None:
    """Plain RFC 8259 JSON parses to the value JSON.parse gives."""
    assert parse_json(data).value == value


@pytest.mark.parametrize(
    ("data", "value"),
    [
        pytest.param(b'{"a": 1, "a": 2}', {"a": 2}, id="flat"),
        pytest.param(b'{"a": {"b": 1}, "a": [3]}', {"a": [3]}, id="different-types"),
        pytest.param(b'{"x": {"k": 1, "k": null}}', {"x": {"k": None}}, id="nested"),
        pytest.param(b'{"a": "\\ud800", "a": 2}', {"a": 2}, id="exotic-path"),
        pytest.param(b'{"a": 1e400, "a": 2}', {"a": 2}, id="exotic-number-path"),
    ],
)
def test_duplicate_keys_last_wins(data: bytes, value: Any) -> None:
    """Duplicate keys: the last one wins, on both parsing paths."""
    assert parse_json(data).value == value


@pytest.mark.parametrize(
    ("data", "value"),
    [
        pytest.param(b'"\\ud800"', "\ud800", id="lone-high"),
        pytest.param(b'"\\udfff"', "\udfff", id="lone-low"),
        pytest.param(b'"\\udd1e\\ud834"', "\udd1e\ud834", id="reversed-pair"),
        pytest.param(b'{"\\ud800": ["x\\udc00y"]}', {"\ud800": ["x\udc00y"]}, id="key-and-value"),
    ],
)
def test_lone_surrogate_escapes_parse(data: bytes, value: Any) -> None:
    """JSON.parse accepts lone surrogate escapes; the result is marked exotic for re-encoding."""
    parsed = parse_json(data)
    assert parsed.value == value
    assert parsed.exotic


@pytest.mark.parametrize(
    ("data", "value"),
    [
        pytest.param(b'"\xff"', "\ufffd", id="ff"),
        pytest.param(b'"\xc0\xaf"', "\ufffd\ufffd", id="overlong"),
        pytest.param(b'"\xed\xa0\x80"', "\ufffd" * 3, id="utf8-encoded-surrogate"),
        pytest.param(b'"\xe2\x82"', "\ufffd", id="truncated"),
        pytest.param(b'"\xf4\x90\x80\x80"', "\ufffd" * 4, id="above-10ffff"),
        pytest.param(b'{"a": "x\x80y"}', {"a": "x\ufffdy"}, id="stray-continuation"),
    ],
)
def test_invalid_utf8_reads_as_replacement(data: bytes, value: Any) -> None:
    """SPEC 2 v2 (issue 11 item 1): bytes are read as Node reads them, U+FFFD per maximal
    subpart, and the text can be JSON (v1 called every such file unparseable)."""
    parsed = parse_json(data)
    assert parsed.value == value
    assert parsed.text is not None and "\ufffd" in parsed.text


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{"a": 1}\x80', id="stray-byte-after-value"),
        pytest.param(b"\xff\xfe{\x00}\x00", id="utf16-le"),
    ],
)
def test_invalid_utf8_outside_strings_is_not_json(data: bytes) -> None:
    """A U+FFFD outside a string is a syntax error to JSON.parse, as any stray character."""
    with pytest.raises(NotJSON):
        parse_json(data)


@pytest.mark.parametrize(
    ("data", "depth"),
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, 100_000, id="arrays-100k"),
        pytest.param(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 100_000, id="objects-100k"),
        pytest.param(b'["\\ud800",' + b"[" * 150_000 + b"]" * 150_000 + b"]", 150_001, id="exotic"),
    ],
)
def test_deep_nesting_parses(data: bytes, depth: int) -> None:
    """Issue 10 item 15: JSON.parse has no practical nesting limit, so neither does memstaged
    (v1 refused these); the value comes back to the same depth, and encodes back to the same
    value without recursion."""
    parsed = parse_json(data)
    level, value = 0, parsed.value
    while isinstance(value, list | dict) and value:
        value = value[-1] if isinstance(value, list) else next(iter(value.values()))
        level += 1
    assert level >= depth - 1
    assert parse_json(encode_json(parsed.value, exotic=parsed.exotic)).text is None


def test_unclosed_deep_nesting_is_not_json() -> None:
    """A deep document that never closes is NotJSON, with no RecursionError."""
    with pytest.raises(NotJSON):
        parse_json(b"[" * 100_000)


def test_moderate_nesting_parses_as_json_parse_does() -> None:
    """JSON.parse has no small depth limit: 2,000 nested arrays are JSON to the reconciler."""
    assert parse_json(b"[" * 2000 + b"]" * 2000).value is not None


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(math.inf, id="inf"),
        pytest.param(-math.inf, id="minus-inf"),
        pytest.param("\ud800", id="lone-surrogate"),
        pytest.param({"\udc00key": "v\ud800"}, id="surrogate-key"),
        pytest.param(10**399, id="400-digit-int"),
        pytest.param(
            {"a": [math.inf, {"b": "\udfff", "c": None}], "d": True, "e": 1.5, "f": "é"},
            id="mixed",
        ),
        pytest.param({"nested": [[[]]], "empty": {}}, id="containers"),
    ],
)
def test_encode_json_round_trips_exotic_values(value: Any) -> None:
    """encode_json(exotic=True) writes UTF-8 JSON (inf as 1e400) that parses back to the value."""
    data = encode_json(value, exotic=True)
    data.decode("utf-8")  # strict: never a raw surrogate
    assert parse_json(data).value == value
    if value in (math.inf, -math.inf):
        assert data in (b"1e400", b"-1e400")


def test_encode_json_plain_round_trip_and_pretty() -> None:
    """A value without exotic parts round-trips on the fast path, and pretty() keeps the value."""
    value = {"a": [1, 2.5, "x", None, False], "b": {"c": "é\u2028"}, "n": 10**30}
    data = encode_json(value)
    assert parse_json(data).value == value
    assert parse_json(pretty(data)).value == value
    assert json.loads(pretty(data)) == value


def test_exotic_parse_then_encode_is_faithful() -> None:
    """A file that needs the exotic path comes back byte-equivalent in value after encoding."""
    data = b'{"x": 1e400, "y": "\\ud800", "z": [1, 2.5, "\xc3\xa9"], "w": -1e400}'
    parsed = parse_json(data)
    assert parsed.exotic
    again = parse_json(encode_json(parsed.value, exotic=parsed.exotic))
    assert again.value == parsed.value


def test_the_reason_a_text_is_not_json_does_not_depend_on_the_callers_stack() -> None:
    """A record's errors are compared with the engine's (and two quarantines of the same bytes
    must give the same record): invalid JSON nested ~900 deep was reported by ``json``'s message
    when the caller left it stack, by the iterative parser's when not (found by the fuzz test,
    seed 679537132: a record differed only in its error)."""
    import sys

    text = b"[" * 900 + b"\x00]"

    def nested(depth: int) -> str:
        if depth:
            return nested(depth - 1)
        with pytest.raises(NotJSON) as err:
            parse_json(text)
        return str(err.value)

    shallow = nested(0)
    deep = nested(sys.getrecursionlimit() - 200)
    assert shallow == deep


def test_minus_zero_inside_a_string_takes_the_fast_path() -> None:
    """Issue 23 (hot paths): ``-0`` inside a string, as in a UUID (``…-0a61…``, in a fifth of
    an agent's files), is no number: such a file is rewritten as any other. It used to be read
    as a possible integer ``-0``, and the file went through the slow parser and encoder, whose
    rewrite escapes every non-ASCII character; an integer ``-0`` still takes that path (the
    Node tests hold its value)."""
    from memstaged.core.decide import Context, Decision, decide

    def rewrite(session: str) -> bytes:
        doc = (
            '{"schemaVersion":1,"session_id":"' + session + '","project_root":"/p",'
            '"produced_at":"2026-01-01T00:00:00Z","candidates":{"lessons":[],"decisions":[],'
            '"preferences":[{"text":"caf\u00e9 \u2013 na\u00efve","source_evidence":'
            '{"lesson_candidate_marker_ids":["m"]}}]}}'
        )  # no "domain": R5 repairs it
        verdict = decide(doc.encode(), Context(project_root="/p", file_name="s.json"))
        assert verdict.decision is Decision.REPAIRED, verdict.reasons
        assert verdict.new_bytes is not None
        return verdict.new_bytes

    with_zero = rewrite("0004df49-f6cd-4155-ae57-0a61e8b2ca11")
    without = rewrite("0004df49-f6cd-4155-ae57-1a61e8b2ca11")
    assert with_zero == without.replace(b"-1a61", b"-0a61")
    assert "caf\u00e9 \u2013 na\u00efve".encode() in with_zero
    assert not parse_json(b'{"id":"a-0b","n":[-0.5,-0e1]}').exotic
    assert parse_json(b'{"n" : [ 1 ,\n-0 ] }').exotic  # the integer -0: the exact path


def split_words(text: str) -> list[str]:
    """``text.split(/\\s+/)`` without the empty strings at either end."""
    return [w for w in _JS_WHITESPACE_RUN.split(text) if w]
