"""Crash consistency: SIGKILL memstaged anywhere, restart it, and nothing is lost or doubled.

SPEC section 5: every version of every staging file memstaged read ends, after any crash or
restart, in ``staging/`` or byte for byte in ``deadletter/``. The harness runs the real program
(``python -m memstaged --once``, and the daemon) on mixed corpora and kills it

* at chosen points between the steps of a rewrite and of a quarantine, through the product's
  test hook ``MEMSTAGED_CRASH_AT=<step>:<n>`` (:func:`memstaged.files.fsio.crash_point`), to hit the
  narrow windows a random kill would almost never hit;
* at the n-th step of any kind (``any:<n>``), and after a random delay, for everything else.

After every kill :func:`support.helpers.check_interim` and :func:`support.helpers.check_logged`
must hold before any restart (the reconciler may run right then), and once a clean restart has
finished :func:`support.helpers.check_final`. Checked after each of hundreds of kills, over a
corpus that grows to tens of thousands of files, they go through
:class:`support.helpers.Invariant`, which reads again only the files and log lines that changed
since its previous check.

A SIGKILL leaves the page cache intact, so it cannot show a missing ``fsync``; the last test
checks the order of writes, fsyncs and renames themselves against SPEC 5's durability rules.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.decision_log import read_events
from support.documents import put, repairable
from support.helpers import (
    OLD_MTIME,
    Input,
    Invariant,
    check_final,
    check_interim,
    check_logged,
    daemon,
    expected_verdict,
    make_corpus,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    run_once,
    same_size_doc,
    temps_in,
    write_config,
    write_inputs,
)
from support.waiting import wait_for

from memstaged.core.decide import Decision
from memstaged.core.records import ORIGINALS_DIR
from memstaged.files import fsio, temp_names
from memstaged.files.memdir import MemoryDir, Options
from memstaged.run.pipeline import Pipeline

#: Every named step of :func:`memstaged.files.fsio.crash_point`, in the order a file meets them.
STEPS = (
    "temps-synced",
    "lock-created",
    "lock-taken",
    "moved",
    "original-written",
    "record-written",
    "batch-written",
    "deadletter-synced",
    "renamed-away",
    "removed",
    "temp-created",
    "temp-written",
    "exchanged",
    "replaced",
    "rewrite-seen",
    "temp-recovered",
)
#: The steps one ``--once`` transaction (a batch of files) passes once, not once per file.
PER_TRANSACTION = frozenset(
    {"temps-synced", "lock-created", "lock-taken", "batch-written", "deadletter-synced"}
)
#: Files above this are quarantined unread as ``file too large`` (the bounded-copy path).
MAX_SIZE = 2048
SEED = int(os.environ.get("MEMSTAGED_TEST_SEED", random.randrange(1 << 30)))


@dataclass
class Tally:
    """Kills by kind, shared by the harness's worker threads."""

    kills: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    rounds: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total(self) -> int:
        return sum(self.kills.values())

    def add(self, kind: str) -> None:
        with self.lock:
            self.kills[kind] += 1


def _plan(
    rng: random.Random, round_no: int, attempt: int, mdir: Path
) -> tuple[str | None, float | None]:
    """A crash spec for one run: a named step, ``any:<n>``, or a kill after a random delay."""
    if rng.random() < 0.5 and any(
        p.name.startswith(temp_names.TEMP_PREFIX) for p in (mdir / "staging").iterdir()
    ):
        return "temp-recovered:1", None  # the last kill left a temp: kill its recovery too
    roll = rng.random()
    if roll < 0.6:
        step = STEPS[(round_no + attempt) % len(STEPS)]
        # A transaction meets these once: a later count would never be reached.
        nth = 1 if step in PER_TRANSACTION else rng.randint(1, 3)
        return f"{step}:{nth}", None
    if roll < 0.85:
        return f"any:{rng.randint(1, 40)}", None
    return None, rng.uniform(0.12, 0.5)


def _run_killed(
    mdir: Path, env: dict[str, str], config: Path, crash_at: str | None, delay: float | None
) -> int:
    """One ``--once`` run; returns its exit status (-9 when it was killed)."""
    run_env = dict(env)
    if crash_at is not None:
        run_env["MEMSTAGED_CRASH_AT"] = crash_at
    proc = subprocess.Popen(
        memstaged_cmd("--once", "--memory-dir", str(mdir), "--config", str(config)),
        env=run_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        proc.wait(timeout=delay if delay is not None else 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # Also when the test itself is stopped here (pytest-timeout): a run left behind would
        # go on changing the memory dir, and fail the next test as a leaked process.
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    return proc.returncode


def _crash_round(
    work: Path, rng: random.Random, round_no: int, files: int, tally: Tally, max_kills: int
) -> list[str]:
    """One corpus, killed again and again until a run finishes, then restarted cleanly."""
    base = work / f"round-{round_no}"
    mdir = make_memory_dir(base)
    env = memstaged_env(base)
    config = write_config(base / "config.toml", max_file_size=MAX_SIZE, settle=0)
    inputs = make_corpus(rng, files, project_root_of(mdir), f"{round_no}-", big_every=5)
    write_inputs(mdir / "staging", inputs)
    verdicts = {i.name: expected_verdict(mdir, i, max_size=MAX_SIZE) for i in inputs}
    problems: list[str] = []
    with Invariant(mdir, Path(env["MEMSTAGED_LOG_FILE"])) as invariant:
        invariant.add(inputs, verdicts)
        for attempt in range(max_kills):
            crash_at, delay = _plan(rng, round_no, attempt, mdir)
            status = _run_killed(mdir, env, config, crash_at, delay)
            with tally.lock:
                tally.runs += 1
            if status != -signal.SIGKILL:
                if status not in (0, 1):
                    problems.append(f"run exited {status} (crash_at={crash_at})")
                break
            tally.add(crash_at.split(":")[0] if crash_at else "timer")
            problems += [f"after kill at {crash_at or 'timer'}: {p}" for p in invariant.check()]
            if problems:
                break
    final = run_once(mdir, env, "--config", str(config))
    if final.returncode != 0:
        problems.append(f"clean restart exited {final.returncode}: {final.stderr[-2000:]!r}")
    problems += check_final(mdir, inputs, max_size=MAX_SIZE)
    with tally.lock:
        tally.rounds += 1
    return [f"round {round_no} (seed {SEED}): {p}" for p in problems]


def _harness(work: Path, kills_wanted: int, files: int, workers: int = 2) -> Tally:
    tally = Tally()
    failures: list[str] = []
    counter = iter(range(1_000_000))
    counter_lock = threading.Lock()

    def worker(index: int) -> None:
        rng = random.Random(SEED * 31 + index)
        while tally.total < kills_wanted and not failures:
            with counter_lock:
                round_no = next(counter)
            failures.extend(_crash_round(work, rng, round_no, files, tally, max_kills=30))

    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(worker, i) for i in range(workers)]:
            future.result()
    print(
        f"\ncrash harness (seed {SEED}): {tally.total} kills in {tally.runs} runs over "
        f"{tally.rounds} rounds: {dict(sorted(tally.kills.items()))}"
    )
    assert not failures, "\n".join(failures[:40])
    return tally


@pytest.mark.timeout(600)  # 200 kills take ~70 s on a quiet 2-core machine, minutes on a busy one
def test_sigkill_anywhere_in_once_loses_nothing(tmp_path: Path) -> None:
    """At least 200 SIGKILLs of ``memstaged --once`` (at every named step of a rewrite and of a
    quarantine, at random steps and at random times) never leave a file half-written, lost,
    changed or dead-lettered twice, and a clean restart always finishes the job and cleans up
    every temp file (SPEC 5's invariant)."""
    tally = _harness(tmp_path, kills_wanted=200, files=14)
    missing = [s for s in STEPS if tally.kills[s] == 0]
    assert not missing, f"these steps were never killed at: {missing}"


@pytest.mark.slow
# A hang guard (each run is bounded): 6.6 min quiet, far more at load 9.
@pytest.mark.timeout(4 * 3600)
def test_sigkill_anywhere_in_once_loses_nothing_at_scale(tmp_path: Path) -> None:
    """The same harness with 2,000 kills on larger corpora."""
    tally = _harness(tmp_path, kills_wanted=2000, files=40)
    assert all(tally.kills[s] for s in STEPS)


def _kill_big_corpus(tmp_path: Path, files: int, min_kills: int) -> int:
    rng = random.Random(SEED)
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path)
    config = write_config(tmp_path / "config.toml", max_file_size=MAX_SIZE, settle=0)
    root = project_root_of(mdir)
    inputs = make_corpus(rng, files, root, "big-", big_every=7)
    write_inputs(mdir / "staging", inputs)
    invariant = Invariant(mdir, Path(env["MEMSTAGED_LOG_FILE"]))
    invariant.add(inputs, {i.name: expected_verdict(mdir, i, max_size=MAX_SIZE) for i in inputs})
    kills = batches = 0
    with invariant:
        while True:
            if rng.random() < 0.5:
                crash_at, delay = None, rng.uniform(0.2, 2.0)
            else:
                crash_at, delay = f"any:{rng.randint(1, 400)}", None
            status = _run_killed(mdir, env, config, crash_at, delay)
            if status != -signal.SIGKILL:
                assert status in (0, 1), f"run exited {status} (crash_at={crash_at})"
                if kills >= min_kills:
                    break
                batches += 1  # finished before enough kills: more work arrives
                batch = make_corpus(rng, files // 6, root, f"more{batches}-", big_every=7)
                write_inputs(mdir / "staging", batch)
                inputs += batch
                invariant.add(
                    batch, {i.name: expected_verdict(mdir, i, max_size=MAX_SIZE) for i in batch}
                )
                continue
            kills += 1
            problems = invariant.check()
            assert not problems, f"after kill {kills} ({crash_at or 'timer'}): {problems[:20]}"
    final = run_once(mdir, env, "--config", str(config), timeout=600)
    assert final.returncode == 0, final.stderr[-2000:]
    problems = check_final(mdir, inputs, max_size=MAX_SIZE)
    assert not problems, problems[:40]
    logs = list(tmp_path.glob("decisions.jsonl*"))
    print(
        f"\nbig corpus (seed {SEED}): {len(inputs)} files ({batches} batches added), {kills} kills "
        f"in {kills + batches + 1} runs; decision log: {len(logs)} files, "
        f"{sum(p.stat().st_size for p in logs) >> 20} MiB"
    )
    return kills


@pytest.mark.slow
# A guard against a hang, not a measure: each run is bounded (killed after 60 s at most), and
# the test's length is its number of runs times what a run costs on the machine as it is. At
# load 8-14 it went past 3,600 s (issue 19 item 8); quiet, it takes minutes.
@pytest.mark.timeout(4 * 3600)
def test_sigkill_a_run_over_thousands_of_files(tmp_path: Path) -> None:
    """Issue 10, "How to prove it": a corpus of 3,000 mixed files, ``--once`` SIGKILLed at
    random times and steps at least 150 times, 500 more files arriving whenever a run gets
    through first (one run grew to 40,500 files over 227 runs): after every kill every input
    is in staging/ or byte for byte in deadletter/, every record is complete, and every change
    has its decision in the (rotated) log; at the end everything is where SPEC 5 says."""
    assert _kill_big_corpus(tmp_path, files=3000, min_kills=150) >= 150


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Overwrite ``path`` in place with as many bytes, its mtime set back (``cp -p``): only the
    ctime tells the new version from the one last checked. The kernel's clock is coarse, so a
    change within the tick of the last check could keep the ctime; the crash tests start a new
    process between two checks, this test waits for the tick to pass."""
    before = os.stat(path)
    assert len(data) == before.st_size
    with path.open("r+b") as fh:
        fh.write(data)

    def ctime_moved() -> bool:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        return os.stat(path).st_ctime_ns != before.st_ctime_ns

    assert wait_for(ctime_moved, 5, interval=0.001)


def test_the_incremental_invariant_misses_nothing_a_full_check_sees(tmp_path: Path) -> None:
    """Issue 10, "How to prove it": the checks after every kill of the big crash test read only
    what changed since the last one (:class:`support.helpers.Invariant`), and still report what
    reading everything reports: a staging file or an original (found by name, or by its identity
    when it was too large to read) rewritten in place keeping size and mtime, a record made
    incomplete, a record that no decision names, and no false alarm once a decision naming it
    arrives in a new log after a rotation, torn at first, or appended to the rotated file."""
    rng = random.Random(SEED + 3)
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path)
    log = Path(env["MEMSTAGED_LOG_FILE"])
    config = write_config(tmp_path / "config.toml", max_file_size=MAX_SIZE, settle=0)
    inputs = make_corpus(rng, 40, project_root_of(mdir), "inc-", big_every=5)
    write_inputs(mdir / "staging", inputs)
    verdicts = {i.name: expected_verdict(mdir, i, max_size=MAX_SIZE) for i in inputs}
    done = run_once(mdir, env, "--config", str(config))
    assert done.returncode == 0, done.stderr[-2000:]
    dl = mdir / "deadletter"

    def full() -> list[str]:
        return check_interim(mdir, inputs, verdicts) + check_logged(mdir, inputs, log)

    def both() -> list[str]:
        problems = invariant.check()
        assert problems == full()
        return problems

    def kind(decision: Decision, too_large: bool) -> Input:
        return next(
            i
            for i in inputs
            if verdicts[i.name].decision is decision
            and i.data  # an empty file cannot be rewritten with other bytes of its size
            and (len(i.data) > MAX_SIZE) is too_large
        )

    with Invariant(mdir, log) as invariant:
        invariant.add(inputs, verdicts)
        assert both() == []
        valid = kind(Decision.VALID, False)
        _rewrite_in_place(mdir / "staging" / valid.name, b"x" * len(valid.data))
        assert both() == [
            f"{valid.name}: staging holds bytes that are neither input nor repair",
            f"{valid.name}: changed on disk, but no repaired/quarantined logged",
        ]
        _rewrite_in_place(mdir / "staging" / valid.name, valid.data)
        assert both() == []
        for gone in (kind(Decision.QUARANTINED, False), kind(Decision.QUARANTINED, True)):
            [original] = (dl / ORIGINALS_DIR).glob(f"{gone.name}.*.orig")
            _rewrite_in_place(original, b"x" * len(gone.data))
            assert both() == [f"{gone.name} ({gone.kind}): neither in staging/ nor in deadletter/"]
            _rewrite_in_place(original, gone.data)
            assert both() == []
        record = dl / verdicts[kind(Decision.QUARANTINED, False).name].deadletter[0].name
        body = record.read_bytes()
        _rewrite_in_place(record, b" " + body[1:])  # its opening brace gone
        assert both() == [f"deadletter/{record.name}: incomplete record"]
        _rewrite_in_place(record, body)
        assert both() == []

        def named_by_a_decision(name: str) -> bytes:
            (dl / name).write_bytes(b"{}")
            assert both() == [f"deadletter/{name}: written, but named by no logged decision"]
            event = {"event": "decision", "decision": "quarantined", "path": "/x/staging/x.json"}
            return json.dumps(event | {"deadletter": [f"deadletter/{name}"]}).encode() + b"\n"

        line = named_by_a_decision("unnamed-1.json")
        log.rename(log.with_name(log.name + ".1"))  # as memstaged rotates it
        log.write_bytes(line[:20])  # torn: not a decision yet
        assert both() == ["deadletter/unnamed-1.json: written, but named by no logged decision"]
        with log.open("ab") as fh:
            fh.write(line[20:])
        assert both() == []
        line = named_by_a_decision("unnamed-2.json")
        with log.with_name(log.name + ".1").open("ab") as fh:
            fh.write(line)
        assert both() == []


def test_sigkill_the_daemon_loses_nothing(tmp_path: Path) -> None:
    """The daemon, killed with SIGKILL a few times while it works through a backlog and while
    new files arrive (once at a named step), restarts cleanly: the invariant holds after every
    kill, and at the end every file is where SPEC says."""
    rng = random.Random(SEED + 7)
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path)
    config = write_config(tmp_path / "config.toml", max_file_size=MAX_SIZE, settle=0)
    root = project_root_of(mdir)
    inputs: list[Input] = []
    with Invariant(mdir, Path(env["MEMSTAGED_LOG_FILE"])) as invariant:
        for kill in range(6):
            batch = make_corpus(rng, 40, root, f"d{kill}-", big_every=6)
            write_inputs(mdir / "staging", batch[:20])
            inputs += batch
            run_env = dict(env)
            if kill == 2:
                run_env["MEMSTAGED_CRASH_AT"] = "renamed-away:3"
            if kill == 4:
                run_env["MEMSTAGED_CRASH_AT"] = "exchanged:2"
            with daemon([mdir], run_env, "--config", str(config)) as proc:
                time.sleep(rng.uniform(0.3, 0.6))
                write_inputs(mdir / "staging", batch[20:], mtime=int(time.time()))
                time.sleep(rng.uniform(0.0, 0.4))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            invariant.add(
                batch, {i.name: expected_verdict(mdir, i, max_size=MAX_SIZE) for i in batch}
            )
            problems = invariant.check()
            assert not problems, f"after daemon kill {kill}: {problems[:20]}"
    final = run_once(mdir, env, "--config", str(config))
    assert final.returncode == 0, final.stderr[-2000:]
    problems = check_final(mdir, inputs, max_size=MAX_SIZE)
    assert not problems, problems[:40]


# -- durability order ---------------------------------------------------------------------------

_LOCK_NAMES = ("canonical-writer.lock",)


def _is_lock(name: str) -> bool:
    return name in _LOCK_NAMES or name.startswith(temp_names.TEMP_PREFIX + "lock~")


def _kept_after_a_crash(directory: str, name: str) -> bool:
    """Would this name survive a crash (and so must never point at unsynced data)?

    Final names do; memstaged's temp files in ``deadletter/`` do not (recovery deletes them),
    nor ``part`` temps in ``staging/``; any other temp in ``staging/`` may be kept by recovery.
    """
    if _is_lock(name):
        return False
    parsed = temp_names.parse_temp_name(name)
    if parsed is None:
        return True
    return os.path.basename(directory) == "staging" and parsed[0] != temp_names.PARTIAL


class _Trace:
    """Records what the file layer does in one memory dir and checks SPEC 5's durability order.

    * a file's data is fsynced before a rename or exchange gives it a name others read;
    * dead-letter files and their directory entries are fsynced before a staging file is
      removed (renamed away);
    * when :meth:`Pipeline.process` returns, every change it made to a directory is durable
      (the lock file excepted: it must not outlive the moment anyway).
    """

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.dirty: set[int] = set()  # inodes written since their last fsync
        self.pending: dict[str, set[str]] = {}  # directory -> names changed since its fsync
        self.violations: list[str] = []
        self.renames = 0

    @staticmethod
    def dir_path(dir_fd: int | None) -> str:
        return os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.getcwd()

    def split(self, path: Any, dir_fd: int | None) -> tuple[str, str]:
        full = os.path.join(self.dir_path(dir_fd), os.fsdecode(path))
        return os.path.dirname(full), os.path.basename(full)

    def mine(self, directory: str) -> bool:
        return directory == self.root or directory.startswith(self.root + "/")

    def changed(self, directory: str, name: str) -> None:
        if self.mine(directory):
            self.pending.setdefault(directory, set()).add(name)

    def written(self, fd: int) -> None:
        if self.mine(os.path.dirname(self.dir_path(fd))):
            self.dirty.add(os.fstat(fd).st_ino)

    def fsynced(self, fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self.pending.pop(self.dir_path(fd), None)
        else:
            self.dirty.discard(st.st_ino)

    def before_rename(self, src_dir: str, src: str, dst_dir: str, dst: str) -> None:
        if not self.mine(src_dir):
            return
        self.renames += 1
        try:
            st = os.stat(os.path.join(src_dir, src), follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_ino in self.dirty and _kept_after_a_crash(dst_dir, dst):
            self.violations.append(f"{src} renamed to {dst} before its data was fsynced")
        staging = os.path.join(self.root, "staging")
        if src_dir == staging and not src.startswith(".") and dst.startswith("."):
            for directory, names in self.pending.items():
                left = {n for n in names if not _is_lock(n)}
                if left and directory != staging:
                    self.violations.append(
                        f"{src} removed from staging/ before {directory} was fsynced "
                        f"({sorted(left)})"
                    )

    def after_rename(self, src_dir: str, src: str, dst_dir: str, dst: str) -> None:
        self.changed(src_dir, src)
        self.changed(dst_dir, dst)

    def finished(self, name: str) -> None:
        for directory, names in self.pending.items():
            left = {n for n in names if not _is_lock(n)}
            if left:
                self.violations.append(
                    f"{name}: the decision returned with unsynced entries in "
                    f"{os.path.relpath(directory, self.root)}: {sorted(left)}"
                )
        self.pending.clear()


def _install_trace(monkeypatch: pytest.MonkeyPatch, trace: _Trace) -> None:
    real_open, real_write, real_fsync = os.open, os.write, os.fsync
    real_unlink, real_mkdir, real_rename, real_link = os.unlink, os.mkdir, os.rename, os.link
    real_rename2 = fsio._rename2
    real_syncfs = fsio.syncfs

    def t_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT:
            trace.changed(*trace.split(path, dir_fd))
        return fd

    def t_write(fd: int, data: Any) -> int:
        n = real_write(fd, data)
        if fd > 2:
            trace.written(fd)
        return n

    def t_fsync(fd: Any) -> None:
        real_fsync(fd)
        trace.fsynced(fd)

    def t_unlink(path: Any, *, dir_fd: int | None = None) -> None:
        real_unlink(path, dir_fd=dir_fd)
        trace.changed(*trace.split(path, dir_fd))

    def t_mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        trace.changed(*trace.split(path, dir_fd))

    def t_rename(
        src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None
    ) -> None:
        a, b = trace.split(src, src_dir_fd), trace.split(dst, dst_dir_fd)
        trace.before_rename(*a, *b)
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        trace.after_rename(*a, *b)

    def t_link(
        src: Any,
        dst: Any,
        *,
        src_dir_fd: int | None = None,
        dst_dir_fd: int | None = None,
        follow_symlinks: bool = True,
    ) -> None:
        # Linking an unnamed O_TMPFILE inode (/proc/self/fd/N) gives it a name others read.
        directory, name = trace.split(dst, dst_dir_fd)
        ino = os.stat(src, dir_fd=src_dir_fd).st_ino
        if trace.mine(directory) and ino in trace.dirty and _kept_after_a_crash(directory, name):
            trace.violations.append(f"{name} linked into place before its data was fsynced")
        real_link(
            src,
            dst,
            src_dir_fd=src_dir_fd,
            dst_dir_fd=dst_dir_fd,
            follow_symlinks=follow_symlinks,
        )
        trace.changed(directory, name)

    def t_rename2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
        a, b = trace.split(src, src_dir), trace.split(dst, dst_dir)
        trace.before_rename(*a, *b)
        if flags == fsio._RENAME_EXCHANGE:
            trace.before_rename(*b, *a)
        real_rename2(src_dir, src, dst_dir, dst, flags)
        trace.after_rename(*a, *b)

    monkeypatch.setattr(os, "open", t_open)
    monkeypatch.setattr(os, "write", t_write)
    monkeypatch.setattr(os, "fsync", t_fsync)
    monkeypatch.setattr(os, "unlink", t_unlink)
    monkeypatch.setattr(os, "mkdir", t_mkdir)
    monkeypatch.setattr(os, "rename", t_rename)
    monkeypatch.setattr(os, "link", t_link)

    def t_syncfs(fd: int) -> None:
        real_syncfs(fd)
        trace.dirty.clear()  # every file's data on this file system is durable now

    monkeypatch.setattr(fsio, "syncfs", t_syncfs)
    monkeypatch.setattr(fsio, "_rename2", t_rename2)


class _NullLog:
    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *_a, **_k: None


@pytest.mark.parametrize(
    ("split", "batch"),
    [(False, False), (True, False), (False, True)],
    ids=["default", "split_invalid_candidates", "batch"],
)
def test_every_write_is_durable_before_what_depends_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: bool, batch: bool
) -> None:
    """The order of writes, fsyncs and renames follows SPEC 5, which a SIGKILL cannot show:
    temp data is fsynced before it is renamed into place, dead-letter files and directory
    entries are fsynced before the staging file is removed, and every directory memstaged
    changed is fsynced before the decision is reported (also on the too-large copy path, for
    repair R4, for ``--once``'s batches, and when a crash's leftovers are recovered). A name that
    would survive a crash never points at data that is not yet durable."""
    rng = random.Random(SEED)
    mdir = make_memory_dir(tmp_path)
    inputs = make_corpus(rng, 60, project_root_of(mdir), "dur-", big_every=6)
    write_inputs(mdir / "staging", inputs)
    # Leftovers of a crash: a rewrite temp and a renamed-away original.
    (mdir / "staging" / temp_names.temp_name("new", inputs[0].name)).write_bytes(b"{}")
    (mdir / "staging" / temp_names.temp_name("out", "gone.json")).write_bytes(b"lost?")
    trace = _Trace(mdir)
    absolute = os.path.abspath(mdir)
    memory_dir = MemoryDir(absolute, project_root_of(mdir))
    pipeline = Pipeline(
        Options(settle=0, max_file_size=MAX_SIZE, split_invalid_candidates=split), _NullLog()
    )
    _install_trace(monkeypatch, trace)
    pipeline.recover_temps(memory_dir)
    trace.finished("recover_temps")
    if batch:
        for _batch in pipeline.batches(memory_dir, pipeline.scan(memory_dir)):
            trace.finished("the batch")
    else:
        for name in pipeline.scan(memory_dir):
            pipeline.process(memory_dir, name)
            trace.finished(name)
    monkeypatch.undo()
    assert trace.renames > 50
    assert not trace.violations, "\n".join(trace.violations[:30])
    assert not temps_in(mdir)


def _cp_p(path: Path, data: bytes, mtime_ns: int, rng: random.Random) -> None:
    """A writer that keeps size and mtime: in place (``cp -p``) or by two renames (``rsync -t``)."""
    in_place = rng.random() < 0.5
    if in_place:
        try:
            with path.open("r+b") as fh:
                fh.write(data)
        except FileNotFoundError:  # the daemon moved it away meanwhile: write a new one
            in_place = False
    if not in_place:
        for n in range(2):
            tmp = path.with_name(f".w{n}-{path.name}")
            tmp.write_bytes(data)
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
            os.rename(tmp, path)
    try:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    except FileNotFoundError:
        pass  # quarantined the instant it was put in place (its bytes are in originals/)


def _newest_survive(mdir: Path, newest: dict[str, bytes], root: str) -> list[str]:
    """Each name's newest version is in staging/ (itself or its repair, any name) or, byte for
    byte, in deadletter/originals/."""
    staged = {p.read_bytes() for p in (mdir / "staging").iterdir() if p.is_file()}
    originals = mdir / "deadletter" / "originals"
    kept = {p.read_bytes() for p in originals.iterdir()} if originals.is_dir() else set()
    problems = []
    for name, data in newest.items():
        repair = expected_verdict(mdir, Input(name, data, "")).new_bytes
        if data not in staged and data not in kept and (repair is None or repair not in staged):
            problems.append(f"{name}: the writer's newest version is lost")
    return problems


def test_sigkill_the_daemon_under_writers_that_keep_size_and_mtime(tmp_path: Path) -> None:
    """Issue 10 items 1, 2 and 5 in the crash ledger: writers replace files in place or by two
    renames keeping size and mtime while the daemon works, and the daemon is SIGKILLed at random
    moments: after every kill, each file's newest version survives, and every change on disk
    has its decision in the log."""
    rng = random.Random(SEED + 11)
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path)
    config = write_config(tmp_path / "config.toml", max_file_size=MAX_SIZE, settle=0)
    root = project_root_of(mdir)
    newest: dict[str, bytes] = {}
    mtime_ns = OLD_MTIME * 1_000_000_000
    for kill in range(16):
        with daemon([mdir], env, "--config", str(config)) as proc:
            deadline = time.monotonic() + rng.uniform(0.4, 0.9)
            n = 0
            while time.monotonic() < deadline:
                name = f"w{rng.randrange(12)}.json"
                data = same_size_doc(root, f"{kill}-{n}", repairable=rng.random() < 0.5)
                _cp_p(mdir / "staging" / name, data, mtime_ns, rng)
                newest[name] = data
                n += 1
                time.sleep(rng.uniform(0.0, 0.01))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        problems = _newest_survive(mdir, newest, root)
        problems += check_logged(mdir, [], Path(env["MEMSTAGED_LOG_FILE"]))
        assert not problems, f"after daemon kill {kill}: {problems[:20]}"
    final = run_once(mdir, env, "--config", str(config))
    assert final.returncode == 0, final.stderr[-2000:]
    assert not _newest_survive(mdir, newest, root)


# -- a repair killed right after its exchange ------------------------------------------------------


def test_a_repair_killed_right_after_the_exchange_is_in_the_log(tmp_path: Path) -> None:
    """Issue 10 item 5: SIGKILL between the rewrite being in place and the end of the run: the
    ``repaired`` decision is in the log already (it is logged, and synced, before any change)."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    put(mdir / "staging" / "fix.json", repairable(root, "x"))
    env = memstaged_env(tmp_path / "work", MEMSTAGED_CRASH_AT="replaced:1")
    killed = run_once(mdir, env, "--settle", "0")
    assert killed.returncode == -9
    assert (mdir / "staging" / "fix.json").read_bytes() != repairable(root, "x")  # repaired
    events = read_events(Path(env["MEMSTAGED_LOG_FILE"]))
    assert [e["decision"] for e in events if e.get("event") == "decision"] == ["repaired"]


def test_a_leftover_that_cannot_be_deleted_stops_no_other_clean_up(tmp_path: Path) -> None:
    """Crash recovery deletes the temps a killed run left, one by one: an entry it cannot
    delete (a directory with a temp's name, here) is said, left alone, and the others are
    deleted still. The first such entry stopped the clean-up of its directory and of
    ``staging/`` after it, with nothing said but a stop: hundreds of temps were left for ever.
    """
    mdir = make_memory_dir(tmp_path)
    store = mdir / "deadletter"
    (store / ORIGINALS_DIR).mkdir(parents=True)
    names = [temp_names.temp_name("rec", f"r{i}.json") for i in range(60)]
    for name in names:
        (store / name).write_bytes(b"{}")
    blocker = store / temp_names.temp_name("rec", "blocker.json")
    blocker.mkdir()
    partial = mdir / "staging" / temp_names.temp_name(temp_names.PARTIAL, "s.json")
    partial.write_bytes(b"{")
    env = memstaged_env(tmp_path)
    done = run_once(mdir, env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in store.iterdir()) == sorted([blocker.name, ORIGINALS_DIR])
    assert not partial.exists()
    events = read_events(Path(env["MEMSTAGED_LOG_FILE"]), strict=False)
    left = [e for e in events if e.get("event") == "temp_recovered" and e.get("left")]
    assert [(e["path"], e["left"]) for e in left] == [("deadletter", 1)], left
