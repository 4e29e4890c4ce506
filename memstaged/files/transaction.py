"""Step 4 of the flow: carry out any number of plans as one durable transaction (SPEC 5).

This module is the only code that changes ``staging/`` or ``deadletter/``: the daemon applies a
transaction of one plan, ``--once`` one of up to a batch, ``deadletter recover``, ``purge`` and
``drop_originals`` their own. It takes :class:`~memstaged.files.plan.Plan` values, which it never
changes, and hands back a :class:`~memstaged.files.plan.Result` for each. A transaction has two
phases, so that a caller's own check under the lock is made in the caller's own code::

    with begin(mem_fd, staging_fd, plans, now=now) as tx:   # before the lock, the lock, step 1
        refused = my_check(tx.live)                         # the caller's look, under the lock
        applied = tx.commit(announce=announce, refused=refused)   # steps 2-7

:func:`apply` is both with nothing refused (the daemon, ``--once``). The order, before the lock:

- a too-large file that cannot be moved by a rename (``deadletter/`` on another file system) is
  copied into ``originals/`` (at most ``max_copy`` bytes), or left where it is (``UNMOVABLE``);
- each new staging file (``CREATE``) is written as a temp named as a partial write, its
  ``flock`` held, and made durable;
- with more than :data:`_FSYNC_EACH` dead-letter files, every dead-letter temp (the original,
  then each record: rendered, written, dropped; only one is in memory at a time, SPEC 4) is
  written and made durable by one ``syncfs``, so that a large quarantine writes nothing while
  the lock is held (SPEC 5: about a second at most).

Before each of these steps (each copy, each temp, each ``syncfs``) the transaction looks for
``canonical-writer.lock`` (:class:`_Lookout`, a ``stat``), and stops at the first live holder
it sees, as if it had found the lock taken: SPEC 5, memstaged does nothing in a memory dir
while the reconciler holds its lock, and a large quarantine's work before the lock takes
seconds. At most the one file under way when the lock appeared is completed.

Then, under ``canonical-writer.lock``:

1. every decision whose version is no longer in place is handed back (``GONE``/``CHANGED``);
   every change one of whose ``depends`` is no longer as read (``GONE``/``CHANGED``; a staging
   file depended on is fsynced), too: nothing of them is done. :func:`begin` ends here: the
   changes still live are :attr:`Transaction.live`, and those the caller refuses when it
   commits are ``REFUSED``, nothing of them done either;
2. with 16 dead-letter files or fewer, their temps are written now, each fsynced;
3. every dead-letter name is settled (:mod:`memstaged.files.deadletter_names`: nothing there is
   trusted; records whose original must take another name than the one they were rendered for are
   written again), and each new staging file's name (the first free ``<base>.recovered-<n>.json``);
4. the plans are announced with their settled names (``announce``: the caller logs them and
   makes the log durable): nothing is carried out unlogged;
5. the rewrites' temps are written and made durable (one ``syncfs`` for a batch, an fsync for
   one plan); the dead-letter files get their names; ``originals/``, ``deadletter/`` and the
   memory dir are fsynced;
6. each staging file is replaced, removed or moved (:mod:`memstaged.files.staging_swap`: a writer's
   newer version is kept as a ``.conflict-`` file, never lost); each new staging file gets its name
   (``RENAME_NOREPLACE``); ``staging/`` is fsynced;
7. only then are the files of ``removes`` removed, each only if it is still the very file that
   was read, and their directories fsynced (SPEC 5: a record goes only once its candidate is
   durable in ``staging/``).

However it ends, the stale locks seen while taking the lock are handed back
(:attr:`~memstaged.files.plan.Applied.stale_locks`, or the ``stale_locks`` of the exceptions of
:mod:`memstaged.errors`), for the caller to log.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

from memstaged.core.records import DeadLetter
from memstaged.core.ticks import tick
from memstaged.errors import Blocked, LockHeld, NotObeyed, TransactionStopped
from memstaged.files import atomic_write, fsio, recheck, staging_swap
from memstaged.files.deadletter_names import (
    File,
    Store,
    Written,
    install,
    settle_original,
    settle_record,
)
from memstaged.files.locks import CANONICAL_LOCK, LockInfo, canonical_lock, read_lock
from memstaged.files.memdir import STAGING
from memstaged.files.plan import (
    Action,
    Applied,
    Plan,
    PlanState,
    Result,
    Settled,
    StaleLock,
    Status,
)
from memstaged.files.temp_names import PARTIAL, temp_name

#: Up to this many dead-letter temps in a transaction are fsynced one by one; more, one syncfs.
_FSYNC_EACH: Final = 16

#: Announces plans with their settled names, before anything of them is carried out (SPEC 5).
Announce = Callable[[Sequence[Settled]], None]


@contextmanager
def begin(
    mem_fd: int,
    staging_fd: int,
    plans: Sequence[Plan],
    *,
    now: float,
    max_copy: int = 1 << 30,
    obey_stale: bool = False,
) -> Iterator[Transaction]:
    """Begin ``plans`` as one transaction: the work before the lock, the lock, step 1.

    The caller's own look under the lock goes between this and :meth:`Transaction.commit`, in
    the ``with``. Leaving the ``with`` without a commit (the caller's check raised) abandons the
    transaction exactly as an error inside it: nothing of the plans is done, the temps are
    removed (left, on a stop or Ctrl-C, for the next start's crash recovery) and the lock is
    released.

    ``now`` names the ``.conflict-`` files. ``obey_stale``: a stale lock of another owner stops
    the transaction before anything is done (:class:`NotObeyed`), for a command that must not
    work beside the daemon without the lock; the daemon does not obey it (SPEC 5).

    Raises :class:`Blocked` (a :class:`~memstaged.errors.LockHeld`; nothing changed) when a
    live process holds ``canonical-writer.lock``, whatever ``announce`` or the caller's check
    raise (nothing of the plans done), and :class:`TransactionStopped` (an ``OSError``) when the
    transaction could not be completed: what was not carried out is unchanged, and nothing is
    lost either way. Each carries the stale locks seen (``stale_locks``).
    """
    tx = Transaction(mem_fd, staging_fd, plans, now)
    try:
        tx._before_lock(max_copy)
        with canonical_lock(mem_fd, tx._saw_stale) as stale:
            if stale is not None and obey_stale:
                raise NotObeyed(stale, tx.stale_locks)
            tx._check()
            yield tx
    except LockHeld as busy:
        tx._close()
        raise Blocked(busy.info, tx.stale_locks) from None
    except OSError as err:
        tx._close()
        raise TransactionStopped(err, tx._so_far(err), tx.stale_locks) from err
    except BaseException as exc:
        # An error: remove our temps. A stop or Ctrl-C (not an Exception): leave them, as a
        # kill would, for the next start's recovery (SPEC 6: acted on within a second).
        tx._close(interrupted=not isinstance(exc, Exception))
        raise
    tx._close()


def apply(
    mem_fd: int,
    staging_fd: int,
    plans: Sequence[Plan],
    *,
    announce: Announce,
    now: float,
    max_copy: int = 1 << 30,
    obey_stale: bool = False,
) -> Applied:
    """Carry ``plans`` out as one transaction, nothing refused: :func:`begin`, then commit."""
    with begin(mem_fd, staging_fd, plans, now=now, max_copy=max_copy, obey_stale=obey_stale) as tx:
        return tx.commit(announce=announce)


def _dead_letter_files(works: Sequence[PlanState]) -> int:
    """How many dead-letter files the plans write (at most: a record per record, an original)."""
    return sum(
        len(w.plan.records) + (w.plan.original is not None) for w in works if w.unmovable is None
    )


class _Lookout:
    """Looks for ``canonical-writer.lock`` before each durable step of the work before the lock.

    A look is a ``stat`` of the name (one system call, failing, when there is no lock); a lock
    there is read, and a live holder raises :class:`~memstaged.errors.LockHeld`, which ends the
    transaction as a lock found taken does: its temps removed, nothing of it done, its files
    deferred. A lock whose holder is gone is not obeyed (SPEC 5), and not read again while it
    is the same file. Under the lock, memstaged's own, there is nothing to look for.
    """

    def __init__(self, mem_fd: int) -> None:
        self.mem_fd = mem_fd
        #: The inode of a lock seen stale (its holder gone), looked past from then on.
        self._stale: int | None = None

    def __call__(self) -> None:
        try:
            st = os.stat(CANONICAL_LOCK, dir_fd=self.mem_fd, follow_symlinks=False)
        except OSError:
            return  # none (or it cannot be seen: taking the lock will tell)
        if st.st_ino == self._stale:
            return
        try:
            info = read_lock(self.mem_fd)
        except OSError:
            return  # taking the lock will tell
        if info is None:
            return  # released meanwhile
        if info.alive:
            raise LockHeld(info)
        self._stale = info.ino


class Transaction:
    """One transaction of :func:`begin`: its plans' progress, its temps, and the steps that
    turn them into changes. Its caller sees :attr:`live` and :attr:`stale_locks`, and commits."""

    def __init__(self, mem_fd: int, staging_fd: int, plans: Sequence[Plan], now: float) -> None:
        self.mem_fd = mem_fd
        self.staging_fd = staging_fd
        self.now = now
        self.store = Store(mem_fd)
        self._look = _Lookout(mem_fd)
        works = [PlanState(p) for p in plans]
        self._works = works
        self._decisions = [w for w in works if w.plan.version is not None]
        self._changes = [w for w in works if w.plan.version is None]
        #: After step 1: the decisions whose version is in place, the changes whose depends hold.
        self._in_place: list[PlanState] = []
        self._holding: list[PlanState] = []
        self._results: dict[str, Result] = {}
        self._seen: list[StaleLock] = []
        #: ``checked`` between step 1 and the commit: the only time a commit may happen.
        self._state = "new"
        #: Temp files not yet installed or handed on: removed if the transaction stops.
        self.ours: set[tuple[int, str]] = set()
        #: The descriptors holding the ``flock`` of new staging files' temps (see
        #: :meth:`_write_ahead`), closed once each temp is renamed or removed.
        self.held: dict[tuple[int, str], int] = {}
        #: Whether the dead-letter temps are written (before the lock, or under it in ``_run``).
        self.written_ahead = False

    @property
    def live(self) -> tuple[Plan, ...]:
        """The ``CREATE``/``UNLINK`` plans whose ``depends`` all still hold, under the lock."""
        return tuple(w.plan for w in self._holding)

    @property
    def stale_locks(self) -> tuple[StaleLock, ...]:
        """The stale ``canonical-writer.lock`` files seen while the lock was taken."""
        return tuple(self._seen)

    def commit(self, *, announce: Announce, refused: Mapping[str, str] | None = None) -> Applied:
        """Steps 2-7 for what step 1 left, but the live plans ``refused`` names (key -> why):
        each plan's result, by its key, and the stale locks seen."""
        if self._state != "checked":
            raise RuntimeError(f"commit() of a transaction that is {self._state}")
        self._state = "committed"
        for work in self._holding:
            work.refused = (refused or {}).get(work.key)
        self._run([w for w in self._holding if w.refused is None], announce)
        for work in self._changes:
            self._results[work.key] = work.change_result()
        return Applied(dict(self._results), self.stale_locks)

    def _saw_stale(self, info: LockInfo, removed: bool) -> None:
        self._seen.append(StaleLock(info, removed))

    def _so_far(self, err: OSError) -> dict[str, Result]:
        """Each plan's result when ``err`` stopped the transaction: what it did until then."""
        failed = {w.key: w.result(Status.FAILED, reason=str(err)) for w in self._works}
        return {**failed, **self._results}

    def _close(self, *, interrupted: bool = False) -> None:
        """Remove the temps not installed, and close the directories.

        ``interrupted`` (a stop's :class:`~memstaged.errors.Abandoned`, Ctrl-C): the temps are
        left, exactly as a kill would leave them, for the next start's crash recovery to
        remove: a quarantine of 100,000 records has as many temps, and unlinking them would
        keep a SIGTERM waiting for seconds (SPEC 6: acted on within a second). They carry
        memstaged's temp names, which the reconciler never reads.
        """
        self._state = "ended"
        if not interrupted:
            for dir_fd, tmp in self.ours:
                fsio.unlink_quietly(dir_fd, tmp)
        self.ours.clear()
        for fd in self.held.values():  # after the unlinks: a temp is never named and unlocked
            os.close(fd)
        self.held.clear()
        self.store.close()

    # -- before the lock ------------------------------------------------------------------------

    def _before_lock(self, max_copy: int) -> None:
        """Copies where a rename is impossible, new staging files, many dead-letter temps; each
        step only while no live process holds ``canonical-writer.lock``."""
        for work in self._decisions:
            if work.plan.action is Action.MOVE:
                self._look()
                self._copy_if_unmovable(work, max_copy)
        self._write_ahead(self._changes)
        if _dead_letter_files(self._decisions) > _FSYNC_EACH:
            self._write_records_ahead(self._decisions, ahead=True)

    def _copy_if_unmovable(self, work: PlanState, max_copy: int) -> None:
        """SPEC 6: where a rename is impossible, copy at most ``max_copy`` bytes, or leave it."""
        version = work.plan.version
        assert version is not None
        or_fd = self.store.open()[1]
        if os.fstat(or_fd).st_dev == version.identity.dev:
            return  # one file system: moved by a rename
        size = version.identity.size
        if size > max_copy:
            work.unmovable = f"larger than max_quarantine_copy ({max_copy} bytes)"
            return
        tmp, _sha, _size = atomic_write.copy_to_temp(version.fd, or_fd, "orig", work.key, most=size)
        self.ours.add((or_fd, tmp))
        fsio.crash_point("copy-written")
        work.copied = tmp

    def _write_ahead(self, changes: Sequence[PlanState]) -> None:
        """Write the new staging files of ``CREATE`` plans as durable temps, before the lock.

        Each temp is named as a partial write until it gets its name under the lock: a
        memstaged starting after a crash deletes it (the records it holds are all still in the
        store) instead of keeping it as a staging file, which would stage its candidates twice.
        This process holds each temp's ``flock`` until then, so that a daemon starting while it
        runs (its crash recovery) leaves the temp alone: it is no leftover of a crash.
        """
        creates = [w for w in changes if w.plan.action is Action.CREATE]
        batch = len(creates) > 1
        for work in creates:
            assert work.plan.data is not None
            self._look()
            try:
                work.tmp, lock_fd = atomic_write.write_held_temp(
                    self.staging_fd,
                    work.plan.data,
                    PARTIAL,
                    f"{work.plan.base}.recovered.json",
                    sync=not batch,
                )
            except OSError as err:
                work.failed = f"could not write the staging file: {err.strerror or err}"
                continue
            self.ours.add((self.staging_fd, work.tmp))
            self.held[(self.staging_fd, work.tmp)] = lock_fd
        if batch and any(w.tmp is not None for w in creates):
            self._look()
            fsio.syncfs(self.mem_fd)  # every new staging file's data is durable from here on

    def _write_records_ahead(self, works: Sequence[PlanState], *, ahead: bool) -> None:
        """Write every dead-letter temp of ``works`` and make them durable: ``ahead`` of the
        lock, looking for it before each, then one ``syncfs``; else under it, each fsynced.

        Streaming: a record is rendered, written and dropped, so a file of 100,000 candidates
        never has their records in memory together (SPEC 4). With more than
        :data:`_FSYNC_EACH` files this runs before the lock (one ``syncfs``), so that the lock
        is held only for names, renames and fsyncs of directories (SPEC 5: about a second at
        most); the temps carry memstaged's temp names: the reconciler never reads them, and
        recovery after a crash deletes them. A few files are written under the lock, each
        fsynced (as cheap as that, and nothing at all appears while the reconciler works).
        """
        todo = [w for w in works if w.unmovable is None and (w.plan.records or w.plan.original)]
        self.written_ahead = True
        if not todo:
            return
        if ahead:
            self._look()  # before deadletter/ is made, too
        dl_fd, or_fd = self.store.open()
        taken: set[str] = set()
        for work in todo:
            plan = work.plan
            if plan.original is not None:
                renamed = plan.action is Action.MOVE
                data = plan.version.data if plan.version is not None else None
                # A first choice, checked again under the lock: the records are rendered for it.
                work.original, _file = settle_original(
                    or_fd, plan.original, taken, data=data, tmp=None, renamed=renamed
                )
                if not renamed:
                    assert data is not None
                    if ahead:
                        self._look()
                    work.original_tmp = atomic_write.write_temp(
                        or_fd, data, "rec", work.original, sync=not ahead
                    )
                    self.ours.add((or_fd, work.original_tmp))
            work.written = self._write_records(work, dl_fd, ahead=ahead)
        if ahead:
            self._look()
            fsio.syncfs(self.mem_fd)  # every dead-letter temp's data is durable from here on
        fsio.crash_point("temps-synced")

    def _write_records(self, work: PlanState, dl_fd: int, *, ahead: bool) -> list[Written]:
        """Each record's temp, rendered one at a time (its bytes are dropped once written);
        ``ahead`` of the lock, each only while no live process holds it, and not fsynced."""
        written: list[Written] = []
        for record in work.plan.records:
            tick()  # each record is rendered and written: thousands of them take seconds
            if ahead:
                self._look()
            body = _render(record, work.original)
            tmp = atomic_write.write_temp(dl_fd, body, "rec", record.name, sync=not ahead)
            self.ours.add((dl_fd, tmp))
            written.append(Written(tmp, len(body)))
            del body
        return written

    # -- under the lock -------------------------------------------------------------------------

    def _check(self) -> None:
        """Step 1: the decisions whose version is in place, the changes whose depends hold."""
        for work in self._decisions:
            version = work.plan.version
            assert version is not None
            if work.unmovable is not None:
                self._results[work.key] = work.result(Status.UNMOVABLE, reason=work.unmovable)
                continue
            state = version.still_in_place(self.staging_fd)
            if state:
                self._in_place.append(work)
            else:
                status = Status.GONE if state is None else Status.CHANGED
                self._results[work.key] = work.result(status, identity=version.identity)
        self._holding = self._admitted(self._changes)
        self._state = "checked"

    def _run(self, admitted: list[PlanState], announce: Announce) -> None:
        """Steps 2-7 of the module docstring, for the decisions in place and ``admitted``."""
        live = self._in_place
        results = self._results
        if not live and not admitted:
            return
        if not self.written_ahead:
            self._write_records_ahead(live, ahead=False)  # a few files: under the lock
        taken: set[str] = set()
        files = [self._settle_names(work, taken) for work in live]
        self._settle_created(admitted)
        admitted = [w for w in admitted if w.failed is None]
        announce([w.settled() for w in (*live, *admitted)])
        batch = len(live) > 1
        rewrites = {w.key: self._rewrite_temp(w, batch) for w in live if w.action is Action.REWRITE}
        fsio.crash_point("batch-written")
        if batch and rewrites:
            fsio.syncfs(self.mem_fd)  # every rewrite's data is durable from here on
        for plan_files in files:
            for file in plan_files:
                tick()
                install(file)
                if file.how != "refresh" and file.tmp is not None:
                    self.ours.discard((file.dir_fd, file.tmp))
                is_original = self.store.fds is not None and file.dir_fd == self.store.fds[1]
                fsio.crash_point("original-written" if is_original else "record-written")
        if self.store.fds is not None:
            fsio.fsync_dir(self.store.fds[1])
            fsio.fsync_dir(self.store.fds[0])
            fsio.fsync_dir(self.mem_fd)
            fsio.crash_point("deadletter-synced")
        for work in live:
            carried = self._carry(work, rewrites, batch)
            results[work.key] = work.result(
                carried.status, identity=carried.identity, conflict=carried.conflict
            )
        created = [
            w for w in admitted if w.plan.action is Action.CREATE and self._create(w, announce)
        ]
        depends_on_staging = any(h.where == STAGING for w in admitted for h in w.plan.depends)
        if live or created or depends_on_staging:
            fsio.fsync_dir(self.staging_fd)
            if admitted:
                fsio.crash_point("staging-synced")
        self._remove_held(
            [w for w in admitted if w.plan.action is Action.UNLINK or w.created is not None]
        )

    def _carry(
        self, work: PlanState, rewrites: Mapping[str, str], batch: bool
    ) -> staging_swap.Carried:
        """Replace, remove or move the plan's staging file (step 6)."""
        version = work.plan.version
        assert version is not None
        if work.action is Action.REWRITE:
            tmp = self._ready(rewrites[work.key], work.key, batch)
            return staging_swap.replace(self.staging_fd, version, tmp, self.now)
        if work.action is Action.REMOVE:
            return staging_swap.remove(self.staging_fd, version, self.now)
        dl_fd, or_fd = self.store.open()
        assert work.original is not None
        return staging_swap.move(
            self.staging_fd, dl_fd, or_fd, version, work.original, work.records, self.now
        )

    def _settle_names(self, work: PlanState, taken: set[str]) -> list[File]:
        """The dead-letter files of a plan, each with a name that is safe to use (SPEC 4).

        The records' temps are written already; if the original must take another name than
        the one they were rendered for (something took it since), they are written again,
        pointing at the new name (rare).
        """
        plan = work.plan
        if plan.original is None and not plan.records:
            return []
        dl_fd, or_fd = self.store.open()
        files: list[File] = []
        if work.original is not None:
            rendered_for = work.original
            renamed = plan.action is Action.MOVE
            data = plan.version.data if plan.version is not None else None
            tmp = work.copied if renamed else work.original_tmp
            work.original, file = settle_original(
                or_fd, rendered_for, taken, data=data, tmp=tmp, renamed=renamed
            )
            if file is not None:
                files.append(file)
            if work.original != rendered_for and plan.records:
                self._rerender(work)
        names: list[str] = []
        for record, written in zip(plan.records, work.written, strict=True):
            file = settle_record(dl_fd, record, work.original, written, taken)
            files.append(file)
            names.append(file.name)
        work.records = names
        return files

    def _rerender(self, work: PlanState) -> None:
        """Under the lock, rare: the records point at the original's new name; written again."""
        dl_fd = self.store.open()[0]
        for old in work.written:
            fsio.unlink_quietly(dl_fd, old.tmp)
            self.ours.discard((dl_fd, old.tmp))
        work.written = self._write_records(work, dl_fd, ahead=False)

    def _rewrite_temp(self, work: PlanState, batch: bool) -> str:
        assert work.plan.data is not None
        # Named ``part`` until it is durable: recovery deletes ``part`` temps rather than
        # keeping them as versions.
        role = PARTIAL if batch else "new"
        tmp = atomic_write.write_temp(
            self.staging_fd, work.plan.data, role, work.key, sync=not batch
        )
        self.ours.add((self.staging_fd, tmp))
        fsio.crash_point("temp-written")
        return tmp

    def _ready(self, tmp: str, name: str, batch: bool) -> str:
        """The durable rewrite under a ``new`` name, handed to :func:`replace.replace`."""
        self.ours.discard((self.staging_fd, tmp))
        if not batch:
            return tmp
        ready = temp_name("new", name)
        try:
            os.rename(tmp, ready, src_dir_fd=self.staging_fd, dst_dir_fd=self.staging_fd)
        except BaseException:
            self.ours.add((self.staging_fd, tmp))
            raise
        return ready

    def _admitted(self, changes: Sequence[PlanState]) -> list[PlanState]:
        """The changes whose files are all still as they were read.

        A staging file a change depends on (one that holds candidates whose records it removes)
        is fsynced here, so that the record goes only once the candidate is durable (SPEC 5).
        """
        fds: dict[str, int | None] = {STAGING: self.staging_fd}
        live: list[PlanState] = []
        try:
            for work in changes:
                if work.failed is not None:
                    continue  # its staging file could not be written
                for file in work.plan.depends:
                    if file.where not in fds:
                        try:
                            fds[file.where] = fsio.open_dir(file.where, self.mem_fd)
                        except (FileNotFoundError, NotADirectoryError):
                            fds[file.where] = None
                    fd = fds[file.where]
                    why = "gone" if fd is None else recheck.is_held(fd, file)
                    if why is None and file.where == STAGING:
                        why = recheck.made_durable(self.staging_fd, file)
                    if why is not None:
                        work.stale[file.name] = why
                if not work.stale:
                    live.append(work)
        finally:
            for where, fd in fds.items():
                if where != STAGING and fd is not None:
                    os.close(fd)
        return live

    def _settle_created(self, changes: Sequence[PlanState]) -> None:
        """The name each new staging file will get, so that it is announced before it is made."""
        taken: set[str] = set()
        for work in changes:
            if work.plan.action is not Action.CREATE:
                continue
            name = recheck.free_name(self.staging_fd, work.plan.base, taken)
            if name is None:
                work.failed = f"no free name for {work.plan.base}.recovered-<n>.json in staging/"
                continue
            taken.add(name)
            work.created = name

    def _remove_held(self, changes: Sequence[PlanState]) -> None:
        """Remove each file of the changes that is still the very file that was read; fsync."""
        if not any(w.plan.removes for w in changes):
            return
        synced: dict[str, int] = {}
        try:
            for work in changes:
                for file in work.plan.removes:
                    fd = synced.get(file.where)
                    if fd is None:
                        fd = synced[file.where] = fsio.open_dir(file.where, self.mem_fd)
                    removed, why = recheck.unlink_held(fd, file)
                    if removed:
                        work.removed.append(file.name)
                    elif why is not None:
                        work.left[file.name] = why
            for fd in synced.values():
                fsio.fsync_dir(fd)
            fsio.crash_point("store-synced")
        finally:
            for fd in synced.values():
                os.close(fd)

    def _create(self, work: PlanState, announce: Announce) -> bool:
        """Give a ``CREATE``'s durable temp its free name in ``staging/``, never over a file."""
        assert work.tmp is not None and work.created is not None
        name = work.created
        while True:
            try:
                fsio.rename_noreplace(self.staging_fd, work.tmp, self.staging_fd, name)
                break
            except FileExistsError:
                # A writer took the name after it was settled: the next free one, announced too.
                free = recheck.free_name(self.staging_fd, work.plan.base, set())
                work.created = free
                if free is None:
                    work.failed = f"no free name for {work.plan.base}.recovered-<n>.json"
                    return False
                name = free
                announce([work.settled()])
            except OSError as err:
                work.created = None
                work.failed = f"could not write the staging file: {err.strerror or err}"
                return False
        self.ours.discard((self.staging_fd, work.tmp))
        lock_fd = self.held.pop((self.staging_fd, work.tmp), None)
        if lock_fd is not None:
            os.close(lock_fd)  # renamed: no temp of that name is left to guard
        work.tmp = None
        fsio.crash_point("created")
        return True


def _render(record: DeadLetter, original: str | None) -> bytes:
    """A record's bytes, naming the original's settled name (its planned one if it has none)."""
    return record.render(original if original is not None else record.original)
