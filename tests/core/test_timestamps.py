"""``produced_at`` in contract v2: timestamps (SPEC 2.3), R3's narrow forms, canonical form.

``Date.parse`` itself is compared with Node in ``test_dateparse_node.py``; these tests hold the
rules built on it. Expected values were measured with Node 20 (``new Date(text).toISOString()``)
under the equivalent zone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from support.engine import Form, classify

from memstaged.core.timestamps import (
    EPOCH,
    canonical,
    canonical_or_epoch,
    format_epoch_ms,
    is_timestamp,
    repairable,
)

#: POSIX TZ strings: glibc reads them without a tz database.
NEW_YORK = "EST5EDT,M3.2.0,M11.1.0"
TOKYO = "JST-9"

UseTZ = Callable[[str], None]


@pytest.fixture
def local_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[UseTZ]:
    """Set the machine's local time zone for one test (``TZ`` + ``tzset``), restored afterwards."""

    def use(tz: str) -> None:
        monkeypatch.setenv("TZ", tz)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01 10:00:00", "2026-01-01T15:00:00.000Z"),
        ("2026/06/10", "2026-06-10T04:00:00.000Z"),
        ("12/31/2026", "2026-12-31T05:00:00.000Z"),
        ("Tue, 01 Jan 2026 00:00:00 GMT", "2026-01-01T00:00:00.000Z"),
        ("Wed, 10 Jun 26 10:00:00 GMT", "2026-06-10T10:00:00.000Z"),
        ("2026-06-10T10:00:00+0200", "2026-06-10T08:00:00.000Z"),
        ("2026-06-10 10:00:00 UTC", "2026-06-10T10:00:00.000Z"),
        ("2026-06-10T24:00:00Z", "2026-06-11T00:00:00.000Z"),
        ("2026-02-30", "2026-03-02T00:00:00.000Z"),
        ("1", "2001-01-01T05:00:00.000Z"),
        ("foo 2026", "2026-01-01T05:00:00.000Z"),
        ("  2026-01-01T00:00:00Z\n", "2026-01-01T00:00:00.000Z"),
        ("\u3000\ufeff2026-01-01\u2028", "2026-01-01T00:00:00.000Z"),
    ],
)
def test_spec_timestamps_as_written(local_tz: UseTZ, text: str, expected: str) -> None:
    """SPEC 2.3 v2 (issue 11 item 2): each of the contract's examples is a timestamp, read in
    America/New_York as Node reads it; v1 called most of these "repairable" or invalid."""
    local_tz(NEW_YORK)
    assert is_timestamp(text)
    assert classify(text) == (Form.AS_WRITTEN, expected)
    assert canonical(text) == expected
    assert repairable(text) is None  # a timestamp is never rewritten


@pytest.mark.parametrize(
    "text", ["20260101T100000Z", "2026-01-01T10:00:00,5Z", "2026-W01-1", "2026-13-01", "hello", ""]
)
def test_spec_not_timestamps(text: str) -> None:
    """SPEC 2.3: the contract's non-timestamps give NaN."""
    assert not is_timestamp(text)
    assert canonical(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20260110T100000Z", "2026-01-10T10:00:00.000Z"),
        ("20260110T1000+0100", "2026-01-10T09:00:00.000Z"),
        ("2026-01-10T10:00:00,5Z", "2026-01-10T10:00:00.500Z"),
        ("20260110t100000z", "2026-01-10T10:00:00.000Z"),
        ("20260110T100000.1239Z", "2026-01-10T10:00:00.123Z"),
        ("20260110T100000,5-05", "2026-01-10T15:00:00.500Z"),
        ("20260110T1000-05:30", "2026-01-10T15:30:00.000Z"),
        ("2026-01-10T10:00:00,123456+0100", "2026-01-10T09:00:00.123Z"),
        ("20240229T235959Z", "2024-02-29T23:59:59.000Z"),
        (" 20260110T100000Z\t", "2026-01-10T10:00:00.000Z"),
    ],
)
def test_r3_rewrites_basic_and_decimal_comma(text: str, expected: str) -> None:
    """R3 v2 (issue 11 item 2): the basic format and the decimal comma, with each zone form,
    lower-case T and Z, a fraction truncated to milliseconds, go to their canonical UTC form."""
    assert repairable(text) == expected
    assert classify(text) == (Form.REPAIRABLE, expected)


@pytest.mark.parametrize(
    "text",
    [
        "20260229T100000Z",  # no such day
        "20261310T100000Z",
        "20260110T240000Z",
        "20260110T106000Z",
        "20260110T100060Z",
        "20260110T1000+2400",
        "20260110T1000.5Z",  # a fraction only after seconds
        "20260110T10Z",
        "2026-01-10T10:00:00.5Z",  # a timestamp: not R3's
        "2026-01-10T10:00,5Z",
        "2026-01-10 10:00:00,5Z",
        "20260110 100000Z",
        "2026011T100000Z",
        "Tue, 01 Jan 2026 00:00:00 GMT",  # v1 rewrote it; it is a timestamp now
    ],
)
def test_r3_leaves_everything_else(text: str) -> None:
    """R3 v2: nothing outside its two shapes, and no impossible calendar value, is rewritten."""
    assert repairable(text) is None


@pytest.mark.parametrize(
    ("tz", "text", "expected"),
    [
        (NEW_YORK, "20260115T120000", "2026-01-15T17:00:00.000Z"),
        (NEW_YORK, "20260715T1200", "2026-07-15T16:00:00.000Z"),
        (NEW_YORK, "20260308T023000", "2026-03-08T07:30:00.000Z"),  # in the gap
        (NEW_YORK, "20261101T013000", "2026-11-01T05:30:00.000Z"),  # twice: the earlier
        (TOKYO, "2026-01-01T05:00:00,25", "2025-12-31T20:00:00.250Z"),
        ("UTC0", "00000101T000000", "0000-01-01T00:00:00.000Z"),
    ],
)
def test_r3_without_offset_is_local_time(
    local_tz: UseTZ, tz: str, text: str, expected: str
) -> None:
    """R3 v2: without an offset the value is read in the machine's zone, DST gaps and overlaps
    resolved as V8 resolves a local date-time (the offset before the change)."""
    local_tz(tz)
    assert repairable(text) == expected


def test_local_time_follows_the_zone(local_tz: UseTZ) -> None:
    """The same local text gives different instants in different zones; an offset fixes it."""
    local_tz(NEW_YORK)
    ny = canonical("2026-06-01T12:00:00")
    local_tz(TOKYO)
    tokyo = canonical("2026-06-01T12:00:00")
    assert (ny, tokyo) == ("2026-06-01T16:00:00.000Z", "2026-06-01T03:00:00.000Z")
    assert canonical("2026-06-01T12:00:00Z") == "2026-06-01T12:00:00.000Z"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00.000Z", id="as-written"),
        pytest.param("2026-01-01", "2026-01-01T00:00:00.000Z", id="date-only"),
        pytest.param("Tue, 01 Jan 2026 00:00:00 GMT", "2026-01-01T00:00:00.000Z", id="rfc2822"),
        pytest.param("2026-01-01 00:00:00Z", "2026-01-01T00:00:00.000Z", id="space"),
        pytest.param("not a date", EPOCH, id="garbage"),
        pytest.param("", EPOCH, id="empty"),
        pytest.param("2026-02-29", "2026-03-01T00:00:00.000Z", id="day-overflow"),
        pytest.param("20260101T100000Z", EPOCH, id="r3-shape-is-no-timestamp"),
        pytest.param(1767225600000, EPOCH, id="number"),
        pytest.param(None, EPOCH, id="null"),
        pytest.param(["2026-01-01"], EPOCH, id="array"),
    ],
)
def test_canonical_or_epoch(value: object, expected: str) -> None:
    """SPEC 4: a record's ``produced_at`` is canonical when it is a timestamp (v2: whatever
    ``Date.parse`` reads, day overflow included), else the epoch."""
    assert canonical_or_epoch(value) == expected
    assert EPOCH == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    ("epoch_ms", "text"),
    [
        pytest.param(0, "1970-01-01T00:00:00.000Z", id="epoch"),
        pytest.param(-1, "1969-12-31T23:59:59.999Z", id="before-epoch"),
        pytest.param(1767225600123, "2026-01-01T00:00:00.123Z", id="2026"),
        pytest.param(951782400000, "2000-02-29T00:00:00.000Z", id="leap-2000"),
        pytest.param(253402300799999, "9999-12-31T23:59:59.999Z", id="last-4-digit"),
        pytest.param(253402300800000, "+010000-01-01T00:00:00.000Z", id="expanded"),
        pytest.param(-62167219200000, "0000-01-01T00:00:00.000Z", id="year-0"),
        pytest.param(-62167219200001, "-000001-12-31T23:59:59.999Z", id="negative-year"),
    ],
)
def test_format_epoch_ms_is_to_iso_string(epoch_ms: int, text: str) -> None:
    """``Date.prototype.toISOString``, expanded years included."""
    assert format_epoch_ms(epoch_ms) == text


def test_one_decision_parses_produced_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19 item 5: deciding one file ran ``Date.parse`` on its ``produced_at`` five times
    (validity before and after the repairs, twice the report, the records). A file whose
    ``produced_at`` is no timestamp and whose other faults no repair fixes is quarantined with
    its record's ``produced_at`` the epoch, having parsed that text once; the next file's own
    ``produced_at`` is parsed afresh."""
    import json

    from memstaged.core.decide import Context, Decision, decide
    from memstaged.core.js import date_parse

    texts: list[str] = []
    real = date_parse.parse

    def counted(text: str) -> int | None:
        texts.append(text)
        return real(text)

    monkeypatch.setattr("memstaged.core.timestamps.parse", counted)
    doc = {"schemaVersion": 1, "session_id": "s", "project_root": "/p", "produced_at": "1:" * 50}
    doc["candidates"] = {"lessons": [], "preferences": [{}], "decisions": []}
    ctx = Context(project_root="/p", file_name="s.json")
    verdict = decide(json.dumps(doc).encode(), ctx)
    assert verdict.decision is Decision.QUARANTINED
    [record] = verdict.deadletter
    assert json.loads(record.body)["produced_at"] == "1970-01-01T00:00:00.000Z"
    assert texts == ["1:" * 50]
    doc["produced_at"] = "2026-06-10 10:00:00 UTC"
    assert decide(json.dumps(doc).encode(), ctx).decision is Decision.QUARANTINED
    assert texts == ["1:" * 50, "2026-06-10 10:00:00 UTC"]
