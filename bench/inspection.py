"""Throughput of the inspection commands (issue 13: ``make bench`` reports them).

Targets: ``memstaged log`` at 100,000 events/s into a pipe and 20,000 events/s on a terminal,
``memstaged deadletter list`` at 20,000 records/s. Run as ``python bench/inspection.py`` (``run.py``
runs it as measure 13, in a sandbox); it prints one JSON object on stdout.

What is measured, and how:

- The data is real memstaged output, multiplied. ``--once`` decides a copy of
  ``examples/memory-dir`` (valid, repaired, quarantined and foreign files); its decision events
  are repeated, each with its own path and a timestamp a millisecond after the last, into a log
  of ``--events`` lines, and its dead-letter records are cloned under new names (each its own
  session and ``decided_at``) into a store of ``--records`` records.
- Each command runs as a user runs it (``python -m memstaged``, a subprocess), ``--no-pager``:
  into a pipe that this script drains, or on a pseudo-terminal (80x24, colour on, as ``auto``
  gives on a terminal) whose controller side it drains. A pager would stop at the first screen.
- The figure is the command's marginal rate in CPU time: items / (CPU seconds, user + system
  from ``wait4``, on the big input - the same on an empty one), so the interpreter's start-up
  (measure 8's subject) is not counted in every item, and other processes on a shared machine do
  not count either. The same in wall-clock time (``*_wall_per_s``) and the whole command's
  rate (``*_whole_per_s``) are in the output too. Median of ``--repeat`` runs, taken in turn.
- ``memstaged deadletter ids`` (what a Tab press after ``deadletter show`` runs, issue 22 item
  7) on a store of ``--ids-records`` (10,000) records, into a pipe: the whole command's wall
  time, start-up included (a person waits for all of it), median of ``IDS_RUNS`` runs per
  repeat, beside the same on an empty store. Target: under 100 ms, a keypress.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

REPO: Final = Path(__file__).resolve().parent.parent
EXAMPLES: Final = REPO / "examples" / "memory-dir"
TARGETS: Final = {
    "log_pipe_events_per_s": 100_000.0,
    "log_tty_events_per_s": 20_000.0,
    "deadletter_list_records_per_s": 20_000.0,
}
#: ``deadletter ids`` must answer within a keypress (issue 22 item 7), in milliseconds of wall.
IDS_TARGET_MS: Final = 100.0
#: Runs of ``deadletter ids`` per repeat: one is a fraction of a second, its median needs several.
IDS_RUNS: Final = 5


def memstaged(*args: str) -> list[str]:
    return [sys.executable, "-m", "memstaged", *args]


def _env(log_file: Path, home: Path) -> dict[str, str]:
    """The caller's environment pointed at this run's log, pager off, and ``HOME`` and the XDG
    dirs in ``home``: run on its own (not in run.py's sandbox), the seed ``--once`` wrote its
    seen cache into the real ``~/.local/state/memstaged`` (issue 19 item 9)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    for name in ("NO_COLOR", "PAGER", "JOURNAL_STREAM", "INVOCATION_ID", "NOTIFY_SOCKET"):
        env.pop(name, None)
    env["HOME"] = str(home / "home")
    for name, sub in (
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_STATE_HOME", ".local/state"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_CACHE_HOME", ".cache"),
    ):
        env[name] = str(home / "home" / sub)
    env["MEMSTAGED_LOG_FILE"] = str(log_file)
    env["TERM"] = "xterm-256color"
    return env


# ---------------------------------------------------------------------------- the data
def seed(work: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A memory dir decided by ``--once`` from the examples; its memory dir and decision events."""
    project = work / "example-project"
    mdir = project / ".pi" / "memory" / "project"
    mdir.parent.mkdir(parents=True)
    shutil.copytree(EXAMPLES, mdir)
    log = work / "seed.jsonl"
    for path in (mdir / "staging").iterdir():
        os.utime(path, (1_700_000_000, 1_700_000_000))  # settled: nothing is deferred
    subprocess.run(
        memstaged("--once", "--memory-dir", str(mdir)),
        env=_env(log, work),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
    )
    events = [json.loads(line) for line in log.read_bytes().splitlines()]
    decisions = [e for e in events if e.get("event") == "decision"]
    if not decisions:
        raise SystemExit("inspection: the seed run logged no decision")
    return mdir, decisions


def write_log(path: Path, decisions: Sequence[dict[str, Any]], count: int) -> None:
    """``count`` decision events, the seed's in turn, each its own file and millisecond."""
    start = time.time() - count / 1000 - 60
    with path.open("w", encoding="utf-8") as fh:
        for i in range(count):
            event = dict(decisions[i % len(decisions)])
            staging = os.path.dirname(str(event["path"]))
            event["path"] = f"{staging}/session-{i:07d}.json"
            event["session_id"] = f"session-{i:07d}"
            stamp = start + i / 1000
            event["timestamp"] = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp))
                + f".{int(stamp % 1 * 1e6):06d}Z"
            )
            fh.write(json.dumps(event, separators=(",", ":")) + "\n")


def fill_store(mdir: Path, count: int) -> None:
    """Clone the seed's dead-letter records until ``deadletter/`` holds ``count`` records."""
    deadletter = mdir / "deadletter"
    seeds = sorted(p for p in deadletter.iterdir() if p.is_file())
    if not seeds:
        raise SystemExit("inspection: the seed run dead-lettered nothing")
    bodies = [json.loads(p.read_bytes()) for p in seeds]
    for i in range(count - len(seeds)):
        record = json.loads(json.dumps(bodies[i % len(bodies)]))
        record["session_id"] = f"session-{i:07d}"
        record["memstaged"]["decided_at"] = f"2026-11-30T10:{i // 60_000 % 60:02d}:00.000Z"
        name = f"session-{i:07d}-{i:016x}-{record['category']}-0.json"
        (deadletter / name).write_text(json.dumps(record, separators=(",", ":")) + "\n")


# ---------------------------------------------------------------------------- running
class Ran(NamedTuple):
    wall: float
    cpu: float
    lines: int


def _reap(proc: subprocess.Popen[bytes], started: float, lines: int, cmd: Sequence[str]) -> Ran:
    """Wait for ``proc`` with ``wait4``: its wall time, its CPU time, the lines it printed."""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"inspection: {' '.join(cmd[2:])} exited {proc.returncode}")
    return Ran(wall, usage.ru_utime + usage.ru_stime, lines)


def to_pipe(cmd: Sequence[str], env: dict[str, str]) -> Ran:
    """The command writing into a pipe drained as fast as it fills."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    lines = 0
    while chunk := proc.stdout.read(1 << 16):
        lines += chunk.count(b"\n")
    return _reap(proc, started, lines, cmd)


def on_tty(cmd: Sequence[str], env: dict[str, str]) -> Ran:
    """The same on a pseudo-terminal of 80x24, whose controller side is drained."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.DEVNULL
    )
    os.close(terminal)
    lines = 0
    while True:
        ready, _, _ = select.select([controller], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(controller, 1 << 16)
            except OSError:  # EIO: every holder of the terminal side is gone
                break
            if not chunk:
                break
            lines += chunk.count(b"\n")
        elif proc.poll() is not None:
            break
    os.close(controller)
    return _reap(proc, started, lines, cmd)


def copy_records(source: Path, mdir: Path) -> None:
    """A new memory dir whose ``deadletter/`` holds copies of ``source``'s seed records."""
    (mdir / "staging").mkdir(parents=True)
    (mdir / "deadletter").mkdir()
    for path in (source / "deadletter").iterdir():
        if path.is_file():
            shutil.copyfile(path, mdir / "deadletter" / path.name)


def ids_figures(records: int, big: list[Ran], empty: list[Ran]) -> dict[str, Any]:
    """``deadletter ids``' wall and CPU time in milliseconds (medians), and its samples."""
    ms = 1000.0
    return {
        "deadletter_ids_records": records,
        "deadletter_ids_wall_ms": round(statistics.median(r.wall for r in big) * ms, 1),
        "deadletter_ids_cpu_ms": round(statistics.median(r.cpu for r in big) * ms, 1),
        "deadletter_ids_empty_wall_ms": round(statistics.median(r.wall for r in empty) * ms, 1),
        "deadletter_ids_wall_samples_ms": [round(r.wall * ms, 1) for r in big],
        "deadletter_ids_lines": big[-1].lines,
        "deadletter_ids_target_ms": IDS_TARGET_MS,
    }


def rate(name: str, items: int, big: list[Ran], empty: list[Ran]) -> dict[str, Any]:
    """The marginal rates of one command (CPU, wall), with what they were computed from."""
    out: dict[str, Any] = {}
    for key, prefix in (("cpu", ""), ("wall", "wall_")):
        whole = statistics.median(getattr(r, key) for r in big)
        start = statistics.median(getattr(r, key) for r in empty)
        out[f"{name}_{prefix}per_s"] = round(items / max(whole - start, 1e-9))
        out[f"{name}_{prefix}whole_per_s"] = round(items / whole)
        out[f"{name}_{key}_seconds"] = round(whole, 4)
        out[f"{name}_{key}_startup_seconds"] = round(start, 4)
        out[f"{name}_{key}_samples"] = [round(getattr(r, key), 4) for r in big]
    out[f"{name}_lines"] = big[-1].lines
    return out


def ids_cmd(mdir: Path) -> list[str]:
    """What the completion scripts run for a Tab press after ``deadletter show``."""
    return memstaged("deadletter", "ids", "--memory-dir", str(mdir), "--", "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--events", type=int, default=200_000, help="log lines (200,000)")
    parser.add_argument("--records", type=int, default=40_000, help="dead-letter records")
    parser.add_argument("--repeat", type=int, help="runs of each command (3; --quick 1)")
    parser.add_argument(
        "--ids-records", type=int, default=10_000, help="records for deadletter ids (10,000)"
    )
    parser.add_argument("--quick", action="store_true", help="20,000 events, 4,000 records, 1 run")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.records = 20_000, 4_000
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="inspection-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        mdir, decisions = seed(work)
        big_log, empty_log = work / "big.jsonl", work / "empty.jsonl"
        write_log(big_log, decisions, args.events)
        empty_log.write_bytes(b"")
        empty_mdir = work / "empty-project" / ".pi" / "memory" / "project"
        (empty_mdir / "staging").mkdir(parents=True)
        ids_mdir = work / "ids-project" / ".pi" / "memory" / "project"
        copy_records(mdir, ids_mdir)  # before the big store is filled: the seed's records
        fill_store(mdir, args.records)
        fill_store(ids_mdir, args.ids_records)
        big_env, empty_env = _env(big_log, work), _env(empty_log, work)
        log_cmd = memstaged("log", "--no-pager")
        samples: dict[str, list[Ran]] = {}
        runs = {
            "log_pipe_events": (to_pipe, log_cmd, big_env, log_cmd, empty_env),
            "log_tty_events": (on_tty, log_cmd, big_env, log_cmd, empty_env),
            "deadletter_list_records": (
                to_pipe,
                memstaged("deadletter", "list", "--no-pager", "--memory-dir", str(mdir)),
                empty_env,
                memstaged("deadletter", "list", "--no-pager", "--memory-dir", str(empty_mdir)),
                empty_env,
            ),
            "deadletter_list_tty_records": (
                on_tty,
                memstaged("deadletter", "list", "--no-pager", "--memory-dir", str(mdir)),
                empty_env,
                memstaged("deadletter", "list", "--no-pager", "--memory-dir", str(empty_mdir)),
                empty_env,
            ),
        }
        for _ in range(args.repeat):  # in turn, so a busy moment slows every command alike
            for name, (how, cmd, env, empty_cmd, env0) in runs.items():
                samples.setdefault(name, []).append(how(cmd, env))
                samples.setdefault(name + "_empty", []).append(how(empty_cmd, env0))
            for _ in range(IDS_RUNS):
                samples.setdefault("ids", []).append(to_pipe(ids_cmd(ids_mdir), empty_env))
                samples.setdefault("ids_empty", []).append(to_pipe(ids_cmd(empty_mdir), empty_env))
        result: dict[str, Any] = {"events": args.events, "records": args.records}
        for name in runs:
            items = args.records if "records" in name else args.events
            result.update(rate(name, items, samples[name], samples[name + "_empty"]))
        result.update(ids_figures(args.ids_records, samples["ids"], samples["ids_empty"]))
        result["targets"] = TARGETS
    print(json.dumps(result))
    for key, target in TARGETS.items():
        wall = result[key.replace("_per_s", "_wall_per_s")]
        print(f"{key}: {result[key]:,} (target {target:,.0f}; wall: {wall:,})", file=sys.stderr)
    print(
        f"deadletter ids on {args.ids_records:,} records: {result['deadletter_ids_wall_ms']} ms"
        f" wall (target < {IDS_TARGET_MS:.0f}; empty store "
        f"{result['deadletter_ids_empty_wall_ms']} ms)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
