"""10-12. System calls and CPU per decided file, by decision; the daemon's memory by part."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Final

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
import costs
import naive
import peer
from harness import (
    DETAILS,
    ONCE_CPU,
    PYTHON,
    Corpora,
    Plan,
    Row,
    _memory_dir,
    children_cpu,
    err,
    fmt,
    median,
    run_once,
    sandbox,
    wait_quiet,
)

from measures.jspeer import PeerCorpus, peer_corpus


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


#: The system calls per file of the peer corpus's mix, at most (issue 32), counted over the
#: whole ``--once`` (its decider processes included) less an empty one.
SYSCALLS_TARGET: Final = 14


def syscall_floor(decision: str, records: float) -> float:
    """The system calls SPEC's rules need per decided file, as memstaged makes them
    (docs/performance.md, "The floor of the calls SPEC's rules need").

    valid: the ``lstat`` before the open, open, fstat, read, close. repaired: those, the read
    lease and its check, the version's ``lstat`` under the lock, the rewrite's temp (open,
    write, its rename once durable, close), the temp's ``lstat`` and its descriptor's
    ``fstat`` (still the temp written) and the name's ``lstat`` before the exchange, the
    exchange, ``lstat`` and ``pread`` of what it displaced, its unlink, and the
    look at the rewrite (``lstat``, ``pread``). quarantined: the five, the lease and its check,
    step 1's ``lstat``, four calls per dead-letter file (open, write, close, rename: the
    records and the original), the name's ``lstat``, its rename away, ``lstat`` and ``pread``
    of what moved, its unlink. Shared calls (syncfs, directory fsyncs, the lock, the log, the
    hand-overs to the deciders) are spread over a batch and left out.
    """
    if decision == "valid":
        return 5
    if decision == "repaired":
        return 21
    return 13 + 4 * (records + 1)


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
        per_file = (total - sum(base.values())) / n_all
        rows.append(
            Row(
                "10 syscalls per file: the peer corpus, minus an empty --once",
                per_file,
                "calls/file",
                f"JS peer, its whole run: {peer_total / n_all:.1f} calls/file"
                if peer_total
                else "JS peer: node not found",
                None,
                "",
                f"≤ {SYSCALLS_TARGET} calls/file",
                per_file <= SYSCALLS_TARGET,
                note="strace -f -c of the whole run, its decider processes included",
            )
        )
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
                    f"SPEC's rules need about {floor_calls:.0f}",
                    value / floor_calls,
                    "x SPEC's floor",
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
    ("import memstaged.core.decide", "import memstaged.core.decide"),
    ("import memstaged.log.writer", "import memstaged.log.writer"),
    ("import memstaged.cli.main", "import memstaged.cli.main"),
    ("import memstaged.run.once", "import memstaged.run.once"),
    ("import memstaged.daemon.watcher", "import memstaged.daemon.watcher"),
    ("import memstaged.daemon.loop", "import memstaged.daemon.loop"),
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
