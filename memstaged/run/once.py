"""``memstaged --once``: decide every staging file of the memory dirs, and report the counts.

Files still being written (deferred for the settle interval) are looked at once more when their
interval has passed, so a run started while a writer is busy still decides them (and a wait of a
second or more says on stderr what it waits for). A file that changed while being decided is
decided again at once (a bounded number of times).

The counts come back as a :class:`Report`; the command line prints them
(:mod:`memstaged.cli.once_summary`). rich is imported only for the progress bar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from memstaged import safe_text
from memstaged.config import (
    Alias,
    Settings,
    check_literal_dirs,
    link_on_the_way,
    one_path_each,
    unwritable,
)
from memstaged.core import digests
from memstaged.core.decide import Decision
from memstaged.errors import BusyError, ConfigError, Terminated
from memstaged.files.fsio import raise_fd_limit
from memstaged.files.locks import InstanceLock
from memstaged.files.memdir import MemoryDir
from memstaged.files.version import quiet_lease_breaks
from memstaged.run.decision import Outcome
from memstaged.run.pipeline import Pipeline
from memstaged.run.seen_cache import SeenCache, remember_outcome, seen_cache, split_unchanged

#: Show a progress bar on a terminal from this many files on.
PROGRESS_FROM: Final = 200
_CHANGED_RETRIES: Final = 3


def _settle(
    pipeline: Pipeline,
    mdir: MemoryDir,
    outcomes: dict[str, Outcome],
    counts: Counter[str],
    waiting: list[tuple[float, str]],
    cache: SeenCache,
    advance: Callable[[], None],
    rewritten: list[str],
) -> None:
    """Count a batch's outcomes; a file that changed meanwhile is decided again on its own.

    The names of files repaired go to ``rewritten``: their rewrites are looked at once the
    others are decided (SPEC 1), as the daemon looks at them when it sees them appear; but not
    those looked at in place by their transaction (``looked``), which most are.
    """
    for name, first in outcomes.items():
        outcome = first
        for _ in range(_CHANGED_RETRIES):
            if not outcome.changed:
                break
            outcome = pipeline.process(mdir, name)
        if outcome.decision is Decision.DEFERRED and outcome.retry_at is not None:
            waiting.append((outcome.retry_at, name))
        else:
            _count(mdir, name, outcome, counts, cache, rewritten)
        advance()


def _count(
    mdir: MemoryDir,
    name: str,
    outcome: Outcome,
    counts: Counter[str],
    cache: SeenCache,
    rewritten: list[str],
) -> None:
    """One decision counted (a look at memstaged's own rewrite is none, SPEC 7) and cached. A
    look that waits (the log cannot take its line) is counted apart (:data:`LOOKS_WAITING`):
    no decision, but still to be logged, which makes the exit code 1."""
    if not outcome.own_rewrite:
        counts[outcome.decision.value] += 1
    elif outcome.decision is Decision.DEFERRED:
        counts[LOOKS_WAITING] += 1
    if outcome.decision is Decision.REPAIRED and not outcome.changed and not outcome.looked:
        rewritten.append(name)
    remember_outcome(cache, mdir, name, outcome)


def _decide_all(
    pipeline: Pipeline,
    mdir: MemoryDir,
    names: list[str],
    advance: Any,
    cache: SeenCache,
) -> tuple[Counter[str], int]:
    """Decide every file; returns the counts per decision and how many were unchanged."""
    counts: Counter[str] = Counter()
    waiting: list[tuple[float, str]] = []
    rewritten: list[str] = []
    todo, held = split_unchanged(cache, mdir.staging, names)
    todo.sort()  # files are decided in name order; the unchanged ones need no order
    if (
        todo
    ):  # every byte of these is hashed: OpenSSL's SHA-256 is 5x faster (memstaged.core.digests)
        digests.for_backlog()
    counts.update(held)
    if advance is not _nothing:
        for _ in held:
            advance()
    with contextlib.closing(pipeline.batches(mdir, todo)) as batches:
        for batch in batches:
            _settle(pipeline, mdir, batch.outcomes, counts, waiting, cache, advance, rewritten)
    waiting.sort()
    if waiting:
        _say_waiting(mdir, waiting, pipeline.options.settle)
    for retry_at, name in waiting:
        delay = retry_at - time.time()
        if delay > 0:
            time.sleep(min(delay, pipeline.options.settle))
        outcome = pipeline.process(mdir, name)
        _count(mdir, name, outcome, counts, cache, rewritten)
    if not pipeline.options.dry_run:  # a dry run rewrote nothing: there is nothing to look at
        _look_at_rewrites(pipeline, mdir, rewritten, counts, cache)
    cache.keep_only(set(names))
    return counts, len(held)


def _look_at_rewrites(
    pipeline: Pipeline,
    mdir: MemoryDir,
    rewritten: list[str],
    counts: Counter[str],
    cache: SeenCache,
) -> None:
    """Decide each rewrite again (SPEC 1: it must be valid), as the daemon does on seeing it.

    The look is logged as memstaged's own (``own_rewrite``) and not counted; the file is then
    remembered as decided, so a later run neither reads it again nor logs a decision for it. A
    version a writer put there meanwhile gets its own decision, counted (a deferred one too: the
    exit code says that something waits for the next run).
    """
    with contextlib.closing(pipeline.batches(mdir, rewritten)) as batches:
        for batch in batches:
            for name, outcome in batch.outcomes.items():
                _count(mdir, name, outcome, counts, cache, [])


#: A settle wait from this long on is said on stderr: a silent pause looks like a hang.
SAY_WAIT_FROM: Final = 1.0


def _say_waiting(mdir: MemoryDir, waiting: list[tuple[float, str]], settle: float) -> None:
    """One stderr line before a wait for files still being written to stay unchanged."""
    longest = waiting[-1][0] - time.time()
    if longest < SAY_WAIT_FROM:
        return
    names = ", ".join(safe_text.name(n) for _, n in waiting[:3])
    more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
    _stderr(
        f"memstaged: waiting up to {longest:.0f}s for {len(waiting)} "
        f"{'file' if len(waiting) == 1 else 'files'} of "
        f"{safe_text.name(mdir.path)} still being written to stay unchanged for the settle "
        f"interval ({settle:g}s): {names}{more}"
    )


def _stderr(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # nobody reads stderr any more: the decisions are logged all the same


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[Any]:
    """rich's progress bar on a terminal's stderr (imported only then), or nothing."""
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True, soft_wrap=True), transient=True) as bar:
        yield bar


#: The key of :class:`Report`'s counts for looks at memstaged's own rewrites that wait for the
#: log (no decisions: not in the total).
LOOKS_WAITING: Final = "looks_waiting"


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """What one run decided: the counts per decision of each memory dir decided, how many of
    its files were unchanged since their decision (not read again), and why each memory dir
    left undecided was (busy, unreadable, unwritable)."""

    counts: dict[str, Counter[str]]
    unchanged: dict[str, int]
    busy: dict[str, str]
    dry_run: bool

    @property
    def code(self) -> int:
        """0 when every file got a decision; 1 when some file is still deferred, a look at a
        rewrite waits for the log, or some memory dir was left undecided."""
        deferred = sum(
            c.get(Decision.DEFERRED.value, 0) + c.get(LOOKS_WAITING, 0)
            for c in self.counts.values()
        )
        return 1 if deferred or self.busy else 0


def run_once(settings: Settings, *, wait: bool = False) -> Report:
    """Decide every staging file of the settings' memory dirs, each under its instance lock."""
    # One directory, one decision (the other paths are said below)
    mdirs, aliases = one_path_each(settings.memory_dirs())
    # a glob's unwritable match is said below, and skipped
    literal = check_literal_dirs(settings, mdirs)
    if not mdirs:
        raise ConfigError(
            "no memory dir: pass --memory-dir DIR, set memory_dirs in the config file, "
            "or run in a project that has .pi/memory/project"
        )
    raise_fd_limit()  # SPEC 6: the soft limit of a service manager is 1,024
    quiet_lease_breaks()
    pipeline = Pipeline(settings.options, _logger())
    previous = _on_sigterm()
    try:
        return _run(settings, pipeline, mdirs, aliases, literal, wait)
    finally:
        pipeline.close()  # the decider processes are the run's
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminated(_sig: int, _frame: object) -> None:
    raise Terminated


def _on_sigterm() -> signal.Handlers | Callable[[int, Any], Any] | int | None:
    """Stop on SIGTERM as on Ctrl-C (:class:`~memstaged.errors.Terminated`); the handler it
    replaced, or None where none can be set (a thread other than the main one)."""
    try:
        return signal.signal(signal.SIGTERM, _terminated)
    except ValueError:
        return None


def _run(
    settings: Settings,
    pipeline: Pipeline,
    mdirs: list[MemoryDir],
    aliases: list[Alias],
    literal: frozenset[str],
    wait: bool,
) -> Report:
    for alias in aliases:
        _same_directory(pipeline, alias)
    for mdir in mdirs:
        said = mdir.physical_root_said()
        if said is not None:  # SPEC 2.4: once, at start; on a terminal too (the log's console)
            pipeline.log.info("project_root_physical", **said)
    results: dict[str, Counter[str]] = {}
    unchanged: dict[str, int] = {}
    busy: dict[str, str] = {}
    show_progress = sys.stderr.isatty()
    pool_said = False
    with _progress(show_progress) as bar:
        for mdir in mdirs:
            strict = mdir.path in literal
            lock = _lock(pipeline, mdir, wait, busy, strict=strict, state_dir=settings.state_dir)
            if lock is None:
                continue
            if not settings.options.dry_run and _unwritable(pipeline, mdir, busy):
                lock.release()
                continue
            try:
                listing = None
                if not settings.options.dry_run:
                    listing = pipeline.recover_temps(mdir)
                names = pipeline.scan(mdir, listing, sort=False)
                if mdir.path in pipeline.unlisted:  # No silent success
                    _stderr(f"memstaged: {pipeline.unlisted[mdir.path]}")
                    busy[mdir.path] = pipeline.unlisted[mdir.path]
                cache = seen_cache(settings, mdir)
                advance: Callable[[], None] = _nothing
                if bar is not None and len(names) >= PROGRESS_FROM:
                    task = bar.add_task(safe_text.name(mdir.path), total=len(names))
                    advance = functools.partial(bar.advance, task)
                results[mdir.path], unchanged[mdir.path] = _decide_all(
                    pipeline, mdir, names, advance, cache
                )
                if pipeline.pool_given_up is not None and not pool_said:
                    _stderr(f"memstaged: {pipeline.pool_given_up}")  # once: the run's pool
                    pool_said = True
                if not settings.options.dry_run:
                    cache.save()
            finally:
                lock.release()
    return Report(results, unchanged, busy, settings.options.dry_run)


def _lock(
    pipeline: Pipeline,
    mdir: MemoryDir,
    wait: bool,
    busy: dict[str, str],
    *,
    strict: bool,
    state_dir: Path | None,
) -> InstanceLock | None:
    """The instance lock of ``mdir``, or None (said, and noted in ``busy`` if it counts).

    ``strict`` (a memory dir named literally): one that cannot be opened is exit 2.
    """
    # no link followed below the anchor
    lock = InstanceLock(mdir.path, mdir.open, state_dir=state_dir)
    try:
        lock.acquire(wait=wait, on_wait=lambda what: print(f"memstaged: {what}", file=sys.stderr))
    except BusyError as err:
        _stderr(f"memstaged: {err}")  # one line, never wrapped: a script greps it
        busy[mdir.path] = str(err)
        return None
    except OSError as err:
        if strict:
            raise ConfigError(f"memory dir {mdir.path}: {err.strerror}") from None
        _unopened(pipeline, mdir, err, busy)  # a glob match: the others go on
        return None
    return lock


def _unwritable(pipeline: Pipeline, mdir: MemoryDir, busy: dict[str, str]) -> bool:
    """A glob's match that memstaged cannot write to (a literal one was refused with exit 2):
    one stderr line and one logged event, and it is left undecided (exit 1)."""
    why = unwritable(mdir)
    if why is None:
        return False
    _stderr(f"memstaged: memory dir {safe_text.name(mdir.path)}: {why}")
    pipeline.log.error("memory_dir_error", memory_dir=mdir.path, error=why)
    busy[mdir.path] = why
    return True


def _unopened(pipeline: Pipeline, mdir: MemoryDir, err: OSError, busy: dict[str, str]) -> None:
    """A glob match that cannot be opened: one stderr line and one logged event, and the
    other memory dirs are decided (defect 8).

    A symbolic link below the glob's literal prefix is not followed (SPEC 6): it is reported,
    and it leaves the exit code alone, since nothing there is memstaged's to decide. Any other
    error (permission denied, ...) leaves that memory dir undecided: exit 1, as for a busy one.
    """
    link = link_on_the_way(mdir)
    if link is not None:
        why = f"{safe_text.name(link)} is a symbolic link: not followed (SPEC 6)"
        _stderr(f"memstaged: memory dir {safe_text.name(mdir.path)} skipped: {why}")
        pipeline.log.warning("memory_dir_skipped", memory_dir=mdir.path, link=link, reason=why)
        return
    why = f"cannot open it: {err.strerror or err}"
    _stderr(f"memstaged: memory dir {safe_text.name(mdir.path)}: {why}")
    pipeline.log.error("memory_dir_error", memory_dir=mdir.path, error=why)
    busy[mdir.path] = why


def _same_directory(pipeline: Pipeline, alias: Alias) -> None:
    """A second path to a memory dir decided through an earlier one: one stderr line and one
    logged event, and the exit code is left alone (nothing is left undecided)."""
    _stderr(
        f"memstaged: memory dir {safe_text.name(alias.mdir.path)} skipped: same directory as "
        f"{safe_text.name(alias.first.path)}"
    )
    pipeline.log.warning(
        "memory_dir_skipped",
        memory_dir=alias.mdir.path,
        same_as=alias.first.path,
        reason=alias.reason,
    )


def _nothing() -> None:
    """The progress bar's advance when no bar is shown (it costs microseconds per call)."""


def _logger() -> Any:
    from memstaged.log.writer import get_logger

    return get_logger()
