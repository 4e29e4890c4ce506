"""The command line: parse, resolve settings, run, map errors to exit codes.

``main(argv)`` returns the exit code and takes argv as a parameter so tests call it directly.
Every error a user can cause ends here as one line on stderr and exit code 2 (usage, config) or
1 (busy, not everything decided); no traceback reaches a user.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

from memstaged.cli.option_types import settle_seconds
from memstaged.cli.stdout import Stdout, to_devnull
from memstaged.errors import (
    BusyError,
    LogUnwritable,
    MemstagedError,
    Terminated,
    UsageError,
    os_reason,
)

EXIT_ATTENTION: Final = 1
EXIT_USAGE: Final = 2

#: The subcommands, each ``memstaged.cli.commands.<name>`` with ``register(subparsers)`` setting
#: ``func`` on its parser, in the order ``--help`` lists them.
_SUBCOMMANDS: Final = (
    "check",
    "service",
    "config",
    "log",
    "stats",
    "status",
    "deadletter",
    "completion",
    "help",
)
#: The top-level options that take a value (the rest are flags).
_VALUED: Final = ("--memory-dir", "--config", "--project-root", "--settle")


def _named_command(argv: Sequence[str]) -> str | None:
    """Which subcommand ``argv`` runs, when that is plain: its name, ``""`` for none (the
    daemon, ``--once``), or ``None`` when in doubt (``--help``, ``--``, a word that is no
    command, an option abbreviated beyond recognition).

    Only that subcommand's module is imported and its parser built: the six modules and their
    parsers were a third of ``--once``'s start-up. In doubt every one is built, so
    argparse sees the whole command line as before and says the same.
    """
    words = iter(argv)
    for word in words:
        if word == "--" or word in ("-h", "--help") or word.startswith("--h"):
            return None
        if not word.startswith("-") or word == "-":
            return word if word in _SUBCOMMANDS else None
        if word.startswith("--") and "=" not in word:
            valued = [name for name in _VALUED if name.startswith(word)]
            flags = word in ("--once", "--dry-run", "--wait", "--json", "--verbose", "--version")
            if len(valued) == 1 and not flags:
                next(words, None)  # the option's value, whatever it looks like
            elif not valued and not flags:
                return None
        elif not word.startswith("--") and set(word[1:]) - {"v"}:
            return None  # a short option other than -v: argparse will say what it is
    return ""


def _columns() -> int:
    """``shutil.get_terminal_size().columns``, without importing shutil (and with it bz2, lzma
    and fnmatch: ~2 ms of every start-up): ``$COLUMNS``, else the terminal's, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


_SIZED: dict[type[argparse.HelpFormatter], type[argparse.HelpFormatter]] = {}


def _sized(base: type[argparse.HelpFormatter]) -> type[argparse.HelpFormatter]:
    """``base`` given the width argparse would compute (see :func:`_columns`)."""
    if base not in _SIZED:

        class Sized(base):  # type: ignore[valid-type,misc]
            def __init__(
                self,
                prog: str,
                indent_increment: int = 2,
                max_help_position: int = 24,
                width: int | None = None,
            ) -> None:
                width = _columns() - 2 if width is None else width
                super().__init__(prog, indent_increment, max_help_position, width)

        _SIZED[base] = Sized
    return _SIZED[base]


class _Parser(argparse.ArgumentParser):
    """argparse's errors as one line (``memstaged log: argument -n: ...``) and exit 2, not its
    usage block: ``main`` prints the message as it is, with no second ``memstaged:``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = _sized(kwargs.get("formatter_class", argparse.HelpFormatter))
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class _Version(argparse._VersionAction):
    """``--version``: ``memstaged VERSION``, the installed distribution's version (see
    ``memstaged.__version__``), looked up only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        import memstaged

        self.version = f"memstaged {memstaged.__version__}"
        super().__call__(parser, *args)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options shared by the daemon and ``--once`` (and the commands that pick memory dirs)."""
    parser.add_argument(
        "--memory-dir",
        action="append",
        metavar="DIR",
        help="a memory dir (<project>/.pi/memory/project); repeatable; globs allowed",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the TOML config file (default $XDG_CONFIG_HOME/memstaged/config.toml)",
    )
    parser.add_argument(
        "--project-root", metavar="DIR", help="the project root of the single --memory-dir"
    )
    parser.add_argument(
        "--settle",
        type=settle_seconds,
        metavar="SECONDS",
        help="how long an unparseable file must stay unchanged (default 2)",
    )


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given ``argv``, with only the subcommand it names (see
    :func:`_named_command`), else with all of them (``--help``, completions, the man page)."""
    parser = _Parser(
        prog="memstaged",
        description="Validate, repair or quarantine agent-memory staging files as they arrive.",
        epilog="Without a command memstaged runs as a daemon, or with --once decides every "
        "staging file now and exits: 0 when every file got a decision (a quarantine is one), "
        "1 when some file could not be decided (still being written, an I/O error, another "
        "memstaged busy on the memory dir), 2 for a usage or configuration error (one line "
        "on stderr). A memory dir is <project>/.pi/memory/project, a directory with a "
        "staging/ subdirectory; anything else is refused. 'memstaged help COMMAND' (or "
        "'memstaged COMMAND --help') says more about each command.",
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "--once",
        action="store_true",
        help="decide every staging file now and exit (default: run as a daemon)",
    )
    add_run_options(parser)
    parser.add_argument("--dry-run", action="store_true", help="decide and log, write nothing")
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait for another memstaged on the same memory dir instead of exiting 1",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --once: the summary as one JSON object per memory dir",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="with --once: every decision as a line on stderr, on a terminal or not (the "
        "decision log file has them all in any case)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    import importlib

    wanted = None if argv is None else _named_command(argv)
    for name in _SUBCOMMANDS:
        if wanted is None or wanted == name:
            importlib.import_module(f"memstaged.cli.commands.{name}").register(sub)
    return parser


def _configure_logging(settings: object, *, console: str = "auto") -> None:
    from memstaged.config import Settings
    from memstaged.log.rotated_file import open_error
    from memstaged.log.writer import configure

    assert isinstance(settings, Settings)
    try:
        configure(
            settings.log_file,
            max_bytes=settings.log_max_bytes,
            backups=settings.log_backups,
            console=console,
        )
    except OSError as err:
        raise open_error(settings.log_file, err) from None


def _run(args: argparse.Namespace) -> int:
    from memstaged import config
    from memstaged.config import check_literal_dirs, one_path_each

    settings = config.load(
        config=args.config,
        memory_dirs=args.memory_dir,
        project_root=args.project_root,
        settle=args.settle,
        dry_run=args.dry_run,
    )
    if args.json and not args.once:
        raise UsageError("--json is for --once (and the commands): the daemon logs JSON lines")
    # before any log is opened: a wrong path is one line, exit 2; a second path is only said
    check_literal_dirs(settings, one_path_each(settings.memory_dirs())[0])
    if args.verbose and not args.once:
        raise UsageError("--verbose is for --once: the daemon logs every event already")
    # before the log (there by default) is opened: the user's own and private, or one line
    config.own_state_dir(settings)
    _configure_logging(settings, console="lines" if args.verbose else "auto")
    if args.once:
        from memstaged.cli.once_summary import print_summary
        from memstaged.run.once import run_once

        return print_summary(run_once(settings, wait=args.wait), as_json=args.json)
    from memstaged.daemon.main import run_daemon

    def reload() -> object:
        return config.load(
            config=args.config,
            memory_dirs=args.memory_dir,
            project_root=args.project_root,
            settle=args.settle,
            dry_run=args.dry_run,
        )

    return run_daemon(settings, wait=args.wait, reload=reload)  # type: ignore[arg-type]


def _error_line(message: str) -> None:
    """The one line of an error, prefixed ``memstaged:`` once, control characters escaped (a
    file name in it comes from whoever wrote the file)."""
    from memstaged.safe_text import text

    line = text(message)
    if not line.startswith("memstaged"):
        line = f"memstaged: {line}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # stderr is gone: the exit code still says it


def main(argv: Sequence[str] | None = None) -> int:
    """Run memstaged; returns the exit code. Output that cannot be written (a full disk,
    ``/dev/full``) is one line on stderr, and exit 1 where the command would have exited 0,
    for ``--help`` and ``--version`` too (argparse drops such an error on the floor)."""
    _standard_streams()
    real = sys.stdout
    watched = Stdout(real)
    sys.stdout = watched
    try:
        code = _command(argv)
        watched.flush()
    except SystemExit as done:  # argparse's --help, --version and usage errors
        if _output_lost(watched):
            raise SystemExit(EXIT_ATTENTION) from None
        raise done from None
    except OSError as err:  # not one a command turned into its own message
        if not _output_lost(watched):
            _error_line(os_reason(err))
        return EXIT_ATTENTION
    finally:
        sys.stdout = real
    # never success when output was lost; a command's own failure or verdict is kept
    return (code or EXIT_ATTENTION) if _output_lost(watched) else code


def _standard_streams() -> None:
    """Descriptors 0-2 held open (on ``/dev/null`` where closed), and ``sys.stderr`` a stream
    where it was closed: its lines go nowhere, and the run goes on. ``sys.stdout`` stays None
    where closed (:class:`Stdout` says so once, and the exit code)."""
    if sys.stdin is not None and sys.stdout is not None and sys.stderr is not None:
        return  # Python makes a stream None when its descriptor was closed as it started
    from memstaged.files import fsio

    fsio.hold_standard_fds()
    if sys.stderr is None:
        sys.stderr = fsio.stream_on(2)


def _output_lost(watched: Stdout) -> bool:
    """Whether some output could not be written; said in one line, and stdout pointed at
    ``/dev/null`` so that the interpreter's last flush does not fail again."""
    if watched.lost is None:
        try:
            watched.flush()
        except OSError:
            pass  # kept in watched.lost (a BrokenPipeError is not kept: the reader left)
    if watched.lost is None:
        return False
    sys.stdout = watched.stream  # None when it is closed
    if watched.stream is not None:
        to_devnull()
    _error_line(f"cannot write standard output: {watched.lost.strerror or watched.lost}")
    return True


def _command(argv: Sequence[str] | None) -> int:
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        if words[:2] == ["deadletter", "ids"]:  # what a Tab press waits for
            from memstaged.cli.commands import ids

            return ids.main(words[2:])
        parser = build_parser(words)
        args = parser.parse_args(words)
        func: Callable[[argparse.Namespace], int] = getattr(args, "func", _run)
        return func(args)
    except (BusyError, LogUnwritable) as err:
        _error_line(str(err))
        return EXIT_ATTENTION
    except MemstagedError as err:
        _error_line(str(err))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("memstaged: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("memstaged: terminated", file=sys.stderr)
        return 143
