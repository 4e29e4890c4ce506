"""``memstaged --once``: decide every staging file of the memory dirs, print a summary, exit.

Files still being written (deferred for the settle interval) are looked at once more when their
interval has passed, so a run started while a writer is busy still decides them. A file that
changed while being decided is decided again at once (a bounded number of times).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from memstaged.config import Settings, check_memory_dir
from memstaged.errors import BusyError, ConfigError
from memstaged.fsio import raise_fd_limit
from memstaged.locks import InstanceLock
from memstaged.pipeline import MemoryDir, Outcome, Pipeline
from memstaged.seen import SeenCache, remember_outcome, seen_cache, split_unchanged
from memstaged.triage import Decision

#: Show a progress bar on a terminal from this many files on.
PROGRESS_FROM: Final = 200
_CHANGED_RETRIES: Final = 3
_ORDER: Final = [d.value for d in Decision]


def _settle(
    pipeline: Pipeline,
    mdir: MemoryDir,
    outcomes: dict[str, Outcome],
    counts: Counter[str],
    waiting: list[tuple[float, str]],
    cache: SeenCache,
    advance: Callable[[], None],
) -> None:
    """Count a batch's outcomes; a file that changed meanwhile is decided again on its own."""
    for name, first in outcomes.items():
        outcome = first
        for _ in range(_CHANGED_RETRIES):
            if not outcome.changed:
                break
            outcome = pipeline.process(mdir, name)
        if outcome.decision is Decision.DEFERRED and outcome.retry_at is not None:
            waiting.append((outcome.retry_at, name))
        else:
            counts[outcome.decision.value] += 1
            remember_outcome(cache, mdir, name, outcome)
        advance()


def _decide_all(
    pipeline: Pipeline, mdir: MemoryDir, names: list[str], advance: Any, cache: SeenCache
) -> tuple[Counter[str], int]:
    """Decide every file; returns the counts per decision and how many were unchanged."""
    counts: Counter[str] = Counter()
    waiting: list[tuple[float, str]] = []
    todo, held = split_unchanged(cache, mdir.staging, names)
    todo.sort()  # files are decided in name order; the unchanged ones need no order
    counts.update(held)
    if advance is not _nothing:
        for _ in held:
            advance()
    for batch in pipeline.batches(mdir, todo):
        _settle(pipeline, mdir, batch.outcomes, counts, waiting, cache, advance)
    for retry_at, name in sorted(waiting):
        delay = retry_at - time.time()
        if delay > 0:
            time.sleep(min(delay, pipeline.options.settle))
        outcome = pipeline.process(mdir, name)
        counts[outcome.decision.value] += 1
        remember_outcome(cache, mdir, name, outcome)
    cache.keep_only(set(names))
    return counts, len(held)


def run_once(settings: Settings, *, wait: bool = False, console: Console | None = None) -> int:
    """Exit 0 when every file got a decision; 1 when some file is still deferred or busy."""
    out = console or Console()
    mdirs = settings.memory_dirs()
    for mdir in mdirs:
        if settings.explicit_dirs:
            check_memory_dir(mdir, writable=not settings.options.dry_run)
    if not mdirs:
        raise ConfigError(
            "no memory dir: pass --memory-dir DIR, set memory_dirs in the config file, "
            "or run in a project that has .pi/memory/project"
        )
    raise_fd_limit()  # SPEC 6: the soft limit of a service manager is 1,024
    pipeline = Pipeline(settings.options, _logger())
    results: dict[str, Counter[str]] = {}
    unchanged: dict[str, int] = {}
    busy = False
    show_progress = sys.stderr.isatty()
    with Progress(console=Console(stderr=True), transient=True, disable=not show_progress) as bar:
        for mdir in mdirs:
            lock = InstanceLock(mdir.path)
            try:
                lock.acquire(
                    wait=wait, on_wait=lambda what: print(f"memstaged: {what}", file=sys.stderr)
                )
            except BusyError as err:
                out.print(f"memstaged: {err}", highlight=False)
                busy = True
                continue
            except OSError as err:
                raise ConfigError(f"memory dir {mdir.path}: {err.strerror}") from None
            try:
                listing = None
                if not settings.options.dry_run:
                    listing = pipeline.recover_temps(mdir)
                names = pipeline.scan(mdir, listing, sort=False)
                if mdir.path in pipeline.unlisted:  # issue 13 item 3: no silent success
                    print(f"memstaged: {pipeline.unlisted[mdir.path]}", file=sys.stderr)
                    busy = True
                task = bar.add_task(
                    mdir.path, total=len(names), visible=len(names) >= PROGRESS_FROM
                )
                cache = seen_cache(settings, mdir)
                advance: Callable[[], None] = _nothing
                if show_progress and len(names) >= PROGRESS_FROM:
                    advance = functools.partial(bar.advance, task)
                results[mdir.path], unchanged[mdir.path] = _decide_all(
                    pipeline, mdir, names, advance, cache
                )
                if not settings.options.dry_run:
                    cache.save()
            finally:
                lock.release()
    _summary(out, results, settings.options.dry_run, unchanged)
    deferred = sum(c.get(Decision.DEFERRED.value, 0) for c in results.values())
    return 1 if deferred or busy else 0


def _nothing() -> None:
    """The progress bar's advance when no bar is shown (it costs microseconds per call)."""


def _summary(
    out: Console, results: dict[str, Counter[str]], dry_run: bool, unchanged: dict[str, int]
) -> None:
    if not out.is_terminal:  # one greppable line per memory dir for scripts and CI logs
        for path, counts in results.items():
            parts = " ".join(f"{d}={counts.get(d, 0)}" for d in _ORDER)
            suffix = " (dry run: nothing written)" if dry_run else ""
            out.print(
                f"{path}: {parts} total={sum(counts.values())} "
                f"unchanged={unchanged.get(path, 0)}{suffix}",
                highlight=False,
                soft_wrap=True,
            )
        return
    table = Table(title="memstaged --once" + (" (dry run: nothing written)" if dry_run else ""))
    table.add_column("memory dir")
    for decision in _ORDER:
        table.add_column(decision, justify="right")
    table.add_column("total", justify="right")
    for path, counts in results.items():
        table.add_row(path, *(str(counts.get(d, 0)) for d in _ORDER), str(sum(counts.values())))
    out.print(table)
    skipped = sum(unchanged.values())
    if skipped:
        out.print(f"{skipped} files unchanged since they were decided were not read again.")


def _logger() -> Any:
    from memstaged.log import get_logger

    return get_logger()
