"""``produced_at``: what is a timestamp (SPEC 2.3), its canonical form, and what R3 may rewrite.

A timestamp is whatever V8's ``Date.parse`` reads as a finite number
(:mod:`memstaged.core.js.date_parse`); its canonical form is ``new Date(ms).toISOString()``. Repair
R3 covers only the ISO 8601 forms that ``Date.parse`` refuses (the basic format, and the decimal
comma), and it never touches a value that already is a timestamp, since the reconciler takes that as
it is.
"""

from __future__ import annotations

import re
from typing import Final

from memstaged.core.js.date_parse import days_from_civil, local_offset_seconds, parse
from memstaged.core.js.ecma import JS_WHITESPACE_SET, trim

EPOCH: Final = "1970-01-01T00:00:00.000Z"
_MS_PER_DAY: Final = 86_400_000

#: The usual shape, ``YYYY-MM-DDTHH:mm[:ss[.s+]](Z|±HH:mm)``: with its values in range it is a
#: timestamp whatever they are (a 4-digit year cannot leave the time range), so the fast path of
#: validity answers it without the full parser.
_COMMON: Final = re.compile(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]"
    r"(?::[0-5][0-9](?:\.[0-9]+)?)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
#: R3's shapes: ISO 8601 basic format, or the extended format with a decimal comma.
_BASIC: Final = re.compile(
    r"([0-9]{4})([0-9]{2})([0-9]{2})[Tt]([0-9]{2})([0-9]{2})(?:([0-9]{2})(?:[.,]([0-9]+))?)?"
    r"([Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?"
)
_COMMA: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2}),([0-9]+)"
    r"([Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?"
)


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if _leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm)."""
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


class _Last:
    """The last ``produced_at`` parsed and what it gave, by identity.

    One decision asks about the same string up to five times (validity before and after the
    repairs, the report, the records' canonical form); a hostile 8 MiB one is parsed once. Only
    within a decision (:func:`remember` to :func:`forget`): the answer depends on the local time
    zone, which may change between decisions, and no file's text outlives its decision here. One
    tuple, replaced whole: a reader in another thread sees a text with its own result or nothing.
    """

    pair: tuple[str, int | None] | None = None
    active = False


def parse_timestamp(value: str) -> int | None:
    """``Date.parse`` of the trimmed text (SPEC 2.3): epoch milliseconds, or ``None`` for NaN."""
    last = _Last.pair
    if last is not None and last[0] is value:
        return last[1]
    result = parse(trim(value))
    if _Last.active:
        _Last.pair = (value, result)
    return result


def remember() -> None:
    """A decision begins: the text it parses is asked about again until :func:`forget`."""
    _Last.active = True


def forget() -> None:
    """A decision is made: the text it parsed is not asked about again."""
    _Last.active = False
    _Last.pair = None


def is_timestamp(value: str) -> bool:
    """``Date.parse(value.trim())`` is finite. The common ISO shape is answered without parsing."""
    if (
        value
        and value[0] not in JS_WHITESPACE_SET
        and value[-1] not in JS_WHITESPACE_SET
        and _COMMON.fullmatch(value) is not None
    ):
        return True
    return parse_timestamp(value) is not None


def canonical(value: str) -> str | None:
    """``new Date(Date.parse(value.trim())).toISOString()``, or ``None`` when it is no timestamp."""
    epoch_ms = parse_timestamp(value)
    return None if epoch_ms is None else format_epoch_ms(epoch_ms)


def _r3_offset(zone: str | None, wall_seconds: int) -> int | None:
    """Seconds east of UTC for R3's zone designator, or local time's; ``None`` if out of range."""
    if zone is None:
        return local_offset_seconds(wall_seconds)
    if zone in "Zz":
        return 0
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or "0")
    if hours > 23 or minutes > 59:
        return None
    return (hours * 3600 + minutes * 60) * (-1 if zone[0] == "-" else 1)


def repairable(value: str) -> str | None:
    """R3: the canonical form of an ISO 8601 basic-format or decimal-comma date-time.

    Only for a value that is not a timestamp: ``None`` for one (it is never rewritten), and for
    any text outside R3's shapes or with values that are not real calendar values.
    """
    text = trim(value)
    match = _BASIC.fullmatch(text) or _COMMA.fullmatch(text)
    if match is None or parse(text) is not None:
        return None
    year, month, day, hour, minute = (int(match[i]) for i in range(1, 6))
    second = int(match[6]) if match[6] else 0
    millis = int((match[7] or "")[:3].ljust(3, "0"))
    if not (
        1 <= month <= 12
        and 1 <= day <= _days_in_month(year, month)
        and hour <= 23
        and minute <= 59
        and second <= 59
    ):
        return None
    wall = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    try:
        offset = _r3_offset(match[8], wall)
    except (OverflowError, OSError, ValueError):
        return None
    if offset is None:
        return None
    return format_epoch_ms((wall - offset) * 1000 + millis)


def canonical_or_epoch(value: object) -> str:
    """A dead-letter record's ``produced_at``: canonical if it is a timestamp, else the epoch."""
    if isinstance(value, str):
        found = canonical(value)
        if found is not None:
            return found
    return EPOCH
