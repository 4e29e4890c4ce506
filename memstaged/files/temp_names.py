"""The names of memstaged's own temp files (SPEC 6: a name no writer would use).

SPEC 6 lets memstaged clean up after a crash only the temp files it made, and never a writer's,
whatever its name or age. So every temp name carries :data:`TEMP_PREFIX` (hidden, and no
writer's), a role, and the file it is for: :func:`temp_name` makes one, and crash recovery
(:mod:`memstaged.files.temp_recovery`) reads it back with :func:`parse_temp_name` and
:func:`resolve_target`. Every name memstaged makes up fits Linux's ``NAME_MAX``, counted in
bytes (:func:`clip_name`). Writing the files themselves is :mod:`memstaged.files.fsio`'s.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Iterator
from typing import Final

from memstaged.core import digests

TEMP_PREFIX: Final = ".memstaged~"
#: Linux's NAME_MAX, in bytes: every name memstaged makes up must fit.
NAME_MAX: Final = 255
_RANDOM_HEX: Final = 12
#: A temp name's target that was too long to spell out: ``#`` and a hash of the name.
_HASHED_TARGET: Final = re.compile(r"#[0-9a-f]{32}")
#: The role of a temp file still being written where ``O_TMPFILE`` is missing: never complete.
PARTIAL: Final = "part"


def _name_hash(name: str) -> str:
    return "#" + digests.sha256(os.fsencode(name)).hexdigest()[:32]


def temp_name(role: str, for_name: str = "") -> str:
    """A name no writer uses: hidden, memstaged's prefix, the role, the target name, random.

    The target is spelled out so that recovery after a crash knows which file a temp belongs
    to. A target too long for ``NAME_MAX`` (counted in bytes: a 100-character name can be 400
    bytes) is replaced by ``#`` and a hash of it, which :func:`resolve_target` maps back.
    """
    budget = NAME_MAX - len(TEMP_PREFIX) - len(role) - 2 - _RANDOM_HEX
    target = for_name if len(os.fsencode(for_name)) <= budget else _name_hash(for_name)
    return f"{TEMP_PREFIX}{role}~{target}~{_unique()}"


class _Tokens:
    """The temp names' unique part: this process's id and a counter that starts at a random
    value (drawn once), ``_RANDOM_HEX`` hex digits. Unique among live processes by the pid, and
    unlike a leftover of an earlier process with the same pid by the random start; a clash is
    refused anyway (``O_EXCL``, ``linkat``, ``RENAME_NOREPLACE``). Was 16 random bytes per name:
    a ``getrandom`` call for each temp file (calls per decision)."""

    def __init__(self) -> None:
        self.pid = -1
        self.counter: Iterator[int] = iter(())

    def reset(self) -> None:
        self.pid = -1

    def next(self) -> str:
        if self.pid < 0:  # the first name, or a forked child: its own pid and start
            self.pid = os.getpid()
            self.counter = itertools.count(int.from_bytes(os.urandom(4), "big"))
        half = _RANDOM_HEX // 2
        return f"{self.pid % 16**half:0{half}x}{next(self.counter) % 16**half:0{half}x}"


_TOKENS: Final = _Tokens()
os.register_at_fork(after_in_child=_TOKENS.reset)


def _unique() -> str:
    return _TOKENS.next()


def parse_temp_name(name: str) -> tuple[str, str] | None:
    """The role and target (a name, or ``#<hash>``) encoded by :func:`temp_name`, or ``None``."""
    if not name.startswith(TEMP_PREFIX):
        return None
    parts = name[len(TEMP_PREFIX) :].split("~")
    if len(parts) < 3:
        return None
    return parts[0], "~".join(parts[1:-1])


def resolve_target(target: str, names: Iterable[str]) -> str | None:
    """The file a parsed temp name's target means: itself, or the one of ``names`` it hashes."""
    if not _HASHED_TARGET.fullmatch(target):
        return target
    return next((n for n in names if _name_hash(n) == target), None)


def clip_name(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` bytes once encoded, at a character boundary."""
    if len(os.fsencode(text)) <= max_bytes:
        return text
    out: list[str] = []
    size = 0
    for char in text:
        size += len(os.fsencode(char))
        if size > max_bytes:
            break
        out.append(char)
    return "".join(out)
