"""The thin watcher: watchdog observers whose handlers only turn events into :class:`Signal`\\ s.

Handlers run on watchdog's dispatch thread under its lock, so they decide nothing: they put a
small value on a queue and return. Which events mean "complete" follows SPEC section 5: a close
after writing and a rename into ``staging/`` say a write is complete; a bare create or modify may
be the middle of one.

inotify drops events when its queue overflows; watchdog then only logs a warning. That warning is
caught here (a logging handler on watchdog's logger) and turned into an ``OVERFLOW`` signal, so the
daemon rescans at once instead of waiting for the periodic rescan.
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
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch
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
_OVERFLOW_LOGGER: Final = "watchdog.observers.inotify_c"


class Kind(Enum):
    """What a signal tells the daemon."""

    COMPLETE = "complete"  # a write finished: decide now
    CHANGED = "changed"  # created or modified: decide once it settles (or on COMPLETE)
    LOCK_RELEASED = "lock_released"  # canonical-writer.lock went away
    DIR_CHANGED = "dir_changed"  # staging/ appeared or disappeared
    OVERFLOW = "overflow"  # events were lost: rescan everything
    WAKE = "wake"  # a signal handler wants the loop to look at its flags


class Signal(NamedTuple):
    kind: Kind
    memory_dir: str = ""
    name: str = ""


class _StagingHandler(FileSystemEventHandler):
    def __init__(self, out: queue.SimpleQueue[Signal], mdir: str, complete_on_change: bool) -> None:
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
            self._emit(Kind.COMPLETE, event.dest_path)
        elif isinstance(event, FileCreatedEvent | FileModifiedEvent):
            self._emit(Kind.COMPLETE if self.complete_on_change else Kind.CHANGED, event.src_path)
        elif isinstance(event, DirDeletedEvent | DirMovedEvent) and (
            os.fsdecode(event.src_path) == self.staging
        ):
            self.out.put(Signal(Kind.DIR_CHANGED, self.mdir))


class _MemoryDirHandler(FileSystemEventHandler):
    """Watches the memory dir itself: the reconciler's lock and ``staging/`` coming and going."""

    def __init__(self, out: queue.SimpleQueue[Signal], mdir: str) -> None:
        self.out = out
        self.mdir = mdir

    def dispatch(self, event: FileSystemEvent) -> None:
        name = os.path.basename(os.fsdecode(event.src_path))
        if name == CANONICAL_LOCK and isinstance(event, FileDeletedEvent | FileMovedEvent):
            self.out.put(Signal(Kind.LOCK_RELEASED, self.mdir))
        elif (
            name == STAGING and isinstance(event, DirCreatedEvent | DirDeletedEvent | DirMovedEvent)
        ) or (
            isinstance(event, DirMovedEvent)
            and os.path.basename(os.fsdecode(event.dest_path)) == STAGING
        ):
            self.out.put(Signal(Kind.DIR_CHANGED, self.mdir))


class _OverflowDetector(logging.Handler):
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

    def __init__(self, out: queue.SimpleQueue[Signal], mode: str, poll_interval: float = 1.0):
        self.out = out
        self.mode = mode
        self.poll_interval = poll_interval
        self._observers: dict[str, BaseObserver] = {}
        self._watches: dict[str, list[tuple[str, ObservedWatch]]] = {}
        self._detector = _OverflowDetector(out)
        logging.getLogger(_OVERFLOW_LOGGER).addHandler(self._detector)

    def _kind_for(self, path: str) -> str:
        if self.mode != "auto":
            return self.mode
        return "polling" if fs_type(path) in NETWORK_FS else "inotify"

    def _observer(self, kind: str) -> BaseObserver:
        observer = self._observers.get(kind)
        if observer is None:
            observer = (
                PollingObserver(timeout=self.poll_interval) if kind == "polling" else Observer()
            )
            observer.daemon = True
            observer.start()
            self._observers[kind] = observer
        return observer

    def watched(self, mdir: str) -> bool:
        return mdir in self._watches

    def staging_watched(self, mdir: str) -> bool:
        return any(role == "staging" for role, _ in self._watches.get(mdir, []))

    def watch(self, mdir: MemoryDir) -> str:
        """Watch a memory dir (and its ``staging/`` if present); returns the observer kind."""
        self.unwatch(mdir.path)
        kind = self._kind_for(mdir.path)
        observer = self._observer(kind)
        watches: list[tuple[str, ObservedWatch]] = []
        watches.append(
            ("memory", observer.schedule(_MemoryDirHandler(self.out, mdir.path), mdir.path))
        )
        if Path(mdir.staging).is_dir() and not Path(mdir.staging).is_symlink():
            handler = _StagingHandler(self.out, mdir.path, complete_on_change=kind == "polling")
            watches.append(("staging", observer.schedule(handler, mdir.staging)))
        self._watches[mdir.path] = watches
        return kind

    def unwatch(self, mdir: str) -> None:
        for _role, watch in self._watches.pop(mdir, []):
            for observer in self._observers.values():
                try:
                    observer.unschedule(watch)
                except (KeyError, OSError):
                    continue  # scheduled on the other observer, or already gone with its dir
                break

    def alive(self) -> bool:
        """False when an observer thread died: the daemon must not go on blind."""
        return all(o.is_alive() for o in self._observers.values())

    def stop(self) -> None:
        logging.getLogger(_OVERFLOW_LOGGER).removeHandler(self._detector)
        for observer in self._observers.values():
            observer.stop()
        for observer in self._observers.values():
            observer.join(timeout=5)
        self._observers.clear()
        self._watches.clear()
