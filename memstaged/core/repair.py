"""Deterministic repairs R1-R6 (SPEC section 3).

A repair only adds or normalizes: it builds new containers along the paths it changes and shares
everything else with the decoded original, so every key and candidate it does not fix stays exactly
as it was, and the original stays intact for the dead-letter record if the repair is not enough.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from memstaged.core.js.ecma import (
    JS_WHITESPACE,
    basename,
    collapse,
    is_finite_number,
    to_lower,
    utf16_length,
)
from memstaged.core.schema import CATEGORIES, check_candidate
from memstaged.core.ticks import tick
from memstaged.core.timestamps import repairable

_CONTEXT_TOPIC_KEYS: Final = (
    "topic",
    "project",
    "projectName",
    "name",
    "title",
    "repository",
    "repo",
    "scope",
)
_CONTEXT_ROOT_KEYS: Final = ("project_root", "projectRoot", "root", "cwd")
_KEYWORD_SEPARATORS: Final = re.compile(r"[`*_#>\[\](){}:;,.!?/\\|<=+~$%^&\-0-9]+")
#: A word of ``split(/\\s+/)``: a run of anything but JavaScript whitespace.
_WORD: Final = re.compile("[^" + re.escape(JS_WHITESPACE) + "]+")
#: The keyword topic reports progress every so many words.
_TICK_EVERY: Final = 4096
_STOPWORDS: Final = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "from",
        "that",
        "this",
        "when",
        "then",
        "into",
        "should",
        "must",
        "have",
        "has",
        "are",
        "was",
        "were",
        "use",
        "using",
    ]
)


class Repair(msgspec.Struct, frozen=True):
    """One applied repair: which rule, where it applied and what it wrote."""

    rule: str
    where: str
    wrote: Any


def _context_topic(context: dict[str, Any]) -> str:
    """Step 1 of SPEC 3.1; a key whose value is blank (or not a string) is passed over."""
    for key in _CONTEXT_TOPIC_KEYS:
        value = context.get(key)
        if isinstance(value, str):
            topic = collapse(value)
            if topic:
                return topic
    for key in _CONTEXT_ROOT_KEYS:
        value = context.get(key)
        if isinstance(value, str):
            topic = collapse(basename(value))
            if topic:
                return topic
    return ""


def keyword_topic(text: str) -> str:
    """Step 3 of SPEC 3.1: the first four meaningful words of the lesson's text.

    Lower-cased and measured as JavaScript does (``toLowerCase``, UTF-16 ``length``), and split on
    JavaScript whitespace (``str.split()`` would also split on U+001C..U+001F and U+0085). The
    words are read one at a time up to the fourth kept: a list of every word of an 8 MiB text
    took 20 times its size.
    """
    kept: list[str] = []
    for count, match in enumerate(_WORD.finditer(_KEYWORD_SEPARATORS.sub(" ", to_lower(text)))):
        if count % _TICK_EVERY == 0:
            tick()
        word = match[0]
        if utf16_length(word) >= 3 and word not in _STOPWORDS:
            kept.append(word)
            if len(kept) == 4:
                break
    return " ".join(kept)


def derive_topic(context: dict[str, Any], lesson: dict[str, Any]) -> str:
    """The trigger topic T of SPEC 3.1, the first non-empty of its five sources in order.

    Each source is computed only when those before it are blank.
    """
    topic = _context_topic(context)
    if topic:
        return topic
    scope = lesson.get("scope_suggestion")
    if isinstance(scope, str):
        topic = collapse(scope)
        if topic:
            return topic
    summary, detail = lesson.get("summary"), lesson.get("detail")
    if isinstance(summary, str) and isinstance(detail, str):
        text = f"{summary}\n{detail}"
        topic = collapse(keyword_topic(text)) or collapse(text)
        if topic:
            return topic
    return "lesson"


def repair_timestamp(doc: dict[str, Any]) -> tuple[dict[str, Any], list[Repair]]:
    """R3: an ISO 8601 basic-format or decimal-comma ``produced_at`` in canonical UTC form.

    A value that already is a timestamp is never rewritten (:func:`timestamps.repairable`).
    """
    value = doc.get("produced_at")
    if not isinstance(value, str):
        return doc, []
    fixed_text = repairable(value)
    if fixed_text is None:
        return doc, []
    fixed = dict(doc)
    fixed["produced_at"] = fixed_text
    return fixed, [Repair("R3", "produced_at", fixed_text)]


def repair_categories(doc: dict[str, Any]) -> tuple[dict[str, Any], list[Repair]]:
    """R5: each category array absent from a ``candidates`` object is added as ``[]``."""
    candidates = doc.get("candidates")
    if not isinstance(candidates, dict):
        return doc, []
    absent = [c for c in CATEGORIES if c not in candidates]
    if not absent:
        return doc, []
    new_candidates = dict(candidates)
    for category in absent:
        new_candidates[category] = []
    fixed = dict(doc)
    fixed["candidates"] = new_candidates
    return fixed, [Repair("R5", f"candidates.{c}", []) for c in absent]


_WRAPPER_KEYS: Final = frozenset(("candidate", "original_staging_file"))
_WRAPPER_KEYS_WITH_ATTEMPTS: Final = frozenset(
    ("candidate", "original_staging_file", "reconcile_attempts")
)


def is_wrapper(item: object) -> bool:
    """A dead-letter record's wrapper that the agent's ``/memory recover`` put back (SPEC R6)."""
    if not isinstance(item, dict) or not isinstance(item.get("candidate"), dict):
        return False
    keys = item.keys()
    return keys in (_WRAPPER_KEYS, _WRAPPER_KEYS_WITH_ATTEMPTS)


def repair_wrappers(doc: dict[str, Any], original: str) -> tuple[dict[str, Any], list[Repair]]:
    """R6: each re-queued wrapper is replaced by its ``candidate``, attempts carried over.

    ``original`` is the original's name under ``deadletter/originals/``: the wrapper's copy of the
    file is dropped, so the original bytes go there first, and each repair names where.
    """
    candidates = doc.get("candidates")
    if not isinstance(candidates, dict):
        return doc, []
    new_candidates: dict[str, Any] | None = None
    repairs: list[Repair] = []
    for category in CATEGORIES:
        items = candidates.get(category)
        if not isinstance(items, list) or not any(is_wrapper(item) for item in items):
            continue
        new_items = list(items)
        for i, item in enumerate(items):
            if not is_wrapper(item):
                continue
            inner = dict(item["candidate"])
            attempts = item.get("reconcile_attempts")
            if is_finite_number(attempts):
                inner["reconcile_attempts"] = attempts
            new_items[i] = inner
            repairs.append(
                Repair(
                    "R6",
                    f"candidates.{category}[{i}]",
                    {"unwrapped": "candidate", "original": f"deadletter/originals/{original}"},
                )
            )
        if new_candidates is None:
            new_candidates = dict(candidates)
        new_candidates[category] = new_items
    if new_candidates is None:
        return doc, []
    fixed = dict(doc)
    fixed["candidates"] = new_candidates
    return fixed, repairs


def _needs_triggers(lesson: object) -> bool:
    if not isinstance(lesson, dict):
        return False
    triggers = lesson.get("triggers")
    return "triggers" not in lesson or not isinstance(triggers, list) or not triggers


def repair_triggers(doc: dict[str, Any]) -> tuple[dict[str, Any], list[Repair]]:
    """R1: derived topic triggers for lessons whose only fault is missing or empty triggers."""
    candidates = doc.get("candidates")
    if not isinstance(candidates, dict):
        return doc, []
    lessons = candidates.get("lessons")
    if not isinstance(lessons, list):
        return doc, []
    new_lessons: list[Any] | None = None
    repairs: list[Repair] = []
    for i, lesson in enumerate(lessons):
        if not i & 1023:
            tick()  # 100,000 lessons to repair take seconds; a stop is acted on at a tick
        if not _needs_triggers(lesson):
            continue
        assert isinstance(lesson, dict)
        fixed = dict(lesson)
        # Any topic is a non-empty string: whether R1 applies does not depend on which, so the
        # topic is derived only for a lesson that is otherwise valid.
        fixed["triggers"] = [{"type": "topic", "value": "lesson"}]
        if check_candidate("lessons", fixed, ""):
            continue  # not otherwise valid: R1 does not apply
        triggers = [{"type": "topic", "value": derive_topic(doc, lesson)}]
        fixed["triggers"] = triggers
        if new_lessons is None:
            new_lessons = list(lessons)
        new_lessons[i] = fixed
        repairs.append(Repair("R1", f"candidates.lessons[{i}].triggers", triggers))
    if new_lessons is None:
        return doc, []
    new_candidates = dict(candidates)
    new_candidates["lessons"] = new_lessons
    fixed_doc = dict(doc)
    fixed_doc["candidates"] = new_candidates
    return fixed_doc, repairs


def split_candidates(doc: dict[str, Any], invalid: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """R4: the file with the invalid candidates left out, every other key kept as it was.

    ``invalid`` maps a category to the indices of its invalid candidates.
    """
    candidates = doc["candidates"]
    new_candidates = dict(candidates)
    for category in CATEGORIES:
        items = candidates.get(category)
        gone = set(invalid.get(category, ()))
        if isinstance(items, list) and gone:
            new_candidates[category] = [item for i, item in enumerate(items) if i not in gone]
    fixed = dict(doc)
    fixed["candidates"] = new_candidates
    return fixed
