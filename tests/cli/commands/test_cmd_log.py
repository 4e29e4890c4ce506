"""``memstaged log``: the decision log, filtered, from the file (rotated ones too).

``--follow`` as a process of its own and ``--journal`` (journald) are in
``tests/system/test_cmd_log_processes.py``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.commands import (
    dated_decisions,
    json_lines,
    one_line_error,
    prepare,
    redated,
    run,
    write_log,
)
from support.decision_log import read_events
from support.documents import lesson, staging_doc, write

from memstaged.cli.main import main
from memstaged.log.reader import ordered

THREE_DAYS_AGO = "2026-01-01T10:00:00.000000Z"


pytestmark = pytest.mark.usefixtures("plain_output")


@pytest.fixture
def prepared(project: Path, memory_dir: Path, log_file: Path) -> Path:
    prepare(project, memory_dir, log_file)
    return log_file


def _decisions(out: str) -> list[tuple[str, str]]:
    return [(Path(e["path"]).name, e["decision"]) for e in json_lines(out)]


def test_json_prints_every_event_as_logged(
    capsys: pytest.CaptureFixture[str], prepared: Path
) -> None:
    """--json gives back exactly the events of the log file, in order, keys in one fixed order."""
    code, out, _ = run(capsys, "log", "--json")
    assert code == 0
    assert json_lines(out) == [ordered(e) for e in read_events(prepared)]
    assert list(json_lines(out)[0])[:3] == ["timestamp", "level", "event"]


def test_decision_filter_is_repeatable(capsys: pytest.CaptureFixture[str], prepared: Path) -> None:
    """--decision selects decision events only, any of the decisions given."""
    _, out, _ = run(capsys, "log", "--json", "--decision", "quarantined")
    assert sorted(_decisions(out)) == [
        ("broken.json", "quarantined"),
        ("mixed.json", "quarantined"),
    ]
    _, out, _ = run(capsys, "log", "--json", "--decision", "foreign", "--decision", "valid")
    assert sorted(_decisions(out)) == [("good.json", "valid"), ("other.json", "foreign")]


def test_unknown_decision_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A decision that does not exist is exit 2 with one line naming the choices."""
    code, _, err = run(capsys, "log", "--decision", "lost")
    assert code == 2
    assert "invalid choice" in one_line_error(err)


def test_path_session_and_memory_dir_filters(
    capsys: pytest.CaptureFixture[str], prepared: Path, memory_dir: Path, tmp_path: Path
) -> None:
    """--path matches a file name or a full path (globs), --session a session_id, --memory-dir
    the memory dir the event is about."""
    _, out, _ = run(capsys, "log", "--json", "--path", "fix*")  # the look at its rewrite too
    assert _decisions(out) == [("fixme.json", "repaired"), ("fixme.json", "valid")]
    _, out, _ = run(capsys, "log", "--json", "--path", str(memory_dir / "staging" / "good.json"))
    assert _decisions(out) == [("good.json", "valid")]
    _, out, _ = run(capsys, "log", "--json", "--session", "mix*")
    assert _decisions(out) == [("mixed.json", "quarantined")]

    other = tmp_path / "second" / ".pi" / "memory" / "project"
    (other / "staging").mkdir(parents=True)
    write(other / "staging" / "s.json", staging_doc(tmp_path / "second", "second"))
    assert main(["--once", "--memory-dir", str(other)]) == 0
    _, out, _ = run(capsys, "log", "--json", "--memory-dir", str(other))
    assert _decisions(out) == [("s.json", "valid")]
    _, out, _ = run(capsys, "log", "--json", "--decision", "valid", "--memory-dir", str(memory_dir))
    assert _decisions(out) == [("good.json", "valid")]


def test_time_window_and_rotated_files(capsys: pytest.CaptureFixture[str], prepared: Path) -> None:
    """Rotated files are read oldest first; --since/--until take durations or ISO times."""
    events = read_events(prepared)
    old = redated([e for e in events if e.get("decision") == "valid"], THREE_DAYS_AGO)
    write_log(prepared.with_name(prepared.name + ".2"), old)
    write_log(prepared.with_name(prepared.name + ".1"), [])
    _, out, _ = run(capsys, "log", "--json")
    assert json_lines(out) == [ordered(e) for e in old + events]

    _, out, _ = run(capsys, "log", "--json", "--since", "1d")
    assert json_lines(out) == [ordered(e) for e in events]
    _, out, _ = run(capsys, "log", "--json", "--until", "2026-01-02")
    assert json_lines(out) == [ordered(e) for e in old]
    _, out, _ = run(
        capsys,
        "log",
        "--json",
        "--since",
        "2025-12-31T00:00:00+00:00",
        "--until",
        "2026-01-01T11:00Z",
    )
    assert len(json_lines(out)) == len(old)


@pytest.mark.parametrize("option", ["--since", "--until"])
def test_bad_time_is_a_usage_error(capsys: pytest.CaptureFixture[str], option: str) -> None:
    """A time that is neither a duration nor ISO: exit 2, one line naming the option."""
    code, _, err = run(capsys, "log", option, "last tuesday")
    assert code == 2
    assert option in one_line_error(err)


def test_reasons_in_full(capsys: pytest.CaptureFixture[str], prepared: Path) -> None:
    """Without --reasons a repaired decision names its repairs on its one line (issue 13: a
    repaired line says which repair), not what they wrote; with it, every validation error and
    every repair, with what it wrote."""
    _, short, _ = run(capsys, "log", "--path", "fixme.json", "--decision", "repaired")
    assert "repaired by R3 at produced_at; R1 at candidates.lessons[0].triggers" in short
    assert short.count("\n") == 1
    assert '"type":"topic"' not in short
    _, full, _ = run(capsys, "log", "--reasons", "--path", "fixme.json")
    assert "- produced_at: is not a timestamp" in full
    assert "repair R3 at produced_at:" in full
    assert "repair R1 at candidates.lessons[0].triggers:" in full
    assert '"type":"topic"' in full


def test_lines_keeps_the_last_n(capsys: pytest.CaptureFixture[str], prepared: Path) -> None:
    """-n N prints only the last N matching events."""
    _, out, _ = run(capsys, "log", "--json", "-n", "2")
    assert json_lines(out) == [ordered(e) for e in read_events(prepared)[-2:]]


def test_broken_lines_are_skipped_and_counted(
    capsys: pytest.CaptureFixture[str], prepared: Path
) -> None:
    """A line that is not a JSON event is skipped with a note on stderr, never a traceback; a
    last line without its newline (still being written) is not read yet."""
    events = read_events(prepared)
    with prepared.open("ab") as fh:
        fh.write(b"garbage\n[1, 2]\n")
        fh.write(b'{"event": "decision", "decision": "valid", "pa')
    code, out, err = run(capsys, "log", "--json")
    assert code == 0
    assert json_lines(out) == [ordered(e) for e in events]
    assert "skipped 2 lines" in one_line_error(err)


def test_no_log_yet(capsys: pytest.CaptureFixture[str], log_file: Path) -> None:
    """Before memstaged ever ran there is nothing to show: exit 0 and a note."""
    code, out, err = run(capsys, "log")
    assert code == 0
    assert out == ""
    assert "no decision log" in one_line_error(err)


def test_lines_reverse_and_journalctl_words_for_days(
    capsys: pytest.CaptureFixture[str], log_file: Path
) -> None:
    """Issue 13: one line per event; ``-n``, ``--reverse`` and ``--since today/yesterday``
    (local midnight, as journalctl takes them), ``--until today``."""
    now = time.time()
    lt = time.localtime(now)
    midnight = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))
    dated_decisions(log_file, [midnight - 40 * 3600, midnight - 12 * 3600, now])

    def names(out: str) -> list[str]:  # time, decision, project label, file name (issue 22)
        return [line.split()[4] for line in out.splitlines()]

    assert names(run(capsys, "log")[1]) == ["f0.json", "f1.json", "f2.json"]
    assert names(run(capsys, "log", "--reverse")[1]) == ["f2.json", "f1.json", "f0.json"]
    assert names(run(capsys, "log", "-n", "2")[1]) == ["f1.json", "f2.json"]
    assert names(run(capsys, "log", "-n", "2", "--reverse")[1]) == ["f2.json", "f1.json"]
    assert names(run(capsys, "log", "--since", "today")[1]) == ["f2.json"]
    assert names(run(capsys, "log", "--since", "yesterday")[1]) == ["f1.json", "f2.json"]
    assert names(run(capsys, "log", "--until", "today")[1]) == ["f0.json", "f1.json"]
    code, _, err = run(capsys, "log", "--follow", "--reverse")
    assert code == 2 and "exclude" in one_line_error(err)


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
