"""What deciding a file came to, as the flow hands it back to its drivers.

``--once``, the daemon, its scheduler and the seen cache read an :class:`Outcome`; none of them
needs the pipeline that made it, so the value lives apart from it.
"""

from __future__ import annotations

import msgspec

from memstaged.core.decide import Decision
from memstaged.files.fsio import Identity
from memstaged.files.memdir import MemoryDir


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
