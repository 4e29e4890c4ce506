"""Shared fixtures: a memory dir in a temp project, staging-file builders, clean logging and
plain (uncoloured) command output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from memstaged import log


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """Each test starts and ends with no memstaged log sinks and default structlog."""
    yield
    log.close()
    structlog.reset_defaults()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root holding an empty ``.pi/memory/project/staging``."""
    root = tmp_path / "example-project"
    (root / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    return root


@pytest.fixture
def memory_dir(project: Path) -> Path:
    return project / ".pi" / "memory" / "project"


@pytest.fixture
def log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Points the decision log at a temp file (and away from the user's state dir)."""
    path = tmp_path / "state" / "decisions.jsonl"
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return path


@pytest.fixture
def plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output as a script sees it, whatever the environment says about colours (the command
    tests use it on every test: ``pytestmark = pytest.mark.usefixtures("plain_output")``)."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


EVIDENCE = {"discussion_note_ids": [1, 2]}


def lesson(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "summary": "Run mypy before committing",
        "detail": "Strict mode caught the Optional misuse.",
        "scope_suggestion": "project",
        "triggers": [{"type": "command", "pattern": "git commit"}],
        "source_evidence": EVIDENCE,
    }
    base.update(overrides)
    return base


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


def write(path: Path, doc: Any) -> bytes:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    path.write_bytes(data)
    return data


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def decisions(path: Path) -> dict[str, str]:
    """File name -> last decision logged for it (memstaged's look at its own rewrite, logged
    ``own_rewrite``, is no decision: SPEC 7)."""
    out: dict[str, str] = {}
    for event in read_log(path):
        if event.get("event") == "decision" and not event.get("own_rewrite"):
            out[Path(event["path"]).name] = event["decision"]
    return out
