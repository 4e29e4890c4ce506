"""Dead-letter records and names (SPEC section 4), as pure values.

The record shape is the one the agent's own tools list and recover, so it is built here exactly;
memstaged's own additions live under the ``memstaged`` key. Names are derived from the staging
file's name (sanitized) and the hash of its bytes only, never from its content, so quarantining the
same bytes twice yields the same names and cannot create a second set of records.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from memstaged.ecma import encode_json, is_finite_number, is_nonempty_string, trim
from memstaged.schema import CATEGORIES
from memstaged.timestamps import canonical_or_epoch

GATE_REASON: Final = "malformed staging file"
ORIGINALS_DIR: Final = "originals"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_LIMIT: Final = 80
_HASH_CHARS: Final = 16


class DeadLetter(msgspec.Struct, frozen=True):
    """One record to write directly in ``deadletter/``: its file name and its encoded bytes."""

    name: str
    category: str
    body: bytes


class Origin(msgspec.Struct, frozen=True):
    """What every record of one decision shares: where the bytes came from and why they failed."""

    file_name: str
    source_path: str
    sha256: str
    size: int
    decided_at: str
    errors: tuple[str, ...]


def safe_component(text: str) -> str:
    """A file-name part that cannot escape a directory, hide itself or overflow ``NAME_MAX``."""
    cleaned = _UNSAFE.sub("_", text).lstrip(".-")[:_NAME_LIMIT]
    return cleaned or "file"


def stem(file_name: str) -> str:
    """The staging file's name without ``.json``."""
    return file_name[: -len(".json")] if file_name.endswith(".json") else file_name


def original_name(file_name: str, sha256: str) -> str:
    """The original's file name inside ``deadletter/originals/``."""
    return f"{safe_component(file_name)}.{sha256[:_HASH_CHARS]}.orig"


def _record_prefix(origin: Origin) -> str:
    return f"{safe_component(stem(origin.file_name))}-{origin.sha256[:_HASH_CHARS]}"


def _session_id(doc: object, origin: Origin) -> str:
    value = doc.get("session_id") if isinstance(doc, dict) else None
    if isinstance(value, str) and is_nonempty_string(value):
        return trim(value)
    return f"malformed-{stem(origin.file_name)}"


def _attempts(candidate: object) -> Any:
    value = candidate.get("reconcile_attempts") if isinstance(candidate, dict) else None
    return value if is_finite_number(value) else 0


def _record(
    doc: object, category: str, candidate: Any, attempts: Any, origin: Origin
) -> dict[str, Any]:
    produced = doc.get("produced_at") if isinstance(doc, dict) else None
    return {
        "session_id": _session_id(doc, origin),
        "produced_at": canonical_or_epoch(produced),
        "attempts": attempts,
        "last_gate_reason": GATE_REASON,
        "category": category,
        "candidate": candidate,
        "memstaged": {
            "source_path": origin.source_path,
            "source_file": origin.file_name,
            "original": f"{ORIGINALS_DIR}/{original_name(origin.file_name, origin.sha256)}",
            "sha256": origin.sha256,
            "size": origin.size,
            "errors": list(origin.errors),
            "decided_at": origin.decided_at,
        },
    }


def _encode(record: dict[str, Any], exotic: bool) -> bytes:
    if not exotic:
        try:
            return encode_json(record) + b"\n"
        except UnicodeEncodeError:
            # A file name that is not UTF-8 reaches us surrogate-escaped (os.fsdecode), and it is
            # part of every record: write it as \udcXX escapes, as for lone surrogates in content.
            pass
    return encode_json(record, exotic=True) + b"\n"


def candidate_records(
    doc: dict[str, Any],
    origin: Origin,
    *,
    only: set[tuple[str, int]] | None = None,
    exotic: bool = False,
) -> list[DeadLetter]:
    """One record per candidate found (SPEC 4.2), or only those in ``only`` (repair R4)."""
    out: list[DeadLetter] = []
    candidates = doc.get("candidates")
    if not isinstance(candidates, dict):
        return out
    for category in CATEGORIES:
        items = candidates.get(category)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if only is not None and (category, i) not in only:
                continue
            wrapped = {"candidate": item, "original_staging_file": doc}
            record = _record(doc, category, wrapped, _attempts(item), origin)
            name = f"{_record_prefix(origin)}-{category}-{i}.json"
            out.append(DeadLetter(name, category, _encode(record, exotic)))
    return out


def whole_file_record(value: Any, origin: Origin, *, exotic: bool = False) -> DeadLetter:
    """The single record of SPEC 4.3, when no candidate can be found.

    ``value`` is the parsed value, the text when it is UTF-8 but not JSON, or ``None`` when it is
    not UTF-8 (or was too large to read): the original file still holds the bytes.
    """
    record = _record(value, "lessons", value, 0, origin)
    return DeadLetter(f"{_record_prefix(origin)}-file.json", "lessons", _encode(record, exotic))
