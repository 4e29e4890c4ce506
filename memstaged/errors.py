"""Every exception memstaged defines, in one place.

A :class:`MemstagedError` carries a message that is shown to the user as one line, so it must
name the file, the option or the key at fault. Exceptions from libraries are re-raised at module
boundaries as one of these (``raise ConfigError(...) from None``) so that no traceback reaches a
user. The rest end a transaction (the lock held, an I/O error), a wait or a stop, and are
caught by memstaged itself.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the file layer's types, named for the checker alone: no import at run time
    from memstaged.files.locks import LockInfo
    from memstaged.files.plan import Result, StaleLock


def os_reason(err: OSError) -> str:
    """An error as a reason or a log line gives it: what went wrong, then the file it names."""
    return f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")


class MemstagedError(Exception):
    """Base of every error memstaged reports to a user; ``str(err)`` is the one-line message."""


class ConfigError(MemstagedError):
    """A bad setting: unknown key, wrong type, a memory dir that cannot be used. Exit code 2."""


class UsageError(MemstagedError):
    """A bad command line that argparse could not catch by itself. Exit code 2."""


class BusyError(MemstagedError):
    """Another memstaged already works on a memory dir (SPEC section 5). Exit code 1.

    ``daemon``: the pid of the memstaged daemon that holds it, which no wait would see go.
    """

    def __init__(self, message: str, *, daemon: int | None = None) -> None:
        super().__init__(message)
        self.daemon = daemon


class NotPrivate(PermissionError):
    """A directory memstaged keeps its own state or its control socket in is not the user's own
    and private (a link, another owner, open to group or others): what is in it may be another
    user's, and is not trusted (as ssh refuses such a directory).

    An :class:`OSError` (``EPERM``), so that what opens a file there treats it as one it cannot
    use; a command refuses it with one line (exit 2) through
    :func:`memstaged.config.own_state_dir`. ``strerror`` is that line.
    """


class Terminated(BaseException):
    """SIGTERM to ``--once``: the run stops as on Ctrl-C, exit 143.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` turns it into a
    decision: a transaction it lands in leaves its temps as a kill would (the next run deletes
    them) and releases ``canonical-writer.lock`` on its way out, which a kill by the signal's
    default action would leave for the next memstaged to find stale, the reconciler waiting.
    """


class NotJSON(MemstagedError):
    """The bytes are not RFC 8259 JSON in UTF-8, as the reconciler's ``JSON.parse`` would see it."""


class LogUnwritable(MemstagedError):
    """The decision log file cannot be written or made durable (SPEC 5 and 7). Exit code 1.

    Raised where a decision is announced, before anything of it is carried out: the change
    waits (the file is ``deferred``, recover and purge stop) until the log can be written again.
    """

    def __init__(self, path: object, err: OSError) -> None:
        if err.strerror:
            name = _errno.errorcode.get(err.errno or 0, str(err.errno))
            self.why = f"{err.strerror} ({name})"
        else:
            self.why = str(err) or type(err).__name__
        self.path = path
        self.errno = err.errno
        super().__init__(
            f"the decision log {path} cannot be written: {self.why}; nothing more was changed "
            "(nothing is carried out unlogged: try again once the log can be written)"
        )

    @property
    def reason(self) -> str:
        """The ``reasons`` entry of the decision that waits for the log."""
        return f"the decision log cannot be written: {self.why}"


# -- the file layer's transaction and locks ------------------------------------------------------


class LockHeld(Exception):
    """A live process holds ``canonical-writer.lock``."""

    def __init__(self, info: LockInfo) -> None:
        holder = f"live pid {info.pid}" if info.pid is not None else "a holder it does not name"
        super().__init__(f"canonical-writer.lock is held by {holder}")
        self.info = info


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


class TransactionStopped(OSError):
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


# -- the daemon: its stop, its wait, its control socket -----------------------------------------


class Abandoned(BaseException):
    """Raised by a progress tick (the daemon's hook,
    :meth:`memstaged.daemon.loop.Daemon.checkpoint`) once SIGTERM's grace is over.

    The stop protocol has no exception raised from a signal handler: the handler
    only sets :attr:`memstaged.daemon.loop.Daemon.stopping`. The work loop looks at it between two
    files, and the long loops of the engine and of the transaction look at it at each
    :func:`tick`, the only points where a file's work is abandoned. So a ``finally`` in the
    pipeline runs to its end, and a stop never lands between an ``open`` and the ``try`` that
    closes it.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` in the pipeline
    turns it into a decision: what is left is what a kill at that tick would leave, minus the
    lock: the file is decided again by the next start (SPEC 5's invariant holds across kills).
    """


class WaitStopped(Exception):
    """SIGTERM arrived while waiting for another memstaged (``--wait``)."""


class Unanswered(Exception):
    """The daemon did not answer (why is the message)."""
