"""What a transaction of :mod:`memstaged.files.transaction` did so far with one of its plans.

A :class:`~memstaged.files.plan.Plan` is never changed once built: the names the transaction
settles, the temps it writes, what it created, removed or left, and why a plan was not carried out
are kept here, one :class:`PlanState` per plan, and handed back as a frozen
:class:`~memstaged.files.plan.Result`.
"""

from __future__ import annotations

from memstaged.files.deadletter_names import Written
from memstaged.files.plan import Action, Plan, Result, Settled, Status


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
