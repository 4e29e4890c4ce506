"""The benchmark's breakdown helpers (``bench/costs.py``): they measure the right thing.

The benchmark's JavaScript peer, run for real beside memstaged, is in
``tests/system/test_bench_peer.py``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import costs  # noqa: E402 - bench/ scripts import each other as top-level modules


def test_strace_summary_is_read_per_call() -> None:
    """issue 14 item 3: the syscall counts come from strace -c's calls column, with or without
    an errors column, and the total line is not a system call."""
    text = (
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 40.00    0.000400           2       200        10 newfstatat\n"
        " 30.00    0.000300           1       300           openat\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.001000           2       500        10 total\n"
    )
    assert costs.parse_strace_summary(text) == {"newfstatat": 200, "openat": 300}
    base = costs.parse_strace_summary(text.replace("200", "100", 1))
    assert costs.per_file(costs.parse_strace_summary(text), base, 50) == {"newfstatat": 2.0}
