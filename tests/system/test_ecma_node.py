"""memstaged's JavaScript semantics against Node.js itself (SPEC 2 and 3.1, issue 11 items 1, 3).

One ``node`` process serves the module. Seeded random inputs: byte strings for
``fs.readFileSync(path, "utf-8")``, strings for ``trim``, ``toLowerCase``, ``length`` and
``path.posix.basename``, JSON texts for ``JSON.parse``, lesson texts for SPEC 3.1's keyword topic.
Each mismatch is printed with the input and both answers.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
from support.node_oracle import Node, compare

from memstaged.core.js.ecma import (
    JS_WHITESPACE,
    basename,
    decode_utf8,
    parse_json,
    to_lower,
    trim,
    utf16_length,
)
from memstaged.core.repair import keyword_topic
from memstaged.errors import NotJSON

#: Characters where JavaScript and Python part ways, or that the rules name.
SPECIAL = (
    JS_WHITESPACE
    + "\x1c\x1d\x1e\x1f\x85\u180e\u200b"  # whitespace to Python only, or to neither
    + "ΣσςΑἈᾼİIıiẞßŉǅǈﬃ"  # noqa: RUF001 - final sigma, dotted I, expansions, title case
    + "\u1c89\ua7cb\ua7cc\ua7dc\U00010d50\U00016ea0"  # upper case letters newer than Python's
    + "\U0001f600\U00010400\ud800\udc00\udbff"  # astral, lone surrogates
    + "/.-_`*#>[](){}:;,!?\\|<=+~$%^&0123456789'\"@"
    + "aZéÉÇçØøÆæΩ中文"
)


def _random_text(rng: random.Random, limit: int = 12) -> str:
    out = []
    for _ in range(rng.randint(0, limit)):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(SPECIAL))
        elif r < 0.8:
            out.append(rng.choice("abcdefghij ABCDEFG  "))
        else:
            cp = rng.randint(0, 0x10FFFF)
            out.append(chr(cp))
    # A high and a low surrogate side by side are one character in JavaScript; as JSON.parse
    # gives them to Python, they are one character here too.
    text: str = json.loads(json.dumps("".join(out)))
    return text


def _random_bytes(rng: random.Random) -> bytes:
    pieces = []
    for _ in range(rng.randint(0, 10)):
        r = rng.random()
        if r < 0.3:
            pieces.append(bytes([rng.randint(0, 255)]))
        elif r < 0.6:
            encoded = chr(
                rng.choice(
                    (
                        rng.randint(0x80, 0x7FF),
                        rng.randint(0x800, 0xFFFF),
                        rng.randint(0x10000, 0x10FFFF),
                    )
                )
            ).encode("utf-8", "surrogatepass")
            pieces.append(encoded[: rng.randint(0, len(encoded))])  # often truncated
        elif r < 0.8:
            pieces.append(
                bytes(
                    rng.choice(
                        (
                            b"\xed\xa0\x80",
                            b"\xc0\x80",
                            b"\xe0\x80\x80",
                            b"\xf0\x80\x80\x80",
                            b"\xf4\x90\x80",
                            b"\xf5\x80",
                            b"\xef\xbb\xbf",
                            b"\xc2",
                            b"\xe2\x82",
                            b"\xf0\x9f\x98",
                            b"\x80\x80",
                        )
                    )
                )
            )
        else:
            pieces.append(rng.choice((b"a", b"{", b'"', b"\x00", b"\x7f")))
    return b"".join(pieces)


def _mutated_json(rng: random.Random) -> bytes:
    doc = {
        "a": [1, -0.5, 1e300, "x\u2028", None, True, {"b": []}],
        "s": "caf\u00e9 \\ud800",
        "n": rng.choice((1, 10**30, 0)),
    }
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
    text = text.replace('"\\\\ud800"', '"\\ud800"')
    chars = list(text)
    for _ in range(rng.randint(0, 3)):
        where = rng.randint(0, len(chars))
        choice = rng.random()
        if choice < 0.4 and chars:
            del chars[min(where, len(chars) - 1)]
        else:
            chars.insert(
                where,
                rng.choice(
                    [
                        *list(',:[]{}"\\ 0-1eE.tnf\t\n\r\x0b\x00'),
                        "\ufeff",
                        "NaN",
                        "1e400",
                        "//",
                        "\\u",
                    ]
                ),
            )
    data = "".join(chars).encode("utf-8", "surrogatepass")
    if rng.random() < 0.2:
        data = data.replace(b"x", b"\xff", 1)
    if rng.random() < 0.1:
        data = b"[" * 3000 + data + b"]" * 3000
    return data


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One Node.js for the whole module."""
    js = Node()
    yield js
    js.close()


def test_utf8_decoding_agrees_with_node(node: Node) -> None:
    """Issue 11 item 1: 5,000 random byte strings (truncated, overlong, surrogate and out-of-range
    sequences, BOMs) decode as Node's ``toString("utf-8")`` does: U+FFFD per maximal subpart."""
    rng = random.Random(8)
    inputs = [_random_bytes(rng) for _ in range(5000)]
    inputs += [b"\xef\xbb\xbf{}", b"\xed\xa0\x80", b"\xf4\x8f\xbf\xbf\xf4\x90"]
    found = compare(node, "utf8", inputs, decode_utf8, raw=True)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("op", "ours"),
    [("trim", trim), ("lower", to_lower), ("length", utf16_length), ("basename", basename)],
)
def test_string_functions_agree_with_node(node: Node, op: str, ours: object) -> None:
    """Issue 11 item 1: 5,000 random strings (every ECMAScript whitespace, Python-only whitespace,
    final sigma, newer Unicode letters, astral characters, lone surrogates, slashes) give the same
    ``trim``, ``toLowerCase``, ``length`` and ``path.posix.basename`` on both sides."""
    rng = random.Random(len(op))
    inputs = [_random_text(rng) for _ in range(5000)]
    inputs += ["", "/", "//", "a/", "/a//", "  /x/  ", "ΑΣ", "ΑΣ Σ", "İ", "\u1c89"]
    assert callable(ours)
    found = compare(node, op, inputs, ours)
    assert found == [], "\n".join(found)


def test_keyword_topic_agrees_with_node(node: Node) -> None:
    """SPEC 3.1 step 3 computed in JavaScript and by memstaged on 3,000 random lesson texts."""
    rng = random.Random(31)
    words = [
        "Use",
        "the",
        "Foo-bar",
        "2things",
        "ÇA",
        "Σίσυφος",
        "ΌΣ",
        "İstanbul",
        "x\U0001f600",
        "\U0001f600\U0001f600",
        "mustn't",
        "_init_",
        "HTTP/2",
        "a.b.c",
        "über",
        "ﬃx",
    ]
    inputs = []
    for _ in range(3000):
        picked = [
            rng.choice(words) if rng.random() < 0.6 else _random_text(rng, 6)
            for _ in range(rng.randint(0, 8))
        ]
        inputs.append(rng.choice((" ", "\n", "\u3000", "\t")).join(picked))
    found = compare(node, "keyword", inputs, keyword_topic)
    assert found == [], "\n".join(found)


def _parses(data: bytes) -> bool:
    try:
        parse_json(data)
    except NotJSON:
        return False
    return True


def test_json_parse_accepts_what_node_accepts(node: Node) -> None:
    """Issue 11 item 1: 3,000 mutated JSON texts (BOM, NaN, comments, trailing commas, raw control
    characters, lone surrogate escapes, invalid UTF-8, 3,000-deep nesting) parse in memstaged
    exactly when ``JSON.parse(fs.readFileSync(path, "utf-8"))`` parses them."""
    rng = random.Random(2)
    inputs = [_mutated_json(rng) for _ in range(3000)]
    found = compare(node, "parses", inputs, _parses, raw=True)
    assert found == [], "\n".join(found)
    assert 0 < sum(map(_parses, inputs)) < len(inputs)


def test_json_parse_million_levels(node: Node) -> None:
    """Issue 10 item 15, issue 11 item 1: a million nested arrays (2 MB) and a million nested
    objects parse, as in Node, with no RecursionError; a deep one a bracket short fails on both."""
    depth = 1_000_000
    arrays = b"[" * depth + b"]" * depth
    objects = b'{"a":' * depth + b"1" + b"}" * depth
    short = b"[" * 100_000 + b"]" * (100_000 - 1)
    inputs = [arrays, objects, short]
    found = compare(node, "parses", inputs, _parses, raw=True)
    assert found == [], "\n".join(found)
    assert [_parses(x) for x in inputs] == [True, True, False]


#: Number literals whose value a parser can get subtly wrong: minus zero written four ways, zero
#: with an exponent, upper-case exponents, beyond the double range either way, below its smallest
#: subnormal, integers beyond 2^53, a 4,001-digit integer, and minus zero in containers.
NUMBER_LITERALS = [
    "-0",
    "-0e0",
    "-0E+0",
    "-0.0",
    "-0.000e-3",
    "0e-5",
    "0",
    "1E+2",
    "1e2",
    "100.0",
    "1e400",
    "-1e400",
    "-1e-400",
    "1e-400",
    "5e-324",
    "1.7976931348623157e308",
    "9007199254740993",
    "-9007199254740993",
    "123456789012345678901234567890",
    "1" * 4001,
    "-" + "9" * 4001,
    "0.1",
    "[-0, 0, -0.0, -0e0]",
    '{"z": -0}',
    "[" * 900 + "-0" + "]" * 900,  # nested
    # whitespace of every JSON kind around it (issue 23: the search for -0 learned its context)
    "[ -0 ]",
    "[\n\t-0\r\n]",
    '{"y" :\r -0\t}',
    "[1,-0,2]",
    '["a-0b", -0]',
]


def _numbers_file(literal: str, schema_version: str) -> bytes:
    """A staging file holding ``literal`` under three keys that no repair touches: at the top, in
    a candidate, and in ``extractor``. Without a ``domain`` array (R5 repairs that)."""
    return (
        '{"schemaVersion":' + schema_version + ',"session_id":"s","project_root":"/p",'
        '"produced_at":"2026-01-01T00:00:00Z","extra":' + literal + ","
        '"extractor":{"n":[' + literal + "]},"
        '"candidates":{"lessons":[],"decisions":[],"preferences":[{"text":"t","n":'
        + literal
        + ',"source_evidence":{"lesson_candidate_marker_ids":["m"]}}]}}'
    ).encode()


def test_repairs_and_records_keep_every_number_as_json_parse_reads_it(node: Node) -> None:
    """Issue 19 item 4, SPEC 3 and 4: a repair keeps every key it does not fix exactly as it
    was, and a record holds its candidate and the file as they were. ``JSON.parse`` of the
    repaired file, and of each dead-letter record, gives the same numbers under the untouched
    keys as ``JSON.parse`` of the original, minus zero included: the integer literal ``-0`` came
    back as ``0`` (msgspec and ``int()`` read it as zero)."""
    from memstaged.core.decide import Context, Decision, decide

    ctx = Context(project_root="/p", file_name="s.json")
    originals: list[bytes] = []
    outputs: list[tuple[str, bytes]] = []  # (how, bytes) per original
    for literal in NUMBER_LITERALS:
        repairable = _numbers_file(literal, "1")
        verdict = decide(repairable, ctx)
        assert verdict.decision is Decision.REPAIRED, (literal, verdict.reasons)
        assert verdict.new_bytes is not None
        originals.append(repairable)
        outputs.append(("repaired", verdict.new_bytes))
        broken = _numbers_file(literal, '"1"')  # schemaVersion "1": quarantined
        verdict = decide(broken, ctx)
        assert verdict.decision is Decision.QUARANTINED, (literal, verdict.reasons)
        [record] = verdict.deadletter
        originals.append(broken)
        outputs.append(("record", record.body))
    before = [json.loads(s) for s in node.ask_bytes("exact", originals)]
    after = [json.loads(s) for s in node.ask_bytes("exact", [b for _, b in outputs])]
    wrong = []
    for literal, was, (how, _bytes), now in zip(
        [x for x in NUMBER_LITERALS for _ in (0, 1)], before, outputs, after, strict=True
    ):
        if how == "repaired":
            kept = {k: now[k] for k in ("extra", "extractor")}
            kept["candidate"] = now["candidates"]["preferences"][0]
            expected = {k: was[k] for k in ("extra", "extractor")}
            expected["candidate"] = was["candidates"]["preferences"][0]
        else:
            kept = {"file": now["candidate"]["original_staging_file"]}
            kept["candidate"] = now["candidate"]["candidate"]
            expected = {"file": was, "candidate": was["candidates"]["preferences"][0]}
        if kept != expected:
            wrong.append(f"{literal[:40]!r} ({how}): node reads {kept!r}, was {expected!r}"[:400])
    assert wrong == [], "\n".join(wrong)


def _exact(value: object) -> object:
    """The oracle's ``exact`` form of a value ``parse_json`` gave (numbers and strings tagged)."""
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v) for v in value]
    if isinstance(value, str):
        return "s:" + value
    if isinstance(value, bool) or value is None:
        return value
    assert isinstance(value, int | float)
    if value == 0:
        return "n:-0" if str(float(value)).startswith("-") else "n:0"
    return "n:" + (str(int(value)) if float(value).is_integer() else repr(value))


def test_minus_zero_is_found_wherever_json_allows_it_and_nowhere_else(node: Node) -> None:
    """Issue 23 (the search for ``-0`` learned its context): over 3,000 random documents
    holding ``-0`` as a number in every place JSON allows a value (top level, array element,
    object member; any of JSON's whitespace around it) and as text inside strings (a UUID's
    ``-0a61``, ``": -0,"``), ``parse_json`` reads every number as ``JSON.parse`` does: minus
    zero where Node reads minus zero, zero where it reads zero."""
    rng = random.Random(2023)
    space = [" ", "\t", "\n", "\r", "", "", ""]
    numbers = ["-0", "0", "-0.0", "-0e0", "-1", "10", "2.5", "-0.5"]
    strings = ['"a-0b"', '"0004df49-0a61"', '": -0,"', '"[-0]"', '"-0"', '"x -0 }"']

    def ws() -> str:
        return "".join(rng.choice(space) for _ in range(rng.randint(0, 2)))

    def value(depth: int) -> str:
        roll = rng.random()
        if depth > 3 or roll < 0.45:
            return ws() + rng.choice(numbers if rng.random() < 0.6 else strings) + ws()
        if roll < 0.75:
            items = [value(depth + 1) for _ in range(rng.randint(0, 4))]
            return ws() + "[" + ",".join(items) + "]" + ws()
        members = [f'{ws()}"k{i}"{ws()}:{value(depth + 1)}' for i in range(rng.randint(0, 4))]
        return ws() + "{" + ",".join(members) + "}" + ws()

    docs = [value(0).encode() for _ in range(3000)]
    assert sum(b"-0" in d for d in docs) > 1000
    theirs = [json.loads(s) for s in node.ask_bytes("exact", docs)]
    ours = [_exact(parse_json(d).value) for d in docs]
    wrong = [
        f"{d!r}: ours {o!r}, node {t!r}"
        for d, o, t in zip(docs, ours, theirs, strict=True)
        if o != t
    ]
    assert wrong == [], "\n".join(wrong[:10])
