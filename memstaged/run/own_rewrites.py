"""memstaged's own rewrites (SPEC 1 and 7): each looked at once, and that look is no decision.

A repaired file is processed again when its rewrite is observed, and must then be valid. The
rewrite is observed when its name is next read (the daemon sees the exchange as an event;
``--once`` reads it back as its transaction puts it in place, or, when it is not found there as
written, once its other files are decided): the SHA-256 of each rewrite
put in place and not looked at yet is remembered, and the version read there next with that
hash is logged as memstaged's own look (``own_rewrite``), never counted as a decision of the
file (:func:`is_look`). It is read, not taken on trust from the exchange that put it there: a
writer may have written into it since, keeping its size and putting its mtime back.
"""

from __future__ import annotations

from typing import Final

import msgspec

from memstaged.core.decide import Decision, Verdict
from memstaged.files.fsio import Identity
from memstaged.run.decision import DecisionEvent, Decisions, Outcome

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
    """The rewrites memstaged put in place and has not looked at yet, by (memory dir, name)."""

    def __init__(self) -> None:
        self._sha256: dict[tuple[str, str], str] = {}
        #: Those taken in the transaction under way: remembered again if its lines are lost.
        self._taken: dict[tuple[str, str], str] = {}

    def remember(self, memory_dir: str, name: str, sha256: str) -> None:
        if len(self._sha256) >= MAX_REWRITES:
            del self._sha256[next(iter(self._sha256))]
        self._sha256[(memory_dir, name)] = sha256

    def take(self, memory_dir: str, name: str) -> str | None:
        """The rewrite memstaged put at ``name``, forgotten: what is read there now is either
        that rewrite or what replaced it."""
        sha256 = self._sha256.pop((memory_dir, name), None)
        if sha256 is not None:
            self._taken[(memory_dir, name)] = sha256
        return sha256

    def settled(self, *, logged: bool) -> None:
        """The end of a transaction: if its decision lines could not all be written, what it
        took is remembered again, so that the look its files wait for is logged as a look."""
        if not logged:
            for (memory_dir, name), sha256 in self._taken.items():
                self.remember(memory_dir, name, sha256)
        self._taken.clear()
