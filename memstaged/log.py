"""The decision log (SPEC section 7): one structured event per decision, fanned out to its sinks.

* a JSON-lines file that memstaged rotates itself (:class:`FileSink`), which the inspection commands
  read without journald: it always gets every event;
* journald, every field as a ``MEMSTAGED_*`` journal field plus ``MESSAGE``, ``PRIORITY`` and a
  ``MESSAGE_ID`` per kind of event, when running under systemd;
* the terminal: a readable line per event on a TTY, rendered by structlog's ``ConsoleRenderer``;
  nothing when stderr is not a terminal (the file has every event: writing the same JSON to
  stderr too was a second write per decision, issue 14), unless asked for (``--verbose``).

Events are flat dicts of JSON values, so each key maps one to one onto a journal field.

The API is structlog's bound logger (``log.info("decision", **event)``) and the event dict is the
one structlog's chain made (the fields, then ``event``, ``level`` and the ``timestamp`` of
``TimeStamper(fmt="iso", utc=True)``), but the hot path does not go through structlog: ``import
structlog`` imports ``structlog.dev`` and ``structlog.stdlib`` (rich's tracebacks, pygments,
asyncio, ssl) whatever is configured, ~75 ms of start-up and ~16 MB of the daemon's memory for
a chain of three steps (issue 14). :class:`Logger` runs those steps itself; structlog is
imported only where it renders, for a terminal.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Final, Protocol, TextIO

import msgspec

from memstaged import display

LOGGER_NAME: Final = "memstaged"
JOURNAL_SOCKET: Final = "/run/systemd/journal/socket"

#: One MESSAGE_ID per kind of event, so ``journalctl MESSAGE_ID=...`` finds them all.
MESSAGE_IDS: Final = {
    "decision": "6f1c2a0d3b7e4f5a9c8d1e2f3a4b5c6d",
    "start": "0b9a5c3e7d2f4a1b8c6e9d0f1a2b3c4d",
    "ready": "1c2d3e4f5a6b4c7d8e9f0a1b2c3d4e5f",
    "reload": "2d3e4f5a6b7c4d8e9f0a1b2c3d4e5f6a",
    "stop": "3e4f5a6b7c8d4e9f0a1b2c3d4e5f6a7b",
    "rescan": "4f5a6b7c8d9e4f0a1b2c3d4e5f6a7b8c",
    "lock_seen": "5a6b7c8d9e0f4a1b2c3d4e5f6a7b8c9d",
    "overflow_recovered": "6b7c8d9e0f1a4b2c3d4e5f6a7b8c9d0e",
    "temp_recovered": "7c8d9e0f1a2b4c3d4e5f6a7b8c9d0e1f",
    "staging_unreadable": "d0de64b33418400bb5127d39534f108d",
    "error": "8d9e0f1a2b3c4d4e5f6a7b8c9d0e1f2a",
    "memory_dir_added": "65074dd73b6e4cc18b67746f05643212",
    "memory_dir_removed": "e19989db96c24cb4abba9639326e11b8",
    "memory_dir_busy": "9e6e3817119a4076b6638db108148301",
    "memory_dir_error": "8b1a3b02e3754abe93bbe98158de47dc",
    "memory_dir_skipped": "3df9a49682ef4e6a892a6cd587e917da",
    "staging_changed": "a8e4907125ee4ee396ef6669bfe3bb82",
    "watch_failed": "cb27afd0a35d49a4a4901ed0657842aa",
    "observer_died": "845149373c7f4d0fa061fbb6413af8a4",
    "control_failed": "dfc8f1892cbe4ffd83b817134dcdef71",
    "metrics_failed": "5375906a46224e4abcd49393fe7fc4ad",
    "metrics_recovered": "714d20d2c80246c6ba5d198511111131",
    "conflict_parked": "023eb8ebcf7c4082b4de5aaa93ec199c",
    "crash": "0613292014ac4ba1b43dd000e3254af1",
    "deadletter_recovery": "f2daf41895f2415ca6db03d959d24115",
    "deadletter_recovered": "70aca388f2464c9e95e4af7a81a66fca",
    "deadletter_recover_failed": "1d0bc16b998e47e1837ff145e4d08bb8",
    "deadletter_purged": "4e1c77b319434bf89fee629cfef8f75f",
    "deadletter_recovering": "c1bc6c6e49db46839cb2e0da7baa4222",
    "deadletter_purging": "b0ed35b57edb4753811565a6d44efd25",
    "deadletter_originals_deleting": "1dea8f43504a4da6b7f4e33777d0766a",
}
_DEFAULT_MESSAGE_ID: Final = "9e0f1a2b3c4d4e5f6a7b8c9d0e1f2a3b"
#: syslog priorities: a quarantine is a warning, errors are errors, the rest information.
_PRIORITIES: Final = {
    "quarantined": 4,
    "deferred": 6,
    "repaired": 5,
    "foreign": 6,
    "valid": 6,
    "skipped": 6,
}
_LEVEL_PRIORITIES: Final = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


def _json_default(value: object) -> object:
    return str(value)


def dumps(event: Any) -> str:
    """Serialize an event; falls back to the standard library for values msgspec refuses."""
    try:
        return msgspec.json.encode(event).decode()
    except (TypeError, UnicodeEncodeError, OverflowError):
        return json.dumps(event, default=_json_default)


def message(event: MutableMapping[str, Any]) -> str:
    """The one readable line for a person (journal ``MESSAGE``, the console).

    Names and reasons come from whoever writes to ``staging/``: every control character is
    escaped (:mod:`memstaged.display`), so a file name with a newline or an ESC can neither
    fake a log line nor drive the terminal (issue 10 item 16). A repair says which.
    """
    kind = event.get("event", "")
    if kind == "decision":
        decision = event.get("decision")
        text = f"{decision} {display.name(event.get('path'))}"
        if event.get("dry_run"):
            text = f"{decision} (dry run) {display.name(event.get('path'))}"
        repairs = [r for r in event.get("repairs") or [] if isinstance(r, dict)]
        reasons = event.get("reasons") or []
        if repairs:
            text += f": repaired by {display.repairs(repairs)}"
        elif reasons:
            text += f": {display.text(reasons[0])}" + (
                f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            )
        return text
    extras = ", ".join(
        f"{k}={display.text(v)}"
        for k, v in event.items()
        if k not in ("event", "timestamp", "level")
    )
    return f"{kind}: {extras}" if extras else str(kind)


def priority(event: MutableMapping[str, Any]) -> int:
    if event.get("event") == "decision" and event.get("level", "info") == "info":
        return _PRIORITIES.get(str(event.get("decision")), 6)
    return _LEVEL_PRIORITIES.get(str(event.get("level", "info")), 6)


def journal_fields(event: MutableMapping[str, Any]) -> dict[str, str]:
    """Every event key as a ``MEMSTAGED_<KEY>`` field; lists and dicts as JSON text."""
    fields: dict[str, str] = {}
    for key, value in event.items():
        if value is None:
            continue  # an unknown session id has no field, rather than the text "null"
        name = "MEMSTAGED_" + "".join(c if c.isascii() and c.isalnum() else "_" for c in key)
        fields[name.upper()[:64]] = value if isinstance(value, str) else dumps(value)
    fields["MESSAGE"] = message(event)
    fields["PRIORITY"] = str(priority(event))
    fields["MESSAGE_ID"] = MESSAGE_IDS.get(str(event.get("event")), _DEFAULT_MESSAGE_ID)
    fields["SYSLOG_IDENTIFIER"] = "memstaged"
    return fields


#: How often (seconds) the file sink looks whether another process rotated or appended to the log.
_CHECK_INTERVAL: Final = 1.0
_ENCODER: Final = msgspec.json.Encoder()


def _render(event: Mapping[str, Any]) -> bytes:
    """The event's JSON line, newline included: rendered once, for the file and a non-TTY stderr.

    The same bytes :func:`dumps` gives; a value neither encoder takes (a key that is not a string,
    a list that contains itself) is logged as text rather than losing the event.
    """
    try:
        return _ENCODER.encode(event) + b"\n"
    except (TypeError, UnicodeEncodeError, OverflowError):
        pass  # msgspec refuses it: the standard library's encoder below says it differently
    try:
        return json.dumps(event, default=_json_default).encode() + b"\n"
    except (TypeError, ValueError, RecursionError):
        flat = {str(key): _json_default(value) for key, value in event.items()}
        return json.dumps(flat).encode() + b"\n"


def _say(text: str) -> None:
    """One line on stderr about the log itself."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # stderr itself is closed or broken: there is nobody left to tell


def private_dirs(path: Path) -> None:
    """``mkdir -p`` with every directory it creates 0700, parents included (SPEC 6).

    ``Path.mkdir(parents=True, mode=0o700)`` gives the mode to the last one only: the parents
    get the umask's default (0755), and ``$XDG_STATE_HOME/memstaged`` was world-readable.
    Directories that exist already are left as they are: they are not memstaged's.
    """
    missing: list[Path] = []
    here = path
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made meanwhile by another process


class _Trouble:
    """Says once that a sink fails and once that it works again, never a line per event.

    A full disk under a daemon deciding a file a second would otherwise print a line (or, with
    ``logging``, a traceback) for each decision, burying the one line that matters.
    """

    __slots__ = ("failing", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def failed(self, err: OSError | ValueError, consequence: str) -> None:
        if not self.failing:
            self.failing = True
            if isinstance(err, OSError) and err.strerror:
                reason = f"{err.strerror} ({errno.errorcode.get(err.errno or 0, err.errno)})"
            else:
                reason = str(err) or type(err).__name__
            _say(
                f"memstaged: {self.what}: {reason}; {consequence} (said once, until it works again)"
            )

    def recovered(self) -> None:
        self.failing = False
        _say(f"memstaged: {self.what}: works again")


class Sink(Protocol):
    """Where an event goes. Called with the fan-out's lock held, so one event at a time."""

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        """``line`` is the event's JSON line (newline included); never raises."""

    def close(self) -> None: ...


class FileSink:
    """The JSON-lines decision log file: one ``write`` per event, rotated by size.

    Rotation is ``RotatingFileHandler``'s: before a line is written, if the file's size plus the
    line would reach ``max_bytes``, ``<file>.N-1`` becomes ``<file>.N`` … and ``<file>`` becomes
    ``<file>.1`` (up to ``backups``), and the line starts a new ``<file>``, so a line is never
    split across files. With ``max_bytes`` or ``backups`` 0 the file just grows, and a path that
    is not a regular file (``/dev/null``, a FIFO) is never rotated. Three deliberate differences:
    the size is counted in bytes (the standard library added the line's *characters* to the
    file's bytes), an empty file is not rotated away for a line longer than ``max_bytes`` (Python
    3.13 stopped doing that too), and the new file is created 0600 like the first one.

    The size is kept in memory (``fstat`` at open), so an event costs one ``write`` and no
    ``stat``. Another process may append to or rotate the same file (``memstaged --once`` next to
    the daemon): at most once a second (checked on the next event) the path's inode is compared
    with the open file's and the size re-read, so a rotation done elsewhere is followed, and a
    line written in between lands in ``<file>.1``, not lost. A rotation holds an ``flock`` on
    the file it rotates and re-checks the inode under it, so two processes that both find the
    file full rotate it once, not twice.
    """

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        """Opens the file now: an ``OSError`` here is a configuration error for the caller."""
        self.path = path
        self._name = os.fspath(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._fd = -1
        self._id = (0, 0)
        self._size = 0
        self._rotates = False
        self._next_check = 0.0
        self._rotate_after = 0.0
        self._torn = False  # the last write stopped inside a line
        self._writing = _Trouble(f"decision log file {path}")
        self._rotating = _Trouble(f"rotating the decision log file {path}")
        self._following = _Trouble(f"checking the decision log file {path} for a rotation")
        private_dirs(path.parent)
        self._open()

    def _open(self) -> None:
        """(Re)open the path; the previous file stays open until this succeeds."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        fd = os.open(self._name, flags, 0o600)
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                os.fchmod(fd, 0o600)  # a file that was there already is made private too
        except OSError:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._id = (st.st_dev, st.st_ino)
        self._size = st.st_size
        self._rotates = self._max_bytes > 0 and self._backups > 0 and stat.S_ISREG(st.st_mode)
        self._next_check = time.monotonic() + _CHECK_INTERVAL
        self._torn = False  # a torn line stays at the end of the old file

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._follow(now)
        if (
            self._rotates
            and self._size
            and self._size + len(line) >= self._max_bytes
            and now >= self._rotate_after
        ):
            self._rotate(len(line), now)
        if self._torn:
            line = b"\n" + line  # end the torn line: it is skipped as not JSON, not glued to this
        try:
            self._write(line)
        except OSError as err:
            self._writing.failed(err, "events go on to the other sinks")
            return
        if self._writing.failing:
            self._writing.recovered()

    def _write(self, line: bytes) -> None:
        written = 0
        try:
            written = os.write(self._fd, line)
            if written < len(line):  # a signal or a nearly full disk: write the rest
                view = memoryview(line)
                while written < len(line):
                    written += os.write(self._fd, view[written:])
        finally:
            self._size += written
            if written:
                self._torn = written < len(line)

    def _follow(self, now: float) -> None:
        """Follow a rotation (or removal) done by another process, and count what it appended."""
        self._next_check = now + _CHECK_INTERVAL
        try:
            st = os.stat(self._name)
            if (st.st_dev, st.st_ino) == self._id:
                self._size = st.st_size
            else:
                self._open()
        except FileNotFoundError:
            try:
                self._open()  # removed: start a new file, as a restart would
            except OSError as err:
                self._following.failed(err, "writing on to the removed file")
                return
        except OSError as err:
            self._following.failed(err, "writing on to the file already open")
            return
        if self._following.failing:
            self._following.recovered()

    def _rotate(self, incoming: int, now: float) -> None:
        try:
            self._rotate_locked(incoming)
        except OSError as err:
            # Keep appending beyond max_bytes rather than losing events; try again in a second.
            self._rotate_after = now + _CHECK_INTERVAL
            self._rotating.failed(err, "appending to it beyond max_bytes")
            return
        if self._rotating.failing:
            self._rotating.recovered()

    def _rotate_locked(self, incoming: int) -> None:
        locked = self._fd
        fcntl.flock(locked, fcntl.LOCK_EX)  # released when _open closes it
        try:
            try:
                st = os.stat(self._name)
            except FileNotFoundError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != self._id:
                self._open()  # another process rotated it: write to the new file if it has room
                if self._size and self._size + incoming >= self._max_bytes:
                    self._rotate_locked(incoming)
                return
            self._size = st.st_size
            if self._size + incoming < self._max_bytes:
                return  # _follow's figure was stale the other way: nothing to do
            base = self._name
            for i in range(self._backups - 1, 0, -1):
                try:
                    os.rename(f"{base}.{i}", f"{base}.{i + 1}")
                except FileNotFoundError:
                    continue  # fewer backups so far than allowed
            os.rename(base, f"{base}.1")
            self._open()
        finally:
            if self._fd == locked:
                fcntl.flock(locked, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def sync(self) -> None:
        """Make the events written so far durable (before the changes they announce)."""
        if self._fd >= 0:
            os.fsync(self._fd)


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
        try:
            terminal = stream.isatty()
        except (OSError, ValueError):  # closed already: emit says so, once
            terminal = False
        self._render: Callable[[MutableMapping[str, Any]], str] | None = None
        if readable or (readable is None and terminal):
            self._render = _readable_renderer(colors=terminal and _colors_wanted())
        self._trouble = _Trouble("console log (stderr)")

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
        line = _render(event)
        with self._lock:
            for sink in self._sinks:
                sink.emit(event, line)


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


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


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
) -> None:
    """Set up the sinks. ``journal`` is ``auto``, ``on`` or ``off``; ``console`` is one of:

    * ``auto``: readable lines on stderr when it is a terminal and journald is not in use;
      nothing otherwise (the log file has every event);
    * ``on``: stderr always, readable on a terminal and JSON lines elsewhere;
    * ``lines``: stderr always, readable lines (``--once --verbose``);
    * ``off``: never.

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
        sinks.append(FileSink(log_file, max_bytes, backups))
    if console == "on" or (console == "auto" and not use_journal and _is_terminal(sys.stderr)):
        sinks.append(ConsoleSink(sys.stderr))
    elif console == "lines":
        sinks.append(ConsoleSink(sys.stderr, readable=True))
    _FANOUT.replace(tuple(sinks))


def add_sink(sink: Sink) -> None:
    """One more sink next to the configured ones (a test's fake journal)."""
    _FANOUT.replace((*_FANOUT.sinks, sink))


def sync() -> None:
    """fsync the decision log file: SPEC 5, nothing is carried out unlogged, even across a
    power cut. A failure is reported in one stderr line, never raised."""
    for sink in _FANOUT.sinks:
        if isinstance(sink, FileSink):
            try:
                sink.sync()
            except OSError as err:
                _say(f"memstaged: cannot sync the decision log: {err.strerror or err}")


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

    def debug(self, event: str, **fields: Any) -> None:
        self._emit("debug", event, fields)

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
