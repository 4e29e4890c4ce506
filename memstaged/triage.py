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

from memstaged import timestamps
from memstaged.ecma import (
    JS_WHITESPACE_SET,
    decode_utf8,
    encode_json,
    is_nonempty_string,
    parse_json,
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
from memstaged.repair import (
    Repair,
    repair_categories,
    repair_timestamp,
    repair_triggers,
    repair_wrappers,
    split_candidates,
)
from memstaged.schema import CATEGORIES, check_file, is_valid
from memstaged.timestamps import EPOCH

BOM: Final = b"\xef\xbb\xbf"
#: A verdict's ``reasons`` (the log's) list at most this many validation errors; the records
#: hold every candidate's own.
MAX_REASONS: Final = 100


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
    #: Records to write in ``deadletter/`` (``quarantined``, or ``repaired`` by R4). Each renders
    #: its bytes when its ``body`` is read.
    deadletter: tuple[DeadLetter, ...] = ()
    #: The name under ``deadletter/originals/`` for the original bytes, when they go there: for
    #: ``quarantined``, for R4, and for R6 (then with no records), always before any rewrite.
    original: str | None = None
    #: For ``quarantined``: the ``reasons`` a repair would have fixed. They come last: the
    #: reasons lead with the errors that remain after every repair (SPEC 7, issue 21 item 1).
    repairable: tuple[str, ...] = ()


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
    """The origin of records whose errors no repair touches (not JSON, too large, R4)."""
    reason = errors[0] if errors else None
    return Origin(
        ctx.file_name, ctx.source_path, sha, size, ctx.decided_at, tuple(errors), reason=reason
    )


def decide(data: bytes, ctx: Context) -> Verdict:
    """Decide ``data``, the bytes of the staging file ``ctx.file_name``. Never raises.

    Nesting depth does not matter: parsing and encoding go without recursion where msgspec
    cannot follow (:mod:`memstaged.ecma`), so a document is never quarantined for its depth.
    """
    timestamps.remember()
    try:
        return _decide(data, ctx)
    finally:
        timestamps.forget()


def _reasons(errors: list[str]) -> tuple[str, ...]:
    if len(errors) <= MAX_REASONS:
        return tuple(errors)
    more = len(errors) - MAX_REASONS
    return (*errors[:MAX_REASONS], f"... and {more} more (each record lists its own)")


def _irreparable_first(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    """The errors of a quarantined file, those no repair fixes first, and those a repair fixes.

    ``after`` are the errors left once every repair was applied (what made the file
    irreparable); ``before`` are the file's errors as it was. An error of ``before`` that is
    not left in ``after`` is one a repair would have fixed: it is kept, after the others.
    """
    left = set(after)
    fixed = [e for e in before if e not in left]
    return [*after, *fixed], fixed


def _unparseable(data: bytes, ctx: Context, sha: str, size: int, err: NotJSON) -> Verdict:
    if not ctx.settled:
        reason = f"{err}; may still be being written, waiting for it to settle"
        return Verdict(Decision.DEFERRED, sha, size, reasons=(reason,))
    # The text as the reconciler reads it, after R2 (SPEC 4.3).
    text = decode_utf8(data[len(BOM) :] if data.startswith(BOM) else data)
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
        parsed = parse_json(body, deep_array_as_text=True)
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
            new_bytes = body if parsed.text is None else parsed.text.encode("utf-8")
            return Verdict(
                Decision.REPAIRED, sha, size, session, repairs=repairs, new_bytes=new_bytes
            )
        return Verdict(Decision.VALID, sha, size, session)
    report = check_file(doc)
    errors = [str(p) for p in report.problems()]
    original = original_name(ctx.file_name, sha)
    after = report  # the errors left once every repair was applied
    if isinstance(doc, dict):
        fixed, r3 = repair_timestamp(doc)
        fixed, r5 = repair_categories(fixed)
        fixed, r6 = repair_wrappers(fixed, original)
        fixed, r1 = repair_triggers(fixed)
        repairs = (*repairs, *r3, *r5, *r6, *r1)
        if is_valid(fixed):  # the repairs were enough: nothing left to report
            return Verdict(
                Decision.REPAIRED,
                sha,
                size,
                session,
                _reasons(errors),
                repairs,
                _encode(fixed, exotic),
                original=original if r6 else None,
            )
        after = check_file(fixed)
        split = ctx.split_invalid_candidates and not after.file_problems
        if split and _has_valid_candidate(fixed, len(after.candidate_problems)):
            return _split(doc, fixed, after.candidate_problems, ctx, sha, size, exotic, repairs)
    ordered, fixed_errors = _irreparable_first(errors, [str(p) for p in after.problems()])
    reasons = _reasons(ordered)
    fixed_set = set(fixed_errors)
    file_after = [str(p) for p in after.file_problems]
    file_fixed = [e for e in (str(p) for p in report.file_problems) if e not in set(file_after)]
    origin = Origin(
        ctx.file_name,
        ctx.source_path,
        sha,
        size,
        ctx.decided_at,
        (*file_after, *file_fixed),
        repairable=tuple(file_fixed),
        reason=next((r for r in ordered if r not in fixed_set), None),
    )
    records: list[DeadLetter] = []
    if isinstance(doc, dict):
        records = candidate_records(
            doc,
            origin,
            problems=report.candidate_problems,
            remaining=after.candidate_problems,
            exotic=exotic,
        )
    if not records:
        records = [whole_file_record(doc, origin, exotic=exotic)]
    return Verdict(
        Decision.QUARANTINED,
        sha,
        size,
        session,
        reasons,
        deadletter=tuple(records),
        original=original,
        repairable=tuple(r for r in reasons if r in fixed_set),
    )


def decide_too_large(ctx: Context, sha: str, size: int, limit: int) -> Verdict:
    """A file over the size limit is quarantined unread: one record, ``candidate`` null.

    Like a file that does not parse, it waits for the settle interval first: a writer may still
    be appending to it, and where ``originals/`` is on another file system it is copied, not
    renamed, and what is appended after the copy would be lost with the staging file.
    """
    reason = f"file too large ({size} bytes, limit {limit})"
    if not ctx.settled:
        why = f"{reason}; may still be being written, waiting for it to settle"
        return Verdict(Decision.DEFERRED, sha, size, reasons=(why,))
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
    """R4: dead-letter the invalid candidates, keep the file with the valid ones.

    The records hold the candidates as they were in the original (its wrappers included), since
    the original is what is dead-lettered; their errors are those found after R6 and R1.
    """
    errors = [str(p) for found in invalid.values() for p in found]
    origin = _origin(ctx, sha, size, [])
    records = candidate_records(doc, origin, problems=invalid, only=set(invalid), exotic=exotic)
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
        _reasons(errors),
        (*repairs, *moved),
        _encode(kept, exotic),
        tuple(records),
        original_name(ctx.file_name, sha),
    )


_CATEGORY_ORDER: Final = {"lessons": 0, "preferences": 1, "decisions": 2, "domain": 3}


def _order(key: tuple[str, int]) -> tuple[int, int]:
    return _CATEGORY_ORDER[key[0]], key[1]
