"""``memstaged service install|uninstall``: the systemd user unit.

``install`` writes ``~/.config/systemd/user/memstaged.service`` with the absolute path of this
installation's ``memstaged`` and runs ``systemctl --user daemon-reload``; with ``--enable`` it also
enables the unit and (re)starts it. ``uninstall`` stops and disables it and removes the file.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("service", help="install or uninstall the systemd user service")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install", help="write ~/.config/systemd/user/memstaged.service and daemon-reload"
    )
    install.add_argument(
        "--enable", action="store_true", help="also enable the service and (re)start it now"
    )
    install.set_defaults(func=run_install)
    uninstall = actions.add_parser("uninstall", help="stop, disable and remove the service")
    uninstall.set_defaults(func=run_uninstall)


def run_install(args: argparse.Namespace) -> int:
    from memstaged import service

    path = service.install(enable=args.enable)
    print(f"wrote {path}")
    if args.enable:
        print(f"enabled and started {service.UNIT_NAME}")
    else:
        print(f"start it with: systemctl --user enable --now {service.UNIT_NAME}")
    return 0


def run_uninstall(_args: argparse.Namespace) -> int:
    from memstaged import service

    path = service.uninstall()
    print(f"stopped, disabled and removed {path}")
    return 0
