"""``memstaged --once`` as a process of its own: stopped by SIGTERM or Ctrl-C under the reconciler's
lock, waiting on a lock a live process holds, run as ``nobody`` on a file it cannot read, and the
mode of the seen cache it writes.

The rest of ``--once``, run in this process through ``cli.main``, is in ``tests/run/test_once.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import as_nobody
from support.decision_log import decisions, read_events
from support.documents import backlog, staging_doc, write
from support.helpers import (
    files_under,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    run_once,
)

from memstaged.cli.main import main


def test_unreadable_staging_file_is_deferred_and_kept() -> None:
    """A staging file that cannot be read stays in staging/ and makes the run exit 1.

    Root reads any file regardless of its mode, so the run is made as the unprivileged user
    ``nobody`` (setpriv), who may use the memory dir but not read the file. Issue 29 item 14:
    from a venv ``nobody`` can reach (:mod:`support.as_nobody`), so it passes in a clone under
    /root.
    """
    with as_nobody.workspace("memstaged-perm-") as base:
        project = base / "p"
        memory_dir = project / ".pi" / "memory" / "project"
        staging = memory_dir / "staging"
        staging.mkdir(parents=True)
        data = write(staging / "secret.json", staging_doc(project))
        os.chmod(staging / "secret.json", 0)
        for path in (project, project / ".pi", memory_dir.parent, memory_dir, staging):
            os.chmod(path, 0o777)  # noqa: S103 - the unprivileged run must reach the dir
        log = base / "decisions.jsonl"
        # Nothing of this process's environment but what any run gets (memstaged_env): no
        # MEMSTAGED_* setting, no systemd socket or journal stream of the test's own.
        env = memstaged_env(base / "work", HOME=str(base))
        env["MEMSTAGED_LOG_FILE"] = str(log)
        uid, gid = as_nobody.ids()
        for path in (base, base / "work", *(base / "work").rglob("*")):
            os.chown(path, uid, gid)  # its home, log, config and state: its own
        result = as_nobody.run_memstaged(
            "--once", "--memory-dir", str(memory_dir), env=env, cwd=base
        )
        assert result.returncode == 1, result.stderr
        assert (staging / "secret.json").read_bytes() == data
        assert decisions(log) == {"secret.json": "deferred"}, (read_events(log), result.stderr)
        assert "permission denied" in log.read_text()
        assert "Traceback" not in result.stderr


def test_a_backlog_waits_for_the_reconcilers_lock_in_every_batch(
    project: Path, memory_dir: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 5: while a live process holds canonical-writer.lock nothing changes; every file
    of every batch is deferred, and the lock is left as it was."""
    from memstaged.run import pipeline

    monkeypatch.setattr(pipeline, "BATCH", 4)
    expected = backlog(project, memory_dir, 20)
    before = files_under(memory_dir / "staging")
    lock = memory_dir / "canonical-writer.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"pid": holder.pid, "owner": "reconciler"}))
        assert main(["--once", "--memory-dir", str(memory_dir)]) == 1
    finally:
        holder.kill()
        holder.wait()
    assert decisions(log_file) == dict.fromkeys(expected, "deferred")
    assert files_under(memory_dir / "staging") == before
    assert not (memory_dir / "deadletter").exists()
    assert json.loads(lock.read_text())["pid"] == holder.pid


def _many_invalid(mdir: Path, count: int) -> bytes:
    """``staging/many.json`` with ``count`` invalid lessons (a record each), settled long ago;
    its bytes."""
    doc = staging_doc(project_root_of(mdir), "many")
    doc["candidates"]["lessons"] = [{}] * count
    data = write(mdir / "staging" / "many.json", doc)
    os.utime(mdir / "staging" / "many.json", (1, 1))
    return data


def test_sigterm_under_the_lock_exits_143_releases_it_and_the_next_run_finishes(
    tmp_path: Path,
) -> None:
    """SIGTERM to ``--once`` (``timeout``, a service manager's stop) while it installs a
    quarantine's records under ``canonical-writer.lock``: exit 143 with the one line
    ``memstaged: terminated`` and no traceback; the lock is released (a run killed by the
    signal's default action left it, and the reconciler waited for the next memstaged to find it
    stale); the staging file is as it was; the next run exits 0 with the original, every record
    once and no temp left. The signal comes at the 100th record installed (the crash hook)."""
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path, MEMSTAGED_CRASH_AT="record-written:100:TERM")
    data = _many_invalid(mdir, 2_000)
    proc = run_once(mdir, env, timeout=300)
    stderr = proc.stderr.decode()
    assert proc.returncode == 143, stderr[-2000:]
    assert stderr.splitlines()[-1] == "memstaged: terminated"
    assert "Traceback" not in stderr
    assert not (mdir / "canonical-writer.lock").exists()
    assert (mdir / "staging" / "many.json").read_bytes() == data

    del env["MEMSTAGED_CRASH_AT"]
    again = run_once(mdir, env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    dl = mdir / "deadletter"
    assert not (mdir / "staging" / "many.json").exists()
    assert [p.read_bytes() for p in (dl / "originals").iterdir()] == [data]
    assert not list(mdir.rglob(".memstaged~*"))
    assert not (mdir / "canonical-writer.lock").exists()
    # Every record once: the same names as a run never interrupted gives.
    other = make_memory_dir(tmp_path / "other")
    (other / "staging" / "many.json").write_bytes(data)
    os.utime(other / "staging" / "many.json", (1, 1))
    root = ["--project-root", project_root_of(mdir)]
    assert run_once(other, env, *root, timeout=300).returncode == 0
    assert sorted(p.name for p in dl.glob("*.json")) == sorted(
        p.name for p in (other / "deadletter").glob("*.json")
    )
    assert len(list(dl.glob("*.json"))) > 2_000


@pytest.mark.timeout(600)  # two runs over 20,000 records: 35-45 s on a busy 2-core machine
def test_ctrl_c_during_a_large_quarantine_exits_130_and_the_next_run_finishes(
    tmp_path: Path,
) -> None:
    """Ctrl-C (SIGINT) while ``--once`` writes the 20,000 record temps of a quarantine: exit
    130 with the one line ``memstaged: interrupted`` and no traceback, the staging file as it
    was; the temps are left as a kill leaves them (README), and the next run deletes them and
    carries the quarantine out: exit 0, the original, the records, no temp.

    The SIGINT comes when the 200th temp is created (the crash hook with a signal): sent by
    the test once it had counted 200 temps, it came after the last one when the test was not
    scheduled for the second or two the temps take, on a busy machine (issue 19 item 8)."""
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path, MEMSTAGED_CRASH_AT="temp-created:200:INT")
    data = _many_invalid(mdir, 20_000)
    # Ctrl-C's disposition in a terminal's foreground job: a suite started as a background job
    # of a non-interactive shell has SIGINT ignored, which a child inherits, and Python then
    # keeps it ignored (rightly, as under nohup): the interruption never came and the run ended
    # 0. A handled signal is reset to the default across exec; an ignored one is not.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            memstaged_cmd("--once", "--memory-dir", str(mdir)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    dl = mdir / "deadletter"
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130
    assert stderr.decode().splitlines()[-1] == "memstaged: interrupted"
    assert b"Traceback" not in stderr
    assert (mdir / "staging" / "many.json").read_bytes() == data
    left = len(list(dl.rglob(".memstaged~*")))
    assert 0 < left < 20_001, f"{left} temps: not interrupted while writing them"
    assert not list(dl.glob("*.json")), "the interrupted run installed records"

    del env["MEMSTAGED_CRASH_AT"]
    again = run_once(mdir, env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (mdir / "staging" / "many.json").exists()
    assert [p.read_bytes() for p in (dl / "originals").iterdir()] == [data]
    assert len(list(dl.glob("*.json"))) >= 20_000
    assert not list(mdir.rglob(".memstaged~*"))


#: Run in the child: umask 022, then ``memstaged --once`` with an audit hook that, at every
#: chmod, rename and link (before the call is made), records the mode of the file concerned when
#: it lies in the seen cache's directory. The hook looks, it changes nothing.
_SEEN_MODES = r"""
import json, os, stat, sys
seen = os.path.join(os.environ["XDG_STATE_HOME"], "memstaged", "seen")
modes = []

def path_of(path, dir_fd):
    path = os.fsdecode(path)
    if dir_fd is not None and dir_fd >= 0 and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return path

def hook(event, args):
    if event in ("os.chmod", "os.rename", "os.link"):
        path = path_of(args[0], args[2]) if isinstance(args[0], (str, bytes)) else None
        if path is not None and os.path.dirname(path) == seen:
            try:
                modes.append([event, os.path.basename(path), stat.S_IMODE(os.lstat(path).st_mode)])
            except OSError:
                pass

sys.addaudithook(hook)
os.umask(0o022)
from memstaged.cli.main import main
code = main(sys.argv[1:])
print(json.dumps(modes))
sys.exit(code)
"""


def test_the_seen_cache_is_0600_from_its_creation(
    project: Path, memory_dir: Path, tmp_path: Path
) -> None:
    """Issue 20 (atomic writers): the seen cache was written, then chmodded, then renamed, so
    under umask 022 it existed for a moment readable by everyone (SPEC 6: 0600). Its temp file
    has mode 0600 from creation to rename, and the cache too."""
    write(memory_dir / "staging" / "a.json", staging_doc(project, "a"))
    env = memstaged_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _SEEN_MODES, "--once", "--memory-dir", str(memory_dir)],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    modes = json.loads(done.stdout.decode().splitlines()[-1])
    assert modes, "the seen cache was never renamed into place"
    assert all(mode == 0o600 for _event, _name, mode in modes), modes
    caches = list((tmp_path / "xdg-state" / "memstaged" / "seen").iterdir())
    assert [oct(c.stat().st_mode & 0o777) for c in caches] == ["0o600"]
