"""``memstaged config check --reload PID`` (the unit's ``ExecReload=``) beside another process.

The rest of ``config check`` and ``config show``, run in this process, is in
``tests/cli/commands/test_cmd_config.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.commands import one_line_error, run


def test_config_check_reload_signals_only_a_memstaged_process(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21 item 8 (the unit's ExecReload=): `--reload PID` hangs up nothing but a
    memstaged: a stale or mistyped PID (here a sleeping Python) is refused with one line and
    exit 2, and that process is still running."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code, _out, err = run(capsys, "config", "check", "--reload", str(other.pid))
        assert code == 2
        assert one_line_error(err) == f"memstaged: --reload {other.pid}: not a memstaged process"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
