"""Issue 12 / defect 9: a new project under a glob is decided at once whatever the order in
which its directories and its first file appear relative to the daemon's own steps (the watch
of each level, the expansion of the glob, the watch of the memory dir, its first scan).

The daemon runs in-process with the real inotify watcher; the test forces each interleaving by
making the file system change exactly between two steps of the daemon (it drives the loop by
hand: ``drain`` then ``work``), instead of hoping that a race happens."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.daemon_fakes import Notes, RecordingLogger, notifier, settings_from_file
from support.documents import staging_doc

from memstaged.daemon.loop import Daemon

#: How long a test waits for a signal that must come (the watches are real).
PATIENCE = 10.0


@pytest.fixture
def glob_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, RecordingLogger, Path]]:
    """A started daemon on ``src/*/.pi/memory/project``, periodic rescans an hour apart (so
    that only the watches can find a new project), settle 0.2 s."""
    src = tmp_path / "src"
    src.mkdir()
    conf = tmp_path / "config.toml"
    pattern = json.dumps(str(src / "*" / ".pi" / "memory" / "project"))
    conf.write_text(f"memory_dirs = [{pattern}]\nsettle = 0.2\nrescan_interval = 3600\n")
    log = RecordingLogger()
    daemon = Daemon(settings_from_file(conf), log, notifier=notifier(Notes()))
    daemon.start()
    try:
        yield daemon, log, src
    finally:
        daemon.shutdown()


def _run_until(daemon: Daemon, done: Callable[[], bool], what: str) -> None:
    """Drive the daemon's loop (signals, then due work) until ``done`` or :data:`PATIENCE`."""
    deadline = time.monotonic() + PATIENCE
    while not done():
        assert time.monotonic() < deadline, f"not within {PATIENCE:g} s: {what}"
        daemon.drain(min(daemon.timeout(), 0.05))
        daemon.work()


def _decided(log: RecordingLogger, name: str) -> Callable[[], bool]:
    return lambda: "valid" in log.decisions(name)


def test_staging_made_after_the_glob_was_expanded_is_seen_at_once(
    glob_daemon: tuple[Daemon, RecordingLogger, Path],
) -> None:
    """defect 9, issue 12: the daemon handles the new project's directories when its memory
    dir exists but ``staging/`` does not yet (``mkdir -p`` interrupted there: not a memory dir
    yet, so not added); ``staging/`` and its first file made after that must still be
    decided at once, without waiting an hour for the rescan."""
    daemon, log, src = glob_daemon
    mdir = src / "new" / ".pi" / "memory" / "project"
    mdir.mkdir(parents=True)
    _run_until(daemon, lambda: str(mdir.parent) in daemon.dirs.levels, "the levels watched")
    daemon.drain(0.2)  # whatever else the mkdir signalled: taken before staging/ exists
    assert str(mdir) not in daemon.mdirs
    (mdir / "staging").mkdir()
    doc = json.dumps(staging_doc(src / "new", "first")).encode()
    (mdir / "staging" / "first.json").write_bytes(doc)
    _run_until(daemon, _decided(log, "first.json"), "first.json decided")


@pytest.mark.parametrize("created", ["before the watch", "between the watch and the scan"])
def test_a_first_file_written_in_place_around_the_first_scan_is_decided(
    glob_daemon: tuple[Daemon, RecordingLogger, Path], created: str
) -> None:
    """defect 9, issue 12: a writer creates the new project's first file (empty, then
    written in place: no rename) just before the memory dir's watch is added, or between the
    watch and the first scan, and finishes writing it after that scan. The scan sees it
    unsettled (empty): it must get a due time, and the write's end must be seen, so the
    file is decided ``valid`` at once, with the bytes written, not at the next rescan."""
    daemon, log, src = glob_daemon
    project = src / "new"
    staging = project / ".pi" / "memory" / "project" / "staging"
    target = staging / "first.json"
    doc = json.dumps(staging_doc(project, "first")).encode()
    writer: list[int] = []

    def create() -> None:
        writer.append(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.write(writer[0], doc[:10])  # begun, not finished: not JSON yet

    hook = "prepare" if created == "before the watch" else "added"
    original = getattr(daemon, hook)

    def hooked(mdir: object) -> None:
        if hook == "added":
            create()
        original(mdir)
        if hook == "prepare":
            create()

    setattr(daemon, hook, hooked)
    staging.mkdir(parents=True)
    _run_until(daemon, lambda: bool(writer), "the memory dir added")
    daemon.work()  # the first scan's files, as the loop would right after it
    os.write(writer[0], doc[10:])
    os.close(writer[0])
    _run_until(daemon, _decided(log, "first.json"), "first.json decided")
    assert target.read_bytes() == doc
