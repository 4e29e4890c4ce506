"""Issue 14: each command imports what it needs, and the decision log writes each event once.

Nothing here is timed (the benchmark times; ``make bench``): these tests hold the properties that
make start-up and per-file cost what they are, as outcomes a user sees: the modules a command
loads, the log file complete, stderr silent off a terminal, and readable lines with ``--verbose``
or on a TTY.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from support.documents import decisions, lesson, read_log, staging_doc, write

from memstaged.cli.main import _named_command, main
from memstaged.log import writer
from memstaged.log.rotated_file import FileSink

#: Modules no production path of these commands may load off a terminal: structlog's package
#: (its ``__init__`` pulls in ``structlog.dev``, rich's tracebacks, asyncio and ssl), rich, the
#: daemon's observers and systemd.
HEAVY = ("structlog", "rich", "watchdog", "systemd", "asyncio", "ssl", "pygments")

_PROBE = """
import json, sys
from memstaged.cli.main import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
sys.exit(code)
"""


def _modules_loaded(tmp_path: Path, *argv: str) -> set[str]:
    """The modules a fresh interpreter holds after running memstaged with ``argv`` (stdin,
    stdout and stderr not terminals, as in a script or a unit)."""
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        MEMSTAGED_LOG_FILE=str(tmp_path / "decisions.jsonl"),
    )
    for key in ("JOURNAL_STREAM", "INVOCATION_ID"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), *argv],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        check=False,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr.decode()
    return set(json.loads(out.read_text()))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_once_on_an_empty_memory_dir_loads_neither_structlog_nor_rich(
    tmp_path: Path, memory_dir: Path
) -> None:
    """Issue 14 start-up: ``--once`` with nothing to decide loads no structlog, rich, watchdog
    or systemd, no other subcommand's module, no TOML parser without a config file, not
    the decision engine's JavaScript semantics, and not OpenSSL (issue 23)."""
    modules = _modules_loaded(tmp_path, "--once", "--memory-dir", str(memory_dir))
    assert _heavy(modules) == []
    assert not {m for m in modules if m.startswith("memstaged.cli.commands")}
    assert "tomllib" not in modules
    assert "ctypes" not in modules  # renameat2/syncfs are loaded when something is changed
    assert "_hashlib" not in modules  # OpenSSL's libcrypto: only for a backlog (issue 23)


def test_check_and_status_load_neither_structlog_nor_rich(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 14 start-up: ``check`` of one file and ``status`` load only their own
    subcommand's module (and the commands' shared ``_common`` and ``_output``), and nothing
    of structlog, rich, watchdog, systemd or OpenSSL (issue 23: the built-in SHA-256)."""
    path = memory_dir / "staging" / "a.json"
    write(path, staging_doc(project, "a"))
    checked = _modules_loaded(tmp_path, "check", "--project-root", str(project), str(path))
    status = _modules_loaded(tmp_path, "status", "--memory-dir", str(memory_dir))
    for modules, own in ((checked, "check"), (status, "status")):
        assert _heavy(modules) == [], own
        assert "_hashlib" not in modules, own  # OpenSSL's libcrypto (issue 23)
        commands = {m for m in modules if m.startswith("memstaged.cli.commands.")}
        shared = {"memstaged.cli.commands._common", "memstaged.cli.commands._output"}
        assert commands <= {f"memstaged.cli.commands.{own}", *shared}, own


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--once", "--memory-dir", "status"], ""),  # a memory dir called "status"
        (["--memory-dir", "d", "status"], "status"),
        (["--mem", "d", "check", "f"], "check"),  # an abbreviation argparse accepts
        (["--config=c", "log", "-n", "3"], "log"),
        (["-v", "--once"], ""),
        (["stat"], None),  # no such command: argparse says so, with every choice listed
        (["--help"], None),
        (["--", "status"], None),
        (["--dry", "status"], None),  # an abbreviation left to argparse
    ],
)
def test_only_the_named_subcommand_is_built(argv: list[str], named: str | None) -> None:
    """Issue 14 start-up: the subcommand a command line names is found without argparse, so
    only its module is imported; anything unclear (help, ``--``, a typo) builds them all."""
    assert _named_command(argv) == named


def test_a_mistyped_command_still_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Building one subcommand's parser does not change what a typo gets: one line naming
    every choice, exit 2."""
    assert main(["stat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for name in ("check", "service", "log", "stats", "status", "deadletter"):
        assert f"'{name}'" in err


def _three_files(project: Path, memory_dir: Path) -> None:
    staging = memory_dir / "staging"
    write(staging / "valid.json", staging_doc(project, "valid"))
    write(
        staging / "no-triggers.json",
        staging_doc(project, "nt", candidates={"lessons": [lesson(triggers=[])]}),
    )
    write(staging / "bad.json", staging_doc(project, "bad", schemaVersion="1"))
    for name in ("valid.json", "no-triggers.json", "bad.json"):
        os.utime(staging / name, (1_700_000_000, 1_700_000_000))


def test_off_a_terminal_each_event_is_written_once_and_only_to_the_log_file(
    project: Path,
    memory_dir: Path,
    log_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 14, the decision log: with stderr not a terminal, ``--once`` writes every event
    to the log file with one ``write`` each, and nothing to stderr (it used to write the same
    JSON there too); the summary line is the only output, on stdout."""
    _three_files(project, memory_dir)
    writes: dict[int, int] = {}
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        writes[fd] = writes.get(fd, 0) + 1
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    fd = next(s for s in writer._FANOUT.sinks if isinstance(s, FileSink))._fd
    monkeypatch.undo()
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1 and "valid=1 repaired=1 quarantined=1" in out
    assert decisions(log_file) == {
        "valid.json": "valid",
        "no-triggers.json": "repaired",
        "bad.json": "quarantined",
    }
    assert writes[fd] == len(read_log(log_file))  # one write per event, every event there
    assert 2 not in writes


def test_verbose_prints_every_decision_readably_and_the_file_stays_complete(
    project: Path, memory_dir: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 14, the decision log: ``--once --verbose`` off a terminal prints one readable line
    per decision on stderr (not JSON: the file has that), and the log file still has every
    event."""
    _three_files(project, memory_dir)
    assert main(["--once", "--verbose", "--memory-dir", str(memory_dir)]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert any("valid " in line and "valid.json" in line for line in lines), err
    assert any("repaired " in line and "no-triggers.json" in line for line in lines), err
    assert any("quarantined " in line and "bad.json" in line for line in lines), err
    assert not any(line.lstrip().startswith("{") for line in err.splitlines()), err
    assert len(decisions(log_file)) == 3


def test_verbose_is_for_once_only(capsys: pytest.CaptureFixture[str]) -> None:
    """``--verbose`` without ``--once`` is a usage error in one line, exit 2."""
    assert main(["--verbose"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_on_a_terminal_every_decision_is_a_readable_line(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 14 / SPEC 7: with stderr a terminal (a pty), ``--once`` shows each decision as a
    readable line (structlog's console rendering of the escaped message), never the JSON."""
    _three_files(project, memory_dir)
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
    assert "repaired" in text and "no-triggers.json" in text, text
    assert "quarantined" in text and "bad.json" in text, text
    assert '{"' not in text, text
    assert len(read_log(tmp_path / "decisions.jsonl")) >= 3


def test_a_file_is_read_with_one_read_call_and_its_bytes_are_whole(
    project: Path, memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14 item 3 (calls per decision): a staging file is read by one ``read`` (the end is
    known from a short read once ``fstat``'s size is in, not from a second read returning
    nothing), and the bytes read are exactly the file's, small or larger than a chunk."""
    from memstaged.files import safe_open
    from memstaged.files.version import Version, read_version

    staging = memory_dir / "staging"
    small = write(staging / "small.json", staging_doc(project, "small"))
    big = write(staging / "big.json", b" " * 200_000 + small)
    empty = write(staging / "empty.json", b"")
    reads: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting_read)
    staging_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, data in (("small.json", small), ("big.json", big), ("empty.json", empty)):
            reads.clear()
            version = read_version(staging_fd, name, 8 << 20)
            assert isinstance(version, Version)
            with version:
                assert version.data == data
                assert len(reads) == 1, name
                assert safe_open.read_fd_at(version.fd, len(data) + 1) == data
    finally:
        os.close(staging_fd)


def test_read_fd_reads_on_when_the_file_is_longer_than_fstat_said(tmp_path: Path) -> None:
    """A file that grew after ``fstat`` (a writer appending) is read to its end, not cut at
    the size ``fstat`` gave: the short-read shortcut only ends a read once that size is in."""
    from memstaged.files import safe_open

    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert safe_open.read_fd(fd, 10, 1 << 20) == b"x" * 100_000
    finally:
        os.close(fd)


def test_the_daemon_logs_without_importing_structlog_off_a_terminal(tmp_path: Path) -> None:
    """Issue 14 item 4 (the daemon's memory): the daemon's modules and a logged event, with
    stderr not a terminal and no journald, load neither structlog (~16 MB) nor rich; the
    event still reaches the log file whole."""
    path = tmp_path / "decisions.jsonl"
    probe = (
        "import json, pathlib, sys, memstaged.daemon.loop, memstaged.log.writer as writer\n"
        f"writer.configure(pathlib.Path({str(path)!r}), journal='off')\n"
        "writer.get_logger().info('decision', decision='valid', path='a.json')\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *HEAVY],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        check=True,
        timeout=60,
        text=True,
    )
    assert set(json.loads(proc.stdout)) <= {"watchdog"}  # the daemon's observer, nothing else
    assert proc.stderr == ""
    [event] = read_log(path)
    assert (event["event"], event["decision"], event["level"]) == ("decision", "valid", "info")
