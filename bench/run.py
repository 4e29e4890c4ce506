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
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Final

import harness
from harness import (
    DETAILS,
    QUIET_CORES,
    Load,
    Plan,
    Row,
    _compile_package,
    code_digest,
    err,
    machine,
    prepare,
    render,
    valid_pool,
)
from measures.backlog import measure_backlog, measure_steady, measure_validate
from measures.daemon import measure_burst, measure_idle, measure_latency, measure_memory
from measures.growth import measure_growth, measure_pool_start, measure_scan
from measures.hostile import measure_hostile_dates
from measures.jspeer import measure_peer
from measures.perfile import measure_perfile, measure_rss
from measures.reading import measure_inspection
from measures.startup import measure_startup
from measures.stop import measure_stop
from rich.console import Console

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
    "growth",
    "scan",
    "deciders",
)


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
        "growth": lambda: measure_growth(c, plan),
        "scan": lambda: measure_scan(c, plan),
        "deciders": lambda: measure_pool_start(c, plan),
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
    harness.QUIET_WAIT = (
        args.quiet_wait if args.quiet_wait is not None else 0.0 if args.quick else 120.0
    )
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
