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
