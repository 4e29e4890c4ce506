"""Step 3 of the flow: what carrying a decision out changes on disk, as a value.

A :class:`Plan` lists, for one version of one staging file, the dead-letter files to write and
what happens to the staging file: rewritten (repaired), removed (quarantined) or moved whole
into ``deadletter/originals/`` (too large to read). :func:`memstaged.apply.apply` carries out
any number of plans as one transaction; nothing else changes ``staging/`` or ``deadletter/``.
"""

from __future__ import annotations

import hashlib
from enum import Enum
from typing import Any

from memstaged.quarantine import DeadLetter
from memstaged.read import Version
from memstaged.triage import Decision, Verdict


class Kind(Enum):
    REWRITE = "rewrite"
    REMOVE = "remove"
    #: The file itself becomes the original (a rename: a huge file costs nothing, SPEC 6).
    MOVE = "move"


class Plan:
    """The changes of one decision, and the log event that announces them."""

    __slots__ = (
        "copied",
        "event",
        "kind",
        "new_bytes",
        "original",
        "records",
        "unmovable",
        "verdict",
        "version",
    )

    def __init__(
        self,
        version: Version,
        verdict: Verdict,
        kind: Kind,
        event: dict[str, Any],
    ) -> None:
        self.version = version
        self.verdict = verdict
        self.kind = kind
        self.event = event
        self.new_bytes = verdict.new_bytes
        #: The name under ``deadletter/originals/`` for the version's bytes, or None.
        self.original = verdict.original
        self.records: list[DeadLetter] = list(verdict.deadletter)
        #: For a too-large file where a rename is impossible: its copy, a temp in originals/.
        self.copied: str | None = None
        #: ... or why it can be neither moved nor copied (it stays where it is).
        self.unmovable: str | None = None

    @property
    def name(self) -> str:
        return self.version.name

    @property
    def held_bytes(self) -> int:
        """What the plan keeps in memory until it is applied (a batch bounds the sum)."""
        return len(self.version.data or b"") + len(self.new_bytes or b"")


def plan_of(version: Version, verdict: Verdict, event: dict[str, Any]) -> Plan | None:
    """The plan for a verdict, or None when the decision changes nothing on disk."""
    if verdict.decision is Decision.REPAIRED:
        return Plan(version, verdict, Kind.REWRITE, event)
    if verdict.decision is Decision.QUARANTINED:
        kind = Kind.MOVE if version.data is None else Kind.REMOVE
        return Plan(version, verdict, kind, event)
    return None


def identity_hash(version: Version) -> str:
    """The hash a too-large file is named by: of its identity, since its bytes are never read.

    Hashing a 100 GiB sparse file would take minutes under the lock (issue 10, item 10); the
    file is moved, not read, so what names it is ``dev:ino:size:mtime_ns:ctime_ns``.
    """
    ident = version.identity
    text = f"id:{ident.dev}:{ident.ino}:{ident.size}:{ident.mtime_ns}:{ident.ctime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()
