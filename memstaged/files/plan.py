"""Step 3 of the flow: what carrying a decision or a command out changes on disk, as a value.

A :class:`Plan` is built once and never changed: :func:`memstaged.files.transaction.apply` carries
out any number of them as one transaction and hands back a
:class:`~memstaged.files.transaction.Result` for each, by its :attr:`Plan.key`. Nothing else changes
``staging/`` or ``deadletter/``. Who builds plans:

- the daemon and ``--once`` (:func:`plan_of`, from a decision): ``REWRITE`` (repaired),
  ``REMOVE`` (quarantined) or ``MOVE`` (quarantined, too large to read: the file itself becomes
  the original under ``deadletter/originals/``, SPEC 6), each with the dead-letter files to
  write (the original and the records) and the :class:`~memstaged.files.version.Version` it is
  about;
- ``deadletter recover`` (``CREATE``: a new staging file of recovered candidates, then the
  records it holds removed), ``purge`` and ``drop_originals`` (``UNLINK``: dead-letter files
  removed), each depending on files that must still be the very files that were read.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import msgspec

from memstaged.core import digests
from memstaged.core.decide import Decision, Verdict
from memstaged.core.records import DeadLetter
from memstaged.files.fsio import Identity
from memstaged.files.locks import LockInfo
from memstaged.files.version import Version


class Action(Enum):
    #: The staging file is replaced by its repair (``RENAME_EXCHANGE``).
    REWRITE = "rewrite"
    #: The staging file is removed; its bytes are in ``originals/`` and its records.
    REMOVE = "remove"
    #: The file itself becomes the original (a rename: a huge file costs nothing, SPEC 6).
    MOVE = "move"
    #: A new staging file (recovered candidates) under the first free ``<base>.recovered-<n>``.
    CREATE = "create"
    #: Only dead-letter files removed (a purge, records already recovered, unneeded originals).
    UNLINK = "unlink"


class Held(NamedTuple):
    """A file as it was read: where, its name, its identity.

    ``where`` is ``staging``, ``deadletter`` or ``deadletter/originals``. ``identity`` is ``None``
    for a file that could not be read as a regular file: it is then taken as whatever holds the
    name.
    """

    where: str
    name: str
    identity: Identity | None


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """One change of one transaction, and everything it depends on."""

    #: Unique in a transaction: its result is handed back under it (a staging file's name for
    #: a decision).
    key: str
    action: Action
    #: The version a decision is about (``REWRITE``, ``REMOVE``, ``MOVE``): the staging file is
    #: changed only while it is still that version.
    version: Version | None = None
    #: Files that must all still be as they were read, or nothing of the plan is carried out.
    depends: tuple[Held, ...] = ()
    #: Files removed once the plan's own change is durable, each only if still as it was read.
    removes: tuple[Held, ...] = ()
    #: The repair's bytes (``REWRITE``), or the new staging file's (``CREATE``).
    data: bytes | None = None
    #: ``CREATE``: the new file is ``<base>.recovered-<n>.json``.
    base: str = ""
    #: The planned name under ``deadletter/originals/`` for the version's bytes, or ``None``.
    original: str | None = None
    #: The records to write directly in ``deadletter/`` (names as planned).
    records: tuple[DeadLetter, ...] = ()

    @property
    def held_bytes(self) -> int:
        """What the plan keeps in memory until it is applied (a batch bounds the sum)."""
        data = self.version.data if self.version is not None else None
        return len(data or b"") + len(self.data or b"")


def plan_of(version: Version, verdict: Verdict) -> Plan | None:
    """The plan for a verdict, or None when the decision changes nothing on disk."""
    if verdict.decision is Decision.REPAIRED:
        action = Action.REWRITE
    elif verdict.decision is Decision.QUARANTINED:
        action = Action.MOVE if version.data is None else Action.REMOVE
    else:
        return None
    return Plan(
        key=version.name,
        action=action,
        version=version,
        data=verdict.new_bytes,
        original=verdict.original,
        records=verdict.deadletter,
    )


def identity_hash(version: Version) -> str:
    """The hash a too-large file is named by: of its identity, since its bytes are never read.

    Hashing a 100 GiB sparse file would take minutes under the lock; the
    file is moved, not read, so what names it is ``dev:ino:size:mtime_ns:ctime_ns``.
    """
    ident = version.identity
    text = f"id:{ident.dev}:{ident.ino}:{ident.size}:{ident.mtime_ns}:{ident.ctime_ns}"
    return digests.sha256(text.encode()).hexdigest()


class Status(Enum):
    """What became of a plan."""

    #: Carried out (for a ``CREATE`` or ``UNLINK``: some removals may still be ``left``).
    DONE = "done"
    #: The version or a file it depends on was gone before anything of it was done.
    GONE = "gone"
    #: The version, or a file it depends on, changed before anything of it was done.
    CHANGED = "changed"
    #: A writer's version was displaced by our rename: kept as :attr:`Result.conflict`, and the
    #: plan's change taken back (nothing of it stays but the records of a rewrite).
    CONFLICT = "conflict"
    #: A too-large file can be neither moved nor copied into ``deadletter/``: left where it is.
    UNMOVABLE = "unmovable"
    #: A check under the lock (``refuse``) said no: nothing of it was done.
    REFUSED = "refused"
    #: Its new staging file could not be written or named: nothing of it was done.
    FAILED = "failed"


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`memstaged.files.transaction.apply` did with one plan."""

    key: str
    status: Status
    #: The identity of the version now decided: for a repair, the rewrite put in place.
    identity: Identity | None = None
    #: The records' final names in ``deadletter/`` (they may differ from the planned ones).
    records: tuple[str, ...] = ()
    #: The original's final name in ``deadletter/originals/``.
    original: str | None = None
    #: The name the new staging file got (``CREATE``).
    created: str | None = None
    #: The files of ``removes`` removed.
    removed: tuple[str, ...] = ()
    #: name -> why a file of ``removes`` is still there.
    left: dict[str, str] = {}
    #: name -> ``gone`` or ``changed``: the files of ``depends`` no longer as they were read.
    stale: dict[str, str] = {}
    #: The ``.conflict-`` name a displaced writer version was kept under in ``staging/``.
    conflict: str | None = None
    #: Why it is ``UNMOVABLE``, ``REFUSED`` or ``FAILED``.
    reason: str | None = None


class Settled(msgspec.Struct, frozen=True):
    """A plan's names as the transaction settled them under the lock, before it carries it out:
    what its announcement (SPEC 5: logged before) names."""

    key: str
    records: tuple[str, ...] = ()
    original: str | None = None
    created: str | None = None


class StaleLock(NamedTuple):
    """A ``canonical-writer.lock`` whose process is gone, seen while taking the lock."""

    info: LockInfo
    #: memstaged's own, removed; else another owner's, not obeyed (memstaged never deletes it).
    removed: bool


class Applied(msgspec.Struct, frozen=True):
    """What :func:`apply` did: each plan's result by its key, and the stale locks it saw."""

    results: dict[str, Result]
    stale_locks: tuple[StaleLock, ...] = ()
