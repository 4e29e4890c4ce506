"""The metrics file's writer (:mod:`memstaged.daemon.metrics`) on a daemon driven by hand: when
it writes, and what it says when it cannot.

The metrics file written by real daemon processes, read back by another user and by a
collector, is in ``tests/system/test_metrics_file.py`` and ``tests/system/test_health.py``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from support.daemon_fakes import RecordingLogger, Rig, settings
from support.documents import write
from support.metrics import samples

from memstaged.daemon import metrics
from memstaged.daemon.watcher import Kind, Signal

pytestmark = pytest.mark.usefixtures("plain_output")


def test_metrics_are_written_only_after_a_change_and_at_most_every_few_seconds(
    tmp_path: Path, memory_dir: Path
) -> None:
    """Issue 21 item 7: idle, the metrics file sets no deadline (no wake-up); after an event it
    is written at once, then not again before MIN_INTERVAL (a deadline says when), and a
    failure to write it is logged once, not per attempt."""
    prom = tmp_path / "m.prom"
    base = settings(memory_dir)
    rig = Rig(msgspec.structs.replace(base, metrics_file=prom))
    daemon = rig.daemon
    tally = metrics.Tally(RecordingLogger())
    hook = metrics.Metrics(daemon, tally, rig.clock, started=1.0)
    daemon.hooks.append(hook)
    daemon.start()
    daemon.work()
    idle = daemon.next_rescan - rig.clock()
    daemon.keepalive()  # the first write: the daemon started
    assert prom.exists()
    first = prom.read_bytes()
    assert hook.deadline() is None
    assert daemon.timeout() == idle  # idle: the metrics add no wake-up

    tally.info("memory_dir_added", memory_dir=str(memory_dir))
    write(memory_dir / "staging" / "a.json", b"not json")
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "a.json"))
    daemon.keepalive()
    assert prom.read_bytes() == first  # within MIN_INTERVAL of the last write
    assert hook.deadline() == rig.clock() + metrics.MIN_INTERVAL
    rig.clock.advance(metrics.MIN_INTERVAL)
    daemon.keepalive()
    found = samples(prom)
    assert found["memstaged_deferrals_total"] == 1  # a wait, apart from the decisions (SPEC 7)
    assert "memstaged_decisions_total{decision=deferred}" not in found
    assert hook.deadline() is None

    prom.unlink()
    prom.mkdir()  # the path cannot be replaced by a file any more
    for _ in range(3):
        tally.info("rescan")
        rig.clock.advance(metrics.MIN_INTERVAL)
        daemon.keepalive()
    assert [e["event"] for e in rig.log.events if e["event"].startswith("metrics_")] == [
        "metrics_failed"
    ]
    daemon.shutdown()
