"""``deadletter purge``: deleting dead-letter records and the originals no record needs.

Planned without the lock (:func:`plan_purge` on a listing), carried out as ``UNLINK``
:class:`~memstaged.files.plan.Plan` values through :func:`memstaged.deadletter.changes.transacting`,
in short transactions, each deleting only files that are still the very files that were read.
:func:`drop_originals` is also how ``deadletter recover`` deletes the originals of the records
it recovered: under the lock, before it commits, it looks at the records present then
(:func:`references_now`) and leaves every original one of them needs.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from memstaged.core.records import ORIGINALS_DIR
from memstaged.deadletter.changes import Waiter, announcer, held_records, transacting
from memstaged.deadletter.store import (
    Original,
    RecordFile,
    is_record_name,
    list_originals,
    list_records,
    read_record,
)
from memstaged.errors import BusyError, ConfigError
from memstaged.files import fsio
from memstaged.files.fsio import Identity
from memstaged.files.memdir import DEADLETTER, MemoryDir
from memstaged.files.plan import Action, Held, Plan, Settled, so_far

_HASH16: Final = re.compile(r"-([0-9a-f]{16})-")


def plan_purge(
    records: Sequence[RecordFile],
    originals: Sequence[Original],
    *,
    cutoff: dt.datetime | None,
    select: Callable[[RecordFile], bool] | None = None,
) -> tuple[list[RecordFile], list[Original]]:
    """The records dead-lettered before ``cutoff`` (any age when ``None``) that ``select``
    chooses (all when ``None``), and the originals that go with them.

    An original goes when no remaining record needs it and either a purged record named it or,
    in a purge by age alone, it is itself older than ``cutoff`` (an original whose records were
    deleted by other tools). A purge of chosen records (``--id``, ``--session``) deletes only
    their own originals.
    """

    def chosen(r: RecordFile) -> bool:
        return (cutoff is None or r.when < cutoff) and (select is None or select(r))

    old = [r for r in records if chosen(r)]
    kept = [r for r in records if not chosen(r)]
    names, hashes = referenced(kept)
    named_by_old, _ = referenced(old)
    orphans_too = cutoff is not None and select is None
    drop = [
        o
        for o in originals
        if not still_needed(o.name, names, hashes)
        and (
            o.name in named_by_old
            or (
                orphans_too
                and cutoff is not None
                and dt.datetime.fromtimestamp(o.mtime, dt.UTC) < cutoff
            )
        )
    ]
    return old, drop


def referenced(records: Iterable[RecordFile]) -> tuple[set[str], set[str]]:
    """The originals records name, and the hashes of unreadable records (which might name one)."""
    names: set[str] = set()
    hashes: set[str] = set()
    for record in records:
        if record.original is not None:
            names.add(record.original)
        elif record.kind == "unreadable":
            match = _HASH16.search(record.name)
            if match:
                hashes.add(match[1])
    return names, hashes


def still_needed(original: str, names: set[str], hashes: set[str]) -> bool:
    """Whether some remaining record needs ``original`` (or might: an unreadable one)."""
    return original in names or any(f".{h}." in original for h in hashes)


def references_now(
    mdir: MemoryDir, mem_fd: int, known: Mapping[str, RecordFile]
) -> tuple[set[str], set[str]]:
    """:func:`referenced` for the records in ``deadletter/`` now, under the lock.

    Only the records that are not in ``known`` as the very same file are read again (those the
    daemon wrote meanwhile, say), so that the lock is held for a listing and a stat per record,
    not for reading the whole store.
    """
    current: list[RecordFile] = []
    try:
        dl_fd = fsio.open_dir(DEADLETTER, mem_fd)
    except (FileNotFoundError, NotADirectoryError):
        return set(), set()
    try:
        for name in sorted(n for n in os.listdir(dl_fd) if is_record_name(n)):
            st = fsio.lstat_at(dl_fd, name)
            if st is None:
                continue
            seen = known.get(name)
            if seen is not None and seen.identity is not None and Identity.of(st) == seen.identity:
                current.append(seen)
                continue
            record = read_record(mdir, dl_fd, name)
            if record is not None:
                current.append(record)
    finally:
        os.close(dl_fd)
    return referenced(current)


class Purged(msgspec.Struct, kw_only=True):
    """What :func:`purge` did in one memory dir."""

    deleted: list[RecordFile]
    originals: list[str]
    #: record name -> why it is still there (changed meanwhile, could not be deleted)
    left: dict[str, str]
    #: records not looked at again because the memory dir was busy, and why
    not_tried: list[RecordFile]
    busy: str | None = None
    #: An I/O error that stopped the purge after it began (what was deleted is listed above).
    error: str | None = None


#: Records deleted in one transaction: a few milliseconds of unlinks under the lock.
PURGE_CHUNK: Final = 256


def purge(
    mdir: MemoryDir,
    *,
    cutoff: dt.datetime | None,
    waiter: Waiter,
    logger: Any,
    select: Callable[[RecordFile], bool] | None = None,
) -> Purged:
    """Delete the records dead-lettered before ``cutoff`` that ``select`` chooses (see
    :func:`plan_purge`) and the originals that go with them.

    Planned without the lock (:func:`plan_purge` on a listing), carried out through
    :func:`transact` in short transactions, each deleting only records that are still the very
    files that were read (one the daemon quarantined again meanwhile has changed, and stays).
    Originals go last, once no record present then needs them, the daemon's newest included.
    """
    records = list_records(mdir)
    old, originals = plan_purge(records, list_originals(mdir), cutoff=cutoff, select=select)
    done = Purged(deleted=[], originals=[], left={}, not_tried=[])
    if not old and not originals:
        return done
    try:
        with fsio.opened_dir(mdir.path) as mem_fd:
            for start in range(0, len(old), PURGE_CHUNK):
                chunk = old[start : start + PURGE_CHUNK]
                event = {
                    "event": "deadletter_purging",
                    "memory_dir": mdir.path,
                    "records": [r.name for r in chunk],
                }
                plan = Plan(key="records", action=Action.UNLINK, removes=held_records(chunk))
                try:
                    # Nothing in staging/ is changed or depended on: mem_fd stands in for it.
                    with transacting(
                        mdir, mem_fd, mem_fd, [plan], waiter=waiter, logger=logger
                    ) as tx:
                        applied = tx.commit(announce=announcer(logger, {plan.key: event}))
                    result = applied.results[plan.key]
                except BusyError as err:
                    done.busy, done.not_tried = str(err), old[start:]
                    return done
                except OSError as err:  # some of the chunk may be gone: say which, and stop
                    done.error = f"{mdir.path}: {err.strerror or err}"
                    before = so_far(err, plan.key)
                    removed = set(before.removed)
                    done.deleted += [r for r in chunk if r.name in removed]
                    done.left.update(before.left)
                    gone = removed | set(before.left)
                    done.not_tried = [r for r in old[start:] if r.name not in gone]
                    return done
                done.left.update(result.left)
                done.deleted += [r for r in chunk if r.name not in result.left]
            if not originals:
                return done
            gone = {r.name for r in done.deleted}
            keep = {r.name: r for r in records if r.name not in gone}
            try:
                done.originals = drop_originals(
                    mdir, mem_fd, [o.name for o in originals], keep, waiter=waiter, logger=logger
                )
            except BusyError as err:
                done.busy = f"{err} (the originals of the deleted records are still there)"
            except OSError as err:
                done.error = (
                    f"{mdir.path}: {err.strerror or err} (the originals of the deleted records "
                    "may still be there)"
                )
    except OSError as err:  # the memory dir could not be opened: nothing was done
        raise ConfigError(f"{mdir.path}: {err.strerror}") from None
    return done


def drop_originals(
    mdir: MemoryDir,
    mem_fd: int,
    names: Sequence[str],
    keep: Mapping[str, RecordFile],
    *,
    waiter: Waiter,
    logger: Any,
) -> list[str]:
    """Delete the originals of ``names`` that no record present now needs, in one transaction.

    ``keep`` are the records known to be there still (as read): under the lock only the others
    are read again (:func:`references_now`), the records the daemon wrote meanwhile included.
    Returns the originals deleted.
    """
    where = f"{DEADLETTER}/{ORIGINALS_DIR}"
    try:
        or_fd = fsio.open_dir(where, mem_fd)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        found = [(n, fsio.lstat_at(or_fd, n)) for n in names]
    finally:
        os.close(or_fd)
    plans = [
        Plan(key=name, action=Action.UNLINK, removes=(Held(where, name, Identity.of(st)),))
        for name, st in found
        if st is not None
    ]
    if not plans:
        return []

    def announce(live: Sequence[Settled]) -> None:
        from memstaged.log.writer import durable

        with durable():
            logger.info(
                "deadletter_originals_deleting",
                memory_dir=mdir.path,
                originals=[s.key for s in live],
            )

    def needed(live: Sequence[Plan]) -> dict[str, str]:
        """Under the lock: the originals a record present now needs (the daemon's newest too)."""
        if not live:
            return {}
        names, hashes = references_now(mdir, mem_fd, keep)
        why = "a record present now needs it"
        return {p.key: why for p in live if still_needed(p.key, names, hashes)}

    with transacting(mdir, mem_fd, mem_fd, plans, waiter=waiter, logger=logger) as tx:
        applied = tx.commit(announce=announce, refused=needed(tx.live))
    return [name for r in applied.results.values() for name in r.removed]
