"""Found by attacking the merged main: memstaged's bounds with real processes — the
descriptor limit and the reconciler's lock during a large quarantine. (SIGTERM while a large
file's records are written took 1.2-5.5 s here, but the figure depends on the disk's load too
much for a strict test.)"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import staging_doc


def _env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID", "WATCHDOG_USEC")
        and not k.startswith("MEMSTAGED_")
    }
    env.update(
        MEMSTAGED_LOG_FILE=str(tmp_path / "decisions.jsonl"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
        XDG_STATE_HOME=str(tmp_path / "xdg-state"),
    )
    return env


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    log_file = tmp_path / "decisions.jsonl"
    if not log_file.exists():
        return []
    lines = log_file.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def _wait_for(proc: subprocess.Popen[bytes], tmp_path: Path, event: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.get("event") == event for e in _events(tmp_path)):
        assert proc.poll() is None, f"the daemon exited ({proc.returncode}) before `{event}`"
        assert time.monotonic() < deadline, f"no `{event}` within {timeout} s"
        time.sleep(0.02)


def test_glob_beyond_the_hard_fd_limit_on_the_command_line_leaves_the_others_working(
    tmp_path: Path,
) -> None:
    """issue 10 item 11, SPEC 6 (bounded resources): the same glob that, in the config file,
    makes the daemon hold as many memory dirs as its descriptors allow and decide files there
    (tests/test_daemon_process.py), given as ``--memory-dir`` under ``ulimit -n 256`` (soft =
    hard) with 300 projects must do the same, not exit 2 deciding nothing in any of them."""
    src = tmp_path / "src"
    for i in range(300):
        (src / f"p{i:03d}" / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    pattern = str(src / "*" / ".pi" / "memory" / "project")
    with (tmp_path / "daemon.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstaged", "--memory-dir", pattern, "--settle", "0.1"],
            env=_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            preexec_fn=limit,  # noqa: PLW1509 - as a service manager or `ulimit -n` would
        )
    try:
        _wait_for(proc, tmp_path, "ready", 60)
        first = src / "p000"
        doc = json.dumps(staging_doc(first, "first")).encode()
        (first / ".pi" / "memory" / "project" / "staging" / "first.json").write_bytes(doc)
        deadline = time.monotonic() + 30
        while not [e for e in _events(tmp_path) if e.get("decision") == "valid"]:
            assert time.monotonic() < deadline, "first.json was never decided"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _empty_candidates_doc(project: Path, count: int) -> bytes:
    """A small file (3 bytes per candidate) whose every preference is ``{}``: one dead-letter
    record per candidate."""
    doc = staging_doc(project, "many", candidates={"preferences": [{}] * count})
    return json.dumps(doc, separators=(",", ":")).encode()


def _on_tmpfs(path: Path) -> bool:
    best, fstype = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if str(path).startswith(fields[1]) and len(fields[1]) > len(best):
            best, fstype = fields[1], fields[2]
    return fstype in ("tmpfs", "ramfs")


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="defect 2: canonical-writer.lock is held while every record of a file is written "
    "and fsynced, one by one (tens of seconds for 10,000 candidates)",
)
def test_reconciler_lock_is_not_held_through_a_whole_large_quarantine(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """SPEC 5: "No memstaged operation holds the lock for longer than about a second." A
    reconciler stand-in polls ``canonical-writer.lock`` while ``--once`` quarantines one 30 KB
    file of 10,000 empty candidates; the longest time it found the lock held continuously must
    stay near a second (the bound asserted is 5 s; the figure is printed). Skipped on tmpfs,
    where fsync costs nothing and the hold cannot be shown."""
    if _on_tmpfs(tmp_path):
        pytest.skip("tmp_path is on tmpfs: fsync is free there, a long hold cannot be shown")
    (memory_dir / "staging" / "many.json").write_bytes(_empty_candidates_doc(project, 10_000))
    lock = memory_dir / "canonical-writer.lock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir)],
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    longest = 0.0
    held_since: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if lock.exists():
            held_since = now if held_since is None else held_since
            longest = max(longest, now - held_since)
        else:
            held_since = None
        time.sleep(0.01)
    assert proc.returncode == 0
    assert len(list((memory_dir / "deadletter").glob("*.json"))) == 10_000
    print(f"canonical-writer.lock held for at most {longest:.2f} s in one stretch")
    assert longest < 5.0


def _peak_rss_kib(tmp_path: Path, memory_dir: Path) -> int:
    """Peak RSS of one ``memstaged --once`` on ``memory_dir`` (from wait4's rusage)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir)],
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return int(usage.ru_maxrss)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="defect 7: quarantining a 30 KB file of 10,000 empty candidates takes about 13 MiB "
    "more memory than a one-candidate file (over 400 times the file's size)",
)
def test_quarantine_memory_is_a_small_multiple_of_the_file_size(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """SPEC 4: "quarantining a file never needs memory beyond a small multiple of its size".
    The peak RSS of ``--once`` quarantining one 30 KB file of 10,000 empty candidates, less that
    of ``--once`` quarantining a one-candidate file, must stay under 32 times the big file's
    size (the figures are printed)."""
    staging = memory_dir / "staging"
    (staging / "one.json").write_bytes(_empty_candidates_doc(project, 1))
    baseline = _peak_rss_kib(tmp_path, memory_dir)
    data = _empty_candidates_doc(project, 10_000)
    (staging / "many.json").write_bytes(data)
    peak = _peak_rss_kib(tmp_path, memory_dir)
    assert not (staging / "many.json").exists()
    extra = (peak - baseline) * 1024
    print(f"{len(data)} bytes, 10,000 records: {extra / 2**20:.1f} MiB above the baseline")
    assert extra < 32 * len(data)
