"""``Date.parse`` as V8 (the JavaScript engine of Node.js 20) implements it (SPEC 2.3).

The reconciler calls a ``produced_at`` a timestamp when ``Date.parse`` gives a finite number, so
memstaged must accept exactly the strings V8 accepts and read them as the same instant. V8 tries
the ECMAScript date-time string format first; when the text leaves that format before a ``T`` it
goes on, with what it has read so far, in its legacy parser, a permissive scanner kept for
compatibility with old browsers. This module is written from that documented grammar and from
Node's own answers (``tests/test_dateparse_node.py`` compares the two on every example of SPEC and
on a seeded corpus of generated strings in three time zones); it shares no code with V8.

The scanner reads the text lazily, one token of look-ahead, as V8's does: numbers (their value
from the first nine significant digits, and their length in characters, leading zeros included),
the symbols ``: - + . )``, words (a run of characters from ``A`` upwards that are not whitespace,
classified by their first three letters lower-cased: month names, ``am``/``pm``, zone names, ``t``,
or nothing), and runs of whitespace, parenthesised comments and anything else, which are ignored.
A NUL character ends the text, as in V8. V8 gives up within a few tokens on most garbage, and so
does this parser: a long text costs only the part of it that is read (issue 19 item 5).

Local time is the machine's zone (``TZ``, else ``/etc/localtime``), read with ``time.localtime``;
a local time that occurs twice is read with the offset in force before the change, and one that
does not occur (clocks set forward) with the offset before the change too, as V8 (through ICU)
does.
"""

from __future__ import annotations

import re
import time
from itertools import accumulate, repeat
from typing import Final

from memstaged.ecma import JS_WHITESPACE_SET
from memstaged.progress import tick

#: What V8's date scanner takes for whitespace: ECMAScript's, less U+2028 and U+2029 (which it
#: reads as letters of a word). Measured with Node 20.
_SPACE: Final = JS_WHITESPACE_SET - {"\u2028", "\u2029"}

MAX_TIME_MS: Final = 8_640_000_000_000_000
#: V8 refuses a local time this far beyond the range before converting it to UTC.
_MAX_LOCAL_MS: Final = MAX_TIME_MS + 864_000_000
_MS_PER_DAY: Final = 86_400_000
#: V8 keeps the first nine significant digits of a number and ignores the rest.
_SIGNIFICANT: Final = 9
#: A zone offset must fit a small integer; V8 computes it in unsigned 32-bit arithmetic first.
_SMI_MAX: Final = (1 << 31) - 1
#: Year limits of MakeDay (beyond them the time value is NaN in any case).
_MAX_YEAR: Final = 1_000_000

# Token kinds.
_END: Final = 0
_NUM: Final = 1
_SYM: Final = 2
_WS: Final = 3
_WORD: Final = 4
_OTHER: Final = 5
#: Many words in a row, each followed by whitespace or ignored characters: read in bulk.
_RUN: Final = 6

# Word classes.
_W_NONE: Final = 0
_W_MONTH: Final = 1
_W_AMPM: Final = 2
_W_ZONE: Final = 3
_W_T: Final = 4

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
#: Words of at most three letters, by their exact lower-cased text, and what they mean.
_SHORT_WORDS: Final[dict[str, tuple[int, int]]] = {
    "am": (_W_AMPM, 0),
    "pm": (_W_AMPM, 12),
    "ut": (_W_ZONE, 0),
    "utc": (_W_ZONE, 0),
    "z": (_W_ZONE, 0),
    "gmt": (_W_ZONE, 0),
    "cdt": (_W_ZONE, -5),
    "cst": (_W_ZONE, -6),
    "edt": (_W_ZONE, -4),
    "est": (_W_ZONE, -5),
    "mdt": (_W_ZONE, -6),
    "mst": (_W_ZONE, -7),
    "pdt": (_W_ZONE, -7),
    "pst": (_W_ZONE, -8),
    "t": (_W_T, 0),
}

Token = tuple[int, int, int, int]
"""(kind, value, length, word class): a number's value and digit count, a symbol's code, a word's
meaning (month number, hour offset, zone offset in hours) and its class."""

_END_TOKEN: Final[Token] = (_END, 0, 0, _W_NONE)
_WS_TOKEN: Final[Token] = (_WS, 0, 1, _W_NONE)
_OTHER_TOKEN: Final[Token] = (_OTHER, 0, 0, _W_NONE)
_SYMBOLS: Final = {c: (_SYM, ord(c), 1, _W_NONE) for c in ":-+.)"}
_DIGITS: Final = re.compile(r"[0-9]+")
_ZEROS: Final = re.compile(r"0*")
#: A word: characters from ``A`` upwards that are not whitespace.
_WORD_RUN: Final = re.compile("[^\\x00-@" + re.escape("".join(sorted(_SPACE))) + "]+")
#: Whitespace, and characters that are nothing to the parser: below ``A`` and none of
#: ``0-9 : - + . ( )`` (a ``(`` opens a comment, skipped apart).
_IGNORED: Final = re.compile("[\\x00-'*,/;-@" + re.escape("".join(sorted(_SPACE))) + "]+")
_PAREN_STEP: Final = {"(": 1, ")": -1}
_NOT_PAREN_BYTES: Final = bytes(b for b in range(256) if b not in b"()")
_PAREN_BYTE_STEP: Final = {ord("("): 1, ord(")"): -1}
_PAREN_RUN: Final = re.compile(rb"\(+|\)+")
#: Word runs shorter than this are read word by word (a real date has a few words).
_RUN_MIN: Final = 256
#: A run token covers at most this many characters; the next word starts the next one.
_RUN_WINDOW: Final = 1 << 16
_WORD_CHAR: Final = "[^\\x00-@" + re.escape("".join(sorted(_SPACE))) + "]"
_IGNORED_CHAR: Final = "[\\x00-'*,/;-@" + re.escape("".join(sorted(_SPACE))) + "]"
#: A comment nested up to four deep.
_COMMENT_4: Final = "\\((?:[^()]++|" * 3 + "\\([^()]*+\\)" + ")*+\\)" * 3
_COMMENTS: Final = re.compile(_COMMENT_4)
#: Whole units of a word and the ignored characters and comments after it.
_UNITS: Final = re.compile(f"(?:{_WORD_CHAR}++(?:{_IGNORED_CHAR}++|{_COMMENT_4})++)++")
_MONTH_NAMES: Final = "|".join(_MONTHS)
_ZONE_NAMES: Final = "|".join(
    sorted((w for w, (kind, _) in _SHORT_WORDS.items() if kind == _W_ZONE), key=len, reverse=True)
)
_AT_WORD: Final = f"(?<!{_WORD_CHAR})"
_WORD_ENDS: Final = f"(?!{_WORD_CHAR})"
#: The last word of a run that is a month, an am/pm, a zone: a greedy ``.*`` then backwards.
_LAST_MONTH: Final = re.compile(f"(?s:.*){_AT_WORD}(?i:({_MONTH_NAMES}))", re.ASCII)
_LAST_AMPM: Final = re.compile(f"(?s:.*){_AT_WORD}(?i:(am|pm)){_WORD_ENDS}", re.ASCII)
_LAST_ZONE: Final = re.compile(f"(?s:.*){_AT_WORD}(?i:({_ZONE_NAMES})){_WORD_ENDS}", re.ASCII)
#: A word that after a number makes the text no date: neither a month nor a zone, nor (when a
#: time was read) am/pm.
_STRAY_AFTER_TIME: Final = re.compile(
    f"{_AT_WORD}(?!(?i:{_MONTH_NAMES})|(?i:{_ZONE_NAMES}|am|pm){_WORD_ENDS}){_WORD_CHAR}",
    re.ASCII,
)
_STRAY: Final = re.compile(
    f"{_AT_WORD}(?!(?i:{_MONTH_NAMES})|(?i:{_ZONE_NAMES}){_WORD_ENDS}){_WORD_CHAR}", re.ASCII
)
#: Ignored characters and comments nested up to four deep, in C: ``()`` repeated over 8 MB is
#: four million comments, each too short to be worth a call of :func:`_skip_comment`.
_IGNORED_OR_COMMENTS: Final = re.compile(f"(?:{_IGNORED_CHAR}++|{_COMMENT_4})++")
_COMMENTS_WINDOW: Final = 1 << 12
#: Symbols, ignored characters and comments nested up to four deep: nothing before a number.
_SYMBOL_RUN: Final = re.compile(f"(?:[-:+.)]++|{_IGNORED_CHAR}++|{_COMMENT_4})++")
#: A comment is skipped this many characters at a time, with C-speed counting.
_CHUNK: Final = 1 << 16
#: The legacy reader reports progress (:func:`memstaged.progress.tick`) every so many tokens.
_TICK_EVERY: Final = 4096


def _lower3(word: str) -> str:
    # V8 lower-cases by setting bit 0x20 of each character, which only maps A-Z onto letters.
    return "".join(chr(ord(c) | 0x20) for c in word[:3])


def _classify_word(prefix: str, length: int) -> tuple[int, int]:
    """What a word means, from its first three characters and its length in UTF-16 units."""
    prefix = _lower3(prefix)
    if length <= 3:
        found = _SHORT_WORDS.get(prefix)
        if found is not None:
            return found
    if length >= 3 and prefix in _MONTHS:
        return _W_MONTH, _MONTHS.index(prefix) + 1
    return _W_NONE, 0


def _min_prefix(chunk: str) -> int:
    """The lowest running depth within ``chunk``, from 0 (so at most 0), counting its parentheses.

    The other characters are dropped in C (in UTF-8 no byte of another character is a
    parenthesis), then adjacent ``()`` are removed in C, which changes no running depth outside
    them (a dense run of ``()`` goes in one pass), as long as that pays; what is left is summed.
    """
    parens = chunk.encode("utf-8", "surrogatepass").translate(None, _NOT_PAREN_BYTES)
    while b"()" in parens:
        reduced = parens.replace(b"()", b"")
        shrunk = len(parens) - len(reduced) >= len(parens) >> 3
        parens = reduced
        if not shrunk:
            break
    if parens.count(b")(") + parens.count(b"()") < len(parens) >> 4:  # deep: long runs
        depth, lowest = 0, 0
        for run in _PAREN_RUN.finditer(parens):
            depth += len(run[0]) if run[0][0] == ord("(") else -len(run[0])
            lowest = min(lowest, depth)
        return lowest
    return min(accumulate(map(_PAREN_BYTE_STEP.__getitem__, parens), initial=0))


def _skip_comment(text: str, i: int) -> int:
    """Past the parenthesised comment that opens at ``i``: where its ``(`` are all closed, or the
    end of the text. Counted a chunk at a time in C: a comment may be the whole 8 MiB text, and
    only the chunk where it closes is walked character by character (issue 19 item 5: ``()``
    repeated inside a comment took 346 ns per byte). Chunks grow from a few characters: ``()``
    repeated outside a comment is as many comments."""
    depth, j, n, chunk = 1, i + 1, len(text), 64
    while j < n:
        k = min(j + chunk, n)
        chunk = min(chunk * 2, _CHUNK)  # a short comment costs its length, not a chunk's
        closes = text.count(")", j, k)
        if depth > closes or depth + _min_prefix(text[j:k]) > 0:
            depth += text.count("(", j, k) - closes  # cannot close in this chunk
        else:
            steps = accumulate(map(_PAREN_STEP.get, text[j:k], repeat(0)), initial=depth)
            sums = list(steps)
            if 0 in sums:
                return j + sums.index(0)
            depth = sums[-1]
        j = k
        tick()
    return n


class _Scanner:
    """V8's date tokenizer: one token of look-ahead, each scanned only when it is reached.

    V8 gives up on most garbage within a few tokens; scanning lazily does the same, so a long
    text costs only what is read of it (issue 19 item 5: a token list of the whole 8 MiB text
    took 700 MB). A run of whitespace, characters the parser ignores and comments is one token,
    of the kind of its first character: every reader ignores all but that first one.
    """

    __slots__ = ("end", "i", "next_token", "run_end", "run_start", "text")

    def __init__(self, text: str) -> None:
        nul = text.find("\0")
        self.text = text
        self.end = len(text) if nul < 0 else nul  # a NUL character ends the text, as in V8
        self.i = 0
        self.run_start = self.run_end = -1
        self.next_token = self._scan()

    def _scan(self) -> Token:
        text, i, n = self.text, self.i, self.end
        if i >= n:
            return _END_TOKEN
        if i == self.run_start:
            self.i = self.run_end
            return _RUN, i, self.run_end, _W_NONE
        c = text[i]
        if "0" <= c <= "9":
            end = _DIGITS.match(text, i, n).end()  # type: ignore[union-attr]
            first = _ZEROS.match(text, i, end).end()  # type: ignore[union-attr]
            value = int(text[first : min(first + _SIGNIFICANT, end)]) if first < end else 0
            self.i = end
            return _NUM, value, end - i, _W_NONE
        symbol = _SYMBOLS.get(c)
        if symbol is not None:
            self.i = i + 1
            return symbol
        if c >= "A" and c not in _SPACE:
            end = _WORD_RUN.match(text, i, n).end()  # type: ignore[union-attr]
            head = text[i : min(i + 4, end)]
            # UTF-16 length, exact up to 4: a character outside the BMP counts two.
            length = len(head) + sum(1 for h in head if ord(h) > 0xFFFF)
            word_class, value = _classify_word(head, length)
            self.i = end
            if n - end > _RUN_MIN:
                self._find_run(end)
            return _WORD, value, length, word_class
        token = _WS_TOKEN if c in _SPACE else _OTHER_TOKEN
        while i < n:  # the whole ignorable run, comments included
            # within a window: a long comment is _skip_comment's, not read twice
            run = _IGNORED_OR_COMMENTS.match(text, i, min(n, i + _COMMENTS_WINDOW))
            if run is not None:
                i = run.end()
            if i < n and text[i] == "(":  # a comment nested deeper, or unclosed
                i = min(_skip_comment(text, i), n)
                continue
            run = _IGNORED.match(text, i, n)
            if run is None:
                break
            i = run.end()
        self.i = i
        return token

    def _find_run(self, word_end: int) -> None:
        """After a word: when many more words, each followed by whitespace or ignored
        characters, come after the ignored characters that follow it, they are one run token.

        No word of a run is followed by a number or a symbol, so no reader looks past it: each
        is taken for what it is, and :func:`_read_run` takes them all at once (issue 19 item 5:
        ``"jan "`` repeated over 8 MB took 4 µs per byte word by word). The first word is a
        token of its own, so the ISO reader, which may look at it, never sees a run.
        """
        gap = _IGNORED_OR_COMMENTS.match(self.text, word_end, self.end)
        if gap is None:
            return
        # A window at a time: V8 may give up at the run's first words, and so must this.
        units = _UNITS.match(self.text, gap.end(), min(self.end, gap.end() + _RUN_WINDOW))
        if units is not None and units.end() - gap.end() >= _RUN_MIN:
            self.run_start, self.run_end = gap.end(), units.end()

    def skip_symbols(self) -> None:
        """Past the symbols, ignored characters and comments that come next, in C.

        Before the first number, none of them means anything to the legacy reader, and V8 reads
        them one by one to the end (issue 19 item 5: ``")"`` repeated took 2 µs per byte here).
        """
        if self.next_token[0] not in (_SYM, _WS, _OTHER):
            return
        run = _SYMBOL_RUN.match(self.text, self.i, self.end)
        if run is not None:
            self.i = run.end()
        self.next_token = self._scan()

    def peek(self) -> Token:
        return self.next_token

    def next(self) -> Token:
        token = self.next_token
        if token[0] != _END:
            self.next_token = self._scan()
        return token

    def skip(self, char: str) -> bool:
        token = self.next_token
        if token[0] == _SYM and token[1] == ord(char):
            self.next_token = self._scan()
            return True
        return False


def _is_sym(token: Token, char: str) -> bool:
    return token[0] == _SYM and token[1] == ord(char)


def _is_sign(token: Token) -> bool:
    return token[0] == _SYM and token[1] in (ord("+"), ord("-"))


def _is_word(token: Token, kind: int) -> bool:
    return token[0] == _WORD and token[3] == kind


def _is_z(token: Token) -> bool:
    return token[0] == _WORD and token[2] == 1 and token[3] == _W_ZONE and token[1] == 0


def _fixed(token: Token, length: int) -> bool:
    return token[0] == _NUM and token[2] == length


def _millis(token: Token) -> int:
    """The first three digits of a fraction, from its value and its digit count."""
    value, length = token[1], min(token[2], _SIGNIFICANT)
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
_INVALID: Final[Token] = (-1, 0, 0, _W_NONE)


def _read_iso(scan: _Scanner, parts: _Parts) -> Token:
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
    if not _is_word(scan.peek(), _W_T):
        if scan.peek()[0] != _END:
            return scan.next()
    elif not _read_iso_time(scan, parts):
        return _INVALID
    if parts.sign is None and not parts.time:
        parts.set_zone(0)  # a date-only form is UTC
    parts.iso = True
    return _END_TOKEN


def _read_iso_time(scan: _Scanner, parts: _Parts) -> bool:
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
            if fraction[0] != _NUM or (is_24 and _millis(fraction) > 0):
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
    return scan.peek()[0] == _END


def _read_legacy_offset(scan: _Scanner, parts: _Parts, sign: Token) -> bool:
    """``±h``, ``±hh``, ``±hmm``, ``±hhmm`` or ``±h:`` (minutes to follow) after a time or UTC."""
    parts.sign = 1 if sign[1] == ord("+") else -1
    value, length = 0, 0
    if scan.peek()[0] == _NUM:
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
    counts, as the word-by-word reading leaves them. Each is found by one regular expression,
    in C.
    """
    if "(" in text[start:end]:  # a comment separates words as a space does; its words are none
        text = _COMMENTS.sub(" ", text[start:end])
        start, end = 0, len(text)
    stray = _STRAY_AFTER_TIME if parts.time else _STRAY
    if has_number and stray.search(text, start, end) is not None:
        return False
    tick()
    # Which names occur at all, found by byte searches in C (ASCII letters lower-cased only, as
    # V8 does; a non-ASCII character is other bytes): the backwards searches below cost more.
    lowered = text[start:end].encode("utf-8", "surrogatepass").lower()
    month = None
    if any(name.encode() in lowered for name in _MONTHS):
        month = _LAST_MONTH.match(text, start, end)
    if month is not None:
        parts.named_month = _MONTHS.index(month[1].lower()) + 1
    if parts.time and (b"am" in lowered or b"pm" in lowered):
        ampm = _LAST_AMPM.match(text, start, end)
        if ampm is not None:
            parts.hour_offset = _SHORT_WORDS[ampm[1].lower()][1]
    if has_number:
        zone = _LAST_ZONE.match(text, start, end)
        if zone is not None:
            parts.set_zone(_SHORT_WORDS[zone[1].lower()][1])
    tick()
    return True


def _read_legacy(scan: _Scanner, parts: _Parts, token: Token) -> bool:
    """V8's legacy reader, from ``token`` on; False when the text is no date."""
    has_number = bool(parts.day)
    count = 0
    while token[0] != _END:
        if not (count := count + 1) % _TICK_EVERY:
            tick()
        kind = token[0]
        if kind == _NUM:
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
                if scan.peek()[0] != _NUM:
                    return False
                parts.add_time_final(_millis(scan.next()))
            elif parts.zone_expects(n):
                parts.zone_minute = n
            elif parts.time_expects(n):
                parts.add_time_final(n)
                after = scan.peek()
                if not (after[0] in (_END, _WS) or _is_z(after) or _is_sign(after)):
                    return False
            else:
                if not parts.add_day(n):
                    return False
                scan.skip("-")
        elif kind == _WORD:
            word_kind, value = token[3], token[1]
            if word_kind == _W_AMPM and parts.time:
                parts.hour_offset = value
            elif word_kind == _W_MONTH:
                parts.named_month = value
                scan.skip("-")
            elif word_kind == _W_ZONE and has_number:
                parts.set_zone(value)
            elif has_number or scan.peek()[0] == _NUM:
                return False  # a stray word after a number, or glued to the first one
        elif kind == _RUN and not _read_run(scan.text, token[1], token[2], parts, has_number):
            return False  # (a run that reads well falls through to no branch but the last)
        elif _is_sign(token) and (parts.zone_is_utc() or parts.time):
            has_number = True
            if not _read_legacy_offset(scan, parts, token):
                return False
        elif (_is_sign(token) or _is_sym(token, ")")) and has_number:
            return False
        elif not has_number and kind != _WORD:
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
    scan = _Scanner(text)
    parts = _Parts()
    token = _read_iso(scan, parts)
    if token is _INVALID or (token[0] != _END and not _read_legacy(scan, parts, token)):
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
