"""What a person sees on a terminal: memstaged run on a real pseudo-terminal (80 columns), its
output read back from it (issue 13, issue 14).

``log`` through a pager that quits early, one line per event and per record however long,
the repairs named on the console line, the settle wait in one line beside the progress bar,
and each decision of ``--once`` as a readable line rather than JSON. The same commands run in
this process are in ``tests/cli/test_terminal.py``; in a tmux pane, in
``tests/system/test_terminal_panes.py``."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.commands import dated_decisions
from support.decision_log import read_events
from support.documents import (
    backlog,
    half_written_ahead,
    lesson,
    one_of_each,
    settled,
    staging_doc,
    write,
)
from support.helpers import memstaged_cmd, memstaged_env
from support.terminal import pty_run

pytestmark = pytest.mark.usefixtures("plain_output")


def test_on_a_terminal_log_goes_through_the_pager_and_a_quitting_pager_is_fine(
    tmp_path: Path,
) -> None:
    """Issue 13: on a TTY ``log`` writes to ``$PAGER`` (here one that keeps the first 300
    bytes and quits, as a reader pressing q after the first screen): exit 0, no traceback,
    and the pager got the first lines; ``--no-pager`` writes to the terminal itself."""
    log_file = tmp_path / "decisions.jsonl"
    dated_decisions(log_file, [time.time() - 60] * 20_000)
    kept = tmp_path / "pager-saw"
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log_file))
    env["PAGER"] = f"sh -c 'head -c 300 > {kept}'"
    env.pop("MEMSTAGED_PAGER", None)
    code, shown = pty_run(memstaged_cmd("log"), env)
    assert code == 0, shown[-2000:]
    assert b"Traceback" not in shown
    assert kept.read_bytes().startswith(b"20")  # the first event's line: the date
    assert b"f0.json" in kept.read_bytes()
    code, shown = pty_run(memstaged_cmd("log", "-n", "1", "--no-pager"), env)
    assert code == 0
    assert b"f19999.json" in shown


def test_on_an_80_column_terminal_each_event_and_record_is_one_line(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: on a terminal, ``log`` drew a box table (5,000 events became 20,671 lines at
    80 columns) and ``deadletter list`` wrapped each ID over six lines. On an 80x24 pty, each
    event and each record is exactly one line (the terminal may fold it, the output does not),
    a record's line starts with its full ID, and the ID given to ``show`` finds it."""
    one_of_each(project, memory_dir)
    env = memstaged_env(tmp_path)
    code, _ = pty_run(memstaged_cmd("--once", "--memory-dir", str(memory_dir)), env)
    assert code == 0
    events = read_events(Path(env["MEMSTAGED_LOG_FILE"]), strict=False)
    code, shown = pty_run(memstaged_cmd("log", "--no-pager", "--color", "never"), env)
    assert code == 0
    lines = [ln for ln in shown.decode().split("\r\n") if ln.strip()]
    assert len(lines) == len(events), lines
    assert all(ln.startswith("20") and len(ln) > 80 for ln in lines if "staging/" in ln)
    records = sorted(p.stem for p in (memory_dir / "deadletter").glob("*.json"))
    assert records
    argv = ["deadletter", "list", "--no-pager", "--color", "never", "--memory-dir"]
    code, shown = pty_run(memstaged_cmd(*argv, str(memory_dir)), env)
    assert code == 0
    lines = [ln for ln in shown.decode().split("\r\n") if ln.strip()]
    assert sorted(ln.split("  ")[0] for ln in lines) == records, lines
    show = ["deadletter", "show", records[0], "--no-pager", "--memory-dir", str(memory_dir)]
    code, shown = pty_run(memstaged_cmd(*show), env)
    assert code == 0 and f"record {records[0]}".encode() in shown


def test_repaired_lines_on_a_terminal_say_which_repair(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: the daemon's and --once's console line on a TTY names the repair."""
    one_of_each(project, memory_dir)
    env = memstaged_env(tmp_path)
    code, shown = pty_run(memstaged_cmd("--once", "--memory-dir", str(memory_dir)), env)
    assert code == 0
    assert b"repaired by R1 at candidates.lessons[0].triggers" in shown


def test_a_repair_behind_added_categories_is_still_named_on_a_terminal(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13 ("repaired lines on a TTY don't say which repair"): the demo's
    session-no-triggers.json lacks three categories and a lesson's triggers; its line on a
    terminal, from ``--once`` and from ``memstaged log``, names R1 and where, instead of three
    R5s and "(+1 more)"."""
    doc = staging_doc(project, "no-triggers", candidates={"lessons": [lesson(triggers=[])]})
    for category in ("preferences", "decisions", "domain"):
        del doc["candidates"][category]
    write(memory_dir / "staging" / "no-triggers.json", doc)
    settled(memory_dir / "staging" / "no-triggers.json")
    env = memstaged_env(tmp_path)
    named = b"repaired by R1 at candidates.lessons[0].triggers; R5 at candidates.preferences"
    code, shown = pty_run(memstaged_cmd("--once", "--memory-dir", str(memory_dir)), env)
    assert code == 0 and named in shown, shown
    code, shown = pty_run(memstaged_cmd("log", "--no-pager"), env)
    assert code == 0 and named in shown, shown


def test_the_settle_wait_is_one_line_on_a_terminal_too(tmp_path: Path, memory_dir: Path) -> None:
    """Issue 13: on an 80-column terminal, where ``--once`` shows a progress bar, the line that
    says what it waits for is one line, not hard-wrapped at 80 columns by the bar's console
    (a path cut in two cannot be copied)."""
    half_written_ahead(memory_dir)
    env = memstaged_env(tmp_path)
    argv = memstaged_cmd("--once", "--settle", "3", "--memory-dir", str(memory_dir))
    code, shown = pty_run(argv, env)
    assert code == 0, shown
    [line] = [ln for ln in shown.split(b"\n") if b"waiting up to" in ln]
    assert len(line) > 80
    assert str(memory_dir).encode() in line and b"settle interval (3s): half.json" in line


def test_on_a_terminal_every_decision_is_a_readable_line(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 14 / SPEC 7: with stderr a terminal (a pty), ``--once`` shows each decision as a
    readable line (structlog's console rendering of the escaped message), never the JSON."""
    named = {decision: name for name, decision in backlog(project, memory_dir, 3).items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        MEMSTAGED_LOG_FILE=str(tmp_path / "decisions.jsonl"),
        NO_COLOR="1",
    )
    for key in ("JOURNAL_STREAM", "INVOCATION_ID"):
        env.pop(key, None)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        assert proc.wait(timeout=30) == 0
    text = seen.decode(errors="replace")
    assert "repaired" in text and named["repaired"] in text, text
    assert "quarantined" in text and named["quarantined"] in text, text
    assert '{"' not in text, text
    assert len(read_events(tmp_path / "decisions.jsonl")) >= 3
