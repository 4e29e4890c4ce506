"""``memstaged service install|uninstall``: the systemd user unit.

``install`` writes ``~/.config/systemd/user/memstaged.service`` with the absolute path of this
installation's ``memstaged`` and runs ``systemctl --user daemon-reload``; with ``--enable`` it also
enables the unit and starts it if it is not running, unless the service would only fail (no memory
dir configured, a bad config file): then it says so in one line, says what to run, and exits 1,
leaving no failed unit. It says which settings differ from the unit installed before (old and
new ``ExecStart``), and restarts a running service only with ``--restart``.
``uninstall`` stops and disables it, removes the file and lists what stays; ``--purge`` also
removes memstaged's own config, state, metrics file and dead daemons' control sockets, never
anything in a memory dir. What either prints is the state the user manager reports before and
after, not what was asked of it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from memstaged.cli.systemd_unit import CannotStart, Uninstalled, UnitState

#: ``install --enable`` wrote the unit but did not start it: the service has nothing to do yet
#: (no memory dir configured) or could not start (a config error). Nothing is left failed.
EXIT_NOT_STARTED: Final = 1


def register(sub: Any) -> None:
    parser = sub.add_parser("service", help="install or uninstall the systemd user service")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install", help="write ~/.config/systemd/user/memstaged.service and daemon-reload"
    )
    install.add_argument(
        "--enable",
        action="store_true",
        help="also enable the service and start it if it is not running (a running one is "
        "restarted only with --restart); with no memory dir configured "
        "(or a bad config file) it says what to do and exits 1 instead, starting nothing",
    )
    install.add_argument(
        "--sandbox",
        action="store_true",
        help="also confine the service with a drop-in (PrivateUsers=, ProtectSystem=strict, "
        "writable only in the memory dirs' trees and the state dir), if this user manager can "
        "run it; run install again after adding a memory dir outside those trees",
    )
    install.add_argument(
        "--restart",
        action="store_true",
        help="also restart the service now (start it if stopped), so that it runs the unit "
        "just written: after an upgrade; without it a running service keeps running as it was",
    )
    install.set_defaults(func=run_install)
    uninstall = actions.add_parser(
        "uninstall", help="stop, disable and remove the service; say what stays"
    )
    uninstall.add_argument(
        "--purge",
        action="store_true",
        help="also remove memstaged's own config (~/.config/memstaged), state "
        "(~/.local/state/memstaged), completions, man page, metrics file and the control "
        "sockets of daemons that are gone; never a memory dir's contents (deadletter/ stays)",
    )
    uninstall.set_defaults(func=run_uninstall)


def run_install(args: argparse.Namespace) -> int:
    from memstaged.cli import systemd_unit

    installed = systemd_unit.install(enable=args.enable, sandbox=args.sandbox, restart=args.restart)
    print(f"wrote {installed.path}")
    for name, old, new in installed.changed:
        print(f"changed {name}:")
        print("".join(f"  - {name}={value}\n" for value in old), end="")
        print("".join(f"  + {name}={value}\n" for value in new), end="")
    if installed.running_old:
        print(
            f"{systemd_unit.UNIT_NAME} is running as it was installed before; to run the unit just "
            f"written: {systemd_unit.RESTART_COMMAND} (or service install --restart)"
        )
    if installed.writable:
        print(f"sandbox: writable only in {', '.join(installed.writable)}")
    problem = installed.cannot_start
    if problem is not None:
        print(_not_started(problem, installed.after, enable=args.enable), file=sys.stderr)
        return EXIT_NOT_STARTED if args.enable else 0
    after = installed.after
    if args.restart:
        print(f"restarted {systemd_unit.UNIT_NAME}" if after.running else after.described())
    elif args.enable:
        print(_enabled(installed.before, after))
    else:
        print(_state_and_hint(after))
    return 0


def _words(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def _enabled(before: UnitState, after: UnitState) -> str:
    """What ``install --enable`` did, from the service's state before and after it: ``enabled
    and started memstaged.service``, or what it found done already."""
    from memstaged.cli.systemd_unit import UNIT_NAME

    states = (
        ("enabled", "enabled", before.enabled, after.enabled),
        ("started", "running", before.running, after.running),
    )
    done = [verb for verb, _, was, now in states if now and not was]
    already = [state for _, state, was, now in states if was and now]
    if done and already:
        return f"{_words(done)} {UNIT_NAME} (it was already {_words(already)})"
    if done:
        return f"{_words(done)} {UNIT_NAME}"
    if already:
        return f"{UNIT_NAME} was already {_words(already)}"
    return after.described()


def _state_and_hint(after: UnitState) -> str:
    """After a plain ``install``: the service's state, and the command that would make it
    enabled and running if it is not."""
    from memstaged.cli import systemd_unit

    if after.enabled and after.running:
        return after.described()
    if after.running:
        command = systemd_unit.ENABLE_ONLY_COMMAND
        return f"{after.described()}: enable it (started at login) with: {command}"
    command = systemd_unit.START_COMMAND if after.enabled else systemd_unit.ENABLE_COMMAND
    return f"{after.described()}: start it with: {command}"


def _not_started(problem: CannotStart, after: UnitState, *, enable: bool) -> str:
    """The one line of an install that started nothing because the service would exit at once
    (no memory dir, a config error): what it is, why, and what to run once that is fixed."""
    from memstaged.cli import systemd_unit

    unit = systemd_unit.UNIT_NAME
    if after.running:
        head, command = f"{unit} runs on as it was started", systemd_unit.RESTART_COMMAND
    elif after.enabled:
        head, command = f"not started ({unit} is enabled)", systemd_unit.START_COMMAND
    else:
        head = "not enabled or started" if enable else "not started yet"
        command = systemd_unit.ENABLE_COMMAND
    return f"memstaged: {head}: {problem.reason}; {problem.fix}, then run: {command}"


def run_uninstall(args: argparse.Namespace) -> int:
    from memstaged.cli import systemd_unit

    done = systemd_unit.uninstall(purge=args.purge)
    print(_uninstalled(done))
    for path in done.removed:
        print(f"removed {path}")
    if done.kept:
        print("kept:" if args.purge else "kept (--purge removes them):")
        for what, path in done.kept:
            print(f"  {path}  ({what})")
    if done.listening:
        print("kept, a memstaged daemon outside the service still listens on them (stop it first):")
        for path in done.listening:
            print(f"  {path}")
    if done.deadletters:
        print(
            "kept, never removed by uninstall (quarantined files: recover or purge them with "
            "memstaged deadletter before uninstalling):"
        )
        for path in done.deadletters:
            print(f"  {path}")
    if done.unlisted is not None:
        print(
            f"the memory dirs could not be listed ({done.unlisted}): their deadletter/ "
            "directories stay too"
        )
    return 0


def _uninstalled(done: Uninstalled) -> str:
    """What ``uninstall`` did to the service, from its state before and after: ``stopped,
    disabled and removed PATH``, or only what there was to do; a unit the user manager still
    finds elsewhere is said too."""
    from memstaged.cli.systemd_unit import UNIT_NAME

    before, after = done.before, done.after
    verbs = [
        verb
        for verb, was, now in (
            ("stopped", before.running, after.running),
            ("disabled", before.enabled, after.enabled),
        )
        if was and not now
    ]
    if done.had_unit:
        line = f"{_words([*verbs, 'removed'])} {done.path}"
    elif verbs:
        line = f"{_words(verbs)} {UNIT_NAME} ({done.path} was not there)"
    else:
        line = f"{UNIT_NAME} was not installed: nothing to stop, disable or remove"
    if after.loaded:
        line += (
            f"; {after.described()} from {after.fragment or 'a unit file of its own'}, "
            "which service install did not write: left as it is"
        )
    return line
