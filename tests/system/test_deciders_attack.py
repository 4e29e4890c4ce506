"""The pool of deciders attacked from outside (issue 29): a worker stopped, a worker that cannot
start a thread, hostile files that each cost hundreds of times their size.

Real ``memstaged --once`` processes with two workers (``MEMSTAGED_WORKERS=2`` and more files
than :data:`memstaged.run.decider_pool.POOL_THRESHOLD`), real signals, real resource limits; the
workers are found as the run's children in ``/proc``. Nothing is timed: each test waits for
the run to end, with a deadline that only bounds a failure.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.decision_log import read_events
from support.documents import staging_doc
from support.helpers import (
    OLD_MTIME,
    REPO,
    Input,
    check_final,
    make_corpus,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    proc_status,
    project_root_of,
    write_config,
    write_inputs,
)
from support.waiting import wait_for

from memstaged.core.decide import Context
from memstaged.run.decider_pool import POOL_THRESHOLD, Deciders
from memstaged.run.memory_budget import estimate

#: Enough files that a worker stopped early holds work the run cannot finish without: the
#: run sends at most two chunks per worker ahead of the verdicts it has read.
FILES = 4 * POOL_THRESHOLD


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that are still its children."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        return []
    return found


def _state(pid: int) -> str | None:
    """A process's state letter (``T``: stopped, ``Z``: a zombie), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _reading_a_socket(pid: int) -> bool:
    """Whether ``pid`` sleeps in ``read`` on a socket: a run waiting for a worker's verdicts (it
    reads nothing else from a socket). True where the kernel does not say (no ``syscall``)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return True
    try:
        if call[0] != "0" or _state(pid) != "S":
            return False
        return os.readlink(f"/proc/{pid}/fd/{int(call[1], 16)}").startswith("socket:")
    except (OSError, IndexError, ValueError):
        return False


@contextmanager
def _run(mdir: Path, env: dict[str, str], *args: str, **popen: object) -> Iterator[RunOnce]:
    """``memstaged --once`` on ``mdir`` in the background; whatever it left running is killed
    at the end (its workers too: they are this test's processes)."""
    # ^C acts in the run as on a terminal, even when this suite runs with SIGINT ignored (a
    # shell without job control starts background commands so, and an ignored signal stays
    # ignored across exec): handled here while the run is started, it is SIG_DFL there.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            memstaged_cmd("--once", "--memory-dir", str(mdir), *args),
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **popen,  # type: ignore[call-overload]
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    run = RunOnce(proc)
    try:
        yield run
    finally:
        for pid in run.workers:
            if _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


class RunOnce:
    """A ``--once`` run in the background and the worker processes seen under it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.workers: list[int] = []

    def first_worker(self) -> int:
        """The first worker, as soon as the pool starts."""
        assert wait_for(lambda: bool(self._seen()) or self.proc.poll() is not None, 60)
        assert self.workers, f"no worker started (the run exited {self.proc.returncode})"
        return self.workers[0]

    def _seen(self) -> list[int]:
        for pid in _children(self.proc.pid):
            if pid not in self.workers:
                self.workers.append(pid)
        return self.workers

    def end(self, timeout: float) -> tuple[int, str]:
        """The run's exit status and stderr, once it ended (within ``timeout``)."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout} s")
        return self.proc.returncode, err.decode()


def _corpus(tmp_path: Path) -> tuple[Path, list[Input], dict[str, str]]:
    mdir = make_memory_dir(tmp_path)
    inputs = make_corpus(random.Random(29), FILES, project_root_of(mdir), "pool-", big_every=7)
    write_inputs(mdir / "staging", inputs)
    return mdir, inputs, memstaged_env(tmp_path, MEMSTAGED_WORKERS="2")


def _said(err: str) -> list[str]:
    return [line for line in err.splitlines() if "pool of deciders" in line]


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_worker_does_not_keep_a_signal_from_ending_the_run(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    """Issue 29 item 6: one decider SIGSTOPped as soon as the pool starts; once the run waits
    for verdicts (it sleeps reading a worker's socket), SIGTERM ends it with 143 and Ctrl-C's
    SIGINT with 130, and no worker is left behind, stopped or not. The run never ended: it read
    the stopped worker's verdicts with no deadline, and on the signal waited in ``waitpid`` for
    that worker to end by itself (each worker had closed its own sentinel)."""
    mdir, _inputs, env = _corpus(tmp_path)
    with _run(mdir, env) as run:
        os.kill(run.first_worker(), signal.SIGSTOP)
        assert wait_for(lambda: _reading_a_socket(run.proc.pid) or run.proc.poll() is not None, 60)
        assert run.proc.poll() is None, "the run ended with a worker stopped"
        run.proc.send_signal(sig)
        code, err = run.end(timeout=30)
        assert code == status, err
        assert "Traceback" not in err
        assert [pid for pid in run.workers if _state(pid) not in (None, "Z")] == []


def test_a_stopped_worker_is_killed_and_its_files_are_decided_in_process(tmp_path: Path) -> None:
    """Issue 29 item 6: a decider SIGSTOPped as soon as the pool starts, and nothing else done:
    the run waits a bounded time for its verdicts, kills it, says once that the pool is given
    up, decides every file in process and exits 0, each file where SPEC says (bytes on disk,
    records, originals) and no worker left. The run never ended."""
    mdir, inputs, env = _corpus(tmp_path)
    with _run(mdir, env) as run:
        stopped = run.first_worker()
        os.kill(stopped, signal.SIGSTOP)
        code, err = run.end(timeout=300)
        assert code == 0, err
        assert "Traceback" not in err
        assert len(_said(err)) == 1, err
        assert "killed" in _said(err)[0]
        assert _state(stopped) is None
    assert check_final(mdir, inputs) == []
    events = read_events(tmp_path / "decisions.jsonl")
    assert [e["event"] for e in events].count("deciders_stopped") == 1
    assert sum(e["event"] == "decision" for e in events) >= FILES


def _no_threads() -> Callable[[], None]:
    """A limit under which no thread can start (its stack, sized by ``RLIMIT_STACK``, does not
    fit in ``RLIMIT_AS``) while a process without threads, as ``--once`` is, works."""
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    if hard != resource.RLIM_INFINITY and hard < 4 << 30:
        pytest.skip(f"the hard stack limit ({hard}) is too low to refuse threads by it")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (4 << 30, hard))
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return limit


def test_a_worker_that_cannot_start_a_thread_prints_no_traceback(tmp_path: Path) -> None:
    """Issue 29 item 9: under a stack limit larger than the address-space limit, a worker
    cannot start its threads. The run says in one line that it gives the pool up, prints no
    traceback, decides every file in process (each where SPEC says) and exits 0. Each worker
    printed ``RuntimeError: can't start new thread`` with its traceback."""
    mdir, inputs, env = _corpus(tmp_path)
    with _run(mdir, env, preexec_fn=_no_threads()) as run:
        code, err = run.end(timeout=300)
    assert code == 0, err
    assert "Traceback" not in err and "RuntimeError" not in err
    assert len(_said(err)) == 1, err
    assert "could not start its threads" in _said(err)[0]
    assert check_final(mdir, inputs) == []


#: The size limit of the memory test: a hostile file near it costs about 160 MB to decide.
_LIMIT = 2 << 20
#: Small valid files beside the hostile ones, so that the run starts its pool.
_SMALL = POOL_THRESHOLD + 44


def _rss_kib(pid: int) -> int:
    try:
        return proc_status(pid, "VmRSS")
    except (OSError, KeyError):  # ended meanwhile (a zombie has no memory left)
        return 0


def _tree_peak(mdir: Path, env: dict[str, str], config: Path) -> int:
    """The most memory (KiB of RSS) that a ``--once`` run and its workers held at one time,
    sampled from ``/proc`` until the run ended (a sample can only miss a peak, never add
    one)."""
    peak = 0
    with _run(mdir, env, "--config", str(config)) as run:
        while run.proc.poll() is None:
            pids = [run.proc.pid, *_children(run.proc.pid)]
            peak = max(peak, sum(_rss_kib(pid) for pid in pids))
            time.sleep(0.002)
        code, err = run.end(timeout=60)
    assert code == 0, err
    return peak


def test_a_pool_does_not_multiply_what_hostile_files_cost(tmp_path: Path) -> None:
    """Issue 29 item 12, SPEC 4: an array nested a million deep that never closes, just under
    the size limit, costs about 80 times its size to decide (a list per bracket before the
    end is found missing). With two workers, four such files were decided two at a time, and
    the run held twice what one costs. The run's memory, summed over memstaged and its
    workers, less that of a run of small files alone, must stay within 1.3 times what it is
    with one such file: files are sent ahead only while their estimated cost stays within the
    budget (memstaged.run.memory_budget), and each of these is decided alone."""
    project = tmp_path / "proj"
    mdir = make_memory_dir(tmp_path, "proj")
    staging = mdir / "staging"
    config = write_config(tmp_path / "config.toml", max_file_size=_LIMIT, settle=0)
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="2")
    depth = _LIMIT // 2
    hostile = b"[" * depth + b"]" * (depth - 1)  # not JSON: the last bracket is missing

    def peak_with(count: int) -> int:
        """The peak of a run of the small files (written again: decided again) and ``count``
        hostile ones, one in each of the first chunks (chunks go to the workers in turn)."""
        names = [f"f-{i:04d}.json" for i in range(_SMALL)]
        names += [f"f-{15 * i:04d}-deep.json" for i in range(count)]
        for name in names:
            data = hostile if "deep" in name else json.dumps(staging_doc(project, name)).encode()
            (staging / name).write_bytes(data)
            os.utime(staging / name, (OLD_MTIME, OLD_MTIME))
        peak = _tree_peak(mdir, env, config)
        assert not list(staging.glob("*-deep.json"))  # quarantined: not JSON
        return peak

    base = peak_with(0)
    one = peak_with(1) - base
    four = peak_with(4) - base
    originals = mdir / "deadletter" / "originals"
    assert sum(p.read_bytes() == hostile for p in originals.iterdir()) == 4
    print(f"peak RSS over the run's processes: {base} KiB, +{one} KiB with one, +{four} with four")
    assert one > 40 * len(hostile) // 1024  # the file is as costly as it is meant to be
    assert four < 1.3 * one


def test_files_wait_while_those_held_leave_no_room() -> None:
    """Issue 29 item 12, in process (no worker: a transaction of ``--once`` holds its files'
    plans until it is carried out): files are handed out only while the estimates of those the
    caller holds fit the budget; the next waits until the caller is done with them (its
    transaction ends there), and one estimated above the budget comes alone. Nothing is
    dropped or handed out twice. Four deep files held by one transaction peaked at 1.8 GB."""
    data = b"[" * 1000
    ctx = Context("/p", "x.json")
    ahead = Deciders(0).ahead(
        range(7), lambda i: (data * (3 if i == 4 else 1), ctx), 7, budget=2 * estimate(data)
    )
    taken: list[list[int]] = []
    while sum(map(len, taken)) < 7:
        held = [i for i, verdict in ahead if verdict is None]
        assert held, "nothing handed out while the caller held nothing"
        taken.append(held)
        for i in held:
            ahead.done(i)
    assert taken == [[0, 1], [2, 3], [4], [5, 6]]
    assert ahead.close() == []
