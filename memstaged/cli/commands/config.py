"""``memstaged config check|show``: is the configuration good, and what does it resolve to.

Both resolve the settings exactly as a run does (:func:`memstaged.config.load`:
option, ``MEMSTAGED_*`` variable, the config file, default), so they cannot disagree with it.

``check`` says ``ok`` (exit 0) or the one line naming the file and the key (exit 2). The unit's
``ExecReload=`` runs it with ``--reload $MAINPID``: a bad config fails
``systemctl --user reload``, as ``nginx -t`` gates nginx's reload, and the daemon is sent SIGHUP
either way, so that on a bad config it keeps its settings and says why in ``STATUS=``.

``show`` prints each setting's effective value and where it came from, one line each, as
``git config --show-origin --list`` does: the origin (``option:--settle``,
``env:MEMSTAGED_SETTLE``, ``file:PATH``, ``default``), a tab, ``key=value`` with the value as
TOML writes it (a line can be pasted into the config file); ``--json``, one object a setting.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from memstaged import config, safe_text
from memstaged.cli.commands._common import add_json_option, add_memory_dir_options
from memstaged.cli.commands._output import guard_output, print_json
from memstaged.config import SettingOrigin, Settings
from memstaged.errors import MemstagedError, UsageError
from memstaged.files import safe_open


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "config",
        help="check the configuration, or show each setting and where it came from",
        description="The settings as a run resolves them: command-line option, then "
        "MEMSTAGED_* environment variable, then the config file, then the default.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="exit 0 when the configuration loads, else one line naming the key and exit 2",
        description="Resolve the settings as the daemon would (the config file and the "
        "MEMSTAGED_* variables) and change nothing. Exit 0 when they load, 2 with one line "
        "naming the file and the key when they do not.",
    )
    check.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the TOML config file (default $MEMSTAGED_CONFIG, "
        "else $XDG_CONFIG_HOME/memstaged/config.toml)",
    )
    check.add_argument(
        "--reload",
        type=_pid,
        metavar="PID",
        help="then send SIGHUP to the memstaged daemon PID, whatever the check found (the "
        "unit's ExecReload=): on a bad config the daemon keeps its settings and says why in "
        "its STATUS=, and this command still exits 2, which fails `systemctl reload`",
    )
    check.set_defaults(func=run_check)
    show = actions.add_parser(
        "show",
        help="each setting's effective value and its origin: option, environment, file, default",
        description="One line a setting: its origin (option:--settle, env:MEMSTAGED_SETTLE, "
        "file:PATH or default), a tab, then key=value as TOML writes it. The options are "
        "those of a run, to see what they would change.",
    )
    add_memory_dir_options(show, triage=True)
    add_json_option(show)
    show.set_defaults(func=run_show)


def _pid(text: str) -> int:
    """A process ID that can be signalled alone: 0 and -1 would signal a group or everything."""
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a process ID") from None
    if pid <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected the daemon's process ID")
    return pid


def _load(args: argparse.Namespace) -> Settings:
    return config.load(
        config=getattr(args, "config", None),
        memory_dirs=getattr(args, "memory_dir", None),
        project_root=getattr(args, "project_root", None),
        settle=getattr(args, "settle", None),
    )


def run_check(args: argparse.Namespace) -> int:
    try:
        settings = config.load(config=getattr(args, "config", None))
    except MemstagedError:
        if args.reload is not None:
            _send_reload(args.reload)
        raise
    if args.reload is not None:
        _send_reload(args.reload)
    if settings.config_path is None:
        absent = config.default_config_path(os.environ)
        print(f"{safe_text.name(str(absent))}: none; the defaults and MEMSTAGED_* variables: ok")
    else:
        print(f"{safe_text.name(settings.config_path)}: ok")
    return 0


def _send_reload(pid: int) -> None:
    """SIGHUP to ``pid``, once it is seen to be memstaged: a stale or mistyped PID must not
    hang up another program (SIGHUP ends most)."""
    try:
        words = safe_open.read_small(f"/proc/{pid}/cmdline").split(b"\0")
    except FileNotFoundError:
        raise UsageError(f"--reload {pid}: no such process") from None
    except OSError as err:
        raise UsageError(f"--reload {pid}: {err.strerror}") from None
    if not any(os.path.basename(word) == b"memstaged" for word in words):
        raise UsageError(f"--reload {pid}: not a memstaged process")
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise UsageError(f"--reload {pid}: no such process") from None
    except PermissionError:
        raise UsageError(f"--reload {pid}: not allowed to signal it") from None


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it: ``2.0``, ``true``, ``"auto"``, ``["a", "b"]``, ``{"k" = "v"}``.

    Strings as JSON writes them, whose escapes TOML's basic strings share.
    """
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{" + (f" {inner} " if inner else "") + "}"
    return str(value)


def rows(settings: Settings) -> list[tuple[str, Any, SettingOrigin]]:
    """``(key, value, origin)`` of the config file used, then of each setting, in the order of
    ``config.example.toml``."""
    found: list[tuple[str, Any, SettingOrigin]] = [
        ("config", settings.config_path, settings.origins.get("config", config.DEFAULT))
    ]
    for key, value in settings.values().items():
        found.append((key, value, settings.origins.get(key, config.DEFAULT)))
    return found


@guard_output
def run_show(args: argparse.Namespace) -> int:
    settings = _load(args)
    out = sys.stdout
    for key, value, origin in rows(settings):
        if args.json:
            print_json({"key": key, "value": value, "origin": origin.kind, "source": origin.source})
            continue
        if value is None:  # no config file: where one would be read
            absent = config.default_config_path(os.environ)
            shown = f"none ({safe_text.text(str(absent))} does not exist)"
        else:
            shown = safe_text.text(toml_value(value))
        out.write(f"{safe_text.text(str(origin))}\t{key}={shown}\n")
    return 0
