"""Fakes for driving :class:`memstaged.daemon.loop.Daemon` by hand: clock, notifier, watcher,
logger.

The daemon under test is real, and so is its pipeline on real files in a temp dir; only the
things that would make a test wait or depend on timing are replaced: the watchdog observer (tests
hand the daemon synthetic signals), the monotonic clock, sd_notify and the structlog logger.
:class:`RecordingLogger` also serves the tests that drive :class:`memstaged.run.pipeline.Pipeline`
directly (:func:`decide_one`: tests/run/test_pipeline.py, test_races.py).
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memstaged import config
from memstaged.config import Settings
from memstaged.daemon.loop import Daemon
from memstaged.daemon.sd_notify import Notifier
from memstaged.daemon.watcher import Kind, Signal
from memstaged.files.memdir import MemoryDir, Options
from memstaged.run.decision import Outcome
from memstaged.run.pipeline import Pipeline
from support.helpers import memory_dir_of


def decide_one(
    mdir: Path, name: str, **options: Any
) -> tuple[Outcome, dict[str, Any], RecordingLogger]:
    """Decide ``staging/<name>`` of ``mdir`` in this process, through the pipeline (settle 0 and
    the memory dir's ``options``); the outcome, its (last) decision event, and the logger.

    A change is logged before it is carried out (SPEC 5); one that then could not be carried
    out gets a second event, saying what it became and what was ``planned``.
    """
    log = RecordingLogger()
    pipeline = Pipeline(Options(settle=0, **options), log)
    outcome = pipeline.process(memory_dir_of(mdir), name)
    events = [e for e in log.events if e["event"] == "decision"]
    assert len(events) in (1, 2), log.events
    if len(events) == 2:
        assert events[1]["planned"] == events[0]["decision"], events
    assert events[-1]["decision"] == outcome.decision.value
    return outcome, events[-1], log


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingLogger:
    """Stands in for the structlog logger: keeps every event as a dict with its level."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.hooks: list[Callable[[dict[str, Any]], None]] = []

    def _log(self, level: str, event: str, **fields: Any) -> None:
        entry = {"event": event, "level": level, **fields}
        self.events.append(entry)
        for hook in list(self.hooks):
            hook(entry)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, **fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log("critical", event, **fields)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    def decisions(self, name: str | None = None) -> list[str]:
        """The decisions logged, in order (for one file name, or all)."""
        return [
            e["decision"]
            for e in self.named("decision")
            if name is None or Path(e["path"]).name == name
        ]

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["level"] in ("error", "critical")]


class FakeWatcher:
    """Records what the daemon asks to watch; the test delivers the events itself."""

    def __init__(self, out: queue.SimpleQueue[Signal], mode: str) -> None:
        self.out = out
        self.mode = mode
        self.watching: dict[str, bool] = {}  # memory dir -> staging/ watched
        self.levels: dict[str, frozenset[str]] = {}  # glob parent dir -> patterns of entries
        self.watch_calls: list[str] = []
        self.is_alive = True
        self.stopped = False

    def watch(self, mdir: MemoryDir) -> str:
        if not Path(mdir.path).is_dir():
            raise FileNotFoundError(2, "No such file or directory", mdir.path)
        self.watch_calls.append(mdir.path)
        self.watching[mdir.path] = Path(mdir.staging).is_dir()
        return self.mode

    def unwatch(self, mdir: str) -> None:
        self.watching.pop(mdir, None)

    def staging_watched(self, mdir: str) -> bool:
        return self.watching.get(mdir, False)

    def watch_level(self, path: str, patterns: frozenset[str]) -> None:
        if not Path(path).is_dir():
            raise FileNotFoundError(2, "No such file or directory", path)
        self.levels[path] = patterns

    def unwatch_level(self, path: str) -> None:
        self.levels.pop(path, None)

    def alive(self) -> bool:
        return self.is_alive

    def stop(self) -> None:
        self.stopped = True


class Notes:
    """Every sd_notify message a :class:`Notifier` sent, one list of lines per message."""

    def __init__(self) -> None:
        self.messages: list[list[str]] = []

    def __call__(self, text: str) -> None:
        self.messages.append(text.split("\n"))

    def firsts(self) -> list[str]:
        """The first line of each message (``READY=1``, ``WATCHDOG=1``, ``STATUS=...``)."""
        return [m[0] for m in self.messages]

    def count(self, line: str) -> int:
        return sum(line in m for m in self.messages)


def notifier(notes: Notes, watchdog_usec: int | None = None) -> Notifier:
    env = {"NOTIFY_SOCKET": "/run/fake/notify"}
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    return Notifier(environ=env, send=notes)


def _env() -> dict[str, str]:
    """No config file; the state dir (the instance locks) in the test's own home (conftest)."""
    return {
        "HOME": "/nonexistent",
        "XDG_CONFIG_HOME": "/nonexistent",
        "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"],
    }


def settings(*memory_dirs: Path | str, settle: float = 2.0, dry_run: bool = False) -> Settings:
    """Settings as the command line would give them, with no config file and no environment."""
    return config.load(
        memory_dirs=[str(m) for m in memory_dirs], settle=settle, dry_run=dry_run, env=_env()
    )


def settings_from_file(config_file: Path) -> Settings:
    return config.load(config=str(config_file), env=_env())


class Rig:
    """A daemon with a fake clock, watcher, notifier and logger, plus helpers to drive it."""

    def __init__(
        self,
        settings: Settings,
        *,
        reload_settings: Callable[[], Settings] | None = None,
        watchdog_usec: int | None = None,
        wait: bool = False,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.log = RecordingLogger()
        self.notes = Notes()
        self.watchers: list[FakeWatcher] = []

        def factory(out: queue.SimpleQueue[Signal], mode: str) -> FakeWatcher:
            watcher = FakeWatcher(out, mode)
            self.watchers.append(watcher)
            return watcher

        self.daemon = Daemon(
            settings,
            self.log,
            reload_settings=reload_settings,
            notifier=notifier(self.notes, watchdog_usec),
            watcher_factory=factory,
            clock=self.clock,
            sleep=sleep or (lambda _seconds: None),
            wait=wait,
        )

    @property
    def watcher(self) -> FakeWatcher:
        return self.watchers[-1]

    def send(self, *signals: Signal) -> int:
        """Deliver signals the way the observer would (through the queue), then do due work."""
        for sig in signals:
            self.daemon.queue.put(sig)
        self.daemon.drain(0)
        return self.daemon.work()

    def after(self, seconds: float) -> int:
        """Let ``seconds`` pass, run the loop's housekeeping, and do the work that fell due."""
        self.clock.advance(seconds)
        self.daemon.maintain()
        self.daemon.drain(0)
        return self.daemon.work()


def started_rig(memory_dir: Path, **kwargs: Any) -> Rig:
    """A :class:`Rig` on one memory dir, its daemon started and its first scan worked off."""
    rig = Rig(settings(memory_dir), **kwargs)
    rig.daemon.start()
    rig.daemon.work()
    return rig


def complete_signal(mdir: Path, name: str) -> Signal:
    """What the watcher sends when a writer closes ``name`` in ``mdir``'s ``staging/``."""
    return Signal(Kind.COMPLETE, str(mdir), name)


def reconciler_lock(memory_dir: Path, pid: int) -> Path:
    """``canonical-writer.lock`` as the reconciler leaves it, naming ``pid`` as its holder."""
    lock = memory_dir / "canonical-writer.lock"
    lock.write_text(json.dumps({"pid": pid, "started_at": "2026-01-01", "owner": "reconciler"}))
    return lock
