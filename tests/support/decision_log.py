"""The decision log read back by the tests, line by line as ``memstaged log`` reads it
(:func:`memstaged.log.reader.parse_line`): the tests' one reader of it.

:func:`read_events` reads the file as it is now; :class:`DecisionLog` reads on from where it
stopped, across rotations, for the tests that watch a log grow (a daemon's, a crash harness's).
A line counts once it ends with its newline: the last line of a file being written, or torn by
a SIGKILL, is not one yet. Strict, a complete line that is not an event fails the test; not
strict (where a process was killed in the middle of a line, and the next run appended to it),
it is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memstaged.log.reader import parse_line, rotated_files

Event = dict[str, Any]


def _events(data: bytes, *, strict: bool, where: Path) -> list[Event]:
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        event = parse_line(line)
        if event is None:
            assert not strict, f"{where}: a line that is not an event: {line[:200]!r}"
            continue
        out.append(event)
    return out


def read_events(log: Path, *, strict: bool = True) -> list[Event]:
    """Every event of the decision log file ``log`` (not its rotated files), oldest first; ``[]``
    while there is no file (not yet written, or rotated away meanwhile)."""
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return []
    return _events(data[: data.rfind(b"\n") + 1], strict=strict, where=log)


def decision_events(events: Iterable[Event]) -> list[Event]:
    """The decision events among ``events``."""
    return [e for e in events if e.get("event") == "decision"]


def decisions(log: Path) -> dict[str, str]:
    """File name -> the last decision logged for it (memstaged's look at its own rewrite, logged
    ``own_rewrite``, is no decision: SPEC 7)."""
    out: dict[str, str] = {}
    for event in decision_events(read_events(log)):
        if not event.get("own_rewrite"):
            out[Path(event["path"]).name] = event["decision"]
    return out


class DecisionLog:
    """The events of a JSON-lines log and of its rotated files, each line read once.

    Files are known by inode and held open, so that an inode is not reused while it is known
    (a backup beyond ``log_backups`` is deleted by the rotation), and each is read on from where
    the last :meth:`update` stopped. A rotation renames files and keeps their inodes: the file
    that was the current log is read on as ``<log>.1``, and a new current log is read from its
    start; files are read oldest first, and a file rotated out of reach is read to its end
    first, so :attr:`events` keeps the order they were logged in.
    """

    def __init__(self, log: Path, *, strict: bool = True, keep_events: bool = True) -> None:
        self.log = log
        self.strict = strict
        self.keep_events = keep_events
        #: (dev, ino) -> [fd, offset]; fd -1 once :meth:`close` closed it.
        self._files: dict[tuple[int, int], list[int]] = {}
        #: Every event read, in order (unless ``keep_events`` is false).
        self.events: list[Event] = []
        #: Base name of a decided path -> the decisions logged for it.
        self.logged: dict[str, set[str]] = {}
        #: Every ``deadletter/...`` file a decision names.
        self.named: set[str] = set()

    def update(self) -> list[Event]:
        """Read what was appended (and rotated) since the last call; returns :attr:`events`."""
        entries: list[list[int]] = []
        for path in [*rotated_files(self.log), self.log]:
            entry = self._open(path)
            if entry is not None and all(entry is not e for e in entries):
                entries.append(entry)
        gone = [k for k, entry in self._files.items() if all(entry is not e for e in entries)]
        for key in gone:  # deleted by a rotation: older than every file still there
            entry = self._files.pop(key)
            if entry[0] >= 0:
                self._read_on(entry)
                os.close(entry[0])
        for entry in entries:
            self._read_on(entry)
        return self.events

    def _read_on(self, entry: list[int]) -> None:
        fd, offset = entry
        size = os.fstat(fd).st_size
        if size < offset:  # truncated (memstaged never does): read it again
            offset = 0
        data = bytearray()
        while offset + len(data) < size:
            chunk = os.pread(fd, size - offset - len(data), offset + len(data))
            if not chunk:
                break
            data += chunk
        complete = data.rfind(b"\n") + 1
        for event in _events(bytes(data[:complete]), strict=self.strict, where=self.log):
            self._take(event)
        entry[1] = offset + complete

    def _open(self, path: Path) -> list[int] | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        entry = self._files.get((st.st_dev, st.st_ino))
        if entry is not None and entry[0] >= 0:
            return entry
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)  # the path may have been replaced between the stat and the open
        entry = self._files.get((st.st_dev, st.st_ino))
        if entry is None:
            entry = self._files[(st.st_dev, st.st_ino)] = [fd, 0]
        elif entry[0] < 0:
            entry[0] = fd  # known, and closed: read on from where it was left
        else:
            os.close(fd)
        return entry

    def _take(self, event: Event) -> None:
        if self.keep_events:
            self.events.append(event)
        if event.get("event") != "decision":
            return
        name = os.path.basename(str(event.get("path", "")))
        self.logged.setdefault(name, set()).add(str(event.get("decision")))
        self.named.update(str(d) for d in event.get("deadletter") or ())

    def close(self) -> None:
        """Close the files held open; a later :meth:`update` opens them again and reads on from
        where it stopped (a file deleted meanwhile is not read again)."""
        for entry in self._files.values():
            if entry[0] >= 0:
                os.close(entry[0])
                entry[0] = -1
