"""What the inspection and recovery commands share: options, memory dirs, time, output.

Every command prints either lines a person reads or, with ``--json``, one JSON object per line
for scripts. ``log`` and ``deadletter list`` print one line per event or record, IDs in full, as
journalctl and git do; on a terminal through a pager (``$MEMSTAGED_PAGER``, ``$PAGER``, else
``less -FRSX``; ``--no-pager``), written line by line as they are read, never built whole. The
small summaries (``stats``, ``status``) are aligned columns on a terminal and a ``# title`` line
with tab-separated rows otherwise, so that ``grep`` and ``cut`` work. Colour only on a terminal,
never with ``NO_COLOR`` set, and as ``--color=auto|always|never`` says. Every text that came from
a file (names, reasons, content) goes through :mod:`memstaged.display` first. Plain writes, no
rich: its import alone cost more than printing a thousand lines.

Bad input raises :class:`~memstaged.errors.UsageError`, which ``cli.main`` turns into one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import io
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Final, ParamSpec

from memstaged import config, display
from memstaged.config import Alias, Settings, check_memory_dir, one_path_each, unwritable
from memstaged.errors import ConfigError, UsageError
from memstaged.memdir import MemoryDir
from memstaged.seconds import is_duration, parse_seconds

if TYPE_CHECKING:
    import subprocess


#: Decision colours on a terminal (SGR codes); the log's own words, never a second vocabulary.
DECISION_STYLES: Final = {
    "valid": "32",
    "repaired": "36",
    "quarantined": "1;31",
    "foreign": "35",
    "deferred": "33",
    "skipped": "2",
}
STYLES: Final = {"bold": "1", "dim": "2", "green": "32", "yellow": "1;33", "red": "31"}


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
        from memstaged.argtypes import settle_seconds

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


def load_settings(args: argparse.Namespace) -> Settings:
    """Settings as ``--once`` resolves them: option, ``MEMSTAGED_*``, file, default."""
    return config.load(
        config=getattr(args, "config", None),
        memory_dirs=getattr(args, "memory_dir", None),
        project_root=getattr(args, "project_root", None),
        settle=getattr(args, "settle", None),
        split_invalid_candidates=getattr(args, "split_invalid_candidates", None) or None,
    )


def memory_dirs(
    settings: Settings, *, writable: bool, aliases: list[Alias] | None = None
) -> list[MemoryDir]:
    """The memory dirs to work on; one named on the command line must exist (exit 2 if not).

    ``writable`` (recover, purge): every one must be writable, a glob's match too, whichever
    way it was configured; else exit 2 before anything is changed (docs/inspection.md).

    A memory dir reached by two paths (a bind mount, a linked literal prefix) is worked on
    through the first only, with its project root (issue 19 item 7): each other path is said in
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
        f"memstaged: memory dir {display.name(alias.mdir.path)} skipped: same directory as "
        f"{display.name(alias.first.path)}",
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
    ``/home/ana/src/gamma/.pi/memory/project`` (issue 22 item 1: at 80 columns the absolute
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
    """``30s``, ``10m``, ``2h``, ``3d``, ``1w`` in seconds (see :mod:`memstaged.seconds`)."""
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


# -- output -----------------------------------------------------------------------------------


def use_color(choice: str, terminal: bool, env: dict[str, str] | None = None) -> bool:
    """``--color``: ``always``/``never`` as said; ``auto`` on a terminal that is not ``dumb``
    and with no ``NO_COLOR`` (https://no-color.org: any non-empty value)."""
    environ = os.environ if env is None else env
    if choice == "always":
        return True
    if choice == "never":
        return False
    return terminal and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"


def pager_command(env: dict[str, str] | None = None) -> list[str] | None:
    """``$MEMSTAGED_PAGER``, then ``$PAGER``, else ``less -FRSX`` if there is one; ``None``
    for no pager (set to empty or ``cat``, or nothing found)."""
    import shlex  # this and shutil only for a pager, on a terminal
    import shutil

    environ = os.environ if env is None else env
    for name in ("MEMSTAGED_PAGER", "PAGER"):
        if name in environ:
            value = environ[name].strip()
            if not value or value == "cat":
                return None
            try:
                return shlex.split(value)
            except ValueError:
                return None  # an unbalanced quote: print straight to the terminal
    return ["less", "-FRSX"] if shutil.which("less") else None


class Output:
    """Where a command's lines go, and whether they are coloured.

    On a terminal, with ``paged``, lines go through the pager as they are written: the first
    screen shows while the rest is still being read. A reader who quits the pager (``q``) or a
    closed pipe (``| head``) ends the output quietly: exit 0, no traceback.
    """

    def __init__(self, args: argparse.Namespace, *, paged: bool = False) -> None:
        self.terminal = display.is_terminal(sys.stdout)
        self.color = use_color(getattr(args, "color", "auto"), self.terminal)
        self.stream: IO[str] = sys.stdout
        self._pager: subprocess.Popen[bytes] | None = None
        if paged and self.terminal and not getattr(args, "no_pager", False):
            self._start_pager()

    def _start_pager(self) -> None:
        import io
        import subprocess

        command = pager_command()
        if command is None:
            return
        env = dict(os.environ)
        env.setdefault("LESS", "FRSX")  # as git and journalctl do, for a bare PAGER=less
        try:
            sys.stdout.flush()
            self._pager = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
        except OSError:
            return  # no such pager: print straight to the terminal
        assert self._pager.stdin is not None
        self.stream = io.TextIOWrapper(
            self._pager.stdin,
            encoding=sys.stdout.encoding or "utf-8",
            errors="backslashreplace",
            line_buffering=False,
        )

    def write(self, text: str) -> None:
        self.stream.write(text)

    def paint(self, text: str, style: str | None) -> str:
        """``text`` in an SGR style (a code of :data:`DECISION_STYLES` or a name of
        :data:`STYLES`) when colour is on."""
        if not self.color or not style:
            return text
        code = STYLES.get(style, style)
        return f"\x1b[{code}m{text}\x1b[0m"

    def __enter__(self) -> Output:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        _tb: TracebackType | None,
    ) -> bool:
        reader_gone = kind is not None and issubclass(kind, (BrokenPipeError, KeyboardInterrupt))
        if self._pager is None:
            if kind is None:
                self.stream.flush()
            return False
        try:
            self.stream.close()
        except (BrokenPipeError, ValueError):
            reader_gone = True
        while True:
            try:
                self._pager.wait()
                break
            except KeyboardInterrupt:
                continue  # Ctrl-C is the pager's to handle; wait for it to end
        return reader_gone


def print_json(obj: Any, out: IO[str] | None = None) -> None:
    """One JSON line; values msgspec refuses (lone surrogates, ...) fall back to the stdlib.
    Characters a terminal acts on are escaped (:func:`display.json_line`)."""
    from memstaged.logevent import dumps

    (out or sys.stdout).write(display.json_line(dumps(obj)) + "\n")


def render_table(
    out: Output,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[str] = (),
    styles: Sequence[Sequence[str | None]] | None = None,
) -> None:
    """Aligned columns under a title on a terminal; elsewhere a ``# title`` line and one
    tab-separated line a row. Cells are escaped here: a name with a tab or an ESC cannot shift
    or colour a column. For the short summaries only: it needs every row to align them."""
    cells = [[display.text(cell) for cell in row] for row in rows]
    if not out.terminal:
        lines = [f"# {display.text(title)}", "\t".join(columns)]
        lines.extend("\t".join(row) for row in cells)
        out.write("\n".join(lines) + "\n")
        return
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]

    def line(row: Sequence[str], row_styles: Sequence[str | None] | None) -> str:
        parts = []
        for i, cell in enumerate(row):
            padded = cell.rjust(widths[i]) if columns[i] in right else cell.ljust(widths[i])
            parts.append(out.paint(padded, row_styles[i] if row_styles else None))
        return "  ".join(parts).rstrip()

    out.write(out.paint(display.text(title), "bold") + "\n")
    out.write(line(list(columns), ["bold"] * len(columns)) + "\n")
    for i, row in enumerate(cells):
        out.write(line(row, styles[i] if styles else None) + "\n")
    out.write("\n")


def one_line(text: str, limit: int | None = None) -> str:
    """Collapse whitespace (and cut at ``limit``), escape the rest: a cell or a line's tail."""
    flat = display.text(" ".join(text.split()))
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


P = ParamSpec("P")


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that no later write or final flush can fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is not a real file (a test's capture): nothing will flush it


def guard_output(func: Callable[P, int]) -> Callable[P, int]:
    """Output that cannot end in a traceback, for commands whose product is their output.

    ``memstaged log | head`` ends quietly (exit 0) instead of with a BrokenPipeError: the reader
    has what it wanted, and reading the rest of the log for nobody would only waste time. Text
    that stdout cannot encode (a lone surrogate: a file name that is not UTF-8, a ``\ud800``
    escape in a staging file) is printed backslash-escaped instead of raising UnicodeEncodeError.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
        try:
            code = func(*args, **kwargs)
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
            return 0
        return code

    return wrapper


class _ReaderMayLeave(io.TextIOBase):
    """stdout for :func:`guard_verdict`: once the reader is gone, what is written is dropped."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        self.gone = True
        _stdout_to_devnull()

    def isatty(self) -> bool:
        return display.is_terminal(self._stream)

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"


def guard_verdict(func: Callable[P, int]) -> Callable[P, int]:
    """:func:`guard_output` for commands whose exit code is a verdict or whose work changes
    things (``check``, ``status``, ``deadletter recover`` and ``purge``).

    ``memstaged check f.json | head -1`` must still exit 4 for a file that would be quarantined,
    and a recovery must not stop half-way because its reader left: so when the reader goes,
    the command goes on to the end with its output dropped, and returns its own exit code (as
    ``--once | head -1`` does).
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
        real = sys.stdout
        quiet = _ReaderMayLeave(real)
        sys.stdout = quiet
        try:
            code = func(*args, **kwargs)
            quiet.flush()
        finally:
            sys.stdout = real
        return code

    return wrapper
