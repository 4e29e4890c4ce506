"""systemd integration: readiness, status and watchdog notifications, and the user unit.

Notifications go through ``systemd.daemon.notify`` (systemd-python); outside systemd (no
``NOTIFY_SOCKET``) they are no-ops, so the daemon runs the same in a terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from memstaged import config
from memstaged.errors import ConfigError

UNIT_NAME: Final = "memstaged.service"
#: What to run once memory dirs are configured (said when ``install --enable`` does not start).
ENABLE_COMMAND: Final = "systemctl --user enable --now memstaged"


class Notifier:
    """sd_notify, and the watchdog interval systemd asked for (half of ``WATCHDOG_USEC``)."""

    def __init__(
        self,
        environ: dict[str, str] | None = None,
        send: Callable[[str], object] | None = None,
    ) -> None:
        env = dict(os.environ) if environ is None else environ
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._notify = send
        if self._notify is None and self.enabled:
            from systemd import daemon

            self._notify = daemon.notify
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        wanted = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        #: Seconds between WATCHDOG=1 pings, or None when systemd does not watch us.
        self.watchdog_interval: float | None = int(usec) / 2e6 if wanted else None

    def send(self, *lines: str) -> None:
        if self._notify is not None:
            self._notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd >= 253 match the reload to this notification.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading configuration")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def ping(self) -> None:
        self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for more start-up time (a large backlog is decided before ``READY=1``)."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")


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


def manager_environment() -> dict[str, str]:
    """The user manager's environment (``systemctl --user show-environment``): what the
    service inherits, so ``HOME``, ``XDG_CONFIG_HOME`` and ``MEMSTAGED_*`` as the service sees
    them, not as this shell has them."""
    result = systemctl("show-environment")
    if result.returncode != 0:
        return {}
    env: dict[str, str] = {}
    for line in result.stdout.splitlines():
        name, sep, value = line.partition("=")
        if sep and not value.startswith("$'"):  # values systemd had to escape: none we read
            env[name] = value
    return env


@dataclass(frozen=True)
class CannotStart:
    """Why the service would exit 2 as soon as it starts, and what the user should do first."""

    reason: str
    fix: str


def why_it_cannot_start(env: Mapping[str, str]) -> CannotStart | None:
    """Why the service, started in ``env``, would exit 2 at once; None when it has work.

    It resolves the settings as the daemon does (``config.load``: the config file, then the
    ``MEMSTAGED_*`` variables), in the service's working directory, which a user manager sets
    to the home directory: there the default ``./.pi/memory/project`` is
    ``~/.pi/memory/project``. Only "no memory dir" and config errors are caught here; a memory
    dir that does not exist yet is fine (the daemon waits for it).
    """
    try:
        settings = config.load(env=env)  # every config error the daemon would exit 2 for
        file_dirs = config.read_config(Path(settings.config_path)) if settings.config_path else None
    except ConfigError as err:
        return CannotStart(str(err), "fix it")
    # load() falls back to ./.pi/memory/project of *this* process's directory; the service's
    # is the home directory, so the fallback is looked for there instead.
    if env.get(config.ENV_PREFIX + "MEMORY_DIRS") or (file_dirs and file_dirs.memory_dirs):
        return None
    home = env.get("HOME") or str(Path.home())
    if (Path(home) / config.DEFAULT_MEMORY_DIR).is_dir():
        return None
    path = config.default_config_path(env)
    return CannotStart(
        f"no memory dir is configured in {path}",
        'write memory_dirs = ["~/src/*/.pi/memory/project"] (your projects) there',
    )


@dataclass(frozen=True)
class Installed:
    """What ``install`` did: the unit written, and whether it was enabled and started."""

    path: Path
    started: bool
    #: Why the unit was not (and should not be) started: no memory dir, a config error.
    cannot_start: CannotStart | None = None


def install(*, enable: bool) -> Installed:
    """Write the unit to ``~/.config/systemd/user/``, reload, optionally enable and (re)start it.

    The file is written atomically, so a running manager never reads half a unit. With
    ``enable``, a service that already runs is restarted so that it runs the unit just written.
    When the service would exit at once (no memory dir configured, a bad config file), the unit
    is written but neither enabled nor started: starting it would only leave a failed unit, and
    an enabled one would fail again at every login.
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
    reason = why_it_cannot_start(manager_environment() or os.environ)
    if reason is not None:
        return Installed(target, started=False, cannot_start=reason)
    if enable:
        _checked("enable", UNIT_NAME)
        _checked("restart", UNIT_NAME)
    return Installed(target, started=enable)


def uninstall() -> Path:
    """Stop and disable the unit if it is known, remove it, reload."""
    target = unit_dir() / UNIT_NAME
    systemctl("disable", "--now", UNIT_NAME)  # fails harmlessly when it was never enabled
    systemctl("stop", UNIT_NAME)  # started without being enabled
    target.unlink(missing_ok=True)
    _checked("daemon-reload")
    systemctl("reset-failed", UNIT_NAME)  # forget a failed state; fails when there is none
    return target
