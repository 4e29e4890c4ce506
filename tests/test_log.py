"""The decision event as it reaches each sink: journal fields, the JSON-lines file, the console."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memstaged import log


def _event() -> dict[str, object]:
    return {
        "event": "decision",
        "decision": "quarantined",
        "path": "/p/.pi/memory/project/staging/a.json",
        "session_id": "s1",
        "reasons": ["schemaVersion: must be the number 1", "candidates: is missing"],
        "deadletter": ["deadletter/a-1-file.json"],
        "duration_ms": 1.5,
        "level": "warning",
        "timestamp": "2026-11-30T00:00:00Z",
    }


def test_journal_fields_map_one_to_one() -> None:
    """Every key becomes MEMSTAGED_<KEY>, lists as JSON text, plus MESSAGE/PRIORITY/MESSAGE_ID."""
    fields = log.journal_fields(_event())
    assert fields["MEMSTAGED_DECISION"] == "quarantined"
    assert fields["MEMSTAGED_SESSION_ID"] == "s1"
    assert json.loads(fields["MEMSTAGED_REASONS"]) == _event()["reasons"]
    assert fields["MEMSTAGED_DURATION_MS"] == "1.5"
    assert fields["PRIORITY"] == "4"  # a quarantine is a warning
    assert fields["MESSAGE"].startswith("quarantined /p/.pi/memory/project/staging/a.json: schema")
    assert "(+1 more)" in fields["MESSAGE"]
    assert fields["MESSAGE_ID"] == log.MESSAGE_IDS["decision"]
    assert len({*log.MESSAGE_IDS.values()}) == len(log.MESSAGE_IDS)


@pytest.mark.parametrize(
    ("decision", "level", "priority"),
    [("valid", "info", "6"), ("repaired", "info", "5"), ("deferred", "error", "3")],
)
def test_priority_fits_the_event(decision: str, level: str, priority: str) -> None:
    """Errors are errors whatever the decision; otherwise the decision sets the priority."""
    event = {**_event(), "decision": decision, "level": level}
    assert log.journal_fields(event)["PRIORITY"] == priority


def test_file_sink_writes_json_lines_with_mode_0600(tmp_path: Path) -> None:
    """The decision log file holds one JSON object per event and is private to its owner."""
    path = tmp_path / "state" / "decisions.jsonl"
    log.configure(path, console="off", journal="off")
    log.get_logger().warning("decision", decision="quarantined", path="x.json", reasons=["r"])
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["event"] == "decision"
    assert event["decision"] == "quarantined"
    assert event["level"] == "warning"
    assert event["timestamp"].endswith("Z")
    assert path.stat().st_mode & 0o777 == 0o600


def test_file_sink_rotates(tmp_path: Path) -> None:
    """The log is rotated by memstaged itself: backups appear, the newest file stays small."""
    path = tmp_path / "decisions.jsonl"
    log.configure(path, max_bytes=2000, backups=2, console="off", journal="off")
    for i in range(100):
        log.get_logger().info("decision", decision="valid", path=f"{i}.json")
    assert (tmp_path / "decisions.jsonl.1").exists()
    assert path.stat().st_size <= 2000


def test_values_msgspec_cannot_encode_still_log(tmp_path: Path) -> None:
    """A lone surrogate in a derived topic does not break logging."""
    path = tmp_path / "decisions.jsonl"
    log.configure(path, console="off", journal="off")
    log.get_logger().info("decision", repairs=[{"wrote": "\ud800"}])
    assert "\\ud800" in path.read_text()


def test_no_journal_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without JOURNAL_STREAM/INVOCATION_ID memstaged does not send to journald."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert log.journal_available() is False
