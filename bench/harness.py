"""What every measure of ``bench/run.py`` shares: the plan, result rows, sandboxes, the daemon
and its log, the machine's load, the corpora, and how memstaged is started and timed."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
from rich.console import Console
from rich.table import Table

PYTHON: Final = sys.executable
REPO: Final = Path(__file__).resolve().parent.parent
#: Environment variables that would change where memstaged logs or what it reads.
_SCRUB: Final = (
    "JOURNAL_STREAM",
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
)
err = Console(stderr=True, highlight=False)
#: CPU seconds of each ``memstaged --once`` run, in order (see :func:`run_once`).
ONCE_CPU: list[float] = []
#: What the breakdowns found (imports, system calls, memory parts): written to the JSON output.
DETAILS: dict[str, Any] = {}


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Plan:
    """Sizes and repeats of one run; ``--quick`` shrinks all of them."""

    n: int = 10_000
    seed: int = 1
    repeat: int = 3
    startup_repeat: int = 10
    rates: tuple[int, ...] = (50, 200, 1000)
    rate_seconds: float = 5.0
    rate_max_files: int = 2000
    grace: float = 10.0
    burst: int = 20_000
    idle_dirs: int = 50
    idle_seconds: float = 60.0
    memory_files: int = 1000
    memory_rounds: int = 100
    settle: float = 2.0
    peer_n: int = 3000
    peer_repeat: int = 5
    #: Measure 9 again on a corpus this large (issue 23), in this many rounds; 0: not taken.
    peer_large: int = 30_000
    peer_large_repeat: int = 3
    #: Measure 16: ``--once`` backlogs of these sizes (memory dirs of 1,000 files each).
    growth_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    #: Measure 17: the daemon's start-up scan of this many memory dirs of 100 files each.
    scan_dirs: tuple[int, ...] = (10, 1_000)

    @classmethod
    def quick(cls, seed: int) -> Plan:
        return cls(
            n=1000,
            seed=seed,
            repeat=1,
            startup_repeat=3,
            rate_seconds=1.0,
            rate_max_files=1000,
            grace=3.0,
            burst=2000,
            idle_seconds=10.0,
            memory_files=200,
            memory_rounds=10,
            peer_n=300,
            peer_repeat=1,
            peer_large=1000,
            peer_large_repeat=1,
            growth_sizes=(1_000, 3_000),
            scan_dirs=(2, 10),
        )


# ---------------------------------------------------------------------------- results
@dataclass
class Row:
    """One line of the table (and one object of the JSON output)."""

    measure: str
    value: float | None
    unit: str
    baseline: str = ""
    ratio: float | None = None
    ratio_unit: str = ""
    target: str = ""
    met: bool | None = None
    samples: list[float] = field(default_factory=list)
    note: str = ""
    #: The baseline's own samples, run interleaved with ``samples`` (same order).
    baseline_samples: list[float] = field(default_factory=list)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def paired(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of per-repeat ratios ``ours[i] / theirs[i]``.

    The runs of one repeat follow each other, so a machine that is slower for a while (other
    processes, writeback, the file system's state) slows both sides of a pair: the ratio of the
    pair is steadier than the ratio of the two medians.
    """
    return median([a / b for a, b in zip(ours, theirs, strict=True)])


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def fmt(value: float | None) -> str:
    """Three significant digits, thousands separated; ``—`` for nothing."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    digits = max(2 - magnitude, 0)
    return f"{value:,.{digits}f}"


def render(rows: Sequence[Row], title: str) -> Table:
    table = Table(title=title)
    for name, justify in (
        ("measure", "left"),
        ("value", "right"),
        ("unit", "left"),
        ("baseline", "left"),
        ("ratio", "right"),
        ("target", "left"),
        ("met", "center"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        met = "—" if r.met is None else "[green]yes[/]" if r.met else "[red]no[/]"
        ratio = "—" if r.ratio is None else f"{fmt(r.ratio)}{r.ratio_unit}"
        table.add_row(
            r.measure, fmt(r.value), r.unit, r.baseline or "—", ratio, r.target or "—", met
        )
    return table


# ---------------------------------------------------------------------------- sandboxes
class Sandbox:
    """A fresh HOME, XDG dirs and decision log for memstaged processes that share state."""

    def __init__(self, parent: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sandbox-", dir=parent))
        self.log = self.root / "log" / "decisions.jsonl"
        for sub in ("home", "config", "state", "cache", "runtime", "log"):
            (self.root / sub).mkdir(mode=0o700)

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MEMSTAGED_") and k not in _SCRUB
        }
        env.update(
            HOME=str(self.root / "home"),
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_STATE_HOME=str(self.root / "state"),
            XDG_CACHE_HOME=str(self.root / "cache"),
            XDG_RUNTIME_DIR=str(self.root / "runtime"),
            MEMSTAGED_LOG_FILE=str(self.log),
        )
        return env

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def sandbox(parent: Path) -> Iterator[Sandbox]:
    box = Sandbox(parent)
    try:
        yield box
    finally:
        box.remove()


def children_cpu() -> float:
    """CPU seconds of every reaped child process so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


#: ``python -m memstaged`` that, as it exits, writes its own CPU seconds (user and system, its
#: threads, not its decider processes) to the file named by ``MEMSTAGED_BENCH_CPU``.
_MAIN_CPU = """
import os, resource, runpy, sys
try:
    runpy.run_module("memstaged", run_name="__main__", alter_sys=True)
finally:
    used = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["MEMSTAGED_BENCH_CPU"], "w") as out:
        out.write(repr(used.ru_utime + used.ru_stime))
"""

#: The main process's CPU seconds of each :func:`run_once` asked for them, in order.
MAIN_CPU: list[float] = []


def run_once(
    box: Sandbox,
    memory_dir: Path,
    extra: Sequence[str] = (),
    more_env: dict[str, str] | None = None,
    *,
    main_cpu: bool = False,
) -> tuple[float, str]:
    """``memstaged --once`` in a subprocess: wall seconds and its summary line.

    Its CPU seconds are added to :data:`ONCE_CPU`, for the notes: wall time is what the issue
    asks for, CPU time shows how much of it a busy machine may have added. ``extra`` are more
    options (``--project-root``, ``--dry-run``); ``more_env`` more variables
    (``MEMSTAGED_WORKERS``). ``main_cpu``: the main process's own CPU seconds, without its
    decider processes', are added to :data:`MAIN_CPU` (it runs under a wrapper that reads its
    ``getrusage(RUSAGE_SELF)`` as it exits).
    """
    start = ["-c", _MAIN_CPU, "--once"] if main_cpu else ["-m", "memstaged", "--once"]
    cmd = [PYTHON, *start, "--memory-dir", str(memory_dir), *extra]
    cpu_file = str(box.root / "main-cpu")
    if main_cpu:
        more_env = {**(more_env or {}), "MEMSTAGED_BENCH_CPU": cpu_file}
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        env={**box.env(), **(more_env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    elapsed = time.perf_counter() - t0
    ONCE_CPU.append(children_cpu() - cpu0)
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        raise RuntimeError(f"memstaged --once exited {proc.returncode}: {out}")
    if main_cpu:
        MAIN_CPU.append(float(Path(cpu_file).read_text()))
    return elapsed, out


def summary_counts(line: str) -> Counter[str]:
    """``path: valid=1 repaired=2 ... total=3`` (the non-TTY summary of --once) as counts."""
    counts: Counter[str] = Counter()
    for part in line.rsplit(": ", 1)[-1].split():
        key, _, value = part.partition("=")
        if value.isdigit() and key != "total":
            counts[key] = int(value)
    return +counts


# ---------------------------------------------------------------------------- the daemon
@dataclass(frozen=True)
class Decided:
    """One decision event of the log."""

    name: str
    decision: str
    at: float  # the event's timestamp, as epoch seconds
    duration: float  # its duration_ms: the time spent in Pipeline.process


class LogTail:
    """Reads the JSON-lines decision log as it grows, across memstaged's own rotations."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] | None = None
        self._ino = -1
        self._rest = b""
        self.decisions: list[Decided] = []
        self.events: Counter[str] = Counter()

    def _read(self) -> bytes:
        assert self._fh is not None
        return self._fh.read()

    def poll(self) -> int:
        """Take in the lines written since the last call; returns how many decisions came."""
        if self._fh is None:
            try:
                self._fh = self.path.open("rb")
            except FileNotFoundError:
                return 0
            self._ino = os.fstat(self._fh.fileno()).st_ino
        chunk = self._read()
        try:
            rotated = os.stat(self.path).st_ino != self._ino
        except FileNotFoundError:
            rotated = False
        if rotated:  # the old file is complete once renamed: drain it, then follow the new one
            chunk += self._read()
            self._fh.close()
            self._fh = None
        before = len(self.decisions)
        self._take(chunk)
        if rotated:
            self.poll()
        return len(self.decisions) - before

    def _take(self, chunk: bytes) -> None:
        data = self._rest + chunk
        lines = data.split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            kind = str(event.get("event"))
            self.events[kind] += 1
            if kind == "decision":
                at = datetime.fromisoformat(event["timestamp"]).timestamp()
                name = os.path.basename(str(event.get("path", "")))
                duration = float(event.get("duration_ms") or 0.0)
                self.decisions.append(Decided(name, str(event.get("decision")), at, duration))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class Daemon:
    """A running ``memstaged`` daemon and the tail of its log."""

    def __init__(self, proc: subprocess.Popen[bytes], tail: LogTail) -> None:
        self.proc = proc
        self.tail = tail

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"the daemon exited with {code}; its log: {self.tail.path}")

    def wait_event(self, kind: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.tail.events[kind] == 0:
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {kind!r} event after {timeout} s")
            time.sleep(0.01)
            self.tail.poll()

    def wait_decisions(self, count: int, idle_timeout: float) -> None:
        """Wait until ``count`` decisions are logged, or none came for ``idle_timeout`` s."""
        last = time.monotonic()
        while len(self.tail.decisions) < count:
            self.check_alive()
            if self.tail.poll():
                last = time.monotonic()
            elif time.monotonic() - last > idle_timeout:
                return
            else:
                time.sleep(0.005)


@contextlib.contextmanager
def daemon(
    box: Sandbox,
    memory_dirs: Sequence[Path],
    settle: float,
    more_env: dict[str, str] | None = None,
) -> Iterator[Daemon]:
    """Start ``python -m memstaged`` on ``memory_dirs``, wait for ``ready``; always stop it."""
    cmd = [PYTHON, "-m", "memstaged", "--settle", str(settle)]
    for m in memory_dirs:
        cmd += ["--memory-dir", str(m)]
    proc = subprocess.Popen(
        cmd,
        env={**box.env(), **(more_env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tail = LogTail(box.log)
    try:
        running = Daemon(proc, tail)
        running.wait_event("ready", timeout=120)
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        tail.close()


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (``/proc/PID/stat``), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After "pid (comm)": state is field 3, so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_wakeups(pid: int) -> int:
    """Voluntary and involuntary context switches, summed over ``/proc/PID/task/*``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def proc_status_kb(pid: int, key: str) -> int:
    """A ``kB`` line of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


# ---------------------------------------------------------------------------- machine load
@dataclass(frozen=True)
class Load:
    """A snapshot of the machine's CPU accounting, to tell our work from everyone else's.

    Other processes on the machine (a test suite, a build) steal CPU and disk from the measured
    runs. ``other`` is the CPU the whole machine spent (``/proc/stat``) minus what this process
    and its reaped children spent (``getrusage``), in cores busy on average: near 0 on a quiet
    machine. Kernel writeback on our behalf counts as other, so a little is normal.
    """

    wall: float
    busy: float
    steal: float
    own: float

    @classmethod
    def now(cls) -> Load:
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as fh:
            cpu = [int(x) for x in fh.readline().split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = cpu[:8]
        me = resource.getrusage(resource.RUSAGE_SELF)
        return cls(
            time.monotonic(),
            (user + nice + system + irq + softirq) / ticks,
            steal / ticks,
            me.ru_utime + me.ru_stime + children_cpu(),
        )

    def other_cores(self, later: Load) -> float:
        wall = max(later.wall - self.wall, 1e-9)
        return max((later.busy - self.busy) - (later.own - self.own), 0.0) / wall

    def steal_cores(self, later: Load) -> float:
        return (later.steal - self.steal) / max(later.wall - self.wall, 1e-9)


#: Seconds to wait, at most, for other processes to go quiet before a measured run.
QUIET_WAIT = 120.0
#: "Quiet": other processes use less than this many cores over a 1 s sample, 3 samples in a row.
QUIET_CORES: Final = 0.25


def wait_quiet(label: str) -> None:
    """Write back what is dirty (``sync``), then wait (up to :data:`QUIET_WAIT`) until nothing
    else keeps the CPUs busy.

    The ``sync`` first: a corpus just copied into place, or what a run that does not sync (the
    JavaScript peer) left in the page cache, would otherwise be written back by the next run's
    ``syncfs`` and charged to it (measure 9 at 30,000 files: memstaged right after the peer
    took 11.0 and 14.6 s, with one worker right after it 9.1 and 9.0 s).
    """
    os.sync()
    if QUIET_WAIT <= 0:
        return
    deadline = time.monotonic() + QUIET_WAIT
    calm = 0
    waited = False
    while calm < 3 and time.monotonic() < deadline:
        before = Load.now()
        time.sleep(1.0)
        other = before.other_cores(Load.now())
        calm = calm + 1 if other < QUIET_CORES else 0
        if calm == 0 and not waited:
            err.print(f"  waiting for a quiet machine before {label} ({other:.2f} cores busy)")
            waited = True
    if calm < 3:
        err.print(f"  [yellow]machine still busy after {QUIET_WAIT:g} s: measuring anyway[/]")


# ---------------------------------------------------------------------------- corpora
@dataclass(frozen=True)
class Corpora:
    """The memory dirs a run uses, under one work dir."""

    work: Path
    backlog: Path  # the mixed backlog (valid, repairable, malformed)
    valid: Path  # all valid: steady state, and the files the daemon measures move in
    empty: Path  # start-up
    manifest: corpus.Manifest
    valid_manifest: corpus.Manifest

    @property
    def incoming(self) -> Path:
        """Where files are written before they are renamed into ``valid/staging``."""
        return self.valid.parent / "bench-incoming"


def _memory_dir(work: Path, name: str) -> Path:
    return work / name / "proj" / ".pi" / "memory" / "project"


def _corpus(
    memory_dir: Path,
    n: int,
    seed: int,
    mix: tuple[float, float, float],
    options: dict[str, Any] | None = None,
) -> corpus.Manifest:
    """Reuse a corpus already generated with these settings (``--workdir``), else generate it."""
    try:
        m = corpus.Manifest.load(memory_dir)
    except FileNotFoundError:
        pass
    else:
        kinds = Counter(e.kind for e in m.files)
        want = round(n * mix[0])
        if m.seed == seed and len(m.files) == n and kinds["valid"] == want:
            err.print(f"  reusing the corpus in {memory_dir}")
            corpus.reset(memory_dir)
            return m
    t0 = time.perf_counter()
    m = corpus.generate(memory_dir, n, seed, mix, **(options or {}))
    err.print(f"  generated {n} files in {memory_dir} ({time.perf_counter() - t0:.1f} s)")
    return m


def prepare(work: Path, plan: Plan) -> Corpora:
    err.print("[bold]corpora[/]")
    # Under their own names: a work dir may hold the corpora of contract version 1 (the manifest
    # does not say which options made it).
    backlog = _memory_dir(work, "backlog-v2")
    valid = _memory_dir(work, "valid-v2")
    empty = _memory_dir(work, "empty")
    (empty / "staging").mkdir(parents=True, exist_ok=True)
    m = _corpus(backlog, plan.n, plan.seed, (0.7, 0.2, 0.1), corpus.V2_CORPUS)
    vm = _corpus(valid, plan.n, plan.seed + 1, (1.0, 0.0, 0.0), corpus.V2_CORPUS)
    return Corpora(work, backlog, valid, empty, m, vm)


def valid_pool(c: Corpora) -> list[bytes]:
    pristine = c.valid / corpus.PRISTINE_NAME
    return [(pristine / e.name).read_bytes() for e in c.valid_manifest.files]


def empty_staging(memory_dir: Path) -> Path:
    staging = memory_dir / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def write_incoming(c: Corpora, pool: Sequence[bytes], names: Sequence[str], offset: int) -> None:
    """Write the files to be renamed in, then flush them so writeback does not disturb timing."""
    incoming = c.incoming
    incoming.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        (incoming / name).write_bytes(pool[(offset + i) % len(pool)])
    os.sync()


def _timed(cmd: Sequence[str], env: dict[str, str] | None, ok: tuple[int, ...] = (0,)) -> float:
    """Wall seconds of one command run to its end, output discarded; its CPU goes to the caller."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        list(cmd),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
    return elapsed


def _compile_package() -> None:
    """Byte-compile ``memstaged/`` before any measure, as an installed package is (pip
    compiles it).

    With ``PYTHONDONTWRITEBYTECODE=1`` in the environment (this machine sets it) and an
    editable install, every memstaged process would otherwise compile ~45 modules again: ~110
    ms of each start-up and of each backlog run that no installed memstaged pays (issue 14;
    the figures before the redesign included it).
    """
    package = Path(__file__).resolve().parent.parent / "memstaged"
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(package)], check=True)


# ---------------------------------------------------------------------------- the run
def code_digest() -> str:
    """A digest of memstaged's source as it is on disk now (the tree may be uncommitted)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((REPO / "memstaged").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def machine() -> dict[str, Any]:
    """What the numbers depend on."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
        "code": code_digest(),
    }
