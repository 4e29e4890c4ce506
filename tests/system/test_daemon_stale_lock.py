"""The daemon and a reconciler's lock whose holder dies: a real process holds it, then is killed.

The daemon is driven by hand as in ``tests/daemon/test_daemon.py`` (synthetic signals, a fake
clock); only the lock's holder is a process of its own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.daemon_fakes import complete_signal, reconciler_lock, started_rig
from support.documents import repairable_doc, write

from memstaged.daemon.loop import LOCK_POLL


def test_lock_of_a_dead_process_is_reported_and_not_obeyed(project: Path, memory_dir: Path) -> None:
    """A holder that dies without removing its lock does not block memstaged for ever: the
    waiting files are decided at the next lock poll, the stale lock is logged and, not being
    memstaged's, left in place."""
    holder = subprocess.Popen(["sleep", "60"])
    try:
        rig = started_rig(memory_dir)
        lock = reconciler_lock(memory_dir, pid=holder.pid)
        path = memory_dir / "staging" / "r.json"
        write(path, repairable_doc(project))
        rig.send(complete_signal(memory_dir, "r.json"))
        assert rig.log.decisions("r.json") == ["deferred"]
    finally:
        holder.kill()
        holder.wait()
    assert rig.after(LOCK_POLL) == 1
    assert rig.log.decisions("r.json") == ["deferred", "repaired"]
    seen = rig.log.named("lock_seen")
    assert seen and seen[0]["alive"] is False and seen[0]["action"] == "not obeyed"
    assert lock.exists()
