"""Issue 19 item 6: the decision log rotated by several processes at once loses no event.

Real processes share one log: the daemon deciding files as they arrive, several ``--once`` runs
on other memory dirs, and a hostile rotator (``log_rotator.py``) that rotates the log as fast as
it can under the same lock memstaged takes, keeping one backup, but archiving every file it
rotates out. So an event written into a file while the path still named it is found at the
end (in the log, its backups or the archive); one written into a file already rotated away
and deleted is not, which is what the daemon did for up to a second after such rotations.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from support.documents import lesson, staging_doc, write
from support.helpers import (
    REPO,
    daemon,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    write_config,
)

OLD = 1_700_000_000
ONCE_RUNS = 4
ONCE_FILES = 150
DAEMON_FILES = 60


def _lines(paths: list[Path]) -> list[bytes]:
    return [line for path in paths for line in path.read_bytes().splitlines() if line.strip()]


def test_no_event_is_lost_or_split_when_processes_rotate_the_shared_log(tmp_path: Path) -> None:
    """Issue 19 item 6: the daemon repairs files while ``--once`` runs and a hostile rotator
    rotate the shared log (dozens of rotations, one backup): every decision of every process
    is found exactly once in what is left plus what was archived as it was rotated out, and
    every line is one whole JSON event."""
    log = tmp_path / "log" / "decisions.jsonl"
    log.parent.mkdir()
    # memstaged rotates too (small files, backups enough that none of its own is deleted).
    config = write_config(tmp_path / "config.toml", log_max_bytes=32768, log_backups=200)
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log))
    watched = make_memory_dir(tmp_path / "daemon")
    others = [make_memory_dir(tmp_path / f"once-{i}") for i in range(ONCE_RUNS)]
    for mdir in others:
        root = project_root_of(mdir)
        for j in range(ONCE_FILES):
            write(mdir / "staging" / f"v{j:04d}.json", staging_doc(root, f"s{j}"))
            os.utime(mdir / "staging" / f"v{j:04d}.json", (OLD, OLD))
    archive = tmp_path / "archive"
    archive.mkdir()
    stop = tmp_path / "stop-rotating"
    err = tmp_path / "daemon.stderr"

    with daemon([watched], env, "--config", str(config), "--settle", "0.2", stderr=err) as proc:
        deadline = time.monotonic() + 60
        while not any(b'"event":"ready"' in line for line in _lines(_files(log))):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.02)
        rotator_args = [str(log), str(archive), str(stop), "100000"]
        rotator = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "support" / "log_rotator.py"), *rotator_args],
            stdout=subprocess.PIPE,
        )
        try:
            runs = [
                subprocess.Popen(
                    memstaged_cmd("--once", "--config", str(config), "--memory-dir", str(mdir)),
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    cwd=REPO,
                )
                for mdir in others
            ]
            originals = _feed(watched)
            for run in runs:
                _out, run_err = run.communicate(timeout=300)
                assert run.returncode == 0, run_err
            deadline = time.monotonic() + 120
            while not all(
                (watched / "staging" / n).read_bytes() != data for n, data in originals.items()
            ):
                assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.05)
        finally:
            stop.touch()
            rotations = int(rotator.communicate(timeout=60)[0] or 0)
    lines = _lines(sorted(archive.iterdir()) + _files(log))
    events = [json.loads(line) for line in lines]  # no line split, none glued to another
    print(f"{rotations} rotations by the hostile rotator, {len(events)} events")
    assert all(isinstance(e, dict) for e in events)
    decided: Counter[tuple[str, str]] = Counter(
        (e["path"], e["decision"])
        for e in events
        if e.get("event") == "decision" and "planned" not in e
    )
    missing = [
        name for name in originals if decided[(str(watched / "staging" / name), "repaired")] != 1
    ]
    missing += [
        f"{mdir}/{j}"
        for mdir in others
        for j in range(ONCE_FILES)
        if decided[(str(mdir / "staging" / f"v{j:04d}.json"), "valid")] != 1
    ]
    assert not missing, f"{len(missing)} decisions lost, e.g. {missing[:5]}"
    assert rotations > 20  # the log was rotated away under the writers, again and again
    # And each logged repair names the very bytes it replaced.
    for name, data in originals.items():
        sha = hashlib.sha256(data).hexdigest()
        assert any(e.get("sha256") == sha and e.get("decision") == "repaired" for e in events), name


def _files(log: Path) -> list[Path]:
    """The log and its backups as they are now, oldest first."""
    backups = sorted(
        (p for p in log.parent.iterdir() if p.name.startswith(log.name + ".")),
        key=lambda p: -int(p.name.rsplit(".", 1)[1]),
    )
    return [*backups, *([log] if log.exists() else [])]


def _feed(mdir: Path) -> dict[str, bytes]:
    """Files for the daemon to repair (a lesson without triggers), written one after another
    while the others run; name -> the bytes written."""
    root = project_root_of(mdir)
    out: dict[str, bytes] = {}
    for i in range(DAEMON_FILES):
        name = f"r{i:04d}.json"
        doc: dict[str, Any] = staging_doc(
            root, f"d{i}", candidates={"lessons": [lesson(triggers=[])]}
        )
        tmp = mdir / "staging" / f".{name}.tmp"
        out[name] = write(tmp, doc)
        os.utime(tmp, (OLD, OLD))
        os.rename(tmp, mdir / "staging" / name)
    return out
