"""systemd integration: readiness, status and watchdog notifications, and the user unit.

Notifications go through ``systemd.daemon.notify`` (systemd-python); outside systemd (no
``NOTIFY_SOCKET``) they are no-ops, so the daemon runs the same in a terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Final

from memstaged.errors import ConfigError

UNIT_NAME: Final = "memstaged.service"


class Notifier:
    """sd_notify, and the watchdog interval systemd asked for (half of ``WATCHDOG_USEC``)."""

    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notify = None
        if self.enabled:
            from systemd import daemon

            self._notify = daemon.notify
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        wanted = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        #: Seconds between WATCHDOG=1 pings, or None when systemd does not watch us.
        self.watchdog_interval: float | None = int(usec) / 2e6 if wanted else None

    def send(self, *lines: str) -> None:
        if self._notify is not None:
            self._notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        self.send("RELOADING=1", "STATUS=reloading configuration")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def ping(self) -> None:
        self.send("WATCHDOG=1")


def unit_text(executable: str) -> str:
    """The packaged unit with ``ExecStart`` pointing at ``executable``."""
    template = resources.files("memstaged").joinpath("data/memstaged.service").read_text()
    lines = [
        f"ExecStart={executable}" if line.startswith("ExecStart=") else line
        for line in template.splitlines()
    ]
    return "\n".join(lines) + "\n"


def installed_executable() -> str:
    """The absolute path of the ``memstaged`` script of this installation."""
    beside = Path(sys.executable).parent / "memstaged"
    if beside.exists():
        return str(beside)
    found = shutil.which("memstaged")
    if found is None:
        raise ConfigError("cannot find the installed memstaged executable on PATH")
    return str(Path(found).absolute())


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["systemctl", "--user", *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise ConfigError("systemctl is not installed: is this a systemd machine?") from None


def _checked(*args: str) -> None:
    result = systemctl(*args)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise ConfigError(
            f"systemctl --user {' '.join(args)}: {message[0] if message else 'failed'}"
        )


def install(*, enable: bool) -> Path:
    """Write the unit to ``~/.config/systemd/user/``, reload, optionally enable and start it."""
    target = unit_dir() / UNIT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(unit_text(installed_executable()))
    _checked("daemon-reload")
    if enable:
        _checked("enable", "--now", UNIT_NAME)
    return target


def uninstall() -> Path:
    """Stop and disable the unit if it is known, remove it, reload."""
    target = unit_dir() / UNIT_NAME
    systemctl("disable", "--now", UNIT_NAME)  # fails harmlessly when it was never enabled
    target.unlink(missing_ok=True)
    _checked("daemon-reload")
    return target
