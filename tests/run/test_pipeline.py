"""A file's way through the pipeline (:class:`memstaged.run.pipeline.Pipeline`): read, decide,
plan, apply, log, for one file or a batch, on real files in a temp dir, in this process.

Hostile and broken input gets the outcome SPEC specifies (SPEC 6: links, special files, names;
SPEC 4: hostile session ids), with a logged event that says why, and no crash. Writers racing
the pipeline (issue 10) are forced, not hoped for: the writer acts from inside the pipeline's own
steps (the engine's ``decide`` of another file of the batch, or the exchange itself), with real
renames, so every round takes exactly the interleaving that lost data. The same input under a
real daemon and real ``--once`` processes is in ``tests/system/`` (test_links.py,
test_file_systems.py, test_unreadable.py, test_daemon_process.py)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_fakes import RecordingLogger, decide_one
from support.documents import OLD, lesson, malformed, put, repairable, staging_doc, unparseable
from support.helpers import (
    IN_OPEN,
    Inotify,
    Input,
    deadletter_records,
    expected_verdict,
    make_memory_dir,
    memory_dir_of,
    project_root_of,
    special_entries,
    temps_in,
)

from memstaged.core import decide as triage
from memstaged.core.decide import Context, Decision
from memstaged.core.js.ecma import trim
from memstaged.core.records import ORIGINALS_DIR
from memstaged.files import fsio
from memstaged.files import version as read_module
from memstaged.files.locks import CANONICAL_LOCK
from memstaged.files.memdir import Options
from memstaged.run import pipeline
from memstaged.run.pipeline import Pipeline

# -- hostile input: links, special files, content, session ids -------------------------------------


def test_links_fifos_sockets_and_directories_are_skipped(tmp_path: Path) -> None:
    """Symbolic links (to a file outside, to a directory, dangling, a loop), a FIFO, a socket and
    a directory named ``*.json`` are ``skipped`` with the reason, never followed, opened for
    writing, moved or blocked on; what a link points to is left exactly as it was."""
    mdir = make_memory_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    expected = special_entries(mdir, outside)
    before = (outside / "outside.json").read_bytes()
    for name, reason in expected.items():
        outcome, event, _log = decide_one(mdir, name)
        assert outcome.decision is Decision.SKIPPED, (name, event)
        assert any(reason in r for r in event["reasons"]), (name, event["reasons"])
    assert (outside / "outside.json").read_bytes() == before
    assert not (mdir / "deadletter").exists()
    assert sorted(p.name for p in (mdir / "staging").iterdir()) == sorted(expected)


@pytest.mark.parametrize("replacement", ["deleted", "symlink", "fifo", "directory", "new file"])
def test_a_file_replaced_between_the_event_and_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replacement: str
) -> None:
    """A staging file deleted, or replaced by a link, a FIFO, a directory or another regular
    file right after memstaged looked at it (between ``lstat`` and ``open``) is ``skipped`` with
    the reason, or decided as the new file it now is; nothing blocks and nothing is followed."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    path = mdir / "staging" / "s.json"
    put(path, malformed(root))
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"secret")
    real = fsio.lstat_at
    fired: list[str] = []

    def racing_lstat(dir_fd: int, name: str) -> os.stat_result | None:
        st = real(dir_fd, name)
        if name == "s.json" and not fired:
            fired.append(name)
            path.unlink()
            if replacement == "symlink":
                os.symlink(outside, path)
            elif replacement == "fifo":
                os.mkfifo(path)
            elif replacement == "directory":
                path.mkdir()
            elif replacement == "new file":
                put(path, repairable(root))
        return st

    monkeypatch.setattr(fsio, "lstat_at", racing_lstat)
    outcome, event, _log = decide_one(mdir, "s.json")
    monkeypatch.undo()
    assert fired
    if replacement == "deleted":
        assert outcome.decision is Decision.SKIPPED
        assert "vanished" in event["reasons"][0]
    elif replacement == "new file":
        assert outcome.decision is Decision.REPAIRED  # the version it opened is the new one
    else:
        assert outcome.decision is Decision.SKIPPED
        assert "replaced by a link or special file" in event["reasons"][0]
    assert outside.read_bytes() == b"secret"
    assert not temps_in(mdir)


def test_a_file_that_vanished_before_the_event_was_handled(tmp_path: Path) -> None:
    """A name whose file is already gone is ``skipped``: vanished."""
    mdir = make_memory_dir(tmp_path)
    outcome, event, _log = decide_one(mdir, "gone.json")
    assert outcome.decision is Decision.SKIPPED
    assert "vanished" in event["reasons"][0]


def test_a_lock_that_is_a_fifo_or_a_link_is_obeyed_without_blocking(tmp_path: Path) -> None:
    """A ``canonical-writer.lock`` that is a FIFO (which would block a reader) or a symbolic link
    is obeyed and never opened for reading or followed: the file is ``deferred``."""
    for kind in ("fifo", "link"):
        mdir = make_memory_dir(tmp_path / kind)
        data = put(mdir / "staging" / "s.json", repairable(project_root_of(mdir)))
        if kind == "fifo":
            os.mkfifo(mdir / CANONICAL_LOCK)
        else:
            os.symlink("/nonexistent", mdir / CANONICAL_LOCK)
        outcome, event, _log = decide_one(mdir, "s.json")
        assert outcome.decision is Decision.DEFERRED and outcome.blocked_by_lock
        assert "canonical-writer.lock is held" in event["reasons"][0]
        assert (mdir / "staging" / "s.json").read_bytes() == data


def test_empty_deep_and_badly_encoded_files_are_quarantined(tmp_path: Path) -> None:
    """A 0-byte file, 10^6-deep nesting and UTF-16 text are quarantined with their exact bytes and
    one record (``candidate`` the text as Node reads it, or the parsed value); a stray non-UTF-8
    byte in a string is U+FFFD to Node, so that file is valid and left as it is (contract v2;
    v1 quarantined it, and a deep file was quarantined as too deep, where it is now JSON)."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    body = json.dumps(staging_doc(root, "s", candidates={"lessons": [lesson("cid-e")]}))
    latin1 = body.replace("keep", "k\xe9ep").encode("latin-1")
    put(mdir / "staging" / "latin1.json", latin1)
    outcome, event, _log = decide_one(mdir, "latin1.json")
    assert outcome.decision is Decision.VALID, event
    assert (mdir / "staging" / "latin1.json").read_bytes() == latin1
    files = {
        "empty.json": (b"", ""),
        "deep.json": (b"[" * 10**6 + b"]" * 10**6, "not a JSON object"),
        "utf16.json": (body.encode("utf-16"), "not JSON"),
    }
    for name, (data, reason) in files.items():
        put(mdir / "staging" / name, data)
        outcome, event, _log = decide_one(mdir, name)
        assert outcome.decision is Decision.QUARANTINED, (name, event)
        assert reason in event["reasons"][0], (name, event["reasons"])
        verdict = expected_verdict(mdir, Input(name, data, ""))
        assert verdict.original is not None
        assert (mdir / "deadletter" / ORIGINALS_DIR / verdict.original).read_bytes() == data
        assert not (mdir / "staging" / name).exists()
    by_file = {r["memstaged"]["source_file"]: r for r in deadletter_records(mdir)}
    assert by_file["empty.json"]["candidate"] == ""
    assert by_file["empty.json"]["session_id"] == "malformed-empty"
    assert by_file["utf16.json"]["candidate"] == body.encode("utf-16").decode("utf-8", "replace")
    deep = by_file["deep.json"]["candidate"]
    depth = 0
    while isinstance(deep, list) and deep:
        deep, depth = deep[0], depth + 1
    assert depth == 10**6 - 1


HOSTILE_SESSIONS = [
    "../../../etc/passwd",
    "a/b/c",
    "..",
    ".hidden",
    "ctrl\x00\x01\x1b[31m\n\r\u2028",
    "x" * 100_000,
    "\udcff lone surrogate",
    " \u3000 padded \ufeff ",
]


@pytest.mark.parametrize("session", HOSTILE_SESSIONS, ids=range(len(HOSTILE_SESSIONS)))
def test_hostile_session_ids_never_lead_outside_deadletter(tmp_path: Path, session: str) -> None:
    """A ``session_id`` with ``/``, ``..``, control characters, 100,000 characters or a lone
    surrogate is kept verbatim (trimmed) in the records but never used for a name: every
    record is a plain file directly in ``deadletter/``, not hidden, within NAME_MAX; the same
    file repairable is rewritten as usual."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    put(mdir / "staging" / "bad.json", malformed(root, session))
    put(mdir / "staging" / "fix.json", repairable(root, session))
    outcome, _event, _log = decide_one(mdir, "bad.json")
    assert outcome.decision is Decision.QUARANTINED
    outcome, _event, _log = decide_one(mdir, "fix.json")
    assert outcome.decision is Decision.REPAIRED
    entries = [p for p in (mdir / "deadletter").rglob("*")]
    assert all(
        p.parent in (mdir / "deadletter", mdir / "deadletter" / ORIGINALS_DIR) for p in entries
    )
    for path in (mdir / "deadletter").glob("*.json"):
        assert not path.name.startswith(".") and len(os.fsencode(path.name)) <= 255
        record = json.loads(path.read_bytes())
        assert record["session_id"] == trim(session)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example-project"]


# -- writers racing the pipeline, forced from inside its steps -------------------------------------


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
def test_inode_reuse_in_a_batch_loses_no_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Issue 10 item 1: a writer replaces a file twice while the batch decides other files; its
    second temp file would get the freed inode number, same size and mtime. The writer's newest
    version must survive in ``staging/``."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    make = unparseable if kind == "quarantine" else repairable
    read, middle, newest = make(root, "A" * 40), make(root, "B" * 40), make(root, "C" * 40)
    assert len(read) == len(newest)
    put(mdir / "staging" / "a.json", read)
    for n in range(5):
        put(mdir / "staging" / f"z{n}.json", unparseable(root, str(n)))
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


def test_an_in_place_rewrite_that_keeps_size_and_mtime_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 item 2: ``cp -p`` onto the file (in place, mtime restored) between the read and the
    removal: the writer's version stays in ``staging/``. Where the file system gives no read
    lease (NFS; simulated here, as no such mount can be made in this sandbox) the write can
    land there, and the identity and byte checks must catch it; with a lease the writer waits
    in ``open`` instead (tests/system/test_writer_lease.py), and this same-thread writer would wait
    out the kernel's lease-break-time."""
    _no_lease(monkeypatch)
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    read, newest = unparseable(root, "A" * 40), unparseable(root, "C" * 40)
    target = mdir / "staging" / "a.json"
    put(target, read)
    put(mdir / "staging" / "b.json", unparseable(root, "b"))

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


def test_an_in_place_rewrite_in_the_last_instant_before_the_exchange_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 item 2: the in-place rewrite lands after every check, right before the exchange:
    what the exchange displaced is compared byte for byte, and the writer's version is kept. Without
    a read lease (simulated, as above); with one, see tests/system/test_writer_lease.py."""
    _no_lease(monkeypatch)
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    read, newest = repairable(root, "A" * 40), repairable(root, "C" * 40)
    target = mdir / "staging" / "a.json"
    put(target, read)
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


def test_a_future_mtime_settles_from_when_the_version_was_first_seen(tmp_path: Path) -> None:
    """Issue 10 item 14: an unparseable file dated a day ahead is deferred for the settle interval
    counted from when memstaged first saw it, then quarantined: not deferred for a day."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    now = 1_900_000_000.0
    put(mdir / "staging" / "late.json", unparseable(root, "x"), mtime=int(now + 86_400))
    clock = [now]
    pipe = Pipeline(Options(settle=2.0), RecordingLogger(), clock=lambda: clock[0])
    first = pipe.process(memory_dir_of(mdir), "late.json")
    assert first.decision is Decision.DEFERRED
    assert first.retry_at == pytest.approx(now + 2.0)
    clock[0] = now + 2.5
    assert pipe.process(memory_dir_of(mdir), "late.json").decision is Decision.QUARANTINED


def test_a_too_large_file_replaced_while_it_was_being_moved_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 item 10 with SPEC 5's writer check: a writer renames a new version over the
    too-large file right before the move; what the move caught is the writer's, and goes back to
    ``staging/`` (as a new name), and no record is left for it."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    big = mdir / "staging" / "big.json"
    put(big, b" " * 5000)
    newest = unparseable(root, "new")
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


# -- what the pipeline hands back ------------------------------------------------------------------


def test_a_repair_reports_the_identity_of_its_own_rewrite(tmp_path: Path) -> None:
    """After a repair the pipeline hands back the identity of exactly the rewrite it put in
    place (so a daemon rescan does not decide it again), not the version it read, and not
    whatever a writer may have renamed in since."""
    mdir = make_memory_dir(tmp_path)
    path = mdir / "staging" / "s.json"
    path.write_bytes(
        json.dumps(
            staging_doc(
                project_root_of(mdir), "s", candidates={"lessons": [lesson("c", triggers=[])]}
            )
        ).encode()
    )
    before = os.lstat(path)
    pipeline = Pipeline(Options(settle=0), RecordingLogger())
    outcome = pipeline.process(memory_dir_of(mdir), "s.json")
    assert outcome.decision is Decision.REPAIRED
    after = os.lstat(path)
    assert outcome.identity is not None
    assert outcome.identity.ino == after.st_ino != before.st_ino
    assert (outcome.identity.size, outcome.identity.mtime_ns) == (after.st_size, after.st_mtime_ns)


def test_a_listed_file_replaced_by_a_fifo_or_a_device_is_never_opened(tmp_path: Path) -> None:
    """A name listed as a regular file and replaced by a FIFO or a device node before its turn
    is looked at (``lstat``) just before it would be opened, and skipped unopened (SPEC 6):
    opening a FIFO lets a writer blocked in its ``open`` through, opening a device can have
    effects. A listing's file type is no substitute for that look: it may be seconds old.
    inotify's ``IN_OPEN`` tells whether anything opened them."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    staging = mdir / "staging"
    for name in ("fifo.json", "dev.json"):
        put(staging / name, malformed(root))
    pipeline = Pipeline(Options(settle=0), RecordingLogger(), durable_log=contextlib.nullcontext)
    memory_dir = memory_dir_of(mdir)
    names = pipeline.scan(memory_dir)
    assert names == ["dev.json", "fifo.json"]
    for name in names:
        (staging / name).unlink()
    os.mkfifo(staging / "fifo.json")
    if os.geteuid() == 0:
        os.mknod(staging / "dev.json", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    else:
        os.mkfifo(staging / "dev.json")  # no device without root: a second FIFO
    watch = Inotify([staging], mask=IN_OPEN)
    try:
        (batch,) = pipeline.batches(memory_dir, names)
        watch.poll()
    finally:
        watch.close()
    assert {n: o.decision for n, o in batch.outcomes.items()} == dict.fromkeys(
        names, Decision.SKIPPED
    )
    opened = [name for _d, name, _m in watch.log if name]  # "": staging/ itself
    assert opened == [], "memstaged opened a special file"
    assert not (mdir / "deadletter").exists()
