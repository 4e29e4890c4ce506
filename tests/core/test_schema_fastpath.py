"""``schema.is_valid`` against ``schema.check_file``: the same answer on every document.

``triage.decide`` trusts ``is_valid`` for the common case and builds ``check_file``'s report only
when it says no, so a single disagreement is a wrong verdict (a file the reconciler rejects called
valid, or a valid file quarantined). The fast path re-states every rule of SPEC 2 by hand, so it is
checked here differentially: over thousands of generated documents that are valid, or broken one
rule at a time, or broken anywhere at random with values that sit on the edge of some rule.
"""

from __future__ import annotations

import copy
import enum
import random
from collections import Counter, OrderedDict
from typing import Any, Final

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.documents import DELETE
from support.engine import Form, classify, patched, staging

from memstaged.core.decide import _foreign_root
from memstaged.core.foreign import foreign_root
from memstaged.core.js.ecma import JS_WHITESPACE
from memstaged.core.schema import (
    Problem,
    candidate_arrays,
    check_candidate,
    check_fields,
    is_valid,
)

Path = tuple[str | int, ...]


class Str(str):
    """A str subclass: not what JSON decodes to, but the rules are stated with isinstance."""


class Num(enum.IntEnum):
    ONE = 1


def agree(doc: object) -> bool:
    """Assert the two agree on ``doc``; return the verdict."""
    fast = is_valid(doc)
    slow = check_file(doc).valid
    assert fast == slow, (fast, check_file(doc).problems(), doc)
    return slow


# --- the generator ------------------------------------------------------------------------------

WORDS: Final = ["x", "Run the tests", "ünïcode", "emoji 🙂", "a b", "\u00e9", "日本"]
#: Whitespace ECMAScript trims, and look-alikes it keeps (U+001C, U+0085, U+180E, U+200B).
JS_SPACES: Final = list(JS_WHITESPACE)
NOT_JS_SPACES: Final = ["\x1c", "\x1f", "\x85", "\u180e", "\u200b", "\u2060"]
VALID_AT: Final = [
    "2026-01-01T00:00:00Z",
    "2026-01-01",
    "2026-03-30t06:59z",
    "2026-03-30T06:59:57.123456+02:00",
    "2024-02-29T23:59:59-23:59",
    "0000-01-01T00:00Z",
    "9999-12-31T23:59:59.9Z",
    " \u3000 2026-01-01T00:00:00Z\ufeff",
    # contract v2: whatever Date.parse reads (v1 listed these as bad)
    "2026-01-01 10:00Z",
    "2026-01-01T10:00:00",
    "Tue, 01 Jan 2026 00:00:00 GMT",
    "2026-02-29",
    "2026-04-31T00:00Z",
    "2026-01-01T24:00Z",
    "\x1c2026-01-01",
    "\u0662\u0660\u0662\u0666-01-01",
    "2026-1-01",
]
BAD_AT: Final = [
    "",
    " ",
    "\u3000\ufeff",
    "2026-13-01",
    "2026-00-10",
    "2026-01-01T23:60Z",
    "2026-01-01T23:59:60Z",
    "2026-01-01T00:00+24:00",
    "2026-01-01T00:00+00:60",
    "2026-01-01T00:00:00.Z",
    "2026-01-01\x85",
    "26-01-01",
    "20260101T100000Z",
]
#: Values on the edge of some rule somewhere; each replaces a value, or goes into a list.
EDGES: Final[list[Any]] = [
    None, True, False, 0, 1, -1, 1.0, 1e0, 0.5, -0.0, 1e308, -1e308, float("inf"), float("-inf"),
    float("nan"), 2**53 - 1, 2**53, 2**53 + 1, -(2**53), 2**1023, 2**1024, 10**400, -(10**400),
    "", " ", "x", "1", "\u3000\ufeff", "\u3000x\ufeff", " \t\n", "\x1c", "\x85", "\u180e", "\u200b",
    "\ufeff", "\ud800", "true", "path", "tool", "command", "topic", "filename", "Path", "path ",
    [], [1], [1.5], [True], ["m"], [""], [" "], [None], [[]], [{}], {}, {"type": "topic"},
    {"type": "topic", "value": "x"}, {"type": "tool", "value": "v", "pattern": 1},
    {"type": "tool", "value": "v", "pattern": ""}, {"type": "command", "pattern": "p"},
    {"type": "command", "value": "v"}, {"discussion_note_ids": []},
    {"lesson_candidate_marker_ids": ["m"]}, {"discussion_note_ids": [1]},
    Str("x"), Str(" "), Str(""), Num.ONE, OrderedDict(), OrderedDict(type="topic", value="x"),
    (), ("m",), 1 + 0j,
]  # fmt: skip


def text(rng: random.Random) -> str:
    """A non-empty string, sometimes wrapped in whitespace JavaScript trims (still non-empty)."""
    word = rng.choice(WORDS)
    if rng.random() < 0.15:
        word = rng.choice(JS_SPACES) + word + rng.choice(JS_SPACES)
    if rng.random() < 0.05:
        word = rng.choice(NOT_JS_SPACES)  # not trimmed: a non-empty string on its own
    return word


def trigger(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["path", "filename", "topic", "tool", "command"])
    if kind == "command":
        out: dict[str, Any] = {"type": "command", "pattern": text(rng)}
        if rng.random() < 0.2:
            out["value"] = rng.choice(EDGES)  # ignored for commands
        return out
    out = {"type": kind, "value": text(rng)}
    if rng.random() < 0.4:
        # Any string for tools (even empty); ignored, whatever it is, for the others.
        out["pattern"] = rng.choice(["", " ", "git *"]) if kind == "tool" else rng.choice(EDGES)
    return out


def evidence(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shape = rng.randrange(3)
    notes: list[Any] = [rng.choice([rng.randrange(10**6), 2.5, 1e308, -(2**53)]) for _ in range(3)]
    markers = [text(rng) for _ in range(rng.randint(1, 3))]
    if shape in (0, 2):
        out["discussion_note_ids"] = notes[: rng.randint(1, 3)]
    if shape in (1, 2):
        out["lesson_candidate_marker_ids"] = markers
    if shape == 2 and rng.random() < 0.3:
        out[rng.choice(["discussion_note_ids", "lesson_candidate_marker_ids"])] = []
    if rng.random() < 0.3:
        out["source"] = rng.choice(EDGES)
    return out


def candidate(rng: random.Random, category: str) -> dict[str, Any]:
    out: dict[str, Any]
    if category == "preferences":
        out = {"text": text(rng)}
    else:
        out = {"summary": text(rng), "detail": text(rng)}
    if category == "lessons":
        out["scope_suggestion"] = text(rng)
        out["triggers"] = [trigger(rng) for _ in range(rng.randint(1, 3))]
    out["source_evidence"] = evidence(rng)
    if rng.random() < 0.3:
        out["reconcile_attempts"] = rng.choice(EDGES)  # never makes a candidate invalid
    if rng.random() < 0.2:
        out["confidence"] = rng.choice(EDGES)
    return out


def document(rng: random.Random) -> dict[str, Any]:
    """A valid staging file of random shape: categories empty or full, unknown keys.

    Contract v2 requires all four categories (v1 let them be absent).
    """
    candidates: dict[str, Any] = {}
    for category in ("lessons", "preferences", "decisions", "domain"):
        count = rng.randint(0, 3) if rng.random() < 0.75 else 0
        candidates[category] = [candidate(rng, category) for _ in range(count)]
    if rng.random() < 0.2:
        candidates["unknown"] = rng.choice(EDGES)
    doc: dict[str, Any] = {
        "schemaVersion": rng.choice([1, 1, 1.0, Num.ONE]),
        "session_id": text(rng),
        "project_root": rng.choice(["/p", " /p ", "."]),
        "produced_at": rng.choice(VALID_AT),
        "candidates": candidates,
    }
    if rng.random() < 0.3:
        doc["extractor"] = {"name": "pi", "version": [1, 2]}
    return doc


def paths(value: Any, prefix: Path = ()) -> list[Path]:
    out: list[Path] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.extend(paths(item, (*prefix, i)))
    return out


def nonsense(rng: random.Random, depth: int = 0) -> Any:
    """An edge value, or a small structure of them."""
    roll = rng.random()
    if depth > 2 or roll < 0.6:
        return copy.deepcopy(rng.choice(EDGES))
    if roll < 0.8:
        return [nonsense(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["type", "value", "x", ""]): nonsense(rng, depth + 1)}


#: Each breaks one rule of SPEC 2 at a path that :func:`document` may or may not have.
def rule_breaks(rng: random.Random, doc: dict[str, Any]) -> list[tuple[Path, Any]]:
    top: list[tuple[Path, Any]] = [
        (("schemaVersion",), rng.choice([DELETE, "1", True, 2, 0.999, None, [1], 1 + 0j])),
        (("session_id",), rng.choice([DELETE, "", " ", "\u3000\ufeff", 1, None, [], Str(" ")])),
        (("project_root",), rng.choice([DELETE, "", "\t\n\v\f\r", 0, False])),
        (("produced_at",), rng.choice([DELETE, 20260101, None, *BAD_AT])),
        (("candidates",), rng.choice([DELETE, [], None, "lessons", 1])),
    ]
    out = list(top)
    candidates = doc["candidates"]
    for category in ("lessons", "preferences", "decisions", "domain"):
        out.append((("candidates", category), rng.choice([None, {}, "x", 0, (), DELETE])))
        for i, item in enumerate(candidates.get(category, [])):
            here: Path = ("candidates", category, i)
            out.append((here, rng.choice([None, [], "x", 1, ()])))
            keys = {"lessons": ["summary", "detail", "scope_suggestion", "triggers"]}.get(
                category, ["text"] if category == "preferences" else ["summary", "detail"]
            )
            for key in keys:
                bad = [DELETE, "", " ", "\u3000\ufeff", "\ufeff", None, 0, ["x"]]
                if key == "triggers":
                    bad = [DELETE, [], None, {"type": "topic", "value": "x"}, [None], [{}]]
                out.append(((*here, key), rng.choice(bad)))
            ev: Path = (*here, "source_evidence")
            out.append((ev, rng.choice([DELETE, None, [], {}, {"source": "x"}])))
            out.append(((*ev, "discussion_note_ids"), rng.choice([None, {}, "1", [True], [None]])))
            out.append(((*ev, "discussion_note_ids"), [1, rng.choice([10**400, float("inf")])]))
            out.append(((*ev, "lesson_candidate_marker_ids"), rng.choice([None, "m", [1], [""]])))
            out.append(((*ev, "lesson_candidate_marker_ids"), ["m", rng.choice(["\u3000", ""])]))
            for j, trig in enumerate(item.get("triggers", [])):
                at: Path = (*here, "triggers", j)
                out.append((at, rng.choice([None, "path", [trig], ()])))
                out.append(((*at, "type"), rng.choice([DELETE, "Path", "", None, 1, ["path"]])))
                key = "pattern" if trig["type"] == "command" else "value"
                out.append(((*at, key), rng.choice([DELETE, "", " \u2028", None, 1])))
                if trig["type"] == "tool":
                    out.append(((*at, "pattern"), rng.choice([None, 1, [], False])))
    return out


def mutate(rng: random.Random, doc: dict[str, Any]) -> tuple[Any, str]:
    """Break ``doc`` somehow; also say how, for the coverage count."""
    how = rng.random()
    if how < 0.45:
        path, value = rng.choice(rule_breaks(rng, doc))
        return patched(doc, (path, value)), "rule"
    if how < 0.9:
        out: Any = doc
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths(out))
            value = DELETE if rng.random() < 0.15 else nonsense(rng)
            if value is DELETE and isinstance(path[-1], int):
                value = None
            out = patched(out, (path, value))
        return out, "anywhere"
    return nonsense(rng), "whole"


def test_generated_documents_agree() -> None:
    """20,000 documents: a third valid as generated, the rest broken; both answers occur."""
    rng = random.Random(20260101)
    seen: Counter[tuple[str, bool]] = Counter()
    for _ in range(20_000):
        doc = document(rng)
        if rng.random() < 0.35:
            seen["valid", agree(doc)] += 1
            continue
        broken, how = mutate(rng, doc)
        seen[how, agree(broken)] += 1
    assert seen["valid", True] > 5000 and not seen["valid", False], seen
    # Every rule break breaks the file; changes anywhere else sometimes leave it valid.
    assert seen["rule", False] > 5000 and not seen["rule", True], seen
    assert seen["anywhere", False] > 4000 and seen["anywhere", True] > 300, seen


def test_every_rule_broken_alone_agrees() -> None:
    """Each rule break on its own, on a document with every category and trigger kind."""
    rng = random.Random(7)
    doc = staging()
    doc["candidates"]["lessons"][0]["triggers"] = [
        {"type": kind, "value": "v"} for kind in ("path", "filename", "topic", "tool")
    ] + [{"type": "command", "pattern": "p"}, {"type": "tool", "value": "v", "pattern": ""}]
    assert agree(doc)
    for _ in range(20):
        for path, value in rule_breaks(rng, doc):
            agree(patched(doc, (path, value)))


@pytest.mark.parametrize(
    "edit",
    [
        (("schemaVersion",), 1.0),
        (("schemaVersion",), True),
        (("schemaVersion",), "1"),
        (("schemaVersion",), Num.ONE),
        (("session_id",), "\u3000\ufeff"),
        (("session_id",), "\x1c"),  # not trimmed by JavaScript: a non-empty string
        (("session_id",), "\x85"),
        (("session_id",), Str("s")),
        (("candidates",), {}),
        (("candidates",), OrderedDict(lessons=[])),
        (("candidates", "lessons"), []),
        (("candidates", "lessons"), DELETE),
        (("candidates", "lessons"), None),
        (("candidates", "lessons"), ()),
        (("candidates", "preferences", 0, "source_evidence", "discussion_note_ids"), []),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [1e308]),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [2**1024]),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [2**1023]),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [-(2**53)]),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [False]),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [Num.ONE]),
        (("candidates", "decisions", 0, "source_evidence", "discussion_note_ids"), [float("nan")]),
        (("candidates", "lessons", 0, "triggers", 0), {"type": "tool", "value": "v"}),
        (("candidates", "lessons", 0, "triggers", 0), {"type": "tool", "value": "v", "pattern": 1}),
        (("candidates", "lessons", 0, "triggers", 0), {"type": "path", "value": "v", "pattern": 1}),
        (("candidates", "lessons", 0, "triggers", 0), {"type": "command", "value": "v"}),
        (("candidates", "lessons", 0, "triggers", 0), {"type": ["path"], "value": "v"}),
        (("candidates", "lessons", 0, "triggers", 0), {"type": Str("path"), "value": "v"}),
        (("candidates", "lessons", 0, "reconcile_attempts"), "2"),
        (("candidates", "unknown_category"), None),
        ((), []),
        ((), None),
    ],
)
def test_edges_agree(edit: tuple[Path, Any]) -> None:
    agree(patched(staging(), edit))


def _timestamps(rng: random.Random) -> list[str]:
    out = []
    for _ in range(5000):
        year = rng.choice(["0000", "1970", "2024", "2026", "9999", "0400", "1900"])
        date = f"{year}-{rng.choice(['00', '01', '02', '04', '12', '13'])}-"
        date += rng.choice(["00", "01", "28", "29", "30", "31", "32"])
        sep = rng.choice(["", "T", "t", " ", "_"])
        clock = ""
        if sep:
            clock = f"{rng.choice(['00', '23', '24'])}:{rng.choice(['00', '59', '60'])}"
            clock += rng.choice(["", ":00", ":59", ":60", ":59.5", ":59.123456789", ":5"])
            clock += rng.choice(["", "Z", "z", "+00:00", "-23:59", "+24:00", "+00:60", "+0000"])
        pad = rng.choice(["", "", " ", "\u3000", "\ufeff", "\x1c", "\x85", "\n"])
        out.append(pad + date + sep + clock + pad)
    return out


def test_timestamps_agree_with_classify() -> None:
    """``produced_at`` alone: the fast path's reading of SPEC 2.3 is classify's."""
    doc = staging()
    seen: Counter[bool] = Counter()
    for stamp in _timestamps(random.Random(3)):
        doc["produced_at"] = stamp
        found = classify(stamp)
        expected = found is not None and found[0] is Form.AS_WRITTEN
        assert agree(doc) == expected, stamp
        seen[expected] += 1
    assert seen[True] > 300 and seen[False] > 3000, seen


ROOTS: Final[list[Any]] = [
    "/p", "/p/", "//p", "/p/.", "/p/../p", "/ p", "/p ", "/p\u3000", "\ufeff/p", "/p\x85", "/",
    "p", "./p", "", " ", "/elsewhere", "/p/sub", "/\ud800", Str("/p"),
]  # fmt: skip


def test_foreign_root_shortcut_agrees() -> None:
    """triage's shortcut for a file naming the root verbatim is foreign_root's answer."""
    for root in ROOTS:
        for value in [*ROOTS, DELETE, None, 1, ["/p"]]:
            doc: Any = staging(project_root=value)
            assert _foreign_root(doc, root) == foreign_root(doc, root), (root, value)
        assert _foreign_root([root], root) is None


# --- hypothesis, over arbitrary JSON in arbitrary places -----------------------------------------

_CHARS = st.one_of(st.characters(), st.sampled_from([*JS_SPACES, *NOT_JS_SPACES]))
JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=2**1020, max_value=2**1030),
        st.floats(),
        st.text(_CHARS, max_size=4),
        st.sampled_from(EDGES),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(), inner)),
    max_leaves=8,
)


@st.composite
def hypothesis_documents(draw: st.DrawFn) -> Any:
    doc: Any = document(random.Random(draw(st.integers(0, 2**32))))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(paths(doc) or [()]))
        if not path:
            break
        doc = patched(doc, (path, draw(JSONISH)))
    return doc


@settings(deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(doc=hypothesis_documents())
def test_hypothesis_documents_agree(doc: Any) -> None:
    agree(doc)


class Report(msgspec.Struct, frozen=True):
    """The validation of one decoded file, split the way repairs R1 and R4 need it."""

    file_problems: tuple[Problem, ...]
    #: (category, index) of each invalid candidate, with its problems.
    candidate_problems: dict[tuple[str, int], tuple[Problem, ...]]

    @property
    def valid(self) -> bool:
        return not self.file_problems and not self.candidate_problems

    def problems(self) -> list[Problem]:
        out = list(self.file_problems)
        for found in self.candidate_problems.values():
            out.extend(found)
        return out


def check_file(doc: object) -> Report:
    """Validate a decoded staging file whole, every invalid candidate's problems at once: the
    slow reading ``is_valid`` must agree with (the engine streams :func:`check_candidate`)."""
    by_candidate: dict[tuple[str, int], tuple[Problem, ...]] = {}
    for category, items in candidate_arrays(doc):
        for i, item in enumerate(items):
            found = check_candidate(category, item, f"candidates.{category}[{i}]")
            if found:
                by_candidate[(category, i)] = tuple(found)
    return Report(tuple(check_fields(doc)), by_candidate)
