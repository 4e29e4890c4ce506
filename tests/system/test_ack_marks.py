"""The dead-letter marks of ``memstaged deadletter ack`` under concurrent writers.

Real processes: a store made by a real ``--once``, then many ``memstaged deadletter ack``
processes started at once, each marking its own record; what is checked is what ``status``
then reports, and the marks file itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from support.documents import staging_doc, write
from support.helpers import (
    REPO,
    holding,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    run_once,
)
from support.waiting import wait_for

from memstaged.deadletter import acks

#: Acks started at once per round, each on its own record.
_ACKERS = 24
#: Rounds: one of 24 lost 3 to 14 marks before they were taken under a lock; a few rounds make
#: the test fail at once on such code, whatever the scheduling.
_ROUNDS = 3


def _store_of(tmp_path: Path, count: int) -> tuple[Path, dict[str, str]]:
    """A memory dir whose ``deadletter/`` holds ``count`` records (one staging file with as
    many invalid candidates, quarantined by a real ``--once``), and the environment used."""
    mdir = make_memory_dir(tmp_path)
    doc = staging_doc(project_root_of(mdir), "many")
    doc["candidates"] = {"lessons": [{}] * count, "preferences": []}
    write(mdir / "staging" / "many.json", doc)
    os.utime(mdir / "staging" / "many.json", (1, 1))
    env = memstaged_env(tmp_path)
    done = run_once(mdir, env)
    assert done.returncode == 0, done.stderr
    return mdir, env


def _status(mdir: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        memstaged_cmd("status", "--json", "--memory-dir", str(mdir)),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    [line] = done.stdout.splitlines()
    result: dict[str, object] = json.loads(line)
    return result


def test_concurrent_acks_each_keep_their_mark(tmp_path: Path) -> None:
    """Issue 29 item 5: 24 ``deadletter ack ID`` processes started at once, on 24 distinct
    records, each print "1 record marked seen" and exit 0; afterwards every record is marked
    seen (``status`` reports none unseen, the marks file names all 24). Without a lock around
    the marks' read-modify-write, 3-14 of each 24 stayed unseen. Several rounds, each with the
    marks of the last one removed."""
    mdir, env = _store_of(tmp_path, _ACKERS)
    ids = sorted(p.stem for p in (mdir / "deadletter").glob("*.json"))
    assert len(ids) == _ACKERS
    state = Path(env["XDG_STATE_HOME"]) / "memstaged"
    marks = state / acks.ACKED_DIR / acks.file_name(str(mdir))
    for round_no in range(_ROUNDS):
        marks.unlink(missing_ok=True)
        assert _status(mdir, env)["deadletter_unseen"] == _ACKERS
        procs = [
            subprocess.Popen(
                memstaged_cmd("deadletter", "ack", record, "--memory-dir", str(mdir)),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for record in ids
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert (proc.returncode, err) == (0, ""), (round_no, err)
            assert out.startswith(f"{mdir}: 1 record marked seen, "), out
        status = _status(mdir, env)
        assert status["deadletter_unseen"] == 0, (round_no, status)
        assert acks.load(state, str(mdir)) == {f"{i}.json" for i in ids}


def test_an_ack_waits_a_bounded_time_for_a_stuck_one_and_says_for_what(tmp_path: Path) -> None:
    """Issue 29 item 5: the wait for the marks' lock has a limit. With the lock held by a
    process that never lets go (a stopped ``deadletter ack``, here a stand-in holding the
    ``flock``), an ack exits 1 after the wait with one line naming the holder, and marks
    nothing; once it lets go, the same ack marks its record."""
    mdir, env = _store_of(tmp_path, 2)
    record = sorted(p.stem for p in (mdir / "deadletter").glob("*.json"))[0]
    acked = Path(env["XDG_STATE_HOME"]) / "memstaged" / acks.ACKED_DIR
    acked.mkdir(mode=0o700, parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
            str(acked),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        cmd = memstaged_cmd("deadletter", "ack", record, "--memory-dir", str(mdir))
        stuck = subprocess.run(
            cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        holder.communicate(timeout=60)  # stdin closed: it lets go and ends
    assert (stuck.returncode, stuck.stdout) == (1, "")
    [line] = stuck.stderr.splitlines()
    assert f"locked by pid {holder.pid} for over {acks.LOCK_PATIENCE:g} s" in line, line
    assert _status(mdir, env)["deadletter_unseen"] == 2
    fd = os.open(acked, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again: nothing holds it
    finally:
        os.close(fd)
    again = subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert (again.returncode, again.stderr) == (0, ""), again.stderr
    assert _status(mdir, env)["deadletter_unseen"] == 1


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (a directory it is about to lock)."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                return True
        except FileNotFoundError:
            continue  # closed meanwhile
    return False


def test_a_link_put_in_place_of_the_state_dir_during_an_ack_is_not_followed(
    tmp_path: Path,
) -> None:
    """Issue 29 D3: the marks were written by their path once the lock was had. With the state
    dir swapped for a link meanwhile (by whoever may write its parent), they went where the
    link pointed. The ack now reads and writes them relative to the descriptor of ``acked/``
    it locked: here it waits for a stand-in holding that lock, the state dir is renamed away
    and a link to another directory put in its place, and the lock is let go. The marks are
    in the renamed directory, and nothing is written where the link points."""
    mdir, env = _store_of(tmp_path, 2)
    records = {p.name for p in (mdir / "deadletter").glob("*.json")}
    state = Path(env["XDG_STATE_HOME"]) / "memstaged"
    acked = state / acks.ACKED_DIR
    acked.mkdir(mode=0o700, parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / acks.ACKED_DIR).mkdir(mode=0o700, parents=True)
    os.chmod(elsewhere, 0o700)
    locker = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    cmd = memstaged_cmd("deadletter", "ack", "--all", "--memory-dir", str(mdir))
    with holding([sys.executable, "-c", locker, str(acked)]):
        ack = subprocess.Popen(
            cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert wait_for(lambda: _holds_open(ack.pid, acked) or ack.poll() is not None, 120)
        assert ack.poll() is None, ack.communicate()
        state.rename(tmp_path / "moved")
        state.symlink_to(elsewhere)
    _out, err = ack.communicate(timeout=120)
    assert ack.returncode == 0, err
    assert list((elsewhere / acks.ACKED_DIR).iterdir()) == []
    assert acks.load(tmp_path / "moved", str(mdir)) == records
