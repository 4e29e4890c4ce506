"""Dead-letter records and names (SPEC section 4), as pure values rendered one at a time.

The record shape is the one the agent's own tools list and recover, so it is built here exactly;
memstaged's own additions live under the ``memstaged`` key. Names are derived from the staging
file's name (sanitized) and the hash of its bytes only, never from its content, so quarantining the
same bytes twice yields the same names and cannot create a second set of records. Sanitizing
loses information (``\x01.json`` and ``_.json`` both clean to ``_.json``), so a name that did
not survive it unchanged is tagged with a hash of its bytes (``_-n<8 hex>``): two different
names never share record names, and each keeps its own records and its own original.

Records stay bounded (SPEC 4): a :class:`DeadLetter` holds only its name and where its candidate
is; its ``body`` is encoded when it is asked for, from the parsed file that all records of a
decision share, so a file with thousands of candidates never has all their records in memory at
once. The whole file, encoded once, is spliced into every record as it is, unless that would make
the records larger than ``max(16 x the file's size, 64 MiB)`` together: then each record names the
original under ``originals/`` (which holds the bytes in any case) instead of embedding it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from memstaged.core import digests
from memstaged.core.js.ecma import encode_json, is_finite_number, is_nonempty_string, trim
from memstaged.core.schema import candidate_arrays, check_candidate
from memstaged.core.timestamps import canonical_or_epoch

GATE_REASON: Final = "malformed staging file"
ORIGINALS_DIR: Final = "originals"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_LIMIT: Final = 80
_HASH_CHARS: Final = 16
#: The tag of a name that sanitizing changed; a name that ends like one is tagged too, so that an
#: untagged name can never equal a tagged one.
_NAME_TAG: Final = re.compile(r"-n[0-9a-f]{8}\Z")
#: SPEC 4: records embedding the whole file may total this much, or 16 times the file's size.
EMBED_LIMIT: Final = 64 << 20
EMBED_FACTOR: Final = 16


class Origin(msgspec.Struct, frozen=True):
    """What every record of one decision shares: where the bytes came from and why they failed.

    ``errors`` are the file-level validation errors, those no repair fixes first and then
    ``repairable``, those a repair would have fixed; each record adds its own candidate's.
    ``reason`` is the first error of the whole file that no repair fixes: why it was quarantined,
    which a record of a valid candidate does not otherwise say.
    """

    file_name: str
    source_path: str
    sha256: str
    size: int
    decided_at: str
    errors: tuple[str, ...]
    repairable: tuple[str, ...] = ()
    reason: str | None = None


def safe_component(text: str) -> str:
    """A file-name part that cannot escape a directory, hide itself or overflow ``NAME_MAX``."""
    cleaned = _UNSAFE.sub("_", text).lstrip(".-")[:_NAME_LIMIT]
    return cleaned or "file"


def name_component(name: str) -> str:
    """``name`` as part of a dead-letter file name, distinct for distinct names.

    A name that is safe as it is stays as it is (``session-1``); any other is sanitized and
    tagged with the first 8 hex digits of the SHA-256 of its bytes (``_-n3f2a9c01``), so names
    that sanitize alike (``\x01``, ``_``, a long name cut at 80 characters) stay apart.
    """
    cleaned = safe_component(name)
    if cleaned == name and not _NAME_TAG.search(name):
        return cleaned
    try:
        raw = os.fsencode(name)  # a name read from the disk: its bytes
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "surrogatepass")  # a lone surrogate that is not a byte
    return f"{cleaned}-n{digests.sha256(raw).hexdigest()[:8]}"


def stem(file_name: str) -> str:
    """The staging file's name without ``.json``."""
    return file_name[: -len(".json")] if file_name.endswith(".json") else file_name


def original_name(file_name: str, sha256: str) -> str:
    """The original's file name inside ``deadletter/originals/``."""
    return f"{name_component(file_name)}.{sha256[:_HASH_CHARS]}.orig"


def _record_prefix(origin: Origin) -> str:
    return f"{name_component(stem(origin.file_name))}-{origin.sha256[:_HASH_CHARS]}"


def _session_id(doc: object, origin: Origin) -> str:
    value = doc.get("session_id") if isinstance(doc, dict) else None
    if isinstance(value, str) and is_nonempty_string(value):
        return trim(value)
    return f"malformed-{stem(origin.file_name)}"


def _attempts(candidate: object) -> Any:
    value = candidate.get("reconcile_attempts") if isinstance(candidate, dict) else None
    return value if is_finite_number(value) else 0


class _Shared:
    """What the records of one decision have in common, computed once."""

    __slots__ = (
        "again",
        "checked",
        "doc",
        "embedded",
        "exotic",
        "origin",
        "original",
        "prefix",
        "produced_at",
        "repaired",
        "session_id",
    )

    def __init__(
        self,
        doc: Any,
        origin: Origin,
        exotic: bool,
        checked: Any = None,
        repaired: Any = None,
    ) -> None:
        self.doc = doc
        self.origin = origin
        self.exotic = exotic
        #: The file whose candidates' problems are each record's own (None: ``doc``). A
        #: record's errors are found again as it is rendered, not kept for every candidate
        #: at once: they took up to 200 times the file.
        self.checked = doc if checked is None else checked
        #: The file once every repair was applied (None: no repair touches the candidates).
        self.repaired = repaired
        self.session_id = _session_id(doc, origin)
        self.prefix = _record_prefix(origin)
        produced = doc.get("produced_at") if isinstance(doc, dict) else None
        self.produced_at = canonical_or_epoch(produced)
        #: The parsed file as each record holds it: its encoding, or a reference to the original.
        self.embedded: msgspec.Raw | dict[str, str] | None = None
        #: The original's name in ``originals/`` as planned; a record rendered for another name
        #: (the planned one was taken, SPEC 4) is given that name by :meth:`DeadLetter.render`.
        self.original = original_name(origin.file_name, origin.sha256)
        #: For a copy without the parsed file (:meth:`light`): gives the records of the same
        #: decision, whole, when a record must be rendered for another original's name.
        self.again: Callable[[], Sequence[DeadLetter]] | None = None

    def light(self) -> _Shared:
        """This without the parsed file: what the records rendered in a decider process need
        in the reading process (names, marks), since their bytes travel with them."""
        copy = _Shared.__new__(_Shared)
        for slot in _Shared.__slots__:
            setattr(copy, slot, getattr(self, slot))
        copy.doc = copy.checked = copy.repaired = copy.embedded = None
        return copy

    def render(
        self,
        category: str,
        candidate: Any,
        attempts: Any,
        errors: list[str],
        repairable: list[str],
        original: str,
    ) -> bytes:
        origin = self.origin
        own: dict[str, Any] = {
            "source_path": origin.source_path,
            "source_file": origin.file_name,
            "original": f"{ORIGINALS_DIR}/{original}",
            "sha256": origin.sha256,
            "size": origin.size,
            "errors": errors,
            "decided_at": origin.decided_at,
        }
        if repairable:
            own["repairable"] = repairable
        if origin.reason is not None:
            own["quarantined_for"] = origin.reason
        record = {
            "session_id": self.session_id,
            "produced_at": self.produced_at,
            "attempts": attempts,
            "last_gate_reason": GATE_REASON,
            "category": category,
            "candidate": candidate,
            "memstaged": own,
        }
        return _encode(record, self.exotic)


def _encode(record: dict[str, Any], exotic: bool) -> bytes:
    if not exotic:
        try:
            return encode_json(record) + b"\n"
        except UnicodeEncodeError:
            # A file name that is not UTF-8 reaches us surrogate-escaped (os.fsdecode), and it is
            # part of every record: write it as \udcXX escapes, as for lone surrogates in content.
            pass
    return encode_json(record, exotic=True) + b"\n"


class DeadLetter:
    """One record to write directly in ``deadletter/``: its file name, and its bytes on demand.

    ``body`` (or :meth:`render`, for another original's name) encodes the record each time it is
    read; the transaction renders it once, as it writes the record, so only one record of a
    decision is in memory at a time. Nothing of it changes once it is built.
    """

    __slots__ = ("_at", "_body", "_index", "_name", "_shared", "category")

    def __init__(
        self,
        name: str | None,
        category: str,
        shared: _Shared,
        index: int | None,
        body: bytes | None = None,
    ) -> None:
        #: None: the name a record of its candidate gets, built when asked for (one string
        #: per record of a file of hundreds of thousands of candidates is not kept).
        self._name = name
        self.category = category
        self._shared = shared
        #: The candidate's index in its category, or None for the whole-file record.
        self._index = index
        #: The record rendered ahead for the planned original (:func:`rendered_ahead`), and
        #: its place among its decision's records.
        self._body = body
        self._at = 0

    @property
    def name(self) -> str:
        """The record's file name in ``deadletter/``."""
        if self._name is not None:
            return self._name
        return f"{self._shared.prefix}-{self.category}-{self._index}.json"

    @property
    def body(self) -> bytes:
        """The record as planned: pointing at the original's planned name."""
        return self.render(self._shared.original)

    def render(self, original: str) -> bytes:
        """The record's bytes, naming ``originals/<original>`` as its original.

        The transaction renders a record for the name its original really gets (the planned
        one may be taken, SPEC 4): nothing of the record changes, each rendering is a value.
        """
        shared = self._shared
        if self._body is not None and original == shared.original:
            return self._body
        if shared.again is not None:  # rendered ahead for another name: the whole record again
            return shared.again()[self._at].render(original)
        origin = shared.origin
        file_fixed = list(origin.repairable)
        file_left = list(origin.errors[: len(origin.errors) - len(file_fixed)])
        if self._index is None:
            return shared.render(
                self.category, shared.doc, 0, [*file_left, *file_fixed], file_fixed, original
            )
        category, index = self.category, self._index
        item = shared.doc["candidates"][category][index]
        where = f"candidates.{category}[{index}]"
        checked = shared.checked["candidates"][category][index]
        own = [str(p) for p in check_candidate(category, checked, where)]
        after = (
            checked if shared.repaired is None else shared.repaired["candidates"][category][index]
        )
        if after is checked:
            own_left, own_fixed = own, []
        else:
            own_left = [str(p) for p in check_candidate(category, after, where)]
            left = set(own_left)
            own_fixed = [e for e in own if e not in left]
        embedded = shared.embedded
        if isinstance(embedded, dict) and original != shared.original:
            embedded = {**embedded, "memstaged_original": original}
        wrapped = {"candidate": item, "original_staging_file": embedded}
        # Those no repair fixes first (SPEC 7): what a reader of the record sees first.
        errors = [*file_left, *own_left, *file_fixed, *own_fixed]
        return shared.render(
            self.category, wrapped, _attempts(item), errors, [*file_fixed, *own_fixed], original
        )

    def renamed(self, name: str) -> DeadLetter:
        """The same record under another file name (SPEC 4: a name under deadletter/ is taken)."""
        other = DeadLetter(name, self.category, self._shared, self._index, self._body)
        other._at = self._at
        return other

    def marks(self, original: str) -> dict[str, Any]:
        """What tells this record's quarantine apart, as :meth:`render` writes it, unrendered.

        The transaction compares a record already at a name under ``deadletter/`` with these
        (the same bytes quarantined earlier) under the lock, where no record is rendered.
        """
        origin = self._shared.origin
        return {
            "sha256": origin.sha256,
            "source_file": origin.file_name,
            "original": f"{ORIGINALS_DIR}/{original}",
            "category": self.category,
        }

    @property
    def original(self) -> str:
        """The original's planned name under ``originals/`` that :attr:`body` points at."""
        return self._shared.original

    def __repr__(self) -> str:
        return f"DeadLetter({self.name!r}, {self.category!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeadLetter):
            return NotImplemented
        return self.name == other.name and self.body == other.body

    __hash__ = None  # type: ignore[assignment]


def candidate_records(
    doc: dict[str, Any],
    origin: Origin,
    *,
    checked: dict[str, Any] | None = None,
    repaired: dict[str, Any] | None = None,
    only: Mapping[str, Sequence[int]] | None = None,
    exotic: bool = False,
) -> list[DeadLetter]:
    """One record per candidate found (SPEC 4.2), or only those in ``only`` (repair R4).

    ``only`` maps a category to the indices of its candidates that get a record, in order.
    A record lists its candidate's own validation errors, as :func:`schema.check_candidate`
    finds them in ``checked`` (``doc`` itself unless given), and the file-level ones
    (``origin.errors``). ``repaired`` is the file once every repair was applied: a
    candidate's errors that are gone there are marked ``repairable`` and listed last.
    """
    positions = [
        (category, range(len(items)) if only is None else only.get(category, ()))
        for category, items in candidate_arrays(doc)
    ]
    count = sum(len(indices) for _category, indices in positions)
    if not count:
        return []
    shared = _Shared(doc, origin, exotic, checked, repaired)
    encoded = encode_json(doc, exotic=exotic)
    if len(encoded) * count > max(EMBED_FACTOR * origin.size, EMBED_LIMIT):
        shared.embedded = {
            "memstaged_original": shared.original,
            "sha256": origin.sha256,
        }
    else:
        shared.embedded = msgspec.Raw(encoded)
    del encoded
    return [
        DeadLetter(None, category, shared, i) for category, indices in positions for i in indices
    ]


def whole_file_record(value: Any, origin: Origin, *, exotic: bool = False) -> DeadLetter:
    """The single record of SPEC 4.3, when no candidate can be found.

    ``value`` is the parsed value, the text as read when it is not JSON, or ``None`` for a file
    too large to read: the original file still holds the bytes.
    """
    shared = _Shared(value, origin, exotic)
    return DeadLetter(f"{shared.prefix}-file.json", "lessons", shared, None)


#: :func:`rendered_ahead` renders a decision's records in a decider process only up to this many
#: bytes together; beyond, they are rendered one at a time as they are written (SPEC 4: records
#: stay bounded), and the parsed file travels instead.
AHEAD_LIMIT: Final = 4 << 20


def rendered_ahead(records: Sequence[DeadLetter]) -> tuple[DeadLetter, ...] | None:
    """The records, each with its bytes rendered for the planned original and without the
    parsed file; None when they would be larger than :data:`AHEAD_LIMIT` together.

    A decider process sends these back instead of the parsed file: pickling a
    decoded document cost more than deciding it, and the reading process rendered every record
    again. Rendering one for another original (rare: the planned name was taken) needs the
    file: :func:`decided_again` gives the way back to it.
    """
    if not records:
        return ()
    out: list[DeadLetter] = []
    total = 0
    lights: dict[int, _Shared] = {}
    for at, record in enumerate(records):
        body = record.body
        total += len(body)
        if total > AHEAD_LIMIT:
            return None
        shared = record._shared
        light = lights.get(id(shared))
        if light is None:
            light = lights[id(shared)] = shared.light()
        ahead = DeadLetter(record.name, record.category, light, record._index, body)
        ahead._at = at
        out.append(ahead)
    return tuple(out)


def decided_again(records: Sequence[DeadLetter], again: Callable[[], Sequence[DeadLetter]]) -> None:
    """Give records rendered ahead the way back to their whole selves: ``again`` decides the
    same bytes in the same context again (deciding is pure: the same records)."""
    whole: list[Sequence[DeadLetter]] = []

    def once() -> Sequence[DeadLetter]:
        if not whole:
            whole.append(again())
        return whole[0]

    for record in records:
        if record._body is not None:
            record._shared.again = once
