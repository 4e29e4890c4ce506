"""The pool of decider processes (issue 23): the same verdicts as deciding in process, in order.

Real worker processes (``fork``, as ``--once`` starts them), real ``triage.decide``; nothing is
timed. The verdicts are compared field by field and by the bytes they make memstaged write (the
rewrite, every dead-letter record's body), over the crash tests' mixed corpus.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator

import msgspec
import pytest
from helpers import KINDS, make_corpus

from memstaged import deciders
from memstaged.deciders import POOL_THRESHOLD, Deciders, Failure, workers_wanted
from memstaged.errors import ConfigError
from memstaged.triage import Context, Verdict, decide

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
    ``triage.decide`` in process and writing the same bytes; a document nested 2,000 deep (no
    depth limit in deciding, one in pickling) comes back without a verdict, to decide in
    process."""
    jobs = _jobs(400, deep=True)
    got = list(pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs)))
    assert [i for i, _ in got] == list(range(len(jobs)))
    assert pool.broken is None
    decisions = set()
    deep = {i for i, (data, _) in enumerate(jobs) if data.startswith(b"[" * 1000)}
    assert deep  # nested deeper than pickle goes: the caller decides those in process
    assert {i for i, v in got if v is None} == deep
    for i, verdict in got:
        if i in deep:
            continue
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


def test_items_with_nothing_to_decide_keep_their_place(pool: Deciders) -> None:
    """Issue 23 item 3: a file skipped or too large (no job) is handed back in its place, and
    stopping (a full transaction) still hands back every item already read."""
    jobs = _jobs(300)
    source = iter(range(len(jobs)))
    ahead = pool.ahead(source, lambda i: None if i % 5 == 0 else jobs[i], len(jobs))
    seen: list[int] = []
    for i, verdict in ahead:
        seen.append(i)
        assert (verdict is None) == (i % 5 == 0)
        if i == 50:
            ahead.stop()
    assert seen == list(range(len(seen))) and 50 < len(seen) < len(jobs)
    # What was not pulled is still in the source, for the next transaction.
    assert next(source) == len(seen)


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

    monkeypatch.setattr("memstaged.triage.decide", boom)  # the workers are forked after this
    jobs = _jobs(300)
    got = dict(pool.ahead(range(len(jobs)), lambda i: jobs[i], len(jobs)))
    failed = [i for i, v in got.items() if isinstance(v, Failure)]
    assert [jobs[i][1].file_name for i in failed] == ["s-pool-7.json"]
    failure = got[failed[0]]
    assert isinstance(failure, Failure)
    assert failure.error == "ValueError('a bug')" and "ValueError: a bug" in failure.traceback


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("1", 1), (" 2 ", 2), ("64", 64)])
def test_the_number_of_workers_can_be_set(value: str, expected: int) -> None:
    """Issue 23 item 3: ``MEMSTAGED_WORKERS`` sets the pool's size (0: none)."""
    assert workers_wanted({deciders.WORKERS_ENV: value}) == expected


def test_the_default_number_of_workers_is_the_cores_this_process_may_use() -> None:
    """Issue 23 item 3: by default one worker per CPU of the affinity mask, none on one CPU."""
    cores = len(os.sched_getaffinity(0))
    assert workers_wanted({}) == (cores if cores > 1 else 0)


@pytest.mark.parametrize("value", ["-1", "65", "two", "1.5"])
def test_a_wrong_number_of_workers_says_what_is_expected(value: str) -> None:
    """Issue 23 item 3: a value that is not a count is refused with the variable's name."""
    with pytest.raises(ConfigError, match="MEMSTAGED_WORKERS"):
        workers_wanted({deciders.WORKERS_ENV: value})
