"""Defect 8 for the daemon: a glob match whose memory dir is a symbolic link, given through
``--memory-dir`` or through the config file, is reported once and the other projects are
worked on (SPEC 6: below the configured literal prefix a link "is not followed, and is
reported"). Real processes, real links, real inotify."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.decision_log import read_events
from support.documents import staging_doc
from support.helpers import memstaged_env, reap


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    return read_events(tmp_path / "decisions.jsonl", strict=False)


def _projects_with_a_linked_one(tmp_path: Path) -> tuple[Path, Path]:
    """Projects a and c with real memory dirs, b whose memory dir is a link to ``elsewhere``
    (holding a malformed file that must stay untouched); returns (src, elsewhere)."""
    src = tmp_path / "src"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "staging").mkdir(parents=True)
    (elsewhere / "staging" / "e.json").write_bytes(b"{not json")
    for name in ("a", "c"):
        (src / name / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    (src / "b" / ".pi" / "memory").mkdir(parents=True)
    (src / "b" / ".pi" / "memory" / "project").symlink_to(elsewhere)
    return src, elsewhere


@pytest.mark.parametrize("via", ["command line", "config file"])
def test_the_daemon_reports_a_linked_memory_dir_once_and_decides_the_others(
    tmp_path: Path, via: str
) -> None:
    """issue 10 item 11 / defect 8, SPEC 6: the daemon given a glob (on the command line or in
    the config file) whose match b is a symbolic link starts, logs one ``memory_dir_skipped``
    event naming b's link (not one per rescan), decides new files in a and c, never touches the
    file behind the link, and stops with 0 on SIGTERM."""
    src, elsewhere = _projects_with_a_linked_one(tmp_path)
    pattern = str(src / "*" / ".pi" / "memory" / "project")
    args = [sys.executable, "-m", "memstaged", "--settle", "0.1"]
    if via == "command line":
        args += ["--memory-dir", pattern]
    else:
        conf = tmp_path / "config.toml"
        conf.write_text(f"memory_dirs = [{json.dumps(pattern)}]\nrescan_interval = 1\n")
        args += ["--config", str(conf)]
    with (tmp_path / "daemon.err").open("wb") as err:
        proc = subprocess.Popen(
            args, env=memstaged_env(tmp_path), stdin=subprocess.DEVNULL, stdout=err, stderr=err
        )
    try:
        deadline = time.monotonic() + 30
        while not any(e.get("event") == "ready" for e in _events(tmp_path)):
            assert proc.poll() is None, (tmp_path / "daemon.err").read_text()[-500:]
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.02)
        for name in ("a", "c"):
            doc = staging_doc(src / name, name)
            staging = src / name / ".pi" / "memory" / "project" / "staging"
            (staging / f"{name}.json").write_bytes(json.dumps(doc).encode())
        while len([e for e in _events(tmp_path) if e.get("decision") == "valid"]) < 2:
            assert proc.poll() is None, (tmp_path / "daemon.err").read_text()[-500:]
            assert time.monotonic() < deadline, "a.json and c.json were not both decided"
            time.sleep(0.05)
        if via == "config file":  # let a periodic rescan or two pass: still reported once
            rescans = len([e for e in _events(tmp_path) if e.get("event") == "rescan"])
            while len([e for e in _events(tmp_path) if e.get("event") == "rescan"]) < rescans + 2:
                assert time.monotonic() < deadline + 30, "no periodic rescan"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        reap(proc)
    events = _events(tmp_path)
    skipped = [e for e in events if e.get("event") == "memory_dir_skipped"]
    linked = str(src / "b" / ".pi" / "memory" / "project")
    assert [e["memory_dir"] for e in skipped] == [linked]
    assert skipped[0]["link"] == linked
    assert not [e for e in events if e.get("memory_dir") == linked and e.get("decision")]
    assert (elsewhere / "staging" / "e.json").read_bytes() == b"{not json"
