"""1-3. The backlog (``--once``) against the I/O floor, raw writes and ``naive.run``; validation
alone; the steady state of decided files."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
import floor
import naive
from harness import (
    ONCE_CPU,
    Corpora,
    Plan,
    Row,
    err,
    fmt,
    median,
    paired,
    run_once,
    sandbox,
    summary_counts,
    wait_quiet,
)


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
    from memstaged.core.decide import Context, decide

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


#: Steady state: runs on the decided files and on the empty memory dir, in turn, per repeat.
STEADY_PAIRS: Final = 7
