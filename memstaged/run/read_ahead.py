"""A file read ahead of its decision, across transactions (SPEC 5 and 6).

``--once`` reads the next transaction's files, and settles the context each is decided in,
before this transaction's commit, so that the decider processes decide them while it runs
(:meth:`memstaged.run.decider_pool.Deciders.ahead` walks them, in the order they were read).
This module says what such a file is (:class:`Read`), when one may be read (only while the
reconciler's lock is known to be free: :class:`LockSeen`), what a decider process gets of it
(:func:`job`), and how one never decided lets go of its version (:func:`release`).

What is logged about a file read ahead is left to where it is decided, in the files' order: an
error reading it is kept and raised there, as if it had been raised reading it there. The lock is
read again at the start of each transaction and obeyed there: a file read ahead while it was
free is deferred, unchanged, if it is held by then. A file read ahead holds its descriptor until
it is decided or released (and one to be changed, its read lease until its change is carried
out), so a writer waits for it at most one commit longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from memstaged.core.decide import Context
from memstaged.files.locks import LockInfo
from memstaged.files.memdir import is_staging_name
from memstaged.files.version import Skip, Version, read_version

__all__ = ["LockSeen", "Read", "job", "read_ahead", "release"]


class Read:
    """A file read ahead of its decision: what deciding it would have read, and the context
    its bytes are decided in, for a decider process."""

    __slots__ = ("changed_at", "ctx", "name", "read", "started")

    def __init__(self, name: str, started: float) -> None:
        self.name = name
        self.started = started
        #: None: not read (not a staging name, or the lock is held); an exception: raised
        #: where the file is decided, as if it had been raised reading it there.
        self.read: Version | Skip | Exception | None = None
        self.ctx: Context | None = None
        self.changed_at = 0.0


class LockSeen:
    """The reconciler's lock as the current transaction read it: files are read ahead for the
    next transaction only while it is known to be free."""

    __slots__ = ("blocked", "known")

    def __init__(self) -> None:
        self.blocked: LockInfo | None = None
        self.known = False


def read_ahead(
    name: str,
    staging_fd: int,
    lock: LockSeen,
    max_size: int,
    context: Callable[[Version], tuple[Context, float]],
) -> Read:
    """Read a file (and settle its ``context``: what it is decided in, and when it was last seen
    to change) before the files ahead of it are decided. Nothing is read while the reconciler's
    lock is held or could not be read."""
    read = Read(name, time.perf_counter())
    if not lock.known or lock.blocked is not None or not is_staging_name(name):
        return read
    try:
        read.read = read_version(staging_fd, name, max_size)
        if isinstance(read.read, Version) and read.read.data is not None:
            read.ctx, read.changed_at = context(read.read)
    except Exception as err:  # noqa: BLE001 - raised again where the file is decided, in order
        if isinstance(read.read, Version):
            read.read.close()
        read.read = err
    return read


def release(read: Read) -> None:
    """Close a version read ahead and never decided (its transaction found the lock held)."""
    if isinstance(read.read, Version):
        read.read.close()
        read.read = None


def job(read: Read) -> tuple[bytes, Context] | None:
    """What a decider process decides of a file read ahead: its bytes in its context."""
    if isinstance(read.read, Version) and read.read.data is not None and read.ctx is not None:
        return read.read.data, read.ctx
    return None
