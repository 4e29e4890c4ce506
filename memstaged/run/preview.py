"""A read-only look at one staging file: what it would get now.

Nothing here writes, renames or deletes: ``memstaged status``, ``check`` and ``deadletter
recover --dry-run`` must be safe to run at any time, next to a daemon and a reconciler. A file
is read as the pipeline reads it and decided by the same :func:`~memstaged.core.decide.decide`
the daemon calls, so a preview cannot disagree with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import msgspec

from memstaged.core.decide import Decision, Verdict, decide
from memstaged.core.timestamps import format_epoch_ms
from memstaged.files import fsio
from memstaged.files.memdir import STAGING, MemoryDir, Options, is_staging_name
from memstaged.files.version import CANNOT_READ, VANISHED, FirstSeen, Skip, read_version


class StagingEntry(msgspec.Struct, frozen=True):
    """One staging-file name and the decision it would get now."""

    name: str
    decision: str
    reason: str | None
    mtime: float | None
    size: int | None


def iter_staging(
    mdir: MemoryDir, options: Options, clock: float
) -> Iterator[tuple[StagingEntry, Verdict | None, bytes | None]]:
    """Every staging-file name with its verdict and bytes (``None`` when not read).

    Raises :class:`OSError` when the memory dir or ``staging/`` cannot be opened (``ELOOP`` for a
    symbolic link); a missing ``staging/`` has no files.
    """
    with fsio.opened_dir(mdir.path) as mem_fd:
        try:
            staging_fd = fsio.open_dir(STAGING, mem_fd)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            for name in sorted(n for n in os.listdir(staging_fd) if is_staging_name(n)):
                found = decide_entry(mdir, staging_fd, name, options, clock)
                if found is not None:
                    yield found
        finally:
            os.close(staging_fd)


def decide_entry(
    mdir: MemoryDir, staging_fd: int, name: str, options: Options, clock: float
) -> tuple[StagingEntry, Verdict | None, bytes | None] | None:
    """``staging/<name>`` read (never followed, never written) and decided; ``None`` if gone.

    Read by :func:`memstaged.files.version.read_version`, as ``--once`` and the daemon read it, so
    that
    ``check``, ``status`` and recovery give the answer a run would: a file memstaged may not
    read, or one being written, is ``deferred`` with the reason (SPEC 5), and a file dated in
    the future counts as changed now.
    """
    try:
        read = read_version(staging_fd, name, options.max_file_size)
    except OSError as err:  # what --once logs as deferred, and retries
        st = fsio.lstat_at(staging_fd, name)
        if st is None:
            return None
        reason = f"{CANNOT_READ}: {err.strerror}"
        entry = StagingEntry(name, Decision.DEFERRED.value, reason, st.st_mtime, st.st_size)
        return entry, None, None
    if isinstance(read, Skip):
        if read.reason == VANISHED:
            return None
        ident = read.identity
        mtime = None if ident is None else ident.mtime_ns / 1e9
        size = None if ident is None else ident.size
        if read.decision == Decision.SKIPPED.value:
            mtime = size = None
        return StagingEntry(name, read.decision, read.reason, mtime, size), None, None
    with read as version:
        if version.data is None:
            size = version.identity.size
            reason = f"file too large ({size} bytes, limit {options.max_file_size})"
            entry = StagingEntry(name, Decision.QUARANTINED.value, reason, version.mtime, size)
            return entry, None, None
        changed_at = FirstSeen().changed_at(version, clock)
        settled = clock - changed_at >= options.settle
        decided_at = format_epoch_ms(int(clock * 1000))
        ctx = mdir.context(name, options, settled=settled, decided_at=decided_at)
        verdict = decide(version.data, ctx)
        first = verdict.reasons[0] if verdict.reasons else None
        size = version.identity.size
        entry = StagingEntry(name, verdict.decision.value, first, version.mtime, size)
        return entry, verdict, version.data
