"""The triage engine: one decision for the bytes of one staging file (SPEC sections 1-4).

:func:`decide` is pure: bytes and a :class:`Context` in, a :class:`Verdict` out, no file system and
no clock (the caller says whether the file has settled and what time it is). The batch run, the
daemon and the inspection commands all call it, so they cannot disagree about a file.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, Final

import msgspec

from memstaged.ecma import (
    JS_WHITESPACE_SET,
    encode_json,
    is_nonempty_string,
    parse_json,
    run_deep,
    trim,
)
from memstaged.errors import NotJSON
from memstaged.project import foreign_root
from memstaged.quarantine import (
    DeadLetter,
    Origin,
    candidate_records,
    original_name,
    whole_file_record,
)
from memstaged.repair import Repair, repair_timestamp, repair_triggers, split_candidates
from memstaged.schema import CATEGORIES, check_file, is_valid
from memstaged.timestamps import EPOCH

BOM: Final = b"\xef\xbb\xbf"


class Decision(StrEnum):
    """The six outcomes of SPEC section 1."""

    VALID = "valid"
    REPAIRED = "repaired"
    QUARANTINED = "quarantined"
    FOREIGN = "foreign"
    DEFERRED = "deferred"
    SKIPPED = "skipped"


class Context(msgspec.Struct, frozen=True):
    """What the engine needs to know besides the bytes."""

    project_root: str
    file_name: str
    source_path: str = ""
    #: False while the file was modified within the settle interval (SPEC section 5).
    settled: bool = True
    split_invalid_candidates: bool = False
    decided_at: str = EPOCH


class Verdict(msgspec.Struct, frozen=True):
    """A decision and everything needed to carry it out and to log it."""

    decision: Decision
    sha256: str
    size: int
    session_id: str | None = None
    reasons: tuple[str, ...] = ()
    repairs: tuple[Repair, ...] = ()
    #: The rewritten file, for ``repaired``.
    new_bytes: bytes | None = None
    #: Records to write in ``deadletter/`` (``quarantined``, or ``repaired`` by R4).
    deadletter: tuple[DeadLetter, ...] = ()
    #: The name under ``deadletter/originals/`` for the original bytes, when they go there.
    original: str | None = None


def _session_id(doc: object) -> str | None:
    value = doc.get("session_id") if isinstance(doc, dict) else None
    return trim(value) if isinstance(value, str) and is_nonempty_string(value) else None


def _foreign_root(doc: object, project_root: str) -> str | None:
    """:func:`foreign_root`, without normalizing two paths when the file names the root verbatim.

    Almost every file names its project exactly as the context does; when that text is absolute
    and has no whitespace to trim at either end, resolving it against the root gives it back
    unchanged, so it is the root and the file is not foreign.
    """
    value = doc.get("project_root") if isinstance(doc, dict) else None
    if (
        value.__class__ is str
        and value == project_root
        and value[:1] == "/"
        and value[-1] not in JS_WHITESPACE_SET
    ):
        return None
    return foreign_root(doc, project_root)


def _origin(ctx: Context, sha: str, size: int, errors: list[str]) -> Origin:
    return Origin(ctx.file_name, ctx.source_path, sha, size, ctx.decided_at, tuple(errors))


def decide(data: bytes, ctx: Context) -> Verdict:
    """Decide ``data``, the bytes of the staging file ``ctx.file_name``. Never raises.

    A document nested too deep for the caller's stack (while encoding a repair or a record) is
    decided again in a thread of fixed depth, so the verdict depends on the bytes only; one too
    deep even there is quarantined as text.
    """
    try:
        return _decide(data, ctx)
    except RecursionError:
        pass  # retried below, outside the handler, so the traceback does not pin the stack
    try:
        return run_deep(_decide, data, ctx)
    except RecursionError:
        return _too_deep(data, ctx)


def _too_deep(data: bytes, ctx: Context) -> Verdict:
    sha = hashlib.sha256(data).hexdigest()
    return _unparseable(data, ctx, sha, len(data), NotJSON("JSON nesting is too deep to handle"))


def _unparseable(data: bytes, ctx: Context, sha: str, size: int, err: NotJSON) -> Verdict:
    if not ctx.settled:
        reason = f"{err}; may still be being written, waiting for it to settle"
        return Verdict(Decision.DEFERRED, sha, size, reasons=(reason,))
    text: Any
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    origin = _origin(ctx, sha, size, [str(err)])
    return Verdict(
        Decision.QUARANTINED,
        sha,
        size,
        reasons=(str(err),),
        deadletter=(whole_file_record(text, origin, exotic=True),),
        original=original_name(ctx.file_name, sha),
    )


def _decide(data: bytes, ctx: Context) -> Verdict:
    sha = hashlib.sha256(data).hexdigest()
    size = len(data)
    body = data[len(BOM) :] if data.startswith(BOM) else data
    bom_repair = (Repair("R2", "(file)", "removed the UTF-8 byte-order mark"),)
    repairs: tuple[Repair, ...] = bom_repair if body is not data else ()
    try:
        parsed = parse_json(body)
    except NotJSON as err:
        return _unparseable(data, ctx, sha, size, err)
    doc, exotic = parsed.value, parsed.exotic
    session = _session_id(doc)
    other = _foreign_root(doc, ctx.project_root)
    if other is not None:
        reason = f"project_root names {other}, not {ctx.project_root}"
        return Verdict(Decision.FOREIGN, sha, size, session, reasons=(reason,))
    if is_valid(doc):  # the common case, decided without building the report it would discard
        if repairs:  # only the BOM: drop it and keep every other byte as it was
            return Verdict(Decision.REPAIRED, sha, size, session, repairs=repairs, new_bytes=body)
        return Verdict(Decision.VALID, sha, size, session)
    report = check_file(doc)
    errors = [str(p) for p in report.problems()]
    if isinstance(doc, dict):
        fixed, r3 = repair_timestamp(doc)
        fixed, r1 = repair_triggers(fixed)
        repairs = (*repairs, *r3, *r1)
        if is_valid(fixed):  # the repairs were enough: nothing left to report
            new_bytes = _encode(fixed, exotic)
            return Verdict(Decision.REPAIRED, sha, size, session, tuple(errors), repairs, new_bytes)
        after = check_file(fixed)
        split = ctx.split_invalid_candidates and not after.file_problems
        if split and _has_valid_candidate(fixed, len(after.candidate_problems)):
            return _split(doc, fixed, after.candidate_problems, ctx, sha, size, exotic, repairs)
    origin = _origin(ctx, sha, size, errors)
    records = candidate_records(doc, origin, exotic=exotic) if isinstance(doc, dict) else []
    if not records:
        records = [whole_file_record(doc, origin, exotic=exotic)]
    return Verdict(
        Decision.QUARANTINED,
        sha,
        size,
        session,
        tuple(errors),
        deadletter=tuple(records),
        original=original_name(ctx.file_name, sha),
    )


def decide_too_large(ctx: Context, sha: str, size: int, limit: int) -> Verdict:
    """A file over the size limit is quarantined unread: one record, ``candidate`` null."""
    reason = f"file too large ({size} bytes, limit {limit})"
    origin = _origin(ctx, sha, size, ["file too large"])
    return Verdict(
        Decision.QUARANTINED,
        sha,
        size,
        reasons=(reason,),
        deadletter=(whole_file_record(None, origin),),
        original=original_name(ctx.file_name, sha),
    )


def _encode(doc: dict[str, Any], exotic: bool) -> bytes:
    encoded = encode_json(doc, exotic=exotic)
    # Compact on purpose: indentation grows with the square of the nesting depth.
    return encoded + b"\n"


def _has_valid_candidate(doc: dict[str, Any], invalid_count: int) -> bool:
    # Only the four category arrays hold candidates: an unknown list-valued key is not one.
    candidates = doc["candidates"]
    total = sum(
        len(items) for items in (candidates.get(c) for c in CATEGORIES) if isinstance(items, list)
    )
    return total > invalid_count


def _split(
    doc: dict[str, Any],
    fixed: dict[str, Any],
    invalid: dict[tuple[str, int], tuple[Any, ...]],
    ctx: Context,
    sha: str,
    size: int,
    exotic: bool,
    repairs: tuple[Repair, ...],
) -> Verdict:
    """R4: dead-letter the invalid candidates, keep the file with the valid ones."""
    errors = [str(p) for found in invalid.values() for p in found]
    origin = _origin(ctx, sha, size, errors)
    records = candidate_records(doc, origin, only=set(invalid), exotic=exotic)
    moved = tuple(
        Repair("R4", f"candidates.{r.category}[{i}]", f"deadletter/{r.name}")
        for (_cat, i), r in zip(sorted(invalid, key=_order), records, strict=True)
    )
    kept = split_candidates(fixed, set(invalid))
    return Verdict(
        Decision.REPAIRED,
        sha,
        size,
        _session_id(doc),
        tuple(errors),
        (*repairs, *moved),
        _encode(kept, exotic),
        tuple(records),
        original_name(ctx.file_name, sha),
    )


_CATEGORY_ORDER: Final = {"lessons": 0, "preferences": 1, "decisions": 2, "domain": 3}


def _order(key: tuple[str, int]) -> tuple[int, int]:
    return _CATEGORY_ORDER[key[0]], key[1]
