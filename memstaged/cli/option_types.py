"""The ``type=`` functions of the numeric options and of record IDs: a value is taken, clamped
or refused here.

A value refused here is argparse's own one line (``memstaged log: argument -n/--lines: ...``)
and exit 2; one taken is one the code after it can use. ``log -n 99999999999999999999999`` once
reached ``collections.deque(maxlen=)`` as it was and ended in an ``OverflowError`` traceback. Every
numeric option of every command has one of these as its ``type``
(``tests/system/test_cli_fuzz.py`` checks that, and throws hostile values at each).

Only ``argparse`` and ``re`` are imported: the command line is built on every start-up.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Final

#: A whole number as a person types it: ASCII digits, an optional sign, blanks around.
_WHOLE: Final = re.compile(r"\s*([+-]?)([0-9]+)\s*")
#: The largest count taken; more is clamped to it. It is what ``deque(maxlen=)`` and
#: ``itertools.islice`` accept, and more events, records or bytes than any file holds.
MAX_COUNT: Final = sys.maxsize


def count(text: str) -> int:
    """``-n``, ``--top``, ``--max-bytes``: a whole number, 0 or more.

    A huge one means "all of them", as ``tail -n 99999999999999999999999`` does: it is clamped to
    :data:`MAX_COUNT` (digits beyond Python's int-string limit included). A negative, fractional
    or non-numeric one (``-1``, ``1.5``, ``1e3``, ``nan``, ``''``) is refused.
    """
    match = _WHOLE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    sign, digits = match.groups()
    digits = digits.lstrip("0") or "0"
    if sign == "-" and digits != "0":
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    if len(digits) > len(str(MAX_COUNT)):
        return MAX_COUNT
    return min(int(digits), MAX_COUNT)


def settle_seconds(text: str) -> float:
    """``--settle``: a finite number of seconds in range; ``inf``, ``nan`` and ``1e308`` are
    refused here rather than overflowing a timer later."""
    from memstaged.config import interval
    from memstaged.errors import ConfigError

    try:
        return interval(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--settle ")) from None


def wait_seconds(text: str) -> float:
    """``deadletter recover|purge --wait=60``, ``--wait=2m``: how long to wait for
    ``canonical-writer.lock``; any finite number of seconds from 0, or a duration."""
    from memstaged.durations import MAX_DURATION, parse_seconds

    try:
        seconds = parse_seconds(text, "either")
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}")
    if seconds > MAX_DURATION:
        raise argparse.ArgumentTypeError(f"{text!r}: longer than 10,000 years")
    return seconds


#: What a shell pattern is made of: an ID is a name or the start of one, never a pattern.
_WILDCARDS: Final = frozenset("*?[")


def record_id(text: str) -> str:
    """A dead-letter record's ID (``show``, ``recover --id``, ``purge --id``, ``ack``): its name
    without ``.json``, or the start of it.

    Empty or blank, it would be the start of every name, and choose the only record there is;
    a wildcard would be taken as a character, not as the pattern it looks like. Either is
    refused, so that no record is chosen by a typo or an unset shell variable.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"an ID names a record; {text!r} names none")
    wild = sorted(_WILDCARDS.intersection(text))
    if wild:
        raise argparse.ArgumentTypeError(
            f"{text!r}: an ID is a record's name or the start of one, not a pattern "
            f"({' '.join(wild)})"
        )
    return text
