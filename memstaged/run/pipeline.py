"""The flow of every decision: read → decide → plan → apply → log.

The daemon and ``--once`` both go through :class:`Pipeline`: the daemon a transaction of one
file (:meth:`Pipeline.process`), ``--once`` transactions of up to :data:`BATCH` files
(:meth:`Pipeline.batches`). Either way the same steps run in the same order, each in the module
named after it: :mod:`memstaged.files.version` (a version, opened safely and kept open, or read
ahead of its turn: :mod:`memstaged.run.read_ahead`), :mod:`memstaged.core.decide` (the pure
decision), :mod:`memstaged.files.plan` (what changes, as a value),
:mod:`memstaged.files.transaction` (the one transaction that changes ``staging/`` and
``deadletter/``), and :mod:`memstaged.run.decision` (each file's event in the decision log, and
its outcome, from the verdict and then from what the transaction did with its plan). Data flows
one way; each module only calls downwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import itertools
import os
import resource
import stat
import time
import traceback
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final

import msgspec

from memstaged.core.decide import (
    Context,
    Decision,
    Verdict,
    decide,
    decide_too_large,
)
from memstaged.core.records import decided_again
from memstaged.core.timestamps import format_epoch_ms
from memstaged.errors import Blocked, LockHeld, LogUnwritable, os_reason
from memstaged.files import fsio, temp_recovery, transaction
from memstaged.files.fsio import Identity
from memstaged.files.locks import LockInfo, lock_to_obey, log_stale_locks
from memstaged.files.memdir import (
    MemoryDir,
    Options,
    is_staging_name,
    opened_memory_dir,
    staging_names,
)
from memstaged.files.plan import Plan, Result, Settled, Status, identity_hash, plan_of
from memstaged.files.version import BEING_WRITTEN, FirstSeen, Skip, Version, read_version
from memstaged.run import memory_budget
from memstaged.run.decider_pool import FD_RESERVE, Deciders, Failure, ReadAhead, workers_wanted
from memstaged.run.decision import (
    Batch,
    DecisionEvent,
    Decisions,
    Outcome,
    abandoned,
    describe,
    io_error_reason,
    name_settled,
    unlogged,
)
from memstaged.run.own_rewrites import OwnRewrites, is_look, log_look
from memstaged.run.read_ahead import LockSeen, Read, job, read_ahead, release

__all__ = ["BATCH", "BATCH_BYTES", "BATCH_HELD", "Pipeline"]

#: How many files a batch decides and carries out together: one syncfs and one fsync per
#: directory each. Measured on a 10,000-file backlog (docs/performance.md): 256 → 1,024 takes a
#: fifth off the time spent applying; beyond, the gain is small and the batch's memory grows.
BATCH: Final = 1024
#: ... at most this many bytes of pending rewrites and originals held in memory at once ...
BATCH_BYTES: Final = 32 * 1024 * 1024
#: ... and at most this many versions held open until they are applied (SPEC 6: descriptors
#: stay bounded; a service manager's default soft limit is 1,024).
BATCH_HELD: Final = 256


@dataclasses.dataclass(slots=True)
class _Pending:
    """A file read and decided whose plan waits for its transaction."""

    plan: Plan
    version: Version
    #: The decision's log event: logged, and replaced by the one logged, when the transaction
    #: announces the plan.
    event: DecisionEvent
    started: float


def _held_most(in_use: int) -> int:
    """The versions a transaction holds open at most: :data:`BATCH_HELD`, or fewer where the
    descriptor limit leaves less room beside the ``in_use`` descriptors already open (SPEC 6: a
    hard limit of 200 ran out of descriptors with 256 held, a traceback); read ahead gets no
    more than as many again, and a rewrite's temp is kept open while it is put in place
    (``--once``'s look), one more each."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return BATCH_HELD
    return max(1, min(BATCH_HELD, (soft - in_use - FD_RESERVE) // 3))


class Pipeline:
    """Decides staging files of any number of memory dirs."""

    def __init__(
        self,
        options: Options,
        logger: Any,
        clock: Callable[[], float] = time.time,
        durable_log: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.options = options
        self.log = logger
        self.clock = clock
        #: Each file's decision event logged, and its outcome, with the options in force.
        self._decisions = Decisions(logger, clock, lambda: self.options, durable_log)
        self._stamp: tuple[int, str] = (-1, "")
        self._first_seen = FirstSeen()
        #: The rewrites memstaged put in place, each looked at once (SPEC 1 and 7).
        self._rewrites = OwnRewrites()
        #: Memory dirs whose ``staging/`` could not be listed at the last :meth:`scan`.
        self.unlisted: dict[str, str] = {}
        #: Decider processes for batches of many files: started on first use, kept for the
        #: whole run (its memory dirs one after the other) and stopped by :meth:`close`.
        self._deciders = Deciders(workers_wanted(), on_break=self._pool_given_up)
        #: Files handed to :meth:`batches` so far: a run of many small memory dirs (1,000 of 100
        #: files) is worth a pool as much as one large one.
        self._batched = 0

    # -- the entry points -----------------------------------------------------------------------

    def process(self, mdir: MemoryDir, name: str) -> Outcome:
        """Decide ``staging/<name>`` of ``mdir`` and carry the decision out; never raises."""
        with contextlib.closing(self._transactions(mdir, [name], 1, 1, look=False)) as transactions:
            return next(transactions).outcomes[name]

    def batches(self, mdir: MemoryDir, names: list[str]) -> Generator[Batch, None, None]:
        """Transactions of up to :data:`BATCH` files, one after the other; close the generator
        (``contextlib.closing``) if it is left before its end: it holds the memory dir open.

        One thread (a second one applying a batch measured slower: docs/performance.md). The
        decider processes are the run's: they decide ahead once its files are enough to win back
        their start (:data:`~memstaged.run.decider_pool.POOL_THRESHOLD`), the next transaction's
        files while this one is carried out.

        Each rewrite is looked at as it is put in place (SPEC 1; the daemon looks at it when it
        sees it as an event): its outcome is then ``looked``, else it waits for a look.
        """
        size = self._batched + len(names)
        self._batched = size
        return self._transactions(mdir, names, BATCH, size, look=True)

    def close(self) -> None:
        """Stop the decider processes, if any started (at the end of a run)."""
        self._deciders.close()

    @property
    def pool_given_up(self) -> str | None:
        """Why the decider processes were given up for the rest of the run (None: they were
        not), in one line."""
        return self._deciders.broken

    def _pool_given_up(self, why: str) -> None:
        self.log.warning("deciders_stopped", reason=why)

    # -- one transaction ------------------------------------------------------------------------

    def _transactions(
        self,
        mdir: MemoryDir,
        names: list[str],
        most: int,
        size: int,
        *,
        look: bool,
    ) -> Generator[Batch, None, None]:
        """The transactions of ``names`` in one memory dir, opened once for all of them.

        Files are read ahead of their transaction, across transactions
        (:mod:`memstaged.run.read_ahead`): with ``size`` files to go (``--once``'s batches), the
        next transaction's files are read and sent to the decider processes before this one's
        commit, so that they are decided while it runs. The reconciler's lock is read again at
        the start of each transaction, and obeyed there: a file read ahead while it was free is
        deferred, unchanged, if it is held by then (the transaction takes the lock itself before
        it changes anything, SPEC 5).
        """
        if not names:
            return
        try:
            opened = opened_memory_dir(mdir)
            mem_fd, staging_fd = opened.__enter__()
        except OSError as err:
            for start in range(0, len(names), most):
                batch = Batch(mdir)
                for name in names[start : start + most]:
                    batch.outcomes[name] = self._unopened(mdir, name, err)
                yield batch
            return
        lock = LockSeen()
        context = functools.partial(self._context, mdir)
        reads = (
            read_ahead(name, staging_fd, lock, self.options.max_file_size, context)
            for name in names
        )
        in_use = 0  # one file at a time (the daemon's) holds one version
        held_most = BATCH_HELD
        if most > 1:
            # What is open already counts (a caller's descriptors, inherited), and what the
            # pool will open if it has not started yet.
            in_use = fsio.descriptors_open() + self._deciders.descriptors_to_come()
            held_most = _held_most(in_use)
        # One file at a time (the daemon's) needs no bound beside itself: not even estimated.
        budget = None if most == 1 else memory_budget.budget(self.options.max_file_size)
        # A transaction holds each version, and with ``look`` each rewrite's temp beside it.
        holds = held_most * (2 if look else 1)
        ahead = self._deciders.ahead(reads, job, size, held=holds + in_use, budget=budget)
        try:
            left = len(names)  # so that no lock is read again after the last file
            while left:
                # A transaction's decisions go into the log in one write; one whose line is
                # not in the log is none yet (SPEC 7).
                with self._decisions.one_write() as logged:
                    batch = self._transaction(
                        mdir, mem_fd, staging_fd, lock, ahead, most, held_most, look
                    )
                if not logged.whole:
                    batch.outcomes = unlogged(batch.outcomes, self.clock() + self.options.settle)
                self._rewrites.settled(logged=logged.whole)
                if not batch.outcomes:  # every file taken (a name given twice)
                    return
                left -= len(batch.outcomes)
                yield batch
        finally:
            for read in ahead.close():
                release(read)
            opened.__exit__()

    def _transaction(
        self,
        mdir: MemoryDir,
        mem_fd: int,
        staging_fd: int,
        lock: LockSeen,
        ahead: ReadAhead[Read],
        most: int,
        held_most: int,
        look: bool,
    ) -> Batch:
        """Decide up to ``most`` files read ahead, then apply their plans together.

        Valid, foreign, skipped and deferred files are final at once; repairs and
        quarantines wait for the transaction, which stops taking files early when the versions
        it holds open reach ``held_most`` (:data:`BATCH_HELD`, or fewer under a low descriptor
        limit), their bytes :data:`BATCH_BYTES`, or the estimated cost of the files it holds
        leaves no room for the next (``ahead`` stops: :mod:`memstaged.run.memory_budget`).
        """
        batch = Batch(mdir)
        try:
            lock.blocked = lock_to_obey(mem_fd, self.log)
            lock.known = True
        except OSError as err:
            lock.known = False  # nothing more is read ahead until it can be read
            for read, _verdict in itertools.islice(ahead, most):
                release(read)
                ahead.done(read)
                batch.outcomes[read.name] = self._decisions.io_error(mdir, read.name, err)
            return batch
        pending: list[_Pending] = []
        holding: list[Read] = []  # the files of the pending plans, as read ahead
        try:
            held = 0
            for read, verdict in ahead:
                outcome, item = self._read_and_decide(
                    mdir, read.name, staging_fd, lock.blocked, read.started, read, verdict
                )
                if item is None:
                    ahead.done(read)
                    batch.outcomes[read.name] = outcome
                else:
                    pending.append(item)
                    holding.append(read)
                    held += item.plan.held_bytes
                if (
                    len(batch.outcomes) + len(pending) >= most
                    or len(pending) >= held_most
                    or held >= BATCH_BYTES
                ):
                    break
            if pending:
                ahead.prefetch()  # decided by the workers while this transaction is carried out
                batch.outcomes.update(self._apply(mdir, mem_fd, staging_fd, pending, look))
        finally:
            for item in pending:
                item.version.close()
            for read in holding:
                ahead.done(read)
        return batch

    def _unopened(self, mdir: MemoryDir, name: str, err: OSError) -> Outcome:
        """The outcome of a file whose memory dir or ``staging/`` cannot be opened."""
        if fsio.is_link(err, None, mdir.path) or (
            err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(mdir.staging)
        ):
            where = "staging/" if os.path.islink(mdir.staging) else "the memory dir"
            return self._decisions.final(
                mdir, name, Decision.SKIPPED, f"{where} is a symbolic link: never followed"
            )
        return self._decisions.io_error(mdir, name, err)

    def _read_and_decide(
        self,
        mdir: MemoryDir,
        name: str,
        staging_fd: int,
        blocked: LockInfo | None,
        started: float,
        ahead: Read | None = None,
        verdict: Verdict | Failure | None = None,
    ) -> tuple[Outcome, _Pending | None]:
        """A file's final outcome (logged), or the plan that carries its decision out.

        ``ahead``: the file as :func:`~memstaged.run.read_ahead.read_ahead` read it;
        ``verdict``: a decider's verdict of it (None: decide it here).
        """
        if not is_staging_name(name):
            return self._decisions.final(
                mdir, name, Decision.SKIPPED, "not a staging file name", started=started
            ), None
        if blocked is not None:
            if ahead is not None:
                release(ahead)  # read ahead while the lock was free: left as it is
            reason = str(LockHeld(blocked))
            outcome = self._decisions.final(mdir, name, Decision.DEFERRED, reason, started=started)
            return msgspec.structs.replace(outcome, blocked_by_lock=True), None
        version: Version | None = None
        try:
            if ahead is None or ahead.read is None:
                read = read_version(staging_fd, name, self.options.max_file_size)
            elif isinstance(ahead.read, Exception):
                raise ahead.read
            else:
                read = ahead.read
            # What was read there is either memstaged's own rewrite or what replaced it: it
            # is known no longer (a lock or an I/O error above keeps it for the next look).
            rewrite = self._rewrites.take(mdir.path, name)
            if isinstance(read, Skip):
                decision = Decision(read.decision)
                outcome = self._decisions.final(mdir, name, decision, read.reason, started=started)
                return msgspec.structs.replace(outcome, identity=read.identity), None
            version = read
            outcome, item = self._decide(mdir, version, started, rewrite, ahead, verdict)
            if item is not None:
                version = None  # the transaction owns it now
            return outcome, item
        except OSError as err:
            return self._decisions.io_error(mdir, name, err, started), None
        except Exception as err:  # noqa: BLE001 - a bug must not stop the daemon; it is logged
            message = f"internal error, file left as it is: {err!r}"
            return self._decisions.failed(
                mdir, name, message, started, traceback.format_exc()
            ), None
        finally:
            if version is not None:
                version.close()

    def _decide(
        self,
        mdir: MemoryDir,
        version: Version,
        started: float,
        rewrite: str | None = None,
        ahead: Read | None = None,
        decided: Verdict | Failure | None = None,
    ) -> tuple[Outcome, _Pending | None]:
        if ahead is not None and ahead.ctx is not None:
            ctx, changed_at = ahead.ctx, ahead.changed_at
        else:
            ctx, changed_at = self._context(mdir, version)
        if isinstance(decided, Failure):  # a bug in a decider process: as one raised here
            message = f"internal error, file left as it is: {decided.error}"
            return self._decisions.failed(
                mdir, version.name, message, started, decided.traceback
            ), None
        if decided is None:
            verdict = self._verdict(version, ctx)
        else:  # its records may be rendered ahead: rendered again here only for another name
            verdict = decided
            decided_again(verdict.deadletter, lambda: self._verdict(version, ctx).deadletter)
        event = describe(
            verdict,
            path=os.path.join(mdir.staging, version.name),
            memory_dir=mdir.path,
            dry_run=self.options.dry_run,
        )
        if is_look(rewrite, verdict):  # SPEC 1: decided again, valid; SPEC 7: logged as a look
            return log_look(self._decisions, event, version.identity, started), None
        if verdict.decision is Decision.DEFERRED:
            retry = changed_at + self.options.settle
            self._decisions.finish(event, started)
            return Outcome(Decision.DEFERRED, version.identity, retry_at=retry), None
        plan = None if self.options.dry_run else plan_of(version, verdict)
        if plan is not None and not version.lease():  # SPEC 5: being written, in place
            outcome = self._decisions.final(
                mdir, version.name, Decision.DEFERRED, BEING_WRITTEN, started=started
            )
            return msgspec.structs.replace(outcome, identity=version.identity), None
        if plan is None:
            self._decisions.finish(event, started)
            return Outcome(verdict.decision, version.identity), None
        return Outcome(verdict.decision, version.identity), _Pending(plan, version, event, started)

    def _context(self, mdir: MemoryDir, version: Version) -> tuple[Context, float]:
        """What a version is decided in, and when it was last seen to change."""
        now = self.clock()
        changed_at = self._first_seen.changed_at(version, now)
        settled = now - changed_at >= self.options.settle
        decided_at = self._decided_at(int(now * 1000))
        ctx = mdir.context(version.name, self.options, settled=settled, decided_at=decided_at)
        return ctx, changed_at

    def _decided_at(self, epoch_ms: int) -> str:
        """``format_epoch_ms``, kept for the millisecond: a backlog decides ~10 files in one."""
        if self._stamp[0] != epoch_ms:
            self._stamp = (epoch_ms, format_epoch_ms(epoch_ms))
        return self._stamp[1]

    def _verdict(self, version: Version, ctx: Context) -> Verdict:
        if version.data is not None:
            return decide(version.data, ctx)
        # SPEC 6: too large to read; moved, never read, so named by its identity's hash.
        return decide_too_large(
            ctx, identity_hash(version), version.identity.size, self.options.max_file_size
        )

    def _apply(
        self,
        mdir: MemoryDir,
        mem_fd: int,
        staging_fd: int,
        pending: list[_Pending],
        look: bool,
    ) -> dict[str, Outcome]:
        """Carry the pending plans out as one transaction, then log what differs from plan, and
        the ``look`` at each rewrite taken in place."""
        by_name = {item.plan.key: item for item in pending}
        announced: set[str] = set()

        def announce(settled: Sequence[Settled]) -> None:
            with self._decisions.durable():  # raises LogUnwritable: nothing of the plans is done
                for names in settled:
                    item = by_name[names.key]
                    event = name_settled(item.event, item.plan, names)
                    item.event = self._decisions.finish(event, item.started)
                    announced.add(names.key)

        fsio.load_libc()  # once per process, and not between an announcement and its change
        try:
            applied = transaction.apply(
                mem_fd,
                staging_fd,
                [item.plan for item in pending],
                announce=announce,
                now=self.clock(),
                max_copy=self.options.max_quarantine_copy,
                look=look,
            )
        except (Blocked, LogUnwritable, OSError) as err:
            return self._not_applied(pending, announced, err)
        log_stale_locks(self.log, applied.stale_locks)
        return {
            item.plan.key: self._outcome(mdir, item, announced, applied.results[item.plan.key])
            for item in pending
        }

    def _not_applied(
        self, pending: list[_Pending], announced: set[str], err: Blocked | LogUnwritable | OSError
    ) -> dict[str, Outcome]:
        """A transaction stopped before its changes: each of its files deferred, and why.

        The reconciler's lock held: retried when it goes. The decision log unwritable (SPEC 5
        and 7: its own line on stderr said why) or an I/O error: retried with the back-off of an
        error.
        """
        log_stale_locks(self.log, getattr(err, "stale_locks", ()))
        extra: dict[str, Any]
        if isinstance(err, Blocked):
            reason, error, extra = str(err), False, {"blocked_by_lock": True}
        else:
            reason = err.reason if isinstance(err, LogUnwritable) else io_error_reason(err)
            error, extra = True, {"retry_at": self.clock() + self.options.settle}
        return {
            item.plan.key: self._after(
                item, announced, Decision.DEFERRED, reason, error=error, **extra
            )
            for item in pending
        }

    def _outcome(
        self, mdir: MemoryDir, item: _Pending, announced: set[str], result: Result
    ) -> Outcome:
        """What a plan's result means for its file, logged where it is not what was planned."""
        name = item.plan.key
        if result.conflict is not None:
            self.log.warning("conflict_parked", path=name, kept_as=result.conflict)
        if result.status is Status.DONE:
            if item.event.rewrite_sha256 is not None:
                self._rewrites.remember(mdir.path, name, item.event.rewrite_sha256)
                if result.looked:
                    return self._looked(mdir, item, result.identity)
            return Outcome(item.event.decision, result.identity)
        if result.status is Status.GONE:
            return self._after(
                item, announced, Decision.SKIPPED, "vanished before the decision was applied"
            )
        if result.status is Status.UNMOVABLE:
            return self._after(
                item,
                announced,
                Decision.DEFERRED,
                "too large to read, and it can be neither moved into deadletter/ nor "
                f"copied there: {result.reason or 'another mount'}; left in staging/",
                retry_at=self.clock() + 3600,
                error=True,
            )
        return self._after(
            item,
            announced,
            Decision.DEFERRED,
            "changed while being decided: the newer version is kept and decided afresh",
            changed=True,
        )

    def _looked(self, mdir: MemoryDir, item: _Pending, identity: Identity | None) -> Outcome:
        """A repair whose rewrite its transaction read again in place: that rewrite decided
        (SPEC 1: it must be valid) and logged as memstaged's look at it (SPEC 7: no second
        decision). It is taken from the rewrites waiting for their look, and remembered again
        if the transaction's lines do not all reach the log (:meth:`OwnRewrites.settled`)."""
        started = time.perf_counter()
        name = item.plan.key
        rewrite = self._rewrites.take(mdir.path, name)
        assert item.plan.data is not None
        ctx = mdir.context(
            name,
            self.options,
            settled=True,
            decided_at=self._decided_at(int(self.clock() * 1000)),
        )
        verdict = decide(item.plan.data, ctx)
        event = describe(
            verdict, path=os.path.join(mdir.staging, name), memory_dir=mdir.path, dry_run=False
        )
        if not is_look(rewrite, verdict):  # a repair that is not valid: a bug, decided anew
            assert rewrite is not None
            self._rewrites.remember(mdir.path, name, rewrite)
            return Outcome(item.event.decision, identity)
        log_look(self._decisions, event, identity, started)
        return Outcome(item.event.decision, identity, looked=True)

    def _after(
        self,
        item: _Pending,
        announced: set[str],
        decision: Decision,
        reason: str,
        *,
        error: bool = False,
        **extra: Any,
    ) -> Outcome:
        """A planned decision that was not carried out: logged as what it became.

        A plan that was announced has its decision in the log already; this second event says
        that it was not carried out, and why (SPEC 5: logged before, never carried out unlogged).
        """
        event = abandoned(item.event, decision, reason, announced=item.plan.key in announced)
        self._decisions.finish(event, item.started, error=error)
        return Outcome(decision, item.version.identity, error=error, **extra)

    # -- crash recovery, listing ----------------------------------------------------------------

    def recover_temps(self, mdir: MemoryDir) -> list[str] | None:
        """Clean up what a killed memstaged left in ``mdir``; the listing of ``staging/`` when
        it had no temp (:func:`memstaged.files.temp_recovery.recover_memory_dir`)."""
        return temp_recovery.recover_memory_dir(mdir, self.log, self.options, self.clock())

    def scan(
        self, mdir: MemoryDir, listing: Iterable[str] | None = None, *, sort: bool = True
    ) -> list[str]:
        """The staging-file names of ``staging/``; why not, in the log, when it is a link or
        cannot be listed (an unreadable ``staging/`` is no silent success).

        ``listing``: what :meth:`recover_temps` just read of ``staging/``, if it returned one.
        ``sort=False`` leaves a ``listing``'s names in directory order, for a caller that sorts
        only those it will read (sorting 10,000 names is a twentieth of a rescan of decided files).
        """
        self.unlisted.pop(mdir.path, None)
        path = mdir.staging
        try:
            st = os.lstat(path)
        except OSError:
            return []
        if stat.S_ISLNK(st.st_mode):
            self._decisions.staging_linked(mdir)
            return []
        if listing is not None:
            return staging_names(listing, sort=sort)
        try:
            with opened_memory_dir(mdir) as (_mem_fd, staging_fd):
                return staging_names(os.listdir(staging_fd), sort=sort)
        except OSError as err:
            if err.errno == errno.ENOENT:
                return []
            self.unlisted[mdir.path] = f"cannot list {path}: {os_reason(err)}"
            self.log.error(
                "staging_unreadable", memory_dir=mdir.path, path=path, error=os_reason(err)
            )
            return []
