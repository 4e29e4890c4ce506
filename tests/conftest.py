"""Shared fixtures: a memory dir in a temp project, clean logging, plain (uncoloured) command
output, and a home of each test's own. Fixtures only: what tests import lives in ``support/``
(staging documents and the decision log read back: ``support/documents.py``). With
``--no-processes`` (``make test-fast``) a test that starts a process fails.

No test may write into the real user's home: tests once left seven events in the real
``~/.local/state/memstaged/decisions.jsonl`` (issue 19 item 9). Every test runs with ``HOME`` and
the ``XDG_*`` directories in its own temp dir (subprocesses inherit them), and the run fails
when anything memstaged could write under the real home changed during it.
"""

from __future__ import annotations

import os
import pwd
import signal
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest
import structlog
from support.cli_values import cli_world, one_event_log, with_a_record
from support.commands import prepare
from support.daemon_process import WAIT, DaemonProcess

from memstaged.log import writer

#: The variables that say where a user's files are, each pointed into the test's temp dir.
PRIVATE_DIRS = {
    "HOME": "home",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_STATE_HOME": "home/.local/state",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_RUNTIME_DIR": "runtime",
}


def real_home_watch(env: Mapping[str, str]) -> tuple[Path, list[Path]]:
    """The real home, whose own entries' names are watched (a new ``~/.pi``, ``~/.memstaged``),
    and the directories under it where memstaged (its log and seen cache, its config, the unit,
    ``make install``) could write, watched entry by entry."""
    home = Path(env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)
    trees = [
        home / ".local" / "state" / "memstaged",
        home / ".config" / "memstaged",
        home / ".config" / "systemd" / "user",
        home / ".local" / "share" / "memstaged",
        home / ".local" / "bin",
        home / ".local" / "share" / "bash-completion",
        home / ".local" / "share" / "man",
        home / ".cache" / "memstaged",
        home / ".pi",
    ]
    for name, sub in (
        ("XDG_STATE_HOME", "memstaged"),
        ("XDG_CONFIG_HOME", "memstaged"),
        ("XDG_CONFIG_HOME", "systemd/user"),
        ("XDG_DATA_HOME", "memstaged"),
        ("XDG_CACHE_HOME", "memstaged"),
    ):
        if env.get(name):
            trees.append(Path(env[name]) / sub)
    return home, trees


def home_snapshot(home: Path, trees: list[Path]) -> dict[str, tuple[int, int, int]]:
    """Each watched entry's (mode, size, mtime in ns); the home's own entries by name only."""
    found: dict[str, tuple[int, int, int]] = {}
    try:
        found.update({f"{home}/{name}": (0, 0, 0) for name in os.listdir(home)})
    except OSError:
        pass  # no home (yet): every entry that appears is new
    for tree in trees:
        for top, dirs, files in os.walk(tree):
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                try:
                    st = os.lstat(name)
                except FileNotFoundError:
                    continue
                size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
                found[name] = (st.st_mode, size, st.st_mtime_ns)
    return found


def home_changes(before: dict[str, tuple[int, int, int]], after: dict[str, Any]) -> list[str]:
    """What changed between two snapshots, a line per path."""
    lines = [f"new: {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"gone: {p}" for p in sorted(before.keys() - after.keys())]
    lines += [
        f"changed: {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]
    ]
    return lines


#: What starting a process raises as an audit event (``multiprocessing``'s fork server starts
#: without one: :func:`_posixsubprocess.fork_exec` is guarded as well).
_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn"}
    | {"os.system", "pty.spawn"}
)
#: The processes refused by ``--no-processes`` since the last test's check.
_REFUSED: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-processes",
        action="store_true",
        help="fail a test that starts a process (make test-fast; such tests are in tests/system/)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """``--no-processes``: starting a process raises, and the test fails even if it caught that."""
    if not config.getoption("no_processes"):
        return
    import _posixsubprocess

    def refuse(what: str) -> NoReturn:
        _REFUSED.append(what)
        raise RuntimeError(
            f"--no-processes: {what}: a test that starts one belongs in tests/system/"
        )

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event in _PROCESS_EVENTS:
            refuse(f"{event} {args[:2]!r}")

    def guarded_fork_exec(*args: Any) -> NoReturn:
        refuse(f"fork_exec {args[:2]!r}")

    sys.addaudithook(audit)
    _posixsubprocess.fork_exec = guarded_fork_exec


@pytest.fixture(autouse=True)
def _no_process_started() -> Iterator[None]:
    """Under ``--no-processes``, a test that tried to start a process fails, caught or not."""
    yield
    if _REFUSED:
        refused = list(_REFUSED)
        _REFUSED.clear()
        pytest.fail("started a process under --no-processes: " + "; ".join(refused), pytrace=False)


#: Taken when this file is imported, before any test (or collection) could write there.
_REAL_HOME = real_home_watch(os.environ)
_REAL_HOME_BEFORE = home_snapshot(*_REAL_HOME)


@pytest.fixture(autouse=True, scope="session")
def _real_home_untouched() -> Iterator[None]:
    """Issue 19 item 9: the run fails (an error at the teardown of its last test) when anything
    under the real home that memstaged could write changed while the tests ran."""
    yield
    changed = home_changes(_REAL_HOME_BEFORE, home_snapshot(*_REAL_HOME))
    if changed:
        pytest.fail("the tests changed the real home:\n" + "\n".join(changed), pytrace=False)


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path) -> Iterator[None]:
    """Issue 19 item 9: ``HOME`` and the ``XDG_*`` directories in the test's own temp dir (not
    created: what needs one makes it, as memstaged makes its state dir; a test may check that
    nothing else is in its temp dir), and no ``MEMSTAGED_*`` setting from the shell that ran
    pytest (``MEMSTAGED_LOG_FILE`` would send a test's events to that user's log). The
    ``systemd --user`` tests give their manager its own runtime dir (tests/support/systemd_env.py).

    A ``MonkeyPatch`` of its own, not the test's: a test's ``monkeypatch.undo()`` (which
    test_cmd_deadletter's recoveries after the plan call) undid the ``log_file`` fixture's
    variables too, and its next run logged into the real home."""
    with pytest.MonkeyPatch.context() as patch:
        for name, where in PRIVATE_DIRS.items():
            patch.setenv(name, str(tmp_path / where))
        for name in list(os.environ):
            if name.startswith("MEMSTAGED_"):
                patch.delenv(name)
        yield


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """Each test starts and ends with no memstaged log sinks and default structlog."""
    yield
    writer.close()
    structlog.reset_defaults()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root holding an empty ``.pi/memory/project/staging``."""
    root = tmp_path / "example-project"
    (root / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    return root


@pytest.fixture
def memory_dir(project: Path) -> Path:
    return project / ".pi" / "memory" / "project"


@pytest.fixture
def store(project: Path, memory_dir: Path, log_file: Path) -> Path:
    """A dead-letter store a real ``--once`` wrote (:func:`support.commands.prepare`: mixed.json
    and broken.json quarantined); returns the memory dir."""
    prepare(project, memory_dir, log_file)
    return memory_dir


@pytest.fixture
def log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Points the decision log at a temp file (and away from the user's state dir)."""
    path = tmp_path / "state" / "decisions.jsonl"
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own (the temp dir itself, also the working directory), and no
    ``MEMSTAGED_*`` variable but those a test sets (the ``config`` command tests)."""
    for name in list(os.environ):
        if name.startswith("MEMSTAGED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def world(tmp_path: Path) -> dict[str, str]:
    """Paths a command may be given (:func:`support.cli_values.cli_world`): a memory dir with one
    settled file of each kind, configs good and bad, a FIFO."""
    return cli_world(tmp_path)


@pytest.fixture
def one_event(log_file: Path) -> Path:
    """A decision log with one event, so ``log`` has something to show."""
    return one_event_log(log_file)


@pytest.fixture
def numeric_world(
    world: dict[str, str], one_event: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, str]:
    """The world with ``bad.json`` quarantined, so ``deadletter show`` has a record to show."""
    return with_a_record(world, capsys)


@pytest.fixture
def plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output as a script sees it, whatever the environment says about colours (the command
    tests use it on every test: ``pytestmark = pytest.mark.usefixtures("plain_output")``)."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts real daemons (for ``system/``) in ``tmp_path``, with the options of
    :class:`~support.daemon_process.DaemonProcess`, each ready unless ``ready=False``; any still
    running at the end is killed, a stopped one (SIGSTOP) too."""
    started: list[DaemonProcess] = []

    def start(
        *args: str, ready: bool = True, ready_timeout: float = WAIT, **options: Any
    ) -> DaemonProcess:
        daemon = DaemonProcess(tmp_path, *args, **options)
        started.append(daemon)
        if ready:
            daemon.wait_ready(ready_timeout)
        return daemon

    yield start
    for daemon in started:
        daemon.proc.send_signal(signal.SIGCONT)  # a test that failed while it was stopped
        daemon.kill()
