"""What deciding a file came to: its ``decision`` log event (SPEC 7) and its :class:`Outcome`.

The pipeline builds each event here, :func:`describe` from the verdict when the file is decided
and :func:`name_settled` when the transaction announces the plan with the dead-letter names it
really uses (the file layer knows nothing of this schema), and hands each file's
:class:`Outcome` back to its drivers: ``--once``, the daemon, its scheduler and the seen cache,
none of which needs the pipeline that made it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from memstaged.core import digests
from memstaged.core.decide import Decision, Verdict
from memstaged.core.records import ORIGINALS_DIR
from memstaged.files.fsio import Identity
from memstaged.files.memdir import DEADLETTER, MemoryDir
from memstaged.files.plan import Plan, Settled


class Outcome(msgspec.Struct, frozen=True):
    """What happened to one file: the decision, the version it was about, when to look again."""

    decision: Decision
    identity: Identity | None = None
    #: For ``deferred``: the earliest wall-clock time worth looking again (None: on the next event).
    retry_at: float | None = None
    #: The file changed while it was being decided: decide it again now.
    changed: bool = False
    #: Deferred because a live process holds ``canonical-writer.lock``: retry when it goes.
    blocked_by_lock: bool = False
    #: Deferred by an error (an I/O error carrying the decision out, a file too large to move):
    #: retried with a growing backoff, as a file that cannot be read is, never at once.
    error: bool = False
    #: memstaged's look at its own rewrite (SPEC 1): logged as such, never a decision again.
    own_rewrite: bool = False


class Batch:
    """The files of one transaction and their outcomes; true while it has files."""

    def __init__(self, mdir: MemoryDir) -> None:
        self.mdir = mdir
        self.outcomes: dict[str, Outcome] = {}

    def __bool__(self) -> bool:
        return bool(self.outcomes)


def describe(event: dict[str, Any], verdict: Verdict) -> None:
    """Put what a verdict says into the decision's log event (SPEC 7)."""
    event.update(
        decision=verdict.decision.value,
        session_id=verdict.session_id,
        sha256=verdict.sha256,
        size=verdict.size,
        reasons=list(verdict.reasons),
    )
    if verdict.repairable:  # reasons that a repair would fix: the last ones (SPEC 7)
        event["repairable"] = list(verdict.repairable)
    if verdict.repairs:
        event["repairs"] = [msgspec.to_builtins(r) for r in verdict.repairs]
        if any(r.rule == "R4" for r in verdict.repairs):
            # Candidates went to deadletter/: a query for quarantines finds them:
            # journalctl MEMSTAGED_DECISION=quarantined + MEMSTAGED_PARTLY_QUARANTINED=true
            event["partly_quarantined"] = True
    if verdict.new_bytes is not None:
        # Names the version memstaged puts in place: its look at it is told from a decision.
        event["rewrite_sha256"] = digests.sha256(verdict.new_bytes).hexdigest()
    names = [f"{DEADLETTER}/{r.name}" for r in verdict.deadletter]
    if verdict.original is not None:
        names.append(f"{DEADLETTER}/{ORIGINALS_DIR}/{verdict.original}")
    if names:
        event["deadletter"] = names


def name_settled(event: dict[str, Any], plan: Plan, settled: Settled) -> None:
    """The log names the dead-letter files as they are really called (SPEC 7).

    The names planned may be taken (SPEC 4: nothing under ``deadletter/`` is trusted); an R6
    repair then names the file that really holds the original (SPEC 3, R6).
    """
    names = [f"{DEADLETTER}/{r}" for r in settled.records]
    if settled.original is not None:
        names.append(f"{DEADLETTER}/{ORIGINALS_DIR}/{settled.original}")
    if names:
        event["deadletter"] = names
    if plan.original is None or settled.original in (None, plan.original):
        return
    before = f"{DEADLETTER}/{ORIGINALS_DIR}/{plan.original}"
    after = f"{DEADLETTER}/{ORIGINALS_DIR}/{settled.original}"
    for repair in event.get("repairs", ()):
        wrote = repair.get("wrote")
        if isinstance(wrote, dict) and wrote.get("original") == before:
            wrote["original"] = after
