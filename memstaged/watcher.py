"""The thin watcher: watchdog observers whose handlers only turn events into :class:`Signal`\\ s.

Handlers run on watchdog's dispatch thread under its lock, so they decide nothing: they put a
small value on a queue and return. Which events mean "complete" follows SPEC section 5: a close
after writing and a rename into ``staging/`` say a write is complete; a bare create or modify may
be the middle of one.

Two details of watchdog matter here:

* Without ``generate_full_events``, a file renamed into ``staging/`` from another directory (the
  usual "write a temp file elsewhere, rename it in") is reported as a plain *created* event, which
  would make it wait for the settle interval. The inotify observer is built with full events, so
  such a rename arrives as a move with an empty source, and counts as complete.
* inotify drops events when its queue overflows; watchdog then only logs a warning. That warning
  is caught here (a logging handler on watchdog's logger) and turned into an ``OVERFLOW`` signal,
  so the daemon rescans at once instead of waiting for the periodic rescan.

Each watch asks the kernel only for the events used here (``event_filter``): memstaged's own reads
of every file would otherwise put an open and a close-without-write event per file on the same
inotify queue, and make an overflow during a burst twice as likely.
"""

from __future__ import annotations

import logging
import os
import queue
from enum import Enum
from pathlib import Path
from typing import Final, NamedTuple

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver, ObservedWatch
from watchdog.observers.inotify import InotifyObserver
from watchdog.observers.polling import PollingObserver

from memstaged.locks import CANONICAL_LOCK
from memstaged.pipeline import STAGING, MemoryDir, is_staging_name

#: File systems where inotify sees no changes made by other machines.
NETWORK_FS: Final = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "fuse.sshfs",
        "afs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "virtiofs",
    }
)
OBSERVER_KINDS: Final = ("auto", "inotify", "polling")
_OVERFLOW_LOGGER: Final = "watchdog.observers.inotify_c"

#: The events each watch asks for; everything else (opens, reads, attribute changes of other
#: entries) is filtered out by the kernel mask or by the emitter.
_STAGING_EVENTS: Final[list[type[FileSystemEvent]]] = [
    FileClosedEvent,
    FileMovedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]
_MEMORY_DIR_EVENTS: Final[list[type[FileSystemEvent]]] = [
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]


class Kind(Enum):
    """What a signal tells the daemon."""

    COMPLETE = "complete"  # a write finished: decide now
    CHANGED = "changed"  # created or modified: decide once it settles (or on COMPLETE)
    LOCK_RELEASED = "lock_released"  # canonical-writer.lock went away
    DIR_CHANGED = "dir_changed"  # staging/ (or the memory dir itself) appeared or disappeared
    OVERFLOW = "overflow"  # events were lost: rescan everything
    WAKE = "wake"  # a signal handler wants the loop to look at its flags


class Signal(NamedTuple):
    """One thing the daemon must look at: a file (``name``) or a whole memory dir."""

    kind: Kind
    memory_dir: str = ""
    name: str = ""


class StagingHandler(FileSystemEventHandler):
    """Events in ``<memory dir>/staging/``: which file, and whether its write is complete."""

    def __init__(
        self, out: queue.SimpleQueue[Signal], mdir: str, *, complete_on_change: bool
    ) -> None:
        self.out = out
        self.mdir = mdir
        self.staging = os.path.join(mdir, STAGING)
        # The polling observer reports only after a write, and never reports a close.
        self.complete_on_change = complete_on_change

    def _emit(self, kind: Kind, path: str | bytes) -> None:
        text = os.fsdecode(path)
        if os.path.dirname(text) == self.staging:
            name = os.path.basename(text)
            if is_staging_name(name):
                self.out.put(Signal(kind, self.mdir, name))

    def dispatch(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileClosedEvent):
            self._emit(Kind.COMPLETE, event.src_path)
        elif isinstance(event, FileMovedEvent):
            # Into staging/ (from a temp name, or from elsewhere: then src_path is empty).
            # A staging file renamed away (an editor's backup) has a dest that is not one.
            self._emit(Kind.COMPLETE, event.dest_path)
        elif isinstance(event, FileCreatedEvent | FileModifiedEvent):
            self._emit(Kind.COMPLETE if self.complete_on_change else Kind.CHANGED, event.src_path)
        elif isinstance(event, DirDeletedEvent | DirMovedEvent) and (
            os.fsdecode(event.src_path) == self.staging
        ):
            self.out.put(Signal(Kind.DIR_CHANGED, self.mdir))


class MemoryDirHandler(FileSystemEventHandler):
    """The memory dir itself: the reconciler's lock, ``staging/`` and the dir coming and going."""

    def __init__(self, out: queue.SimpleQueue[Signal], mdir: str) -> None:
        self.out = out
        self.mdir = mdir

    def dispatch(self, event: FileSystemEvent) -> None:
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path)
        name = os.path.basename(src)
        if name == CANONICAL_LOCK and isinstance(event, FileDeletedEvent | FileMovedEvent):
            self.out.put(Signal(Kind.LOCK_RELEASED, self.mdir))
        elif (
            (
                name == STAGING
                and isinstance(event, DirCreatedEvent | DirDeletedEvent | DirMovedEvent)
            )
            or (isinstance(event, DirMovedEvent) and os.path.basename(dest) == STAGING)
            or (isinstance(event, DirDeletedEvent) and src == self.mdir)
        ):
            self.out.put(Signal(Kind.DIR_CHANGED, self.mdir))


class OverflowDetector(logging.Handler):
    """Turns watchdog's "queue overflowed" warning into an ``OVERFLOW`` signal."""

    def __init__(self, out: queue.SimpleQueue[Signal]) -> None:
        super().__init__(logging.WARNING)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self.out.put(Signal(Kind.OVERFLOW))


def fs_type(path: str) -> str:
    """The file-system type of the mount that holds ``path`` (from ``/proc/self/mounts``)."""
    best, kind = "", ""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


class Watcher:
    """Keeps one watch on each memory dir and one on its ``staging/`` when that exists."""

    def __init__(
        self, out: queue.SimpleQueue[Signal], mode: str, poll_interval: float = 1.0
    ) -> None:
        self.out = out
        self.mode = mode
        self.poll_interval = poll_interval
        self._observers: dict[str, BaseObserver] = {}
        self._watches: dict[str, list[tuple[str, str, ObservedWatch]]] = {}
        self._detector = OverflowDetector(out)
        logging.getLogger(_OVERFLOW_LOGGER).addHandler(self._detector)

    def kind_for(self, path: str) -> str:
        """``inotify`` or ``polling`` for a memory dir, resolving ``auto`` by its file system."""
        if self.mode != "auto":
            return self.mode
        return "polling" if fs_type(path) in NETWORK_FS else "inotify"

    def _observer(self, kind: str) -> BaseObserver:
        observer = self._observers.get(kind)
        if observer is None:
            observer = (
                PollingObserver(timeout=self.poll_interval)
                if kind == "polling"
                else InotifyObserver(generate_full_events=True)
            )
            observer.daemon = True
            observer.start()
            self._observers[kind] = observer
        return observer

    def watched(self, mdir: str) -> bool:
        return mdir in self._watches

    def staging_watched(self, mdir: str) -> bool:
        return any(role == "staging" for role, _, _ in self._watches.get(mdir, []))

    def watch(self, mdir: MemoryDir) -> str:
        """Watch a memory dir (and its ``staging/`` if present); returns the observer kind.

        Raises ``OSError`` when the memory dir cannot be watched (it vanished meanwhile, or the
        inotify watch limit is reached); a ``staging/`` that vanishes meanwhile is just not
        watched (its appearance will be reported by the memory dir's watch).
        """
        self.unwatch(mdir.path)
        kind = self.kind_for(mdir.path)
        observer = self._observer(kind)
        watches: list[tuple[str, str, ObservedWatch]] = []
        handler = MemoryDirHandler(self.out, mdir.path)
        watch = observer.schedule(handler, mdir.path, event_filter=_MEMORY_DIR_EVENTS)
        watches.append(("memory", kind, watch))
        self._watches[mdir.path] = watches
        staging = Path(mdir.staging)
        if staging.is_dir() and not staging.is_symlink():
            staging_handler = StagingHandler(
                self.out, mdir.path, complete_on_change=kind == "polling"
            )
            try:
                watch = observer.schedule(
                    staging_handler, mdir.staging, event_filter=_STAGING_EVENTS
                )
            except FileNotFoundError:
                return kind
            watches.append(("staging", kind, watch))
        return kind

    def unwatch(self, mdir: str) -> None:
        for _role, kind, watch in self._watches.pop(mdir, []):
            observer = self._observers.get(kind)
            if observer is None:
                continue
            try:
                observer.unschedule(watch)
            except (KeyError, OSError):
                continue  # already gone with its directory

    def alive(self) -> bool:
        """False when an observer thread died: the daemon must not go on blind."""
        return all(o.is_alive() for o in self._observers.values())

    def stop(self) -> None:
        """Stop every observer thread and wait for it (a few seconds at most)."""
        logging.getLogger(_OVERFLOW_LOGGER).removeHandler(self._detector)
        for observer in self._observers.values():
            observer.stop()
        for observer in self._observers.values():
            observer.join(timeout=5)
        self._observers.clear()
        self._watches.clear()
