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

A plan is never changed once built: what a transaction did so far with it (the names it
settled, the temps it wrote, what it created, removed or left, why it was not carried out) is
kept beside it in a :class:`PlanState`, and handed back as a frozen :class:`Result`.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import msgspec

from memstaged.core import digests
from memstaged.core.decide import Decision, Verdict
from memstaged.core.records import DeadLetter
from memstaged.errors import TransactionStopped
from memstaged.files.deadletter_names import Written
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
    #: A rewrite put in place (``DONE``) whose bytes were read there again under ``identity``
    #: (:func:`memstaged.files.staging_swap.replace`'s look), in a transaction begun ``look``.
    looked: bool = False


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


def so_far(err: OSError, key: str) -> Result:
    """What the plan ``key`` did before ``err`` stopped its transaction (nothing, if unknown)."""
    if isinstance(err, TransactionStopped) and key in err.results:
        return err.results[key]
    return Result(key=key, status=Status.FAILED, reason=str(err))


class PlanState:
    """One plan's progress through its transaction: the transaction's own state, not the plan's."""

    __slots__ = (
        "copied",
        "created",
        "failed",
        "left",
        "original",
        "original_tmp",
        "plan",
        "records",
        "refused",
        "removed",
        "rewrite_tmp",
        "stale",
        "tmp",
        "unmovable",
        "written",
    )

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        #: A too-large file's copy (a temp in ``originals/``) where a rename is impossible ...
        self.copied: str | None = None
        #: ... or why it can be neither moved nor copied (it stays where it is).
        self.unmovable: str | None = None
        #: The original's name as settled, and the records' names.
        self.original = plan.original
        self.records = [r.name for r in plan.records]
        #: The dead-letter temps, written and made durable: the original's, each record's.
        self.original_tmp: str | None = None
        self.written: list[Written] = []
        #: ``REWRITE`` in a batch: the rewrite's temp, written and made durable before the lock.
        self.rewrite_tmp: str | None = None
        #: ``CREATE``: the new staging file's durable temp, then the name it gets.
        self.tmp: str | None = None
        self.created: str | None = None
        self.removed: list[str] = []
        self.left: dict[str, str] = {}
        self.stale: dict[str, str] = {}
        self.refused: str | None = None
        self.failed: str | None = None

    @property
    def key(self) -> str:
        return self.plan.key

    @property
    def action(self) -> Action:
        """A move whose file was copied (another file system) is a removal."""
        if self.plan.action is Action.MOVE and self.copied is not None:
            return Action.REMOVE
        return self.plan.action

    def settled(self) -> Settled:
        return Settled(self.key, tuple(self.records), self.original, self.created)

    def result(self, status: Status, **fields: object) -> Result:
        return Result(
            key=self.key,
            status=status,
            records=tuple(self.records),
            original=self.original,
            created=self.created if self.tmp is None else None,
            removed=tuple(self.removed),
            left=dict(self.left),
            stale=dict(self.stale),
            **fields,  # type: ignore[arg-type]
        )

    def change_result(self) -> Result:
        """The result of a ``CREATE`` or ``UNLINK`` plan."""
        if self.failed is not None:
            return self.result(Status.FAILED, reason=self.failed)
        if self.stale:
            gone = all(why == "gone" for why in self.stale.values())
            return self.result(Status.GONE if gone else Status.CHANGED)
        if self.refused is not None:
            return self.result(Status.REFUSED, reason=self.refused)
        return self.result(Status.DONE)
