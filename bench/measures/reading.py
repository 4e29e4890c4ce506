"""13. Inspection (issue 13): ``log`` and ``deadletter list`` throughput."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Final

from harness import (
    DETAILS,
    PYTHON,
    Corpora,
    Plan,
    Row,
    err,
    sandbox,
    wait_quiet,
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
    rows.append(_ids_row(got))
    return rows


def _ids_row(got: dict[str, object]) -> Row:
    """``deadletter ids`` on 10,000 records: a Tab press's wait, in wall milliseconds."""
    value = got.get("deadletter_ids_wall_ms")
    records = got.get("deadletter_ids_records", IDS_RECORDS)
    label = f"13 inspection: deadletter ids, {records:,} records"
    if not isinstance(value, int | float):
        return Row(label, None, "ms", note="deadletter_ids_wall_ms missing from inspection.py")
    samples = got.get("deadletter_ids_wall_samples_ms")
    return Row(
        label,
        float(value),
        "ms",
        target=f"< {IDS_TARGET_MS:.0f} ms (a keypress)",
        met=value < IDS_TARGET_MS,
        samples=[float(x) for x in samples] if isinstance(samples, list) else [],
        note=(
            f"wall, the whole command (start-up included: measure 8); CPU "
            f"{got.get('deadletter_ids_cpu_ms')} ms; an empty store "
            f"{got.get('deadletter_ids_empty_wall_ms')} ms"
        ),
    )


INSPECTION: Final = Path(__file__).resolve().parent.parent / "inspection.py"  # bench/
#: bench/inspection.py's figures and their targets (issue 13/14: the inspection commands).
INSPECTION_TARGETS: Final = (
    ("log_pipe_events_per_s", "log to a pipe", 100_000.0, "events/s"),
    ("log_tty_events_per_s", "log to a terminal", 20_000.0, "events/s"),
    ("deadletter_list_records_per_s", "deadletter list", 20_000.0, "records/s"),
)
#: ``deadletter ids`` (a Tab press after ``deadletter show``, issue 22 item 7): its target.
IDS_TARGET_MS: Final = 100.0
IDS_RECORDS: Final = 10_000
