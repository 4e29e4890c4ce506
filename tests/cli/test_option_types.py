"""Option values (:mod:`memstaged.cli.option_types`): every number and duration a command takes
is bounded, and a value out of range is one line and exit 2, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.commands import one_line_error, run
from support.documents import one_of_each

pytestmark = pytest.mark.usefixtures("plain_output")


def test_huge_durations(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 4: ``log --since 3000000d`` shows everything (a time before the first
    date), ``purge --older-than 99999999999d`` is one line and exit 2; both were a
    ValueError traceback."""
    one_of_each(project, memory_dir)
    assert run(capsys, "--once", "--memory-dir", str(memory_dir))[0] == 0
    code, out, err = run(capsys, "log", "--since", "3000000d", "--json")
    assert code == 0, err
    assert len(out.splitlines()) == 5  # four decisions and the look at fix.json's rewrite
    code, _, err = run(capsys, "deadletter", "purge", "--older-than", "99999999999d")
    assert code == 2
    assert "--older-than" in one_line_error(err)
