"""What the inspection and recovery commands print, and how: a person's lines, or JSON lines.

Every command prints either lines a person reads or, with ``--json``, one JSON object per line
for scripts. ``log`` and ``deadletter list`` print one line per event or record, IDs in full, as
journalctl and git do; on a terminal through a pager (``$MEMSTAGED_PAGER``, ``$PAGER``, else
``less -FRSX``; ``--no-pager``), written line by line as they are read, never built whole. The
small summaries (``stats``, ``status``) are aligned columns on a terminal and a ``# title`` line
with tab-separated rows otherwise, so that ``grep`` and ``cut`` work. Colour only on a terminal,
never with ``NO_COLOR`` set, and as ``--color=auto|always|never`` says. Every text that came from
a file (names, reasons, content) goes through :mod:`memstaged.safe_text` first. Plain writes, no
rich: its import alone cost more than printing a thousand lines. A reader that leaves (a pager
quit, ``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Final, ParamSpec

from memstaged import safe_text
from memstaged.cli.stdout import Stdout, to_devnull

if TYPE_CHECKING:
    import subprocess


def plural(count: int, singular: str, many: str | None = None) -> str:
    """``1 record``, ``2 records``, ``0 records``: the count and the form it takes; ``many``
    for a plural that is not the singular and an ``s`` (``entry``, ``entries``)."""
    return f"{count} {singular if count == 1 else many or singular + 's'}"


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
        self.terminal = safe_text.is_terminal(sys.stdout)
        self.color = use_color(getattr(args, "color", "auto"), self.terminal)
        self.stream: IO[str] = sys.stdout
        self._pager: subprocess.Popen[bytes] | None = None
        if paged and self.terminal and not getattr(args, "no_pager", False):
            self._start_pager()

    def _start_pager(self) -> None:
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
    from memstaged.log.format import dumps

    (out or sys.stdout).write(safe_text.json_line(dumps(obj)) + "\n")


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
    cells = [[safe_text.text(cell) for cell in row] for row in rows]
    if not out.terminal:
        lines = [f"# {safe_text.text(title)}", "\t".join(columns)]
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

    out.write(out.paint(safe_text.text(title), "bold") + "\n")
    out.write(line(list(columns), ["bold"] * len(columns)) + "\n")
    for i, row in enumerate(cells):
        out.write(line(row, styles[i] if styles else None) + "\n")
    out.write("\n")


def one_line(text: str, limit: int | None = None) -> str:
    """Collapse whitespace (and cut at ``limit``), escape the rest: a cell or a line's tail."""
    flat = safe_text.text(" ".join(text.split()))
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


P = ParamSpec("P")


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
            to_devnull()
            return 0
        return code

    return wrapper


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
        out = real if isinstance(real, Stdout) else Stdout(real)
        sys.stdout = out
        try:
            with out.dropping():
                code = func(*args, **kwargs)
                out.flush()
        finally:
            sys.stdout = real
        return code

    return wrapper
