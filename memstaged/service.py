"""systemd integration: the user unit (``memstaged service install/uninstall``).

The notifications (readiness, status, watchdog) live in :mod:`memstaged.notify`; ``Notifier`` is
re-exported here for the callers that import it from this module.
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
from memstaged.notify import Notifier

__all__ = [  # Notifier is re-exported: it lived here before memstaged.notify
    "UNIT_NAME",
    "Notifier",
    "exec_quote",
    "install",
    "installed_executable",
    "systemctl",
    "uninstall",
    "unit_dir",
    "unit_text",
]

UNIT_NAME: Final = "memstaged.service"


def exec_quote(path: str) -> str:
    """``path`` as one word of an ``ExecStart=`` line: specifiers, variables and spaces escaped."""
    escaped = path.replace("%", "%%").replace("$", "$$")
    if any(c.isspace() or c in "\\\"';" for c in escaped):
        escaped = '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


def unit_text(executable: str) -> str:
    """The packaged unit with ``ExecStart`` pointing at ``executable``."""
    template = resources.files("memstaged").joinpath("data/memstaged.service").read_text()
    lines = [
        f"ExecStart={exec_quote(executable)}" if line.startswith("ExecStart=") else line
        for line in template.splitlines()
    ]
    return "\n".join(lines) + "\n"


def installed_executable() -> str:
    """The absolute path of the ``memstaged`` script of this installation."""
    beside = Path(sys.executable).parent / "memstaged"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which("memstaged")
    if found is None:
        raise ConfigError("cannot find the installed memstaged executable on PATH")
    return str(Path(found).absolute())


def unit_dir() -> Path:
    """``$XDG_CONFIG_HOME/systemd/user`` (``~/.config/systemd/user``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    """``systemctl --user ARGS``; a missing systemctl is a one-line error."""
    try:
        return subprocess.run(
            ["systemctl", "--user", "--no-ask-password", *args],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise ConfigError("systemctl is not installed: is this a systemd machine?") from None


def _checked(*args: str) -> None:
    result = systemctl(*args)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise ConfigError(f"systemctl --user {' '.join(args)}: {lines[0] if lines else 'failed'}")


def install(*, enable: bool) -> Path:
    """Write the unit to ``~/.config/systemd/user/``, reload, optionally enable and (re)start it.

    The file is written atomically, so a running manager never reads half a unit. With
    ``enable``, a service that already runs is restarted so that it runs the unit just written.
    """
    target = unit_dir() / UNIT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    text = unit_text(installed_executable())
    tmp = target.with_name(f".{UNIT_NAME}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o644)
        tmp.replace(target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {target}: {err.strerror}") from None
    _checked("daemon-reload")
    if enable:
        _checked("enable", UNIT_NAME)
        _checked("restart", UNIT_NAME)
    return target


def uninstall() -> Path:
    """Stop and disable the unit if it is known, remove it, reload."""
    target = unit_dir() / UNIT_NAME
    systemctl("disable", "--now", UNIT_NAME)  # fails harmlessly when it was never enabled
    systemctl("stop", UNIT_NAME)  # started without being enabled
    target.unlink(missing_ok=True)
    _checked("daemon-reload")
    systemctl("reset-failed", UNIT_NAME)  # forget a failed state; fails when there is none
    return target
