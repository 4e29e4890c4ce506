"""The daemon's event handling, driven by synthetic signals and a fake clock (no sleeping).

Each test hands :class:`memstaged.daemon.loop.Daemon` the signals the watcher would send, moves the
fake clock, and checks what a user sees: the bytes in ``staging/`` and ``deadletter/``, the
decisions logged, and the sd_notify messages systemd would get.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.daemon_fakes import (
    Notes,
    RecordingLogger,
    Rig,
    complete_signal,
    reconciler_lock,
    settings,
    settings_from_file,
    started_rig,
)
from support.documents import repairable_doc, staging_doc, write

from memstaged.config import Settings
from memstaged.core import ticks
from memstaged.daemon.loop import STOP_GRACE, Daemon
from memstaged.daemon.main import install_signal_handlers
from memstaged.daemon.memory_dirs import Glob, split_glob
from memstaged.daemon.schedule import MAX_BACKOFF
from memstaged.daemon.sd_notify import Notifier
from memstaged.daemon.watcher import Kind, Signal, Watcher
from memstaged.errors import BusyError, ConfigError
from memstaged.files.locks import InstanceLock
from memstaged.files.memdir import MemoryDir
from memstaged.run.seen_cache import seen_cache

VALID_NAME = "s1.json"


def _age(path: Path, seconds: float = 60.0) -> None:
    """Make a file look untouched for ``seconds`` (instead of sleeping through a settle)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def _changed(mdir: Path, name: str) -> Signal:
    return Signal(Kind.CHANGED, str(mdir), name)


def _deadletter_originals(memory_dir: Path) -> list[bytes]:
    originals = memory_dir / "deadletter" / "originals"
    return [p.read_bytes() for p in sorted(originals.iterdir())] if originals.exists() else []


def _temp_files(memory_dir: Path) -> list[str]:
    return [p.name for p in memory_dir.rglob(".memstaged~*")]


# -- settle: complete writes now, others once they settle -------------------------------------


def test_close_after_write_is_decided_at_once(project: Path, memory_dir: Path) -> None:
    """A close-after-write event gets its file decided without any time passing."""
    rig = started_rig(memory_dir)
    data = write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.send(complete_signal(memory_dir, VALID_NAME)) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]
    assert (memory_dir / "staging" / VALID_NAME).read_bytes() == data


def test_create_without_close_waits_for_the_settle_interval(
    project: Path, memory_dir: Path
) -> None:
    """A bare create/modify event is decided only once the settle interval has passed."""
    rig = started_rig(memory_dir)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.send(_changed(memory_dir, VALID_NAME)) == 0
    assert rig.after(1.9) == 0
    assert rig.log.decisions() == []
    assert rig.after(0.1) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]


def test_half_written_file_is_deferred_not_quarantined(project: Path, memory_dir: Path) -> None:
    """A complete-looking event for a file that does not parse yet leaves it alone; once the
    writer finishes it, the file is decided valid and nothing ever went to deadletter/."""
    rig = started_rig(memory_dir)
    full = json.dumps(staging_doc(project)).encode()
    path = memory_dir / "staging" / VALID_NAME
    path.write_bytes(full[:40])
    rig.send(complete_signal(memory_dir, VALID_NAME))
    assert rig.log.decisions(VALID_NAME) == ["deferred"]
    assert path.read_bytes() == full[:40]
    path.write_bytes(full)
    rig.send(complete_signal(memory_dir, VALID_NAME))
    assert rig.log.decisions(VALID_NAME) == ["deferred", "valid"]
    assert not (memory_dir / "deadletter").exists()


def test_unparseable_file_is_quarantined_once_it_settles(memory_dir: Path) -> None:
    """A file that stays unparseable is retried by itself and quarantined once settled,
    with its exact bytes in deadletter/originals/."""
    rig = started_rig(memory_dir)
    path = memory_dir / "staging" / "broken.json"
    path.write_bytes(b'{"schemaVersion": 1, "session_')
    rig.send(complete_signal(memory_dir, "broken.json"))
    assert rig.log.decisions("broken.json") == ["deferred"]
    _age(path)  # the writer went away: the file stays as it is
    rig.after(MAX_BACKOFF)
    assert rig.log.decisions("broken.json") == ["deferred", "quarantined"]
    assert not path.exists()
    assert _deadletter_originals(memory_dir) == [b'{"schemaVersion": 1, "session_']


def test_events_for_one_file_collapse_into_one_decision(project: Path, memory_dir: Path) -> None:
    """Creates, modifies and closes of one file that arrive together give one decision."""
    rig = started_rig(memory_dir)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    burst = [_changed(memory_dir, VALID_NAME)] * 5 + [complete_signal(memory_dir, VALID_NAME)] * 3
    assert rig.send(*burst) == 1
    assert rig.after(10) == 0
    assert rig.log.decisions(VALID_NAME) == ["valid"]


def test_backlog_takes_new_events_between_files(project: Path, memory_dir: Path) -> None:
    """While a long backlog is decided, events for a file already queued do not add a second
    decision of it."""
    for i in range(200):
        write(memory_dir / "staging" / f"f{i:03}.json", staging_doc(project, f"s{i}"))
    rig = Rig(settings(memory_dir))
    rig.daemon.start()  # schedules all 200
    for _ in range(3):
        rig.daemon.queue.put(complete_signal(memory_dir, "f199.json"))
    assert rig.daemon.work() == 200
    assert rig.log.decisions("f199.json") == ["valid"]


# -- missed events: overflow and rescans ------------------------------------------------------


def test_overflow_rescan_decides_missed_files_and_rereads_only_changed_ones(
    project: Path, memory_dir: Path
) -> None:
    """After an overflow every file nobody told us about is decided; a second overflow reads
    again only the file that changed since."""
    rig = started_rig(memory_dir)
    for i in range(20):
        write(memory_dir / "staging" / f"f{i}.json", staging_doc(project, f"s{i}"))
    assert rig.send(Signal(Kind.OVERFLOW)) == 20
    assert rig.log.named("overflow_recovered")[0]["scheduled"] == 20
    write(memory_dir / "staging" / "f3.json", b"{}")
    _age(memory_dir / "staging" / "f3.json")
    assert rig.send(Signal(Kind.OVERFLOW)) == 1
    assert rig.log.decisions("f3.json") == ["valid", "quarantined"]
    assert len(rig.log.decisions()) == 21


def test_periodic_rescan_finds_files_whose_events_were_lost(
    project: Path, memory_dir: Path
) -> None:
    """With no event at all, a new file is decided at the next periodic rescan (5 min)."""
    rig = started_rig(memory_dir)
    data = write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.after(299) == 0
    assert rig.after(1) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]
    assert rig.log.named("rescan")[-1]["scheduled"] == 1
    assert rig.after(300) == 0  # unchanged since decided: not read again
    assert (memory_dir / "staging" / VALID_NAME).read_bytes() == data


# -- memory dirs coming and going ---------------------------------------------------------------


def test_staging_dir_created_later_is_watched_and_scanned(project: Path, memory_dir: Path) -> None:
    """A memory dir of the config file without staging/ is watched; when staging/ appears with
    files already in it, it gets its own watch and the files are decided. (On the command line
    such a dir is refused: SPEC 5, a memory dir has a staging/ subdirectory; issue 13 item 2.)"""
    shutil.rmtree(memory_dir / "staging")
    config_file = project / "config.toml"
    config_file.write_text(f"memory_dirs = [{json.dumps(str(memory_dir))}]\n")
    rig = Rig(settings_from_file(config_file))
    rig.daemon.start()
    rig.daemon.work()
    assert rig.watcher.staging_watched(str(memory_dir)) is False
    (memory_dir / "staging").mkdir()
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.send(Signal(Kind.DIR_CHANGED, str(memory_dir))) == 1
    assert rig.watcher.staging_watched(str(memory_dir)) is True
    assert rig.log.decisions(VALID_NAME) == ["valid"]


@pytest.mark.parametrize("signalled", [True, False], ids=["with-event", "without-event"])
def test_removed_memory_dir_is_dropped_without_an_error_storm(
    project: Path, memory_dir: Path, signalled: bool
) -> None:
    """Deleting a memory dir with 50 files queued drops it with one log line and no errors,
    whether or not its deletion was seen as an event."""
    rig = started_rig(memory_dir)
    for i in range(50):
        write(memory_dir / "staging" / f"f{i}.json", b"{")
    rig.send(*[_changed(memory_dir, f"f{i}.json") for i in range(50)])
    shutil.rmtree(memory_dir)
    if signalled:
        rig.send(Signal(Kind.DIR_CHANGED, str(memory_dir)))
    rig.after(2)
    rig.after(MAX_BACKOFF)
    assert rig.log.errors() == []
    assert rig.log.decisions() == []
    assert [e["why"] for e in rig.log.named("memory_dir_removed")] == [
        "memory dir no longer exists"
    ]
    assert rig.daemon.mdirs == {}
    assert rig.daemon.pending == {}


def test_removed_staging_dir_forgets_its_files_quietly(memory_dir: Path) -> None:
    """staging/ removed with files queued: no error, no decision, and the memory dir is still
    watched for a new staging/."""
    rig = started_rig(memory_dir)
    for i in range(10):
        write(memory_dir / "staging" / f"f{i}.json", b"{")
    rig.send(*[_changed(memory_dir, f"f{i}.json") for i in range(10)])
    shutil.rmtree(memory_dir / "staging")
    rig.send(Signal(Kind.DIR_CHANGED, str(memory_dir)))
    rig.after(MAX_BACKOFF)
    assert rig.log.errors() == []
    assert rig.log.decisions() == []
    assert str(memory_dir) in rig.daemon.mdirs
    assert rig.watcher.staging_watched(str(memory_dir)) is False


def test_glob_is_reexpanded_on_rescan(tmp_path: Path) -> None:
    """A memory-dir glob picks up a project created after start-up at the next rescan, and
    drops one whose memory dir went away."""
    pattern = str(tmp_path / "src" / "*" / ".pi" / "memory" / "project")

    def make(name: str) -> Path:
        mdir = tmp_path / "src" / name / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        write(mdir / "staging" / "a.json", staging_doc(tmp_path / "src" / name))
        return mdir

    first = make("one")
    rig = Rig(settings(pattern))
    rig.daemon.start()
    rig.daemon.work()
    second = make("two")
    shutil.rmtree(first)
    rig.after(300)
    assert sorted(rig.daemon.mdirs) == [str(second)]
    assert [Path(e["path"]).parts[-6] for e in rig.log.named("decision")] == ["one", "two"]
    assert rig.log.decisions() == ["valid", "valid"]
    assert rig.log.errors() == []


def test_glob_parents_are_watched_while_they_exist_and_match(tmp_path: Path) -> None:
    """issue 12: for ``src/*/.pi/memory/project`` the daemon watches ``src``, each project
    dir, its ``.pi`` and ``.pi/memory``, and the memory dir itself for its ``staging/`` (defect
    9), and nothing else: not a project without ``.pi``'s subtree below what exists, not a dot
    dir, not the files; a project that goes loses its watches."""
    src = tmp_path / "src"
    (src / "one" / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    (src / "bare").mkdir()  # a project dir without .pi: watched for a .pi to come
    (src / ".cache" / ".pi").mkdir(parents=True)  # glob's * skips dot names
    (src / "one" / "notes.txt").write_text("not a dir")
    rig = Rig(settings(str(src / "*" / ".pi" / "memory" / "project")))
    rig.daemon.start()
    one = src / "one"
    assert rig.watcher.levels == {
        str(src): frozenset({"*"}),
        str(one): frozenset({".pi"}),
        str(src / "bare"): frozenset({".pi"}),
        str(one / ".pi"): frozenset({"memory"}),
        str(one / ".pi" / "memory"): frozenset({"project"}),
        str(one / ".pi" / "memory" / "project"): frozenset({"staging"}),
    }
    assert list(rig.daemon.mdirs) == [str(one / ".pi" / "memory" / "project")]
    shutil.rmtree(one)
    rig.send(Signal(Kind.TREE_CHANGED, str(src), "one"))
    assert sorted(rig.watcher.levels) == [str(src), str(src / "bare")]
    assert rig.daemon.mdirs == {}


def test_new_project_under_a_glob_is_added_at_once_not_at_the_next_rescan(
    tmp_path: Path,
) -> None:
    """issue 12: a project created under a watched glob (``mkdir -p``: the whole tree exists
    when the first event is handled) is added and its file decided as soon as the event for
    its top directory arrives, with no time passing and no rescan; removing it drops it."""
    src = tmp_path / "src"
    src.mkdir()
    rig = Rig(settings(str(src / "*" / ".pi" / "memory" / "project")))
    rig.daemon.start()
    assert rig.daemon.mdirs == {}
    mdir = src / "new" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    data = write(mdir / "staging" / VALID_NAME, staging_doc(src / "new"))
    assert rig.send(Signal(Kind.TREE_CHANGED, str(src), "new")) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]
    assert (mdir / "staging" / VALID_NAME).read_bytes() == data
    assert rig.log.named("rescan") == []
    assert str(src / "new" / ".pi" / "memory") in rig.watcher.levels
    shutil.rmtree(src / "new")
    rig.send(Signal(Kind.TREE_CHANGED, str(src), "new"))
    assert rig.daemon.mdirs == {}
    assert [e["why"] for e in rig.log.named("memory_dir_removed")] == ["no longer configured"]
    assert rig.watcher.levels == {str(src): frozenset({"*"})}


def test_glob_is_split_at_its_first_magic_component() -> None:
    """issue 12: what is watched for a pattern: its literal prefix, then one level per
    component; a literal memory dir is watched from its parent."""
    assert split_glob("/home/u/src/*/.pi/memory/project") == Glob(
        "/home/u/src", ("*", ".pi", "memory", "project")
    )
    assert split_glob("/home/u/src/a/.pi/memory/project") == Glob(
        "/home/u/src/a/.pi/memory", ("project",)
    )
    assert split_glob("/srv/proj-[ab]/mem/") == Glob("/srv", ("proj-[ab]", "mem"))


def test_named_memory_dir_that_comes_back_is_added_at_once(project: Path, memory_dir: Path) -> None:
    """issue 12: a memory dir named on the command line that is removed and made again (a
    re-clone) is dropped, then added again from the event of its parent directory, without
    waiting for the rescan."""
    rig = started_rig(memory_dir)
    assert rig.watcher.levels == {
        str(memory_dir.parent): frozenset({"project"}),
        str(memory_dir): frozenset({"staging"}),
    }
    shutil.rmtree(memory_dir)
    rig.send(Signal(Kind.TREE_CHANGED, str(memory_dir.parent), "project"))
    assert rig.daemon.mdirs == {}
    (memory_dir / "staging").mkdir(parents=True)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.send(Signal(Kind.TREE_CHANGED, str(memory_dir.parent), "project")) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]
    assert rig.log.named("rescan") == []


# -- the reconciler's lock -----------------------------------------------------------------------


def test_files_wait_while_the_reconciler_holds_its_lock(project: Path, memory_dir: Path) -> None:
    """While a live process holds canonical-writer.lock a repairable file is left exactly as it
    is; it is repaired as soon as the lock is released."""
    rig = started_rig(memory_dir)
    lock = reconciler_lock(memory_dir, pid=1)  # pid 1 is always alive
    path = memory_dir / "staging" / "r.json"
    data = write(path, repairable_doc(project))
    rig.send(complete_signal(memory_dir, "r.json"))
    rig.send(complete_signal(memory_dir, "r.json"), Signal(Kind.OVERFLOW))
    assert rig.log.decisions("r.json") == ["deferred"]
    assert path.read_bytes() == data
    lock.unlink()
    rig.send(Signal(Kind.LOCK_RELEASED, str(memory_dir)))
    assert rig.log.decisions("r.json") == ["deferred", "repaired"]
    assert json.loads(path.read_bytes())["candidates"]["lessons"][0]["triggers"] != []


# -- stopping --------------------------------------------------------------------------------


def test_stop_mid_burst_finishes_the_file_in_hand_and_nothing_more(memory_dir: Path) -> None:
    """SIGTERM during a burst of 100 quarantines: the file being decided is finished (its bytes
    safe in deadletter/, gone from staging/), no other file is touched, no temp file is left,
    STOPPING=1 is sent and the instance lock is free for the next memstaged."""
    for i in range(100):
        write(memory_dir / "staging" / f"f{i:03}.json", b"not json %d" % i)
        _age(memory_dir / "staging" / f"f{i:03}.json")
    rig = Rig(settings(memory_dir))

    def stop_on_tenth(event: dict[str, Any]) -> None:
        if event["event"] == "decision" and len(rig.log.decisions()) == 10:
            rig.daemon.request_stop()  # arrives while the 10th file is in hand

    rig.log.hooks.append(stop_on_tenth)
    rig.daemon.start()
    assert rig.daemon.work() == 10
    rig.daemon.shutdown()
    assert rig.log.decisions() == ["quarantined"] * 10
    assert len(list((memory_dir / "staging").iterdir())) == 90
    assert len(_deadletter_originals(memory_dir)) == 10
    assert _temp_files(memory_dir) == []
    assert rig.notes.firsts()[-1] == "STOPPING=1"
    assert rig.log.named("stop")[0]["pending"] == 90
    next_one = InstanceLock(str(memory_dir), state_dir=rig.daemon.settings.state_dir)
    next_one.acquire(wait=False)
    next_one.release()


def test_run_says_ready_after_the_startup_scan_and_exits_0_on_stop(
    project: Path, memory_dir: Path
) -> None:
    """READY=1 comes only after the files already there are decided; start-up asks systemd for
    more time while it works; SIGTERM (request_stop) ends run() with 0 and STOPPING=1."""
    for i in range(30):
        write(memory_dir / "staging" / f"f{i}.json", staging_doc(project, f"s{i}"))
    notes = Notes()
    ready = threading.Event()
    decided_at_ready: list[int] = []
    log_events: list[str] = []

    class Logger:
        def _log(self, event: str, **fields: Any) -> None:
            log_events.append(fields.get("decision", event))

        info = warning = error = critical = _log

    def send(text: str) -> None:
        notes(text)
        if text.startswith("READY=1"):
            decided_at_ready.append(log_events.count("valid"))
            ready.set()

    env = {"NOTIFY_SOCKET": "/run/fake/notify", "WATCHDOG_USEC": "60000000"}
    daemon = Daemon(
        settings(memory_dir),
        Logger(),
        notifier=Notifier(environ=env, send=send),
        watcher_factory=lambda out, mode: _NullWatcher(),
    )
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(daemon.run()))
    thread.start()
    assert ready.wait(10)
    daemon.request_stop()
    thread.join(10)
    assert result == [0]
    assert decided_at_ready == [30]
    firsts = notes.firsts()
    assert firsts.index("WATCHDOG=1") < firsts.index("READY=1")
    assert any(m[0].startswith("EXTEND_TIMEOUT_USEC=") for m in notes.messages)
    assert firsts[-1] == "STOPPING=1"


def test_a_staging_dir_made_while_the_daemon_watches_anew_is_scanned_at_once(
    project: Path, memory_dir: Path
) -> None:
    """Issue 21 item 7 (a staging/ made anew was seen only at the periodic rescan): staging/
    is removed, and a writer makes it again, with a file in it, while the daemon is watching
    the memory dir anew for that removal. The daemon, with real inotify, says staging/ is back
    and decides the file now, not at the rescan minutes later. The writer's mkdir runs from
    inside the watcher's ``watch`` (at its look at the file system's type): the daemon used to
    look at staging/ before that, and to drop the memory dir's watch there."""
    staging = memory_dir / "staging"
    made: list[str] = []

    class WriterInTheWindow(Watcher):
        def kind_for(self, path: str) -> str:
            if not staging.exists() and not made:
                staging.mkdir()
                write(staging / "a.json", staging_doc(project, "s1"))
                made.append(path)
            return super().kind_for(path)

    log = RecordingLogger()
    daemon = Daemon(
        settings(memory_dir, settle=0),
        log,
        notifier=Notifier(environ={}, send=lambda _text: None),
        watcher_factory=WriterInTheWindow,
    )
    daemon.start()
    try:
        daemon.work()
        staging.rmdir()
        deadline = time.monotonic() + 30  # a failure guard only: each drain waits for a signal
        while not log.named("decision") and time.monotonic() < deadline:
            daemon.drain(1.0)
            daemon.work()
        assert made
        assert [(e["exists"]) for e in log.named("staging_changed")] == [True]
        assert [(e["decision"], os.path.basename(e["path"])) for e in log.named("decision")] == [
            ("valid", "a.json")
        ]
    finally:
        daemon.shutdown()


class _EndlessPipeline:
    """A pipeline whose decision of a file takes for ever (Python code that ticks, as the
    validator of a huge file does), unless something stops it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.finished = False

    def process(self, mdir: MemoryDir, name: str) -> None:
        self.started.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)
            ticks.tick()
        self.finished = True


def test_sigterm_abandons_a_file_that_takes_too_long(project: Path, memory_dir: Path) -> None:
    """SPEC 6 (issue 10 item 9's SIGTERM ignored for minutes): a real SIGTERM while a file's
    decision would take a minute stops the loop after the grace period: the file's work is
    abandoned (not finished) at its next progress tick, it is counted pending and named in
    `stop`, and run's signal handlers are the real ones (install_signal_handlers)."""
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    rig = Rig(settings(memory_dir))
    rig.daemon.start()
    slow = _EndlessPipeline()
    rig.daemon.pipeline = slow  # type: ignore[assignment]
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    install_signal_handlers(rig.daemon)

    def terminate_once_started() -> None:
        if slow.started.wait(10):
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_once_started)
    killer.start()
    try:
        started = time.monotonic()
        assert rig.daemon.work() == 0
        print(f"SIGTERM acted on {time.monotonic() - started:.3f} s after the file was taken")
    finally:
        killer.join()
        ticks.set_hook(None)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert not slow.finished
    assert rig.daemon.abandoned == (str(memory_dir), VALID_NAME)
    rig.daemon.shutdown()
    stop = rig.log.named("stop")[0]
    assert stop["abandoned"] == str(memory_dir / "staging" / VALID_NAME)
    assert stop["pending"] == 1


class _DecidedThenUnticked:
    """The real pipeline, then a stretch of work with no progress tick that outlasts the stop's
    grace (standing for a ``finally`` that closes and unlinks, or a slow fsync), during which
    the process gets its own SIGTERM."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def process(self, mdir: MemoryDir, name: str) -> Any:
        outcome = self.real.process(mdir, name)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE * 3)  # no tick: a stop must not cut this short
        return outcome


def test_sigterm_never_cuts_work_between_two_ticks(project: Path, memory_dir: Path) -> None:
    """Issue 20 (hazards: the stop grace was a BaseException raised from SIGALRM, so every
    ``finally`` of the pipeline was part of the stop protocol): a real SIGTERM while the file in
    hand is in a stretch with no progress tick that outlasts the grace does not cut it: the
    stretch ends, the file's decision counts, nothing is named abandoned or left pending, and
    the loop stops before the next file. (Before, SIGALRM raised into the stretch after 0.5 s:
    the decided file was reported abandoned and pending.)"""
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    write(memory_dir / "staging" / "b.json", staging_doc(project, "b"))
    rig = Rig(settings(memory_dir, settle=0.0))
    rig.daemon.start()
    rig.daemon.pipeline = _DecidedThenUnticked(rig.daemon.pipeline)  # type: ignore[assignment]
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    old_alarm = signal.getsignal(signal.SIGALRM)
    install_signal_handlers(rig.daemon)
    try:
        done = rig.daemon.work()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # the code before this change armed one
        ticks.set_hook(None)
        for sig, handler in {**old, signal.SIGALRM: old_alarm}.items():
            signal.signal(sig, handler)
    assert rig.daemon.stopping
    assert done == 1
    assert rig.log.decisions() == ["valid"]
    rig.daemon.shutdown()
    stop = rig.log.named("stop")[0]
    assert stop["abandoned"] is None
    assert stop["pending"] == 1  # the second file, never started
    assert stop["decided"] == 1


class _NullWatcher:
    def watch(self, mdir: object) -> str:
        return "none"

    def unwatch(self, mdir: str) -> None:
        return None

    def staging_watched(self, mdir: str) -> bool:
        return True

    def watch_level(self, path: str, patterns: frozenset[str]) -> None:
        return None

    def unwatch_level(self, path: str) -> None:
        return None

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        return None


# -- one memstaged per memory dir --------------------------------------------------------------


def test_second_daemon_on_the_same_memory_dir_is_refused(memory_dir: Path) -> None:
    """A second daemon on a memory dir another memstaged works on raises BusyError (exit 1).
    (Both are in this process, which is no memstaged by its command line: the holder is not
    named; tests/system/test_instance_lock.py has real processes.)"""
    first = started_rig(memory_dir)
    second = Rig(settings(memory_dir))
    with pytest.raises(BusyError, match=f"{memory_dir} is busy"):
        second.daemon.start()
    first.daemon.shutdown()
    second.daemon.start()  # free once the first one is gone


def test_waiting_daemon_stops_on_sigterm_and_starts_when_free(memory_dir: Path) -> None:
    """With --wait a second daemon waits (feeding the watchdog) instead of failing; SIGTERM
    ends the wait with exit 0; once the first is gone a waiting one takes over."""
    first = started_rig(memory_dir)
    polls: list[float] = []

    def sleep_then_stop(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 3:
            waiting.daemon.request_stop()

    waiting = Rig(settings(memory_dir), wait=True, sleep=sleep_then_stop, watchdog_usec=10**6)
    assert waiting.daemon.run() == 0
    assert len(polls) == 3
    assert waiting.notes.count("WATCHDOG=1") >= 1
    assert waiting.log.named("memory_dir_busy")[0]["action"] == "waiting"

    def release_first(_seconds: float) -> None:
        first.daemon.shutdown()

    taker = Rig(settings(memory_dir), wait=True, sleep=release_first)
    taker.daemon.start()
    assert str(memory_dir) in taker.daemon.mdirs


# -- reload -------------------------------------------------------------------------------------


def _config(path: Path, *memory_dirs: Path, settle: float = 2.0, observer: str = "auto") -> Path:
    dirs = ", ".join(json.dumps(str(m)) for m in memory_dirs)
    path.write_text(f"memory_dirs = [{dirs}]\nsettle = {settle}\nobserver = {observer!r}\n")
    return path


def _second_memory_dir(tmp_path: Path) -> tuple[Path, Path]:
    project = tmp_path / "other-project"
    mdir = project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    return project, mdir


def test_reload_applies_new_settings_and_keeps_queued_work(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """SIGHUP with a changed config: a new memory dir is added and scanned, the new settle
    applies to new events, and a file queued before the reload is still decided."""
    conf = _config(tmp_path / "config.toml", memory_dir, settle=2.0)
    rig = Rig(settings_from_file(conf), reload_settings=lambda: settings_from_file(conf))
    rig.daemon.start()
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    rig.send(_changed(memory_dir, VALID_NAME))  # due in 2 s
    other_project, other = _second_memory_dir(tmp_path)
    write(other / "staging" / "o.json", staging_doc(other_project))
    _config(conf, memory_dir, other, settle=5.0)
    rig.daemon.request_reload()
    rig.daemon.drain(0)
    rig.daemon.reload()
    assert rig.notes.firsts()[-2:] == ["RELOADING=1", "READY=1"]
    assert rig.log.named("reload")[0]["ok"] is True
    assert rig.daemon.work() == 1
    assert rig.log.decisions("o.json") == ["valid"]
    assert rig.after(2) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]
    write(memory_dir / "staging" / "late.json", staging_doc(project))
    rig.send(_changed(memory_dir, "late.json"))
    assert rig.after(4.9) == 0
    assert rig.after(0.1) == 1


def test_reload_with_a_bad_config_keeps_the_old_one(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """A config that does not load is refused on reload: the error is logged with the file and
    key, the old memory dirs and settings stay, and READY=1 follows RELOADING=1."""
    conf = _config(tmp_path / "config.toml", memory_dir)
    rig = Rig(settings_from_file(conf), reload_settings=lambda: settings_from_file(conf))
    rig.daemon.start()
    conf.write_text("memory_dirs = []\nsettel = 1\n")
    rig.daemon.reload()
    failed = rig.log.named("reload")[0]
    assert failed["ok"] is False
    assert "unknown key 'settel'" in failed["error"]
    assert failed["action"] == "kept the old configuration"
    assert rig.notes.firsts()[-2:] == ["RELOADING=1", "READY=1"]
    assert list(rig.daemon.mdirs) == [str(memory_dir)]
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.send(complete_signal(memory_dir, VALID_NAME)) == 1


def test_a_refused_reload_is_in_the_status_until_a_good_one_names_what_changed(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 21 item 8: after a reload refused for a typo (`settel = 2`), READY=1's STATUS= and
    every later one say that the old settings are kept and why; a good reload brings the plain
    counts back, and its `reload` event names every setting that changed, split_invalid_candidates
    included (it used to name only settle, observer, memory dirs and the file)."""
    conf = _config(tmp_path / "config.toml", memory_dir)
    rig = Rig(settings_from_file(conf), reload_settings=lambda: settings_from_file(conf))
    rig.daemon.start()
    conf.write_text(conf.read_text() + "settel = 2\n")
    rig.daemon.reload()
    ready = rig.notes.messages[-1]
    why = (
        f"reload refused, old settings kept: {conf}: unknown key 'settel' (did you mean 'settle'?)"
    )
    assert ready == [
        "READY=1",
        f"STATUS={why}; watching 1 memory dirs; 0 decided, 0 quarantined, 0 repaired, 0 waiting",
    ]
    sent = len(rig.notes.messages)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    rig.clock.advance(1)
    # the counts change: a new STATUS=
    assert rig.send(complete_signal(memory_dir, VALID_NAME)) == 1
    statuses = [line for m in rig.notes.messages[sent:] for line in m if line.startswith("STATUS=")]
    assert statuses == [
        f"STATUS={why}; watching 1 memory dirs; 1 decided, 0 quarantined, 0 repaired, 0 waiting"
    ]
    assert rig.daemon.settings.options.split_invalid_candidates is False

    conf.write_text(
        f"memory_dirs = [{json.dumps(str(memory_dir))}]\nsplit_invalid_candidates = true\n"
        "rescan_interval = 60.0\n"
    )
    rig.daemon.reload()
    assert rig.notes.messages[-1][1].startswith("STATUS=watching 1 memory dirs;")
    accepted = rig.log.named("reload")[-1]
    assert accepted["ok"] is True
    assert accepted["changed"] == {
        "split_invalid_candidates": [False, True],
        "rescan_interval": [300.0, 60.0],
    }
    assert rig.daemon.pipeline.options.split_invalid_candidates is True


def test_reload_that_changes_the_observer_rebuilds_the_watches(
    tmp_path: Path, memory_dir: Path
) -> None:
    """observer = "polling" on reload stops the old observer and watches everything anew."""
    conf = _config(tmp_path / "config.toml", memory_dir, observer="inotify")
    rig = Rig(settings_from_file(conf), reload_settings=lambda: settings_from_file(conf))
    rig.daemon.start()
    old = rig.watcher
    _config(conf, memory_dir, observer="polling")
    rig.daemon.reload()
    assert old.stopped
    assert rig.watcher.mode == "polling"
    assert rig.watcher.watch_calls == [str(memory_dir)]


# -- systemd notifications ------------------------------------------------------------------


def test_watchdog_is_pinged_at_a_quarter_of_its_interval_even_in_a_long_backlog(
    project: Path, memory_dir: Path
) -> None:
    """WATCHDOG_USEC=20 s gives a ping every 5 s (a quarter: issue 19 item 5), from the loop that
    decides files: a backlog that takes 40 s (fake) sends a ping every 5 s of it."""
    for i in range(40):
        write(memory_dir / "staging" / f"f{i}.json", staging_doc(project, f"s{i}"))
    rig = Rig(settings(memory_dir), watchdog_usec=20_000_000)
    rig.log.hooks.append(lambda e: rig.clock.advance(1) if e["event"] == "decision" else None)
    rig.daemon.start()
    assert rig.daemon.work() == 40
    assert 7 <= rig.notes.count("WATCHDOG=1") <= 9
    rig.after(5)
    rig.notes.messages.clear()
    rig.after(4)
    assert rig.notes.count("WATCHDOG=1") == 0
    rig.after(1)
    assert rig.notes.count("WATCHDOG=1") == 1


def test_status_shows_live_counts(project: Path, memory_dir: Path) -> None:
    """STATUS= says how many memory dirs are watched and how many files were decided."""
    rig = started_rig(memory_dir)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    write(memory_dir / "staging" / "bad.json", b"[]")
    rig.send(complete_signal(memory_dir, VALID_NAME), complete_signal(memory_dir, "bad.json"))
    rig.after(1)
    status = [m[0] for m in rig.notes.messages if m[0].startswith("STATUS=")][-1]
    assert (
        status == "STATUS=watching 1 memory dirs; 2 decided, 1 quarantined, 0 repaired, 0 waiting"
    )


def test_dead_observer_is_replaced_and_everything_rescanned(
    project: Path, memory_dir: Path
) -> None:
    """If the observer thread dies, the daemon does not go on blind: it logs it, builds new
    watches and rescans, so a file written meanwhile is still decided."""
    rig = started_rig(memory_dir)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    rig.watcher.is_alive = False
    assert rig.after(0) == 1
    assert len(rig.watchers) == 2 and rig.watchers[0].stopped
    assert rig.log.named("observer_died")
    assert rig.log.decisions(VALID_NAME) == ["valid"]


def test_explicit_memory_dir_that_does_not_exist_is_a_config_error(tmp_path: Path) -> None:
    """--memory-dir naming a missing directory fails at start with a one-line ConfigError."""
    rig = Rig(settings(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="does not exist"):
        rig.daemon.start()


def test_replaced_memory_dir_is_locked_and_watched_anew(project: Path, memory_dir: Path) -> None:
    """A memory dir deleted and created again (a re-clone) is re-added: its new files are
    decided, and the instance lock is taken on the new directory, so no second memstaged can
    start on it. (The old one is removed once the new one exists, so that the new one has
    another inode number: the daemon holds no descriptor of the directory, and a number given
    again names the same instance lock, which the daemon then holds already.)"""
    rig = started_rig(memory_dir)
    old = memory_dir.with_name("old")
    memory_dir.rename(old)
    (memory_dir / "staging").mkdir(parents=True)
    shutil.rmtree(old)
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    assert rig.send(Signal(Kind.DIR_CHANGED, str(memory_dir))) == 1
    assert rig.log.decisions(VALID_NAME) == ["valid"]
    assert [e["why"] for e in rig.log.named("memory_dir_removed")] == [
        "memory dir was replaced by a new directory"
    ]
    with pytest.raises(BusyError):
        InstanceLock(str(memory_dir), state_dir=rig.daemon.settings.state_dir).acquire(wait=False)
    assert rig.log.errors() == []


def test_dry_run_daemon_decides_and_writes_nothing(project: Path, memory_dir: Path) -> None:
    """--dry-run: files are decided and logged, staging/ keeps every byte, no deadletter/, and
    an unchanged file is not decided again at the next rescan."""
    staging = memory_dir / "staging"
    broken = write(staging / "bad.json", b"[1, 2")
    _age(staging / "bad.json")
    repairable = write(staging / "r.json", repairable_doc(project))
    rig = Rig(settings(memory_dir, dry_run=True))
    rig.daemon.start()
    rig.daemon.work()
    assert sorted(rig.log.decisions()) == ["quarantined", "repaired"]
    assert (staging / "bad.json").read_bytes() == broken
    assert (staging / "r.json").read_bytes() == repairable
    assert not (memory_dir / "deadletter").exists()
    assert rig.after(300) == 0


def test_stop_during_the_startup_backlog_sends_no_ready(project: Path, memory_dir: Path) -> None:
    """SIGTERM while the start-up backlog is decided: run() stops after the file in hand,
    returns 0 and never claims READY=1."""
    for i in range(20):
        write(memory_dir / "staging" / f"f{i}.json", staging_doc(project, f"s{i}"))
    rig = Rig(settings(memory_dir))
    rig.log.hooks.append(lambda e: rig.daemon.request_stop() if e["event"] == "decision" else None)
    assert rig.daemon.run() == 0
    assert len(rig.log.decisions()) == 1
    assert "READY=1" not in rig.notes.firsts()
    assert rig.notes.firsts()[-1] == "STOPPING=1"


def test_failed_start_is_logged_as_a_stop_with_the_error(memory_dir: Path) -> None:
    """A daemon that cannot start (memory dir busy) logs a stop event saying why before the
    error reaches the command line."""
    holder = InstanceLock(str(memory_dir), state_dir=settings(memory_dir).state_dir)
    holder.acquire(wait=False)
    try:
        rig = Rig(settings(memory_dir))
        with pytest.raises(BusyError):
            rig.daemon.run()
    finally:
        holder.release()
    stop = rig.log.named("stop")[0]
    assert stop["level"] == "error" and f"{memory_dir} is busy" in stop["error"]


# -- the seen cache -----------------------------------------------------------------------------


def _with_state(s: Settings, state_dir: Path) -> Settings:
    return msgspec.structs.replace(s, state_dir=state_dir)


def test_seen_cache_is_written_at_rescans_not_per_decision(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Decisions are remembered in memory and written at the next periodic rescan; a file
    decided valid, then rewritten and quarantined, is forgotten."""
    state = tmp_path / "state"
    rig = Rig(_with_state(settings(memory_dir), state))
    rig.daemon.start()
    write(memory_dir / "staging" / VALID_NAME, staging_doc(project))
    write(memory_dir / "staging" / "later.json", staging_doc(project, "later"))
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), VALID_NAME))
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "later.json"))
    write(memory_dir / "staging" / "later.json", b'["not", "a", "staging", "file"]')
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "later.json"))
    assert rig.log.decisions() == ["valid", "valid", "quarantined"]
    assert not (state / "seen").exists()
    rig.after(300)
    [cache] = (state / "seen").iterdir()
    loaded = seen_cache(rig.daemon.settings, MemoryDir(str(memory_dir), str(project)))
    assert set(loaded.entries) == {VALID_NAME}
    assert cache.stat().st_mode & 0o777 == 0o600


def test_reload_keeps_the_seen_cache_unless_a_file_is_now_too_large(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 21 item 3: a reload that turns split_invalid_candidates on keeps what the cache
    holds (a valid file is valid whatever becomes of invalid ones), so a restart decides none
    of it again; a reload that lowers the size limit below a decided file's size has that file
    decided again at the next rescan, and forgotten by the cache."""
    state = tmp_path / "state"
    conf = _config(tmp_path / "config.toml", memory_dir, settle=0)
    rig = Rig(
        _with_state(settings_from_file(conf), state),
        reload_settings=lambda: _with_state(settings_from_file(conf), state),
    )
    write(memory_dir / "staging" / "old.json", staging_doc(project))
    rig.daemon.start()
    rig.daemon.work()
    mdir = MemoryDir(str(memory_dir), str(project))
    conf.write_text(conf.read_text() + "split_invalid_candidates = true\n")
    rig.daemon.reload()
    write(memory_dir / "staging" / "new.json", staging_doc(project, "n"))  # a byte smaller
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "new.json"))
    rig.daemon.shutdown()
    assert set(seen_cache(rig.daemon.settings, mdir).entries) == {"old.json", "new.json"}

    again = Rig(
        _with_state(settings_from_file(conf), state),
        reload_settings=lambda: _with_state(settings_from_file(conf), state),
    )
    again.daemon.start()
    again.daemon.work()
    assert again.log.decisions() == []  # a restart after the change: nothing decided again
    big = memory_dir / "staging" / "old.json"  # untouched: only the limit changes
    conf.write_text(conf.read_text() + f"max_file_size = {big.stat().st_size - 1}\n")
    again.daemon.reload()
    again.after(again.daemon.rescan_interval)
    assert again.log.decisions() == ["quarantined"]
    again.daemon.shutdown()
    assert set(seen_cache(again.daemon.settings, mdir).entries) == {"new.json"}


def test_a_decision_that_cannot_be_carried_out_backs_off(memory_dir: Path) -> None:
    """A quarantine that fails with an I/O error every time (``deadletter/`` is a regular file
    here; a memory dir that is not writable, or a full disk, do the same) is retried with a
    growing backoff, not every 50 ms: found by an unwritable glob match, whose one bad file
    logged an error 20 times a second for as long as the daemon ran. Over ten minutes it is
    tried about a dozen times, and the file stays where it is."""
    rig = started_rig(memory_dir)
    (memory_dir / "deadletter").write_bytes(b"not a directory")
    path = memory_dir / "staging" / "broken.json"
    path.write_bytes(b"{")
    _age(path)
    rig.send(complete_signal(memory_dir, "broken.json"))
    for _ in range(6000):
        rig.after(0.1)
    tries = rig.log.decisions("broken.json")
    assert set(tries) == {"deferred"}
    assert len(tries) <= 20, f"{len(tries)} tries in 10 minutes"
    assert path.read_bytes() == b"{"


def test_status_counts_a_repair_and_the_look_at_its_rewrite_once(
    project: Path, memory_dir: Path
) -> None:
    """Issue 21 item 3, ``STATUS=``: a repaired file and the daemon's look at its rewrite are
    one decision."""
    rig = Rig(settings(memory_dir))
    rig.daemon.start()
    rig.daemon.work()
    doc = staging_doc(project)
    del doc["candidates"]["lessons"][0]["triggers"]
    write(memory_dir / "staging" / "r.json", doc)
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "r.json"))
    rig.send(Signal(Kind.COMPLETE, str(memory_dir), "r.json"))  # the rewrite, seen
    assert rig.log.decisions("r.json") == ["repaired", "valid"]
    rig.after(1)
    status = [m[0] for m in rig.notes.messages if m[0].startswith("STATUS=")][-1]
    assert (
        status == "STATUS=watching 1 memory dirs; 1 decided, 0 quarantined, 1 repaired, 0 waiting"
    )
