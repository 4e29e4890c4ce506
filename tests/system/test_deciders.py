"""The pool of decider processes (issue 23): the same verdicts as deciding in process, in order.

Real worker processes (``fork``, as ``--once`` starts them), real ``triage.decide``; nothing is
timed. The verdicts are compared field by field and by the bytes they make memstaged write (the
rewrite, every dead-letter record's body), over the crash tests' mixed corpus.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import multiprocessing
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.daemon_fakes import RecordingLogger
from support.helpers import (
    KINDS,
    REPO,
    Input,
    make_corpus,
    memory_dir_of,
    memstaged_env,
    project_root_of,
    run_once,
    write_inputs,
)

from memstaged.core.decide import Context, Decision, Verdict, decide
from memstaged.core.records import AHEAD_LIMIT
from memstaged.errors import ConfigError
from memstaged.files.memdir import Options
from memstaged.run import decider_pool
from memstaged.run import pipeline as pipeline_module
from memstaged.run.decider_pool import POOL_THRESHOLD, Deciders, Failure, workers_wanted
from memstaged.run.pipeline import Pipeline

ROOT = "/home/dev/proj"


def _jobs(count: int, *, deep: bool = False) -> list[tuple[bytes, Context]]:
    """The crash tests' mixed corpus (without its 2,000-deep document unless ``deep``)."""
    kinds = KINDS if deep else tuple(k for k in KINDS if k != "deep")
    inputs = make_corpus(random.Random(23), count, ROOT, "pool-", big_every=7, kinds=kinds)
    return [
        (
            i.data,
            Context(
                ROOT,
                i.name,
                f"{ROOT}/.pi/memory/project/staging/{i.name}",
                True,
                False,
                "2026-12-02T01:00:00.000Z",
            ),
        )
        for i in inputs
    ]


def _written(v: Verdict) -> tuple[object, ...]:
    """What a verdict makes memstaged write or log, as bytes and values."""
    return (
        v.decision,
        v.sha256,
        v.size,
        v.session_id,
        v.reasons,
        v.repairable,
        [msgspec.json.encode(r) for r in v.repairs],  # as the log writes them
        v.new_bytes,
        v.original,
        [(d.name, d.category, d.body) for d in v.deadletter],
    )


@pytest.fixture
def pool() -> Iterator[Deciders]:
    d = Deciders(2)
    try:
        yield d
    finally:
        d.close()


def test_the_pool_gives_each_file_the_verdict_deciding_in_process_gives(pool: Deciders) -> None:
    """Issue 23 item 3: over 400 mixed files (valid, every repair, every kind of quarantine,
    foreign, not JSON), two workers hand back, in the order read, verdicts equal to
    ``triage.decide`` in process and writing the same bytes. A document nested 2,000 deep comes
    back decided too (its record rendered in the worker); one whose records are too large to
    render ahead would carry the parsed document, which pickling cannot nest that deep: it
    comes back without a verdict, to decide in process."""
    jobs = _jobs(400, deep=True)
    ctx = jobs[0][1]
    too_deep = b"[" * 2000 + b'"' + b"x" * (AHEAD_LIMIT + 1) + b'"' + b"]" * 2000
    jobs.append((too_deep, ctx))
    got = list(pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs)))
    assert [i for i, _ in got] == list(range(len(jobs)))
    assert pool.broken is None
    decisions = set()
    deep = {i for i, (data, _) in enumerate(jobs) if data.startswith(b"[" * 1000)}
    assert len(deep) > 1
    assert {i for i, v in got if v is None} == {len(jobs) - 1}
    for i, verdict in got[:-1]:
        assert isinstance(verdict, Verdict), (i, verdict)
        expected = decide(*jobs[i])
        assert verdict == expected
        assert _written(verdict) == _written(expected)
        decisions.add(verdict.decision.value)
    assert {"valid", "repaired", "quarantined", "foreign"} <= decisions


def test_a_small_batch_is_decided_in_the_reading_process(pool: Deciders) -> None:
    """Issue 23 item 3: below the threshold (the daemon's one file, a short ``--once``) no
    worker starts: every item comes back without a verdict, for the caller to decide."""
    jobs = _jobs(POOL_THRESHOLD - 1)
    got = list(pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs)))
    assert got == [(i, None) for i in range(len(jobs))]
    assert not pool._procs


def test_items_keep_their_place_across_transactions(pool: Deciders) -> None:
    """Issue 23: a caller that stops taking items (a full transaction), has the next ones read
    and sent ahead (before its commit) and takes the rest later (the next transaction) gets
    every item once, in order, each with its own file's verdict; a file skipped or too large
    (no job) is handed back in its place."""
    jobs = _jobs(700)
    ahead = pool.ahead(range(len(jobs)), lambda i: None if i % 5 == 0 else jobs[i], len(jobs))
    seen: list[int] = []
    for end in (50, 51, 400, len(jobs)):
        for i, verdict in ahead:
            seen.append(i)
            if i % 5 == 0:
                assert verdict is None
            else:
                assert isinstance(verdict, Verdict)
                assert verdict.sha256 == decide(*jobs[i]).sha256, i
            if i + 1 == end:
                break
        ahead.prefetch()
    assert seen == list(range(len(jobs)))
    assert ahead.close() == []


def test_items_left_are_handed_back_and_the_pool_s_next_user_gets_its_own_verdicts(
    pool: Deciders,
) -> None:
    """Issue 23: a transaction left early (an error, a stop) with files read and sent ahead:
    :meth:`ReadAhead.close` hands back every file never taken, for their descriptors to be
    closed, and hangs up on the workers with verdicts still coming, so that the next memory
    dir's files, decided by the run's pool, each get their own verdict."""
    jobs = _jobs(600)
    ahead = pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs))
    taken = [i for i, _ in itertools.islice(ahead, 10)]
    ahead.prefetch()
    left = ahead.close()
    assert taken + left == list(range(len(taken) + len(left)))
    assert len(left) >= decider_pool.AHEAD_FILES - 10 - decider_pool.CHUNK  # read ahead, not taken
    others = _jobs(320)[::-1]
    got = list(pool.ahead(range(len(others)), lambda i: others[i], len(others)))
    assert [i for i, _ in got] == list(range(len(others)))
    for i, verdict in got:
        assert isinstance(verdict, Verdict)
        assert verdict.sha256 == decide(*others[i]).sha256, i
    assert pool.broken is None


def test_a_killed_worker_costs_time_not_a_verdict(pool: Deciders) -> None:
    """Issue 23 item 3: a worker killed (OOM killer, an operator) breaks the pool; every file
    is then decided in process (the caller gets None), none is lost or given a wrong verdict."""
    jobs = _jobs(300)
    ahead = pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs))
    got = []
    for i, verdict in ahead:
        if i == 0:
            assert pool._procs
            for proc in pool._procs:
                os.kill(proc.pid or 0, signal.SIGKILL)
        got.append((i, verdict))
    assert [i for i, _ in got] == list(range(len(jobs)))
    assert pool.broken is not None and "broke" in pool.broken
    assert got[-1][1] is None
    for i, verdict in got:
        assert verdict is None or verdict == decide(*jobs[i])


def test_a_bug_in_a_worker_is_that_file_s_failure(
    pool: Deciders, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 3: ``decide`` raising in a worker (a bug) comes back as that file's
    failure, with the exception's repr and traceback the pipeline logs; the others are decided."""

    def boom(data: bytes, ctx: Context) -> Verdict:
        if ctx.file_name.endswith("-7.json"):
            raise ValueError("a bug")
        return decide(data, ctx)

    monkeypatch.setattr("memstaged.core.decide.decide", boom)  # the workers are forked after this
    jobs = _jobs(300)
    got = dict(pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs)))
    failed = [i for i, v in got.items() if isinstance(v, Failure)]
    assert [jobs[i][1].file_name for i in failed] == ["s-pool-7.json"]
    failure = got[failed[0]]
    assert isinstance(failure, Failure)
    assert failure.error == "ValueError('a bug')" and "ValueError: a bug" in failure.traceback


def _bytes_written(pid: int) -> int:
    """What a process has written so far by ``write`` calls, sockets included (``wchar``)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["wchar"])


def test_many_workers_each_get_work_from_what_is_read_ahead() -> None:
    """Chunks are of 64 files with two workers (fewer hand-overs), but smaller with many: 16
    workers given the :data:`~decider_pool.AHEAD_FILES` files read ahead each decide some of
    them (each writes verdicts back). In chunks of 64 whatever the workers, 8 chunks held them
    all, and half the workers answered nothing."""
    pool = Deciders(16)
    try:
        jobs = _jobs(decider_pool.AHEAD_FILES)
        got = list(pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs)))
        assert [i for i, _ in got] == list(range(len(jobs)))
        assert all(isinstance(v, Verdict) for _, v in got)
        assert len(pool._procs) == 16
        idle = [p.pid for p in pool._procs if p.pid is not None and _bytes_written(p.pid) == 0]
        assert idle == [], f"{len(idle)} of 16 workers were given nothing"
    finally:
        pool.close()


def test_a_chunk_is_handed_to_a_busy_worker_without_waiting_for_it() -> None:
    """The main process hands chunks over and goes on to its commit while the worker decides
    the one before: with its only worker stopped (SIGSTOP, a stand-in for a worker busy
    deciding, whose receiving thread waits for the interpreter's lock), two chunks of over 400
    KB each are sent at once and the pool is not given up; continued, the worker answers both.
    With a socket's default send buffer (208 KiB, doubled by the kernel) the first send waited
    for the worker until the stall bound, and the pool was given up."""
    wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
    if wmem_max < decider_pool.SEND_BUFFER:
        pytest.skip(
            f"net.core.wmem_max is {wmem_max} bytes: the kernel grants no send buffer of "
            f"{decider_pool.SEND_BUFFER} bytes, and a hand-over may wait for its worker"
        )
    # 64 files of about 8 KB (JSON allows whitespace after the value)
    jobs = [(data + b" " * 8192, ctx) for data, ctx in _jobs(64)]
    assert sum(len(data) for data, _ in jobs) > 425_984  # more than a default buffer holds
    pool = Deciders(1)
    try:
        pool._start()
        pid = pool._procs[0].pid or 0
        os.kill(pid, signal.SIGSTOP)
        try:
            assert pool._submit(jobs) == 0
            assert pool._submit(jobs) == 0
            assert pool.broken is None
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed, where the pool gave up
                os.kill(pid, signal.SIGCONT)
        expected = [decide(*job) for job in jobs]
        for _ in range(2):
            answers = pool._result(0, sum(len(data) for data, _ in jobs))
            assert answers is not None
            got = [pickle.loads(a) for a in answers if isinstance(a, bytes)]  # noqa: S301 - ours
            assert got == expected
    finally:
        pool.close()


#: Run in a fresh interpreter: 8 workers decide 512 small files of which one in 16 has
#: 100,000 candidates, with ``--once``'s memory budget; prints the memory each worker then
#: maps alone, in MiB. A fresh process: the
#: workers fork from it, and what a large parent (pytest, after a thousand tests) frees or
#: writes after the fork becomes each worker's alone, whatever the worker did.
_LARGE_CHUNKS = """
import json
import msgspec
from pathlib import Path
from support.documents import empty_candidates, staging_doc
from memstaged.core.decide import Context, Verdict
from memstaged.run import memory_budget
from memstaged.run.decider_pool import POOL_THRESHOLD, Deciders

root = "/srv/p"
ctx = Context(root, "x.json")

def many(i):  # one file in 16 of 100,000 empty candidates (300 KB), the others small
    small = json.dumps(staging_doc(root, f"s{i}")).encode()
    data = empty_candidates(root, 100_000) if i % 16 == 0 else small
    return data, msgspec.structs.replace(ctx, file_name=f"f{i}.json")

def private_mib(pid):
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    lines = text.splitlines()
    return sum(int(x.split()[1]) for x in lines if x.startswith("Private_")) // 1024

pool = Deciders(8)
budget = memory_budget.budget(8 << 20)  # as --once has it
decided = [v for _, v in pool.ahead(range(512), many, POOL_THRESHOLD, budget=budget)]
assert all(isinstance(v, Verdict) for v in decided), decided
assert pool.broken is None and len(pool._procs) == 8, pool.broken
print(json.dumps([private_mib(p.pid) for p in pool._procs]))
pool.close()
"""


def test_a_worker_gives_back_what_a_costly_chunk_took() -> None:
    """The pool does not multiply what a run needs: 8 workers decide 512 small files of which
    one in 16 has 100,000 empty candidates (300 KB, estimated at 37 MiB), and each then keeps
    at most 64 MiB of its own. Python and glibc kept what deciding took: 96 MiB in each
    worker, 1 GiB for the 8 (about 6 GiB for 64, by the same measure)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    done = subprocess.run(
        [sys.executable, "-c", _LARGE_CHUNKS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kept = json.loads(done.stdout)
    assert len(kept) == 8
    assert max(kept) <= 64, f"each worker keeps {kept} MiB"


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("1", 1), (" 2 ", 2), ("64", 64)])
def test_the_number_of_workers_can_be_set(value: str, expected: int) -> None:
    """Issue 23 item 3: ``MEMSTAGED_WORKERS`` sets the pool's size (0: none)."""
    assert workers_wanted({decider_pool.WORKERS_ENV: value}) == expected


def test_the_default_number_of_workers_is_the_cores_this_process_may_use() -> None:
    """Issue 23 item 3: by default one worker per CPU of the affinity mask, none on one CPU."""
    cores = len(os.sched_getaffinity(0))
    assert workers_wanted({}) == (cores if cores > 1 else 0)


@pytest.mark.parametrize("value", ["-1", "65", "two", "1.5"])
def test_a_wrong_number_of_workers_says_what_is_expected(value: str) -> None:
    """Issue 23 item 3: a value that is not a count is refused with the variable's name."""
    with pytest.raises(ConfigError, match="MEMSTAGED_WORKERS"):
        workers_wanted({decider_pool.WORKERS_ENV: value})


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _decide_batches(
    mdir: Path, inputs: list[Input], *, keep: bool = False
) -> tuple[dict[str, bytes], list[Any]]:
    """``--once``'s path in process (``Pipeline.batches``) on a fresh copy of ``inputs``, with
    a fixed clock: what is left on disk, and the decision events without their durations.
    ``keep``: the memory dir's other contents are kept."""
    if not keep:
        shutil.rmtree(mdir, ignore_errors=True)
    (mdir / "staging").mkdir(parents=True)
    write_inputs(mdir / "staging", inputs)
    log = RecordingLogger()
    pipeline = Pipeline(Options(settle=0), log, clock=lambda: 1_800_000_000.0)
    names = sorted(i.name for i in inputs)
    for _batch in pipeline.batches(memory_dir_of(mdir), names):
        pass
    pipeline.close()
    events = [
        {k: v for k, v in e.items() if k not in ("duration_ms", "timestamp")} for e in log.events
    ]
    return _tree(mdir), events


def test_once_with_deciders_writes_and_logs_what_in_process_deciding_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 3, at the seam: ``--once``'s batches of 300 mixed files, decided by two
    worker processes, leave ``staging/`` and ``deadletter/`` byte for byte as deciding in
    process does, and log the same decisions in the same order."""
    mdir = tmp_path / "proj" / ".pi" / "memory" / "project"
    inputs = make_corpus(random.Random(5), 300, project_root_of(mdir), "seam-", big_every=7)
    monkeypatch.setenv(decider_pool.WORKERS_ENV, "0")
    alone_tree, alone_log = _decide_batches(mdir, inputs)
    sent: list[int] = []
    submit = Deciders._submit

    def counted(
        self: Deciders, jobs: list[tuple[bytes, Context]], release: bool = False
    ) -> int | None:
        sent.append(len(jobs))
        return submit(self, jobs, release)

    monkeypatch.setattr(Deciders, "_submit", counted)
    monkeypatch.setenv(decider_pool.WORKERS_ENV, "2")
    pool_tree, pool_log = _decide_batches(mdir, inputs)
    assert sum(sent) > 250  # the workers decided (all but files not read: none here)
    assert pool_tree == alone_tree
    assert pool_log == alone_log
    # Transactions of at most 40 plans: the next one's files are read and decided ahead, during
    # each commit (issue 23); still the same bytes and the same log.
    monkeypatch.setattr(pipeline_module, "BATCH_HELD", 40)
    sent.clear()
    pool_tree, pool_log = _decide_batches(mdir, inputs)
    assert sum(sent) > 250
    monkeypatch.setenv(decider_pool.WORKERS_ENV, "0")
    alone_tree, alone_log = _decide_batches(mdir, inputs)
    assert pool_tree.keys() == alone_tree.keys()
    assert pool_tree == alone_tree
    assert pool_log == alone_log
    decisions = {e.get("decision") for e in pool_log if e["event"] == "decision"}
    assert {"valid", "repaired", "quarantined"} <= decisions


def test_once_refuses_a_wrong_number_of_workers_as_a_usage_error(tmp_path: Path) -> None:
    """Issue 23 item 3: ``MEMSTAGED_WORKERS=two memstaged --once`` exits 2 with one line naming
    the variable, and decides nothing."""
    mdir = tmp_path / "proj" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    inputs = make_corpus(random.Random(9), 3, project_root_of(mdir), "env-")
    write_inputs(mdir / "staging", inputs)
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="two")
    proc = run_once(mdir, env)
    assert proc.returncode == 2, proc
    assert proc.stderr.decode().strip().splitlines() == [
        "memstaged: MEMSTAGED_WORKERS='two': expected a number of worker processes from 0 to 64 "
        "(0: decide in the reading process)"
    ]
    assert sorted(p.name for p in (mdir / "staging").iterdir()) == sorted(i.name for i in inputs)


def test_one_pool_decides_a_run_of_many_small_memory_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 (one pool per run): a run of four memory dirs of 100 files each, none large
    enough alone to start a pool, is decided by one pool, started once for the run and stopped
    by ``close``; what is left on disk is what deciding in process leaves."""
    mdirs = [tmp_path / f"p{i}" / ".pi" / "memory" / "project" for i in range(4)]
    corpora = [
        make_corpus(random.Random(40 + i), 100, project_root_of(m), f"run{i}-", big_every=7)
        for i, m in enumerate(mdirs)
    ]

    def decide_run() -> dict[str, bytes]:
        pipeline = Pipeline(Options(settle=0), RecordingLogger(), clock=lambda: 1_800_000_000.0)
        try:
            for mdir, inputs in zip(mdirs, corpora, strict=True):
                shutil.rmtree(mdir, ignore_errors=True)
                (mdir / "staging").mkdir(parents=True)
                write_inputs(mdir / "staging", inputs)
                names = sorted(i.name for i in inputs)
                for _batch in pipeline.batches(memory_dir_of(mdir), names):
                    pass
        finally:
            pipeline.close()
        return _tree(tmp_path)

    monkeypatch.setenv(decider_pool.WORKERS_ENV, "0")
    alone = decide_run()
    starts: list[int] = []
    sent: list[int] = []
    start, submit = Deciders._start, Deciders._submit

    def counted_start(self: Deciders) -> None:
        starts.append(self.workers)
        start(self)

    def counted_submit(
        self: Deciders, jobs: list[tuple[bytes, Context]], release: bool = False
    ) -> int | None:
        sent.append(len(jobs))
        return submit(self, jobs, release)

    monkeypatch.setattr(Deciders, "_start", counted_start)
    monkeypatch.setattr(Deciders, "_submit", counted_submit)
    monkeypatch.setenv(decider_pool.WORKERS_ENV, "2")
    pooled = decide_run()
    assert starts == [2]  # one pool for the run
    assert sum(sent) >= 100  # it decided the dirs from the one that brought the run to 256 on
    assert pooled == alone


def test_records_rendered_ahead_follow_an_original_that_takes_another_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 (records rendered in the workers): when the original's planned name under
    ``originals/`` is taken by other bytes, the records rendered ahead by a worker for that name
    are rendered again for the name it gets; ``deadletter/`` is byte for byte what deciding in
    process writes, and every record points at an original that holds its file's bytes."""
    mdir = tmp_path / "proj" / ".pi" / "memory" / "project"
    kinds = tuple(k for k in KINDS if k != "deep")  # its records are read back with json here
    inputs = make_corpus(
        random.Random(11), 300, project_root_of(mdir), "taken-", big_every=7, kinds=kinds
    )
    ctx = Context(project_root_of(mdir), "x.json")
    taken = {}
    for i in inputs:
        verdict = decide(i.data, msgspec.structs.replace(ctx, file_name=i.name))
        if verdict.original is not None and verdict.deadletter:
            taken[verdict.original] = b"other bytes under the planned name\n"
    assert len(taken) > 10

    def run(workers: str) -> tuple[dict[str, bytes], list[Any]]:
        monkeypatch.setenv(decider_pool.WORKERS_ENV, workers)
        originals = mdir / "deadletter" / "originals"
        shutil.rmtree(mdir, ignore_errors=True)
        originals.mkdir(parents=True)
        for name, data in taken.items():
            (originals / name).write_bytes(data)
        return _decide_batches(mdir, inputs, keep=True)

    alone_tree, alone_log = run("0")
    pool_tree, pool_log = run("2")
    assert pool_tree == alone_tree
    assert pool_log == alone_log
    names_of: dict[bytes, set[str]] = {}
    for i in inputs:
        names_of.setdefault(i.data, set()).add(i.name)
    pointed = 0
    for path, data in pool_tree.items():
        if path.startswith("deadletter/") and path.count("/") == 1:
            record = json.loads(data)
            original = pool_tree["deadletter/" + record["memstaged"]["original"]]
            assert record["memstaged"]["source_file"] in names_of[original]
            pointed += record["memstaged"]["original"].removeprefix("originals/") not in taken
    assert pointed > 10  # records that point at the other name their original got


def _open_fds() -> int:
    gc.collect()  # descriptors of earlier tests' garbage are closed first,
    multiprocessing.active_children()  # and their workers reaped (each holds a sentinel)
    return len(os.listdir("/proc/self/fd"))


def test_files_read_ahead_are_deferred_and_closed_when_the_lock_is_taken_before_their_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 and SPEC 5: the next transaction's files are read ahead during a commit, while
    the reconciler's lock is free. The reconciler takes it before their transaction starts (a
    live process named in ``canonical-writer.lock``, written between the two transactions):
    every such file is deferred and left byte for byte as it was, and the descriptors of the
    versions read ahead are closed (SPEC 6: bounded; a leak here is one per file)."""
    mdir = tmp_path / "proj" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    inputs = make_corpus(random.Random(11), 700, project_root_of(mdir), "lock-", big_every=0)
    write_inputs(mdir / "staging", inputs)
    monkeypatch.setenv(decider_pool.WORKERS_ENV, "2")
    monkeypatch.setattr(pipeline_module, "BATCH_HELD", 40)
    before = _open_fds()
    log = RecordingLogger()
    pipeline = Pipeline(Options(settle=0), log, clock=lambda: 1_800_000_000.0)
    names = sorted(i.name for i in inputs)
    batches = pipeline.batches(memory_dir_of(mdir), names)
    first = next(batches)
    assert len(first.outcomes) < len(names)
    read_ahead = _open_fds() - before - 2 * 2  # less the pool's sockets (and the fork's pipes)
    assert read_ahead > 100, "no file was read ahead during the commit"
    assert read_ahead <= decider_pool.AHEAD_FILES + 2 * decider_pool.CHUNK + 8
    staged = _tree(mdir / "staging")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (mdir / "canonical-writer.lock").write_text(
            json.dumps({"pid": holder.pid, "owner": "reconciler"})
        )
        rest = {n: o for batch in batches for n, o in batch.outcomes.items()}
    finally:
        holder.kill()
        holder.wait()
    pipeline.close()
    assert set(rest) == set(names) - set(first.outcomes)
    assert {o.decision for o in rest.values()} == {Decision.DEFERRED}
    assert all(o.blocked_by_lock for o in rest.values())
    assert {n: b for n, b in _tree(mdir / "staging").items() if n in rest} == {
        n: b for n, b in staged.items() if n in rest
    }
    assert _open_fds() == before
