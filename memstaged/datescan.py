"""V8's date scanner, for :mod:`memstaged.dateparse`: the tokens ``Date.parse`` reads (SPEC 2.3).

The scanner reads the text lazily, one token of look-ahead, as V8's does: numbers (their value
from the first nine significant digits, and their length in characters, leading zeros included),
the symbols ``: - + . )``, words (a run of characters from ``A`` upwards that are not whitespace,
classified by their first three letters lower-cased: month names, ``am``/``pm``, zone names, ``t``,
or nothing), and runs of whitespace, parenthesised comments and anything else, which are ignored.
A NUL character ends the text, as in V8. Long runs of words, of comments and of ignored
characters are read in bulk by regular expressions (in C), so a long text costs little per byte
(issue 19 item 5). Written from V8's documented grammar and Node's answers; it shares no code
with V8.
"""

from __future__ import annotations

import re
from itertools import accumulate, repeat
from typing import Final

from memstaged.ecma import JS_WHITESPACE_SET
from memstaged.progress import tick

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
_MONTH_NAMES: Final = "|".join(MONTHS)
_ZONE_NAMES: Final = "|".join(
    sorted((w for w, (kind, _) in SHORT_WORDS.items() if kind == W_ZONE), key=len, reverse=True)
)
_AT_WORD: Final = f"(?<!{_WORD_CHAR})"
_WORD_ENDS: Final = f"(?!{_WORD_CHAR})"
#: The last word of a run that is a month, an am/pm, a zone: a greedy ``.*`` then backwards.
LAST_MONTH: Final = re.compile(f"(?s:.*){_AT_WORD}(?i:({_MONTH_NAMES}))", re.ASCII)
LAST_AMPM: Final = re.compile(f"(?s:.*){_AT_WORD}(?i:(am|pm)){_WORD_ENDS}", re.ASCII)
LAST_ZONE: Final = re.compile(f"(?s:.*){_AT_WORD}(?i:({_ZONE_NAMES})){_WORD_ENDS}", re.ASCII)
#: A word that after a number makes the text no date: neither a month nor a zone, nor (when a
#: time was read) am/pm.
STRAY_AFTER_TIME: Final = re.compile(
    f"{_AT_WORD}(?!(?i:{_MONTH_NAMES})|(?i:{_ZONE_NAMES}|am|pm){_WORD_ENDS}){_WORD_CHAR}",
    re.ASCII,
)
STRAY: Final = re.compile(
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


class Scanner:
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
            return END_TOKEN
        if i == self.run_start:
            self.i = self.run_end
            return RUN, i, self.run_end, W_NONE
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
