"""Validity: what the reconciler accepts (SPEC section 2, staging schema version 1).

The staging format is open (unknown keys anywhere are allowed and must survive a repair), and its
string rules use ECMAScript ``trim``, so it is checked by code over the decoded value rather than by
decoding into closed structs. Every problem names where it is, in the reconciler's own terms
(``candidates.lessons[0].source_evidence``), and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from memstaged.ecma import is_finite_number, is_nonempty_string, is_number
from memstaged.timestamps import Form, classify

CATEGORIES: Final = ("lessons", "preferences", "decisions", "domain")
_PLAIN_TRIGGERS: Final = ("path", "filename", "topic")


class Problem(msgspec.Struct, frozen=True):
    """One validation error: where it is and why it fails."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.why}" if self.where else self.why


class Report(msgspec.Struct, frozen=True):
    """The validation of one decoded file, split the way repairs R1 and R4 need it."""

    file_problems: tuple[Problem, ...]
    #: (category, index) of each invalid candidate, with its problems.
    candidate_problems: dict[tuple[str, int], tuple[Problem, ...]]

    @property
    def valid(self) -> bool:
        return not self.file_problems and not self.candidate_problems

    def problems(self) -> list[Problem]:
        out = list(self.file_problems)
        for found in self.candidate_problems.values():
            out.extend(found)
        return out


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
    for i, trigger in enumerate(triggers):
        out.extend(check_trigger(trigger, f"{where}[{i}]"))
    return out


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
            for i, note in enumerate(notes):
                if not is_finite_number(note):
                    out.append(
                        Problem(f"{where}.discussion_note_ids[{i}]", "must be a finite number")
                    )
    markers = evidence.get("lesson_candidate_marker_ids")
    if "lesson_candidate_marker_ids" in evidence:
        if not isinstance(markers, list):
            out.append(Problem(f"{where}.lesson_candidate_marker_ids", "must be an array"))
        else:
            nonempty = nonempty or bool(markers)
            for i, marker in enumerate(markers):
                if not is_nonempty_string(marker):
                    out.append(
                        Problem(
                            f"{where}.lesson_candidate_marker_ids[{i}]",
                            "must be a non-empty string",
                        )
                    )
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
    """``produced_at``: a non-empty string that is a timestamp as written (SPEC 2.3)."""
    if not is_nonempty_string(value):
        return [Problem("produced_at", "must be a non-empty string")]
    assert isinstance(value, str)
    found = classify(value)
    if found is None or found[0] is not Form.AS_WRITTEN:
        return [Problem("produced_at", "is not an ISO 8601 timestamp with an offset")]
    return []


def check_file(doc: object) -> Report:
    """Validate a decoded staging file; never raises, whatever the value."""
    if not isinstance(doc, dict):
        return Report((Problem("", "the file is not a JSON object"),), {})
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
    by_candidate: dict[tuple[str, int], tuple[Problem, ...]] = {}
    candidates = doc.get("candidates")
    if "candidates" not in doc:
        out.append(Problem("candidates", "is missing"))
    elif not isinstance(candidates, dict):
        out.append(Problem("candidates", "must be an object"))
    else:
        for category in CATEGORIES:
            items = candidates.get(category)
            if category not in candidates:
                continue
            if not isinstance(items, list):
                out.append(Problem(f"candidates.{category}", "must be an array when present"))
                continue
            for i, item in enumerate(items):
                found = check_candidate(category, item, f"candidates.{category}[{i}]")
                if found:
                    by_candidate[(category, i)] = tuple(found)
    return Report(tuple(out), by_candidate)
