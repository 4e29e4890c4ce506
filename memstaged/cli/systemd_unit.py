"""systemd integration: the user unit (``memstaged service install/uninstall``).

The notifications (readiness, status, watchdog) live in :mod:`memstaged.daemon.sd_notify`;
``Notifier`` is re-exported here for the callers that import it from this module.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from memstaged import config
from memstaged.daemon.sd_notify import Notifier
from memstaged.errors import ConfigError
from memstaged.files import fsio

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
    file_config = config.read_config(Path(settings.config_path)) if settings.config_path else None
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
    #: With ``--sandbox``: the only trees the service may write to.
    writable: tuple[str, ...] = ()
    #: The settings of the unit that differ from the one installed before, as (name, old
    #: values, new values): ``ExecStart`` after an upgrade or a move to another installation.
    changed: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = ()
    #: The service runs, and still runs the unit as it was before (not restarted).
    running_old: bool = False
    #: It was restarted (``--restart``) and now runs the unit just written.
    restarted: bool = False


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


def is_active() -> bool:
    """Whether the service runs now (``systemctl --user is-active``)."""
    return systemctl("is-active", "--quiet", UNIT_NAME).returncode == 0


def _write_atomically(target: Path, text: str) -> None:
    """Replace ``target`` (mode 0644) in one rename: a manager never reads half a unit."""
    try:
        fsio.replace_file(target, text.encode(), mode=0o644, parents=True)
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
        return fsio.read_private(path, _MAX_UNIT, follow=True).decode("utf-8")
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
        from memstaged.files.fsio import private_dirs  # the state dir and any parent it makes: 0700

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
    running_old = bool(changed) and not restart and is_active()
    reason = why_it_cannot_start(env)
    if reason is not None:
        return Installed(
            target,
            started=False,
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
        started=enable or restart,
        writable=tuple(trees),
        changed=changed,
        running_old=running_old,
        restarted=restart,
    )


@dataclass(frozen=True)
class Uninstalled:
    """What ``uninstall`` did, and what it left."""

    path: Path
    #: memstaged's own files and directories removed (``purge``).
    removed: tuple[Path, ...]
    #: memstaged's own files and directories left in place (without ``purge``), as (what, path).
    kept: tuple[tuple[str, Path], ...]
    #: Each memory dir's ``deadletter/``: never removed, by ``purge`` either.
    deadletters: tuple[Path, ...]
    #: Why the memory dirs could not be listed (a bad config file), if so.
    unlisted: str | None = None


def own_files(env: Mapping[str, str]) -> list[tuple[str, Path]]:
    """memstaged's own config and state, and the decision log where it is configured outside
    the state dir, as (what, path), those that exist."""
    from memstaged.cli.commands.completion import targets
    from memstaged.log.reader import rotated_files

    found = [
        ("config", config.default_config_path(env).parent),
        ("state (the decision log, the seen cache)", config.default_state_dir(env)),
    ]
    try:
        log_file = config.load(env=env).log_file
    except ConfigError:
        log_file = None
    if log_file is not None and not log_file.is_relative_to(found[1][1]):
        found.append(("decision log", log_file))
        with contextlib.suppress(ConfigError):  # a log dir that cannot be listed: none found
            found += [("decision log", p) for p in rotated_files(log_file)]  # NAME.1 .. NAME.N
    found += [
        (f"{t.what} completion" if t.what != "man" else "man page", t.path) for t in targets(env)
    ]
    return [(what, path) for what, path in found if path.exists() or path.is_symlink()]


def _memory_dirs(env: Mapping[str, str]) -> tuple[list[Path], str | None]:
    """The configured memory dirs (globs expanded now), or why they cannot be known."""
    try:
        return [Path(m.path) for m in config.load(env=env).memory_dirs()], None
    except ConfigError as err:
        return [], str(err)


def _remove(path: Path, keep: list[Path]) -> bool:
    """Remove ``path`` (a tree too), unless one of ``keep`` (the memory dirs) is inside it."""
    is_tree = path.is_dir() and not path.is_symlink()
    if is_tree and any(k == path or k.is_relative_to(path) for k in keep):
        return False
    fsio.remove(path, tree=True)
    return True


def uninstall(*, purge: bool = False) -> Uninstalled:
    """Stop and disable the unit if it is known, remove it, reload; with ``purge`` also remove
    memstaged's own config and state (:func:`own_files`). A memory dir's contents, its
    ``deadletter/`` included, are never removed: they are the writers' data and the only copy
    of what was quarantined.
    """
    target = unit_dir() / UNIT_NAME
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
    env = manager_environment() or dict(os.environ)
    memory_dirs, unlisted = _memory_dirs(env)
    deadletters = tuple(d for d in (m / "deadletter" for m in memory_dirs) if d.is_dir())
    own = own_files(env)
    if not purge:
        return Uninstalled(target, (), tuple(own), deadletters, unlisted)
    removed, kept = [], []
    for what, path in own:
        try:
            gone = _remove(path, memory_dirs)
        except OSError as err:
            raise ConfigError(f"cannot remove {path}: {err.strerror}") from None
        if gone:
            removed.append(path)
        else:
            kept.append((what, path))
    return Uninstalled(target, tuple(removed), tuple(kept), deadletters, unlisted)
