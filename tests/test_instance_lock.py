"""The instance lock is a ``flock`` on the memory dir's own descriptor (SPEC 5, issue 10 items 6
and 13, issue 12): it leaves no file, follows no planted link, and cannot be unlinked away.

Every test runs real ``memstaged`` processes; the lock holder is a real second process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_memory_dir, memstaged_env, run_once, wait_for

from memstaged.locks import InstanceLock, instance_holder

_HOLD = """
import sys, time
from memstaged.locks import InstanceLock
lock = InstanceLock(sys.argv[1])
lock.acquire(wait=False)
print("held", flush=True)
time.sleep(60)
"""


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry below ``root``: its mode and, for files, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(root))] = (st.st_mode, data)
    return out


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A memory dir whose instance lock a second, real process holds."""
    mdir = make_memory_dir(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(mdir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    try:
        yield mdir, proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


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
    """Issue 10 item 13: with the lock on the directory there is nothing to unlink."""
    mdir, proc = holder
    for leftover in mdir.glob(".memstaged*"):
        leftover.unlink()
    busy = run_once(mdir, memstaged_env(tmp_path / "work"))
    assert busy.returncode == 1
    assert f"pid {proc.pid}" in busy.stdout.decode() + busy.stderr.decode()


def test_status_finds_the_holder_without_taking_the_lock(
    holder: tuple[Path, subprocess.Popen[str]],
) -> None:
    """Issue 12: ``status`` reads ``/proc/locks``; it never takes even a shared flock."""
    mdir, proc = holder
    assert instance_holder(str(mdir)) == proc.pid
    proc.kill()
    proc.wait()
    assert wait_for(lambda: instance_holder(str(mdir)) is None, 60)
    lock = InstanceLock(str(mdir))
    lock.acquire(wait=False)  # the kernel dropped the killed holder's lock
    lock.release()


def test_wait_has_a_limit_and_says_what_it_waits_for(
    holder: tuple[Path, subprocess.Popen[str]],
) -> None:
    """SPEC 5: a wait for another memstaged has a limit and says what it waits for."""
    mdir, proc = holder
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(Exception, match=f"pid {proc.pid}.*waited 0.5 s"):
        InstanceLock(str(mdir)).acquire(wait=0.5, on_wait=said.append)
    assert time.monotonic() - started < 10  # bounded, not for ever (a generous hang guard)
    assert len(said) == 1 and str(mdir) in said[0] and f"pid {proc.pid}" in said[0]


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
