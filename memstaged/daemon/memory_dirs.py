"""Which memory dirs the daemon works on: each one locked, watched, and dropped when it goes.

:class:`MemoryDirs` holds, for every memory dir the daemon works on, its instance lock (one
descriptor, SPEC 5 and 6), its watches, and the identity of its directory (a memory dir replaced
by a new directory is dropped and added again). It knows nothing of the files in a memory dir:
what is done with them when a dir is added or dropped is the :class:`Owner`'s (the daemon's).

New projects are seen at once: for a configured glob such as
``~/src/*/.pi/memory/project``, the directories on the way to its memory dirs are watched, and
only while they exist and match: ``~/src`` (the glob's literal prefix), each ``~/src/X``, each
``X/.pi`` and each ``X/.pi/memory``. An entry appearing or going in one of them that matches the
glob's next component (a ``TREE_CHANGED`` signal) gets its own watch, or loses it with
everything below, and the globs are expanded again, so a memory dir created by ``mkdir -p`` or
by ``git clone`` is added (locked, watched, scanned) within the time of one event. A directory
that appeared with a subtree already in it (``mkdir -p``, a clone) is listed once its watch is
in place, so nothing created before the watch is missed. The periodic rescan still expands the
globs and walks the levels again (a parent directory that did not exist yet, a watch limit hit).
"""

from __future__ import annotations

import glob
import os
import queue
import resource
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol

from memstaged.config import Settings, link_on_the_way
from memstaged.core.foreign import normalize
from memstaged.daemon.watcher import Signal, component_matches
from memstaged.errors import BusyError, ConfigError, WaitStopped
from memstaged.files.locks import Holder, InstanceLock, flock_holders, instance_holder
from memstaged.files.memdir import STAGING, MemoryDir


class WatcherLike(Protocol):
    """What the daemon needs of :class:`memstaged.daemon.watcher.Watcher` (tests pass a fake)."""

    def watch(self, mdir: MemoryDir) -> str: ...
    def unwatch(self, mdir: str) -> None: ...
    def staging_watched(self, mdir: str) -> bool: ...
    def watch_level(self, path: str, patterns: frozenset[str]) -> None: ...
    def unwatch_level(self, path: str) -> None: ...
    def alive(self) -> bool: ...
    def stop(self) -> None: ...


WatcherFactory = Callable[["queue.SimpleQueue[Signal]", str], WatcherLike]


class Owner(Protocol):
    """What happens to a memory dir's files when it is added or dropped (the daemon)."""

    def prepare(self, mdir: MemoryDir) -> None:
        """Locked, not yet watched: clean up after a crash."""

    def added(self, mdir: MemoryDir) -> None:
        """Locked and watched: scan it."""

    def dropped(self, path: str) -> None:
        """Still locked, no longer watched: save and forget what is known of its files."""


#: ``--wait``: called between two tries of a busy lock; waits a little (feeding the systemd
#: watchdog meanwhile) and says whether to give up (SIGTERM arrived).
Waiting = Callable[[], bool]


#: Descriptors kept free for everything but the instance locks: a memory dir whose lock would
#: eat into them is not added, so the dirs already held are still decided.
#: Counted (docs/daemon.md): 7 always open (stdin, stdout, stderr, the decision log, the inotify
#: descriptor and watchdog's two wake-up pipe ends), and at most 6 more while one file is decided
#: (memory dir, staging/, the version in hand, deadletter/, originals/, a temp file or the
#: reconciler's lock); measured with every kind of decision, rescans, log rotation and a
#: reload: 16 suffice and 12 do not. 24 leaves room for journald's socket, a lazy import and
#: the control socket's six at most (its socket, an eventfd, four clients), and lets 1,000
#: memory dirs fit under a hard limit of 1,024 (SPEC 6).
FD_RESERVE: Final = 24


def daemons_holding_all(settings: Settings) -> list[Holder]:
    """The memstaged daemons whose instance locks hold every configured memory dir, each once,
    in the order of the memory dirs; empty when none is configured (yet), or one is free or
    held by anything else (a ``--once`` run, which ends soon; a process that is not memstaged):
    a daemon started then works on what it can, and retries the others on each rescan.

    Read from ``/proc/locks`` (:func:`flock_holders`, once): nothing is locked or created, so
    a daemon refused for this has touched nothing, not even the shared metrics file.
    """
    holders: dict[int, Holder] = {}
    table = flock_holders()
    for mdir in settings.memory_dirs():
        holder = instance_holder(settings.state_dir, mdir, table)
        if holder is None or holder.role != "daemon":
            return []
        holders.setdefault(holder.pid, holder)
    return list(holders.values())


class Glob(NamedTuple):
    """A configured memory-dir pattern, split for watching: the directory ``root`` (its literal
    prefix), then the path components below it; the last one names the memory dirs."""

    root: str
    parts: tuple[str, ...]


def split_glob(pattern: str) -> Glob:
    """``~/src/*/.pi/memory/project`` -> ``Glob("/home/u/src", ("*", ".pi", "memory",
    "project"))``; a pattern without magic is watched from its memory dir's parent."""
    absolute = normalize(os.path.abspath(os.path.expanduser(pattern)))
    components = [c for c in absolute.split("/") if c]
    first = next((i for i, c in enumerate(components) if glob.has_magic(c)), None)
    cut = len(components) - 1 if first is None else first
    return Glob("/" + "/".join(components[:cut]), tuple(components[cut:]))


class MemoryDirs:
    """The memory dirs held: lock, watches, directory identity."""

    def __init__(
        self,
        owner: Owner,
        logger: Any,
        out: queue.SimpleQueue[Signal],
        watcher_factory: WatcherFactory,
        observer: str,
        state_dir: Path | None,
    ) -> None:
        self.owner = owner
        #: Where the instance locks are kept (:class:`~memstaged.files.locks.InstanceLock`).
        self.state_dir = state_dir
        self.log = logger
        self.out = out
        self.watcher_factory = watcher_factory
        self.watcher = watcher_factory(out, observer)
        self.mdirs: dict[str, MemoryDir] = {}
        self.locks: dict[str, InstanceLock] = {}
        #: (st_dev, st_ino) of each memory dir when it was added: a replaced one is re-added.
        self.dir_ids: dict[str, tuple[int, int]] = {}
        #: The path each held directory is worked on as: a second path to it is not added
        #:, and the path it was skipped for, so that it is said once.
        self.held_ids: dict[tuple[int, int], str] = {}
        self.aliases_said: dict[str, str] = {}
        self.busy_logged: set[str] = set()
        #: Memory dirs that could not be opened (a link, permissions), logged once each.
        self.unopened_logged: set[str] = set()
        self.globs: list[Glob] = []
        #: Each watched parent directory of a glob: (glob index, depth) of every use of it,
        #: depth being how many of the glob's components below its root lead there.
        self.levels: dict[str, set[tuple[int, int]]] = {}
        #: Set when a watched parent directory changed: the globs are to be expanded again.
        self.tree_changed_since_sync = False
        #: Memory dirs not added for want of descriptors (logged once each).
        self.over_limit: set[str] = set()

    def __contains__(self, path: str) -> bool:
        return path in self.mdirs

    def __len__(self) -> int:
        return len(self.mdirs)

    def _lock(
        self, mdir: MemoryDir, *, strict: bool, waiting: Waiting | None
    ) -> InstanceLock | None:
        """The instance lock of ``mdir``, or None when another memstaged has it (and we go on).

        ``--wait`` polls (rather than blocking in ``flock``) so that SIGTERM still stops us and
        the systemd watchdog is still fed while we wait.
        """
        # no link followed below the anchor
        lock = InstanceLock(mdir.path, mdir.open, state_dir=self.state_dir)
        waiting_logged = False
        while True:
            try:
                lock.acquire(wait=False)
            except BusyError as err:
                if waiting is not None:  # --wait at start, a glob's matches too
                    if not waiting_logged:
                        self.log.info("memory_dir_busy", memory_dir=mdir.path, action="waiting")
                        waiting_logged = True
                    if waiting():
                        raise WaitStopped(str(err)) from None
                    continue
                if strict:
                    raise
                if mdir.path not in self.busy_logged:
                    self.busy_logged.add(mdir.path)
                    self.log.warning(
                        "memory_dir_busy", memory_dir=mdir.path, action="retried on each rescan"
                    )
                return None
            except OSError as err:
                if strict:
                    raise ConfigError(f"memory dir {mdir.path}: {err.strerror}") from None
                self._unopened(mdir, err)
                return None
            self.unopened_logged.discard(mdir.path)
            return lock

    def _unopened(self, mdir: MemoryDir, err: OSError) -> None:
        """A glob match that cannot be opened is reported once (not at every rescan) and the
        others are worked on; a symbolic link below the literal prefix is not followed (SPEC
        6, defect 8). It is tried again at each rescan: the link may become a directory."""
        if mdir.path in self.unopened_logged:
            return
        self.unopened_logged.add(mdir.path)
        link = link_on_the_way(mdir)
        if link is not None:
            self.log.warning(
                "memory_dir_skipped",
                memory_dir=mdir.path,
                link=link,
                reason="a symbolic link below the configured path: not followed (SPEC 6)",
                action="looked at again on each rescan",
            )
            return
        self.log.error(
            "memory_dir_error",
            memory_dir=mdir.path,
            error=str(err),
            action="not watched; retried on each rescan",
        )

    def _held_as_another(self, mdir: MemoryDir) -> bool:
        """Whether the directory of ``mdir`` is already worked on through another path (a bind
        mount, a linked literal prefix): it is then not added, and that is said once.

        The path it was added by keeps it, with its project root, for as long
        as it is held; in one expansion of the globs that is the first path in the order of
        configuration (:meth:`sync` adds in that order). Its ``flock`` would only say "busy".
        """
        dir_id = mdir.identity()
        first = self.held_ids.get(dir_id) if dir_id is not None else None
        if first is not None and _dir_id(first) != dir_id:
            first = None  # the held one went, and its inode number was given to a new directory
        if first is None:
            self.aliases_said.pop(mdir.path, None)
            return False
        if self.aliases_said.get(mdir.path) != first:
            self.aliases_said[mdir.path] = first
            self.log.warning(
                "memory_dir_skipped",
                memory_dir=mdir.path,
                same_as=first,
                reason=f"same directory as {first}",
                action="not watched; looked at again on each rescan",
            )
        return True

    def _room_for_one_more(self, mdir: MemoryDir, *, strict: bool) -> bool:
        """Whether one more instance lock leaves :data:`FD_RESERVE` descriptors free."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or len(self.locks) + FD_RESERVE < soft:
            self.over_limit.discard(mdir.path)
            return True
        error = (
            f"descriptor limit {soft} reached with {len(self.locks)} memory dirs held "
            "(raise LimitNOFILE= of the unit)"
        )
        if strict:
            raise ConfigError(f"memory dir {mdir.path}: {error}")
        if mdir.path not in self.over_limit:
            self.over_limit.add(mdir.path)
            self.log.error(
                "memory_dir_error",
                memory_dir=mdir.path,
                error=error,
                action="not watched; retried on each rescan",
            )
        return False

    def add(self, mdir: MemoryDir, *, strict: bool = False, waiting: Waiting | None = None) -> bool:
        """Start working on a memory dir: lock, clean up after a crash, watch, scan."""
        if mdir.path in self.mdirs or not Path(mdir.path).is_dir():
            return False
        if self._held_as_another(mdir):
            return False
        if not self._room_for_one_more(mdir, strict=strict):
            return False
        lock = self._lock(mdir, strict=strict, waiting=waiting)
        if lock is None:
            return False
        dir_id = _dir_id(mdir.path)
        if dir_id is None:
            lock.release()
            return False
        self.busy_logged.discard(mdir.path)
        self.locks[mdir.path] = lock
        self.mdirs[mdir.path] = mdir
        self.dir_ids[mdir.path] = dir_id
        self.held_ids[dir_id] = mdir.path
        self.owner.prepare(mdir)
        observer = self.watch(mdir)
        self.log.info(
            "memory_dir_added",
            memory_dir=mdir.path,
            observer=observer,
            project_root=mdir.project_root,
        )
        said = mdir.physical_root_said()
        if said is not None:  # SPEC 2.4: once, when the memory dir is added
            self.log.info("project_root_physical", **said)
        self.owner.added(mdir)
        return True

    def watch(self, mdir: MemoryDir) -> str:
        """Watch a memory dir (anew); a failure is logged once, and rescans cover for it."""
        try:
            return self.watcher.watch(mdir)
        except OSError as err:
            self.log.error(
                "watch_failed",
                memory_dir=mdir.path,
                error=str(err),
                action="relying on rescans for this memory dir",
            )
            return "none (rescans only)"

    def drop(self, path: str, why: str) -> None:
        """Stop working on a memory dir; its queued files are forgotten quietly."""
        if path not in self.mdirs:
            return
        self.watcher.unwatch(path)
        self.owner.dropped(path)  # while the lock is held: a --once may take over at once
        lock = self.locks.pop(path, None)
        if lock is not None:
            lock.release()
        self.mdirs.pop(path, None)
        dir_id = self.dir_ids.pop(path, None)
        if dir_id is not None and self.held_ids.get(dir_id) == path:
            del self.held_ids[dir_id]
        self.log.info("memory_dir_removed", memory_dir=path, why=why)

    def sync(self, wanted_dirs: list[MemoryDir]) -> None:
        """Make the memory dirs held those configured: add new ones, drop vanished ones."""
        wanted = {m.path: m for m in wanted_dirs}
        for path in [p for p in self.aliases_said if p not in wanted]:
            del self.aliases_said[path]
        for path in list(self.mdirs):
            if path not in wanted:
                self.drop(path, "no longer configured")
            elif not self.still_there(path):
                continue
            elif wanted[path] != self.mdirs[path]:
                self.drop(path, "project root changed")
        for mdir in wanted.values():
            self.add(mdir)

    def still_there(self, path: str) -> bool:
        """Drop a memory dir that is gone; re-add one that was replaced (new watches, lock)."""
        current = _dir_id(path)
        if current is None:
            self.drop(path, "memory dir no longer exists")
            return False
        if current != self.dir_ids.get(path):
            mdir = self.mdirs[path]
            self.drop(path, "memory dir was replaced by a new directory")
            self.add(mdir)
            return False
        return True

    def new_watcher(self, mode: str) -> None:
        """Stop the watcher and watch every memory dir (and glob level) anew with one of kind
        ``mode``."""
        self.watcher.stop()
        self.watcher = self.watcher_factory(self.out, mode)
        for mdir in list(self.mdirs.values()):
            self.watch(mdir)
        levels, self.levels = self.levels, {}
        if mode != "polling":
            for path, uses in levels.items():
                for index, depth in uses:
                    self._watch_level(path, index, depth, walk=False)

    # -- the parent directories of the globs ------------------------------------------------------

    def watch_globs(self, patterns: tuple[str, ...], *, observer: str) -> None:
        """Watch the parent directories of ``patterns`` (replacing those of earlier ones).

        With ``observer = "polling"`` (network file systems) nothing is watched: new projects
        are then found by the periodic rescan.
        """
        for path in list(self.levels):
            self.watcher.unwatch_level(path)
        self.levels = {}
        self.globs = [] if observer == "polling" else [split_glob(p) for p in patterns]
        self.refresh_levels()

    def refresh_levels(self) -> None:
        """Walk every glob from its root again, watching what is missing (at each rescan)."""
        for index, pattern in enumerate(self.globs):
            self._watch_level(pattern.root, index, 0, walk=True)

    def _watch_level(self, path: str, index: int, depth: int, *, walk: bool) -> None:
        """Watch ``path`` as the directory reached by ``depth`` components of glob ``index``,
        then (``walk``) the matching directories already in it, down to the memory dirs'
        parent."""
        pattern = self.globs[index]
        uses = self.levels.setdefault(path, set())
        uses.add((index, depth))
        wanted = frozenset(self._next_component(i, d) for i, d in uses)
        try:
            self.watcher.watch_level(path, wanted)
        except OSError:
            # Not there (yet), not a directory, a link, or no watch left: rescans cover it.
            self._unwatch_below(path, including=True)
            return
        if not walk or depth >= len(pattern.parts):
            return  # a memory dir (or one to be): watched for its staging/, not walked
        try:
            names = os.listdir(path)
        except OSError:
            return
        for name in names:
            if component_matches(name, pattern.parts[depth]):
                child = os.path.join(path, name)
                if os.path.isdir(child):
                    self._watch_level(child, index, depth + 1, walk=True)

    def _next_component(self, index: int, depth: int) -> str:
        """The entry that matters in a directory reached by ``depth`` components of glob
        ``index``: the glob's next component, or ``staging`` in the memory dir itself.

        The memory dirs' own directories are watched too, with or without ``staging/`` (defect
        9): one made by ``mkdir -p`` may be looked at by the glob's expansion before its
        ``staging/`` exists (then it is not a memory dir yet, and is not added), and nothing
        else would signal the ``staging/`` made a moment later. A held memory dir already has
        a watch (:meth:`watch`): this adds a role to it, not a second inotify watch.
        """
        parts = self.globs[index].parts
        return parts[depth] if depth < len(parts) else STAGING

    def _unwatch_below(self, path: str, *, including: bool) -> None:
        prefix = path.rstrip("/") + "/"
        for level in [p for p in self.levels if p.startswith(prefix) or (including and p == path)]:
            self.watcher.unwatch_level(level)
            del self.levels[level]

    def tree_changed(self, path: str, name: str) -> None:
        """An entry of a watched parent directory came or went (``name`` empty: the directory
        itself went): watch what appeared, unwatch what went; the globs are expanded again at
        the end of the batch of signals (:attr:`tree_changed_since_sync`)."""
        self.tree_changed_since_sync = True
        if not name:
            if not os.path.isdir(path):
                self._unwatch_below(path, including=True)
            return
        child = os.path.join(path, os.fsdecode(name))
        for index, depth in list(self.levels.get(path, ())):
            parts = self.globs[index].parts
            if depth < len(parts) and component_matches(name, parts[depth]):
                if os.path.isdir(child):
                    self._watch_level(child, index, depth + 1, walk=True)
                else:
                    self._unwatch_below(child, including=True)

    def release_all(self) -> None:
        """Release every instance lock (at stop; the memory dirs are no longer worked on)."""
        for lock in self.locks.values():
            lock.release()
        self.locks.clear()


def _dir_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a directory, or None when it is not (or no longer) one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
