"""Hostile and broken input: the outcome SPEC specifies, a log event that says why, no crash.

SPEC 6 (links, special files, size limit, names), SPEC 4 (hostile session ids), SPEC 5 (a full
disk, a dead-letter store that cannot be written: the file stays, ``deferred`` with the reason).
Most cases go through :meth:`Pipeline.process` in-process (a capturing logger sees the event);
the last tests run the real daemon over all of it at once and check that it keeps working, and
the real ``--once`` for the 100 MiB file (bounded memory) and for an unreadable file (as nobody).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import as_nobody
from support.daemon_fakes import RecordingLogger
from support.documents import lesson
from support.helpers import (
    PYTHON,
    REPO,
    Input,
    daemon,
    doc,
    expected_verdict,
    fd_count,
    make_memory_dir,
    memory_dir_of,
    memstaged_env,
    mounted,
    project_root_of,
    read_events,
    run_once,
    temps_in,
)
from support.waiting import wait_for

from memstaged.core.decide import Decision
from memstaged.core.js.ecma import parse_json, trim
from memstaged.core.records import ORIGINALS_DIR
from memstaged.files import fsio
from memstaged.files.locks import CANONICAL_LOCK
from memstaged.files.memdir import Options
from memstaged.run.decision import Outcome
from memstaged.run.pipeline import Pipeline

OLD = 1_700_000_000


def _decide(
    mdir: Path, name: str, **options: Any
) -> tuple[Outcome, dict[str, Any], RecordingLogger]:
    """Decide one file in-process; returns the outcome and its (last) decision event.

    A change is logged before it is carried out (SPEC 5); one that then could not be carried
    out gets a second event, saying what it became and what was ``planned``.
    """
    log = RecordingLogger()
    pipeline = Pipeline(Options(settle=0, **options), log)
    outcome = pipeline.process(memory_dir_of(mdir), name)
    events = [e for e in log.events if e["event"] == "decision"]
    assert len(events) in (1, 2), log.events
    if len(events) == 2:
        assert events[1]["planned"] == events[0]["decision"], events
    assert events[-1]["decision"] == outcome.decision.value
    return outcome, events[-1], log


def _malformed(root: str, session: Any = "s", extra: int = 0) -> bytes:
    body = doc(session, root, {"lessons": [lesson("cid-h")]}, schemaVersion="1")
    if extra:
        body["padding"] = "x" * extra
    return json.dumps(body).encode()


def _repairable(root: str, session: Any = "s", extra: int = 0) -> bytes:
    body = doc(session, root, {"lessons": [lesson("cid-h", triggers=[])]})
    if extra:
        body["padding"] = "x" * extra
    return json.dumps(body).encode()


def _put(path: Path, data: bytes) -> bytes:
    path.write_bytes(data)
    os.utime(path, (OLD, OLD))
    return data


def _records(mdir: Path) -> list[dict[str, Any]]:
    # parse_json, not json.loads: a record of a 10^6-deep file is that deep too.
    return [parse_json(p.read_bytes()).value for p in sorted((mdir / "deadletter").glob("*.json"))]


# -- links and special files --------------------------------------------------------------------


def _special_entries(mdir: Path, outside: Path) -> dict[str, str]:
    """Create every kind of entry SPEC 6 says is never touched; name -> expected reason."""
    staging = mdir / "staging"
    target = outside / "outside.json"
    target.write_bytes(_malformed(project_root_of(mdir)))
    (outside / "dir").mkdir()
    os.symlink(target, staging / "link-outside.json")
    os.symlink(outside / "dir", staging / "link-dir.json")
    os.symlink(outside / "missing.json", staging / "link-dangling.json")
    os.symlink("loop-b.json", staging / "loop-a.json")
    os.symlink("loop-a.json", staging / "loop-b.json")
    os.mkfifo(staging / "fifo.json")
    os.mknod(staging / "socket.json", stat.S_IFSOCK | 0o600)
    (staging / "directory.json").mkdir()
    return {
        "link-outside.json": "symbolic link",
        "link-dir.json": "symbolic link",
        "link-dangling.json": "symbolic link",
        "loop-a.json": "symbolic link",
        "loop-b.json": "symbolic link",
        "fifo.json": "not a regular file",
        "socket.json": "not a regular file",
        "directory.json": "a directory",
    }


def test_links_fifos_sockets_and_directories_are_skipped(tmp_path: Path) -> None:
    """Symbolic links (to a file outside, to a directory, dangling, a loop), a FIFO, a socket and
    a directory named ``*.json`` are ``skipped`` with the reason, never followed, opened for
    writing, moved or blocked on; what a link points to is left exactly as it was."""
    mdir = make_memory_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    expected = _special_entries(mdir, outside)
    before = (outside / "outside.json").read_bytes()
    for name, reason in expected.items():
        outcome, event, _log = _decide(mdir, name)
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
    _put(path, _malformed(root))
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
                _put(path, _repairable(root))
        return st

    monkeypatch.setattr(fsio, "lstat_at", racing_lstat)
    outcome, event, _log = _decide(mdir, "s.json")
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
    outcome, event, _log = _decide(mdir, "gone.json")
    assert outcome.decision is Decision.SKIPPED
    assert "vanished" in event["reasons"][0]


def test_staging_or_deadletter_replaced_by_a_link(tmp_path: Path) -> None:
    """A ``staging/`` that is a symbolic link is never followed (``skipped``, and ``--once``
    logs why); a ``deadletter/`` that is one is never written through: the malformed file stays
    in ``staging/``, ``deferred`` with the reason, and is retried (not given up as skipped)."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = _put(mdir / "staging" / "bad.json", _malformed(root))
    os.symlink(elsewhere, mdir / "deadletter")
    outcome, event, _log = _decide(mdir, "bad.json")
    assert outcome.decision is Decision.DEFERRED
    assert any("deadletter/ is a symbolic link" in r for r in event["reasons"])
    assert outcome.retry_at is not None
    assert (mdir / "staging" / "bad.json").read_bytes() == data
    assert list(elsewhere.iterdir()) == []
    assert not temps_in(mdir)

    other = make_memory_dir(tmp_path / "b")
    shutil.rmtree(other / "staging")
    real_staging = tmp_path / "real-staging"
    real_staging.mkdir()
    bad = _put(real_staging / "bad.json", _malformed(project_root_of(other)))
    os.symlink(real_staging, other / "staging")
    outcome, event, _log = _decide(other, "bad.json")
    assert outcome.decision is Decision.SKIPPED
    assert "staging/ is a symbolic link" in event["reasons"][0]
    env = memstaged_env(tmp_path / "b")
    result = run_once(other, env, "--settle", "0")
    assert result.returncode == 0, result.stderr
    assert (real_staging / "bad.json").read_bytes() == bad
    assert not (other / "deadletter").exists()
    events = read_events(tmp_path / "b" / "decisions.jsonl")
    assert any(
        e.get("decision") == "skipped" and "staging/ is a symbolic link" in e["reasons"][0]
        for e in events
    ), events


def test_a_lock_that_is_a_fifo_or_a_link_is_obeyed_without_blocking(tmp_path: Path) -> None:
    """A ``canonical-writer.lock`` that is a FIFO (which would block a reader) or a symbolic link
    is obeyed and never opened for reading or followed: the file is ``deferred``."""
    for kind in ("fifo", "link"):
        mdir = make_memory_dir(tmp_path / kind)
        data = _put(mdir / "staging" / "s.json", _repairable(project_root_of(mdir)))
        if kind == "fifo":
            os.mkfifo(mdir / CANONICAL_LOCK)
        else:
            os.symlink("/nonexistent", mdir / CANONICAL_LOCK)
        outcome, event, _log = _decide(mdir, "s.json")
        assert outcome.decision is Decision.DEFERRED and outcome.blocked_by_lock
        assert "canonical-writer.lock is held" in event["reasons"][0]
        assert (mdir / "staging" / "s.json").read_bytes() == data


# -- hostile content and names ------------------------------------------------------------------


def test_empty_deep_and_badly_encoded_files_are_quarantined(tmp_path: Path) -> None:
    """A 0-byte file, 10^6-deep nesting and UTF-16 text are quarantined with their exact bytes and
    one record (``candidate`` the text as Node reads it, or the parsed value); a stray non-UTF-8
    byte in a string is U+FFFD to Node, so that file is valid and left as it is (contract v2;
    v1 quarantined it, and a deep file was quarantined as too deep, where it is now JSON)."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    body = json.dumps(doc("s", root, {"lessons": [lesson("cid-e")]}))
    latin1 = body.replace("keep", "k\xe9ep").encode("latin-1")
    _put(mdir / "staging" / "latin1.json", latin1)
    outcome, event, _log = _decide(mdir, "latin1.json")
    assert outcome.decision is Decision.VALID, event
    assert (mdir / "staging" / "latin1.json").read_bytes() == latin1
    files = {
        "empty.json": (b"", ""),
        "deep.json": (b"[" * 10**6 + b"]" * 10**6, "not a JSON object"),
        "utf16.json": (body.encode("utf-16"), "not JSON"),
    }
    for name, (data, reason) in files.items():
        _put(mdir / "staging" / name, data)
        outcome, event, _log = _decide(mdir, name)
        assert outcome.decision is Decision.QUARANTINED, (name, event)
        assert reason in event["reasons"][0], (name, event["reasons"])
        verdict = expected_verdict(mdir, Input(name, data, ""))
        assert verdict.original is not None
        assert (mdir / "deadletter" / ORIGINALS_DIR / verdict.original).read_bytes() == data
        assert not (mdir / "staging" / name).exists()
    by_file = {r["memstaged"]["source_file"]: r for r in _records(mdir)}
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
    _put(mdir / "staging" / "bad.json", _malformed(root, session))
    _put(mdir / "staging" / "fix.json", _repairable(root, session))
    outcome, _event, _log = _decide(mdir, "bad.json")
    assert outcome.decision is Decision.QUARANTINED
    outcome, _event, _log = _decide(mdir, "fix.json")
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


HOSTILE_NAMES = [
    "é" * 125 + ".json",  # 255 bytes: every temp name built from it must still fit
    "漢" * 83 + ".json",  # 254 bytes
    "a" * 250 + ".json",
    "new\nline.json",
    "-dash ~tilde~ .json",
    os.fsdecode(b"latin1-\xe9.json"),  # not UTF-8 at all
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_long_and_strange_file_names_are_decided_like_any_other(tmp_path: Path, name: str) -> None:
    """Staging file names of 255 bytes (multibyte characters), with newlines, tildes or bytes
    that are not UTF-8 are repaired and quarantined like any other (memstaged's own temp names
    stay within NAME_MAX), and a crash's leftover temp for such a name is recovered."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    data = _put(mdir / "staging" / name, _repairable(root))
    outcome, event, _log = _decide(mdir, name)
    assert outcome.decision is Decision.REPAIRED, event
    repaired = (mdir / "staging" / name).read_bytes()
    assert repaired == expected_verdict(mdir, Input(name, data, "")).new_bytes
    bad = _put(mdir / "staging" / name, _malformed(root))
    outcome, event, _log = _decide(mdir, name)
    assert outcome.decision is Decision.QUARANTINED, event
    verdict = expected_verdict(mdir, Input(name, bad, ""))
    assert verdict.original is not None
    assert (mdir / "deadletter" / ORIGINALS_DIR / verdict.original).read_bytes() == bad
    assert not temps_in(mdir)
    # A crash right after the rename-away leaves a temp whose name encodes this target.
    again = _put(mdir / "staging" / name, _malformed(root, "again"))
    env = memstaged_env(tmp_path, MEMSTAGED_CRASH_AT="renamed-away:1")
    killed = run_once(mdir, env, "--settle", "0")
    assert killed.returncode == -signal.SIGKILL
    assert temps_in(mdir)
    result = run_once(mdir, memstaged_env(tmp_path), "--settle", "0")
    assert result.returncode == 0, result.stderr
    assert not temps_in(mdir)
    assert not (mdir / "staging" / name).exists()
    originals = [p.read_bytes() for p in (mdir / "deadletter" / ORIGINALS_DIR).iterdir()]
    assert again in originals


# -- resources: size, disk, permissions ---------------------------------------------------------

_RSS_WRAPPER = """
import sys
from memstaged.cli.main import main
rc = main(sys.argv[2:])
with open("/proc/self/status") as fh:
    hwm = next(line.split()[1] for line in fh if line.startswith("VmHWM:"))
with open(sys.argv[1], "w") as out:
    out.write(hwm)
sys.exit(rc)
"""


def _peak_rss_kib(mdir: Path, work: Path, *args: str) -> int:
    out = work / "hwm.txt"
    result = subprocess.run(
        [PYTHON, "-c", _RSS_WRAPPER, str(out), "--once", "--memory-dir", str(mdir), *args],
        env=memstaged_env(work),
        capture_output=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return int(out.read_text())


def test_a_100_mib_file_is_quarantined_with_bounded_memory(tmp_path: Path) -> None:
    """A 100 MiB staging file is quarantined as ``file too large`` without being read whole: its
    bytes are copied exactly to ``originals/``, there is one record with ``candidate`` null and
    ``session_id`` ``malformed-<name>``, and the peak RSS of the run stays far below 100 MiB
    (within 24 MiB of a run on a tiny file)."""
    small = make_memory_dir(tmp_path / "small")
    _put(small / "staging" / "tiny.json", b"{}")
    baseline = _peak_rss_kib(small, tmp_path / "small", "--settle", "0")

    mdir = make_memory_dir(tmp_path / "big")
    path = mdir / "staging" / "big.json"
    digest = hashlib.sha256()
    chunk = (b'{"schemaVersion": 1, "padding": "' + b"x" * (1 << 20))[: 1 << 20]
    with path.open("wb") as fh:
        for i in range(100):
            block = chunk if i == 0 else os.urandom(1 << 20)
            digest.update(block)
            fh.write(block)
    os.utime(path, (OLD, OLD))
    peak = _peak_rss_kib(mdir, tmp_path / "big", "--settle", "0")
    print(f"\npeak RSS: {baseline} KiB on a tiny file, {peak} KiB on a 100 MiB file")
    assert peak - baseline < 24 * 1024
    assert not path.exists()
    originals = list((mdir / "deadletter" / ORIGINALS_DIR).iterdir())
    assert len(originals) == 1
    copy = hashlib.sha256()
    with originals[0].open("rb") as fh:
        while block := fh.read(1 << 20):
            copy.update(block)
    assert copy.hexdigest() == digest.hexdigest()
    (record,) = _records(mdir)
    assert record["candidate"] is None
    assert record["session_id"] == "malformed-big"
    events = [
        e for e in read_events(tmp_path / "big" / "decisions.jsonl") if e.get("event") == "decision"
    ]
    assert events[-1]["decision"] == "quarantined"
    assert "file too large" in events[-1]["reasons"][0]


def test_a_deeply_nested_file_does_not_blow_up_its_record(tmp_path: Path) -> None:
    """A 16 KB staging file nested 8,000 deep (well within what the engine parses) is
    quarantined with a record of a size comparable to the file, and without a memory peak of
    hundreds of MiB: a few such files must not be able to exhaust the disk or the daemon."""
    small = make_memory_dir(tmp_path / "small")
    _put(small / "staging" / "tiny.json", b"{}")
    baseline = _peak_rss_kib(small, tmp_path / "small", "--settle", "0")
    mdir = make_memory_dir(tmp_path / "deep")
    data = _put(mdir / "staging" / "deep.json", b"[" * 8000 + b"]" * 8000)
    peak = _peak_rss_kib(mdir, tmp_path / "deep", "--settle", "0")
    records = sum(p.stat().st_size for p in (mdir / "deadletter").glob("*.json"))
    print(
        f"\ndeep nesting: {len(data)} bytes in, {records} bytes of records, "
        f"peak RSS +{peak - baseline} KiB"
    )
    assert not (mdir / "staging" / "deep.json").exists()
    assert records < 100 * len(data)
    assert peak - baseline < 64 * 1024


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
        bad = _put(mdir / "staging" / "bad.json", _malformed(root, extra=300_000))
        fix = _put(mdir / "staging" / "fix.json", _repairable(root, extra=300_000))
        filler = _fill(mnt, 100_000)
        for name in ("bad.json", "fix.json"):
            outcome, event, _log = _decide(mdir, name)
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
        assert _decide(mdir, "bad.json")[0].decision is Decision.QUARANTINED
        assert _decide(mdir, "fix.json")[0].decision is Decision.REPAIRED
        assert not temps_in(mdir)


def test_a_deadletter_store_that_cannot_be_written(tmp_path: Path) -> None:
    """With ``deadletter/`` a read-only bind mount, a malformed file stays in ``staging/``
    (``deferred``, the reason logged, nothing half-written); a repairable one is still repaired
    (it needs no dead-letter file); writable again, the malformed one is quarantined."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    (mdir / "deadletter" / ORIGINALS_DIR).mkdir(parents=True)
    bad = _put(mdir / "staging" / "bad.json", _malformed(root))
    _put(mdir / "staging" / "fix.json", _repairable(root))
    dl = mdir / "deadletter"
    with mounted(dl, "--bind", str(dl)):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(dl)], check=True)
        outcome, event, _log = _decide(mdir, "bad.json")
        assert outcome.decision is Decision.DEFERRED
        assert any("Read-only file system" in r for r in event["reasons"]), event
        assert (mdir / "staging" / "bad.json").read_bytes() == bad
        assert _decide(mdir, "fix.json")[0].decision is Decision.REPAIRED
        assert not temps_in(mdir)
    assert _decide(mdir, "bad.json")[0].decision is Decision.QUARANTINED


def test_a_file_memstaged_may_not_read(tmp_path: Path) -> None:
    """Run as an unprivileged user (root would bypass permissions), ``--once`` meets a file it
    may not read: it is left as it is, ``deferred`` with "permission denied" (exit 1), and the
    other files are decided. Issue 29 item 14: passes wherever the clone is (in /root too), as
    ``nobody`` runs memstaged from a venv it can reach (:mod:`support.as_nobody`)."""
    with _unreadable_world(fix=True) as (base, mdir, env, secret):
        result = _as_nobody(base, env, "--once", "--settle", "0", "--memory-dir", str(mdir))
        assert result.returncode == 1, result.stderr
        assert (mdir / "staging" / "secret.json").read_bytes() == secret
        events = [
            e
            for e in read_events(base / "decisions.jsonl")
            if e.get("event") == "decision" and not e.get("own_rewrite")
        ]
        by_name = {Path(e["path"]).name: e for e in events}
        # Said with what the run printed: a bare KeyError said nothing (issue 19 item 8).
        assert set(by_name) == {"secret.json", "fix.json"}, (events, result.stderr)
        assert by_name["secret.json"]["decision"] == "deferred"
        assert "permission denied" in by_name["secret.json"]["reasons"][0]
        assert by_name["fix.json"]["decision"] == "repaired"


@contextlib.contextmanager
def _unreadable_world(*, fix: bool) -> Iterator[tuple[Path, Path, dict[str, str], bytes]]:
    """A memory dir owned by ``nobody`` whose ``secret.json`` (malformed) only root may read,
    and with ``fix`` a repairable ``fix.json``: (base, memory dir, environment, secret's bytes).
    In a workspace ``nobody`` can reach (a test's tmp_path may not be)."""
    uid, gid = as_nobody.ids()
    with as_nobody.workspace("memstaged-nobody-") as base:
        mdir = make_memory_dir(base)
        root = project_root_of(mdir)
        secret = _put(mdir / "staging" / "secret.json", _malformed(root))
        os.chmod(mdir / "staging" / "secret.json", 0o600)  # owned by root
        if fix:
            _put(mdir / "staging" / "fix.json", _repairable(root))
        for path in [base, *base.rglob("*")]:
            if path.name != "secret.json":
                os.chown(path, uid, gid)
        env = memstaged_env(base)
        env["HOME"] = str(base)
        os.chown(base / "xdg-config", uid, gid)
        yield base, mdir, env, secret


def _as_nobody(base: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``memstaged ARGS`` as ``nobody`` (root would bypass permissions)."""
    return as_nobody.run_memstaged(*args, env=env, cwd=base)


# -- the daemon keeps running ---------------------------------------------------------------------


def test_the_daemon_survives_all_of_it(tmp_path: Path) -> None:
    """One daemon over memory dirs full of hostile input (links, FIFOs, sockets, directories,
    empty/deep/non-UTF-8/UTF-16 files, hostile session ids and names, a ``deadletter/`` that is a
    link, a full disk when mounting is permitted): every entry gets the decision SPEC gives it
    with a reason in the log, no error escapes, the file descriptors do not pile up, and a
    file dropped afterwards is still decided."""
    a = make_memory_dir(tmp_path / "a")
    root = project_root_of(a)
    outside = tmp_path / "outside"
    outside.mkdir()
    skipped = _special_entries(a, outside)
    quarantined = {
        "empty.json": b"",
        "deep.json": b"[" * 10**6 + b"]" * 10**6,
        "latin1.json": b'{"schemaVersion": "\xe9"}',
        "utf16.json": json.dumps({"a": 1}).encode("utf-16"),
        "traversal.json": _malformed(root, "../../../x"),
        "long-session.json": _malformed(root, "s" * 100_000),
        ("é" * 125 + ".json"): _malformed(root),
    }
    for name, data in quarantined.items():
        _put(a / "staging" / name, data)
    c = make_memory_dir(tmp_path / "c")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, c / "deadletter")
    stuck = _put(c / "staging" / "stuck.json", _malformed(project_root_of(c)))
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    with daemon([a, c], env, "--settle", "0", stderr=tmp_path / "daemon.err") as proc:
        assert wait_for(lambda: any(e.get("event") == "ready" for e in read_events(log)), 60)
        fds = fd_count(proc.pid)
        late = _put(a / "staging" / "late.json", _repairable(root))

        def decided(name: str, mdir: Path = a) -> list[dict[str, Any]]:
            path = str(mdir / "staging" / name)
            return [
                e
                for e in read_events(log)
                if e.get("event") == "decision" and e.get("path") == path
            ]

        assert wait_for(lambda: any(e["decision"] == "repaired" for e in decided("late.json")), 30)
        assert wait_for(lambda: len(decided("stuck.json", c)) >= 2, 30)  # retried, not given up
        assert proc.poll() is None, "the daemon died"
        assert fd_count(proc.pid) <= fds + 4
        for name, reason in skipped.items():
            events = decided(name)
            assert events and events[0]["decision"] == "skipped", (name, events)
            assert reason in events[0]["reasons"][0]
        for name in quarantined:
            events = decided(name)
            assert events and events[-1]["decision"] == "quarantined", (name, events)
            assert events[-1]["reasons"], name
        for event in decided("stuck.json", c):
            assert event["decision"] == "deferred"
            assert "deadletter/ is a symbolic link" in event["reasons"][-1]
        errors = [
            e
            for e in read_events(log)
            if e.get("level") == "error" and e.get("path") != str(c / "staging" / "stuck.json")
        ]
        assert not errors, errors
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert (c / "staging" / "stuck.json").read_bytes() == stuck
    assert list(elsewhere.iterdir()) == []
    assert (a / "staging" / "late.json").read_bytes() != late
    assert (outside / "outside.json").exists()
    assert not temps_in(a) and not temps_in(c)
    assert "Traceback" not in (tmp_path / "daemon.err").read_text(errors="replace")


def test_the_daemon_says_why_it_ignores_a_staging_link(tmp_path: Path) -> None:
    """A ``staging/`` that is a symbolic link is never followed by the daemon, and the log says
    so (a ``skipped`` event naming the reason), as ``--once`` does."""
    mdir = make_memory_dir(tmp_path)
    shutil.rmtree(mdir / "staging")
    real = tmp_path / "real"
    real.mkdir()
    _put(real / "bad.json", b"{")
    os.symlink(real, mdir / "staging")
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    with daemon([mdir], env, "--settle", "0"):
        assert wait_for(lambda: any(e.get("event") == "ready" for e in read_events(log)), 30)
        assert wait_for(
            lambda: any(
                "staging/ is a symbolic link" in " ".join(e.get("reasons", []))
                for e in read_events(log)
            ),
            5,
        )
    assert (real / "bad.json").read_bytes() == b"{"


def test_check_status_and_once_agree_on_a_file_memstaged_may_not_read() -> None:
    """Issue 20 (one reader, one answer): a file memstaged may not read is ``deferred`` with
    "permission denied" (SPEC 5) for ``check`` (exit 1), ``status`` and ``--once`` alike;
    ``check`` and ``status`` said ``unreadable`` (exit 2) where ``--once`` deferred it. Issue 29
    item 14: run as ``nobody`` from a venv it can reach, in a clone under /root too."""
    with _unreadable_world(fix=False) as (base, mdir, env, secret):
        target = str(mdir / "staging" / "secret.json")
        check = _as_nobody(base, env, "check", "--json", "--settle", "0", target)
        assert check.returncode == 1, (check.stdout, check.stderr)
        [line] = [json.loads(x) for x in check.stdout.splitlines() if x.strip()]
        assert line["decision"] == "deferred", line
        status = _as_nobody(base, env, "status", "--json", "--files", "--memory-dir", str(mdir))
        [report] = [json.loads(x) for x in status.stdout.splitlines() if x.strip()]
        assert report["staging"]["deferred"] == 1, report
        [entry] = report["files"]
        assert entry["decision"] == "deferred", entry
        assert "permission denied" in entry["reason"], entry
        assert any("secret.json" in a for a in report["attention"]), report
        once = _as_nobody(base, env, "--once", "--settle", "0", "--memory-dir", str(mdir))
        assert once.returncode == 1, once.stderr
        [event] = [e for e in read_events(base / "decisions.jsonl") if e.get("event") == "decision"]
        assert event["decision"] == "deferred"
        assert entry["reason"] == event["reasons"][0]
        assert (mdir / "staging" / "secret.json").read_bytes() == secret
