"""Service notifications: sd_notify messages, and when each is due.

Notifications go through ``systemd.daemon.notify`` (systemd-python); outside systemd (no
``NOTIFY_SOCKET``) they are no-ops, so the daemon runs the same in a terminal.

:class:`Notifier` sends one message; :class:`Heartbeat` decides when: ``WATCHDOG=1`` every quarter
of ``WATCHDOG_USEC``, ``EXTEND_TIMEOUT_USEC=`` while the start-up backlog is decided, and
``STATUS=`` at most once a second and only when its text changed. The daemon calls
:meth:`Heartbeat.beat` between two files, and the engine's long loops call it through
:func:`memstaged.core.ticks.tick` while one file is decided, so the pings come from the thread that
decides files, from where its work happens: a worker stuck (a hung read, a loop that makes no
progress) stops pinging, and systemd restarts the service, but a hostile file that takes seconds
to decide does not leave a gap longer than a third of ``WatchdogSec=``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final

#: How often STATUS= is refreshed while there is work.
STATUS_EVERY: Final = 1.0
#: While the start-up backlog is decided (before READY=1), systemd is asked for this much more
#: start-up time, again every third of it: a large backlog must not hit TimeoutStartSec=.
START_EXTENSION: Final = 60.0


class Notifier:
    """sd_notify, and the watchdog interval: a quarter of ``WATCHDOG_USEC``.

    A ping is sent at the first beat after the interval, so the gap between two pings is the
    interval plus the longest stretch of work without a beat: a quarter leaves room under the
    third of ``WatchdogSec=`` that no gap may exceed.
    """

    def __init__(
        self,
        environ: dict[str, str] | None = None,
        send: Callable[[str], object] | None = None,
    ) -> None:
        env = dict(os.environ) if environ is None else environ
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._notify = send
        if self._notify is None and self.enabled:
            from systemd import daemon

            self._notify = daemon.notify
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        wanted = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        #: Seconds between WATCHDOG=1 pings, or None when systemd does not watch us.
        self.watchdog_interval: float | None = int(usec) / 4e6 if wanted else None

    def send(self, *lines: str) -> None:
        if self._notify is not None:
            self._notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd >= 253 match the reload to this notification.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading configuration")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def ping(self) -> None:
        self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for more start-up time (a large backlog is decided before ``READY=1``)."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")


class Heartbeat:
    """The notifications that are due by time, and the next time one will be."""

    def __init__(
        self, notifier: Notifier, clock: Callable[[], float], status: Callable[[], str]
    ) -> None:
        self.notifier = notifier
        self.clock = clock
        self.status = status
        now = clock()
        self.next_ping = now
        self.next_status = now
        self.next_extend = now
        self.status_sent = ""

    def beat(self, *, ready: bool) -> None:
        """Ping the watchdog and refresh STATUS= when due; cheap enough to call per file."""
        now = self.clock()
        interval = self.notifier.watchdog_interval
        if interval is not None and now >= self.next_ping:
            self.notifier.ping()
            self.next_ping = now + interval
        if not ready and self.notifier.enabled and now >= self.next_extend:
            self.notifier.extend_timeout(START_EXTENSION)
            self.next_extend = now + START_EXTENSION / 3
        if now >= self.next_status:
            text = self.status()
            if text != self.status_sent:
                self.notifier.status(text)
                self.status_sent = text
            self.next_status = now + STATUS_EVERY

    def deadlines(self) -> list[float]:
        """When :meth:`beat` has something to send next (a STATUS= only if its text changed)."""
        due = []
        if self.status() != self.status_sent:
            due.append(self.next_status)
        if self.notifier.watchdog_interval is not None:
            due.append(self.next_ping)
        return due
