"""``memstaged stats``: counts per decision, memory dir and period; frequent errors; stuck files."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.commands import (
    BAD_TRIGGER,
    json_lines,
    one_line_error,
    prepare,
    redated,
    run,
    write_log,
)
from support.decision_log import read_events
from support.documents import lesson, one_of_each, staging_doc, write

from memstaged.cli.commands import _common
from memstaged.cli.commands.stats import compute, error_key
from memstaged.cli.main import main
from memstaged.log.reader import EventFilter

OLD_DAY = "2026-01-01T10:00:00.000000Z"


pytestmark = pytest.mark.usefixtures("plain_output")


def _stats(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, "stats", "--json", *argv)
    assert code == 0, err
    [result] = json_lines(out)
    return result


def _local_day(timestamp: str, fmt: str = "%Y-%m-%d") -> str:
    return dt.datetime.fromisoformat(timestamp).astimezone().strftime(fmt)


def test_counts_per_decision_memory_dir_and_day(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Each decision of a real --once run is counted once, under its memory dir and its day
    (memstaged's look at fixme.json's rewrite is not a second decision); the errors that
    quarantined files are counted apart from the repairs, by rule (issue 21 item 2)."""
    prepare(project, memory_dir, log_file)
    result = _stats(capsys)
    assert result["decisions"] == {
        "valid": 1,
        "repaired": 1,
        "quarantined": 2,
        "foreign": 1,
        "skipped": 0,
    }
    assert result["total"] == 5
    assert result["not_counted"] == 1
    assert result["memory_dirs"] == {str(memory_dir): result["decisions"]}
    today = _local_day(read_events(log_file)[0]["timestamp"])
    assert result["periods"] == {today: result["decisions"]}
    errors = {e["error"]: e["count"] for e in result["top_errors"]}
    # mixed.json's lessons[1] lacks triggers, which R1 would have added: not why it went
    assert errors == {
        "candidates.lessons[].triggers[].type: must be one of path, filename, topic, "
        "tool, command": 1,
        "not JSON": 1,
    }
    repairs = {(r["rule"], r["where"]): r["count"] for r in result["top_repairs"]}
    assert repairs == {
        ("R3", "produced_at"): 1,
        ("R1", "candidates.lessons[].triggers"): 1,
    }
    assert result["stuck"] == []


def test_window_and_hours(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """--since leaves out older events (here: a rotated file dated months back); --by hour
    buckets per local hour."""
    prepare(project, memory_dir, log_file)
    # Other versions of the same files, decided months back (the same version decided again
    # would be one decision: issue 21 item 3).
    old = [
        {**e, "sha256": "0" * 64} if "sha256" in e else e
        for e in redated(read_events(log_file), OLD_DAY)
    ]
    write_log(log_file.with_name(log_file.name + ".1"), old)
    everything = _stats(capsys)
    assert everything["total"] == 10
    assert _local_day(OLD_DAY) in everything["periods"]
    recent = _stats(capsys, "--since", "1d")
    assert recent["total"] == 5
    assert _local_day(OLD_DAY) not in recent["periods"]
    assert recent["since"] is not None
    hours = _stats(capsys, "--by", "hour", "--until", "2026-01-02")
    assert hours["total"] == 5
    assert list(hours["periods"]) == [_local_day(OLD_DAY, "%Y-%m-%d %H:00")]


def test_top_errors_add_up_across_indexes(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """The same fault at lessons[0] in one file and lessons[1] in another counts twice, and
    --top limits the list."""
    staging = memory_dir / "staging"
    write(
        staging / "a.json",
        staging_doc(project, "a", candidates={"lessons": [lesson(triggers=BAD_TRIGGER)]}),
    )
    write(
        staging / "b.json",
        staging_doc(project, "b", candidates={"lessons": [lesson(), lesson(triggers=BAD_TRIGGER)]}),
    )
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    result = _stats(capsys, "--top", "1")
    assert result["top_errors"] == [
        {
            "error": "candidates.lessons[].triggers[].type: must be one of path, filename, topic, "
            "tool, command",
            "count": 2,
        }
    ]


def test_stuck_files_are_deferred_longer_than_the_threshold(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """A file deferred (here: the reconciler's lock is held) shows up as stuck once it has been
    deferred longer than --stuck-after, with why; once decided it is no longer stuck."""
    write(memory_dir / "staging" / "wait.json", staging_doc(project, "wait"))
    lock = memory_dir / "canonical-writer.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "owner": "reconciler"}))
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 1
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 1
    assert _stats(capsys, "--stuck-after", "1h")["stuck"] == []
    later = _common.now() + 2 * 3600
    monkeypatch.setattr(_common, "now", lambda: later)
    [stuck] = _stats(capsys, "--stuck-after", "1h")["stuck"]
    assert stuck["path"] == str(memory_dir / "staging" / "wait.json")
    assert stuck["deferrals"] == 2
    assert stuck["exists"] is True
    assert stuck["reason"] == f"canonical-writer.lock is held by live pid {os.getpid()}"
    assert stuck["for_seconds"] > 3600
    lock.unlink()
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    assert _stats(capsys, "--stuck-after", "1h")["stuck"] == []


def test_plain_output_has_every_section(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Without --json, each section is a titled block of tab-separated rows."""
    prepare(project, memory_dir, log_file)
    code, out, _ = run(capsys, "stats")
    assert code == 0
    for title in (
        "# decisions",
        "# waits",
        "# per memory dir",
        "# per day",
        "# most frequent",
        "# repairs by rule",
        "# stuck",
    ):
        assert title in out
    assert "quarantined\t2" in out


@pytest.mark.parametrize(
    "argv", [["--stuck-after", "soon"], ["--by", "week"], ["--since", "yesterday-ish"]]
)
def test_bad_options(capsys: pytest.CaptureFixture[str], argv: list[str], log_file: Path) -> None:
    """Bad durations, periods and times are exit 2 with one line."""
    code, _, err = run(capsys, "stats", *argv)
    assert code == 2
    one_line_error(err)


def test_error_key_and_compute_are_pure() -> None:
    """Error keys drop indexes and input-specific tails; compute needs no file and no clock."""
    assert error_key("candidates.domain[12].source_evidence: is missing") == (
        "candidates.domain[].source_evidence: is missing"
    )
    assert error_key("not UTF-8 (invalid byte at offset 7)") == "not UTF-8"
    events: list[dict[str, Any]] = [
        {
            "event": "decision",
            "decision": "deferred",
            "path": "/m/staging/a.json",
            "memory_dir": "/m",
            "timestamp": "2026-01-01T00:00:00Z",
            "reasons": ["held"],
        },
        {"event": "start", "timestamp": "2026-01-01T00:00:01Z"},
    ]
    clock = dt.datetime(2026, 1, 1, 1, tzinfo=dt.UTC).timestamp()
    result = compute(
        events, window=EventFilter(), stuck_after=60, clock=clock, exists=lambda _p: False
    )
    assert result.total == 0  # a deferral is a wait, not a decision (issue 21 item 4)
    assert (result.waits.deferrals, result.waits.files, result.waits.waiting) == (1, 1, 0)
    [stuck] = result.stuck
    assert (stuck.deferrals, stuck.exists, stuck.for_seconds) == (1, False, 3600.0)


def test_dry_run_decisions_are_marked_and_never_counted(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 6 (SPEC 7): after ``--once --dry-run``, ``log`` shows every decision
    marked ``(dry run)`` and ``stats`` counts none of them as decisions (it counts them apart);
    after a real run, they count."""
    one_of_each(project, memory_dir)
    assert run(capsys, "--once", "--dry-run", "--memory-dir", str(memory_dir))[0] == 0
    _, out, _ = run(capsys, "log", "--decision", "quarantined")
    assert "quarantined (dry run)" in out
    _, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert stats["total"] == 0 and stats["decisions"]["quarantined"] == 0
    assert stats["dry_run"] == 4
    assert run(capsys, "--once", "--memory-dir", str(memory_dir))[0] == 0
    stats = json.loads(run(capsys, "stats", "--json")[1])
    assert stats["decisions"]["quarantined"] == 1 and stats["total"] == 4


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
