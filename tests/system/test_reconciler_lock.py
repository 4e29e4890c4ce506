"""SPEC 5: while the reconciler holds ``canonical-writer.lock``, memstaged does nothing in that
memory dir, the work it does before taking the lock itself included.

Real processes: ``memstaged --once`` stopped (SIGSTOP, by the crash hook) in the middle of
writing a large quarantine's dead-letter temps, a reconciler stand-in that takes the lock
meanwhile, and inotify counting what appears in ``deadletter/`` once it holds it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from support.decision_log import read_events
from support.documents import staging_doc, write
from support.helpers import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_MODIFY,
    IN_MOVED_TO,
    Inotify,
    LockHolder,
    check_final,
    make_corpus,
    make_memory_dir,
    memstaged_env,
    once_stopped_at,
    project_root_of,
    run_once,
    write_inputs,
)

from memstaged.core.records import ORIGINALS_DIR

#: Records of the quarantine: far more than the 16 written under the lock, so that their temps
#: are written before it (and take a while on a busy machine).
_RECORDS = 2_000
#: The temp being created when memstaged is stopped: the original's, then 49 records'.
_STOP_AT = 50
#: The most temps written once the reconciler holds its lock: one look every 32 temps
#: (``transaction_temps.LOOK_EVERY``, as docs/reliability.md says; a number here, so that a
#: larger one in the code fails).
_UNDER_THE_LOCK = 32


class _TakenInPlace:
    """A reconciler that takes over a stale ``canonical-writer.lock`` in place: the same file
    (the same inode), truncated and naming a live process."""

    def __init__(self, lock: Path) -> None:
        self.lock = lock
        self.proc = subprocess.Popen(["sleep", "600"])
        with lock.open("r+") as fh:
            fh.truncate()
            fh.write(json.dumps({"pid": self.proc.pid, "started_at": _LONG_AGO}))

    def release(self) -> None:
        self.lock.unlink()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


_LONG_AGO = "2026-01-01T00:00:00.000Z"


@pytest.mark.parametrize("stale_first", [False, True])
def test_a_lock_taken_while_temps_are_written_stops_the_writing(
    tmp_path: Path, stale_first: bool
) -> None:
    """Issue 29 item 8: ``--once`` quarantining a file of 2,000 records writes their temps
    before it takes ``canonical-writer.lock``. Stopped when it creates its 50th temp, a
    reconciler stand-in takes the lock, and memstaged goes on: from then on at most
    ``LOOK_EVERY`` more files appear in ``deadletter/`` (it looks before every ``LOOK_EVERY``-th
    temp), where over a thousand did (the lock was read once, before the first temp; and again
    with ``LOOK_EVERY`` set to 10⁹). The temps
    made are removed, the file is logged ``deferred`` for the lock, the run exits 1 and the
    staging file is as it was. Once the reconciler lets go, the next run quarantines it: every
    record, the original, no temp left.

    ``stale_first``: a lock whose process is gone is there when the run starts (not obeyed,
    SPEC 5), and the reconciler takes it over in place, keeping its inode: the look past the
    stale lock went by its inode alone, and 19,800 temps of 20,000 were written under the live
    one."""
    mdir = make_memory_dir(tmp_path)
    doc = staging_doc(project_root_of(mdir), "many", candidates={"lessons": [{}] * _RECORDS})
    data = write(mdir / "staging" / "many.json", doc)
    os.utime(mdir / "staging" / "many.json", (1, 1))
    lock = mdir / "canonical-writer.lock"
    if stale_first:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        lock.write_text(json.dumps({"pid": dead.pid, "started_at": _LONG_AGO}))
        os.utime(lock, (1, 1))  # its ctime is now; the takeover's comes later still
    env = memstaged_env(tmp_path)
    store = mdir / "deadletter"
    run = _locked_midway(
        mdir,
        env,
        [store, store / ORIGINALS_DIR],
        (lambda: _TakenInPlace(lock)) if stale_first else (lambda: LockHolder(mdir)),
    )
    _check_stopped_under_the_lock(run.watch, run.stderr, run.code)
    assert (mdir / "staging" / "many.json").read_bytes() == data
    assert [p.name for p in store.rglob("*") if p.is_file()] == []  # the temps are removed
    assert [e["decision"] for e in run.decisions] == ["deferred"], run.decisions
    assert "canonical-writer.lock" in str(run.decisions[0]["reasons"]), run.decisions
    again = run_once(mdir, env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (mdir / "staging" / "many.json").exists()
    assert [p.read_bytes() for p in (store / ORIGINALS_DIR).iterdir()] == [data]
    assert len(list(store.glob("*.json"))) == _RECORDS
    assert not list(mdir.rglob(".memstaged~*"))


def test_a_lock_taken_while_a_batch_s_rewrites_are_written_stops_the_writing(
    tmp_path: Path,
) -> None:
    """SPEC 5: ``--once`` writes the rewrite temps of a transaction of many repairs before it
    takes ``canonical-writer.lock`` (one ``syncfs`` with the dead-letter temps). Stopped as it
    creates its 50th temp, a reconciler stand-in takes the lock, and memstaged goes on: from
    then on at most ``LOOK_EVERY`` more files appear in ``staging/``, the temps made are
    removed, every file is logged ``deferred`` (none decided), each is byte for byte as it was,
    and the run exits 1. Once the reconciler lets go, the next run repairs them all."""
    mdir = make_memory_dir(tmp_path)
    inputs = make_corpus(
        random.Random(5), 600, project_root_of(mdir), "rw-", kinds=("r1-empty-triggers",)
    )
    write_inputs(mdir / "staging", inputs)
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="0")
    run = _locked_midway(mdir, env, [mdir / "staging"], lambda: LockHolder(mdir))
    # Written: modified. A rewrite's temp is kept open for the look at it, and closed when the
    # transaction stops, after the lock was taken: a close, no write.
    _check_stopped_under_the_lock(run.watch, run.stderr, run.code, IN_MODIFY)
    assert {p.name: p.read_bytes() for p in (mdir / "staging").iterdir()} == {
        i.name: i.data for i in inputs
    }
    assert {e["decision"] for e in run.decisions} == {"deferred"}, run.decisions[:3]
    again = run_once(mdir, env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert check_final(mdir, inputs) == []
    assert not list(mdir.rglob(".memstaged~*"))


class _Run(NamedTuple):
    """What a run stopped midway for a reconciler's lock did (:func:`_locked_midway`)."""

    watch: Inotify
    stderr: bytes
    code: int | None
    decisions: list[dict[str, Any]]


def _locked_midway(
    mdir: Path,
    env: dict[str, str],
    watched: list[Path],
    take: Callable[[], LockHolder | _TakenInPlace],
) -> _Run:
    """``--once`` on ``mdir``, stopped (SIGSTOP, by the crash hook) as it creates its
    ``_STOP_AT``-th temp; a reconciler then takes the lock (``take``) and the
    run goes on to its end. What inotify saw in ``watched`` from then on, the run's stderr,
    exit code and decisions; the reconciler has let go before this returns."""
    proc = once_stopped_at(mdir, env, f"temp-created:{_STOP_AT}")
    holder: LockHolder | _TakenInPlace | None = None
    try:
        watch = Inotify(watched)
        holder = take()
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=300)
        watch.poll()
        watch.close()
        events = read_events(Path(env["MEMSTAGED_LOG_FILE"]), strict=False)
        holder.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if holder is not None:
            holder.kill()
    return _Run(watch, stderr, proc.returncode, [e for e in events if e.get("decision")])


def _check_stopped_under_the_lock(
    watch: Inotify, stderr: bytes, code: int | None, written_mask: int = IN_MODIFY | IN_CLOSE_WRITE
) -> None:
    """At most ``_UNDER_THE_LOCK`` files created and written (``written_mask``) in the store
    once the lock was held, some removed (the temps made before), and the run ended 1 without a
    traceback."""
    assert not watch.overflowed
    made = {(d, n) for d, n, mask in watch.log if mask & (IN_CREATE | IN_MOVED_TO)}
    written = {(d, n) for d, n, mask in watch.log if mask & written_mask}
    assert len(made) <= _UNDER_THE_LOCK, f"{len(made)} files created under the reconciler's lock"
    assert len(written) <= _UNDER_THE_LOCK, f"{len(written)} written under the reconciler's lock"
    assert any(mask & IN_DELETE for _, _, mask in watch.log)
    assert b"Traceback" not in stderr
    assert code == 1, stderr.decode(errors="replace")


def test_a_stale_own_lock_is_cleared_at_start_even_with_nothing_to_decide(
    tmp_path: Path,
) -> None:
    """Issue 10 item 12: memstaged's own ``canonical-writer.lock`` left by a killed run is removed
    as the next one starts, not only once a file is decided there."""
    mdir = make_memory_dir(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = mdir / "canonical-writer.lock"
    lock.write_text(
        json.dumps(
            {"pid": dead.pid, "started_at": "2026-01-01T00:00:00.000Z", "owner": "memstaged"}
        )
    )
    env = memstaged_env(tmp_path / "work")
    done = run_once(mdir, env)
    assert done.returncode == 0, done.stderr
    assert not lock.exists()
    log = Path(env["MEMSTAGED_LOG_FILE"]).read_text()
    assert '"lock_seen"' in log and "removed" in log
