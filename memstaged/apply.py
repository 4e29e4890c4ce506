"""Step 4 of the flow: carry out any number of plans as one durable transaction (SPEC 5).

:func:`apply` is the only code that changes ``staging/`` or ``deadletter/`` for a decision: the
daemon applies a transaction of one plan, ``--once`` one of up to a batch. It writes every
dead-letter temp (the original, then each record: rendered, written, dropped; only one is in
memory at a time, SPEC 4): with more than :data:`_FSYNC_EACH` of them, before the lock, made
durable by one ``syncfs``, so that a large quarantine writes nothing while the lock is held
(SPEC 5: about a second at most); with 16 or fewer, under the lock (before step 2), each fsynced,
which costs no more. Then, under ``canonical-writer.lock``, it

1. hands back at once every plan whose version is no longer in place (nothing written);
2. settles every dead-letter name: what is already at a name is never trusted (SPEC 4): the
   same bytes are kept (and their age refreshed), an earlier record of the same quarantine is
   replaced (refreshing its age), anything else makes it write under another name; records
   whose original must take another name than the one they were rendered for are written again;
3. announces the decisions (the caller logs them and makes the log durable): nothing is
   carried out unlogged (issue 10, item 5);
4. writes the rewrites' temps and makes them durable (one ``syncfs`` for a batch, an fsync for
   one plan), gives the dead-letter files their names and fsyncs their directories;
5. replaces (``RENAME_EXCHANGE``), removes or moves each staging file, checking that what it
   displaced is exactly the version that was decided (inode, size, mtime and bytes); a writer's
   newer version is kept as a new staging file, never lost; then fsyncs ``staging/``.

``deadletter recover`` and ``purge`` apply their own :class:`~memstaged.plan.Change` values
through the same :func:`apply`, in the same order: a new staging file is written as a temp named
as a partial write and made durable (before the lock, as a too-large file's copy is), then,
under the lock, every file a change depends on is checked, the caller's own check runs
(``admit``), the changes are announced, the new files get free names (``RENAME_NOREPLACE``),
``staging/`` is fsynced, and only then are dead-letter files removed, each only if it is still
the very file that was read, and their directories fsynced (SPEC 5: a record goes only once its
candidate is durable in ``staging/``).

Crash recovery of temp files (:func:`recover_temps`) lives here too: it undoes exactly what a
killed :func:`apply` may leave.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, Final, NamedTuple, overload

from memstaged import fsio
from memstaged.fsio import Identity
from memstaged.locks import LockHeld, LockInfo, canonical_lock, read_lock, remove_stale_own_lock
from memstaged.memdir import DEADLETTER, STAGING
from memstaged.plan import Ahead, Change, Held, Kind, Plan, Written
from memstaged.progress import tick
from memstaged.quarantine import ORIGINALS_DIR, DeadLetter

#: Keeps a displaced writer version as a new staging file: (dir of it, its name, staging/'s
#: descriptor, the staging name it was displaced from) -> the name it now has.
Park = Callable[[int, str, int, str], str]
#: Up to this many dead-letter temps in a transaction are fsynced one by one; more, one syncfs.
_FSYNC_EACH: Final = 16
#: How many other names are tried for a dead-letter file whose name is taken.
_ALT_NAMES: Final = 100
#: The caller's own check of its changes under the lock: change key -> why it is refused.
Admit = Callable[[Sequence[Change]], Mapping[str, str]]
#: How many names ``<base>.recovered-<n>.json`` a new staging file may try.
_CREATE_NAMES: Final = 100_000


class Applied(Enum):
    DONE = "done"
    CONFLICT = "conflict"
    GONE = "gone"
    #: The file cannot be moved into ``deadletter/`` (another file system): left where it is.
    UNMOVABLE = "unmovable"


class Result(NamedTuple):
    applied: Applied
    #: The identity of the version now decided: for a repair, the rewrite put in place.
    identity: Identity


class _File(NamedTuple):
    """A dead-letter file to put in place: where, its final name, how, and its durable temp."""

    dir_fd: int
    name: str
    #: "install" (the name is free), "refresh" (it holds these bytes), "replace" (it holds an
    #: earlier record of the same quarantine).
    how: str
    #: The temp written and made durable before the lock (None: a refresh needs none).
    tmp: str | None


class _Store:
    """``deadletter/`` and ``originals/`` of one transaction, opened (and created) on first use."""

    def __init__(self, mem_fd: int) -> None:
        self.mem_fd = mem_fd
        self.fds: tuple[int, int] | None = None

    def open(self) -> tuple[int, int]:
        if self.fds is None:
            try:
                dl_fd = fsio.open_dir(DEADLETTER, self.mem_fd, create=True)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(
                        err.errno,
                        "deadletter/ is a symbolic link or not a directory: never followed",
                    ) from None
                raise
            try:
                or_fd = fsio.open_dir(ORIGINALS_DIR, dl_fd, create=True)
            except OSError as err:
                os.close(dl_fd)
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    what = "deadletter/originals/ is a symbolic link or not a directory"
                    raise OSError(err.errno, f"{what}: never followed") from None
                raise
            self.fds = (dl_fd, or_fd)
        return self.fds

    def close(self) -> None:
        for fd in self.fds or ():
            os.close(fd)
        self.fds = None


def _holds(dir_fd: int, name: str, body: bytes) -> bool | None:
    """Is ``name`` a regular file with exactly ``body``? ``None`` when the name is free."""
    st = fsio.lstat_at(dir_fd, name)
    if st is None:
        return None
    try:
        with fsio.open_regular(dir_fd, name) as (fd, fst):
            return fst.st_size == len(body) and fsio.read_fd_at(fd, len(body) + 1) == body
    except OSError:
        return False  # a link, a FIFO, unreadable: not ours to trust


def _holds_written(dir_fd: int, name: str, written: Written) -> bool | None:
    """Is ``name`` a regular file with exactly the bytes of the temp ``written``? ``None``: free.

    Compared on disk, in bounded chunks: under the lock no record is rendered (SPEC 4, 5).
    """
    st = fsio.lstat_at(dir_fd, name)
    if st is None:
        return None
    try:
        with fsio.open_regular(dir_fd, name) as (fd, fst):
            if fst.st_size != written.size:
                return False
            with fsio.open_regular(dir_fd, written.tmp) as (tmp_fd, _tst):
                return fsio.hash_fd(fd) == fsio.hash_fd(tmp_fd)
    except OSError:
        return False  # a link, a FIFO, unreadable: not ours to trust


def _same_quarantine(dir_fd: int, name: str, record: DeadLetter, size: int) -> bool:
    """Is ``name`` a record memstaged wrote for the same bytes (an earlier quarantine of them)?

    ``size`` is the size of the record as it is now rendered.
    """
    try:
        with fsio.open_regular(dir_fd, name) as (fd, fst):
            if fst.st_size > 4 * size + 65536:
                return False
            old = json.loads(fsio.read_fd_at(fd, fst.st_size + 1))
    except (OSError, ValueError):
        return False
    if not isinstance(old, dict) or not isinstance(old.get("memstaged"), dict):
        return False
    marks = record.marks()
    keys = ("sha256", "source_file", "original")
    return (
        all(old["memstaged"].get(k) == marks[k] for k in keys)
        and old.get("category") == marks["category"]
    )


def _alt_name(dir_fd: int, name: str, taken: set[str]) -> str:
    """Another free name for ``name``: ``<stem>.<n>.json`` (or ``<name>.<n>`` for originals)."""
    base, dot, ext = name.rpartition(".")
    for n in range(2, _ALT_NAMES + 2):
        alt = f"{base}.{n}.{ext}" if dot else f"{name}.{n}"
        if alt not in taken and fsio.lstat_at(dir_fd, alt) is None:
            return alt
    raise OSError(errno.EEXIST, "no free name in deadletter/", name)


def _settle_original(plan: Plan, or_fd: int, taken: set[str]) -> _File | None:
    """The original's file, under a name that is safe to use; the records point at that name.

    Run once before the lock (so that the records are rendered for the name they will most
    likely keep) and again under it, where what is at the name is checked for real.
    """
    base = plan.original
    assert base is not None
    name, file = base, None
    if plan.kind is Kind.MOVE or plan.copied is not None:
        if fsio.lstat_at(or_fd, name) is not None or name in taken:
            name = _alt_name(or_fd, name, taken)
        if plan.copied is not None:
            file = _File(or_fd, name, "install", plan.copied)
    else:
        assert plan.version.data is not None
        held = _holds(or_fd, name, plan.version.data) if name not in taken else False
        if held is False:
            name = _alt_name(or_fd, name, taken)
        file = _File(or_fd, name, "refresh" if held else "install", plan.ahead.original)
    taken.add(name)
    if name != base:
        for r in plan.records:
            r.point_at(name)
        _repairs_point_at(plan.event, base, name)
        plan.original = name
    return file


def _settle_names(
    plan: Plan, store: _Store, taken: set[str], rerender: Callable[[Plan], None]
) -> list[_File]:
    """The dead-letter files of a plan, each with a name that is safe to use (SPEC 4).

    Under the lock. The records' temps are written already; if the original must take
    another name than the one they were rendered for (something took it since), ``rerender``
    writes them again, pointing at the new name (rare).
    """
    if plan.original is None and not plan.records:
        return []
    dl_fd, or_fd = store.open()
    files: list[_File] = []
    if plan.original is not None:
        rendered_for = plan.original
        file = _settle_original(plan, or_fd, taken)
        if file is not None:
            files.append(file)
        if plan.original != rendered_for and plan.records:
            rerender(plan)
    records: list[DeadLetter] = []
    for record, written in zip(plan.records, plan.ahead.records, strict=True):
        name = record.name
        held = _holds_written(dl_fd, name, written) if name not in taken else False
        how = "refresh" if held else "install"
        if held is False:
            if name not in taken and _same_quarantine(dl_fd, name, record, written.size):
                how = "replace"
            else:
                name = _alt_name(dl_fd, name, taken)
        taken.add(name)
        files.append(_File(dl_fd, name, how, None if held else written.tmp))
        records.append(record.renamed(name) if name != record.name else record)
    plan.records = records
    _name_in_event(plan)
    return files


def _repairs_point_at(event: dict[str, Any], old: str, new: str) -> None:
    """An R6 repair in the log names the file that really holds the original (SPEC 3, R6)."""
    before, after = f"{DEADLETTER}/{ORIGINALS_DIR}/{old}", f"{DEADLETTER}/{ORIGINALS_DIR}/{new}"
    for repair in event.get("repairs", ()):
        wrote = repair.get("wrote")
        if isinstance(wrote, dict) and wrote.get("original") == before:
            wrote["original"] = after


def _name_in_event(plan: Plan) -> None:
    """The log names the dead-letter files as they are really called (SPEC 7)."""
    names = [f"{DEADLETTER}/{r.name}" for r in plan.records]
    if plan.original is not None:
        names.append(f"{DEADLETTER}/{ORIGINALS_DIR}/{plan.original}")
    if names:
        plan.event["deadletter"] = names


def _install(file: _File) -> None:
    """Give a complete, durable temp its final name; refresh the age of what is kept (SPEC 4)."""
    if file.how == "refresh" or file.tmp is None:
        os.utime(file.name, dir_fd=file.dir_fd, follow_symlinks=False)
    elif file.how == "replace":
        os.rename(file.tmp, file.name, src_dir_fd=file.dir_fd, dst_dir_fd=file.dir_fd)
    else:
        fsio.rename_noreplace(file.dir_fd, file.tmp, file.dir_fd, file.name)


def _no_park(_from_fd: int, tmp: str, _staging_fd: int, _name: str) -> str:
    """A transaction of changes displaces no staging file, so it never has one to keep."""
    raise OSError(errno.EINVAL, "nothing may be displaced here", tmp)


@overload
def apply(
    mem_fd: int,
    staging_fd: int,
    plans: Sequence[Plan],
    *,
    announce: Callable[[Sequence[Plan]], None],
    on_stale: Callable[[LockInfo, bool], None],
    park: Park,
    max_copy: int = ...,
) -> dict[str, Result]: ...


@overload
def apply(
    mem_fd: int,
    staging_fd: int,
    plans: Sequence[Change],
    *,
    announce: Callable[[Sequence[Change]], None],
    on_stale: Callable[[LockInfo, bool], None],
    admit: Admit | None = ...,
) -> dict[str, Result]: ...


def apply(
    mem_fd: int,
    staging_fd: int,
    plans: Sequence[Plan] | Sequence[Change],
    *,
    announce: Callable[[Sequence[Any]], None],
    on_stale: Callable[[LockInfo, bool], None],
    park: Park = _no_park,
    max_copy: int = 1 << 30,
    admit: Admit | None = None,
) -> dict[str, Result]:
    """Carry ``plans`` out as one transaction; see the module docstring for the order.

    A too-large file that cannot be moved by a rename (``deadletter/`` on another file system)
    is first copied, at most ``max_copy`` bytes in bounded chunks, before the lock is taken:
    the lock is never held for a copy (SPEC 5: about a second at most). So are the new staging
    files of :class:`~memstaged.plan.Change` values written and made durable.

    Returns the result of each :class:`~memstaged.plan.Plan` by its name; what became of each
    change is written into it (``created``, ``removed``, ``left``, ``stale``, ``refused``,
    ``failed``). ``admit`` is called under the lock with the changes whose files are still in
    place, and refuses those it names (nothing of them is carried out).

    Raises :class:`~memstaged.locks.LockHeld` (nothing changed) when a live process holds
    ``canonical-writer.lock``, and ``OSError`` when the transaction could not be completed (what
    was not carried out is unchanged; nothing is lost either way).
    """
    results: dict[str, Result] = {}
    files = [p for p in plans if isinstance(p, Plan)]
    changes = [p for p in plans if isinstance(p, Change)]
    tx = _Transaction(mem_fd, staging_fd, park)
    try:
        for plan in files:
            if plan.kind is Kind.MOVE:
                tx.copy_if_unmovable(plan, max_copy)
        tx.write_ahead(changes)
        if _dead_letter_files(files) > _FSYNC_EACH:
            _not_held(mem_fd)  # nothing is written while the reconciler works, if it can be seen
            tx.write_records_ahead(files, sync=False)
        with canonical_lock(mem_fd, on_stale):
            _apply_locked(tx, files, announce, results, changes, admit)
    except BaseException as exc:
        # An error: remove our temps. A stop or Ctrl-C (not an Exception): leave them, as a
        # kill would, for the next start's recovery (SPEC 6: acted on within a second).
        tx.close(interrupted=not isinstance(exc, Exception))
        raise
    tx.close()
    return results


def _dead_letter_files(plans: Sequence[Plan]) -> int:
    """How many dead-letter files the plans write (at most: a record per record, an original)."""
    return sum(len(p.records) + (p.original is not None) for p in plans if p.unmovable is None)


def _not_held(mem_fd: int) -> None:
    """Raise :class:`~memstaged.locks.LockHeld` now if a live process holds the lock."""
    try:
        info = read_lock(mem_fd)
    except OSError:
        return  # taking the lock will tell
    if info is not None and info.alive:
        raise LockHeld(info)


def _apply_locked(
    tx: _Transaction,
    plans: Sequence[Plan],
    announce: Callable[[Sequence[Any]], None],
    results: dict[str, Result],
    changes: Sequence[Change] = (),
    admit: Admit | None = None,
) -> None:
    """Steps 1-5 of the module docstring, with every temp file already durable."""
    mem_fd, staging_fd = tx.mem_fd, tx.staging_fd
    live: list[Plan] = []
    for plan in plans:
        if plan.unmovable is not None:
            results[plan.name] = Result(Applied.UNMOVABLE, plan.version.identity)
            continue
        state = plan.version.still_in_place(staging_fd)
        if state:
            live.append(plan)
        else:
            applied = Applied.GONE if state is None else Applied.CONFLICT
            results[plan.name] = Result(applied, plan.version.identity)
    admitted = _admitted(mem_fd, staging_fd, changes, admit)
    if live or admitted:
        results.update(tx.run(live, announce, admitted))


class _Transaction:
    """The temp files of one :func:`apply` and the steps that turn them into changes."""

    def __init__(self, mem_fd: int, staging_fd: int, park: Park) -> None:
        self.mem_fd = mem_fd
        self.staging_fd = staging_fd
        self.park = park
        self.store = _Store(mem_fd)
        #: Temp files not yet installed or handed on: removed if the transaction stops.
        self.ours: set[tuple[int, str]] = set()
        #: The descriptors holding the ``flock`` of new staging files' temps (see
        #: :meth:`write_ahead`), closed once each temp is renamed or removed.
        self.held: dict[tuple[int, str], int] = {}
        #: Whether the dead-letter temps are written (before the lock, or under it in ``run``).
        self.written_ahead = False

    def copy_if_unmovable(self, plan: Plan, max_copy: int) -> None:
        """SPEC 6: where a rename is impossible, copy at most ``max_copy`` bytes, or leave it."""
        or_fd = self.store.open()[1]
        if os.fstat(or_fd).st_dev == plan.version.identity.dev:
            return  # one file system: moved by a rename
        size = plan.version.identity.size
        if size > max_copy:
            plan.unmovable = f"larger than max_quarantine_copy ({max_copy} bytes)"
            return
        tmp, _sha, _size = fsio.copy_to_temp(plan.version.fd, or_fd, "orig", plan.name, most=size)
        self.ours.add((or_fd, tmp))
        fsio.crash_point("copy-written")
        plan.copied = tmp
        plan.kind = Kind.REMOVE

    def close(self, *, interrupted: bool = False) -> None:
        """Remove the temps not installed, and close the directories.

        ``interrupted`` (a stop's :class:`~memstaged.daemon.Abandoned`, Ctrl-C): the temps are
        left, exactly as a kill would leave them, for the next start's crash recovery to
        remove: a quarantine of 100,000 records has as many temps, and unlinking them would
        keep a SIGTERM waiting for seconds (SPEC 6: acted on within a second). They carry
        memstaged's temp names, which the reconciler never reads.
        """
        if not interrupted:
            for dir_fd, tmp in self.ours:
                fsio.unlink_quietly(dir_fd, tmp)
        self.ours.clear()
        for fd in self.held.values():  # after the unlinks: a temp is never named and unlocked
            os.close(fd)
        self.held.clear()
        self.store.close()

    def write_records_ahead(self, plans: Sequence[Plan], *, sync: bool) -> None:
        """Write every dead-letter temp of ``plans`` and make them durable (fsyncs or a syncfs).

        Streaming: a record is rendered, written and dropped, so a file of 100,000 candidates
        never has their records in memory together (SPEC 4). With more than
        :data:`_FSYNC_EACH` files this runs before the lock (one ``syncfs``), so that the lock
        is held only for names, renames and fsyncs of directories (SPEC 5: about a second at
        most); the temps carry memstaged's temp names: the reconciler never reads them, and
        recovery after a crash deletes them. A few files are written under the lock, each
        fsynced (as cheap as that, and nothing at all appears while the reconciler works).
        """
        work = [p for p in plans if p.unmovable is None and (p.records or p.original)]
        self.written_ahead = True
        if not work:
            return
        dl_fd, or_fd = self.store.open()
        taken: set[str] = set()
        for plan in work:
            original = None
            if plan.original is not None:
                _settle_original(plan, or_fd, taken)  # a first choice, checked under the lock
                if plan.kind is not Kind.MOVE and plan.copied is None:
                    assert plan.version.data is not None
                    original = fsio.write_temp(
                        or_fd, plan.version.data, "rec", plan.original, sync=sync
                    )
                    self.ours.add((or_fd, original))
            plan.ahead = Ahead(self._write_records(plan, dl_fd, sync=sync), original)
        if not sync:
            fsio.syncfs(self.mem_fd)  # every dead-letter temp's data is durable from here on
        fsio.crash_point("temps-synced")

    def _write_records(self, plan: Plan, dl_fd: int, *, sync: bool) -> list[Written]:
        """Each record's temp, rendered one at a time (its bytes are dropped once written)."""
        written: list[Written] = []
        for record in plan.records:
            tick()  # each record is rendered and written: thousands of them take seconds
            body = record.body
            tmp = fsio.write_temp(dl_fd, body, "rec", record.name, sync=sync)
            self.ours.add((dl_fd, tmp))
            written.append(Written(tmp, len(body)))
            del body
        return written

    def _rerender(self, plan: Plan) -> None:
        """Under the lock, rare: the records point at the original's new name; written again."""
        dl_fd = self.store.open()[0]
        for old in plan.ahead.records:
            fsio.unlink_quietly(dl_fd, old.tmp)
            self.ours.discard((dl_fd, old.tmp))
        plan.ahead = Ahead(self._write_records(plan, dl_fd, sync=True), plan.ahead.original)

    def run(
        self,
        live: list[Plan],
        announce: Callable[[Sequence[Any]], None],
        changes: Sequence[Change] = (),
    ) -> dict[str, Result]:
        if not self.written_ahead:
            self.write_records_ahead(live, sync=True)  # a few files: under the lock
        taken: set[str] = set()
        files = [_settle_names(plan, self.store, taken, self._rerender) for plan in live]
        _settle_created(self.staging_fd, changes)
        changes = [c for c in changes if c.failed is None]
        announce([*live, *changes])
        batch = len(live) > 1
        rewrites = {p.name: self._rewrite_temp(p, batch) for p in live if p.kind is Kind.REWRITE}
        fsio.crash_point("batch-written")
        if batch and rewrites:
            fsio.syncfs(self.mem_fd)  # every rewrite's data is durable from here on
        for plan_files in files:
            for file in plan_files:
                tick()
                _install(file)
                if file.how != "refresh" and file.tmp is not None:
                    self.ours.discard((file.dir_fd, file.tmp))
                is_original = self.store.fds is not None and file.dir_fd == self.store.fds[1]
                fsio.crash_point("original-written" if is_original else "record-written")
        if self.store.fds is not None:
            fsio.fsync_dir(self.store.fds[1])
            fsio.fsync_dir(self.store.fds[0])
            fsio.fsync_dir(self.mem_fd)
            fsio.crash_point("deadletter-synced")
        results = {}
        for plan in live:
            if plan.kind is Kind.REWRITE:
                tmp = self._ready(rewrites[plan.name], plan.name, batch)
                results[plan.name] = _replace(self.staging_fd, plan, tmp, self.park)
            elif plan.kind is Kind.REMOVE:
                results[plan.name] = _remove(self.staging_fd, plan, self.park)
            else:
                results[plan.name] = _move(self.staging_fd, self.store, plan, self.park)
        created = [c for c in changes if c.kind is Kind.CREATE and self._create(c, announce)]
        if live or created or any(h.where == STAGING for c in changes for h in c.depends):
            fsio.fsync_dir(self.staging_fd)
            if changes:
                fsio.crash_point("staging-synced")
        self._remove_held([c for c in changes if c.kind is Kind.DELETE or c.created is not None])
        return results

    def write_ahead(self, changes: Sequence[Change]) -> None:
        """Write the new staging files of ``changes`` as durable temps, before the lock.

        Each temp is named as a partial write until it gets its name under the lock: a
        memstaged starting after a crash deletes it (the records it holds are all still in the
        store) instead of keeping it as a staging file, which would stage its candidates twice.
        This process holds each temp's ``flock`` until then, so that a daemon starting while it
        runs (its crash recovery) leaves the temp alone: it is no leftover of a crash.
        """
        creates = [c for c in changes if c.kind is Kind.CREATE]
        batch = len(creates) > 1
        for change in creates:
            assert change.data is not None
            try:
                change.tmp, held = fsio.write_held_temp(
                    self.staging_fd,
                    change.data,
                    fsio.PARTIAL,
                    f"{change.base}.recovered.json",
                    sync=not batch,
                )
            except OSError as err:
                change.failed = f"could not write the staging file: {err.strerror or err}"
                continue
            self.ours.add((self.staging_fd, change.tmp))
            self.held[(self.staging_fd, change.tmp)] = held
        if batch and any(c.tmp is not None for c in creates):
            fsio.syncfs(self.mem_fd)  # every new staging file's data is durable from here on

    def _create(self, change: Change, announce: Callable[[Sequence[Any]], None]) -> bool:
        """Give a change's durable temp its free name in ``staging/``, never replacing a file."""
        assert change.tmp is not None and change.created is not None
        name = change.created
        while True:
            try:
                fsio.rename_noreplace(self.staging_fd, change.tmp, self.staging_fd, name)
                break
            except FileExistsError:
                # A writer took the name after it was settled: the next free one, announced too.
                free = _free_name(self.staging_fd, change.base, set())
                change.created = free
                if free is None:
                    change.failed = f"no free name for {change.base}.recovered-<n>.json"
                    return False
                name = free
                announce([change])
            except OSError as err:
                change.created = None
                change.failed = f"could not write the staging file: {err.strerror or err}"
                return False
        self.ours.discard((self.staging_fd, change.tmp))
        held = self.held.pop((self.staging_fd, change.tmp), None)
        if held is not None:
            os.close(held)  # renamed: no temp of that name is left to guard
        change.tmp = None
        fsio.crash_point("created")
        return True

    def _remove_held(self, changes: Sequence[Change]) -> None:
        """Remove each file of the changes that is still the very file that was read; fsync."""
        if not any(c.removes for c in changes):
            return
        synced: dict[str, int] = {}
        try:
            for change in changes:
                for held in change.removes:
                    fd = synced.get(held.where)
                    if fd is None:
                        fd = synced[held.where] = fsio.open_dir(held.where, self.mem_fd)
                    removed, why = _unlink_held(fd, held)
                    if removed:
                        change.removed.append(held.name)
                    elif why is not None:
                        change.left[held.name] = why
            for fd in synced.values():
                fsio.fsync_dir(fd)
            fsio.crash_point("store-synced")
        finally:
            for fd in synced.values():
                os.close(fd)

    def _rewrite_temp(self, plan: Plan, batch: bool) -> str:
        assert plan.new_bytes is not None
        # Named ``part`` until it is durable: recovery deletes ``part`` temps rather than
        # keeping them as versions.
        role = fsio.PARTIAL if batch else "new"
        tmp = fsio.write_temp(self.staging_fd, plan.new_bytes, role, plan.name, sync=not batch)
        self.ours.add((self.staging_fd, tmp))
        fsio.crash_point("temp-written")
        return tmp

    def _ready(self, tmp: str, name: str, batch: bool) -> str:
        """The durable rewrite under a ``new`` name, handed to :func:`_replace`."""
        self.ours.discard((self.staging_fd, tmp))
        if not batch:
            return tmp
        ready = fsio.temp_name("new", name)
        try:
            os.rename(tmp, ready, src_dir_fd=self.staging_fd, dst_dir_fd=self.staging_fd)
        except BaseException:
            self.ours.add((self.staging_fd, tmp))
            raise
        return ready


def _free_name(staging_fd: int, base: str, taken: set[str]) -> str | None:
    """The first ``<base>.recovered-<n>.json`` that names nothing in ``staging/``."""
    for n in range(1, _CREATE_NAMES):
        name = f"{base}.recovered-{n}.json"
        if name not in taken and fsio.lstat_at(staging_fd, name) is None:
            return name
    return None


def _settle_created(staging_fd: int, changes: Sequence[Change]) -> None:
    """The name each new staging file will get, so that it is announced before it is made."""
    taken: set[str] = set()
    for change in changes:
        if change.kind is not Kind.CREATE:
            continue
        name = _free_name(staging_fd, change.base, taken)
        if name is None:
            change.failed = f"no free name for {change.base}.recovered-<n>.json in staging/"
            continue
        taken.add(name)
        change.created = name


def _is_held(dir_fd: int, held: Held) -> str | None:
    """``None`` when ``held`` is still the file that was read, else ``gone`` or ``changed``."""
    st = fsio.lstat_at(dir_fd, held.name)
    if st is None:
        return "gone"
    if held.identity is not None and Identity.of(st) != held.identity:
        return "changed"
    return None


def _admitted(
    mem_fd: int, staging_fd: int, changes: Sequence[Change], admit: Admit | None
) -> list[Change]:
    """The changes whose files are all still as they were read and that ``admit`` lets through.

    A staging file a change depends on (one that holds candidates whose records it removes) is
    fsynced here, so that the record goes only once the candidate is durable (SPEC 5).
    """
    fds: dict[str, int | None] = {STAGING: staging_fd}
    live: list[Change] = []
    try:
        for change in changes:
            if change.failed is not None:
                continue  # its staging file could not be written
            for held in change.depends:
                if held.where not in fds:
                    try:
                        fds[held.where] = fsio.open_dir(held.where, mem_fd)
                    except (FileNotFoundError, NotADirectoryError):
                        fds[held.where] = None
                fd = fds[held.where]
                why = "gone" if fd is None else _is_held(fd, held)
                if why is None and held.where == STAGING:
                    why = _made_durable(staging_fd, held)
                if why is not None:
                    change.stale[held.name] = why
            if not change.stale:
                live.append(change)
    finally:
        for where, fd in fds.items():
            if where != STAGING and fd is not None:
                os.close(fd)
    refused = admit(live) if admit is not None and live else {}
    for change in live:
        change.refused = refused.get(change.key)
    return [c for c in live if c.refused is None]


def _made_durable(staging_fd: int, held: Held) -> str | None:
    """fsync a staging file a change depends on (``staging/`` follows); why not, else ``None``."""
    try:
        with fsio.open_regular(staging_fd, held.name) as (fd, st):
            if held.identity is not None and Identity.of(st) != held.identity:
                return "changed"
            os.fsync(fd)
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "changed"  # no longer a regular file we can read
    return None


def _unlink_held(dir_fd: int, held: Held) -> tuple[bool, str | None]:
    """Remove ``held`` if it is still the file that was read: (removed, why it is left).

    One already gone is what was wanted (not removed, not left). One changed meanwhile
    (quarantined again, edited) is someone's newer file: it stays.
    """
    why = _is_held(dir_fd, held)
    if why == "gone":
        return False, None
    if why == "changed":
        what = "record" if held.where == DEADLETTER else "file"
        return False, f"the {what} changed while this ran; it is left in place"
    try:
        os.unlink(held.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False, None
    except OSError as err:
        return False, f"cannot delete it: {err.strerror or err}"
    fsio.crash_point("unlinked")
    return True, None


def _replace(staging_fd: int, plan: Plan, tmp: str, park: Park) -> Result:
    """Atomically put the rewrite in place of exactly the version that was read.

    The exchange hands back whatever it displaced. If that is not the version that was read (a
    writer renamed or rewrote a newer one in between the check and the exchange), the writer's
    version is kept beside, under a ``.conflict-`` name, and never put back under the name: our
    rewrite was visible there for a moment, and a writer may be about to rename its next version
    over it, which would silently destroy the one put back.
    """
    version, name = plan.version, plan.name
    tmp_is_ours = True
    try:
        st = fsio.lstat_at(staging_fd, tmp)
        assert st is not None
        rewrite = Identity.of(st)
        state = version.still_in_place(staging_fd)
        if not state:
            return Result(Applied.GONE if state is None else Applied.CONFLICT, version.identity)
        try:
            fsio.exchange(staging_fd, tmp, name)
        except FileNotFoundError:
            return Result(Applied.GONE, version.identity)
        tmp_is_ours = False
        fsio.crash_point("exchanged")
        if version.is_displaced(staging_fd, tmp):
            os.unlink(tmp, dir_fd=staging_fd)
            fsio.crash_point("replaced")
            now = fsio.lstat_at(staging_fd, name)  # the exchange changed the rewrite's ctime
            if now is not None and now.st_ino == rewrite.ino:
                rewrite = Identity.of(now)
            return Result(Applied.DONE, rewrite)
        park(staging_fd, tmp, staging_fd, name)
        return Result(Applied.CONFLICT, version.identity)
    finally:
        if tmp_is_ours:
            fsio.unlink_quietly(staging_fd, tmp)


def _remove(staging_fd: int, plan: Plan, park: Park) -> Result:
    """Remove exactly the version that was read; a newer one is kept, never lost.

    The file is renamed away to a temp name and checked there. A writer's version caught by that
    rename is kept under a ``.conflict-`` name rather than renamed back: while the name was
    absent a writer may have started a fresh file, whose rename would destroy it.
    """
    version, name = plan.version, plan.name
    state = version.still_in_place(staging_fd)
    if not state:
        return Result(Applied.GONE if state is None else Applied.CONFLICT, version.identity)
    out = fsio.temp_name("out", name)
    try:
        os.rename(name, out, src_dir_fd=staging_fd, dst_dir_fd=staging_fd)
    except FileNotFoundError:
        return Result(Applied.GONE, version.identity)
    fsio.crash_point("renamed-away")
    if version.is_displaced(staging_fd, out):
        os.unlink(out, dir_fd=staging_fd)
        fsio.crash_point("removed")
        return Result(Applied.DONE, version.identity)
    park(staging_fd, out, staging_fd, name)
    return Result(Applied.CONFLICT, version.identity)


def _move(staging_fd: int, store: _Store, plan: Plan, park: Park) -> Result:
    """Move a too-large file itself into ``originals/`` by a rename (SPEC 6): no copy, no read.

    Its record is durable already. If what the rename moved is not the version that was decided
    (a writer renamed a new one in meanwhile), that version goes back to ``staging/`` under a
    new name, and the records written for the replaced one are taken back.
    """
    version, name = plan.version, plan.name
    dl_fd, or_fd = store.open()
    assert plan.original is not None
    state = version.still_in_place(staging_fd)
    if state:
        try:
            fsio.rename_noreplace(staging_fd, name, or_fd, plan.original)
        except FileNotFoundError:
            state = None
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            _take_back(dl_fd, plan)
            return Result(Applied.UNMOVABLE, version.identity)
    if not state:
        _take_back(dl_fd, plan)
        return Result(Applied.GONE if state is None else Applied.CONFLICT, version.identity)
    fsio.crash_point("moved")
    fsio.fsync_dir(or_fd)
    if version.is_displaced(or_fd, plan.original):
        return Result(Applied.DONE, version.identity)
    park(or_fd, plan.original, staging_fd, name)
    _take_back(dl_fd, plan)
    return Result(Applied.CONFLICT, version.identity)


def _take_back(dl_fd: int, plan: Plan) -> None:
    """Delete the records just written for a version that was not quarantined after all."""
    for record in plan.records:
        fsio.unlink_quietly(dl_fd, record.name)
    fsio.fsync_dir(dl_fd)


# -- after a crash ------------------------------------------------------------------------------


class Recovery:
    """What :func:`recover_temps` needs besides the memory dir: how to log and to decide."""

    def __init__(
        self,
        log: Any,
        park: Park,
        is_redundant: Callable[[bytes, bytes], bool],
        limit: int,
        on_stale: Callable[[LockInfo, bool], None],
    ) -> None:
        self.log = log
        self.park = park
        self.is_redundant = is_redundant
        self.limit = limit
        self.on_stale = on_stale


@contextmanager
def _opened(sub: str, mem_fd: int) -> Iterator[int | None]:
    try:
        fd = fsio.open_dir(sub, mem_fd) if sub != "." else os.dup(mem_fd)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def recover_temps(mem_fd: int, how: Recovery) -> list[str] | None:
    """Clean up what a killed memstaged left: delete only what is provably redundant.

    A stale ``canonical-writer.lock`` of memstaged's own is removed first (SPEC 5: at start, not
    only when a file is next decided there; issue 10, item 12). A temp file in the memory dir (a
    lock being taken) or in ``deadletter/`` only ever holds memstaged's own lock, record or
    copy: it is deleted. A temp file in ``staging/`` may hold a writer's version that was
    displaced at the moment of the crash, so it is deleted only when the same bytes (or their
    repair) are safe elsewhere; otherwise it is kept as a new staging file and decided on its
    own. A temp in ``staging/`` whose ``flock`` a live process holds (a recovery running beside
    this daemon, between writing its new staging file and naming it) is no leftover: it is left
    alone, and nothing is logged about it. Every directory is opened one component at a time
    without following a link (item 7).

    Returns the listing of ``staging/`` when it had no temp file (the usual case), so that a
    scan need not list a directory of thousands of files a second time.
    """
    try:
        info = read_lock(mem_fd)
        if info is not None and not info.alive:
            how.on_stale(info, remove_stale_own_lock(mem_fd, info))
    except FileNotFoundError:
        pass  # released meanwhile: nothing to clean up
    except OSError as err:
        how.log.error("lock_seen", lock="canonical-writer.lock", action=f"unreadable: {err}")
    for sub in (".", DEADLETTER, f"{DEADLETTER}/{ORIGINALS_DIR}"):
        with _opened(sub, mem_fd) as fd:
            if fd is None:
                continue
            deleted = 0
            for entry in os.listdir(fd):
                if fsio.parse_temp_name(entry) is not None:
                    fsio.unlink_quietly(fd, entry)
                    deleted += 1
            if deleted:  # one event: a stopped quarantine can leave 100,000 record temps
                how.log.info("temp_recovered", path=sub, deleted=deleted, action="deleted")
    with _opened(STAGING, mem_fd) as staging_fd:
        if staging_fd is None:
            return None
        names = os.listdir(staging_fd)
        temps = sorted([n for n in names if n.startswith(fsio.TEMP_PREFIX)])
        if not temps:
            return names
        for entry in temps:
            parsed = fsio.parse_temp_name(entry)
            if parsed is None or fsio.temp_in_use(staging_fd, entry):
                continue  # a live recovery's new staging file, not yet named: not a leftover
            if parsed[0] == fsio.PARTIAL:  # still being written: never anyone's version
                fsio.unlink_quietly(staging_fd, entry)
                how.log.info("temp_recovered", path=f"{STAGING}/{entry}", action="deleted")
                continue
            try:
                _recover_staging_temp(how, mem_fd, staging_fd, entry, parsed[1], names)
            except OSError as err:
                how.log.error(
                    "temp_recovered",
                    path=f"{STAGING}/{entry}",
                    action=f"left alone: {err.strerror or err}",
                )
    return None


def _snapshot(dir_fd: int, name: str, limit: int) -> tuple[str, bytes | None] | None:
    """sha256 and (unless larger than the size limit) the bytes of a regular file."""
    try:
        with fsio.open_regular(dir_fd, name) as (fd, _st):
            sha, size = fsio.hash_fd(fd)
            return sha, fsio.read_fd(fd, size, limit) if size <= limit else None
    except FileNotFoundError:
        return None


def _recover_staging_temp(
    how: Recovery, mem_fd: int, staging_fd: int, entry: str, encoded: str, names: list[str]
) -> None:
    path = f"{STAGING}/{entry}"
    try:
        ours = _snapshot(staging_fd, entry, how.limit)
    except OSError as err:
        how.log.warning("temp_recovered", path=path, action=f"left alone: {err.strerror or err}")
        return
    if ours is None:
        return  # gone meanwhile
    sha, data = ours
    target = fsio.resolve_target(encoded, names)
    theirs: tuple[str, bytes | None] | None = None
    if target is not None and target.endswith(".json") and not target.startswith("."):
        try:
            theirs = _snapshot(staging_fd, target, how.limit)
        except OSError:
            theirs = ("", None)  # something unreadable holds the name: keep ours beside it
    redundant = (theirs is not None and theirs[0] == sha) or _in_originals(mem_fd, sha)
    if not redundant and data is not None and theirs is not None and theirs[1] is not None:
        # One is the repair of the other: a rewrite that was (or was not yet) put in place.
        redundant = how.is_redundant(data, theirs[1])
    if redundant:
        fsio.unlink_quietly(staging_fd, entry)
        action = "deleted: the same content is in staging/ or deadletter/"
    else:
        # Kept beside, never renamed back under the target's name: writers are back at work,
        # and one that found the name absent may be about to rename a fresh file there.
        action = f"kept as {how.park(staging_fd, entry, staging_fd, target or 'recovered.json')}"
    fsio.fsync_dir(staging_fd)
    fsio.crash_point("temp-recovered")
    how.log.warning("temp_recovered", path=path, action=action)


def _in_originals(mem_fd: int, sha: str) -> bool:
    """Are these exact bytes in ``deadletter/originals/``? Checked by content, not by name.

    A name there is never trusted (SPEC 4): only a regular file whose bytes hash to ``sha``.
    """
    suffix = f".{sha[:16]}."
    try:
        with fsio.opened_dir(f"{DEADLETTER}/{ORIGINALS_DIR}", mem_fd) as or_fd:
            for name in os.listdir(or_fd):
                if suffix not in name:
                    continue
                try:
                    with fsio.open_regular(or_fd, name) as (fd, _st):
                        if fsio.hash_fd(fd)[0] == sha:
                            return True
                except OSError:
                    continue
            return False
    except OSError:
        return False
