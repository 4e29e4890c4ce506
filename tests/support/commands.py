"""What the command tests (test_cmd_*.py) share: a memory dir with real records and log lines.

:func:`prepare` writes a few staging files and runs ``memstaged --once`` on them, so the decision
log, the dead-letter records and the originals the commands read are the ones memstaged really
writes, not hand-made imitations.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pytest

from memstaged.cli.main import main
from support.documents import EVIDENCE, lesson, staging_doc, write

BAD_TRIGGER: Final = [{"type": "bogus"}]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``memstaged ARGV`` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def deadletter_command(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, *argv: str
) -> tuple[int, str, str]:
    """``memstaged deadletter ACTION --memory-dir MEMORY_DIR REST...`` in this process."""
    action, *rest = argv
    return run(capsys, "deadletter", action, "--memory-dir", str(memory_dir), *rest)


def status_json(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, *argv: str
) -> tuple[int, Any]:
    """``memstaged status --json`` of one memory dir in this process: exit code, its one line."""
    code, out, err = run(capsys, "status", "--json", "--memory-dir", str(memory_dir), *argv)
    assert code in (0, 1), err
    [result] = json_lines(out)
    return code, result


def json_lines(text: str) -> list[dict[str, Any]]:
    """Parse ``--json`` output: every non-empty line is one JSON object."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def one_line_error(err: str) -> str:
    """The usage error a command printed: exactly one line, and no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def mixed_doc(project: Path, session: str = "mixed") -> dict[str, Any]:
    """A file quarantined for one lesson's unknown trigger type; besides it, a lesson R1 can
    repair (no triggers), a valid preference and a valid decision: three recoverable candidates."""
    no_triggers = lesson(summary="Pin the venv", detail="Stale venvs break collection.")
    del no_triggers["triggers"]
    return staging_doc(
        project,
        session,
        candidates={
            "lessons": [lesson(triggers=BAD_TRIGGER), no_triggers],
            "preferences": [{"text": "Prefer small commits", "source_evidence": EVIDENCE}],
            "decisions": [
                {"summary": "Use msgspec", "detail": "It is fast.", "source_evidence": EVIDENCE}
            ],
        },
    )


def prepare(project: Path, memory_dir: Path, log_file: Path) -> dict[str, bytes]:
    """Stage one file per decision and let ``--once`` decide them; returns the bytes written.

    good.json is valid, fixme.json repairable, mixed.json and broken.json are quarantined (the
    latter is not JSON), other.json belongs to another project.
    """
    staging = memory_dir / "staging"
    fixme = staging_doc(project, "fix", produced_at="20261129T180411Z")
    del fixme["candidates"]["lessons"][0]["triggers"]
    files = {
        "good.json": write(staging / "good.json", staging_doc(project, "good")),
        "fixme.json": write(staging / "fixme.json", fixme),
        "mixed.json": write(staging / "mixed.json", mixed_doc(project)),
        "broken.json": write(staging / "broken.json", b'{"session_id": "broken", '),
        "other.json": write(staging / "other.json", staging_doc("/somewhere/else", "other")),
    }
    assert main(["--once", "--memory-dir", str(memory_dir), "--settle", "0"]) == 0
    assert log_file.exists()
    return files


def record_files(memory_dir: Path) -> dict[str, bytes]:
    """Every dead-letter record: name -> bytes."""
    dl = memory_dir / "deadletter"
    return {p.name: p.read_bytes() for p in sorted(dl.glob("*.json"))} if dl.exists() else {}


def record_ids(memory_dir: Path, contains: str) -> list[str]:
    """The IDs of the dead-letter records whose names contain ``contains``."""
    return [n[: -len(".json")] for n in record_files(memory_dir) if contains in n]


def original_files(memory_dir: Path) -> dict[str, bytes]:
    orig = memory_dir / "deadletter" / "originals"
    return {p.name: p.read_bytes() for p in sorted(orig.iterdir())} if orig.exists() else {}


def staging_files(memory_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((memory_dir / "staging").iterdir())}


def redated(events: Sequence[dict[str, Any]], timestamp: str) -> list[dict[str, Any]]:
    """Copies of real events, as if logged at ``timestamp`` (for time windows without sleeping)."""
    return [{**e, "timestamp": timestamp} for e in events]


def write_log(path: Path, events: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


def dated_decisions(log_file: Path, stamps: Sequence[float]) -> None:
    """A decision log of one ``valid`` decision per time stamp, of ``/m/staging/f<i>.json``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("w") as fh:
        for i, stamp in enumerate(stamps):
            when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + ".000001Z"
            event = {
                "timestamp": when,
                "level": "info",
                "event": "decision",
                "decision": "valid",
                "path": f"/m/staging/f{i}.json",
                "memory_dir": "/m",
            }
            fh.write(json.dumps(event) + "\n")


def set_old(path: Path, seconds_ago: float = 3600.0) -> None:
    """Date a file back, so that it counts as settled and as older than status's grace."""
    stamp = os.stat(path).st_mtime - seconds_ago
    os.utime(path, (stamp, stamp))
