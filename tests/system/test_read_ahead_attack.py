"""``memstaged --once``'s read-ahead across transactions (issue 23), attacked from outside.

Real processes only: ``python -m memstaged --once`` as a subprocess on corpora of 1,000-3,000
mixed files, with its descriptor limit lowered, its workers killed, and a "reconciler" process
that takes ``canonical-writer.lock`` between two transactions. What is checked is what a user
sees: the exit code, stderr, the decision log (one decision per file) and the bytes on disk.
Nothing is timed: a test waits for an event (a log line, a child process) and acts on it.
"""

from __future__ import annotations

import collections
import json
import os
import random
import resource
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from support.decision_log import read_events
from support.documents import lesson, staging_doc
from support.helpers import (
    KINDS,
    REPO,
    Input,
    check_final,
    make_corpus,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    write_inputs,
)

#: The corpus of these tests: every kind of file but the 2,000-deep one (whose records the
#: checks read back with ``json``).
_KINDS = tuple(k for k in KINDS if k != "deep")


def _corpus(mdir: Path, count: int, seed: int, prefix: str) -> list[Input]:
    inputs = make_corpus(
        random.Random(seed), count, project_root_of(mdir), prefix, big_every=7, kinds=_KINDS
    )
    write_inputs(mdir / "staging", inputs)
    return inputs


def _decided(events: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Staging file name -> the decisions logged for it, a look at memstaged's own rewrite and
    a wait (``deferred``) left out: SPEC 7's one decision per version. A run that did not see
    the rewrite made (a later run, after a look deferred for the lock) logs it as a plain
    ``valid`` of the rewrite's hash, which ``stats`` tells from a decision the same way."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    rewrites: set[tuple[str, str]] = set()
    for event in events:
        if event.get("event") != "decision" or event.get("own_rewrite"):
            continue
        name = os.path.basename(event["path"])
        if event.get("rewrite_sha256"):
            rewrites.add((name, event["rewrite_sha256"]))
        if event.get("decision") == "deferred" or (name, event.get("sha256")) in rewrites:
            continue
        out[name].append(event["decision"])
    return out


def _once(
    env: dict[str, str], *mdirs: Path, limit: int | None = None, inherit: int = 0
) -> subprocess.CompletedProcess[bytes]:
    """``memstaged --once`` on ``mdirs`` in a real process, under a descriptor ``limit``,
    started with ``inherit`` descriptors open besides stdio (as a caller may leave them)."""
    args = [a for m in mdirs for a in ("--memory-dir", str(m))]
    passed = [os.open(os.devnull, os.O_RDONLY) for _ in range(inherit)]
    try:
        return subprocess.run(
            memstaged_cmd("--once", *args),
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
            cwd=REPO,
            preexec_fn=None if limit is None else _limit_descriptors(limit),
            pass_fds=passed,
        )
    finally:
        for fd in passed:
            os.close(fd)


def _limit_descriptors(limit: int) -> Callable[[], None]:
    """In the child, before exec: a soft and hard limit of ``limit`` descriptors (so that
    ``raise_fd_limit`` cannot raise it), as a container or a unit's ``LimitNOFILE=`` sets."""

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return preexec


#: Every kind that is repaired: each holds its rewrite's temp open beside its version.
_REPAIRS = ("r1-empty-triggers", "r1-missing-triggers", "r2-bom", "r3-space", "r3-rfc2822", "r123")


@pytest.mark.parametrize(
    ("limit", "workers", "kinds", "inherit"),
    [
        (500, "2", _KINDS, 0),  # a hard limit below what 512 files read ahead and 256 held need
        (1024, "32", _KINDS, 0),  # the default limit, on a 32-core machine: 2 chunks per worker
        (200, "0", _KINDS, 0),  # below the 256 versions a transaction held, with no pool at all
        (200, "2", _KINDS, 0),
        (1024, "2", _REPAIRS, 0),  # 256 versions held, their 256 rewrites' temps, 512 read ahead
        (1024, "32", _KINDS, 300),  # and 300 descriptors left open by the caller
        (300, "2", _REPAIRS, 160),  # every file repaired, under a low limit
    ],
)
def test_once_under_a_low_descriptor_limit_decides_every_file_without_an_error(
    tmp_path: Path, limit: int, workers: str, kinds: tuple[str, ...], inherit: int
) -> None:
    """SPEC 6 (descriptors stay bounded) and issue 23: under a hard limit of 500 descriptors,
    or of 1,024 with 32 workers, a 3,000-file backlog is decided in one run: exit 0, every file
    exactly one decision, none deferred for an I/O error ("Too many open files"), no traceback,
    and the disk as SPEC says. Files read ahead each hold a descriptor: they must leave room
    for the transaction's own (before the fix, 500 crashed with EMFILE importing ``ctypes`` at
    the first commit, exit 1 with a traceback; 1,024 with 32 workers deferred ~1,000 files with
    ``Too many open files`` and retried them one by one; 1,024 with nothing but repairs
    deferred 2,304 files so, the rewrites' temps, kept open for ``--once``'s look, not counted
    beside the files read ahead; 300 descriptors inherited, under 1,024 with 32 workers,
    deferred 2,560 files so, the read-ahead sized as if none were open)."""
    mdir = make_memory_dir(tmp_path)
    inputs = make_corpus(
        random.Random(31), 3000, project_root_of(mdir), "fd-", big_every=7, kinds=kinds
    )
    write_inputs(mdir / "staging", inputs)
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS=workers)
    proc = _once(env, mdir, limit=limit, inherit=inherit)
    stderr = proc.stderr.decode(errors="replace")
    assert "Traceback" not in stderr
    assert proc.returncode == 0, stderr[-2000:]
    events = read_events(tmp_path / "decisions.jsonl", strict=False)
    errors = [e for e in events if "Too many open files" in json.dumps(e)]
    assert errors == [], errors[:3]
    decided = _decided(events)
    assert {i.name for i in inputs} == set(decided)
    assert [n for n, d in decided.items() if len(d) != 1] == []
    assert check_final(mdir, inputs) == []


#: A "reconciler": once the first dead-letter record of memory dir ``argv[1]`` appears (the
#: first commit of a ``--once`` is under way), it takes ``canonical-writer.lock`` as the real
#: one does (create-exclusive: memstaged holds it for a moment during its commit, so it tries
#: again until it gets it), names itself in it, says so on stdout and holds it until killed.
_RECONCILER = r"""
import json, os, sys, time
mdir = sys.argv[1]
dl = os.path.join(mdir, "deadletter")
while not (os.path.isdir(dl) and any(n.endswith(".json") for n in os.listdir(dl))):
    time.sleep(0.001)
lock = os.path.join(mdir, "canonical-writer.lock")
while True:
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        time.sleep(0.001)
        continue
    os.write(fd, json.dumps({"pid": os.getpid(), "owner": "reconciler"}).encode())
    os.close(fd)
    break
print("locked", flush=True)
time.sleep(600)
"""


def test_a_lock_taken_between_transactions_stops_that_memory_dir_and_not_the_next(
    tmp_path: Path,
) -> None:
    """SPEC 5 (the reconciler's lock) and issue 23, with two memory dirs in one run: a live
    reconciler takes the first dir's ``canonical-writer.lock`` as soon as that dir's first
    commit writes a dead-letter record, while the next transaction's files are read ahead.
    Once a file of that dir is logged deferred for the lock, no later file of it is decided
    (files read ahead while it was free included), every deferred file is byte for byte as it
    was, and the run exits 1. The second dir, decided by the same pool after it, is exactly
    what SPEC says (its verdicts are its own). Killed, the reconciler leaves a stale lock, which
    the next run reports and does not obey: every file of both dirs then has exactly one
    decision over the two runs, and the disk is as SPEC says."""
    first = make_memory_dir(tmp_path, "first")
    second = make_memory_dir(tmp_path, "second")
    inputs1 = _corpus(first, 1500, 41, "one-")
    inputs2 = _corpus(second, 700, 42, "two-")
    before = {i.name: i.data for i in inputs1}
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="2")
    reconciler = subprocess.Popen(
        [sys.executable, "-c", _RECONCILER, str(first)], stdout=subprocess.PIPE
    )
    try:
        run = _once(env, first, second)
        assert reconciler.stdout is not None
        assert reconciler.stdout.readline() == b"locked\n"
    finally:
        reconciler.kill()
        reconciler.wait()
        if reconciler.stdout is not None:
            reconciler.stdout.close()
    stderr = run.stderr.decode(errors="replace")
    assert "Traceback" not in stderr
    assert run.returncode == 1, stderr
    events = read_events(tmp_path / "decisions.jsonl", strict=False)
    ones = [
        e
        for e in events
        if e.get("event") == "decision"
        and e["memory_dir"] == str(first)
        and not e.get("own_rewrite")
    ]
    blocked = [i for i, e in enumerate(ones) if "canonical-writer.lock" in str(e.get("reasons"))]
    assert blocked, "the lock never stopped a transaction"
    after = ones[blocked[0] :]
    assert [e["path"] for e in after if e["decision"] != "deferred"] == []
    # Files decided before the lock, a repair among them, may have the look at their rewrite
    # deferred: what is checked here is the files never decided.
    decided_before = set(_decided(ones[: blocked[0]]))
    deferred = {os.path.basename(e["path"]) for e in after} - decided_before
    assert len(deferred) > 100
    for name in deferred:
        assert (first / "staging" / name).read_bytes() == before[name], name
    assert check_final(second, inputs2) == []
    assert set(_decided(e for e in events if e.get("memory_dir") == str(second))) == {
        i.name for i in inputs2
    }
    # The reconciler is gone; its lock stays (memstaged never deletes another's lock) and
    # is not obeyed. Then the reconciler's own clean-up removes it.
    again = _once(env, first, second)
    assert again.returncode == 0, again.stderr.decode(errors="replace")
    (first / "canonical-writer.lock").unlink()
    assert check_final(first, inputs1) == []
    decided = _decided(read_events(tmp_path / "decisions.jsonl", strict=False))
    names = {i.name for i in inputs1} | {i.name for i in inputs2}
    assert set(decided) == names
    assert [n for n, d in decided.items() if len(d) != 1] == []


#: A writer: once the first dead-letter record of memory dir ``argv[1]`` appears (a commit is
#: under way and the next transaction's files are read ahead), it puts a new valid version in
#: each of the names on stdin, one per line with its bytes' file: every other one rewritten in
#: place (an open for writing, which waits on memstaged's read lease), the others renamed over.
_WRITER = r"""
import os, sys, time
mdir = sys.argv[1]
dl = os.path.join(mdir, "deadletter")
jobs = [line.split() for line in sys.stdin.read().splitlines()]
while not (os.path.isdir(dl) and any(n.endswith(".json") for n in os.listdir(dl))):
    time.sleep(0.001)
for i, (name, source) in enumerate(jobs):
    data = open(source, "rb").read()
    path = os.path.join(mdir, "staging", name)
    if i % 2:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)
    else:
        tmp = os.path.join(mdir, "staging", "." + name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.rename(tmp, path)
print("written", flush=True)
"""


def test_a_writer_s_versions_of_files_read_ahead_survive_the_commit(tmp_path: Path) -> None:
    """SPEC 5 (concurrent writers: nothing lost) and issue 23: during ``--once``'s first
    commit, a writer replaces 400 files of the next transactions, read ahead or about to be,
    half by renaming over them and half by writing them in place (which waits on the read lease
    of a file read ahead until memstaged lets it go). The writer finishes (it is not kept
    waiting for the lease-break time), and each of its versions is in ``staging/`` byte for
    byte, under its name or a ``.conflict-`` name; a second run then decides every one of
    them ``valid`` (or, for one parked as a conflict, leaves it there), and exits 0."""
    mdir = make_memory_dir(tmp_path)
    inputs = _corpus(mdir, 1200, 51, "w-")
    names = sorted(i.name for i in inputs)[500:900]
    root = project_root_of(mdir)
    new: dict[str, bytes] = {}
    lines = []
    for k, name in enumerate(names):
        body = staging_doc(root, f"new-{k}", candidates={"lessons": [lesson(f"cid-new-{k}")]})
        data = json.dumps(body).encode()
        new[name] = data
        source = tmp_path / f"new-{k}.bin"
        source.write_bytes(data)
        lines.append(f"{name} {source}")
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="2")
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(mdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.write("\n".join(lines).encode() + b"\n")
        writer.stdin.close()
        run = _once(env, mdir)
        assert writer.stdout.readline() == b"written\n"
        assert writer.wait(timeout=40) == 0  # under the lease-break time (45 s by default)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    assert "Traceback" not in run.stderr.decode(errors="replace")
    assert run.returncode in (0, 1)
    _assert_kept(mdir, new)
    again = _once(env, mdir)
    assert again.returncode == 0, again.stderr.decode(errors="replace")
    _assert_kept(mdir, new)
    decided = _decided(read_events(tmp_path / "decisions.jsonl", strict=False))
    for conflict in (mdir / "staging").glob("*.conflict-*.json"):
        assert decided[conflict.name] == ["valid"], conflict


def _assert_kept(mdir: Path, new: dict[str, bytes]) -> None:
    """Each writer's version is in ``staging/``, under its name or the ``.conflict-`` name a
    version displaced by memstaged's rename is parked under (SPEC 5: nothing lost)."""
    staged = {p.name: p.read_bytes() for p in (mdir / "staging").iterdir()}
    for name, data in new.items():
        stem = name.removesuffix(".json")
        parked = [n for n, b in staged.items() if b == data and n.startswith(stem + ".conflict-")]
        assert staged.get(name) == data or parked, name
