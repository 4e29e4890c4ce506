"""memstaged's own rewrites (SPEC 1 and 7): each looked at once, and that look is no decision.

A repaired file is processed again when its rewrite is observed, and must then be valid. Where
the rewrite is observed when its name is next read (the daemon, which sees the exchange as an
event), the SHA-256 of each rewrite put in place and not looked at yet is remembered: the
version read there next with that hash is logged as memstaged's own look (``own_rewrite``),
never counted as a decision of the file (:func:`is_look`).

``--once`` looks at it without reading it back (``look_in_place``): the rewrite's bytes were
decided with the repair (:func:`~memstaged.core.decide.decide_and_look`), and the exchange that
put them in place saw them at their name afterwards (:attr:`Result.rewrite_seen
<memstaged.files.plan.Result.rewrite_seen>`). A rewrite not seen in place, or whose look is not
``valid``, is left to be read and decided as any file.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec

from memstaged.core.decide import Decision, Verdict
from memstaged.files.fsio import Identity
from memstaged.files.plan import Result
from memstaged.run.decision import DecisionEvent, Decisions, Outcome, describe

#: Rewrites remembered until they are looked at: more means a watcher that misses events, and
#: the oldest are then forgotten (a forgotten one is logged as a plain ``valid``, which
#: ``stats`` still tells from a decision by its ``rewrite_sha256``).
MAX_REWRITES: Final = 100_000


def is_look(rewrite: str | None, verdict: Verdict) -> bool:
    """Whether a version decided is memstaged's own rewrite (SHA-256 ``rewrite``), valid."""
    return rewrite is not None and rewrite == verdict.sha256 and verdict.decision is Decision.VALID


def log_look(
    decisions: Decisions, event: DecisionEvent, identity: Identity | None, started: float
) -> Outcome:
    """The look at memstaged's own rewrite, logged as what it is: no second decision (SPEC 7)."""
    decisions.finish(msgspec.structs.replace(event, own_rewrite=True), started)
    return Outcome(Decision.VALID, identity, own_rewrite=True)


class OwnRewrites:
    """The rewrites memstaged put in place and has not looked at yet, by (memory dir, name).

    ``look_in_place``: look at each as it is put in place, where it can be (``--once``).
    """

    def __init__(self, *, look_in_place: bool = False) -> None:
        self._sha256: dict[tuple[str, str], str] = {}
        self._look_in_place = look_in_place

    def take(self, memory_dir: str, name: str) -> str | None:
        """The rewrite memstaged put at ``name``, forgotten: what is read there now is either
        that rewrite or what replaced it."""
        return self._sha256.pop((memory_dir, name), None)

    def carried_out(
        self,
        decisions: Decisions,
        name: str,
        event: DecisionEvent,
        look: Verdict | None,
        result: Result,
    ) -> Outcome | None:
        """A decision carried out: for a repair, its rewrite looked at now (the look's
        outcome, logged), or remembered to be looked at when read (None)."""
        rewrite = event.rewrite_sha256
        if rewrite is None:
            return None
        if (
            self._look_in_place
            and result.rewrite_seen
            and look is not None
            and is_look(rewrite, look)
        ):
            seen = describe(look, path=event.path, memory_dir=event.memory_dir, dry_run=False)
            return log_look(decisions, seen, result.identity, time.perf_counter())
        if len(self._sha256) >= MAX_REWRITES:
            del self._sha256[next(iter(self._sha256))]
        self._sha256[(event.memory_dir, name)] = rewrite
        return None
