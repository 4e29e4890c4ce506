"""9. The backlog against the JavaScript peer (issue 14): same work, durable, rounds in turn."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
import peer
from harness import (
    DETAILS,
    ONCE_CPU,
    Corpora,
    Plan,
    Row,
    _corpus,
    _memory_dir,
    children_cpu,
    err,
    fmt,
    median,
    paired,
    run_once,
    sandbox,
    wait_quiet,
)


# ---------------------------------------------------------------------------- issue 14
@dataclass(frozen=True)
class PeerCorpus:
    """Two identical copies of issue 14's corpus: one for the JavaScript peer, one for memstaged.

    Both runs are told the same project root (the copies live in different directories), so the
    same bytes get the same decisions and the outcomes can be compared file by file.
    """

    node_dir: Path
    memstaged_dir: Path
    project_root: str
    manifest: corpus.Manifest


def peer_corpus(c: Corpora, plan: Plan) -> PeerCorpus:
    """Generate (or reuse) the peer corpus, and copy it for memstaged."""
    node_dir = _memory_dir(c.work, "peer-node")
    mem_dir = _memory_dir(c.work, "peer-memstaged")
    m = _corpus(node_dir, plan.peer_n, plan.seed + 13, (0.7, 0.2, 0.1), corpus.PEER_CORPUS)
    try:
        same = corpus.Manifest.load(mem_dir) == m
    except FileNotFoundError:
        same = False
    if same:
        corpus.reset(mem_dir)
    else:
        peer.copy_corpus(node_dir, mem_dir)
    return PeerCorpus(node_dir, mem_dir, m.project_root, m)


def measure_peer(c: Corpora, plan: Plan) -> list[Row]:
    """9. ``memstaged --once`` (durable) against the JavaScript peer, on identical copies.

    Rounds alternate which of the two goes first; each round checks that both did the same work.
    ``--once --dry-run`` is timed too: what deciding costs without carrying anything out.
    """
    err.print("[bold]9 JavaScript peer[/]")
    node = shutil.which("node")
    version = peer.node_version(node) if node else None
    if node is None or version is None:
        reason = "skipped: node is not on PATH (the peer is a Node 20 script)"
        err.print(f"  [yellow]{reason}[/]")
        return [Row("9 backlog vs JS peer", None, "s", note=reason)]
    pc = peer_corpus(c, plan)
    n = len(pc.manifest.files)
    size = sum(e.size for e in pc.manifest.files)
    records = sum(e.records for e in pc.manifest.files)
    err.print(f"  {n:,} files, {size / 1e6:.1f} MB, {records:,} records expected; node {version}")
    root = ["--project-root", pc.project_root]
    wall: dict[str, list[float]] = {"peer": [], "memstaged": [], "dry-run": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    problems: list[str] = []
    summary = ""
    env = peer.node_env()
    for r in range(plan.peer_repeat):
        corpus.reset(pc.node_dir)
        corpus.reset(pc.memstaged_dir)
        order = ["peer", "memstaged"] if r % 2 == 0 else ["memstaged", "peer"]
        for who in [*order, "dry-run"]:
            if who == "dry-run":
                corpus.reset(pc.memstaged_dir)
            wait_quiet(who)
            cpu0 = children_cpu()
            if who == "peer":
                t0 = time.perf_counter()
                counts = peer.run_peer(node, pc.node_dir, pc.project_root, env)
                elapsed = time.perf_counter() - t0
            else:
                extra = [*root, "--dry-run"] if who == "dry-run" else root
                with sandbox(c.work) as box:
                    elapsed, _ = run_once(box, pc.memstaged_dir, extra)
                ONCE_CPU.pop()  # counted below, with the peer's
            wall[who].append(elapsed)
            cpu[who].append(children_cpu() - cpu0)
            if who != "dry-run" and who == order[-1]:
                ours, theirs = peer.outcome(pc.memstaged_dir), peer.outcome(pc.node_dir)
                problems += peer.differences(ours, theirs, "memstaged", "the peer")
                summary = f"memstaged: {ours.summary()}; peer: {theirs.summary()}"
        err.print(
            f"  [{r + 1}/{plan.peer_repeat}] "
            + ", ".join(f"{k} {wall[k][-1]:.3f} s (CPU {cpu[k][-1]:.2f} s)" for k in wall)
        )
    if counts.get("records") != records:
        problems.append(f"the peer wrote {counts.get('records')} records, the corpus has {records}")
    problems = sorted(set(problems))
    for p in problems:
        err.print(f"  [red]{p}[/]")
    t_mem, t_peer, t_dry = (median(wall[k]) for k in ("memstaged", "peer", "dry-run"))
    c_mem, c_peer, c_dry = (median(cpu[k]) for k in ("memstaged", "peer", "dry-run"))
    ratio = paired(wall["memstaged"], wall["peer"])
    pairs = (wall["memstaged"], wall["peer"])
    DETAILS["peer"] = {
        "node": version,
        "files": n,
        "bytes": size,
        "records": records,
        "wall": wall,
        "cpu": cpu,
        "differences": problems,
        "outcome": summary,
    }
    label = f"{n:,} files, {size / 1e6:.0f} MB"
    return [
        Row(
            f"9 backlog vs JS peer: --once (durable), {label}",
            t_mem,
            "s",
            f"peer-loader.mjs (node {version}, no fsync): {fmt(t_peer)} s",
            ratio,
            "x peer time",
            "≤ 1.0x peer time",
            ratio <= 1.0,
            wall["memstaged"],
            "per round: " + ", ".join(f"{a / b:.2f}" for a, b in zip(*pairs, strict=True)),
            wall["peer"],
        ),
        Row(
            "9 backlog vs JS peer: CPU time",
            c_mem,
            "CPU s",
            f"peer: {fmt(c_peer)} CPU s",
            c_mem / c_peer,
            "x peer CPU",
            samples=cpu["memstaged"],
            baseline_samples=cpu["peer"],
        ),
        Row(
            "9 backlog vs JS peer: --once --dry-run",
            t_dry,
            "s",
            f"peer: {fmt(t_peer)} s",
            t_dry / t_peer,
            "x peer time",
            samples=wall["dry-run"],
            note=f"CPU {c_dry:.2f} s",
        ),
        Row(
            "9 backlog vs JS peer: same work",
            float(len(problems)),
            "differences",
            target="0",
            met=not problems,
            note="; ".join(problems) if problems else summary,
        ),
    ]
