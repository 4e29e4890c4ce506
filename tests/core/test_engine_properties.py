"""Properties of the triage engine over generated inputs (hypothesis).

The default run uses the ``memstaged-engine`` profile (300 examples, no deadline); set
``MEMSTAGED_HYPOTHESIS_PROFILE=memstaged-engine-fuzz`` for a long fuzzing run.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.documents import DELETE, decision, lesson, preference
from support.engine import (
    PROJECT,
    category_items,
    context,
    decoded,
    encode,
    expected_after_repairs,
    is_safe_name,
    patched,
    records,
    staging,
)

from memstaged.core.decide import BOM, Context, Decision, Verdict, decide
from memstaged.core.schema import CATEGORIES

settings.register_profile(
    "memstaged-engine",
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "memstaged-engine-fuzz",
    deadline=None,
    max_examples=20_000,
    suppress_health_check=[HealthCheck.too_slow],
)
ENGINE = settings.get_profile(os.environ.get("MEMSTAGED_HYPOTHESIS_PROFILE", "memstaged-engine"))

PROJECT_TOPIC = [{"type": "topic", "value": "example-project"}]

# --- strategies --------------------------------------------------------------------------------

_CHARS = st.one_of(
    st.characters(),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
    st.sampled_from(["\x1c", "\x85", "\u180e", "\u200b", "\u3000", "\ufeff", "\u2028", " ", "\t"]),
)
TEXT = st.one_of(
    st.text(_CHARS, max_size=12),
    st.sampled_from(["", " ", "2026-01-01", "2026-01-01 10:00Z", "Tue, 01 Jan 2026 00:00:00 GMT"]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**308, max_value=10**400),
    st.floats(allow_nan=False),
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=16,
)
#: Values that sit on the edge of a rule somewhere in a staging file.
EDGE = st.sampled_from(
    [
        DELETE, None, "", " ", "x", 1, 1.0, True, 0, [], {}, [1], ["m"], [""], float("inf"),
        "2026-01-01 10:00Z", "Tue, 01 Jan 2026 00:00:00 GMT", "2026-02-29", "\x1c", "\ud800",
        "/elsewhere", ".", [{"type": "topic"}], [{"type": "tool", "value": "v", "pattern": 1}],
        {"discussion_note_ids": []}, {"lesson_candidate_marker_ids": ["m"]},
    ]
)  # fmt: skip


def _paths(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.extend(_paths(item, (*prefix, i)))
    return out


def _base() -> dict[str, Any]:
    doc = staging()
    doc["candidates"]["lessons"].append(lesson(summary="second", reconcile_attempts=1))
    doc["candidates"]["preferences"].append(preference(text="second"))
    return doc


REPAIRABLE_AT = st.sampled_from(
    ["2026-01-01 10:00Z", "2026-01-01T10:00:00", "Tue, 01 Jan 2026 00:00:00 GMT", " 2026-01-01 "]
)
NO_TRIGGERS = st.sampled_from([DELETE, [], None, "topic", {"type": "topic", "value": "x"}, 0])


@st.composite
def mutated_files(draw: st.DrawFn) -> dict[str, Any]:
    """A valid staging file with repairable faults (R1, R3) and zero to three values deleted or
    replaced anywhere in it."""
    doc = _base()
    doc["project_root"] = draw(st.sampled_from([PROJECT, PROJECT, PROJECT, " ./ ", "/elsewhere"]))
    if draw(st.booleans()):
        doc["produced_at"] = draw(REPAIRABLE_AT)
    for i in range(len(doc["candidates"]["lessons"])):
        if draw(st.booleans()):
            doc = patched(doc, (("candidates", "lessons", i, "triggers"), draw(NO_TRIGGERS)))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        value = draw(st.one_of(EDGE, JSON) if draw(st.integers(0, 4)) == 0 else EDGE)
        if value is DELETE and isinstance(path[-1], int):
            value = None
        doc = patched(doc, (path, value))
        if not isinstance(doc, dict):
            break
    return doc


# --- the invariants every verdict keeps ---------------------------------------------------------


def check_verdict(data: bytes, ctx: Context, verdict: Verdict) -> None:
    """What must hold of any verdict: one decision, with exactly the data it needs."""
    assert isinstance(verdict, Verdict)
    event(f"decision: {verdict.decision}")
    event(f"rules: {sorted({r.rule for r in verdict.repairs})}")
    assert verdict.decision in (
        Decision.VALID,
        Decision.REPAIRED,
        Decision.QUARANTINED,
        Decision.FOREIGN,
        Decision.DEFERRED,
    )
    assert verdict.size == len(data)
    if verdict.decision is Decision.DEFERRED:
        assert not ctx.settled
    if verdict.decision in (Decision.VALID, Decision.FOREIGN, Decision.DEFERRED):
        assert verdict.new_bytes is None
        assert verdict.deadletter == ()
        assert verdict.original is None
    if verdict.decision is Decision.QUARANTINED:
        assert verdict.new_bytes is None
        assert verdict.deadletter
        assert verdict.original is not None and is_safe_name(verdict.original)
    if verdict.decision is Decision.REPAIRED:
        assert verdict.new_bytes is not None
        assert verdict.repairs
        again = decide(verdict.new_bytes, ctx)
        assert again.decision is Decision.VALID, again.reasons
    for record in verdict.deadletter:
        assert is_safe_name(record.name) and record.name.endswith(".json")
        body = decoded(record.body)
        assert body["last_gate_reason"] == "malformed staging file"
        assert body["category"] in CATEGORIES
    names = [r.name for r in verdict.deadletter]
    assert len(set(names)) == len(names)


def _decide(data: bytes, ctx: Context) -> Verdict:
    verdict = decide(data, ctx)
    check_verdict(data, ctx, verdict)
    return verdict


def _contexts() -> st.SearchStrategy[Context]:
    return st.builds(
        context,
        settled=st.booleans(),
        split_invalid_candidates=st.booleans(),
    )


# --- properties ---------------------------------------------------------------------------------


@ENGINE
@given(data=st.binary(max_size=400), ctx=_contexts())
def test_any_bytes_one_decision(data: bytes, ctx: Context) -> None:
    """Any bytes get exactly one decision and decide() never raises."""
    _decide(data, ctx)


@ENGINE
@given(
    doc=mutated_files(),
    ctx=_contexts(),
    cut=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    bom=st.booleans(),
)
def test_damaged_bytes_one_decision(
    doc: dict[str, Any], ctx: Context, cut: int, byte: int, bom: bool
) -> None:
    """Truncated or byte-flipped staging files (with or without a BOM) never make decide() raise."""
    data = encode(doc)
    cut %= len(data) + 1
    _decide((BOM if bom else b"") + data[:cut], ctx)
    _decide(data[:cut] + bytes([byte]) + data[cut + 1 :], ctx)


@ENGINE
@given(value=JSON, ctx=_contexts())
def test_any_json_value_one_decision(value: Any, ctx: Context) -> None:
    """Any JSON value, as the file or as its ``candidates``, gets one decision without raising."""
    _decide(encode(value), ctx)
    _decide(encode(staging(candidates=value)), ctx)
    _decide(encode(staging(candidates={"lessons": value, "domain": [value]})), ctx)


@ENGINE
@given(doc=mutated_files(), bom=st.booleans())
def test_mutated_files_r1_to_r3_keep_every_candidate(doc: Any, bom: bool) -> None:
    """On a mutated file, R1-R3 never drop or alter what they do not repair: the rewritten file is
    the input with exactly the repaired paths changed, and is valid when decided again."""
    ctx = context()
    verdict = _decide((BOM if bom else b"") + encode(doc), ctx)
    if verdict.decision is Decision.REPAIRED:
        after = decoded(verdict.new_bytes)
        assert after == expected_after_repairs(doc, verdict.repairs)
        assert Counter(c for c, _i, _x in category_items(after)) == Counter(
            c for c, _i, _x in category_items(doc)
        )
        r1 = {r.where for r in verdict.repairs if r.rule == "R1"}
        for (c, i, old), (_c, _i, new) in zip(
            category_items(doc), category_items(after), strict=True
        ):
            if f"candidates.{c}[{i}].triggers" not in r1:
                assert new == old
            else:
                assert {k: v for k, v in new.items() if k != "triggers"} == {
                    k: v for k, v in old.items() if k != "triggers"
                }
    if verdict.decision is Decision.QUARANTINED:
        got = records(verdict)
        items = list(category_items(doc))
        if items:
            assert [(r["category"], r["candidate"]["candidate"]) for r in got] == [
                (c, x) for c, _i, x in items
            ]
        else:
            [record] = got
            assert record["candidate"] == doc


# --- R4 ------------------------------------------------------------------------------------------

#: (label, candidate) per category: "ok" is valid, "r1" needs derived triggers, "bad" is invalid.
POOL: dict[str, list[tuple[str, Any]]] = {
    "lessons": [
        ("ok", lesson()),
        ("ok", lesson(summary="other", reconcile_attempts="x")),
        ("r1", lesson(triggers=[])),
        ("r1", lesson(triggers=DELETE)),
        ("r1", lesson(triggers="path")),
        ("bad", lesson(summary="")),
        ("bad", lesson(triggers=[{"type": "regex", "value": "x"}])),
        ("bad", lesson(triggers=[], source_evidence={})),
        ("bad", "not an object"),
        ("bad", None),
    ],
    "preferences": [
        ("ok", preference()),
        ("bad", preference(text=" ")),
        ("bad", preference(source_evidence={"discussion_note_ids": [float("inf")]})),
    ],
    "decisions": [
        ("ok", decision()),
        ("bad", decision(detail=DELETE)),
        ("bad", decision(source_evidence={"lesson_candidate_marker_ids": [""]})),
    ],
    "domain": [("ok", decision(summary="d")), ("bad", decision(summary=5)), ("bad", [])],
}


@st.composite
def split_files(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A file with valid file-level fields and labelled candidates in each category."""
    doc = staging(produced_at=draw(st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01 00:00Z"])))
    labels: dict[str, list[str]] = {}
    for category in CATEGORIES:
        chosen = draw(st.lists(st.sampled_from(POOL[category]), max_size=4))
        doc["candidates"][category] = [copy.deepcopy(c) for _label, c in chosen]
        labels[category] = [label for label, _c in chosen]
    return doc, labels


@ENGINE
@given(case=split_files())
def test_r4_keeps_valid_and_dead_letters_exactly_the_invalid(
    case: tuple[dict[str, Any], dict[str, list[str]]],
) -> None:
    """With R4 on, the rewritten file keeps every valid candidate (R1 applied) in order, and the
    dead letters hold exactly the invalid ones, as they were; with no valid candidate at all the
    file is quarantined whole; with R4 off any invalid candidate quarantines the file."""
    doc, labels = case
    kept = {
        c: [
            patched(x, (("triggers",), PROJECT_TOPIC)) if label == "r1" else x
            for label, x in zip(labels[c], doc["candidates"][c], strict=True)
            if label != "bad"
        ]
        for c in CATEGORIES
    }
    bad = [
        (c, x)
        for c in CATEGORIES
        for label, x in zip(labels[c], doc["candidates"][c], strict=True)
        if label == "bad"
    ]
    n_kept = sum(len(v) for v in kept.values())

    verdict = _decide(encode(doc), context(split_invalid_candidates=True))
    if not bad:
        assert verdict.decision in (Decision.VALID, Decision.REPAIRED)
        assert verdict.deadletter == ()
    elif n_kept == 0:
        assert verdict.decision is Decision.QUARANTINED
    else:
        assert verdict.decision is Decision.REPAIRED
        after = decoded(verdict.new_bytes)
        assert {c: after["candidates"][c] for c in CATEGORIES} == kept
        assert after["candidates"]["unknown_category"] == doc["candidates"]["unknown_category"]
        assert {k: v for k, v in after.items() if k not in ("candidates", "produced_at")} == {
            k: v for k, v in doc.items() if k not in ("candidates", "produced_at")
        }
        got = records(verdict)
        assert [(r["category"], r["candidate"]["candidate"]) for r in got] == bad
        assert all(r["candidate"]["original_staging_file"] == doc for r in got)
        assert verdict.original is not None

    unsplit = _decide(encode(doc), context())
    assert unsplit.decision is (Decision.QUARANTINED if bad else verdict.decision)


@ENGINE
@given(case=split_files(), name=st.text(_CHARS, max_size=300), session=TEXT)
def test_record_names_always_safe(
    case: tuple[dict[str, Any], dict[str, list[str]]], name: str, session: str
) -> None:
    """Whatever the file name and session id, record and original names are safe, and the same
    bytes under the same name give the same names."""
    doc, _labels = case
    doc["schemaVersion"] = 0
    doc["session_id"] = session
    ctx = context(file_name=name + ".json")
    first = _decide(encode(doc), ctx)
    second = decide(encode(doc), context(file_name=name + ".json", decided_at="2030-01-01"))
    assert [r.name for r in first.deadletter] == [r.name for r in second.deadletter]
    assert first.original == second.original
