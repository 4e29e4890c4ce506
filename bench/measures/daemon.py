"""4-7. The daemon: latency at a paced rate, a burst of renames, idle cost, memory."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Sequence

from harness import (
    Corpora,
    Daemon,
    Decided,
    Plan,
    Row,
    _memory_dir,
    daemon,
    empty_staging,
    err,
    median,
    percentile,
    proc_cpu_seconds,
    proc_status_kb,
    proc_wakeups,
    sandbox,
    wait_quiet,
    write_incoming,
)


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
    """6. The daemon watching ``plan.idle_dirs`` empty memory dirs: CPU and wake-ups, with its
    metrics file and its control socket on (issue 23: idle stays at 0 with both)."""
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
    with sandbox(c.work) as box:
        metrics = box.root / "metrics" / "memstaged.prom"
        metrics.parent.mkdir()  # as node_exporter's textfile directory would be
        with daemon(box, dirs, plan.settle, {"MEMSTAGED_METRICS_FILE": str(metrics)}) as d:
            time.sleep(2.0)  # let start-up work finish
            socket = box.root / "runtime" / "memstaged" / f"daemon-{d.pid}.sock"
            on = [p.name for p in (metrics, socket) if p.exists()]
            err.print(f"  on: {', '.join(on) or 'neither the metrics file nor the socket'}")
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
                    f"  [{r + 1}/{plan.repeat}] {cpu[-1]:.3f} CPU s/min, "
                    f"{wakes[-1]:.0f} wake-ups/min, RSS {rss[-1]:.1f} MB"
                )
    shutil.rmtree(c.work / "idle", ignore_errors=True)
    window = f"{plan.idle_seconds:g} s windows; on: {', '.join(on) or 'none'}"
    both = len(on) == 2
    return [
        Row(
            f"6 idle: {plan.idle_dirs} memory dirs, CPU",
            median(cpu),
            "CPU s/min",
            target="< 0.1 s/min, metrics and socket on",
            met=median(cpu) < 0.1 and both,
            samples=cpu,
            note=window,
        ),
        Row(
            f"6 idle: {plan.idle_dirs} memory dirs, wake-ups",
            median(wakes),
            "switches/min",
            target="0, metrics and socket on",
            met=median(wakes) == 0 and both,
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
