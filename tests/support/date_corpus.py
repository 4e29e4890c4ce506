"""Date-like strings for the ``Date.parse`` differential tests: a seeded generator of date parts,
separators, month and day names, zones, offsets, garbage words and whitespace.

:func:`corpus` gives the same strings for the same seed.
"""

from __future__ import annotations

import random

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ZONE_WORDS = [
    "Z",
    "z",
    "UTC",
    "utc",
    "UT",
    "GMT",
    "gmt",
    "EST",
    "EDT",
    "CST",
    "CDT",
    "MST",
    "MDT",
    "PST",
    "PDT",
    "est",
    "pdt",
    "UTCX",
    "GMTX",
]
GARBAGE = ["foo", "x", "T", "t", "am", "PM", "a", "[", "_", "@", "é", "Ω", "(note)", "(a(b)c)", "("]
GARBAGE += [
    ")",
    "de",
    "le",
    "at",
    "on",
    "the",
    "sept",
    "ma",
    "ju",
    "decembre",
    "\u0085",
    "\U0001f600",
]
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\u00a0", "\u3000", "\ufeff", "\u2028", "\x0b", "\x1c"]
SEPARATORS = ["-", "/", ".", " ", ",", ", ", "T", "t", "", ":", "+", "--", " - ", "_"]


def _num(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.25:
        return f"{rng.randint(0, 12):0{rng.choice((1, 2))}d}"
    if kind < 0.5:
        return f"{rng.randint(0, 32):0{rng.choice((1, 2))}d}"
    if kind < 0.7:
        return str(rng.choice((rng.randint(1900, 2100), rng.randint(0, 9999))))
    if kind < 0.8:
        return f"{rng.randint(0, 99):02d}"
    if kind < 0.9:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    return "0" * rng.randint(1, 4) + str(rng.randint(0, 999))


def _time(rng: random.Random) -> str:
    hour = rng.choice((rng.randint(0, 23), rng.randint(0, 25), 24, 12, 0))
    text = f"{hour:0{rng.choice((1, 2))}d}:{rng.randint(0, 61):02d}"
    if rng.random() < 0.6:
        text += f":{rng.randint(0, 61):02d}"
        if rng.random() < 0.4:
            text += rng.choice((".", ",")) + "".join(
                rng.choice("0123456789") for _ in range(rng.randint(0, 12))
            )
    elif rng.random() < 0.1:
        text += rng.choice(("::", ":", "."))
    if rng.random() < 0.2:
        text += rng.choice(SPACES) + rng.choice(("am", "pm", "AM", "P.M.", "a.m."))
    return text


def _offset(rng: random.Random) -> str:
    sign = rng.choice("+-")
    hours, minutes = rng.choice((rng.randint(0, 14), rng.randint(0, 99))), rng.randint(0, 60)
    return rng.choice(
        (
            f"{sign}{hours:02d}:{minutes:02d}",
            f"{sign}{hours:02d}{minutes:02d}",
            f"{sign}{hours}",
            f"{sign}{hours:02d}",
            f"{sign}{hours}{minutes:02d}",
            f"{sign}{hours}:",
            f"{sign}:{minutes:02d}",
            f"{sign}{rng.randint(0, 99999)}",
            sign,
            f"GMT{sign}{hours:02d}{minutes:02d}",
            f"UTC{sign}{hours}",
        )
    )


def _iso(rng: random.Random) -> str:
    """The ECMAScript format and its near misses."""
    year = rng.choice(
        (
            f"{rng.randint(0, 9999):04d}",
            f"{rng.choice('+-')}{rng.randint(0, 275761):06d}",
            f"{rng.randint(0, 99999):05d}",
            f"{rng.randint(0, 999):03d}",
        )
    )
    text = year
    if rng.random() < 0.85:
        text += f"-{rng.randint(0, 13):0{rng.choice((2, 2, 1))}d}"
        if rng.random() < 0.85:
            text += f"-{rng.randint(0, 32):0{rng.choice((2, 2, 1))}d}"
    if rng.random() < 0.7:
        text += rng.choice(("T", "T", "t", " ", "", "  "))
        text += (
            _time(rng)
            if rng.random() < 0.5
            else f"{rng.randint(0, 25):02d}:{rng.randint(0, 60):02d}"
        )
        if rng.random() < 0.7:
            text += rng.choice(("Z", "z", "", " ", " UTC", " GMT", " EST")) + (
                _offset(rng) if rng.random() < 0.4 else ""
            )
    return text


def _legacy(rng: random.Random) -> str:
    """Free-form parts in random order, as people and programs write dates."""
    parts: list[str] = []
    for _ in range(rng.randint(1, 7)):
        kind = rng.random()
        if kind < 0.3:
            parts.append(_num(rng))
        elif kind < 0.45:
            month = rng.choice(MONTHS)
            parts.append(rng.choice((month, month[:3], month.upper(), month[: rng.randint(1, 6)])))
        elif kind < 0.55:
            day = rng.choice(DAYS)
            parts.append(rng.choice((day, day[:3], day[:3] + ",")))
        elif kind < 0.7:
            parts.append(_time(rng))
        elif kind < 0.8:
            parts.append(rng.choice(ZONE_WORDS))
        elif kind < 0.88:
            parts.append(_offset(rng))
        else:
            parts.append(rng.choice(GARBAGE))
    out = parts[0]
    for part in parts[1:]:
        out += rng.choice(SEPARATORS + SPACES) + part
    return out


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        where = rng.randint(0, len(chars))
        choice = rng.random()
        if choice < 0.4 and chars:
            del chars[min(where, len(chars) - 1)]
        elif choice < 0.8:
            chars.insert(where, rng.choice("0123456789-:/.,+ TZ()az\0"))
        elif chars:
            chars[min(where, len(chars) - 1)] = rng.choice("0123456789-:T ")
    return "".join(chars)


def corpus(seed: int, count: int) -> list[str]:
    """``count`` date-like strings, the same for the same seed."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        kind = rng.random()
        text = _iso(rng) if kind < 0.45 else _legacy(rng)
        if rng.random() < 0.25:
            text = _mutate(rng, text)
        if rng.random() < 0.1:
            text = rng.choice(SPACES) + text + rng.choice(SPACES)
        out.append(text)
    return out
