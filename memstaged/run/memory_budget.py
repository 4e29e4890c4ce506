"""What deciding a file costs in memory, told from its bytes before it is decided (SPEC 4 and 6).

Deciding a file builds a Python object per JSON container and string, and a file's records
and explanations grow with its candidates; a hostile file within the size limit costs far more
than its size (an array of 8 MiB of ``[`` that never closes: 136 times its size, since the
reader builds a list per bracket before it finds the end missing). :func:`estimate` bounds
that cost from what a C-speed count of the file's brackets and quotes says, and :class:`Ledger`
keeps the sum of the estimates of the files being decided at once (by the decider processes
and by memstaged itself) within :func:`budget`: a pool of workers never multiplies what a run
needs, and a file estimated above the budget is decided with nothing else in flight.

The weights are measured (docs/reliability.md, "Memory of a run"): the peak RSS of ``--once``
deciding one file of each hostile shape, less that of a run deciding a small file, never
exceeded the estimate, whichever part of the engine the shape works hardest.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BUDGET_FLOOR", "BUDGET_MULTIPLE", "Ledger", "budget", "estimate"]

#: The estimate's bytes per byte of the file: its text, decoded once or twice (the
#: validation, a repair's rewrite, records that embed it), and each scalar's object.
PER_BYTE: Final = 16
#: ... per ``[``: a list, and the iterative reader's stack entry (a deep array of a file's
#: records is encoded again, with a work item per level, in the process that writes them).
PER_ARRAY: Final = 192
#: ... per ``{``: a dict with its keys table, and the stack entry.
PER_OBJECT: Final = 320
#: ... per ``"``: half a string object (a string has two), its slot, and a record's share of
#: the validation problems about it.
PER_QUOTE: Final = 48
#: The files decided at once may together be estimated at this many times ``max_file_size``...
BUDGET_MULTIPLE: Final = 64
#: ... or at this much, whichever is more: a small size limit (a few KiB) would otherwise hold
#: a batch of ordinary files (tens of KiB estimated each) to a few files at a time.
BUDGET_FLOOR: Final = 256 << 20


def estimate(data: bytes) -> int:
    """An upper bound of the memory deciding ``data`` takes, in bytes (four scans in C)."""
    return (
        PER_BYTE * len(data)
        + PER_ARRAY * data.count(b"[")
        + PER_OBJECT * data.count(b"{")
        + PER_QUOTE * data.count(b'"')
    )


def budget(max_file_size: int) -> int:
    """What the files decided at once may be estimated at together: :data:`BUDGET_MULTIPLE`
    times the size limit (512 MiB for the default 8 MiB), and at least :data:`BUDGET_FLOOR`."""
    return max(BUDGET_MULTIPLE * max_file_size, BUDGET_FLOOR)


class Ledger:
    """The estimated cost of the files taken and not yet given back, against a limit.

    A file is admitted while the sum stays within the limit, and always when nothing is
    taken: a file estimated above the limit is decided alone, and a caller is never kept
    waiting on nothing.
    """

    __slots__ = ("limit", "used")

    def __init__(self, limit: int | None) -> None:
        #: None: no limit (a caller that bounds its memory otherwise).
        self.limit = limit
        self.used = 0

    def admits(self, cost: int) -> bool:
        return self.limit is None or self.used == 0 or self.used + cost <= self.limit

    def take(self, cost: int) -> None:
        self.used += cost

    def give(self, cost: int) -> None:
        self.used -= cost
