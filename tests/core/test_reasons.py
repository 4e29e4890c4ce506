"""Issue 21 items 1 and 2: a quarantine's reasons lead with the errors no repair fixes (SPEC 7).

The demo's ``session-bad-trigger.json`` lacks two category arrays (R5 adds them) and has a
trigger of type ``"regex"``, which nothing repairs: that trigger is why it is quarantined, and it
is what the log, the records, ``deadletter list``/``show``/``recover`` and ``stats`` must say
first. Every file here is decided by a real ``memstaged --once`` run; the old-log tests feed the
readers events and records as the previous version wrote them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Final

import pytest
from support.commands import json_lines, record_files, run
from support.decision_log import read_events
from support.helpers import DEMO

pytestmark = pytest.mark.usefixtures("plain_output")

TRIGGER: Final = (
    "candidates.lessons[0].triggers[0].type: must be one of path, filename, topic, tool, command"
)
MISSING: Final = ["candidates.decisions: is missing", "candidates.domain: is missing"]


@pytest.fixture
def bad_trigger(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path
) -> dict[str, Any]:
    """The demo's session-bad-trigger.json, decided by ``--once``; returns its decision event.
    (The demo's files name their project ``../example-project``, as this one is named.)"""
    shutil.copy(DEMO / "session-bad-trigger.json", memory_dir / "staging")
    code, _, _ = run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")
    assert code == 0
    (event,) = [e for e in read_events(log_file) if e.get("decision") == "quarantined"]
    return event


def test_the_logged_reasons_lead_with_the_error_no_repair_fixes(
    capsys: pytest.CaptureFixture[str], bad_trigger: dict[str, Any], memory_dir: Path
) -> None:
    """Issue 21 item 1: the event keeps every error, the trigger first, and marks the two that
    R5 would have fixed; ``memstaged log`` shows the trigger, not "decisions: is missing"."""
    assert bad_trigger["reasons"] == [TRIGGER, *MISSING]
    assert bad_trigger["repairable"] == MISSING
    code, out, _ = run(capsys, "log", "--decision", "quarantined")
    assert code == 0
    assert f"{TRIGGER} (+2 more, 2 repairable)" in out
    code, out, _ = run(capsys, "log", "--decision", "quarantined", "--reasons")
    lines = [line.strip() for line in out.splitlines()]
    assert lines[1:4] == [
        f"- {TRIGGER}",
        f"- {MISSING[0]} (a repair would fix this one)",
        f"- {MISSING[1]} (a repair would fix this one)",
    ]


def test_records_and_deadletter_commands_lead_with_the_error_no_repair_fixes(
    capsys: pytest.CaptureFixture[str], bad_trigger: dict[str, Any], memory_dir: Path
) -> None:
    """Issue 21 item 1: both records of the file (the bad lesson's and the valid preference's)
    say why they were dead-lettered: the trigger. ``list``, ``show`` and ``recover`` say it
    first; the missing categories are marked as what a repair would have fixed."""
    records = {
        name: json.loads((memory_dir / "deadletter" / name).read_text())["memstaged"]
        for name in record_files(memory_dir)
    }
    lesson = next(m for n, m in records.items() if "-lessons-0" in n)
    preference = next(m for n, m in records.items() if "-preferences-0" in n)
    assert lesson["errors"] == [TRIGGER, *MISSING]
    assert lesson["repairable"] == MISSING
    assert preference["errors"] == MISSING
    assert preference["repairable"] == MISSING
    assert preference["quarantined_for"] == TRIGGER

    code, out, _ = run(capsys, "deadletter", "list", "--memory-dir", str(memory_dir))
    assert code == 0
    listed = out.splitlines()
    assert len(listed) == 2
    assert all(TRIGGER in line and "is missing" not in line for line in listed)

    lesson_id = next(n for n in records if "-lessons-0" in n)[: -len(".json")]
    code, out, _ = run(capsys, "deadletter", "show", "--memory-dir", str(memory_dir), lesson_id)
    assert code == 0
    assert f"quarantined for: {TRIGGER}" in out
    assert f"  - {MISSING[0]}  (a repair would fix this one)" in out

    code, out, _ = run(
        capsys, "deadletter", "recover", "--memory-dir", str(memory_dir), "--all", "--json"
    )
    left = [o for o in json_lines(out) if o["action"] == "left"]
    assert [o["reason"] for o in left] == [f"cannot be made valid: {TRIGGER}"]


def _old_event(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as the previous version logged it: errors in the order found, no mark."""
    old = {k: v for k, v in event.items() if k != "repairable"}
    old["reasons"] = [*MISSING, TRIGGER]
    return old


def test_an_old_log_and_old_records_are_read_the_same_way(
    capsys: pytest.CaptureFixture[str],
    bad_trigger: dict[str, Any],
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 21 item 1, logs and records of the previous version: their errors are in the
    order they were found and carry no mark; an absent category (always repaired by R5) is
    read as repairable, so the trigger still comes first."""
    log_file.write_text(json.dumps(_old_event(bad_trigger)) + "\n")
    for name in record_files(memory_dir):
        path = memory_dir / "deadletter" / name
        record = json.loads(path.read_text())
        meta = record["memstaged"]
        meta.pop("repairable", None)
        meta.pop("quarantined_for", None)
        if "-lessons-0" in name:
            meta["errors"] = [*MISSING, TRIGGER]
        path.write_text(json.dumps(record))
    code, out, _ = run(capsys, "log", "--decision", "quarantined")
    assert code == 0
    assert f"{TRIGGER} (+2 more, 2 repairable)" in out
    code, out, _ = run(capsys, "deadletter", "list", "--memory-dir", str(memory_dir))
    assert code == 0
    lesson_line = next(line for line in out.splitlines() if "-lessons-0" in line)
    assert f"[malformed staging file: {TRIGGER}]" in lesson_line


def test_stats_counts_the_errors_that_quarantined_apart_from_those_repaired(
    capsys: pytest.CaptureFixture[str],
    bad_trigger: dict[str, Any],
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 21 item 2: the demo's staging files decided by ``--once``; ``stats`` counts the
    errors that quarantined a file (the trigger, the missing evidence, not JSON) apart from the
    repairs, by rule (R5's categories, R1's triggers): no "is missing" category causes a
    quarantine, and an old log's quarantine is counted the same way."""
    for name in ("session-no-triggers.json", "session-one-bad-lesson.json", "session-bom.json"):
        shutil.copy(DEMO / name, memory_dir / "staging")
    code, _, _ = run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")
    assert code == 0
    for old in (False, True):
        if old:  # the same decisions, the quarantine's reasons as the previous version logged
            log_file.write_text(
                "".join(
                    json.dumps(_old_event(e) if e.get("repairable") == MISSING else e) + "\n"
                    for e in read_events(log_file)
                )
            )
        code, out, _ = run(capsys, "stats", "--json")
        stats = json.loads(out)
        causes = {e["error"]: e["count"] for e in stats["top_errors"]}
        assert causes == {
            "candidates.lessons[].triggers[].type: must be one of path, filename, topic, tool, "
            "command": 1,
            "candidates.lessons[].source_evidence: is missing": 1,
        }, old
        repairs = {(r["rule"], r["where"]): r["count"] for r in stats["top_repairs"]}
        assert repairs[("R5", "candidates.domain")] == 2
        assert repairs[("R1", "candidates.lessons[].triggers")] == 1
        assert repairs[("R2", "(file)")] == 1
    code, out, _ = run(capsys, "stats")
    assert "errors that caused a quarantine" in out
    assert "repairs by rule" in out
