"""The decision log (SPEC section 7): one structured event per decision, fanned out to its sinks.

* a JSON-lines file that memstaged rotates itself (:class:`FileSink`), which the inspection commands
  read without journald: it gets every event, and a change whose announcement it could not take
  whole and durably is not carried out (:func:`durable`, SPEC 7);
* journald, every field as a ``MEMSTAGED_*`` journal field plus ``MESSAGE``, ``PRIORITY`` and a
  ``MESSAGE_ID`` per kind of event, when running under systemd;
* the terminal: a readable line per event on a TTY, rendered by structlog's ``ConsoleRenderer``;
  nothing when stderr is not a terminal (the file has every event: writing the same JSON to
  stderr too was a second write per decision), unless asked for (``--verbose``).

Events are flat dicts of JSON values, so each key maps one to one onto a journal field.

The API is structlog's bound logger (``log.info("decision", **event)``) and the event dict is the
one structlog's chain made (the fields, then ``event``, ``level`` and the ``timestamp`` of
``TimeStamper(fmt="iso", utc=True)``), but the hot path does not go through structlog: ``import
structlog`` imports ``structlog.dev`` and ``structlog.stdlib`` (rich's tracebacks, pygments,
asyncio, ssl) whatever is configured, ~75 ms of start-up and ~16 MB of the daemon's memory for
a chain of three steps. :class:`Logger` runs those steps itself; structlog is
imported only where it renders, for a terminal.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Protocol, TextIO

from memstaged import safe_text
from memstaged.log.format import journal_fields, message, render
from memstaged.log.rotated_file import FileSink, Trouble

__all__ = [
    "JOURNAL_SOCKET",
    "ConsoleSink",
    "JournalSink",
    "Logged",
    "Logger",
    "Sink",
    "add_sink",
    "close",
    "configure",
    "durable",
    "file_failing",
    "get_logger",
    "journal_available",
    "one_write",
]

JOURNAL_SOCKET: Final = "/run/systemd/journal/socket"


class Sink(Protocol):
    """Where an event goes. Called with the fan-out's lock held, so one event at a time."""

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        """``line`` is the event's JSON line (newline included); never raises."""

    def close(self) -> None: ...


class ConsoleSink:
    """stderr: a readable line per event, or the JSON line (what a pipe or a file wants).

    ``readable=None`` decides by the stream: readable on a TTY, JSON otherwise. Readable lines
    are structlog's ``ConsoleRenderer`` (coloured on a terminal unless ``NO_COLOR`` is set or
    ``TERM=dumb``) of the time, the level and :func:`message`, whose names and reasons are
    escaped: a field's raw value never reaches the terminal. structlog is imported here, only
    for a terminal or ``--verbose``.
    """

    def __init__(self, stream: TextIO, *, readable: bool | None = None) -> None:
        self._stream = stream
        terminal = safe_text.is_terminal(stream)  # not when closed already: emit says so, once
        self._render: Callable[[MutableMapping[str, Any]], str] | None = None
        if readable or (readable is None and terminal):
            self._render = _readable_renderer(colors=terminal and _colors_wanted())
        self._trouble = Trouble("console log (stderr)")

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        text = line.decode() if self._render is None else self._render(event)
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError) as err:  # ValueError: the stream was closed
            self._trouble.failed(err, "events go on to the other sinks")
            return
        if self._trouble.failing:
            self._trouble.recovered()

    def close(self) -> None:
        """The stream is the process's stderr: not ours to close."""


def _colors_wanted() -> bool:
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _readable_renderer(*, colors: bool) -> Callable[[MutableMapping[str, Any]], str]:
    """One readable line for an event: structlog's console rendering of the escaped message."""
    from structlog.dev import ConsoleRenderer  # the terminal only: ~75 ms and ~16 MB to import

    renderer = ConsoleRenderer(colors=colors, pad_event_to=0)

    def render(event: MutableMapping[str, Any]) -> str:
        shown = {
            "timestamp": str(event.get("timestamp", ""))[11:23],
            "level": str(event.get("level", "info")),
            "event": message(event),
        }
        return str(renderer(None, shown["level"], shown)) + "\n"

    return render


class JournalSink:
    """Sends each event to journald with its fields.

    Values are sent as UTF-8 bytes; a path that is not valid UTF-8 (a lone surrogate from
    ``os.fsdecode``) keeps its original bytes instead of failing the send. If journald cannot be
    reached the event is written to stderr as a JSON line (the decision log file has it too):
    logging never raises into the work loop and never prints a traceback per event.
    """

    def __init__(self, send: Callable[..., object] | None = None) -> None:
        if send is None:
            from systemd import journal  # imported here: only needed under systemd

            send = journal.sendv
        self._sendv = send

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        try:
            lines = [
                name.encode() + b"=" + value.encode("utf-8", "surrogateescape")
                for name, value in journal_fields(event).items()
            ]
            self._sendv(*lines)
        except Exception:  # noqa: BLE001 - a lost journal must not stop the daemon
            try:
                sys.stderr.write(line.decode())
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # stderr is gone too: the decision log file still has the event

    def close(self) -> None:
        """Nothing held: each event is one datagram."""


#: Lines held by :func:`one_write` past this many bytes are written at once: an event can be as
#: large as the file it is about (another project's root, a session id), and a transaction's
#: 1,024 of them must not be held whole.
HELD_MOST: Final = 1 << 20


class _Fanout:
    """Where every event of the process goes: the sinks, replaced as a whole by :func:`configure`.

    One object for the whole process, so that a logger kept before a later :func:`configure`
    (the daemon's, re-configured on reload) reaches the new sinks. One lock around the writes:
    the worker thread applying a batch and the main thread may log at the same moment, and a
    line must never interleave with another; the JSON is rendered once, outside it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sinks: tuple[Sink, ...] = ()
        #: Per thread: the decision log file's lines held for one write (:func:`one_write`).
        self._held = threading.local()

    def replace(self, sinks: tuple[Sink, ...]) -> None:
        with self._lock:
            old, self._sinks = self._sinks, sinks
            for sink in old:
                if sink not in sinks:
                    sink.close()

    @property
    def sinks(self) -> tuple[Sink, ...]:
        return self._sinks

    def emit(self, event: MutableMapping[str, Any]) -> None:
        if not self._sinks:
            return
        line = render(event)
        held: list[bytes] | None = getattr(self._held, "lines", None)
        with self._lock:
            for sink in self._sinks:
                if held is not None and isinstance(sink, FileSink):
                    continue
                sink.emit(event, line)
        if held is not None:
            held.append(line)
            self._held.size += len(line)
            # Only decisions wait: any other event (a stale lock removed, a version kept as a
            # conflict) reports what was just done, and goes out at once with those before it.
            # And a bounded memory, whatever the events hold.
            if event.get("event") != "decision" or self._held.size >= HELD_MOST:
                self.write_held(stop=False)

    def hold(self) -> bool:
        """Hold this thread's file lines from now on; False when they are held already."""
        if getattr(self._held, "lines", None) is not None:
            return False
        self._held.lines, self._held.size = [], 0
        return True

    def write_held(self, *, stop: bool) -> None:
        """Write this thread's held lines into the decision log file(s) now, in one write each
        (the sinks of the moment: a reload in between loses none); ``stop``: hold no more."""
        held: list[bytes] | None = getattr(self._held, "lines", None)
        if held is None:
            return
        self._held.lines, self._held.size = (None if stop else []), 0
        if not held:
            return
        with self._lock:
            for sink in self._sinks:
                if isinstance(sink, FileSink):
                    sink.write_lines(held)


_FANOUT: Final = _Fanout()


class _UtcStamper:
    """The ``timestamp`` structlog's ``TimeStamper(fmt="iso", utc=True)`` writes, byte for byte.

    That is ``datetime.now(timezone.utc).isoformat()`` with ``Z`` for ``+00:00``: microseconds
    always six digits, and left out (``…T17:00:00Z``) when they are exactly 0. Building a
    ``datetime`` per event was the largest single cost left; here the text up to the seconds is
    made once a second by the same ``isoformat`` and the microseconds are appended.
    ``datetime.now`` floors the system clock to microseconds, as ``// 1000`` does here.
    """

    __slots__ = ("_clock", "_second")

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._second: tuple[int, str] = (-1, "")

    def __call__(
        self, _logger: Any, _name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        seconds, micros = divmod(self._clock() // 1000, 1_000_000)
        second = self._second  # one tuple: two threads never see a prefix of another second
        if second[0] != seconds:
            text = datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()[:-6]
            second = self._second = (seconds, text)
        event["timestamp"] = f"{second[1]}.{micros:06d}Z" if micros else f"{second[1]}Z"
        return event


def journal_available() -> bool:
    """Under systemd (``JOURNAL_STREAM``/``INVOCATION_ID``) and journald's socket is there."""
    under_systemd = "JOURNAL_STREAM" in os.environ or "INVOCATION_ID" in os.environ
    return under_systemd and Path(JOURNAL_SOCKET).exists()


def configure(
    log_file: Path | None,
    *,
    max_bytes: int = 10 * 1024 * 1024,
    backups: int = 5,
    console: str = "auto",
    journal: str = "auto",
    quiet_file: bool = False,
) -> None:
    """Set up the sinks. ``journal`` is ``auto``, ``on`` or ``off``; ``console`` is one of:

    * ``auto``: readable lines on stderr when it is a terminal and journald is not in use;
      nothing otherwise (the log file has every event);
    * ``on``: stderr always, readable on a terminal and JSON lines elsewhere;
    * ``lines``: stderr always, readable lines (``--once --verbose``);
    * ``off``: never.

    ``quiet_file``: the file sink's failures are not said on stderr (see :class:`FileSink`).

    Raises ``OSError`` when the log file cannot be opened; the sinks in use stay as they were.
    """
    sinks: list[Sink] = []
    use_journal = journal == "on" or (journal == "auto" and journal_available())
    if use_journal:
        try:
            sinks.append(JournalSink())
        except ImportError:
            use_journal = False
    if log_file is not None:
        sinks.append(FileSink(log_file, max_bytes, backups, quiet=quiet_file))
    if console == "on" or (
        console == "auto" and not use_journal and safe_text.is_terminal(sys.stderr)
    ):
        sinks.append(ConsoleSink(sys.stderr))
    elif console == "lines":
        sinks.append(ConsoleSink(sys.stderr, readable=True))
    _FANOUT.replace(tuple(sinks))


def add_sink(sink: Sink) -> None:
    """One more sink next to the configured ones (a test's fake journal)."""
    _FANOUT.replace((*_FANOUT.sinks, sink))


def _file_sinks() -> list[FileSink]:
    return [sink for sink in _FANOUT.sinks if isinstance(sink, FileSink)]


class Logged:
    """What became of a :func:`one_write` block's events: ``whole`` is false when one of them
    could not be written whole into a decision log file (the outermost block's says it)."""

    __slots__ = ("whole",)

    def __init__(self) -> None:
        self.whole = True


@contextmanager
def one_write() -> Iterator[Logged]:
    """The decision events this thread logs in the block go into the decision log file in one
    write when it ends: one lock, one look at the path, one ``write``, whatever their number (a
    transaction's). The other sinks get each event at once, and so does the file any other
    event, with the decisions held before it; a block inside another writes with the outer one.
    What is held is bounded: past :data:`HELD_MOST` bytes the lines held are written at once.

    An event held is not yet in the file: whoever must have it there before a change uses
    :func:`durable`, which writes what is held so far. A decision whose line was not written
    is none yet (SPEC 7): the caller reads :attr:`Logged.whole` after the block.
    """
    marks = {id(sink): sink.failures for sink in _file_sinks()}
    logged = Logged()
    outer = _FANOUT.hold()
    try:
        yield logged
    finally:
        if outer:
            _FANOUT.write_held(stop=True)
        logged.whole = all(sink.failures == marks.get(id(sink), 0) for sink in _file_sinks())


@contextmanager
def durable() -> Iterator[None]:
    """The events logged in the block, and any held before it by an enclosing
    :func:`one_write`, are written whole and fsynced when it ends, or
    :class:`~memstaged.errors.LogUnwritable` is raised (SPEC 5 and 7: nothing is carried out
    unlogged, even across a power cut). Whoever announces a change logs it in this block and
    carries it out only after it."""
    marks = {id(sink): sink.failures for sink in _file_sinks()}
    with one_write():
        try:
            yield
        finally:
            _FANOUT.write_held(stop=False)  # an outer block holds again from here on
    for sink in _file_sinks():
        sink.sync(marks.get(id(sink), 0))


def file_failing() -> bool:
    """Whether the decision log file could not be written at the last try."""
    return any(isinstance(sink, FileSink) and sink.failing for sink in _FANOUT.sinks)


def close() -> None:
    """Close the log file and drop every sink; events are discarded until :func:`configure`."""
    _FANOUT.replace(())


_STAMP: Final = _UtcStamper()


class Logger:
    """structlog's bound logger as memstaged uses it: ``info("decision", path=..., ...)``.

    Each call builds the event dict structlog's chain built (``add_log_level``, then the UTC
    ``timestamp``) and hands it to the sinks: the JSON line is rendered once and written once
    to the decision log file, and to any other sink configured. Stateless: every logger is the
    same, and all follow :func:`configure`.
    """

    __slots__ = ()

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        fields["event"] = event
        fields["level"] = level
        _FANOUT.emit(_STAMP(None, level, fields))

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._emit("critical", event, fields)


_LOGGER: Final = Logger()


def get_logger() -> Logger:
    """The process's logger (one for all: the sinks are the process's)."""
    return _LOGGER
