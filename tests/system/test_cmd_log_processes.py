"""``memstaged log`` beside other processes: ``--follow`` as a process of its own, reading what a
run logs after it started, and ``--journal`` reading what a run under systemd sent to journald.

The rest of ``log``, run in this process, is in ``tests/cli/commands/test_cmd_log.py``."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest
from support import systemd_env
from support.commands import (
    json_lines,
    run,
)
from support.documents import staging_doc, write

from memstaged.cli.main import main
from memstaged.log.writer import JOURNAL_SOCKET

pytestmark = pytest.mark.usefixtures("plain_output")


# -- --follow -----------------------------------------------------------------------------------


def _lines_of(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _next_line(lines: queue.Queue[str], want: str, timeout: float = 30.0) -> str:
    """The next line of the follower's output that contains ``want``, or fail after timeout."""
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"log --follow printed no line with {want!r} within {timeout}s")
        if want in line:
            return line


def test_follow_prints_an_event_written_after_it_started(
    project: Path, memory_dir: Path, store: Path, log_file: Path
) -> None:
    """--follow prints the recent history, then an event logged after it started (read from the
    same open file, no polling race), as JSON lines a script can read one by one."""
    env = {**os.environ, "MEMSTAGED_LOG_FILE": str(log_file)}
    argv = [sys.executable, "-m", "memstaged", "log", "--follow", "--json", "--decision", "valid"]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_lines_of, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            assert "good.json" in _next_line(lines, '"decision":"valid"')  # the history
            write(memory_dir / "staging" / "late.json", staging_doc(project, "late"))
            assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
            line = _next_line(lines, "late.json")
            [event] = json_lines(line)
            assert event["decision"] == "valid"
            assert event["session_id"] == "late"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            reader.join(timeout=30)
    assert not reader.is_alive()


# -- journald -------------------------------------------------------------------------------------


def _journal_or_skip() -> str:
    """``harness`` when a private journald can run here, ``host`` when this machine has one."""
    reason = systemd_env.unavailable_reason()
    if reason is None:
        return "harness"
    if Path(JOURNAL_SOCKET).exists():
        return "host"
    pytest.skip(
        f"no journald socket on this machine: {JOURNAL_SOCKET} is missing, and the "
        f"private journald of tests/support/systemd_env.py cannot run here ({reason})"
    )


def _journal_decisions(directory: str | None, memory_dir: Path) -> int:
    from systemd import journal

    reader = journal.Reader(path=directory) if directory else journal.Reader()
    try:
        reader.add_match(SYSLOG_IDENTIFIER="memstaged", MEMSTAGED_MEMORY_DIR=str(memory_dir))
        return sum(1 for entry in reader if entry.get("MEMSTAGED_EVENT") == "decision")
    finally:
        reader.close()


@pytest.mark.systemd
def test_journal_gives_the_same_output_as_the_file(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """A memstaged run under systemd logs to journald and to the file; ``log --journal`` (through
    systemd.journal.Reader) then prints byte for byte what ``log`` prints from the file."""
    where = _journal_or_skip()
    staging = memory_dir / "staging"
    write(staging / "good.json", staging_doc(project, "good"))
    fixme = staging_doc(project, "fix")
    del fixme["candidates"]["lessons"][0]["triggers"]
    write(staging / "fixme.json", fixme)
    write(staging / "broken.json", b"{not json")
    argv = [
        sys.executable,
        "-m",
        "memstaged",
        "--once",
        "--settle",
        "0",
        "--memory-dir",
        str(memory_dir),
    ]
    if where == "harness":
        with systemd_env.user_systemd() as sd:
            done = sd.run(
                "systemd-run",
                "--user",
                "--wait",
                "--quiet",
                "--collect",
                f"--setenv=MEMSTAGED_LOG_FILE={log_file}",
                *argv,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            journal_dir: str | None = str(sd.journal_dir)
            systemd_env.wait_until(
                lambda: _journal_decisions(journal_dir, memory_dir) >= 4,
                timeout=30,
                what="3 decisions and the look at the rewrite in the journal",
            )
            journal = _log_json(
                capsys,
                "--journal",
                "--journal-dir",
                str(journal_dir),
                "--memory-dir",
                str(memory_dir),
            )
    else:
        env = {
            **os.environ,
            "INVOCATION_ID": os.urandom(16).hex(),
            "MEMSTAGED_LOG_FILE": str(log_file),
        }
        assert subprocess.run(argv, env=env, check=False, timeout=60).returncode == 0
        systemd_env.wait_until(
            lambda: _journal_decisions(None, memory_dir) >= 4,
            timeout=30,
            what="3 decisions and the look at the rewrite in the journal",
        )
        journal = _log_json(capsys, "--journal", "--memory-dir", str(memory_dir))
    from_file = _log_json(capsys, "--memory-dir", str(memory_dir))
    assert len(json_lines(from_file)) == 4  # fixme.json's rewrite is looked at (own_rewrite)
    assert journal == from_file


def _log_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run(capsys, "log", "--json", *argv)
    assert code == 0, err
    return out
