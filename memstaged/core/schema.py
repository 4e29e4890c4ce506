"""Validity: what the reconciler accepts (SPEC section 2, staging schema version 1, contract v2).

The staging format is open (unknown keys anywhere are allowed and must survive a repair), and its
string rules use ECMAScript ``trim``, so it is checked by code over the decoded value rather than by
decoding into closed structs. Every problem names where it is, in the reconciler's own terms
(``candidates.lessons[0].source_evidence``), and why.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from memstaged.core.js.ecma import (
    JS_WHITESPACE_SET,
    is_finite_number,
    is_nonempty_string,
    is_number,
)
from memstaged.core.ticks import tick
from memstaged.core.timestamps import is_timestamp

CATEGORIES: Final = ("lessons", "preferences", "decisions", "domain")
#: Of one array in a candidate (its triggers, its ids), the problems of at most this many invalid
#: elements are listed; one more problem counts the others. A candidate's problems, and so its
#: dead-letter record, stay bounded whatever its size (an 8 MB array of ``{}``
#: triggers was millions of problems).
MAX_ELEMENT_PROBLEMS: Final = 100
_PLAIN_TRIGGERS: Final = ("path", "filename", "topic")


class Problem(msgspec.Struct, frozen=True):
    """One validation error: where it is and why it fails."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.why}" if self.where else self.why


def _need_string(obj: Mapping[str, Any], key: str, where: str, out: list[Problem]) -> None:
    if key not in obj:
        out.append(Problem(f"{where}{key}", "is missing"))
    elif not is_nonempty_string(obj[key]):
        out.append(Problem(f"{where}{key}", "must be a non-empty string"))


def check_trigger(trigger: object, where: str) -> list[Problem]:
    """A trigger is valid per SPEC 2.2; anything else, including unknown types, is not."""
    if not isinstance(trigger, dict):
        return [Problem(where, "must be an object")]
    out: list[Problem] = []
    kind = trigger.get("type")
    if kind in _PLAIN_TRIGGERS:
        _need_string(trigger, "value", f"{where}.", out)
    elif kind == "tool":
        _need_string(trigger, "value", f"{where}.", out)
        if "pattern" in trigger and not isinstance(trigger["pattern"], str):
            out.append(Problem(f"{where}.pattern", "must be a string when present"))
    elif kind == "command":
        _need_string(trigger, "pattern", f"{where}.", out)
    else:
        out.append(Problem(f"{where}.type", "must be one of path, filename, topic, tool, command"))
    return out


def check_triggers(triggers: object, where: str) -> list[Problem]:
    """``triggers``: a non-empty array of valid triggers."""
    if not isinstance(triggers, list):
        return [Problem(where, "must be a non-empty array of triggers")]
    if not triggers:
        return [Problem(where, "must not be empty")]
    out: list[Problem] = []
    bad = 0
    for i, trigger in enumerate(triggers):
        if not i & 1023:
            tick()
        found = check_trigger(trigger, f"{where}[{i}]")
        if found:
            bad += 1
            if bad <= MAX_ELEMENT_PROBLEMS:
                out.extend(found)
    _count_the_rest(bad, where, out)
    return out


def _count_the_rest(bad: int, where: str, out: list[Problem]) -> None:
    """One problem for the invalid elements of an array past :data:`MAX_ELEMENT_PROBLEMS`."""
    if bad > MAX_ELEMENT_PROBLEMS:
        more = bad - MAX_ELEMENT_PROBLEMS
        out.append(Problem(where, f"+{more} more invalid elements, not listed one by one"))


def check_evidence(evidence: object, where: str) -> list[Problem]:
    """``source_evidence``: at least one non-empty id list, each of the right element type."""
    if not isinstance(evidence, dict):
        return [Problem(where, "must be an object")]
    out: list[Problem] = []
    nonempty = False
    notes = evidence.get("discussion_note_ids")
    if "discussion_note_ids" in evidence:
        if not isinstance(notes, list):
            out.append(Problem(f"{where}.discussion_note_ids", "must be an array"))
        else:
            nonempty = nonempty or bool(notes)
            bad = 0
            for i, note in enumerate(notes):
                if not i & 1023:
                    tick()
                if not is_finite_number(note):
                    bad += 1
                    if bad <= MAX_ELEMENT_PROBLEMS:
                        out.append(
                            Problem(f"{where}.discussion_note_ids[{i}]", "must be a finite number")
                        )
            _count_the_rest(bad, f"{where}.discussion_note_ids", out)
    markers = evidence.get("lesson_candidate_marker_ids")
    if "lesson_candidate_marker_ids" in evidence:
        if not isinstance(markers, list):
            out.append(Problem(f"{where}.lesson_candidate_marker_ids", "must be an array"))
        else:
            nonempty = nonempty or bool(markers)
            bad = 0
            for i, marker in enumerate(markers):
                if not i & 1023:
                    tick()
                if not is_nonempty_string(marker):
                    bad += 1
                    if bad <= MAX_ELEMENT_PROBLEMS:
                        out.append(
                            Problem(
                                f"{where}.lesson_candidate_marker_ids[{i}]",
                                "must be a non-empty string",
                            )
                        )
            _count_the_rest(bad, f"{where}.lesson_candidate_marker_ids", out)
    if not nonempty:
        out.append(
            Problem(
                where,
                "needs a non-empty discussion_note_ids or lesson_candidate_marker_ids",
            )
        )
    return out


def _check_evidence_key(candidate: Mapping[str, Any], where: str, out: list[Problem]) -> None:
    if "source_evidence" not in candidate:
        out.append(Problem(f"{where}.source_evidence", "is missing"))
    else:
        out.extend(check_evidence(candidate["source_evidence"], f"{where}.source_evidence"))


def check_candidate(category: str, candidate: object, where: str) -> list[Problem]:
    """One element of a category array (SPEC 2.2). ``reconcile_attempts`` never invalidates."""
    if not isinstance(candidate, dict):
        return [Problem(where, "must be an object")]
    out: list[Problem] = []
    if category == "lessons":
        for key in ("summary", "detail", "scope_suggestion"):
            _need_string(candidate, key, f"{where}.", out)
        if "triggers" not in candidate:
            out.append(Problem(f"{where}.triggers", "is missing"))
        else:
            out.extend(check_triggers(candidate["triggers"], f"{where}.triggers"))
    elif category == "preferences":
        _need_string(candidate, "text", f"{where}.", out)
    else:
        _need_string(candidate, "summary", f"{where}.", out)
        _need_string(candidate, "detail", f"{where}.", out)
    _check_evidence_key(candidate, where, out)
    return out


def check_produced_at(value: object) -> list[Problem]:
    """``produced_at``: a non-empty string that ``Date.parse`` reads as a time (SPEC 2.3)."""
    if not is_nonempty_string(value):
        return [Problem("produced_at", "must be a non-empty string")]
    if not is_timestamp(value):
        return [Problem("produced_at", "is not a timestamp (Date.parse gives NaN)")]
    return []


def check_fields(doc: object) -> list[Problem]:
    """The problems of a decoded file that are not a candidate's own: its fields and arrays."""
    if not isinstance(doc, dict):
        return [Problem("", "the file is not a JSON object")]
    out: list[Problem] = []
    version = doc.get("schemaVersion")
    if "schemaVersion" not in doc:
        out.append(Problem("schemaVersion", "is missing"))
    elif not (is_number(version) and version == 1):
        out.append(Problem("schemaVersion", "must be the number 1"))
    _need_string(doc, "session_id", "", out)
    _need_string(doc, "project_root", "", out)
    if "produced_at" not in doc:
        out.append(Problem("produced_at", "is missing"))
    else:
        out.extend(check_produced_at(doc["produced_at"]))
    candidates = doc.get("candidates")
    if "candidates" not in doc:
        out.append(Problem("candidates", "is missing"))
    elif not isinstance(candidates, dict):
        out.append(Problem("candidates", "must be an object"))
    else:
        for category in CATEGORIES:
            if category not in candidates:
                out.append(Problem(f"candidates.{category}", "is missing"))
            elif not isinstance(candidates[category], list):
                out.append(Problem(f"candidates.{category}", "must be an array"))
    return out


def candidate_arrays(doc: object) -> Iterator[tuple[str, list[Any]]]:
    """Each category array of a decoded file that is an array, in the order of CATEGORIES."""
    candidates = doc.get("candidates") if isinstance(doc, dict) else None
    if not isinstance(candidates, dict):
        return
    for category in CATEGORIES:
        items = candidates.get(category)
        if isinstance(items, list):
            yield category, items


# --- the fast path ------------------------------------------------------------------------------
#
# Most files are valid, and for them check_file's work (a Problem per rule broken, an f-string path
# per candidate, the canonical text of produced_at) is thrown away. is_valid answers the only
# question a valid file needs, "is anything wrong?", with the same predicates as the checks above,
# and stops at the first fault; check_file then runs only to say what is wrong.
#
# A valid file makes dozens of string and number tests, and a function call costs more than the
# test, so the hot ones are written out inline, each as a cheap sufficient condition backed by the
# exact predicate:
#   (s.__class__ is str and s and s[0] not in JS_WHITESPACE_SET) or is_nonempty_string(s)
#   (n.__class__ is int and -_SAFE < n < _SAFE) or is_finite_number(n)
# are is_nonempty_string(s) and is_finite_number(n): a non-empty str that starts with a non-space is
# a non-empty string, and an int (not a bool: its class is bool) that a double holds exactly is a
# finite number; anything else gets the exact answer. tests/core/test_schema_fastpath.py holds
# is_valid and check_file to agreement.

#: Tells a missing key from one whose value is None; private, so no document can hold it.
_ABSENT: Final = object()
#: Any int of smaller magnitude is exact as a double, so certainly finite.
_SAFE: Final = 1 << 53


def _evidence_ok(evidence: object) -> bool:
    if not isinstance(evidence, dict):
        return False
    nonempty = False
    notes = evidence.get("discussion_note_ids", _ABSENT)
    if notes is not _ABSENT:
        if not isinstance(notes, list):
            return False
        for n in notes:
            if not ((n.__class__ is int and -_SAFE < n < _SAFE) or is_finite_number(n)):
                return False
        nonempty = bool(notes)
    markers = evidence.get("lesson_candidate_marker_ids", _ABSENT)
    if markers is not _ABSENT:
        if not isinstance(markers, list):
            return False
        for s in markers:
            if not (
                (s.__class__ is str and s and s[0] not in JS_WHITESPACE_SET)
                or is_nonempty_string(s)
            ):
                return False
        nonempty = nonempty or bool(markers)
    return nonempty


def _triggers_ok(triggers: object) -> bool:
    if not isinstance(triggers, list) or not triggers:
        return False
    for trigger in triggers:
        if not isinstance(trigger, dict):
            return False
        kind = trigger.get("type")
        if kind == "command":
            if not is_nonempty_string(trigger.get("pattern")):
                return False
            continue
        if kind == "tool":
            pattern = trigger.get("pattern", _ABSENT)
            if not (pattern is _ABSENT or isinstance(pattern, str)):
                return False
        elif kind not in _PLAIN_TRIGGERS:
            return False
        s = trigger.get("value")
        if not (
            (s.__class__ is str and s and s[0] not in JS_WHITESPACE_SET) or is_nonempty_string(s)
        ):
            return False
    return True


def _lessons_ok(items: list[Any]) -> bool:
    for i, candidate in enumerate(items):
        if not i & 4095:
            tick()  # a stop and the watchdog are served at a tick
        if not isinstance(candidate, dict):
            return False
        get = candidate.get
        for s in (get("summary"), get("detail"), get("scope_suggestion")):
            if not (
                (s.__class__ is str and s and s[0] not in JS_WHITESPACE_SET)
                or is_nonempty_string(s)
            ):
                return False
        if not (_triggers_ok(get("triggers")) and _evidence_ok(get("source_evidence"))):
            return False
    return True


def _preferences_ok(items: list[Any]) -> bool:
    for i, candidate in enumerate(items):
        if not i & 4095:
            tick()  # a stop and the watchdog are served at a tick
        if not isinstance(candidate, dict):
            return False
        s = candidate.get("text")
        if not (
            (s.__class__ is str and s and s[0] not in JS_WHITESPACE_SET) or is_nonempty_string(s)
        ):
            return False
        if not _evidence_ok(candidate.get("source_evidence")):
            return False
    return True


def _decisions_ok(items: list[Any]) -> bool:
    """Decisions and domain facts: the same fields."""
    for i, candidate in enumerate(items):
        if not i & 4095:
            tick()  # a stop and the watchdog are served at a tick
        if not isinstance(candidate, dict):
            return False
        get = candidate.get
        for s in (get("summary"), get("detail")):
            if not (
                (s.__class__ is str and s and s[0] not in JS_WHITESPACE_SET)
                or is_nonempty_string(s)
            ):
                return False
        if not _evidence_ok(get("source_evidence")):
            return False
    return True


_CATEGORIES_OK: Final = (
    ("lessons", _lessons_ok),
    ("preferences", _preferences_ok),
    ("decisions", _decisions_ok),
    ("domain", _decisions_ok),
)


def is_valid(doc: object) -> bool:
    """``check_file(doc).valid`` at a fraction of the cost; only check_file says why not."""
    if not isinstance(doc, dict):
        return False
    get = doc.get
    version = get("schemaVersion")
    produced = get("produced_at")
    candidates = get("candidates")
    if not (
        is_number(version)
        and version == 1
        and is_nonempty_string(get("session_id"))
        and is_nonempty_string(get("project_root"))
        and is_nonempty_string(produced)
        and is_timestamp(produced)
        and isinstance(candidates, dict)
    ):
        return False
    for category, items_ok in _CATEGORIES_OK:
        items = candidates.get(category)
        if not (isinstance(items, list) and items_ok(items)):
            return False
    return True
