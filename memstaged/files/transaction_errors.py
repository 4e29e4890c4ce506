"""How a transaction of :mod:`memstaged.files.transaction` ends short of its commit.

Each ending carries the stale ``canonical-writer.lock`` files seen while the lock was taken
(``stale_locks``, as :class:`~memstaged.files.plan.Applied` does when it commits), so that its
caller logs ``lock_seen`` for them however the transaction ended: a stale lock of memstaged's own is
removed before the lock is found held by a live process, or before an I/O error stops the
transaction, and its removal is logged all the same (SPEC 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstaged.files.locks import LockHeld, LockInfo, log_stale_lock
from memstaged.files.plan import Result, StaleLock, Status


class Blocked(LockHeld):
    """A live process holds ``canonical-writer.lock``: nothing of the plans was done."""

    def __init__(self, info: LockInfo, stale_locks: Sequence[StaleLock] = ()) -> None:
        super().__init__(info)
        self.stale_locks = tuple(stale_locks)


class NotObeyed(Exception):
    """A stale lock of another owner is in place, and the caller works only under the lock."""

    def __init__(self, info: LockInfo, stale_locks: Sequence[StaleLock]) -> None:
        super().__init__(info)
        self.info = info
        self.stale_locks = tuple(stale_locks)


class Stopped(OSError):
    """An I/O error stopped the transaction; :attr:`results` says what each plan did until then.

    A plan's result is then ``FAILED``, with what it created or removed before the error.
    """

    def __init__(
        self, err: OSError, results: dict[str, Result], stale_locks: Sequence[StaleLock] = ()
    ) -> None:
        named = () if err.filename is None else (err.filename,)
        super().__init__(err.errno, err.strerror or str(err), *named)
        self.results = results
        self.stale_locks = tuple(stale_locks)


def so_far(err: OSError, key: str) -> Result:
    """What the plan ``key`` did before ``err`` stopped its transaction (nothing, if unknown)."""
    if isinstance(err, Stopped) and key in err.results:
        return err.results[key]
    return Result(key=key, status=Status.FAILED, reason=str(err))


def log_stale_locks(logger: Any, seen: Sequence[StaleLock], **fields: Any) -> None:
    """``lock_seen`` for each stale lock a transaction saw, however it ended (SPEC 7)."""
    for lock in seen:
        log_stale_lock(logger, lock.info, lock.removed, **fields)
