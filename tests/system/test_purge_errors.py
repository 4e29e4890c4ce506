"""``deadletter purge`` meeting an I/O error after it has deleted records (issue 20, hazards)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from support.documents import lesson, staging_doc
from support.helpers import (
    PYTHON,
    REPO,
    make_memory_dir,
    memstaged_env,
    project_root_of,
    run_once,
    stopped,
)
from support.waiting import wait_for


def _chattr(flag: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chattr", flag, str(path)], capture_output=True, text=True, check=False, timeout=60
    )


def test_an_io_error_in_the_middle_of_a_purge_exits_1_and_says_what_was_deleted(
    tmp_path: Path,
) -> None:
    """Issue 20 (hazards): an I/O error after some records were deleted was a ``ConfigError``:
    exit 2, as a usage error, and no word of the records already gone. It is exit 1 now, with
    the deleted records listed and the error said in one line.

    The error is real: the purge is stopped (SIGSTOP at its first ``unlinked`` crash point) and
    the memory dir made immutable (``chattr +i``) meanwhile, so that removing the
    ``canonical-writer.lock`` it took fails with EPERM once its records are deleted."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    for n in range(2):
        body = staging_doc(
            root, f"s{n}", candidates={"lessons": [lesson(f"cid-{n}")]}, schemaVersion="1"
        )
        (mdir / "staging" / f"bad{n}.json").write_bytes(json.dumps(body).encode())
    env = memstaged_env(tmp_path)
    assert run_once(mdir, env, "--settle", "0").returncode == 0
    records = sorted(p.name for p in (mdir / "deadletter").iterdir() if p.is_file())
    assert len(records) == 2, records
    if _chattr("+i", tmp_path).returncode != 0:
        pytest.skip("this file system has no immutable flag (chattr +i)")
    _chattr("-i", tmp_path)
    proc = subprocess.Popen(
        [
            *(PYTHON, "-m", "memstaged", "deadletter", "purge", "--memory-dir", str(mdir)),
            *("--older-than", "0s", "--yes", "--json"),
        ],
        env={**env, "MEMSTAGED_CRASH_AT": "unlinked:1:STOP"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert wait_for(lambda: stopped(proc.pid) or proc.poll() is not None, 120)
        assert proc.poll() is None, proc.communicate()
        assert _chattr("+i", mdir).returncode == 0
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        _chattr("-i", mdir)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(p.is_file() for p in (mdir / "deadletter").iterdir()), "not deleted"
    assert proc.returncode == 1, (proc.returncode, out, err)
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    deleted = sorted(r["name"] for r in rows if r["kind"] == "record" and r["action"] == "deleted")
    assert deleted == records, rows
    [line] = err.strip().splitlines()
    assert "Operation not permitted" in line, err
    assert "Traceback" not in err
