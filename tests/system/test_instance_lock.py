"""The instance lock (SPEC 5, issue 10 items 6 and 13, issue 12, issue 29 item 10): ``flock`` on
an empty file of memstaged's own in the user's private state dir, named by the memory dir's
identity. It leaves nothing in the memory dir, follows no planted link, cannot be taken first by
another user who may read the memory dir, and names its holder only when that is memstaged.

Every test runs real ``memstaged`` processes; the lock holder is a real second process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.decision_log import read_events
from support.helpers import (
    daemon,
    holding,
    instance_lock_held,
    make_memory_dir,
    memory_dir_of,
    memstaged_cmd,
    memstaged_env,
    run_once,
)
from support.waiting import wait_for

from memstaged.files.locks import InstanceLock, instance_holder, instance_lock_path
from memstaged.files.private_dirs import private_dirs


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry below ``root``: its mode and, for files, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(root))] = (st.st_mode, data)
    return out


def _state_dir(env: dict[str, str]) -> Path:
    return Path(env["XDG_STATE_HOME"]) / "memstaged"


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A memory dir whose instance lock a second, real process holds, as a memstaged daemon
    would (the state dir of ``memstaged_env(tmp_path / "work")``)."""
    mdir = make_memory_dir(tmp_path)
    state = _state_dir(memstaged_env(tmp_path / "work"))
    with instance_lock_held(mdir, state, tmp_path / "bin") as proc:
        yield mdir, proc


@pytest.fixture
def once_holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """The same, held as a ``--once`` run would: one that ends, so worth waiting for."""
    mdir = make_memory_dir(tmp_path)
    state = _state_dir(memstaged_env(tmp_path / "work"))
    with instance_lock_held(mdir, state, tmp_path / "bin", "--once") as proc:
        yield mdir, proc


def test_once_leaves_nothing_in_the_memory_dir_and_changes_nothing_the_second_time(
    tmp_path: Path,
) -> None:
    """Issue 12: the lock leaves no file; a second ``--once`` changes nothing at all."""
    mdir = make_memory_dir(tmp_path)
    (mdir / "staging" / "junk.json").write_bytes(b"not json")
    os.utime(mdir / "staging" / "junk.json", (1, 1))
    env = memstaged_env(tmp_path / "work")
    first = run_once(mdir, env)
    assert first.returncode == 0, first.stderr
    after_first = _tree(mdir)
    assert ".memstaged.lock" not in after_first
    assert set(after_first) <= {"staging", "deadletter"} | {
        p for p in after_first if p.startswith("deadletter/")
    }
    second = run_once(mdir, env)
    assert second.returncode == 0, second.stderr
    assert _tree(mdir) == after_first


def test_a_planted_hard_link_at_the_old_lock_name_is_never_written(tmp_path: Path) -> None:
    """Issue 10 item 6: ``.memstaged.lock`` hard-linked to an outside file is left untouched."""
    mdir = make_memory_dir(tmp_path)
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"precious bytes\n")
    os.link(outside, mdir / ".memstaged.lock")
    done = run_once(mdir, memstaged_env(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    assert outside.read_bytes() == b"precious bytes\n"


def test_unlinking_a_lock_file_does_not_let_a_second_memstaged_in(
    holder: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Issue 10 item 13: nothing in the memory dir is the lock, so there is nothing to unlink."""
    mdir, proc = holder
    for leftover in mdir.glob(".memstaged*"):
        leftover.unlink()
    busy = run_once(mdir, memstaged_env(tmp_path / "work"))
    assert busy.returncode == 1
    assert re.search(
        rf"the memstaged daemon \(pid {proc.pid}(, \S+\.service)?\) already decides",
        busy.stderr.decode(),
    )


def test_status_finds_the_holder_without_taking_the_lock(
    holder: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Issue 12: ``status`` reads ``/proc/locks``; it never takes even a shared flock."""
    mdir, proc = holder
    state = _state_dir(memstaged_env(tmp_path / "work"))
    assert instance_holder(state, memory_dir_of(mdir)) == (proc.pid, "daemon")
    proc.kill()
    proc.wait()
    assert wait_for(lambda: instance_holder(state, memory_dir_of(mdir)) is None, 60)
    lock = InstanceLock(str(mdir), state_dir=state)
    lock.acquire(wait=False)  # the kernel dropped the killed holder's lock
    lock.release()


def test_wait_has_a_limit_and_says_what_it_waits_for(
    once_holder: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """SPEC 5: a wait for another memstaged (a --once run) has a limit and says what it waits
    for."""
    mdir, proc = once_holder
    state = _state_dir(memstaged_env(tmp_path / "work"))
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(Exception, match=f"pid {proc.pid}.*waited 0.5 s"):
        InstanceLock(str(mdir), state_dir=state).acquire(wait=0.5, on_wait=said.append)
    assert time.monotonic() - started < 10  # bounded, not for ever (a generous hang guard)
    assert len(said) == 1 and str(mdir) in said[0] and f"pid {proc.pid}" in said[0]


def test_once_beside_a_running_daemon_says_so_at_once_and_does_not_wait(tmp_path: Path) -> None:
    """Issue 31 item 7: `--once --wait` while a real memstaged daemon holds the memory dir
    waited 30 s, then exited 1 with the hint "use --wait", which cannot help. Now it says at
    once, in one line naming the daemon's pid, that the daemon decides these files, suggests no
    --wait, and exits 1 (this run decided nothing there); the file is the daemon's to decide,
    and it does. A glob's other memory dir is decided by the run as before."""
    mdir = make_memory_dir(tmp_path)
    other = make_memory_dir(tmp_path / "other")
    env = memstaged_env(tmp_path / "work")
    state = _state_dir(env)
    with daemon([mdir], env) as proc:
        assert wait_for(lambda: instance_holder(state, memory_dir_of(mdir)) is not None, 60)
        (mdir / "staging" / "late.json").write_bytes(b"not json")
        (other / "staging" / "mine.json").write_bytes(b"not json")
        summaries = []
        for args in (["--wait"], []):
            started = time.monotonic()
            done = run_once(mdir, env, "--memory-dir", str(other), "--settle", "0", *args)
            took = time.monotonic() - started
            err = done.stderr.decode()
            assert done.returncode == 1, err
            # The unit is named when the daemon runs as one (pytest may run in a service).
            assert [re.sub(r", \S+\.service\)", ")", line) for line in err.splitlines()] == [
                f"memstaged: the memstaged daemon (pid {proc.pid}) already decides the files "
                f"of {mdir}, for as long as it runs: waiting for it would not help"
            ]
            assert took < 15, took  # not the 30 s wait (a generous bound on a loaded machine)
            summaries.append(done.stdout.decode())
        assert "quarantined=1" in summaries[0]  # the other memory dir, decided by this run
        assert wait_for(lambda: not (mdir / "staging" / "late.json").exists(), 60)


_READ_ONLY = [
    ["--once", "--dry-run"],
    ["check", "{file}"],
    ["log"],
    ["stats"],
    ["status"],
    ["deadletter", "list"],
    ["deadletter", "show", "{record}"],
    ["deadletter", "recover", "--all", "--dry-run"],
    ["deadletter", "purge", "--older-than", "0s"],
]


@pytest.mark.parametrize("command", _READ_ONLY, ids=" ".join)
def test_every_command_that_only_looks_leaves_the_memory_dir_as_it_was(
    tmp_path: Path, command: list[str]
) -> None:
    """Issue 12 (the lock leaves nothing) and issue 13 item 2 (``--dry-run`` writes nothing):
    each inspecting command, run on a memory dir with a quarantined and a valid file, leaves
    every entry of the memory dir as it was: names, modes and bytes."""
    mdir = make_memory_dir(tmp_path)
    junk = mdir / "staging" / "junk.json"
    junk.write_bytes(b'{"session_id": "s1", "candidates": {"lessons": [{"summary": 1}]}}')
    os.utime(junk, (1, 1))
    env = memstaged_env(tmp_path / "work")
    assert run_once(mdir, env).returncode == 0
    again = mdir / "staging" / "again.json"
    again.write_bytes(b"still not json")
    os.utime(again, (1, 1))
    record = next((mdir / "deadletter").glob("*.json")).name.removesuffix(".json")
    before = _tree(mdir)
    argv = [a.format(file=again, record=record) for a in command]
    done = subprocess.run(
        [sys.executable, "-m", "memstaged", *argv, "--memory-dir", str(mdir)]
        if argv[0] != "check"
        else [sys.executable, "-m", "memstaged", *argv],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr.decode(), done.stderr
    assert _tree(mdir) == before, (argv, done.stderr)


# -- issue 29 item 10: another user cannot take the lock; a holder is named only if memstaged --


def _as_nobody() -> list[str]:
    """The command prefix that runs a program as the user ``nobody``; skips where it cannot."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a program as another user")
    if shutil.which("setpriv") is None or shutil.which("flock") is None:
        pytest.skip("setpriv and flock(1) are needed to hold a flock as another user")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@contextlib.contextmanager
def _shared_memory_dir() -> Iterator[Path]:
    """A memory dir that another user may read (and so ``flock``): under /tmp, which ``nobody``
    reaches, where a test's tmp_path (or a clone in /root) may not be reachable."""
    base = Path(tempfile.mkdtemp(prefix="memstaged-shared-", dir="/tmp"))
    try:
        mdir = make_memory_dir(base)
        for path in [base, *base.rglob("*")]:
            os.chmod(path, 0o755)  # noqa: S103 - another user must reach it
        yield mdir
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _flock(
    path: Path, prefix: list[str]
) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    """``flock -x PATH`` (util-linux) held until the block ends, by ``prefix``'s user."""
    return holding([*prefix, "flock", "-x", str(path), "sh", "-c", "echo held; exec cat"])


def _status(mdir: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    done = subprocess.run(
        memstaged_cmd("status", "--json", *args, "--memory-dir", str(mdir)),
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr.decode(), done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_another_users_flock_on_the_memory_dir_stops_no_memstaged(tmp_path: Path) -> None:
    """Issue 29 item 10: with the user ``nobody`` holding ``flock -x`` on the memory dir (any
    user who may read it can), ``--once`` decides its file (exit 0; it exited 1 with "another
    memstaged (pid N)", naming nobody's flock), ``status`` names no memstaged (it named the
    flock as the daemon), and the daemon starts, decides, is named by ``status`` and answers,
    and stops with exit 0 (it exited 1)."""
    prefix = _as_nobody()
    with _shared_memory_dir() as mdir, _flock(mdir, prefix) as other:
        bad = mdir / "staging" / "bad.json"
        bad.write_bytes(b"not json")
        os.utime(bad, (1, 1))
        env = memstaged_env(tmp_path / "work")
        once = run_once(mdir, env)
        assert once.returncode == 0, once.stderr
        assert f"pid {other.pid}" not in once.stderr.decode()
        assert not bad.exists()  # quarantined
        result = _status(mdir, env)
        assert result["memstaged_pid"] is None, result

        log = Path(env["MEMSTAGED_LOG_FILE"])
        (mdir / "staging" / "later.json").write_bytes(b"not json either")
        os.utime(mdir / "staging" / "later.json", (1, 1))
        with daemon([mdir], env, "--settle", "0.5", stderr=tmp_path / "daemon.err") as proc:
            assert wait_for(
                lambda: (
                    any(e.get("event") == "ready" for e in read_events(log, strict=False))
                    or proc.poll() is not None
                ),
                120,
            )
            assert proc.poll() is None, (tmp_path / "daemon.err").read_text()
            assert not (mdir / "staging" / "later.json").exists()
            result = _status(mdir, env, "--require-daemon")
            assert (result["memstaged_pid"], result["memstaged_kind"]) == (proc.pid, "daemon")
            assert result["daemon_answered"] is True, result
        assert proc.returncode == 0


def test_a_holder_that_is_not_memstaged_is_not_named(tmp_path: Path) -> None:
    """Issue 29 item 10: the lock file is the user's own, so only their own processes may hold
    it; one that is not memstaged (``flock(1)`` here) makes ``--once`` busy (exit 1) without
    its pid being named as memstaged's, and ``status`` names no memstaged but says why none can
    work there."""
    if shutil.which("flock") is None:
        pytest.skip("flock(1) is not installed")
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path / "work")
    st = mdir.stat()
    lock = instance_lock_path(_state_dir(env), (st.st_dev, st.st_ino))
    private_dirs(lock.parent)
    with _flock(lock, []) as other:
        once = run_once(mdir, env)
        assert once.returncode == 1
        err = once.stderr.decode()
        assert f"{mdir} is busy: a process that is not memstaged holds its instance lock" in err
        assert str(other.pid) not in err
        result = _status(mdir, env)
        assert result["memstaged_pid"] is None, result
        assert result["critical"] == ["a process that is not memstaged holds its instance lock"]


@pytest.mark.usefixtures("plain_output")
def test_the_busy_error_is_one_unwrapped_line(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: ``--once`` on a memory dir a daemon works on says so on one line, whatever the
    width (rich wrapped it at 80 columns into a pipe), and exits 1."""
    env = memstaged_env(tmp_path, COLUMNS="30")
    log = Path(env["MEMSTAGED_LOG_FILE"])
    with daemon([memory_dir], env):
        assert wait_for(
            lambda: any(e.get("event") == "ready" for e in read_events(log, strict=False)), 30
        )
        result = run_once(memory_dir, env, timeout=60)
    assert result.returncode == 1
    lines = [ln for ln in result.stderr.decode().splitlines() if "already decides" in ln]
    assert len(lines) == 1 and str(memory_dir) in lines[0]
