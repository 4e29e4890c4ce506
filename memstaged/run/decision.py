"""What deciding a file came to: its ``decision`` log event (SPEC 7) and its :class:`Outcome`.

A :class:`DecisionEvent` is a value: the pipeline builds it here, :func:`describe` from the verdict
when the file is decided, and every later change makes a new one (:func:`name_settled` when the
transaction announces the plan with the dead-letter names it really uses, the file layer knowing
nothing of this schema; :func:`abandoned` when a plan is not carried out). :class:`Decisions`
logs each event once, at its level and with its duration, and builds the events of the decisions
no verdict made (a skip, a wait, an error). The pipeline hands each file's :class:`Outcome` back
to its drivers: ``--once``, the daemon, its scheduler and the seen cache, none of which needs the
pipeline that made it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from memstaged.core import digests
from memstaged.core.decide import Decision, Verdict
from memstaged.core.records import ORIGINALS_DIR
from memstaged.core.repair import Repair
from memstaged.errors import os_reason
from memstaged.files.fsio import Identity
from memstaged.files.memdir import DEADLETTER, MemoryDir, Options
from memstaged.files.plan import Plan, Settled

if TYPE_CHECKING:
    from memstaged.log.writer import Logged

__all__ = [
    "Batch",
    "DecisionEvent",
    "Decisions",
    "Outcome",
    "abandoned",
    "describe",
    "name_settled",
]


class DecisionEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One decision's ``decision`` log event (SPEC 7), its fields in the order they are logged
    (the logger adds ``event``, ``level`` and ``timestamp`` after them).

    A field at its default is not logged: ``dry_run`` only in a dry run, what a verdict says
    (``session_id`` to ``deadletter``) only once the bytes were decided, ``planned`` only for a
    decision announced and then not carried out. Never changed: a change is a new event
    (``msgspec.structs.replace``).
    """

    path: str
    memory_dir: str
    dry_run: bool = False
    #: The traceback of an internal error that left the file as it is (deferred).
    traceback: str | None = None
    decision: Decision
    #: Logged (``null`` when the file names none) once the bytes were decided, else not at all.
    session_id: str | UnsetType | None = UNSET
    sha256: str | None = None
    size: int | None = None
    #: Validation errors, or why deferred or skipped: logged even when there are none.
    reasons: tuple[str, ...]
    #: For ``quarantined``: the reasons a repair would have fixed, the last ones.
    repairable: tuple[str, ...] = ()
    repairs: tuple[Repair, ...] = ()
    #: An R4 repair put candidates in ``deadletter/``: a query for quarantines finds them
    #: (``journalctl MEMSTAGED_DECISION=quarantined + MEMSTAGED_PARTLY_QUARANTINED=true``).
    partly_quarantined: bool = False
    #: The SHA-256 of the version memstaged puts in place: its look at it is told from a decision.
    rewrite_sha256: str | None = None
    #: The files written under ``deadletter/``, as they are really called once announced.
    deadletter: tuple[str, ...] = ()
    #: memstaged's look at its own rewrite (SPEC 1): not a decision again.
    own_rewrite: bool = False
    duration_ms: float | None = None
    #: The decision announced (and logged) before it was not carried out.
    planned: Decision | None = None

    def fields(self) -> dict[str, Any]:
        """The event as the logger's keyword arguments: JSON values (lists, a repair as a dict)
        in the order of the fields, those at their default left out."""
        fields: dict[str, Any] = msgspec.to_builtins(self)
        for key, value in fields.items():
            if isinstance(value, tuple):  # to_builtins keeps tuples: a list, as it always was
                fields[key] = list(value)
        return fields


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
    #: A repair whose rewrite was looked at in place as it was put there, that look logged:
    #: ``identity`` is the rewrite's, decided (``valid``) and not to be looked at again.
    looked: bool = False


class Batch:
    """The files of one transaction and their outcomes; true while it has files."""

    def __init__(self, mdir: MemoryDir) -> None:
        self.mdir = mdir
        self.outcomes: dict[str, Outcome] = {}

    def __bool__(self) -> bool:
        return bool(self.outcomes)


def describe(verdict: Verdict, *, path: str, memory_dir: str, dry_run: bool) -> DecisionEvent:
    """The log event of a file decided (SPEC 7): what its verdict says."""
    new_bytes = verdict.new_bytes
    records = tuple(r.name for r in verdict.deadletter)
    return DecisionEvent(
        path=path,
        memory_dir=memory_dir,
        dry_run=dry_run,
        decision=verdict.decision,
        session_id=verdict.session_id,
        sha256=verdict.sha256,
        size=verdict.size,
        reasons=verdict.reasons,
        repairable=verdict.repairable,
        repairs=verdict.repairs,
        partly_quarantined=any(r.rule == "R4" for r in verdict.repairs),
        rewrite_sha256=None if new_bytes is None else digests.sha256(new_bytes).hexdigest(),
        deadletter=_deadletter(records, verdict.original),
    )


def name_settled(event: DecisionEvent, plan: Plan, settled: Settled) -> DecisionEvent:
    """The event naming the dead-letter files as they are really called (SPEC 7).

    The names planned may be taken (SPEC 4: nothing under ``deadletter/`` is trusted); an R6
    repair then names the file that really holds the original (SPEC 3, R6).
    """
    names = _deadletter(settled.records, settled.original)
    if names:
        event = msgspec.structs.replace(event, deadletter=names)
    if plan.original is None or settled.original in (None, plan.original):
        return event
    before = f"{DEADLETTER}/{ORIGINALS_DIR}/{plan.original}"
    after = f"{DEADLETTER}/{ORIGINALS_DIR}/{settled.original}"
    repairs = tuple(_original_renamed(r, before, after) for r in event.repairs)
    return msgspec.structs.replace(event, repairs=repairs)


def abandoned(
    event: DecisionEvent, decision: Decision, reason: str, *, announced: bool
) -> DecisionEvent:
    """The event of a planned decision that was not carried out: what it became, and why.

    Nothing of the plan was done, so it names no repairs and no dead-letter files; an announced
    one (whose decision is in the log already) says what was ``planned`` (SPEC 5: logged before,
    never carried out unlogged).
    """
    return msgspec.structs.replace(
        event,
        decision=decision,
        reasons=(*event.reasons, reason),
        repairs=(),
        deadletter=(),
        planned=event.decision if announced else None,
    )


#: Decisions that leave the file as it is: one whose line is not in the log has not happened.
_LEFT_AS_IT_IS: Final = frozenset({Decision.VALID, Decision.FOREIGN, Decision.SKIPPED})


def unlogged(outcomes: dict[str, Outcome], retry_at: float) -> dict[str, Outcome]:
    """A transaction's outcomes when some of its decision lines could not be written: a file
    left as it was decided (``valid``, ``foreign``, ``skipped``) has no decision until one is
    logged (SPEC 7), so it is deferred as by an error and decided again once the log can be
    written; a look at memstaged's own rewrite stays a look, not counted, and a repair's look
    taken in place is not one yet: its rewrite waits to be looked at. What was carried out was
    logged durably first, or not carried out (:func:`durable`)."""
    return {
        name: (
            Outcome(
                Decision.DEFERRED,
                retry_at=retry_at,
                error=True,
                own_rewrite=outcome.own_rewrite,
            )
            if outcome.decision in _LEFT_AS_IT_IS
            else msgspec.structs.replace(outcome, looked=False)
        )
        for name, outcome in outcomes.items()
    }


def io_error_reason(err: OSError) -> str:
    """The reason of a file an I/O error stopped: it is retried."""
    return f"I/O error, will retry: {os_reason(err)}"


class Decisions:
    """What deciding each file came to: its ``decision`` event logged (SPEC 7), once, at its
    level and with its duration, and its :class:`Outcome` handed back.

    The event of a file decided is :func:`describe`'s; those of the decisions no verdict made (a
    file skipped, a wait, an I/O or internal error) are built here. A file an error stopped is
    deferred, at the earliest until the settle time has passed, and its outcome says it was an
    error (retried with a growing backoff). An announced plan's events are logged in
    :attr:`durable`'s block: on disk before any of the plan is carried out (SPEC 5).
    """

    def __init__(
        self,
        logger: Any,
        clock: Callable[[], float],
        options: Callable[[], Options],
        durable_log: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self._log = logger
        self._clock = clock
        #: The settings in force (a reload replaces them): a dry run, the settle time.
        self._options = options
        #: The events logged in its block are durable when it ends, or it raises
        #: :class:`~memstaged.errors.LogUnwritable`: the decision log's
        #: :func:`memstaged.log.writer.durable` (a test's recording logger has none).
        self.durable = durable_log if durable_log is not None else _durable_decision_log
        #: The events logged in its block go into the decision log file in one write
        #: (:func:`memstaged.log.writer.one_write`): a transaction's.
        self.one_write = _one_write_decision_log

    def final(
        self,
        mdir: MemoryDir,
        name: str,
        decision: Decision,
        reason: str,
        *,
        started: float = 0.0,
    ) -> Outcome:
        """A decision no verdict made (a skip, a wait), logged: nothing more is done with it."""
        self.finish(self._event(mdir, name, decision, reason), started)
        return Outcome(decision)

    def io_error(self, mdir: MemoryDir, name: str, err: OSError, started: float = 0.0) -> Outcome:
        """A file an I/O error stopped deciding: deferred, logged at level error."""
        return self.failed(mdir, name, io_error_reason(err), started)

    def failed(
        self,
        mdir: MemoryDir,
        name: str,
        reason: str,
        started: float,
        trace: str | None = None,
    ) -> Outcome:
        """A file an error stopped deciding (``trace``: an internal error's traceback), left as
        it is: deferred, logged at level error."""
        event = self._event(mdir, name, Decision.DEFERRED, reason, trace)
        self.finish(event, started, error=True)
        retry_at = self._clock() + self._options().settle
        return Outcome(Decision.DEFERRED, retry_at=retry_at, error=True)

    def finish(self, event: DecisionEvent, started: float, *, error: bool = False) -> DecisionEvent:
        """Log the event with its duration since ``started`` (none if 0); returns it as logged."""
        if started:
            duration = round((time.perf_counter() - started) * 1000, 3)
            event = msgspec.structs.replace(event, duration_ms=duration)
        self.emit(event, error=error)
        return event

    def emit(self, event: DecisionEvent, *, error: bool = False) -> None:
        """The event at its level: ``error`` for an error that stopped a decision, ``warning``
        for a quarantine, ``info`` for the rest."""
        if error:
            self._log.error("decision", **event.fields())
        elif event.decision is Decision.QUARANTINED:
            self._log.warning("decision", **event.fields())
        else:
            self._log.info("decision", **event.fields())

    def staging_linked(self, mdir: MemoryDir) -> None:
        """A memory dir whose ``staging/`` is a symbolic link, logged: none of its files is
        decided (SPEC 6: a link is never followed)."""
        self.emit(
            DecisionEvent(
                path=mdir.staging,
                memory_dir=mdir.path,
                decision=Decision.SKIPPED,
                reasons=("staging/ is a symbolic link: never followed",),
                dry_run=self._options().dry_run,  # SPEC 7: a dry run's decisions are marked
            )
        )

    def _event(
        self,
        mdir: MemoryDir,
        name: str,
        decision: Decision,
        reason: str,
        trace: str | None = None,
    ) -> DecisionEvent:
        """The log event of a decision no verdict made (a skip, a wait, an error): its reason,
        and an internal error's traceback."""
        return DecisionEvent(
            path=os.path.join(mdir.staging, name),
            memory_dir=mdir.path,
            dry_run=self._options().dry_run,
            traceback=trace,
            decision=decision,
            reasons=(reason,),
        )


def _deadletter(records: tuple[str, ...], original: str | None) -> tuple[str, ...]:
    """The dead-letter files' names as the log gives them: the records', then the original's."""
    names = tuple(f"{DEADLETTER}/{r}" for r in records)
    if original is None:
        return names
    return (*names, f"{DEADLETTER}/{ORIGINALS_DIR}/{original}")


def _original_renamed(repair: Repair, before: str, after: str) -> Repair:
    """An R6 repair naming the original ``after`` where it named it ``before``."""
    wrote = repair.wrote
    if isinstance(wrote, dict) and wrote.get("original") == before:
        return msgspec.structs.replace(repair, wrote={**wrote, "original": after})
    return repair


def _durable_decision_log() -> AbstractContextManager[object]:
    from memstaged.log.writer import durable

    return durable()


def _one_write_decision_log() -> AbstractContextManager[Logged]:
    from memstaged.log.writer import one_write

    return one_write()
