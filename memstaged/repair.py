"""Deterministic repairs R1-R4 (SPEC section 3).

A repair only adds or normalizes: it builds new containers along the paths it changes and shares
everything else with the decoded original, so every key and candidate it does not fix stays exactly
as it was, and the original stays intact for the dead-letter record if the repair is not enough.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Final

import msgspec

from memstaged.ecma import collapse, split_words
from memstaged.schema import CATEGORIES, check_candidate
from memstaged.timestamps import Form, classify

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


def _first_string(context: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = context.get(key)
        if isinstance(value, str):
            return value
    return None


def _basename(path: str) -> str:
    # POSIX basename with trailing slashes ignored; "/" (all slashes) has no last component.
    return posixpath.basename(path.rstrip("/"))


def keyword_topic(text: str) -> str:
    """Step 3 of SPEC 3.1: the first four meaningful words of the lesson's text."""
    # Split on JavaScript whitespace (str.split() would also split on U+001C..U+001F, U+0085).
    words = split_words(_KEYWORD_SEPARATORS.sub(" ", text.lower()))
    kept = [w for w in words if len(w) >= 3 and w not in _STOPWORDS]
    return " ".join(kept[:4])


def derive_topic(context: dict[str, Any], lesson: dict[str, Any]) -> str:
    """The trigger topic T of SPEC 3.1, the first non-empty of its five sources in order.

    "The first string among its keys" is read literally: the first listed key whose value is a
    string is the source, even if it collapses to nothing (then the next numbered source is used).
    """
    sources: list[object] = [_first_string(context, _CONTEXT_TOPIC_KEYS)]
    root = _first_string(context, _CONTEXT_ROOT_KEYS)
    sources.append(None if root is None else _basename(root))
    sources.append(lesson.get("scope_suggestion"))
    summary, detail = lesson.get("summary"), lesson.get("detail")
    if isinstance(summary, str) and isinstance(detail, str):
        text = f"{summary}\n{detail}"
        sources.append(keyword_topic(text))
        sources.append(text)
    for source in sources:
        if isinstance(source, str):
            topic = collapse(source)
            if topic:
                return topic
    return "lesson"


def repair_timestamp(doc: dict[str, Any]) -> tuple[dict[str, Any], list[Repair]]:
    """R3: rewrite an unambiguous but non-canonical ``produced_at`` in canonical UTC form."""
    value = doc.get("produced_at")
    if not isinstance(value, str):
        return doc, []
    found = classify(value)
    if found is None or found[0] is Form.AS_WRITTEN:
        return doc, []
    fixed = dict(doc)
    fixed["produced_at"] = found[1]
    return fixed, [Repair("R3", "produced_at", found[1])]


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
        if not _needs_triggers(lesson):
            continue
        assert isinstance(lesson, dict)
        triggers = [{"type": "topic", "value": derive_topic(doc, lesson)}]
        fixed = dict(lesson)
        fixed["triggers"] = triggers
        if check_candidate("lessons", fixed, ""):
            continue  # not otherwise valid: R1 does not apply
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


def split_candidates(doc: dict[str, Any], invalid: set[tuple[str, int]]) -> dict[str, Any]:
    """R4: the file with the invalid candidates left out, every other key kept as it was."""
    candidates = doc["candidates"]
    new_candidates = dict(candidates)
    for category in CATEGORIES:
        items = candidates.get(category)
        if isinstance(items, list) and any((category, i) in invalid for i in range(len(items))):
            new_candidates[category] = [
                item for i, item in enumerate(items) if (category, i) not in invalid
            ]
    fixed = dict(doc)
    fixed["candidates"] = new_candidates
    return fixed
