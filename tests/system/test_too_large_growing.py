"""Found by attacking the merged main: a staging file over max_file_size
that a writer is still appending to, with ``deadletter/`` on another file system (a real tmpfs
mount, so the move into ``originals/`` cannot be a rename and memstaged copies)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import reap


@pytest.fixture
def deadletter_on_tmpfs(memory_dir: Path) -> Iterator[Path]:
    """``<memory dir>/deadletter`` as a 64 MiB tmpfs mount (root only), unmounted afterwards."""
    deadletter = memory_dir / "deadletter"
    deadletter.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(deadletter)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield deadletter
    finally:
        subprocess.run(["umount", str(deadletter)], check=True)


def test_growing_too_large_file_loses_no_byte_when_deadletter_is_another_fs(
    tmp_path: Path, memory_dir: Path, deadletter_on_tmpfs: Path
) -> None:
    """SPEC 5 (incomplete writes; "memstaged must never lose a version that a writer put in
    place") and SPEC 6 (a too-large file is moved, or copied where a rename is impossible; "the
    writer check of section 5 still applies"): a writer appends 10 pieces of 300 KB, 0.5 s
    apart, to one staging file through one open descriptor (the file is never unchanged for the
    2 s settle interval) while the daemon (max_file_size 100 KB) runs. Afterwards the writer's
    complete bytes must be in staging/ or in deadletter/originals/. With deadletter/ on the same
    file system the rename keeps them all; across file systems a too-large file used to be
    decided at first sight, whatever its mtime: a partial copy was kept and the file removed
    under the writer. It now waits for the settle interval, as a file that does not parse does."""
    conf = tmp_path / "config.toml"
    conf.write_text(
        f"memory_dirs = [{json.dumps(str(memory_dir))}]\nmax_file_size = 100000\nsettle = 2.0\n"
    )
    log_file = tmp_path / "decisions.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(
        MEMSTAGED_LOG_FILE=str(log_file),
        XDG_CONFIG_HOME=str(tmp_path / "c"),
        XDG_STATE_HOME=str(tmp_path / "s"),
    )
    env.pop("NOTIFY_SOCKET", None)
    with (tmp_path / "daemon.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstaged", "--config", str(conf)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 30
        while not (log_file.exists() and b'"ready"' in log_file.read_bytes()):
            assert proc.poll() is None and time.monotonic() < deadline, "daemon not ready"
            time.sleep(0.02)
        written = b""
        with (memory_dir / "staging" / "grow.json").open("wb", buffering=0) as out:
            for _ in range(10):
                chunk = os.urandom(150_000).hex().encode()
                out.write(chunk)
                written += chunk
                time.sleep(0.5)  # a slow writer pauses between pieces, for less than settle
        deadline = time.monotonic() + 30
        while b'"decision":"quarantined"' not in log_file.read_bytes():
            assert time.monotonic() < deadline, "grow.json was never quarantined"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        reap(proc)
    kept = [
        p
        for d in (memory_dir / "staging", deadletter_on_tmpfs / "originals")
        for p in (d.iterdir() if d.is_dir() else [])
        if p.is_file() and p.read_bytes() == written
    ]
    sizes = {p.name: p.stat().st_size for p in (deadletter_on_tmpfs / "originals").iterdir()}
    assert kept, f"the writer wrote {len(written)} bytes; deadletter/originals/ holds {sizes}"
