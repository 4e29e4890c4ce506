"""``memstaged service install|uninstall``: the systemd user unit.

``install`` writes ``~/.config/systemd/user/memstaged.service`` with the absolute path of this
installation's ``memstaged`` and runs ``systemctl --user daemon-reload``; with ``--enable`` it also
enables the unit and starts it if it is not running, unless the service would only fail (no memory
dir configured, a bad config file): then it says so in one line, says what to run, and exits 1,
leaving no failed unit. It says which settings differ from the unit installed before (old and
new ``ExecStart``), and restarts a running service only with ``--restart``.
``uninstall`` stops and disables it, removes the file and lists what stays; ``--purge`` also
removes memstaged's own config and state, never anything in a memory dir.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final

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
        "(~/.local/state/memstaged), completions and man page; never a memory dir's contents "
        "(deadletter/ stays)",
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
    elif installed.restarted:
        print(f"restarted {systemd_unit.UNIT_NAME}")
    if installed.writable:
        print(f"sandbox: writable only in {', '.join(installed.writable)}")
    problem = installed.cannot_start
    if problem is not None:
        what = "not enabled or started" if args.enable else "not started yet"
        print(
            f"memstaged: {what}: {problem.reason}; {problem.fix}, "
            f"then run: {systemd_unit.ENABLE_COMMAND}",
            file=sys.stderr,
        )
        return EXIT_NOT_STARTED if args.enable else 0
    if args.enable:
        print(f"enabled{'' if installed.running_old else ' and started'} {systemd_unit.UNIT_NAME}")
    elif not installed.started:
        print(f"start it with: {systemd_unit.ENABLE_COMMAND}")
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    from memstaged.cli import systemd_unit

    done = systemd_unit.uninstall(purge=args.purge)
    print(f"stopped, disabled and removed {done.path}")
    for path in done.removed:
        print(f"removed {path}")
    if done.kept:
        why = "a memory dir is inside" if args.purge else "--purge removes them"
        print(f"kept ({why}):")
        for what, path in done.kept:
            print(f"  {path}  ({what})")
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
