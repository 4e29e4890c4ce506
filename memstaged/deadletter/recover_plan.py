"""The pure core of ``deadletter recover``: records in, what to write back out (no disk).

:func:`plan` takes records and what ``staging/`` already holds (fingerprint -> file), and
returns :class:`Found`. It groups candidates by session (and by the staging file they came
from), puts each back into a staging document built from its original file's fields
(``original_staging_file``), lets the triage engine decide that document, and keeps a candidate
only if the engine calls it valid or repairs it to valid. A candidate already in ``staging/`` (or
recovered twice in one run) is a duplicate and is not written again. A candidate that cannot be
made valid stays in the dead-letter store untouched, so recovery never loops.
:mod:`memstaged.deadletter.recover` carries the answer out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from memstaged.core.decide import Context, Decision, Verdict, decide
from memstaged.core.js.ecma import encode_json, is_finite_number, parse_json
from memstaged.core.records import safe_component
from memstaged.core.schema import CATEGORIES
from memstaged.core.timestamps import format_epoch_ms
from memstaged.deadletter.store import RecordFile
from memstaged.errors import NotJSON

#: The file name the engine sees while deciding a recovered document.
_DOC_NAME: Final = "recovered.json"


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


class Found(msgspec.Struct, kw_only=True):
    """What recovery does with the records chosen: the pure core's answer."""

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
) -> Found:
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
    return Found(groups=list(groups.values()), in_staging=in_staging, left=left)


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
