"""Reading the decision log back (:mod:`memstaged.log.reader`): journal entries turned back into
the events logged, and the file followed across a rotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.commands import write_log
from support.decision_log import read_events

from memstaged.log.format import journal_fields
from memstaged.log.reader import FileSource, event_from_journal, ordered

pytestmark = pytest.mark.usefixtures("plain_output")


@pytest.mark.usefixtures("store")
def test_journal_fields_round_trip(log_file: Path) -> None:
    """Every logged event, turned into journal fields the way log/writer.py sends them and back,
    is the same event: the journal source and the file source agree without a journald."""
    events = read_events(log_file)
    assert events
    for event in events:
        fields: dict[str, Any] = journal_fields(dict(event))
        back = event_from_journal(fields)
        assert back is not None
        assert ordered(back) == ordered(event)
    assert event_from_journal({"MESSAGE": "a line of stderr"}) is None


def test_follow_reads_on_across_a_rotation(tmp_path: Path) -> None:
    """When the log is rotated while followed, the rest of the old file and then the new file
    are read: no event is skipped or repeated."""
    path = tmp_path / "decisions.jsonl"
    write_log(path, [{"event": "a"}])
    source = FileSource(path, poll=0)
    try:
        assert [e["event"] for e in source.iter_history()] == ["a"]
        with path.open("a", encoding="utf-8") as fh:
            fh.write('{"event": "b"}\n')
        path.rename(tmp_path / "decisions.jsonl.1")
        write_log(path, [{"event": "c"}, {"event": "d"}])
        seen = []
        for event in source.follow(stop=lambda: False):
            seen.append(event["event"])
            if len(seen) == 3:
                break
        assert seen == ["b", "c", "d"]
    finally:
        source.close()
