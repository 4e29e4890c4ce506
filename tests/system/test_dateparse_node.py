"""memstaged's ``Date.parse`` against V8's, run in Node.js itself (SPEC 2.3, issue 11 items 1, 3).

One ``node`` process serves the module. A seeded generator builds date-like strings from date
parts, separators, month and day names, zones, offsets, garbage words and whitespace; each is
parsed by both sides in three time zones (UTC, America/New_York with its DST, Australia/Adelaide
with a half-hour offset and southern DST) and any difference is printed with the input and both
answers. ``make test`` runs 20,000 inputs per zone; ``make test-slow`` runs 200,000.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from support.date_corpus import MONTHS, ZONE_WORDS, corpus
from support.node_oracle import Node, local_zone, mismatches

from memstaged.core.js import date_scan
from memstaged.core.js.date_parse import parse
from memstaged.core.timestamps import format_epoch_ms

ZONES = ("UTC", "America/New_York", "Australia/Adelaide")

#: Local times next to each zone's changes of offset, before time zones, and at the range's ends.
EDGES = {
    "UTC": [],
    "America/New_York": [
        *(f"2026-03-08T{h:02d}:{m:02d}:00" for h in (1, 2, 3) for m in (0, 30, 59)),
        *(f"2026-11-01T{h:02d}:{m:02d}:00" for h in (0, 1, 2) for m in (0, 30, 59)),
        "Mar 8 2026 2:30",
        "11/1/2026 1:30 am",
        "1883-11-18T12:00",
        "1883-11-18T11:59:59",
    ],
    "Australia/Adelaide": [
        *(f"2026-04-05T{h:02d}:{m:02d}:00" for h in (1, 2, 3) for m in (0, 30, 59)),
        *(f"2026-10-04T{h:02d}:{m:02d}:00" for h in (1, 2, 3) for m in (0, 30, 59)),
        "1899-04-30T23:59",
        "1899-05-01T00:10",
        "1894-02-01T00:00",
    ],
}
EDGES_ALL = [
    "1800-01-01T00:00:00",
    "1066-10-14T09:00",
    "0001-01-01T00:00",
    "2100-07-01T12:00",
    "9999-12-31T23:59:59.999",
    "+275760-09-13T00:00:00",
    "+275760-09-12T12:00:00",
    "-271821-04-20T00:00:00",
    "-271821-04-20T12:00:00",
    "-271821-04-19T23:00:00",
    "+275760-09-13",
    "+275760-09-13T00:00:00.001Z",
    "-271821-04-20",
    "-271821-04-19T23:59:59.999Z",
    "Sep 13 275760",
    "Sep 13 275760 00:00 GMT",
    "Sep 14 275760 GMT-0100",
    "Apr 19 -271821",
]


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One Node.js for the whole module."""
    js = Node()
    yield js
    js.close()


def _ours(text: str) -> list[object] | None:
    ms = parse(text)
    return None if ms is None else [ms, format_epoch_ms(ms)]


def _run(node: Node, inputs: list[str]) -> list[str]:
    return mismatches(inputs, [_ours(s) for s in inputs], node.ask("date", inputs))


SPEC_TIMESTAMPS = [
    "2026-01-01 10:00:00",
    "2026/06/10",
    "12/31/2026",
    "Tue, 01 Jan 2026 00:00:00 GMT",
    "Wed, 10 Jun 26 10:00:00 GMT",
    "2026-06-10T10:00:00+0200",
    "2026-06-10 10:00:00 UTC",
    "2026-06-10T24:00:00Z",
    "2026-02-30",
    "1",
    "foo 2026",
]
SPEC_NOT_TIMESTAMPS = [
    "20260101T100000Z",
    "2026-01-01T10:00:00,5Z",
    "2026-W01-1",
    "2026-13-01",
    "hello",
]


@pytest.mark.parametrize("zone", ZONES)
def test_spec_examples_agree_with_node(node: Node, zone: str) -> None:
    """Issue 11 item 3: SPEC 2.3's examples are (not) timestamps in memstaged as in Node 20."""
    with local_zone(node, zone):
        assert _run(node, SPEC_TIMESTAMPS + SPEC_NOT_TIMESTAMPS) == []
        assert all(parse(s) is not None for s in SPEC_TIMESTAMPS)
        assert all(parse(s) is None for s in SPEC_NOT_TIMESTAMPS)


def test_spec_examples_in_new_york(node: Node) -> None:
    """SPEC 2.3, measured in America/New_York: the readings the contract names, exactly."""
    with local_zone(node, "America/New_York"):
        assert format_epoch_ms(parse("2026-02-30") or 0) == "2026-03-02T00:00:00.000Z"
        assert format_epoch_ms(parse("1") or 0) == "2001-01-01T05:00:00.000Z"
        assert format_epoch_ms(parse("foo 2026") or 0) == "2026-01-01T05:00:00.000Z"
        assert format_epoch_ms(parse("Wed, 10 Jun 26 10:00:00 GMT") or 0) == (
            "2026-06-10T10:00:00.000Z"
        )
        assert format_epoch_ms(parse("2026-06-10T24:00:00Z") or 0) == "2026-06-11T00:00:00.000Z"


@pytest.mark.parametrize("zone", ZONES)
def test_generated_corpus_agrees_with_node(node: Node, zone: str) -> None:
    """Issue 11 items 1, 3: 20,000 seeded date-like strings parse to the same time value (or NaN)
    in memstaged as in V8, in each of three zones, with DST edges and range ends added."""
    inputs = corpus(seed=11, count=20_000) + EDGES[zone] + EDGES_ALL
    with local_zone(node, zone):
        found = _run(node, inputs)
    assert found == [], "\n".join(found)
    accepted = sum(1 for s in inputs if parse(s) is not None)
    print(f"{zone}: {len(inputs)} inputs, {accepted} timestamps, {len(inputs) - accepted} NaN")
    assert accepted > len(inputs) // 5  # the corpus reaches both outcomes in earnest


@pytest.mark.slow
@pytest.mark.parametrize("zone", ZONES)
def test_large_corpus_agrees_with_node(node: Node, zone: str) -> None:
    """Issue 11 item 3 at scale: 200,000 more strings per zone, another seed."""
    inputs = corpus(seed=2026, count=200_000)
    with local_zone(node, zone):
        found = _run(node, inputs)
    assert found == [], "\n".join(found)


#: Words and separators of the long runs that ``dateparse`` reads in bulk (issue 19 item 5).
RUN_WORDS = [
    *(m[:3] for m in MONTHS),
    *(m.upper() for m in MONTHS[:4]),
    "jAnuary",
    "Septembre",
    "am",
    "PM",
    "pm",
    "Am",
    *ZONE_WORDS,
    "T",
    "t",
    "a",
    "foo",
    "ja",
    "amx",
    "pmé",
    "ut\U0001f600",
    "é",
    "[",
    "_",
    "\u2028",
    "\U0001f600",
]
RUN_SEPARATORS = [" ", " ", "  ", ",", ", ", "\t", "/", "\u00a0", "\u3000", "\x1c", "!", " @ "]
RUN_SEPARATORS += ["(jan)", " (pm 10) ", "()", "(a(b(c)d)e)", "((((x))))"]
RUN_HEADS = ["", "10:00 ", "12 ", "2026 ", "Jan 5 2026 3:00 ", "1 ", "5/6/2026 10:00:00 ", "x "]
RUN_TAILS = ["", "2026", " 10:30", "- 7", "(c) 1", "1", "+0200", " 2026-", "am"]


def _run_text(rng: random.Random) -> str:
    """A date-like head, a run of hundreds of words (one repeated, or a few cycled, or drawn at
    random), and a tail that may make it a date or not."""
    vocabulary = rng.sample(RUN_WORDS, rng.choice((1, 2, 3, len(RUN_WORDS))))
    separators = rng.sample(RUN_SEPARATORS, rng.choice((1, 1, 2, len(RUN_SEPARATORS))))
    words = [rng.choice(vocabulary) + rng.choice(separators) for _ in range(rng.randint(100, 400))]
    if rng.random() < 0.3:  # one odd word somewhere in the run
        words.insert(rng.randrange(len(words)), rng.choice(RUN_WORDS) + " ")
    return rng.choice(RUN_HEADS) + "".join(words) + rng.choice(RUN_TAILS)


def _comment_text(rng: random.Random) -> str:
    """A comment of 65,536 characters or more (more than one chunk) made of parentheses in
    dense or deep shapes, closed somewhere or not at all, then a date or not."""
    shape = rng.choice(("()", "(x)", "(()", "())", "((()))", "(" * 300 + ")" * 300, "a(b)c"))
    body = shape * (rng.randint(66_000, 140_000) // len(shape))
    cut = rng.randrange(len(body))
    body = body[:cut] + rng.choice(("", ")", "))", "(", ")" * 400)) + body[cut:]
    return rng.choice(("", "1 ", "Jan 5 ")) + "(" + body + rng.choice(("", ") 2026", " 2026"))


SYMBOL_PIECES = [
    ")",
    "-",
    ".",
    ":",
    "+",
    " ",
    ",",
    "/",
    "(x)",
    "(1)",
    "((a)b)",
    "\u3000",
    "(((())))",
]
SYMBOL_TAILS = ["", "2026", "Jan 5 2026 10:00", "x 1", "(", "((((((1))))))", "- 7", ")1"]


def _symbol_text(rng: random.Random) -> str:
    """Hundreds of symbols, ignored characters and comments, maybe after a word, then a tail."""
    pieces = rng.sample(SYMBOL_PIECES, rng.choice((1, 2, 4, len(SYMBOL_PIECES))))
    body = "".join(rng.choice(pieces) for _ in range(rng.randint(200, 600)))
    return rng.choice(("", "", "x ", "jan", "Jan ", "1 ")) + body + rng.choice(SYMBOL_TAILS)


GLUED_SYMBOLS = ["-", ":", ".", "+", ")", "-.", " ", ",", "/", "\u3000"]
GLUED_HEADS = ["", "", "x", "a-", "Jan", "10:00 ", "1 ", "2026 ", "Jan 5 2026 3:00 pm "]
GLUED_TAILS = [*RUN_TAILS, "a1", "jan1", "-1", "(c) 2026", ")2026", "5/6/2026", "12:00"]


def _glued_text(rng: random.Random) -> str:
    """Hundreds of words glued to symbols (``"a-a-"``, ``"jan-x:"``), maybe after a head that
    reads a number or a time, then a tail that may make it a date or not (issue 19 item 5)."""
    words = rng.sample(RUN_WORDS, rng.choice((1, 2, 3, len(RUN_WORDS))))
    symbols = rng.sample(GLUED_SYMBOLS, rng.choice((1, 1, 2, len(GLUED_SYMBOLS))))
    body = "".join(rng.choice(words) + rng.choice(symbols) for _ in range(rng.randint(150, 500)))
    return rng.choice(GLUED_HEADS) + body + rng.choice(GLUED_TAILS)


def test_bulk_reading_agrees_with_word_by_word_and_node(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 item 5: long runs of words, long comments, symbols before any number and
    words glued to symbols before any number (``"a-"`` repeated: 20-30 µs per byte) are
    read in bulk (regular expressions and string methods in C) instead of a token or a character
    at a time. On seeded
    texts made for those paths, the bulk reading gives what the word-by-word reading gives (the
    bulk paths switched off) and what Node's ``Date.parse`` gives, in two zones."""
    rng = random.Random(195)
    inputs = [_run_text(rng) for _ in range(400)] + [_comment_text(rng) for _ in range(24)]
    inputs += [_symbol_text(rng) for _ in range(200)]
    inputs += [_glued_text(random.Random(f"glued {i}")) for i in range(300)]
    bulk = [_ours(s) for s in inputs]
    for zone in ("UTC", "America/New_York"):
        with local_zone(node, zone):
            found = _run(node, inputs)
        assert found == [], "\n".join(found)
    with monkeypatch.context() as patch:  # runs and comment runs cut in many windows
        patch.setattr(date_scan, "_RUN_WINDOW", 300)
        patch.setattr(date_scan, "_COMMENTS_WINDOW", 50)
        assert [_ours(s) for s in inputs] == bulk
    with monkeypatch.context() as patch:
        patch.setattr(date_scan, "_RUN_MIN", 1 << 30)  # no run is long enough: word by word
        patch.setattr(date_scan, "_min_prefix", lambda _chunk: -(1 << 30))  # walk every chunk
        patch.setattr(date_scan.Scanner, "skip_symbols", lambda _self: None)
        one_by_one = [_ours(s) for s in inputs]
    assert bulk == one_by_one
    accepted = sum(1 for value in bulk if value is not None)
    assert 40 < accepted < len(inputs) - 40  # both outcomes, in earnest
