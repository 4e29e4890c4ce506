"""V8's date scanner, for :mod:`memstaged.core.js.date_parse`: the tokens ``Date.parse`` reads (SPEC
2.3).

The scanner reads the text lazily, one token of look-ahead, as V8's does: numbers (their value
from the first nine significant digits, and their length in characters, leading zeros included),
the symbols ``: - + . )``, words (a run of characters from ``A`` upwards that are not whitespace,
classified by their first three letters lower-cased: month names, ``am``/``pm``, zone names, ``t``,
or nothing), and runs of whitespace, parenthesised comments and anything else, which are ignored.
A NUL character ends the text, as in V8. Long runs of words, of comments and of ignored
characters are read in bulk by regular expressions (in C), so a long text costs little per byte.
Written from V8's documented grammar and Node's answers; it shares no code with V8.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import accumulate, repeat
from typing import Final

from memstaged.core.js.ecma import JS_WHITESPACE_SET
from memstaged.core.ticks import tick

#: What V8's date scanner takes for whitespace: ECMAScript's, less U+2028 and U+2029 (which it
#: reads as letters of a word). Measured with Node 20.
_SPACE: Final = JS_WHITESPACE_SET - {"\u2028", "\u2029"}

#: V8 keeps the first nine significant digits of a number and ignores the rest.
SIGNIFICANT: Final = 9

# Token kinds.
END: Final = 0
NUM: Final = 1
SYM: Final = 2
WS: Final = 3
WORD: Final = 4
_OTHER: Final = 5
#: Many words in a row, each followed by whitespace or ignored characters: read in bulk.
RUN: Final = 6
#: Before the first number: words glued to symbols (``"a-a-"``), whitespace and ignored
#: characters, no comment; the legacy reader reads it in bulk or not at all (:meth:`unglue`).
GLUED: Final = 7

# Word classes.
W_NONE: Final = 0
W_MONTH: Final = 1
W_AMPM: Final = 2
W_ZONE: Final = 3
W_T: Final = 4

MONTHS: Final = (
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
SHORT_WORDS: Final[dict[str, tuple[int, int]]] = {
    "am": (W_AMPM, 0),
    "pm": (W_AMPM, 12),
    "ut": (W_ZONE, 0),
    "utc": (W_ZONE, 0),
    "z": (W_ZONE, 0),
    "gmt": (W_ZONE, 0),
    "cdt": (W_ZONE, -5),
    "cst": (W_ZONE, -6),
    "edt": (W_ZONE, -4),
    "est": (W_ZONE, -5),
    "mdt": (W_ZONE, -6),
    "mst": (W_ZONE, -7),
    "pdt": (W_ZONE, -7),
    "pst": (W_ZONE, -8),
    "t": (W_T, 0),
}

Token = tuple[int, int, int, int]
"""(kind, value, length, word class): a number's value and digit count, a symbol's code, a word's
meaning (month number, hour offset, zone offset in hours) and its class."""

END_TOKEN: Final[Token] = (END, 0, 0, W_NONE)
_WS_TOKEN: Final[Token] = (WS, 0, 1, W_NONE)
_OTHER_TOKEN: Final[Token] = (_OTHER, 0, 0, W_NONE)
_SYMBOLS: Final = {c: (SYM, ord(c), 1, W_NONE) for c in ":-+.)"}
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
COMMENTS: Final = re.compile(_COMMENT_4)
#: Whole units of a word and the ignored characters and comments after it.
_UNITS: Final = re.compile(f"(?:{_WORD_CHAR}++(?:{_IGNORED_CHAR}++|{_COMMENT_4})++)++")
#: The names a word of a run may be (ASCII lower case): a month by its first three letters,
#: a zone or am/pm as a whole word.
MONTH_NAMES: Final = frozenset(MONTHS)
ZONE_NAMES: Final = frozenset(w for w, (kind, _) in SHORT_WORDS.items() if kind == W_ZONE)
AMPM_NAMES: Final = frozenset(("am", "pm"))
#: Ignored characters and comments nested up to four deep, in C: ``()`` repeated over 8 MB is
#: four million comments, each too short to be worth a call of :func:`_skip_comment`.
_IGNORED_OR_COMMENTS: Final = re.compile(f"(?:{_IGNORED_CHAR}++|{_COMMENT_4})++")
_COMMENTS_WINDOW: Final = 1 << 12
#: Symbols, ignored characters and comments nested up to four deep: nothing before a number.
#: What a glued run may hold: anything but a digit or a comment (a NUL ends the text before).
_GLUED_RUN: Final = re.compile(r"[^0-9(]*+")
_SYMBOL_RUN: Final = re.compile(f"(?:[-:+.)]++|{_IGNORED_CHAR}++|{_COMMENT_4})++")
#: A comment is skipped this many characters at a time, with C-speed counting.
_CHUNK: Final = 1 << 16


def _lower3(word: str) -> str:
    # V8 lower-cases by setting bit 0x20 of each character, which only maps A-Z onto letters.
    return "".join(chr(ord(c) | 0x20) for c in word[:3])


def _classify_word(prefix: str, length: int) -> tuple[int, int]:
    """What a word means, from its first three characters and its length in UTF-16 units."""
    prefix = _lower3(prefix)
    if length <= 3:
        found = SHORT_WORDS.get(prefix)
        if found is not None:
            return found
    if length >= 3 and prefix in MONTHS:
        return W_MONTH, MONTHS.index(prefix) + 1
    return W_NONE, 0


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
    only the chunk where it closes is walked character by character (``()``
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


_ASCII_LOWER: Final = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


#: Every character that is no word character becomes a space, A-Z lower case.
_WORDS_ONLY: Final = {
    **{c: 32 for c in range(ord("A"))},
    **{ord(c): 32 for c in _SPACE},
    **_ASCII_LOWER,
}


def run_words(text: str, start: int, end: int) -> set[str]:
    """The distinct words of ``text[start:end]``, A-Z lower-cased (V8 sets bit 0x20: only A-Z
    become letters), split in C (``re.findall`` cost 100 ns per character)."""
    words = set(text[start:end].translate(_WORDS_ONLY).split(" "))
    words.discard("")
    return words


def last_name(text: str, start: int, end: int, names: Iterable[str]) -> str | None:
    """The last whole word of ``text[start:end]`` that is one of ``names``, A-Z lower-cased."""
    chunk = text[start:end].translate(_WORDS_ONLY)
    best, found = -1, None
    for name in names:
        pos = chunk.rfind(name)
        while pos > best:
            after = pos + len(name)
            if (pos == 0 or chunk[pos - 1] == " ") and (after == len(chunk) or chunk[after] == " "):
                best, found = pos, name
                break
            pos = chunk.rfind(name, 0, after - 1)
    return found


def last_month(text: str, start: int, end: int, names: Iterable[str] = MONTHS) -> int | None:
    """The month (1-12) of the last word of ``text[start:end]`` that names one, if any.

    By ``rfind`` of each name in C, then a look at the character before it: a regular
    expression searching back from the end cost 200-400 ns per character.
    """
    chunk = text[start:end].translate(_ASCII_LOWER)  # ASCII only, as V8; lengths unchanged
    best, month = -1, None
    for name in names:
        number = MONTHS.index(name) + 1
        pos = chunk.rfind(name)
        while pos > best:
            before = text[start + pos - 1] if start + pos > 0 else " "
            if before < "A" or before in _SPACE:  # the name starts a word
                best, month = pos, number
                break
            pos = chunk.rfind(name, 0, pos + len(name) - 1)
    return month


class Scanner:
    """V8's date tokenizer: one token of look-ahead, each scanned only when it is reached.

    V8 gives up on most garbage within a few tokens; scanning lazily does the same, so a long
    text costs only what is read of it (a token list of the whole 8 MiB text
    took 700 MB). A run of whitespace, characters the parser ignores and comments is one token,
    of the kind of its first character: every reader ignores all but that first one.
    """

    __slots__ = (
        "end",
        "glue",
        "glue_from",
        "i",
        "next_token",
        "run_end",
        "run_kind",
        "run_start",
        "text",
    )

    def __init__(self, text: str) -> None:
        nul = text.find("\0")
        self.text = text
        self.end = len(text) if nul < 0 else nul  # a NUL character ends the text, as in V8
        self.i = 0
        self.run_start = self.run_end = -1
        self.run_kind = RUN
        #: Set by the legacy reader: glued runs may be found (never for the ISO reader).
        self.glue = False
        #: No glued run starts before this (the reader asked to read one token by token).
        self.glue_from = 0
        self.next_token = self._scan()

    def _scan(self) -> Token:
        text, i, n = self.text, self.i, self.end
        if i >= n:
            return END_TOKEN
        if i == self.run_start:
            self.i = self.run_end
            return self.run_kind, i, self.run_end, W_NONE
        c = text[i]
        if "0" <= c <= "9":
            end = _DIGITS.match(text, i, n).end()  # type: ignore[union-attr]
            first = _ZEROS.match(text, i, end).end()  # type: ignore[union-attr]
            value = int(text[first : min(first + SIGNIFICANT, end)]) if first < end else 0
            self.i = end
            return NUM, value, end - i, W_NONE
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
                if self.run_start < end and self.glue and end >= self.glue_from:
                    self._find_glued(end)
            return WORD, value, length, word_class
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
        is taken for what it is, and :func:`_read_run` takes them all at once (``"jan "`` repeated
        over 8 MB took 4 µs per byte word by word). The first word is a token of its own, so the ISO
        reader, which may look at it, never sees a run.
        """
        gap = _IGNORED_OR_COMMENTS.match(self.text, word_end, self.end)
        if gap is None:
            return
        # A window at a time: V8 may give up at the run's first words, and so must this.
        units = _UNITS.match(self.text, gap.end(), min(self.end, gap.end() + _RUN_WINDOW))
        if units is not None and units.end() - gap.end() >= _RUN_MIN:
            self.run_start, self.run_end, self.run_kind = gap.end(), units.end(), RUN

    def _find_glued(self, word_end: int) -> None:
        """After a word: when what follows it up to the next digit or comment is long, it is
        one glued-run token (``"a-"`` repeated took 20-30 µs per byte).

        A window at a time, as for a run, and never ending inside a word: a word cut in two
        is two words. A word right before a digit is left out, to be read on its own: glued
        to a number, it makes the text no date.
        """
        text, n = self.text, self.end
        stop = _GLUED_RUN.match(text, word_end, min(n, word_end + _RUN_WINDOW)).end()  # type: ignore[union-attr]
        after = text[stop] if stop < n else " "
        if "0" <= after <= "9" or (after >= "A" and after not in _SPACE):
            # a digit, or a word character at the window's edge: leave out the last word
            while stop > word_end and text[stop - 1] >= "A" and text[stop - 1] not in _SPACE:
                stop -= 1
        if stop - word_end >= _RUN_MIN:
            self.run_start, self.run_end, self.run_kind = word_end, stop, GLUED

    def unglue(self, token: Token) -> None:
        """Read the glued run ``token`` token by token after all (a number or a time was read)."""
        self.i, self.glue_from = token[1], token[2]
        self.run_start = -1
        self.next_token = self._scan()

    def skip_symbols(self) -> None:
        """Past the symbols, ignored characters and comments that come next, in C.

        Before the first number, none of them means anything to the legacy reader, and V8 reads
        them one by one to the end (``")"`` repeated took 2 µs per byte here).
        """
        if self.next_token[0] not in (SYM, WS, _OTHER):
            return
        run = _SYMBOL_RUN.match(self.text, self.i, self.end)
        if run is not None:
            self.i = run.end()
        self.next_token = self._scan()

    def peek(self) -> Token:
        return self.next_token

    def next(self) -> Token:
        token = self.next_token
        if token[0] != END:
            self.next_token = self._scan()
        return token

    def skip(self, char: str) -> bool:
        token = self.next_token
        if token[0] == SYM and token[1] == ord(char):
            self.next_token = self._scan()
            return True
        return False
