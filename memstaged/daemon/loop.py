"""``memstaged`` without ``--once``: watch every memory dir and decide files as they arrive.

One thread does all the work (this module's loop, :meth:`Daemon.run`); the watcher's one reader
thread only enqueues signals. The loop collapses signals per file into one due time, decides due
files through the same :meth:`Pipeline.process` as ``--once``, and between files pings the
systemd watchdog, rescans, and reacts to SIGHUP/SIGTERM flags. Missed events are expected: a
start-up scan before ``READY=1``, a rescan after an inotify overflow, and a periodic rescan that
reads only files whose identity changed since they were decided.

The rest is elsewhere: which memory dirs are held (locks, watches, new projects under a glob)
in :mod:`memstaged.daemon.memory_dirs`, due times in :mod:`memstaged.daemon.schedule`, sd_notify and
when each notification is due in :mod:`memstaged.daemon.sd_notify`, events to signals in
:mod:`memstaged.daemon.watcher`, and the process around the loop (signal handlers, control socket,
metrics file, crash) in
:mod:`memstaged.daemon.main`.

What was decided survives a restart: the seen caches, in :mod:`memstaged.daemon.seen_caches`.

"Decided" has one meaning in ``STATUS=``, the ``ready`` and ``stop`` events and the metrics
(:meth:`Daemon.decided`): the decisions this process made and logged. A ``deferred`` is a wait,
not a decision; the look at the daemon's own rewrite is not a second decision (SPEC 7); and a
file taken from the seen cache at start-up was decided by an earlier run, not by this one (it
is counted apart, as ``unchanged``).

Time: the daemon's own deadlines use ``clock`` (monotonic, injectable, so tests drive it by hand);
only the pipeline looks at wall-clock time, to compare it with a file's mtime.
"""

from __future__ import annotations

import os
import queue
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

from memstaged import safe_text
from memstaged.config import Settings, check_literal_dirs, one_path_each
from memstaged.core.decide import Decision
from memstaged.daemon.memory_dirs import MemoryDirs, WatcherFactory, WatcherLike
from memstaged.daemon.schedule import Key, Schedule, changed_delay, retry_delay
from memstaged.daemon.sd_notify import Heartbeat, Notifier
from memstaged.daemon.seen_caches import SeenCaches
from memstaged.daemon.watcher import Kind, Signal, Watcher
from memstaged.errors import Abandoned, ConfigError, MemstagedError, WaitStopped
from memstaged.files.fsio import Identity, raise_fd_limit
from memstaged.files.locks import live_lock_at
from memstaged.files.memdir import STAGING, MemoryDir
from memstaged.run.decision import Outcome
from memstaged.run.pipeline import Pipeline

#: How often a memory dir blocked by a lock whose holder may die silently is looked at again.
LOCK_POLL: Final = 5.0
#: Shortest interval between two periodic rescans, whatever the config says.
MIN_RESCAN: Final = 1.0
#: How often ``--wait`` retries a lock.
WAIT_POLL: Final = 0.25
#: Take new signals every so many files of a long backlog, so that events collapse.
DRAIN_EVERY: Final = 64
#: SIGTERM: the file in hand is finished if that takes at most this long; otherwise its work
#: is abandoned at its next progress tick (SPEC 6: SIGTERM is acted on within a second
#: whatever file is in hand).
STOP_GRACE: Final = 0.5
_FINAL: Final = frozenset(
    {Decision.VALID, Decision.FOREIGN, Decision.SKIPPED, Decision.REPAIRED, Decision.QUARANTINED}
)


class Hook(Protocol):
    """Something the loop serves between two files: the control socket, the metrics file."""

    def tick(self) -> None: ...
    def deadline(self) -> float | None: ...
    def close(self) -> None: ...


class Daemon:
    """The work loop. Tests drive it with :meth:`handle` and :meth:`work` and a fake clock."""

    def __init__(
        self,
        settings: Settings,
        logger: Any,
        *,
        reload_settings: Callable[[], Settings] | None = None,
        notifier: Notifier | None = None,
        watcher_factory: WatcherFactory = Watcher,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wait: bool = False,
    ) -> None:
        self.settings = settings
        self.log = logger
        self.reload_settings = reload_settings
        self.notifier = notifier or Notifier()
        self.queue: queue.SimpleQueue[Signal] = queue.SimpleQueue()
        self.clock = clock
        self.sleep = sleep
        self.wait = wait
        self.pipeline = Pipeline(settings.options, logger)
        self.dirs = MemoryDirs(
            self, logger, self.queue, watcher_factory, settings.observer, settings.state_dir
        )
        self.due = Schedule()
        #: The version of each file last given a final decision: a rescan skips it.
        self.identities: dict[Key, Identity] = {}
        #: What was decided, by this run or an earlier one, that a restart need not read again.
        self.seen = SeenCaches()
        self.failures: Counter[Key] = Counter()
        #: Memory dirs whose files wait for the reconciler's lock, and those files.
        self.lock_waiting: dict[str, set[str]] = {}
        #: This process's outcomes by decision, ``deferred`` (waits) included; see :meth:`decided`.
        self.counts: Counter[str] = Counter()
        self.stopping = False
        #: When (``time.monotonic``, as the signal is real) the work in hand stops being
        #: finished and is abandoned at its next progress tick; ``None``: no stop requested.
        self.abandon_after: float | None = None
        #: The file being decided, and the one whose work a stop abandoned (if any).
        self.in_hand: Key | None = None
        self.abandoned: Key | None = None
        self.reload_requested = False
        #: Why the last reload was refused (the old settings are in force), until one succeeds.
        self.reload_error: str | None = None
        self.ready = False
        now = clock()
        self.next_rescan = now + self.rescan_interval
        self.next_lock_poll = now + LOCK_POLL
        self.heartbeat = Heartbeat(self.notifier, clock, self.status_text)
        #: Served from this loop between two files (see :func:`run_daemon`).
        self.hooks: list[Hook] = []

    @property
    def mdirs(self) -> dict[str, MemoryDir]:
        """The memory dirs worked on (locked and watched), by path."""
        return self.dirs.mdirs

    @property
    def watcher(self) -> WatcherLike:
        return self.dirs.watcher

    @property
    def pending(self) -> dict[Key, float]:
        """The files waiting to be decided, and when each falls due."""
        return self.due.due

    @property
    def rescan_interval(self) -> float:
        return max(self.settings.rescan_interval, MIN_RESCAN)

    # -- memory dirs ----------------------------------------------------------------------------

    def start(self) -> None:
        """Lock, clean up, watch and scan every memory dir; raises for a bad explicit one.

        The parent directories of the globs are watched before the globs are expanded, so a
        project created meanwhile is either expanded now or signalled."""
        limit = raise_fd_limit()
        self.dirs.watch_globs(self.settings.memory_dir_patterns, observer=self.settings.observer)
        mdirs = self.settings.memory_dirs()
        # a second path to one is said when it is added
        literal = check_literal_dirs(self.settings, one_path_each(mdirs)[0])
        if not mdirs and not self.settings.memory_dir_patterns:
            raise ConfigError(
                "no memory dir: pass --memory-dir DIR or set memory_dirs in the config file"
            )
        self.log.info(
            "start",
            pid=os.getpid(),
            memory_dirs=[m.path for m in mdirs],
            patterns=list(self.settings.memory_dir_patterns),
            config=self.settings.config_path,
            observer=self.settings.observer,
            settle=self.settings.options.settle,
            dry_run=self.settings.options.dry_run,
            nofile=limit.soft,
            nofile_raised_from=limit.found if limit.found != limit.soft else None,
            nofile_hard=limit.hard,
        )
        # Only a memory dir named literally is refused with exit 2; a glob's matches that
        # cannot be held (a link, no descriptor left) are logged and the others worked on.
        for mdir in mdirs:
            if self.stopping:
                break  # SIGTERM while thousands of memory dirs are added: stop now
            self.dirs.add(
                mdir,
                strict=mdir.path in literal,
                waiting=self._wait_a_little if self.wait else None,
            )

    def _wait_a_little(self) -> bool:
        """``--wait``: feed the watchdog, wait, and say whether SIGTERM arrived meanwhile."""
        self.keepalive()
        self.sleep(WAIT_POLL)
        return self.stopping

    def prepare(self, mdir: MemoryDir) -> None:
        """A memory dir was just locked: clean up what a killed memstaged left there."""
        if not self.settings.options.dry_run:
            self.pipeline.recover_temps(mdir)

    def added(self, mdir: MemoryDir) -> None:
        """A memory dir is locked and watched: decide what is in it."""
        self.seen.add(self.settings, mdir)
        self.rescan(mdir, seed=True)

    def dropped(self, path: str) -> None:
        """A memory dir is let go: save its seen cache (under its lock), forget its files."""
        self.seen.drop(self.settings.options, path)
        self.lock_waiting.pop(path, None)
        self._forget(lambda key: key[0] == path)

    def _limit(self, max_file_size: int) -> None:
        """A lower size limit: files decided under the old one that are over it now are decided
        again (too large to read); the others stay decided."""
        self.seen.limit(max_file_size)
        over = {k for k, ident in self.identities.items() if ident.size > max_file_size}
        if over:
            self._forget(over.__contains__)

    def _forget(self, which: Callable[[Key], bool]) -> None:
        self.due.forget(which)
        for key in [k for k in self.identities if which(k)]:
            del self.identities[key]
        for key in [k for k in self.failures if which(k)]:
            del self.failures[key]

    def sync_memory_dirs(self) -> None:
        """Re-expand the configured globs: add new memory dirs, drop vanished ones."""
        self.dirs.tree_changed_since_sync = False
        self.dirs.sync(self.settings.memory_dirs())

    # -- scheduling -----------------------------------------------------------------------------

    def handle(self, sig: Signal) -> None:
        """React to one signal from the watcher (or a signal handler)."""
        now = self.clock()
        if sig.kind is Kind.COMPLETE:
            self.due.at((sig.memory_dir, sig.name), now)
        elif sig.kind is Kind.CHANGED:
            self.due.at((sig.memory_dir, sig.name), now + self.settings.options.settle)
        elif sig.kind is Kind.LOCK_RELEASED:
            self.release_waiting(sig.memory_dir)
        elif sig.kind is Kind.DIR_CHANGED:
            self._dir_changed(sig.memory_dir)
        elif sig.kind is Kind.TREE_CHANGED:
            self.dirs.tree_changed(sig.memory_dir, sig.name)
        elif sig.kind is Kind.OVERFLOW:
            total = sum(self.rescan(m) for m in list(self.mdirs.values()))
            self.log.warning(
                "overflow_recovered", action="rescanned every memory dir", scheduled=total
            )

    def _dir_changed(self, path: str) -> None:
        """staging/ (or the memory dir) came or went: watch anew, then look at staging/.

        In that order: a staging/ that comes after the look is signalled by the watch, one that
        came before it is seen by the look (looked at first, one made meanwhile was watched
        but neither said nor scanned until the periodic rescan)."""
        mdir = self.mdirs.get(path)
        if mdir is None or not self.dirs.still_there(path):
            return
        was_watched = self.watcher.staging_watched(mdir.path)
        # Watch anew in any case: a staging/ replaced by another directory needs a new watch.
        self.dirs.watch(mdir)
        staging_ok = Path(mdir.staging).is_dir()
        if staging_ok != was_watched:
            self.log.info("staging_changed", memory_dir=mdir.path, exists=staging_ok)
        if staging_ok:
            self.rescan(mdir)
        else:
            self._forget(lambda key: key[0] == mdir.path)

    def release_waiting(self, path: str) -> None:
        names = self.lock_waiting.pop(path, None)
        if names:
            now = self.clock()
            for name in names:
                self.due.at((path, name), now)

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
                break
        if self.dirs.tree_changed_since_sync:
            self.sync_memory_dirs()  # once for every project created or removed meanwhile

    # -- work -----------------------------------------------------------------------------------

    def rescan(self, mdir: MemoryDir, *, seed: bool = False) -> int:
        """Schedule every file whose identity changed since it was decided; returns how many.

        With ``seed`` (the first scan of a memory dir) the files the seen cache holds as decided
        and unchanged are taken as decided: neither read nor logged again after a restart.
        """
        now = self.clock()
        scheduled = 0
        waiting = self.lock_waiting.get(mdir.path)
        names = self.pipeline.scan(mdir)  # says why, when staging/ is a link
        here = set(names)  # the names now in staging/
        todo, decided = self.seen.scanned(mdir, names, seed=seed)
        self.identities.update(decided)
        for name in todo:
            key = (mdir.path, name)
            try:
                st = os.stat(os.path.join(mdir.staging, name), follow_symlinks=False)
            except OSError:
                continue
            if self.identities.get(key) != Identity.of(st) and key not in self.due:
                if waiting is not None:
                    waiting.add(name)
                else:
                    self.due.at(key, now)
                    scheduled += 1
        self._forget(lambda key: key[0] == mdir.path and key[1] not in here and key not in self.due)
        return scheduled

    def process(self, key: Key) -> Outcome | None:
        """Decide one due file (unless its memory dir is gone or waits for the lock)."""
        mdir = self.mdirs.get(key[0])
        if mdir is None:
            return None  # its memory dir was dropped
        if key[0] in self.lock_waiting:
            self.lock_waiting[key[0]].add(key[1])
            return None
        if not Path(mdir.path).is_dir():
            self.dirs.still_there(mdir.path)
            return None
        if not Path(mdir.staging).is_dir():
            self._forget(lambda k: k[0] == mdir.path)  # gone with staging/: nothing to decide
            return None
        self.in_hand = key
        outcome = self.pipeline.process(mdir, key[1])
        self.in_hand = None
        if not outcome.own_rewrite:  # the look at its own rewrite is no second decision
            self.counts[outcome.decision.value] += 1
        self.seen.decided(mdir, key[1], outcome)
        now = self.clock()
        if outcome.changed:
            self.failures[key] += 1
            self.due.at(key, now + changed_delay(self.failures[key]))
        elif outcome.blocked_by_lock:
            self.lock_waiting.setdefault(key[0], set()).add(key[1])
            self.next_lock_poll = min(self.next_lock_poll, now + LOCK_POLL)
        elif outcome.decision is Decision.DEFERRED:
            self.failures[key] += 1
            self.due.at(key, now + retry_delay(outcome, self.failures[key]))
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
            key = self.due.pop_due(self.clock())
            if key is None:
                break
            try:
                self.process(key)
            except Abandoned:
                self.in_hand = None
                self.abandoned = key
                break
            done += 1
            if done % DRAIN_EVERY == 0:
                self.drain(0)  # collapse new signals in a long backlog
            self.keepalive()
        return done

    def keepalive(self) -> None:
        """Watchdog ping, start-up extension and STATUS= when due (see :class:`Heartbeat`)."""
        self.heartbeat.beat(ready=self.ready)
        for hook in self.hooks:
            hook.tick()

    def maintain(self) -> None:
        """Watchdog and status, a dead observer, the periodic rescan, and lock polls when due."""
        self.keepalive()
        now = self.clock()
        if not self.watcher.alive():
            self.log.error("observer_died", action="restarting the watches and rescanning")
            self._new_watcher(self.settings.observer)
        if now >= self.next_rescan:
            self.next_rescan = now + self.rescan_interval
            self.dirs.refresh_levels()
            self.sync_memory_dirs()
            total = sum(self.rescan(m) for m in list(self.mdirs.values()))
            self.seen.save(self.settings.options)
            self.log.info("rescan", memory_dirs=len(self.mdirs), scheduled=total)
        if self.lock_waiting and now >= self.next_lock_poll:
            self.next_lock_poll = now + LOCK_POLL
            for path in list(self.lock_waiting):
                if not live_lock_at(path):
                    self.release_waiting(path)

    def _new_watcher(self, mode: str) -> None:
        self.dirs.new_watcher(mode)
        for mdir in list(self.mdirs.values()):
            self.rescan(mdir)

    def decisions(self) -> dict[str, int]:
        """The decisions this process made and logged, by decision: no ``deferred`` (a wait),
        no look at its own rewrite, no file taken from the seen cache (see the module)."""
        return {k: v for k, v in self.counts.items() if k != Decision.DEFERRED.value}

    def decided(self) -> int:
        """How many decisions this process made: the ``decided`` of ``STATUS=``, of the
        ``ready`` and ``stop`` events, and the sum of ``memstaged_decisions_total``."""
        return sum(self.decisions().values())

    def status_text(self) -> str:
        c = self.counts
        decided = self.decided()
        waiting = len(self.due) + sum(len(v) for v in self.lock_waiting.values())
        counts = (
            f"watching {len(self.mdirs)} memory dirs; {decided} decided, "
            f"{c[Decision.QUARANTINED.value]} quarantined, {c[Decision.REPAIRED.value]} repaired, "
            f"{waiting} waiting"
        )
        if self.reload_error is None:
            return counts
        # A refused reload is said where `systemctl status` shows it, until a
        # reload succeeds; escaped, as a newline in a path would end the sd_notify message.
        return f"reload refused, old settings kept: {safe_text.text(self.reload_error)}; {counts}"

    def timeout(self) -> float:
        """How long the loop may sleep: until the next file, ping, rescan, poll or status."""
        now = self.clock()
        deadlines = [self.next_rescan, *self.heartbeat.deadlines()]
        deadlines += [d for d in (hook.deadline() for hook in self.hooks) if d is not None]
        if self.lock_waiting:
            deadlines.append(self.next_lock_poll)
        due = self.due.next_due()
        if due is not None:
            deadlines.append(due)
        return max(min(deadlines) - now, 0.0)

    # -- lifecycle ------------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        """SIGTERM/SIGINT: stop after the file in hand, or at its first progress tick once
        :data:`STOP_GRACE` is over (safe in a signal handler: it only sets flags and wakes the
        loop; see :class:`Abandoned`)."""
        if self.abandon_after is None:
            self.abandon_after = time.monotonic() + STOP_GRACE
        self.stopping = True
        self.queue.put(Signal(Kind.WAKE))

    def checkpoint(self) -> None:
        """A progress tick from inside a file's work (:mod:`memstaged.core.ticks`): feed the
        watchdog, and abandon the file in hand if a stop's grace is over."""
        self.keepalive()
        if (
            self.in_hand is not None
            and self.abandon_after is not None
            and time.monotonic() >= self.abandon_after
        ):
            raise Abandoned

    def request_reload(self, *_: object) -> None:
        """SIGHUP: reload between two files (safe in a signal handler)."""
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
            self.reload_error = str(err)
            self.log.error(
                "reload",
                pid=os.getpid(),
                ok=False,
                error=str(err),
                action="kept the old configuration",
            )
        else:
            self.reload_error = None
            old = self.settings
            self.seen.reloaded(old, new, self.mdirs)
            self.settings = new
            self.pipeline.options = new.options
            self._limit(new.options.max_file_size)
            self.next_rescan = self.clock() + self.rescan_interval
            if new.observer != old.observer:
                self._new_watcher(new.observer)
            self.dirs.watch_globs(new.memory_dir_patterns, observer=new.observer)
            self.sync_memory_dirs()
            self.log.info(
                "reload",
                pid=os.getpid(),
                ok=True,
                memory_dirs=sorted(self.mdirs),
                settle=new.options.settle,
                observer=new.observer,
                config=new.config_path,
                changed=new.changed_from(old),
            )
        self.notifier.ready(self.status_text())

    def run(self) -> int:
        """Start, drain the backlog, say READY=1, then loop until SIGTERM/SIGINT."""
        try:
            self.start()
        except WaitStopped:
            self.shutdown()
            return 0
        except MemstagedError as err:
            self.shutdown(error=str(err))
            raise
        self.work()
        if not self.stopping:
            self.ready = True
            self.notifier.ready(self.status_text())
            self.log.info(
                "ready",
                pid=os.getpid(),
                memory_dirs=len(self.mdirs),
                decided=self.decided(),
                unchanged=self.seen.unchanged,
                waiting=len(self.due),
            )
        while not self.stopping:
            self.drain(self.timeout())
            if self.stopping:
                break
            if self.reload_requested:
                self.reload()
            self.work()
            self.maintain()
        self.shutdown()
        return 0

    def shutdown(self, error: str | None = None) -> None:
        """STOPPING=1, stop the observers, save the seen caches (a clean stop), release the
        instance locks (after the save: the next memstaged must see the whole cache)."""
        self.stopping = True
        self.notifier.stopping()
        self.watcher.stop()
        if error is None:
            self.seen.save(self.settings.options)
        self.dirs.release_all()
        pending = len(self.due) + sum(len(v) for v in self.lock_waiting.values())
        if self.abandoned is not None:
            pending += 1
        if error is None:
            abandoned = None
            if self.abandoned is not None:
                abandoned = os.path.join(self.abandoned[0], STAGING, self.abandoned[1])
            self.log.info(
                "stop",
                pid=os.getpid(),
                decided=self.decided(),
                pending=pending,
                abandoned=abandoned,
            )
        else:
            self.log.error(
                "stop",
                pid=os.getpid(),
                decided=self.decided(),
                pending=pending,
                error=error,
            )
        for hook in self.hooks:
            hook.close()
