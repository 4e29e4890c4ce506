"""``produced_at``: what counts as a timestamp as written (SPEC 2.3) and what repair R3 may rewrite.

Both the check and the canonical form are computed here without :mod:`datetime` where possible,
because SPEC's ISO forms allow year 0000, which :class:`datetime.datetime` cannot hold. The
canonical form is JavaScript's ``Date.prototype.toISOString``: ``YYYY-MM-DDTHH:MM:SS.sssZ``.
"""

from __future__ import annotations

import re
import time
from enum import Enum
from typing import Final

from memstaged.ecma import trim

EPOCH: Final = "1970-01-01T00:00:00.000Z"

_ISO: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:([Tt ])([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})?)?"
)
_MONTHS: Final = (
    "jan",
    "feb",
    "mar",
    "apr",
    "may",
    "jun",
    "jul",
    "aug",
    "sep",
    "oct",
    "nov",
    "dec",
)
_ZONES: Final = {
    "ut": 0,
    "utc": 0,
    "gmt": 0,
    "z": 0,
    "est": -300,
    "edt": -240,
    "cst": -360,
    "cdt": -300,
    "mst": -420,
    "mdt": -360,
    "pst": -480,
    "pdt": -420,
}
_RFC2822: Final = re.compile(
    r"(?:(?:mon|tue|wed|thu|fri|sat|sun)[ \t]*,[ \t]*)?"
    r"([0-9]{1,2})[ \t]+(" + "|".join(_MONTHS) + r")[ \t]+([0-9]{4})[ \t]+"
    r"([0-9]{2}):([0-9]{2})(?::([0-9]{2}))?[ \t]+"
    r"([+-][0-9]{4}|" + "|".join(_ZONES) + r")",
    re.IGNORECASE,
)
_MS_PER_DAY: Final = 86_400_000


class Form(Enum):
    """How a ``produced_at`` string stands with respect to SPEC 2.3 and R3."""

    AS_WRITTEN = "as written"
    REPAIRABLE = "repairable"


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if _leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


def format_epoch_ms(epoch_ms: int) -> str:
    """``new Date(epoch_ms).toISOString()``, expanded years included."""
    days, ms_of_day = divmod(epoch_ms, _MS_PER_DAY)
    year, month, day = _civil_from_days(days)
    hours, rest = divmod(ms_of_day, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    ytext = f"{year:04d}" if 0 <= year <= 9999 else f"{'-' if year < 0 else '+'}{abs(year):06d}"
    return f"{ytext}-{month:02d}-{day:02d}T{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}Z"


def _local_offset_seconds(wall: int) -> int | None:
    """The machine's UTC offset for a local wall time, as ``new Date(y, m, d, h, mi, s)`` reads it.

    ``wall`` is the wall time counted in seconds as if it were UTC. Like ECMAScript, a wall time
    that occurs twice (clocks set back) is read as its earlier instant, and one that does not occur
    (clocks set forward) with the offset in force before the change. Offsets keep their seconds
    (local mean time before time zones, e.g. +00:53:28 in Berlin). ``None`` when the platform
    cannot say.
    """
    try:
        before = time.localtime(wall - 86_400).tm_gmtoff
        after = time.localtime(wall + 86_400).tm_gmtoff
        fits = [o for o in {before, after} if time.localtime(wall - o).tm_gmtoff == o]
    except (OverflowError, OSError, ValueError):
        return None
    return max(fits) if fits else before


def _epoch_ms(
    year: int, month: int, day: int, hour: int, minute: int, second: int, millis: int, offset: int
) -> int:
    """Milliseconds since the epoch of a wall time at ``offset`` seconds east of UTC."""
    seconds = _days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    return (seconds - offset) * 1000 + millis


def _calendar_ok(year: int, month: int, day: int, hour: int, minute: int, second: int) -> bool:
    return (
        1 <= month <= 12
        and 1 <= day <= _days_in_month(year, month)
        and hour <= 23
        and minute <= 59
        and second <= 59
    )


def _parse_iso(text: str) -> tuple[Form, str] | None:
    match = _ISO.fullmatch(text)
    if match is None:
        return None
    year, month, day = int(match[1]), int(match[2]), int(match[3])
    if match[4] is None:  # date only: valid as written, midnight UTC
        if not _calendar_ok(year, month, day, 0, 0, 0):
            return None
        return Form.AS_WRITTEN, format_epoch_ms(_epoch_ms(year, month, day, 0, 0, 0, 0, 0))
    hour, minute = int(match[5]), int(match[6])
    second = int(match[7]) if match[7] else 0
    millis = int((match[8] or "")[:3].ljust(3, "0"))
    if not _calendar_ok(year, month, day, hour, minute, second):
        return None
    zone = match[9]
    if zone is None:
        wall = _epoch_ms(year, month, day, hour, minute, second, 0, 0) // 1000
        local = _local_offset_seconds(wall)
        if local is None:
            return None
        offset = local
    elif zone in "Zz":
        offset = 0
    else:
        zh, zm = int(zone[1:3]), int(zone[4:6])
        if zh > 23 or zm > 59:
            return None
        offset = (zh * 3600 + zm * 60) * (-1 if zone[0] == "-" else 1)
    form = Form.AS_WRITTEN if match[4] in "Tt" and zone is not None else Form.REPAIRABLE
    return form, format_epoch_ms(_epoch_ms(year, month, day, hour, minute, second, millis, offset))


def _parse_rfc2822(text: str) -> str | None:
    match = _RFC2822.fullmatch(text)
    if match is None:
        return None
    day, month, year = int(match[1]), _MONTHS.index(match[2].lower()) + 1, int(match[3])
    hour, minute = int(match[4]), int(match[5])
    second = int(match[6]) if match[6] else 0
    if not _calendar_ok(year, month, day, hour, minute, second):
        return None
    zone = match[7].lower()
    if zone[0] in "+-":
        zh, zm = int(zone[1:3]), int(zone[3:5])
        if zh > 23 or zm > 59:
            return None
        offset = (zh * 3600 + zm * 60) * (-1 if zone[0] == "-" else 1)
    else:
        offset = _ZONES[zone] * 60
    return format_epoch_ms(_epoch_ms(year, month, day, hour, minute, second, 0, offset))


def classify(value: str) -> tuple[Form, str] | None:
    """Say whether ``value`` is a timestamp as written, one R3 may rewrite, or neither.

    Returns the form and the canonical UTC text, or ``None`` when ``value`` names no timestamp
    unambiguously. A date-time without an offset is read in the machine's local time zone, as
    the reconciler's ``new Date(text)`` would read it.
    """
    text = trim(value)
    parsed = _parse_iso(text)
    if parsed is not None:
        return parsed
    canonical = _parse_rfc2822(text)
    return None if canonical is None else (Form.REPAIRABLE, canonical)


def is_as_written(value: str) -> bool:
    """``classify(value)`` is ``AS_WRITTEN``, without building the canonical text it returns.

    Validity checks every file's ``produced_at``; the canonical text is only needed for repairs
    and records. Only :func:`_parse_iso` can say ``AS_WRITTEN`` (RFC 2822 dates are at best
    repairable), and only for a date, or a date-time with a ``T`` and an offset; this follows its
    steps up to that answer, so a change there belongs here too
    (``test_timestamps_agree_with_classify`` notices when they part).
    """
    match = _ISO.fullmatch(trim(value))
    if match is None:
        return False
    year, month, day, sep, hour, minute, second, _fraction, zone = match.groups()
    if sep is None:
        return _calendar_ok(int(year), int(month), int(day), 0, 0, 0)
    if sep not in "Tt" or zone is None:
        return False  # repairable (R3) or not a timestamp: either way not as written
    if not _calendar_ok(
        int(year), int(month), int(day), int(hour), int(minute), int(second) if second else 0
    ):
        return False
    return zone in "Zz" or (int(zone[1:3]) <= 23 and int(zone[4:6]) <= 59)


def canonical_or_epoch(value: object) -> str:
    """A dead-letter record's ``produced_at``: canonical if it is a timestamp, else the epoch."""
    if isinstance(value, str):
        found = classify(value)
        if found is not None:
            return found[1]
    return EPOCH
