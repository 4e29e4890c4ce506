"""The decision log's lines for every kind of decision event, key for key (SPEC 7).

Each test drives the real :class:`~memstaged.run.pipeline.Pipeline` on a temp memory dir with the
real log writer (its file sink, and its journal sink sending to a fake journald), and compares
each decision event's JSON line and its journal ``MESSAGE`` and ``PRIORITY`` to the ones
memstaged wrote when the event was a dict (taken from the code before the re-housing issue's
decision-event item made it a frozen Struct). Only what differs from run to run is put aside:
the temp dir (``<tmp>``), the timestamp, a duration's value and a traceback's text.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.documents import lesson, repairable_doc, staging_doc, write
from support.helpers import memory_dir_of

from memstaged.core.decide import Decision
from memstaged.core.repair import Repair
from memstaged.files import transaction
from memstaged.files.locks import CANONICAL_LOCK
from memstaged.files.memdir import Options
from memstaged.files.plan import Action, Plan, Settled
from memstaged.log import writer
from memstaged.run import pipeline as pipeline_module
from memstaged.run.decision import DecisionEvent, abandoned, name_settled
from memstaged.run.pipeline import Pipeline

#: A file old enough to be settled.
_OLD = 1_700_000_000


class _Hooked:
    """The real logger, with a hook called after each event (a race staged at an announcement)."""

    def __init__(self) -> None:
        self.inner = writer.get_logger()
        self.hook: Callable[[str, dict[str, Any]], None] | None = None

    def _log(self, level: str, event: str, fields: dict[str, Any]) -> None:
        getattr(self.inner, level)(event, **fields)
        if self.hook is not None:
            self.hook(event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log("critical", event, fields)


class _Log:
    """The decision log file and the fake journal, read back with what varies put aside."""

    def __init__(self, tmp_path: Path, memory_dir: Path) -> None:
        self.tmp = str(tmp_path)
        self.mdir = str(memory_dir)
        self.file = tmp_path / "decisions.jsonl"
        self.journal: list[dict[str, str]] = []
        writer.configure(self.file, console="off", journal="off")
        writer.add_sink(writer.JournalSink(send=self._send))
        self.logger = _Hooked()

    def _send(self, *lines: bytes) -> None:
        fields = dict(line.decode("utf-8", "surrogateescape").split("=", 1) for line in lines)
        if fields.get("MEMSTAGED_EVENT") == "decision":
            self.journal.append(fields)

    def pipeline(self, **options: Any) -> Pipeline:
        return Pipeline(
            Options(**{"settle": 0, **options}), self.logger, durable_log=writer.durable
        )

    def lines(self) -> list[str]:
        """The decision events' lines, the temp dir, time, durations and tracebacks put aside."""
        out = []
        for written in self.file.read_text().splitlines():
            if json.loads(written)["event"] != "decision":
                continue
            line = written.replace(self.mdir, "<mdir>").replace(self.tmp, "<tmp>")
            line = re.sub(r'"timestamp":"[^"]*"', '"timestamp":"<ts>"', line)
            line = re.sub(r'"duration_ms":[0-9.e+-]+', '"duration_ms":"<ms>"', line)
            out.append(
                re.sub(r'"traceback":"Traceback (?:[^"\\]|\\.)*"', '"traceback":"<tb>"', line)
            )
        return out

    def messages(self) -> list[tuple[str, str]]:
        """The journal's (PRIORITY, MESSAGE) of each decision event."""
        return [
            (f["PRIORITY"], f["MESSAGE"].replace(self.mdir, "<mdir>").replace(self.tmp, "<tmp>"))
            for f in self.journal
        ]


@pytest.fixture
def log(tmp_path: Path, memory_dir: Path) -> Iterator[_Log]:
    yield _Log(tmp_path, memory_dir)
    writer.close()


def _stage(memory_dir: Path, name: str, doc: Any) -> None:
    path = memory_dir / "staging" / name
    write(path, doc)
    os.utime(path, (_OLD, _OLD))


def _line(event: dict[str, Any]) -> str:
    """An event as the log writes it (msgspec's JSON: compact, UTF-8 as it is)."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))


def _check(log: _Log, lines: list[dict[str, Any]], messages: list[tuple[str, str]]) -> None:
    """The decision events' lines are exactly ``lines``, keys in that order, and the journal's
    priorities and messages ``messages``."""
    assert log.lines() == [_line(event) for event in lines]
    assert log.messages() == messages


def test_valid_repaired_and_own_rewrite(memory_dir: Path, log: _Log) -> None:
    """A valid file, a repair (with ``rewrite_sha256``) and memstaged's look at its own rewrite
    (``own_rewrite``) are logged at info, key for key as before."""
    _stage(memory_dir, "valid.json", staging_doc(".", "s-valid"))
    _stage(memory_dir, "repair.json", repairable_doc("."))
    pipeline = log.pipeline()
    mdir = memory_dir_of(memory_dir)
    for name in ("valid.json", "repair.json", "repair.json"):
        pipeline.process(mdir, name)
    _check(
        log,
        [
            {
                "path": "<mdir>/staging/valid.json",
                "memory_dir": "<mdir>",
                "decision": "valid",
                "session_id": "s-valid",
                "sha256": "cfdf90af8e415cf3d56682b803a043a89fc7130cffcd9c63a496c9e47fba2750",
                "size": 504,
                "reasons": [],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/repair.json",
                "memory_dir": "<mdir>",
                "decision": "repaired",
                "session_id": "s1",
                "sha256": "c7d84a89473c429fd20b9ba417eefe9e19897c6849dbd32cb2aeff3a3e15ce65",
                "size": 378,
                "reasons": ["candidates.lessons[0].triggers: must not be empty"],
                "repairs": [
                    {
                        "rule": "R1",
                        "where": "candidates.lessons[0].triggers",
                        "wrote": [{"type": "topic", "value": "."}],
                    }
                ],
                "rewrite_sha256": (
                    "a88b8d77ed77e5bab705bfc961d8f3e48079676432da192e3feabfab59c0835a"
                ),
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/repair.json",
                "memory_dir": "<mdir>",
                "decision": "valid",
                "session_id": "s1",
                "sha256": "a88b8d77ed77e5bab705bfc961d8f3e48079676432da192e3feabfab59c0835a",
                "size": 380,
                "reasons": [],
                "own_rewrite": True,
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
        ],
        [
            ("6", "valid <mdir>/staging/valid.json"),
            (
                "5",
                "repaired <mdir>/staging/repair.json: repaired by R1 at "
                "candidates.lessons[0].triggers",
            ),
            (
                "6",
                "valid <mdir>/staging/repair.json: memstaged's own rewrite, looked at again (not a "
                "new decision)",
            ),
        ],
    )


def test_quarantined_and_partly_quarantined(memory_dir: Path, log: _Log) -> None:
    """A quarantine (its reasons, ``repairable`` and ``deadletter``) is a warning, and a repair
    that split candidates off (R4) is ``partly_quarantined``, as before."""
    _stage(
        memory_dir,
        "bad.json",
        staging_doc(".", "s-bad", schemaVersion=2, candidates={"lessons": [lesson(triggers=[])]}),
    )
    _stage(
        memory_dir,
        "split.json",
        staging_doc(
            ".", "s-split", candidates={"lessons": [lesson("good"), lesson("bad", summary="")]}
        ),
    )
    mdir = memory_dir_of(memory_dir)
    log.pipeline().process(mdir, "bad.json")
    log.pipeline(split_invalid_candidates=True).process(mdir, "split.json")
    _check(
        log,
        [
            {
                "path": "<mdir>/staging/bad.json",
                "memory_dir": "<mdir>",
                "decision": "quarantined",
                "session_id": "s-bad",
                "sha256": "bd33e22b3528de1f3d0549918308d9b2656213016874ded6f73f78d093fe0b85",
                "size": 381,
                "reasons": [
                    "schemaVersion: must be the number 1",
                    "candidates.lessons[0].triggers: must not be empty",
                ],
                "repairable": ["candidates.lessons[0].triggers: must not be empty"],
                "deadletter": [
                    "deadletter/bad-bd33e22b3528de1f-lessons-0.json",
                    "deadletter/originals/bad.json.bd33e22b3528de1f.orig",
                ],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "warning",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/split.json",
                "memory_dir": "<mdir>",
                "decision": "repaired",
                "session_id": "s-split",
                "sha256": "23ff3b9ff49420f38f15c670b947ed0490d1e8d864b5de826587d22e5c6fcc9f",
                "size": 654,
                "reasons": ["candidates.lessons[1].summary: must be a non-empty string"],
                "repairs": [
                    {
                        "rule": "R4",
                        "where": "candidates.lessons[1]",
                        "wrote": "deadletter/split-23ff3b9ff49420f3-lessons-1.json",
                    }
                ],
                "partly_quarantined": True,
                "rewrite_sha256": (
                    "eb9d0403c4279baa3316b18a005016734b12cc742c11f6e4c7eefd9a04ab1106"
                ),
                "deadletter": [
                    "deadletter/split-23ff3b9ff49420f3-lessons-1.json",
                    "deadletter/originals/split.json.23ff3b9ff49420f3.orig",
                ],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
        ],
        [
            (
                "4",
                "quarantined <mdir>/staging/bad.json: schemaVersion: must be the number 1 (+1 "
                "more)",
            ),
            ("5", "repaired <mdir>/staging/split.json: repaired by R4 at candidates.lessons[1]"),
        ],
    )


def test_foreign_skipped_and_deferred(project: Path, memory_dir: Path, log: _Log) -> None:
    """Another project's file, the skips (a name that is no staging file's, a link, a
    ``staging/`` that is a link) and the waits (an unsettled file, a held lock) are logged as
    before."""
    _stage(memory_dir, "foreign.json", staging_doc("/somewhere/else", "s-foreign"))
    (memory_dir / "staging" / "notes.txt").write_bytes(b"not a staging file")
    os.symlink("/etc/hostname", memory_dir / "staging" / "link.json")
    write(memory_dir / "staging" / "fresh.json", staging_doc(".", "s-fresh"))
    _stage(memory_dir, "locked.json", staging_doc(".", "s-locked"))
    mdir = memory_dir_of(memory_dir)
    pipeline = log.pipeline()
    for name in ("foreign.json", "notes.txt", "link.json"):
        pipeline.process(mdir, name)
    log.pipeline(settle=3600).process(mdir, "fresh.json")
    (memory_dir / CANONICAL_LOCK).write_bytes(b"")
    pipeline.process(mdir, "locked.json")

    other = project.parent / "other" / ".pi" / "memory" / "project"
    other.mkdir(parents=True)
    os.symlink(memory_dir / "staging", other / "staging")
    pipeline.scan(memory_dir_of(other))
    pipeline.process(memory_dir_of(other), "x.json")
    _check(
        log,
        [
            {
                "path": "<mdir>/staging/foreign.json",
                "memory_dir": "<mdir>",
                "decision": "foreign",
                "session_id": "s-foreign",
                "sha256": "9ed04068f3c1683a824f3482297c6497d0142e22f183b20520c575e3dcfd519f",
                "size": 520,
                "reasons": ["project_root names /somewhere/else, not <tmp>/example-project"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/notes.txt",
                "memory_dir": "<mdir>",
                "decision": "skipped",
                "reasons": ["not a staging file name"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/link.json",
                "memory_dir": "<mdir>",
                "decision": "skipped",
                "reasons": ["symbolic link: never followed"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/fresh.json",
                "memory_dir": "<mdir>",
                "decision": "valid",
                "session_id": "s-fresh",
                "sha256": "852e01e114d3ea0d7d01384eae950282204575bb91772a6ce73d652686e5968f",
                "size": 504,
                "reasons": [],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/locked.json",
                "memory_dir": "<mdir>",
                "decision": "deferred",
                "reasons": ["canonical-writer.lock is held by a holder it does not name"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<tmp>/other/.pi/memory/project/staging",
                "memory_dir": "<tmp>/other/.pi/memory/project",
                "decision": "skipped",
                "reasons": ["staging/ is a symbolic link: never followed"],
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<tmp>/other/.pi/memory/project/staging/x.json",
                "memory_dir": "<tmp>/other/.pi/memory/project",
                "decision": "skipped",
                "reasons": ["staging/ is a symbolic link: never followed"],
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
        ],
        [
            (
                "6",
                "foreign <mdir>/staging/foreign.json: project_root names /somewhere/else, not "
                "<tmp>/example-project",
            ),
            ("6", "skipped <mdir>/staging/notes.txt: not a staging file name"),
            ("6", "skipped <mdir>/staging/link.json: symbolic link: never followed"),
            ("6", "valid <mdir>/staging/fresh.json"),
            (
                "6",
                "deferred <mdir>/staging/locked.json: canonical-writer.lock is held by a holder it "
                "does not name",
            ),
            (
                "6",
                "skipped <tmp>/other/.pi/memory/project/staging: staging/ is a symbolic link: "
                "never followed",
            ),
            (
                "6",
                "skipped <tmp>/other/.pi/memory/project/staging/x.json: staging/ is a symbolic "
                "link: never followed",
            ),
        ],
    )


def test_errors(
    project: Path, memory_dir: Path, log: _Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error (a memory dir that cannot be opened; a transaction that failed before its
    announcement) and an internal error (with its ``traceback``) defer the file at level error,
    logged as before."""
    _stage(memory_dir, "bug.json", staging_doc(".", "s-bug"))
    _stage(memory_dir, "eio.json", repairable_doc("."))
    gone = project.parent / "gone" / ".pi" / "memory" / "project"
    pipeline = log.pipeline()
    pipeline.process(memory_dir_of(gone), "x.json")

    def bug(*_args: Any) -> Any:
        raise RuntimeError("a bug in decide")

    with monkeypatch.context() as patch:
        patch.setattr(pipeline_module, "decide", bug)
        pipeline.process(memory_dir_of(memory_dir), "bug.json")

    def eio(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(transaction, "apply", eio)
        pipeline.process(memory_dir_of(memory_dir), "eio.json")
    assert '"traceback":"<tb>"' in log.lines()[1]
    assert "RuntimeError: a bug in decide" in log.file.read_text()
    _check(
        log,
        [
            {
                "path": "<tmp>/gone/.pi/memory/project/staging/x.json",
                "memory_dir": "<tmp>/gone/.pi/memory/project",
                "decision": "deferred",
                "reasons": [
                    "I/O error, will retry: No such file or directory: "
                    "<tmp>/gone/.pi/memory/project"
                ],
                "event": "decision",
                "level": "error",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/bug.json",
                "memory_dir": "<mdir>",
                "traceback": "<tb>",
                "decision": "deferred",
                "reasons": ["internal error, file left as it is: RuntimeError('a bug in decide')"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "error",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/eio.json",
                "memory_dir": "<mdir>",
                "decision": "deferred",
                "session_id": "s1",
                "sha256": "c7d84a89473c429fd20b9ba417eefe9e19897c6849dbd32cb2aeff3a3e15ce65",
                "size": 378,
                "reasons": [
                    "candidates.lessons[0].triggers: must not be empty",
                    "I/O error, will retry: Input/output error",
                ],
                "rewrite_sha256": (
                    "a88b8d77ed77e5bab705bfc961d8f3e48079676432da192e3feabfab59c0835a"
                ),
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "error",
                "timestamp": "<ts>",
            },
        ],
        [
            (
                "3",
                "deferred <tmp>/gone/.pi/memory/project/staging/x.json: I/O error, will retry: No "
                "such file or directory: <tmp>/gone/.pi/memory/project",
            ),
            (
                "3",
                "deferred <mdir>/staging/bug.json: internal error, file left as it is: "
                "RuntimeError('a bug in decide')",
            ),
            (
                "3",
                "deferred <mdir>/staging/eio.json: candidates.lessons[0].triggers: must not be "
                "empty (+1 more)",
            ),
        ],
    )


def test_dry_run(project: Path, memory_dir: Path, log: _Log) -> None:
    """A dry run's decisions are marked ``dry_run``, at the same levels, as before; the skip of
    a ``staging/`` that is a link too (SPEC 7: it was the one decision left unmarked)."""
    _stage(memory_dir, "repair.json", repairable_doc("."))
    _stage(memory_dir, "bad.json", staging_doc(".", "s-bad", schemaVersion=2))
    (memory_dir / "staging" / "notes.txt").write_bytes(b"not a staging file")
    pipeline = log.pipeline(dry_run=True)
    mdir = memory_dir_of(memory_dir)
    for name in ("repair.json", "bad.json", "notes.txt"):
        pipeline.process(mdir, name)
    other = project.parent / "other" / ".pi" / "memory" / "project"
    other.mkdir(parents=True)
    os.symlink(memory_dir / "staging", other / "staging")
    pipeline.scan(memory_dir_of(other))
    _check(
        log,
        [
            {
                "path": "<mdir>/staging/repair.json",
                "memory_dir": "<mdir>",
                "dry_run": True,
                "decision": "repaired",
                "session_id": "s1",
                "sha256": "c7d84a89473c429fd20b9ba417eefe9e19897c6849dbd32cb2aeff3a3e15ce65",
                "size": 378,
                "reasons": ["candidates.lessons[0].triggers: must not be empty"],
                "repairs": [
                    {
                        "rule": "R1",
                        "where": "candidates.lessons[0].triggers",
                        "wrote": [{"type": "topic", "value": "."}],
                    }
                ],
                "rewrite_sha256": (
                    "a88b8d77ed77e5bab705bfc961d8f3e48079676432da192e3feabfab59c0835a"
                ),
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/bad.json",
                "memory_dir": "<mdir>",
                "dry_run": True,
                "decision": "quarantined",
                "session_id": "s-bad",
                "sha256": "a94a36c748d473bbfa8c11e856dd179bc7736432e79fba3c0e89837ff65f4128",
                "size": 502,
                "reasons": ["schemaVersion: must be the number 1"],
                "deadletter": [
                    "deadletter/bad-a94a36c748d473bb-lessons-0.json",
                    "deadletter/bad-a94a36c748d473bb-preferences-0.json",
                    "deadletter/originals/bad.json.a94a36c748d473bb.orig",
                ],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "warning",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/notes.txt",
                "memory_dir": "<mdir>",
                "dry_run": True,
                "decision": "skipped",
                "reasons": ["not a staging file name"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<tmp>/other/.pi/memory/project/staging",
                "memory_dir": "<tmp>/other/.pi/memory/project",
                "dry_run": True,
                "decision": "skipped",
                "reasons": ["staging/ is a symbolic link: never followed"],
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
        ],
        [
            (
                "5",
                "repaired (dry run) <mdir>/staging/repair.json: repaired by R1 at "
                "candidates.lessons[0].triggers",
            ),
            (
                "4",
                "quarantined (dry run) <mdir>/staging/bad.json: schemaVersion: must be the number "
                "1",
            ),
            ("6", "skipped (dry run) <mdir>/staging/notes.txt: not a staging file name"),
            (
                "6",
                "skipped (dry run) <tmp>/other/.pi/memory/project/staging: staging/ is a "
                "symbolic link: never followed",
            ),
        ],
    )


def test_announced_then_abandoned(memory_dir: Path, log: _Log) -> None:
    """A decision announced and then not carried out (its file vanished, or changed, under the
    lock) is logged again as what it became, with ``planned`` and without ``repairs`` and
    ``deadletter``, as before."""
    _stage(memory_dir, "vanish.json", repairable_doc("."))
    _stage(memory_dir, "change.json", staging_doc(".", "s-change", schemaVersion=2))
    staging = memory_dir / "staging"

    def race(event: str, fields: dict[str, Any]) -> None:
        name = Path(str(fields.get("path"))).name
        if event != "decision" or "planned" in fields:
            return
        if name == "vanish.json":
            (staging / name).unlink()
        elif name == "change.json":  # by a rename: a write would wait for the read lease
            write(staging / ".new", staging_doc(".", "s-changed"))
            (staging / ".new").rename(staging / name)

    log.logger.hook = race
    pipeline = log.pipeline()
    mdir = memory_dir_of(memory_dir)
    for name in ("vanish.json", "change.json"):
        pipeline.process(mdir, name)
    _check(
        log,
        [
            {
                "path": "<mdir>/staging/vanish.json",
                "memory_dir": "<mdir>",
                "decision": "repaired",
                "session_id": "s1",
                "sha256": "c7d84a89473c429fd20b9ba417eefe9e19897c6849dbd32cb2aeff3a3e15ce65",
                "size": 378,
                "reasons": ["candidates.lessons[0].triggers: must not be empty"],
                "repairs": [
                    {
                        "rule": "R1",
                        "where": "candidates.lessons[0].triggers",
                        "wrote": [{"type": "topic", "value": "."}],
                    }
                ],
                "rewrite_sha256": (
                    "a88b8d77ed77e5bab705bfc961d8f3e48079676432da192e3feabfab59c0835a"
                ),
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/vanish.json",
                "memory_dir": "<mdir>",
                "decision": "skipped",
                "session_id": "s1",
                "sha256": "c7d84a89473c429fd20b9ba417eefe9e19897c6849dbd32cb2aeff3a3e15ce65",
                "size": 378,
                "reasons": [
                    "candidates.lessons[0].triggers: must not be empty",
                    "vanished before the decision was applied",
                ],
                "rewrite_sha256": (
                    "a88b8d77ed77e5bab705bfc961d8f3e48079676432da192e3feabfab59c0835a"
                ),
                "duration_ms": "<ms>",
                "planned": "repaired",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/change.json",
                "memory_dir": "<mdir>",
                "decision": "quarantined",
                "session_id": "s-change",
                "sha256": "547cf07db05932a9192d99bc8bf724e3e0c1c60a261172083cea2839d078ad40",
                "size": 505,
                "reasons": ["schemaVersion: must be the number 1"],
                "deadletter": [
                    "deadletter/change-547cf07db05932a9-lessons-0.json",
                    "deadletter/change-547cf07db05932a9-preferences-0.json",
                    "deadletter/originals/change.json.547cf07db05932a9.orig",
                ],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "warning",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/change.json",
                "memory_dir": "<mdir>",
                "decision": "deferred",
                "session_id": "s-change",
                "sha256": "547cf07db05932a9192d99bc8bf724e3e0c1c60a261172083cea2839d078ad40",
                "size": 505,
                "reasons": [
                    "schemaVersion: must be the number 1",
                    "changed while being decided: the newer version is kept and decided afresh",
                ],
                "duration_ms": "<ms>",
                "planned": "quarantined",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
        ],
        [
            (
                "5",
                "repaired <mdir>/staging/vanish.json: repaired by R1 at "
                "candidates.lessons[0].triggers",
            ),
            (
                "6",
                "skipped <mdir>/staging/vanish.json: candidates.lessons[0].triggers: must not be "
                "empty (+1 more)",
            ),
            ("4", "quarantined <mdir>/staging/change.json: schemaVersion: must be the number 1"),
            (
                "6",
                "deferred <mdir>/staging/change.json: schemaVersion: must be the number 1 (+1 "
                "more)",
            ),
        ],
    )


def test_names_taken_in_deadletter(memory_dir: Path, log: _Log) -> None:
    """Where the planned names under ``deadletter/`` are taken, the event names the files really
    written: ``deadletter`` and an R6 repair's ``wrote.original``, as before."""
    inner = {"text": "Small commits", "source_evidence": {"discussion_note_ids": [1]}}
    wrapper = {"candidate": inner, "original_staging_file": {"a": 1}}
    wrapped = json.dumps(staging_doc(".", "w", candidates={"preferences": [wrapper]})).encode()
    bad = json.dumps(staging_doc(".", "s-bad", schemaVersion=2)).encode()
    originals = memory_dir / "deadletter" / "originals"
    originals.mkdir(parents=True)
    for name, data in (("w.json", wrapped), ("bad.json", bad)):
        sha = hashlib.sha256(data).hexdigest()[:16]
        (originals / f"{name}.{sha}.orig").write_bytes(b"not the original\n")
        _stage(memory_dir, name, data)
    bad_sha = hashlib.sha256(bad).hexdigest()[:16]
    (memory_dir / "deadletter" / f"bad-{bad_sha}-lessons-0.json").write_bytes(b"taken\n")
    pipeline = log.pipeline()
    mdir = memory_dir_of(memory_dir)
    for name in ("w.json", "bad.json"):
        pipeline.process(mdir, name)
    _check(
        log,
        [
            {
                "path": "<mdir>/staging/w.json",
                "memory_dir": "<mdir>",
                "decision": "repaired",
                "session_id": "w",
                "sha256": "b6999bc9392c27e61c6753fbcbe36cfdf107e95ee8446abd5e6d701ca68e591b",
                "size": 308,
                "reasons": [
                    "candidates.preferences[0].text: is missing",
                    "candidates.preferences[0].source_evidence: is missing",
                ],
                "repairs": [
                    {
                        "rule": "R6",
                        "where": "candidates.preferences[0]",
                        "wrote": {
                            "unwrapped": "candidate",
                            "original": "deadletter/originals/w.json.b6999bc9392c27e6.2.orig",
                        },
                    }
                ],
                "rewrite_sha256": (
                    "9a2a6b604f8ef2dea76a1572172a7b8321a8c0d099cc329eb18a45cc33e07609"
                ),
                "deadletter": ["deadletter/originals/w.json.b6999bc9392c27e6.2.orig"],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "info",
                "timestamp": "<ts>",
            },
            {
                "path": "<mdir>/staging/bad.json",
                "memory_dir": "<mdir>",
                "decision": "quarantined",
                "session_id": "s-bad",
                "sha256": "a94a36c748d473bbfa8c11e856dd179bc7736432e79fba3c0e89837ff65f4128",
                "size": 502,
                "reasons": ["schemaVersion: must be the number 1"],
                "deadletter": [
                    "deadletter/bad-a94a36c748d473bb-lessons-0.2.json",
                    "deadletter/bad-a94a36c748d473bb-preferences-0.json",
                    "deadletter/originals/bad.json.a94a36c748d473bb.2.orig",
                ],
                "duration_ms": "<ms>",
                "event": "decision",
                "level": "warning",
                "timestamp": "<ts>",
            },
        ],
        [
            ("5", "repaired <mdir>/staging/w.json: repaired by R6 at candidates.preferences[0]"),
            ("4", "quarantined <mdir>/staging/bad.json: schemaVersion: must be the number 1"),
        ],
    )


def _r6_event() -> DecisionEvent:
    wrote = {"unwrapped": "candidate", "original": "deadletter/originals/w.json.ab.orig"}
    return DecisionEvent(
        path="/m/staging/w.json",
        memory_dir="/m",
        decision=Decision.REPAIRED,
        session_id=None,
        sha256="ab",
        size=1,
        reasons=("r",),
        repairs=(Repair("R6", "candidates.preferences[0]", wrote),),
        deadletter=("deadletter/originals/w.json.ab.orig",),
    )


def test_name_settled_makes_a_new_event() -> None:
    """``name_settled`` returns a new event naming the files really written, an R6 repair
    rebuilt; the event and the repair it was given (the verdict's) stay as they were."""
    event = _r6_event()
    before = msgspec.json.encode(event)
    plan = Plan(key="w.json", action=Action.REWRITE, original="w.json.ab.orig")
    named = name_settled(event, plan, Settled("w.json", (), "w.json.ab.2.orig"))
    assert msgspec.json.encode(event) == before
    assert named.deadletter == ("deadletter/originals/w.json.ab.2.orig",)
    assert named.repairs[0].wrote == {
        "unwrapped": "candidate",
        "original": "deadletter/originals/w.json.ab.2.orig",
    }
    assert named.fields()["repairs"] == [
        {"rule": "R6", "where": "candidates.preferences[0]", "wrote": named.repairs[0].wrote}
    ]
    with pytest.raises(AttributeError):
        named.decision = Decision.VALID  # type: ignore[misc]


def test_abandoned_and_fields() -> None:
    """An abandoned plan's event says what it became and what was ``planned`` (if announced),
    without repairs or dead-letter files; its fields are those of the dict it replaced: in
    order, lists, ``session_id`` null once decided, defaults left out."""
    event = _r6_event()
    gone = abandoned(event, Decision.SKIPPED, "vanished", announced=True)
    assert gone.fields() == {
        "path": "/m/staging/w.json",
        "memory_dir": "/m",
        "decision": "skipped",
        "session_id": None,
        "sha256": "ab",
        "size": 1,
        "reasons": ["r", "vanished"],
        "planned": "repaired",
    }
    assert list(gone.fields()) == list(_line_keys(gone))
    unannounced = abandoned(event, Decision.DEFERRED, "held", announced=False)
    assert "planned" not in unannounced.fields()
    bare = DecisionEvent(path="p", memory_dir="m", decision=Decision.SKIPPED, reasons=())
    assert bare.fields() == {"path": "p", "memory_dir": "m", "decision": "skipped", "reasons": []}


def _line_keys(event: DecisionEvent) -> list[str]:
    """The keys of the event's JSON line as msgspec writes the Struct itself."""
    return list(json.loads(msgspec.json.encode(event)))
