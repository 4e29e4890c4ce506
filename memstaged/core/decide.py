"""The triage engine: one decision for the bytes of one staging file (SPEC sections 1-4).

:func:`decide` is pure: bytes and a :class:`Context` in, a :class:`Verdict` out, no file system and
no clock (the caller says whether the file has settled and what time it is). The batch run, the
daemon and the inspection commands all call it, so they cannot disagree about a file.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Final

import msgspec

from memstaged.core import digests, timestamps
from memstaged.core.foreign import foreign_root
from memstaged.core.js.ecma import (
    JS_WHITESPACE_SET,
    decode_utf8,
    encode_json,
    is_nonempty_string,
    parse_json,
    trim,
)
from memstaged.core.records import (
    DeadLetter,
    Origin,
    candidate_records,
    original_name,
    whole_file_record,
)
from memstaged.core.repair import (
    Repair,
    repair_categories,
    repair_timestamp,
    repair_triggers,
    repair_wrappers,
    split_candidates,
)
from memstaged.core.schema import (
    CATEGORIES,
    candidate_arrays,
    check_candidate,
    check_fields,
    is_valid,
)
from memstaged.core.timestamps import EPOCH
from memstaged.errors import NotJSON

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
    #: reasons lead with the errors that remain after every repair (SPEC 7).
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
    cannot follow (:mod:`memstaged.core.js.ecma`), so a document is never quarantined for its depth.
    """
    timestamps.remember()
    try:
        return _decide(data, ctx)
    finally:
        timestamps.forget()


class _Tally:
    """A stream of validation errors: the first :data:`MAX_REASONS` of them, and their count.

    A file of hundreds of thousands of invalid candidates has millions of errors; keeping them
    all took up to 200 times the file's size. The log lists the first ones
    and says how many more; each record finds its own again as it is written.
    """

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.first: list[str] = []
        self.count = 0

    def add(self, errors: Iterable[str]) -> None:
        for error in errors:
            self.count += 1
            if len(self.first) < MAX_REASONS:
                self.first.append(error)


def _reasons(*tallies: _Tally) -> tuple[str, ...]:
    """The errors of ``tallies`` one after the other, the first MAX_REASONS and how many more."""
    first = [e for t in tallies for e in t.first][:MAX_REASONS]
    more = sum(t.count for t in tallies) - len(first)
    if not more:
        return tuple(first)
    return (*first, f"... and {more} more (each record lists its own)")


class _Comparison:
    """A file's errors before and after every repair, compared candidate by candidate.

    ``left`` are the errors the repairs leave, the file's own first; ``fixed`` those of the file
    as it was that a repair would have fixed, in the file's order. A candidate's errors name it
    (``candidates.lessons[2]...``), so comparing them one candidate at a time is comparing the
    whole lists, without holding them.
    """

    def __init__(self, doc: dict[str, Any], fixed: dict[str, Any], *, split: bool) -> None:
        before = [str(p) for p in check_fields(doc)]
        self.file_left = [str(p) for p in check_fields(fixed)]
        left_set = set(self.file_left)
        self.file_fixed = [e for e in before if e not in left_set]
        self.left, self.fixed = _Tally(), _Tally()
        self.left.add(self.file_left)
        self.fixed.add(self.file_fixed)
        self.candidates = 0
        self.invalid_count = 0
        #: For R4: the indices of each category's candidates invalid after every repair.
        self.invalid: dict[str, list[int]] = {}
        originals = dict(candidate_arrays(doc))
        for category, items in candidate_arrays(fixed):
            was = originals.get(category, items)
            self.candidates += len(items)
            for i, item in enumerate(items):
                where = f"candidates.{category}[{i}]"
                old = was[i]
                found = [str(p) for p in check_candidate(category, old, where)]
                now = (
                    found
                    if item is old
                    else [str(p) for p in check_candidate(category, item, where)]
                )
                if now:
                    self.left.add(now)
                    self.invalid_count += 1
                    if split:
                        self.invalid.setdefault(category, []).append(i)
                if found and now is not found:
                    gone = set(now)
                    self.fixed.add(e for e in found if e not in gone)


def _all_errors(doc: dict[str, Any]) -> _Tally:
    """The errors of the file as it was, in order (the ``reasons`` of a repaired file)."""
    tally = _Tally()
    tally.add(str(p) for p in check_fields(doc))
    for category, items in candidate_arrays(doc):
        for i, item in enumerate(items):
            tally.add(
                str(p) for p in check_candidate(category, item, f"candidates.{category}[{i}]")
            )
    return tally


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
    sha = digests.sha256(data).hexdigest()
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
    original = original_name(ctx.file_name, sha)
    if not isinstance(doc, dict):
        errors = [str(p) for p in check_fields(doc)]
        return Verdict(
            Decision.QUARANTINED,
            sha,
            size,
            session,
            tuple(errors),
            deadletter=(whole_file_record(doc, _origin(ctx, sha, size, errors), exotic=exotic),),
            original=original,
        )
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
            _reasons(_all_errors(doc)),
            repairs,
            _encode(fixed, exotic),
            original=original if r6 else None,
        )
    found = _Comparison(doc, fixed, split=ctx.split_invalid_candidates)
    if found.invalid and not found.file_left and found.candidates > found.invalid_count:
        return _split(doc, fixed, found, ctx, sha, size, exotic, repairs)
    reasons = _reasons(found.left, found.fixed)
    # The reasons lead with the errors no repair fixes (SPEC 7); those listed after them are
    # the ones a repair would have fixed.
    repairable = reasons[len(found.left.first) :]
    if len(reasons) > MAX_REASONS:
        repairable = repairable[:-1]  # the count of the others, not an error
    origin = Origin(
        ctx.file_name,
        ctx.source_path,
        sha,
        size,
        ctx.decided_at,
        (*found.file_left, *found.file_fixed),
        repairable=tuple(found.file_fixed),
        reason=found.left.first[0] if found.left.first else None,
    )
    records = candidate_records(doc, origin, repaired=fixed, exotic=exotic)
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
        repairable=repairable,
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


def _split(
    doc: dict[str, Any],
    fixed: dict[str, Any],
    found: _Comparison,
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
    origin = _origin(ctx, sha, size, [])
    records = candidate_records(doc, origin, checked=fixed, only=found.invalid, exotic=exotic)
    where = (f"candidates.{c}[{i}]" for c in CATEGORIES for i in found.invalid.get(c, ()))
    moved = tuple(
        Repair("R4", at, f"deadletter/{r.name}") for at, r in zip(where, records, strict=True)
    )
    kept = split_candidates(fixed, found.invalid)
    return Verdict(
        Decision.REPAIRED,
        sha,
        size,
        _session_id(doc),
        _reasons(found.left),
        (*repairs, *moved),
        _encode(kept, exotic),
        tuple(records),
        original_name(ctx.file_name, sha),
    )
