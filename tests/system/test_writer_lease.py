"""Writers that write into the file itself (``cp -p`` onto it, ``rsync --inplace``): the read
lease (SPEC 5, "Concurrent writers"; issue 10 item 2).

memstaged holds a read lease on the version it decides. A writer that has the file open for
writing when memstaged looks makes it wait (the file is still being written); a writer that
opens it for writing while memstaged decides waits in ``open`` until the decision is carried out,
and memstaged, seeing it wait, keeps the version it displaced as a conflict instead of letting it
go: what the writer then writes lands in a file that stays in ``staging/``.

The writers are real processes; the interleavings are forced, not hoped for.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.daemon_fakes import RecordingLogger
from support.documents import staging_doc
from support.helpers import (
    OLD_MTIME,
    Input,
    expected_verdict,
    make_memory_dir,
    memory_dir_of,
    memstaged_env,
    project_root_of,
    run_once,
    same_size_doc,
)

from memstaged.files import fsio
from memstaged.files.memdir import Options
from memstaged.files.version import Version, quiet_lease_breaks
from memstaged.run.pipeline import Pipeline

#: A writer process: opens the file for writing, says so, and on a line from stdin writes the
#: new bytes in place, puts the old mtime back and exits.
WRITER = """
import os, sys
path, data, mtime = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY)
print("open", flush=True)
sys.stdin.readline()
os.pwrite(fd, data, 0)
os.close(fd)
os.utime(path, ns=(mtime, mtime))
"""


def _lease_supported(directory: Path) -> None:
    probe = directory / ".lease-probe"
    probe.write_bytes(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as err:
        pytest.skip(f"the file system of {directory} gives no read lease ({err.strerror})")
    finally:
        os.close(fd)
        probe.unlink()


def _start_writer(path: Path, data: bytes, mtime_ns: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), data.hex(), str(mtime_ns)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@contextmanager
def _writer(path: Path, data: bytes, mtime_ns: int) -> Iterator[subprocess.Popen[str]]:
    proc = _start_writer(path, data, mtime_ns)
    try:
        yield proc
    finally:
        _reap(proc)


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _survives(mdir: Path, name: str, data: bytes) -> bool:
    """``data`` is in staging/ (as itself or as its repair, under any name) or in originals/."""
    staged = {p.read_bytes() for p in (mdir / "staging").iterdir() if p.is_file()}
    originals = mdir / "deadletter" / "originals"
    kept = {p.read_bytes() for p in originals.iterdir()} if originals.is_dir() else set()
    repair = expected_verdict(mdir, Input(name, data, "")).new_bytes
    return data in staged or data in kept or (repair is not None and repair in staged)


def _staged(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A memory dir whose ``staging/x.json`` holds an old repairable version, long settled;
    returns it, that file, and the new version a writer will write in place."""
    mdir = make_memory_dir(tmp_path)
    _lease_supported(mdir / "staging")
    root = project_root_of(mdir)
    path = mdir / "staging" / "x.json"
    path.write_bytes(same_size_doc(root, "old"))
    mtime_ns = OLD_MTIME * 1_000_000_000
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return mdir, path, same_size_doc(root, "new")


def test_a_file_open_for_writing_waits_and_what_is_written_then_is_decided(
    tmp_path: Path,
) -> None:
    """Issue 10 item 2: a writer has ``x.json`` open for writing when ``--once`` looks, and
    writes its new version (same size, mtime put back) only after that run. The run must not
    decide the file (deferred: it is being written; exit 1); the next run decides the new
    version. Before the lease, the first run repaired the old version by an exchange and let
    the old inode go, and the writer's new bytes went into that unlinked inode: lost."""
    mdir, path, new = _staged(tmp_path)
    env = memstaged_env(tmp_path)
    mtime_ns = OLD_MTIME * 1_000_000_000
    with _writer(path, new, mtime_ns) as writer:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline() == "open\n"
        first = run_once(mdir, env, "--settle", "0")
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    second = run_once(mdir, env, "--settle", "0")
    assert _survives(mdir, "x.json", new), "the writer's new version is lost"
    assert first.returncode == 1, first.stderr
    assert b"deferred=1" in first.stdout
    assert second.returncode == 0, second.stderr


@pytest.mark.parametrize("quiet", [False, True], ids=["sigurg", "sigio-ignored"])
def test_a_writer_that_opens_the_file_while_it_is_decided_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quiet: bool
) -> None:
    """Issue 10 item 2, the other order: memstaged has read ``x.json`` (repairable) and is about
    to exchange in the repair when a writer opens the file for writing. The writer waits in
    ``open`` (the lease); memstaged sees it wait, carries the repair out and keeps the version
    it displaced as a ``.conflict-`` file; then the writer writes its new version into that
    inode, which stays in staging/. Forced: the exchange waits until the kernel shows the lease
    breaking. Without the check of a waiting writer, the displaced inode was unlinked and the
    writer's bytes went into it: lost.

    ``quiet``: as in ``--once`` and the daemon, ``SIGIO`` is ignored first and the lease names
    no signal of its own; the break's ``SIGIO`` must not end the process (this test's: without
    the ``SIG_IGN``, pytest died of it)."""
    if quiet:
        previous = signal.getsignal(signal.SIGIO) or signal.SIG_DFL
        quiet_lease_breaks()
        assert signal.getsignal(signal.SIGIO) is signal.SIG_IGN
    try:
        _writer_opens_while_decided(tmp_path, monkeypatch)
    finally:
        if quiet:
            signal.signal(signal.SIGIO, previous)


def _writer_opens_while_decided(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mdir, path, new = _staged(tmp_path)
    mtime_ns = OLD_MTIME * 1_000_000_000
    ino = os.stat(path).st_ino
    real_exchange = fsio.exchange
    started: list[subprocess.Popen[str]] = []

    def exchange_once_a_writer_waits(dir_fd: int, a: str, b: str) -> None:
        writer = _start_writer(path, new, mtime_ns)
        started.append(writer)
        assert writer.stdin is not None
        writer.stdin.write("go\n")  # it writes as soon as its open returns
        writer.stdin.flush()
        deadline = time.monotonic() + 30
        while f":{ino} " not in _breaking_leases():
            assert writer.poll() is None, "the writer opened the file without waiting"
            assert time.monotonic() < deadline, "no lease was ever broken"
            time.sleep(0.001)
        real_exchange(dir_fd, a, b)

    monkeypatch.setattr(fsio, "exchange", exchange_once_a_writer_waits)
    try:
        pipeline = Pipeline(Options(settle=0), RecordingLogger())
        outcome = pipeline.process(memory_dir_of(mdir), "x.json")
        monkeypatch.undo()
        assert started, "the repair was never exchanged in"
        assert started[0].wait(timeout=30) == 0
    finally:
        for writer in started:
            _reap(writer)
    assert outcome.decision.value == "deferred"  # changed while being decided: decided afresh
    assert _survives(mdir, "x.json", new), "the writer's new version is lost"
    conflicts = [p for p in (mdir / "staging").iterdir() if ".conflict-" in p.name]
    assert [p.read_bytes() for p in conflicts] == [new]


def test_a_writer_that_writes_in_place_before_the_lease_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is taken once a version is to change: after it was read and decided. A writer
    that writes into the file in that gap (same size, old mtime put back, and closed) wrote
    into the inode memstaged holds, and changed its ctime: the look before the exchange sees
    another version, so nothing is changed and the writer's version stays in place, decided
    afresh (within one tick of the clock, the bytes read back through the held descriptor
    before the inode is let go would tell). Forced: the writer writes and exits just before the
    lease."""
    mdir, path, new = _staged(tmp_path)
    _lease_supported(mdir / "staging")
    mtime_ns = OLD_MTIME * 1_000_000_000
    real_lease = Version.lease

    def lease_after_a_write(version: Version) -> bool:
        with _writer(path, new, mtime_ns) as writer:
            assert writer.stdout is not None and writer.stdin is not None
            assert writer.stdout.readline() == "open\n"
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.wait(timeout=30) == 0
        return real_lease(version)

    monkeypatch.setattr(Version, "lease", lease_after_a_write)
    outcome = Pipeline(Options(settle=0), RecordingLogger()).process(memory_dir_of(mdir), "x.json")
    monkeypatch.undo()
    assert outcome.decision.value == "deferred"  # changed while being decided: decided afresh
    assert path.read_bytes() == new, "the writer's new version is not in place"
    assert sorted(p.name for p in (mdir / "staging").iterdir()) == ["x.json"]


def test_a_file_left_as_it_is_takes_no_lease_and_waits_for_no_writer(tmp_path: Path) -> None:
    """A valid file is left as it is, so it needs no lease: one that another process holds
    open for writing (and does not write) gets its decision, ``valid``, at once; only a file
    that will change waits for its writer (the test above)."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    path = mdir / "staging" / "x.json"
    path.write_bytes(json.dumps(staging_doc(root)).encode())
    mtime_ns = OLD_MTIME * 1_000_000_000
    os.utime(path, ns=(mtime_ns, mtime_ns))
    with _writer(path, path.read_bytes(), mtime_ns) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "open\n"
        done = run_once(mdir, memstaged_env(tmp_path), "--settle", "0")
    assert done.returncode == 0, done.stderr
    assert b"valid=1" in done.stdout


def _breaking_leases() -> str:
    """The lines of ``/proc/locks`` for leases being broken (``<major>:<minor>:<inode> ``)."""
    lines = Path("/proc/locks").read_text().splitlines()
    return "\n".join(line + " " for line in lines if "LEASE" in line and "BREAK" in line)
