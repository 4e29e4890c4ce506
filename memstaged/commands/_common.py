"""What the inspection and recovery commands share: options, memory dirs, time, output.

Every command prints either rows a person reads (a rich table on a terminal, tab-separated lines
otherwise, so that ``grep`` and ``cut`` work) or, with ``--json``, one JSON object per line for
scripts. Bad input raises :class:`~memstaged.errors.UsageError`, which ``cli.main`` turns into one
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, ParamSpec

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memstaged import config
from memstaged.config import Settings, check_memory_dir
from memstaged.errors import ConfigError, UsageError
from memstaged.pipeline import MemoryDir

_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}

#: Decision colours on a terminal; the log's own words, never a second vocabulary.
DECISION_STYLES: Final = {
    "valid": "green",
    "repaired": "cyan",
    "quarantined": "bold red",
    "foreign": "magenta",
    "deferred": "yellow",
    "skipped": "dim",
}


def now() -> float:
    """The wall clock; one seam so tests can move time instead of sleeping through it."""
    return time.time()


# -- options ----------------------------------------------------------------------------------


def add_memory_dir_options(parser: argparse.ArgumentParser, *, triage: bool = False) -> None:
    """``--memory-dir`` and ``--config`` (and, for commands that decide files, ``--project-root``
    and ``--settle``), resolved exactly as for ``--once`` by :func:`config.load`.

    The top-level parser defines the same options; ``default=SUPPRESS`` keeps a value given
    before the command name (``memstaged --memory-dir D status``) instead of letting the
    subcommand's default overwrite it with ``None``.
    """
    quiet = argparse.SUPPRESS
    parser.add_argument(
        "--memory-dir",
        action="append",
        metavar="DIR",
        default=quiet,
        help="a memory dir (<project>/.pi/memory/project); repeatable; globs allowed",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=quiet,
        help="the TOML config file (default $XDG_CONFIG_HOME/memstaged/config.toml)",
    )
    if triage:
        parser.add_argument(
            "--project-root",
            metavar="DIR",
            default=quiet,
            help="the project root of the single --memory-dir",
        )
        parser.add_argument(
            "--settle",
            type=float,
            metavar="SECONDS",
            default=quiet,
            help="how long an unparseable file must stay unchanged (default 2)",
        )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per line, for scripts")


def load_settings(args: argparse.Namespace) -> Settings:
    """Settings as ``--once`` resolves them: option, ``MEMSTAGED_*``, file, default."""
    return config.load(
        config=getattr(args, "config", None),
        memory_dirs=getattr(args, "memory_dir", None),
        project_root=getattr(args, "project_root", None),
        settle=getattr(args, "settle", None),
    )


def memory_dirs(settings: Settings, *, writable: bool) -> list[MemoryDir]:
    """The memory dirs to work on; one named on the command line must exist (exit 2 if not)."""
    mdirs = settings.memory_dirs()
    if settings.explicit_dirs:
        for mdir in mdirs:
            check_memory_dir(mdir, writable=writable)
    if not mdirs:
        raise ConfigError(
            "no memory dir: pass --memory-dir DIR, set memory_dirs in the config file, "
            "or run in a project that has .pi/memory/project"
        )
    return mdirs


# -- time -------------------------------------------------------------------------------------


def parse_duration(text: str, option: str) -> float:
    """``30s``, ``10m``, ``2h``, ``3d``, ``1w`` in seconds."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise UsageError(f"{option} {text!r}: expected a duration such as 30s, 10m, 2h or 3d")
    return float(match[1]) * _UNIT_SECONDS[match[2].lower()]


def parse_when(text: str, option: str, *, clock: Callable[[], float] = now) -> dt.datetime:
    """A point in time: a duration ago (``10m``, ``2h``, ``3d``) or an ISO 8601 date or time.

    An ISO time without an offset is local time, as an operator at a terminal means it.
    """
    if _DURATION.fullmatch(text):
        seconds = parse_duration(text, option)
        return dt.datetime.fromtimestamp(clock() - seconds, dt.UTC)
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: expected 10m, 2h, 3d or an ISO time such as 2026-01-31T14:00"
        ) from None
    return when.astimezone(dt.UTC)


def local_time(when: dt.datetime | None) -> str:
    """A timestamp the way a person at this machine reads it."""
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S") if when is not None else "-"


def iso_utc(when: dt.datetime | float | None) -> str | None:
    """A timestamp for JSON output: ISO 8601 in UTC, like the decision log's own."""
    if when is None:
        return None
    if not isinstance(when, dt.datetime):
        when = dt.datetime.fromtimestamp(when, dt.UTC)
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def human_age(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h05m``, ``4d02h``: an age to read at a glance."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86_400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86_400}d{seconds % 86_400 // 3600:02d}h"


# -- output -----------------------------------------------------------------------------------


def console() -> Console:
    """stdout as rich sees it now (tests swap ``sys.stdout``, so it is never cached)."""
    return Console(file=sys.stdout, highlight=False)


def print_json(obj: Any) -> None:
    """One JSON line; values msgspec refuses (lone surrogates, ...) fall back to the stdlib."""
    from memstaged.log import dumps

    sys.stdout.write(dumps(obj) + "\n")


def styled(value: str, style: str | None = None) -> Text:
    """A table cell that is never read as rich markup (paths may hold ``[`` and ``]``)."""
    return Text(value, style=style or "")


def decision_text(decision: str) -> Text:
    return styled(decision, DECISION_STYLES.get(decision))


def render_table(
    out: Console,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str | Text]],
    *,
    right: Sequence[str] = (),
) -> None:
    """A rich table on a terminal; elsewhere a ``# title`` line and one tab-separated line a row."""
    if out.is_terminal:
        table = Table(title=title, title_justify="left")
        for column in columns:
            # fold, never cut: an ID or a path must stay copyable from the table
            table.add_column(
                column, justify="right" if column in right else "left", overflow="fold"
            )
        for row in rows:
            table.add_row(*(cell if isinstance(cell, Text) else styled(cell) for cell in row))
        out.print(table)
        return
    lines = [f"# {title}", "\t".join(columns)]
    lines.extend("\t".join(_plain(cell) for cell in row) for row in rows)
    sys.stdout.write("\n".join(lines) + "\n")


def _plain(cell: str | Text) -> str:
    text = cell.plain if isinstance(cell, Text) else cell
    return text.replace("\t", " ").replace("\n", " | ")


def one_line(text: str, limit: int | None = None) -> str:
    """Collapse whitespace (and cut at ``limit``), for table cells."""
    flat = " ".join(text.split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


P = ParamSpec("P")


def guard_output(func: Callable[P, int]) -> Callable[P, int]:
    """Output that cannot end in a traceback.

    ``memstaged log | head`` ends quietly instead of with a BrokenPipeError, and text that stdout
    cannot encode (a lone surrogate: a file name that is not UTF-8, a ``\ud800`` escape in a
    staging file) is printed backslash-escaped instead of raising UnicodeEncodeError.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:
            # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass  # stdout is not a real file (a test's capture): nothing will flush it
            return 0

    return wrapper
