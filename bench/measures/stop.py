"""14. SIGTERM during a large quarantine (issue 10): time from the signal to the exit."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Final

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
from harness import (
    Corpora,
    Plan,
    Row,
    _memory_dir,
    daemon,
    err,
    median,
    sandbox,
    wait_quiet,
)


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


#: Candidates of measure 14's file: each an empty lesson, so each is a record (SPEC 4).
STOP_CANDIDATES: Final = 100_000
