"""Files and directories memstaged may not read (SPEC 5: deferred, with the reason), as a user
who may not read them: ``nobody`` (:mod:`support.as_nobody`), or root without the capabilities
that let it read anything (``setpriv``)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from support.helpers import (
    REPO,
    memstaged_cmd,
    memstaged_env,
    read_events,
    without_dac_override,
)
from support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("plain_output")


def test_the_daemon_says_when_staging_cannot_be_read(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13 item 3, the daemon's side: with ``staging/`` unreadable (``chmod 000``, a normal
    user), the daemon does not just log ``ready``: an error event ``staging_unreadable``
    naming the directory and the cause comes first. As root, the run drops the capabilities
    that let root read anything (``setpriv``)."""
    prefix = without_dac_override()
    env = memstaged_env(tmp_path)
    log = Path(env["MEMSTAGED_LOG_FILE"])
    (memory_dir / "staging").chmod(0)
    proc = subprocess.Popen(
        [*prefix, *memstaged_cmd("--memory-dir", str(memory_dir))],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        assert wait_for(lambda: any(e.get("event") == "ready" for e in read_events(log)), 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        (memory_dir / "staging").chmod(0o700)
    assert code == 0
    events = [e.get("event") for e in read_events(log)]
    [unreadable] = [e for e in read_events(log) if e.get("event") == "staging_unreadable"]
    assert events.index("staging_unreadable") < events.index("ready")
    assert unreadable["level"] == "error"
    assert unreadable["path"] == str(memory_dir / "staging")
    assert "ermission denied" in unreadable["error"]
