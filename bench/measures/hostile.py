"""15. ``Date.parse`` of hostile ``produced_at`` texts, per byte, against Node's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Final

from harness import (
    Corpora,
    Plan,
    Row,
    err,
    fmt,
)


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
