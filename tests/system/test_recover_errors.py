"""``deadletter recover`` meeting an I/O error once it has planned (issue 20 item 5)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.documents import lesson
from support.helpers import PYTHON, REPO, make_memory_dir, memstaged_env


def test_an_io_error_after_the_plan_exits_1_and_leaves_every_record_saying_why(
    tmp_path: Path,
) -> None:
    """Issue 20 item 5: an ``OSError`` while recovery carried its plan out became a
    ``ConfigError``: exit 2, as a usage error, with no word of what was done. It is exit 1 now,
    every record not tried listed as left, with the error as its reason, and no traceback.

    The error is real: ``staging/`` is a symbolic link (never followed), so opening it to
    write the recovered file fails with ENOTDIR after the records were read and planned."""
    mdir = make_memory_dir(tmp_path)
    store = mdir / "deadletter"
    store.mkdir()
    record = {
        "session_id": "s0",
        "produced_at": "2026-01-01T00:00:00.000Z",
        "attempts": 1,
        "last_gate_reason": "hand-written",
        "category": "lessons",
        "candidate": lesson("cid-0"),
    }
    (store / "r0.json").write_text(json.dumps(record))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (mdir / "staging").rmdir()
    (mdir / "staging").symlink_to(elsewhere)
    proc = subprocess.run(
        [
            *(PYTHON, "-m", "memstaged", "deadletter", "recover", "--all"),
            *("--memory-dir", str(mdir), "--json"),
        ],
        env=memstaged_env(tmp_path),
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    [row] = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert row["id"] == "r0" and row["action"] == "left", row
    assert row["reason"].startswith("not tried: ") and "Not a directory" in row["reason"], row
    assert "Traceback" not in proc.stderr
    assert (store / "r0.json").exists()
    assert os.listdir(elsewhere) == []
