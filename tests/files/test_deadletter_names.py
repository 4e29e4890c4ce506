"""Dead-letter names of files whose names sanitize alike (SPEC 4, SPEC 6; issue 13 item 1).

Record and original names are built from the staging file's name with every character outside
``A-Za-z0-9._-`` replaced by ``_``. So ``\\x01.json`` and ``_.json`` used to get the very same
names, and with identical bytes the same records: the second file's quarantine found "its"
records there, and a later quarantine of the same bytes wrote a second set under other names.
Each file must get its own set of records, each naming its own file and its own original, and
quarantining the same bytes again must add nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.commands import run
from support.daemon_fakes import RecordingLogger
from support.decision_log import read_events
from support.documents import empty_candidates, lesson, put, staging_doc
from support.helpers import make_memory_dir, memory_dir_of

from memstaged.core import decide as triage
from memstaged.core.decide import Context, Decision
from memstaged.files import fsio
from memstaged.files.memdir import Options
from memstaged.run.pipeline import Pipeline

pytestmark = pytest.mark.usefixtures("plain_output")

#: Two names that sanitize alike: a control character and the ``_`` it is replaced by.
NAMES = (b"\x01.json", b"_.json")


def _bytes(project: Path) -> bytes:
    """One file's bytes, quarantined with two candidate records (a bad lesson, a preference)."""
    doc = staging_doc(
        project,
        "same-session",
        candidates={
            "lessons": [lesson(triggers=[{"type": "nonsense"}])],
            "preferences": [{"text": "tabs", "source_evidence": {"discussion_note_ids": [3]}}],
            "decisions": [],
            "domain": [],
        },
    )
    return json.dumps(doc).encode()


def _put(memory_dir: Path, name: bytes, data: bytes) -> None:
    path = os.path.join(os.fsencode(memory_dir / "staging"), name)
    with open(path, "wb") as fh:
        fh.write(data)
    os.utime(path, (1_700_000_000, 1_700_000_000))


def _records(memory_dir: Path) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """source_file -> [(record name, record)] of every record in ``deadletter/``."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for entry in sorted((memory_dir / "deadletter").iterdir()):
        if entry.is_file():
            record = json.loads(entry.read_bytes())
            out.setdefault(record["memstaged"]["source_file"], []).append((entry.name, record))
    return out


def _check(memory_dir: Path, data: bytes) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Two record sets, one per file: each names its own file, holds both candidates, and
    points at an original of its own that holds the file's exact bytes."""
    records = _records(memory_dir)
    assert set(records) == {os.fsdecode(n) for n in NAMES}, records.keys()
    originals = {}
    for source, items in records.items():
        assert sorted(r["category"] for _, r in items) == ["lessons", "preferences"], items
        assert {r["memstaged"]["source_path"] for _, r in items} == {
            os.fsdecode(os.path.join(os.fsencode(memory_dir / "staging"), os.fsencode(source)))
        }
        [original] = {r["memstaged"]["original"] for _, r in items}
        assert (memory_dir / "deadletter" / original).read_bytes() == data
        originals[source] = original
    assert len(set(originals.values())) == 2, originals
    names = [{name for name, _ in items} for items in records.values()]
    assert not names[0] & names[1]
    return records


def _count(memory_dir: Path) -> tuple[int, int]:
    deadletter = memory_dir / "deadletter"
    files = [p for p in deadletter.iterdir() if p.is_file()]
    return len(files), len(list((deadletter / "originals").iterdir()))


def test_two_names_that_sanitize_alike_in_one_batch(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Both files quarantined by one ``--once`` (one transaction): two record sets, each its
    own; both again (same bytes): no record or original added."""
    data = _bytes(project)
    for name in NAMES:
        _put(memory_dir, name, data)
    code, _, err = run(capsys, "--once", "--memory-dir", str(memory_dir))
    assert code == 0, err
    assert not os.listdir(memory_dir / "staging")
    _check(memory_dir, data)
    assert _count(memory_dir) == (4, 2)
    for name in NAMES:
        _put(memory_dir, name, data)
    code, _, err = run(capsys, "--once", "--memory-dir", str(memory_dir))
    assert code == 0, err
    _check(memory_dir, data)
    assert _count(memory_dir) == (4, 2)


def test_two_names_that_sanitize_alike_in_two_runs(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """``\\x01.json`` quarantined first, ``_.json`` in a later run (and the reverse after a
    re-quarantine of each): two record sets, each its own, never a third."""
    data = _bytes(project)
    for name in (*NAMES, *reversed(NAMES)):
        _put(memory_dir, name, data)
        code, _, err = run(capsys, "--once", "--memory-dir", str(memory_dir))
        assert code == 0, err
    _check(memory_dir, data)
    assert _count(memory_dir) == (4, 2)


# -- what is at a name is trusted only under the lock ----------------------------------------------


@pytest.mark.parametrize("plant", ["dangling-link", "empty-file", "other-bytes"])
def test_something_already_at_a_deadletter_name_is_not_trusted(tmp_path: Path, plant: str) -> None:
    """Issue 10 item 3: a dangling link, an empty file or other bytes at the original's name (and at
    the record's): the original's bytes are written under another name, the staging file is removed
    only then, and the log names files that really hold them."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    data = b'{"schemaVersion": 1, "candidates": {"lessons": [{}]}, "project_root": "' + (
        root.encode() + b'"}'
    )
    put(mdir / "staging" / "bad.json", data)
    ctx = Context(project_root=root, file_name="bad.json")
    verdict = triage.decide(data, ctx)
    assert verdict.decision is Decision.QUARANTINED and verdict.original is not None
    originals = mdir / "deadletter" / "originals"
    originals.mkdir(parents=True)
    planted = [originals / verdict.original, mdir / "deadletter" / verdict.deadletter[0].name]
    for path in planted:
        if plant == "dangling-link":
            path.symlink_to(tmp_path / "nowhere")
        else:
            path.write_bytes(b"" if plant == "empty-file" else b"someone else's bytes")
    log = RecordingLogger()
    outcome = Pipeline(Options(settle=0), log, durable_log=contextlib.nullcontext).process(
        memory_dir_of(mdir), "bad.json"
    )
    assert outcome.decision is Decision.QUARANTINED
    assert not (mdir / "staging" / "bad.json").exists()
    event = next(e for e in log.events if e["event"] == "decision")
    named = [mdir / p for p in event["deadletter"]]
    kept = [p for p in named if p.parent == originals]
    assert len(kept) == 1 and kept[0].read_bytes() == data and not kept[0].is_symlink()
    for path in named:
        assert path.is_file() and not path.is_symlink() and path not in planted
    assert not (tmp_path / "nowhere").exists()
    record = json.loads(next(p for p in named if p.parent != originals).read_bytes())
    assert record["memstaged"]["original"] == f"originals/{kept[0].name}"


@pytest.mark.usefixtures("plain_output")
def test_records_point_at_the_original_that_took_another_name_under_the_lock(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """issue 10 (defect 2), SPEC 4: the records are written before the lock, pointing at the
    name their original should get; what is at a name is only trusted under the lock. If other
    bytes take that name in between (here: at the crash point right after the temps are made
    durable), the original goes under another name, and every record, and the logged decision,
    must name that one: the records are written again. Nothing else is touched, no temp is
    left."""
    data = empty_candidates(project, 30)
    (memory_dir / "staging" / "many.json").write_bytes(data)
    originals = memory_dir / "deadletter" / "originals"
    real_crash_point = fsio.crash_point
    squatted: list[Path] = []

    def squat(step: str) -> None:
        if step == "temps-synced" and not squatted:
            temp = next(p for p in originals.iterdir() if p.name.startswith(".memstaged~"))
            target = originals / temp.name.split("~")[2]  # the name it was written for
            target.write_bytes(b"someone else's bytes")
            squatted.append(target)
        real_crash_point(step)

    monkeypatch.setattr(fsio, "crash_point", squat)
    code, _, err = run(capsys, "--once", "--memory-dir", str(memory_dir))
    assert code == 0, err
    assert squatted and squatted[0].read_bytes() == b"someone else's bytes"
    kept = [p for p in originals.iterdir() if p.read_bytes() == data]
    assert len(kept) == 1 and kept[0] != squatted[0]
    deadletter = memory_dir / "deadletter"
    assert not [p for p in deadletter.rglob(".memstaged~*")]
    records = [json.loads(p.read_bytes()) for p in deadletter.glob("*.json")]
    assert len(records) == 30
    assert {r["memstaged"]["original"] for r in records} == {f"originals/{kept[0].name}"}
    logged = [e for e in read_events(log_file) if e.get("decision") == "quarantined"]
    assert f"deadletter/originals/{kept[0].name}" in logged[-1]["deadletter"]


def test_a_name_taken_after_the_listing_stops_the_transaction_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the lock the store is listed once, and a name the listing does not hold is used
    without a look of its own. Something put at a record's name after the listing (by someone
    outside memstaged) is never replaced: the rename fails, the transaction stops as on an I/O
    error (the file deferred, in place), and the next run, which sees it, names the record
    around it. Forced: the name is taken right after the listing."""
    from memstaged.files import deadletter_names

    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    data = b'{"schemaVersion": 1, "candidates": {"lessons": [{}]}, "project_root": "' + (
        root.encode() + b'"}'
    )
    put(mdir / "staging" / "bad.json", data)
    verdict = triage.decide(data, Context(project_root=root, file_name="bad.json"))
    squatter = mdir / "deadletter" / verdict.deadletter[0].name
    real_list = deadletter_names.Names.list

    def list_then_squat(names: deadletter_names.Names, dir_fd: int, most: int) -> None:
        real_list(names, dir_fd, most)
        if not squatter.exists():
            squatter.write_bytes(b"someone else's bytes")

    monkeypatch.setattr(deadletter_names.Names, "list", list_then_squat)
    pipeline = Pipeline(Options(settle=0), RecordingLogger(), durable_log=contextlib.nullcontext)
    first = pipeline.process(memory_dir_of(mdir), "bad.json")
    assert first.decision is Decision.DEFERRED and first.error
    assert (mdir / "staging" / "bad.json").read_bytes() == data
    assert squatter.read_bytes() == b"someone else's bytes"
    monkeypatch.undo()
    log = RecordingLogger()
    second = Pipeline(Options(settle=0), log, durable_log=contextlib.nullcontext).process(
        memory_dir_of(mdir), "bad.json"
    )
    assert second.decision is Decision.QUARANTINED
    assert squatter.read_bytes() == b"someone else's bytes"
    event = next(e for e in log.events if e["event"] == "decision")
    assert f"deadletter/{squatter.name}" not in event["deadletter"]
    kept = [mdir / p for p in event["deadletter"] if "/originals/" in p]
    assert [p.read_bytes() for p in kept] == [data]
    assert not list(mdir.rglob(".memstaged~*"))
