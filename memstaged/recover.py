"""Putting dead-lettered candidates back into ``staging/``, as the agent's ``/memory recover`` does.

The core, :func:`plan`, is pure: records and what ``staging/`` already holds in, a :class:`Plan`
out. It groups candidates by session (and by the staging file they came from), puts each back
into a staging document built from its original file's fields (``original_staging_file``), lets
the triage engine decide that document, and keeps a candidate only if the engine calls it valid or
repairs it to valid. A candidate already in ``staging/`` (or recovered twice in one run) is a
duplicate and is not written again.

The file layer, :func:`recover`, carries a plan out under the memory dir's locks, in the order
that loses nothing: the new staging file is written to a temp file, fsynced, renamed to a name no
other file has (``<session>.recovered-<n>.json``) and its directory fsynced; only then are the
records it holds deleted, and then the originals no record needs any more. A candidate that cannot
be made valid stays in the dead-letter store untouched, so recovery never loops.
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
    delete_originals,
    delete_records,
    exclusive,
    list_records,
    referenced,
    still_needed,
)
from memstaged.ecma import encode_json, is_finite_number, parse_json
from memstaged.errors import ConfigError, NotJSON
from memstaged.pipeline import STAGING, MemoryDir, Options, is_staging_name
from memstaged.quarantine import safe_component
from memstaged.schema import CATEGORIES
from memstaged.survey import decide_entry, iter_staging
from memstaged.timestamps import format_epoch_ms
from memstaged.triage import Context, Decision, Verdict, decide

#: The file name the engine sees while deciding a recovered document.
_DOC_NAME: Final = "recovered.json"
_MAX_NAMES: Final = 100_000


class Action(StrEnum):
    RECOVERED = "recovered"
    DUPLICATE = "duplicate"
    LEFT = "left"


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
    return None, f"cannot be made valid: {'; '.join(verdict.reasons)}"


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


def _gather(
    mdir: MemoryDir, wanted: set[str] | None, options: Options, clock: float
) -> tuple[dict[str, RecordFile], Plan]:
    records = {r.name: r for r in list_records(mdir) if wanted is None or r.name in wanted}
    try:
        entries = [(e.name, v, d) for e, v, d in iter_staging(mdir, options, clock)]
    except OSError as err:
        raise ConfigError(f"{mdir.staging}: {err.strerror}") from None
    found = plan(
        list(records.values()),
        index_staging(entries),
        project_root=mdir.project_root,
        clock_ms=int(clock * 1000),
    )
    return records, found


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
    records, found = _gather(mdir, wanted, options, clock)
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


def _write_group(staging_fd: int, group: Group) -> str:
    """Write the group's file durably under a new name; never replaces an existing file."""
    assert group.data is not None
    tmp = fsio.write_temp(staging_fd, group.data, "recover", f"{group.base}.recovered.json")
    try:
        for n in range(1, _MAX_NAMES):
            name = f"{group.base}.recovered-{n}.json"
            try:
                fsio.rename_noreplace(staging_fd, tmp, staging_fd, name)
            except FileExistsError:
                continue
            fsio.fsync_dir(staging_fd)
            return name
        raise OSError(f"no free name for {group.base}.recovered-<n>.json in staging/")
    finally:
        fsio.unlink_quietly(staging_fd, tmp)  # gone after the rename; left only on failure


def _still_holds(
    mdir: MemoryDir, staging_fd: int, name: str, fp: str, options: Options, clock: float
) -> bool:
    """``staging/<name>`` still holds the candidate ``fp``; if so it is fsynced, so the record
    can go."""
    found = decide_entry(mdir, staging_fd, name, options, clock)
    if found is None or fp not in index_staging([(name, found[1], found[2])]):
        return False
    with fsio.open_regular(staging_fd, name) as (fd, _st):
        os.fsync(fd)
    return True


def recover(
    mdir: MemoryDir,
    wanted: set[str] | None,
    *,
    options: Options,
    clock: float,
    wait: bool,
    logger: Any,
) -> Report:
    """Recover the records named in ``wanted`` (``None``: all) of ``mdir``; see the module doc."""
    with exclusive(mdir, wait=wait, logger=logger) as mem_fd:
        records, found = _gather(mdir, wanted, options, clock)
        outcomes = _left_outcomes(mdir, records, found, False)
        gone: list[RecordFile] = []
        with fsio.opened_dir(STAGING, mem_fd, create=True) as staging_fd:
            for group in found.groups:
                outcomes.extend(
                    _apply_group(mdir, mem_fd, staging_fd, group, records, gone, logger)
                )
            for rec, (holder, fp) in found.in_staging.items():
                record = records[rec]
                if _still_holds(mdir, staging_fd, holder, fp, options, clock):
                    why_left = delete_records(mem_fd, [record]).get(rec)
                else:
                    why_left = f"staging/{holder} changed meanwhile; run recover again"
                if why_left is None:
                    gone.append(record)
                outcomes.append(
                    _staged_outcome(mdir, record, holder, dry_run=False, why_left=why_left)
                )
        deleted = _drop_originals(mdir, mem_fd, gone)
    logger.info(
        "deadletter_recovery",
        memory_dir=mdir.path,
        recovered=sum(o.action == Action.RECOVERED for o in outcomes),
        duplicates=sum(o.action == Action.DUPLICATE for o in outcomes),
        left=sum(o.action == Action.LEFT for o in outcomes),
        originals_deleted=deleted,
    )
    return Report(outcomes=outcomes, originals_deleted=deleted)


def _apply_group(
    mdir: MemoryDir,
    mem_fd: int,
    staging_fd: int,
    group: Group,
    records: Mapping[str, RecordFile],
    gone: list[RecordFile],
    logger: Any,
) -> list[Outcome]:
    members = [records[n] for n in (*group.records, *group.duplicates)]
    failure = group.failure
    name: str | None = None
    if failure is None:
        try:
            name = _write_group(staging_fd, group)
        except OSError as err:
            failure = f"could not write the staging file: {err.strerror or err}; nothing deleted"
            logger.error(
                "deadletter_recover_failed",
                memory_dir=mdir.path,
                session_id=group.session_id,
                records=[r.name for r in members],
                reason=failure,
            )
    if failure is not None or name is None:
        return _group_outcomes(mdir, group, records, None, dry_run=False, failure=failure)
    left = delete_records(mem_fd, members)
    gone.extend(r for r in members if r.name not in left)
    logger.info(
        "deadletter_recovered",
        memory_dir=mdir.path,
        session_id=group.session_id,
        staging_file=f"{STAGING}/{name}",
        records=list(group.records),
        duplicates=list(group.duplicates),
        left=left,
    )
    return _group_outcomes(mdir, group, records, name, dry_run=False, not_deleted=left)


def _drop_originals(mdir: MemoryDir, mem_fd: int, gone: Sequence[RecordFile]) -> list[str]:
    """Delete the originals of deleted records that no remaining record needs."""
    maybe = {r.original for r in gone if r.original is not None}
    if not maybe:
        return []
    names, hashes = referenced(list_records(mdir))
    return delete_originals(mem_fd, sorted(o for o in maybe if not still_needed(o, names, hashes)))
