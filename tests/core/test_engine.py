"""The triage engine against SPEC 2-4: validity, repairs R1-R6, dead-letter records, foreign;
and the changes of contract v2 (issue 11 item 2, issue 10 items 9 and 15) at the end.

Every test builds bytes in memory and calls the pure :func:`memstaged.core.decide.decide`; nothing
touches the file system except the symbolic-link cases of SPEC 2.4, which only create links.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.documents import DELETE, decision, lesson, preference
from support.engine import (
    FILE_NAME,
    PROJECT,
    category_items,
    context,
    decide_doc,
    decoded,
    encode,
    expected_after_repairs,
    is_safe_name,
    patched,
    records,
    staging,
    wheres,
)

from memstaged.core.decide import BOM, MAX_REASONS, Decision, Verdict, decide, decide_too_large
from memstaged.core.js.ecma import parse_json
from memstaged.core.records import EMBED_LIMIT, original_name
from memstaged.core.repair import derive_topic, keyword_topic
from memstaged.core.schema import CATEGORIES
from memstaged.core.timestamps import EPOCH

L0 = ("candidates", "lessons", 0)
P0 = ("candidates", "preferences", 0)
D0 = ("candidates", "decisions", 0)
M0 = ("candidates", "domain", 0)
EV = (*L0, "source_evidence")
T0 = (*L0, "triggers")

VALID = Decision.VALID
REPAIRED = Decision.REPAIRED
QUARANTINED = Decision.QUARANTINED
FOREIGN = Decision.FOREIGN

Edit = tuple[tuple[str | int, ...], Any]
ATTEMPT_VALUES: list[tuple[str, Any]] = [
    ("string", "3"),
    ("null", None),
    ("negative", -1),
    ("inf", math.inf),
    ("true", True),
    ("object", {}),
    ("fraction", 0.5),
]


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC for the test (R3 reads offset-less times in local time)."""
    monkeypatch.setenv("TZ", "UTC0")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _names(where: str, verdict: Verdict) -> bool:
    """``where`` is reported, itself or as the parent of a reported location."""
    return any(w == where or w.startswith((f"{where}.", f"{where}[")) for w in wheres(verdict))


def row(
    case_id: str, edits: list[Edit], outcome: Decision, where: str | None = None
) -> pytest.ParameterSet:
    return pytest.param(edits, outcome, where, id=case_id)


def _trigger(**fields: Any) -> list[Edit]:
    return [(T0, [fields])]


def _evidence(**fields: Any) -> list[Edit]:
    return [(EV, fields)]


# --- SPEC 2.1 and 2.2, one row per rule and boundary ------------------------------------------

Q = QUARANTINED
L = "candidates.lessons[0]"
TR0 = f"{L}.triggers[0]"
LEV = f"{L}.source_evidence"
NOTES = f"{LEV}.discussion_note_ids"
MARKS = f"{LEV}.lesson_candidate_marker_ids"

RULES = [
    row("baseline-valid", [], VALID),
    # 2.1 schemaVersion
    row("schemaVersion-1.0", [(("schemaVersion",), 1.0)], VALID),
    row("schemaVersion-string", [(("schemaVersion",), "1")], Q, "schemaVersion"),
    row("schemaVersion-true", [(("schemaVersion",), True)], Q, "schemaVersion"),
    row("schemaVersion-2", [(("schemaVersion",), 2)], Q, "schemaVersion"),
    row("schemaVersion-0", [(("schemaVersion",), 0)], Q, "schemaVersion"),
    row("schemaVersion-1.5", [(("schemaVersion",), 1.5)], Q, "schemaVersion"),
    row("schemaVersion-null", [(("schemaVersion",), None)], Q, "schemaVersion"),
    row("schemaVersion-array", [(("schemaVersion",), [1])], Q, "schemaVersion"),
    row("schemaVersion-missing", [(("schemaVersion",), DELETE)], Q, "schemaVersion"),
    # 2.1 session_id
    row("session_id-padded", [(("session_id",), "  s-1 \t")], VALID),
    row("session_id-u001c-is-nonempty", [(("session_id",), "\x1c")], VALID),
    row("session_id-u0085-is-nonempty", [(("session_id",), "\x85")], VALID),
    row("session_id-missing", [(("session_id",), DELETE)], Q, "session_id"),
    row("session_id-empty", [(("session_id",), "")], Q, "session_id"),
    row("session_id-blank", [(("session_id",), " \t\n")], Q, "session_id"),
    row("session_id-js-space", [(("session_id",), "\u3000\ufeff\u2028")], Q, "session_id"),
    row("session_id-number", [(("session_id",), 5)], Q, "session_id"),
    row("session_id-null", [(("session_id",), None)], Q, "session_id"),
    row("session_id-array", [(("session_id",), ["s"])], Q, "session_id"),
    # 2.1 project_root (an empty one is invalid, never foreign)
    row("project_root-missing", [(("project_root",), DELETE)], Q, "project_root"),
    row("project_root-empty", [(("project_root",), "")], Q, "project_root"),
    row("project_root-blank", [(("project_root",), " \u00a0\t")], Q, "project_root"),
    row("project_root-number", [(("project_root",), 7)], Q, "project_root"),
    row("project_root-null", [(("project_root",), None)], Q, "project_root"),
    # 2.1 produced_at
    row("produced_at-date-only", [(("produced_at",), "2026-01-01")], VALID),
    row("produced_at-offset", [(("produced_at",), "2026-01-01T10:00:00.5+02:00")], VALID),
    row("produced_at-padded", [(("produced_at",), " 2026-01-01T10:00Z\n")], VALID),
    row("produced_at-missing", [(("produced_at",), DELETE)], Q, "produced_at"),
    row("produced_at-empty", [(("produced_at",), "")], Q, "produced_at"),
    row("produced_at-number", [(("produced_at",), 1767225600000)], Q, "produced_at"),
    row("produced_at-null", [(("produced_at",), None)], Q, "produced_at"),
    row("produced_at-garbage", [(("produced_at",), "last tuesday")], Q, "produced_at"),
    # v2: whatever Date.parse reads is a timestamp (Feb 29 of 2026 is Mar 1; 24:00 the next day)
    row("produced_at-feb-29", [(("produced_at",), "2026-02-29T00:00Z")], VALID),
    row("produced_at-hour-24", [(("produced_at",), "2026-01-01T24:00Z")], VALID),
    row("produced_at-rfc2822", [(("produced_at",), "Tue, 01 Jan 2026 00:00:00 GMT")], VALID),
    row("produced_at-basic", [(("produced_at",), "20260101")], Q, "produced_at"),
    # 2.1 candidates
    # v2: all four categories are required; R5 adds an absent one
    row("candidates-empty-object", [(("candidates",), {})], REPAIRED),
    row("candidates-unknown-only", [(("candidates",), {"notes": "x"})], REPAIRED),
    row("categories-empty", [(("candidates",), {c: [] for c in ("lessons", "domain")})], REPAIRED),
    row("categories-all-empty", [(("candidates",), {c: [] for c in CATEGORIES})], VALID),
    row("candidates-missing", [(("candidates",), DELETE)], Q, "candidates"),
    row("candidates-array", [(("candidates",), [lesson()])], Q, "candidates"),
    row("candidates-null", [(("candidates",), None)], Q, "candidates"),
    row("candidates-string", [(("candidates",), "lessons")], Q, "candidates"),
    row("lessons-null", [(("candidates", "lessons"), None)], Q, "candidates.lessons"),
    row("lessons-object", [(("candidates", "lessons"), {"0": lesson()})], Q),
    row("preferences-string", [(("candidates", "preferences"), "x")], Q),
    row("decisions-number", [(("candidates", "decisions"), 0)], Q, "candidates.decisions"),
    row("domain-null", [(("candidates", "domain"), None)], Q, "candidates.domain"),
    row("lesson-not-object", [(L0, "a lesson")], Q, "candidates.lessons[0]"),
    row("preference-null", [(P0, None)], Q, "candidates.preferences[0]"),
    row("decision-array", [(D0, [])], Q, "candidates.decisions[0]"),
    row("domain-number", [(M0, 3)], Q, "candidates.domain[0]"),
    row("unknown-keys-everywhere", [((*L0, "x"), {"y": [1]}), ((*EV, "request_id"), "r")], VALID),
    # 2.2 lesson strings
    row("lesson-summary-missing", [((*L0, "summary"), DELETE)], Q, f"{L}.summary"),
    row("lesson-summary-blank", [((*L0, "summary"), "\u2003")], Q, f"{L}.summary"),
    row("lesson-summary-number", [((*L0, "summary"), 1)], Q, f"{L}.summary"),
    row("lesson-detail-empty", [((*L0, "detail"), "")], Q, f"{L}.detail"),
    row("lesson-scope-missing", [((*L0, "scope_suggestion"), DELETE)], Q, f"{L}.scope_suggestion"),
    row("lesson-scope-null", [((*L0, "scope_suggestion"), None)], Q, f"{L}.scope_suggestion"),
    row("lesson-summary-u180e", [((*L0, "summary"), "\u180e")], VALID),
    row("lesson-summary-u001c", [((*L0, "summary"), "\x1c")], VALID),
    row("preference-text-u0085", [((*P0, "text"), "\x85")], VALID),
    row("decision-detail-u200b", [((*D0, "detail"), "\u200b")], VALID),
    # 2.2 triggers of each type and their boundaries
    row("trigger-path", _trigger(type="path", value="src/"), VALID),
    row("trigger-filename", _trigger(type="filename", value="Makefile"), VALID),
    row("trigger-topic", _trigger(type="topic", value="x"), VALID),
    row("trigger-tool", _trigger(type="tool", value="bash"), VALID),
    row("trigger-tool-pattern", _trigger(type="tool", value="bash", pattern="^git"), VALID),
    row("trigger-tool-pattern-empty", _trigger(type="tool", value="bash", pattern=""), VALID),
    row("trigger-command", _trigger(type="command", pattern="make"), VALID),
    row("trigger-command-extra-value", _trigger(type="command", pattern="make", value=5), VALID),
    row("trigger-extra-keys", _trigger(type="path", value="a", weight=2), VALID),
    row("trigger-path-no-value", _trigger(type="path"), Q, TR0),
    row("trigger-path-blank", _trigger(type="path", value=" "), Q, TR0),
    row("trigger-filename-empty", _trigger(type="filename", value=""), Q, TR0),
    row("trigger-topic-number", _trigger(type="topic", value=3), Q, TR0),
    row("trigger-topic-pattern-only", _trigger(type="topic", pattern="x"), Q, TR0),
    row("trigger-tool-no-value", _trigger(type="tool", pattern="x"), Q, TR0),
    row("trigger-tool-pattern-number", _trigger(type="tool", value="b", pattern=1), Q, TR0),
    row("trigger-tool-pattern-null", _trigger(type="tool", value="b", pattern=None), Q, TR0),
    row("trigger-tool-pattern-array", _trigger(type="tool", value="b", pattern=["x"]), Q, TR0),
    row("trigger-command-no-pattern", _trigger(type="command", value="make"), Q, TR0),
    row("trigger-command-pattern-empty", _trigger(type="command", pattern=""), Q, TR0),
    row("trigger-command-pattern-number", _trigger(type="command", pattern=1), Q, TR0),
    row("trigger-unknown-type", _trigger(type="regex", value="x"), Q, TR0),
    row("trigger-type-case", _trigger(type="Path", value="x"), Q, TR0),
    row("trigger-type-missing", _trigger(value="x"), Q, TR0),
    row("trigger-type-null", _trigger(type=None, value="x"), Q, TR0),
    row("trigger-type-array", _trigger(type=["path"], value="x"), Q, TR0),
    row("trigger-not-object", [(T0, ["path"])], Q, TR0),
    row("trigger-null", [(T0, [None])], Q, TR0),
    row(
        "trigger-second-invalid",
        [(T0, [{"type": "topic", "value": "a"}, {"type": "x"}])],
        Q,
        f"{L}.triggers[1]",
    ),
    # 2.2 preference, decision, domain
    row("preference-no-summary-needed", [(P0, preference())], VALID),
    row("preference-text-missing", [((*P0, "text"), DELETE)], Q, "candidates.preferences[0].text"),
    row("preference-text-blank", [((*P0, "text"), "\r\n")], Q, "candidates.preferences[0].text"),
    row(
        "preference-summary-not-text",
        [(P0, preference(text=DELETE, summary="s"))],
        Q,
        "candidates.preferences[0].text",
    ),
    row(
        "preference-evidence-missing",
        [((*P0, "source_evidence"), DELETE)],
        Q,
        "candidates.preferences[0].source_evidence",
    ),
    row(
        "decision-summary-missing",
        [((*D0, "summary"), DELETE)],
        Q,
        "candidates.decisions[0].summary",
    ),
    row(
        "decision-detail-blank", [((*D0, "detail"), "\u3000")], Q, "candidates.decisions[0].detail"
    ),
    row(
        "decision-evidence-empty",
        [((*D0, "source_evidence"), {})],
        Q,
        "candidates.decisions[0].source_evidence",
    ),
    row("decision-no-triggers-needed", [(D0, decision(triggers=[]))], VALID),
    row("domain-summary-number", [((*M0, "summary"), 1)], Q, "candidates.domain[0].summary"),
    row("domain-detail-missing", [((*M0, "detail"), DELETE)], Q, "candidates.domain[0].detail"),
    row(
        "domain-evidence-null",
        [((*M0, "source_evidence"), None)],
        Q,
        "candidates.domain[0].source_evidence",
    ),
    # 2.2 source_evidence boundaries
    row("evidence-notes", _evidence(discussion_note_ids=[1]), VALID),
    row("evidence-note-0", _evidence(discussion_note_ids=[0]), VALID),
    row("evidence-note-negative", _evidence(discussion_note_ids=[-1]), VALID),
    row("evidence-note-fraction", _evidence(discussion_note_ids=[1.5]), VALID),
    row("evidence-note-1e308", _evidence(discussion_note_ids=[1e308]), VALID),
    row("evidence-markers", _evidence(lesson_candidate_marker_ids=["m"]), VALID),
    row("evidence-marker-u001c", _evidence(lesson_candidate_marker_ids=["\x1c"]), VALID),
    row(
        "evidence-notes-empty-markers-set",
        _evidence(discussion_note_ids=[], lesson_candidate_marker_ids=["m"]),
        VALID,
    ),
    row(
        "evidence-notes-set-markers-empty",
        _evidence(discussion_note_ids=[2], lesson_candidate_marker_ids=[]),
        VALID,
    ),
    row(
        "evidence-both",
        _evidence(discussion_note_ids=[2], lesson_candidate_marker_ids=["m"], source="s"),
        VALID,
    ),
    row("evidence-missing", [(EV, DELETE)], Q, LEV),
    row("evidence-null", [(EV, None)], Q, LEV),
    row("evidence-array", [(EV, [1])], Q, LEV),
    row("evidence-empty-object", _evidence(), Q, LEV),
    row("evidence-only-other-keys", _evidence(source="chat"), Q, LEV),
    row(
        "evidence-both-empty",
        _evidence(discussion_note_ids=[], lesson_candidate_marker_ids=[]),
        Q,
        LEV,
    ),
    row("evidence-notes-empty-only", _evidence(discussion_note_ids=[]), Q, LEV),
    row("evidence-markers-empty-only", _evidence(lesson_candidate_marker_ids=[]), Q, LEV),
    row("evidence-note-inf", _evidence(discussion_note_ids=[math.inf]), Q, NOTES),
    row("evidence-note-minus-inf", _evidence(discussion_note_ids=[1, -math.inf]), Q, NOTES),
    row("evidence-note-400-digits", _evidence(discussion_note_ids=[10**399]), Q, NOTES),
    row("evidence-note-string", _evidence(discussion_note_ids=["1"]), Q, NOTES),
    row("evidence-note-true", _evidence(discussion_note_ids=[True]), Q, NOTES),
    row("evidence-note-null", _evidence(discussion_note_ids=[None]), Q, NOTES),
    row("evidence-notes-not-array", _evidence(discussion_note_ids=1), Q, NOTES),
    row(
        "evidence-notes-null-markers-ok",
        _evidence(discussion_note_ids=None, lesson_candidate_marker_ids=["m"]),
        Q,
        NOTES,
    ),
    row("evidence-marker-empty", _evidence(lesson_candidate_marker_ids=[""]), Q, MARKS),
    row("evidence-marker-blank", _evidence(lesson_candidate_marker_ids=["m", " \u2029"]), Q, MARKS),
    row("evidence-marker-number", _evidence(lesson_candidate_marker_ids=[1]), Q, MARKS),
    row("evidence-markers-string", _evidence(lesson_candidate_marker_ids="m"), Q, MARKS),
    row(
        "evidence-markers-bad-notes-ok",
        _evidence(discussion_note_ids=[1], lesson_candidate_marker_ids=[""]),
        Q,
        MARKS,
    ),
    # 2.2 reconcile_attempts never invalidates
    *[
        row(f"attempts-{name}-{cat}", [((*path, "reconcile_attempts"), value)], VALID)
        for name, value in ATTEMPT_VALUES
        for cat, path in [("lesson", L0), ("preference", P0), ("decision", D0), ("domain", M0)]
    ],
    # R1 applies only to missing / non-array / empty triggers of an otherwise valid lesson
    row("r1-triggers-missing", [(T0, DELETE)], REPAIRED),
    row("r1-triggers-empty", [(T0, [])], REPAIRED),
    row("r1-triggers-null", [(T0, None)], REPAIRED),
    row("r1-triggers-string", [(T0, "topic")], REPAIRED),
    row("r1-triggers-object", [(T0, {"type": "topic", "value": "x"})], REPAIRED),
    row("r1-not-with-invalid-element", [(T0, [{"type": "topic"}])], Q, TR0),
    row("r1-not-when-summary-bad", [(T0, []), ((*L0, "summary"), "")], Q, f"{L}.summary"),
    row(
        "r1-not-when-scope-bad",
        [(T0, DELETE), ((*L0, "scope_suggestion"), 4)],
        Q,
        f"{L}.scope_suggestion",
    ),
    row("r1-not-when-evidence-bad", [(T0, []), (EV, {})], Q, LEV),
    # R3
    # v2: R3 only for the basic format and the decimal comma; a timestamp is left as written
    row("r3-basic", [(("produced_at",), "20260101T100000Z")], REPAIRED),
    row("r3-basic-minutes", [(("produced_at",), "20260101T1000+0100")], REPAIRED),
    row("r3-comma", [(("produced_at",), "2026-01-01T10:00:00,5Z")], REPAIRED),
    row("r3-not-space", [(("produced_at",), "2026-01-01 10:00:00Z")], VALID),
    row("r3-not-rfc2822", [(("produced_at",), "Tue, 01 Jan 2026 00:00:00 GMT")], VALID),
    row("r3-not-no-offset", [(("produced_at",), "2026-01-01T10:00:00")], VALID),
    row("r3-impossible", [(("produced_at",), "20260230T100000Z")], Q, "produced_at"),
    row("r3-plus-r1", [(("produced_at",), "2026-01-01 10:00"), (T0, [])], REPAIRED),
    row(
        "r3-cannot-fix-other-fault",
        [(("produced_at",), "2026-01-01 10:00"), (("session_id",), "")],
        Q,
        "session_id",
    ),
]


@pytest.mark.usefixtures("utc")
@pytest.mark.parametrize(("edits", "outcome", "where"), RULES)
def test_validity_rules(edits: list[Edit], outcome: Decision, where: str | None) -> None:
    """Each rule of SPEC 2.1/2.2 and each repair trigger, on one side or the other of its edge.

    A quarantined file names where it fails (e.g. ``candidates.lessons[0].source_evidence``); a
    repaired one is valid when decided again; a valid one is left untouched.
    """
    verdict = decide_doc(patched(staging(), *edits))
    assert verdict.decision is outcome, verdict.reasons
    if outcome is VALID:
        assert verdict.reasons == ()
        assert verdict.new_bytes is None
        assert verdict.deadletter == ()
    elif outcome is REPAIRED:
        assert verdict.repairs
        assert verdict.deadletter == ()
        assert decide(verdict.new_bytes or b"", context()).decision is VALID
    else:
        assert verdict.new_bytes is None
        assert verdict.deadletter
        assert verdict.original is not None
    if where is not None:
        assert _names(where, verdict), verdict.reasons


@pytest.mark.parametrize(
    ("old", "new", "outcome"),
    [
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":1e0', VALID, id="1e0"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":1E0', VALID, id="1E0"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":10e-1', VALID, id="10e-1"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":1.000', VALID, id="1.000"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":"1"', QUARANTINED, id="string"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":true', QUARANTINED, id="true"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":1e400', QUARANTINED, id="inf"),
        pytest.param(
            b'"session_id":"sess-1"', b'"session_id":"","session_id":"s"', VALID, id="dup-last-ok"
        ),
        pytest.param(
            b'"session_id":"sess-1"',
            b'"session_id":"s","session_id":" "',
            QUARANTINED,
            id="dup-bad",
        ),
        pytest.param(
            b'"session_id":"sess-1"', b'"session_id":"\\ud800"', VALID, id="lone-surrogate"
        ),
        pytest.param(b'"candidates":{', b'"candidates":{"lessons":null,', VALID, id="dup-cat"),
        pytest.param(b'"schemaVersion":1', b'"schemaVersion":NaN', QUARANTINED, id="nan"),
        pytest.param(b'"schemaVersion":1,', b'"schemaVersion":1,,', QUARANTINED, id="double-comma"),
    ],
)
def test_validity_of_raw_json(old: bytes, new: bytes, outcome: Decision) -> None:
    """Rules that only raw JSON text can express: number spellings, duplicate keys, surrogates."""
    data = encode(staging()).replace(b", ", b",").replace(b": ", b":")
    assert old in data
    verdict = decide(data.replace(old, new, 1), context())
    assert verdict.decision is outcome, verdict.reasons


@pytest.mark.parametrize(
    "value",
    [
        pytest.param([], id="array"),
        pytest.param([staging()], id="array-of-file"),
        pytest.param("staging", id="string"),
        pytest.param(1, id="number"),
        pytest.param(None, id="null"),
        pytest.param(True, id="true"),
    ],
)
def test_file_not_an_object(value: Any) -> None:
    """A JSON value that is not an object is quarantined with one record holding the value."""
    verdict = decide_doc(value)
    assert verdict.decision is QUARANTINED
    [record] = records(verdict)
    assert record["candidate"] == value
    assert record["category"] == "lessons"
    assert record["session_id"] == "malformed-sess-1"


def test_verdict_describes_the_bytes() -> None:
    """sha256 and size are those of the exact bytes decided; the session id is trimmed."""
    data = encode(staging(session_id="\u3000 s-9 \n"))
    verdict = decide(data, context())
    assert verdict.sha256 == hashlib.sha256(data).hexdigest()
    assert verdict.size == len(data)
    assert verdict.session_id == "s-9"


# --- SPEC 3: repairs --------------------------------------------------------------------------


def _multi() -> dict[str, Any]:
    """A file with several candidates per category, unknown keys and exotic values."""
    doc = staging()
    doc["zeta"] = {"inf": math.inf, "surrogate": "\ud800", "big": 10**30, "n": [None, False]}
    doc["candidates"]["lessons"] = [
        lesson(summary="first", extra={"k": [1, 2]}),
        lesson(summary="second", triggers=[]),
        lesson(summary="third", reconcile_attempts=2, note="\u2028"),
        lesson(summary="fourth", triggers=None),
    ]
    doc["candidates"]["preferences"].append(preference(text="second", x=1))
    return doc


@pytest.mark.usefixtures("utc")
@pytest.mark.parametrize(
    ("edits", "rules"),
    [
        pytest.param([], ["R1", "R1"], id="r1-two-lessons"),
        pytest.param([(("produced_at",), "20260101T020000+02")], ["R3", "R1", "R1"], id="r3"),
        pytest.param(
            [(("produced_at",), "2026-01-01T00:00:00,0z")], ["R3", "R1", "R1"], id="r3-comma"
        ),
        pytest.param(
            [(("produced_at",), "Tue, 01 Jan 2026 00:00:00 GMT")], ["R1", "R1"], id="rfc-kept"
        ),
        pytest.param([(("produced_at",), "2026-01-01T00:00:00")], ["R1", "R1"], id="local-kept"),
    ],
)
def test_repairs_change_only_what_they_repair(edits: list[Edit], rules: list[str]) -> None:
    """R1/R3 keep every unknown key and every candidate: the rewritten file equals the input with
    exactly the repaired paths changed, and is ``valid`` when decided again."""
    doc = patched(_multi(), *edits)
    verdict = decide_doc(doc)
    assert verdict.decision is REPAIRED, verdict.reasons
    assert [r.rule for r in verdict.repairs] == rules
    after = decoded(verdict.new_bytes)
    assert after == expected_after_repairs(doc, verdict.repairs)
    assert [r.where for r in verdict.repairs if r.rule == "R1"] == [
        "candidates.lessons[1].triggers",
        "candidates.lessons[3].triggers",
    ]
    if "R3" in rules:
        assert after["produced_at"] == "2026-01-01T00:00:00.000Z"
    again = decide(verdict.new_bytes or b"", context())
    assert again.decision is VALID


def test_r2_bom_only_strips_three_bytes() -> None:
    """R2: a valid file behind a BOM is rewritten as exactly its bytes after the BOM."""
    body = encode(_multi()).replace(b"[]", b'[{"type":"path","value":"a"}]')
    body = body.replace(b"null", b'[{"type":"path","value":"a"}]', 1)
    assert decide(body, context()).decision is VALID
    verdict = decide(BOM + body, context())
    assert verdict.decision is REPAIRED
    assert [r.rule for r in verdict.repairs] == ["R2"]
    assert verdict.new_bytes == body


@pytest.mark.usefixtures("utc")
def test_r2_with_other_repairs() -> None:
    """R2 combines with R1 and R3; the result parses without the BOM and is valid."""
    doc = patched(staging(), (T0, DELETE), (("produced_at",), "20260101T000000Z"))
    verdict = decide(BOM + encode(doc), context())
    assert verdict.decision is REPAIRED
    assert [r.rule for r in verdict.repairs] == ["R2", "R3", "R1"]
    assert verdict.new_bytes is not None
    assert not verdict.new_bytes.startswith(BOM)
    assert decoded(verdict.new_bytes) == expected_after_repairs(doc, verdict.repairs)
    assert decide(verdict.new_bytes, context()).decision is VALID


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(BOM + BOM + encode(staging()), id="double-bom"),
        pytest.param(BOM + b"{", id="bom-then-garbage"),
        pytest.param(BOM + encode(staging(session_id="")), id="bom-and-invalid"),
    ],
)
def test_r2_does_not_save_what_stays_invalid(data: bytes) -> None:
    """After R2 the rest of section 2 still applies; the original bytes go to the dead letters."""
    verdict = decide(data, context())
    assert verdict.decision is QUARANTINED
    assert verdict.new_bytes is None
    assert verdict.original is not None


def test_quarantined_file_is_not_rewritten_after_partial_repair() -> None:
    """A file that fails after all repairs is quarantined as it was: records hold the original."""
    doc = patched(
        staging(), (T0, []), (("produced_at",), "2026-01-01 00:00Z"), (("session_id",), 1)
    )
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    for record in records(verdict):
        assert record["candidate"]["original_staging_file"] == doc


# --- SPEC 3.1: deriving a trigger topic --------------------------------------------------------

TOPIC_KEYS = ["topic", "project", "projectName", "name", "title", "repository", "repo", "scope"]


@pytest.mark.parametrize("winner", range(len(TOPIC_KEYS)), ids=TOPIC_KEYS)
def test_r1_topic_key_order(winner: int) -> None:
    """Source 1: the first string among topic, project, ..., scope wins, before project_root."""
    doc = patched(staging(), (T0, DELETE))
    for key in TOPIC_KEYS[:winner]:
        doc[key] = {"not": "a string"} if key == "project" else 7
    for key in TOPIC_KEYS[winner:]:
        doc[key] = f"  value of \n {key} "
    verdict = decide_doc(doc)
    assert verdict.decision is REPAIRED
    [repair] = verdict.repairs
    assert repair.wrote == [{"type": "topic", "value": f"value of {TOPIC_KEYS[winner]}"}]


@pytest.mark.parametrize(
    ("project_root", "topic"),
    [
        pytest.param("/home/ana/src/example-project/", "example-project", id="spec-example"),
        pytest.param("/home/ana/src/example-project", "example-project", id="no-trailing-slash"),
        pytest.param("/home/ana/src/example-project///", "example-project", id="many-slashes"),
        pytest.param("//home/ana//src/example-project", "example-project", id="double-slashes"),
        pytest.param(".", ".", id="dot-relative"),
    ],
)
def test_r1_project_root_basename(project_root: str, topic: str) -> None:
    """Source 1 (roots): SPEC's example gives ``[{"type": "topic", "value": "example-project"}]``
    (the trailing slash is ignored)."""
    verdict = decide_doc(patched(staging(project_root=project_root), (T0, DELETE)))
    assert verdict.decision is REPAIRED, verdict.reasons
    assert decoded(verdict.new_bytes)["candidates"]["lessons"][0]["triggers"] == [
        {"type": "topic", "value": topic}
    ]


def test_r1_scope_suggestion_when_root_is_slash() -> None:
    """Source 2: with no topic key and a root of ``/`` (no last component), scope_suggestion."""
    doc = patched(
        staging(project_root="/"), (T0, []), ((*L0, "scope_suggestion"), " build\t tools ")
    )
    verdict = decide_doc(doc, project_root="/")
    assert verdict.decision is REPAIRED, verdict.reasons
    assert verdict.repairs[0].wrote == [{"type": "topic", "value": "build tools"}]


@pytest.mark.parametrize(
    ("context_keys", "lesson_fields", "topic"),
    [
        pytest.param({"topic": "T"}, {}, "T", id="topic"),
        pytest.param({"topic": 1, "project": "P"}, {}, "P", id="non-string-skipped"),
        pytest.param({"scope": "S", "project_root": "/a/b"}, {}, "S", id="topic-before-root"),
        pytest.param({"project_root": "/a/b/"}, {}, "b", id="project_root"),
        pytest.param({"cwd": "/c", "root": "/r", "projectRoot": "/p/q"}, {}, "q", id="projectRoot"),
        pytest.param({"cwd": "/c/d", "root": "/r/s"}, {}, "s", id="root-before-cwd"),
        pytest.param({"cwd": "rel/dir"}, {}, "dir", id="cwd-relative"),
        pytest.param({"project_root": 5, "cwd": "/x/y"}, {}, "y", id="non-string-root-skipped"),
        pytest.param({"project_root": "/"}, {}, "scope", id="slash-has-no-component"),
        pytest.param({"project_root": "///"}, {}, "scope", id="slashes-have-no-component"),
        pytest.param({"project_root": ""}, {}, "scope", id="empty-root"),
        pytest.param({"topic": " \n\t "}, {}, "scope", id="blank-topic-then-next-source"),
        pytest.param({}, {"scope_suggestion": " my   scope "}, "my scope", id="scope-collapsed"),
        pytest.param(
            {},
            {
                "scope_suggestion": " ",
                "summary": "The build_cache: 2 bad-things!!",
                "detail": "When using uv, should pin",
            },
            "build cache bad things",
            id="keyword-topic",
        ),
        pytest.param(
            {},
            {"scope_suggestion": 3, "summary": "Ab", "detail": "12 !! ok"},
            "Ab 12 !! ok",
            id="text-when-no-keyword",
        ),
        pytest.param(
            {}, {"scope_suggestion": "", "summary": " ", "detail": "\u3000"}, "lesson", id="lesson"
        ),
        pytest.param(
            {},
            {"scope_suggestion": None, "summary": "\t", "detail": "-- 42 --"},
            "-- 42 --",
            id="text-not-trimmed-away",
        ),
    ],
)
def test_derive_topic_order(
    context_keys: dict[str, Any], lesson_fields: dict[str, Any], topic: str
) -> None:
    """SPEC 3.1: the first non-empty (after collapsing) of context, scope, keywords, text, lesson.

    "The first string among its keys" is read literally: a blank first string is that source,
    which is then empty, so the next numbered source is used.
    """
    the_lesson = {"summary": "s s", "detail": "d d", "scope_suggestion": "scope"}
    the_lesson.update(lesson_fields)
    assert derive_topic(context_keys, the_lesson) == topic


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        pytest.param("Use the cache", "cache", id="stopwords-and-short"),
        pytest.param(
            "the and for with from that this when then into should must have has are was were "
            "use using",
            "",
            id="all-stopwords",
        ),
        pytest.param("THE Cache Layer", "cache layer", id="lower-cased-then-stopwords"),
        pytest.param("abc123def 4567 xy9z", "abc def", id="digits-separate"),
        pytest.param(
            "a`b*c_d#e>f[g]h(i)j{k}l:m;n,o.p!q?r/s\\t|u<v=w+x~y$z%a^b&c-d", "", id="all-separators"
        ),
        pytest.param("alpha`beta*gamma_delta#epsilon", "alpha beta gamma delta", id="first-four"),
        pytest.param('don\'t stop @home "quoted"', 'don\'t stop @home "quoted"', id="kept-chars"),
        pytest.param("Cache\nlayer\tRules\u3000here now", "cache layer rules here", id="js-spaces"),
        pytest.param("alpha\x1cbeta gamma", "alpha\x1cbeta gamma", id="u001c-is-not-a-space"),
        pytest.param("alpha\x85beta gamma", "alpha\x85beta gamma", id="u0085-is-not-a-space"),
        pytest.param("ab ab abc", "abc", id="length-three"),
        pytest.param("ÉCOLE Straße", "école straße", id="unicode-lower"),
    ],
)
def test_keyword_topic(text: str, topic: str) -> None:
    """SPEC 3.1 step 3: lower-case, separators and digits to spaces, >= 3 chars, no stopwords,
    first four words. Whitespace is JavaScript's (``split(/\\s+/)``)."""
    assert keyword_topic(text) == topic


# --- R4: split (opt-in) ------------------------------------------------------------------------


def _mixed() -> dict[str, Any]:
    doc = staging()
    doc["candidates"]["lessons"] = [
        lesson(summary="keep"),
        lesson(summary=""),  # invalid
        lesson(summary="needs R1", triggers=[]),
    ]
    doc["candidates"]["preferences"] = [preference(source_evidence={}), preference()]
    return doc


def test_r4_splits_invalid_candidates() -> None:
    """R4: invalid candidates go to dead letters, the file keeps the valid ones (R1 applied) and
    every other key; the decision is ``repaired`` and the repairs name the records."""
    doc = _mixed()
    verdict = decide_doc(doc, split_invalid_candidates=True)
    assert verdict.decision is REPAIRED, verdict.reasons
    assert verdict.original is not None
    after = decoded(verdict.new_bytes)
    lessons = after["candidates"]["lessons"]
    assert [x["summary"] for x in lessons] == ["keep", "needs R1"]
    assert lessons[0] == doc["candidates"]["lessons"][0]
    assert lessons[1]["triggers"] == [{"type": "topic", "value": "example-project"}]
    assert after["candidates"]["preferences"] == [doc["candidates"]["preferences"][1]]
    for key in ("decisions", "domain", "unknown_category"):
        assert after["candidates"][key] == doc["candidates"][key]
    assert {k: v for k, v in after.items() if k != "candidates"} == {
        k: v for k, v in doc.items() if k != "candidates"
    }
    got = records(verdict)
    assert [(r["category"], r["candidate"]["candidate"]) for r in got] == [
        ("lessons", doc["candidates"]["lessons"][1]),
        ("preferences", doc["candidates"]["preferences"][0]),
    ]
    assert all(r["candidate"]["original_staging_file"] == doc for r in got)
    moved = [r for r in verdict.repairs if r.rule == "R4"]
    assert [r.where for r in moved] == ["candidates.lessons[1]", "candidates.preferences[0]"]
    for repair, record in zip(moved, verdict.deadletter, strict=True):
        assert record.name in str(repair.wrote)
    assert decide(verdict.new_bytes or b"", context()).decision is VALID


def test_r4_is_off_by_default() -> None:
    """Without ``split_invalid_candidates`` the whole file is quarantined, one record per
    candidate of the four categories."""
    doc = _mixed()
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    assert verdict.new_bytes is None
    got = [(r["category"], r["candidate"]["candidate"]) for r in records(verdict)]
    assert got == [(c, item) for c, _i, item in category_items(doc)]


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(patched(_mixed(), (("session_id",), "")), id="file-level-fault"),
        pytest.param(patched(_mixed(), (("produced_at",), "soon")), id="bad-timestamp"),
        pytest.param(patched(_mixed(), (("candidates", "decisions"), None)), id="category-null"),
        pytest.param(
            staging(candidates={"lessons": [lesson(summary="")], "notes": [1, 2, 3]}),
            id="all-invalid-with-unknown-list",
        ),
        pytest.param(
            staging(candidates={"lessons": [lesson(detail="")], "domain": [decision(detail=1)]}),
            id="all-invalid",
        ),
    ],
)
def test_r4_does_not_apply(doc: dict[str, Any]) -> None:
    """R4 needs valid file-level fields; a file whose every candidate is invalid is quarantined
    whole (memstaged's choice: rewriting it with no candidates would keep nothing)."""
    verdict = decide_doc(doc, split_invalid_candidates=True)
    assert verdict.decision is QUARANTINED
    assert verdict.new_bytes is None
    assert not [r for r in verdict.repairs if r.rule == "R4"]


def test_r4_leaves_valid_files_alone() -> None:
    """With the option on, a valid file is still ``valid`` and an R1-only file still ``repaired``
    with no dead letters."""
    assert decide_doc(staging(), split_invalid_candidates=True).decision is VALID
    verdict = decide_doc(patched(staging(), (T0, [])), split_invalid_candidates=True)
    assert verdict.decision is REPAIRED
    assert verdict.deadletter == ()


# --- SPEC 4: dead-letter records ---------------------------------------------------------------

RECORD_KEYS = {"session_id", "produced_at", "attempts", "last_gate_reason", "category", "candidate"}


def test_record_per_candidate() -> None:
    """One record per element of each of the four category arrays, with SPEC 4's fields."""
    doc = patched(_multi(), (("session_id",), 3))
    doc["candidates"]["domain"].append("not even an object")
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    got = records(verdict)
    expected = list(category_items(doc))
    assert len(got) == len(expected) == 9
    for record, (category, _i, item) in zip(got, expected, strict=True):
        assert record.keys() >= RECORD_KEYS
        assert record["session_id"] == "malformed-sess-1"
        assert record["produced_at"] == "2026-01-01T00:00:00.000Z"
        assert record["last_gate_reason"] == "malformed staging file"
        assert record["category"] == category
        assert record["candidate"] == {"candidate": item, "original_staging_file": doc}
    assert [r["attempts"] for r in got] == [0, 0, 2, 0, 0, 0, 0, 0, 0]
    names = [r.name for r in verdict.deadletter]
    assert len(set(names)) == len(names)
    assert all(n.endswith(".json") and is_safe_name(n) for n in names)


def test_record_carries_memstaged_additions() -> None:
    """Each record also holds the source path, the original's name and hash, the validation
    errors and the decision time (under keys of memstaged's choice)."""
    verdict = decide_doc(staging(session_id=""))
    assert verdict.original is not None
    body = verdict.deadletter[0].body.decode()
    for value in (
        f"{PROJECT}/.pi/memory/project/staging/{FILE_NAME}",
        verdict.original,
        verdict.sha256,
        "2026-02-01T10:00:00.000Z",
        *(json.dumps(reason)[1:-1] for reason in verdict.reasons),
    ):
        assert value in body


@pytest.mark.parametrize(
    ("session_id", "file_name", "expected"),
    [
        pytest.param(" s-1\t", FILE_NAME, "s-1", id="trimmed"),
        pytest.param("\u3000s 2\ufeff", FILE_NAME, "s 2", id="js-trimmed"),
        pytest.param("\x1c", FILE_NAME, "\x1c", id="u001c-kept"),
        pytest.param(DELETE, FILE_NAME, "malformed-sess-1", id="missing"),
        pytest.param("", FILE_NAME, "malformed-sess-1", id="empty"),
        pytest.param(" \n", FILE_NAME, "malformed-sess-1", id="blank"),
        pytest.param(42, FILE_NAME, "malformed-sess-1", id="number"),
        pytest.param(None, "a.b.c.json", "malformed-a.b.c", id="dotted-name"),
        pytest.param(None, "x.json.json", "malformed-x.json", id="one-suffix-only"),
    ],
)
def test_record_session_id(session_id: Any, file_name: str, expected: str) -> None:
    """``session_id``: trimmed if non-empty, else ``malformed-`` + the file name without .json."""
    doc = patched(staging(schemaVersion=0), (("session_id",), session_id))
    verdict = decide_doc(doc, file_name=file_name)
    assert {r["session_id"] for r in records(verdict)} == {expected}


@pytest.mark.usefixtures("utc")
@pytest.mark.parametrize(
    ("produced_at", "expected"),
    [
        pytest.param("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00.000Z", id="as-written"),
        pytest.param("2026-03-04", "2026-03-04T00:00:00.000Z", id="date-only"),
        pytest.param("2026-01-01 10:00:00Z", "2026-01-01T10:00:00.000Z", id="space"),
        pytest.param("2026-01-01T10:00:00", "2026-01-01T10:00:00.000Z", id="local"),
        pytest.param("Tue, 01 Jan 2026 00:00:00 GMT", "2026-01-01T00:00:00.000Z", id="rfc"),
        pytest.param("whenever", EPOCH, id="garbage"),
        pytest.param("2026-02-30", "2026-03-02T00:00:00.000Z", id="day-overflow"),
        pytest.param("20260101T100000Z", EPOCH, id="r3-shape"),
        pytest.param(17, EPOCH, id="number"),
        pytest.param(DELETE, EPOCH, id="missing"),
    ],
)
def test_record_produced_at(produced_at: Any, expected: str) -> None:
    """``produced_at``: canonical when it is a timestamp (2.3 or R3), else the epoch."""
    doc = patched(staging(session_id=""), (("produced_at",), produced_at))
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    assert {r["produced_at"] for r in records(verdict)} == {expected}


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [
        pytest.param(3, 3, id="int"),
        pytest.param(2.5, 2.5, id="fraction"),
        pytest.param(-1, -1, id="negative"),
        pytest.param(0, 0, id="zero"),
        pytest.param("3", 0, id="string"),
        pytest.param(True, 0, id="true"),
        pytest.param(None, 0, id="null"),
        pytest.param(math.inf, 0, id="inf"),
        pytest.param(10**399, 0, id="400-digits"),
        pytest.param([3], 0, id="array"),
        pytest.param(DELETE, 0, id="missing"),
    ],
)
def test_record_attempts(attempts: Any, expected: Any) -> None:
    """``attempts``: the candidate's reconcile_attempts if a finite number, else 0."""
    doc = patched(staging(session_id=""), ((*P0, "reconcile_attempts"), attempts))
    [record] = [r for r in records(decide_doc(doc)) if r["category"] == "preferences"]
    assert record["attempts"] == expected
    assert type(record["attempts"]) is type(expected)


@pytest.mark.parametrize(
    ("data", "candidate"),
    [
        pytest.param(b"hello {", "hello {", id="text"),
        pytest.param(b"", "", id="empty-file"),
        pytest.param(b'{"session_id": "s", ', '{"session_id": "s", ', id="truncated-json"),
        pytest.param(BOM + b"[1,]", "[1,]", id="bom-text-after-r2"),
        pytest.param("caf\u00e9 \u2028".encode(), "caf\u00e9 \u2028", id="utf8-text"),
        pytest.param(b"\xff\xfe\x00", "\ufffd\ufffd\x00", id="not-utf8-as-read"),
        pytest.param(b'{"a": "\xc0\xaf"}', {"a": "\ufffd\ufffd"}, id="overlong-utf8-parses"),
        pytest.param(b"[" * 50_000, "[" * 50_000, id="too-deep"),
    ],
)
def test_single_record_for_unparseable(data: bytes, candidate: Any) -> None:
    """SPEC 4.3 v2: text that is not JSON gives one record whose ``candidate`` is the text as
    Node reads it after R2 (v1 wrote null for bytes that are not UTF-8, and kept the BOM); the
    session is ``malformed-<stem>``, the timestamp the epoch."""
    verdict = decide(data, context())
    assert verdict.decision is QUARANTINED
    assert verdict.original is not None
    [record] = records(verdict)
    assert record["candidate"] == candidate
    assert record["category"] == "lessons"
    assert record["session_id"] == "malformed-sess-1"
    assert record["produced_at"] == EPOCH
    assert record["attempts"] == 0
    assert record["last_gate_reason"] == "malformed staging file"
    assert verdict.deadletter[0].name.endswith(".json")


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(patched(staging(), (("candidates",), DELETE)), id="candidates-missing"),
        pytest.param(staging(candidates=[lesson()]), id="candidates-array"),
        pytest.param(staging(candidates=None), id="candidates-null"),
        pytest.param(staging(candidates={}, session_id=""), id="no-category"),
        pytest.param(staging(candidates={"lessons": None}, schemaVersion=2), id="category-null"),
        pytest.param(staging(candidates={"lessons": [], "domain": []}, produced_at=""), id="empty"),
    ],
)
def test_single_record_when_no_candidate(doc: dict[str, Any]) -> None:
    """No candidate to find: one record whose ``candidate`` is the whole parsed value."""
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    [record] = records(verdict)
    assert record["candidate"] == doc
    assert record["category"] == "lessons"
    assert record["attempts"] == 0
    assert record["session_id"] == (doc["session_id"] or "malformed-sess-1")


def test_records_only_for_array_categories() -> None:
    """A non-array category yields no records; the array ones still do."""
    doc = staging(schemaVersion="1")
    doc["candidates"]["lessons"] = None
    verdict = decide_doc(doc)
    assert [r["category"] for r in records(verdict)] == ["preferences", "decisions", "domain"]


def test_too_large_file() -> None:
    """SPEC 6: a file over the limit gives one record, ``candidate`` null, session
    ``malformed-<stem>``, reason ``file too large``."""
    verdict = decide_too_large(context(), "ab" * 32, 9 * 2**20, 8 * 2**20)
    assert verdict.decision is QUARANTINED
    assert verdict.reasons[0].startswith("file too large")
    assert verdict.original is not None
    assert is_safe_name(verdict.original)
    [record] = records(verdict)
    assert record["candidate"] is None
    assert record["session_id"] == "malformed-sess-1"
    assert record["produced_at"] == EPOCH
    assert record["attempts"] == 0
    assert record["last_gate_reason"] == "malformed staging file"
    assert record["category"] == "lessons"


# --- SPEC 4: record names ----------------------------------------------------------------------

HOSTILE_FILE_NAMES = [
    pytest.param("../../x.json", id="dotdot"),
    pytest.param("..json", id="dotdot-json"),
    pytest.param(".hidden.json", id="leading-dot"),
    pytest.param("...json", id="dots"),
    pytest.param("." * 300 + ".json", id="300-dots"),
    pytest.param("a" * 10_000 + ".json", id="10000-chars"),
    pytest.param("\u00e9" * 300 + ".json", id="multibyte"),
    pytest.param("a/b/../c.json", id="slashes"),
    pytest.param("-rf.json", id="leading-dash"),
    pytest.param(" .json", id="space-dot"),
    pytest.param("nul\x00byte.json", id="nul"),
    pytest.param("\ud800.json", id="surrogate"),
    pytest.param(".json", id="only-suffix"),
]


@pytest.mark.parametrize("file_name", HOSTILE_FILE_NAMES)
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(encode(staging(schemaVersion=3)), id="per-candidate"),
        pytest.param(b"not json", id="single"),
    ],
)
def test_record_names_are_sanitized(file_name: str, data: bytes) -> None:
    """Names never contain ``/``, never start with ``.``, stay within 255 bytes, end in .json."""
    verdict = decide(data, context(file_name=file_name))
    assert verdict.decision is QUARANTINED
    assert verdict.original is not None and is_safe_name(verdict.original)
    for record in verdict.deadletter:
        assert is_safe_name(record.name), record.name
        assert record.name.endswith(".json")
        assert record.name.isascii()


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("../../x", id="dotdot"),
        pytest.param("/etc/passwd", id="absolute"),
        pytest.param(".hidden", id="leading-dot"),
        pytest.param("s" * 10_000, id="10000-chars"),
        pytest.param("a/../../b\x00c", id="nul"),
    ],
)
def test_hostile_session_ids_do_not_reach_names(session_id: str) -> None:
    """A session id never leads a record outside ``deadletter/`` nor makes its name too long;
    the record still holds the session id itself."""
    verdict = decide_doc(staging(session_id=session_id, schemaVersion=None))
    assert verdict.decision is QUARANTINED
    for record in verdict.deadletter:
        assert is_safe_name(record.name)
    assert {r["session_id"] for r in records(verdict)} == {session_id}


def test_identical_bytes_identical_names() -> None:
    """Quarantining the same bytes twice yields the same record names (no second set), at any
    time; different bytes yield different names."""
    data = encode(staging(session_id=""))
    first = decide(data, context(decided_at="2026-01-01T00:00:00.000Z"))
    second = decide(data, context(decided_at="2027-06-01T00:00:00.000Z"))
    assert [r.name for r in first.deadletter] == [r.name for r in second.deadletter]
    assert first.original == second.original
    other = decide(data + b" ", context())
    assert {r.name for r in other.deadletter}.isdisjoint(r.name for r in first.deadletter)
    assert other.original != first.original


# --- SPEC 2.4: foreign -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("project_root", "outcome"),
    [
        pytest.param(PROJECT, VALID, id="same"),
        pytest.param(PROJECT + "/", VALID, id="trailing-slash"),
        pytest.param(PROJECT + "///", VALID, id="trailing-slashes"),
        pytest.param("/home//ana///src/example-project", VALID, id="repeated-slashes"),
        pytest.param("/" + PROJECT, VALID, id="double-slash-prefix"),
        pytest.param("//" + PROJECT, VALID, id="triple-slash-prefix"),
        pytest.param("/home/ana/./src/example-project/.", VALID, id="dots"),
        pytest.param(PROJECT + "/sub/..", VALID, id="dotdot-back"),
        pytest.param("/home/ana/src/x/../example-project", VALID, id="dotdot-sibling"),
        pytest.param(f" \t{PROJECT}\u3000\n", VALID, id="trimmed"),
        pytest.param(".", VALID, id="relative-dot"),
        pytest.param("./", VALID, id="relative-dot-slash"),
        pytest.param("sub/..", VALID, id="relative-sub-back"),
        pytest.param("../example-project", VALID, id="relative-via-parent"),
        pytest.param("/../../home/ana/src/example-project", VALID, id="dotdot-above-root"),
        pytest.param("sub", FOREIGN, id="relative-sub"),
        pytest.param("..", FOREIGN, id="relative-parent"),
        pytest.param("../other", FOREIGN, id="relative-sibling"),
        pytest.param("/home/ana/src/other-project", FOREIGN, id="other"),
        pytest.param("/home/ana/src", FOREIGN, id="ancestor"),
        pytest.param(PROJECT + "/sub", FOREIGN, id="descendant"),
        pytest.param(PROJECT + "/..", FOREIGN, id="dotdot-out"),
        pytest.param("/", FOREIGN, id="root"),
        pytest.param("/home/ana/src/Example-Project", FOREIGN, id="case-differs"),
        pytest.param(PROJECT + " x", FOREIGN, id="inner-space-kept"),
        pytest.param(PROJECT + "\x1c", FOREIGN, id="u001c-not-trimmed"),
        pytest.param("", QUARANTINED, id="empty-not-foreign"),
        pytest.param("  \u00a0", QUARANTINED, id="blank-not-foreign"),
    ],
)
def test_foreign_paths(project_root: str, outcome: Decision) -> None:
    """SPEC 2.4: the trimmed project_root, resolved against the root and normalized lexically,
    must equal the project root; an empty or blank one is invalid, not foreign."""
    verdict = decide_doc(staging(project_root=project_root))
    assert verdict.decision is outcome, verdict.reasons


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(staging(project_root="/elsewhere", session_id=""), id="invalid-session"),
        pytest.param(staging(project_root="/elsewhere", candidates=[]), id="candidates-array"),
        pytest.param(staging(project_root="/elsewhere", schemaVersion="1"), id="bad-version"),
        pytest.param(patched(staging(project_root="/elsewhere"), (T0, DELETE)), id="would-be-r1"),
        pytest.param(
            staging(project_root="/elsewhere", produced_at="2026-01-01 00:00Z"), id="would-be-r3"
        ),
        pytest.param({"project_root": "/elsewhere"}, id="nothing-else"),
    ],
)
@pytest.mark.parametrize("bom", [b"", BOM], ids=["plain", "bom"])
@pytest.mark.parametrize("split", [False, True], ids=["nosplit", "split"])
def test_malformed_foreign_is_foreign(doc: dict[str, Any], bom: bytes, split: bool) -> None:
    """A file naming another project is ``foreign`` whatever else is wrong: never repaired,
    rewritten or quarantined."""
    verdict = decide(bom + encode(doc), context(split_invalid_candidates=split))
    assert verdict.decision is FOREIGN
    assert verdict.new_bytes is None
    assert verdict.deadletter == ()
    assert verdict.original is None
    assert verdict.repairs == ()


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(staging(project_root=5, session_id=""), id="number-root"),
        pytest.param(staging(project_root=["/elsewhere"], session_id=""), id="array-root"),
        pytest.param(["/elsewhere"], id="not-an-object"),
        pytest.param("/elsewhere", id="string-file"),
    ],
)
def test_no_foreign_without_a_root_string(doc: Any) -> None:
    """Only a non-empty ``project_root`` string can make a file foreign."""
    assert decide_doc(doc).decision is QUARANTINED


def test_unparseable_naming_another_project_is_not_foreign() -> None:
    """Text that does not parse names no project: it is quarantined (or deferred)."""
    data = b'{"project_root": "/elsewhere", '
    assert decide(data, context()).decision is QUARANTINED
    assert decide(data, context(settled=False)).decision is Decision.DEFERRED


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    """Paths are compared lexically: a link to the project is another path, so foreign."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert link.resolve() == real.resolve()

    def outcome(ctx_root: Path, file_root: Path) -> Decision:
        doc = staging(project_root=str(file_root))
        return decide(encode(doc), context(project_root=str(ctx_root))).decision

    assert outcome(real, real) is VALID
    assert outcome(link, link) is VALID
    assert outcome(real, link) is FOREIGN
    assert outcome(link, real) is FOREIGN
    assert outcome(real, link / ".." / "real") is VALID  # lexical: link/.. is tmp_path


# --- SPEC 5: deferred -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "settled", "outcome"),
    [
        pytest.param(b'{"schemaVersion": 1, "sess', False, Decision.DEFERRED, id="truncated"),
        pytest.param(b"", False, Decision.DEFERRED, id="empty"),
        pytest.param(b"\xff\xfe", False, Decision.DEFERRED, id="not-utf8"),
        pytest.param(BOM, False, Decision.DEFERRED, id="bom-only"),
        pytest.param(b'{"schemaVersion": 1, "sess', True, QUARANTINED, id="settled-truncated"),
        pytest.param(b"", True, QUARANTINED, id="settled-empty"),
        pytest.param(encode(staging(session_id="")), False, QUARANTINED, id="parses-invalid"),
        pytest.param(encode(staging()), False, VALID, id="parses-valid"),
        pytest.param(encode(patched(staging(), (T0, []))), False, REPAIRED, id="parses-r1"),
    ],
)
def test_unparseable_and_unsettled_is_deferred(
    data: bytes, settled: bool, outcome: Decision
) -> None:
    """Only a file that does not parse and has not settled is deferred; nothing is written."""
    verdict = decide(data, context(settled=settled))
    assert verdict.decision is outcome
    if outcome is Decision.DEFERRED:
        assert verdict.deadletter == ()
        assert verdict.new_bytes is None
        assert verdict.original is None
        assert verdict.reasons


def test_deep_unknown_key_is_valid() -> None:
    """A valid file with a 2,000-deep unknown key is valid to JSON.parse, hence to memstaged."""
    data = encode(staging()).replace(b"{", b'{"deep":' + b"[" * 2000 + b"]" * 2000 + b",", 1)
    assert decide(data, context()).decision is VALID


def _at_stack_depth(frames: int, data: bytes) -> Decision:
    if frames:
        return _at_stack_depth(frames - 1, data)
    return decide(data, context()).decision


def test_decision_does_not_depend_on_caller_stack() -> None:
    """The same bytes get the same decision however deep the caller's stack is (daemon, --once,
    a worker thread): a 700-deep unknown key must not flip a file between repaired and
    quarantined."""
    doc = patched(staging(), (T0, DELETE))
    data = encode(doc).replace(b"{", b'{"deep":' + b"[" * 700 + b"]" * 700 + b",", 1)
    assert _at_stack_depth(0, data) is _at_stack_depth(400, data)


# --- SPEC 3 v2: R5 adds absent categories, R6 unwraps re-queued wrappers ----------------------


@pytest.mark.parametrize("absent", [["domain"], ["decisions", "domain"], ["lessons"]])
def test_r5_adds_absent_categories(absent: list[str]) -> None:
    """R5 (issue 11 item 2): a file missing category arrays is not valid (the reconciler of
    2026-06-10 rejects it); each absent one is added as [], nothing else changes, and the
    rewrite is valid when decided again."""
    doc = patched(staging(), *((("candidates", c), DELETE) for c in absent))
    verdict = decide_doc(doc)
    assert verdict.decision is REPAIRED, verdict.reasons
    assert [(r.rule, r.where, r.wrote) for r in verdict.repairs] == [
        ("R5", f"candidates.{c}", []) for c in absent
    ]
    after = decoded(verdict.new_bytes)
    assert after == patched(doc, *((("candidates", c), []) for c in absent))
    assert decide(verdict.new_bytes or b"", context()).decision is VALID


def test_r5_does_not_repair_a_category_that_is_not_an_array() -> None:
    """R5: a present category that is not an array is not repaired."""
    verdict = decide_doc(patched(staging(), (("candidates", "domain"), None)))
    assert verdict.decision is QUARANTINED
    assert "candidates.domain: must be an array" in verdict.reasons


def _wrapper(candidate: Any, **extra: Any) -> dict[str, Any]:
    return {"candidate": candidate, "original_staging_file": {"schemaVersion": 1}, **extra}


def test_r6_unwraps_requeued_wrappers_and_names_the_original() -> None:
    """R6 (issue 11 item 2): wrappers put back by the agent's /memory recover are replaced by
    their candidate, the wrapper's finite reconcile_attempts carried over; the verdict is
    ``repaired`` with no records and ``original`` set, so the original bytes are dead-lettered
    before the rewrite, and each R6 repair names where they go."""
    doc = staging()
    doc["candidates"]["preferences"] = [
        _wrapper(preference(), reconcile_attempts=2),
        _wrapper(preference(text="second", reconcile_attempts=7), reconcile_attempts="x"),
        preference(text="plain"),
    ]
    data = encode(doc)
    verdict = decide(data, context())
    assert verdict.decision is REPAIRED, verdict.reasons
    assert verdict.deadletter == ()
    sha = verdict.sha256
    assert verdict.original == original_name("sess-1.json", sha)
    r6 = [r for r in verdict.repairs if r.rule == "R6"]
    assert [r.where for r in r6] == ["candidates.preferences[0]", "candidates.preferences[1]"]
    assert all(r.wrote["original"] == f"deadletter/originals/{verdict.original}" for r in r6)
    after = decoded(verdict.new_bytes)
    assert after["candidates"]["preferences"] == [
        {**preference(), "reconcile_attempts": 2},
        preference(text="second", reconcile_attempts=7),
        preference(text="plain"),
    ]
    assert decide(verdict.new_bytes or b"", context()).decision is VALID


@pytest.mark.parametrize(
    "element",
    [
        pytest.param(_wrapper(preference(), extra=1), id="extra-key"),
        pytest.param({"candidate": preference()}, id="no-original"),
        pytest.param(_wrapper("text"), id="candidate-not-object"),
    ],
)
def test_r6_only_for_exact_wrappers(element: Any) -> None:
    """R6: only an object with exactly candidate, original_staging_file (and reconcile_attempts)
    whose candidate is an object is unwrapped; anything else stays and is quarantined."""
    doc = patched(staging(), (("candidates", "preferences"), [element]))
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    assert not [r for r in verdict.repairs if r.rule == "R6"]


def test_r6_undoes_the_agents_recover_of_memstageds_own_record() -> None:
    """R6 then R1: a lesson quarantined by memstaged, re-queued as the agent's /memory recover
    does it (spreading record.candidate), comes back as the lesson with derived triggers."""
    bad = patched(staging(session_id=""), (("candidates", "lessons", 0, "triggers"), DELETE))
    [record] = [r for r in records(decide_doc(bad)) if r["category"] == "lessons"]
    requeued = staging()
    requeued["candidates"]["lessons"] = [{**record["candidate"]}]
    verdict = decide_doc(requeued)
    assert verdict.decision is REPAIRED, verdict.reasons
    assert [r.rule for r in verdict.repairs] == ["R6", "R1"]
    [lesson_after] = decoded(verdict.new_bytes)["candidates"]["lessons"]
    assert lesson_after == {**bad["candidates"]["lessons"][0], "triggers": lesson_after["triggers"]}


# --- SPEC 3.1 v2: blank context keys ----------------------------------------------------------


@pytest.mark.parametrize(
    ("context_keys", "expected"),
    [
        pytest.param({"topic": "  ", "project": "alpha"}, "alpha", id="blank-topic-passed-over"),
        pytest.param({"topic": 3, "name": "\u3000\n", "repo": " b  c "}, "b c", id="non-string"),
        pytest.param(
            {"project_root": "/home/ana/src/example-project/"}, "example-project", id="spec"
        ),
        pytest.param({"project_root": "/", "cwd": "/w/tool"}, "tool", id="root-has-no-basename"),
        pytest.param({"project_root": "/x/  ", "root": "/r/y//"}, "y", id="blank-basename"),
        pytest.param({"project_root": "///"}, "project", id="falls-to-scope"),
    ],
)
def test_topic_passes_over_blank_context_keys(context_keys: dict[str, Any], expected: str) -> None:
    """SPEC 3.1 v2 (issue 11 item 2): a context key whose value is blank is passed over and the
    next one tried (v1 stopped at the first string); basenames are Node's."""
    assert derive_topic(context_keys, lesson()) == expected


# --- SPEC 2 v2: bytes read as Node reads them -------------------------------------------------


def test_invalid_utf8_valid_file_is_left_untouched() -> None:
    """SPEC 2 v2 (issue 11 item 2): a stray non-UTF-8 byte inside a string reads as U+FFFD;
    the file is valid, decided on the decoded text, and not touched."""
    data = encode(staging()).replace(b"Prefer small", b"Prefer \xff small")
    verdict = decide(data, context())
    assert verdict.decision is VALID, verdict.reasons
    assert verdict.new_bytes is None and verdict.deadletter == ()


def test_invalid_utf8_foreign_file_is_foreign() -> None:
    """Issue 11: memstaged moved another project's file with a stray byte out of staging/;
    read as Node reads it, it is foreign, whatever else is wrong with it."""
    doc = staging(project_root="/elsewhere", session_id="")
    data = encode(doc).replace(b"Prefer small", b"Prefer \xc0 small")
    assert decide(data, context()).decision is FOREIGN


def test_bom_and_invalid_utf8_rewrites_utf8() -> None:
    """R2 on a file with invalid bytes: the rewrite is the decoded text as UTF-8 (U+FFFD in
    place), which Node reads as the same value, and is then valid."""
    data = encode(staging()).replace(b"Prefer small", b"Prefer \xe2\x82 small")
    verdict = decide(BOM + data, context())
    assert verdict.decision is REPAIRED
    assert verdict.new_bytes == data.decode("utf-8", "replace").encode("utf-8")
    assert decide(verdict.new_bytes, context()).decision is VALID


# --- any depth (issue 10 item 15) -------------------------------------------------------------


def test_million_levels_valid_file_is_valid() -> None:
    """Issue 10 item 15: a valid file holding an unknown key nested 1,000,000 levels deep
    (2 MB, within the 8 MiB limit) is valid, as Node finds it; no RecursionError."""
    data = encode(staging()).replace(
        b'"extractor"', b'"deep":' + b"[" * 10**6 + b"]" * 10**6 + b',"extractor"', 1
    )
    verdict = decide(data, context())
    assert verdict.decision is VALID, verdict.reasons


def test_million_levels_repaired_file_keeps_its_depth() -> None:
    """Issue 10 item 15: the same depth in a file that needs R1 is repaired; the rewrite is
    encoded without recursion and holds the same deep value."""
    doc = patched(staging(), (("candidates", "lessons", 0, "triggers"), DELETE))
    data = encode(doc).replace(
        b'"extractor"', b'"deep":' + b"[" * 10**6 + b"]" * 10**6 + b',"extractor"', 1
    )
    verdict = decide(data, context())
    assert verdict.decision is REPAIRED, verdict.reasons
    assert verdict.new_bytes is not None
    assert b"[" * 10**6 + b"]" * 10**6 in verdict.new_bytes
    assert decide(verdict.new_bytes, context()).decision is VALID


def test_million_levels_is_never_a_depth_quarantine() -> None:
    """Issue 10 item 15: a million nested arrays is JSON; it is quarantined only because it is
    not an object, never for its depth."""
    verdict = decide(b"[" * 10**6 + b"]" * 10**6, context())
    assert verdict.decision is QUARANTINED
    assert verdict.reasons == ("the file is not a JSON object",)


# --- SPEC 4 v2: records and reasons, bounded (issue 10 item 9) --------------------------------


def test_record_errors_are_its_own_and_the_files() -> None:
    """SPEC 4 v2: a record's errors are its own candidate's and the file-level ones only."""
    doc = staging(session_id="")
    doc["candidates"]["preferences"] = [preference(text=""), preference()]
    by_index = {
        r["memstaged"]["source_file"] + str(i): r for i, r in enumerate(records(decide_doc(doc)))
    }
    errors = [r["memstaged"]["errors"] for r in by_index.values()]
    assert ["session_id: must be a non-empty string"] in errors  # a valid candidate's record
    assert [
        "session_id: must be a non-empty string",
        "candidates.preferences[0].text: must be a non-empty string",
    ] in errors


def test_records_reference_the_original_when_embedding_would_be_too_large() -> None:
    """SPEC 4 v2: when every record embedding the whole file would pass max(16 x size, 64 MiB),
    ``original_staging_file`` names the original and its hash instead; below it, the file is
    embedded as parsed."""
    small = staging(session_id="")
    [first, *_] = records(decide_doc(small))
    assert first["candidate"]["original_staging_file"] == small
    big = staging(session_id="", padding="x" * (200 * 1024))
    big["candidates"]["preferences"] = [{}] * 400  # 400 records x 200 KB > 64 MiB
    verdict = decide_doc(big)
    assert len(encode(big)) * 403 > EMBED_LIMIT
    body = parse_json(verdict.deadletter[5].body).value
    assert body["candidate"]["original_staging_file"] == {
        "memstaged_original": verdict.original,
        "sha256": verdict.sha256,
    }
    assert body["candidate"]["candidate"] == {}


def test_records_are_rendered_on_demand() -> None:
    """Issue 10 item 9: a record keeps no bytes; each read of ``body`` renders the same bytes."""
    verdict = decide_doc(staging(session_id=""))
    record = verdict.deadletter[0]
    assert not hasattr(record, "__dict__") and "body" not in type(record).__slots__
    assert record.body == record.body


def test_reasons_are_bounded() -> None:
    """The log's reasons list at most MAX_REASONS errors and says how many more."""
    doc = staging(session_id="")
    doc["candidates"]["preferences"] = [{}] * 500
    verdict = decide_doc(doc)
    assert len(verdict.reasons) == MAX_REASONS + 1
    assert verdict.reasons[-1].startswith("... and ")


def test_too_large_record_is_as_spec_says() -> None:
    """SPEC 6: a file over the size limit gets one record, candidate null, session
    malformed-<name>, reason ``file too large``."""
    verdict = decide_too_large(context(), "ab" * 32, 9 << 20, 8 << 20)
    [record] = records(verdict)
    assert record["candidate"] is None
    assert record["session_id"] == "malformed-sess-1"
    assert record["memstaged"]["errors"] == ["file too large"]
