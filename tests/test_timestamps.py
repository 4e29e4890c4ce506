"""``produced_at``: SPEC 2.3 (timestamp as written), R3 (what may be rewritten), canonical form.

Expected canonical values for local-time readings were checked against Node 20
(``new Date(text).toISOString()``) under the equivalent IANA zone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memstaged.timestamps import EPOCH, Form, canonical_or_epoch, classify, format_epoch_ms

CANONICAL = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")
#: POSIX TZ strings: glibc reads them without a tz database.
NEW_YORK = "EST5EDT,M3.2.0,M11.1.0"
BERLIN = "CET-1CEST,M3.5.0,M10.5.0/3"
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


def _as_written(text: str, canonical: str) -> pytest.ParameterSet:
    return pytest.param(text, canonical, id=text.replace(" ", "_") or "empty")


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        _as_written("2026-01-01", "2026-01-01T00:00:00.000Z"),
        _as_written("2026-01-01T00:00:00Z", "2026-01-01T00:00:00.000Z"),
        _as_written("2026-01-01T10:30Z", "2026-01-01T10:30:00.000Z"),
        _as_written("2026-01-01t10:30:00z", "2026-01-01T10:30:00.000Z"),
        _as_written("2026-01-01T10:30:00z", "2026-01-01T10:30:00.000Z"),
        _as_written("2026-01-01t10:30:00Z", "2026-01-01T10:30:00.000Z"),
        _as_written("2026-01-01T00:00:00.5Z", "2026-01-01T00:00:00.500Z"),
        _as_written("2026-01-01T00:00:00.12Z", "2026-01-01T00:00:00.120Z"),
        _as_written("2026-01-01T00:00:00.123Z", "2026-01-01T00:00:00.123Z"),
        _as_written("2026-01-01T00:00:00.123456789Z", "2026-01-01T00:00:00.123Z"),
        _as_written("2026-01-01T00:00:00.9999Z", "2026-01-01T00:00:00.999Z"),
        _as_written("2026-01-01T00:00:00.1+01:00", "2025-12-31T23:00:00.100Z"),
        _as_written("2026-01-01T10:30:00-05:30", "2026-01-01T16:00:00.000Z"),
        _as_written("2026-01-01T00:00:00+14:00", "2025-12-31T10:00:00.000Z"),
        _as_written("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00.000Z"),
        _as_written("2026-01-01T00:00:00-00:00", "2026-01-01T00:00:00.000Z"),
        _as_written("2026-01-01T00:00:00+23:59", "2025-12-31T00:01:00.000Z"),
        _as_written("2026-12-31T23:59:59.999Z", "2026-12-31T23:59:59.999Z"),
        _as_written("0000-01-01T00:00:00Z", "0000-01-01T00:00:00.000Z"),
        _as_written("9999-12-31T23:59:59Z", "9999-12-31T23:59:59.000Z"),
        _as_written("9999-12-31T23:00:00-01:00", "+010000-01-01T00:00:00.000Z"),
        # month 01..12
        _as_written("2026-01-15", "2026-01-15T00:00:00.000Z"),
        _as_written("2026-12-15T00:00Z", "2026-12-15T00:00:00.000Z"),
        # last day of each month length
        _as_written("2026-01-31", "2026-01-31T00:00:00.000Z"),
        _as_written("2026-04-30T12:00Z", "2026-04-30T12:00:00.000Z"),
        _as_written("2026-06-30", "2026-06-30T00:00:00.000Z"),
        _as_written("2026-09-30", "2026-09-30T00:00:00.000Z"),
        _as_written("2026-11-30", "2026-11-30T00:00:00.000Z"),
        _as_written("2026-02-28", "2026-02-28T00:00:00.000Z"),
        _as_written("2024-02-29", "2024-02-29T00:00:00.000Z"),
        _as_written("2024-02-29T23:59:59Z", "2024-02-29T23:59:59.000Z"),
        _as_written("2000-02-29", "2000-02-29T00:00:00.000Z"),
        _as_written("1900-02-28", "1900-02-28T00:00:00.000Z"),
        # hour 00..23, minute and second 00..59
        _as_written("2026-01-01T23:00:00Z", "2026-01-01T23:00:00.000Z"),
        _as_written("2026-01-01T00:59:00Z", "2026-01-01T00:59:00.000Z"),
        _as_written("2026-01-01T00:00:59Z", "2026-01-01T00:00:59.000Z"),
        # surrounding ECMAScript whitespace is trimmed first
        _as_written("  2026-01-01T00:00:00Z\n", "2026-01-01T00:00:00.000Z"),
        _as_written("\u3000\ufeff2026-01-01\u2028", "2026-01-01T00:00:00.000Z"),
    ],
)
def test_timestamp_as_written(text: str, canonical: str) -> None:
    """Every form of SPEC 2.3, at each calendar boundary, is a timestamp as written."""
    assert classify(text) == (Form.AS_WRITTEN, canonical)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2026-01-01T10:00:00", id="missing-offset"),
        pytest.param("2026-01-01T10:00", id="missing-offset-no-seconds"),
        pytest.param("2026-01-01 10:00:00Z", id="space-separator"),
        pytest.param("Tue, 01 Jan 2026 00:00:00 GMT", id="rfc2822"),
        pytest.param("2026-00-01", id="month-00"),
        pytest.param("2026-13-01", id="month-13"),
        pytest.param("2026-13-01T00:00:00Z", id="month-13-datetime"),
        pytest.param("2026-01-00", id="day-00"),
        pytest.param("2026-01-32", id="jan-32"),
        pytest.param("2026-04-31", id="apr-31"),
        pytest.param("2026-06-31T00:00:00Z", id="jun-31"),
        pytest.param("2026-09-31", id="sep-31"),
        pytest.param("2026-11-31", id="nov-31"),
        pytest.param("2026-02-29", id="feb-29-non-leap"),
        pytest.param("2026-02-29T00:00:00Z", id="feb-29-non-leap-datetime"),
        pytest.param("1900-02-29", id="feb-29-1900"),
        pytest.param("2100-02-29T00:00:00Z", id="feb-29-2100"),
        pytest.param("2024-02-30", id="feb-30-leap"),
        pytest.param("2026-01-01T24:00:00Z", id="hour-24"),
        pytest.param("2026-01-01T24:00Z", id="hour-24-no-seconds"),
        pytest.param("2026-01-01T00:60:00Z", id="minute-60"),
        pytest.param("2026-01-01T00:00:60Z", id="second-60"),
        pytest.param("2026-01-01 24:00:00Z", id="hour-24-space"),
        pytest.param("2026-01-01T24:00:00", id="hour-24-local"),
        pytest.param("", id="empty"),
        pytest.param(" \t", id="blank"),
        pytest.param("yesterday", id="word"),
        pytest.param("2026", id="year-only"),
        pytest.param("2026-01", id="year-month"),
        pytest.param("2026-1-01", id="one-digit-month"),
        pytest.param("26-01-01", id="two-digit-year"),
        pytest.param("2026/01/01", id="slashes"),
        pytest.param("20260101", id="basic-date"),
        pytest.param("2026-01-01T", id="dangling-t"),
        pytest.param("2026-01-01T10Z", id="hour-only"),
        pytest.param("2026-01-01T10:00:00.Z", id="empty-fraction"),
        pytest.param("2026-01-01T10:00.5Z", id="fraction-without-seconds"),
        pytest.param("2026-01-01T10:00:00,5Z", id="comma-fraction"),
        pytest.param("2026-01-01Z", id="date-with-z"),
        pytest.param("2026-01-01T10:00:00 Z", id="space-before-z"),
        pytest.param("2026-01-01T10:00:00+01", id="offset-hours-only"),
        pytest.param("2026-01-01T10:00:00+0100", id="offset-basic"),
        pytest.param("2026-01-01T10:00:00+24:00", id="offset-24"),
        pytest.param("2026-01-01T10:00:00+01:60", id="offset-minute-60"),
        pytest.param("2026-01-01T10:00:00UTC", id="offset-utc-word"),
        pytest.param("+002026-01-01T00:00:00Z", id="expanded-year"),
        pytest.param("\uff12\uff10\uff12\uff16-01-01", id="fullwidth-digits"),
        pytest.param("2026-01-01\x1c", id="js-keeps-u001c"),
        pytest.param("1767225600000", id="epoch-millis"),
    ],
)
def test_not_a_timestamp_as_written(text: str) -> None:
    """The other side of every boundary, and other shapes, are not timestamps as written."""
    found = classify(text)
    assert found is None or found[0] is not Form.AS_WRITTEN


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2026-02-29T00:00:00Z", id="feb-29-non-leap"),
        pytest.param("2026-01-01T24:00:00Z", id="hour-24"),
        pytest.param("2026-13-01 00:00:00", id="month-13-space"),
        pytest.param("Thu, 31 Feb 2026 00:00:00 GMT", id="rfc2822-feb-31"),
        pytest.param("Thu, 01 Jan 2026 24:00:00 GMT", id="rfc2822-hour-24"),
        pytest.param("yesterday", id="word"),
        pytest.param("", id="empty"),
        pytest.param("2026-01-01T10:00:00+01", id="offset-hours-only"),
        pytest.param("Thu, 01 Jan 2026", id="rfc2822-no-time"),
    ],
)
def test_names_no_timestamp(text: str) -> None:
    """Impossible calendar values and non-dates name no timestamp at all: R3 cannot apply."""
    assert classify(text) is None


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        pytest.param("2026-01-01 10:00:00Z", "2026-01-01T10:00:00.000Z", id="space-z"),
        pytest.param("2026-01-01 10:00:00+02:00", "2026-01-01T08:00:00.000Z", id="space-offset"),
        pytest.param("2026-01-01 10:00Z", "2026-01-01T10:00:00.000Z", id="space-no-seconds"),
        pytest.param("2026-01-01 10:00:00.25z", "2026-01-01T10:00:00.250Z", id="space-fraction"),
        pytest.param(" 2026-01-01 10:00:00Z ", "2026-01-01T10:00:00.000Z", id="space-trimmed"),
        pytest.param(
            "Tue, 01 Jan 2026 00:00:00 GMT", "2026-01-01T00:00:00.000Z", id="spec-rfc2822-example"
        ),
        pytest.param(
            "Thu, 01 Jan 2026 00:00:00 +0100", "2025-12-31T23:00:00.000Z", id="rfc2822-offset"
        ),
        pytest.param("01 Jan 2026 00:00:00 GMT", "2026-01-01T00:00:00.000Z", id="rfc2822-no-day"),
        pytest.param("1 Jan 2026 10:00 UTC", "2026-01-01T10:00:00.000Z", id="rfc2822-short"),
        pytest.param("Thu, 01 Jan 2026 00:00:00 EST", "2026-01-01T05:00:00.000Z", id="rfc2822-est"),
        pytest.param(
            "thu, 01 jan 2026 00:00:00 pdt", "2026-01-01T07:00:00.000Z", id="rfc2822-lowercase"
        ),
        pytest.param(
            "Sun, 29 Feb 2032 23:59:59 -0000", "2032-02-29T23:59:59.000Z", id="rfc2822-leap-day"
        ),
        pytest.param(
            "\tMon, 05 Oct 2026 08:09:10 +0530\n", "2026-10-05T02:39:10.000Z", id="rfc2822-trimmed"
        ),
    ],
)
def test_repairable_independent_of_local_time(text: str, canonical: str) -> None:
    """R3 forms with an explicit zone: a space instead of T, or RFC 2822 (weekday not checked).

    SPEC's own example ``Tue, 01 Jan 2026 00:00:00 GMT`` names a Thursday: the weekday is ignored,
    as ``Date.parse`` ignores it.
    """
    assert classify(text) == (Form.REPAIRABLE, canonical)
    assert CANONICAL.fullmatch(canonical)


@pytest.mark.parametrize(
    ("tz", "text", "canonical"),
    [
        pytest.param("UTC0", "2026-01-01T10:00:00", "2026-01-01T10:00:00.000Z", id="utc"),
        pytest.param("UTC0", "2026-01-01 10:00", "2026-01-01T10:00:00.000Z", id="utc-space"),
        pytest.param(NEW_YORK, "2026-01-15T12:00:00", "2026-01-15T17:00:00.000Z", id="ny-winter"),
        pytest.param(NEW_YORK, "2026-07-15 12:00:00", "2026-07-15T16:00:00.000Z", id="ny-summer"),
        pytest.param(
            NEW_YORK, "2026-01-15T12:00:00.25", "2026-01-15T17:00:00.250Z", id="ny-fraction"
        ),
        pytest.param(NEW_YORK, "2026-01-01 10:00", "2026-01-01T15:00:00.000Z", id="ny-no-seconds"),
        pytest.param(NEW_YORK, "2026-03-08T02:30:00", "2026-03-08T07:30:00.000Z", id="ny-gap"),
        pytest.param(NEW_YORK, "2026-11-01T01:30:00", "2026-11-01T05:30:00.000Z", id="ny-overlap"),
        pytest.param(BERLIN, "2026-01-15T12:00:00", "2026-01-15T11:00:00.000Z", id="berlin"),
        pytest.param(BERLIN, "2026-03-29T02:30:00", "2026-03-29T01:30:00.000Z", id="berlin-gap"),
        pytest.param(
            BERLIN, "2026-10-25T02:30:00", "2026-10-25T00:30:00.000Z", id="berlin-overlap"
        ),
        pytest.param(TOKYO, "2026-01-01 10:00", "2026-01-01T01:00:00.000Z", id="tokyo"),
        pytest.param(TOKYO, "2026-01-01T05:00:00", "2025-12-31T20:00:00.000Z", id="tokyo-day"),
        pytest.param(
            TOKYO, "9999-12-31T23:59:59", "9999-12-31T14:59:59.000Z", id="tokyo-year-9999"
        ),
        pytest.param(
            NEW_YORK, "9999-12-31T23:59:59", "+010000-01-01T04:59:59.000Z", id="ny-past-9999"
        ),
        pytest.param("UTC0", "0000-01-01T00:00:00", "0000-01-01T00:00:00.000Z", id="year-0"),
        pytest.param(
            TOKYO, "0000-01-01T00:00:00", "-000001-12-31T15:00:00.000Z", id="tokyo-year-0"
        ),
    ],
)
def test_local_time_reading(local_tz: UseTZ, tz: str, text: str, canonical: str) -> None:
    """A date-time without an offset is read in the local zone, as ``new Date(text)`` reads it.

    A wall time skipped by a DST change takes the offset before the change; one that occurs twice
    is its earlier instant; years at the ends of the range do not raise.
    """
    local_tz(tz)
    assert classify(text) == (Form.REPAIRABLE, canonical)


_ZONEINFO = Path("/usr/share/zoneinfo")


@pytest.mark.skipif(not (_ZONEINFO / "Europe/Berlin").exists(), reason="no tz database")
@pytest.mark.parametrize(
    ("tz", "text", "canonical"),
    [
        pytest.param(
            "Europe/Berlin", "1800-06-01T12:00:00", "1800-06-01T11:06:32.000Z", id="berlin-lmt"
        ),
        pytest.param(
            "America/New_York", "0001-01-01T00:00:00", "0001-01-01T04:56:02.000Z", id="ny-lmt"
        ),
        pytest.param(
            "Asia/Tokyo", "0001-01-01T00:00:00", "0000-12-31T14:41:01.000Z", id="tokyo-lmt"
        ),
        pytest.param(
            "Europe/Berlin", "2026-03-29T02:30:00", "2026-03-29T01:30:00.000Z", id="berlin-gap"
        ),
    ],
)
def test_local_time_keeps_offset_seconds(
    local_tz: UseTZ, tz: str, text: str, canonical: str
) -> None:
    """Local mean time offsets (e.g. +00:53:28) are applied to the second, as V8 applies them."""
    local_tz(tz)
    assert classify(text) == (Form.REPAIRABLE, canonical)


@pytest.mark.parametrize("tz", ["UTC0", NEW_YORK, BERLIN, TOKYO, "XYZ+13:45"])
@pytest.mark.parametrize(
    "text",
    ["0000-01-01T00:00:00", "0000-01-01 00:00", "9999-12-31T23:59:59", "9999-12-31 23:59"],
)
def test_local_time_never_raises_at_range_ends(local_tz: UseTZ, tz: str, text: str) -> None:
    """Years 0000 and 9999 read in any local zone give a value or None, never an exception."""
    local_tz(tz)
    found = classify(text)
    assert found is None or found[0] is Form.REPAIRABLE


def test_local_time_follows_the_zone(local_tz: UseTZ) -> None:
    """The same text gives different instants in different zones, an offset makes it fixed."""
    local_tz(NEW_YORK)
    ny = classify("2026-06-01T12:00:00")
    local_tz(TOKYO)
    tokyo = classify("2026-06-01T12:00:00")
    assert ny != tokyo
    assert classify("2026-06-01T12:00:00Z") == (Form.AS_WRITTEN, "2026-06-01T12:00:00.000Z")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00.000Z", id="as-written"),
        pytest.param("2026-01-01", "2026-01-01T00:00:00.000Z", id="date-only"),
        pytest.param("Tue, 01 Jan 2026 00:00:00 GMT", "2026-01-01T00:00:00.000Z", id="rfc2822"),
        pytest.param("2026-01-01 00:00:00Z", "2026-01-01T00:00:00.000Z", id="space"),
        pytest.param("not a date", EPOCH, id="garbage"),
        pytest.param("", EPOCH, id="empty"),
        pytest.param("2026-02-29", EPOCH, id="impossible-date"),
        pytest.param(1767225600000, EPOCH, id="number"),
        pytest.param(None, EPOCH, id="null"),
        pytest.param(["2026-01-01"], EPOCH, id="array"),
    ],
)
def test_canonical_or_epoch(value: object, expected: str) -> None:
    """The dead-letter ``produced_at``: canonical when it names a timestamp, else the epoch."""
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
