"""systemd integration: the user unit (``memstaged service install/uninstall``).

memstaged's own files, which ``uninstall`` lists and ``--purge`` removes, are
:mod:`memstaged.cli.own_files`'s. The notifications (readiness, status, watchdog) live in
:mod:`memstaged.daemon.sd_notify`; ``Notifier`` is re-exported here for the callers that
import it from this module.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from memstaged import config, config_file
from memstaged.cli.systemctl import systemctl
from memstaged.daemon.sd_notify import Notifier
from memstaged.errors import ConfigError
from memstaged.files import atomic_write, fsio, safe_open

__all__ = [  # Notifier is re-exported: it lived here before memstaged.daemon.sd_notify
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
#: A unit file larger than this is not one memstaged wrote.
_MAX_UNIT: Final = 1024 * 1024
#: What to run once memory dirs are configured (said when ``install --enable`` does not start).
ENABLE_COMMAND: Final = "systemctl --user enable --now memstaged"
#: What makes a running service run the unit just installed.
RESTART_COMMAND: Final = "systemctl --user restart memstaged"
#: What starts an enabled service that is not running.
START_COMMAND: Final = "systemctl --user start memstaged"
#: What makes a running service start at login too.
ENABLE_ONLY_COMMAND: Final = "systemctl --user enable memstaged"
#: The drop-in ``install --sandbox`` writes, beside the unit.
SANDBOX_DROPIN: Final = f"{UNIT_NAME}.d/sandbox.conf"
#: The throwaway unit that checks, before the drop-in is written, that the manager can run it.
SANDBOX_CHECK_UNIT: Final = "memstaged-sandbox-check.service"
#: What the sandbox adds to the unit. ``PrivateUsers=yes`` gives the service a user namespace,
#: in which a normal user's manager may drop capabilities and set up mounts: without it,
#: systemd 252 fails the first four (218/CAPABILITIES) and ignores the rest (docs/daemon.md).
#: ProtectKernelTunables= and ProtectControlGroups= are not here: under PrivateUsers= they left
#: the service an empty /run (no journald socket, no notify socket in /run/user/UID).
SANDBOX_OPTIONS: Final = (
    "PrivateUsers=yes",
    "PrivateDevices=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectSystem=strict",
)


def exec_quote(path: str) -> str:
    """``path`` as one word of an ``ExecStart=`` line: specifiers, variables and spaces escaped."""
    escaped = path.replace("%", "%%").replace("$", "$$")
    if any(c.isspace() or c in "\\\"';" for c in escaped):
        escaped = '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


#: The executable the packaged unit names (``make install``'s link), replaced by ``install``.
TEMPLATE_EXECUTABLE: Final = "%h/.local/bin/memstaged"


def unit_text(executable: str) -> str:
    """The packaged unit with ``ExecStart=`` and ``ExecReload=`` (the config check) running
    ``executable``."""
    template = resources.files("memstaged").joinpath("data/memstaged.service").read_text()
    lines = []
    for line in template.splitlines():
        setting, _, command = line.partition("=")
        program, space, rest = command.partition(" ")
        if setting in ("ExecStart", "ExecReload") and program == TEMPLATE_EXECUTABLE:
            lines.append(f"{setting}={exec_quote(executable)}{space}{rest}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def unit_quote(word: str) -> str:
    """``word`` as one quoted word of a unit file setting: specifiers and quotes escaped."""
    escaped = word.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _literal_prefix(pattern: str, home: str) -> str:
    """The directories of ``pattern`` before its first glob component, absolute (a relative
    pattern is relative to the service's working directory, the home directory)."""
    if pattern == "~" or pattern.startswith("~/"):  # the service's home, not this shell's
        pattern = home + pattern[1:]
    path = os.path.join(home, os.path.expanduser(pattern))
    parts: list[str] = []
    for part in path.split("/"):
        if glob.has_magic(part):
            break
        parts.append(part)
    return os.path.normpath("/".join(parts) or "/")


def writable_trees(env: Mapping[str, str]) -> list[str]:
    """What the sandbox leaves writable: each memory-dir pattern's literal prefix (its nearest
    directory that exists now, so a memory dir created later below it is writable too), the
    state dir, the decision log's directory, ``$XDG_RUNTIME_DIR`` (the control socket) and the
    metrics file's directory. Everything else is read-only to the service."""
    settings = config.load(env=env)
    home = env.get("HOME") or str(Path.home())
    file_config = (
        config_file.read_config(Path(settings.config_path)) if settings.config_path else None
    )
    env_dirs = env.get(config.ENV_PREFIX + "MEMORY_DIRS")
    patterns = env_dirs.split(os.pathsep) if env_dirs else []
    patterns = patterns or (list(file_config.memory_dirs) if file_config else [])
    patterns = patterns or [config.DEFAULT_MEMORY_DIR]
    trees: list[str] = []
    for pattern in patterns:
        tree = _literal_prefix(pattern, home)
        while not os.path.isdir(tree) and tree != "/":
            tree = os.path.dirname(tree)
        trees.append(tree)
    state = settings.state_dir or config.default_state_dir(env)
    trees += [str(state), str(settings.log_file.parent)]
    # The control socket under $XDG_RUNTIME_DIR (ProtectSystem=strict
    # makes /run read-only), and the metrics file's directory.
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        trees.append(runtime)
    if settings.metrics_file is not None:
        trees.append(str(settings.metrics_file.parent))
    return sorted(set(trees))


def sandbox_text(trees: list[str]) -> str:
    """The drop-in: the sandbox options, and ``ReadWritePaths=`` for ``trees`` only ("-": a
    tree removed since is skipped rather than failing the start)."""
    paths = " ".join(unit_quote(f"-{tree}") for tree in trees)
    return (
        "# Written by `memstaged service install --sandbox` from the config's memory_dirs;\n"
        "# run it again after adding a memory dir outside these trees.\n"
        "[Service]\n"
        + "".join(f"{line}\n" for line in SANDBOX_OPTIONS)
        + f"ReadWritePaths={paths}\n"
    )


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
        file_dirs = (
            config_file.read_config(Path(settings.config_path)) if settings.config_path else None
        )
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
    """What ``install`` did: the unit written, and the service's state before and after (what
    was enabled or started is their difference, not what was asked)."""

    path: Path
    before: UnitState
    after: UnitState
    #: Why the unit was not (and should not be) started: no memory dir, a config error.
    cannot_start: CannotStart | None = None
    #: With ``--sandbox``: the only trees the service may write to.
    writable: tuple[str, ...] = ()
    #: The settings of the unit that differ from the one installed before, as (name, old
    #: values, new values): ``ExecStart`` after an upgrade or a move to another installation.
    changed: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = ()
    #: The service runs, and still runs the unit as it was before (not restarted).
    running_old: bool = False


def _settings(text: str) -> dict[str, tuple[str, ...]]:
    """A unit's settings by name, each with its values in order (a setting may repeat)."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            found.setdefault(f"{section}{name.strip()}", []).append(value.strip())
    return {name: tuple(values) for name, values in found.items()}


def unit_changes(
    old: str | None, new: str
) -> tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]:
    """Which settings ``new`` changes in the unit ``old`` (nothing when there was none), named
    without their section when it is ``[Service]``, as ``systemctl cat`` users know them."""
    if old is None:
        return ()
    before, after = _settings(old), _settings(new)
    changes = []
    for key in [*after, *(k for k in before if k not in after)]:
        if before.get(key, ()) != after.get(key, ()):
            changes.append((key.removeprefix("[Service]"), before.get(key, ()), after.get(key, ())))
    return tuple(changes)


#: ``ActiveState=`` values of a service that has a process, or is about to have one.
_RUNNING: Final = frozenset({"active", "reloading", "activating", "deactivating"})


@dataclass(frozen=True)
class UnitState:
    """What the user manager says of the service now: whether it has a unit file for it
    (``LoadState=loaded``; ``FragmentPath`` names the file), runs it, and starts it at login."""

    loaded: bool = False
    running: bool = False
    enabled: bool = False
    failed: bool = False
    fragment: str = ""

    def described(self) -> str:
        """``memstaged.service is enabled and running`` and the like: the state, in words."""
        started = "running" if self.running else "failed" if self.failed else "not running"
        if self.enabled:
            return f"{UNIT_NAME} is enabled and {started}"
        if self.running or self.failed:
            return f"{UNIT_NAME} is {started}, not enabled"
        return f"{UNIT_NAME} is not enabled or running"


def unit_state() -> UnitState:
    """The service's state, asked of the user manager (``systemctl --user show``). A manager
    that cannot be asked (none is running) knows no unit: nothing runs or is enabled."""
    result = systemctl("show", "-p", "LoadState,ActiveState,UnitFileState,FragmentPath", UNIT_NAME)
    if result.returncode != 0:
        return UnitState()
    props = dict(line.partition("=")[::2] for line in result.stdout.splitlines())
    active = props.get("ActiveState", "")
    return UnitState(
        loaded=props.get("LoadState") == "loaded",
        running=active in _RUNNING,
        enabled=props.get("UnitFileState") in ("enabled", "enabled-runtime"),
        failed=active == "failed",
        fragment=props.get("FragmentPath", ""),
    )


def _write_atomically(target: Path, text: str) -> None:
    """Replace ``target`` (mode 0644) in one rename: a manager never reads half a unit."""
    try:
        atomic_write.replace_file(target, text.encode(), mode=0o644, parents=True)
    except OSError as err:
        raise ConfigError(f"cannot write {target}: {err.strerror}") from None


def service_lines(text: str) -> list[str]:
    """The ``[Service]`` settings of a unit or drop-in, without comments (tests read them too)."""
    section, lines = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            lines.append(line)
    return lines


def check_sandbox(unit: str, dropin: str, executable: str) -> None:
    """Run ``memstaged --version`` once, as a throwaway unit with the unit's hardening and the
    sandbox, and raise ConfigError (one line, with the exit status) if this manager cannot.

    Where user namespaces are switched off, or systemd cannot set up the mounts, the sandbox
    would fail the service at every start; this finds out before anything is enabled.
    """
    hardening = [
        line
        for line in service_lines(unit)
        if line.split("=", 1)[0] not in {"Type", "ExecStart", "ExecReload", "WatchdogSec"}
        and not line.startswith(("Restart", "NotifyAccess"))
    ]
    check = unit_dir() / SANDBOX_CHECK_UNIT
    body = "\n".join([*hardening, *service_lines(dropin)])
    _write_atomically(
        check,
        f"[Service]\nType=oneshot\nExecStart={exec_quote(executable)} --version\n{body}\n",
    )
    try:
        _checked("daemon-reload")
        started = systemctl("start", SANDBOX_CHECK_UNIT)
        if started.returncode != 0:
            shown = systemctl("show", "-p", "ExecMainStatus", "--value", SANDBOX_CHECK_UNIT)
            status = shown.stdout.strip() or "?"
            raise ConfigError(
                f"the sandbox cannot run in this user manager (a check unit exited with status "
                f"{status}: see journalctl --user -u {SANDBOX_CHECK_UNIT}); "
                "install without --sandbox"
            )
    finally:
        fsio.remove(check)
        systemctl("daemon-reload")
        systemctl("reset-failed", SANDBOX_CHECK_UNIT)  # fails harmlessly when it did not fail


def _read_if_there(path: Path) -> str | None:
    try:  # a unit file may be a link (a dotfile manager's): the user's own path, followed
        return safe_open.read_private(path, _MAX_UNIT, follow=True).decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from None


def install(*, enable: bool, sandbox: bool = False, restart: bool = False) -> Installed:
    """Write the unit to ``~/.config/systemd/user/``, reload, optionally enable, start or
    restart it.

    The file is written atomically, so a running manager never reads half a unit. The settings
    that differ from the unit installed before are returned (``ExecStart`` names another
    installation after ``pipx install`` then ``make install``, say). With ``enable`` it is
    enabled and started if it is not running; a running service is restarted only with
    ``restart`` (an install must not silently swap the program under a running
    daemon), else the result says that it still runs the old unit.
    When the service would exit at once (no memory dir configured, a bad config file), the unit
    is written but neither enabled nor started: starting it would only leave a failed unit, and
    an enabled one would fail again at every login.

    With ``sandbox``, the drop-in :data:`SANDBOX_DROPIN` is (re)written from the config's memory
    dirs, after :func:`check_sandbox` showed that this manager can run it; without, an earlier
    one is removed.
    """
    target = unit_dir() / UNIT_NAME
    executable = installed_executable()
    text = unit_text(executable)
    before = unit_state()
    previous = _read_if_there(target)
    changed = unit_changes(previous, text)
    _write_atomically(target, text)
    env = manager_environment() or dict(os.environ)
    dropin = unit_dir() / SANDBOX_DROPIN
    old_dropin = _read_if_there(dropin)
    trees: list[str] = []
    if sandbox:
        trees = writable_trees(env)
        state = config.default_state_dir(env)
        from memstaged.files.private_dirs import (
            private_dirs,  # the state dir, parents it makes: 0700
        )

        try:  # it must exist at start: the sandbox makes its parent read-only
            private_dirs(state)
        except OSError as err:
            raise ConfigError(f"cannot create {state}: {err.strerror}") from None
        dropin_text = sandbox_text(trees)
        check_sandbox(text, dropin_text, executable)
        _write_atomically(dropin, dropin_text)
    elif dropin.exists():
        fsio.remove(dropin)
        fsio.remove_empty_dir(dropin.parent)  # other drop-ins of the user's stay
    if previous is not None:  # a drop-in added or removed changes the service as much
        new_dropin = _read_if_there(dropin)
        changed += tuple(
            (f"{SANDBOX_DROPIN}: {name}", old, new)
            for name, old, new in unit_changes(old_dropin or "", new_dropin or "")
        )
    _checked("daemon-reload")
    running_old = bool(changed) and not restart and before.running
    reason = why_it_cannot_start(env)
    if reason is not None:
        return Installed(
            target,
            before,
            unit_state(),
            cannot_start=reason,
            writable=tuple(trees),
            changed=changed,
            running_old=running_old,
        )
    if enable:
        _checked("enable", UNIT_NAME)
    if restart:
        _checked("restart", UNIT_NAME)
    elif enable:
        _checked("start", UNIT_NAME)  # a running service is left as it runs
    return Installed(
        target,
        before,
        unit_state(),
        writable=tuple(trees),
        changed=changed,
        running_old=running_old,
    )


@dataclass(frozen=True)
class Uninstalled:
    """What ``uninstall`` did, and what it left."""

    path: Path
    #: The service's state before (what was stopped and disabled) and after the uninstall.
    before: UnitState
    after: UnitState
    #: Whether the unit file was there to remove.
    had_unit: bool
    #: memstaged's own files and directories removed (``purge``).
    removed: tuple[Path, ...]
    #: memstaged's own files and directories left in place, as (what, path): all of them
    #: without ``purge``; with it, those it may not remove (``what`` then says why).
    kept: tuple[tuple[str, Path], ...]
    #: Each memory dir's ``deadletter/``: never removed, by ``purge`` either.
    deadletters: tuple[Path, ...]
    #: Why the memory dirs could not be listed (a bad config file), if so.
    unlisted: str | None = None
    #: The control sockets a daemon still listens on: one running outside the service.
    listening: tuple[Path, ...] = ()


def uninstall(*, purge: bool = False) -> Uninstalled:
    """Stop and disable the unit if it is known, remove it, reload; with ``purge`` also remove
    memstaged's own files (:mod:`memstaged.cli.own_files`: config, state, metrics file, stale
    control sockets, and the runtime dir ``$XDG_RUNTIME_DIR/memstaged`` once empty). A memory
    dir's contents, its ``deadletter/`` included, are never removed: they are the writers' data
    and the only copy of what was quarantined.
    """
    from memstaged.cli import own_files
    from memstaged.daemon.control_socket import left_sockets

    target = unit_dir() / UNIT_NAME
    before = unit_state()
    had_unit = target.exists() or target.is_symlink()
    systemctl("disable", "--now", UNIT_NAME)  # fails harmlessly when it was never enabled
    systemctl("stop", UNIT_NAME)  # started without being enabled
    dropin = unit_dir() / SANDBOX_DROPIN
    try:
        fsio.remove(target)
        fsio.remove(dropin)
    except OSError as err:
        raise ConfigError(f"cannot remove {err.filename or target}: {err.strerror}") from None
    fsio.remove_empty_dir(dropin.parent)
    _checked("daemon-reload")
    systemctl("reset-failed", UNIT_NAME)  # forget a failed state; fails when there is none
    after = unit_state()
    env = manager_environment() or dict(os.environ)
    memory_dirs, unlisted = own_files.memory_dirs(env)
    deadletters = tuple(d for d in (m / "deadletter" for m in memory_dirs) if d.is_dir())
    own = own_files.own_files(env)
    listening = tuple(left_sockets(env)[1])
    if not purge:
        kept = tuple((what, path) for what, path, _ in own)
        return Uninstalled(
            target, before, after, had_unit, (), kept, deadletters, unlisted, listening
        )
    removed, kept_purged = own_files.purge(own, memory_dirs, env)
    return Uninstalled(
        target,
        before,
        after,
        had_unit,
        tuple(removed),
        tuple(kept_purged),
        deadletters,
        unlisted,
        listening,
    )
