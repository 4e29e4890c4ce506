"""Progress from inside one decision, for a watchdog that must hear from the daemon meanwhile.

The engine is pure and knows nothing of systemd; but one hostile file can keep it busy for
seconds, and the daemon pings the watchdog only between files. So the engine's
long loops call :func:`tick` every so much work, and the daemon hooks its heartbeat here
(:meth:`memstaged.daemon.sd_notify.Heartbeat.beat` sends a ping only when one is due). Outside the
daemon no hook is set and a tick costs one global look-up.

A tick is also the one place where a stop abandons a file's work: once SIGTERM's grace is over,
the daemon's hook raises :class:`Abandoned`.
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[], None] | None = None


def set_hook(hook: Callable[[], None] | None) -> None:
    """Call ``hook`` on every :func:`tick` from now on (``None``: no more)."""
    global _hook  # noqa: PLW0603 - one process-wide hook, set by the daemon that owns the process
    _hook = hook


def tick() -> None:
    """Some work was done; the daemon's heartbeat decides whether anything is due."""
    if _hook is not None:
        _hook()


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
