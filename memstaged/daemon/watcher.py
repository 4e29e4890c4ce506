"""The thin watcher: one inotify instance for every watch, whose callbacks only enqueue signals.

Everything the daemon watches with inotify (each memory dir, its ``staging/``, and the parent
directories of the configured globs, see :mod:`memstaged.daemon.memory_dirs`) shares one inotify
descriptor and one reader thread: watchdog's :class:`~watchdog.observers.inotify_c.InotifyFD`.
Its callbacks run on that thread, so they decide nothing: they turn a raw inotify event into a
small :class:`Signal`, put it on a queue and return. watchdog's observer, which would add one
emitter thread per watched directory (two per memory dir: 2,000 memory dirs gave 4,003
threads), is used only for the polling fallback on network file systems.

Which events mean "complete" follows SPEC section 5: a close after writing and a rename into
``staging/`` say a write is complete; a bare create or modify may be the middle of one. A raw
``IN_MOVED_TO`` is a rename in, whether its source was in ``staging/`` (a temp name) or in
another directory, so no move pairing is needed.

inotify drops events when its queue overflows; watchdog then logs a warning once (and calls
every callback). The warning is caught here (a logging handler on watchdog's logger) and turned
into one ``OVERFLOW`` signal, so the daemon rescans at once instead of at the periodic rescan.

Each watch asks the kernel only for the events used here (its mask): memstaged's own reads of
every file would otherwise put an open and a close-without-write event per file on the same
inotify queue, and make an overflow during a burst twice as likely.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import os
import queue
import threading
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

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
from watchdog.observers.api import ObservedWatch
from watchdog.observers.inotify_c import (
    CallbackId,
    InotifyConstants,
    InotifyEvent,
    InotifyFD,
    Mask,
    WatchDescriptor,
)

from memstaged.files.locks import CANONICAL_LOCK
from memstaged.files.memdir import STAGING, MemoryDir, is_staging_name

if TYPE_CHECKING:  # imported when a network file system is polled (the daemon's RSS)
    from watchdog.observers.polling import PollingObserver

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
    TREE_CHANGED = "tree_changed"  # an entry of a glob's parent directory came or went
    OVERFLOW = "overflow"  # events were lost: rescan everything
    WAKE = "wake"  # a signal handler wants the loop to look at its flags


class Signal(NamedTuple):
    """One thing the daemon must look at: a file (``name``) or a whole memory dir.

    For ``TREE_CHANGED``, ``memory_dir`` is the watched parent directory and ``name`` the entry
    that came or went (empty: the watched directory itself went).
    """

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


# -- inotify: raw events, one descriptor --------------------------------------------------------

_IN = InotifyConstants
#: Every watch: directories only, never through a link, no events of already-unlinked files;
#: a directory watched through two paths (a bind mount, a linked literal prefix: one inotify
#: watch) keeps the events each path asked for (``IN_MASK_ADD``), not only the last path's.
_FLAGS: Final = _IN.IN_ONLYDIR | _IN.IN_DONT_FOLLOW | _IN.IN_EXCL_UNLINK | _IN.IN_MASK_ADD
_SELF: Final = _IN.IN_DELETE_SELF | _IN.IN_MOVE_SELF
#: What each role of a watch asks the kernel for (no opens, no reads, no attribute changes).
_MASKS: Final[dict[str, int]] = {
    "staging": _IN.IN_CLOSE_WRITE | _IN.IN_MOVED_TO | _IN.IN_CREATE | _IN.IN_MODIFY | _SELF,
    "memory": _IN.IN_DELETE | _IN.IN_MOVE | _IN.IN_CREATE | _SELF,
    "level": _IN.IN_DELETE | _IN.IN_MOVE | _IN.IN_CREATE | _SELF,
}
#: Each role of each watched path has a callback id of its own: a directory watched in two
#: roles, or through two paths (one inotify watch, whose events each path's
#: callback turns into its own signal), keeps one inotify watch and every callback.
_CALLBACK_IDS: Final = itertools.count(1)


def staging_signal(mdir: str, event: InotifyEvent) -> Signal | None:
    """The signal for a raw event of ``<mdir>/staging/`` (None: nothing to look at)."""
    mask = event.mask
    if mask & _SELF:
        return Signal(Kind.DIR_CHANGED, mdir)
    if mask & _IN.IN_ISDIR or not event.name:
        return None
    name = os.fsdecode(event.name)
    if not is_staging_name(name):
        return None
    if mask & (_IN.IN_CLOSE_WRITE | _IN.IN_MOVED_TO):
        return Signal(Kind.COMPLETE, mdir, name)
    if mask & (_IN.IN_CREATE | _IN.IN_MODIFY):
        return Signal(Kind.CHANGED, mdir, name)
    return None


def memory_dir_signal(mdir: str, event: InotifyEvent) -> Signal | None:
    """The signal for a raw event of the memory dir itself."""
    mask = event.mask
    if mask & _SELF:
        return Signal(Kind.DIR_CHANGED, mdir)
    name = os.fsdecode(event.name)
    if name == CANONICAL_LOCK and mask & (_IN.IN_DELETE | _IN.IN_MOVED_FROM):
        return Signal(Kind.LOCK_RELEASED, mdir)
    if name == STAGING and mask & _IN.IN_ISDIR:
        return Signal(Kind.DIR_CHANGED, mdir)
    return None


def level_signal(path: str, patterns: frozenset[str], event: InotifyEvent) -> Signal | None:
    """The signal for a raw event of a glob's parent directory: an entry that matches the next
    component of a pattern came or went (or the directory itself went)."""
    mask = event.mask
    if mask & _SELF:
        return Signal(Kind.TREE_CHANGED, path)
    if not mask & _IN.IN_ISDIR:
        return None  # the levels and the memory dir are directories
    name = os.fsdecode(event.name)
    if any(component_matches(name, pattern) for pattern in patterns):
        return Signal(Kind.TREE_CHANGED, path, name)
    return None


def component_matches(name: str, pattern: str) -> bool:
    """Whether ``name`` matches one path component of a glob, as :func:`glob.glob` reads it
    (a name starting with ``.`` matches only a pattern that does)."""
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


class _Callback:
    """One role of one watched directory: raw events in, at most one signal out."""

    def __init__(self, watcher: Watcher, role: str, path: str, mdir: str) -> None:
        self.watcher = watcher
        self.role = role
        self.path = path
        self.mdir = mdir
        self.patterns: frozenset[str] = frozenset()
        self.id = CallbackId(next(_CALLBACK_IDS))

    def on_event(self, event: InotifyEvent) -> None:
        if self.role == "staging":
            sig = staging_signal(self.mdir, event)
        elif self.role == "memory":
            sig = memory_dir_signal(self.mdir, event)
        else:
            sig = level_signal(self.path, self.patterns, event)
        if sig is not None:
            self.watcher.out.put(sig)

    def on_watch_deleted(self, wd: WatchDescriptor) -> None:
        self.watcher.forget_wd(wd)

    def on_queue_overflow(self) -> None:
        return None  # the one warning watchdog logs is turned into one OVERFLOW signal

    def on_events_lost(self) -> None:
        return None  # watchdog >= 7.1.1 calls it on every watch after an overflow: same signal


class _Inotify:
    """One watched directory on the shared inotify descriptor: its roles and their callbacks."""

    def __init__(self, wd: WatchDescriptor, mask: int, dir_id: tuple[int, int]) -> None:
        self.wd = wd
        self.mask = mask
        self.dir_id = dir_id
        self.callbacks: dict[str, _Callback] = {}


class Watcher:
    """Keeps one watch on each memory dir, one on its ``staging/`` when that exists, and one on
    each parent directory of a configured glob that :mod:`memstaged.daemon.memory_dirs` asks for.

    With inotify, every watch is on one shared descriptor read by one thread; with the polling
    observer (network file systems), watchdog polls each watched directory.
    """

    def __init__(
        self, out: queue.SimpleQueue[Signal], mode: str, poll_interval: float = 1.0
    ) -> None:
        self.out = out
        self.mode = mode
        self.poll_interval = poll_interval
        self._fd: InotifyFD | None = None
        self._polling: PollingObserver | None = None
        self._lock = threading.Lock()
        #: Watched directory path -> its inotify watch, and the paths of each watch descriptor.
        self._dirs: dict[str, _Inotify] = {}
        self._paths: dict[WatchDescriptor, set[str]] = {}
        self._polled: dict[str, list[ObservedWatch]] = {}
        self._detector = OverflowDetector(out)
        logging.getLogger(_OVERFLOW_LOGGER).addHandler(self._detector)

    def kind_for(self, path: str) -> str:
        """``inotify`` or ``polling`` for a memory dir, resolving ``auto`` by its file system."""
        if self.mode != "auto":
            return self.mode
        return "polling" if fs_type(path) in NETWORK_FS else "inotify"

    # -- the shared inotify descriptor -----------------------------------------------------------

    def _inotify(self) -> InotifyFD:
        if self._fd is None:
            self._fd = InotifyFD()
            self._fd.start()
        return self._fd

    def _add(self, role: str, path: str, mdir: str, *, renew: bool = False) -> _Callback:
        """Watch ``path`` in ``role`` (raises OSError: gone, not a directory, a link, limit).

        Idempotent: the same directory already watched in this role keeps its watch; a new
        directory at the same path (the old one was replaced) is watched anew.

        ``renew``: ask the kernel again in any case (a directory removed and made again may
        have the same inode number while its old watch is not yet known to be gone), and
        give up the old callback only once the new one is in place, so that no event of the
        directory falls between the two.
        """
        st = os.stat(path, follow_symlinks=False)
        dir_id = (st.st_dev, st.st_ino)
        with self._lock:
            current = self._dirs.get(path)
            existing = current.callbacks.get(role) if current is not None else None
            same = current is not None and existing is not None and current.dir_id == dir_id
            if same and existing is not None and not renew:
                return existing
            old_wd = current.wd if current is not None else None
        if existing is not None and not renew:
            self._remove(role, path)
            existing = None
        fd = self._inotify()
        callback = _Callback(self, role, path, mdir)
        with self._lock:
            current = self._dirs.get(path)
            mask = _MASKS[role] | (current.mask if current is not None else 0)
            wd = fd.add_callback(os.fsencode(path), Mask(mask | _FLAGS), callback, callback.id)
            if wd < 0:  # watchdog returns -1 instead of raising for EACCES
                # ... and keeps the callback on a watch of its own numbered -1: not one more
                # at each failed try.
                fd.remove_callbacks([(wd, callback.id)])
                raise PermissionError(13, "Permission denied", path)
            if current is None or current.wd != wd:
                current = _Inotify(wd, mask, dir_id)
                self._dirs[path] = current
                self._paths.setdefault(wd, set()).add(path)
            current.mask = mask
            current.dir_id = dir_id
            current.callbacks[role] = callback
        if existing is not None and old_wd is not None:
            try:
                fd.remove_callbacks([(old_wd, existing.id)])
            except OSError:
                return callback  # already gone with its directory
        return callback

    def _remove(self, role: str, path: str) -> None:
        with self._lock:
            current = self._dirs.get(path)
            callback = current.callbacks.pop(role, None) if current is not None else None
            if current is None or callback is None:
                return
            if not current.callbacks:
                del self._dirs[path]
                self._paths.get(current.wd, set()).discard(path)
            fd = self._fd
        if fd is not None:
            try:
                fd.remove_callbacks([(current.wd, callback.id)])
            except OSError:
                return  # already gone with its directory

    def forget_wd(self, wd: WatchDescriptor) -> None:
        """The kernel dropped a watch (its directory is gone): forget it (reader thread)."""
        with self._lock:
            for path in self._paths.pop(wd, ()):
                if path in self._dirs and self._dirs[path].wd == wd:
                    del self._dirs[path]

    def _has(self, role: str, path: str) -> bool:
        with self._lock:
            current = self._dirs.get(path)
            return current is not None and role in current.callbacks

    # -- memory dirs -----------------------------------------------------------------------------

    def watched(self, mdir: str) -> bool:
        return self._has("memory", mdir) or mdir in self._polled

    def staging_watched(self, mdir: str) -> bool:
        if mdir in self._polled:
            return len(self._polled[mdir]) > 1
        return self._has("staging", os.path.join(mdir, STAGING))

    def watch(self, mdir: MemoryDir) -> str:
        """Watch a memory dir (and its ``staging/`` if present); returns the observer kind.

        Raises ``OSError`` when the memory dir cannot be watched (it vanished meanwhile, or the
        inotify watch limit is reached) or its ``staging/`` cannot (no permission to read it);
        a ``staging/`` that vanishes meanwhile is just not watched (its appearance will be
        reported by the memory dir's watch).

        Watching anew adds each new watch before it gives up the old one (``renew``):
        removing the memory dir's watch first, even for a moment, lost the event of a
        ``staging/`` created meanwhile, and the daemon then waited for the periodic rescan to
        see it (a ``staging/`` made readable again).
        """
        kind = self.kind_for(mdir.path)
        if kind == "polling" or mdir.path in self._polled:
            self.unwatch(mdir.path)
        if kind == "polling":
            self._watch_polling(mdir)
            return kind
        self._add("memory", mdir.path, mdir.path, renew=True)
        staging = Path(mdir.staging)
        if not staging.is_dir() or staging.is_symlink():
            self._remove("staging", mdir.staging)
            return kind
        try:
            self._add("staging", mdir.staging, mdir.path, renew=True)
        except FileNotFoundError:
            self._remove("staging", mdir.staging)
        except OSError:
            self._remove("staging", mdir.staging)  # not the watch of a staging/ that went
            raise
        return kind

    def unwatch(self, mdir: str) -> None:
        self._remove("staging", os.path.join(mdir, STAGING))
        self._remove("memory", mdir)
        for watch in self._polled.pop(mdir, []):
            if self._polling is not None:
                try:
                    self._polling.unschedule(watch)
                except (KeyError, OSError):
                    continue  # already gone with its directory

    # -- the parent directories of the configured globs -------------------------------------------

    def watch_level(self, path: str, patterns: frozenset[str]) -> None:
        """Watch a glob's parent directory for entries matching ``patterns`` (raises OSError;
        a directory already watched keeps its watch and gets the new ``patterns``)."""
        callback = self._add("level", path, "")
        callback.patterns = patterns

    def unwatch_level(self, path: str) -> None:
        self._remove("level", path)

    # -- polling (network file systems) ----------------------------------------------------------

    def _watch_polling(self, mdir: MemoryDir) -> None:
        if self._polling is None:
            from watchdog.observers.polling import PollingObserver

            self._polling = PollingObserver(timeout=self.poll_interval)
            self._polling.daemon = True
            self._polling.start()
        watches = [
            self._polling.schedule(
                MemoryDirHandler(self.out, mdir.path), mdir.path, event_filter=_MEMORY_DIR_EVENTS
            )
        ]
        self._polled[mdir.path] = watches
        staging = Path(mdir.staging)
        if staging.is_dir() and not staging.is_symlink():
            handler = StagingHandler(self.out, mdir.path, complete_on_change=True)
            try:
                watches.append(
                    self._polling.schedule(handler, mdir.staging, event_filter=_STAGING_EVENTS)
                )
            except FileNotFoundError:
                return

    # -- lifecycle -------------------------------------------------------------------------------

    def alive(self) -> bool:
        """False when a watcher thread died: the daemon must not go on blind."""
        return all(t.is_alive() for t in (self._fd, self._polling) if t is not None)

    def stop(self) -> None:
        """Stop the reader and polling threads and wait for them (a few seconds at most)."""
        logging.getLogger(_OVERFLOW_LOGGER).removeHandler(self._detector)
        with self._lock:  # first: closing the descriptor reports every watch as deleted
            self._dirs.clear()
            self._paths.clear()
        threads = [t for t in (self._fd, self._polling) if t is not None]
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(timeout=5)
        self._fd = self._polling = None
        self._polled.clear()
