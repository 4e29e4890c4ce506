"""Due times: when each file the daemon knows of is to be decided next.

One due time per file, kept in a dict and mirrored in a heap: a new signal can only move a due
time earlier (events collapse), and a stale heap entry (its file rescheduled or forgotten) is
skipped when it reaches the top. Nothing here looks at the file system or at a clock: callers pass
``now``, so the rules are tested with plain numbers.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Final

from memstaged.run.decision import Outcome

Key = tuple[str, str]  # (memory dir, file name)

#: Longest wait before a deferred file is looked at again (I/O errors back off up to this).
MAX_BACKOFF: Final = 60.0
#: Longest wait before a file that changed while it was decided is decided again.
MAX_CHANGED_BACKOFF: Final = 1.0


class Schedule:
    """The files waiting to be decided, each with the (monotonic) time it falls due."""

    def __init__(self) -> None:
        self.due: dict[Key, float] = {}
        self._heap: list[tuple[float, Key]] = []

    def __len__(self) -> int:
        return len(self.due)

    def __contains__(self, key: Key) -> bool:
        return key in self.due

    def at(self, key: Key, due: float) -> None:
        """Decide ``key`` at ``due``, or earlier if it is already due earlier (events collapse)."""
        current = self.due.get(key)
        if current is not None and current <= due:
            return
        self.due[key] = due
        heapq.heappush(self._heap, (due, key))

    def next_due(self) -> float | None:
        """The earliest due time, or None when nothing waits."""
        while self._heap:
            due, key = self._heap[0]
            if self.due.get(key) == due:
                return due
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now: float) -> Key | None:
        """The file due first, if it is due by ``now`` (it is then no longer scheduled)."""
        due = self.next_due()
        if due is None or due > now:
            return None
        _, key = heapq.heappop(self._heap)
        del self.due[key]
        return key

    def forget(self, which: Callable[[Key], bool]) -> None:
        """Unschedule the files ``which`` selects (their heap entries become stale)."""
        for key in [k for k in self.due if which(k)]:
            del self.due[key]


def changed_delay(failures: int) -> float:
    """When to decide again a file that changed while it was being decided.

    Soon, but not at once: a file rewritten without pause would otherwise be decided over and
    over while every other file waits.
    """
    return min(0.02 * 2.0 ** min(failures, 6), MAX_CHANGED_BACKOFF)


def retry_delay(
    outcome: Outcome, failures: int, wall_now: Callable[[], float] = time.time
) -> float:
    """When to look again at a deferred file.

    A file still being written (the pipeline read it, and nothing failed) is looked at when its
    settle interval has passed, but never later than :data:`MAX_BACKOFF` from now (an mtime in
    the future would otherwise mean waiting for years). A file deferred by an error (it cannot
    be read, or its decision cannot be carried out: permission denied, a full disk) backs off
    exponentially up to :data:`MAX_BACKOFF`, so that one bad file or directory does not fill the
    log; a later time the pipeline asked for is kept (a file too large to move: an hour).
    ``retry_at`` is wall-clock time (it comes from a file's mtime).
    """
    backoff = min(0.25 * 2.0 ** min(failures, 16), MAX_BACKOFF)
    if outcome.retry_at is None:
        return max(backoff, 0.05)
    delay = outcome.retry_at - wall_now()
    if outcome.error or outcome.identity is None:
        return max(delay, backoff)
    return min(max(delay, 0.05), MAX_BACKOFF)
