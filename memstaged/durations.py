"""Seconds as a person types them: the one reading of ``--settle``, ``--wait``, ``--older-than``.

Three options once read seconds three ways: ``--settle`` (and the config's
intervals) as a bare number, the inspection commands' ages (``--older-than 30d``, ``--since
2h``, ``--grace``) as a number with a unit, and ``deadletter --wait`` as either, each with its
own regular expression or ``float`` call. They are one reading here; each option says which
forms it takes and what range, and words its error around the reason given here.

Only ``re`` and ``math`` are imported: the command line is built on every start-up.
"""

from __future__ import annotations

import math
import re
from typing import Final, Literal

#: A duration: a plain decimal number (no sign, no exponent) and a unit, blanks around.
_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: The longest duration taken: ten thousand years; longer is a typo, and overflows dates.
MAX_DURATION: Final = 10_000 * 365.25 * 86_400

#: What an option takes: a bare number (``float``'s syntax: ``1.5``, ``1e3``, ``inf``; the
#: range is the option's), a duration (``30s``, ``10m``, ``2h``, ``3d``, ``1w``), or either.
Form = Literal["number", "duration", "either"]


def is_duration(text: str) -> bool:
    """Whether ``text`` has a duration's form (``--since`` also takes ``today`` or a date)."""
    return _DURATION.fullmatch(text) is not None


def parse_seconds(text: str, accept: Form) -> float:
    """``text`` in seconds, or ``ValueError`` whose text is the reason, without the option's
    name (each caller's message puts the option and the value before it).

    A bare number is not range-checked (``--settle`` refuses over a week, ``--wait`` only
    negatives and infinities: that is the option's to say); a duration is at most
    :data:`MAX_DURATION`, as longer overflows the dates it is subtracted from.
    """
    if accept != "duration":
        try:
            return float(text)
        except ValueError:
            if accept == "number":
                raise ValueError("expected a number of seconds") from None
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError("expected a duration such as 30s, 10m, 2h or 3d")
    seconds = float(match[1]) * _UNIT_SECONDS[match[2].lower()]
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError("longer than 10,000 years")
    return seconds
