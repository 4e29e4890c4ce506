"""The daemon's seen caches: what was decided survives a restart.

The daemon keeps one seen cache (:mod:`memstaged.run.seen_cache`, shared with ``--once``) per
memory dir it holds. It loads it when it adds the memory dir, and the start-up scan takes the
files that the cache holds as decided ``valid`` or ``foreign`` and unchanged since as decided,
without reading them or logging a new decision: an earlier run decided them, so they are
counted apart (:attr:`SeenCaches.unchanged`), never as this process's decisions. Each decision
is then remembered, or forgotten when it does not leave the file as it is. The caches are
written at each periodic rescan, on SIGHUP, when a memory dir is dropped and when the daemon
stops, never per file and never in a dry run.
"""

from __future__ import annotations

from collections import Counter

from memstaged.config import Settings
from memstaged.daemon.schedule import Key
from memstaged.files.fsio import Identity
from memstaged.files.memdir import MemoryDir, Options
from memstaged.run.decision import Outcome
from memstaged.run.seen_cache import (
    SeenCache,
    remember_outcome,
    seen_cache,
    settings_key,
    split_unchanged,
)


class SeenCaches:
    """The seen cache of each memory dir the daemon holds, by path."""

    def __init__(self) -> None:
        self.by_dir: dict[str, SeenCache] = {}
        #: Files taken as decided from a seen cache at start-up (not read, not logged, and not
        #: counted among the daemon's decisions: an earlier run decided them).
        self.unchanged = 0

    def add(self, settings: Settings, mdir: MemoryDir) -> None:
        """A memory dir is locked and watched: load its cache."""
        self.by_dir[mdir.path] = seen_cache(settings, mdir)

    def drop(self, options: Options, path: str) -> None:
        """A memory dir is let go: save its cache (still under its lock), then forget it."""
        self.save(options, path)
        self.by_dir.pop(path, None)

    def scanned(
        self, mdir: MemoryDir, names: list[str], *, seed: bool
    ) -> tuple[list[str], dict[Key, Identity]]:
        """``staging/`` was listed (``names``): forget the files gone from it, and return the
        files to look at and the identities of those taken as decided.

        With ``seed`` (the first scan of a memory dir) the files the cache holds as decided and
        unchanged (ctime included) are taken as decided; otherwise every name is looked at."""
        cache = self.by_dir.get(mdir.path)
        todo = names
        decided: dict[Key, Identity] = {}
        if seed and cache is not None:
            todo, held = split_unchanged(cache, mdir.staging, names)
            if held:
                to_read = set(todo)
                for name in names:
                    if name not in to_read:
                        decided[(mdir.path, name)] = Identity(*cache.entries[name][0])
                self.unchanged += len(held)
        if cache is not None:
            cache.keep_only(set(names))
        return todo, decided

    def decided(self, mdir: MemoryDir, name: str, outcome: Outcome) -> None:
        """Remember a file that stays as it was decided; forget any other (deferred, changed
        while being decided, quarantined, repaired, skipped, gone): it is looked at again."""
        cache = self.by_dir.get(mdir.path)
        if cache is None:
            return
        if outcome.changed:
            cache.forget(name)
        else:
            remember_outcome(cache, mdir, name, outcome)

    def limit(self, max_file_size: int) -> None:
        """A lower size limit: files over it are decided again (too large to read)."""
        for cache in self.by_dir.values():
            cache.limit(max_file_size)

    def reloaded(self, old: Settings, new: Settings, mdirs: dict[str, MemoryDir]) -> None:
        """SIGHUP: save the caches under the old settings, which their entries were decided
        with; when decisions made from now on are not those the caches hold, start new ones."""
        self.save(old.options)
        if settings_key(new.options) != settings_key(old.options):
            for path, mdir in mdirs.items():
                self.by_dir[path] = seen_cache(new, mdir)

    def save(self, options: Options, path: str | None = None) -> None:
        """Write the cache of one memory dir (or of all) if it changed; never in a dry run
        (as ``--once``). Called at each periodic rescan, SIGHUP, drop and stop, not per file."""
        if options.dry_run:
            return
        if path is None:
            for cache in self.by_dir.values():
                cache.save()
        elif path in self.by_dir:
            self.by_dir[path].save()

    def held(self) -> Counter[str]:
        """The files the caches hold as decided and unchanged, by decision."""
        held: Counter[str] = Counter()
        for cache in list(self.by_dir.values()):
            held.update(decision for _identity, decision in cache.entries.values())
        return held
