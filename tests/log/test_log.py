"""The decision event as it reaches each sink: journal fields, the JSON-lines file, the console."""

from __future__ import annotations

import datetime
import errno
import io
import itertools
import json
import logging
import logging.handlers
import os
import re
import threading
from pathlib import Path

import pytest
from support.decision_log import decisions, read_events
from support.documents import backlog
from support.shown_names import unquote

from memstaged.cli.main import main
from memstaged.log import writer
from memstaged.log.format import MESSAGE_IDS, journal_fields
from memstaged.log.rotated_file import FileSink


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
    fields = journal_fields(_event())
    assert fields["MEMSTAGED_DECISION"] == "quarantined"
    assert fields["MEMSTAGED_SESSION_ID"] == "s1"
    assert json.loads(fields["MEMSTAGED_REASONS"]) == _event()["reasons"]
    assert fields["MEMSTAGED_DURATION_MS"] == "1.5"
    assert fields["PRIORITY"] == "4"  # a quarantine is a warning
    assert fields["MESSAGE"].startswith("quarantined /p/.pi/memory/project/staging/a.json: schema")
    assert "(+1 more)" in fields["MESSAGE"]
    assert fields["MESSAGE_ID"] == MESSAGE_IDS["decision"]
    assert len({*MESSAGE_IDS.values()}) == len(MESSAGE_IDS)


@pytest.mark.parametrize(
    ("decision", "level", "priority"),
    [("valid", "info", "6"), ("repaired", "info", "5"), ("deferred", "error", "3")],
)
def test_priority_fits_the_event(decision: str, level: str, priority: str) -> None:
    """Errors are errors whatever the decision; otherwise the decision sets the priority."""
    event = {**_event(), "decision": decision, "level": level}
    assert journal_fields(event)["PRIORITY"] == priority


def test_file_sink_writes_json_lines_with_mode_0600(tmp_path: Path) -> None:
    """The decision log file holds one JSON object per event and is private to its owner."""
    path = tmp_path / "state" / "decisions.jsonl"
    writer.configure(path, console="off", journal="off")
    writer.get_logger().warning("decision", decision="quarantined", path="x.json", reasons=["r"])
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
    writer.configure(path, max_bytes=2000, backups=2, console="off", journal="off")
    for i in range(100):
        writer.get_logger().info("decision", decision="valid", path=f"{i}.json")
    assert (tmp_path / "decisions.jsonl.1").exists()
    assert path.stat().st_size <= 2000


def test_values_msgspec_cannot_encode_still_log(tmp_path: Path) -> None:
    """A lone surrogate in a derived topic does not break logging."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, console="off", journal="off")
    writer.get_logger().info("decision", repairs=[{"wrote": "\ud800"}])
    assert "\\ud800" in path.read_text()


def test_no_journal_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without JOURNAL_STREAM/INVOCATION_ID memstaged does not send to journald."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert writer.journal_available() is False


# -- the file sink: rotation, threads, errors ------------------------------------------------------


def _files(path: Path, backups: int) -> list[Path]:
    """The log's files, oldest first: ``.N`` … ``.1``, then the current one."""
    rotated = [Path(f"{path}.{i}") for i in range(backups, 0, -1)]
    return [p for p in rotated if p.exists()] + [path]


def test_rotation_matches_rotating_file_handler_byte_for_byte(tmp_path: Path) -> None:
    """The same lines give the same files, byte for byte, as logging's RotatingFileHandler: each
    line whole in one file, a file rotated when it plus the next line would reach max_bytes, no
    more than ``backups`` old files, and every file 0600 (the handler left new files to the
    umask)."""
    path = tmp_path / "ours" / "decisions.jsonl"
    writer.configure(path, max_bytes=1000, backups=3, console="off", journal="off")
    for i in range(200):
        writer.get_logger().info("decision", decision="valid", path=f"{i}.json", pad="x" * (i % 37))
    writer.close()
    ours = _files(path, 5)
    assert [p.name for p in ours] == [
        "decisions.jsonl.3",
        "decisions.jsonl.2",
        "decisions.jsonl.1",
        "decisions.jsonl",
    ]
    data = [p.read_bytes() for p in ours]
    assert all(d.endswith(b"\n") and len(d) < 1000 for d in data)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in ours)
    kept = [json.loads(line)["path"] for d in data for line in d.splitlines()]
    assert kept == [f"{i}.json" for i in range(200 - len(kept), 200)]  # the newest, in order

    # Replay every line that reached the files through the standard library's handler.
    theirs = tmp_path / "theirs" / "decisions.jsonl"
    theirs.parent.mkdir()
    handler = logging.handlers.RotatingFileHandler(theirs, maxBytes=1000, backupCount=3)
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("t", logging.INFO, __file__, 0, "", None, None)
    first = len(kept)  # lines of the events before the kept ones, rebuilt from a fresh run
    writer.configure(tmp_path / "all.jsonl", console="off", journal="off")
    for i in range(200):
        writer.get_logger().info("decision", decision="valid", path=f"{i}.json", pad="x" * (i % 37))
    writer.close()
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    # The timestamps differ from the first run: give the kept lines their original text.
    lines[-first:] = [line for d in data for line in d.decode().splitlines()]
    for line in lines:
        record.msg = line
        handler.emit(record)
    handler.close()
    assert [p.read_bytes() for p in _files(theirs, 5)] == data


def test_rotation_details(tmp_path: Path) -> None:
    """A line longer than max_bytes is written whole into a file of its own (an empty file is not
    rotated away); with backups=0 the file just grows; the files ``.N`` stop at ``backups``."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, max_bytes=300, backups=2, console="off", journal="off")
    logger = writer.get_logger()
    logger.info("decision", path="big", pad="y" * 400)
    assert [json.loads(x)["path"] for x in path.read_text().splitlines()] == ["big"]
    assert not Path(f"{path}.1").exists()
    logger.info("decision", path="small")
    assert json.loads(Path(f"{path}.1").read_text())["path"] == "big"
    assert json.loads(path.read_text())["path"] == "small"
    for i in range(50):
        logger.info("decision", path=f"{i}")
    assert not Path(f"{path}.3").exists()

    # Exactly at the limit: 50 + 50 bytes reach max_bytes=100, so the second line starts a new
    # file (RotatingFileHandler's ">="); 50 + 49 stay together.
    exact = tmp_path / "exact.jsonl"
    sink = FileSink(exact, 100, 1)
    for line in (b"a" * 49 + b"\n", b"b" * 49 + b"\n", b"c" * 48 + b"\n"):
        sink.emit({}, line)
    sink.close()
    assert Path(f"{exact}.1").read_bytes() == b"a" * 49 + b"\n"
    assert exact.read_bytes() == b"b" * 49 + b"\n" + b"c" * 48 + b"\n"

    grows = tmp_path / "grows.jsonl"
    writer.configure(grows, max_bytes=300, backups=0, console="off", journal="off")
    for i in range(50):
        writer.get_logger().info("decision", path=f"{i}")
    assert len(grows.read_text().splitlines()) == 50
    assert not Path(f"{grows}.1").exists()


def test_a_rotation_by_another_process_is_followed(tmp_path: Path) -> None:
    """Two writers of one file (the daemon and ``--once``): whoever finds it full rotates it once,
    the other follows to the new file, and no line is lost or split."""
    path = tmp_path / "decisions.jsonl"
    one = FileSink(path, 2000, 50)
    two = FileSink(path, 2000, 50)
    for i in range(400):
        line = json.dumps({"event": "decision", "n": i}).encode() + b"\n"
        (one if i % 3 else two).emit({}, line)
    one.close()
    two.close()
    files = _files(path, 50)
    data = [p.read_bytes() for p in files]
    assert all(d.endswith(b"\n") and len(d) < 2000 for d in data)
    numbers = [json.loads(line)["n"] for d in data for line in d.splitlines()]
    assert numbers == list(range(400))
    # Each file holds as many lines as fit: rotated exactly when the next line would not.
    for older, newer in itertools.pairwise(data):
        assert len(older) + len(newer.splitlines(keepends=True)[0]) >= 2000


def test_a_logger_kept_across_configure_writes_to_the_new_file(tmp_path: Path) -> None:
    """The daemon keeps its logger; a reload that changes log_file re-configures: the kept (and
    cached) logger writes to the new file."""
    logger = writer.get_logger()
    writer.configure(tmp_path / "a.jsonl", console="off", journal="off")
    logger.info("start")
    writer.configure(tmp_path / "b.jsonl", console="off", journal="off")
    logger.info("reload", ok=True)
    assert [json.loads(x)["event"] for x in (tmp_path / "a.jsonl").read_text().splitlines()] == [
        "start"
    ]
    assert json.loads((tmp_path / "b.jsonl").read_text())["event"] == "reload"


def test_two_threads_never_interleave_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker thread and the main thread logging at once: every line (file and console) is one
    whole JSON event, none lost, each thread's in its order, across rotations too."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, max_bytes=200_000, backups=50, console="on", journal="off")
    per_thread = 3000
    start = threading.Barrier(2)

    def emit(name: str) -> None:
        logger = writer.get_logger()
        start.wait()
        for i in range(per_thread):
            logger.info("decision", thread=name, n=i, path=f"/p/{name}/{i}.json", pad="z" * 40)

    worker = threading.Thread(target=emit, args=("worker",))
    worker.start()
    emit("main")
    worker.join()
    writer.close()
    files = _files(path, 50)
    assert len(files) > 2
    for lines in (
        [line for p in files for line in p.read_text().splitlines()],
        capsys.readouterr().err.splitlines(),
    ):
        events = [json.loads(line) for line in lines]
        assert len(events) == 2 * per_thread
        for name in ("worker", "main"):
            assert [e["n"] for e in events if e["thread"] == name] == list(range(per_thread))


def test_timestamps_are_structlogs_iso_utc_text() -> None:
    """The same text as ``TimeStamper(fmt="iso", utc=True)``: six digits of microseconds, none
    when they are 0, ``Z`` for UTC; the clock floored to the microsecond like ``datetime.now``."""
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    for ns in (
        0,
        999,
        1_796_058_000_000_000_999,
        1_796_058_000_123_456_789,
        1_796_058_059_999_999_999,
    ):
        stamp = writer._UtcStamper(clock=itertools.repeat(ns).__next__)(None, "info", {})[
            "timestamp"
        ]
        when = epoch + datetime.timedelta(microseconds=ns // 1000)
        assert stamp == when.isoformat().replace("+00:00", "Z")
    # On the real clock: between two readings of datetime.now, as TimeStamper would read it.
    before = datetime.datetime.now(datetime.UTC)
    stamp = writer._UtcStamper()(None, "info", {})["timestamp"]
    after = datetime.datetime.now(datetime.UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", stamp)
    assert before <= datetime.datetime.fromisoformat(stamp) <= after


def test_a_closed_console_is_reported_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A console that is gone gives one line on stderr, no traceback, and the file still gets
    every event."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, console="off", journal="off")
    closed = io.StringIO()
    writer.add_sink(writer.ConsoleSink(closed))
    closed.close()
    for i in range(5):
        writer.get_logger().info("decision", path=f"{i}.json")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "memstaged: console log (stderr): I/O operation on closed file; events go on "
        "to the other sinks (said once, until it works again)"
    ]
    assert len(path.read_text().splitlines()) == 5


def test_a_line_is_never_written_into_a_file_rotated_away(tmp_path: Path) -> None:
    """Issue 19 item 6: another process rotates the shared log more than ``backups`` times
    between two lines of this one; the next line lands in the file the path names (it used to
    go, for up to a second, into the old file, deleted by then, and was lost)."""
    path = tmp_path / "decisions.jsonl"
    daemon = FileSink(path, 300, 2)
    once = FileSink(path, 300, 2)
    daemon.emit({}, b'{"n":"daemon-1"}\n')
    for i in range(40):  # ~ 12 rotations: the daemon's file is rotated out and deleted
        once.emit({}, json.dumps({"n": f"once-{i}", "pad": "p" * 60}).encode() + b"\n")
    daemon.emit({}, b'{"n":"daemon-2"}\n')
    daemon.close()
    once.close()
    kept = [json.loads(line)["n"] for p in _files(path, 2) for line in p.read_bytes().splitlines()]
    assert kept[-1] == "daemon-2"
    assert "daemon-1" not in kept  # rotated out with its file, after it was written there


def test_a_torn_line_of_another_writer_is_ended_not_glued(tmp_path: Path) -> None:
    """Issue 19 item 6: a line another process left torn (killed mid-write) is ended before
    this one's line is appended, so this one's event stays a line of its own."""
    path = tmp_path / "decisions.jsonl"
    path.write_bytes(b'{"n":1}\n{"n":')
    sink = FileSink(path, 0, 0)
    sink.emit({}, b'{"n":2}\n')
    sink.close()
    assert path.read_bytes() == b'{"n":1}\n{"n":\n{"n":2}\n'


@pytest.mark.parametrize("kind", ["fifo", "dev-null"])
def test_a_log_path_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """Issue 19 item 3: a FIFO (nobody reading it), a directory, ``/dev/null`` or a socket as
    the log file is refused at once with an ``OSError`` naming it, never blocking."""
    path = tmp_path / "decisions.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-null":
        path = Path("/dev/null")
    else:
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    with pytest.raises(
        OSError, match=r"not a regular file|Is a directory|No such device"
    ) as raised:
        FileSink(path, 100, 1)
    assert raised.value.errno in (errno.EINVAL, errno.ENXIO, errno.EISDIR)


# -- control characters never reach a terminal -----------------------------------------------------


def test_console_and_journal_message_escape_control_characters() -> None:
    """Issue 10 item 16: the readable line (console on a TTY, journal MESSAGE) of a decision
    about a name with ESC and a newline, and a reason quoting content, holds no raw control
    character: it cannot fake a log line, clear the screen or set the title."""
    from memstaged.log.format import message
    from memstaged.log.writer import _readable_renderer

    event = {
        "event": "decision",
        "decision": "quarantined",
        "path": os.fsdecode(b"/m/staging/a\x1b]0;pwned\x07\nFAKE LINE\xff.json"),
        "reasons": ["not JSON: bad \x1b[2J byte"],
        "timestamp": "2026-12-01T10:00:00.000000Z",
        "level": "warning",
    }
    for text in (message(event), _readable_renderer(colors=False)(event).rstrip("\n")):
        assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in text), repr(text)
        assert "\\x1b]0;pwned\\x07\\nFAKE LINE\\xff.json" in text
    shown = message(event).removeprefix("quarantined ").rsplit(": not JSON", 1)[0]
    assert os.fsencode(unquote(shown)) == b"/m/staging/a\x1b]0;pwned\x07\nFAKE LINE\xff.json"


# -- what --once logs where ------------------------------------------------------------------------


def test_off_a_terminal_each_event_is_written_once_and_only_to_the_log_file(
    project: Path,
    memory_dir: Path,
    log_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With stderr not a terminal, ``--once`` writes every event to the log file, one ``write``
    per transaction, and nothing to stderr; the summary line is the only output, on stdout.
    Here two transactions: the three files, then the look at the one rewrite (SPEC 1)."""
    expected = backlog(project, memory_dir, 3)  # valid, repaired, quarantined
    writes: dict[int, int] = {}
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        writes[fd] = writes.get(fd, 0) + 1
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    fd = next(s for s in writer._FANOUT.sinks if isinstance(s, FileSink))._fd
    monkeypatch.undo()
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1 and "valid=1 repaired=1 quarantined=1" in out
    assert decisions(log_file) == expected
    assert len(read_events(log_file)) == 4  # three decisions and the look at the rewrite
    assert writes[fd] == 2  # one write per transaction
    assert 2 not in writes


def test_verbose_prints_every_decision_readably_and_the_file_stays_complete(
    project: Path, memory_dir: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 14, the decision log: ``--once --verbose`` off a terminal prints one readable line
    per decision on stderr (not JSON: the file has that), and the log file still has every
    event."""
    expected = backlog(project, memory_dir, 3)  # valid, repaired, quarantined
    assert main(["--once", "--verbose", "--memory-dir", str(memory_dir)]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    for name, decision in expected.items():
        assert any(f"{decision} " in line and name in line for line in lines), err
    assert not any(line.lstrip().startswith("{") for line in err.splitlines()), err
    assert len(decisions(log_file)) == 3


def _events_in(path: Path) -> list[str]:
    """The ``n`` of each decision event in ``path`` (the event's name for any other)."""
    if not path.exists():
        return []
    events = [json.loads(x) for x in path.read_text().splitlines()]
    return [e["n"] if e["event"] == "decision" else e["event"] for e in events]


def _file_only(tmp_path: Path) -> tuple[Path, writer.Logger]:
    """The decision log file alone configured; its path and the logger."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, console="off", journal="off")
    return path, writer.get_logger()


def test_a_blocks_decisions_reach_the_file_together_when_it_ends(tmp_path: Path) -> None:
    """Inside :func:`one_write` the file does not change (one write at its end takes every
    decision, in order); a block inside another writes with the outer one; a block left by an
    exception still writes what it held, and says the lines were written whole."""
    path, log = _file_only(tmp_path)
    with writer.one_write() as logged:
        log.info("decision", n="a")
        with writer.one_write():
            log.info("decision", n="b")
        log.info("decision", n="c")
        assert _events_in(path) == []
    assert _events_in(path) == ["a", "b", "c"]
    assert logged.whole
    with pytest.raises(RuntimeError), writer.one_write():
        log.info("decision", n="d")
        raise RuntimeError
    assert _events_in(path) == ["a", "b", "c", "d"]


def test_any_other_event_goes_out_at_once_with_the_decisions_before_it(tmp_path: Path) -> None:
    """An event that reports something just done (a stale lock of memstaged's own removed, a
    version kept as a conflict) is in the file at once, after the decisions held before it:
    a kill right after leaves no change of memstaged's without its line."""
    path, log = _file_only(tmp_path)
    with writer.one_write():
        log.info("decision", n="valid")
        log.warning("lock_seen", action="removed")
        assert _events_in(path) == ["valid", "lock_seen"]
        log.info("decision", n="next")
        assert _events_in(path) == ["valid", "lock_seen"]
    assert _events_in(path) == ["valid", "lock_seen", "next"]


def test_durable_writes_what_the_enclosing_block_held_and_holds_again(tmp_path: Path) -> None:
    """A transaction's announcement: the decisions held before it (the valid files of the
    batch) and its own are in the file when :func:`durable` ends; what follows is held again."""
    path, log = _file_only(tmp_path)
    with writer.one_write():
        log.info("decision", n="valid")
        with writer.durable():
            log.info("decision", n="announced")
        assert _events_in(path) == ["valid", "announced"]
        log.info("decision", n="after")
        assert _events_in(path) == ["valid", "announced"]
    assert _events_in(path) == ["valid", "announced", "after"]


def test_a_reload_inside_a_block_loses_no_event(tmp_path: Path) -> None:
    """The daemon's reload may replace the log file while a batch holds its decisions: they
    go to the file configured when the block ends, none lost."""
    log = writer.get_logger()
    writer.configure(tmp_path / "a.jsonl", console="off", journal="off")
    with writer.one_write():
        log.info("decision", n="decided")
        writer.configure(tmp_path / "b.jsonl", console="off", journal="off")
        log.info("decision", n="after reload")
    assert _events_in(tmp_path / "a.jsonl") == []
    assert _events_in(tmp_path / "b.jsonl") == ["decided", "after reload"]


def test_another_threads_events_are_not_held(tmp_path: Path) -> None:
    """The daemon's main thread logs while the worker thread holds a batch's decisions: its
    events are written at once, not held with the batch."""
    path, log = _file_only(tmp_path)
    with writer.one_write():
        log.info("decision", n="held")
        other = threading.Thread(target=log.info, args=("decision",), kwargs={"n": "other"})
        other.start()
        other.join()
        assert _events_in(path) == ["other"]
    assert _events_in(path) == ["other", "held"]


def test_lines_written_together_are_never_split_by_a_rotation(tmp_path: Path) -> None:
    """A transaction's lines go into one file: a rotation comes before them, never between."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, max_bytes=2000, backups=20, console="off", journal="off")
    log = writer.get_logger()
    for batch in range(12):
        with writer.one_write():
            for i in range(7):
                log.info("decision", batch=batch, i=i, pad="x" * 40)
    writer.close()
    files = _files(path, 20)
    assert len(files) > 3
    seen: list[int] = []
    for p in files:
        batches = [json.loads(x)["batch"] for x in p.read_text().splitlines()]
        for b in set(batches):
            assert batches.count(b) == 7, f"batch {b} split across files"
        seen += batches
    assert sorted(seen) == sorted(b for b in range(12) for _ in range(7))


def test_a_file_rotated_away_is_fsynced_before_it_is_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines announcing changes (a :func:`durable` block) may go into a file that a rotation then
    renames away, before the block's fsync of the file open at its end: that file is fsynced
    before its descriptor is closed, or a power cut could lose the lines whose changes were
    carried out. A power cut cannot be made here: the test records which inodes are fsynced
    (the real ``os.fsync`` still runs) and checks the rotated file is among them."""
    path = tmp_path / "decisions.jsonl"
    writer.configure(path, max_bytes=3000, backups=5, console="off", journal="off")
    log = writer.get_logger()
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with writer.durable():
        for i in range(40):  # ~4 KiB of lines: the file is rotated inside the block
            log.info("decision", n=str(i), pad="p" * 60)
            if i == 5:
                writer._FANOUT.write_held(stop=False)  # as the 1 MiB bound does
    rotated = tmp_path / "decisions.jsonl.1"
    assert rotated.exists()
    assert rotated.stat().st_ino in synced, "the rotated file's lines were never fsynced"
    assert path.stat().st_ino in synced
