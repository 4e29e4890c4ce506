"""What ``log``, ``deadletter list`` and ``--once`` show a person on a real pseudo-terminal of 80
columns (a tmux pane, with less as the pager as a user has it), read with ``tmux capture-pane``:
what is cut off at the right edge or wrapped is what the person does not see.

The same commands' output read as a script reads it is in ``tests/cli/test_terminal.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from support.commands import prepare, record_files
from support.documents import staging_doc, write
from support.helpers import memstaged_cmd
from support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("plain_output")

#: A failure guard only: each wait ends on what the test waits for (a screen, a process end).
GUARD: Final = 60.0
WIDTH: Final = 80


class Pane:
    """A tmux pane of WIDTH x 24 running one command, on a private tmux server."""

    def __init__(self, where: Path, env: dict[str, str], argv: list[str]) -> None:
        self.socket = str(where / "sock")
        conf = where / "tmux.conf"
        # The screen stays once the command ends; "screen" is a terminal every terminfo has.
        conf.write_text("set -g remain-on-exit on\nset -g default-terminal screen\n")
        env = {k: v for k, v in env.items() if k not in ("TMUX", "PAGER", "MEMSTAGED_PAGER")}
        self._tmux(
            "-f", str(conf), "new-session", "-d", "-x", str(WIDTH), "-y", "24", shlex.join(argv),
            env=env,
        )  # fmt: skip

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=GUARD,
        )
        return done.stdout

    def screen(self) -> list[str]:
        return self._tmux("capture-pane", "-p").splitlines()

    def dead(self) -> bool:
        return self._tmux("display-message", "-p", "#{pane_dead}").strip() == "1"

    def wait(self, ready: Callable[[list[str]], bool]) -> list[str]:
        """The screen once ``ready`` says it shows what the test waits for."""
        shown: list[str] = []

        def shows() -> bool:
            shown[:] = self.screen()
            return ready(shown)

        wait_until(
            shows,
            "the screen the test waits for",
            timeout=GUARD,
            interval=0.05,
            said=lambda: "\n".join(shown),
        )
        return shown

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", *keys)

    def paged(self) -> list[str]:
        """The screen once the pager shows the end (or has quit: less -F on one screen), and
        the pane once the pager is left as a person leaves it (q)."""
        screen = self.wait(lambda rows: any("(END)" in row for row in rows) or self.dead())
        if not self.dead():
            self.keys("q")
            self.wait(lambda rows: self.dead())
        return screen

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: tmux's socket path must fit in 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="ms-") as name:
        yield Path(name)


@pytest.fixture
def pane_env(tmp_path: Path, log_file: Path) -> dict[str, str]:
    """The environment of the command in the pane: the test's log file, the real pager."""
    if shutil.which("tmux") is None or shutil.which("less") is None:
        pytest.fail("tmux and less are needed (make sysdeps installs them)")
    env = dict(os.environ)
    for name in ("NO_COLOR", "LESS", "COLUMNS", "LINES"):
        env.pop(name, None)
    return env


def _rows(screen: list[str], word: str) -> list[str]:
    return [row for row in screen if word in row]


def test_log_at_80_columns_shows_project_file_and_reason(
    project: Path, memory_dir: Path, log_file: Path, pane_env: dict[str, str], short_dir: Path
) -> None:
    """Issue 22 item 1: at 80 columns, through less -S, each line shows the time, the decision,
    the project and the file's name, and the start of the reason (the absolute path used to
    fill the line, so that neither the name nor the reason was on screen)."""
    prepare(project, memory_dir, log_file)
    pane = Pane(short_dir, pane_env, memstaged_cmd("log"))
    try:
        screen = pane.paged()
    finally:
        pane.close()
    [mixed] = _rows(screen, "mixed.json")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  quarantined  example-project  ", mixed)
    assert "mixed.json  candidates." in mixed  # the reason starts on screen
    for name in ("good.json", "fixme.json", "broken.json", "other.json"):
        decisions = [
            row
            for row in _rows(screen, f"  example-project  {name}")
            if "memstaged's own" not in row  # the look at its own rewrite: no decision (SPEC 7)
        ]
        assert len(decisions) == 1, screen


def test_deadletter_list_at_80_columns_shows_the_project(
    project: Path, memory_dir: Path, log_file: Path, pane_env: dict[str, str], short_dir: Path
) -> None:
    """Issue 22 item 2: on a terminal of 80 columns, through less -S, each record's line shows
    its full ID, when, and its project (only ``--json`` named the memory dir)."""
    prepare(project, memory_dir, log_file)
    ids = [n[: -len(".json")] for n in record_files(memory_dir)]
    argv = memstaged_cmd("deadletter", "list", "--memory-dir", str(memory_dir))
    pane = Pane(short_dir, pane_env, argv)
    try:
        screen = pane.paged()
    finally:
        pane.close()
    for ident in ids:
        [row] = _rows(screen, ident)
        assert re.match(rf"{re.escape(ident)}  \S+ \S+  example-project", row), screen


def test_once_table_fits_80_columns(pane_env: dict[str, str], short_dir: Path) -> None:
    """Issue 22 item 5: the ``--once`` summary on a terminal too narrow for the path and the
    counts on one line puts the memory dir on its own line (it wrapped: ``to`` / ``tal``)."""
    root = short_dir / "a-project-with-a-rather-long-name-indeed"
    mdir = root / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    write(mdir / "staging" / "good.json", staging_doc(root, "good"))
    assert len(str(mdir)) + 2 + 63 > WIDTH > len(str(mdir))
    argv = memstaged_cmd("--once", "--memory-dir", str(mdir), "--settle", "0")
    pane = Pane(short_dir, pane_env, argv)
    try:
        screen = pane.wait(lambda rows: pane.dead())
    finally:
        pane.close()
    rows = [row.rstrip() for row in screen if row.strip()]
    rows = rows[rows.index("memstaged --once") :]  # after the decisions logged to the terminal
    assert re.fullmatch(
        r"\s+valid\s+repaired\s+quarantined\s+foreign\s+deferred\s+skipped\s+total", rows[1]
    )
    assert rows[2] == str(mdir)
    assert re.fullmatch(r"\s+1\s+0\s+0\s+0\s+0\s+0\s+1", rows[3])
    assert len(rows[3]) == len(rows[1])  # the counts right-aligned under their headings
