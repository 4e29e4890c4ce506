"""``systemctl --user`` as memstaged asks it (:mod:`memstaged.cli.systemctl`), against stand-in
``systemctl`` scripts of the test's own on ``PATH``: a real manager cannot be made to print
bytes that are not UTF-8 or to print without end, which is what a broken or hostile one on
``PATH`` may do. The real manager is asked in ``test_systemd_health.py``."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from support.waiting import wait_until

from memstaged.cli import health
from memstaged.cli.commands import status
from memstaged.cli.main import main
from memstaged.cli.systemctl import OUTPUT_LIMIT, systemctl

pytestmark = pytest.mark.usefixtures("plain_output")


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """A ``systemctl`` first on PATH that runs ``body`` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_output_that_is_not_utf8_is_no_traceback_for_status_check(
    tmp_path: Path,
    memory_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A systemctl that answers with a byte that is not UTF-8 made `status --check` end in a
    ``UnicodeDecodeError`` traceback. The answer is read with replacement: the unit is seen
    (enabled, stopped) and the check says CRITICAL in one line."""
    _stand_in(
        tmp_path,
        monkeypatch,
        r"printf 'LoadState=loaded\nUnitFileState=enabled\nActiveState=inactive\n"
        r"SubState=dead\nResult=success\377\n'",
    )
    code = main(["status", "--check", "--memory-dir", str(memory_dir)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code == status.CRITICAL, (out, err)
    assert out.splitlines()[0].startswith("MEMSTAGED CRITICAL - memstaged.service is enabled")


def test_output_without_end_is_cut_and_the_process_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A systemctl that prints 50 MB was read whole (a 200 MB line took 1 GB). What is kept is
    at most OUTPUT_LIMIT bytes; the process is killed, and its status says so."""
    _stand_in(tmp_path, monkeypatch, "head -c 50000000 /dev/zero | tr '\\0' x")
    done = systemctl("show", "memstaged.service", timeout=60)
    assert len(done.stdout) <= OUTPUT_LIMIT
    assert done.returncode != 0


def test_a_manager_that_hangs_is_given_up_on_by_the_timeout(
    tmp_path: Path,
    memory_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A systemctl that never ends is killed at `--timeout`: the check goes on without the
    manager's answer (no unit is taken to be meant to run) and says OK for a healthy dir."""
    _stand_in(tmp_path, monkeypatch, "exec sleep 600")
    code = main(["status", "--check", "--timeout", "1", "--memory-dir", str(memory_dir)])
    out, _ = capsys.readouterr()
    assert code == status.OK, out
    assert out.startswith("MEMSTAGED OK")


def test_a_daemon_is_not_asked_once_the_timeout_is_used_up() -> None:
    """`--timeout` bounds the whole check: a hung manager and each hung daemon had their own
    `--timeout`, and added up. A daemon whose turn comes after the time is used up is not asked
    (no connection is tried: pid 1 has no memstaged socket) and the reason says why."""
    answer = health._ask(1, time.monotonic() - 0.1)
    assert answer == "not asked: --timeout was used up before its turn"


def test_what_systemctl_left_holding_its_output_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A systemctl whose child prints without end (``yes``) kept memstaged reading for ever,
    the child holding the pipe after systemctl was killed; one that ended leaving ``sleep
    300`` behind with the pipe made `service install` wait 300 s. The group is killed: past
    the limit at once, and DRAIN seconds after systemctl itself ended."""
    _stand_in(tmp_path, monkeypatch, "yes yyyy")
    done = systemctl("show", "memstaged.service")
    assert len(done.stdout) <= OUTPUT_LIMIT
    assert done.returncode != 0

    pid_file = tmp_path / "left.pid"
    (tmp_path / "bin" / "systemctl").write_text(
        f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\necho LoadState=loaded\n"
    )
    done = systemctl("show", "memstaged.service")
    assert done.returncode == 0
    assert done.stdout == "LoadState=loaded\n"
    left = int(pid_file.read_text())
    # SIGKILL is delivered when the process next runs: wait for its end, not for a time
    wait_until(lambda: _gone(left), f"the sleep systemctl left behind (pid {left}) killed")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (no such process, or a zombie not yet reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_systemctl_that_never_ends_is_one_line_for_the_commands_that_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A systemctl that closes its output and runs on made `service install` wait for ever. Its
    wait is bounded (LONGEST, here made short): one ConfigError line naming the command."""
    from memstaged.errors import ConfigError

    _stand_in(tmp_path, monkeypatch, "exec >&- 2>&-\nsleep 300")
    with pytest.raises(ConfigError, match=r"systemctl --user daemon-reload: no answer within 1s"):
        systemctl("daemon-reload", timeout=1)


@pytest.mark.parametrize("value", ["2147484", "1e8", "9.3e9", "86401"])
def test_a_timeout_longer_than_a_day_is_a_usage_error(
    memory_dir: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """`status --timeout 1e8` ended in an OverflowError traceback (a poll's and a socket's
    timeout cannot be that long). More than a day is refused: exit 2, one line."""
    code = main(["status", "--check", "--timeout", value, "--memory-dir", str(memory_dir)])
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "at most 86400 seconds" in err
