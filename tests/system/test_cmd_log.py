"""``memstaged log``: the decision log, filtered, from the file (rotated ones too) or journald."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pytest
from support import systemd_env
from support.commands import (
    json_lines,
    logged,
    one_line_error,
    prepare,
    redated,
    run,
    write_log,
)
from support.documents import staging_doc, write

from memstaged.cli.main import main
from memstaged.log.format import journal_fields
from memstaged.log.reader import FileSource, event_from_journal, ordered
from memstaged.log.writer import JOURNAL_SOCKET

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
    assert json_lines(out) == [ordered(e) for e in logged(prepared)]
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
    events = logged(prepared)
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
    assert json_lines(out) == [ordered(e) for e in logged(prepared)[-2:]]


def test_broken_lines_are_skipped_and_counted(
    capsys: pytest.CaptureFixture[str], prepared: Path
) -> None:
    """A line that is not a JSON event is skipped with a note on stderr, never a traceback; a
    last line without its newline (still being written) is not read yet."""
    events = logged(prepared)
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


def test_journal_fields_round_trip(prepared: Path) -> None:
    """Every logged event, turned into journal fields the way log/writer.py sends them and back,
    is the same event: the journal source and the file source agree without a journald."""
    events = logged(prepared)
    assert events
    for event in events:
        fields: dict[str, Any] = journal_fields(dict(event))
        back = event_from_journal(fields)
        assert back is not None
        assert ordered(back) == ordered(event)
    assert event_from_journal({"MESSAGE": "a line of stderr"}) is None


# -- --follow -----------------------------------------------------------------------------------


def _lines_of(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _next_line(lines: queue.Queue[str], want: str, timeout: float = 30.0) -> str:
    """The next line of the follower's output that contains ``want``, or fail after timeout."""
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"log --follow printed no line with {want!r} within {timeout}s")
        if want in line:
            return line


def test_follow_prints_an_event_written_after_it_started(
    project: Path, memory_dir: Path, prepared: Path
) -> None:
    """--follow prints the recent history, then an event logged after it started (read from the
    same open file, no polling race), as JSON lines a script can read one by one."""
    env = {**os.environ, "MEMSTAGED_LOG_FILE": str(prepared)}
    argv = [sys.executable, "-m", "memstaged", "log", "--follow", "--json", "--decision", "valid"]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_lines_of, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            assert "good.json" in _next_line(lines, '"decision":"valid"')  # the history
            write(memory_dir / "staging" / "late.json", staging_doc(project, "late"))
            assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
            line = _next_line(lines, "late.json")
            [event] = json_lines(line)
            assert event["decision"] == "valid"
            assert event["session_id"] == "late"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            reader.join(timeout=30)
    assert not reader.is_alive()


# -- journald -------------------------------------------------------------------------------------


def _journal_or_skip() -> str:
    """``harness`` when a private journald can run here, ``host`` when this machine has one."""
    reason = systemd_env.unavailable_reason()
    if reason is None:
        return "harness"
    if Path(JOURNAL_SOCKET).exists():
        return "host"
    pytest.skip(
        f"no journald socket on this machine: {JOURNAL_SOCKET} is missing, and the "
        f"private journald of tests/support/systemd_env.py cannot run here ({reason})"
    )


def _journal_decisions(directory: str | None, memory_dir: Path) -> int:
    from systemd import journal

    reader = journal.Reader(path=directory) if directory else journal.Reader()
    try:
        reader.add_match(SYSLOG_IDENTIFIER="memstaged", MEMSTAGED_MEMORY_DIR=str(memory_dir))
        return sum(1 for entry in reader if entry.get("MEMSTAGED_EVENT") == "decision")
    finally:
        reader.close()


@pytest.mark.systemd
def test_journal_gives_the_same_output_as_the_file(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """A memstaged run under systemd logs to journald and to the file; ``log --journal`` (through
    systemd.journal.Reader) then prints byte for byte what ``log`` prints from the file."""
    where = _journal_or_skip()
    staging = memory_dir / "staging"
    write(staging / "good.json", staging_doc(project, "good"))
    fixme = staging_doc(project, "fix")
    del fixme["candidates"]["lessons"][0]["triggers"]
    write(staging / "fixme.json", fixme)
    write(staging / "broken.json", b"{not json")
    argv = [
        sys.executable,
        "-m",
        "memstaged",
        "--once",
        "--settle",
        "0",
        "--memory-dir",
        str(memory_dir),
    ]
    if where == "harness":
        with systemd_env.user_systemd() as sd:
            done = sd.run(
                "systemd-run",
                "--user",
                "--wait",
                "--quiet",
                "--collect",
                f"--setenv=MEMSTAGED_LOG_FILE={log_file}",
                *argv,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            journal_dir: str | None = str(sd.journal_dir)
            systemd_env.wait_until(
                lambda: _journal_decisions(journal_dir, memory_dir) >= 4,
                timeout=30,
                what="3 decisions and the look at the rewrite in the journal",
            )
            journal = _log_json(
                capsys,
                "--journal",
                "--journal-dir",
                str(journal_dir),
                "--memory-dir",
                str(memory_dir),
            )
    else:
        env = {
            **os.environ,
            "INVOCATION_ID": os.urandom(16).hex(),
            "MEMSTAGED_LOG_FILE": str(log_file),
        }
        assert subprocess.run(argv, env=env, check=False, timeout=60).returncode == 0
        systemd_env.wait_until(
            lambda: _journal_decisions(None, memory_dir) >= 4,
            timeout=30,
            what="3 decisions and the look at the rewrite in the journal",
        )
        journal = _log_json(capsys, "--journal", "--memory-dir", str(memory_dir))
    from_file = _log_json(capsys, "--memory-dir", str(memory_dir))
    assert len(json_lines(from_file)) == 4  # fixme.json's rewrite is looked at (own_rewrite)
    assert journal == from_file


def _log_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run(capsys, "log", "--json", *argv)
    assert code == 0, err
    return out


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


def test_repairs_are_named_by_rule_r5_last_escaped() -> None:
    """Issue 13 (a repaired line says which repair): the one-line form groups the repairs by
    rule in the order seen, R5 (an added category) last, at most three places a rule; what it
    prints is escaped, and a hand-edited log with a list for a rule prints, not raises."""
    from memstaged import safe_text

    items = [{"rule": "R5", "where": c} for c in ("a", "b", "c", "d")]
    items += [{"rule": "R1", "where": f"candidates.lessons[{i}].triggers"} for i in range(2)]
    items.append({"rule": "R3", "where": "produced_at\x1b[2J"})
    assert safe_text.repairs(items) == (
        "R1 at candidates.lessons[0].triggers, candidates.lessons[1].triggers; "
        "R3 at produced_at\\x1b[2J; R5 at a, b, c (+1 more)"
    )
    assert safe_text.repairs([{"rule": ["R1"], "where": "x"}]) == "['R1'] at x"
