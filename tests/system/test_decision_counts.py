"""Issue 21 items 3-5: counts that add up (SPEC 7: one version of one file is one decision), with
a real daemon (real process, real inotify): its look at its own rewrite is logged as such
(``own_rewrite``) and never counted, and a later ``--once`` takes what it decided as decided.

The same in this process: ``--once`` on the demo (tests/run/test_once.py), ``STATUS=``
(tests/daemon/test_daemon.py), deferrals as waits (tests/cli/commands/test_cmd_stats.py), the
candidates R4 dead-lettered found by a query for quarantines (tests/cli/commands/test_cmd_log.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.decision_log import decision_events, read_events
from support.helpers import DEMO, REPO, daemon, memstaged_cmd, memstaged_env, run_once
from support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("plain_output")


def test_the_daemon_logs_the_look_at_its_rewrite_and_a_later_once_decides_nothing(
    tmp_path: Path, memory_dir: Path
) -> None:
    """Issue 21 item 3, with a real daemon: a repair, then the daemon's look at its rewrite,
    logged ``own_rewrite``; after the daemon stops, ``--once`` takes every file as decided
    (``unchanged``) and logs nothing, and ``stats`` counts one decision per file."""
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    shutil.copy(DEMO / "session-valid.json", memory_dir / "staging")
    with daemon([memory_dir], env, "--settle", "0"):
        assert wait_for(lambda: len(decision_events(read_events(log, strict=False))) >= 1, 30)
        shutil.copy(DEMO / "session-no-triggers.json", memory_dir / "staging")
        assert wait_for(
            lambda: any(e.get("own_rewrite") for e in read_events(log, strict=False)), 30
        )
    decided = decision_events(read_events(log, strict=False))
    repaired = [e for e in decided if e["decision"] == "repaired"]
    looks = [e for e in decided if e.get("own_rewrite")]
    assert len(repaired) == len(looks) == 1
    assert looks[0]["decision"] == "valid"
    assert looks[0]["sha256"] == repaired[0]["rewrite_sha256"]
    before = len(read_events(log, strict=False))

    done = run_once(memory_dir, env, "--settle", "0")
    assert done.returncode == 0, done.stderr
    assert b"valid=2 " in done.stdout and b"total=2 unchanged=2" in done.stdout
    assert decision_events(read_events(log, strict=False)[before:]) == []

    done = run_once(memory_dir, env, "--settle", "0")  # and again: still nothing to decide
    assert b"total=2 unchanged=2" in done.stdout
    shown = subprocess.run(
        memstaged_cmd("stats", "--json"), env=env, capture_output=True, check=True, cwd=REPO
    )
    stats = json.loads(shown.stdout)
    assert stats["total"] == 2
    assert stats["decisions"]["repaired"] == 1
    assert stats["decisions"]["valid"] == 1
