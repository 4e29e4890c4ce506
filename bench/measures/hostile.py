"""15. ``Date.parse`` of hostile ``produced_at`` texts, per byte, against Node's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Final

from harness import (
    PYTHON,
    Corpora,
    Plan,
    Row,
    Sandbox,
    _memory_dir,
    empty_staging,
    err,
    fmt,
    sandbox,
)


def measure_hostile_dates(c: Corpora, plan: Plan) -> list[Row]:
    """15. Time per byte of ``Date.parse`` on hostile 8 MB texts (issue 19 item 5): memstaged's
    parser in process, best of 3, against Node's own ``Date.parse`` of the same text, best of 5.
    Memory is not measured here: ``tests/system/test_bounds.py`` asserts it."""
    from memstaged.core.js.date_parse import parse

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
