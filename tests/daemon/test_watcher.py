"""The watcher: which file-system events become which signals for the daemon.

The handlers are fed synthetic watchdog events (no file system). A few tests use a real inotify
observer on a temp dir and wait on the signal queue with a timeout, never with a sleep.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
)
from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent, Mask, WatchDescriptor

from memstaged.daemon import watcher as watcher_module
from memstaged.daemon.watcher import (
    Kind,
    MemoryDirHandler,
    Signal,
    StagingHandler,
    Watcher,
    level_signal,
    memory_dir_signal,
    staging_signal,
)
from memstaged.files.memdir import MemoryDir

IN = InotifyConstants
M = "/p/.pi/memory/project"
S = f"{M}/staging"


def _signals(handler_events: list[FileSystemEvent], *, polling: bool = False) -> list[Signal]:
    out: queue.SimpleQueue[Signal] = queue.SimpleQueue()
    handler = StagingHandler(out, M, complete_on_change=polling)
    for event in handler_events:
        handler.dispatch(event)
    result = []
    while not out.empty():
        result.append(out.get_nowait())
    return result


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (FileClosedEvent(f"{S}/a.json"), Signal(Kind.COMPLETE, M, "a.json")),
        (FileMovedEvent(f"{S}/.a.json.tmp", f"{S}/a.json"), Signal(Kind.COMPLETE, M, "a.json")),
        (FileMovedEvent("", f"{S}/a.json"), Signal(Kind.COMPLETE, M, "a.json")),
        (FileCreatedEvent(f"{S}/a.json"), Signal(Kind.CHANGED, M, "a.json")),
        (FileModifiedEvent(f"{S}/a.json"), Signal(Kind.CHANGED, M, "a.json")),
        (DirDeletedEvent(S), Signal(Kind.DIR_CHANGED, M)),
        (FileClosedEvent(f"{S}/.a.json.swp"), None),
        (FileClosedEvent(f"{S}/notes.txt"), None),
        (FileMovedEvent(f"{S}/a.json", f"{S}/a.json~"), None),
        (FileMovedEvent(f"{S}/a.json", ""), None),
        (FileClosedNoWriteEvent(f"{S}/a.json"), None),
        (FileOpenedEvent(f"{S}/a.json"), None),
        (FileDeletedEvent(f"{S}/a.json"), None),
        (FileClosedEvent(f"{S}/sub/a.json"), None),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, Signal | None) else "",
)
def test_staging_events_become_signals(event: FileSystemEvent, expected: Signal | None) -> None:
    """A close-after-write or a rename into staging/ (from a temp name or from elsewhere) is a
    complete write; a create/modify is not yet; temp names, other files, reads, deletions and
    renames away are not signalled at all."""
    assert _signals([event]) == ([] if expected is None else [expected])


def test_polling_observer_changes_count_as_complete() -> None:
    """The polling observer sees no closes, so a created or modified file is decided at once
    (the pipeline still defers it if it does not parse yet)."""
    signals = _signals(
        [FileCreatedEvent(f"{S}/a.json"), FileModifiedEvent(f"{S}/b.json")], polling=True
    )
    assert signals == [Signal(Kind.COMPLETE, M, "a.json"), Signal(Kind.COMPLETE, M, "b.json")]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (FileDeletedEvent(f"{M}/canonical-writer.lock"), Kind.LOCK_RELEASED),
        (FileMovedEvent(f"{M}/canonical-writer.lock", f"{M}/x"), Kind.LOCK_RELEASED),
        (DirCreatedEvent(S), Kind.DIR_CHANGED),
        (DirDeletedEvent(S), Kind.DIR_CHANGED),
        (DirMovedEvent(f"{M}/staging.new", S), Kind.DIR_CHANGED),
        (DirMovedEvent("", S), Kind.DIR_CHANGED),
        (DirDeletedEvent(M), Kind.DIR_CHANGED),
        (FileDeletedEvent(f"{M}/other.lock"), None),
        (DirCreatedEvent(f"{M}/deadletter"), None),
    ],
)
def test_memory_dir_events_become_signals(event: FileSystemEvent, expected: Kind | None) -> None:
    """The memory dir's watch reports the reconciler's lock going away, staging/ appearing or
    disappearing, and the memory dir itself being deleted; nothing else."""
    out: queue.SimpleQueue[Signal] = queue.SimpleQueue()
    MemoryDirHandler(out, M).dispatch(event)
    got = [out.get_nowait().kind] if not out.empty() else []
    assert got == ([] if expected is None else [expected])


def _raw(mask: int, name: bytes = b"") -> InotifyEvent:
    return InotifyEvent(WatchDescriptor(1), Mask(mask), 0, name)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (_raw(IN.IN_CLOSE_WRITE, b"a.json"), Signal(Kind.COMPLETE, M, "a.json")),
        (_raw(IN.IN_MOVED_TO, b"a.json"), Signal(Kind.COMPLETE, M, "a.json")),
        (_raw(IN.IN_CREATE, b"a.json"), Signal(Kind.CHANGED, M, "a.json")),
        (_raw(IN.IN_MODIFY, b"a.json"), Signal(Kind.CHANGED, M, "a.json")),
        (_raw(IN.IN_DELETE_SELF), Signal(Kind.DIR_CHANGED, M)),
        (_raw(IN.IN_MOVE_SELF), Signal(Kind.DIR_CHANGED, M)),
        (_raw(IN.IN_CLOSE_WRITE, b".a.json.swp"), None),
        (_raw(IN.IN_CLOSE_WRITE, b"notes.txt"), None),
        (_raw(IN.IN_MOVED_FROM, b"a.json"), None),
        (_raw(IN.IN_DELETE, b"a.json"), None),
        (_raw(IN.IN_CREATE | IN.IN_ISDIR, b"sub.json"), None),
    ],
)
def test_raw_staging_events_become_signals(event: InotifyEvent, expected: Signal | None) -> None:
    """issue 10 item 11: the shared inotify descriptor's raw events of staging/ give the same
    signals as watchdog's events did: a close after writing or any rename in (no move pairing
    is needed) is complete, a create or modify waits, temp names, other files, renames away,
    deletions and directories say nothing, and staging/ going away is a DIR_CHANGED."""
    assert staging_signal(M, event) == expected


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (_raw(IN.IN_DELETE, b"canonical-writer.lock"), Signal(Kind.LOCK_RELEASED, M)),
        (_raw(IN.IN_MOVED_FROM, b"canonical-writer.lock"), Signal(Kind.LOCK_RELEASED, M)),
        (_raw(IN.IN_CREATE | IN.IN_ISDIR, b"staging"), Signal(Kind.DIR_CHANGED, M)),
        (_raw(IN.IN_DELETE | IN.IN_ISDIR, b"staging"), Signal(Kind.DIR_CHANGED, M)),
        (_raw(IN.IN_MOVED_TO | IN.IN_ISDIR, b"staging"), Signal(Kind.DIR_CHANGED, M)),
        (_raw(IN.IN_DELETE_SELF), Signal(Kind.DIR_CHANGED, M)),
        (_raw(IN.IN_CREATE, b"canonical-writer.lock"), None),
        (_raw(IN.IN_DELETE, b"other.lock"), None),
        (_raw(IN.IN_CREATE | IN.IN_ISDIR, b"deadletter"), None),
        (_raw(IN.IN_CREATE, b"staging"), None),  # a file or link named staging is no staging/
    ],
)
def test_raw_memory_dir_events_become_signals(event: InotifyEvent, expected: Signal | None) -> None:
    """issue 10 item 11: the memory dir's raw events: the reconciler's lock going away,
    staging/ appearing or going (as a directory), the memory dir itself going; nothing else."""
    assert memory_dir_signal(M, event) == expected


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (_raw(IN.IN_CREATE | IN.IN_ISDIR, b"proj"), Signal(Kind.TREE_CHANGED, "/src", "proj")),
        (_raw(IN.IN_MOVED_TO | IN.IN_ISDIR, b"proj"), Signal(Kind.TREE_CHANGED, "/src", "proj")),
        (_raw(IN.IN_DELETE | IN.IN_ISDIR, b"proj"), Signal(Kind.TREE_CHANGED, "/src", "proj")),
        (_raw(IN.IN_DELETE_SELF), Signal(Kind.TREE_CHANGED, "/src")),
        (_raw(IN.IN_CREATE, b"proj"), None),  # a file is never a level or a memory dir
        (_raw(IN.IN_CREATE | IN.IN_ISDIR, b".hidden"), None),  # glob's * skips dot names
    ],
)
def test_raw_glob_parent_events_become_signals(
    event: InotifyEvent, expected: Signal | None
) -> None:
    """issue 12: a watched parent directory of a glob (``/src`` for ``/src/*/...``) reports a
    directory entry that matches the glob's next component coming or going, as glob.glob
    reads the component (``*`` matches no dot name); files say nothing."""
    assert level_signal("/src", frozenset({"*"}), event) == expected


# -- with a real observer ----------------------------------------------------------------------


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Fails the test if it leaves an observer thread running."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leaked == []


@pytest.fixture
def live(
    memory_dir: Path, no_thread_leak: None
) -> Iterator[tuple[Watcher, queue.SimpleQueue[Signal]]]:
    out: queue.SimpleQueue[Signal] = queue.SimpleQueue()
    watcher = Watcher(out, "inotify")
    try:
        yield watcher, out
    finally:
        watcher.stop()


def _next_file_signal(out: queue.SimpleQueue[Signal], timeout: float = 30.0) -> Signal:
    while True:
        sig = out.get(timeout=timeout)
        if sig.name:
            return sig


def test_rename_from_another_directory_is_a_complete_write(
    tmp_path: Path, memory_dir: Path, live: tuple[Watcher, queue.SimpleQueue[Signal]]
) -> None:
    """A writer that writes a temp file outside staging/ and renames it in is seen as a
    complete write (not a bare create that would wait for the settle interval)."""
    watcher, out = live
    assert watcher.watch(MemoryDir(str(memory_dir), str(memory_dir.parents[2]))) == "inotify"
    outside = tmp_path / "elsewhere.tmp"
    outside.write_bytes(b"{}")
    os.rename(outside, memory_dir / "staging" / "in.json")
    assert _next_file_signal(out) == Signal(Kind.COMPLETE, str(memory_dir), "in.json")


def test_reading_a_file_signals_nothing(
    memory_dir: Path, live: tuple[Watcher, queue.SimpleQueue[Signal]]
) -> None:
    """memstaged's own reads (open, close without writing) produce no signal, so deciding a
    file never makes it due again: the next signal is the one of a later write."""
    (memory_dir / "staging" / "old.json").write_bytes(b"{}")
    watcher, out = live
    watcher.watch(MemoryDir(str(memory_dir), str(memory_dir.parents[2])))
    for _ in range(3):
        (memory_dir / "staging" / "old.json").read_bytes()
    with (memory_dir / "staging" / "new.json").open("wb") as fh:
        fh.write(b"{}")
    signals = [_next_file_signal(out)]
    while signals[-1].kind is not Kind.COMPLETE:
        signals.append(_next_file_signal(out))
    assert {s.name for s in signals} == {"new.json"}  # create, modify, close: nothing for old


def test_staging_deleted_is_signalled(
    memory_dir: Path, live: tuple[Watcher, queue.SimpleQueue[Signal]]
) -> None:
    """Removing staging/ tells the daemon (which then stops expecting events from it)."""
    watcher, out = live
    watcher.watch(MemoryDir(str(memory_dir), str(memory_dir.parents[2])))
    assert watcher.staging_watched(str(memory_dir))
    (memory_dir / "staging").rmdir()
    assert out.get(timeout=30) == Signal(Kind.DIR_CHANGED, str(memory_dir))


def test_staging_created_while_the_memory_dir_is_watched_anew_is_signalled(
    memory_dir: Path, live: tuple[Watcher, queue.SimpleQueue[Signal]]
) -> None:
    """Issue 21 item 7 (a staging/ made readable again was seen only at the periodic rescan):
    the daemon watches a memory dir anew at each DIR_CHANGED; a staging/ created while it does
    is signalled. The writer's mkdir is run from inside :meth:`Watcher.watch` (at its look at
    the file system's type), the moment where the daemon's thread can be preempted; the memory
    dir's watch used to be removed there, and the event was lost."""
    watcher, out = live
    mdir = MemoryDir(str(memory_dir), str(memory_dir.parents[2]))
    (memory_dir / "staging").rmdir()
    watcher.watch(mdir)
    real_kind_for = watcher.kind_for

    def kind_for_with_a_writer(path: str) -> str:
        if not (memory_dir / "staging").exists():
            (memory_dir / "staging").mkdir()
        return real_kind_for(path)

    watcher.kind_for = kind_for_with_a_writer  # type: ignore[method-assign]
    watcher.watch(mdir)  # as the daemon's _dir_changed does
    assert out.get(timeout=30) == Signal(Kind.DIR_CHANGED, str(memory_dir))


def test_watching_a_vanished_memory_dir_raises_oserror(
    tmp_path: Path, live: tuple[Watcher, queue.SimpleQueue[Signal]]
) -> None:
    """A memory dir that is gone cannot be watched: OSError, which the daemon logs once."""
    watcher, _ = live
    with pytest.raises(OSError):
        watcher.watch(MemoryDir(str(tmp_path / "gone"), str(tmp_path)))


def test_inotify_overflow_warning_becomes_an_overflow_signal(
    live: tuple[Watcher, queue.SimpleQueue[Signal]],
) -> None:
    """watchdog only logs a lost-events warning; the watcher turns it into OVERFLOW."""
    _, out = live
    logging.getLogger("watchdog.observers.inotify_c").warning(
        "Inotify queue overflowed; filesystem events were lost"
    )
    assert out.get(timeout=30) == Signal(Kind.OVERFLOW)


def test_auto_mode_polls_on_network_file_systems(
    monkeypatch: pytest.MonkeyPatch, memory_dir: Path, no_thread_leak: None
) -> None:
    """observer = "auto" picks the polling observer for a memory dir on NFS (where inotify
    misses other machines' writes) and inotify elsewhere."""
    out: queue.SimpleQueue[Signal] = queue.SimpleQueue()
    watcher = Watcher(out, "auto", poll_interval=0.1)
    try:
        assert watcher.kind_for(str(memory_dir)) == "inotify"
        monkeypatch.setattr(watcher_module, "fs_type", lambda path: "nfs4")
        assert watcher.kind_for(str(memory_dir)) == "polling"
        assert watcher.watch(MemoryDir(str(memory_dir), str(memory_dir.parents[2]))) == "polling"
        (memory_dir / "staging" / "p.json").write_bytes(b"{}")
        assert _next_file_signal(out) == Signal(Kind.COMPLETE, str(memory_dir), "p.json")
    finally:
        watcher.stop()


def _inotify_fds() -> int:
    """How many inotify instances this process holds (from /proc/self/fd)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue  # the descriptor listdir itself used
    return count


def _inotify_watches() -> int:
    """How many inotify watches this process holds: the kernel's count, one ``inotify wd:``
    line per watch in /proc/self/fdinfo of each inotify descriptor."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue  # the descriptor listdir itself used
        count += sum(line.startswith("inotify wd:") for line in info.splitlines())
    return count


def test_many_memory_dirs_share_one_thread_and_one_inotify_descriptor(
    tmp_path: Path, no_thread_leak: None
) -> None:
    """issue 10 item 11: 200 memory dirs (400 watches) cost one reader thread and one inotify
    descriptor, not two watchdog emitter threads per memory dir; a file written in the last
    one is still signalled, and stopping leaves no thread behind."""
    threads_before, fds_before = threading.active_count(), _inotify_fds()
    watches_before = _inotify_watches()
    out: queue.SimpleQueue[Signal] = queue.SimpleQueue()
    watcher = Watcher(out, "inotify")
    try:
        mdirs = []
        for i in range(200):
            mdir = tmp_path / f"p{i}" / ".pi" / "memory" / "project"
            (mdir / "staging").mkdir(parents=True)
            watcher.watch(MemoryDir(str(mdir), str(tmp_path / f"p{i}")))
            mdirs.append(mdir)
        assert _inotify_watches() - watches_before == 400
        assert threading.active_count() - threads_before == 1
        assert _inotify_fds() - fds_before == 1
        (mdirs[-1] / "staging" / "last.json").write_bytes(b"{}")
        signals = [_next_file_signal(out)]
        while signals[-1].kind is not Kind.COMPLETE:
            signals.append(_next_file_signal(out))
        assert signals[-1] == Signal(Kind.COMPLETE, str(mdirs[-1]), "last.json")
    finally:
        watcher.stop()
    assert _inotify_fds() == fds_before


def test_fs_type_reads_the_mount_table() -> None:
    """The file-system type of / is whatever /proc/self/mounts says (never empty on Linux)."""
    assert watcher_module.fs_type("/") != ""
