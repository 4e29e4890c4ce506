"""What the log says about dead-letter files is true of the bytes on disk when names under
``deadletter/`` are already taken (found by attacking the merged main). Each test runs the
installed command (``python -m memstaged --once``) on a real memory dir and reads the JSON-lines
decision log back."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.decision_log import read_events
from support.documents import staging_doc


def _once(tmp_path: Path, memory_dir: Path, *extra: str) -> list[dict[str, Any]]:
    """``memstaged --once`` on ``memory_dir``; the decisions it logged (not its looks at its
    own rewrites, ``own_rewrite``: no decisions, SPEC 7)."""
    log_file = tmp_path / "decisions.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(
        MEMSTAGED_LOG_FILE=str(log_file),
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
        XDG_STATE_HOME=str(tmp_path / "xdg-state"),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir), *extra],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    events = read_events(log_file)
    return [e for e in events if e.get("event") == "decision" and not e.get("own_rewrite")]


def _wrapped_doc(project: Path) -> bytes:
    """A file whose one preference is a wrapper re-queued by the agent's /memory recover (R6)."""
    inner = {"text": "Small commits", "source_evidence": {"discussion_note_ids": [1]}}
    wrapper = {"candidate": inner, "original_staging_file": {"a": 1}}
    doc = staging_doc(project, "w", candidates={"preferences": [wrapper]})
    return json.dumps(doc).encode()


def test_r6_repair_log_names_the_file_holding_the_original_bytes(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """SPEC 3 R6 ("the file's original bytes go to deadletter/originals/ first ... and the log
    names them") with SPEC 4 ("what is already at a name under deadletter/ is never trusted"):
    when the original's usual name already holds other bytes, memstaged writes the original under
    another name, and the repair's log entry must name that file, the one with the exact bytes
    (names already present combined with R6 wrappers)."""
    data = _wrapped_doc(project)
    originals = memory_dir / "deadletter" / "originals"
    originals.mkdir(parents=True)
    squatted = originals / f"w.json.{hashlib.sha256(data).hexdigest()[:16]}.orig"
    squatted.write_bytes(b"not the original\n")
    (memory_dir / "staging" / "w.json").write_bytes(data)

    [event] = _once(tmp_path, memory_dir)

    assert event["decision"] == "repaired"
    [repair] = [r for r in event["repairs"] if r["rule"] == "R6"]
    named = memory_dir / repair["wrote"]["original"]
    assert squatted.read_bytes() == b"not the original\n"  # never trusted, never overwritten
    assert named.read_bytes() == data, f"the log names {named.name}, which holds other bytes"
