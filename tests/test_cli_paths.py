"""Hostile path arguments to the installed command (found by attacking the merged main).
A user error is one line on stderr and exit 2, never a traceback (STYLE, SPEC 5 "refuses, with
one line and exit 2, a --memory-dir that is not one")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Every command that takes --memory-dir and checks it (the daemon last: it must not start).
COMMANDS = [
    ["--once"],
    ["status"],
    ["deadletter", "list"],
    ["deadletter", "recover", "--all"],
    [],
]


@pytest.mark.parametrize(
    "command", COMMANDS, ids=["--once", "status", "deadletter list", "deadletter recover", "daemon"]
)
def test_memory_dir_name_too_long_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str]
) -> None:
    """A --memory-dir whose last component is 300 bytes (the kernel says ENAMETOOLONG) is not a
    memory dir: one line naming it, exit 2, no traceback, and the daemon does not start."""
    too_long = tmp_path / ("a" * 300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "c"), XDG_STATE_HOME=str(tmp_path / "s"))
    proc = subprocess.run(
        [sys.executable, "-m", "memstaged", *command, "--memory-dir", str(too_long)],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )
    err = proc.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1, err
