"""The daemon as a process: what ``memstaged`` without ``--once`` runs around :class:`Daemon`.

:mod:`memstaged.daemon.loop` is the work loop, driven by hand in tests with a fake clock; here is
what only a real process has: the signal handlers and the progress hook that together are the
stop protocol (see :class:`memstaged.errors.Abandoned`), the control socket and the metrics
file served between two files, the decision log re-opened on a reload, and a crash logged
before systemd restarts the service.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from memstaged.config import Settings
from memstaged.core import ticks
from memstaged.daemon import control_socket, metrics
from memstaged.daemon.loop import Daemon
from memstaged.daemon.memory_dirs import daemons_holding_all
from memstaged.daemon.watcher import Kind, Signal
from memstaged.errors import BusyError, ConfigError, MemstagedError
from memstaged.files.locks import service_unit
from memstaged.files.version import quiet_lease_breaks


def run_daemon(settings: Settings, *, wait: bool = False, reload: Callable[[], Settings]) -> int:
    """The daemon of ``memstaged`` (no ``--once``): signal handlers, then :meth:`Daemon.run`.

    Unless it is to ``wait``, a daemon whose every memory dir another memstaged daemon holds
    is not started (:func:`refuse_if_running`)."""
    from memstaged.log.writer import get_logger

    if not wait:
        refuse_if_running(settings)

    tally = metrics.Tally(get_logger())
    logger: Any = tally

    def reload_all() -> Settings:
        new = reload()
        _reconfigure_logging(settings_now(), new)
        return new

    daemon = Daemon(settings, logger, reload_settings=reload_all, wait=wait)

    def settings_now() -> Settings:
        return daemon.settings

    attach(daemon, tally)
    install_signal_handlers(daemon)
    try:
        return daemon.run()
    except MemstagedError:
        raise
    except Exception as err:
        logger.critical(
            "crash",
            pid=os.getpid(),
            error=repr(err),
            action="exiting; systemd restarts the service",
        )
        raise
    finally:
        ticks.set_hook(None)
        if not daemon.stopping:  # a crash: stop the watcher threads too
            daemon.watcher.stop()


def refuse_if_running(settings: Settings) -> None:
    """Raise :class:`BusyError` (exit 1, one line, as ``postfix start`` says it) when every
    configured memory dir is held by another memstaged daemon: a second one would only idle,
    retrying them, its events mixed into the first one's log. It has logged nothing yet, made
    no control socket and writes no metrics file. The line names each daemon's pid and its
    systemd service, if it runs as one: ``memstaged is already running (pid 4242,
    memstaged.service)``."""
    holders = daemons_holding_all(settings)
    if not holders:
        return
    named = []
    for holder in holders:
        unit = service_unit(holder.pid)
        named.append(f"pid {holder.pid}" + (f", {unit}" if unit else ""))
    raise BusyError(f"memstaged is already running ({'; '.join(named)})")


def attach(daemon: Daemon, tally: metrics.Tally) -> None:
    """The control socket (when ``$XDG_RUNTIME_DIR`` is set) and the metrics file; a socket that
    cannot be made is logged and the daemon works on without."""
    started = time.time()
    path = control_socket.socket_path(os.getpid())
    if path is not None:
        try:
            wake = functools.partial(daemon.queue.put, Signal(Kind.WAKE))
            daemon.hooks.append(
                control_socket.Control(daemon, path, started, wake=wake, touch=tally.touch)
            )
        except OSError as err:
            daemon.log.error(
                "control_failed",
                path=str(path),
                error=err.strerror or str(err),
                action="memstaged status cannot ask this daemon",
            )
    daemon.hooks.append(metrics.Metrics(daemon, tally, daemon.clock, started))


def install_signal_handlers(daemon: Daemon) -> None:
    """The stop protocol's two halves: SIGTERM/SIGINT set a flag (SIGHUP, a reload's), and
    the engine's progress ticks act on it (:meth:`Daemon.checkpoint`), so a stop is acted on
    within :data:`STOP_GRACE` plus one tick whatever file is in hand, and never raised from a
    signal handler. The ticks feed the watchdog too: one hostile file may take seconds to
    decide, and the pings must not wait for it."""
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    signal.signal(signal.SIGHUP, daemon.request_reload)
    quiet_lease_breaks()
    ticks.set_hook(daemon.checkpoint)


def _reconfigure_logging(old: Settings, new: Settings) -> None:
    """A reload that changes the log file settings re-opens the log; a bad path refuses it."""
    if (old.log_file, old.log_max_bytes, old.log_backups) == (
        new.log_file,
        new.log_max_bytes,
        new.log_backups,
    ):
        return
    from memstaged.log.writer import configure

    try:
        configure(new.log_file, max_bytes=new.log_max_bytes, backups=new.log_backups)
    except OSError as err:
        configure(old.log_file, max_bytes=old.log_max_bytes, backups=old.log_backups)
        raise ConfigError(f"log file {new.log_file}: {err.strerror}") from None
