"""Dead-letter names of files whose names sanitize alike (SPEC 4, SPEC 6; issue 13 item 1).

Record and original names are built from the staging file's name with every character outside
``A-Za-z0-9._-`` replaced by ``_``. So ``\\x01.json`` and ``_.json`` used to get the very same
names, and with identical bytes the same records: the second file's quarantine found "its"
records there, and a later quarantine of the same bytes wrote a second set under other names.
Each file must get its own set of records, each naming its own file and its own original, and
quarantining the same bytes again must add nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.commands import run
from support.documents import lesson, staging_doc

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
