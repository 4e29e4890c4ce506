"""``memstaged`` without ``--once``: watch every memory dir and decide files as they arrive.

One thread does all the work (this module's loop); watchdog's threads only enqueue signals. The
loop collapses signals per file into one due time, decides due files through the same
:meth:`Pipeline.process` as ``--once``, and between files pings the systemd watchdog, rescans, and
reacts to SIGHUP/SIGTERM flags. Missed events are expected: a start-up scan before ``READY=1``, a
rescan after an inotify overflow, and a periodic rescan that reads only files whose identity
changed since they were decided.
"""

from __future__ import annotations

import heapq
import os
import queue
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from memstaged.config import Settings, check_memory_dir
from memstaged.errors import BusyError, ConfigError, MemstagedError
from memstaged.fsio import Identity
from memstaged.locks import InstanceLock, read_lock
from memstaged.pipeline import MemoryDir, Outcome, Pipeline, list_staging
from memstaged.service import Notifier
from memstaged.triage import Decision
from memstaged.watcher import Kind, Signal, Watcher

Key = tuple[str, str]  # (memory dir, file name)

#: How often a memory dir blocked by a lock whose holder may die silently is looked at again.
LOCK_POLL: Final = 5.0
#: Longest back-off for a file that keeps failing with an I/O error.
MAX_BACKOFF: Final = 60.0
STATUS_EVERY: Final = 1.0
_FINAL: Final = frozenset(
    {Decision.VALID, Decision.FOREIGN, Decision.SKIPPED, Decision.REPAIRED, Decision.QUARANTINED}
)


class Daemon:
    """The work loop. Tests drive it with :meth:`handle` and :meth:`work` and a fake clock."""

    def __init__(
        self,
        settings: Settings,
        logger: Any,
        *,
        reload_settings: Callable[[], Settings] | None = None,
        notifier: Notifier | None = None,
        watcher: Watcher | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: bool = False,
    ) -> None:
        self.settings = settings
        self.log = logger
        self.reload_settings = reload_settings
        self.notifier = notifier or Notifier()
        self.queue: queue.SimpleQueue[Signal] = queue.SimpleQueue()
        self.watcher = watcher or Watcher(self.queue, settings.observer)
        self.clock = clock
        self.wait = wait
        self.pipeline = Pipeline(settings.options, logger)
        self.mdirs: dict[str, MemoryDir] = {}
        self.instance_locks: dict[str, InstanceLock] = {}
        self.pending: dict[Key, float] = {}
        self._heap: list[tuple[float, Key]] = []
        self.identities: dict[Key, Identity] = {}
        self.failures: Counter[Key] = Counter()
        #: Memory dirs whose files wait for the reconciler's lock, and those files.
        self.lock_waiting: dict[str, set[str]] = {}
        self.counts: Counter[str] = Counter()
        self.stopping = False
        self.reload_requested = False
        now = clock()
        self.next_rescan = now + settings.rescan_interval
        self.next_lock_poll = now + LOCK_POLL
        self.next_ping = now
        self.next_status = now
        self.busy_logged: set[str] = set()

    # -- memory dirs ----------------------------------------------------------------------------

    def start(self) -> None:
        """Lock, clean up, watch and scan every memory dir; raises for a bad explicit one."""
        mdirs = self.settings.memory_dirs()
        if self.settings.explicit_dirs:
            for mdir in mdirs:
                check_memory_dir(mdir, writable=not self.settings.options.dry_run)
        if not mdirs and not self.settings.memory_dir_patterns:
            raise ConfigError(
                "no memory dir: pass --memory-dir DIR or set memory_dirs in the config file"
            )
        for mdir in mdirs:
            self.add(mdir, strict=self.settings.explicit_dirs)
        self.log.info(
            "start",
            pid=os.getpid(),
            memory_dirs=sorted(self.mdirs),
            patterns=list(self.settings.memory_dir_patterns),
            config=self.settings.config_path,
        )

    def add(self, mdir: MemoryDir, *, strict: bool = False) -> bool:
        if mdir.path in self.mdirs or not Path(mdir.path).is_dir():
            return False
        lock = InstanceLock(mdir.path)
        try:
            lock.acquire(wait=self.wait)
        except BusyError:
            if strict:
                raise
            if mdir.path not in self.busy_logged:
                self.busy_logged.add(mdir.path)
                self.log.warning("memory_dir_busy", memory_dir=mdir.path)
            return False
        except OSError as err:
            if strict:
                raise ConfigError(f"memory dir {mdir.path}: {err.strerror}") from None
            self.log.error("memory_dir_error", memory_dir=mdir.path, error=str(err))
            return False
        self.busy_logged.discard(mdir.path)
        self.instance_locks[mdir.path] = lock
        self.mdirs[mdir.path] = mdir
        if not self.settings.options.dry_run:
            self.pipeline.recover_temps(mdir)
        try:
            observer = self.watcher.watch(mdir)
        except OSError as err:
            self.log.error("watch_failed", memory_dir=mdir.path, error=str(err))
            observer = "none (rescans only)"
        self.log.info(
            "memory_dir_added",
            memory_dir=mdir.path,
            observer=observer,
            project_root=mdir.project_root,
        )
        self.rescan(mdir)
        return True

    def drop(self, path: str, why: str) -> None:
        self.watcher.unwatch(path)
        lock = self.instance_locks.pop(path, None)
        if lock is not None:
            lock.release()
        self.mdirs.pop(path, None)
        self.lock_waiting.pop(path, None)
        for key in [k for k in self.identities if k[0] == path]:
            del self.identities[key]
        self.log.info("memory_dir_removed", memory_dir=path, why=why)

    def sync_memory_dirs(self) -> None:
        """Re-expand the configured globs: add new memory dirs, drop vanished ones."""
        wanted = {m.path: m for m in self.settings.memory_dirs()}
        for path in list(self.mdirs):
            if path not in wanted:
                self.drop(path, "no longer configured")
            elif not Path(path).is_dir():
                self.drop(path, "memory dir no longer exists")
            elif wanted[path] != self.mdirs[path]:
                self.drop(path, "project root changed")
        for mdir in wanted.values():
            self.add(mdir)

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(self, key: Key, due: float) -> None:
        current = self.pending.get(key)
        if current is not None and current <= due:
            return
        self.pending[key] = due
        heapq.heappush(self._heap, (due, key))

    def next_due(self) -> float | None:
        while self._heap:
            due, key = self._heap[0]
            if self.pending.get(key) == due:
                return due
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now: float) -> Key | None:
        due = self.next_due()
        if due is None or due > now:
            return None
        _, key = heapq.heappop(self._heap)
        del self.pending[key]
        return key

    def handle(self, sig: Signal) -> None:
        """React to one signal from the watcher (or a signal handler)."""
        now = self.clock()
        if sig.kind is Kind.COMPLETE:
            self.schedule((sig.memory_dir, sig.name), now)
        elif sig.kind is Kind.CHANGED:
            self.schedule((sig.memory_dir, sig.name), now + self.settings.options.settle)
        elif sig.kind is Kind.LOCK_RELEASED:
            self.release_waiting(sig.memory_dir)
        elif sig.kind is Kind.DIR_CHANGED:
            mdir = self.mdirs.get(sig.memory_dir)
            if mdir is not None:
                staging_ok = Path(mdir.staging).is_dir()
                if staging_ok != self.watcher.staging_watched(mdir.path):
                    self.watcher.watch(mdir)
                    self.log.info("staging_changed", memory_dir=mdir.path, exists=staging_ok)
                if staging_ok:
                    self.rescan(mdir)
        elif sig.kind is Kind.OVERFLOW:
            self.log.warning("overflow_recovered", action="rescanning every memory dir")
            for mdir in list(self.mdirs.values()):
                self.rescan(mdir)

    def release_waiting(self, path: str) -> None:
        names = self.lock_waiting.pop(path, None)
        if names:
            now = self.clock()
            for name in names:
                self.schedule((path, name), now)

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a signal, then take every signal already queued."""
        try:
            sig = (
                self.queue.get(timeout=max(timeout, 0.0))
                if timeout > 0
                else self.queue.get_nowait()
            )
        except queue.Empty:
            return
        while True:
            if sig.kind is not Kind.WAKE:
                self.handle(sig)
            try:
                sig = self.queue.get_nowait()
            except queue.Empty:
                return

    # -- work -----------------------------------------------------------------------------------

    def rescan(self, mdir: MemoryDir) -> int:
        """Schedule every file whose identity changed since it was decided; returns how many."""
        now = self.clock()
        seen: set[str] = set()
        scheduled = 0
        waiting = self.lock_waiting.get(mdir.path)
        for name in list_staging(mdir):
            seen.add(name)
            key = (mdir.path, name)
            try:
                st = os.stat(os.path.join(mdir.staging, name), follow_symlinks=False)
            except OSError:
                continue
            if self.identities.get(key) != Identity.of(st) and key not in self.pending:
                if waiting is not None:
                    waiting.add(name)
                else:
                    self.schedule(key, now)
                    scheduled += 1
        for key in [k for k in self.identities if k[0] == mdir.path and k[1] not in seen]:
            del self.identities[key]
        return scheduled

    def process(self, key: Key) -> Outcome | None:
        mdir = self.mdirs.get(key[0])
        if mdir is None:
            return None  # its memory dir was dropped
        if key[0] in self.lock_waiting:
            self.lock_waiting[key[0]].add(key[1])
            return None
        if not Path(mdir.path).is_dir():
            self.drop(mdir.path, "memory dir no longer exists")
            return None
        outcome = self.pipeline.process(mdir, key[1])
        self.counts[outcome.decision.value] += 1
        now = self.clock()
        if outcome.changed:
            self.schedule(key, now)
        elif outcome.blocked_by_lock:
            self.lock_waiting.setdefault(key[0], set()).add(key[1])
        elif outcome.decision is Decision.DEFERRED:
            self.failures[key] += 1
            backoff = min(0.25 * 2 ** self.failures[key], MAX_BACKOFF)
            delay = backoff if outcome.retry_at is None else max(outcome.retry_at - time.time(), 0)
            self.schedule(key, now + max(delay, 0.05))
        elif outcome.decision in _FINAL:
            self.failures.pop(key, None)
            if outcome.identity is not None:
                self.identities[key] = outcome.identity
        return outcome

    def work(self, limit: int | None = None) -> int:
        """Decide due files, keeping the watchdog fed; stops early on a stop or reload request."""
        done = 0
        while not self.stopping and not self.reload_requested:
            if limit is not None and done >= limit:
                break
            key = self.pop_due(self.clock())
            if key is None:
                break
            self.process(key)
            done += 1
            if done % 64 == 0:
                self.drain(0)  # collapse new signals in a long backlog
            self.maintain(quick=True)
        return done

    def maintain(self, *, quick: bool = False) -> None:
        """Watchdog pings, status, and (unless ``quick``) rescans and lock polls when due."""
        now = self.clock()
        interval = self.notifier.watchdog_interval
        if interval is not None and now >= self.next_ping:
            self.notifier.ping()
            self.next_ping = now + interval
        if now >= self.next_status:
            self.notifier.status(self.status_text())
            self.next_status = now + STATUS_EVERY
        if quick:
            return
        if not self.watcher.alive():
            self.log.error("observer_died", action="restarting the watches and rescanning")
            self.watcher.stop()
            self.watcher = Watcher(self.queue, self.settings.observer)
            for mdir in list(self.mdirs.values()):
                self.watcher.watch(mdir)
                self.rescan(mdir)
        if now >= self.next_rescan:
            self.next_rescan = now + self.settings.rescan_interval
            self.sync_memory_dirs()
            total = sum(self.rescan(m) for m in list(self.mdirs.values()))
            self.log.info("rescan", memory_dirs=len(self.mdirs), scheduled=total)
        if self.lock_waiting and now >= self.next_lock_poll:
            self.next_lock_poll = now + LOCK_POLL
            for path in list(self.lock_waiting):
                self._poll_lock(path)

    def _poll_lock(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            self.release_waiting(path)
            return
        try:
            info = read_lock(fd)
        finally:
            os.close(fd)
        if info is None or not info.alive:
            self.release_waiting(path)

    def status_text(self) -> str:
        c = self.counts
        decided = sum(v for k, v in c.items() if k != Decision.DEFERRED.value)
        return (
            f"watching {len(self.mdirs)} memory dirs; {decided} decided, "
            f"{c[Decision.QUARANTINED.value]} quarantined, {c[Decision.REPAIRED.value]} repaired, "
            f"{len(self.pending) + sum(len(v) for v in self.lock_waiting.values())} waiting"
        )

    def timeout(self) -> float:
        now = self.clock()
        deadlines = [self.next_rescan, self.next_status if self.pending else self.next_rescan]
        if self.notifier.watchdog_interval is not None:
            deadlines.append(self.next_ping)
        if self.lock_waiting:
            deadlines.append(self.next_lock_poll)
        due = self.next_due()
        if due is not None:
            deadlines.append(due)
        return max(min(deadlines) - now, 0.0)

    # -- lifecycle ------------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self.stopping = True
        self.queue.put(Signal(Kind.WAKE))

    def request_reload(self, *_: object) -> None:
        self.reload_requested = True
        self.queue.put(Signal(Kind.WAKE))

    def reload(self) -> None:
        """SIGHUP: new settings and memory dirs; queued work is kept; a bad config is refused."""
        self.reload_requested = False
        self.notifier.reloading()
        try:
            if self.reload_settings is None:
                raise ConfigError("this daemon has no configuration to reload")
            new = self.reload_settings()
        except MemstagedError as err:
            self.log.error("reload", ok=False, error=str(err), action="kept the old configuration")
        else:
            self.settings = new
            self.pipeline.options = new.options
            self.next_rescan = self.clock() + new.rescan_interval
            self.sync_memory_dirs()
            self.log.info("reload", ok=True, memory_dirs=sorted(self.mdirs))
        self.notifier.ready(self.status_text())

    def run(self) -> int:
        """Start, drain the backlog, say READY=1, then loop until SIGTERM/SIGINT."""
        self.start()
        self.work()
        self.notifier.ready(self.status_text())
        self.log.info("ready", memory_dirs=len(self.mdirs), decided=sum(self.counts.values()))
        while not self.stopping:
            self.drain(self.timeout())
            if self.reload_requested:
                self.reload()
            self.work()
            self.maintain()
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        self.notifier.stopping()
        self.watcher.stop()
        for lock in self.instance_locks.values():
            lock.release()
        self.instance_locks.clear()
        self.log.info("stop", decided=sum(self.counts.values()), pending=len(self.pending))


def run_daemon(settings: Settings, *, wait: bool = False, reload: Callable[[], Settings]) -> int:
    from memstaged.log import get_logger

    daemon = Daemon(settings, get_logger(), reload_settings=reload, wait=wait)
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    signal.signal(signal.SIGHUP, daemon.request_reload)
    try:
        return daemon.run()
    finally:
        if not daemon.stopping:  # an error on the way up: stop the watcher threads too
            daemon.watcher.stop()
