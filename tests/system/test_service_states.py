"""What `service install` and `service uninstall` say, against the state a real ``systemd --user``
manager reports (issue 31 items 8 and 9): each message names what the command did to the unit,
and `uninstall --purge` removes the metrics file and the control socket a killed daemon left.

The manager and journald are private to each test (``tests/support/systemd_env.py``); the unit
is installed from this checkout's ``.venv`` as a user would.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.systemd_env import UserSystemd, unavailable_reason, user_systemd
from support.waiting import wait_until

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.systemd,
    pytest.mark.skipif(REASON is not None, reason=f"no private systemd here: {REASON}"),
]

UNIT = "memstaged.service"
MEMSTAGED = Path(sys.executable).parent / "memstaged"


def _memstaged(sd: UserSystemd, *args: str) -> subprocess.CompletedProcess[str]:
    return sd.run(str(MEMSTAGED), "service", *args)


def _config(sd: UserSystemd, tmp_path: Path, extra: str = "") -> Path:
    mdir = tmp_path / "project" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True, exist_ok=True)
    path = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"memory_dirs = [{json.dumps(str(mdir))}]\n{extra}")
    return path


def _state(sd: UserSystemd) -> tuple[str, str, str]:
    """(ActiveState, UnitFileState, MainPID) as the manager says them."""
    props = sd.show(UNIT, "ActiveState", "UnitFileState", "MainPID")
    return props["ActiveState"], props["UnitFileState"], props["MainPID"]


def test_install_says_what_it_did_to_the_unit(tmp_path: Path) -> None:
    """Issue 31 item 8: `service install` and `install --enable` print the state the manager
    reports, and what they changed in it, in each case: a first install (not enabled or
    running), a first --enable (enabled and started), a plain install over an enabled and
    running unit (no "start it with"), --enable over it (nothing started: the same main pid),
    a stopped enabled unit, a running unit that is not enabled, and a config error while it
    runs (it runs on: restart it once fixed)."""
    with user_systemd() as sd:
        config = _config(sd, tmp_path)
        first = _memstaged(sd, "install")
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines()[-1] == (
            f"{UNIT} is not enabled or running: start it with: "
            "systemctl --user enable --now memstaged"
        )

        enabled = _memstaged(sd, "install", "--enable")
        assert enabled.returncode == 0, enabled.stderr
        assert enabled.stdout.splitlines()[-1] == f"enabled and started {UNIT}"
        pid = _state(sd)[2]
        assert _state(sd) == ("active", "enabled", pid) and pid != "0"

        again = _memstaged(sd, "install")
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[-1] == f"{UNIT} is enabled and running"
        assert "start it with" not in again.stdout + again.stderr

        enabled_again = _memstaged(sd, "install", "--enable")
        assert enabled_again.returncode == 0, enabled_again.stderr
        assert enabled_again.stdout.splitlines()[-1] == f"{UNIT} was already enabled and running"
        assert _state(sd) == ("active", "enabled", pid)  # nothing was started

        sd.systemctl("stop", UNIT, check=True)
        stopped = _memstaged(sd, "install")
        assert stopped.stdout.splitlines()[-1] == (
            f"{UNIT} is enabled and not running: start it with: systemctl --user start memstaged"
        )
        started = _memstaged(sd, "install", "--enable")
        assert started.stdout.splitlines()[-1] == f"started {UNIT} (it was already enabled)"
        active, _, pid = _state(sd)
        assert active == "active"

        sd.systemctl("disable", UNIT, check=True)
        not_enabled = _memstaged(sd, "install")
        assert not_enabled.stdout.splitlines()[-1] == (
            f"{UNIT} is running, not enabled: enable it (started at login) with: "
            "systemctl --user enable memstaged"
        )
        enabled_only = _memstaged(sd, "install", "--enable")
        assert enabled_only.stdout.splitlines()[-1] == f"enabled {UNIT} (it was already running)"
        assert _state(sd) == ("active", "enabled", pid)

        config.write_text("memory_dirs = [\n")
        broken = _memstaged(sd, "install", "--enable")
        assert broken.returncode == 1
        assert broken.stderr.startswith(
            f"memstaged: {UNIT} runs on as it was started: {config}: not valid TOML"
        )
        assert broken.stderr.endswith(", then run: systemctl --user restart memstaged\n")
        assert len(broken.stderr.splitlines()) == 1
        assert _state(sd) == ("active", "enabled", pid)
        assert _memstaged(sd, "uninstall").returncode == 0


def test_uninstall_says_what_it_did_to_the_unit(tmp_path: Path) -> None:
    """Issue 31 item 8: `service uninstall` says "stopped, disabled and removed" only of a unit
    that was running and enabled; of one that was only installed, "removed"; of one whose
    file was gone while it ran, that it was stopped; and of none, that there was nothing to
    do (it said "stopped, disabled and removed" in every case)."""
    with user_systemd() as sd:
        unit = sd.unit_dir / UNIT
        nothing = _memstaged(sd, "uninstall")
        assert nothing.returncode == 0, nothing.stderr
        assert nothing.stdout.splitlines()[0] == (
            f"{UNIT} was not installed: nothing to stop, disable or remove"
        )

        _config(sd, tmp_path)
        assert _memstaged(sd, "install", "--enable").returncode == 0
        everything = _memstaged(sd, "uninstall")
        assert everything.stdout.splitlines()[0] == f"stopped, disabled and removed {unit}"
        assert sd.show(UNIT, "ActiveState", "LoadState") == {
            "ActiveState": "inactive",
            "LoadState": "not-found",
        }

        assert _memstaged(sd, "install").returncode == 0
        assert _memstaged(sd, "uninstall").stdout.splitlines()[0] == f"removed {unit}"

        assert _memstaged(sd, "install").returncode == 0
        sd.systemctl("start", UNIT, check=True)
        unit.unlink()  # removed by hand; the manager still runs it
        gone = _memstaged(sd, "uninstall")
        assert gone.stdout.splitlines()[0] == f"stopped {UNIT} ({unit} was not there)"
        assert sd.show(UNIT, "ActiveState")["ActiveState"] == "inactive"


def test_purge_removes_the_metrics_file_and_a_killed_daemons_socket(tmp_path: Path) -> None:
    """Issue 31 item 9: after the service's daemon was killed (SIGKILL, as the watchdog's
    SIGABRT leaves it) and restarted, its control socket stays, no daemon listening; the
    metrics file stays after the service is gone (an alert on it fires for ever). `uninstall`
    lists both among what stays; `uninstall --purge` removes them, and the runtime dir."""
    prom = tmp_path / "textfile" / "memstaged.prom"
    prom.parent.mkdir()
    with user_systemd() as sd:
        _config(sd, tmp_path, f"metrics_file = {json.dumps(str(prom))}\n")
        assert _memstaged(sd, "install", "--enable").returncode == 0
        wait_until(prom.exists, timeout=20, what="the metrics file")
        killed = _state(sd)[2]
        sd.systemctl("kill", "-s", "SIGKILL", UNIT, check=True)
        wait_until(
            lambda: _state(sd)[0] == "active" and _state(sd)[2] not in ("0", killed),
            timeout=30,
            what="the service restarted after SIGKILL",
        )
        runtime = Path(sd.env["XDG_RUNTIME_DIR"]) / "memstaged"
        stale = runtime / f"daemon-{killed}.sock"
        assert stat.S_ISSOCK(stale.lstat().st_mode)

        kept = _memstaged(sd, "uninstall")
        assert kept.returncode == 0, kept.stderr
        lines = kept.stdout.splitlines()
        assert f"  {prom}  (metrics file)" in lines
        assert f"  {stale}  (control socket of a daemon that is gone)" in lines
        assert prom.is_file() and stale.exists()

        purged = _memstaged(sd, "uninstall", "--purge")
        assert purged.returncode == 0, purged.stderr
        lines = purged.stdout.splitlines()
        assert {f"removed {prom}", f"removed {stale}", f"removed {runtime}"} <= set(lines)
        assert not prom.exists() and not os.path.lexists(stale) and not runtime.exists()
        assert sorted(p.name for p in prom.parent.iterdir()) == []
