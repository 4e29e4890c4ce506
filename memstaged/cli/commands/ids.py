"""``memstaged deadletter ids [PREFIX]``: the record IDs, one a line, for shell completion.

Hidden (no help, so neither ``--help``, shtab nor the man page show it): the completion scripts
call it when ``deadletter show``, ``recover --id`` or ``purge --id`` is completed. A Tab press waits
for it, so it reads only the names in each ``deadletter/`` (no record is opened) and imports only
what resolving the memory dirs needs: :func:`memstaged.cli.main.main` runs
``deadletter ids`` here directly, without building the command's full parser and importing
:mod:`memstaged.cli.commands.deadletter`, which was most of its time. What it cannot read it skips
in silence: a completion that fails prints nothing, and never an error under the user's prompt.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Final

from memstaged.errors import MemstagedError
from memstaged.files.memdir import DEADLETTER

#: The IDs offered: what memstaged names records with (``quarantine.name_component``). A record
#: the agent's own tools named otherwise is not offered (a shell would have to quote it), but is
#: still taken by ``show`` and ``--id`` as typed.
_OFFERED: Final = re.compile(r"[A-Za-z0-9._-]+")


class _Quiet(argparse.ArgumentParser):
    """A usage error is an exception here, for :func:`main` to turn into silence."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Unusable(message)


class _Unusable(Exception):
    """The command line of ``deadletter ids`` could not be parsed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``PREFIX`` and the options that pick memory dirs, as the other deadletter actions take
    them (a value given before ``deadletter`` is kept: ``default=SUPPRESS``)."""
    parser.add_argument("prefix", nargs="?", default="")
    parser.add_argument("--memory-dir", action="append", default=argparse.SUPPRESS)
    parser.add_argument("--config", default=argparse.SUPPRESS)


def record_ids(memory_dirs: Sequence[str], prefix: str = "") -> tuple[list[str], bool]:
    """The IDs of the records directly in each memory dir's ``deadletter/`` that start with
    ``prefix``, sorted and each once; and whether every store could be read.

    Only the directory is listed: a record's ID is its name without ``.json`` (dot files are
    memstaged's temp files, as ``deadletter.is_record_name`` says). ``deadletter/`` is opened
    without following a link, as every other deadletter command opens it.
    """
    from memstaged.files import fsio

    found: set[str] = set()
    whole = True
    for path in memory_dirs:
        try:
            mem_fd = fsio.open_dir(path)
        except FileNotFoundError:
            continue
        except OSError:
            whole = False
            continue
        try:
            dl_fd = fsio.open_dir(DEADLETTER, mem_fd)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            whole = False
            continue
        finally:
            os.close(mem_fd)
        try:
            names = os.listdir(dl_fd)
        except OSError:
            whole = False
            continue
        finally:
            os.close(dl_fd)
        found.update(
            name[: -len(".json")]
            for name in names
            if name.endswith(".json")
            and name.startswith(prefix)
            and not name.startswith(".")
            and _OFFERED.fullmatch(name)
        )
    return sorted(i for i in found if i), whole


def run(args: argparse.Namespace) -> int:
    """Print the IDs; exit 0 when every memory dir's store was read, else 1, and silently."""
    from memstaged import config

    try:
        settings = config.load(
            config=getattr(args, "config", None),
            memory_dirs=getattr(args, "memory_dir", None),
            lenient=True,  # a typo in the config does not take Tab away; nothing is said here
        )
        paths = [m.path for m in settings.memory_dirs()]
    except (MemstagedError, OSError, ValueError):
        return 1
    ids, whole = record_ids(paths, args.prefix)
    try:
        sys.stdout.write("".join(f"{i}\n" for i in ids))
        sys.stdout.flush()
    except (OSError, ValueError):
        return 1  # the shell stopped reading: nothing to say, and nowhere to say it
    return 0 if whole else 1


def main(argv: Sequence[str]) -> int:
    """``deadletter ids`` with what follows it in ``argv``; a bad command line prints nothing."""
    parser = _Quiet(prog="memstaged deadletter ids", add_help=False)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except _Unusable:
        return 2
    return run(args)
