"""The performance benchmark of issue #6: every measure, its baselines, a table of medians.

Run it as ``python bench/run.py`` (``make bench``); ``--quick`` is a smoke run (1,000 files, one
repeat, a short idle) that checks the script itself in about a minute. Corpora come from
``corpus.generate`` with a fixed seed, so every run decides the same bytes.

Measures (each repeated, the median reported; see ``bench/README.md`` and docs/performance.md):

1. backlog: ``memstaged --once`` on 10,000 files (70 % valid, 20 % repairable, 10 % malformed)
   against the I/O floor and the raw write of the same bytes;
2. steady state: the same run on 10,000 valid files that were all decided before;
3. the usual alternative: ``naive.run`` on the same backlog, and validation alone;
4. latency of the daemon at 50, 200 and 1,000 renames per second;
5. a burst of 20,000 renames;
6. the idle daemon watching 50 memory dirs: CPU time and wake-ups;
7. daemon memory after start and after 100,000 decisions;
8. start-up of ``memstaged --once`` on an empty memory dir;
15. ``Date.parse`` of hostile 8 MB ``produced_at`` texts, per byte, against Node's own.

memstaged always runs as a subprocess (``python -m memstaged``) with HOME and the XDG dirs in a
temp dir, its decision log (``MEMSTAGED_LOG_FILE``) there too, and stdout/stderr discarded; every
daemon started here is stopped in a ``finally``.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
import costs
import floor
import naive
import peer
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
MEASURES: Final = (
    "startup",
    "backlog",
    "validate",
    "steady",
    "latency",
    "burst",
    "idle",
    "memory",
    "peer",
    "perfile",
    "rss",
    "inspection",
    "stop",
    "hostile",
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


def run_once(box: Sandbox, memory_dir: Path, extra: Sequence[str] = ()) -> tuple[float, str]:
    """``memstaged --once`` in a subprocess: wall seconds and its summary line.

    Its CPU seconds are added to :data:`ONCE_CPU`, for the notes: wall time is what the issue
    asks for, CPU time shows how much of it a busy machine may have added. ``extra`` are more
    options (``--project-root``, ``--dry-run``).
    """
    cmd = [PYTHON, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir), *extra]
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        env=box.env(),
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
def daemon(box: Sandbox, memory_dirs: Sequence[Path], settle: float) -> Iterator[Daemon]:
    """Start ``python -m memstaged`` on ``memory_dirs``, wait for ``ready``; always stop it."""
    cmd = [PYTHON, "-m", "memstaged", "--settle", str(settle)]
    for m in memory_dirs:
        cmd += ["--memory-dir", str(m)]
    proc = subprocess.Popen(
        cmd,
        env=box.env(),
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
    """Wait (up to :data:`QUIET_WAIT`) until nothing else keeps the CPUs busy."""
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


# ---------------------------------------------------------------------------- measures
#: The start-up measures of issue 14: (key, label, memstaged arguments, target in ms).
STARTUP_COMMANDS: Final = (
    ("once", "--once, empty memory dir", 100.0),
    ("check", "check of one valid file", 80.0),
    ("status", "status, one empty memory dir", 100.0),
)


def _startup_args(c: Corpora, key: str) -> list[str]:
    """The memstaged arguments of one start-up measure (after ``python -m memstaged``)."""
    if key == "once":
        return ["--once", "--memory-dir", str(c.empty)]
    if key == "check":
        first = c.valid / corpus.PRISTINE_NAME / c.valid_manifest.files[0].name
        return ["check", "--project-root", c.valid_manifest.project_root, str(first)]
    return ["status", "--memory-dir", str(c.empty)]


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


def _imports_note(entries: Sequence[costs.Imported]) -> str:
    top = costs.top_imports(entries, 6, min_depth=1)
    listed = ", ".join(f"{e.module} {e.cumulative_ms:.0f}" for e in top)
    total = costs.total_import_ms(entries)
    return f"imports {total:.0f} ms in all; costliest (cumulative ms): {listed}"


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


def measure_startup(c: Corpora, plan: Plan) -> tuple[list[Row], float]:
    """8. Start-up of ``--once`` (empty memory dir), ``check`` (one file) and ``status``.

    Each is taken in turn with ``python -c pass`` and ``node -e 0`` in every repeat, so the
    interpreters' own start-up on this machine, at this moment, is the baseline. Then one
    ``python -X importtime`` run of each command says what its imports cost.
    """
    err.print("[bold]8 start-up[/]")
    node = shutil.which("node")
    times: dict[str, list[float]] = {k: [] for k, _, _ in STARTUP_COMMANDS}
    bare: list[float] = []
    js: list[float] = []
    cpu: dict[str, list[float]] = {k: [] for k in times}
    wait_quiet("start-up")
    with sandbox(c.work) as box:
        env = env_of_startup = box.env()
        for _ in range(plan.startup_repeat):
            bare.append(_timed([PYTHON, "-c", "pass"], env))
            if node is not None:
                js.append(_timed([node, "-e", "0"], env))
            for key, samples in times.items():
                cpu0 = children_cpu()
                cmd = [PYTHON, "-m", "memstaged", *_startup_args(c, key)]
                samples.append(_timed(cmd, env, ok=(0, 1)))  # status: 1 = needs care
                cpu[key].append(children_cpu() - cpu0)
        imports = {
            key: costs.importtime_min(["-m", "memstaged", *_startup_args(c, key)], env, runs=5)
            for key in times
        }
    import_cpu = _import_cpu(env_of_startup)
    DETAILS["import_cpu_ms"] = import_cpu
    DETAILS["imports"] = {
        key: [asdict(e) for e in costs.top_imports(entries, 25)] for key, entries in imports.items()
    }
    b = median(bare)
    js_note = f"; node -e 0: {median(js) * 1000:.1f} ms" if js else "; node not found"
    rows = []
    for key, label, target in STARTUP_COMMANDS:
        t = median(times[key])
        err.print(
            f"  {label}: {t * 1000:.0f} ms (python -c pass {b * 1000:.0f} ms"
            f"{js_note.replace('; ', ', ')})"
        )
        rows.append(
            Row(
                f"8 start-up: {label}",
                t * 1000,
                "ms",
                f"python -c pass: {fmt(b * 1000)} ms",
                t / b,
                "x bare interpreter",
                f"≤ {target:g} ms",
                t * 1000 <= target,
                [x * 1000 for x in times[key]],
                f"CPU {median(cpu[key]) * 1000:.0f} ms{js_note}; " + _imports_note(imports[key]),
                [x * 1000 for x in bare],
            )
        )
    for module, ms in import_cpu.items():
        rows.append(
            Row(
                f"8 import CPU: {module}",
                ms,
                "CPU ms",
                "python -c pass",
                note="least of 5 fresh interpreters, minus python -c pass's least",
            )
        )
    return rows, median(times["once"])


#: Modules whose import cost (CPU, which a busy machine inflates less than wall time) is
#: reported: what memstaged's commands import, and what those pull in.
IMPORT_CPU_MODULES: Final = (
    "msgspec",
    "structlog",
    "asyncio",
    "rich.console",
    "rich.traceback",
    "watchdog.observers.inotify",
    "systemd.journal",
    "memstaged.triage",
    "memstaged.log",
    "memstaged.config",
    "memstaged.commands._common",
    "memstaged.once",
    "memstaged.daemon",
)


def _import_cpu(env: dict[str, str], runs: int = 5) -> dict[str, float]:
    """CPU ms of importing each of :data:`IMPORT_CPU_MODULES` in a fresh interpreter.

    The least of ``runs`` interpreters, minus the least CPU of ``python -c pass``: on a machine
    busy with other work, CPU time says more about the import than ``-X importtime``'s wall time.
    """

    def least(code: str) -> float:
        spent = []
        for _ in range(runs):
            cpu0 = children_cpu()
            _timed([PYTHON, "-c", code], env)
            spent.append(children_cpu() - cpu0)
        return min(spent)

    bare = least("pass")
    return {m: round((least(f"import {m}") - bare) * 1000, 1) for m in IMPORT_CPU_MODULES}


def _interleaved(
    memory_dir: Path, actions: dict[str, Callable[[], None]], repeat: int
) -> dict[str, list[float]]:
    """Each action ``repeat`` times, round-robin (so drift hits all alike), each after a reset."""
    times: dict[str, list[float]] = {k: [] for k in actions}
    for r in range(repeat):
        for name, action in actions.items():
            corpus.reset(memory_dir)
            wait_quiet(name)
            t0 = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - t0)
            err.print(f"  [{r + 1}/{repeat}] {name}: {times[name][-1]:.3f} s")
    return times


def measure_backlog(c: Corpora, plan: Plan) -> list[Row]:
    """1 and 3a. memstaged --once, the I/O floor, raw, and naive.run on the same backlog."""
    err.print("[bold]1 backlog, 3 naive[/]")
    m = c.manifest
    want = Counter(corpus.EXPECTED_DECISION[e.kind] for e in m.files)
    problems: list[str] = []
    cpu_from = len(ONCE_CPU)

    def memstaged() -> None:
        with sandbox(c.work) as box:
            _, line = run_once(box, c.backlog)
        got = summary_counts(line)
        if got != want:
            problems.append(f"memstaged decided {dict(got)}, expected {dict(want)}")

    def naive_run() -> None:
        got = naive.run(c.backlog, m.project_root)
        if +got != want:
            problems.append(f"naive decided {dict(got)}, expected {dict(want)}")

    times = _interleaved(
        c.backlog,
        {
            "memstaged --once": memstaged,
            "floor": lambda: floor.run_floor(c.backlog, m),
            "raw": lambda: floor.run_raw(c.backlog, m),
            "naive": naive_run,
        },
        plan.repeat,
    )
    corpus.reset(c.backlog)
    n = len(m.files)
    mem = times["memstaged --once"]
    t_mem = median(mem)
    t_floor, t_raw, t_naive = (median(times[k]) for k in ("floor", "raw", "naive"))
    r_floor = paired(mem, times["floor"])
    r_raw = paired(mem, times["raw"])
    r_naive = paired(times["naive"], mem)
    note = "; ".join(sorted(set(problems)))
    if note:
        err.print(f"  [red]{note}[/]")
    cpu = median(ONCE_CPU[cpu_from:])
    note = "; ".join(x for x in (note, f"memstaged CPU time {cpu:.2f} s (median)") if x)
    return [
        Row(
            f"1 backlog: --once, {n:,} files (70/20/10)",
            n / t_mem,
            "files/s",
            f"I/O floor: {fmt(n / t_floor)} files/s ({fmt(t_floor)} s)",
            r_floor,
            "x floor time",
            "≤ 0.5x floor time",
            r_floor <= 0.5,
            mem,
            note,
            times["floor"],
        ),
        Row(
            "1 backlog: --once wall time vs raw",
            t_mem,
            "s",
            f"raw (no fsync, one sync): {fmt(t_raw)} s",
            r_raw,
            "x raw time",
            samples=mem,
            baseline_samples=times["raw"],
        ),
        Row(
            "3 backlog: speed-up over naive.run",
            n / t_mem,
            "files/s",
            f"json+jsonschema: {fmt(n / t_naive)} files/s ({fmt(t_naive)} s)",
            r_naive,
            "x faster",
            "≥ 3x faster",
            r_naive >= 3,
            mem,
            baseline_samples=times["naive"],
        ),
    ]


def memstaged_validate(paths: Sequence[Path], project_root: str) -> None:
    """memstaged's validation alone: read each file and decide it in-process, no writes."""
    from memstaged.triage import Context, decide

    for p in paths:
        decide(p.read_bytes(), Context(project_root=project_root, file_name=p.name))


def measure_validate(c: Corpora, plan: Plan) -> list[Row]:
    """3b. ``naive.validate_only`` against ``triage.decide`` on the backlog's bytes."""
    err.print("[bold]3 validation alone[/]")
    pristine = c.backlog / corpus.PRISTINE_NAME
    paths = [pristine / e.name for e in c.manifest.files]
    root = c.manifest.project_root
    memstaged_validate(paths, root)  # warm: imports, page cache
    naive.validate_only(paths)
    mem: list[float] = []
    nai: list[float] = []
    for r in range(plan.repeat):
        wait_quiet("validation")
        t0 = time.perf_counter()
        memstaged_validate(paths, root)
        mem.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        naive.validate_only(paths)
        nai.append(time.perf_counter() - t0)
        err.print(f"  [{r + 1}/{plan.repeat}] memstaged {mem[-1]:.3f} s, naive {nai[-1]:.3f} s")
    n = len(paths)
    t_mem, t_naive = median(mem), median(nai)
    ratio = paired(nai, mem)
    return [
        Row(
            "3 validation alone: triage.decide",
            n / t_mem,
            "files/s",
            f"naive.validate_only: {fmt(n / t_naive)} files/s",
            ratio,
            "x faster",
            "≥ 5x faster",
            ratio >= 5,
            mem,
            baseline_samples=nai,
        )
    ]


def _stat_floor(staging: Path) -> float:
    """Seconds to list ``staging/`` and lstat every entry: the least an unchanged check costs."""
    t0 = time.perf_counter()
    for entry in os.scandir(staging):
        entry.stat(follow_symlinks=False)
    return time.perf_counter() - t0


#: Steady state: runs on the decided files and on the empty memory dir, in turn, per repeat.
STEADY_PAIRS: Final = 7


def measure_steady(c: Corpora, plan: Plan) -> list[Row]:
    """2. ``--once`` again on files that were all decided before: cost per unchanged file.

    A run is ~0.2 s, most of it start-up, and the files' share is a few tens of milliseconds:
    the empty memory dir's run is taken in turn with the full one, in the same sandbox, and each
    repeat's value is the difference of the two medians, so drift between the two cancels.
    """
    err.print("[bold]2 steady state[/]")
    corpus.reset(c.valid)
    n = len(c.valid_manifest.files)
    per_repeat: list[float] = []
    stats: list[float] = []
    note = ""
    with sandbox(c.work) as box:  # one sandbox: whatever memstaged keeps between runs, it keeps
        run_once(box, c.valid)  # the first run decides everything
        cpu_from = len(ONCE_CPU)
        for r in range(plan.repeat):
            wait_quiet("steady state")
            full: list[float] = []
            empty: list[float] = []
            for _ in range(STEADY_PAIRS):
                elapsed, line = run_once(box, c.valid)
                full.append(elapsed)
                empty.append(run_once(box, c.empty)[0])
                if summary_counts(line).get("valid", 0) not in (0, n):
                    note = f"unexpected decisions: {line}"
            per_repeat.append((median(full) - median(empty)) / n * 1e6)
            stats.append(_stat_floor(c.valid / "staging"))
            err.print(
                f"  [{r + 1}/{plan.repeat}] {median(full):.3f} s vs empty {median(empty):.3f} s:"
                f" {per_repeat[-1]:.2f} µs/file ({line.rsplit(': ', 1)[-1]})"
            )
    per_file = median(per_repeat)
    stat_us = median(stats) / n * 1e6
    cpu = median(ONCE_CPU[cpu_from::2])
    note = "; ".join(x for x in (note, f"memstaged CPU time {cpu:.2f} s per run (median)") if x)
    measurable = per_file > 0
    if not measurable:  # small corpora (--quick): the files cost less than start-up's jitter
        note += "; the run took no longer than an empty start-up: too few files to measure"
    return [
        Row(
            f"2 steady state: --once, {n:,} decided files",
            per_file if measurable else None,
            "µs/file",
            f"scandir+lstat: {fmt(stat_us)} µs/file",
            per_file / stat_us if measurable else None,
            "x stat floor",
            "< 5 µs/file",
            per_file < 5 if measurable else None,
            per_repeat,
            note,
            [x / n * 1e6 for x in stats],
        )
    ]


def _paced(
    c: Corpora, d: Daemon, pool: Sequence[bytes], rate: int, count: int, tag: str, grace: float
) -> tuple[list[float], list[float], int]:
    """Rename ``count`` files in at ``rate``/s at an even pace.

    Returns the latencies (s) of the decided files, the part of each spent deciding (the event's
    ``duration_ms``, in ms), and how many files got no decision.
    """
    names = [f"{tag}-{i:06d}.json" for i in range(count)]
    write_incoming(c, pool, names, offset=rate)
    staging = c.valid / "staging"
    incoming = c.incoming
    sent: dict[str, float] = {}
    decided_before = len(d.tail.decisions)
    start = time.perf_counter() + 0.05
    for i, name in enumerate(names):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent[name] = time.time()
        os.rename(incoming / name, staging / name)
    d.wait_decisions(decided_before + count, idle_timeout=grace)
    first: dict[str, Decided] = {}
    for ev in d.tail.decisions[decided_before:]:
        if ev.name in sent and ev.name not in first:
            first[ev.name] = ev
    latencies = [first[k].at - sent[k] for k in names if k in first]
    return latencies, [ev.duration for ev in first.values()], count - len(first)


def measure_latency(c: Corpora, plan: Plan, pool: Sequence[bytes]) -> list[Row]:
    """4. Rename-to-decision latency of the daemon at each rate."""
    err.print("[bold]4 latency[/]")
    runs: dict[int, list[tuple[float, float, float, int]]] = {r: [] for r in plan.rates}
    inside: dict[int, list[tuple[float, float]]] = {r: [] for r in plan.rates}
    for rep in range(plan.repeat):
        empty_staging(c.valid)
        wait_quiet("latency")
        with sandbox(c.work) as box, daemon(box, [c.valid], plan.settle) as d:
            for rate in plan.rates:
                count = min(int(rate * plan.rate_seconds), plan.rate_max_files)
                lat, spent, missed = _paced(c, d, pool, rate, count, f"lat{rep}-{rate}", plan.grace)
                ms = [x * 1000 for x in lat] or [math.nan]
                spent = spent or [math.nan]
                stats = (percentile(ms, 50), percentile(ms, 99), max(ms), missed)
                runs[rate].append(stats)
                inside[rate].append((percentile(spent, 50), percentile(spent, 99)))
                err.print(
                    f"  [{rep + 1}/{plan.repeat}] {rate}/s, {count} files: p50 {stats[0]:.2f} ms, "
                    f"p99 {stats[1]:.2f} ms, max {stats[2]:.2f} ms, missed {missed}"
                )
    empty_staging(c.valid)
    rows: list[Row] = []
    for rate, results in runs.items():
        in50 = median([x[0] for x in inside[rate]])
        in99 = median([x[1] for x in inside[rate]])
        p50 = median([r[0] for r in results])
        p99 = median([r[1] for r in results])
        worst = median([r[2] for r in results])
        missed = max(r[3] for r in results)
        at200 = rate == 200
        rows += [
            Row(
                f"4 latency @{rate}/s: p50",
                p50,
                "ms",
                target="< 2 ms" if at200 else "",
                met=p50 < 2 if at200 else None,
                samples=[r[0] for r in results],
                note=f"of which in Pipeline.process (duration_ms): p50 {in50:.3f} ms",
            ),
            Row(
                f"4 latency @{rate}/s: p99",
                p99,
                "ms",
                target="< 20 ms" if at200 else "< 2 ms" if rate == 1000 else "",
                met=p99 < 20 if at200 else p99 < 2 if rate == 1000 else None,
                samples=[r[1] for r in results],
                note=f"of which in Pipeline.process (duration_ms): p99 {in99:.3f} ms",
            ),
            Row(f"4 latency @{rate}/s: max", worst, "ms", samples=[r[2] for r in results]),
            Row(
                f"4 latency @{rate}/s: missed",
                missed,
                "files (worst run)",
                target="0" if rate == 1000 else "",
                met=missed == 0 if rate == 1000 else None,
                samples=[float(r[3]) for r in results],
            ),
        ]
    return rows


def measure_burst(c: Corpora, plan: Plan, pool: Sequence[bytes]) -> list[Row]:
    """5. ``plan.burst`` files renamed in at once: time until every one is decided."""
    err.print("[bold]5 burst[/]")
    times: list[float] = []
    misses: list[int] = []
    overflows: list[int] = []
    for rep in range(plan.repeat):
        empty_staging(c.valid)
        names = [f"burst{rep}-{i:06d}.json" for i in range(plan.burst)]
        write_incoming(c, pool, names, offset=0)
        staging, incoming = c.valid / "staging", c.incoming
        wait_quiet("burst")
        with sandbox(c.work) as box, daemon(box, [c.valid], plan.settle) as d:
            before = len(d.tail.decisions)
            t0 = time.time()
            for name in names:
                os.rename(incoming / name, staging / name)
            loop = time.time() - t0
            d.wait_decisions(before + plan.burst, idle_timeout=max(plan.grace, 15.0))
            wanted = set(names)
            done = {ev.name: ev.at for ev in d.tail.decisions[before:] if ev.name in wanted}
            overflow = d.tail.events["overflow_recovered"]
        elapsed = max(done.values(), default=t0) - t0
        times.append(elapsed)
        misses.append(plan.burst - len(done))
        overflows.append(overflow)
        err.print(
            f"  [{rep + 1}/{plan.repeat}] renames {loop:.2f} s, all decided after "
            f"{elapsed:.2f} s, missed {misses[-1]}, overflows {overflow}"
        )
    empty_staging(c.valid)
    t = median(times)
    note = f"inotify overflows recovered per run: {overflows}" if any(overflows) else ""
    return [
        Row(
            f"5 burst: {plan.burst:,} renames, until all decided",
            t,
            "s",
            ratio=plan.burst / t,
            ratio_unit=" files/s",
            samples=times,
            note=note,
        ),
        Row(
            "5 burst: missed",
            max(misses),
            "files (worst run)",
            target="0",
            met=max(misses) == 0,
            samples=[float(x) for x in misses],
        ),
    ]


def measure_idle(c: Corpora, plan: Plan) -> list[Row]:
    """6. The daemon watching ``plan.idle_dirs`` empty memory dirs: CPU and wake-ups."""
    err.print("[bold]6 idle[/]")
    dirs = []
    for i in range(plan.idle_dirs):
        mdir = _memory_dir(c.work / "idle", f"p{i:02d}")
        (mdir / "staging").mkdir(parents=True, exist_ok=True)
        dirs.append(mdir)
    cpu: list[float] = []
    wakes: list[float] = []
    rss: list[float] = []
    threads = 0
    with sandbox(c.work) as box, daemon(box, dirs, plan.settle) as d:
        time.sleep(2.0)  # let start-up work finish
        for r in range(plan.repeat):
            wait_quiet("idle")
            c0, w0 = proc_cpu_seconds(d.pid), proc_wakeups(d.pid)
            time.sleep(plan.idle_seconds)
            d.check_alive()
            c1, w1 = proc_cpu_seconds(d.pid), proc_wakeups(d.pid)
            per_min = 60 / plan.idle_seconds
            cpu.append((c1 - c0) * per_min)
            wakes.append((w1 - w0) * per_min)
            rss.append(proc_status_kb(d.pid, "VmRSS") / 1024)
            threads = proc_status_kb(d.pid, "Threads")
            err.print(
                f"  [{r + 1}/{plan.repeat}] {cpu[-1]:.3f} CPU s/min, {wakes[-1]:.0f} wake-ups/min,"
                f" RSS {rss[-1]:.1f} MB"
            )
    shutil.rmtree(c.work / "idle", ignore_errors=True)
    window = f"{plan.idle_seconds:g} s windows"
    return [
        Row(
            f"6 idle: {plan.idle_dirs} memory dirs, CPU",
            median(cpu),
            "CPU s/min",
            target="< 0.1 s/min",
            met=median(cpu) < 0.1,
            samples=cpu,
            note=window,
        ),
        Row(
            f"6 idle: {plan.idle_dirs} memory dirs, wake-ups",
            median(wakes),
            "switches/min",
            samples=wakes,
            note=window,
        ),
        Row(
            f"6 idle: {plan.idle_dirs} memory dirs, RSS",
            median(rss),
            "MB",
            target="< 25 MB",
            met=median(rss) < 25,
            samples=rss,
            note=f"{threads} threads; the breakdown is measure 12",
        ),
    ]


def measure_memory(c: Corpora, plan: Plan, pool: Sequence[bytes]) -> list[Row]:
    """7. RSS after start and after ``files x rounds`` decisions of rewritten valid files."""
    err.print("[bold]7 memory[/]")
    start: list[float] = []
    after: list[float] = []
    peak: list[float] = []
    total = plan.memory_files * plan.memory_rounds
    names = [f"mem-{i:05d}.json" for i in range(plan.memory_files)]
    staging, incoming = c.valid / "staging", c.incoming
    for rep in range(plan.repeat):
        empty_staging(c.valid)
        wait_quiet("memory")
        with sandbox(c.work) as box, daemon(box, [c.valid], plan.settle) as d:
            time.sleep(1.0)
            start.append(proc_status_kb(d.pid, "VmRSS") / 1024)
            base = len(d.tail.decisions)
            t0 = time.perf_counter()
            for rnd in range(plan.memory_rounds):
                for i, name in enumerate(names):
                    (incoming / name).write_bytes(pool[(rnd * 7 + i) % len(pool)])
                    os.rename(incoming / name, staging / name)
                d.wait_decisions(base + (rnd + 1) * plan.memory_files, idle_timeout=plan.grace)
            got = len(d.tail.decisions) - base
            time.sleep(1.0)
            after.append(proc_status_kb(d.pid, "VmRSS") / 1024)
            peak.append(proc_status_kb(d.pid, "VmHWM") / 1024)
        err.print(
            f"  [{rep + 1}/{plan.repeat}] {got} decisions in {time.perf_counter() - t0:.1f} s: "
            f"RSS {start[-1]:.1f} → {after[-1]:.1f} MB, peak {peak[-1]:.1f} MB"
        )
    empty_staging(c.valid)
    shutil.rmtree(incoming, ignore_errors=True)
    growth = [a - s for s, a in zip(start, after, strict=True)]
    return [
        Row(
            "7 memory: RSS after start",
            median(start),
            "MB",
            target="< 60 MB",
            met=median(start) < 60,
            samples=start,
        ),
        Row(
            f"7 memory: RSS after {total:,} decisions",
            median(after),
            "MB",
            target="< 60 MB",
            met=median(after) < 60,
            samples=after,
        ),
        Row(
            "7 memory: growth",
            median(growth),
            "MB",
            target="< 5 MB",
            met=median(growth) < 5,
            samples=growth,
        ),
        Row("7 memory: peak (VmHWM)", median(peak), "MB", samples=peak),
    ]


# ---------------------------------------------------------------------------- issue 14
@dataclass(frozen=True)
class PeerCorpus:
    """Two identical copies of issue 14's corpus: one for the JavaScript peer, one for memstaged.

    Both runs are told the same project root (the copies live in different directories), so the
    same bytes get the same decisions and the outcomes can be compared file by file.
    """

    node_dir: Path
    memstaged_dir: Path
    project_root: str
    manifest: corpus.Manifest


def peer_corpus(c: Corpora, plan: Plan) -> PeerCorpus:
    """Generate (or reuse) the peer corpus, and copy it for memstaged."""
    node_dir = _memory_dir(c.work, "peer-node")
    mem_dir = _memory_dir(c.work, "peer-memstaged")
    m = _corpus(node_dir, plan.peer_n, plan.seed + 13, (0.7, 0.2, 0.1), corpus.PEER_CORPUS)
    try:
        same = corpus.Manifest.load(mem_dir) == m
    except FileNotFoundError:
        same = False
    if same:
        corpus.reset(mem_dir)
    else:
        peer.copy_corpus(node_dir, mem_dir)
    return PeerCorpus(node_dir, mem_dir, m.project_root, m)


def measure_peer(c: Corpora, plan: Plan) -> list[Row]:
    """9. ``memstaged --once`` (durable) against the JavaScript peer, on identical copies.

    Rounds alternate which of the two goes first; each round checks that both did the same work.
    ``--once --dry-run`` is timed too: what deciding costs without carrying anything out.
    """
    err.print("[bold]9 JavaScript peer[/]")
    node = shutil.which("node")
    version = peer.node_version(node) if node else None
    if node is None or version is None:
        reason = "skipped: node is not on PATH (the peer is a Node 20 script)"
        err.print(f"  [yellow]{reason}[/]")
        return [Row("9 backlog vs JS peer", None, "s", note=reason)]
    pc = peer_corpus(c, plan)
    n = len(pc.manifest.files)
    size = sum(e.size for e in pc.manifest.files)
    records = sum(e.records for e in pc.manifest.files)
    err.print(f"  {n:,} files, {size / 1e6:.1f} MB, {records:,} records expected; node {version}")
    root = ["--project-root", pc.project_root]
    wall: dict[str, list[float]] = {"peer": [], "memstaged": [], "dry-run": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    problems: list[str] = []
    summary = ""
    env = peer.node_env()
    for r in range(plan.peer_repeat):
        corpus.reset(pc.node_dir)
        corpus.reset(pc.memstaged_dir)
        order = ["peer", "memstaged"] if r % 2 == 0 else ["memstaged", "peer"]
        for who in [*order, "dry-run"]:
            if who == "dry-run":
                corpus.reset(pc.memstaged_dir)
            wait_quiet(who)
            cpu0 = children_cpu()
            if who == "peer":
                t0 = time.perf_counter()
                counts = peer.run_peer(node, pc.node_dir, pc.project_root, env)
                elapsed = time.perf_counter() - t0
            else:
                extra = [*root, "--dry-run"] if who == "dry-run" else root
                with sandbox(c.work) as box:
                    elapsed, _ = run_once(box, pc.memstaged_dir, extra)
                ONCE_CPU.pop()  # counted below, with the peer's
            wall[who].append(elapsed)
            cpu[who].append(children_cpu() - cpu0)
            if who != "dry-run" and who == order[-1]:
                ours, theirs = peer.outcome(pc.memstaged_dir), peer.outcome(pc.node_dir)
                problems += peer.differences(ours, theirs, "memstaged", "the peer")
                summary = f"memstaged: {ours.summary()}; peer: {theirs.summary()}"
        err.print(
            f"  [{r + 1}/{plan.peer_repeat}] "
            + ", ".join(f"{k} {wall[k][-1]:.3f} s (CPU {cpu[k][-1]:.2f} s)" for k in wall)
        )
    if counts.get("records") != records:
        problems.append(f"the peer wrote {counts.get('records')} records, the corpus has {records}")
    problems = sorted(set(problems))
    for p in problems:
        err.print(f"  [red]{p}[/]")
    t_mem, t_peer, t_dry = (median(wall[k]) for k in ("memstaged", "peer", "dry-run"))
    c_mem, c_peer, c_dry = (median(cpu[k]) for k in ("memstaged", "peer", "dry-run"))
    ratio = paired(wall["memstaged"], wall["peer"])
    pairs = (wall["memstaged"], wall["peer"])
    DETAILS["peer"] = {
        "node": version,
        "files": n,
        "bytes": size,
        "records": records,
        "wall": wall,
        "cpu": cpu,
        "differences": problems,
        "outcome": summary,
    }
    label = f"{n:,} files, {size / 1e6:.0f} MB"
    return [
        Row(
            f"9 backlog vs JS peer: --once (durable), {label}",
            t_mem,
            "s",
            f"peer-loader.mjs (node {version}, no fsync): {fmt(t_peer)} s",
            ratio,
            "x peer time",
            "≤ 1.0x peer time",
            ratio <= 1.0,
            wall["memstaged"],
            "per round: " + ", ".join(f"{a / b:.2f}" for a, b in zip(*pairs, strict=True)),
            wall["peer"],
        ),
        Row(
            "9 backlog vs JS peer: CPU time",
            c_mem,
            "CPU s",
            f"peer: {fmt(c_peer)} CPU s",
            c_mem / c_peer,
            "x peer CPU",
            samples=cpu["memstaged"],
            baseline_samples=cpu["peer"],
        ),
        Row(
            "9 backlog vs JS peer: --once --dry-run",
            t_dry,
            "s",
            f"peer: {fmt(t_peer)} s",
            t_dry / t_peer,
            "x peer time",
            samples=wall["dry-run"],
            note=f"CPU {c_dry:.2f} s",
        ),
        Row(
            "9 backlog vs JS peer: same work",
            float(len(problems)),
            "differences",
            target="0",
            met=not problems,
            note="; ".join(problems) if problems else summary,
        ),
    ]


def _kind_dirs(c: Corpora, pc: PeerCorpus) -> dict[str, tuple[Path, int]]:
    """The peer corpus split by expected decision, one memory dir each, plus an empty one."""
    by_decision: dict[str, list[str]] = {"valid": [], "repaired": [], "quarantined": []}
    for e in pc.manifest.files:
        by_decision[corpus.EXPECTED_DECISION[e.kind]].append(e.name)
    out: dict[str, tuple[Path, int]] = {}
    source = pc.node_dir / corpus.PRISTINE_NAME
    for decision, names in [*by_decision.items(), ("empty", [])]:
        mdir = _memory_dir(c.work / "perfile", decision)
        pristine = mdir / corpus.PRISTINE_NAME
        if not pristine.is_dir() or len(list(pristine.iterdir())) != len(names):
            shutil.rmtree(pristine, ignore_errors=True)
            pristine.mkdir(parents=True)
            for name in names:
                shutil.copy2(source / name, pristine / name)
        corpus.reset(mdir)
        out[decision] = (mdir, len(names))
    return out


def syscall_floor(decision: str, records: float) -> float:
    """The system calls SPEC 5 needs per decided file, at least (docs/performance.md lists them).

    valid: open, fstat, read, close, one log write. repaired: those, plus the temp file (open,
    write, link, close), the exchange, a check of what it displaced, its unlink. quarantined: the
    original (open, write, link, close, rename) and a check of it, five calls per record (open,
    write, link, close, rename), renaming the staging file away, checking and unlinking it.
    Shared calls (syncfs, directory fsyncs, the lock) are spread over a batch and left out.
    """
    if decision == "valid":
        return 5
    if decision == "repaired":
        return 12
    return 14 + 5 * records


def measure_perfile(c: Corpora, plan: Plan) -> list[Row]:
    """10 and 11. System calls and CPU per decided file, by decision, on the peer corpus.

    Each decision has its own memory dir (the peer corpus split by kind); a run on an empty
    memory dir is subtracted, so start-up and exit are not counted. System calls come from
    ``strace -f -c`` (skipped, with the reason, when strace is absent); CPU from the children's
    rusage, beside the JavaScript peer (also minus its run on the empty memory dir) and
    ``naive.run`` (json + jsonschema, in process) on the same files.
    """
    err.print("[bold]10 system calls, 11 CPU per file[/]")
    pc = peer_corpus(c, plan)
    dirs = _kind_dirs(c, pc)
    root = ["--project-root", pc.project_root]
    rows: list[Row] = []
    strace = costs.strace_path()
    if strace is None:
        reason = "skipped: strace is not installed (apt-get install strace)"
        err.print(f"  [yellow]{reason}[/]")
        rows.append(Row("10 syscalls per file", None, "calls", note=reason))
    else:
        with sandbox(c.work) as box:
            env = box.env()
            counted: dict[str, Counter[str]] = {}
            for decision, (mdir, _) in dirs.items():
                corpus.reset(mdir)
                cmd = [PYTHON, "-m", "memstaged", "--once", "--memory-dir", str(mdir), *root]
                counted[decision], code = costs.strace_counts(strace, cmd, env)
                if code != 0:
                    raise RuntimeError(f"memstaged --once under strace exited {code}")
            corpus.reset(pc.memstaged_dir)
            cmd = [PYTHON, "-m", "memstaged", "--once", "--memory-dir", str(pc.memstaged_dir)]
            cmd += root
            whole, _ = costs.strace_counts(strace, cmd, env)
            node = shutil.which("node")
            theirs: Counter[str] = Counter()
            if node is not None:
                corpus.reset(pc.node_dir)
                cmd = [node, str(peer.PEER_SCRIPT), str(pc.node_dir), *root]
                theirs, _ = costs.strace_counts(strace, cmd, peer.node_env())
        corpus.reset(pc.memstaged_dir)
        corpus.reset(pc.node_dir)
        DETAILS["syscalls"] = {
            "raw": {k: dict(v) for k, v in counted.items()},
            "corpus": dict(whole),
            "peer": dict(theirs),
        }
        n_all = len(pc.manifest.files)
        total, peer_total = sum(whole.values()), sum(theirs.values())
        top = ", ".join(f"{k} {v:,}" for k, v in whole.most_common(6))
        peer_top = ", ".join(f"{k} {v:,}" for k, v in theirs.most_common(4))
        rows.append(
            Row(
                f"10 syscalls: --once on the peer corpus ({n_all:,} files)",
                float(total),
                "calls",
                f"JS peer: {peer_total:,} calls" if peer_total else "JS peer: node not found",
                total / peer_total if peer_total else None,
                "x peer",
                note=f"memstaged: {top}; peer: {peer_top}",
            )
        )
        base = counted["empty"]
        by_kind: dict[str, list[corpus.Entry]] = {}
        for e in pc.manifest.files:
            by_kind.setdefault(corpus.EXPECTED_DECISION[e.kind], []).append(e)
        per_kind: dict[str, dict[str, float]] = {}
        for decision in ("valid", "repaired", "quarantined"):
            _, count = dirs[decision]
            calls = costs.per_file(counted[decision], base, count)
            per_kind[decision] = calls
            listed = ", ".join(f"{k} {v:.2f}" for k, v in calls.items())
            value = sum(calls.values())
            records = sum(e.records for e in by_kind[decision]) / max(len(by_kind[decision]), 1)
            floor_calls = syscall_floor(decision, records)
            err.print(f"  {decision}: {value:.1f} calls/file: {listed}")
            rows.append(
                Row(
                    f"10 syscalls per file: {decision}",
                    value,
                    "calls/file",
                    f"SPEC 5 needs about {floor_calls:.0f}",
                    value / floor_calls,
                    "x SPEC 5's",
                    note=listed,
                )
            )
        DETAILS["syscalls"]["per_file"] = per_kind
    # 11. CPU per file, by decision, beside naive.run on the same files.
    cpu: dict[str, list[float]] = {k: [] for k in dirs}
    naive_cpu: dict[str, list[float]] = {k: [] for k in dirs if k != "empty"}
    node_cpu: dict[str, list[float]] = {k: [] for k in dirs}
    naive_problems: list[str] = []
    node = shutil.which("node")
    for _ in range(plan.repeat):
        for decision, (mdir, _count) in dirs.items():
            wait_quiet(f"CPU of {decision}")
            for _run in range(3 if decision == "empty" else 1):  # the one to subtract: steadier
                corpus.reset(mdir)
                cpu0 = children_cpu()
                with sandbox(c.work) as box:
                    run_once(box, mdir, root)
                ONCE_CPU.pop()
                cpu[decision].append(children_cpu() - cpu0)
                if node is not None:
                    corpus.reset(mdir)
                    cpu0 = children_cpu()
                    peer.run_peer(node, mdir, pc.project_root, peer.node_env())
                    node_cpu[decision].append(children_cpu() - cpu0)
            if decision == "empty":
                continue
            corpus.reset(mdir)
            t0 = time.process_time()
            got = naive.run(mdir, pc.project_root)
            naive_cpu[decision].append(time.process_time() - t0)
            if set(got) != {decision}:
                naive_problems.append(f"naive decided {dict(got)} on the {decision} files")
        corpus.reset(mdir)
    empty = median(cpu["empty"])
    node_empty = median(node_cpu["empty"]) if node is not None else 0.0
    for decision in ("valid", "repaired", "quarantined"):
        _, count = dirs[decision]
        ours = (median(cpu[decision]) - empty) / count * 1e6
        naive_us = median(naive_cpu[decision]) / count * 1e6
        if node is not None:
            node_us = (median(node_cpu[decision]) - node_empty) / count * 1e6
            rows.append(
                Row(
                    f"11 CPU per file: {decision}, vs the JS peer",
                    ours,
                    "CPU µs/file",
                    f"peer-loader.mjs: {fmt(node_us)} CPU µs/file",
                    ours / node_us if node_us > 0 else None,
                    "x peer CPU",
                    samples=[(x - empty) / count * 1e6 for x in cpu[decision]],
                    baseline_samples=[(x - node_empty) / count * 1e6 for x in node_cpu[decision]],
                    note=f"node on an empty memory dir: {node_empty * 1000:.0f} ms CPU",
                )
            )
        rows.append(
            Row(
                f"11 CPU per file: {decision}",
                ours,
                "CPU µs/file",
                f"json+jsonschema: {fmt(naive_us)} CPU µs/file",
                naive_us / ours if ours > 0 else None,
                "x less CPU",
                samples=[(x - empty) / count * 1e6 for x in cpu[decision]],
                baseline_samples=[x / count * 1e6 for x in naive_cpu[decision]],
                note="; ".join(
                    [
                        f"{count:,} files; --once minus an empty --once"
                        f" ({empty * 1000:.0f} ms CPU)",
                        *sorted(set(naive_problems)),
                    ]
                ),
            )
        )
    return rows


#: What the daemon's memory is made of: (label, code run in a fresh interpreter).
RSS_PARTS: Final = (
    ("python -c pass", "pass"),
    ("import ssl (asyncio's)", "import ssl"),
    ("import asyncio (structlog.stdlib's)", "import asyncio"),
    ("import rich.console", "import rich.console"),
    ("import rich.traceback (structlog.dev's)", "import rich.traceback"),
    ("import msgspec", "import msgspec"),
    ("import structlog", "import structlog"),
    ("import structlog, rich hidden", "import sys\nsys.modules['rich'] = None\nimport structlog"),
    ("import systemd.journal", "import systemd.journal"),
    ("import watchdog.observers.inotify", "import watchdog.observers.inotify"),
    ("import memstaged.triage", "import memstaged.triage"),
    ("import memstaged.log", "import memstaged.log"),
    ("import memstaged.cli", "import memstaged.cli"),
    ("import memstaged.once", "import memstaged.once"),
    ("import memstaged.watcher", "import memstaged.watcher"),
    ("import memstaged.daemon", "import memstaged.daemon"),
)


def measure_rss(c: Corpora, plan: Plan) -> list[Row]:
    """12. What the idle daemon's RSS is made of: interpreter, imports, the observer's watches."""
    err.print("[bold]12 memory breakdown[/]")
    rows: list[Row] = []
    parts: dict[str, dict[str, float]] = {}
    with sandbox(c.work) as box:
        env = box.env()
        bare, _ = costs.rss_of("pass", env)
        for label, code in RSS_PARTS:
            rss, threads = costs.rss_of(code, env)
            parts[label] = {"rss_mb": rss, "threads": threads}
            err.print(f"  {label}: {rss:.1f} MB")
            rows.append(
                Row(
                    f"12 RSS: {label}",
                    rss,
                    "MB",
                    f"python -c pass: {fmt(bare)} MB",
                    rss - bare,
                    " MB more",
                )
            )
        dirs = costs.make_memory_dirs(c.work / "rss", plan.idle_dirs)
        imported, _ = costs.rss_of("import watchdog.observers.inotify", env)
        started = {}
        for count in (0, 1, plan.idle_dirs):
            rss, threads = costs.rss_of(costs.observer_code(dirs[:count]), env)
            started[count] = (rss, threads)
            parts[f"observer, {count} memory dirs"] = {"rss_mb": rss, "threads": threads}
            err.print(f"  observer on {count} memory dirs: {rss:.1f} MB, {threads} threads")
        shutil.rmtree(c.work / "rss", ignore_errors=True)
    DETAILS["rss"] = parts
    watches = 2 * plan.idle_dirs
    per_watch = (started[plan.idle_dirs][0] - started[0][0]) / watches * 1024
    rows += [
        Row(
            "12 RSS: watchdog observer started, no watch",
            started[0][0],
            "MB",
            f"import watchdog.observers.inotify: {fmt(imported)} MB",
            started[0][0] - imported,
            " MB more",
        ),
        Row(
            f"12 RSS: observer with {watches} watches ({plan.idle_dirs} memory dirs)",
            started[plan.idle_dirs][0],
            "MB",
            f"no watch: {fmt(started[0][0])} MB",
            per_watch,
            " kB per watch",
            note=f"{started[plan.idle_dirs][1]} threads (one emitter per watch)",
        ),
    ]
    return rows


INSPECTION: Final = Path(__file__).resolve().parent / "inspection.py"
#: bench/inspection.py's figures and their targets (issue 13/14: the inspection commands).
INSPECTION_TARGETS: Final = (
    ("log_pipe_events_per_s", "log to a pipe", 100_000.0, "events/s"),
    ("log_tty_events_per_s", "log to a terminal", 20_000.0, "events/s"),
    ("deadletter_list_records_per_s", "deadletter list", 20_000.0, "records/s"),
)


def measure_inspection(c: Corpora, plan: Plan) -> list[Row]:
    """13. The inspection commands' throughput, from ``bench/inspection.py`` when it exists."""
    err.print("[bold]13 inspection[/]")
    if not INSPECTION.is_file():
        reason = f"skipped: {INSPECTION.name} is not in bench/ (another engineer is writing it)"
        err.print(f"  [yellow]{reason}[/]")
        return [Row("13 inspection", None, "", note=reason)]
    with sandbox(c.work) as box:
        wait_quiet("inspection")
        sizes = ["--quick"] if plan.n < Plan().n else []
        proc = subprocess.run(
            [PYTHON, str(INSPECTION), *sizes, "--repeat", str(plan.repeat)],
            env=box.env(),
            cwd=c.work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    lines = [x for x in proc.stdout.splitlines() if x.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        reason = f"failed: inspection.py exited {proc.returncode}: {proc.stderr.strip()[-200:]}"
        err.print(f"  [red]{reason}[/]")
        return [Row("13 inspection", None, "", note=reason)]
    got = json.loads(lines[-1])
    DETAILS["inspection"] = got
    rows = []
    for key, label, target, unit in INSPECTION_TARGETS:
        value = got.get(key)
        number = float(value) if isinstance(value, int | float) else None
        rows.append(
            Row(
                f"13 inspection: {label}",
                number,
                unit,
                ratio=number / target if number is not None else None,
                ratio_unit="x target",
                target=f"≥ {target:,.0f} {unit}",
                met=number >= target if number is not None else None,
                note=(
                    f"marginal, per CPU second; wall: {got.get(key[:-6] + '_wall_per_s')}/s"
                    if number is not None
                    else f"{key} missing from inspection.py's output"
                ),
            )
        )
    return rows


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


#: Candidates of measure 14's file: each an empty lesson, so each is a record (SPEC 4).
STOP_CANDIDATES: Final = 100_000


def _holds_open(pid: int, path: Path) -> bool:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == str(path):
                return True
    return False


def _temps(directory: Path) -> int:
    try:
        return sum(1 for e in os.scandir(directory) if e.name.startswith(".memstaged~"))
    except FileNotFoundError:
        return 0


def measure_stop(c: Corpora, plan: Plan) -> list[Row]:
    """14. SIGTERM to exit while the daemon quarantines a file of 100,000 bad candidates: once
    as soon as it holds the file (reading and triage), once while it writes the records' temps
    (SPEC 6: a SIGTERM is acted on within a second whatever file is in hand)."""
    err.print("[bold]14 stop[/]")
    n = STOP_CANDIDATES if plan.n >= Plan().n else STOP_CANDIDATES // 10
    mdir = _memory_dir(c.work / "stop", "p")
    staging, deadletter = mdir / "staging", mdir / "deadletter"
    doc = {
        "schemaVersion": 1,
        "session_id": "stop",
        "project_root": corpus.project_root_of(mdir),
        "produced_at": "2026-11-29T18:04:11.250Z",
        "candidates": {"lessons": [{}] * n, "preferences": [], "decisions": [], "domain": []},
    }
    data = json.dumps(doc).encode()
    seconds: dict[str, list[float]] = {"triage": [], "temps": []}
    for r in range(plan.repeat):
        for stage, samples in seconds.items():
            shutil.rmtree(c.work / "stop", ignore_errors=True)
            staging.mkdir(parents=True)
            wait_quiet("stop")
            with sandbox(c.work) as box, daemon(box, [mdir], 0.0) as d:
                path = staging / "many.json"
                corpus.write_file(staging / ".many.part", data, durable=False)
                os.rename(staging / ".many.part", path)
                deadline = time.monotonic() + 120
                while not (
                    _holds_open(d.pid, path) if stage == "triage" else _temps(deadletter) >= n // 20
                ):
                    d.check_alive()
                    if time.monotonic() > deadline:
                        raise SystemExit(f"measure 14: the daemon never reached {stage}")
                    time.sleep(0.001)
                started = time.monotonic()
                d.proc.send_signal(signal.SIGTERM)
                d.proc.wait(timeout=60)
                samples.append(time.monotonic() - started)
            err.print(
                f"  [{r + 1}/{plan.repeat}] {stage}: exited {samples[-1]:.3f} s after SIGTERM"
            )
    shutil.rmtree(c.work / "stop", ignore_errors=True)
    what = f"a file of {n:,} bad candidates"
    return [
        Row(
            f"14 stop: SIGTERM to exit, {what} being read and triaged",
            median(seconds["triage"]),
            "s",
            target="< 1 s",
            met=max(seconds["triage"]) < 1.0,
            samples=seconds["triage"],
            note="met by the slowest repeat",
        ),
        Row(
            f"14 stop: SIGTERM to exit, {what}: its record temps being written",
            median(seconds["temps"]),
            "s",
            target="< 1 s",
            met=max(seconds["temps"]) < 1.0,
            samples=seconds["temps"],
            note=f"signalled at {n // 20:,} temps; met by the slowest repeat",
        ),
    ]


#: Measure 15: hostile ``produced_at`` texts, each the size of a file just under the limit.
HOSTILE_DATES: Final = {
    "'1:' repeated (V8 gives up at once)": ("1:", ""),
    "spaces": (" ", ""),
    "'(' repeated: one unclosed comment": ("(", ""),
    "'()' repeated inside a comment": ("()", "("),
    "'jan ' repeated: read to the end": ("jan ", ""),
    "'10:00 pm ' then 'pm ' repeated": ("pm ", "10:00 "),
    "'a ' repeated": ("a ", ""),
    "'()' repeated: four million comments": ("()", ""),
    "'x (jan) ' repeated: words between comments": ("x (jan) ", ""),
    "'2026 ' then 'Jan Feb Mar pm ' repeated": ("Jan Feb Mar pm ", "2026 "),
    "'a-' repeated: words glued to symbols": ("a-", ""),
    "'((((( )))))' repeated: comments five deep": ("((((( )))))", ""),
}
_NODE_DATE_TIMER: Final = """
const fs = require("fs");
const text = fs.readFileSync(process.argv[1], "utf-8");
let best = Infinity, value;
for (let i = 0; i < 5; i++) {
  const t = process.hrtime.bigint(); value = Date.parse(text.trim());
  best = Math.min(best, Number(process.hrtime.bigint() - t));
}
process.stdout.write(JSON.stringify({ns: best, value: Number.isNaN(value) ? null : value}));
"""


def measure_hostile_dates(c: Corpora, plan: Plan) -> list[Row]:
    """15. Time per byte of ``Date.parse`` on hostile 8 MB texts (issue 19 item 5): memstaged's
    parser in process, best of 3, against Node's own ``Date.parse`` of the same text, best of 5.
    Memory is not measured here: ``tests/test_bounds_hostile.py`` asserts it."""
    from memstaged.dateparse import parse

    err.print("[bold]15 hostile dates[/]")
    node = shutil.which("node") or shutil.which("nodejs")
    size = 8_000_000 if plan.n >= Plan().n else 800_000
    rows: list[Row] = []
    for label, (unit, head) in HOSTILE_DATES.items():
        text = head + unit * ((size - len(head)) // len(unit))
        samples = []
        for _ in range(3 if plan.repeat > 1 else 1):
            started = time.perf_counter()
            ours = parse(text.strip())
            samples.append((time.perf_counter() - started) * 1e9 / len(text))
        theirs_ns: float | None = None
        if node is not None:
            path = c.work / "hostile-date.txt"
            path.write_text(text, encoding="utf-8")
            done = subprocess.run(
                [node, "-e", _NODE_DATE_TIMER, str(path)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "TZ": "UTC"},
            )
            got = json.loads(done.stdout)
            theirs_ns = got["ns"] / len(text)
            path.unlink()
        best = min(samples)
        err.print(
            f"  {label}: memstaged {best:.2f} ns/byte ({ours}), node {fmt(theirs_ns)} ns/byte"
        )
        rows.append(
            Row(
                f"15 hostile dates: Date.parse of {size:,} bytes, {label}",
                best,
                "ns/byte",
                baseline="node Date.parse",
                ratio=None if not theirs_ns else best / theirs_ns,
                ratio_unit="x node",
                samples=samples,
                baseline_samples=[] if theirs_ns is None else [theirs_ns],
                note="best of the repeats; the text trimmed first, as the reconciler does",
            )
        )
    return rows + measure_hostile_records(c, size)


#: Measure 15, records: a file of invalid candidates (a lesson of 10 problems each, 48 bytes),
#: quarantined or split off by R4; one record per candidate (issue 19 item 5).
HOSTILE_RECORDS: Final = {"quarantined": "false", "split off by R4": "true"}


def _once_peak(box: Sandbox, memory_dir: Path, split: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB, from wait4) of one ``memstaged --once``."""
    env = {**box.env(), "MEMSTAGED_SPLIT_INVALID_CANDIDATES": split}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [PYTHON, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"memstaged --once exited {os.waitstatus_to_exitcode(status)}")
    return elapsed, int(usage.ru_maxrss)


def measure_hostile_records(c: Corpora, size: int) -> list[Row]:
    """15, records: time per byte and peak RSS of ``--once`` on a file of ``size`` bytes made of
    invalid candidates, each a record (the test asserts the memory bound; this says the time)."""
    rows: list[Row] = []
    bad = {"kind": "lesson", "triggers": [{}] * 6}
    valid = {"text": "t", "source_evidence": {"discussion_note_ids": [1]}}
    for label, split in HOSTILE_RECORDS.items():
        memory_dir = _memory_dir(c.work, "hostile-records")
        memory_dir.mkdir(parents=True, exist_ok=True)
        staging = empty_staging(memory_dir)
        with sandbox(c.work) as box:
            lessons: list[Any] = []
            doc: dict[str, Any] = {
                "schemaVersion": 1,
                "session_id": "hostile",
                "project_root": str(memory_dir.parents[2]),
                "produced_at": "2026-11-29T18:04:11.250Z",
                "candidates": {
                    "lessons": lessons,
                    "preferences": [valid],
                    "decisions": [],
                    "domain": [],
                },
            }
            (staging / "one.json").write_text(json.dumps(doc))
            _, baseline = _once_peak(box, memory_dir, split)
            lessons.extend([bad] * ((size - 300) // 49))
            data = json.dumps(doc, separators=(",", ":")).encode()
            (staging / "hostile.json").write_bytes(data)
            seconds, peak = _once_peak(box, memory_dir, split)
        shutil.rmtree(memory_dir.parents[2].parent, ignore_errors=True)
        count = len(lessons)
        multiple = (peak - baseline) * 1024 / len(data)
        err.print(
            f"  {count:,} invalid candidates, {label}: {seconds:.1f} s, "
            f"{seconds * 1e9 / len(data):.0f} ns/byte, {multiple:.1f}x its size"
        )
        rows.append(
            Row(
                f"15 hostile records: --once on {len(data):,} bytes, {count:,} invalid "
                f"candidates {label}",
                seconds * 1e9 / len(data),
                "ns/byte",
                note=f"{multiple:.1f} times the file's size in peak RSS above a small file's run",
            )
        )
    return rows


def run(plan: Plan, work: Path, only: set[str]) -> tuple[list[Row], dict[str, dict[str, float]]]:
    """Every selected measure; the rows, and how busy the machine was during each measure."""
    c = prepare(work, plan)
    pool: list[bytes] = []

    def startup_rows() -> list[Row]:
        rows, _startup = measure_startup(c, plan)
        return rows

    def need_pool() -> list[bytes]:
        if not pool:
            pool.extend(valid_pool(c))
        return pool

    steps: dict[str, Callable[[], list[Row]]] = {
        "startup": startup_rows,
        "backlog": lambda: measure_backlog(c, plan),
        "validate": lambda: measure_validate(c, plan),
        "steady": lambda: measure_steady(c, plan),
        "latency": lambda: measure_latency(c, plan, need_pool()),
        "burst": lambda: measure_burst(c, plan, need_pool()),
        "idle": lambda: measure_idle(c, plan),
        "memory": lambda: measure_memory(c, plan, need_pool()),
        "peer": lambda: measure_peer(c, plan),
        "perfile": lambda: measure_perfile(c, plan),
        "rss": lambda: measure_rss(c, plan),
        "inspection": lambda: measure_inspection(c, plan),
        "stop": lambda: measure_stop(c, plan),
        "hostile": lambda: measure_hostile_dates(c, plan),
    }
    rows: list[Row] = []
    conditions: dict[str, dict[str, float]] = {}
    for name, step in steps.items():
        if name not in only:
            continue
        before = Load.now()
        got = step()
        after = Load.now()
        other, steal = before.other_cores(after), before.steal_cores(after)
        conditions[name] = {
            "seconds": round(after.wall - before.wall, 1),
            "other_cores": round(other, 3),
            "steal_cores": round(steal, 3),
        }
        rows += got
    rows.sort(key=lambda r: int(r.measure.split(" ", 1)[0]))  # by measure number, stable
    return rows, conditions


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run memstaged's performance benchmark (issue #6).")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke run")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    p.add_argument("--seed", type=int, default=1, help="corpus seed (default 1)")
    p.add_argument("--repeat", type=int, help="repeats per measure (default 3, --quick 1)")
    p.add_argument("--idle", type=float, metavar="SECONDS", help="length of an idle window")
    p.add_argument(
        "--only",
        metavar="LIST",
        help=f"comma-separated measures to run (default all): {','.join(MEASURES)}",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        metavar="SECONDS",
        help="before each measured run, wait up to this long for other processes to go quiet "
        "(default 120, --quick 0)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        help="keep corpora here and reuse them next time (default: a temp dir, removed)",
    )
    args = p.parse_args(argv)
    plan = Plan.quick(args.seed) if args.quick else Plan(seed=args.seed)
    if args.repeat is not None:
        plan = Plan(**{**asdict(plan), "repeat": args.repeat})
    if args.idle is not None:
        plan = Plan(**{**asdict(plan), "idle_seconds": args.idle})
    global QUIET_WAIT  # noqa: PLW0603 - one setting, read by every measure
    QUIET_WAIT = args.quiet_wait if args.quiet_wait is not None else 0.0 if args.quick else 120.0
    only = set(MEASURES) if not args.only else set(args.only.split(","))
    unknown = only - set(MEASURES)
    if unknown:
        p.error(f"unknown measures: {', '.join(sorted(unknown))}")
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        work = args.workdir.resolve()
    else:
        work = Path(tempfile.mkdtemp(prefix="memstaged-bench-"))
    _compile_package()  # every measure runs memstaged as installed: its bytecode compiled
    info = machine()
    started = time.time()

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds the finally blocks: daemons stop, dirs go

    signal.signal(signal.SIGTERM, terminate)
    try:
        rows, conditions = run(plan, work, only)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    code_after = code_digest()
    if code_after != info["code"]:
        info["code_after"] = code_after
        err.print(
            f"[yellow]memstaged/ changed during the run (code {info['code']} -> {code_after}): "
            "measures may have run different code[/]"
        )
    title = (
        f"memstaged benchmark{' (quick)' if args.quick else ''}: medians of {plan.repeat} "
        f"(start-up {plan.startup_repeat}); {info['cores']} cores, Python {info['python']}; "
        f"{info['commit']}, code {info['code']}"
    )
    if args.json is not None:
        body = {
            "machine": info,
            "plan": asdict(plan),
            "started": datetime.fromtimestamp(started).astimezone().isoformat(),
            "seconds": round(time.time() - started, 1),
            "conditions": conditions,
            "rows": [asdict(r) for r in rows],
            "details": DETAILS,
        }
        args.json.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    out = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    out.print(render(rows, title))
    for r in rows:
        if r.note:
            out.print(f"[dim]{r.measure}: {r.note}[/]")
    out.print("[dim]CPU used by other processes during each measure (cores, average):[/]")
    out.print(
        "[dim]  "
        + ", ".join(f"{k} {v['other_cores']:.2f}" for k, v in conditions.items())
        + f" (quiet: < {QUIET_CORES})[/]"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
