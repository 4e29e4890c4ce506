"""Issue 10's defects, each reproduced as it was found (the number is in each docstring).

The races are forced, not hoped for: the writer acts from inside the pipeline's own steps (the
engine's ``decide`` of another file of the batch, or the exchange itself), on a real ext4 or
tmpfs directory with real renames, so every round takes exactly the interleaving that lost data.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_fakes import RecordingLogger
from support.documents import staging_doc
from support.helpers import (
    make_memory_dir,
    memory_dir_of,
    memstaged_env,
    mounted,
    run_once,
    without_dac_override,
)

from memstaged.cli.main import main
from memstaged.core import decide as triage
from memstaged.core.decide import Context, Decision
from memstaged.files import fsio, temp_names
from memstaged.files import version as read_module
from memstaged.files.memdir import Options
from memstaged.run import pipeline
from memstaged.run.pipeline import Pipeline

OLD = 1_700_000_000  # a settled mtime


def _malformed(root: str, filler: str) -> bytes:
    """An unparseable file (quarantined once settled) of a fixed size."""
    return ('{"project_root": "' + root + '", "x": "' + filler + '"').encode()


def _repairable(root: str, filler: str) -> bytes:
    doc = staging_doc(root, session=filler)
    doc["candidates"]["lessons"][0].pop("triggers")
    return json.dumps(doc).encode()


def _put(path: Path, data: bytes, mtime: int = OLD) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def _every_byte_string_in(mdir: Path) -> set[bytes]:
    return {p.read_bytes() for p in mdir.rglob("*") if p.is_file() and not p.is_symlink()}


def _staged(mdir: Path) -> set[bytes]:
    return {p.read_bytes() for p in (mdir / "staging").iterdir() if p.is_file()}


def _during_decide(monkeypatch: pytest.MonkeyPatch, when: str, action: Callable[[], None]) -> None:
    """Run ``action`` while the engine decides ``when`` (after the batch read the others)."""
    real = triage.decide

    def deciding(data: bytes, ctx: Context) -> Any:
        if ctx.file_name == when:
            action()
        return real(data, ctx)

    monkeypatch.setattr(pipeline, "decide", deciding)


def _replace_twice(path: Path, first: bytes, second: bytes) -> None:
    """A writer's two temp-and-rename replacements, the second with the same size and mtime
    as the version memstaged read (``rsync -t``, ``cp -p``); on ext4 its temp file gets the
    inode number the first replacement freed, unless memstaged still holds it open."""
    st = path.stat()
    for n, data in enumerate((first, second)):
        tmp = path.with_name(f".writer-{n}.tmp")
        tmp.write_bytes(data)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(tmp, path)


@pytest.mark.parametrize("kind", ["quarantine", "repair"])
def test_1_inode_reuse_in_a_batch_loses_no_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Item 1: a writer replaces a file twice while the batch decides other files; its second
    temp file would get the freed inode number, same size and mtime. The writer's newest
    version must survive in ``staging/``."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    make = _malformed if kind == "quarantine" else _repairable
    read, middle, newest = make(root, "A" * 40), make(root, "B" * 40), make(root, "C" * 40)
    assert len(read) == len(newest)
    _put(mdir / "staging" / "a.json", read)
    for n in range(5):
        _put(mdir / "staging" / f"z{n}.json", _malformed(root, str(n)))
    target = mdir / "staging" / "a.json"
    _during_decide(monkeypatch, "z2.json", lambda: _replace_twice(target, middle, newest))
    log = RecordingLogger()
    pipeline = Pipeline(Options(settle=0), log, durable_log=contextlib.nullcontext)
    memory_dir = memory_dir_of(mdir)
    outcomes = {
        name: outcome
        for batch in pipeline.batches(memory_dir, pipeline.scan(memory_dir))
        for name, outcome in batch.outcomes.items()
    }
    assert newest in _staged(mdir), "the writer's newest version was lost"
    assert outcomes["a.json"].decision is Decision.DEFERRED


def _no_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decide as on a file system without read leases (NFS), where a writer's in-place write can
    land while memstaged decides the file."""
    monkeypatch.setattr(read_module, "read_lease", lambda _fd: False)


def test_2_an_in_place_rewrite_that_keeps_size_and_mtime_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: ``cp -p`` onto the file (in place, mtime restored) between the read and the
    removal: the writer's version stays in ``staging/``. Where the file system gives no read
    lease (NFS; simulated here, as no such mount can be made in this sandbox) the write can
    land there, and the identity and byte checks must catch it; with a lease the writer waits
    in ``open`` instead (tests/system/test_writer_lease.py), and this same-thread writer would wait
    out the kernel's lease-break-time."""
    _no_lease(monkeypatch)
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    read, newest = _malformed(root, "A" * 40), _malformed(root, "C" * 40)
    target = mdir / "staging" / "a.json"
    _put(target, read)
    _put(mdir / "staging" / "b.json", _malformed(root, "b"))

    def in_place() -> None:
        with target.open("r+b") as fh:
            fh.write(newest)
        os.utime(target, (OLD, OLD))

    _during_decide(monkeypatch, "b.json", in_place)
    pipeline = Pipeline(Options(settle=0), RecordingLogger(), durable_log=contextlib.nullcontext)
    memory_dir = memory_dir_of(mdir)
    for _batch in pipeline.batches(memory_dir, pipeline.scan(memory_dir)):
        pass
    assert newest in _staged(mdir)


def test_2_an_in_place_rewrite_in_the_last_instant_before_the_exchange_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: the in-place rewrite lands after every check, right before the exchange: what
    the exchange displaced is compared byte for byte, and the writer's version is kept. Without
    a read lease (simulated, as above); with one, see tests/system/test_writer_lease.py."""
    _no_lease(monkeypatch)
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    read, newest = _repairable(root, "A" * 40), _repairable(root, "C" * 40)
    target = mdir / "staging" / "a.json"
    _put(target, read)
    real = fsio.exchange

    def exchange(dir_fd: int, a: str, b: str) -> None:
        with target.open("r+b") as fh:
            fh.write(newest)
        os.utime(target, (OLD, OLD))
        real(dir_fd, a, b)

    monkeypatch.setattr(fsio, "exchange", exchange)
    outcome = Pipeline(
        Options(settle=0), RecordingLogger(), durable_log=contextlib.nullcontext
    ).process(memory_dir_of(mdir), "a.json")
    assert newest in _staged(mdir)
    assert outcome.decision is Decision.DEFERRED


@pytest.mark.parametrize("plant", ["dangling-link", "empty-file", "other-bytes"])
def test_3_something_already_at_a_deadletter_name_is_not_trusted(
    tmp_path: Path, plant: str
) -> None:
    """Item 3: a dangling link, an empty file or other bytes at the original's name (and at the
    record's): the original's bytes are written under another name, the staging file is removed
    only then, and the log names files that really hold them."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    data = b'{"schemaVersion": 1, "candidates": {"lessons": [{}]}, "project_root": "' + (
        root.encode() + b'"}'
    )
    _put(mdir / "staging" / "bad.json", data)
    ctx = Context(project_root=root, file_name="bad.json")
    verdict = triage.decide(data, ctx)
    assert verdict.decision is Decision.QUARANTINED and verdict.original is not None
    originals = mdir / "deadletter" / "originals"
    originals.mkdir(parents=True)
    planted = [originals / verdict.original, mdir / "deadletter" / verdict.deadletter[0].name]
    for path in planted:
        if plant == "dangling-link":
            path.symlink_to(tmp_path / "nowhere")
        else:
            path.write_bytes(b"" if plant == "empty-file" else b"someone else's bytes")
    log = RecordingLogger()
    outcome = Pipeline(Options(settle=0), log, durable_log=contextlib.nullcontext).process(
        memory_dir_of(mdir), "bad.json"
    )
    assert outcome.decision is Decision.QUARANTINED
    assert not (mdir / "staging" / "bad.json").exists()
    event = next(e for e in log.events if e["event"] == "decision")
    named = [mdir / p for p in event["deadletter"]]
    kept = [p for p in named if p.parent == originals]
    assert len(kept) == 1 and kept[0].read_bytes() == data and not kept[0].is_symlink()
    for path in named:
        assert path.is_file() and not path.is_symlink() and path not in planted
    assert not (tmp_path / "nowhere").exists()
    record = json.loads(next(p for p in named if p.parent != originals).read_bytes())
    assert record["memstaged"]["original"] == f"originals/{kept[0].name}"


def test_4_a_requarantine_refreshes_the_age_that_purge_counts(
    tmp_path: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4: the same bytes quarantined again an hour later are not purged by
    ``purge --older-than 5s`` run right after: their only copy survives."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    data = _malformed(root, "same bytes")
    staging = mdir / "staging" / "bad.json"
    now = time.time()
    for clock in (now - 3600, now):
        _put(staging, data)
        Pipeline(
            Options(settle=0), RecordingLogger(), clock=functools.partial(float, clock)
        ).process(memory_dir_of(mdir), "bad.json")
        assert not staging.exists()
    records = sorted((mdir / "deadletter").glob("*.json"))
    assert len(records) == 1  # not a second set
    code = main(["deadletter", "purge", "--older-than", "5s", "--yes", "--memory-dir", str(mdir)])
    assert code == 0
    assert sorted((mdir / "deadletter").glob("*.json")) == records
    assert data in _every_byte_string_in(mdir / "deadletter")


def test_5_a_repair_killed_right_after_the_exchange_is_in_the_log(tmp_path: Path) -> None:
    """Item 5: SIGKILL between the rewrite being in place and the end of the run: the
    ``repaired`` decision is in the log already (it is logged, and synced, before any change)."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    _put(mdir / "staging" / "fix.json", _repairable(root, "x"))
    env = memstaged_env(tmp_path / "work", MEMSTAGED_CRASH_AT="replaced:1")
    killed = run_once(mdir, env, "--settle", "0")
    assert killed.returncode == -9
    assert (mdir / "staging" / "fix.json").read_bytes() != _repairable(root, "x")  # repaired
    events = [json.loads(line) for line in Path(env["MEMSTAGED_LOG_FILE"]).read_text().splitlines()]
    assert [e["decision"] for e in events if e.get("event") == "decision"] == ["repaired"]


def test_7_a_linked_deadletter_is_not_followed_by_crash_recovery(tmp_path: Path) -> None:
    """Item 7: ``deadletter/`` a link to an outside directory holding files named like
    memstaged's temps: start-up recovery deletes nothing there."""
    mdir = make_memory_dir(tmp_path)
    outside = tmp_path / "outside"
    (outside / "originals").mkdir(parents=True)
    victims = [
        outside / f"{temp_names.TEMP_PREFIX}rec~x.json~0123456789ab",
        outside / "originals" / (f"{temp_names.TEMP_PREFIX}orig~x.json~0123456789ab"),
    ]
    for victim in victims:
        victim.write_bytes(b"precious")
    (mdir / "deadletter").symlink_to(outside)
    done = run_once(mdir, memstaged_env(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    assert all(v.read_bytes() == b"precious" for v in victims)


def test_8_no_link_is_followed_below_the_configured_prefix(tmp_path: Path) -> None:
    """Item 8: a project under a glob whose ``.pi`` is a link to elsewhere: memstaged writes
    nothing there. The literal prefix of the glob may itself be a link (SPEC 6)."""
    real_base = tmp_path / "real-src"
    good = make_memory_dir(real_base, "good")
    elsewhere = tmp_path / "elsewhere"
    target = make_memory_dir(elsewhere, "victim")
    (real_base / "linked").mkdir()
    (real_base / "linked" / ".pi").symlink_to(target.parents[1])
    root_good = str(good.parents[2])
    _put(good / "staging" / "bad.json", _malformed(root_good, "g"))
    _put(target / "staging" / "bad.json", _malformed(str(real_base / "linked"), "v"))
    base = tmp_path / "src"
    base.symlink_to(real_base)  # the literal prefix: a link there is followed
    env = memstaged_env(tmp_path / "work")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "memstaged",
            "--once",
            "--memory-dir",
            f"{base}/*/.pi/memory/project",
        ],
        env=env,
        capture_output=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    assert not (target / "deadletter").exists()
    assert (target / "staging" / "bad.json").exists()
    assert not (good / "staging" / "bad.json").exists()  # the good project was decided


def test_12_a_stale_own_lock_is_cleared_at_start_even_with_nothing_to_decide(
    tmp_path: Path,
) -> None:
    """Item 12: memstaged's own ``canonical-writer.lock`` left by a killed run is removed as
    the next one starts, not only once a file is decided there."""
    mdir = make_memory_dir(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = mdir / "canonical-writer.lock"
    lock.write_text(
        json.dumps(
            {"pid": dead.pid, "started_at": "2026-01-01T00:00:00.000Z", "owner": "memstaged"}
        )
    )
    env = memstaged_env(tmp_path / "work")
    done = run_once(mdir, env)
    assert done.returncode == 0, done.stderr
    assert not lock.exists()
    log = Path(env["MEMSTAGED_LOG_FILE"]).read_text()
    assert '"lock_seen"' in log and "removed" in log


def test_14_a_future_mtime_settles_from_when_the_version_was_first_seen(tmp_path: Path) -> None:
    """Item 14: an unparseable file dated a day ahead is deferred for the settle interval
    counted from when memstaged first saw it, then quarantined: not deferred for a day."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    now = 1_900_000_000.0
    _put(mdir / "staging" / "late.json", _malformed(root, "x"), mtime=int(now + 86_400))
    clock = [now]
    pipe = Pipeline(Options(settle=2.0), RecordingLogger(), clock=lambda: clock[0])
    first = pipe.process(memory_dir_of(mdir), "late.json")
    assert first.decision is Decision.DEFERRED
    assert first.retry_at == pytest.approx(now + 2.0)
    clock[0] = now + 2.5
    assert pipe.process(memory_dir_of(mdir), "late.json").decision is Decision.QUARANTINED


def test_an_unreadable_staging_dir_is_an_error_not_a_silent_success(tmp_path: Path) -> None:
    """Issue 13 item 3: ``chmod 000 staging/`` as a normal user: ``--once`` exits 1 and says
    why in one line. Root reads anything, so as root the run drops the capabilities that let
    it (``setpriv``), which makes it a normal user as far as permissions go."""
    prefix = without_dac_override()
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path / "work")
    (mdir / "staging").chmod(0)
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(mdir)],
            env=env,
            capture_output=True,
            check=False,
        )
    finally:
        (mdir / "staging").chmod(0o700)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.decode().splitlines() if line.startswith("memstaged:")]
    assert len(lines) == 1 and "staging" in lines[0] and "ermission denied" in lines[0], lines


def test_10_a_huge_sparse_file_is_moved_not_copied_and_fills_no_disk(tmp_path: Path) -> None:
    """Item 10: a 100 GiB sparse file on a 64 MiB tmpfs is quarantined by a rename: the very
    inode lands in ``originals/`` with its record, nothing is copied, the free space is as it
    was, and ``canonical-writer.lock`` is gone after (it was held only for the rename)."""
    mnt = tmp_path / "mnt"
    with mounted(mnt, "-t", "tmpfs", "-o", "size=64m", "tmpfs"):
        mdir = make_memory_dir(mnt)
        huge = mdir / "staging" / "huge.json"
        with huge.open("wb") as fh:
            fh.truncate(100 << 30)
        os.utime(huge, (OLD, OLD))
        ino = huge.stat().st_ino
        free = os.statvfs(mnt).f_bavail
        log = RecordingLogger()
        outcome = Pipeline(Options(settle=0), log, durable_log=contextlib.nullcontext).process(
            memory_dir_of(mdir), "huge.json"
        )
        assert outcome.decision is Decision.QUARANTINED
        moved = list((mdir / "deadletter" / "originals").iterdir())
        assert [p.stat().st_ino for p in moved] == [ino]
        assert moved[0].stat().st_size == 100 << 30
        assert os.statvfs(mnt).f_bavail >= free - 16  # a record, a few pages: no copy
        record = json.loads(next((mdir / "deadletter").glob("*.json")).read_bytes())
        assert record["candidate"] is None and record["memstaged"]["original"].endswith(
            moved[0].name
        )
        assert not huge.exists() and not (mdir / "canonical-writer.lock").exists()


def test_10_a_file_replaced_while_it_was_being_moved_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 10 with SPEC 5's writer check: a writer renames a new version over the too-large
    file right before the move; what the move caught is the writer's, and goes back to
    ``staging/`` (as a new name), and no record is left for it."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    big = mdir / "staging" / "big.json"
    _put(big, b" " * 5000)
    newest = _malformed(root, "new")
    real = fsio.rename_noreplace

    def racing(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
        if src == "big.json":
            tmp = big.with_name(".writer.tmp")
            tmp.write_bytes(newest)
            os.rename(tmp, big)
        real(src_dir, src, dst_dir, dst)

    monkeypatch.setattr(fsio, "rename_noreplace", racing)
    outcome = Pipeline(
        Options(settle=0, max_file_size=4096), RecordingLogger(), durable_log=contextlib.nullcontext
    ).process(memory_dir_of(mdir), "big.json")
    assert outcome.decision is Decision.DEFERRED
    assert newest in _staged(mdir)
    assert not list((mdir / "deadletter").glob("*.json"))


@pytest.mark.parametrize("max_copy", [1 << 20, 1000])
def test_10_where_no_rename_can_move_it_at_most_max_quarantine_copy_is_copied(
    tmp_path: Path, max_copy: int
) -> None:
    """Item 10, SPEC 6: ``deadletter/`` on another file system (a tmpfs mounted there): a
    too-large file is copied in bounded chunks (byte-exact) when it is within
    ``max_quarantine_copy``; a larger one stays in ``staging/``, reported, and fills nothing."""
    mdir = make_memory_dir(tmp_path)
    big = mdir / "staging" / "big.json"
    data = os.urandom(5000)
    _put(big, data)
    with mounted(mdir / "deadletter", "-t", "tmpfs", "-o", "size=1m", "tmpfs"):
        log = RecordingLogger()
        options = Options(settle=0, max_file_size=4096, max_quarantine_copy=max_copy)
        outcome = Pipeline(options, log, durable_log=contextlib.nullcontext).process(
            memory_dir_of(mdir), "big.json"
        )
        kept = [p.read_bytes() for p in (mdir / "deadletter").rglob("*.orig")]
        temps = [p for p in (mdir / "deadletter").rglob("*") if p.name.startswith(".")]
        if max_copy > len(data):
            assert outcome.decision is Decision.QUARANTINED
            assert kept == [data] and not big.exists()
        else:
            assert outcome.decision is Decision.DEFERRED
            assert kept == [] and big.read_bytes() == data
            last = [e for e in log.events if e["event"] == "decision"][-1]
            assert "max_quarantine_copy" in " ".join(last["reasons"])
        assert temps == []
