"""The decision log (SPEC section 7): one structured event per decision, fanned out to its sinks.

* a JSON-lines file that memstaged rotates itself (:class:`FileSink`), which the inspection commands
  read without journald: it gets every event, and a change whose announcement it could not take
  whole and durably is not carried out (:func:`durable`, SPEC 7);
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
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Protocol, TextIO

import msgspec

from memstaged import display
from memstaged.errors import ConfigError, LogUnwritable, MemstagedError

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


#: The standard library's separators as msgspec writes them.
_COMPACT: Final = (",", ":")


def _json_default(value: object) -> object:
    return str(value)


def dumps(event: Any) -> str:
    """Serialize an event; falls back to the standard library for values msgspec refuses."""
    try:
        return msgspec.json.encode(event).decode()
    except (TypeError, UnicodeEncodeError, OverflowError):
        # Compact as msgspec writes: one command's --json lines must not change form when a
        # file name is not UTF-8 (issue 22 item 5: status --json's later objects had spaces).
        return json.dumps(event, default=_json_default, separators=_COMPACT)


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
        if event.get("own_rewrite"):
            text += ": memstaged's own rewrite, looked at again (not a new decision)"
        elif repairs:
            text += f": repaired by {display.repairs(repairs)}"
        elif reasons:
            text += f": {display.text(reasons[0])}" + (
                f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            )
        return text
    extras = ", ".join(
        f"{k}={display.text(v)}"
        for k, v in event.items()
        if k not in ("event", "timestamp", "level") and v is not None  # not "abandoned=None"
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


#: After a rotation failed (a rename refused), how long (seconds) the file grows before a retry.
_ROTATE_RETRY: Final = 1.0
#: How many rotations by other processes one event follows before its write is given up: each
#: means that another process rotated the file between this one's open and its lock.
_FOLLOWS: Final = 100
#: How long an append waits for another process's lock on the log. A line holds it for
#: microseconds, a rotation for a few renames; a holder stopped inside (Ctrl-Z on a ``--once``
#: while it logs) would otherwise hold every other memstaged for as long, the daemon with
#: ``canonical-writer.lock`` in hand. Past this the event counts as not written: the change it
#: announces waits, ``deferred``, and is retried with the back-off.
LOCK_PATIENCE: Final = 5.0
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
        return json.dumps(event, default=_json_default, separators=_COMPACT).encode() + b"\n"
    except (TypeError, ValueError, RecursionError):
        flat = {str(key): _json_default(value) for key, value in event.items()}
        return json.dumps(flat, separators=_COMPACT).encode() + b"\n"


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

    __slots__ = ("failing", "quiet", "what")

    def __init__(self, what: str, *, quiet: bool = False) -> None:
        self.what = what
        self.failing = False
        #: Say nothing: the caller reports the failure itself (recover and purge stop with it).
        self.quiet = quiet

    def failed(self, err: OSError | ValueError, consequence: str) -> None:
        if not self.failing:
            self.failing = True
            if self.quiet:
                return
            if isinstance(err, OSError) and err.strerror:
                reason = f"{err.strerror} ({errno.errorcode.get(err.errno or 0, err.errno)})"
            else:
                reason = str(err) or type(err).__name__
            _say(
                f"memstaged: {self.what}: {reason}; {consequence} (said once, until it works again)"
            )

    def recovered(self) -> None:
        self.failing = False
        if not self.quiet:
            _say(f"memstaged: {self.what}: works again")


class Sink(Protocol):
    """Where an event goes. Called with the fan-out's lock held, so one event at a time."""

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        """``line`` is the event's JSON line (newline included); never raises."""

    def close(self) -> None: ...


class FileSink:
    """The JSON-lines decision log file: one whole line per event, rotated by size.

    The path must name a regular file, or nothing yet (it is created 0600). A link to a regular
    file is followed, as for the config file (the user named this path); a FIFO, socket,
    device or directory is refused (``OSError``, ``EINVAL``), ``/dev/null`` included: a decision
    log that keeps nothing would let changes be carried out unlogged (issue 19 item 3). It is
    opened ``O_NONBLOCK``, so that whatever stands at the path never blocks a command.

    Rotation is ``RotatingFileHandler``'s: before a line is written, if the file's size plus the
    line would reach ``max_bytes``, ``<file>.N-1`` becomes ``<file>.N`` … and ``<file>`` becomes
    ``<file>.1`` (up to ``backups``), and the line starts a new ``<file>``, so a line is never
    split across files. With ``max_bytes`` or ``backups`` 0 the file just grows. Three deliberate
    differences: the size is counted in bytes (the standard library added the line's
    *characters* to the file's bytes), an empty file is not rotated away for a line longer than
    ``max_bytes`` (Python 3.13 stopped doing that too), and the new file is created 0600.

    Several processes write and rotate the same file (the daemon, ``--once``, recover, purge;
    issue 19 item 6). Every append holds an exclusive ``flock`` on the file it writes and checks,
    under it, that the path still names that file (``stat``); a rotation holds the same lock on
    the file it renames. So a line is only ever written into the file the path names at that
    moment, never into one rotated away (and perhaps deleted) meanwhile; the size that decides a
    rotation is the file's own, whoever appended; and the order of the lines across the files is
    the order in which they were written. An event costs ``flock``, ``stat``, ``write`` and
    ``flock`` (a ``pread`` of the last byte, too, when another process wrote since).

    A line is written whole or not at all: a write cut short (a full disk) is truncated away
    under the lock, and a line left torn by a crash is ended before the next is appended. A
    failed write is said once on stderr and counted (:attr:`failures`): :func:`durable` raises
    :class:`~memstaged.errors.LogUnwritable` for it, so that the change the event announces is
    not carried out (SPEC 5 and 7).
    """

    def __init__(self, path: Path, max_bytes: int, backups: int, *, quiet: bool = False) -> None:
        """Opens the file now: an ``OSError`` here is a configuration error for the caller.

        ``quiet``: a failed write is not said on stderr (the caller says
        :class:`~memstaged.errors.LogUnwritable` itself: recover and purge stop with it).
        """
        self.path = path
        self._name = os.fspath(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._rotates = max_bytes > 0 and backups > 0
        self._rotate_after = 0.0
        #: Where this process's last line ended, if nothing was written after it since.
        self._end = -1
        #: Events not written (whole) so far, and the last reason: see :func:`durable`.
        self.failures = 0
        self._lock_stuck = False  # the last append found the lock held too long
        self._error: OSError | None = None
        #: A file was created or renamed since the last sync: its directory is fsynced too.
        self._dir_changed = False
        self._writing = _Trouble(f"decision log file {path}", quiet=quiet)
        self._rotating = _Trouble(f"rotating the decision log file {path}")
        private_dirs(path.parent)
        self._fd, self._id = self._open()

    def _open(self) -> tuple[int, tuple[int, int]]:
        """Open (or create) the file the path names now; refuse anything but a regular file."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(self._name, flags, 0o600)  # O_RDWR: the last byte is read, see _append
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, not_a_log_file(st.st_mode), self._name)
            fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND)  # O_NONBLOCK was for the open only
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)  # a file that was there already is made private too
        except BaseException:
            os.close(fd)
            raise
        if st.st_size == 0:
            self._dir_changed = True  # created now, perhaps: its name is made durable too
        return fd, (st.st_dev, st.st_ino)

    def _reopen(self) -> None:
        """Follow the path to the file it names now; the old one stays open until that works."""
        fd, ident = self._open()
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._id, self._end = fd, ident, -1

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        try:
            self._append(line)
        except OSError as err:
            self.failures += 1
            self._error = err
            self._writing.failed(
                err,
                "nothing is carried out while it cannot be written (the files wait, deferred); "
                "events go on to the other sinks",
            )
            return
        if self._writing.failing:
            self._writing.recovered()

    def _append(self, line: bytes) -> None:
        """Write ``line`` whole into the file the path names, under its lock; else raise."""
        if self._fd < 0:
            raise OSError(errno.EBADF, "the decision log file is closed", self._name)
        for _ in range(_FOLLOWS):
            fd = self._fd
            # After one wait in vain, the next events try once until the lock is had again: a
            # run's every event waiting its full patience would make a stop take minutes.
            try:
                _lock(fd, self._name, 0.0 if self._lock_stuck else LOCK_PATIENCE)
            except OSError:
                self._lock_stuck = True
                raise
            self._lock_stuck = False
            try:
                if self._append_locked(fd, line):
                    return
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            self._reopen()  # rotated or removed by another process (or just now, by this one)
        raise OSError(errno.EAGAIN, "rotated away by other processes at every try", self._name)

    def _append_locked(self, fd: int, line: bytes) -> bool:
        """With ``fd``'s lock held: write (or rotate); False when the path names another file."""
        try:
            st = os.stat(self._name)
        except FileNotFoundError:
            return False  # removed: start a new file, as a restart would
        if (st.st_dev, st.st_ino) != self._id:
            return False
        size = st.st_size
        if (
            self._rotates
            and size
            and size + len(line) >= self._max_bytes
            and time.monotonic() >= self._rotate_after
            and self._rotate()
        ):
            return False  # the line goes into the new file
        data = line
        if size and size != self._end and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + line  # end a torn line: it is skipped as not JSON, not glued to this
        self._write(fd, data, size)
        self._end = size + len(data)
        return True

    def _write(self, fd: int, data: bytes, size: int) -> None:
        """Append ``data`` whole, or leave the file as it was (``size``) and raise."""
        written = 0
        try:
            while written < len(data):  # a signal or a nearly full disk: write the rest
                done = os.write(fd, data[written:] if written else data)
                if not done:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)
                written += done
        except OSError:
            if written:
                try:
                    os.ftruncate(fd, size)  # no line is counted, or left, half-written
                except OSError:
                    self._end = -1  # the next append (of any process) ends the torn line
            raise

    def _rotate(self) -> bool:
        """Rename the files one down, with the current one's lock held; True when done."""
        base = self._name
        try:
            for i in range(self._backups - 1, 0, -1):
                try:
                    os.rename(f"{base}.{i}", f"{base}.{i + 1}")
                except FileNotFoundError:
                    continue  # fewer backups so far than allowed
            os.rename(base, f"{base}.1")
        except OSError as err:
            # Keep appending beyond max_bytes rather than losing events; try again later.
            self._rotate_after = time.monotonic() + _ROTATE_RETRY
            self._rotating.failed(err, "appending to it beyond max_bytes")
            return False
        if self._rotating.failing:
            self._rotating.recovered()
        return True

    @property
    def failing(self) -> bool:
        """Whether its last write failed (``status`` and the metrics report it)."""
        return self._writing.failing

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def sync(self, since: int) -> None:
        """Make the events written so far durable, before the changes they announce.

        Raises :class:`~memstaged.errors.LogUnwritable` when an event since the mark ``since``
        (:attr:`failures` then) was not written, or the fsync fails: the caller must not carry
        out what they announce.
        """
        if self.failures != since:
            assert self._error is not None
            raise LogUnwritable(self.path, self._error)
        try:
            os.fsync(self._fd)
            if self._dir_changed:
                fsync_dir(self.path.parent)
                self._dir_changed = False
        except OSError as err:
            self.failures += 1
            self._error = err
            self._writing.failed(err, "nothing is carried out while it cannot be made durable")
            raise LogUnwritable(self.path, err) from None


#: What a file system that cannot take the log now says (full, read-only, failing): a command
#: that cannot open the log for it changes nothing and exits 1 (try again), not 2 (a setting).
UNWRITABLE: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def open_error(path: Path, err: OSError) -> MemstagedError:
    """The one-line error of a log file that cannot be opened: try again, or fix a setting."""
    if err.errno in UNWRITABLE:
        return LogUnwritable(path, err)
    return ConfigError(f"log file {path}: {err.strerror or err}")


def not_a_log_file(mode: int) -> str:
    """Why a path cannot be the decision log, for a mode that is not a regular file's."""
    return (
        f"not a regular file ({display.file_kind(mode)}): the decision log must be a regular "
        "file, or a path where one can be created"
    )


def fsync_dir(path: Path) -> None:
    """fsync a directory: the names created and renamed in it are durable from then on."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(fd: int, name: str, patience: float) -> None:
    """``flock(LOCK_EX)`` on the log, waiting at most ``patience`` seconds; else ``OSError``.

    Polled (1 ms, doubling to 50 ms): ``flock`` has no timeout, and an alarm would interrupt
    whatever else the process does. Only a contended lock polls; an idle daemon takes none.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass  # held by another process: wait for it, a while
    deadline = time.monotonic() + patience
    pause = 0.001
    while time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue
    raise OSError(
        errno.EWOULDBLOCK,
        f"locked by another process for over {LOCK_PATIENCE:g} s (a stopped memstaged?)",
        name,
    )


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
        terminal = display.is_terminal(stream)  # not when closed already: emit says so, once
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
        console == "auto" and not use_journal and display.is_terminal(sys.stderr)
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


@contextmanager
def durable() -> Iterator[None]:
    """The events logged in the block are written whole and fsynced when it ends, or
    :class:`~memstaged.errors.LogUnwritable` is raised (SPEC 5 and 7: nothing is carried out
    unlogged, even across a power cut). Whoever announces a change logs it in this block and
    carries it out only after it."""
    marks = {id(sink): sink.failures for sink in _file_sinks()}
    yield
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
