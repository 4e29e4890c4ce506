"""``deadletter recover``: putting dead-lettered candidates back into ``staging/``, as the agent's
``/memory recover`` does.

What to write is decided by the pure core, :func:`memstaged.deadletter.recover_plan.plan`.
:func:`recover` carries it out beside a running daemon (SPEC 5, as ``postsuper -r`` beside Postfix's
queue manager). The plan is made without any lock; it is carried out as
:class:`~memstaged.files.plan.Plan` values through the daemon's own transaction
(:func:`memstaged.files.transaction.begin`), in short transactions under ``canonical-writer.lock``,
which the daemon obeys, each re-checking what it depends on and keeping the order that loses
nothing: the new staging file is written to a temp file and made durable (before the lock is
taken), renamed to a name no other file has (``<session>.recovered-<n>.json``) and its
directory fsynced; only then are the records it holds deleted, and then the originals no record
needs any more (:func:`memstaged.deadletter.purge.drop_originals`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

import msgspec

from memstaged.deadletter import recover_plan
from memstaged.deadletter.changes import Waiter, announcer, held_records, transacting
from memstaged.deadletter.purge import drop_originals
from memstaged.deadletter.recover_plan import Found, Group, index_staging
from memstaged.deadletter.store import RecordFile, list_records
from memstaged.errors import BusyError, ConfigError
from memstaged.files import fsio
from memstaged.files.fsio import Identity
from memstaged.files.memdir import STAGING, MemoryDir, Options, is_staging_name
from memstaged.files.plan import Action as PlanAction
from memstaged.files.plan import Held, Plan, Result, Status, so_far
from memstaged.files.recheck import recovered_name
from memstaged.run.preview import decide_entry


class RecoverAction(StrEnum):
    RECOVERED = "recovered"
    DUPLICATE = "duplicate"
    LEFT = "left"
    #: Not looked at again: the memory dir was busy (its lock held); still in the store.
    BUSY = "busy"
    #: No longer in the store when its turn came: another recovery, or a purge, took it.
    GONE = "gone"


class RecordOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened (or, in a dry run, would happen) to one record."""

    memory_dir: str
    id: str
    session_id: str | None
    category: str | None
    action: str
    staging_file: str | None = None
    reason: str | None = None
    dry_run: bool = False


class Report(msgspec.Struct, kw_only=True):
    outcomes: list[RecordOutcome]
    originals_deleted: list[str] = []
    #: Why the memory dir was busy, when some records were not looked at again; else ``None``.
    busy: str | None = None
    #: The I/O error that stopped the recovery (what was done before is in ``outcomes``).
    error: str | None = None


def _outcome(
    mdir: MemoryDir,
    record: RecordFile,
    action: RecoverAction,
    *,
    dry_run: bool,
    staging_file: str | None = None,
    reason: str | None = None,
) -> RecordOutcome:
    return RecordOutcome(
        memory_dir=mdir.path,
        id=record.id,
        session_id=record.session_id,
        category=record.category,
        action=action.value,
        staging_file=staging_file,
        reason=reason,
        dry_run=dry_run,
    )


def _group_outcomes(
    mdir: MemoryDir,
    group: Group,
    records: Mapping[str, RecordFile],
    name: str | None,
    *,
    dry_run: bool,
    failure: str | None = None,
    not_deleted: Mapping[str, str] | None = None,
) -> list[RecordOutcome]:
    """The outcome of every record of a group whose file was (would be) written as ``name``."""
    not_deleted = not_deleted or {}
    out = []
    for rec in (*group.records, *group.duplicates):
        record = records[rec]
        if failure is not None or name is None:
            out.append(_outcome(mdir, record, RecoverAction.LEFT, dry_run=dry_run, reason=failure))
        elif rec in not_deleted:
            why = f"recovered into {name}, but {not_deleted[rec]}"
            out.append(
                _outcome(
                    mdir, record, RecoverAction.LEFT, dry_run=dry_run, staging_file=name, reason=why
                )
            )
        elif rec in group.duplicates:
            why = "same candidate as another record recovered with it"
            out.append(
                _outcome(
                    mdir,
                    record,
                    RecoverAction.DUPLICATE,
                    dry_run=dry_run,
                    staging_file=name,
                    reason=why,
                )
            )
        else:
            out.append(
                _outcome(mdir, record, RecoverAction.RECOVERED, dry_run=dry_run, staging_file=name)
            )
    return out


def _staged_outcome(
    mdir: MemoryDir, record: RecordFile, holder: str, *, dry_run: bool, why_left: str | None = None
) -> RecordOutcome:
    """A record whose candidate ``staging/<holder>`` already holds."""
    if why_left is not None:
        return _outcome(mdir, record, RecoverAction.LEFT, dry_run=dry_run, reason=why_left)
    return _outcome(
        mdir,
        record,
        RecoverAction.DUPLICATE,
        dry_run=dry_run,
        staging_file=holder,
        reason=f"already in staging/{holder}",
    )


class _Staging(msgspec.Struct):
    """What recovery knows of ``staging/``: each file it looked at, by the identity it had just
    before it was read, and the fingerprint of every candidate that will reach the reconciler."""

    identities: dict[str, Identity]
    index: dict[str, str]


def _look(
    mdir: MemoryDir, staging_fd: int, options: Options, clock: float, staged: _Staging
) -> dict[str, str]:
    """Index the staging files that are new or changed since ``staged`` last looked.

    Returns the fingerprints found in them (fingerprint -> file). Unchanged files cost a stat,
    so that this can run again under the lock, where it sees what writers (or a recovery killed
    halfway) put in place since the plan was made.
    """
    found: dict[str, str] = {}
    for name in sorted(n for n in os.listdir(staging_fd) if is_staging_name(n)):
        st = fsio.lstat_at(staging_fd, name)
        if st is None:
            continue
        identity = Identity.of(st)
        if staged.identities.get(name) == identity:
            continue
        staged.identities[name] = (
            identity  # taken before the read: a later change is seen next time
        )
        entry = decide_entry(mdir, staging_fd, name, options, clock)
        if entry is None:
            continue
        for fp in index_staging([(name, entry[1], entry[2])]):
            found.setdefault(fp, name)
            staged.index.setdefault(fp, name)
    return found


def _gather(
    mdir: MemoryDir, wanted: set[str] | None, options: Options, clock: float
) -> tuple[dict[str, RecordFile], dict[str, RecordFile], Found, _Staging]:
    """The chosen records, every record, the plan and what ``staging/`` holds; no lock taken."""
    every = {r.name: r for r in list_records(mdir)}
    records = {n: r for n, r in every.items() if wanted is None or n in wanted}
    staged = _Staging(identities={}, index={})
    try:
        with fsio.opened_dir(mdir.path) as mem_fd:
            try:
                staging_fd = fsio.open_dir(STAGING, mem_fd)
            except (FileNotFoundError, NotADirectoryError):
                staging_fd = None
            if staging_fd is not None:
                try:
                    _look(mdir, staging_fd, options, clock, staged)
                finally:
                    os.close(staging_fd)
    except OSError as err:
        raise ConfigError(f"{mdir.staging}: {err.strerror}") from None
    found = recover_plan.plan(
        list(records.values()),
        staged.index,
        project_root=mdir.project_root,
        clock_ms=int(clock * 1000),
    )
    return records, every, found, staged


def _free_names(existing: set[str], groups: Sequence[Group]) -> list[str]:
    """The names a dry run predicts (the real run takes the first free one when it writes)."""
    names = []
    taken = set(existing)
    for group in groups:
        n = 1
        while recovered_name(group.base, n) in taken:
            n += 1
        taken.add(recovered_name(group.base, n))
        names.append(recovered_name(group.base, n))
    return names


def _left_outcomes(
    mdir: MemoryDir, records: Mapping[str, RecordFile], found: Found, dry_run: bool
) -> list[RecordOutcome]:
    return [
        _outcome(mdir, records[name], RecoverAction.LEFT, dry_run=dry_run, reason=why)
        for name, why in found.left.items()
    ]


def preview(mdir: MemoryDir, wanted: set[str] | None, options: Options, clock: float) -> Report:
    """What :func:`recover` would do, changing nothing."""
    records, _every, found, _staged = _gather(mdir, wanted, options, clock)
    try:
        existing = {n for n in os.listdir(mdir.staging) if is_staging_name(n)}
    except OSError:
        existing = set()
    outcomes = _left_outcomes(mdir, records, found, True)
    for group, name in zip(found.groups, _free_names(existing, found.groups), strict=True):
        outcomes += _group_outcomes(mdir, group, records, name, dry_run=True, failure=group.failure)
    for rec, (holder, _fp) in found.in_staging.items():
        outcomes.append(_staged_outcome(mdir, records[rec], holder, dry_run=True))
    return Report(outcomes=outcomes)


#: Groups whose staging files are written (outside the lock) ahead of one transaction, and
#: records already in staging/ deleted in one: SPEC 5 wants no memstaged operation to hold
#: canonical-writer.lock for longer than about a second, and the daemon waits meanwhile.
_CHUNK: Final = 32
_STAGED_CHUNK: Final = 256


def recover(
    mdir: MemoryDir,
    wanted: set[str] | None,
    *,
    options: Options,
    clock: float,
    waiter: Waiter,
    logger: Any,
) -> Report:
    """Recover the records named in ``wanted`` (``None``: all) of ``mdir``; see the module doc.

    Works beside a running daemon: the plan is made without any lock, and carried out in short
    transactions of :func:`memstaged.files.transaction.begin`, each re-checking what it depends on.
    An I/O error stops it (exit 1, not a usage error): what was done is
    reported, and every record not yet tried is left, with the error as its reason.
    """
    records, every, found, staged = _gather(mdir, wanted, options, clock)
    run = _Recovery(mdir, records, staged, options, clock, waiter, logger)
    run.outcomes += _left_outcomes(mdir, records, found, False)
    deleted: list[str] = []
    error: str | None = None
    try:
        with (
            fsio.opened_dir(mdir.path) as mem_fd,
            fsio.opened_dir(STAGING, mem_fd, create=True) as staging_fd,
        ):
            run.carry_out(mem_fd, staging_fd, found)
            deleted = run.drop_originals(mem_fd, every)
    except OSError as err:
        error = f"memory dir {mdir.path}: {err.strerror or err}"
        tried = {o.id for o in run.outcomes}
        run.outcomes += [
            _outcome(mdir, r, RecoverAction.LEFT, dry_run=False, reason=f"not tried: {error}")
            for r in records.values()
            if r.id not in tried
        ]
    outcomes = run.outcomes
    logger.info(
        "deadletter_recovery",
        memory_dir=mdir.path,
        recovered=sum(o.action == RecoverAction.RECOVERED for o in outcomes),
        duplicates=sum(o.action == RecoverAction.DUPLICATE for o in outcomes),
        left=sum(o.action == RecoverAction.LEFT for o in outcomes),
        gone=sum(o.action == RecoverAction.GONE for o in outcomes),
        not_tried=sum(o.action == RecoverAction.BUSY for o in outcomes),
        busy=run.busy,
        originals_deleted=deleted,
    )
    return Report(outcomes=outcomes, originals_deleted=deleted, busy=run.busy, error=error)


class _Recovery:
    """One recovery of one memory dir, carried out transaction by transaction.

    Each group becomes a ``CREATE`` plan (its staging file; its records and duplicates removed
    once that file is durable), each record whose candidate ``staging/`` holds already an
    ``UNLINK`` plan that depends on that staging file. :func:`memstaged.files.transaction.begin`
    checks, under ``canonical-writer.lock``, that every record is still the very file that was
    read (another recovery or a purge may have taken it); then, still under the lock and before
    the commit, :meth:`_refuse` looks again at the staging files that are new or changed since
    the plan (a group a candidate of which is there now is not written again). The daemon
    obeys the lock, so it decides a recovered file (``valid``) only once the records it holds
    are gone, and never quarantines anything into the store while they are
    deleted. :meth:`_settle` turns each plan's result into the outcomes of its records.
    """

    def __init__(
        self,
        mdir: MemoryDir,
        records: Mapping[str, RecordFile],
        staged: _Staging,
        options: Options,
        clock: float,
        waiter: Waiter,
        logger: Any,
    ) -> None:
        self.mdir = mdir
        self.records = records
        self.staged = staged
        self.options = options
        self.clock = clock
        self.waiter = waiter
        self.log = logger
        self.outcomes: list[RecordOutcome] = []
        self.gone: list[RecordFile] = []
        self.busy: str | None = None
        #: Plan key -> its group (``CREATE``) and its announcement.
        self.groups: dict[str, Group] = {}
        self.events: dict[str, dict[str, Any]] = {}

    def carry_out(self, mem_fd: int, staging_fd: int, found: Found) -> None:
        pending: list[Group] = []
        for group in found.groups:
            if group.failure is not None:
                self.outcomes += self._group(group, None, failure=group.failure)
            else:
                pending.append(group)
        staged = list(found.in_staging.items())
        announce = announcer(self.log, self.events)
        while pending or staged:
            groups, pending = pending[:_CHUNK], pending[_CHUNK:]
            held, staged = staged[:_STAGED_CHUNK], staged[_STAGED_CHUNK:]
            plans = [self._create(g) for g in groups] + [self._duplicate(*h) for h in held]
            stopped: str | None = None
            try:
                with transacting(
                    self.mdir, mem_fd, staging_fd, plans, waiter=self.waiter, logger=self.log
                ) as tx:
                    refused = self._refuse(staging_fd, tx.live)
                    results = tx.commit(announce=announce, refused=refused).results
            except BusyError as err:
                self.busy = str(err)
                pending, staged = groups + pending, held + staged
                break
            except OSError as err:  # what it did is reported, nothing more
                stopped = f"the transaction stopped: {err.strerror or err}"
                results = {p.key: so_far(err, p.key) for p in plans}
            for plan in plans:
                self._settle(staging_fd, plan, results[plan.key], stopped)
        for group in pending:
            self.outcomes += self._group(group, None, action=RecoverAction.BUSY, failure=self.busy)
        for rec, _held in staged:
            self.outcomes.append(
                _outcome(
                    self.mdir,
                    self.records[rec],
                    RecoverAction.BUSY,
                    dry_run=False,
                    reason=self.busy,
                )
            )

    def _members(self, group: Group) -> list[RecordFile]:
        return [self.records[n] for n in (*group.records, *group.duplicates)]

    def _create(self, group: Group) -> Plan:
        """The group's staging file, and its records to remove once that file is durable."""
        key = f"group:{len(self.groups)}"
        self.groups[key] = group
        held = held_records(self._members(group))
        self.events[key] = {
            "event": "deadletter_recovering",
            "memory_dir": self.mdir.path,
            "session_id": group.session_id,
            "records": [*group.records, *group.duplicates],
        }
        assert group.data is not None
        return Plan(
            key=key,
            action=PlanAction.CREATE,
            depends=held,
            removes=held,
            data=group.data,
            base=group.base,
        )

    def _duplicate(self, rec: str, holder_fp: tuple[str, str]) -> Plan:
        """A record whose candidate ``staging/<holder>`` holds: removed once that file is
        durable, if it is still the very file recovery looked at."""
        holder = holder_fp[0]
        key = f"staged:{rec}"
        (record,) = held_records([self.records[rec]])
        self.events[key] = {
            "event": "deadletter_recovering",
            "memory_dir": self.mdir.path,
            "duplicates": [rec],
            "staging_file": f"{STAGING}/{holder}",
        }
        depends = (record, Held(STAGING, holder, self.staged.identities.get(holder)))
        return Plan(key=key, action=PlanAction.UNLINK, depends=depends, removes=(record,))

    def _refuse(self, staging_fd: int, live: Sequence[Plan]) -> dict[str, str]:
        """Under the lock: a group one of whose candidates ``staging/`` holds now is refused."""
        if not live:
            return {}
        appeared = _look(self.mdir, staging_fd, self.options, self.clock, self.staged)
        refused: dict[str, str] = {}
        for plan in live:
            group = self.groups.get(plan.key)
            if group is None:
                continue
            clash = next((appeared[fp] for fp in group.fingerprints if fp in appeared), None)
            if clash is not None:
                refused[plan.key] = (
                    f"staging/{clash} got a candidate of its group while this ran; "
                    "run recover again"
                )
        return refused

    def _settle(self, staging_fd: int, plan: Plan, result: Result, stopped: str | None) -> None:
        """The outcomes of the records of one plan, from its result (``stopped``: why its
        transaction stopped, when it did)."""
        removed = set(result.removed)
        self.gone += [self.records[n] for n in result.removed]
        group = self.groups.get(plan.key)
        if group is None:
            self._settle_duplicate(plan, result, stopped)
        elif stopped is not None and result.created is not None:
            later = "run recover again: it removes them as duplicates"
            left = {
                n: f"{stopped}; the record is kept ({later})"
                for n in (*group.records, *group.duplicates)
                if n not in removed
            }
            self.outcomes += self._group(group, result.created, not_deleted=left)
        elif stopped is not None or result.status is Status.FAILED:
            why = stopped if stopped is not None else result.reason or "failed"
            self._failed(group, why)
        elif result.status is not Status.DONE:
            self.outcomes += self._not_written(group, result)
        elif result.created is not None:
            name = result.created
            st = fsio.lstat_at(staging_fd, name)
            if st is not None:  # known already: the next look need not decide it again
                self.staged.identities[name] = Identity.of(st)
                for fp in group.fingerprints:
                    self.staged.index.setdefault(fp, name)
            self.log.info(
                "deadletter_recovered",
                memory_dir=self.mdir.path,
                session_id=group.session_id,
                staging_file=f"{STAGING}/{name}",
                records=list(group.records),
                duplicates=list(group.duplicates),
                left=dict(result.left),
            )
            self.outcomes += self._group(group, name, not_deleted=result.left)

    def _settle_duplicate(self, plan: Plan, result: Result, stopped: str | None) -> None:
        rec = plan.removes[0].name
        record = self.records[rec]
        holder = plan.depends[1].name
        stale = result.stale.get(rec)
        if stopped is not None and rec not in result.removed:
            self.outcomes.append(
                _outcome(self.mdir, record, RecoverAction.LEFT, dry_run=False, reason=stopped)
            )
            return
        if stale == "gone":
            self.outcomes.append(
                _outcome(self.mdir, record, RecoverAction.GONE, dry_run=False, reason=_TAKEN)
            )
            return
        if stale == "changed":
            why_left: str | None = "the record changed while this ran; run recover again"
        elif result.stale:
            why_left = f"staging/{holder} changed meanwhile; run recover again"
        else:
            why_left = result.left.get(rec)
        self.outcomes.append(
            _staged_outcome(self.mdir, record, holder, dry_run=False, why_left=why_left)
        )

    def _failed(self, group: Group, why: str) -> None:
        failure = f"{why}; nothing deleted"
        self.log.error(
            "deadletter_recover_failed",
            memory_dir=self.mdir.path,
            session_id=group.session_id,
            records=[*group.records, *group.duplicates],
            reason=failure,
        )
        self.outcomes += self._group(group, None, failure=failure)

    def _not_written(self, group: Group, result: Result) -> list[RecordOutcome]:
        out = []
        for rec in (*group.records, *group.duplicates):
            record = self.records[rec]
            stale = result.stale.get(rec)
            if stale == "gone":
                out.append(
                    _outcome(self.mdir, record, RecoverAction.GONE, dry_run=False, reason=_TAKEN)
                )
                continue
            if stale == "changed":
                why = "the record changed while this ran; run recover again"
            elif result.status is Status.REFUSED and result.reason is not None:
                why = result.reason
            else:
                why = (
                    "another record of its group changed or vanished while this ran; "
                    "run recover again"
                )
            out.append(_outcome(self.mdir, record, RecoverAction.LEFT, dry_run=False, reason=why))
        return out

    def _group(
        self,
        group: Group,
        name: str | None,
        *,
        action: RecoverAction = RecoverAction.LEFT,
        failure: str | None = None,
        not_deleted: Mapping[str, str] | None = None,
    ) -> list[RecordOutcome]:
        if action is RecoverAction.BUSY:
            return [
                _outcome(self.mdir, r, action, dry_run=False, reason=failure)
                for r in self._members(group)
            ]
        return _group_outcomes(
            self.mdir,
            group,
            self.records,
            name,
            dry_run=False,
            failure=failure,
            not_deleted=not_deleted,
        )

    def drop_originals(self, mem_fd: int, every: Mapping[str, RecordFile]) -> list[str]:
        """Delete the originals of deleted records that no record present now needs."""
        maybe = sorted({r.original for r in self.gone if r.original is not None})
        if not maybe or self.busy is not None:
            return []
        gone = {r.name for r in self.gone}
        keep = {n: r for n, r in every.items() if n not in gone}
        try:
            return drop_originals(
                self.mdir, mem_fd, maybe, keep, waiter=self.waiter, logger=self.log
            )
        except BusyError as err:
            self.busy = f"{err} (the originals of the recovered records are kept)"
            return []
        except OSError as err:
            self.log.error(
                "deadletter_recover_failed",
                memory_dir=self.mdir.path,
                originals=maybe,
                reason=f"the originals were not deleted: {err.strerror or err}",
            )
            return []


#: Why a record is ``gone``.
_TAKEN: Final = "no longer in the store: recovered or purged meanwhile by another process"
