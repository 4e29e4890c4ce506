"""``memstaged status`` beside other processes: a reconciler's lock whose holder is alive or gone,
and a real memstaged holding the instance lock, named with its pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.commands import status_json
from support.helpers import instance_lock_held

from memstaged import config

pytestmark = pytest.mark.usefixtures("plain_output")


def test_locks_and_a_running_memstaged(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path, tmp_path: Path
) -> None:
    """A live reconciler lock is reported but fine; a stale one needs attention; a memstaged
    holding the instance lock is named with its pid."""
    lock = memory_dir / "canonical-writer.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "owner": "reconciler"}))
    code, result = status_json(capsys, memory_dir)
    assert code == 0
    assert result["canonical_lock"] == {"pid": os.getpid(), "owner": "reconciler", "alive": True}

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    lock.write_text(json.dumps({"pid": int(dead.stdout), "owner": "reconciler"}))
    code, result = status_json(capsys, memory_dir)
    assert code == 1
    assert any("stale" in a for a in result["attention"])
    assert lock.exists()  # status never removes anything
    lock.unlink()

    state = config.default_state_dir(os.environ)
    with instance_lock_held(memory_dir, state, tmp_path / "bin") as held:
        code, result = status_json(capsys, memory_dir, "--require-daemon")
    assert result["memstaged_pid"] == held.pid
    # It holds the lock as a daemon would but answers no status (issue 21 item 6).
    assert code == 1
    assert result["daemon_answered"] is False
    assert any("does not answer" in a for a in result["critical"])
    code, result = status_json(capsys, memory_dir, "--require-daemon")
    assert code == 1
    assert "no memstaged daemon is running on it" in result["attention"]
