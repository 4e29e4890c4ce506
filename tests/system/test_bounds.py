"""memstaged's bounds with real processes (found by attacking the merged main): the descriptor
limit, the reconciler's lock during a large quarantine (shown structurally: what is on disk at
the moment the lock is taken), and the memory a quarantine and the engine need: a 100 MiB file,
deep nesting, 10,000 empty candidates, hostile files that cost hundreds of times their size.
(SIGTERM while a large file's records are written took 1.2-5.5 s here, but the figure depends
on the disk's load too much for a strict test.)"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from support.decision_log import read_events
from support.documents import OLD, empty_candidates, put, staging_doc
from support.helpers import (
    PYTHON,
    REPO,
    deadletter_records,
    make_memory_dir,
    memstaged_env,
    reap,
    run_once,
)
from support.waiting import wait_until

from memstaged.core.records import EMBED_LIMIT, ORIGINALS_DIR


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    return read_events(tmp_path / "decisions.jsonl", strict=False)


def test_glob_beyond_the_hard_fd_limit_on_the_command_line_leaves_the_others_working(
    tmp_path: Path,
) -> None:
    """issue 10 item 11, SPEC 6 (bounded resources): the same glob that, in the config file,
    makes the daemon hold as many memory dirs as its descriptors allow and decide files there
    (tests/system/test_daemon_process.py), given as ``--memory-dir`` under ``ulimit -n 256`` (soft =
    hard) with 300 projects must do the same, not exit 2 deciding nothing in any of them."""
    src = tmp_path / "src"
    for i in range(300):
        (src / f"p{i:03d}" / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    pattern = str(src / "*" / ".pi" / "memory" / "project")
    with (tmp_path / "daemon.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstaged", "--memory-dir", pattern, "--settle", "0.1"],
            env=memstaged_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            preexec_fn=limit,  # noqa: PLW1509 - as a service manager or `ulimit -n` would
        )
    try:
        wait_until(
            lambda: any(e.get("event") == "ready" for e in _events(tmp_path)),
            "`ready`",
            timeout=60,
            alive=proc,
        )
        first = src / "p000"
        doc = json.dumps(staging_doc(first, "first")).encode()
        (first / ".pi" / "memory" / "project" / "staging" / "first.json").write_bytes(doc)
        deadline = time.monotonic() + 30
        while not [e for e in _events(tmp_path) if e.get("decision") == "valid"]:
            assert time.monotonic() < deadline, "first.json was never decided"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        reap(proc)


def _once(tmp_path: Path, memory_dir: Path, crash_at: str | None = None) -> int:
    """One ``memstaged --once`` on ``memory_dir``; its exit status (-9 when killed)."""
    env = memstaged_env(tmp_path)
    if crash_at is not None:
        env["MEMSTAGED_CRASH_AT"] = crash_at
    return run_once(memory_dir, env).returncode


@pytest.mark.parametrize("count", [20, 300])
def test_every_record_is_on_disk_before_the_reconciler_lock_is_taken(
    tmp_path: Path, project: Path, memory_dir: Path, count: int
) -> None:
    """issue 10 (defect 2), SPEC 5: "No memstaged operation holds the lock for longer than
    about a second." Writing (and fsyncing) the records of a file of thousands of candidates
    took tens of seconds, so none of it may happen under ``canonical-writer.lock`` (only a
    transaction of at most 16 dead-letter files writes them under it). ``--once`` is killed the
    moment it has taken the lock: every record of the file (20 or 300, one syncfs) and its
    original must already be complete on disk, under memstaged's own temp names, which the
    reconciler never reads; no record has its name yet. A clean run
    then finishes the quarantine: the records under their names, no temp, no lock left."""
    data = empty_candidates(project, count)
    (memory_dir / "staging" / "many.json").write_bytes(data)
    assert _once(tmp_path, memory_dir, "lock-taken:1") == -signal.SIGKILL
    assert (memory_dir / "canonical-writer.lock").exists()  # killed while holding it
    deadletter = memory_dir / "deadletter"
    temps = sorted(p for p in deadletter.iterdir() if p.name.startswith(".memstaged~"))
    assert not [p for p in deadletter.iterdir() if p.is_file() and p not in temps]
    records = [json.loads(p.read_bytes()) for p in temps]
    assert len(records) == count
    assert all(
        r["category"] == "preferences" and r["candidate"]["candidate"] == {} for r in records
    )
    assert all(r["last_gate_reason"] == "malformed staging file" for r in records)
    originals = list((deadletter / "originals").iterdir())
    assert [p.read_bytes() for p in originals] == [data]
    assert originals[0].name.startswith(".memstaged~")

    assert _once(tmp_path, memory_dir) == 0
    assert not (memory_dir / "staging" / "many.json").exists()
    assert not (memory_dir / "canonical-writer.lock").exists()
    names = sorted(p.name for p in deadletter.iterdir() if p.is_file())
    assert len(names) == count and all(n.endswith(".json") for n in names)
    kept = [p.read_bytes() for p in (deadletter / "originals").iterdir()]
    assert kept == [data]


def _peak_rss_kib(tmp_path: Path, memory_dir: Path, **env: str) -> int:
    """Peak RSS of one ``memstaged --once`` on ``memory_dir`` (from wait4's rusage)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir)],
        env=memstaged_env(tmp_path, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return int(usage.ru_maxrss)


def _large_records_doc(project: Path, count: int, padding: int) -> bytes:
    """A file of ``count`` empty preferences and a ``padding``-character note: each of its
    records embeds the whole file, so its records together are ``count`` times its size."""
    doc = staging_doc(project, "big", candidates={"preferences": [{}] * count})
    doc["note"] = "x" * padding
    return json.dumps(doc, separators=(",", ":")).encode()


def test_quarantine_memory_is_a_small_multiple_of_the_file_size(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """issue 10 (defect 7), SPEC 4: "Records are written one at a time: quarantining a file
    never needs memory beyond a small multiple of its size." A 150 KB file of 400 empty
    candidates has 400 records that each embed the whole file (60 MB together, under SPEC 4's
    64 MiB): the peak RSS of ``--once`` quarantining it, less that of ``--once`` quarantining
    a one-candidate file, must stay under 32 times the file's size (it held every record at
    once: about 300 times). The figures are printed."""
    staging = memory_dir / "staging"
    (staging / "one.json").write_bytes(empty_candidates(project, 1))
    baseline = _peak_rss_kib(tmp_path, memory_dir)
    data = _large_records_doc(project, 400, 150_000)
    (staging / "big.json").write_bytes(data)
    peak = _peak_rss_kib(tmp_path, memory_dir)
    assert not (staging / "big.json").exists()
    records = list((memory_dir / "deadletter").glob("big-*.json"))
    assert len(records) == 400
    assert all(p.stat().st_size > len(data) for p in records)  # each embeds the whole file
    extra = (peak - baseline) * 1024
    print(f"{len(data)} bytes, 400 records: {extra / 2**20:.1f} MiB above {baseline} KiB")
    assert extra < 32 * len(data)


def test_a_transactions_events_are_held_in_bounded_memory(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """A transaction's events go into the decision log in one write, but an event is as large
    as what a file puts in it (another project's root, here 2 MiB): 48 such files in one
    transaction must not be held together (96 MiB). The peak RSS of ``--once`` deciding them,
    less that of deciding 48 small foreign files, stays under 48 MiB; every event is logged."""
    staging = memory_dir / "staging"
    config = tmp_path / "xdg-config" / "memstaged" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("log_max_bytes = 1073741824\n")  # one file, not rotated: every event kept
    for i in range(48):
        put(staging / f"f{i:02d}.json", json.dumps(staging_doc("/other", f"s{i}")).encode())
    baseline = _peak_rss_kib(tmp_path, memory_dir)
    for i in range(48):
        doc = staging_doc("/other" + "x" * (2 << 20), f"s{i}")
        put(staging / f"f{i:02d}.json", json.dumps(doc).encode())
    peak = _peak_rss_kib(tmp_path, memory_dir)
    assert len([e for e in _events(tmp_path) if e.get("decision") == "foreign"]) == 96
    extra = (peak - baseline) * 1024
    print(f"48 events of 2 MiB each: {extra / 2**20:.1f} MiB above {baseline} KiB")
    assert extra < 48 << 20


#: Issue 19 item 5: an 8,000,000-byte file (under the 8 MiB limit) made hostile for one part of
#: the engine at a time, and the most its decision may add to the peak RSS of ``--once``, in
#: multiples of the file's size (docs/reliability.md, "Memory of one decision").
_HOSTILE_SIZE = 8_000_000


def _hostile(project: Path, part: str) -> bytes:
    """A staging file of about 8 MB that works ``part`` as hard as its size allows."""
    doc = staging_doc(project, "hostile")
    doc["candidates"] = {"lessons": [], "preferences": [], "decisions": [], "domain": []}
    head = len(json.dumps(doc, separators=(",", ":")))
    room = _HOSTILE_SIZE - head - 40
    if part == "deep array":  # 4 million arrays, one in another: no staging file at all
        depth = _HOSTILE_SIZE // 2
        return b"[" * depth + b"]" * depth
    if part == "date parser":  # V8 gives up after a few tokens; the old parser tokenized it all
        doc["produced_at"] = "1:" * (room // 2)
    elif part == "keyword topic":  # R1's topic from 2 million words (no context topic, no scope)
        del doc["project_root"]
        doc["candidates"]["lessons"] = [
            {
                "summary": "s",
                "detail": "ab1 " * ((room - 150) // 4),
                "scope_suggestion": " ",
                "source_evidence": {"discussion_note_ids": [1]},
            }
        ]
    elif part == "JSON reader":  # 2.7 million empty objects under an unknown key
        doc["x"] = [{}] * (room // 3)
    elif part == "R6":  # 90,000 re-queued wrappers, each unwrapped: the file is repaired
        evidence = {"lesson_candidate_marker_ids": ["m"]}
        wrapper = {
            "candidate": {"text": "t", "source_evidence": evidence},
            "original_staging_file": {},
        }
        each = len(json.dumps(wrapper, separators=(",", ":"))) + 1
        doc["candidates"]["preferences"] = [wrapper] * (room // each)
    elif part.startswith("invalid candidates"):  # 166,000 lessons, 10 problems each; one valid
        bad: dict[str, Any] = {"kind": "lesson", "triggers": [{}] * 6}
        each = len(json.dumps(bad, separators=(",", ":"))) + 1
        doc["candidates"]["preferences"] = [_VALID_PREFERENCE]
        doc["candidates"]["lessons"] = [bad] * ((room - 100) // each)
    elif part == "invalid ids":  # 4,000 preferences, each with 500 ids that are no numbers
        bad = {"text": "t", "source_evidence": {"discussion_note_ids": ["a"] * 500}}
        each = len(json.dumps(bad, separators=(",", ":"))) + 1
        doc["candidates"]["preferences"] = [bad] * (room // each)
    return json.dumps(doc, separators=(",", ":")).encode()


_VALID_PREFERENCE: dict[str, Any] = {
    "text": "t",
    "source_evidence": {"discussion_note_ids": [1]},
}


@pytest.mark.parametrize(
    ("part", "multiple"),
    [
        ("date parser", 8),
        ("keyword topic", 8),
        ("JSON reader", 32),
        ("R6", 32),
        ("deep array", 8),
        # 166,000 records each: a minute quiet, three under load; in `make test-slow`
        pytest.param("invalid candidates", 48, marks=[pytest.mark.slow, pytest.mark.timeout(900)]),
        pytest.param(
            "invalid candidates, R4", 64, marks=[pytest.mark.slow, pytest.mark.timeout(900)]
        ),
        ("invalid ids", 32),
    ],
)
def test_one_hostile_file_is_decided_within_a_small_multiple_of_its_size(
    tmp_path: Path, project: Path, memory_dir: Path, part: str, multiple: int
) -> None:
    """Issue 19 item 5, SPEC 4 and 6: deciding a file within the size limit needs at most a
    small multiple of its size. A ``produced_at`` of ``"1:"`` four million times took 90 times
    the file (a token tuple per character pair before V8's reader ran, which gives up after
    five tokens); a lesson's 8 MB ``detail`` made the keyword topic list all its 2 million
    words (24 times); an array nested 4 million deep, 90 times (issue 19 item 5, second part:
    a Python list per level, and the regular expression's state per bracket). Peak RSS of
    ``--once`` deciding an 8,000,000-byte file hostile to each part, less that of ``--once``
    deciding a small file, must stay under the multiple that
    docs/reliability.md states for that part. The file is decided (quarantined or repaired)
    and the figures printed. The JSON reader and R6 bounds held before the change too; they
    are here so that they keep holding.

    Issue 19 item 5 (records): 166,000 invalid candidates, quarantined or split off by R4 (one
    record each, as SPEC 4 says), took 140 times the file: every validation problem of every
    candidate was kept, twice, until the records were written; 4,000 candidates of 500 bad ids
    each, 2 million problems. A record now finds its own problems as it is written, a
    candidate lists those of 100 elements of an array and counts the others, and the log lists
    the first 100 reasons and how many more."""
    staging = memory_dir / "staging"
    env = {"MEMSTAGED_SPLIT_INVALID_CANDIDATES": "true" if part.endswith("R4") else "false"}
    (staging / "one.json").write_bytes(empty_candidates(project, 1))
    baseline = _peak_rss_kib(tmp_path, memory_dir, **env)
    data = _hostile(project, part)
    assert _HOSTILE_SIZE - 1000 < len(data) <= _HOSTILE_SIZE
    (staging / "hostile.json").write_bytes(data)
    data_sha = hashlib.sha256(data).hexdigest()
    peak = _peak_rss_kib(tmp_path, memory_dir, **env)
    decided = [
        e["decision"]
        for e in _events(tmp_path)
        if e.get("event") == "decision" and e["path"].endswith("hostile.json")
    ]
    assert decided and decided[-1] in ("quarantined", "repaired", "valid")
    extra = (peak - baseline) * 1024
    print(f"{part}: {len(data)} bytes, {extra / len(data):.1f} times its size above {baseline} KiB")
    if part.startswith("invalid"):  # one record per invalid candidate (SPEC 4), each bounded
        # Counted without parsing or listing it all here: this process's own memory at the
        # next fork would be in the next run's peak RSS (exec keeps the high-water mark).
        ids = part == "invalid ids"
        category = "preferences" if ids else "lessons"
        bad = data.count(b'"discussion_note_ids":["a"' if ids else b'"kind":"lesson"')
        prefix = f"hostile-{data_sha[:16]}-{category}-"
        with os.scandir(memory_dir / "deadletter") as entries:
            names = (e.name for e in entries)
            assert sum(1 for n in names if n.startswith(prefix)) == bad
        if ids:
            record = memory_dir / "deadletter" / f"{prefix}0.json"
            errors = json.loads(record.read_bytes())["memstaged"]["errors"]
            assert len(errors) == 101
            assert errors[-1].endswith(
                "discussion_note_ids: +400 more invalid elements, not listed one by one"
            )
    assert extra < multiple * len(data)


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


def _once_peak_rss_kib(mdir: Path, work: Path, *args: str) -> int:
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
    put(small / "staging" / "tiny.json", b"{}")
    baseline = _once_peak_rss_kib(small, tmp_path / "small", "--settle", "0")

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
    peak = _once_peak_rss_kib(mdir, tmp_path / "big", "--settle", "0")
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
    (record,) = deadletter_records(mdir)
    assert record["candidate"] is None
    assert record["session_id"] == "malformed-big"
    events = [
        e
        for e in read_events(tmp_path / "big" / "decisions.jsonl", strict=False)
        if e.get("event") == "decision"
    ]
    assert events[-1]["decision"] == "quarantined"
    assert "file too large" in events[-1]["reasons"][0]


def test_a_deeply_nested_file_does_not_blow_up_its_record(tmp_path: Path) -> None:
    """A 16 KB staging file nested 8,000 deep (well within what the engine parses) is
    quarantined with a record of a size comparable to the file, and without a memory peak of
    hundreds of MiB: a few such files must not be able to exhaust the disk or the daemon."""
    small = make_memory_dir(tmp_path / "small")
    put(small / "staging" / "tiny.json", b"{}")
    baseline = _once_peak_rss_kib(small, tmp_path / "small", "--settle", "0")
    mdir = make_memory_dir(tmp_path / "deep")
    data = put(mdir / "staging" / "deep.json", b"[" * 8000 + b"]" * 8000)
    peak = _once_peak_rss_kib(mdir, tmp_path / "deep", "--settle", "0")
    records = sum(p.stat().st_size for p in (mdir / "deadletter").glob("*.json"))
    print(
        f"\ndeep nesting: {len(data)} bytes in, {records} bytes of records, "
        f"peak RSS +{peak - baseline} KiB"
    )
    assert not (mdir / "staging" / "deep.json").exists()
    assert records < 100 * len(data)
    assert peak - baseline < 64 * 1024


_RSS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from memstaged.core.decide import Context, decide
    count = int(sys.argv[1])
    def status(field):  # in KiB, of this process's own memory (ru_maxrss counts the forker's)
        with open("/proc/self/status") as lines:
            return next(int(l.split()[1]) for l in lines if l.startswith(field))
    base = status("VmRSS:")
    doc = {"schemaVersion": 1, "session_id": "s", "project_root": "/p",
           "produced_at": "2026-01-01T00:00:00Z",
           "candidates": {c: [{}] * count
                          for c in ("lessons", "preferences", "decisions", "domain")}}
    data = json.dumps(doc, separators=(",", ":")).encode()
    verdict = decide(data, Context(project_root="/p", file_name="s.json"))
    total = sum(len(r.body) for r in verdict.deadletter)  # as the apply path writes them
    peak = status("VmHWM:")
    print(json.dumps({"size": len(data), "records": len(verdict.deadletter),
                      "total": total, "base_kib": base, "peak_kib": peak}))
    """
)


def test_many_empty_candidates_decide_in_bounded_memory() -> None:
    """Issue 10 item 9: a 30 KB file of 10,000 empty candidates (v1: killed by the OOM killer at
    24 GB) is quarantined with one record each, their bytes bounded by SPEC 4, in a process whose
    peak RSS grows by less than 100 MiB (the v1 engine hit MemoryError at a 3 GiB limit)."""
    done = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, "2500"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout)
    print(found)
    assert 29_000 < found["size"] < 32_000
    assert found["records"] == 10_000
    assert found["total"] < max(16 * found["size"], EMBED_LIMIT) + found["records"] * 2048
    assert found["peak_kib"] - found["base_kib"] < 100 * 1024
