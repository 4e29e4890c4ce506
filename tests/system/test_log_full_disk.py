"""The decision log's sinks on a full disk: a 64 KiB tmpfs mounted for the test (needs root)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.decision_log import decision_events, decisions, read_events
from support.documents import put, repairable, staging_doc, write
from support.failing_fs import Broken, take_every_byte
from support.helpers import memory_dir_of

from memstaged.cli.main import main
from memstaged.core.decide import Decision
from memstaged.errors import LogUnwritable
from memstaged.files import fsio
from memstaged.files.memdir import Options
from memstaged.log import writer
from memstaged.run.pipeline import Pipeline


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs root): the decision log runs out of space on it."""
    mount = tmp_path / "small"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=False
        ).returncode
    ):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mount
    finally:
        writer.close()  # the open log file would keep the mount busy
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_reported_once_and_the_other_sinks_go_on(
    full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC on the log file: one clear line on stderr (no traceback, nothing raised), the
    console and journald still get every event; once there is room again that is said too, and
    the file goes on with whole lines."""
    filler = full_disk / "filler"
    filler.write_bytes(b"f" * 16384)
    path = full_disk / "state" / "decisions.jsonl"
    writer.configure(path, console="on", journal="off")
    sent: list[tuple[bytes, ...]] = []
    writer.add_sink(writer.JournalSink(send=lambda *lines: sent.append(lines)))
    logger = writer.get_logger()
    for i in range(600):  # ~90 KiB of lines
        logger.warning("decision", decision="quarantined", path=f"/p/{i}.json", pad="q" * 100)
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if not line.startswith("{")]
    assert notes == [
        f"memstaged: decision log file {path}: No space left on device (ENOSPC); nothing is "
        "carried out while it cannot be written (the files wait, deferred); events go on to the "
        "other sinks (said once, until it works again)"
    ]
    assert len(err) == 600 + 1  # the console had every event
    assert len(sent) == 600
    written = path.read_bytes()
    assert 0 < len(written) < 64 * 1024

    filler.unlink()
    logger.info("decision", decision="valid", path="/p/after.json")
    err = capsys.readouterr().err.splitlines()
    assert f"memstaged: decision log file {path}: works again" in err
    lines = path.read_bytes().splitlines()
    assert json.loads(lines[-1])["path"] == "/p/after.json"
    # The line the disk cut short was taken back: every line is whole (issue 19 item 1).
    assert all(json.loads(line) for line in lines)


def test_an_event_not_written_whole_is_never_counted_as_logged(full_disk: Path) -> None:
    """Issue 19 item 1: with the log's file system full, :func:`log.durable` raises (so the
    change it announces is not carried out), a line cut short is not left in the file, and
    once there is room the next announcement is written and fsynced."""
    path = full_disk / "decisions.jsonl"
    writer.configure(path, console="off", journal="off")
    logger = writer.get_logger()
    logger.info("start")
    filler = full_disk / "filler"
    take_every_byte(filler)  # but for what is left of the log's last page
    before = path.read_bytes()
    with pytest.raises(LogUnwritable) as raised, writer.durable():
        logger.warning("decision", decision="quarantined", path="/p/a.json", pad="q" * 8000)
    assert (
        raised.value.reason
        == "the decision log cannot be written: No space left on device (ENOSPC)"
    )
    assert path.read_bytes() == before  # nothing half-written is left in the log

    filler.unlink()
    with writer.durable():
        logger.warning("decision", decision="quarantined", path="/p/a.json", pad="q" * 8000)
    assert json.loads(path.read_bytes().splitlines()[-1])["path"] == "/p/a.json"


def test_valid_files_whose_lines_the_log_could_not_take_are_decided_again(
    full_disk: Path,
    project: Path,
    memory_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A transaction's decisions go into the log in one write. On a log that cannot take it
    (almost full), the valid files of that transaction have no decision yet (SPEC 7): they are
    deferred (exit 1) and not remembered as decided, and once there is room the next run logs
    them. Before, they were counted valid, cached, and never logged."""
    staging = memory_dir / "staging"
    for i in range(20):
        write(staging / f"v{i:02d}.json", staging_doc(project, f"v{i}"))
    log = full_disk / "decisions.jsonl"
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(log))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(memory_dir.parent / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(memory_dir.parent / "state"))
    log.write_bytes(b"")
    filler = full_disk / "filler"
    take_every_byte(filler)
    os.truncate(filler, os.path.getsize(filler) - 2048)  # about 2 KiB: less than the 20 lines
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 1
    out = capsys.readouterr().out
    assert "valid=0" in out and "deferred=20" in out
    assert [e for e in decision_events(read_events(log)) if e["decision"] == "valid"] == []
    filler.unlink()
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    assert "valid=20" in capsys.readouterr().out
    assert decisions(log) == {f"v{i:02d}.json": "valid" for i in range(20)}


def test_a_look_or_a_skip_the_log_could_not_take_is_logged_as_such_later(
    full_disk: Path, project: Path, memory_dir: Path
) -> None:
    """On a full log, memstaged's look at its own rewrite and the skip of a link are not lost:
    each waits, deferred, and once there is room the look is logged as a look (``own_rewrite``,
    not a second decision of the file: SPEC 1 and 7) and the link as ``skipped``."""
    log = full_disk / "decisions.jsonl"
    writer.configure(log, console="off", journal="off")
    pipeline = Pipeline(Options(settle=0), writer.get_logger())
    mdir = memory_dir_of(memory_dir)
    staging = memory_dir / "staging"
    put(staging / "r.json", repairable(project))
    assert pipeline.process(mdir, "r.json").decision is Decision.REPAIRED
    (staging / "l.json").symlink_to(full_disk / "nowhere")
    full = Broken("enospc", full_disk)
    full.break_it()  # not a byte left, the log's last page included
    look = pipeline.process(mdir, "r.json")  # the look at the rewrite, unwritable
    link = pipeline.process(mdir, "l.json")
    assert (look.decision, look.own_rewrite, link.decision) == (
        Decision.DEFERRED,
        True,
        Decision.DEFERRED,
    )
    full.mend()
    look = pipeline.process(mdir, "r.json")
    link = pipeline.process(mdir, "l.json")
    assert (look.decision, look.own_rewrite, link.decision) == (
        Decision.VALID,
        True,
        Decision.SKIPPED,
    )
    events = [
        (e["path"].rsplit("/", 1)[1], e["decision"], e.get("own_rewrite", False))
        for e in decision_events(read_events(log))
    ]
    assert events == [
        ("r.json", "repaired", False),
        ("r.json", "valid", True),
        ("l.json", "skipped", False),
    ]


def test_a_look_taken_in_place_the_log_could_not_take_waits_and_is_logged_as_a_look(
    full_disk: Path, project: Path, memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--once``'s batches look at a rewrite as they put it in place. When the log fills up
    right then, the repair stands (its line was durable before it was carried out) but its look
    is no look yet: the outcome is not ``looked`` (so ``--once`` looks again), and once there is
    room the look is logged as a look (``own_rewrite``), not as a second decision."""
    log = full_disk / "decisions.jsonl"
    writer.configure(log, console="off", journal="off")
    pipeline = Pipeline(Options(settle=0), writer.get_logger())
    mdir = memory_dir_of(memory_dir)
    put(memory_dir / "staging" / "r.json", repairable(project))
    full = _full_at_the_look(monkeypatch, full_disk)
    with contextlib.closing(pipeline.batches(mdir, ["r.json"])) as batches:
        first = [o for batch in batches for o in batch.outcomes.values()]
    monkeypatch.undo()
    assert [(o.decision, o.looked) for o in first] == [(Decision.REPAIRED, False)]
    full.mend()
    with contextlib.closing(pipeline.batches(mdir, ["r.json"])) as batches:
        again = [o for batch in batches for o in batch.outcomes.values()]
    assert [(o.decision, o.own_rewrite) for o in again] == [(Decision.VALID, True)]
    events = [
        (e["path"].rsplit("/", 1)[1], e["decision"], e.get("own_rewrite", False))
        for e in decision_events(read_events(log))
    ]
    assert events == [("r.json", "repaired", False), ("r.json", "valid", True)]


def test_once_exits_1_when_the_log_cannot_take_a_look(
    full_disk: Path,
    project: Path,
    memory_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The log fills up as ``--once`` looks at its rewrite: the repair was logged and carried
    out, but the look cannot be logged, in place or after the other files. It waits: the run
    says so (``looks_waiting=1``, no file of its own: not in the total) and exits 1, for
    something is still to be logged. It exited 0 with nothing said."""
    log = full_disk / "decisions.jsonl"
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(log))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(memory_dir.parent / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(memory_dir.parent / "state"))
    put(memory_dir / "staging" / "r.json", repairable(project))
    _full_at_the_look(monkeypatch, full_disk)
    assert main(["--once", "--memory-dir", str(memory_dir), "--settle", "0"]) == 1
    monkeypatch.undo()
    out = capsys.readouterr().out
    assert "repaired=1" in out and "deferred=0" in out and "total=1" in out, out
    assert "looks_waiting=1" in out, out
    assert [e["decision"] for e in decision_events(read_events(log))] == ["repaired"]


def _full_at_the_look(monkeypatch: pytest.MonkeyPatch, full_disk: Path) -> Broken:
    """The log's file system filled up right after the rewrite's ``lstat`` for the look in
    place (crash point ``rewrite-seen``): the repair's line is in, the look's is not."""
    full = Broken("enospc", full_disk)
    real = fsio.crash_point

    def fill_at_the_look(step: str) -> None:
        real(step)
        if step == "rewrite-seen":
            full.break_it()

    monkeypatch.setattr(fsio, "crash_point", fill_at_the_look)
    return full
