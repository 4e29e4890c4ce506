"""Issue 21 items 3-5: counts that add up (SPEC 7: one version of one file is one decision).

memstaged's look at its own rewrite is logged as such (``own_rewrite``) and never counted, by the
daemon (real process, real inotify), by ``--once`` and by ``stats``; a later run holds what was
decided, rewrites included; a deferral is a wait, shown apart; a query for quarantines finds the
candidates R4 dead-lettered from a file that was repaired.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
from support.commands import json_lines, run
from support.daemon_fakes import Rig, settings
from support.decision_log import read_events
from support.documents import lesson, staging_doc, write
from support.helpers import REPO, daemon, memstaged_cmd, memstaged_env, run_once
from support.waiting import wait_for

from memstaged.daemon.watcher import Kind, Signal

pytestmark = pytest.mark.usefixtures("plain_output")

DEMO: Final = REPO / "examples" / "memory-dir" / "staging"


def _decisions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "decision"]


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
        assert wait_for(lambda: len(_decisions(read_events(log, strict=False))) >= 1, 30)
        shutil.copy(DEMO / "session-no-triggers.json", memory_dir / "staging")
        assert wait_for(
            lambda: any(e.get("own_rewrite") for e in read_events(log, strict=False)), 30
        )
    decided = _decisions(read_events(log, strict=False))
    repaired = [e for e in decided if e["decision"] == "repaired"]
    looks = [e for e in decided if e.get("own_rewrite")]
    assert len(repaired) == len(looks) == 1
    assert looks[0]["decision"] == "valid"
    assert looks[0]["sha256"] == repaired[0]["rewrite_sha256"]
    before = len(read_events(log, strict=False))

    done = run_once(memory_dir, env, "--settle", "0")
    assert done.returncode == 0, done.stderr
    assert b"valid=2 " in done.stdout and b"total=2 unchanged=2" in done.stdout
    assert _decisions(read_events(log, strict=False)[before:]) == []

    done = run_once(memory_dir, env, "--settle", "0")  # and again: still nothing to decide
    assert b"total=2 unchanged=2" in done.stdout
    shown = subprocess.run(
        memstaged_cmd("stats", "--json"), env=env, capture_output=True, check=True, cwd=REPO
    )
    stats = json.loads(shown.stdout)
    assert stats["total"] == 2
    assert stats["decisions"]["repaired"] == 1
    assert stats["decisions"]["valid"] == 1


def test_a_second_once_on_the_demo_decides_nothing_again(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path
) -> None:
    """Issue 21 item 3, the demo: ``--once`` repairs three files and looks at each rewrite
    (logged ``own_rewrite``, not counted); a second run reads none of them again (it said
    ``unchanged=2`` and logged three ``valid`` decisions)."""
    for path in DEMO.iterdir():
        shutil.copy(path, memory_dir / "staging")
    code, out, _ = run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")
    assert code == 0
    assert "valid=1 repaired=3 quarantined=3 foreign=1 deferred=0 skipped=0 total=8" in out
    first = _decisions(read_events(log_file))
    assert sum(1 for e in first if e.get("own_rewrite")) == 3
    code, out, _ = run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")
    assert code == 0
    assert "total=5 unchanged=5" in out
    assert _decisions(read_events(log_file)) == first
    code, out, _ = run(capsys, "log", "--decision", "valid")
    assert len(out.splitlines()) == 1  # session-valid.json: the looks are no decisions
    code, out, _ = run(capsys, "log", "--path", "session-bom.json")
    assert "memstaged's own rewrite, looked at again: valid (not a new decision)" in out


def test_status_counts_a_repair_and_the_look_at_its_rewrite_once(
    project: Path, memory_dir: Path
) -> None:
    """Issue 21 item 3, ``STATUS=``: a repaired file and the daemon's look at its rewrite are
    one decision."""
    rig = Rig(settings(memory_dir))
    rig.daemon.start()
    rig.daemon.work()
    doc = staging_doc(project)
    del doc["candidates"]["lessons"][0]["triggers"]
    write(memory_dir / "staging" / "r.json", doc)
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "r.json"))
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "r.json"))  # the rewrite, seen
    assert rig.log.decisions("r.json") == ["repaired", "valid"]
    rig.after(1)
    status = [m[0] for m in rig.notes.messages if m[0].startswith("STATUS=")][-1]
    assert (
        status == "STATUS=watching 1 memory dirs; 1 decided, 0 quarantined, 1 repaired, 0 waiting"
    )


def test_deferrals_are_waits_shown_apart_with_the_oldest(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 21 item 4: a file deferred by two runs (the reconciler's lock is held) is not two
    decisions: ``stats`` totals the decisions alone and shows the waits apart, with the file
    still waiting and how long it has waited."""
    write(memory_dir / "staging" / "wait.json", staging_doc(project, "wait"))
    lock = memory_dir / "canonical-writer.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "owner": "reconciler"}))
    for _ in range(2):
        code, _, _ = run(capsys, "--once", "--memory-dir", str(memory_dir))
        assert code == 1
    code, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert "deferred" not in stats["decisions"]
    assert stats["total"] == 0
    assert stats["waits"]["deferrals"] == 2
    assert stats["waits"]["files"] == 1
    assert stats["waits"]["waiting"] == 1
    assert stats["waits"]["oldest_path"] == str(memory_dir / "staging" / "wait.json")
    assert stats["waits"]["oldest_seconds"] >= 0
    code, out, _ = run(capsys, "stats")
    assert "# waits: deferred, not decisions" in out
    assert "deferrals\t2" in out
    assert "oldest still waiting\t" in out and "wait.json" in out


def test_a_query_for_quarantines_finds_the_candidates_r4_dead_lettered(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 21 item 5: with split_invalid_candidates, a file with one bad lesson is repaired
    and its bad lesson dead-lettered; ``log --decision quarantined`` finds it."""
    bad = lesson(triggers=[{"type": "regex", "value": "x"}])
    write(
        memory_dir / "staging" / "split.json",
        staging_doc(project, "split", candidates={"lessons": [lesson(), bad]}),
    )
    write(memory_dir / "staging" / "ok.json", staging_doc(project, "ok"))
    config = tmp_path / "config.toml"
    config.write_text("split_invalid_candidates = true\n")
    code, _, _ = run(capsys, "--once", "--config", str(config), "--memory-dir", str(memory_dir))
    assert code == 0
    code, out, _ = run(capsys, "log", "--json", "--decision", "quarantined")
    assert code == 0
    [found] = json_lines(out)
    assert found["path"].endswith("split.json")
    assert found["decision"] == "repaired"
    assert found["partly_quarantined"] is True
    assert any(d.endswith("-lessons-1.json") for d in found["deadletter"])
    code, out, _ = run(capsys, "log", "--decision", "quarantined")
    assert "split.json" in out
