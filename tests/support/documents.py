"""Staging documents as the tests build and write them: the tests' one document builder.

:func:`lesson`, :func:`preference` and :func:`decision` are valid candidates (a ``cid`` marks
one, keyword changes alter it, :data:`DELETE` removes a key); :func:`staging_doc` is a valid
staging file of a project (contract v2: all four categories), changed with keyword overrides;
:func:`malformed`, :func:`repairable` and :func:`unparseable` are such files' bytes for each
outcome, :func:`backlog` and :func:`one_of_each` stage several, :func:`write` and :func:`put`
put a document (or raw bytes) at a path. The engine's tests build on them
(:mod:`support.engine`); the decision log is read back by :mod:`support.decision_log`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Final

EVIDENCE = {"discussion_note_ids": [1, 2]}
#: A settled mtime: a staging file dated then is never deferred for its settle interval (SPEC 5).
OLD: Final = 1_700_000_000


#: A value of :func:`lesson`'s changes (and of :mod:`support.engine`'s builders) that removes
#: the key.
DELETE: Final = object()


def changed(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``changes``, without the keys set to :data:`DELETE`."""
    base.update(changes)
    return {key: value for key, value in base.items() if value is not DELETE}


def lesson(cid: str = "", **changes: Any) -> dict[str, Any]:
    """A valid lesson candidate; ``cid`` marks its summary and detail, so that a test tells its
    candidates apart in records and rewrites."""
    mark = f"{cid} " if cid else ""
    base: dict[str, Any] = {
        "summary": f"{mark}Run mypy before committing",
        "detail": f"{mark}Strict mode caught the Optional misuse.",
        "scope_suggestion": "project",
        "triggers": [{"type": "command", "pattern": "git commit"}],
        "source_evidence": EVIDENCE,
    }
    return changed(base, changes)


def preference(cid: str = "", **changes: Any) -> dict[str, Any]:
    """A valid preference candidate; ``cid`` marks its text, as :func:`lesson`'s does."""
    mark = f"{cid} " if cid else ""
    base: dict[str, Any] = {
        "text": f"{mark}Prefer small commits",
        "source_evidence": {"lesson_candidate_marker_ids": ["m-1"]},
    }
    return changed(base, changes)


def decision(cid: str = "", **changes: Any) -> dict[str, Any]:
    """A valid decision (or domain) candidate; ``cid`` marks its summary and detail."""
    mark = f"{cid} " if cid else ""
    base: dict[str, Any] = {
        "summary": f"{mark}Use msgspec",
        "detail": f"{mark}It decodes straight from bytes.",
        "source_evidence": {"discussion_note_ids": [3, 4.5]},
    }
    return changed(base, changes)


def staging_doc(project_root: Path | str, session: str = "s1", **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "session_id": session,
        "project_root": str(project_root),
        "produced_at": "2026-11-29T18:04:11.250Z",
        "candidates": {
            "lessons": [lesson()],
            "preferences": [{"text": "Small commits", "source_evidence": EVIDENCE}],
            "decisions": [],
            "domain": [],
        },
    }
    doc.update(overrides)
    if isinstance(doc["candidates"], dict):  # contract v2 (2.1): all four categories are required
        doc["candidates"] = {c: [] for c in ("lessons", "preferences", "decisions", "domain")} | (
            doc["candidates"]
        )
    return doc


def repairable_doc(project_root: Path | str) -> dict[str, Any]:
    """A staging document that R1 repairs: its one lesson has no triggers."""
    return staging_doc(project_root, candidates={"lessons": [lesson(triggers=[])]})


def empty_candidates(project_root: Path | str, count: int) -> bytes:
    """A small file (3 bytes per candidate) whose every preference is ``{}``: one dead-letter
    record per candidate."""
    doc = staging_doc(project_root, "many", candidates={"preferences": [{}] * count})
    return json.dumps(doc, separators=(",", ":")).encode()


def malformed(root: Path | str, session: Any = "s", padding: int = 0) -> bytes:
    """JSON that SPEC 2 refuses (``schemaVersion`` the string ``"1"``), of one lesson marked
    ``cid-h``: quarantined; ``padding`` characters make it larger."""
    doc = staging_doc(root, session, candidates={"lessons": [lesson("cid-h")]}, schemaVersion="1")
    if padding:
        doc["padding"] = "x" * padding
    return json.dumps(doc).encode()


def repairable(root: Path | str, session: Any = "s", padding: int = 0) -> bytes:
    """A staging file R1 repairs: its one lesson (``cid-h``) has no triggers."""
    doc = staging_doc(root, session, candidates={"lessons": [lesson("cid-h", triggers=[])]})
    if padding:
        doc["padding"] = "x" * padding
    return json.dumps(doc).encode()


def unparseable(root: Path | str, filler: str) -> bytes:
    """Not JSON at all (quarantined once settled), naming ``root``, its size fixed by ``filler``."""
    return ('{"project_root": "' + str(root) + '", "x": "' + filler + '"').encode()


def put(path: Path, data: bytes, mtime: float = OLD) -> bytes:
    """Write ``data`` at ``path``, dated ``mtime`` (settled by default); returns ``data``."""
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return data


def write(path: Path, doc: Any) -> bytes:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    path.write_bytes(data)
    return data


def backlog(project: Path, memory_dir: Path, n: int) -> dict[str, str]:
    """``n`` files: valid, repairable (no triggers) and malformed in turn; name -> expected."""
    staging = memory_dir / "staging"
    expected: dict[str, str] = {}
    for i in range(n):
        name = f"f{i:04d}.json"
        if i % 3 == 0:
            write(staging / name, staging_doc(project, f"s{i}"))
            expected[name] = "valid"
        elif i % 3 == 1:
            doc = staging_doc(project, f"s{i}", candidates={"lessons": [lesson(triggers=[])]})
            write(staging / name, doc)
            expected[name] = "repaired"
        else:
            write(staging / name, staging_doc(project, f"s{i}", schemaVersion="1"))
            expected[name] = "quarantined"
        os.utime(staging / name, (1_700_000_000, 1_700_000_000))
    return expected


def settled(*paths: Path) -> None:
    """Date files back to :data:`OLD`, so that none is deferred for its settle interval."""
    for path in paths:
        os.utime(path, (OLD, OLD))


def one_of_each(project: Path, memory_dir: Path) -> dict[str, Path]:
    """One settled file per decision in ``staging/``: valid.json, fix.json (repairable: a lesson
    without triggers), bad.json (a trigger of an unknown type) and far.json (another project's);
    decision -> path."""
    staging = memory_dir / "staging"
    bad = staging_doc(project, "bad", candidates={"lessons": [lesson(triggers=[{"type": "x"}])]})
    files = {
        "valid": staging / "valid.json",
        "repaired": staging / "fix.json",
        "quarantined": staging / "bad.json",
        "foreign": staging / "far.json",
    }
    no_triggers = staging_doc(project, "fix")
    del no_triggers["candidates"]["lessons"][0]["triggers"]
    write(files["valid"], staging_doc(project, "ok"))
    write(files["repaired"], no_triggers)
    write(files["quarantined"], bad)
    write(files["foreign"], staging_doc("/elsewhere", "far"))
    settled(*files.values())
    return files


def half_written_ahead(memory_dir: Path) -> None:
    """A half-written ``staging/half.json`` dated a day ahead: it settles counting from when
    memstaged first sees it (SPEC 5), not from its write, which a busy machine may have made
    seconds before."""
    path = memory_dir / "staging" / "half.json"
    write(path, b'{"schemaVersion": 1, "sess')
    ahead = time.time() + 86_400
    os.utime(path, (ahead, ahead))
