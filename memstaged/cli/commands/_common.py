"""What the inspection and recovery commands share: options, memory dirs, time.

The options every command takes (``--memory-dir``, ``--config``, ``--json``, the output
options) are resolved exactly as ``--once`` resolves them; times are read as an operator types
them (``today``, ``10m``, an ISO time, local unless it has an offset) and shown in local time.
What they print, and how, is :mod:`memstaged.cli.commands._output`.

Bad input raises :class:`~memstaged.errors.UsageError`, which ``cli.main`` turns into one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from memstaged import config, safe_text
from memstaged.config import Alias, Settings, check_memory_dir, one_path_each, unwritable
from memstaged.durations import is_duration, parse_seconds
from memstaged.errors import ConfigError, UsageError
from memstaged.files.memdir import MemoryDir

if TYPE_CHECKING:
    pass


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
        from memstaged.cli.option_types import settle_seconds

        parser.add_argument(
            "--settle",
            type=settle_seconds,
            metavar="SECONDS",
            default=quiet,
            help="how long an unparseable file must stay unchanged (default 2)",
        )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per line, for scripts")


def add_output_options(parser: argparse.ArgumentParser, *, pager: bool = False) -> None:
    """``--color`` (and, for the commands whose output can be long, ``--no-pager``)."""
    parser.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour the output: auto (on a terminal, unless NO_COLOR is set), always, never",
    )
    if pager:
        parser.add_argument(
            "--no-pager",
            action="store_true",
            help="on a terminal, print straight to it instead of through $PAGER (less -FRSX)",
        )


def load_settings(args: argparse.Namespace, *, lenient: bool = False) -> Settings:
    """Settings as ``--once`` resolves them: option, ``MEMSTAGED_*``, file, default.

    ``lenient``, for the commands that only look (``status``, ``log``, ``stats``, ``deadletter
    list`` and ``show``): a key of the config file that is unknown or has a bad value is left
    out, with one warning line on stderr naming the file and the key (once per process), as
    ``postqueue -p`` works with a typo in main.cf. What changes files stays strict (exit 2).
    """
    settings = resolve_settings(args, lenient=lenient)
    # Kept with the command's arguments: a command that resolves its settings twice (log: the
    # log file, then the project labels) says each warning once.
    said: set[str] = vars(args).setdefault("_config_warnings_said", set())
    for warning in settings.warnings:
        if warning not in said:
            said.add(warning)
            print(f"memstaged: warning: {safe_text.text(warning)}", file=sys.stderr, flush=True)
    return settings


def resolve_settings(args: argparse.Namespace, *, lenient: bool = False) -> Settings:
    """:func:`load_settings` without saying the warnings (``status --check`` reports them)."""
    return config.load(
        config=getattr(args, "config", None),
        memory_dirs=getattr(args, "memory_dir", None),
        project_root=getattr(args, "project_root", None),
        settle=getattr(args, "settle", None),
        split_invalid_candidates=getattr(args, "split_invalid_candidates", None) or None,
        lenient=lenient,
    )


def memory_dirs(
    settings: Settings, *, writable: bool, aliases: list[Alias] | None = None
) -> list[MemoryDir]:
    """The memory dirs to work on; one named on the command line must exist (exit 2 if not).

    ``writable`` (recover, purge): every one must be writable, a glob's match too, whichever
    way it was configured; else exit 2 before anything is changed (docs/inspection.md).

    A memory dir reached by two paths (a bind mount, a linked literal prefix) is worked on
    through the first only, with its project root: each other path is said in
    one stderr line and added to ``aliases``, for a command that logs to log it.
    """
    mdirs, found = one_path_each(settings.memory_dirs())
    for alias in found:
        say_same_directory(alias)
    if aliases is not None:
        aliases.extend(found)
    for mdir in mdirs:
        if settings.explicit_dirs:
            check_memory_dir(mdir, writable=writable)
        elif writable and (why := unwritable(mdir)) is not None:
            raise ConfigError(f"memory dir {mdir.path}: {why}")
    if not mdirs:
        raise ConfigError(
            "no memory dir: pass --memory-dir DIR, set memory_dirs in the config file, "
            "or run in a project that has .pi/memory/project"
        )
    return mdirs


def say_same_directory(alias: Alias) -> None:
    """The one stderr line for a path not worked on: its directory is, through another path."""
    print(
        f"memstaged: memory dir {safe_text.name(alias.mdir.path)} skipped: same directory as "
        f"{safe_text.name(alias.first.path)}",
        file=sys.stderr,
        flush=True,
    )


def log_same_directory(logger: Any, aliases: Sequence[Alias]) -> None:
    """The decision log's event for each path not worked on (recover and purge log theirs)."""
    for alias in aliases:
        logger.warning(
            "memory_dir_skipped",
            memory_dir=alias.mdir.path,
            same_as=alias.first.path,
            reason=alias.reason,
        )


#: What ends a memory dir's path when it is the usual ``<project>/.pi/memory/project``.
_MEMORY_SUFFIX: Final = "/.pi/memory/project"


def project_root_of(memory_dir: str) -> str:
    """The directory holding ``.pi`` for a usual memory dir; any other is its own root."""
    path = memory_dir.rstrip("/") or "/"
    if path.endswith(_MEMORY_SUFFIX):
        return path[: -len(_MEMORY_SUFFIX)] or "/"
    return path


class ProjectLabels:
    """Short names for memory dirs, as a person calls the project: ``gamma`` for
    ``/home/ana/src/gamma/.pi/memory/project`` (at 80 columns the absolute
    path left no room for the file's name and the reason).

    A label is the last component of the project root, or as many last components as it takes
    to tell it from the other roots it is shown with (``src/gamma``, ``old/gamma``). The roots
    known before anything is shown (the configured memory dirs) are told apart from each other
    up front; one first met later gets the shortest label no one else has, so that a label once
    shown never changes meaning within one output. Labels are raw: escape them for a terminal.
    """

    def __init__(self, known: Iterable[str] = ()) -> None:
        self._roots = sorted({project_root_of(d) for d in known})
        self._labels: dict[str, str] = {}
        self._taken: set[str] = set()
        for root in self._roots:
            self._assign(root)

    def __call__(self, memory_dir: str) -> str:
        label = self._labels.get(memory_dir)
        if label is None:
            label = self._labels[memory_dir] = self._assign(project_root_of(memory_dir))
        return label

    def _assign(self, root: str) -> str:
        label = self._labels.get("\0" + root)  # keyed apart from memory dirs: \0 is in no path
        if label is not None:
            return label
        parts = [p for p in root.split("/") if p]
        label = root
        for k in range(1, len(parts) + 1):
            candidate = "/".join(parts[-k:])
            if candidate in self._taken:
                continue
            if any(other != root and _ends_with(other, candidate) for other in self._roots):
                continue
            label = candidate
            break
        self._taken.add(label)
        self._labels["\0" + root] = label
        return label


def _ends_with(path: str, suffix: str) -> bool:
    return path == suffix or path.endswith("/" + suffix)


def within(path: str, memory_dir: str) -> str | None:
    """A file's name within its memory dir (a staging file's without ``staging/``), or
    ``None`` when it is not in it."""
    base = memory_dir.rstrip("/") + "/"
    if not path.startswith(base) or len(path) == len(base):
        return None
    rest = path[len(base) :]
    return rest[len("staging/") :] if rest.startswith("staging/") and len(rest) > 8 else rest


# -- time -------------------------------------------------------------------------------------

_EARLIEST: Final = dt.datetime.min.replace(tzinfo=dt.UTC)
_LATEST: Final = dt.datetime.max.replace(tzinfo=dt.UTC)


def parse_duration(text: str, option: str) -> float:
    """``30s``, ``10m``, ``2h``, ``3d``, ``1w`` in seconds (see :mod:`memstaged.durations`)."""
    try:
        return parse_seconds(text, "duration")
    except ValueError as err:
        raise UsageError(f"{option} {text!r}: {err}") from None


def at(epoch: float) -> dt.datetime:
    """An epoch time as an aware UTC datetime, clamped to the dates Python has: "3,000,000 days
    ago" is before anything logged, not a ``ValueError``."""
    try:
        return dt.datetime.fromtimestamp(epoch, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return _EARLIEST if epoch < 0 else _LATEST


def _local_midnight(clock: float, days: int) -> dt.datetime:
    today = dt.datetime.fromtimestamp(clock).astimezone().date() + dt.timedelta(days=days)
    return dt.datetime.combine(today, dt.time()).astimezone().astimezone(dt.UTC)


#: journalctl's words for a point in time: midnight of a local day, and now.
_DAYS: Final = {"today": 0, "yesterday": -1, "tomorrow": 1}


def parse_when(text: str, option: str, *, clock: Callable[[], float] = now) -> dt.datetime:
    """A point in time: ``today``, ``yesterday``, ``tomorrow`` (local midnight, as journalctl
    takes them), ``now``, a duration ago (``10m``, ``2h``, ``3d``) or an ISO 8601 date or time.

    An ISO time without an offset is local time, as an operator at a terminal means it.
    """
    word = text.strip().lower()
    if word in _DAYS:
        return _local_midnight(clock(), _DAYS[word])
    if word == "now":
        return at(clock())
    if is_duration(text):
        return at(clock() - parse_duration(text, option))
    try:
        when = dt.datetime.fromisoformat(text.strip())
        return when.astimezone(dt.UTC)
    except (ValueError, OverflowError, OSError):
        raise UsageError(
            f"{option} {text!r}: expected today, yesterday, 10m, 2h, 3d "
            "or an ISO time such as 2026-01-31T14:00"
        ) from None


def local_time(when: dt.datetime | None) -> str:
    """A timestamp the way a person at this machine reads it."""
    if when is None:
        return "-"
    try:
        return when.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):
        return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def iso_utc(when: dt.datetime | float | None) -> str | None:
    """A timestamp for JSON output: ISO 8601 in UTC, like the decision log's own."""
    if when is None:
        return None
    if not isinstance(when, dt.datetime):
        when = at(when)
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
