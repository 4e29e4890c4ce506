"""Issue 14: each command imports what it needs, in a fresh interpreter as a user starts it.

Nothing here is timed (the benchmark times; ``make bench``): these tests hold the property that
makes start-up cost what it is: the modules ``--once``, ``check``, ``status`` and the daemon's
logging load (no structlog, rich or OpenSSL off a terminal). What the decision log writes
(each event once, readable lines with ``--verbose``) is in ``tests/log/test_log.py``; which
subcommand is built, in ``tests/cli/test_main.py``; the readable lines on a terminal, in
``tests/system/test_terminal_output.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.decision_log import read_events
from support.documents import staging_doc, write

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
    [event] = read_events(path)
    assert (event["event"], event["decision"], event["level"]) == ("decision", "valid", "info")
