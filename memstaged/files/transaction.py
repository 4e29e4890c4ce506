"""Step 4 of the flow: carry out any number of plans as one durable transaction (SPEC 5).

This module is the only code that changes ``staging/`` or ``deadletter/``: the daemon applies a
transaction of one plan, ``--once`` one of up to a batch, ``deadletter recover``, ``purge`` and
``drop_originals`` their own. It takes :class:`~memstaged.files.plan.Plan` values, which it never
changes, and hands back a :class:`~memstaged.files.plan.Result` for each. A transaction has two
phases, so that a caller's own check under the lock is made in the caller's own code::

    with begin(mem_fd, staging_fd, plans, now=now) as tx:   # before the lock, the lock, step 1
        refused = my_check(tx.live)                         # the caller's look, under the lock
        applied = tx.commit(announce=announce, refused=refused)   # steps 2-7

:func:`apply` is both with nothing refused (the daemon, ``--once``). Before the lock, the
transaction writes what it can as temps (:mod:`memstaged.files.transaction_temps`: copies where a
rename is impossible, new staging files, the dead-letter temps of a large quarantine and the
rewrites of a batch), each step only while no live process holds ``canonical-writer.lock``.
Then, under the lock:

1. every decision whose version is no longer in place is handed back (``GONE``/``CHANGED``);
   every change one of whose ``depends`` is no longer as read (``GONE``/``CHANGED``; a staging
   file depended on is fsynced), too: nothing of them is done. :func:`begin` ends here: the
   changes still live are :attr:`Transaction.live`, and those the caller refuses when it
   commits are ``REFUSED``, nothing of them done either;
2. with 16 dead-letter files or fewer (:data:`~memstaged.files.transaction_temps.FSYNC_EACH`),
   their temps are written now, each fsynced;
3. every dead-letter name is settled (:mod:`memstaged.files.deadletter_names`: nothing there is
   trusted; records whose original must take another name than the one they were rendered for are
   written again), and each new staging file's name (the first free ``<base>.recovered-<n>.json``);
4. the plans are announced with their settled names (``announce``: the caller logs them and
   makes the log durable): nothing is carried out unlogged;
5. one decision's rewrite temp is written and fsynced (a batch's were written before the lock,
   made durable by the same ``syncfs`` as its dead-letter temps); the dead-letter files get
   their names; ``originals/``, ``deadletter/`` and the memory dir are fsynced;
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

from memstaged.core.ticks import tick
from memstaged.errors import Blocked, LockHeld, NotObeyed, TransactionStopped
from memstaged.files import fsio, recheck, staging_swap
from memstaged.files.deadletter_names import (
    File,
    Names,
    Store,
    install,
    settle_original,
    settle_record,
)
from memstaged.files.locks import LockInfo, canonical_lock
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
from memstaged.files.transaction_temps import Temps

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
    look: bool = False,
) -> Iterator[Transaction]:
    """Begin ``plans`` as one transaction: the work before the lock, the lock, step 1.

    The caller's own look under the lock goes between this and :meth:`Transaction.commit`, in
    the ``with``. Leaving the ``with`` without a commit (the caller's check raised) abandons the
    transaction exactly as an error inside it: nothing of the plans is done, the temps are
    removed (left, on a stop or Ctrl-C, for the next start's crash recovery) and the lock is
    released.

    ``now`` names the ``.conflict-`` files. ``obey_stale``: a stale lock of another owner stops
    the transaction before anything is done (:class:`NotObeyed`), for a command that must not
    work beside the daemon without the lock; the daemon does not obey it (SPEC 5). ``look``:
    each rewrite's temp is kept open, and its bytes read again once in place
    (:attr:`~memstaged.files.plan.Result.looked`), for a caller that does not see the rewrite
    appear (``--once``: the daemon sees it as an event).

    Raises :class:`Blocked` (a :class:`~memstaged.errors.LockHeld`; nothing changed) when a
    live process holds ``canonical-writer.lock``, whatever ``announce`` or the caller's check
    raise (nothing of the plans done), and :class:`TransactionStopped` (an ``OSError``) when the
    transaction could not be completed: what was not carried out is unchanged, and nothing is
    lost either way. Each carries the stale locks seen (``stale_locks``).
    """
    tx = Transaction(mem_fd, staging_fd, plans, now, look=look)
    try:
        tx.temps.before_lock(tx._decisions, tx._changes, max_copy, keep=look)
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
    look: bool = False,
) -> Applied:
    """Carry ``plans`` out as one transaction, nothing refused: :func:`begin`, then commit."""
    with begin(
        mem_fd, staging_fd, plans, now=now, max_copy=max_copy, obey_stale=obey_stale, look=look
    ) as tx:
        return tx.commit(announce=announce)


class Transaction:
    """One transaction of :func:`begin`: its plans' progress, its temps, and the steps that
    turn them into changes. Its caller sees :attr:`live` and :attr:`stale_locks`, and commits."""

    def __init__(
        self, mem_fd: int, staging_fd: int, plans: Sequence[Plan], now: float, *, look: bool
    ) -> None:
        self.mem_fd = mem_fd
        self.look = look
        self.staging_fd = staging_fd
        self.now = now
        self.store = Store(mem_fd)
        self.temps = Temps(mem_fd, staging_fd, self.store)
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
        """Remove the temps not installed (left if ``interrupted``: a stop, Ctrl-C; see
        :meth:`Temps.close`), and close the directories."""
        self._state = "ended"
        self.temps.close(interrupted=interrupted)
        self.store.close()

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
        if not self.temps.written_ahead:
            self.temps.write_dead_letter(live, ahead=False)  # a few files: under the lock
        names = self._names(live)
        files = [self._settle_names(work, names) for work in live]
        self._settle_created(admitted)
        admitted = [w for w in admitted if w.failed is None]
        announce([w.settled() for w in (*live, *admitted)])
        # A batch's rewrite temps are durable already (written before the lock); one
        # decision's is written now, and fsynced.
        rewrites = {
            w.key: w.rewrite_tmp or self.temps.rewrite(w, False, keep=self.look)
            for w in live
            if w.action is Action.REWRITE
        }
        fsio.crash_point("batch-written")
        for plan_files in files:
            for file in plan_files:
                tick()
                install(file)
                if file.how != "refresh" and file.tmp is not None:
                    self.temps.installed(file.dir_fd, file.tmp)
                is_original = self.store.fds is not None and file.dir_fd == self.store.fds[1]
                fsio.crash_point("original-written" if is_original else "record-written")
        if self.store.fds is not None:
            fsio.fsync_dir(self.store.fds[1])
            fsio.fsync_dir(self.store.fds[0])
            fsio.fsync_dir(self.mem_fd)
            fsio.crash_point("deadletter-synced")
        for work in live:
            carried = self._carry(work, rewrites)
            results[work.key] = work.result(
                carried.status,
                identity=carried.identity,
                conflict=carried.conflict,
                looked=carried.looked,
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

    def _carry(self, work: PlanState, rewrites: Mapping[str, str]) -> staging_swap.Carried:
        """Replace, remove or move the plan's staging file (step 6)."""
        version = work.plan.version
        assert version is not None
        if work.action is Action.REWRITE:
            # A temp written ahead is named as partial until it is durable and its turn comes
            batch = work.rewrite_tmp is not None
            tmp = self.temps.ready(rewrites[work.key], work.key, batch)
            fd = self.temps.kept.get(work.key)
            look = None if fd is None or work.plan.data is None else (fd, work.plan.data)
            try:
                return staging_swap.replace(self.staging_fd, version, tmp, self.now, look)
            finally:
                self.temps.close_kept(work.key)
        if work.action is Action.REMOVE:
            return staging_swap.remove(self.staging_fd, version, self.now)
        dl_fd, or_fd = self.store.open()
        assert work.original is not None
        return staging_swap.move(
            self.staging_fd, dl_fd, or_fd, version, work.original, work.records, self.now
        )

    def _names(self, live: Sequence[PlanState]) -> Names:
        """The dead-letter store's names, listed once where that costs less than a look each."""
        names = Names()
        files = sum(len(w.plan.records) + (w.plan.original is not None) for w in live)
        if files:
            for dir_fd in self.store.open():
                names.list(dir_fd, most=4 * files + 64)
        return names

    def _settle_names(self, work: PlanState, names: Names) -> list[File]:
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
                or_fd, rendered_for, names, data=data, tmp=tmp, renamed=renamed
            )
            if file is not None:
                files.append(file)
            if work.original != rendered_for and plan.records:
                self.temps.rerender(work)
        records: list[str] = []
        for record, written in zip(plan.records, work.written, strict=True):
            file = settle_record(dl_fd, record, work.original, written, names)
            files.append(file)
            records.append(file.name)
        work.records = records
        return files

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
        self.temps.created(work.tmp)
        work.tmp = None
        fsio.crash_point("created")
        return True
