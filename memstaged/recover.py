"""Putting dead-lettered candidates back into ``staging/``, as the agent's ``/memory recover`` does.

The core, :func:`plan`, is pure: records and what ``staging/`` already holds in, a :class:`Plan`
out. It groups candidates by session (and by the staging file they came from), puts each back
into a staging document built from its original file's fields (``original_staging_file``), lets
the triage engine decide that document, and keeps a candidate only if the engine calls it valid or
repairs it to valid. A candidate already in ``staging/`` (or recovered twice in one run) is a
duplicate and is not written again.

The file layer, :func:`recover`, works beside a running daemon (SPEC 5, as ``postsuper -r`` beside
Postfix's queue manager). The plan is made without any lock; it is carried out as
:class:`~memstaged.plan.Change` values through the daemon's own :func:`memstaged.apply.apply`,
in short transactions under ``canonical-writer.lock``, which the daemon obeys, each re-checking
what it depends on and keeping the order that loses nothing: the new staging file is written to
a temp file and made durable (before the lock is taken), renamed to a name no other file has
(``<session>.recovered-<n>.json``) and its directory fsynced; only then are the records it holds
deleted, and then the originals no record needs any more. A candidate that cannot be made valid
stays in the dead-letter store untouched, so recovery never loops.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

import msgspec

from memstaged import fsio
from memstaged.deadletter import (
    RecordFile,
    Waiter,
    announcer,
    drop_originals,
    held_records,
    list_records,
    transact,
)
from memstaged.ecma import encode_json, is_finite_number, parse_json
from memstaged.errors import BusyError, ConfigError, NotJSON
from memstaged.fsio import Identity
from memstaged.memdir import STAGING, MemoryDir, Options, is_staging_name
from memstaged.plan import Change, Held, Kind
from memstaged.quarantine import safe_component
from memstaged.schema import CATEGORIES
from memstaged.survey import decide_entry
from memstaged.timestamps import format_epoch_ms
from memstaged.triage import Context, Decision, Verdict, decide

#: The file name the engine sees while deciding a recovered document.
_DOC_NAME: Final = "recovered.json"
_MAX_NAMES: Final = 100_000


class Action(StrEnum):
    RECOVERED = "recovered"
    DUPLICATE = "duplicate"
    LEFT = "left"
    #: Not looked at again: the memory dir was busy (its lock held); still in the store.
    BUSY = "busy"
    #: No longer in the store when its turn came: another recovery, or a purge, took it.
    GONE = "gone"


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened (or, in a dry run, would happen) to one record."""

    memory_dir: str
    id: str
    session_id: str | None
    category: str | None
    action: str
    staging_file: str | None = None
    reason: str | None = None
    dry_run: bool = False


class Group(msgspec.Struct, kw_only=True):
    """One staging file to write: the candidates of one session from one original file."""

    session_id: str
    base: str
    envelope: dict[str, Any]
    exotic: bool = False
    candidates: dict[str, list[Any]] = {}
    #: Records whose candidate this file holds.
    records: list[str] = []
    #: Records whose candidate is the same as one this file holds: deleted with it.
    duplicates: list[str] = []
    #: The fingerprints of its candidates, as they were and as written.
    fingerprints: list[str] = []
    data: bytes | None = None
    failure: str | None = None


class Plan(msgspec.Struct, kw_only=True):
    groups: list[Group]
    #: record name -> (staging file already holding its candidate, that candidate's fingerprint)
    in_staging: dict[str, tuple[str, str]]
    #: record name -> why it stays in the dead-letter store
    left: dict[str, str]


def fingerprint(category: str, candidate: Any) -> str:
    """Equal for equal candidates of a category, whatever the key order (the agent's stableJson)."""
    return category + ":" + json.dumps(candidate, sort_keys=True, separators=(",", ":"))


def index_staging(entries: Iterable[tuple[str, Verdict | None, bytes | None]]) -> dict[str, str]:
    """Fingerprint -> staging file, for every candidate of a file the engine calls valid or
    repairs (as repaired): those are the candidates that will reach the reconciler."""
    index: dict[str, str] = {}
    for name, verdict, data in entries:
        if verdict is None:
            continue
        if verdict.decision is Decision.VALID and data is not None:
            body = data
        elif verdict.decision is Decision.REPAIRED and verdict.new_bytes is not None:
            body = verdict.new_bytes
        else:
            continue
        try:
            doc = parse_json(body).value
        except NotJSON:
            continue
        candidates = doc.get("candidates") if isinstance(doc, dict) else None
        if not isinstance(candidates, dict):
            continue
        for category in CATEGORIES:
            items = candidates.get(category)
            for item in items if isinstance(items, list) else []:
                index.setdefault(fingerprint(category, item), name)
    return index


# -- the pure core ------------------------------------------------------------------------------


def _unwrap(
    record: RecordFile, project_root: str, clock_ms: int
) -> tuple[dict[str, Any], str, Any] | str:
    """The envelope (file-level fields), category and candidate of a record, or why there is none.

    SPEC 4.2 records carry their original file: its fields are the envelope. Records the agent's
    own tools wrote hold a bare candidate: the envelope is built from the record as the agent's
    recovery builds it, and ``reconcile_attempts`` carries the record's ``attempts``.
    """
    if record.error is not None:
        return f"unreadable record: {record.error}"
    category = record.category
    if category not in CATEGORIES:
        return f"unknown category {category!r}"
    if record.wrapped:
        original = record.doc["candidate"]["original_staging_file"]
        if not isinstance(original, dict):
            return "its original staging file is not a JSON object: no fields to recover it with"
        envelope = {k: v for k, v in original.items() if k != "candidates"}
        return envelope, category, record.candidate
    cand = record.candidate
    if record.meta:  # memstaged's SPEC 4.3 record: no candidate could be found in the file
        what = "was not JSON" if not isinstance(cand, dict) else "held no candidate to be found"
        where = (
            f" (its bytes are in deadletter/originals/{record.original})" if record.original else ""
        )
        return f"whole-file record: the file {what}; nothing to recover{where}"
    if not isinstance(cand, dict):
        return "its candidate is not a JSON object"
    attempts = record.attempts
    if is_finite_number(attempts):
        cand = {**cand, "reconcile_attempts": attempts}
    produced = record.doc.get("produced_at")
    envelope = {
        "schemaVersion": 1,
        "session_id": record.session_id or "recovered",
        "produced_at": produced if isinstance(produced, str) else format_epoch_ms(clock_ms),
        "project_root": project_root,
    }
    return envelope, category, cand


def _context(project_root: str) -> Context:
    return Context(project_root=project_root, file_name=_DOC_NAME, source_path=_DOC_NAME)


def _made_valid(
    envelope: dict[str, Any], category: str, candidate: Any, exotic: bool, project_root: str
) -> tuple[Any, str | None]:
    """The candidate as the engine makes it valid (repaired if need be), or why it cannot be."""
    doc = {**envelope, "candidates": {category: [candidate]}}
    verdict = decide(encode_json(doc, exotic=exotic), _context(project_root))
    if verdict.decision is Decision.VALID:
        return candidate, None
    if verdict.decision is Decision.REPAIRED and verdict.new_bytes is not None:
        return parse_json(verdict.new_bytes).value["candidates"][category][0], None
    if verdict.decision is Decision.FOREIGN:
        return None, f"it belongs to another project: {'; '.join(verdict.reasons)}"
    fixed = set(verdict.repairable)  # R5 adds the categories this one-candidate file lacks
    left = [r for r in verdict.reasons if r not in fixed] or list(verdict.reasons)
    return None, f"cannot be made valid: {'; '.join(left)}"


def plan(
    records: Sequence[RecordFile],
    staging: Mapping[str, str],
    *,
    project_root: str,
    clock_ms: int = 0,
) -> Plan:
    """Decide what recovery does with ``records``, given the candidates ``staging`` holds."""
    groups: dict[tuple[str, str], Group] = {}
    seen: dict[str, Group] = {}
    in_staging: dict[str, tuple[str, str]] = {}
    left: dict[str, str] = {}
    for record in records:
        found = _unwrap(record, project_root, clock_ms)
        if isinstance(found, str):
            left[record.name] = found
            continue
        envelope, category, candidate = found
        fixed, why = _made_valid(envelope, category, candidate, record.exotic, project_root)
        if why is not None:
            left[record.name] = why
            continue
        prints = {fingerprint(category, candidate), fingerprint(category, fixed)}
        holder = next((staging[p] for p in sorted(prints) if p in staging), None)
        if holder is not None:
            in_staging[record.name] = (holder, next(p for p in sorted(prints) if p in staging))
            continue
        twin = next((seen[p] for p in prints if p in seen), None)
        if twin is not None:
            twin.duplicates.append(record.name)
            continue
        session = record.session_id or str(envelope.get("session_id") or "recovered")
        key = (session, json.dumps(envelope, sort_keys=True))
        group = groups.get(key)
        if group is None:
            group = Group(
                session_id=session,
                base=safe_component(session),
                envelope=envelope,
                candidates={},
                records=[],
                duplicates=[],
            )
            groups[key] = group
        group.exotic = group.exotic or record.exotic
        group.candidates.setdefault(category, []).append(fixed)
        group.records.append(record.name)
        group.fingerprints.extend(sorted(prints))
        seen.update(dict.fromkeys(prints, group))
    for group in groups.values():
        _finish(group, project_root)
    return Plan(groups=list(groups.values()), in_staging=in_staging, left=left)


def _finish(group: Group, project_root: str) -> None:
    """The group's staging file, decided by the engine; it must come out ``valid``."""
    candidates = {c: group.candidates[c] for c in CATEGORIES if c in group.candidates}
    doc = {**group.envelope, "candidates": candidates}
    encoded = encode_json(doc, exotic=group.exotic)
    verdict = decide(encoded, _context(project_root))
    if verdict.decision is Decision.VALID:
        data = encoded + b"\n"  # compact: indentation grows with the square of the depth
    elif verdict.decision is Decision.REPAIRED and verdict.new_bytes is not None:
        data = verdict.new_bytes
    else:
        group.failure = f"the recovered file would not be valid: {'; '.join(verdict.reasons)}"
        return
    check = decide(data, _context(project_root))
    if check.decision is not Decision.VALID:
        group.failure = f"the recovered file would be {check.decision.value}, not valid"
        return
    group.data = data


# -- the file layer -----------------------------------------------------------------------------


class Report(msgspec.Struct, kw_only=True):
    outcomes: list[Outcome]
    originals_deleted: list[str] = []
    #: Why the memory dir was busy, when some records were not looked at again; else ``None``.
    busy: str | None = None


def _outcome(
    mdir: MemoryDir,
    record: RecordFile,
    action: Action,
    *,
    dry_run: bool,
    staging_file: str | None = None,
    reason: str | None = None,
) -> Outcome:
    return Outcome(
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
) -> list[Outcome]:
    """The outcome of every record of a group whose file was (would be) written as ``name``."""
    not_deleted = not_deleted or {}
    out = []
    for rec in (*group.records, *group.duplicates):
        record = records[rec]
        if failure is not None or name is None:
            out.append(_outcome(mdir, record, Action.LEFT, dry_run=dry_run, reason=failure))
        elif rec in not_deleted:
            why = f"recovered into {name}, but {not_deleted[rec]}"
            out.append(
                _outcome(mdir, record, Action.LEFT, dry_run=dry_run, staging_file=name, reason=why)
            )
        elif rec in group.duplicates:
            why = "same candidate as another record recovered with it"
            out.append(
                _outcome(
                    mdir, record, Action.DUPLICATE, dry_run=dry_run, staging_file=name, reason=why
                )
            )
        else:
            out.append(_outcome(mdir, record, Action.RECOVERED, dry_run=dry_run, staging_file=name))
    return out


def _staged_outcome(
    mdir: MemoryDir, record: RecordFile, holder: str, *, dry_run: bool, why_left: str | None = None
) -> Outcome:
    """A record whose candidate ``staging/<holder>`` already holds."""
    if why_left is not None:
        return _outcome(mdir, record, Action.LEFT, dry_run=dry_run, reason=why_left)
    return _outcome(
        mdir,
        record,
        Action.DUPLICATE,
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
) -> tuple[dict[str, RecordFile], dict[str, RecordFile], Plan, _Staging]:
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
    found = plan(
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
        while f"{group.base}.recovered-{n}.json" in taken:
            n += 1
        taken.add(f"{group.base}.recovered-{n}.json")
        names.append(f"{group.base}.recovered-{n}.json")
    return names


def _left_outcomes(
    mdir: MemoryDir, records: Mapping[str, RecordFile], found: Plan, dry_run: bool
) -> list[Outcome]:
    return [
        _outcome(mdir, records[name], Action.LEFT, dry_run=dry_run, reason=why)
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
    transactions of :func:`memstaged.apply.apply`, each re-checking what it depends on.
    """
    records, every, found, staged = _gather(mdir, wanted, options, clock)
    try:
        with (
            fsio.opened_dir(mdir.path) as mem_fd,
            fsio.opened_dir(STAGING, mem_fd, create=True) as staging_fd,
        ):
            run = _Recovery(mdir, records, staged, options, clock, waiter, logger)
            run.outcomes += _left_outcomes(mdir, records, found, False)
            run.carry_out(mem_fd, staging_fd, found)
            deleted = run.drop_originals(mem_fd, every)
    except OSError as err:
        raise ConfigError(f"memory dir {mdir.path}: {err.strerror or err}") from None
    outcomes = run.outcomes
    logger.info(
        "deadletter_recovery",
        memory_dir=mdir.path,
        recovered=sum(o.action == Action.RECOVERED for o in outcomes),
        duplicates=sum(o.action == Action.DUPLICATE for o in outcomes),
        left=sum(o.action == Action.LEFT for o in outcomes),
        gone=sum(o.action == Action.GONE for o in outcomes),
        not_tried=sum(o.action == Action.BUSY for o in outcomes),
        busy=run.busy,
        originals_deleted=deleted,
    )
    return Report(outcomes=outcomes, originals_deleted=deleted, busy=run.busy)


class _Recovery:
    """One recovery of one memory dir, carried out transaction by transaction.

    Each group becomes a ``CREATE`` change (its staging file; its records and duplicates to
    remove once that file is durable), each record whose candidate ``staging/`` holds already a
    ``DELETE`` change that depends on that staging file. :func:`memstaged.apply.apply` checks,
    under ``canonical-writer.lock``, that every record is still the very file that was read
    (another recovery or a purge may have taken it); :meth:`_admit` looks again at the staging
    files that are new or changed since the plan (a candidate there now is not written again).
    The daemon obeys the lock, so it decides a recovered file (``valid``) only once the records
    it holds are gone, and never quarantines anything into the store while they are deleted.
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
        self.outcomes: list[Outcome] = []
        self.gone: list[RecordFile] = []
        self.busy: str | None = None
        self.groups: dict[str, Group] = {}

    def carry_out(self, mem_fd: int, staging_fd: int, found: Plan) -> None:
        pending: list[Group] = []
        for group in found.groups:
            if group.failure is not None:
                self.outcomes += self._group(group, None, failure=group.failure)
            else:
                pending.append(group)
        staged = list(found.in_staging.items())
        announce = announcer(self.log)
        while pending or staged:
            groups, pending = pending[:_CHUNK], pending[_CHUNK:]
            held, staged = staged[:_STAGED_CHUNK], staged[_STAGED_CHUNK:]
            changes = [self._create(g) for g in groups] + [self._duplicate(*h) for h in held]
            try:
                transact(
                    self.mdir,
                    mem_fd,
                    staging_fd,
                    changes,
                    waiter=self.waiter,
                    logger=self.log,
                    announce=announce,
                    admit=lambda live: self._admit(staging_fd, live),
                )
            except BusyError as err:
                self.busy = str(err)
                pending, staged = groups + pending, held + staged
                break
            except OSError as err:
                self._stopped(changes, err)
                continue
            for change in changes:
                self._done(staging_fd, change)
        for group in pending:
            self.outcomes += self._group(group, None, action=Action.BUSY, failure=self.busy)
        for rec, _held in staged:
            self.outcomes.append(
                _outcome(self.mdir, self.records[rec], Action.BUSY, dry_run=False, reason=self.busy)
            )

    def _members(self, group: Group) -> list[RecordFile]:
        return [self.records[n] for n in (*group.records, *group.duplicates)]

    def _create(self, group: Group) -> Change:
        """The group's staging file, and its records to remove once that file is durable."""
        key = f"group:{len(self.groups)}"
        self.groups[key] = group
        held = held_records(self._members(group))
        event = {
            "event": "deadletter_recovering",
            "memory_dir": self.mdir.path,
            "session_id": group.session_id,
            "records": [*group.records, *group.duplicates],
        }
        assert group.data is not None
        return Change(
            Kind.CREATE, key, event, depends=held, removes=held, data=group.data, base=group.base
        )

    def _duplicate(self, rec: str, holder_fp: tuple[str, str]) -> Change:
        """A record whose candidate ``staging/<holder>`` holds: removed once that file is
        durable, if it is still the very file recovery looked at."""
        holder = holder_fp[0]
        [record] = held_records([self.records[rec]])
        event = {
            "event": "deadletter_recovering",
            "memory_dir": self.mdir.path,
            "duplicates": [rec],
            "staging_file": f"{STAGING}/{holder}",
        }
        depends = [record, Held(STAGING, holder, self.staged.identities.get(holder))]
        return Change(Kind.DELETE, f"staged:{rec}", event, depends=depends, removes=[record])

    def _admit(self, staging_fd: int, live: Sequence[Change]) -> dict[str, str]:
        """Under the lock: a group one of whose candidates ``staging/`` holds now is refused."""
        appeared = _look(self.mdir, staging_fd, self.options, self.clock, self.staged)
        refused: dict[str, str] = {}
        for change in live:
            group = self.groups.get(change.key)
            if group is None:
                continue
            clash = next((appeared[fp] for fp in group.fingerprints if fp in appeared), None)
            if clash is not None:
                refused[change.key] = (
                    f"staging/{clash} got a candidate of its group while this ran; "
                    "run recover again"
                )
        return refused

    def _done(self, staging_fd: int, change: Change) -> None:
        """The outcomes of a change that :func:`memstaged.apply.apply` went through."""
        group = self.groups.get(change.key)
        removed = set(change.removed)
        self.gone += [self.records[n] for n in removed]
        if group is None:
            self._done_duplicate(change)
            return
        if change.failed is not None:
            self._failed(group, change.failed)
        elif change.stale or change.refused is not None:
            self.outcomes += self._not_written(group, change.stale, change.refused)
        elif change.created is not None:
            name = change.created
            st = fsio.lstat_at(staging_fd, name)
            if st is not None:  # known already: the next look need not decide it again
                self.staged.identities[name] = Identity.of(st)
                for fp in group.fingerprints:
                    self.staged.index.setdefault(fp, name)
            not_deleted = {n: why for n, why in change.left.items()}
            self.log.info(
                "deadletter_recovered",
                memory_dir=self.mdir.path,
                session_id=group.session_id,
                staging_file=f"{STAGING}/{name}",
                records=list(group.records),
                duplicates=list(group.duplicates),
                left=not_deleted,
            )
            self.outcomes += self._group(group, name, not_deleted=not_deleted)

    def _done_duplicate(self, change: Change) -> None:
        rec = change.removes[0].name
        record = self.records[rec]
        holder = change.depends[1].name
        if change.stale.get(rec) == "gone":
            why = "no longer in the store: recovered or purged meanwhile by another process"
            self.outcomes.append(
                _outcome(self.mdir, record, Action.GONE, dry_run=False, reason=why)
            )
            return
        if change.stale.get(rec) == "changed":
            why_left: str | None = "the record changed while this ran; run recover again"
        elif change.stale:
            why_left = f"staging/{holder} changed meanwhile; run recover again"
        else:
            why_left = change.left.get(rec)
        self.outcomes.append(
            _staged_outcome(self.mdir, record, holder, dry_run=False, why_left=why_left)
        )

    def _stopped(self, changes: Sequence[Change], err: OSError) -> None:
        """A transaction stopped by an I/O error: what it did is reported, nothing more."""
        why = f"the transaction stopped: {err.strerror or err}"
        for change in changes:
            group = self.groups.get(change.key)
            done = set(change.removed)
            self.gone += [self.records[n] for n in done]
            if group is None:
                record = self.records[change.removes[0].name]
                if record.name in done:
                    holder = change.depends[1].name
                    self.outcomes.append(_staged_outcome(self.mdir, record, holder, dry_run=False))
                else:
                    self.outcomes.append(
                        _outcome(self.mdir, record, Action.LEFT, dry_run=False, reason=why)
                    )
            elif change.created is None or change.tmp is not None:
                self._failed(group, why)
            else:
                later = "run recover again: it removes them as duplicates"
                left = {
                    n: f"{why}; the record is kept ({later})"
                    for n in (*group.records, *group.duplicates)
                    if n not in done
                }
                self.outcomes += self._group(group, change.created, not_deleted=left)

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

    def _not_written(
        self, group: Group, changes: Mapping[str, str], refused: str | None
    ) -> list[Outcome]:
        out = []
        for rec in (*group.records, *group.duplicates):
            record = self.records[rec]
            change = changes.get(rec)
            if change == "gone":
                why = "no longer in the store: recovered or purged meanwhile by another process"
                out.append(_outcome(self.mdir, record, Action.GONE, dry_run=False, reason=why))
                continue
            if change == "changed":
                why = "the record changed while this ran; run recover again"
            elif refused is not None:
                why = refused
            else:
                why = (
                    "another record of its group changed or vanished while this ran; "
                    "run recover again"
                )
            out.append(_outcome(self.mdir, record, Action.LEFT, dry_run=False, reason=why))
        return out

    def _group(
        self,
        group: Group,
        name: str | None,
        *,
        action: Action = Action.LEFT,
        failure: str | None = None,
        not_deleted: Mapping[str, str] | None = None,
    ) -> list[Outcome]:
        if action is Action.BUSY:
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
