"""``Date.parse`` as V8 (the JavaScript engine of Node.js 20) implements it (SPEC 2.3).

The reconciler calls a ``produced_at`` a timestamp when ``Date.parse`` gives a finite number, so
memstaged must accept exactly the strings V8 accepts and read them as the same instant. V8 tries
the ECMAScript date-time string format first; when the text leaves that format before a ``T`` it
goes on, with what it has read so far, in its legacy parser, a permissive scanner kept for
compatibility with old browsers. This module is written from that documented grammar and from
Node's own answers (``tests/system/test_dateparse_node.py`` compares the two on every example of
SPEC and on a seeded corpus of generated strings in three time zones); it shares no code with V8.

The tokens come from :mod:`memstaged.core.js.date_scan`, lazily, one token of look-ahead, as V8
reads them; this module is the reader of the two formats and the calendar. V8 gives up within a few
tokens on most garbage, and so does this parser: a long text costs only the part of it that is
read.

Local time is the machine's zone (``TZ``, else ``/etc/localtime``), read with ``time.localtime``;
a local time that occurs twice is read with the offset in force before the change, and one that
does not occur (clocks set forward) with the offset before the change too, as V8 (through ICU)
does.
"""

from __future__ import annotations

import time
from typing import Final

from memstaged.core.js.date_scan import (
    AMPM_NAMES,
    COMMENTS,
    END,
    END_TOKEN,
    GLUED,
    MONTH_NAMES,
    NUM,
    RUN,
    SHORT_WORDS,
    SIGNIFICANT,
    SYM,
    W_AMPM,
    W_MONTH,
    W_NONE,
    W_T,
    W_ZONE,
    WORD,
    WS,
    ZONE_NAMES,
    Scanner,
    Token,
    last_month,
    last_name,
    run_words,
)
from memstaged.core.ticks import tick

MAX_TIME_MS: Final = 8_640_000_000_000_000
#: V8 refuses a local time this far beyond the range before converting it to UTC.
_MAX_LOCAL_MS: Final = MAX_TIME_MS + 864_000_000
_MS_PER_DAY: Final = 86_400_000
#: Year limits of MakeDay (beyond them the time value is NaN in any case).
_MAX_YEAR: Final = 1_000_000
#: A zone offset must fit a small integer; V8 computes it in unsigned 32-bit arithmetic first.
_SMI_MAX: Final = (1 << 31) - 1
#: The legacy reader reports progress (:func:`memstaged.core.ticks.tick`) every so many tokens.
_TICK_EVERY: Final = 4096


def _is_sym(token: Token, char: str) -> bool:
    return token[0] == SYM and token[1] == ord(char)


def _is_sign(token: Token) -> bool:
    return token[0] == SYM and token[1] in (ord("+"), ord("-"))


def _is_word(token: Token, kind: int) -> bool:
    return token[0] == WORD and token[3] == kind


def _is_z(token: Token) -> bool:
    return token[0] == WORD and token[2] == 1 and token[3] == W_ZONE and token[1] == 0


def _fixed(token: Token, length: int) -> bool:
    return token[0] == NUM and token[2] == length


def _millis(token: Token) -> int:
    """The first three digits of a fraction, from its value and its digit count."""
    value, length = token[1], min(token[2], SIGNIFICANT)
    if length < 3:
        return value * (100 if length == 1 else 10)
    divisor: int = 10 ** (length - 3)
    return value // divisor


class _Parts:
    """What has been read: up to three date numbers, up to four time numbers and a zone."""

    def __init__(self) -> None:
        self.day: list[int] = []
        self.named_month: int | None = None
        self.iso = False
        self.time: list[int] = []
        self.hour_offset: int | None = None
        self.sign: int | None = None
        self.zone_hour: int | None = None
        self.zone_minute: int | None = None

    # -- date
    def add_day(self, n: int) -> bool:
        if len(self.day) >= 3:
            return False
        self.day.append(n)
        return True

    # -- time
    def add_time(self, n: int) -> bool:
        if len(self.time) >= 4:
            return False
        self.time.append(n)
        return True

    def add_time_final(self, n: int) -> bool:
        if not self.add_time(n):
            return False
        self.time.extend([0] * (4 - len(self.time)))
        return True

    def time_expects(self, n: int) -> bool:
        index = len(self.time)
        return (index in (1, 2) and 0 <= n <= 59) or (index == 3 and 0 <= n <= 999)

    # -- zone
    def set_zone(self, hours: int) -> None:
        self.sign = -1 if hours < 0 else 1
        self.zone_hour, self.zone_minute = abs(hours), 0

    def zone_expects(self, n: int) -> bool:
        return self.zone_hour is not None and self.zone_minute is None and 0 <= n <= 59

    def zone_is_utc(self) -> bool:
        return self.zone_hour == 0 and self.zone_minute == 0

    # -- the result
    def date(self) -> tuple[int, int, int] | None:
        if not self.day:
            return None
        comp = self.day + [1] * (3 - len(self.day))
        if self.named_month is None:
            if self.iso or not 1 <= comp[0] <= 31:
                year, month, day = comp
            else:
                month, day, year = comp
        else:
            month = self.named_month
            if not 1 <= comp[0] <= 31:
                year, day = comp[0], comp[1]
            else:
                day, year = comp[0], comp[1]
        if not self.iso:
            if 0 <= year <= 49:
                year += 2000
            elif 50 <= year <= 99:
                year += 1900
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return None
        return year, month, day

    def clock(self) -> tuple[int, int, int, int] | None:
        hour, minute, second, millis = self.time + [0] * (4 - len(self.time))
        if self.hour_offset is not None:
            if not 0 <= hour <= 12:
                return None
            hour = hour % 12 + self.hour_offset
        in_range = 0 <= hour <= 23 and 0 <= minute <= 59 and 0 <= second <= 59 and millis <= 999
        if not in_range and (hour, minute, second, millis) != (24, 0, 0, 0):
            return None  # 24:00 is the end of the day; no other hour 24
        return hour, minute, second, millis

    def offset_seconds(self) -> int | bool | None:
        """Seconds east of UTC; ``None`` for local time; ``False`` when the offset is unusable."""
        if self.sign is None:
            return None
        total = ((self.zone_hour or 0) * 3600 + (self.zone_minute or 0) * 60) % (1 << 32)
        if total > _SMI_MAX:
            return False
        return self.sign * total


#: Returned by the ISO reader when the text can be nothing at all.
_INVALID: Final[Token] = (-1, 0, 0, W_NONE)


def _read_iso(scan: Scanner, parts: _Parts) -> Token:
    """The ECMAScript date-time string format, with V8's ``±hhmm`` offsets and long fractions.

    Returns the end token when the whole text was read, ``_INVALID`` when the text broke the
    format after its ``T`` (then it is no date at all), or else the first token it did not take,
    from which the legacy reader goes on with what was read.
    """
    if _is_sign(scan.peek()):
        sign_token = scan.next()
        if not _fixed(scan.peek(), 6):
            return sign_token
        year = scan.next()[1]
        if sign_token[1] == ord("-") and year == 0:
            return sign_token
        parts.add_day(-year if sign_token[1] == ord("-") else year)
    elif _fixed(scan.peek(), 4):
        parts.add_day(scan.next()[1])
    else:
        return scan.next()
    if scan.skip("-"):
        if not (_fixed(scan.peek(), 2) and 1 <= scan.peek()[1] <= 12):
            return scan.next()
        parts.add_day(scan.next()[1])
        if scan.skip("-"):
            if not (_fixed(scan.peek(), 2) and 1 <= scan.peek()[1] <= 31):
                return scan.next()
            parts.add_day(scan.next()[1])
    if not _is_word(scan.peek(), W_T):
        if scan.peek()[0] != END:
            return scan.next()
    elif not _read_iso_time(scan, parts):
        return _INVALID
    if parts.sign is None and not parts.time:
        parts.set_zone(0)  # a date-only form is UTC
    parts.iso = True
    return END_TOKEN


def _read_iso_time(scan: Scanner, parts: _Parts) -> bool:
    """``THH:mm[:ss[.s+]][Z|±hh:mm|±hhmm]`` to the end of the text."""
    scan.next()  # the T
    hour = scan.peek()
    if not (_fixed(hour, 2) and 0 <= hour[1] <= 24):
        return False
    is_24 = hour[1] == 24
    scan.next()
    if not scan.skip(":"):
        return False
    minute = scan.peek()
    if not (_fixed(minute, 2) and minute[1] <= 59) or (is_24 and minute[1] > 0):
        return False
    scan.next()
    parts.add_time(hour[1])
    parts.add_time(minute[1])
    if scan.skip(":"):
        second = scan.peek()
        if not (_fixed(second, 2) and second[1] <= 59) or (is_24 and second[1] > 0):
            return False
        parts.add_time(scan.next()[1])
        if scan.skip("."):
            fraction = scan.peek()
            if fraction[0] != NUM or (is_24 and _millis(fraction) > 0):
                return False
            parts.add_time(_millis(scan.next()))
    if _is_z(scan.peek()):
        scan.next()
        parts.set_zone(0)
    elif _is_sign(scan.peek()):
        parts.sign = 1 if scan.next()[1] == ord("+") else -1
        if _fixed(scan.peek(), 4):
            hhmm = scan.next()[1]
            if not (hhmm // 100 <= 23 and hhmm % 100 <= 59):
                return False
            parts.zone_hour, parts.zone_minute = divmod(hhmm, 100)
        else:
            zone_hour = scan.peek()
            if not (_fixed(zone_hour, 2) and zone_hour[1] <= 23):
                return False
            parts.zone_hour = scan.next()[1]
            if not scan.skip(":"):
                return False
            zone_minute = scan.peek()
            if not (_fixed(zone_minute, 2) and zone_minute[1] <= 59):
                return False
            parts.zone_minute = scan.next()[1]
    return scan.peek()[0] == END


def _read_legacy_offset(scan: Scanner, parts: _Parts, sign: Token) -> bool:
    """``±h``, ``±hh``, ``±hmm``, ``±hhmm`` or ``±h:`` (minutes to follow) after a time or UTC."""
    parts.sign = 1 if sign[1] == ord("+") else -1
    value, length = 0, 0
    if scan.peek()[0] == NUM:
        _kind, value, length, _cls = scan.next()
    if _is_sym(scan.peek(), ":"):
        parts.zone_hour, parts.zone_minute = value, None
    elif length in (1, 2):
        parts.zone_hour, parts.zone_minute = value, 0
    elif length in (3, 4):
        parts.zone_hour, parts.zone_minute = divmod(value, 100)
    else:
        return False
    return True


def _read_run(text: str, start: int, end: int, parts: _Parts, has_number: bool) -> bool:
    """The words of ``text[start:end]`` as the legacy reader takes them one by one.

    Each word is followed by whitespace or ignored characters, and none of them changes what the
    others mean (a number before them does: ``has_number``; a time read does). So: after a
    number, a word that is no month, no zone and no am/pm after a time makes the text no date;
    else the last month, am/pm (after a time) and zone (after a number) of the run are what
    counts, as the word-by-word reading leaves them. The run's words (at most a window of
    them) are split and lower-cased in C, and looked up as a set: a regular expression
    looking for a stray word, or for the last name, cost up to 700 ns per character.
    """
    if "(" in text[start:end]:  # a comment separates words as a space does; its words are none
        text = COMMENTS.sub(" ", text[start:end])
        start, end = 0, len(text)
    distinct = run_words(text, start, end)
    allowed = ZONE_NAMES | AMPM_NAMES if parts.time else ZONE_NAMES
    if has_number and any(w[:3] not in MONTH_NAMES and w not in allowed for w in distinct):
        return False  # a stray word after a number
    tick()
    # Each name that occurs is looked for from the end, in C (str.rfind).
    months = {w[:3] for w in distinct} & MONTH_NAMES
    if months:
        month = last_month(text, start, end, months)
        if month is not None:
            parts.named_month = month
    ampms = distinct & AMPM_NAMES
    if parts.time and ampms:
        ampm = last_name(text, start, end, ampms)
        if ampm is not None:
            parts.hour_offset = SHORT_WORDS[ampm][1]
    zones = distinct & ZONE_NAMES
    if has_number and zones:
        zone = last_name(text, start, end, zones)
        if zone is not None:
            parts.set_zone(SHORT_WORDS[zone][1])
    tick()
    return True


def _read_glued(scan: Scanner, parts: _Parts, token: Token, has_number: bool) -> None:
    """Words glued to symbols before any number (``"a-a-"``), the glued-run ``token``.

    Read one by one, only a month word means anything there (no word of it is followed by a
    number, by construction): the last one counts. Once a number or a time was read, every
    word and symbol means something: the run is read token by token after all.
    """
    if has_number or parts.time or parts.zone_hour is not None:
        scan.unglue(token)
        return
    tick()
    month = last_month(scan.text, token[1], token[2])
    if month is not None:
        parts.named_month = month


def _read_bulk(scan: Scanner, parts: _Parts, token: Token, has_number: bool) -> bool:
    """A run or a glued run, read at once; False when the text is no date."""
    if token[0] == GLUED:
        _read_glued(scan, parts, token, has_number)
        return True
    return _read_run(scan.text, token[1], token[2], parts, has_number)


def _read_legacy(scan: Scanner, parts: _Parts, token: Token) -> bool:
    """V8's legacy reader, from ``token`` on; False when the text is no date."""
    has_number = bool(parts.day)
    count = 0
    while token[0] != END:
        if not (count := count + 1) % _TICK_EVERY:
            tick()
        kind = token[0]
        if kind == NUM:
            has_number = True
            n = token[1]
            if scan.skip(":"):
                if scan.skip(":"):
                    if parts.time:
                        return False
                    parts.add_time(n)
                    parts.add_time(0)
                else:
                    if not parts.add_time(n):
                        return False
                    if _is_sym(scan.peek(), "."):
                        scan.next()
            elif scan.skip(".") and parts.time_expects(n):
                parts.add_time(n)
                if scan.peek()[0] != NUM:
                    return False
                parts.add_time_final(_millis(scan.next()))
            elif parts.zone_expects(n):
                parts.zone_minute = n
            elif parts.time_expects(n):
                parts.add_time_final(n)
                after = scan.peek()
                if not (after[0] in (END, WS) or _is_z(after) or _is_sign(after)):
                    return False
            else:
                if not parts.add_day(n):
                    return False
                scan.skip("-")
        elif kind == WORD:
            word_kind, value = token[3], token[1]
            if word_kind == W_AMPM and parts.time:
                parts.hour_offset = value
            elif word_kind == W_MONTH:
                parts.named_month = value
                scan.skip("-")
            elif word_kind == W_ZONE and has_number:
                parts.set_zone(value)
            elif has_number or scan.peek()[0] == NUM:
                return False  # a stray word after a number, or glued to the first one
        elif kind in (RUN, GLUED) and not _read_bulk(scan, parts, token, has_number):
            return False  # (a run that reads well falls through to no branch but the last)
        elif _is_sign(token) and (parts.zone_is_utc() or parts.time):
            has_number = True
            if not _read_legacy_offset(scan, parts, token):
                return False
        elif (_is_sign(token) or _is_sym(token, ")")) and has_number:
            return False
        elif not has_number and kind != WORD:
            scan.skip_symbols()
        token = scan.next()
    return True


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (month 1-12; day may overflow)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468 + day - 1


def local_offset_seconds(local_seconds: int) -> int:
    """The offset V8 uses to read a local wall time (counted in seconds as if it were UTC).

    The offsets in force a day before and a day after are the candidates; one fits when the
    instant it gives has that offset. When both fit (clocks set back) or neither does (clocks set
    forward), the earlier offset is used.
    """
    before = time.localtime(local_seconds - 86_400).tm_gmtoff
    if time.localtime(local_seconds - before).tm_gmtoff == before:
        return before
    after = time.localtime(local_seconds + 86_400).tm_gmtoff
    if time.localtime(local_seconds - after).tm_gmtoff == after:
        return after
    return before


def parse(text: str) -> int | None:
    """``Date.parse(text)``: milliseconds since the epoch, or ``None`` for NaN."""
    scan = Scanner(text)
    parts = _Parts()
    token = _read_iso(scan, parts)
    scan.glue = True  # the legacy reader, if any, reads from here: glued runs may be found
    if token is _INVALID or (token[0] != END and not _read_legacy(scan, parts, token)):
        return None
    date, clock, offset = parts.date(), parts.clock(), parts.offset_seconds()
    if date is None or clock is None or offset is False:
        return None
    year, month, day = date
    if abs(year) > _MAX_YEAR:
        return None
    hour, minute, second, millis = clock
    local = (
        days_from_civil(year, month, day) * _MS_PER_DAY
        + ((hour * 60 + minute) * 60 + second) * 1000
        + millis
    )
    if offset is None:
        if abs(local) > _MAX_LOCAL_MS:
            return None
        try:
            offset = local_offset_seconds(local // 1000)
        except (OverflowError, OSError, ValueError):
            return None
    utc = local - offset * 1000
    return utc if abs(utc) <= MAX_TIME_MS else None
