"""Where memstaged's fixed and per-file costs go (issue 14): imports, system calls, memory.

The measures of ``run.py`` say how long things take; these helpers say what the time and memory
are made of, so that the lead can cut them:

- :func:`importtime`: ``python -X importtime`` of one command, as (module, self, cumulative);
- :func:`strace_counts`: ``strace -f -c`` of one command, as calls per system call;
- :func:`rss_of`: the resident memory of a fresh interpreter after some code ran (an import, a
  started watchdog observer), for the daemon's memory breakdown.

Nothing here times memstaged's work itself: each function runs one subprocess and parses what it
prints.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PYTHON: Final = sys.executable
_IMPORT_LINE: Final = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)\s*$")


@dataclass(frozen=True)
class Imported:
    """One line of ``-X importtime``: a module, its own and its cumulative import time."""

    module: str
    self_ms: float
    cumulative_ms: float
    depth: int  # 0 for a module imported by the program itself, 1 for one it imported, ...


def importtime(args: Sequence[str], env: dict[str, str], cwd: Path | None = None) -> list[Imported]:
    """``python -X importtime ARGS``: every import, in the order the interpreter finished them."""
    proc = subprocess.run(
        [PYTHON, "-X", "importtime", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    out: list[Imported] = []
    for line in proc.stderr.decode(errors="replace").splitlines():
        m = _IMPORT_LINE.match(line)
        if m:
            depth = (len(m.group(3)) - 1) // 2
            out.append(Imported(m.group(4), int(m.group(1)) / 1000, int(m.group(2)) / 1000, depth))
    return out


def importtime_min(
    args: Sequence[str], env: dict[str, str], runs: int, cwd: Path | None = None
) -> list[Imported]:
    """:func:`importtime` ``runs`` times; each module's least self and cumulative time.

    One run's figures move with whatever else the machine does; the least of several is the
    closest to what the import itself costs (the order and depths are the first run's).
    """
    results = [importtime(args, env, cwd) for _ in range(max(runs, 1))]
    best: dict[str, tuple[float, float]] = {}
    for entries in results:
        for e in entries:
            old = best.get(e.module, (e.self_ms, e.cumulative_ms))
            best[e.module] = (min(old[0], e.self_ms), min(old[1], e.cumulative_ms))
    return [Imported(e.module, best[e.module][0], best[e.module][1], e.depth) for e in results[0]]


def top_imports(entries: Sequence[Imported], n: int = 10, min_depth: int = 0) -> list[Imported]:
    """The ``n`` costliest imports by cumulative time, at ``min_depth`` or deeper.

    A package's cumulative time includes what it imports, so a chain (``memstaged.log.writer`` ->
    ``structlog`` -> ``structlog.dev``) shows as several lines; that is the point: it says which
    import brings which cost in.
    """
    ranked = sorted((e for e in entries if e.depth >= min_depth), key=lambda e: -e.cumulative_ms)
    return ranked[:n]


def total_import_ms(entries: Sequence[Imported]) -> float:
    """Time of every import together: the sum of the outermost imports' cumulative times."""
    return sum(e.cumulative_ms for e in entries if e.depth == 0)


def strace_path() -> str | None:
    """The ``strace`` binary, or None: the syscall counts are then skipped with a reason."""
    return shutil.which("strace")


def strace_counts(strace: str, cmd: Sequence[str], env: dict[str, str]) -> tuple[Counter[str], int]:
    """``strace -f -c CMD``: calls per system call (all threads), and the command's exit code."""
    with tempfile.NamedTemporaryFile(prefix="strace-", suffix=".txt", delete=False) as fh:
        report = Path(fh.name)
    try:
        proc = subprocess.run(
            [strace, "-f", "-c", "-o", str(report), *cmd],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return parse_strace_summary(report.read_text()), proc.returncode
    finally:
        report.unlink(missing_ok=True)


def parse_strace_summary(text: str) -> Counter[str]:
    """The ``calls`` column of ``strace -c``'s table, per system call (the total line left out).

    Columns: ``% time, seconds, usecs/call, calls, [errors], syscall``; the errors column is blank
    for calls that never failed, so a row has five or six fields.
    """
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) not in (5, 6) or not fields[0][0].isdigit() or fields[-1] == "total":
            continue
        try:
            counts[fields[-1]] = int(fields[3])
        except ValueError:
            continue
    return counts


def per_file(counts: Counter[str], baseline: Counter[str], files: int) -> dict[str, float]:
    """``(counts - baseline) / files`` per system call, where that is not zero, largest first."""
    out = {k: (counts[k] - baseline.get(k, 0)) / files for k in counts.keys() | baseline.keys()}
    return dict(sorted(((k, v) for k, v in out.items() if abs(v) >= 0.005), key=lambda kv: -kv[1]))


_RSS_SNIPPET: Final = """
import threading
def _status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
print(_status("VmRSS"), threading.active_count())
"""


def rss_of(code: str, env: dict[str, str]) -> tuple[float, int]:
    """VmRSS (MB) and thread count of a fresh interpreter once ``code`` has run."""
    proc = subprocess.run(
        [PYTHON, "-c", code + "\n" + _RSS_SNIPPET],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=True,
    )
    kb, threads = proc.stdout.split()[-2:]
    return int(kb) / 1024, int(threads)


def observer_code(dirs: Sequence[Path], watches_per_dir: int = 2) -> str:
    """Code that starts one watchdog inotify observer with the daemon's watches on ``dirs``.

    As ``memstaged.daemon.watcher`` does: one ``InotifyObserver(generate_full_events=True)`` and two
    watches per memory dir (the memory dir and its ``staging/``), each its own emitter thread.
    """
    paths = []
    for d in dirs:
        paths.append(str(d))
        if watches_per_dir > 1:
            paths.append(str(d / "staging"))
    return (
        "import time\n"
        "from watchdog.events import FileSystemEventHandler\n"
        "from watchdog.observers.inotify import InotifyObserver\n"
        "obs = InotifyObserver(generate_full_events=True)\n"
        "handler = FileSystemEventHandler()\n"
        f"for p in {paths!r}:\n"
        "    obs.schedule(handler, p)\n"
        "obs.start()\n"
        "time.sleep(0.5)\n"
    )


def make_memory_dirs(parent: Path, n: int) -> list[Path]:
    """``n`` empty memory dirs (``pNN/proj/.pi/memory/project/staging``) under ``parent``."""
    out = []
    for i in range(n):
        mdir = parent / f"p{i:02d}" / "proj" / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True, exist_ok=True)
        out.append(mdir)
    return out
