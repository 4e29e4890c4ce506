"""Resource use of a long-running daemon: memory, file descriptors, threads.

A daemon watches two memory dirs while files arrive steadily (every kind: valid, repairable,
malformed, foreign), rescans run every second and SIGHUP reloads the configuration every few
seconds. Its RSS, open file descriptors and threads are sampled from ``/proc``; at the end every
file must have its decision and the daemon must still answer at once.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from support.decision_log import read_events
from support.helpers import (
    KINDS,
    Input,
    check_final,
    corpus_file,
    daemon,
    fd_count,
    make_memory_dir,
    memstaged_env,
    proc_status,
    project_root_of,
    write_config,
)
from support.waiting import wait_for

SEED = int(os.environ.get("MEMSTAGED_TEST_SEED", random.randrange(1 << 30)))
#: Every kind but deep nesting: it runs in a thread with a 1 GiB stack (ecma.run_deep), whose
#: pages would measure the allocator rather than a leak.
SOAK_KINDS = tuple(k for k in KINDS if k != "deep")


def _arrivals(
    mdirs: list[Path], rate: float, stop: threading.Event, inputs: dict[Path, list[Input]]
) -> None:
    """A writer dropping ``rate`` files a second, round-robin over the memory dirs."""
    rng = random.Random(SEED)
    k = 0
    while not stop.is_set():
        mdir = mdirs[k % len(mdirs)]
        item = corpus_file(rng, f"soak{k}", project_root_of(mdir), kinds=SOAK_KINDS)
        tmp = mdir / "staging" / f".{item.name}.tmp"
        tmp.write_bytes(item.data)
        os.rename(tmp, mdir / "staging" / item.name)
        inputs[mdir].append(item)
        k += 1
        stop.wait(1 / rate)


def _soak(tmp_path: Path, seconds: float, rate: float) -> dict[str, float]:
    mdirs = [make_memory_dir(tmp_path / "a"), make_memory_dir(tmp_path / "b")]
    config = write_config(tmp_path / "config.toml", rescan_interval=1, settle=0.2)
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    inputs: dict[Path, list[Input]] = {m: [] for m in mdirs}
    stop = threading.Event()
    figures: dict[str, float] = {}
    with daemon(mdirs, env, "--config", str(config), stderr=tmp_path / "daemon.err") as proc:
        assert wait_for(
            lambda: any(e.get("event") == "ready" for e in read_events(log, strict=False)), 30
        )
        writer = threading.Thread(target=_arrivals, args=(mdirs, rate, stop, inputs))
        writer.start()
        try:
            time.sleep(min(3.0, seconds / 4))  # warm up: imports, first decisions, caches
            figures["rss_start_kib"] = proc_status(proc.pid, "VmRSS")
            figures["fds_start"] = fd_count(proc.pid)
            figures["threads_start"] = proc_status(proc.pid, "Threads")
            end = time.monotonic() + seconds
            reloads = 0
            peak_fds = figures["fds_start"]
            while time.monotonic() < end:
                time.sleep(0.5)
                assert proc.poll() is None, "the daemon died"
                peak_fds = max(peak_fds, fd_count(proc.pid))
                if int(time.monotonic() * 2) % 6 == 0:
                    proc.send_signal(signal.SIGHUP)
                    reloads += 1
        finally:
            stop.set()
            writer.join()
        all_inputs = [i for m in mdirs for i in inputs[m]]

        def finished() -> bool:
            return all(not check_final(m, inputs[m]) for m in mdirs)

        assert wait_for(finished, 60, interval=0.5), [check_final(m, inputs[m])[:5] for m in mdirs]
        time.sleep(1.5)  # a rescan or two with nothing to do
        figures["rss_end_kib"] = proc_status(proc.pid, "VmRSS")
        figures["fds_end"] = fd_count(proc.pid)
        figures["fds_peak"] = peak_fds
        figures["threads_end"] = proc_status(proc.pid, "Threads")
        figures["files"] = len(all_inputs)
        figures["reloads"] = reloads
        # Still answering at once after all of it.
        sentinel = corpus_file(random.Random(1), "sentinel", project_root_of(mdirs[0]))
        (mdirs[0] / "staging" / sentinel.name).write_bytes(sentinel.data)
        path = str(mdirs[0] / "staging" / sentinel.name)
        assert wait_for(
            lambda: any(e.get("path") == path for e in read_events(log, strict=False)), 60
        ), "the daemon no longer reacts"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    events = read_events(log, strict=False)
    figures["decisions"] = sum(1 for e in events if e.get("event") == "decision")
    figures["rescans"] = sum(1 for e in events if e.get("event") == "rescan")
    figures["reload_events"] = sum(1 for e in events if e.get("event") == "reload")
    errors = [e for e in events if e.get("level") == "error" or e.get("event") == "observer_died"]
    print(f"\nsoak (seed {SEED}, {seconds:.0f} s): {figures}")
    assert not errors, errors[:5]
    assert figures["threads_end"] == figures["threads_start"], "a thread died or leaked"
    assert figures["fds_end"] <= figures["fds_start"] + 2, "file descriptors leak"
    assert figures["reload_events"] >= 1 and figures["rescans"] >= 1
    assert "Traceback" not in (tmp_path / "daemon.err").read_text(errors="replace")
    return figures


def test_daemon_soak(tmp_path: Path) -> None:
    """20 s of steady arrivals (25 files/s over two memory dirs), rescans every second and
    SIGHUP reloads: every file is decided as SPEC says, RSS grows by less than 12 MiB, no file
    descriptor leaks, no thread dies or leaks, no error is logged, and the daemon still reacts
    at once."""
    figures = _soak(tmp_path, seconds=20, rate=25)
    assert figures["rss_end_kib"] - figures["rss_start_kib"] < 12 * 1024


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_daemon_soak_for_minutes(tmp_path: Path) -> None:
    """The same for 4 minutes at 40 files/s: RSS grows by less than 16 MiB."""
    figures = _soak(tmp_path, seconds=240, rate=40)
    assert figures["rss_end_kib"] - figures["rss_start_kib"] < 16 * 1024
