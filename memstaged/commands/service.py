"""``memstaged service install|uninstall``: the systemd user unit.

``install`` writes ``~/.config/systemd/user/memstaged.service`` with the absolute path of this
installation's ``memstaged`` and runs ``systemctl --user daemon-reload``; with ``--enable`` it also
enables the unit and (re)starts it, unless the service would only fail (no memory dir configured,
a bad config file): then it says so in one line, says what to run, and exits 1, leaving no failed
unit. ``uninstall`` stops and disables it and removes the file.
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
        help="also enable the service and (re)start it now; with no memory dir configured "
        "(or a bad config file) it says what to do and exits 1 instead, starting nothing",
    )
    install.add_argument(
        "--sandbox",
        action="store_true",
        help="also confine the service with a drop-in (PrivateUsers=, ProtectSystem=strict, "
        "writable only in the memory dirs' trees and the state dir), if this user manager can "
        "run it; run install again after adding a memory dir outside those trees",
    )
    install.set_defaults(func=run_install)
    uninstall = actions.add_parser("uninstall", help="stop, disable and remove the service")
    uninstall.set_defaults(func=run_uninstall)


def run_install(args: argparse.Namespace) -> int:
    from memstaged import service

    installed = service.install(enable=args.enable, sandbox=args.sandbox)
    print(f"wrote {installed.path}")
    if installed.writable:
        print(f"sandbox: writable only in {', '.join(installed.writable)}")
    problem = installed.cannot_start
    if problem is not None:
        what = "not enabled or started" if args.enable else "not started yet"
        print(
            f"memstaged: {what}: {problem.reason}; {problem.fix}, "
            f"then run: {service.ENABLE_COMMAND}",
            file=sys.stderr,
        )
        return EXIT_NOT_STARTED if args.enable else 0
    if installed.started:
        print(f"enabled and started {service.UNIT_NAME}")
    else:
        print(f"start it with: {service.ENABLE_COMMAND}")
    return 0


def run_uninstall(_args: argparse.Namespace) -> int:
    from memstaged import service

    path = service.uninstall()
    print(f"stopped, disabled and removed {path}")
    return 0
