"""Which errors of a quarantine a repair would have fixed, and so which one a reader sees first.

A quarantined file's ``reasons`` (and a dead-letter record's ``errors``) lead with the errors that
remain after every repair, and mark the others ``repairable`` (SPEC 7): the error
that made a file irreparable is what a person must read first, not the ``candidates.decisions: is
missing`` that R5 would have added. Logs and records written before the mark existed list the
errors in the order they were found; for those, the one error known to be always repaired, a
category array that is absent (R5), is taken as repairable. Pure functions: the log, ``stats``
and ``deadletter`` all read reasons through them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

#: R5 adds every absent category array: this error is always one a repair fixes.
_ABSENT_CATEGORY: Final = re.compile(
    r"candidates\.(lessons|preferences|decisions|domain): is missing"
)


def repairable_of(reasons: Sequence[str], marked: object) -> set[str]:
    """The reasons a repair would have fixed: the ``marked`` list, or for an old log or record
    (no mark) those that R5 always repairs."""
    if isinstance(marked, list):
        return {str(r) for r in marked}
    return {r for r in reasons if _ABSENT_CATEGORY.fullmatch(r)}


def split(reasons: Sequence[str], marked: object) -> tuple[list[str], list[str]]:
    """``reasons`` as (those no repair fixes, those a repair would have fixed), in their order."""
    fixed = repairable_of(reasons, marked)
    return [r for r in reasons if r not in fixed], [r for r in reasons if r in fixed]


def of_event(event: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """A decision's reasons split as :func:`split` does. Only a quarantine's are split: the
    reasons of a repair are what it fixed, those of a wait or a skip why it waits or skips."""
    reasons = [str(r) for r in event.get("reasons") or []]
    if event.get("decision") != "quarantined":
        return reasons, []
    return split(reasons, event.get("repairable"))
