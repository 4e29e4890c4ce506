"""Builders and checks shared by the engine tests (tests/core/test_engine*.py).

A staging file is built as a plain dict from :func:`staging`, changed with :func:`patched` at a
path such as ``("candidates", "lessons", 0, "triggers")``, encoded with :func:`encode` and decided
with :func:`decide_doc`. Nothing here touches the file system.
"""

from __future__ import annotations

import copy
import enum
import json
import math
import re
from collections.abc import Iterator
from typing import Any, Final

from memstaged.core.decide import Context, Verdict, decide
from memstaged.core.js.ecma import parse_json
from memstaged.core.repair import Repair
from memstaged.core.schema import CATEGORIES
from memstaged.core.timestamps import canonical, repairable
from support.documents import DELETE, changed, decision, lesson, preference, staging_doc

PROJECT: Final = "/home/ana/src/example-project"
FILE_NAME: Final = "sess-1.json"
VALID_AT: Final = "2026-01-01T00:00:00Z"

#: Marks a key to delete in :func:`patched`.

Path = tuple[str | int, ...]


def staging(**changes: Any) -> dict[str, Any]:
    """A valid staging file of :data:`PROJECT` with one candidate of each category and a few
    unknown keys (:func:`support.documents.staging_doc`'s, changed with ``changes``)."""
    base = staging_doc(
        PROJECT,
        "sess-1",
        produced_at=VALID_AT,
        extractor={"name": "pi", "version": [1, 2]},
        candidates={
            "lessons": [lesson()],
            "preferences": [preference()],
            "decisions": [decision()],
            "domain": [decision(summary="Staging files are JSON")],
            "unknown_category": [{"anything": True}],
        },
    )
    return changed(base, changes)


def patched(doc: Any, *edits: tuple[Path, Any]) -> Any:
    """A deep copy of ``doc`` with each ``(path, value)`` set (``DELETE`` removes the key)."""
    out = copy.deepcopy(doc)
    for path, value in edits:
        if not path:
            out = value
            continue
        parent = out
        for step in path[:-1]:
            parent = parent[step]
        if value is DELETE:
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return out


def _encode_into(value: Any, out: list[str]) -> None:
    if isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(("," if i else "") + json.dumps(key) + ":")
            _encode_into(item, out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            out.append("," if i else "")
            _encode_into(item, out)
        out.append("]")
    elif isinstance(value, float) and math.isinf(value):
        out.append("1e400" if value > 0 else "-1e400")
    else:
        out.append(json.dumps(value))  # ASCII: lone surrogates become \udXXX escapes


def encode(doc: Any) -> bytes:
    """UTF-8 JSON that JSON.parse reads as ``doc`` (infinities as ``1e400``), built without the
    engine's own encoder."""
    out: list[str] = []
    _encode_into(doc, out)
    return "".join(out).encode("ascii")


def context(**changes: Any) -> Context:
    """The engine's context for :data:`FILE_NAME` in :data:`PROJECT`."""
    fields: dict[str, Any] = {
        "project_root": PROJECT,
        "file_name": FILE_NAME,
        "source_path": f"{PROJECT}/.pi/memory/project/staging/{FILE_NAME}",
        "decided_at": "2026-02-01T10:00:00.000Z",
    }
    fields.update(changes)
    return Context(**fields)


def decide_doc(doc: Any, **ctx_changes: Any) -> Verdict:
    """Decide the encoded ``doc``."""
    return decide(encode(doc), context(**ctx_changes))


def decoded(data: bytes | None) -> Any:
    """The value JSON.parse reads from ``data``."""
    assert data is not None
    return parse_json(data).value


def records(verdict: Verdict) -> list[dict[str, Any]]:
    """The decoded dead-letter records of ``verdict``, in order."""
    return [decoded(record.body) for record in verdict.deadletter]


def wheres(verdict: Verdict) -> list[str]:
    """The locations named by ``verdict.reasons`` (``where: why``)."""
    return [reason.split(": ", 1)[0] for reason in verdict.reasons]


_REPAIR_WHERE: Final = re.compile(r"candidates\.(\w+)(?:\[(\d+)\](?:\.(\w+))?)?")


def repair_path(where: str) -> Path:
    """``candidates.lessons[2].triggers`` as a path for :func:`patched`."""
    if where == "produced_at":
        return ("produced_at",)
    match = _REPAIR_WHERE.fullmatch(where)
    assert match is not None, where
    if match[2] is None:
        return ("candidates", match[1])
    path: Path = ("candidates", match[1], int(match[2]))
    return (*path, match[3]) if match[3] else path


def expected_after_repairs(doc: dict[str, Any], repairs: tuple[Repair, ...]) -> Any:
    """``doc`` with exactly the values the R1/R3/R5 repairs say they wrote, nothing else changed."""
    edits = [(repair_path(r.where), r.wrote) for r in repairs if r.rule in ("R1", "R3", "R5")]
    return patched(doc, *edits)


def category_items(doc: Any) -> Iterator[tuple[str, int, Any]]:
    """Every ``(category, index, element)`` of the four category arrays."""
    candidates = doc.get("candidates") if isinstance(doc, dict) else None
    if not isinstance(candidates, dict):
        return
    for category in CATEGORIES:
        items = candidates.get(category)
        if isinstance(items, list):
            for i, item in enumerate(items):
                yield category, i, item


def is_safe_name(name: str) -> bool:
    """A dead-letter file name that stays in its directory, is visible and fits NAME_MAX."""
    return (
        "/" not in name
        and "\x00" not in name
        and not name.startswith(".")
        and name not in ("", ".", "..")
        and len(name.encode("utf-8", "surrogatepass")) <= 255
    )


class Form(enum.Enum):
    """How a ``produced_at`` string stands with respect to SPEC 2.3 and R3."""

    AS_WRITTEN = "as written"
    REPAIRABLE = "repairable"


def classify(value: str) -> tuple[Form, str] | None:
    """A timestamp and its canonical form, a value R3 rewrites and what it writes, or ``None``:
    how the engine's two readings (``canonical``, ``repairable``) split every value."""
    found = canonical(value)
    if found is not None:
        return Form.AS_WRITTEN, found
    fixed = repairable(value)
    return None if fixed is None else (Form.REPAIRABLE, fixed)
