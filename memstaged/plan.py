"""Step 3 of the flow: what carrying a decision out changes on disk, as a value.

A :class:`Plan` lists, for one version of one staging file, the dead-letter files to write and
what happens to the staging file: rewritten (repaired), removed (quarantined) or moved whole
into ``deadletter/originals/`` (too large to read). A :class:`Change` is what an operator's
command changes (``deadletter recover`` and ``purge``): a new staging file of recovered
candidates, and dead-letter files removed, each only if it is still the very file that was read.
:func:`memstaged.apply.apply` carries out any number of plans, or of changes, as one
transaction; nothing else changes ``staging/`` or ``deadletter/``.
"""

from __future__ import annotations

import hashlib
from enum import Enum
from typing import Any, NamedTuple

from memstaged.fsio import Identity
from memstaged.quarantine import DeadLetter
from memstaged.read import Version
from memstaged.triage import Decision, Verdict


class Kind(Enum):
    REWRITE = "rewrite"
    REMOVE = "remove"
    #: The file itself becomes the original (a rename: a huge file costs nothing, SPEC 6).
    MOVE = "move"
    #: A new staging file (recovered candidates) under the first free ``<base>.recovered-<n>``.
    CREATE = "create"
    #: Only dead-letter files removed (a purge, records already recovered, unneeded originals).
    DELETE = "delete"


class Plan:
    """The changes of one decision, and the log event that announces them."""

    __slots__ = (
        "ahead",
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
        #: The dead-letter temps written and made durable before the lock, one per record (in
        #: the order of ``records``), and the original's (SPEC 5: the lock is held briefly).
        self.ahead = Ahead([], None)

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


class Written(NamedTuple):
    """A record's durable temp in ``deadletter/``: its name and the size of its bytes.

    Under the lock a record is not rendered again (SPEC 4: one record in memory at a time):
    what is at its name is compared with the temp, on disk.
    """

    tmp: str
    size: int


class Ahead(NamedTuple):
    """What a plan wrote before the lock: its records' temps and its original's temp."""

    records: list[Written]
    original: str | None


class Held(NamedTuple):
    """A file of the dead-letter store as it was read: where, its name, its identity.

    ``where`` is ``deadletter`` or ``deadletter/originals``. ``identity`` is ``None`` for a file
    that could not be read as a regular file: it is then taken as whatever holds the name.
    """

    where: str
    name: str
    identity: Identity | None


class Change:
    """One change of ``deadletter recover`` or ``purge``, and the log event that announces it.

    A ``CREATE`` writes ``data`` as a new staging file and then removes ``removes`` (the
    records whose candidates it holds); a ``DELETE`` only removes. Both are carried out only if
    every file of ``depends`` is still the very file that was read, and each file of
    ``removes`` is removed only if it still is. :func:`memstaged.apply.apply` fills in the
    outcome: ``created``, ``removed``, ``left``, and ``stale``, ``refused`` or ``failed`` for a
    change it did not carry out.
    """

    __slots__ = (
        "base",
        "created",
        "data",
        "depends",
        "event",
        "failed",
        "key",
        "kind",
        "left",
        "refused",
        "removed",
        "removes",
        "stale",
        "tmp",
    )

    def __init__(
        self,
        kind: Kind,
        key: str,
        event: dict[str, Any] | None,
        *,
        removes: list[Held],
        depends: list[Held] | None = None,
        data: bytes | None = None,
        base: str = "",
    ) -> None:
        assert kind in (Kind.CREATE, Kind.DELETE)
        assert (data is not None) == (kind is Kind.CREATE)
        self.kind = kind
        #: Unique in a transaction: :func:`~memstaged.apply.apply`'s results are keyed by it.
        self.key = key
        #: Logged (announced) before anything of the change is carried out; ``None``: nothing.
        self.event = event
        self.data = data
        self.base = base
        self.depends = list(depends or ())
        self.removes = removes
        #: The staging file's temp, written and made durable before the lock is taken.
        self.tmp: str | None = None
        #: The name the new staging file got in ``staging/``.
        self.created: str | None = None
        self.removed: list[str] = []
        #: name -> why a file of ``removes`` is still there.
        self.left: dict[str, str] = {}
        #: name -> ``gone`` or ``changed``: files of ``depends`` no longer as they were read.
        self.stale: dict[str, str] = {}
        #: Why the caller's own check under the lock refused it (``admit``).
        self.refused: str | None = None
        #: Why it could not be carried out (an I/O error); nothing of it was.
        self.failed: str | None = None
