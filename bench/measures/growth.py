"""16-18. Growth (issue 23): does a file cost the same at 100,000 files as at 1,000?

16. ``--once`` on a backlog of 1,000, 10,000 and 100,000 files, in memory dirs of 1,000 files
    each, and on one ``staging/`` of 100,000 files;
17. the daemon's start-up scan of memory dirs of 100 files each (10, then 1,000 of them) until
    it says ``READY=1`` on a real notify socket;
18. what the pool of decider processes costs to start (memstaged.run.decider_pool).

Each figure is per file: wall time, system calls (a second run under ``strace -f -c``), and the
peak RSS of the process. The verdict "flat" holds when the per-file time and calls of the
largest size are within :data:`FLAT_FACTOR` of the smallest's.

The corpus is the peer corpus of measure 9 (same generator, mix and options): 1,000 files are
generated once; every other file is one of them with a new session id (so a new name and new
dead-letter names) and its memory dir's own project root, substituted byte for byte, so every
copy is decided as its original is (same size, same decision) and no name is ever shared.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import corpus
import costs
from harness import PYTHON, Corpora, Plan, Row, Sandbox, err, fmt, sandbox, wait_quiet

#: "Flat": per-file time and system calls at the largest size within this factor of the
#: smallest's. Time on a shared machine moves by ±20 % from run to run; a term that grows with
#: the number of files (a sort, a listing per file) shows as 10x from 1,000 to 100,000.
FLAT_FACTOR: Final = 1.5
#: Files of each memory dir of measure 16, and of measure 17.
BACKLOG_DIR_FILES: Final = 1000
SCAN_DIR_FILES: Final = 100
#: The marker of a finished layout (pristine copies written), with its parameters.
_DONE: Final = "bench-growth-done"


# ---------------------------------------------------------------------------- the corpus
def _base(c: Corpora, plan: Plan) -> tuple[Path, corpus.Manifest]:
    """The 1,000 generated files every layout copies (memory dir ``m000``)."""
    base = _growth_dir(c, "m000")
    try:
        m = corpus.Manifest.load(base)
    except FileNotFoundError:
        m = None
    pristine = base / corpus.PRISTINE_NAME
    whole = pristine.is_dir() and len(os.listdir(pristine)) == BACKLOG_DIR_FILES
    if m is None or m.seed != plan.seed + 23 or len(m.files) != BACKLOG_DIR_FILES or not whole:
        t0 = time.perf_counter()
        m = corpus.generate(
            base, BACKLOG_DIR_FILES, plan.seed + 23, (0.7, 0.2, 0.1), **corpus.PEER_CORPUS
        )
        err.print(
            f"  generated {BACKLOG_DIR_FILES} files in {base} ({time.perf_counter() - t0:.0f} s)"
        )
    return base, m


def _growth_dir(c: Corpora, tag: str) -> Path:
    """A memory dir of the growth layouts; ``tag`` is 4 characters, as ``m000`` is, so that
    substituting one project root for another keeps every file's size."""
    assert len(tag) == 4, tag
    return c.work / "growth" / tag / "proj" / ".pi" / "memory" / "project"


def _copy_of(data: bytes, sid: str, new_sid: str, root: str, new_root: str) -> bytes:
    return data.replace(sid.encode(), new_sid.encode()).replace(root.encode(), new_root.encode())


def _layout(
    c: Corpora, plan: Plan, tags: Sequence[str], per_dir: int, single: str = ""
) -> list[Path]:
    """Memory dirs ``tags`` of ``per_dir`` files each (or, with ``single``, one memory dir
    ``single`` holding ``len(tags) x per_dir`` files), their pristine copies written once."""
    base, m = _base(c, plan)
    pristine_base = base / corpus.PRISTINE_NAME
    dirs = [_growth_dir(c, single)] if single else [_growth_dir(c, t) for t in tags]
    marker = f"{plan.seed} {len(tags)} {per_dir}"
    # The base is its own first copy (``m000``): generated, never rewritten here.
    todo = [d for d in dirs if d != base and _read(d / _DONE) != marker]
    if not todo:
        return dirs
    t0 = time.perf_counter()
    for d in todo:
        shutil.rmtree(d / corpus.PRISTINE_NAME, ignore_errors=True)
        (d / corpus.PRISTINE_NAME).mkdir(parents=True)
    for k, tag in enumerate(tags):
        dest = dirs[0] if single else dirs[k]
        if dest not in todo:
            continue
        new_root = corpus.project_root_of(dest)
        for entry in m.files[:per_dir]:
            sid = entry.name.removesuffix(".json")
            digest = hashlib.sha256(f"{tag}/{sid}".encode()).digest()[:16]
            new_sid = sid if tag == "m000" else str(uuid.UUID(bytes=digest, version=4))
            data = (pristine_base / entry.name).read_bytes()
            path = dest / corpus.PRISTINE_NAME / f"{new_sid}.json"
            path.write_bytes(_copy_of(data, sid, new_sid, m.project_root, new_root))
            os.utime(path, (corpus.PRISTINE_MTIME, corpus.PRISTINE_MTIME))
    for d in todo:
        (d / _DONE).write_text(marker)
    files = len(tags) * per_dir
    err.print(
        f"  wrote {files:,} files in {len(dirs)} memory dirs ({time.perf_counter() - t0:.0f} s)"
    )
    return dirs


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _reset(dirs: Sequence[Path]) -> None:
    """``corpus.reset`` of many memory dirs with one ``sync`` for all (not one per dir)."""
    for d in dirs:
        for sub in ("staging", "deadletter"):
            shutil.rmtree(d / sub, ignore_errors=True)
        shutil.copytree(d / corpus.PRISTINE_NAME, d / "staging")
    os.sync()


# ---------------------------------------------------------------------------- running
def _dir_args(dirs: Sequence[Path]) -> list[str]:
    return [arg for d in dirs for arg in ("--memory-dir", str(d))]


def _run_measured(cmd: Sequence[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (kB) of one command, from its own ``wait4``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def _calls(cmd: Sequence[str], env: dict[str, str]) -> int | None:
    """System calls of one run, every thread and child (``strace -f -c``); None without strace."""
    strace = costs.strace_path()
    if strace is None:
        return None
    counted, code = costs.strace_counts(strace, cmd, env)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {code} under strace")
    return sum(counted.values())


@contextlib.contextmanager
def _notify_socket(box: Sandbox) -> Iterator[socket.socket]:
    """A real ``NOTIFY_SOCKET``: a datagram socket the daemon sends ``READY=1`` to."""
    path = box.root / "runtime" / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(path))
        yield sock
    finally:
        sock.close()


def _until_ready(sock: socket.socket, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for ``READY=1`` (the daemon's start-up scan is over), failing if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(1.0)
        try:
            message = sock.recv(4096)
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the daemon exited with {proc.returncode} before READY=1"
                ) from None
            continue
        if b"READY=1" in message.split(b"\n"):
            return
    raise RuntimeError(f"no READY=1 after {timeout:.0f} s")


def _daemon_to_ready(
    box: Sandbox, dirs: Sequence[Path], strace: str | None
) -> tuple[float, float, int, int | None]:
    """Start the daemon on ``dirs``; wall and CPU seconds until ``READY=1``, its peak RSS (kB)
    then, and (under ``strace``) the system calls of the whole run, stop included."""
    cmd = [PYTHON, "-m", "memstaged", *_dir_args(dirs)]
    with _notify_socket(box) as sock, tempfile.NamedTemporaryFile(suffix=".strace") as report:
        env = {**box.env(), "NOTIFY_SOCKET": sock.getsockname()}
        if strace is not None:
            cmd = [strace, "-f", "-c", "-o", report.name, *cmd]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _until_ready(sock, proc, timeout=3600)
            elapsed = time.perf_counter() - t0
            pid = proc.pid if strace is None else _traced_child(proc.pid)
            cpu = _cpu_seconds(pid)
            peak = _status_kb(pid, "VmHWM")
            os.kill(pid, signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        calls = None
        if strace is not None:
            calls = sum(costs.parse_strace_summary(Path(report.name).read_text()).values())
    return elapsed, cpu, peak, calls


def _traced_child(strace_pid: int) -> int:
    children = Path(f"/proc/{strace_pid}/task/{strace_pid}/children").read_text().split()
    return int(children[0])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


# ---------------------------------------------------------------------------- the rows
def _per_file_rows(
    number: int,
    label: str,
    sizes: Sequence[int],
    got: dict[int, tuple[float, float, int, int | None]],
) -> list[Row]:
    """Per size: µs per file (wall), calls per file, peak RSS; then the verdict."""
    rows = []
    for n in sizes:
        wall, cpu, peak_kb, calls = got[n]
        rows.append(
            Row(
                f"{number} growth: {label}, {n:,} files: time",
                wall / n * 1e6,
                "µs/file",
                ratio=None,
                samples=[wall],
                note=f"wall {wall:.2f} s, CPU {cpu:.2f} s ({cpu / n * 1e6:.0f} µs/file); "
                f"peak RSS {peak_kb / 1024:.1f} MB"
                + ("" if calls is None else f"; {calls:,} system calls"),
            )
        )
        rows.append(Row(f"{number} growth: {label}, {n:,} files: peak RSS", peak_kb / 1024, "MB"))
        rows.append(
            Row(
                f"{number} growth: {label}, {n:,} files: system calls",
                None if calls is None else calls / n,
                "calls/file",
                note="skipped: strace is not installed" if calls is None else "",
            )
        )
    small, large = min(sizes), max(sizes)
    if small == large:
        return rows
    time_ratio = (got[large][0] / large) / (got[small][0] / small)
    calls_s, calls_l = got[small][3], got[large][3]
    calls_ratio = None if not calls_s or not calls_l else (calls_l / large) / (calls_s / small)
    worst = max(time_ratio, calls_ratio or 0.0)
    rows.append(
        Row(
            f"{number} growth: {label}: per file at {large:,} vs {small:,}",
            time_ratio,
            "x time/file",
            f"{small:,} files: {fmt(got[small][0] / small * 1e6)} µs/file",
            worst,
            "x (worst of time, calls)",
            f"≤ {FLAT_FACTOR}x: flat",
            worst <= FLAT_FACTOR,
            note=f"flat: {'yes' if worst <= FLAT_FACTOR else 'no'}; calls/file ratio "
            + ("—" if calls_ratio is None else f"{calls_ratio:.2f}")
            + f"; peak RSS {got[small][2] / 1024:.1f} -> {got[large][2] / 1024:.1f} MB",
        )
    )
    return rows


def measure_growth(c: Corpora, plan: Plan) -> list[Row]:
    """16. ``--once`` backlogs of growing size, and one ``staging/`` of the largest size."""
    err.print("[bold]16 growth: --once backlogs[/]")
    sizes = plan.growth_sizes
    largest = max(sizes)
    tags = [f"m{k:03d}" for k in range(max(largest // BACKLOG_DIR_FILES, 1))]
    all_dirs = _layout(c, plan, tags, min(BACKLOG_DIR_FILES, largest))
    got: dict[int, tuple[float, float, int, int | None]] = {}
    for n in sizes:
        dirs = all_dirs[: max(n // BACKLOG_DIR_FILES, 1)]
        got[n] = _once_figures(c, dirs, n)
    rows = _per_file_rows(16, "--once, memory dirs of 1,000", sizes, got)
    err.print(f"[bold]16 growth: one staging/ of {largest:,} files[/]")
    single = _layout(c, plan, tags, min(BACKLOG_DIR_FILES, largest), single="s000")
    one = {largest: _once_figures(c, single, largest)}
    small = min(sizes)
    one_rows = _per_file_rows(16, "--once, one staging/", [largest], one)
    ratio = (one[largest][0] / largest) / (got[small][0] / small)
    one_rows.append(
        Row(
            f"16 growth: --once, one staging/ of {largest:,} vs {small:,} files in dirs",
            ratio,
            "x time/file",
            target=f"≤ {FLAT_FACTOR}x: flat",
            met=ratio <= FLAT_FACTOR,
        )
    )
    return rows + one_rows


def _once_figures(c: Corpora, dirs: Sequence[Path], n: int) -> tuple[float, float, int, int | None]:
    cmd = [PYTHON, "-m", "memstaged", "--once", *_dir_args(dirs)]
    with sandbox(c.work) as box:
        _reset(dirs)
        wait_quiet(f"--once on {n:,} files")
        wall, cpu, peak = _run_measured(cmd, box.env())
    with sandbox(c.work) as box:
        _reset(dirs)
        calls = _calls(cmd, box.env())
    err.print(
        f"  {n:,} files in {len(dirs)} memory dirs: {wall:.2f} s ({wall / n * 1e6:.0f} µs/file), "
        f"CPU {cpu:.2f} s, peak RSS {peak / 1024:.1f} MB"
        + ("" if calls is None else f", {calls / n:.1f} calls/file")
    )
    return wall, cpu, peak, calls


def measure_scan(c: Corpora, plan: Plan) -> list[Row]:
    """17. The daemon's start-up scan until ``READY=1``, memory dirs of 100 files each."""
    err.print("[bold]17 growth: the daemon's start-up scan[/]")
    counts = plan.scan_dirs
    tags = [f"d{k:03d}" for k in range(max(counts))]
    dirs = _layout(c, plan, tags, SCAN_DIR_FILES)
    strace = costs.strace_path()
    got: dict[int, tuple[float, float, int, int | None]] = {}
    for count in counts:
        n = count * SCAN_DIR_FILES
        some = dirs[:count]
        with sandbox(c.work) as box:
            _reset(some)
            wait_quiet(f"the start-up scan of {n:,} files")
            wall, cpu, peak, _ = _daemon_to_ready(box, some, None)
        calls = None
        if strace is not None:
            with sandbox(c.work) as box:
                _reset(some)
                calls = _daemon_to_ready(box, some, strace)[3]
        got[n] = (wall, cpu, peak, calls)
        err.print(
            f"  {count:,} memory dirs, {n:,} files: READY=1 after {wall:.2f} s, CPU {cpu:.2f} s, "
            f"peak RSS {peak / 1024:.1f} MB"
            + ("" if calls is None else f", {calls / n:.1f} calls/file")
        )
    sizes = [count * SCAN_DIR_FILES for count in counts]
    return _per_file_rows(17, "daemon start-up scan to READY=1, dirs of 100", sizes, got)


#: Starts ``workers`` decider processes, sends each one chunk of one small file, and stops them:
#: what a ``--once`` that uses the pool pays beyond deciding (measure 18).
_START_CODE: Final = """
import sys, time
from memstaged.run.decider_pool import Deciders
from memstaged.core.decide import Context
workers = int(sys.argv[1])
job = (b'{}', Context('/p', 'a.json'))
t0 = time.perf_counter()
pool = Deciders(workers)
sent = [pool._submit([job]) for _ in range(workers)]
for worker in sent:
    assert pool._result(worker) is not None
t1 = time.perf_counter()
pool.close()
t2 = time.perf_counter()
print((t1 - t0) * 1e3, (t2 - t1) * 1e3)
"""


def measure_pool_start(c: Corpora, plan: Plan) -> list[Row]:
    """18. What starting the pool of deciders costs: fork, first round trip, stop."""
    err.print("[bold]18 deciders: start-up of the pool[/]")
    rows = []
    for workers in (1, 2):
        starts, stops = [], []
        for _ in range(plan.startup_repeat):
            wait_quiet(f"starting {workers} deciders")
            out = subprocess.run(
                [PYTHON, "-c", _START_CODE, str(workers)], capture_output=True, check=True
            ).stdout.split()
            starts.append(float(out[0]))
            stops.append(float(out[1]))
        starts.sort()
        stops.sort()
        start, stop = starts[len(starts) // 2], stops[len(stops) // 2]
        rows.append(
            Row(
                f"18 deciders: start {workers} worker{'s' if workers > 1 else ''} (fork, first "
                "chunk back)",
                start,
                "ms",
                samples=starts,
                note=f"stopping them: {stop:.1f} ms (median of {len(stops)})",
            )
        )
    return rows
