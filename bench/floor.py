"""The I/O floors: what deciding a backlog costs when nothing is decided.

memstaged's time on a backlog is validation plus file system work; these scripts measure the file
system work alone, so that the ratio says how much of memstaged's time is its own. Both take each
file's kind from the corpus manifest and never look inside a file.

``floor`` performs the file operations of a decision with its durability, each file on its own:
read every file; for a repairable one write a temp file, fsync it, rename it over, fsync the
directory; for a malformed one write its original and one record per dead-letter record (the
file's bytes stand in for a record, which holds the whole parsed file), fsync each, fsync the
dead-letter directories, unlink the staging file and fsync ``staging/``. memstaged cannot do less
and stay crash-safe (SPEC 5), so memstaged/floor is its overhead factor.

``raw`` writes the same bytes with no per-file durability and no renames or unlinks, then calls
``os.sync()`` once: the cost of the bytes alone, which shows what the fsyncs themselves cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import corpus  # a sibling script: bench/ is on sys.path when these scripts run


def run_floor(memory_dir: Path, manifest: corpus.Manifest) -> None:
    """Do the file operations memstaged must do for this backlog, each file durable on its own."""
    staging = memory_dir / "staging"
    dl = memory_dir / "deadletter"
    originals = dl / "originals"
    originals.mkdir(parents=True, exist_ok=True)
    for e in manifest.files:
        path = staging / e.name
        data = path.read_bytes()
        if e.kind == "repairable":
            tmp = staging / f".floor-{e.name}.tmp"
            corpus.write_file(tmp, data, durable=True)
            tmp.replace(path)
            corpus.fsync_dir(staging)
        elif e.kind == "malformed":
            corpus.write_file(originals / e.name, data, durable=True)
            for i in range(e.records):
                corpus.write_file(dl / f"{path.stem}-{i}.json", data, durable=True)
            corpus.fsync_dir(originals)
            corpus.fsync_dir(dl)
            path.unlink()
            corpus.fsync_dir(staging)


def run_raw(memory_dir: Path, manifest: corpus.Manifest) -> None:
    """Read every file, write what ``run_floor`` writes to ``bench-raw/``, sync once at the end."""
    out = memory_dir / "bench-raw"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for e in manifest.files:
        data = (memory_dir / "staging" / e.name).read_bytes()
        if e.kind == "repairable":
            corpus.write_file(out / e.name, data, durable=False)
        elif e.kind == "malformed":
            corpus.write_file(out / f"{e.name}.orig", data, durable=False)
            for i in range(e.records):
                corpus.write_file(out / f"{e.name}-{i}", data, durable=False)
    os.sync()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: time the floor (or raw) on a corpus made by corpus.py."""
    p = argparse.ArgumentParser(description="Time the I/O floor of a memstaged backlog.")
    p.add_argument("memory_dir", type=Path, help="a memory dir made by corpus.py")
    p.add_argument("--raw", action="store_true", help="same bytes, one os.sync() at the end")
    p.add_argument("--repeat", type=int, default=3, help="runs (each on a reset backlog)")
    args = p.parse_args(argv)
    manifest = corpus.Manifest.load(args.memory_dir)
    fn = run_raw if args.raw else run_floor
    times = corpus.measure(args.memory_dir, lambda: fn(args.memory_dir, manifest), args.repeat)
    median = sorted(times)[len(times) // 2]
    n = len(manifest.files)
    written = sum(
        e.size * (1 if e.kind == "repairable" else 1 + e.records)
        for e in manifest.files
        if e.kind != "valid"
    )
    print(
        f"{'raw' if args.raw else 'floor'}: {n} files, {written / 1e6:.1f} MB written, "
        f"median {median:.3f} s, {n / median:,.0f} files/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
