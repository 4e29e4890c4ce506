"""How an operator's change to a memory dir is carried out beside a running daemon (SPEC 5).

``deadletter recover`` and ``purge`` (:mod:`memstaged.deadletter.recover`,
:mod:`memstaged.deadletter.purge`) change a memory dir the daemon may be working on. Their
changes are :class:`~memstaged.files.plan.Plan` values carried out by the daemon's own
transaction (:func:`memstaged.files.transaction.begin`, through :func:`transacting`), in short
transactions under ``canonical-writer.lock``: the lock the daemon obeys, the reconciler holds
while it works, and the agent's own ``/memory recover`` takes too. Never under the instance
lock, which the daemon holds for its whole life. The lock is waited for as ``--wait`` says
(:class:`Waiter`), each holder said once; what a transaction depends on (a record still the
very file that was read) is checked again under the lock (:func:`held_records`), what only the
caller can check by the caller, in the transaction, before it commits; and every change is
logged, durably, before it is carried out (:func:`announcer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Final

from memstaged.errors import Blocked, BusyError, NotObeyed, TransactionStopped
from memstaged.files import transaction
from memstaged.files.locks import LockInfo, log_stale_locks, memstaged_role, read_lock
from memstaged.files.memdir import DEADLETTER, MemoryDir
from memstaged.files.plan import Held, Plan, Settled
from memstaged.files.transaction import Announce, Transaction
from memstaged.patience import poll

if TYPE_CHECKING:
    from memstaged.deadletter.store import RecordFile

#: The clock and the pause of a wait for the lock: seams, so that a test moves time instead of
#: sleeping through it.
_monotonic: Callable[[], float] = time.monotonic
_sleep: Callable[[float], None] = time.sleep
#: Without ``--wait``, a ``canonical-writer.lock`` another memstaged holds is still waited for this
#: long: it holds it for one short transaction only (SPEC 5: about a second at most).
MEMSTAGED_GRACE: Final = 3.0
#: ``--wait`` without a number.
DEFAULT_WAIT: Final = 30.0
_LOCK_POLL: Final = 0.05


class Waiter:
    """How long a change to a memory dir waits for ``canonical-writer.lock``, and saying so.

    ``limit`` is ``--wait``'s: ``None`` waits for nobody but another memstaged, whose holds last
    about a second at most (SPEC 5), for :data:`MEMSTAGED_GRACE`; a number waits up to that many
    seconds for any live holder. What is waited for is said once per holder, through ``say``.
    """

    def __init__(
        self,
        limit: float | None,
        say: Callable[[str], None],
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.limit = limit
        self.say = say
        self.clock = clock or _monotonic
        self.sleep = sleep or _sleep
        self._said: set[tuple[str, int | None]] = set()

    def patience(self, info: LockInfo) -> float:
        """How long to wait for this holder."""
        grace = MEMSTAGED_GRACE if info.ours else 0.0
        return max(self.limit or 0.0, grace)

    def announce(self, mdir: MemoryDir, info: LockInfo, patience: float) -> None:
        key = (mdir.path, info.pid)
        if key not in self._said:
            self._said.add(key)
            self.say(
                f"waiting up to {patience:g} s for canonical-writer.lock of {mdir.path}, "
                f"held by {holder_text(info)}"
            )


def holder_text(info: LockInfo) -> str:
    """Who holds ``canonical-writer.lock``, in words: ``pid 12 (the memstaged daemon)``."""
    if info.pid is None:
        return "a process it does not name"
    if info.ours:
        return f"pid {info.pid} ({_ROLE_TEXT[memstaged_role(info.pid)]})"
    owner = f"owner {info.owner!r}" if info.owner else "no owner named: the reconciler?"
    return f"pid {info.pid} ({owner})"


#: How :func:`holder_text` names a memstaged process by its role (None: not known).
_ROLE_TEXT: Final = {
    None: "another memstaged",
    "once": "a memstaged --once run",
    "deadletter": "another memstaged deadletter command",
    "daemon": "the memstaged daemon",
}


@contextmanager
def transacting(
    mdir: MemoryDir,
    mem_fd: int,
    staging_fd: int,
    plans: Sequence[Plan],
    *,
    waiter: Waiter,
    logger: Any,
) -> Iterator[Transaction]:
    """Begin ``plans`` as one transaction of :func:`memstaged.files.transaction.begin` (SPEC 5),
    waiting for ``canonical-writer.lock`` as ``waiter`` says; the caller checks what only it can
    check under the lock, then commits, in the ``with``.

    The same transaction as the daemon's, under ``canonical-writer.lock``: the daemon obeys the
    lock (it defers every change in the memory dir while a live process holds it), so what is
    done inside cannot interleave with its own changes, nor with the reconciler's or the
    agent's ``/memory recover``. Callers keep each transaction short, never one for a whole
    run; what a plan depends on is checked again under the lock (by ``begin``, and by the
    caller before it commits). The stale locks seen are logged (``lock_seen``) however it ends.

    Raises :class:`BusyError` (exit 1; nothing of ``plans`` done) when a live process holds
    the lock for longer than ``waiter`` waits, or when a stale lock of another owner is in
    place: memstaged never deletes that one, and without the lock it could not keep out of the
    daemon's way. Raises :class:`~memstaged.errors.TransactionStopped` (an ``OSError``, with
    what was done) when the transaction could not be completed.
    """
    started = waiter.clock()
    with ExitStack() as stack:
        while True:
            try:
                tx = stack.enter_context(
                    transaction.begin(mem_fd, staging_fd, plans, now=time.time(), obey_stale=True)
                )
            except Blocked as held:
                log_stale_locks(logger, held.stale_locks, memory_dir=mdir.path)
                info = held.info
            except NotObeyed as stale:
                log_stale_locks(logger, stale.stale_locks, memory_dir=mdir.path)
                raise BusyError(
                    f"{mdir.path}: canonical-writer.lock names pid {stale.info.pid}, which is "
                    "gone, and is not memstaged's: memstaged never deletes it, and cannot "
                    "change the memory dir beside the daemon without it; remove it if no "
                    "reconciler is running"
                ) from None
            except TransactionStopped as err:
                log_stale_locks(logger, err.stale_locks, memory_dir=mdir.path)
                raise
            else:
                break
            _wait(mdir, mem_fd, info, waiter, started)
        try:
            yield tx
        finally:
            log_stale_locks(logger, tx.stale_locks, memory_dir=mdir.path)


def _wait(mdir: MemoryDir, mem_fd: int, info: LockInfo, waiter: Waiter, started: float) -> None:
    """Wait for the live holder ``info`` to let go, or raise :class:`BusyError` once
    ``waiter``'s patience for it is spent."""
    patience = waiter.patience(info)
    if waiter.clock() - started >= patience:
        waited = f" (waited {patience:g} s)" if patience > 0 else ""
        hint = "" if waiter.limit is not None else "; --wait[=SECONDS] waits for it"
        raise BusyError(
            f"{mdir.path}: busy: canonical-writer.lock is held by {holder_text(info)}"
            f"{waited}; nothing more was changed there{hint}"
        )
    waiter.announce(mdir, info, patience)
    waiter.sleep(_LOCK_POLL)

    def let_go() -> bool | None:
        """Only read the lock while its holder lives: taking it means writing and fsyncing a
        file."""
        try:
            now = read_lock(mem_fd)
        except OSError:
            return True
        return True if now is None or not now.alive or now.ino != info.ino else None

    left = patience - (waiter.clock() - started)
    poll(let_go, left, first=_LOCK_POLL, most=_LOCK_POLL, clock=waiter.clock, sleep=waiter.sleep)


def held_records(records: Iterable[RecordFile]) -> tuple[Held, ...]:
    """The records as :func:`memstaged.files.transaction.begin` checks them: name and identity as
    read."""
    return tuple(Held(DEADLETTER, r.name, r.identity) for r in records)


def announcer(logger: Any, events: Mapping[str, dict[str, Any]]) -> Announce:
    """Log the plans' events (by key) and make the log durable before any of them is carried
    out (SPEC 5 and 7: nothing is carried out unlogged, even across a power cut); a new staging
    file is named as the transaction settled it."""

    def announce(settled: Sequence[Settled]) -> None:
        from memstaged.log.writer import durable

        with durable():  # raises LogUnwritable: nothing of the plans is carried out
            for names in settled:
                event = dict(events[names.key])
                if names.created is not None:
                    event["staging_file"] = f"staging/{names.created}"
                logger.info(event.pop("event"), **event)

    return announce
