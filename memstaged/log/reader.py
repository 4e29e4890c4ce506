"""Reading the decision log back: the JSON-lines file (rotated files included) and journald.

Both sources yield the same event dicts, the ones :mod:`memstaged.log.writer` wrote, so ``memstaged
log`` prints the same thing whichever it reads. A source has two phases: :meth:`history` returns
what is there now, and :meth:`follow` then yields what arrives after it, with no gap and no repeat
between the two (the file is read on from the same open handle; the journal from the same cursor).

Filtering is a pure function of one event (:class:`EventFilter`), so it is tested without a file.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
import posixpath
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Final, Protocol

import msgspec

from memstaged.core.foreign import normalize
from memstaged.errors import ConfigError, UsageError
from memstaged.files import safe_open

Event = dict[str, Any]

SYSLOG_IDENTIFIER: Final = "memstaged"
FIELD_PREFIX: Final = "MEMSTAGED_"
#: Keys whose journal value is always the string itself (never JSON text).
_STRING_KEYS: Final = frozenset(
    {
        "event",
        "level",
        "timestamp",
        "decision",
        "path",
        "memory_dir",
        "sha256",
        "kept_as",
        "lock",
        "owner",
        "action",
        "observer",
        "config",
        "staging_file",
        "original",
        "id",
    }
)
#: Keys holding a string or ``null``: older memstaged sent the text ``null`` for None.
_NULLABLE_STRING_KEYS: Final = frozenset({"session_id"})
#: The order keys are printed in, so that both sources print byte-identical JSON.
KEY_ORDER: Final = (
    "timestamp",
    "level",
    "event",
    "decision",
    "path",
    "memory_dir",
    "session_id",
    "sha256",
    "size",
    "reasons",
    "repairs",
    "deadletter",
    "duration_ms",
)
_decoder: Final = msgspec.json.Decoder()


def ordered(event: Mapping[str, Any]) -> Event:
    """The event as both sources print it: keys in :data:`KEY_ORDER`, then the others sorted,
    and no ``null`` values (journald has no field for them, so absent and null must agree)."""
    out = {key: event[key] for key in KEY_ORDER if event.get(key) is not None}
    out.update((key, event[key]) for key in sorted(event) if key not in out)
    return {key: value for key, value in out.items() if value is not None}


def event_time(event: Mapping[str, Any]) -> dt.datetime | None:
    value = event.get("timestamp")
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


# -- filtering ----------------------------------------------------------------------------------


class EventFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What ``memstaged log`` and ``stats`` select; empty fields select everything."""

    decisions: frozenset[str] = frozenset()
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    #: A glob matched against the full path and against the file name.
    path: str | None = None
    #: A glob matched against ``session_id``.
    session: str | None = None
    #: Globs matched against ``memory_dir`` (absolute, normalized).
    memory_dirs: tuple[str, ...] = ()
    decisions_only: bool = False

    def matches(self, event: Mapping[str, Any]) -> bool:
        is_decision = event.get("event") == "decision"
        if (self.decisions or self.decisions_only) and not is_decision:
            return False
        if (
            self.decisions
            and event.get("decision") not in self.decisions
            and not ("quarantined" in self.decisions and partly_quarantined(event))
        ):
            return False
        if self.decisions and event.get("own_rewrite"):
            return False  # the look at memstaged's own rewrite is no decision (SPEC 7)
        if self.since is not None or self.until is not None:
            when = event_time(event)
            if when is None:
                return False
            if self.since is not None and when < self.since:
                return False
            if self.until is not None and when > self.until:
                return False
        if self.path is not None and not _path_matches(event.get("path"), self.path):
            return False
        if self.session is not None:
            session = event.get("session_id")
            if not isinstance(session, str) or not fnmatch.fnmatchcase(session, self.session):
                return False
        if self.memory_dirs:
            mdir = event.get("memory_dir")
            if not isinstance(mdir, str):
                return False
            return any(fnmatch.fnmatchcase(normalize(mdir), p) for p in self.memory_dirs)
        return True


def partly_quarantined(event: Mapping[str, Any]) -> bool:
    """A ``repaired`` file whose invalid candidates R4 dead-lettered: what a query for the
    quarantines must find too. Older logs say it only by the repairs' rule."""
    if event.get("decision") != "repaired":
        return False
    if event.get("partly_quarantined"):
        return True
    repairs = event.get("repairs")
    return isinstance(repairs, list) and any(
        isinstance(r, dict) and r.get("rule") == "R4" for r in repairs
    )


def _path_matches(path: object, pattern: str) -> bool:
    if not isinstance(path, str):
        return False
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(
        posixpath.basename(path), pattern
    )


def path_pattern(text: str) -> str:
    """``--path``: a bare name or glob matches file names; a relative path is made absolute."""
    if "/" in text and not text.startswith("/"):
        return normalize(os.path.abspath(text))
    return text


def memory_dir_pattern(text: str) -> str:
    return normalize(os.path.abspath(os.path.expanduser(text)))


# -- sources ------------------------------------------------------------------------------------


class Source(Protocol):
    """Where events come from: what is there now, then what arrives."""

    def iter_history(self) -> Iterator[Event]: ...

    def iter_reverse(self) -> Iterator[Event]: ...

    def follow(self, stop: Callable[[], bool]) -> Iterator[Event]: ...

    def close(self) -> None: ...


def rotated_files(path: Path) -> list[Path]:
    """``decisions.jsonl.N`` ... ``.1`` (oldest first); RotatingFileHandler's numbering."""
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ConfigError(f"log directory {path.parent}: {err.strerror}") from None
    pattern = re.compile(re.escape(path.name) + r"\.([0-9]+)")
    found = sorted(
        ((int(m[1]), name) for name in names if (m := pattern.fullmatch(name))), reverse=True
    )
    return [path.parent / name for _, name in found]


def open_log(path: Path) -> IO[bytes]:
    """Open a decision log file (or a rotated one) for reading, never blocking.

    ``O_NONBLOCK``: a FIFO at the path (``.1`` included, which the config check does not see)
    would block the reader until someone writes; it is refused like any file that is not a
    regular one, with one line (``ConfigError``, exit 2). ``FileNotFoundError`` is passed on.
    """
    from memstaged.log.rotated_file import not_a_log_file

    try:
        fd = safe_open.open_nonblocking(path)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ConfigError(f"log file {path}: {err.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"log file {path}: {not_a_log_file(mode)}")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def parse_line(line: bytes) -> Event | None:
    """One log line as an event, or ``None`` for a line that is not a JSON object.

    A file name that is not UTF-8 is logged as a ``\\udcNN`` escape (what the standard
    library's encoder writes for ``os.fsdecode``'s lone surrogates): valid JSON, which msgspec
    refuses to decode, so such a line is read again by the standard library and gives back the
    very string (and so, through ``os.fsencode``, the very bytes) that was logged.
    """
    try:
        value = _decoder.decode(line)
    except msgspec.DecodeError:
        if b"\\ud" not in line and b"\\uD" not in line:
            return None
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


class FileSource:
    """The JSON-lines decision log and its rotated predecessors.

    Rotation renames ``decisions.jsonl`` to ``.1`` and starts a new file; :meth:`follow` notices
    (a different inode, or a file shorter than where it is), finishes the old handle and reads
    the new file from its start, so no event is skipped.
    """

    def __init__(self, path: Path, *, poll: float = 0.2) -> None:
        self.path = path
        self.poll = poll
        self.bad_lines = 0
        self._fh: IO[bytes] | None = None
        self._ino: int | None = None
        self._partial = b""

    def iter_history(self) -> Iterator[Event]:
        """What is there now, oldest first, read a chunk at a time: the first events are
        printed before the last are read. :meth:`follow` goes on from where this ends."""
        for older in rotated_files(self.path):
            try:
                with open_log(older) as fh:
                    yield from self._chunks(fh, complete=True)
            except FileNotFoundError:
                continue  # rotated away meanwhile
            except OSError as err:
                raise ConfigError(f"log file {older}: {err.strerror}") from None
        if self._open():
            assert self._fh is not None
            yield from self._chunks(self._fh, complete=False)

    def iter_reverse(self) -> Iterator[Event]:
        """What is there now, newest first (``--reverse``): the current file, then ``.1``,
        ``.2`` …, each read whole (a file is at most ``log_max_bytes``) and walked backwards."""
        for path in [self.path, *reversed(rotated_files(self.path))]:
            try:
                with open_log(path) as fh:
                    data = fh.read()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise ConfigError(f"log file {path}: {err.strerror}") from None
            if path == self.path and data and not data.endswith(b"\n"):
                data = data.rpartition(b"\n")[0]  # a last line still being written
            for line in reversed(data.split(b"\n")):
                if not line.strip():
                    continue
                event = parse_line(line)
                if event is None:
                    self.bad_lines += 1
                else:
                    yield event

    def _chunks(self, fh: IO[bytes], *, complete: bool) -> Iterator[Event]:
        """The events of ``fh`` from where it is, 1 MiB at a time; an incomplete last line is
        kept back in ``_partial`` for :meth:`follow` unless the file is ``complete``."""
        rest = b""
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            data = rest + chunk
            data, _, rest = data.rpartition(b"\n")
            yield from self._parse(data)
        if complete:
            yield from self._parse(rest)
        else:
            self._partial = rest

    def follow(self, stop: Callable[[], bool]) -> Iterator[Event]:
        while not stop():
            if self._fh is None and not self._open():
                time.sleep(self.poll)
                continue
            new = self._read_new(complete=False)
            if new:
                yield from new
                continue
            if self._rotated():
                yield from self._read_new(complete=True)  # whatever the old file still had
                self.close()
                continue
            time.sleep(self.poll)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self) -> bool:
        try:
            self._fh = open_log(self.path)
        except FileNotFoundError:
            return False
        self._ino = os.fstat(self._fh.fileno()).st_ino
        self._partial = b""
        return True

    def _rotated(self) -> bool:
        assert self._fh is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return False  # between the rename and the new file: keep the old handle for now
        return st.st_ino != self._ino or st.st_size < self._fh.tell()

    def _read_new(self, *, complete: bool) -> list[Event]:
        """What was appended since the last read. A last line without its newline is still
        being written: it is kept back until it is complete, unless the file is (``complete``)."""
        assert self._fh is not None
        data = self._partial + self._fh.read()
        self._partial = b""
        if not complete and data and not data.endswith(b"\n"):
            data, _, self._partial = data.rpartition(b"\n")
        return self._parse(data)

    def _parse(self, data: bytes) -> list[Event]:
        """The events of whole lines. msgspec reads a chunk's lines in one call (twice as fast
        as line by line: ``log``'s target is 100,000 events/s); a chunk with a line that is not
        a JSON object, or a ``\\udcNN`` name msgspec refuses, is read line by line instead."""
        try:
            values = _decoder.decode_lines(data)
        except msgspec.DecodeError:
            values = None
        if values is not None and all(type(v) is dict for v in values):
            return values
        events = []
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            event = parse_line(line)
            if event is None:
                self.bad_lines += 1
            else:
                events.append(event)
        return events


# -- journald -----------------------------------------------------------------------------------


def event_from_journal(entry: Mapping[str, Any]) -> Event | None:
    """Turn a journal entry's ``MEMSTAGED_*`` fields back into the event dict memstaged logged.

    The journal keeps only strings: :func:`memstaged.log.format.journal_fields` writes a string as
    it is and anything else as JSON text. Keys known to hold strings are kept as they are; others
    are decoded when they are JSON for a number, boolean, null, array or object. ``None`` for an
    entry that is not an event (memstaged's stderr, for instance, has no ``MEMSTAGED_EVENT``).
    """
    if FIELD_PREFIX + "EVENT" not in entry:
        return None
    event: Event = {}
    for field, raw in entry.items():
        if not field.startswith(FIELD_PREFIX):
            continue
        key = field[len(FIELD_PREFIX) :].lower()
        event[key] = _field_value(key, raw)
    return event


def _field_value(key: str, raw: object) -> Any:
    if isinstance(raw, bytes):  # not UTF-8 (a file name): kept losslessly, as os.fsdecode does
        raw = raw.decode("utf-8", "surrogateescape")
    if not isinstance(raw, str):
        return raw
    if key in _STRING_KEYS:
        return raw
    if key in _NULLABLE_STRING_KEYS:
        return None if raw == "null" else raw
    try:
        value = _decoder.decode(raw)
    except msgspec.DecodeError:
        return raw
    return raw if isinstance(value, str) else value


class JournalSource:
    """memstaged's events in journald (``SYSLOG_IDENTIFIER=memstaged``), via systemd-python."""

    def __init__(
        self, *, directory: str | None = None, since: dt.datetime | None = None, poll: float = 1.0
    ) -> None:
        try:
            from systemd import journal
        except ImportError:
            raise UsageError(
                "--journal needs systemd-python (the systemd.journal module)"
            ) from None
        try:
            self._reader = journal.Reader(path=directory) if directory else journal.Reader()
        except OSError as err:
            where = directory or "the system journal"
            raise ConfigError(f"cannot open {where}: {err.strerror or err}") from None
        self._reader.add_match(SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
        if since is not None:
            # The journal's clock is when journald received an entry; allow for the delay.
            self._reader.seek_realtime(since - dt.timedelta(minutes=1))
        self.poll = poll

    def _drain(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                entry = self._reader.get_next()
            except OSError as err:
                raise ConfigError(f"reading the journal: {err.strerror or err}") from None
            if not entry:
                return events
            event = event_from_journal(entry)
            if event is not None:
                events.append(event)

    def iter_history(self) -> Iterator[Event]:
        yield from self._drain()

    def iter_reverse(self) -> Iterator[Event]:
        yield from reversed(self._drain())

    def follow(self, stop: Callable[[], bool]) -> Iterator[Event]:
        while not stop():
            self._reader.wait(self.poll)
            yield from self._drain()

    def close(self) -> None:
        self._reader.close()
