"""Memory dirs on file systems that run out of room or refuse writes: a small tmpfs filled up, a
read-only bind mount of ``deadletter/``, a ``deadletter/`` on another file system than
``staging/`` (SPEC 5, SPEC 6: the file stays, ``deferred`` with the reason, or is moved, never
copied whole, when it is too large; issue 10 item 10). Real mounts: skipped where mounting is
not permitted."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from support.daemon_fakes import RecordingLogger, decide_one
from support.documents import OLD, malformed, put, repairable
from support.helpers import (
    make_corpus,
    make_memory_dir,
    memory_dir_of,
    memstaged_env,
    mounted,
    once_stopped_at,
    project_root_of,
    temps_in,
    write_inputs,
)

from memstaged.core.decide import Decision
from memstaged.core.records import ORIGINALS_DIR
from memstaged.files.locks import CANONICAL_LOCK
from memstaged.files.memdir import Options
from memstaged.run.pipeline import Pipeline


def test_a_huge_sparse_file_is_moved_not_copied_and_fills_no_disk(tmp_path: Path) -> None:
    """Issue 10 item 10: a 100 GiB sparse file on a 64 MiB tmpfs is quarantined by a rename: the
    very inode lands in ``originals/`` with its record, nothing is copied, the free space is as it
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


@pytest.mark.parametrize("max_copy", [1 << 20, 1000])
def test_where_no_rename_can_move_it_at_most_max_quarantine_copy_is_copied(
    tmp_path: Path, max_copy: int
) -> None:
    """Issue 10 item 10, SPEC 6: ``deadletter/`` on another file system (a tmpfs mounted there): a
    too-large file is copied in bounded chunks (byte-exact) when it is within
    ``max_quarantine_copy``; a larger one stays in ``staging/``, reported, and fills nothing."""
    mdir = make_memory_dir(tmp_path)
    big = mdir / "staging" / "big.json"
    data = os.urandom(5000)
    put(big, data)
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


def _fill(directory: Path, leave: int) -> Path:
    """Fill the file system of ``directory`` until about ``leave`` bytes are free."""
    filler = directory / "filler"
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    with filler.open("wb") as fh:
        fh.write(b"\0" * max(free - leave, 0))
    return filler


def test_a_disk_that_fills_up_defers_and_loses_nothing(tmp_path: Path) -> None:
    """On a 2 MiB tmpfs with little space left, a quarantine (its copy and records) and a
    rewrite run out of space: both files stay in ``staging/`` byte for byte, the decision is
    ``deferred`` with the reason, no temp file or partial dead-letter file is left; once space
    is freed, the next attempt decides them."""
    mnt = tmp_path / "mnt"
    with mounted(mnt, "-t", "tmpfs", "-o", "size=2m", "tmpfs"):
        mdir = make_memory_dir(mnt)
        root = project_root_of(mdir)
        bad = put(mdir / "staging" / "bad.json", malformed(root, padding=300_000))
        fix = put(mdir / "staging" / "fix.json", repairable(root, padding=300_000))
        filler = _fill(mnt, 100_000)
        for name in ("bad.json", "fix.json"):
            outcome, event, _log = decide_one(mdir, name)
            assert outcome.decision is Decision.DEFERRED, (name, event)
            assert any("No space left on device" in r for r in event["reasons"]), event
            assert event["level"] == "error"
        assert (mdir / "staging" / "bad.json").read_bytes() == bad
        assert (mdir / "staging" / "fix.json").read_bytes() == fix
        assert not temps_in(mdir)
        assert (
            not list((mdir / "deadletter").glob("*.json"))
            if (mdir / "deadletter").exists()
            else True
        )
        assert not (mdir / CANONICAL_LOCK).exists()
        filler.unlink()
        assert decide_one(mdir, "bad.json")[0].decision is Decision.QUARANTINED
        assert decide_one(mdir, "fix.json")[0].decision is Decision.REPAIRED
        assert not temps_in(mdir)


def test_a_deadletter_store_that_cannot_be_written(tmp_path: Path) -> None:
    """With ``deadletter/`` a read-only bind mount, a malformed file stays in ``staging/``
    (``deferred``, the reason logged, nothing half-written); a repairable one is still repaired
    (it needs no dead-letter file); writable again, the malformed one is quarantined."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    (mdir / "deadletter" / ORIGINALS_DIR).mkdir(parents=True)
    bad = put(mdir / "staging" / "bad.json", malformed(root))
    put(mdir / "staging" / "fix.json", repairable(root))
    dl = mdir / "deadletter"
    with mounted(dl, "--bind", str(dl)):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(dl)], check=True)
        outcome, event, _log = decide_one(mdir, "bad.json")
        assert outcome.decision is Decision.DEFERRED
        assert any("Read-only file system" in r for r in event["reasons"]), event
        assert (mdir / "staging" / "bad.json").read_bytes() == bad
        assert decide_one(mdir, "fix.json")[0].decision is Decision.REPAIRED
        assert not temps_in(mdir)
    assert decide_one(mdir, "bad.json")[0].decision is Decision.QUARANTINED


def _sectors_written(mount: Path) -> int:
    """Sectors written so far to the block device mounted at ``mount`` (its ``/sys`` stat)."""
    source = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(mount)], capture_output=True, text=True, check=True
    ).stdout.strip()
    fields = Path(f"/sys/block/{Path(source).name}/stat").read_text().split()
    return int(fields[6])


def test_temps_written_ahead_are_durable_on_a_staging_mounted_apart(tmp_path: Path) -> None:
    """SPEC 5 (durability): a batch's rewrite temps, written before the lock, are made durable
    before any is put in place, on whatever file system ``staging/`` is. One ``syncfs`` of the
    memory dir's file system left those of a ``staging/`` mounted apart (an ext4 image here)
    unwritten: stopped right after it, a ``sync`` of ``staging/`` wrote 1,400 sectors more."""
    image = tmp_path / "staging.img"
    with image.open("wb") as fh:
        fh.truncate(64 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"no mkfs.ext4 here: {made.stderr.decode().strip()}")
    mdir = make_memory_dir(tmp_path)
    staging = mdir / "staging"
    with mounted(staging, "-o", "loop", str(image)):
        inputs = make_corpus(
            random.Random(3), 200, project_root_of(mdir), "dur-", kinds=("r1-empty-triggers",)
        )
        write_inputs(staging, inputs)
        subprocess.run(["sync", "-f", str(staging)], check=True)
        env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="0")
        proc = once_stopped_at(mdir, env, "temps-synced:1", stderr=subprocess.DEVNULL)
        try:
            before = _sectors_written(staging)
            subprocess.run(["sync", "-f", str(staging)], check=True)
            unwritten = _sectors_written(staging) - before
        finally:
            proc.kill()
            proc.wait()
    assert unwritten < 200, f"{unwritten} sectors of temps were not on disk yet"
